//! The CPT Figure 1 demo: start services A, B and C on loopback, drive load
//! with sampling plus a few forced requests, write the records as JSON Lines.
//!
//! ```text
//! cargo run --release --bin demo -- --requests 2000 --out ./cpt-demo-out
//! ```
//!
//! Each service can also run alone (`--only a --addr 127.0.0.1:50051
//! --b-addr … --c-addr …`), writing its own records to `--out`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use cpt_examples::proto::{GrpcClient, RunReply, RunRequest, method};
use cpt_examples::system::{self, Config};
use cpt_middleware::{ForceAuth, header};
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::{Record, SegmentKind, Trigger};
use tracing_subscriber::prelude::*;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Only {
    A,
    B,
    C,
}

/// Run the CPT Figure 1 system (services A, B, C) and write critical-path records.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Requests to send to A.
    #[arg(long, default_value_t = 1000)]
    requests: u64,
    /// Output directory: records go to DIR/records.jsonl.
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

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating output directory {}", args.out.display()))?;
    let records_path = args.out.join("records.jsonl");
    let file = File::create(&records_path)
        .with_context(|| format!("creating {}", records_path.display()))?;
    let sink = JsonLinesSink(Arc::new(Mutex::new(BufWriter::new(file))));

    let (layer, handle) = CriticalPathLayer::builder()
        .with_service("demo")
        .with_sink(sink.clone())
        .build();
    // Library spans below INFO (h2, hyper, tower create them per poll) are
    // off, as in a typical service; cpt's and the services' spans are INFO.
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
    if let Some(only) = args.only {
        return runtime.block_on(run_one(only, &args, config));
    }
    let force_key = config.force_key.clone();
    let summary = runtime.block_on(async {
        let addrs = system::start_all(config).await?;
        drive(&args, addrs.a, &force_key).await
    })?;
    // Records are emitted as the entry service finishes; give the sink a
    // moment for the last ones, then flush.
    std::thread::sleep(Duration::from_millis(200));
    sink.flush()?;
    drop(runtime);

    let records = read_records(&records_path)?;
    print_summary(&args, &summary, &records, handle.records_emitted());
    write_profile(&args.out, &records)?;
    Ok(())
}

/// A [`cpt_sdk::RecordSink`] appending JSON Lines to a file.
#[derive(Clone)]
struct JsonLinesSink(Arc<Mutex<BufWriter<File>>>);

impl cpt_sdk::RecordSink for JsonLinesSink {
    fn emit(&self, record: Record) {
        let mut line = record.to_json();
        line.push('\n');
        if let Ok(mut w) = self.0.lock()
            && let Err(e) = w.write_all(line.as_bytes())
        {
            eprintln!("demo: writing a record failed: {e}");
        }
    }
}

impl JsonLinesSink {
    fn flush(&self) -> anyhow::Result<()> {
        self.0
            .lock()
            .map_err(|_| anyhow::anyhow!("record writer poisoned"))?
            .flush()?;
        Ok(())
    }
}

async fn run_one(only: Only, args: &Args, config: Config) -> anyhow::Result<()> {
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

struct DriveSummary {
    latencies: Vec<Duration>,
    errors: u64,
    elapsed: Duration,
}

/// Send `--requests` requests to A, `--concurrency` at a time; alternate
/// sequential and parallel calls; force `--forced` of them.
async fn drive(args: &Args, a: SocketAddr, force_key: &str) -> anyhow::Result<DriveSummary> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{a}"))?
        .tcp_nodelay(true)
        .connect()
        .await
        .context("connecting to A")?;
    let client = GrpcClient::new(channel);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let every = args
        .requests
        .checked_div(args.forced)
        .map_or(u64::MAX, |n| n.max(1));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (mut client, next) = (client.clone(), next.clone());
        let (requests, items, key) = (args.requests, args.items, force_key.to_owned());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                let mut req = tonic::Request::new(RunRequest {
                    parallel: i % 2 == 1,
                    key: i,
                    items,
                });
                let id = format!("demo-{i}");
                if i % every == every / 2 {
                    let cred = ForceAuth::sign(&key, &id);
                    req.metadata_mut()
                        .insert(key_of(&header::FORCE), cred.parse().expect("hex is ASCII"));
                }
                req.metadata_mut().insert(
                    key_of(&header::REQUEST_ID),
                    id.parse().expect("ids are ASCII"),
                );
                let t = Instant::now();
                match client
                    .unary::<RunRequest, RunReply>(method::A_RUN, req)
                    .await
                {
                    Ok(_) => latencies.push(t.elapsed()),
                    Err(e) => {
                        errors += 1;
                        if errors <= 3 {
                            eprintln!("demo: request {i} failed: {e}");
                        }
                    }
                }
            }
            (latencies, errors)
        }));
    }
    let mut summary = DriveSummary {
        latencies: Vec::new(),
        errors: 0,
        elapsed: Duration::ZERO,
    };
    for w in workers {
        let (l, e) = w.await?;
        summary.latencies.extend(l);
        summary.errors += e;
    }
    summary.elapsed = start.elapsed();
    Ok(summary)
}

fn key_of(name: &http::HeaderName) -> tonic::metadata::AsciiMetadataKey {
    tonic::metadata::AsciiMetadataKey::from_bytes(name.as_str().as_bytes())
        .expect("cpt header names are valid metadata keys")
}

fn read_records(path: &Path) -> anyhow::Result<Vec<Record>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .enumerate()
        .map(|(i, l)| Record::from_json(l).with_context(|| format!("{}:{}", path.display(), i + 1)))
        .collect()
}

fn print_summary(args: &Args, s: &DriveSummary, records: &[Record], emitted: u64) {
    let mut lat = s.latencies.clone();
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!(
        "sent {} requests to A in {:.2?} ({:.0} req/s, {} failed); client latency p50 {:.2?}, p99 {:.2?}",
        s.latencies.len() as u64 + s.errors,
        s.elapsed,
        s.latencies.len() as f64 / s.elapsed.as_secs_f64(),
        s.errors,
        pct(0.5),
        pct(0.99)
    );
    let forced = records
        .iter()
        .filter(|r| r.trigger == Trigger::Forced)
        .count();
    println!(
        "{} records ({} sampled, {} forced; SDK emitted {emitted}) in {}",
        records.len(),
        records.len() - forced,
        forced,
        args.out.join("records.jsonl").display()
    );
    let services: std::collections::BTreeSet<&str> = records
        .iter()
        .flat_map(|r| r.path.frames().iter().map(|f| &*f.service))
        .collect();
    println!("services on the paths: {services:?}");
    // Mean time per request by leaf frame (what a profile's "flat" view shows).
    let sampled: Vec<&Record> = records
        .iter()
        .filter(|r| r.trigger == Trigger::Sampled)
        .collect();
    if sampled.is_empty() {
        return;
    }
    let mut by_leaf: HashMap<String, Duration> = HashMap::new();
    for r in &sampled {
        for seg in r.path.segments() {
            let leaf = seg.stack.last().map(|id| r.path.frame(*id));
            let name = match (leaf, seg.kind) {
                (Some(f), SegmentKind::Busy) => format!("{} ({})", f.name, f.service),
                (Some(f), kind) => format!("{} ({}) [{kind}]", f.name, f.service),
                (None, kind) => format!("[{kind}]"),
            };
            *by_leaf.entry(name).or_default() += seg.duration;
        }
    }
    let mut rows: Vec<_> = by_leaf.into_iter().collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.1));
    let n = sampled.len() as u32;
    let mean: Duration = sampled.iter().map(|r| r.latency).sum::<Duration>() / n;
    println!("mean sampled latency {mean:.2?}; critical path by leaf (mean per request):");
    for (name, total) in rows.iter().take(12) {
        let per = *total / n;
        println!(
            "  {:>9.2?} {:>5.1}%  {name}",
            per,
            100.0 * per.as_secs_f64() / mean.as_secs_f64()
        );
    }
}

/// Aggregate the sampled records (forced ones are left out, as in every
/// profile by default) into DIR/profile.pb.gz, a gzipped pprof profile.
fn write_profile(out: &Path, records: &[Record]) -> anyhow::Result<()> {
    use cpt_collector::{aggregate::Aggregate, profile, selection::Selection};
    let agg = Aggregate::from_records(&Selection::new(), records);
    let path = out.join("profile.pb.gz");
    std::fs::write(&path, profile::encode_gzip(&agg))
        .with_context(|| format!("writing {}", path.display()))?;
    println!(
        "profile of {} sampled requests: {}\n  go tool pprof -http=: {}",
        agg.requests(),
        path.display(),
        path.display()
    );
    Ok(())
}
