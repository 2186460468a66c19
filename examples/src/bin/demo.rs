//! The CPT Figure 1 demo: start services A, B and C on loopback, drive load
//! with sampling plus a few forced requests, write the records as JSON Lines
//! and ship them to a collector (in process by default), then write the
//! profile. See [`cpt_examples::demo`].
//!
//! ```text
//! cargo run --release --bin demo -- --requests 2000 --out ./cpt-demo-out
//! cargo run --release --bin demo -- --collector grpc://127.0.0.1:7070
//! ```
//!
//! Each service can also run alone (`--only a --addr 127.0.0.1:50051
//! --b-addr … --c-addr …`), writing its own records to `--out` (and to
//! `--collector` if given) until Ctrl-C.

use std::io::BufWriter;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use cpt_examples::demo::{self, CollectorMode, DemoConfig, FanOut};
use cpt_examples::system::{self, Config};
use cpt_exporter::{CollectorClient, Endpoint};
use cpt_sdk::export::{ExportHandle, Exporter};
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::sink::JsonLines;
use tracing_subscriber::prelude::*;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Only {
    A,
    B,
    C,
}

/// Run the CPT Figure 1 system (services A, B, C), write critical-path
/// records and ship them to a collector.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Requests to send to A.
    #[arg(long, default_value_t = 1000)]
    requests: u64,
    /// Output directory: DIR/records.jsonl, DIR/profile.pb.gz and, with the
    /// in-process collector, DIR/store.db.
    #[arg(long, default_value = "cpt-demo-out")]
    out: PathBuf,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// A's sampling probability.
    #[arg(long, default_value_t = 0.1)]
    sample_rate: f64,
    /// Requests forced by an operator (x-cpt-force with a valid credential).
    #[arg(long, default_value_t = 5)]
    forced: u64,
    /// Items B2 scans from C's streaming RPC per request.
    #[arg(long, default_value_t = 3)]
    items: u32,
    /// Ship records to this running `cpt serve` (grpc://HOST:PORT or
    /// http://HOST:PORT) instead of a collector started in process.
    #[arg(long, value_name = "URL", conflicts_with = "no_collector")]
    collector: Option<String>,
    /// Do not ship records to a collector; only write DIR/records.jsonl.
    #[arg(long)]
    no_collector: bool,
    /// Keep batches the collector could not take in this on-disk spool and
    /// replay them when it answers (this run or the next); also
    /// CPT_SPOOL_DIR.
    #[arg(long, value_name = "DIR", conflicts_with = "no_collector")]
    spool: Option<PathBuf>,
    /// Seconds the end of the run waits for the exporters to ship what is
    /// queued before giving up with an error.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    flush_timeout: f64,
    /// Run only this service (with --addr and the addresses of its callees).
    #[arg(long, value_enum)]
    only: Option<Only>,
    /// With --only: this service's gRPC address.
    #[arg(long)]
    addr: Option<SocketAddr>,
    /// With --only a: B's address.
    #[arg(long)]
    b_addr: Option<SocketAddr>,
    /// With --only a|b: C's gRPC address.
    #[arg(long)]
    c_addr: Option<SocketAddr>,
    /// With --only b|c: C's HTTP address.
    #[arg(long)]
    c_http_addr: Option<SocketAddr>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the context chain on one line, without a backtrace.
            eprintln!("demo: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.flush_timeout.is_finite() && args.flush_timeout > 0.0,
        "--flush-timeout must be a positive number of seconds, not {}",
        args.flush_timeout
    );
    if let Some(only) = args.only {
        return run_one(only, &args);
    }
    let collector = match (&args.collector, args.no_collector) {
        (_, true) => CollectorMode::Off,
        (Some(url), false) => CollectorMode::External(url.clone()),
        (None, false) => CollectorMode::InProcess,
    };
    let config = DemoConfig::new(&args.out)
        .with_requests(args.requests)
        .with_concurrency(args.concurrency)
        .with_sample_rate(args.sample_rate)
        .with_forced(args.forced)
        .with_items(args.items)
        .with_collector(collector)
        .with_flush_timeout(Duration::from_secs_f64(args.flush_timeout));
    let config = match &args.spool {
        Some(dir) => config.with_spool(dir),
        None => config,
    };
    demo::run(&config)?;
    Ok(())
}

/// One service alone until Ctrl-C; its records go to DIR/records.jsonl and
/// to `--collector` if given, then both are flushed.
fn run_one(only: Only, args: &Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating output directory {}", args.out.display()))?;
    let records_path = args.out.join("records.jsonl");
    let file = std::fs::File::create(&records_path)
        .with_context(|| format!("creating {}", records_path.display()))?;
    let (file_sink, file_handle) = Exporter::builder().build(JsonLines::new(BufWriter::new(file)));
    let mut handles = vec![("records.jsonl", file_handle)];
    let mut sink = FanOut::new().with(file_sink);
    if let Some(url) = &args.collector {
        let mut client = CollectorClient::builder(Endpoint::parse(url)?).try_with_default_env()?;
        if let Some(dir) = &args.spool {
            client = client.with_spool(dir, cpt_exporter::DEFAULT_SPOOL_MAX_BYTES);
        }
        let client = client.try_build()?;
        let (s, h) = Exporter::builder().build(client);
        sink = sink.with(s);
        handles.push(("collector", h));
    }
    let (layer, layer_handle) = CriticalPathLayer::builder()
        .with_service("demo")
        .with_sink(sink)
        .build();
    tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(layer)
        .init();
    let config = Config {
        sample_rate: args.sample_rate,
        ..Config::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let served = runtime.block_on(async {
        tokio::select! {
            r = serve_one(only, args, config) => r,
            r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C"),
        }
    });
    drop(runtime);
    let timeout = Duration::from_secs_f64(args.flush_timeout);
    // Records of the last requests may still be on the layer's background
    // thread: hand them to the exporters before flushing those.
    if !layer_handle.flush(timeout) {
        eprintln!("demo: the layer did not emit every record within {timeout:?}");
    }
    for (what, handle) in handles {
        finish(what, handle, timeout);
    }
    served
}

fn finish(what: &str, handle: ExportHandle, timeout: Duration) {
    let flushed = handle.flush(timeout);
    eprintln!(
        "demo: {what}: {} exported, {} dropped, {} failed",
        handle.exported(),
        handle.dropped(),
        handle.failed()
    );
    if !flushed || !handle.shutdown_timeout(timeout) {
        eprintln!("demo: the {what} exporter did not finish within {timeout:?}");
    }
}

async fn serve_one(only: Only, args: &Args, config: Config) -> anyhow::Result<()> {
    let need = |a: Option<SocketAddr>, flag: &str| {
        a.with_context(|| format!("--only {only:?} needs {flag}"))
    };
    let addr = need(args.addr, "--addr")?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let config = Arc::new(config);
    eprintln!(
        "demo: service {only:?} on {addr}; records to {}",
        args.out.display()
    );
    match only {
        Only::A => {
            let b = need(args.b_addr, "--b-addr")?;
            let c = need(args.c_addr, "--c-addr")?;
            system::serve_a(config, listener, b, c).await
        }
        Only::B => {
            let c = need(args.c_addr, "--c-addr")?;
            let ch = need(args.c_http_addr, "--c-http-addr")?;
            system::serve_b(config, listener, c, ch).await
        }
        Only::C => {
            let ch = need(args.c_http_addr, "--c-http-addr")?;
            let http = tokio::net::TcpListener::bind(ch).await?;
            system::serve_c(config, listener, http).await
        }
    }
}
