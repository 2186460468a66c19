//! `cpt profile`, `flame`, `folded`, `histogram`, `diff` and `merge`: the
//! aggregation commands.
//!
//! They share the selection flags ([`SelectArgs`]) and the record sources
//! ([`SourceArgs`]): JSON Lines files (`-` is stdin, gzip recognised by its
//! content), the SQLite store (`--store`), and for the commands that only
//! draw an aggregate, profiles `cpt` wrote (`*.pb.gz`, `*.pb`). Files are read
//! by [`crate::records`], the reader `cpt import` uses too.
//!
//! # Bad input lines
//!
//! A JSON Lines line that is not a record is skipped with a warning naming
//! `FILE:LINE` and what is wrong (the first ten are shown, the rest counted),
//! and the run ends with a summary of how many were skipped. A profile of a
//! big log should not die on one truncated last line. A gzip file that breaks
//! off keeps the records before the break, with a warning. `--strict` makes
//! the first bad line or broken gzip stream an error instead (exit status 1),
//! for pipelines that must not silently lose data.

use std::io::{self, IsTerminal as _, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use anyhow::{Context as _, bail};

use crate::format::fmt_ns;
use crate::format::plural;
use crate::profile;
use crate::profile::aggregate::{Aggregate, Aggregator, Waits, push_json_block, push_parquet};
use crate::profile::diff::{DiffOptions, diff};
use crate::profile::flame::{FlameOptions, flame_svg, folded};
use crate::profile::report::Report;
use crate::records::blocks::{Chunking, End, LineBlocks};
use crate::records::parquet::{ScanPlan, UNIT_ROWS};
use crate::records::selection::{PercentileBand, Selection, TriggerFilter, parse_time};
use crate::records::{EntryServices, InputError, Warning, WarningKind, is_parquet_input, open};

/// Bad lines shown before the rest are only counted.
const SHOWN_BAD_LINES: u64 = 10;
/// Lines parsed per parallel batch.
#[cfg(feature = "server")]
const LINES_PER_BATCH: usize = 8 * 1024;

/// Which records to aggregate (all filters combine with AND).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SelectArgs {
    /// Entry service name (the service whose request is a record's root). Without it, a
    /// selection of several services gets a warning; a service seen on another's paths is named
    /// as internal (its own records are calls it sampled itself, counted twice).
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
    /// Latency percentile band over the otherwise-selected requests, both bounds: p99-p100 is
    /// the slowest 1%, p0-p50 the faster half (a single bound like `99` is refused as ambiguous).
    #[arg(long, value_name = "BAND", value_parser = PercentileBand::parse)]
    pub percentile: Option<PercentileBand>,
    /// Which triggers: sampled (default; forced traces are not a random sample), forced, all.
    /// With --request-id or --trace-id the default is all (that request, forced or not).
    #[arg(long, value_name = "WHICH", value_parser = TriggerFilter::parse)]
    pub trigger: Option<TriggerFilter>,
    /// Only the record of this request id (the `x-request-id` the request carried).
    #[arg(long, value_name = "ID")]
    pub request_id: Option<String>,
    /// Only the records of this OpenTelemetry trace id (32 hex digits).
    #[arg(long, value_name = "HEX")]
    pub trace_id: Option<String>,
    /// How named waits are shown: `site` keeps each resource apart (`[sleep src/main.rs:88]`),
    /// `kind` groups them by kind (`[sleep]`, `[semaphore]`, `[io]`).
    #[arg(long, value_enum, value_name = "HOW", default_value = "site")]
    pub waits: Waits,
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
        let mut sel = Selection::new();
        if let Some(t) = self.trigger {
            sel = sel.with_triggers(t);
        }
        if let Some(id) = &self.request_id {
            sel = sel.with_request_id(id);
        }
        if let Some(id) = &self.trace_id {
            sel = sel.with_trace_id(id);
        }
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
    /// JSON Lines record files (`-` = stdin; gzip is recognised by its content), Parquet files
    /// (`cpt export --parquet-dir`) or directories of them. Commands that only draw an
    /// aggregate also take profiles cpt wrote (`.pb.gz`, `.pb`), merged in.
    #[arg(value_name = "INPUT")]
    pub inputs: Vec<PathBuf>,
    /// Read records from this SQLite store (as `cpt serve` / `cpt import` write it).
    #[arg(long, value_name = "PATH")]
    pub store: Option<PathBuf>,
    /// Fail on the first bad JSON Lines line (or a gzip file that breaks off) instead of
    /// skipping it with a warning.
    #[arg(long)]
    pub strict: bool,
    /// Draw from an aggregate computed elsewhere (the `cpt.aggregate.v1` file, or directory,
    /// that `collector/spark/cpt_aggregate.py` writes) instead of folding records here. The
    /// selection was applied by that job: give its flags there, not here.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["inputs", "store"])]
    pub from_aggregate: Option<PathBuf>,
}

fn is_profile_path(p: &Path) -> bool {
    let s = p.to_string_lossy();
    s.ends_with(".pb.gz") || s.ends_with(".pb")
}

/// A progress bar on stderr for a read that lasts: drawn once the read has
/// taken [`PROGRESS_AFTER`], and only when stderr is a terminal.
struct Progress {
    bar: ProgressBar,
    started: Instant,
}

/// How long a read runs before its progress bar appears.
const PROGRESS_AFTER: Duration = Duration::from_secs(2);

impl Progress {
    /// A bar to `total` (bytes or records, as `template` shows them).
    fn new(total: Option<u64>, template: &str) -> Progress {
        let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template(template)
                .expect("a valid progress template; this is a bug"),
        );
        Progress {
            bar,
            started: Instant::now(),
        }
    }

    fn inc(&self, n: u64) {
        self.bar.inc(n);
        if self.bar.is_hidden()
            && self.started.elapsed() >= PROGRESS_AFTER
            && io::stderr().is_terminal()
        {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Counts of what a load read, for the summary line.
#[derive(Debug, Default)]
struct LoadStats {
    records: u64,
    bad_lines: u64,
    /// Gzip inputs whose stream broke off.
    truncated: u64,
    profiles: usize,
}

/// Prints read warnings: every broken gzip tail, the first
/// [`SHOWN_BAD_LINES`] bad lines, then only counts them.
#[derive(Debug, Default)]
struct WarningPrinter {
    bad_lines: u64,
}

impl WarningPrinter {
    fn print(&mut self, w: &Warning) {
        if let WarningKind::BadLine(_) = w.kind {
            self.bad_lines += 1;
            if self.bad_lines > SHOWN_BAD_LINES {
                if self.bad_lines == SHOWN_BAD_LINES + 1 {
                    eprintln!("cpt: … further bad lines are only counted");
                }
                return;
            }
        }
        eprintln!("cpt: warning: {w}");
    }
}

/// Feed every record of the JSON Lines sources and the store to each
/// aggregator (one pass, several selections), and merge profile inputs into
/// `profiles`. `mix`, when given, sees the records the first aggregator's
/// selection keeps.
fn load(
    src: &SourceArgs,
    aggs: &mut [&mut Aggregator],
    profiles: Option<&mut Vec<Aggregate>>,
    mut mix: Option<&mut EntryServices>,
) -> anyhow::Result<LoadStats> {
    if src.inputs.is_empty() && src.store.is_none() {
        bail!("no input: give JSON Lines record files (or `-` for stdin) or --store PATH");
    }
    let mut stats = LoadStats::default();
    let mut profiles = profiles;
    let mut printer = WarningPrinter::default();
    for path in &src.inputs {
        if is_profile_path(path) {
            let Some(out) = profiles.as_deref_mut() else {
                bail!(
                    "{}: a profile cannot be re-selected or compared; give the JSON Lines records",
                    path.display()
                );
            };
            out.push(crate::profile::pprof::read_file(path)?);
            stats.profiles += 1;
            continue;
        }
        if path != Path::new("-") && is_parquet_input(path) {
            // Folded from the columns in one pass for every selection,
            // skipping the partitions and row groups outside all their time
            // ranges.
            if aggs.is_empty() {
                continue;
            }
            let (since, until) = union_range(aggs);
            let plan = ScanPlan::open(path, since, until, UNIT_ROWS)?;
            let progress = Progress::new(
                Some(plan.rows()),
                "{bar:30} {human_pos}/{human_len} Parquet rows ({per_sec}) {elapsed}",
            );
            stats.records += push_parquet(aggs, &plan, mix.as_deref_mut(), &|n| progress.inc(n))?;
            continue;
        }
        // JSON Lines: blocks read (and gunzipped) on their own thread, their
        // lines parsed and folded in parallel without building records.
        let chunking = Chunking::default();
        let opened = open(path)?;
        let size = (!opened.gzip && path != Path::new("-"))
            .then(|| std::fs::metadata(path).ok().map(|m| m.len()))
            .flatten();
        let progress = Progress::new(
            size,
            "{bar:30} {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}) {elapsed}",
        );
        let mut blocks = LineBlocks::start(opened, chunking.block_bytes);
        while let Some(block) = blocks.next_block() {
            progress.inc(block.bytes.len() as u64);
            if aggs.is_empty() {
                continue;
            }
            // Each line parsed once, folded into every selection keeping it.
            let r = push_json_block(aggs, &block, chunking.chunk_bytes, mix.as_deref_mut());
            stats.records += r.records;
            for (line, error) in r.bad {
                if src.strict {
                    return Err(InputError::BadLine {
                        path: path.clone(),
                        line,
                        error,
                    }
                    .into());
                }
                stats.bad_lines += 1;
                printer.print(&Warning {
                    path: path.clone(),
                    line,
                    kind: WarningKind::BadLine(error),
                });
            }
        }
        if let End::Truncated { line, error } = blocks.end()? {
            if src.strict {
                return Err(InputError::Truncated {
                    path: path.clone(),
                    line,
                    error,
                }
                .into());
            }
            stats.truncated += 1;
            printer.print(&Warning {
                path: path.clone(),
                line,
                kind: WarningKind::Truncated(error),
            });
        }
    }
    if let Some(store) = &src.store {
        load_store(store, aggs, &mut stats, mix)?;
    }
    if stats.bad_lines > 0 || stats.truncated > 0 {
        let mut what = Vec::new();
        if stats.bad_lines > 0 {
            what.push(format!("skipped {}", plural(stats.bad_lines, "bad line")));
        }
        if stats.truncated > 0 {
            what.push(format!(
                "lost the tail of {}",
                plural(stats.truncated, "truncated gzip file")
            ));
        }
        eprintln!(
            "cpt: warning: {} (use --strict to fail instead)",
            what.join(", ")
        );
    }
    Ok(stats)
}

/// Fold the records of `inputs` (JSON Lines or Parquet, as `cpt profile`
/// reads them: bad lines skipped with a warning) and of the store at
/// `store` into `agg`, the selection's own. Returns how many records were
/// read.
///
/// # Errors
///
/// As `cpt profile`: no input, an unreadable input or store.
pub(crate) fn fold_sources(
    inputs: &[PathBuf],
    store: Option<&Path>,
    agg: &mut Aggregator,
) -> anyhow::Result<u64> {
    let src = SourceArgs {
        inputs: inputs.to_vec(),
        store: store.map(Path::to_path_buf),
        strict: false,
        from_aggregate: None,
    };
    Ok(load(&src, &mut [agg], None, None)?.records)
}

/// The time range covering every aggregator's selection (unbounded on a
/// side any of them leaves open).
fn union_range(aggs: &[&mut Aggregator]) -> (Option<u64>, Option<u64>) {
    let ranges: Vec<_> = aggs.iter().map(|a| a.selection().time_range()).collect();
    let since = ranges.iter().map(|r| r.0).collect::<Option<Vec<u64>>>();
    let until = ranges.iter().map(|r| r.1).collect::<Option<Vec<u64>>>();
    (
        since.and_then(|v| v.into_iter().min()),
        until.and_then(|v| v.into_iter().max()),
    )
}

#[cfg(feature = "server")]
fn load_store(
    path: &Path,
    aggs: &mut [&mut Aggregator],
    stats: &mut LoadStats,
    mut mix: Option<&mut EntryServices>,
) -> anyhow::Result<()> {
    crate::records::check_store(path)?;
    // The store's errors name it and include SQLite's message: print them
    // alone, not with their source chain (which repeats SQLite's text).
    let store =
        crate::server::store::Store::open_read_only(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    // Each selection pushed down and folded from the packed paths: one
    // read per aggregator (diff has two), each of only what it selects.
    let progress = Progress::new(
        None,
        "{spinner} {human_pos} stored records ({per_sec}) {elapsed}",
    );
    for (i, a) in aggs.iter_mut().enumerate() {
        let shown = if i == 0 { mix.as_deref_mut() } else { None };
        let (read, source) = store
            .fold_profile(a, LINES_PER_BATCH, shown, &mut |n| progress.inc(n))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if source != crate::server::store::ProfileSource::Raw {
            eprintln!(
                "cpt: {} (selection {}) answered from the store's {source}",
                path.display(),
                a.selection()
            );
        }
        if i == 0 {
            stats.records += read;
        }
    }
    Ok(())
}

#[cfg(not(feature = "server"))]
fn load_store(
    path: &Path,
    _: &mut [&mut Aggregator],
    _: &mut LoadStats,
    _: Option<&mut EntryServices>,
) -> anyhow::Result<()> {
    bail!(
        "--store {}: this cpt was built without the `server` feature (no SQLite store)",
        path.display()
    )
}

/// Load, aggregate one selection, merge any profile inputs.
fn aggregate(src: &SourceArgs, select: &SelectArgs, histograms: bool) -> anyhow::Result<Aggregate> {
    let sel = select.selection();
    if let Some(path) = &src.from_aggregate {
        let mut agg = from_aggregate_file(path, &sel, histograms)?;
        agg.group_waits(select.waits);
        return Ok(agg);
    }
    let mut agg = Aggregator::new(sel.clone()).with_histograms(histograms);
    let mut profiles = Vec::new();
    let mut mix = EntryServices::default();
    let stats = load(src, &mut [&mut agg], Some(&mut profiles), Some(&mut mix))?;
    if !profiles.is_empty() && sel != Selection::new() {
        bail!(
            "selection flags apply to records, not to profile inputs (a profile is already a \
             selection); drop the flags or give JSON Lines records"
        );
    }
    let matched = agg.matched();
    let mut out = agg.finish();
    out.group_waits(select.waits);
    eprintln!(
        "cpt: {} read, {} the selection{}, {} aggregated{}",
        plural(stats.records, "record"),
        if matched == 1 {
            "1 matched".to_owned()
        } else {
            format!("{matched} matched")
        },
        match sel.percentile() {
            Some(b) => format!(" before the percentile band p{}-p{}", b.lo(), b.hi()),
            None => String::new(),
        },
        out.requests(),
        if stats.profiles > 0 {
            format!(", {} merged in", plural(stats.profiles as u64, "profile"))
        } else {
            String::new()
        }
    );
    if let Some(w) = mix.warning() {
        eprintln!("cpt: warning: {w}");
    }
    for p in &profiles {
        out.merge(p);
    }
    if out.requests() == 0 {
        eprintln!("cpt: warning: the selection is empty (check --service, --trigger, time range)");
    }
    Ok(out)
}

/// Read an aggregate file (`--from-aggregate`): the selection was the job's.
fn from_aggregate_file(
    path: &Path,
    sel: &Selection,
    histograms: bool,
) -> anyhow::Result<Aggregate> {
    if *sel != Selection::new() {
        bail!(
            "--from-aggregate {}: the selection was applied when the aggregate was computed \
             ({sel} given here); pass these flags to cpt_aggregate.py instead and drop them here",
            path.display()
        );
    }
    let file = crate::profile::aggregate::file::read_path(path)?;
    if histograms && !file.stack_histograms {
        bail!(
            "{}: computed without per-stack histograms (cpt_aggregate.py --no-histograms); \
             re-run it without that flag for `cpt histogram`",
            path.display()
        );
    }
    eprintln!(
        "cpt: {}: aggregate of {} ({} matched the selection{}), selection {}",
        path.display(),
        plural(file.aggregate.requests(), "request"),
        file.matched,
        match file.selection.percentile() {
            Some(b) => format!(" before the percentile band p{}-p{}", b.lo(), b.hi()),
            None => String::new(),
        },
        file.selection
    );
    if file.aggregate.requests() == 0 {
        eprintln!("cpt: warning: the selection is empty (check --service, --trigger, time range)");
    }
    Ok(file.aggregate)
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
        "{}, mean latency {}, {}",
        plural(agg.requests(), "request"),
        fmt_ns(agg.mean_latency().as_nanos() as u64),
        plural(agg.stacks().len() as u64, "stack")
    )
}

/// Write the selection's average critical path as a gzipped pprof profile.
///
/// Sample values are mean nanoseconds per request (pprof's total is the mean latency).
///
/// Warns when the selected records come from more than one entry service (a record's service
/// is the one whose request is its root), and names a service that appears on another's paths:
/// its records are calls it sampled itself, counted twice. Select one with --service.
#[derive(Debug, clap::Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    select: SelectArgs,
    #[command(flatten)]
    source: SourceArgs,
    /// Ask a running collector (`cpt serve --http`, e.g. http://127.0.0.1:7071) for the profile
    /// (its GET /profile) instead of folding records here.
    #[arg(long, value_name = "URL", conflicts_with_all = ["inputs", "store", "from_aggregate"])]
    collector: Option<String>,
    /// How to read from the collector (its read token).
    #[command(flatten)]
    remote: super::remote::RemoteArgs,
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
    if let Some(url) = &args.collector {
        let remote = super::remote::Remote::new(url, &args.remote)?;
        let query = super::remote::selection_query(&args.select.selection());
        let answer = remote.get("/profile", &query)?;
        let body = match args.select.waits {
            Waits::Site => answer.body.clone(),
            waits => {
                let mut agg = profile::read_aggregate(&answer.body)
                    .context("the collector's profile does not read")?;
                agg.group_waits(waits);
                profile::encode_gzip(&agg)
            }
        };
        write_out(Some(&args.output), &body)?;
        eprintln!(
            "cpt: wrote {} ({} bytes) from the collector at {url}",
            args.output.display(),
            body.len()
        );
        if let Some(source) = answer.profile_source() {
            eprintln!("cpt: the collector answered from its {source}");
        }
        if answer.forced_withheld() {
            eprintln!("cpt: note: the collector has no read token, so forced records are left out");
        }
        eprintln!(
            "cpt: open it with: go tool pprof -http=: {}",
            args.output.display()
        );
        return Ok(());
    }
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
/// Reading the same inputs, the arms must be disjoint (different values of one label, service,
/// endpoint or trigger, time ranges that do not meet, or bands that do not overlap); overlapping
/// arms are refused, since their intervals would assume independent samples.
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
    /// The base arm as an aggregate file (`cpt_aggregate.py --output`); with --test-aggregate,
    /// compares two aggregates computed elsewhere (e.g. on Spark).
    #[arg(long, value_name = "FILE", requires = "test_aggregate", conflicts_with_all = ["inputs", "store", "base", "test", "base_inputs", "test_inputs", "from_aggregate"])]
    base_aggregate: Option<PathBuf>,
    /// The test arm as an aggregate file (see --base-aggregate).
    #[arg(long, value_name = "FILE", requires = "base_aggregate")]
    test_aggregate: Option<PathBuf>,
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
    if args.source.from_aggregate.is_some() {
        bail!("a diff has two arms: give --base-aggregate FILE and --test-aggregate FILE");
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
    let (mut base, mut test) = match (&args.base_aggregate, &args.test_aggregate) {
        (Some(b), Some(t)) => (
            from_aggregate_file(b, &common, false)?,
            from_aggregate_file(t, &common, false)?,
        ),
        _ => diff_arms(&args, base_sel, test_sel)?,
    };
    base.group_waits(args.select.waits);
    test.group_waits(args.select.waits);
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

/// Fold the two arms of a diff from records.
fn diff_arms(
    args: &DiffArgs,
    base_sel: Selection,
    test_sel: Selection,
) -> anyhow::Result<(Aggregate, Aggregate)> {
    if args.base_inputs.is_empty() && args.test_inputs.is_empty() && !disjoint(&base_sel, &test_sel)
    {
        bail!(
            "{}base ({base_sel}) and test ({test_sel}) can select the same records; a diff \
             compares two disjoint sets (its intervals assume independent samples). Make the arms \
             exclusive, e.g. --base label=arm=a --test label=arm=b, --base until=T --test since=T, \
             --base percentile=p0-p50 --test percentile=p50-p100, or give --base-input / \
             --test-input",
            if args.test.is_empty() || args.base.is_empty() {
                "--base and --test each need a filter: without one an arm is every selected \
                 record, the other arm's included. "
            } else {
                ""
            }
        );
    }
    let mut base = Aggregator::new(base_sel);
    let mut test = Aggregator::new(test_sel);
    let arm_source = |inputs: &[PathBuf]| SourceArgs {
        inputs: inputs.to_vec(),
        store: None,
        strict: args.source.strict,
        from_aggregate: None,
    };
    match (args.base_inputs.is_empty(), args.test_inputs.is_empty()) {
        (true, true) => {
            load(&args.source, &mut [&mut base, &mut test], None, None)?;
        }
        (false, false) => {
            load(&arm_source(&args.base_inputs), &mut [&mut base], None, None)?;
            load(&arm_source(&args.test_inputs), &mut [&mut test], None, None)?;
        }
        (false, true) => {
            load(&arm_source(&args.base_inputs), &mut [&mut base], None, None)?;
            load(&args.source, &mut [&mut test], None, None)?;
        }
        (true, false) => {
            load(&args.source, &mut [&mut base], None, None)?;
            load(&arm_source(&args.test_inputs), &mut [&mut test], None, None)?;
        }
    }
    Ok((base.finish(), test.finish()))
}

/// Whether no record can be in both selections (provably, from the filters):
/// different triggers, services, endpoints or values of one label, time
/// ranges that do not meet, or percentile bands that do not overlap over the
/// same otherwise-equal selection (adjacent bands partition exactly).
fn disjoint(a: &Selection, b: &Selection) -> bool {
    use TriggerFilter::{Forced, Sampled};
    let differ = |x: Option<&str>, y: Option<&str>| matches!((x, y), (Some(x), Some(y)) if x != y);
    let triggers = matches!(
        (a.triggers(), b.triggers()),
        (Sampled, Forced) | (Forced, Sampled)
    );
    let labels = a
        .labels()
        .iter()
        .any(|(k, v)| b.labels().iter().any(|(k2, v2)| k == k2 && v != v2));
    let ((a_since, a_until), (b_since, b_until)) = (a.time_range(), b.time_range());
    let before = |until: Option<u64>, since: Option<u64>| matches!((until, since), (Some(u), Some(s)) if u <= s);
    let times = before(a_until, b_since) || before(b_until, a_since);
    let bands = match (a.percentile(), b.percentile()) {
        (Some(x), Some(y)) => {
            let sorted = |s: &Selection| {
                let mut l = s.labels().to_vec();
                l.sort();
                l
            };
            let rest_equal = a.service() == b.service()
                && a.endpoint() == b.endpoint()
                && a.time_range() == b.time_range()
                && a.triggers() == b.triggers()
                && sorted(a) == sorted(b);
            rest_equal && (x.hi() <= y.lo() || y.hi() <= x.lo())
        }
        _ => false,
    };
    triggers
        || differ(a.service(), b.service())
        || differ(a.endpoint(), b.endpoint())
        || labels
        || times
        || bands
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
        let agg = crate::profile::pprof::read_file(path)?;
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
