//! The `cpt` command line: one clap [`Command`] per subcommand.
//!
//! Each subcommand lives in its own module exposing a `#[derive(clap::Args)]`
//! struct and a synchronous `run` function (commands that need tokio build a
//! runtime inside their `run`); see `/work/notes/cli.md` for the convention.
//! `src/bin/cpt.rs` only parses [`Cli`] and calls [`run`].

pub mod export;
pub mod force;
#[cfg(feature = "server")]
pub mod import;
pub(crate) mod load;
pub mod mystery;
pub mod predict;
pub mod profile;
pub mod reference;
pub mod remote;
#[cfg(feature = "server")]
pub mod serve;
pub mod show;
pub mod traces;
pub mod trend;

/// Critical path tracing: collect records, build latency profiles that pprof opens.
#[derive(Debug, clap::Parser)]
#[command(name = "cpt", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Write a selection's average critical path as a gzipped pprof profile.
    Profile(profile::ProfileArgs),
    /// Draw a selection's average critical path as a flame graph SVG.
    Flame(profile::FlameArgs),
    /// Print a selection as folded stacks (mean ns per request).
    Folded(profile::FoldedArgs),
    /// Per-stack latency histograms: how often on the path, how long when on it.
    Histogram(profile::HistogramArgs),
    /// Compare two selections with confidence intervals; profiles for pprof -diff_base.
    Diff(profile::DiffArgs),
    /// Merge profiles from several collectors, keeping the mean right.
    Merge(profile::MergeArgs),
    /// Run the collector (gRPC + HTTP ingest into a SQLite store, GET /profile).
    #[cfg(feature = "server")]
    Serve(Box<serve::ServeArgs>),
    /// Write records (JSON Lines, a store) as Parquet files for Spark and other engines.
    Export(export::ExportArgs),
    /// Load JSON Lines record files into a store.
    #[cfg(feature = "server")]
    Import(import::ImportArgs),
    /// Print headers that force a trace on one request (x-request-id, x-cpt-force).
    Force(force::ForceArgs),
    /// Show one request's critical path as a tree (by request id or trace id).
    Show(show::ShowArgs),
    /// Import Jaeger / Zipkin / OTLP traces and analyse their critical paths (CRISP).
    Traces(traces::TracesArgs),
    /// An endpoint's mean and p99 per hour over weeks, and the frames that took it (roll-ups).
    Trend(trend::TrendArgs),
}

/// Run a parsed command line.
///
/// # Errors
///
/// Whatever the subcommand reports; `main` prints it and exits with status 1.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Profile(a) => profile::run_profile(a),
        Command::Flame(a) => profile::run_flame(a),
        Command::Folded(a) => profile::run_folded(a),
        Command::Histogram(a) => profile::run_histogram(a),
        Command::Diff(a) => profile::run_diff(a),
        Command::Merge(a) => profile::run_merge(a),
        #[cfg(feature = "server")]
        Command::Serve(a) => serve::run(*a),
        #[cfg(feature = "server")]
        Command::Import(a) => import::run(a),
        Command::Export(a) => export::run(a),
        Command::Traces(a) => traces::run(a),
        Command::Force(a) => force::run(a),
        Command::Show(a) => show::run(a),
        Command::Trend(a) => trend::run(a),
    }
}
