//! `cpt profile`, `flame`, `folded`, `histogram`, `diff` and `merge`: the
//! aggregation commands.
//!
//! They share the selection flags ([`SelectArgs`]) and the record sources
//! ([`SourceArgs`]): JSON Lines files (`-` is stdin, `.gz` files are
//! gunzipped), the SQLite store (`--store`), and for the commands that only
//! draw an aggregate, profiles `cpt` wrote (`*.pb.gz`, `*.pb`).
//!
//! # Bad input lines
//!
//! A JSON Lines line that is not a record is skipped with a warning naming
//! `FILE:LINE` and what is wrong (the first ten are shown, the rest counted),
//! and the run ends with a summary of how many were skipped. A profile of a
//! big log should not die on one truncated last line. `--strict` makes the
//! first bad line an error instead (exit status 1), for pipelines that must
//! not silently lose data.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use cpt_sdk::record::Record;
use flate2::read::MultiGzDecoder;
use rayon::prelude::*;

use crate::profile;
use crate::profile::aggregate::{Aggregate, Aggregator};
use crate::profile::diff::{DiffOptions, diff};
use crate::profile::flame::{FlameOptions, flame_svg, folded};
use crate::profile::format::fmt_ns;
use crate::profile::report::Report;
use crate::records::selection::{PercentileBand, Selection, TriggerFilter, parse_time};

/// Bad lines shown before the rest are only counted.
const SHOWN_BAD_LINES: u64 = 10;
/// Lines parsed per parallel batch.
const LINES_PER_BATCH: usize = 8 * 1024;

/// Which records to aggregate (all filters combine with AND).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SelectArgs {
    /// Entry service name.
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,
    /// Endpoint (gRPC method, HTTP route).
    #[arg(long, value_name = "ENDPOINT")]
    pub endpoint: Option<String>,
    /// Requests that started at or after this time: Unix nanoseconds, a number with unit
    /// s/ms/us/ns (Unix time), or RFC 3339 (2026-11-21T22:00:00Z).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub since: Option<u64>,
    /// Requests that started before this time (same forms as --since).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub until: Option<u64>,
    /// Label filter KEY=VALUE; repeat for several (all must match).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Latency percentile band over the otherwise-selected requests, e.g. p95-p100, p0-p50.
    #[arg(long, value_name = "BAND", value_parser = PercentileBand::parse)]
    pub percentile: Option<PercentileBand>,
    /// Which triggers: sampled (default; forced traces are not a random sample), forced, all.
    #[arg(long, value_name = "WHICH", default_value = "sampled", value_parser = TriggerFilter::parse)]
    pub trigger: TriggerFilter,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?}: expected KEY=VALUE, e.g. arm=b")),
    }
}

impl SelectArgs {
    /// The selection these flags describe.
    pub fn selection(&self) -> Selection {
        let mut sel = Selection::new().with_triggers(self.trigger);
        if let Some(s) = &self.service {
            sel = sel.with_service(s);
        }
        if let Some(e) = &self.endpoint {
            sel = sel.with_endpoint(e);
        }
        if let Some(t) = self.since {
            sel = sel.with_since(t);
        }
        if let Some(t) = self.until {
            sel = sel.with_until(t);
        }
        for (k, v) in &self.labels {
            sel = sel.with_label(k, v);
        }
        if let Some(b) = self.percentile {
            sel = sel.with_percentile(b);
        }
        sel
    }
}

/// Where records come from.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SourceArgs {
    /// JSON Lines record files (`-` = stdin; `.gz` is gunzipped). Commands that only draw an
    /// aggregate also take profiles cpt wrote (`.pb.gz`, `.pb`), merged in.
    #[arg(value_name = "INPUT")]
    pub inputs: Vec<PathBuf>,
    /// Read records from this SQLite store (as `cpt serve` / `cpt import` write it).
    #[arg(long, value_name = "PATH")]
    pub store: Option<PathBuf>,
    /// Fail on the first bad JSON Lines line instead of skipping it with a warning.
    #[arg(long)]
    pub strict: bool,
}

fn is_profile_path(p: &Path) -> bool {
    let s = p.to_string_lossy();
    s.ends_with(".pb.gz") || s.ends_with(".pb")
}

/// Counts of what a load read, for the summary line.
#[derive(Debug, Default)]
struct LoadStats {
    records: u64,
    bad_lines: u64,
    profiles: usize,
}

fn open_text(path: &Path) -> anyhow::Result<Box<dyn BufRead + Send>> {
    if path == Path::new("-") {
        return Ok(Box::new(BufReader::new(io::stdin())));
    }
    let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic)?;
    let head = io::Cursor::new(magic[..n].to_vec()).chain(f);
    if n == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(BufReader::with_capacity(
            1 << 16,
            MultiGzDecoder::new(head),
        )))
    } else {
        Ok(Box::new(BufReader::with_capacity(1 << 16, head)))
    }
}

/// Feed every record of the JSON Lines sources and the store to each
/// aggregator (one pass, several selections), and merge profile inputs into
/// `profiles`.
fn load(
    src: &SourceArgs,
    aggs: &mut [&mut Aggregator],
    profiles: Option<&mut Vec<Aggregate>>,
) -> anyhow::Result<LoadStats> {
    if src.inputs.is_empty() && src.store.is_none() {
        bail!("no input: give JSON Lines record files (or `-` for stdin) or --store PATH");
    }
    let mut stats = LoadStats::default();
    let mut profiles = profiles;
    for path in &src.inputs {
        if is_profile_path(path) {
            let Some(out) = profiles.as_deref_mut() else {
                bail!(
                    "{}: a profile cannot be re-selected or compared; give the JSON Lines records",
                    path.display()
                );
            };
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let agg = profile::read_aggregate(&bytes)
                .with_context(|| format!("{}: not a readable profile", path.display()))?;
            out.push(agg);
            stats.profiles += 1;
            continue;
        }
        load_json_lines(path, src.strict, aggs, &mut stats)?;
    }
    if let Some(store) = &src.store {
        load_store(store, aggs, &mut stats)?;
    }
    if stats.bad_lines > 0 {
        eprintln!(
            "cpt: skipped {} bad line{} (use --strict to fail on them)",
            stats.bad_lines,
            if stats.bad_lines == 1 { "" } else { "s" }
        );
    }
    Ok(stats)
}

fn load_json_lines(
    path: &Path,
    strict: bool,
    aggs: &mut [&mut Aggregator],
    stats: &mut LoadStats,
) -> anyhow::Result<()> {
    let mut reader = open_text(path)?;
    let mut lineno: u64 = 0;
    loop {
        let mut lines: Vec<(u64, String)> = Vec::with_capacity(LINES_PER_BATCH);
        while lines.len() < LINES_PER_BATCH {
            let mut line = String::new();
            let n = reader
                .read_line(&mut line)
                .with_context(|| format!("{}:{}: cannot read", path.display(), lineno + 1))?;
            if n == 0 {
                break;
            }
            lineno += 1;
            if !line.trim().is_empty() {
                lines.push((lineno, line));
            }
        }
        if lines.is_empty() {
            return Ok(());
        }
        let parsed: Vec<(u64, Result<Record, cpt_sdk::record::RecordError>)> = lines
            .par_iter()
            .map(|(n, l)| (*n, Record::from_json(l.trim_end())))
            .collect();
        drop(lines);
        let mut ok = Vec::with_capacity(parsed.len());
        for (n, r) in parsed {
            match r {
                Ok(r) => ok.push(r),
                Err(e) if strict => bail!("{}:{n}: {e} (--strict)", path.display()),
                Err(e) => {
                    stats.bad_lines += 1;
                    if stats.bad_lines <= SHOWN_BAD_LINES {
                        eprintln!("cpt: {}:{n}: skipped: {e}", path.display());
                    } else if stats.bad_lines == SHOWN_BAD_LINES + 1 {
                        eprintln!("cpt: … further bad lines are only counted");
                    }
                }
            }
        }
        stats.records += ok.len() as u64;
        for a in aggs.iter_mut() {
            a.push_batch(&ok);
        }
    }
}

#[cfg(feature = "server")]
fn load_store(
    path: &Path,
    aggs: &mut [&mut Aggregator],
    stats: &mut LoadStats,
) -> anyhow::Result<()> {
    let store = crate::server::store::Store::open_read_only(path)
        .with_context(|| format!("cannot open store {}", path.display()))?;
    // One query per distinct selection would push more filters down; one
    // query with the first selection's pushdown is only correct for one
    // aggregator, so with several (diff) read everything they share.
    let sel = match aggs {
        [one] => one.selection().clone(),
        _ => Selection::new().with_triggers(TriggerFilter::All),
    };
    let mut batch = Vec::with_capacity(LINES_PER_BATCH);
    let flush = |batch: &mut Vec<Record>, aggs: &mut [&mut Aggregator]| {
        for a in aggs.iter_mut() {
            a.push_batch(batch);
        }
        batch.clear();
    };
    for r in store.records(&sel)? {
        batch.push(r.with_context(|| format!("reading store {}", path.display()))?);
        stats.records += 1;
        if batch.len() == LINES_PER_BATCH {
            flush(&mut batch, aggs);
        }
    }
    flush(&mut batch, aggs);
    Ok(())
}

#[cfg(not(feature = "server"))]
fn load_store(path: &Path, _: &mut [&mut Aggregator], _: &mut LoadStats) -> anyhow::Result<()> {
    bail!(
        "--store {}: this cpt was built without the `server` feature (no SQLite store)",
        path.display()
    )
}

/// Load, aggregate one selection, merge any profile inputs.
fn aggregate(src: &SourceArgs, select: &SelectArgs, histograms: bool) -> anyhow::Result<Aggregate> {
    let sel = select.selection();
    let mut agg = Aggregator::new(sel.clone()).with_histograms(histograms);
    let mut profiles = Vec::new();
    let stats = load(src, &mut [&mut agg], Some(&mut profiles))?;
    if !profiles.is_empty() && sel != Selection::new() {
        bail!(
            "selection flags apply to records, not to profile inputs (a profile is already a \
             selection); drop the flags or give JSON Lines records"
        );
    }
    let matched = agg.matched();
    let mut out = agg.finish();
    eprintln!(
        "cpt: {} records read, {} matched the selection{}, {} aggregated{}",
        stats.records,
        matched,
        if sel.percentile().is_some() {
            " before the percentile band"
        } else {
            ""
        },
        out.requests(),
        if stats.profiles > 0 {
            format!(", {} profiles merged in", stats.profiles)
        } else {
            String::new()
        }
    );
    for p in &profiles {
        out.merge(p);
    }
    if out.requests() == 0 {
        eprintln!("cpt: warning: the selection is empty (check --service, --trigger, time range)");
    }
    Ok(out)
}

fn write_out(path: Option<&Path>, bytes: &[u8]) -> anyhow::Result<()> {
    match path {
        Some(p) if p != Path::new("-") => {
            std::fs::write(p, bytes).with_context(|| format!("cannot write {}", p.display()))
        }
        _ => {
            let mut out = io::stdout().lock();
            out.write_all(bytes)?;
            out.flush()?;
            Ok(())
        }
    }
}

fn summary(agg: &Aggregate) -> String {
    format!(
        "{} requests, mean latency {}, {} stacks",
        agg.requests(),
        fmt_ns(agg.mean_latency().as_nanos() as u64),
        agg.stacks().len()
    )
}

/// Write the selection's average critical path as a gzipped pprof profile.
///
/// Sample values are mean nanoseconds per request (pprof's total is the mean latency).
#[derive(Debug, clap::Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    select: SelectArgs,
    #[command(flatten)]
    source: SourceArgs,
    /// Output file (gzipped profile.proto).
    #[arg(short, long, value_name = "OUT.pb.gz")]
    output: PathBuf,
}

/// Run `cpt profile`.
///
/// # Errors
///
/// Unreadable inputs, a bad line under `--strict`, an unwritable output.
pub fn run_profile(args: ProfileArgs) -> anyhow::Result<()> {
    let agg = aggregate(&args.source, &args.select, false)?;
    write_out(Some(&args.output), &profile::encode_gzip(&agg))?;
    eprintln!("cpt: wrote {}: {}", args.output.display(), summary(&agg));
    eprintln!(
        "cpt: open it with: go tool pprof -http=: {}",
        args.output.display()
    );
    Ok(())
}

/// Draw the selection's average critical path as a flame graph SVG (inferno).
#[derive(Debug, clap::Args)]
pub struct FlameArgs {
    #[command(flatten)]
    select: SelectArgs,
    #[command(flatten)]
    source: SourceArgs,
    /// Output SVG file (`-` = stdout).
    #[arg(short, long, value_name = "OUT.svg")]
    output: PathBuf,
    /// Title (default: mean latency and request count).
    #[arg(long)]
    title: Option<String>,
    /// Icicle graph: roots at the top.
    #[arg(long)]
    inverted: bool,
}

/// Run `cpt flame`.
///
/// # Errors
///
/// As `cpt profile`, or an empty selection (nothing to draw).
pub fn run_flame(args: FlameArgs) -> anyhow::Result<()> {
    let agg = aggregate(&args.source, &args.select, false)?;
    let opts = FlameOptions {
        title: args.title,
        subtitle: None,
        inverted: args.inverted,
    };
    let svg = flame_svg(&agg, &opts).context("cannot draw the flame graph")?;
    write_out(Some(&args.output), &svg)?;
    eprintln!("cpt: wrote {}: {}", args.output.display(), summary(&agg));
    Ok(())
}

/// Print the selection as folded stacks (`A1 (A);B1 (B) NANOS`, mean ns per request).
#[derive(Debug, clap::Args)]
pub struct FoldedArgs {
    #[command(flatten)]
    select: SelectArgs,
    #[command(flatten)]
    source: SourceArgs,
    /// Output file (default stdout).
    #[arg(short, long, value_name = "OUT.folded")]
    output: Option<PathBuf>,
}

/// Run `cpt folded`.
///
/// # Errors
///
/// As `cpt profile`.
pub fn run_folded(args: FoldedArgs) -> anyhow::Result<()> {
    let agg = aggregate(&args.source, &args.select, false)?;
    write_out(args.output.as_deref(), folded(&agg).as_bytes())
}

/// Report formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table for humans.
    Text,
    /// One CSV row per stack.
    Csv,
    /// CSV in long form, one row per stack and histogram bucket (histogram only).
    BucketsCsv,
}

/// Per-stack latency histograms: how often each frame stack is on the critical path and
/// how long it takes when it is (p50/p90/p99/max).
#[derive(Debug, clap::Args)]
pub struct HistogramArgs {
    #[command(flatten)]
    select: SelectArgs,
    #[command(flatten)]
    source: SourceArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Rows in the text table.
    #[arg(long, value_name = "N", default_value_t = 30)]
    top: usize,
    /// Bar charts of the distribution for the first N rows (text only).
    #[arg(long, value_name = "N", default_value_t = 5)]
    charts: usize,
    /// Output file (default stdout).
    #[arg(short, long, value_name = "OUT")]
    output: Option<PathBuf>,
}

/// Run `cpt histogram`.
///
/// # Errors
///
/// As `cpt profile`.
pub fn run_histogram(args: HistogramArgs) -> anyhow::Result<()> {
    let agg = aggregate(&args.source, &args.select, true)?;
    let rep = Report::new(&agg);
    if agg.latency_detail().is_none() {
        eprintln!("cpt: note: profile inputs carry no per-request spread; histograms are empty");
    }
    let text = match args.format {
        Format::Text => rep.to_text(args.top, args.charts),
        Format::Csv => rep.to_csv(),
        Format::BucketsCsv => rep.buckets_csv(),
    };
    write_out(args.output.as_deref(), text.as_bytes())
}

/// Compare two selections: each stack's change in mean critical-path time with its confidence
/// interval (flagging changes larger than noise), and base/test profiles for
/// `go tool pprof -diff_base`.
///
/// The shared selection flags apply to both arms; --base / --test add KEY=VALUE filters
/// (service, endpoint, since, until, label=K=V, percentile, trigger) to one arm, e.g.
/// `--base label=arm=a --test label=arm=b`, or `--base percentile=p0-p50 --test percentile=p99-p100`.
#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    #[command(flatten)]
    select: SelectArgs,
    #[command(flatten)]
    source: SourceArgs,
    /// Filter for the base arm only, KEY=VALUE (repeatable).
    #[arg(long = "base", value_name = "KEY=VALUE")]
    base: Vec<String>,
    /// Filter for the test arm only, KEY=VALUE (repeatable).
    #[arg(long = "test", value_name = "KEY=VALUE")]
    test: Vec<String>,
    /// Records for the base arm only (instead of INPUT...), e.g. yesterday's log.
    #[arg(long = "base-input", value_name = "FILE")]
    base_inputs: Vec<PathBuf>,
    /// Records for the test arm only (instead of INPUT...).
    #[arg(long = "test-input", value_name = "FILE")]
    test_inputs: Vec<PathBuf>,
    /// Two-sided confidence level of the intervals.
    #[arg(long, value_name = "P", default_value_t = 0.95)]
    confidence: f64,
    /// Flag only changes at least this large (e.g. 1ms, 100us): CPT Table 3 shows small
    /// thresholds flag many unchanged components by chance.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, default_value = "0s")]
    min_change: Duration,
    /// Bonferroni-correct the intervals for the number of stacks compared.
    #[arg(long)]
    bonferroni: bool,
    /// Text: list every stack (up to --top), not only flagged ones.
    #[arg(long)]
    all: bool,
    /// Rows in the text report.
    #[arg(long, value_name = "N", default_value_t = 40)]
    top: usize,
    /// Report format (text or csv).
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Directory for base.pb.gz and test.pb.gz (for `go tool pprof -diff_base`).
    #[arg(short, long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Also draw a differential flame graph (widths: test; red slower, blue faster).
    #[arg(long, value_name = "OUT.svg")]
    flame: Option<PathBuf>,
}

/// Run `cpt diff`.
///
/// # Errors
///
/// Bad --base/--test filters, a confidence outside (0, 1), or as `cpt profile`.
pub fn run_diff(args: DiffArgs) -> anyhow::Result<()> {
    if !(args.confidence > 0.0 && args.confidence < 1.0) {
        bail!(
            "--confidence {}: must be between 0 and 1, e.g. 0.95",
            args.confidence
        );
    }
    if args.format == Format::BucketsCsv {
        bail!("--format buckets-csv is for `cpt histogram`; use text or csv");
    }
    let common = args.select.selection();
    let arm = |pairs: &[String], name: &str| -> anyhow::Result<Selection> {
        let mut sel = common.clone();
        for p in pairs {
            sel.set_pair(p).with_context(|| format!("--{name} {p}"))?;
        }
        Ok(sel)
    };
    let base_sel = arm(&args.base, "base")?;
    let test_sel = arm(&args.test, "test")?;
    if base_sel == test_sel && args.base_inputs.is_empty() && args.test_inputs.is_empty() {
        eprintln!(
            "cpt: note: base and test select the same records; every flag is a false positive \
             (useful to measure noise, CPT Table 3)"
        );
    }
    let mut base = Aggregator::new(base_sel);
    let mut test = Aggregator::new(test_sel);
    let arm_source = |inputs: &[PathBuf]| SourceArgs {
        inputs: inputs.to_vec(),
        store: None,
        strict: args.source.strict,
    };
    match (args.base_inputs.is_empty(), args.test_inputs.is_empty()) {
        (true, true) => {
            load(&args.source, &mut [&mut base, &mut test], None)?;
        }
        (false, false) => {
            load(&arm_source(&args.base_inputs), &mut [&mut base], None)?;
            load(&arm_source(&args.test_inputs), &mut [&mut test], None)?;
        }
        (false, true) => {
            load(&arm_source(&args.base_inputs), &mut [&mut base], None)?;
            load(&args.source, &mut [&mut test], None)?;
        }
        (true, false) => {
            load(&args.source, &mut [&mut base], None)?;
            load(&arm_source(&args.test_inputs), &mut [&mut test], None)?;
        }
    }
    let (base, test) = (base.finish(), test.finish());
    let opts = DiffOptions {
        confidence: args.confidence,
        min_change: args.min_change,
        bonferroni: args.bonferroni,
    };
    let report = diff(&base, &test, &opts);
    if let Some(dir) = &args.output {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let (b, t) = (dir.join("base.pb.gz"), dir.join("test.pb.gz"));
        write_out(Some(&b), &profile::encode_gzip(&base))?;
        write_out(Some(&t), &profile::encode_gzip(&test))?;
        eprintln!(
            "cpt: wrote {} and {}; compare with: go tool pprof -diff_base {} {}",
            b.display(),
            t.display(),
            b.display(),
            t.display()
        );
    }
    if let Some(path) = &args.flame {
        let svg = crate::profile::flame::diff_flame_svg(&base, &test, &FlameOptions::default())
            .context("cannot draw the differential flame graph")?;
        write_out(Some(path), &svg)?;
        eprintln!("cpt: wrote {}", path.display());
    }
    let text = match args.format {
        Format::Csv => report.to_csv(),
        _ => report.to_text(args.top, args.all),
    };
    write_out(None, text.as_bytes())
}

/// Merge profiles cpt wrote (e.g. from several collectors) into one, keeping the average
/// right: per stack, summed times and request counts add; the mean is recomputed.
#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// Profiles to merge (`.pb.gz` or `.pb`).
    #[arg(value_name = "PROFILE", required = true)]
    inputs: Vec<PathBuf>,
    /// Output file (gzipped profile.proto).
    #[arg(short, long, value_name = "OUT.pb.gz")]
    output: PathBuf,
}

/// Run `cpt merge`.
///
/// # Errors
///
/// An input that is not a readable profile, an unwritable output.
pub fn run_merge(args: MergeArgs) -> anyhow::Result<()> {
    let mut out: Option<Aggregate> = None;
    for path in &args.inputs {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let agg = profile::read_aggregate(&bytes)
            .with_context(|| format!("{}: not a readable profile", path.display()))?;
        match &mut out {
            None => out = Some(agg),
            Some(o) => o.merge(&agg),
        }
    }
    let out = out.expect("clap requires at least one input");
    write_out(Some(&args.output), &profile::encode_gzip(&out))?;
    eprintln!("cpt: wrote {}: {}", args.output.display(), summary(&out));
    Ok(())
}
