//! `cpt traces …`: import Jaeger / Zipkin / OTLP traces and analyse their
//! critical paths (CRISP).

use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cpt_sdk::Record;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::format::plural;
use crate::profile::diff::DiffOptions;
use crate::traces::analysis::{bottomup, heatmap, histograms, topdown};
use crate::traces::{
    BuildOptions, Endpoint, Format, Import, ImportOptions, OverlapThreshold, RepairOptions,
    RootSelector, import_files,
};

/// Import distributed traces (Jaeger, Zipkin v2, OTLP JSON) of services
/// without the SDK and analyse their critical paths (CRISP).
#[derive(Debug, clap::Args)]
pub struct TracesArgs {
    /// What to do with the traces.
    #[command(subcommand)]
    pub command: TracesCommand,
}

/// The `cpt traces` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TracesCommand {
    /// Write one cpt record per selected root span as JSON Lines.
    Convert(ConvertArgs),
    /// Per endpoint: profiles of the P50 / P95 / P99 latency windows.
    Topdown(TopdownArgs),
    /// Compare two latency windows of one endpoint (diff with confidence intervals).
    Diff(WindowDiffArgs),
    /// Rank operations over all endpoints by critical-path time and endpoints affected.
    Bottomup(BottomupArgs),
    /// Histograms: spans per trace, critical-path length, depth, concurrency.
    Histograms(HistogramsArgs),
    /// Heat map operations × traces as a self-contained HTML page.
    Heatmap(HeatmapArgs),
    /// Predict parents' latencies from their children's (Mann et al.'s
    /// execution flows and baselines) and report Mann Table 1.
    Predict(super::predict::PredictArgs),
    /// What if an operation were faster? Replay traces through learned
    /// execution flows with its latency scaled and predict the roots.
    Whatif(super::predict::WhatifArgs),
    /// Infer the causal model from the traces (the Mystery Machine:
    /// happens-before, mutual exclusion, pipeline) and its convergence.
    Model(super::mystery::ModelArgs),
    /// Critical path through the inferred model and the slack of every span
    /// (the Mystery Machine).
    Slack(super::mystery::SlackArgs),
    /// Rank call paths by how much more of the critical path they take in
    /// the slowest requests (the Mystery Machine's outlier analysis).
    Outliers(super::mystery::OutliersArgs),
    /// Score test traces by how unusual their critical paths are against
    /// training traces (CRISP's PCA anomaly detection).
    Anomalies(super::mystery::AnomaliesArgs),
}

/// Input files and import choices shared by every `cpt traces` command.
#[derive(Debug, clap::Args)]
pub struct InputArgs {
    /// Trace file format.
    #[arg(long = "from", value_name = "jaeger|zipkin|otlp|nezha", value_parser = parse_format)]
    pub from: Format,
    /// Trace files (gzipped or not).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Analyse spans of this endpoint, `SERVICE[:OPERATION]` (repeatable);
    /// default: every root span.
    #[arg(long = "root", value_name = "SERVICE[:OPERATION]")]
    pub roots: Vec<Endpoint>,
    /// Keep spans whose parent is missing as extra roots instead of
    /// rejecting their trace.
    #[arg(long)]
    pub orphans_as_roots: bool,
    /// Do not shift server spans by the client/server round trip; only
    /// truncate and drop (CRISP §5.2 as published).
    #[arg(long)]
    pub no_shift: bool,
    /// Largest sibling overlap read as sequential, µs (CRISP: 1000).
    #[arg(long, default_value_t = 1000, value_name = "US")]
    pub overlap_max_us: u64,
    /// ...and at most this fraction of the parent's duration.
    #[arg(long, default_value_t = 0.01, value_name = "FRACTION")]
    pub overlap_fraction: f64,
    /// How the critical path's time is shared between spans: `cpt` (each
    /// instant on one span; overlapping siblings cut at the later one's
    /// start; a client's own time around its server is network) or
    /// `crisp` (CRISP's reference: every span on the path its full
    /// duration, its parent the rest; see the CRISP accounting reference).
    #[arg(long, default_value = "cpt", value_name = "cpt|crisp")]
    pub accounting: crate::traces::Accounting,
    /// Stream Jaeger, Zipkin and OTLP files larger than this (decompressed)
    /// instead of reading them whole, MiB.
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub stream_above_mib: u64,
    /// Write every rejected trace with its reason to this file.
    #[arg(long, value_name = "FILE")]
    pub errors: Option<PathBuf>,
    /// No progress bar or summary on stderr (why traces were rejected is
    /// still shown when none could be analysed).
    #[arg(long, short)]
    pub quiet: bool,
}

fn parse_format(s: &str) -> Result<Format, String> {
    s.parse()
}

impl InputArgs {
    fn options(&self) -> anyhow::Result<ImportOptions> {
        if !(0.0..=1.0).contains(&self.overlap_fraction) {
            bail!(
                "--overlap-fraction {} must be within 0..=1",
                self.overlap_fraction
            );
        }
        Ok(ImportOptions {
            build: BuildOptions {
                orphans_as_roots: self.orphans_as_roots,
            },
            repair: RepairOptions {
                shift_rpc: !self.no_shift,
            },
            overlap: OverlapThreshold {
                max_ns: i64::try_from(self.overlap_max_us.saturating_mul(1000)).unwrap_or(i64::MAX),
                fraction: self.overlap_fraction,
            },
            accounting: self.accounting,
            roots: if self.roots.is_empty() {
                RootSelector::AllRoots
            } else {
                RootSelector::Endpoints(self.roots.clone())
            },
            stream_above_bytes: self.stream_above_mib.saturating_mul(1 << 20),
            otlp_labels: Vec::new(),
        })
    }

    /// Import with a progress bar, report rejected traces, fail when nothing
    /// could be analysed.
    fn import(&self) -> anyhow::Result<Import> {
        self.import_with(|_| {})
    }

    /// [`Self::import`] with options a subcommand adds to the shared ones.
    fn import_with(&self, more: impl FnOnce(&mut ImportOptions)) -> anyhow::Result<Import> {
        let mut opts = self.options()?;
        more(&mut opts);
        let started = Instant::now();
        let bar = if self.quiet {
            ProgressBar::hidden()
        } else {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("{spinner} {pos} traces read ({per_sec}) {elapsed}")
                    .expect("a valid progress template; this is a bug"),
            );
            b.enable_steady_tick(Duration::from_millis(120));
            b
        };
        let imp = import_files(&self.files, self.from, &opts, &|n| bar.set_position(n));
        bar.finish_and_clear();
        if let Some(path) = &self.errors {
            let mut w = BufWriter::new(
                fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
            );
            for e in &imp.errors {
                writeln!(w, "{e}")?;
            }
            w.flush()?;
        }
        // Files that could not be read are errors, shown even with --quiet.
        for e in &imp.file_errors {
            eprintln!("error: {e}");
        }
        for w in &imp.warnings {
            eprintln!("warning: {w}");
        }
        let s = &imp.stats;
        if !self.quiet {
            let a = &s.adjustments;
            eprintln!(
                "{}{}, {} ({} rejected), {}, {} in {:.2?}",
                plural(s.files, "file"),
                if s.failed_files > 0 {
                    format!(" ({} unreadable)", s.failed_files)
                } else {
                    String::new()
                },
                plural(s.traces, "trace"),
                s.rejected,
                plural(s.spans, "span"),
                plural(s.records, "record"),
                started.elapsed()
            );
            eprintln!(
                "clock-skew repair: {} shifted, {} truncated ({} µs), {} dropped ({} µs), {} read as sequential ({} µs)",
                plural(a.shifted_spans, "span"),
                a.truncated_spans,
                a.truncated_ns / 1000,
                a.dropped_spans,
                a.dropped_ns / 1000,
                plural(a.overlaps, "overlap"),
                a.overlap_ns / 1000
            );
            if a.overhang_spans > 0 {
                eprintln!(
                    "{} ended after their parent on the parent's clock: cut at its end, {} µs after it off the path (not skew)",
                    plural(a.overhang_spans, "span"),
                    a.overhang_ns / 1000
                );
            }
        }
        // Why traces were rejected; with --quiet only when that is why the
        // command fails.
        if !self.quiet || imp.analyzed.is_empty() {
            for e in imp.errors.iter().take(10) {
                eprintln!("rejected: {e}");
            }
            if imp.errors.len() > 10 {
                eprintln!(
                    "… and {} more rejected (see --errors FILE)",
                    imp.errors.len() - 10
                );
            }
        }
        if imp.analyzed.is_empty() {
            if s.failed_files == s.files {
                bail!(
                    "no trace could be analysed: {} could not be read",
                    if s.files == 1 {
                        "the file".to_owned()
                    } else {
                        format!("none of the {} files", s.files)
                    }
                );
            }
            bail!(
                "no trace could be analysed ({}{} read, {} rejected{}); are the files {} traces?",
                if s.failed_files > 0 {
                    format!("{} unreadable, ", plural(s.failed_files, "file"))
                } else {
                    String::new()
                },
                plural(s.traces, "trace"),
                s.rejected,
                if self.roots.is_empty() {
                    ""
                } else {
                    ", or no span matched --root"
                },
                self.from
            );
        }
        Ok(imp)
    }
}

/// `cpt traces convert`.
#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Output JSON Lines file (`-` = stdout).
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Also write CRISP's conformance CCT of all selected roots here (one
    /// line per call path: `[service] operation;… EXCLUSIVE_US
    /// <<SPANS>>`, byte-sorted), as CRISP's `--conformance` writes it.
    /// Needs `--accounting crisp`.
    #[arg(long, value_name = "FILE")]
    cct: Option<PathBuf>,
    /// `--from otlp`: resource or span attributes whose values become record labels (on the
    /// root span, else its resource), comma-separated or repeated, as `cpt serve --otlp-label`
    /// takes them, e.g. `service.version,deployment.environment`.
    #[arg(long, value_name = "KEYS", value_delimiter = ',')]
    otlp_label: Vec<String>,
}

/// `cpt traces topdown`.
#[derive(Debug, clap::Args)]
pub struct TopdownArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Latency windows, `NAME=BAND` or `BAND` (repeatable); default
    /// p50=p45-p55, p95=p94-p96, p99=p99-p100.
    #[arg(long = "window", value_name = "NAME=BAND", value_parser = topdown::Window::parse)]
    windows: Vec<topdown::Window>,
    /// Write one gzipped pprof profile per endpoint and window into this directory.
    #[arg(short = 'o', long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// Stacks shown per window.
    #[arg(long, default_value_t = 8)]
    top: usize,
    /// Skip endpoints with fewer records.
    #[arg(long, default_value_t = 1)]
    min_requests: u64,
}

/// `cpt traces diff`.
#[derive(Debug, clap::Args)]
pub struct WindowDiffArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Base window (`NAME=BAND` or `BAND`).
    #[arg(long, default_value = "p50=p45-p55", value_parser = topdown::Window::parse)]
    base: topdown::Window,
    /// Test window.
    #[arg(long, default_value = "p99=p99-p100", value_parser = topdown::Window::parse)]
    test: topdown::Window,
    /// The endpoint to compare, `SERVICE[:OPERATION]`; default: the one with most records.
    #[arg(long, value_name = "SERVICE[:OPERATION]")]
    endpoint: Option<Endpoint>,
    /// Also write the two windows as profiles `DIR/base.pb.gz`, `DIR/test.pb.gz`
    /// (for `go tool pprof -diff_base`).
    #[arg(short = 'o', long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// Confidence level of the intervals.
    #[arg(long, default_value_t = 0.95)]
    confidence: f64,
    /// Rows shown.
    #[arg(long, default_value_t = 15)]
    top: usize,
    /// Show the largest changes, flagged or not.
    #[arg(long)]
    all: bool,
}

/// `cpt traces bottomup`.
#[derive(Debug, clap::Args)]
pub struct BottomupArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Rows shown.
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Order by endpoints affected first (default: exclusive time).
    #[arg(long)]
    by_endpoints: bool,
    /// Also write every operation as CSV.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
}

/// `cpt traces histograms`.
#[derive(Debug, clap::Args)]
pub struct HistogramsArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Bins per histogram in the text output.
    #[arg(long, default_value_t = 16)]
    bins: usize,
    /// Also write the exact counts as CSV.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
}

/// `cpt traces heatmap`.
#[derive(Debug, clap::Args)]
pub struct HeatmapArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Output HTML file.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Sort operations by this percentile of their exclusive time (0-100).
    #[arg(long, default_value_t = 50.0)]
    sort_percentile: f64,
    /// At most this many traces (columns), taken at even latency ranks.
    #[arg(long, default_value_t = 600)]
    max_traces: usize,
    /// At most this many operations (rows).
    #[arg(long, default_value_t = 80)]
    max_rows: usize,
}

/// Run `cpt traces …`.
///
/// # Errors
///
/// Unreadable arguments, nothing analysable, or output that cannot be written.
pub fn run(args: TracesArgs) -> anyhow::Result<()> {
    match args.command {
        TracesCommand::Convert(a) => convert(a),
        TracesCommand::Topdown(a) => top_down(a),
        TracesCommand::Diff(a) => window_diff(a),
        TracesCommand::Bottomup(a) => bottom_up(a),
        TracesCommand::Histograms(a) => hists(a),
        TracesCommand::Heatmap(a) => heat(a),
        TracesCommand::Predict(a) => super::predict::predict(a),
        TracesCommand::Whatif(a) => super::predict::whatif(a),
        TracesCommand::Model(a) => super::mystery::model(a),
        TracesCommand::Slack(a) => super::mystery::slack(a),
        TracesCommand::Outliers(a) => super::mystery::outliers(a),
        TracesCommand::Anomalies(a) => super::mystery::anomalies(a),
    }
}

fn output(path: &Path) -> anyhow::Result<Box<dyn Write>> {
    if path.as_os_str() == "-" {
        Ok(Box::new(BufWriter::new(std::io::stdout().lock())))
    } else {
        let f = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Box::new(BufWriter::new(f)))
    }
}

fn records(imp: Import) -> Vec<Record> {
    imp.analyzed.into_iter().map(|a| a.record).collect()
}

fn convert(a: ConvertArgs) -> anyhow::Result<()> {
    if a.cct.is_some() && a.input.accounting != crate::traces::Accounting::Crisp {
        bail!("--cct writes CRISP's reference exclusive times: add --accounting crisp");
    }
    let labels: Vec<String> = a
        .otlp_label
        .iter()
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty())
        .collect();
    if !labels.is_empty() && a.input.from != Format::Otlp {
        bail!(
            "--otlp-label reads OpenTelemetry attributes: it needs --from otlp, not --from {}",
            a.input.from
        );
    }
    let imp = a.input.import_with(|o| o.otlp_labels = labels)?;
    if let Some(path) = &a.cct {
        let text = crate::traces::analysis::crisp_reference::conformance_cct(
            imp.analyzed.iter().map(|x| x.call_paths.as_slice()),
        );
        fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let mut w = output(&a.output)?;
    for r in imp.records() {
        w.write_all(r.to_json().as_bytes())?;
        w.write_all(b"\n")?;
    }
    w.flush()
        .with_context(|| format!("writing {}", a.output.display()))?;
    Ok(())
}

fn top_down(a: TopdownArgs) -> anyhow::Result<()> {
    let imp = a.input.import()?;
    let recs = records(imp);
    let windows = if a.windows.is_empty() {
        topdown::default_windows()
    } else {
        a.windows
    };
    let reports = topdown::top_down(&recs, &windows, a.min_requests);
    print!("{}", topdown::to_text(&reports, a.top));
    if let Some(dir) = &a.out_dir {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for r in &reports {
            for (w, agg) in &r.windows {
                let path = dir.join(format!(
                    "{}.pb.gz",
                    topdown::file_stem(&r.service, r.endpoint.as_deref(), &w.name)
                ));
                fs::write(&path, crate::profile::encode_gzip(agg))
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}

fn window_diff(a: WindowDiffArgs) -> anyhow::Result<()> {
    if !(a.confidence > 0.0 && a.confidence < 1.0) {
        bail!("--confidence {} must be within (0, 1)", a.confidence);
    }
    let imp = a.input.import()?;
    let recs = records(imp);
    let (service, endpoint) = match &a.endpoint {
        Some(e) => (e.service.clone(), e.operation.clone()),
        None => {
            let eps = topdown::endpoints(&recs);
            let (s, e, _) = eps.into_iter().next().context("no records")?;
            (s, e)
        }
    };
    let opts = DiffOptions {
        confidence: a.confidence,
        ..Default::default()
    };
    let (report, base, test) = topdown::window_diff(
        &recs,
        &service,
        endpoint.as_deref(),
        &a.base,
        &a.test,
        &opts,
    );
    println!(
        "{} {}: base {} = {}, test {} = {}",
        service,
        endpoint.as_deref().unwrap_or("(any)"),
        a.base.name,
        a.base.band,
        a.test.name,
        a.test.band
    );
    print!("{}", report.to_text(a.top, a.all));
    if let Some(dir) = &a.out_dir {
        fs::create_dir_all(dir)?;
        for (name, agg) in [("base", &base), ("test", &test)] {
            let path = dir.join(format!("{name}.pb.gz"));
            fs::write(&path, crate::profile::encode_gzip(agg))
                .with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn bottom_up(a: BottomupArgs) -> anyhow::Result<()> {
    let imp = a.input.import()?;
    let n = imp.analyzed.len() as u64;
    let endpoints = topdown::endpoints(
        &imp.analyzed
            .iter()
            .map(|x| x.record.clone())
            .collect::<Vec<_>>(),
    )
    .len();
    let mut ranks = bottomup::rank(imp.records());
    if a.by_endpoints {
        ranks = bottomup::by_endpoints(ranks);
    }
    println!(
        "{} over {}; per-request means over all records",
        plural(n, "record"),
        plural(endpoints as u64, "endpoint")
    );
    print!("{}", bottomup::to_text(&ranks, a.top, n));
    if let Some(path) = &a.csv {
        fs::write(path, bottomup::to_csv(&ranks))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn hists(a: HistogramsArgs) -> anyhow::Result<()> {
    let imp = a.input.import()?;
    let h = histograms::Histograms::from_shapes(imp.analyzed.iter().map(|x| &x.shape));
    print!("{}", h.to_text(a.bins));
    if let Some(path) = &a.csv {
        fs::write(path, h.to_csv()).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn heat(a: HeatmapArgs) -> anyhow::Result<()> {
    if !(0.0..=100.0).contains(&a.sort_percentile) {
        bail!(
            "--sort-percentile {} must be within 0..=100",
            a.sort_percentile
        );
    }
    let imp = a.input.import()?;
    let refs: Vec<&Record> = imp.records().collect();
    let opts = heatmap::HeatMapOptions {
        sort_quantile: a.sort_percentile / 100.0,
        max_traces: a.max_traces,
        max_rows: a.max_rows,
    };
    let map = heatmap::build(&refs, &opts);
    let title = format!("Critical-path heat map: {}", files_title(&a.input.files));
    fs::write(
        &a.output,
        heatmap::to_html(&map, &title, opts.sort_quantile),
    )
    .with_context(|| format!("writing {}", a.output.display()))?;
    if !a.input.quiet {
        eprintln!(
            "wrote {} ({} operations × {} traces)",
            a.output.display(),
            map.rows.len(),
            map.cols.len()
        );
    }
    Ok(())
}

fn files_title(files: &[PathBuf]) -> String {
    let names: Vec<String> = files
        .iter()
        .take(3)
        .map(|p| {
            p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let more = files.len().saturating_sub(3);
    if more > 0 {
        format!("{} and {more} more", names.join(", "))
    } else {
        names.join(", ")
    }
}
