//! `cpt serve`: run the collector.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;

use crate::server::store::Durability;
use crate::server::{
    Collector, DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_GROUP_RECORDS, DEFAULT_MAX_PENDING_BATCHES,
    ServeConfig,
};

/// Run the collector: accept record batches over gRPC (cpt.collector.v1.Collector/Export) and
/// HTTP (POST /v1/records, JSON Lines or protobuf) into a SQLite store, acknowledging each batch
/// only once it is durable, and answer GET /profile?service=…&percentile=… with a gzipped
/// profile.proto (`go tool pprof http://ADDR/profile?…`).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The SQLite store (created if missing; WAL mode).
    #[arg(long, value_name = "PATH")]
    pub store: PathBuf,
    /// gRPC listen address, or `off`. Port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7070")]
    pub grpc: String,
    /// HTTP listen address (ingest and profiles), or `off`.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7071")]
    pub http: String,
    /// Commit durability: `full` fsyncs every commit (survives power loss), `normal` survives a
    /// killed process but not a machine crash.
    #[arg(long, value_name = "MODE", default_value = "full", value_parser = ["full", "normal"])]
    pub durability: String,
    /// Batches admitted but not yet stored, at most; beyond it requests get HTTP 429 /
    /// RESOURCE_EXHAUSTED (memory stays bounded by this times --max-batch-bytes).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_PENDING_BATCHES)]
    pub max_pending_batches: usize,
    /// Largest batch body accepted, in bytes (HTTP 413 / OUT_OF_RANGE above).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BATCH_BYTES)]
    pub max_batch_bytes: usize,
    /// Records committed in one group transaction, at most.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_GROUP_RECORDS)]
    pub max_group_records: usize,
}

fn parse_addr(flag: &str, s: &str) -> anyhow::Result<Option<SocketAddr>> {
    if s == "off" {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .with_context(|| format!("--{flag} {s:?}: expected IP:PORT (e.g. 127.0.0.1:7070) or `off`"))
}

/// Run `cpt serve` until Ctrl-C or SIGTERM.
///
/// # Errors
///
/// Bad addresses, a store that cannot be opened, an address in use, or a server failure.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let grpc = parse_addr("grpc", &args.grpc)?;
    let http = parse_addr("http", &args.http)?;
    anyhow::ensure!(
        grpc.is_some() || http.is_some(),
        "both --grpc and --http are off: nothing to serve"
    );
    let durability = Durability::parse(&args.durability).expect("clap checked the value");
    let mut config = ServeConfig::new(&args.store)
        .with_durability(durability)
        .with_max_pending_batches(args.max_pending_batches)
        .with_max_batch_bytes(args.max_batch_bytes)
        .with_max_group_records(args.max_group_records);
    config.grpc = grpc;
    config.http = http;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    rt.block_on(async move {
        let collector = Collector::start(config).await?;
        eprintln!(
            "cpt serve: store {} (WAL, synchronous={})",
            args.store.display(),
            args.durability.to_uppercase()
        );
        if let Some(a) = collector.grpc_addr() {
            eprintln!("cpt serve: grpc listening on {a}");
        }
        if let Some(a) = collector.http_addr() {
            eprintln!("cpt serve: http listening on http://{a}");
            eprintln!(
                "cpt serve: profiles: go tool pprof -http=: 'http://{a}/profile?service=SERVICE'"
            );
        }
        collector.run_until(shutdown_signal()).await?;
        eprintln!("cpt serve: stopped");
        Ok(())
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    eprintln!("cpt serve: shutting down (finishing pending batches)");
}
