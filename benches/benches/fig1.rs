//! The CPT Figure 1 system (services A, B, C over loopback gRPC + HTTP +
//! a streaming RPC) with every request traced, with tracing off, and with no
//! cpt middleware at all, side by side in one run.
//!
//! Prints request latency (mean, p50, p99) and closed-loop throughput per
//! configuration, and the ratios the middleware is held to:
//!
//! - traced / untraced (CPT reports 1.017× mean, 1.020× p99; target here
//!   ≤ 1.005× mean, ≤ 1.01× p99);
//! - middleware with tracing off / no middleware;
//! - the traced extra in absolute time (per request, per RPC hop, and CPU
//!   per request from throughput), which does not depend on the workload
//!   the way the ratios do.
//!
//! Configurations run in interleaved rounds so that drift on a shared
//! machine hits all of them alike. Each runs on its own runtime whose
//! threads have their own subscriber: the cpt layer for the first two, a
//! plain registry (spans, no cpt) for the baseline.
//!
//! `cargo bench --bench fig1`; `CPT_BENCH_ROUNDS` (default 12) and
//! `CPT_BENCH_REQUESTS` (per round and configuration, default 200) scale it;
//! `CPT_BENCH_WORK` (default 1.0) scales the subcomponents' simulated work
//! (0 measures the bare RPC and tracing costs). `CPT_BENCH_ONLY=N` runs
//! configuration N alone (0 traced, 1 untraced, 2 no cpt), for `perf` or
//! `strace -c`; no ratios are printed then.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cpt_examples::proto::RunRequest;
use cpt_examples::proto::service_a_client::ServiceAClient;
use cpt_examples::system::{self, Config, Work};
use cpt_sdk::layer::{CriticalPathLayer, Handle};
use tonic::transport::Channel;
use tracing::Dispatch;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;

struct Setup {
    name: &'static str,
    runtime: tokio::runtime::Runtime,
    client: ServiceAClient<Channel>,
    latencies: Vec<Duration>,
    throughput: Vec<f64>,
    /// The cpt layer's handle: its background path computations are
    /// waited for inside this configuration's throughput timing, so they
    /// neither go uncharged nor spill into the next configuration's round.
    layer: Option<Handle>,
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn work() -> Work {
    let scale: f64 = std::env::var("CPT_BENCH_WORK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let w = Work::default();
    Work {
        a1: w.a1.mul_f64(scale),
        a2: w.a2.mul_f64(scale),
        b1: w.b1.mul_f64(scale),
        b2: w.b2.mul_f64(scale),
        c1: w.c1.mul_f64(scale),
        c2: w.c2.mul_f64(scale),
    }
}

fn setup(name: &'static str, dispatch: Dispatch, config: Config, layer: Option<Handle>) -> Setup {
    let config = Config {
        work: work(),
        ..config
    };
    let d = dispatch.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || {
            // The guard lives as long as the thread.
            std::mem::forget(tracing::dispatcher::set_default(&d));
        })
        .build()
        .expect("a runtime");
    let _guard = tracing::dispatcher::set_default(&dispatch);
    let client = runtime.block_on(async {
        let addrs = system::start_all(config).await.expect("start A, B, C");
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", addrs.a))
            .unwrap()
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("connect to A");
        ServiceAClient::new(channel)
    });
    Setup {
        name,
        runtime,
        client,
        latencies: Vec::new(),
        throughput: Vec::new(),
        layer,
    }
}

fn request(i: u64) -> RunRequest {
    RunRequest {
        parallel: i % 2 == 1,
        key: i,
        items: 2,
    }
}

/// `n` sequential requests (latency), then `n` with 4 in flight (throughput).
fn round(s: &mut Setup, n: usize) {
    let mut client = s.client.clone();
    let lat = s.runtime.block_on(async {
        let mut lat = Vec::with_capacity(n);
        for i in 0..n as u64 {
            let t = Instant::now();
            client.run(request(i)).await.expect("A.Run");
            lat.push(t.elapsed());
        }
        lat
    });
    s.latencies.extend(lat);
    let client = s.client.clone();
    let layer = s.layer.clone();
    let rps = s.runtime.block_on(async move {
        let next = Arc::new(AtomicU64::new(0));
        let t = Instant::now();
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (mut client, next) = (client.clone(), next.clone());
                tokio::spawn(async move {
                    while next.fetch_add(1, Ordering::Relaxed) < n as u64 {
                        client.run(request(3)).await.expect("A.Run");
                    }
                })
            })
            .collect();
        for w in workers {
            w.await.expect("worker");
        }
        if let Some(h) = &layer {
            h.flush(Duration::from_secs(10));
        }
        n as f64 / t.elapsed().as_secs_f64()
    });
    s.throughput.push(rps);
}

struct Stats {
    mean: Duration,
    p50: Duration,
    p99: Duration,
    rps: f64,
}

fn stats(s: &Setup) -> Stats {
    let mut l = s.latencies.clone();
    l.sort();
    let at = |q: f64| l[((l.len() as f64 * q) as usize).min(l.len() - 1)];
    let mut t = s.throughput.clone();
    t.sort_by(f64::total_cmp);
    Stats {
        mean: l.iter().sum::<Duration>() / l.len() as u32,
        p50: at(0.5),
        p99: at(0.99),
        rps: t[t.len() / 2],
    }
}

fn main() {
    let rounds = env("CPT_BENCH_ROUNDS", 12);
    let n = env("CPT_BENCH_REQUESTS", 200);
    let records = Arc::new(AtomicU64::new(0));
    let r = records.clone();
    let (layer, handle) = CriticalPathLayer::builder()
        .with_service("bench")
        .with_sink(move |_: cpt_sdk::Record| {
            r.fetch_add(1, Ordering::Relaxed);
        })
        .build();
    // As a service would run: library spans below INFO (h2, hyper, tower
    // create them per poll) are off; cpt's and the services' spans are INFO.
    let cpt = Dispatch::new(
        tracing_subscriber::registry()
            .with(LevelFilter::INFO)
            .with(layer),
    );
    let plain = Dispatch::new(tracing_subscriber::registry().with(LevelFilter::INFO));

    let mut setups = [
        setup(
            "traced (every request)",
            cpt.clone(),
            Config {
                sample_rate: 1.0,
                ..Config::default()
            },
            Some(handle),
        ),
        setup(
            "untraced (middleware, sampling off)",
            cpt,
            Config {
                sample_rate: 0.0,
                ..Config::default()
            },
            None,
        ),
        setup(
            "no cpt middleware, no cpt layer",
            plain,
            Config {
                middleware: false,
                ..Config::default()
            },
            None,
        ),
    ];
    // `CPT_BENCH_ONLY=N` runs configuration N alone (0 traced, 1 untraced,
    // 2 no cpt), to profile or count its work (perf, strace -c); no ratios
    // are printed then.
    let only = env("CPT_BENCH_ONLY", usize::MAX).min(setups.len());
    if only < setups.len() {
        setups.swap(0, only);
    }
    let active = if only < setups.len() { 1 } else { setups.len() };
    // Warm up connections and caches.
    for s in &mut setups[..active] {
        round(s, n / 4 + 1);
        s.latencies.clear();
        s.throughput.clear();
    }
    for _ in 0..rounds {
        for s in &mut setups[..active] {
            round(s, n);
        }
    }

    println!(
        "fig1: {rounds} rounds × {n} requests per configuration (latency: sequential; throughput: 4 in flight, median round)"
    );
    println!(
        "{:<38} {:>10} {:>10} {:>10} {:>10}",
        "configuration", "mean", "p50", "p99", "req/s"
    );
    let st: Vec<Stats> = setups[..active].iter().map(stats).collect();
    for (s, x) in setups.iter().zip(&st) {
        println!(
            "{:<38} {:>10.1?} {:>10.1?} {:>10.1?} {:>10.0}",
            s.name, x.mean, x.p50, x.p99, x.rps
        );
    }
    println!("records emitted: {}", records.load(Ordering::Relaxed));
    if active == 1 {
        return;
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "traced / untraced:        mean {:.3}×  p99 {:.3}×  throughput {:.3}×  (target mean ≤ 1.005×, p99 ≤ 1.01×)",
        ratio(st[0].mean, st[1].mean),
        ratio(st[0].p99, st[1].p99),
        st[0].rps / st[1].rps
    );
    println!(
        "tracing off / no cpt:     mean {:.3}×  p99 {:.3}×  throughput {:.3}×",
        ratio(st[1].mean, st[2].mean),
        ratio(st[1].p99, st[2].p99),
        st[1].rps / st[2].rps
    );
    // The same difference in absolute time: the cost is roughly a fixed
    // amount per request, so this is what does not depend on the workload.
    // CPU per request is the cores' time over the throughput (4 in flight
    // keep both of this machine's cores busy); a target in time per hop can
    // be read off these.
    let micros = |a: Duration, b: Duration| (a.as_secs_f64() - b.as_secs_f64()) * 1e6;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let cpu = |rps: f64| cores / rps * 1e6;
    println!(
        "traced extra per request:  mean {:+.0} µs  p99 {:+.0} µs  CPU ≈ {:+.0} µs ({:.0} vs {:.0} µs on {cores} cores); per RPC hop ({HOPS}): mean {:+.0} µs",
        micros(st[0].mean, st[1].mean),
        micros(st[0].p99, st[1].p99),
        cpu(st[0].rps) - cpu(st[1].rps),
        cpu(st[0].rps),
        cpu(st[1].rps),
        micros(st[0].mean, st[1].mean) / HOPS as f64,
    );
}

/// RPCs per request to A: A→B and A→C (gRPC), B→C (HTTP), B→C (streaming).
const HOPS: usize = 4;
