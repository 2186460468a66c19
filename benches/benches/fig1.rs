//! The CPT Figure 1 system (services A, B, C over loopback gRPC + HTTP +
//! a streaming RPC) with every request traced, with tracing off, with no
//! cpt middleware at all, and traced with `tracing-opentelemetry` instead
//! (the peer: SDK tracer, W3C `traceparent` through the same tonic and HTTP
//! clients and servers, a batch span processor exporting to a no-op
//! exporter), side by side in one run.
//!
//! Prints request latency (mean, p50, p99), closed-loop throughput, process
//! CPU time and heap allocations per request per configuration, and these
//! ratios:
//!
//! - traced / untraced (mean and p99 at the default workload);
//! - middleware with tracing off / no middleware;
//! - the traced extra in absolute time (per request, per RPC hop, CPU per
//!   request), which does not depend on the workload the way the ratios do,
//!   next to what OpenTelemetry adds over no tracing (cpt's extra CPU over
//!   otel's).
//!
//! Configurations run in interleaved rounds so that drift on a shared
//! machine hits all of them alike. Each runs on its own runtime whose
//! threads have their own subscriber: the cpt layer for the first two, a
//! plain registry (spans, no cpt) for the baseline.
//!
//! Built with `RUSTFLAGS="--cfg tokio_unstable"` and the `named-waits`
//! feature, a fifth configuration traces every request with named waits:
//! cpt's layer behind the per-layer filter the quickstart shows
//! ([`NamedWaits`](cpt_sdk::layer::filter::NamedWaits) over INFO), so it
//! sees tokio's task and resource spans; the others see none of them, which
//! is the opt-in turned off in the same binary. A sixth gives the same
//! spans of tokio's to a layer that does nothing with them while cpt's layer
//! sees none: tokio's own cost, apart from cpt's. A seventh filters cpt's
//! layer by target instead (`tokio` and `runtime` at TRACE: every span and
//! event tokio makes). It prints each over traced.
//!
//! `cargo bench --bench fig1`; `CPT_BENCH_ROUNDS` (default 12) and
//! `CPT_BENCH_REQUESTS` (per round and configuration, default 200) scale it;
//! `CPT_BENCH_WORK` (default 1.0) scales the subcomponents' simulated work
//! (0 measures the bare RPC and tracing costs). `CPT_BENCH_ONLY=N` runs
//! configuration N alone (0 traced, 1 untraced, 2 no cpt, 3 otel, 4 named
//! waits, 5 tokio's spans alone, 6 named waits filtered by target), for
//! `valgrind --tool=callgrind`, `perf` or `strace -c`; no ratios are
//! printed then.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cpt_examples::proto::RunRequest;
use cpt_examples::proto::service_a_client::ServiceAClient;
use cpt_examples::system::{self, Config, Work};
use cpt_sdk::layer::CriticalPathLayer;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tonic::transport::Channel;
use tracing::Dispatch;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;

/// Counts heap allocations (all threads), so each configuration's
/// allocations per request can be printed next to its CPU.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: delegates to the system allocator; the counter is a side effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// This process's CPU time (user + system, all threads).
fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The OpenTelemetry peer's exporter: counts the spans it is handed and
/// drops them (what remains is the SDK's own cost: span building, the batch
/// processor's queue and thread).
#[derive(Debug, Clone)]
struct NoopExporter(Arc<AtomicU64>);

impl SpanExporter for NoopExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.fetch_add(batch.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Waits for a configuration's background work (cpt's path computations,
/// the batch span processor's export) inside its throughput timing, so it
/// neither goes uncharged nor spills into the next configuration's round.
type Flush = Arc<dyn Fn() + Send + Sync>;

struct Setup {
    name: &'static str,
    runtime: tokio::runtime::Runtime,
    client: ServiceAClient<Channel>,
    latencies: Vec<Duration>,
    throughput: Vec<f64>,
    /// Process CPU time and requests, over both phases of every round.
    cpu: Duration,
    allocs: u64,
    requests: u64,
    flush: Option<Flush>,
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

fn setup(name: &'static str, dispatch: Dispatch, config: Config, flush: Option<Flush>) -> Setup {
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
        cpu: Duration::ZERO,
        allocs: 0,
        requests: 0,
        flush,
    }
}

/// cpt's layer counting its records (and the named-wait segments in them,
/// when given a counter), and its flush.
fn cpt_layer(
    records: &Arc<AtomicU64>,
    named_waits: Option<&Arc<AtomicU64>>,
) -> (CriticalPathLayer, Flush) {
    let (r, named) = (records.clone(), named_waits.cloned());
    let (layer, handle) = CriticalPathLayer::builder()
        .with_service("bench")
        .with_sink(move |record: cpt_sdk::Record| {
            r.fetch_add(1, Ordering::Relaxed);
            if let Some(named) = &named {
                let waits = record.path.segments().iter();
                let waits = waits.filter(|s| s.kind == cpt_sdk::SegmentKind::Wait);
                named.fetch_add(waits.count() as u64, Ordering::Relaxed);
            }
        })
        .build();
    let flush: Flush = Arc::new(move || {
        handle.flush(Duration::from_secs(10));
    });
    (layer, flush)
}

/// cpt's layer behind `filter` (per layer), counting its records and the
/// named-wait segments in them, and its flush.
#[cfg(all(tokio_unstable, feature = "named-waits"))]
fn named(
    records: &Arc<AtomicU64>,
    named_waits: &Arc<AtomicU64>,
    filter: Box<dyn tracing_subscriber::layer::Filter<tracing_subscriber::Registry> + Send + Sync>,
) -> (Dispatch, Option<Flush>) {
    let (layer, flush) = cpt_layer(records, Some(named_waits));
    let dispatch = Dispatch::new(tracing_subscriber::registry().with(layer.with_filter(filter)));
    (dispatch, Some(flush))
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
    let (cpu0, allocs0) = (cpu_time(), ALLOCS.load(Ordering::Relaxed));
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
    let flush = s.flush.clone();
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
        if let Some(flush) = &flush {
            flush();
        }
        n as f64 / t.elapsed().as_secs_f64()
    });
    s.throughput.push(rps);
    s.cpu += cpu_time() - cpu0;
    s.allocs += ALLOCS.load(Ordering::Relaxed) - allocs0;
    s.requests += 2 * n as u64;
}

struct Stats {
    mean: Duration,
    p50: Duration,
    p99: Duration,
    rps: f64,
    /// Process CPU time per request, µs.
    cpu: f64,
    allocs: f64,
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
        cpu: s.cpu.as_secs_f64() * 1e6 / s.requests as f64,
        allocs: s.allocs as f64 / s.requests as f64,
    }
}

fn main() {
    let rounds = env("CPT_BENCH_ROUNDS", 12);
    let n = env("CPT_BENCH_REQUESTS", 200);
    let (records, exported) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (records, exported) = (&records, &exported);
    #[cfg(all(tokio_unstable, feature = "named-waits"))]
    let named_waits = &Arc::new(AtomicU64::new(0));
    // cpt's layer counting its records, as a dispatch, and its flush.
    let cpt = || {
        let (layer, flush) = cpt_layer(records, None);
        // As a service would run: library spans below INFO (h2, hyper, tower
        // create them per poll) are off; cpt's and the services' spans are INFO.
        let dispatch = Dispatch::new(
            tracing_subscriber::registry()
                .with(LevelFilter::INFO)
                .with(layer),
        );
        (dispatch, Some(flush))
    };
    // Each configuration is made only if it runs: every dispatch alive
    // takes part in each callsite's interest, so one configuration run
    // alone (`CPT_BENCH_ONLY`) pays for no other's filters.
    type Make<'a> = Box<dyn FnOnce() -> Setup + 'a>;
    let mut makes: Vec<Make<'_>> = vec![
        Box::new(|| {
            let (dispatch, flush) = cpt();
            let config = Config {
                sample_rate: 1.0,
                ..Config::default()
            };
            setup("traced (every request)", dispatch, config, flush)
        }),
        Box::new(|| {
            let (dispatch, _) = cpt();
            let config = Config {
                sample_rate: 0.0,
                ..Config::default()
            };
            setup(
                "untraced (middleware, sampling off)",
                dispatch,
                config,
                None,
            )
        }),
        Box::new(|| {
            let plain = Dispatch::new(tracing_subscriber::registry().with(LevelFilter::INFO));
            let config = Config {
                middleware: false,
                ..Config::default()
            };
            setup("no cpt middleware, no cpt layer", plain, config, None)
        }),
        Box::new(|| {
            // The peer: tracing-opentelemetry with an SDK tracer whose batch
            // span processor (its own thread, default settings) exports to a
            // no-op.
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(NoopExporter(exported.clone()))
                .build();
            let otel = Dispatch::new(
                tracing_subscriber::registry()
                    .with(LevelFilter::INFO)
                    .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("fig1"))),
            );
            let flush: Flush = Arc::new(move || {
                let _ = provider.force_flush();
            });
            let config = Config {
                middleware: false,
                otel: true,
                ..Config::default()
            };
            setup(
                "otel (tracing-opentelemetry, no cpt)",
                otel,
                config,
                Some(flush),
            )
        }),
    ];
    #[cfg(all(tokio_unstable, feature = "named-waits"))]
    {
        use cpt_sdk::layer::filter::NamedWaits;
        use tracing_subscriber::filter::Targets;
        let traced = || Config {
            sample_rate: 1.0,
            ..Config::default()
        };
        makes.push(Box::new(move || {
            let filter = NamedWaits::new(LevelFilter::INFO);
            let (dispatch, flush) = named(records, named_waits, Box::new(filter));
            setup(
                "traced, named waits (tokio's spans)",
                dispatch,
                traced(),
                flush,
            )
        }));
        // The same spans of tokio's made for a layer that does nothing with
        // them, cpt's layer seeing none of them: what tokio's
        // instrumentation costs whoever turns it on, apart from cpt's share.
        makes.push(Box::new(move || {
            let (layer, flush) = cpt_layer(records, None);
            let dispatch = Dispatch::new(
                tracing_subscriber::registry()
                    .with(layer.with_filter(LevelFilter::INFO))
                    .with(
                        tracing_subscriber::layer::Identity::new()
                            .with_filter(NamedWaits::new(LevelFilter::INFO)),
                    ),
            );
            let name = "traced, tokio's spans to no one";
            setup(name, dispatch, traced(), Some(flush))
        }));
        // A filter by target instead: every span and event of tokio's.
        makes.push(Box::new(move || {
            let by_target = Targets::new()
                .with_target("tokio", LevelFilter::TRACE)
                .with_target("runtime", LevelFilter::TRACE)
                .with_default(LevelFilter::INFO);
            let (dispatch, flush) = named(records, named_waits, Box::new(by_target));
            setup("named waits, filtered by target", dispatch, traced(), flush)
        }));
    }
    // `CPT_BENCH_ONLY=N` runs configuration N alone (0 traced, 1 untraced,
    // 2 no cpt, 3 otel, 4 named waits, 5 tokio's spans alone, 6 named waits
    // filtered by target), to profile or count its work (callgrind, perf,
    // strace -c); no ratios are printed then.
    let only = env("CPT_BENCH_ONLY", usize::MAX);
    let mut setups: Vec<Setup> = if only < makes.len() {
        vec![makes.swap_remove(only)()]
    } else {
        makes.into_iter().map(|make| make()).collect()
    };
    // Warm up connections and caches.
    for s in &mut setups {
        round(s, n / 4 + 1);
        s.latencies.clear();
        s.throughput.clear();
    }
    for _ in 0..rounds {
        for s in &mut setups {
            round(s, n);
        }
    }

    println!(
        "fig1: {rounds} rounds × {n} requests per configuration (latency: sequential; throughput: 4 in flight, median round)"
    );
    println!(
        "{:<38} {:>10} {:>10} {:>10} {:>8} {:>10} {:>10}",
        "configuration", "mean", "p50", "p99", "req/s", "CPU/req", "allocs/req"
    );
    let st: Vec<Stats> = setups.iter().map(stats).collect();
    for (s, x) in setups.iter().zip(&st) {
        println!(
            "{:<38} {:>10.1?} {:>10.1?} {:>10.1?} {:>8.0} {:>8.0}µs {:>10.1}",
            s.name, x.mean, x.p50, x.p99, x.rps, x.cpu, x.allocs
        );
    }
    for s in &setups {
        if let Some(flush) = &s.flush {
            flush();
        }
    }
    println!(
        "records emitted (cpt): {}; spans exported (otel): {}",
        records.load(Ordering::Relaxed),
        exported.load(Ordering::Relaxed)
    );
    if setups.len() == 1 {
        return;
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "traced / untraced:        mean {:.3}×  p99 {:.3}×  throughput {:.3}×  (target at the default workload: mean, p99 ≤ 1.03×)",
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
    println!(
        "otel / no cpt:            mean {:.3}×  p99 {:.3}×  throughput {:.3}×",
        ratio(st[3].mean, st[2].mean),
        ratio(st[3].p99, st[2].p99),
        st[3].rps / st[2].rps
    );
    // The same differences in absolute time: the cost is roughly a fixed
    // amount per request, so this is what does not depend on the workload.
    // CPU per request is the process's CPU time over the requests served
    // (both phases; background threads included), and, as a check, the
    // cores' time over the throughput (4 in flight keep both of this
    // machine's cores busy).
    let micros = |a: Duration, b: Duration| (a.as_secs_f64() - b.as_secs_f64()) * 1e6;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let cpu = |rps: f64| cores / rps * 1e6;
    let extra = |label: &str, t: &Stats, base: &Stats| {
        println!(
            "{label} extra per request:  mean {:+.0} µs  p99 {:+.0} µs  CPU {:+.0} µs (throughput: {:+.0} µs)  allocs {:+.1}; per RPC hop ({HOPS}): mean {:+.1} µs  CPU {:+.1} µs",
            micros(t.mean, base.mean),
            micros(t.p99, base.p99),
            t.cpu - base.cpu,
            cpu(t.rps) - cpu(base.rps),
            t.allocs - base.allocs,
            micros(t.mean, base.mean) / HOPS as f64,
            (t.cpu - base.cpu) / HOPS as f64,
        );
    };
    #[cfg(all(tokio_unstable, feature = "named-waits"))]
    println!(
        "named-wait segments in the named waits configuration's records: {}",
        named_waits.load(Ordering::Relaxed)
    );
    let over_traced = |label: &str, t: &Stats| {
        println!(
            "{label} / traced: mean {:.3}×  p99 {:.3}×  throughput {:.3}×  CPU {:.3}×",
            ratio(t.mean, st[0].mean),
            ratio(t.p99, st[0].p99),
            t.rps / st[0].rps,
            t.cpu / st[0].cpu,
        );
    };
    if let (Some(named), Some(tokio)) = (st.get(4), st.get(5)) {
        over_traced("tokio's spans alone           ", tokio);
        over_traced("named waits                   ", named);
        println!(
            "  cpt's share alone (named waits - tokio's spans alone) / traced: CPU {:.3}×",
            (st[0].cpu + named.cpu - tokio.cpu) / st[0].cpu,
        );
        extra("named waits vs traced ", named, &st[0]);
        extra("named waits vs tokio's", named, tokio);
    }
    if let Some(by_target) = st.get(6) {
        over_traced("named waits, filter by target ", by_target);
    }
    extra("cpt traced vs untraced", &st[0], &st[1]);
    extra("cpt traced vs no cpt  ", &st[0], &st[2]);
    extra("otel vs no cpt        ", &st[3], &st[2]);
    println!(
        "cpt extra CPU / otel extra CPU: {:.2}× (vs untraced), {:.2}× (vs no cpt)  (target ≤ 1.0×)",
        (st[0].cpu - st[1].cpu) / (st[3].cpu - st[2].cpu),
        (st[0].cpu - st[2].cpu) / (st[3].cpu - st[2].cpu),
    );
}

/// RPCs per request to A: A→B and A→C (gRPC), B→C (HTTP), B→C (streaming).
const HOPS: usize = 4;
