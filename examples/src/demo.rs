//! The CPT Figure 1 demo as a library: start services A, B and C on
//! loopback, drive load, and send every record to two sinks through the
//! SDK's asynchronous [`Exporter`]: a JSON Lines file (`DIR/records.jsonl`)
//! and a collector (`cpt serve`, in process by default, through
//! [`CollectorClient`]). At the end it flushes both, checks that the
//! collector stored every record the file has, and writes
//! `DIR/profile.pb.gz` from the file.
//!
//! The `demo` binary is a command line over [`run`]; the end-to-end tests
//! call [`run`] directly.
//!
//! ```no_run
//! use cpt_examples::demo::{self, DemoConfig};
//!
//! let report = demo::run(&DemoConfig::new("cpt-demo-out").with_requests(200))?;
//! assert_eq!(report.store_records, Some(report.file_records));
//! # Ok::<(), anyhow::Error>(())
//! ```

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::BufWriter;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cpt_collector::serve::{Collector, ServeConfig};
use cpt_exporter::{CollectorClient, Endpoint};
use cpt_middleware::{ForceAuth, header};
use cpt_sdk::export::{ExportHandle, Exporter};
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::sink::JsonLines;
use cpt_sdk::{Record, RecordSink, SegmentKind, Trigger};
use tracing_subscriber::prelude::*;

use crate::proto::RunRequest;
use crate::proto::service_a_client::ServiceAClient;
use crate::system::{self, Config};

/// Where the demo ships its records besides `DIR/records.jsonl`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CollectorMode {
    /// Start a collector in this process, its store at `DIR/store.db`
    /// (replaced at start), gRPC on a free loopback port.
    InProcess,
    /// Ship to a running `cpt serve` at this URL (`grpc://HOST:PORT` or
    /// `http://HOST:PORT`).
    External(String),
    /// Do not ship; write only the file.
    Off,
}

/// What [`run`] does. Build with [`DemoConfig::new`] and the `with_*`
/// methods.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DemoConfig {
    /// Output directory (created): `records.jsonl`, `profile.pb.gz`,
    /// `store.db` with the in-process collector.
    pub out: PathBuf,
    /// Requests sent to A.
    pub requests: u64,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// A's sampling probability.
    pub sample_rate: f64,
    /// Requests forced by an operator (valid `x-cpt-force` credential).
    pub forced: u64,
    /// Items B2 scans from C's streaming RPC per request.
    pub items: u32,
    /// Where records are shipped besides the file.
    pub collector: CollectorMode,
    /// How long the end of the run waits for each exporter to ship what is
    /// queued; past it the run fails instead of hanging.
    pub flush_timeout: Duration,
    /// The collector client's on-disk spool (`None`: given-up batches are
    /// lost and counted). `CPT_SPOOL_DIR` sets it too.
    pub spool: Option<PathBuf>,
}

impl DemoConfig {
    /// The defaults of the `demo` command: 1000 requests, 4 in flight,
    /// sampling 10 %, 5 forced, 3 scanned items, in-process collector,
    /// 10 s flush timeout.
    pub fn new(out: impl Into<PathBuf>) -> Self {
        DemoConfig {
            out: out.into(),
            requests: 1000,
            concurrency: 4,
            sample_rate: 0.1,
            forced: 5,
            items: 3,
            collector: CollectorMode::InProcess,
            flush_timeout: Duration::from_secs(10),
            spool: None,
        }
    }

    /// Set [`DemoConfig::spool`].
    #[must_use]
    pub fn with_spool(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spool = Some(dir.into());
        self
    }

    /// Set [`DemoConfig::requests`].
    #[must_use]
    pub fn with_requests(mut self, n: u64) -> Self {
        self.requests = n;
        self
    }

    /// Set [`DemoConfig::concurrency`].
    #[must_use]
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Set [`DemoConfig::sample_rate`].
    #[must_use]
    pub fn with_sample_rate(mut self, p: f64) -> Self {
        self.sample_rate = p;
        self
    }

    /// Set [`DemoConfig::forced`].
    #[must_use]
    pub fn with_forced(mut self, n: u64) -> Self {
        self.forced = n;
        self
    }

    /// Set [`DemoConfig::items`].
    #[must_use]
    pub fn with_items(mut self, n: u32) -> Self {
        self.items = n;
        self
    }

    /// Set [`DemoConfig::collector`].
    #[must_use]
    pub fn with_collector(mut self, mode: CollectorMode) -> Self {
        self.collector = mode;
        self
    }

    /// Set [`DemoConfig::flush_timeout`].
    #[must_use]
    pub fn with_flush_timeout(mut self, d: Duration) -> Self {
        self.flush_timeout = d;
        self
    }
}

/// What a [`run`] did.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DemoReport {
    /// Requests that succeeded.
    pub succeeded: u64,
    /// Requests that failed.
    pub failed_requests: u64,
    /// Records the SDK emitted.
    pub emitted: u64,
    /// `DIR/records.jsonl`.
    pub records_path: PathBuf,
    /// Records in it.
    pub file_records: u64,
    /// Of them forced.
    pub forced_records: u64,
    /// `DIR/profile.pb.gz`.
    pub profile_path: PathBuf,
    /// Requests in the profile (the sampled records).
    pub profile_requests: u64,
    /// The in-process collector's store (`DIR/store.db`).
    pub store_path: Option<PathBuf>,
    /// Records in that store at the end.
    pub store_records: Option<u64>,
    /// The collector exporter's counters (`None` without a collector).
    pub export: Option<ExportCounts>,
}

/// Counters of the collector exporter at the end of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportCounts {
    /// Records the collector acknowledged (durably stored).
    pub exported: u64,
    /// Records dropped because the exporter's queue was full.
    pub dropped: u64,
    /// Records in batches the collector rejected or the client gave up on.
    pub failed: u64,
    /// Retried sends.
    pub retries: u64,
    /// Records the collector could not take that went to the spool.
    pub spooled: u64,
    /// Records delivered from the spool.
    pub replayed: u64,
    /// Records still waiting in the spool at the end (for the next run).
    pub spool_pending: u64,
}

/// Several sinks behind one: each record goes to every sink, in order.
///
/// The SDK's layer takes one [`RecordSink`]; the demo gives it a `FanOut`
/// of two [`Exporter`]s (file and collector), so both see every record and
/// neither blocks the request.
#[derive(Clone, Default)]
pub struct FanOut(Vec<Arc<dyn RecordSink>>);

impl FanOut {
    /// No sinks yet.
    pub fn new() -> Self {
        FanOut::default()
    }

    /// Add a sink.
    #[must_use]
    pub fn with(mut self, sink: impl RecordSink) -> Self {
        self.0.push(Arc::new(sink));
        self
    }
}

impl std::fmt::Debug for FanOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanOut")
            .field("sinks", &self.0.len())
            .finish()
    }
}

impl RecordSink for FanOut {
    fn emit(&self, record: Record) {
        if let Some((last, rest)) = self.0.split_last() {
            for s in rest {
                s.emit(record.clone());
            }
            last.emit(record);
        }
    }
}

/// The exporter queue: large enough that a demo run at full sampling never
/// drops (a drop would make the file and the store disagree).
const QUEUE_CAPACITY: usize = 16 * 1024;

/// Run the demo (see the [module docs](self)) and print what happened.
///
/// The services' tracing subscriber (with the `CriticalPathLayer`) is
/// installed for this run's threads only, so `run` may be called more than
/// once in a process.
///
/// # Errors
///
/// Bad configuration, an unwritable output directory, a collector that
/// cannot start, an exporter that does not finish within
/// [`DemoConfig::flush_timeout`], or a store that does not hold as many
/// records as `records.jsonl`.
pub fn run(config: &DemoConfig) -> anyhow::Result<DemoReport> {
    anyhow::ensure!(
        (0.0..=1.0).contains(&config.sample_rate),
        "--sample-rate must be within 0..=1, not {}",
        config.sample_rate
    );
    let out = &config.out;
    std::fs::create_dir_all(out)
        .with_context(|| format!("creating output directory {}", out.display()))?;
    let records_path = out.join("records.jsonl");
    let file = File::create(&records_path)
        .with_context(|| format!("creating {}", records_path.display()))?;
    let (file_sink, file_handle) = Exporter::builder()
        .with_queue_capacity(QUEUE_CAPACITY)
        .build(JsonLines::new(BufWriter::new(file)));

    // The collector runs on a runtime of its own, outside the traced system
    // (as a separate `cpt serve` would be).
    let collector = match &config.collector {
        CollectorMode::InProcess => Some(InProcessCollector::start(&out.join("store.db"))?),
        _ => None,
    };
    let endpoint = match (&config.collector, &collector) {
        (CollectorMode::External(url), _) => Some(Endpoint::parse(url)?),
        (_, Some(c)) => Some(Endpoint::parse(&format!("grpc://{}", c.addr))?),
        _ => None,
    };
    let shipping = endpoint
        .map(|endpoint| -> anyhow::Result<_> {
            let client = CollectorClient::builder(endpoint)
                // Give up on an unreachable collector within seconds: the demo
                // must end, and every lost record is counted.
                .with_max_attempts(4)
                .with_max_backoff(Duration::from_secs(1))
                .with_request_timeout(Duration::from_secs(5))
                .try_with_default_env()?;
            let client = match &config.spool {
                Some(dir) => client.with_spool(dir, cpt_exporter::DEFAULT_SPOOL_MAX_BYTES),
                None => client,
            };
            let spooling = config.spool.is_some() || std::env::var_os("CPT_SPOOL_DIR").is_some();
            let client = client.try_build().context("opening the collector spool")?;
            let stats = client.stats();
            // Left by an earlier run: replayed with this run's records.
            let recovered = stats.spool_pending_records();
            let (sink, handle) = Exporter::builder()
                .with_queue_capacity(QUEUE_CAPACITY)
                .build(client);
            Ok((sink, handle, stats, spooling.then_some(recovered)))
        })
        .transpose()?;
    let mut fan_out = FanOut::new().with(file_sink);
    if let Some((sink, _, _, _)) = &shipping {
        fan_out = fan_out.with(sink.clone());
    }

    let (layer, layer_handle) = CriticalPathLayer::builder()
        .with_service("demo")
        .with_sink(fan_out)
        .build();
    // Library spans below INFO (h2, hyper, tower create them per poll) are
    // off, as in a typical service; cpt's and the services' spans are INFO.
    let dispatch = tracing::Dispatch::new(
        tracing_subscriber::registry()
            .with(tracing_subscriber::filter::LevelFilter::INFO)
            .with(layer),
    );
    let runtime = scoped_runtime(&dispatch)?;
    let services = Config {
        sample_rate: config.sample_rate,
        ..Config::default()
    };
    let force_key = services.force_key.clone();
    let summary = tracing::dispatcher::with_default(&dispatch, || {
        runtime.block_on(async {
            let addrs = system::start_all(services).await?;
            let summary = drive(config, addrs.a, &force_key).await?;
            // A emits a record when its response is ready; the client may
            // see the response first. Wait (bounded) for the last ones.
            let deadline = Instant::now() + Duration::from_secs(2);
            while layer_handle.requests_in_flight() > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            anyhow::Ok(summary)
        })
    })?;
    drop(runtime);
    // A's records are computed in the background (off its responses' path).
    layer_handle.flush(Duration::from_secs(2));
    let emitted = layer_handle.records_emitted();

    // Ship what is queued, bounded, then stop both workers.
    let file_done = finish_exporter(file_handle, config.flush_timeout);
    let export = match shipping {
        Some((sink, handle, stats, spooling)) => {
            drop(sink);
            let done = finish_exporter(handle, config.flush_timeout);
            Some((done, stats, spooling))
        }
        None => None,
    };
    let file_counts = file_done.with_context(|| format!("writing {}", records_path.display()))?;
    anyhow::ensure!(
        file_counts.failed == 0 && file_counts.dropped == 0,
        "{} records could not be written to {} ({} dropped, {} failed)",
        file_counts.failed + file_counts.dropped,
        records_path.display(),
        file_counts.dropped,
        file_counts.failed
    );

    let records = read_records(&records_path)?;
    print_summary(config, &summary, &records, emitted);
    let (profile_path, profile_requests) = write_profile(out, &records)?;

    let mut report = DemoReport {
        succeeded: summary.latencies.len() as u64,
        failed_requests: summary.errors,
        emitted,
        records_path: records_path.clone(),
        file_records: records.len() as u64,
        forced_records: records
            .iter()
            .filter(|r| r.trigger == Trigger::Forced)
            .count() as u64,
        profile_path,
        profile_requests,
        store_path: None,
        store_records: None,
        export: None,
    };
    // Shipping: counters, and the store must hold what the file holds.
    let store_hint = match export {
        None => {
            println!("records were not shipped to a collector (--no-collector)");
            None
        }
        Some((done, stats, spooling)) => {
            let mut counts = done.context("shipping records to the collector")?;
            counts.retries = stats.retries();
            // Acknowledged by the collector (with a spool the exporter also
            // counts as shipped what went to the spool).
            counts.exported = stats.exported_records();
            counts.spooled = stats.spooled_records();
            counts.replayed = stats.replayed_records();
            counts.spool_pending = stats.spool_pending_records();
            report.export = Some(counts);
            println!(
                "collector exporter: {} exported, {} dropped (queue full), {} failed ({} rejected, {} given up after retries), {} retries",
                counts.exported,
                counts.dropped,
                counts.failed,
                stats.rejected_records(),
                stats.dropped_after_retries(),
                counts.retries
            );
            let recovered = spooling.unwrap_or(0);
            if spooling.is_some() {
                println!(
                    "collector spool: {recovered} left by an earlier run, {} spooled, {} replayed, {} waiting for the next run, {} dropped (spool full)",
                    counts.spooled,
                    counts.replayed,
                    counts.spool_pending,
                    stats.spool_dropped_records()
                );
            }
            if let Some(e) = stats.last_error() {
                println!("  last collector error: {e}");
            }
            let n = records.len() as u64;
            if let Some(c) = collector {
                let store = c.stop()?;
                let stored = cpt_collector::store::Store::open_read_only(&store)
                    .and_then(|s| s.len())
                    .with_context(|| format!("counting the records in {}", store.display()))?;
                println!(
                    "store {} holds {stored} records; {} has {n}",
                    store.display(),
                    records_path.display(),
                );
                report.store_path = Some(store.clone());
                report.store_records = Some(stored);
                anyhow::ensure!(
                    stored == n + recovered,
                    "the store holds {stored} records but {} has {n} ({} dropped, {} failed on the way)",
                    records_path.display(),
                    counts.dropped,
                    counts.failed
                );
                Some(store.display().to_string())
            } else {
                let url = match &config.collector {
                    CollectorMode::External(url) => url.as_str(),
                    _ => "the collector",
                };
                println!(
                    "{url} acknowledged {} records (stored durably), {} wait in the spool; {} has {n}{}",
                    counts.exported,
                    counts.spool_pending,
                    records_path.display(),
                    if recovered > 0 {
                        format!(", the spool had {recovered} from an earlier run")
                    } else {
                        String::new()
                    }
                );
                anyhow::ensure!(
                    counts.exported + counts.spool_pending == n + recovered,
                    "the collector acknowledged {} records and {} wait in the spool but {} has {n} ({} dropped, {} failed)",
                    counts.exported,
                    counts.spool_pending,
                    records_path.display(),
                    counts.dropped,
                    counts.failed
                );
                Some("STORE.db".to_owned())
            }
        }
    };

    let profile = report.profile_path.display();
    println!(
        "profile of {} sampled requests: {profile}\n  go tool pprof -http=: {profile}",
        report.profile_requests
    );
    println!(
        "  the same with cpt (cargo run --release --bin cpt -- …):\n    cpt profile -o {} {}",
        out.join("profile-from-file.pb.gz").display(),
        records_path.display()
    );
    if let Some(store) = store_hint {
        println!(
            "    cpt profile --store {store} -o {}",
            out.join("profile-from-store.pb.gz").display()
        );
    }
    Ok(report)
}

/// A multi-thread runtime whose threads (workers and blocking pool) have
/// `dispatch` as their default subscriber while they live.
fn scoped_runtime(dispatch: &tracing::Dispatch) -> anyhow::Result<tokio::runtime::Runtime> {
    thread_local! {
        static GUARD: std::cell::RefCell<Option<tracing::dispatcher::DefaultGuard>> =
            const { std::cell::RefCell::new(None) };
    }
    let d = dispatch.clone();
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(move || {
            let guard = tracing::dispatcher::set_default(&d);
            GUARD.with(|g| *g.borrow_mut() = Some(guard));
        })
        .on_thread_stop(|| GUARD.with(|g| drop(g.borrow_mut().take())))
        .build()?)
}

/// Flush an exporter, then shut it down, in at most `timeout` overall.
fn finish_exporter(handle: ExportHandle, timeout: Duration) -> anyhow::Result<ExportCounts> {
    let flushed = handle.flush(timeout);
    let counts = ExportCounts {
        exported: handle.exported(),
        dropped: handle.dropped(),
        failed: handle.failed(),
        ..ExportCounts::default()
    };
    anyhow::ensure!(
        flushed,
        "the exporter did not ship its queue within {timeout:?} ({} exported, {} dropped, {} failed so far)",
        counts.exported,
        counts.dropped,
        counts.failed
    );
    // Bounded: a stuck collector cannot hang the demo.
    anyhow::ensure!(
        handle.shutdown_timeout(timeout),
        "the exporter did not stop within {timeout:?}"
    );
    Ok(counts)
}

/// A collector in this process on a runtime of its own (outside the traced
/// services, as a separate `cpt serve` would be).
struct InProcessCollector {
    runtime: tokio::runtime::Runtime,
    collector: Collector,
    addr: SocketAddr,
    store: PathBuf,
}

impl InProcessCollector {
    /// Start it with a fresh store at `store` (an old one is removed, as
    /// `records.jsonl` is rewritten).
    fn start(store: &Path) -> anyhow::Result<Self> {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut p = store.as_os_str().to_owned();
            p.push(suffix);
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("removing the old store {}", Path::new(&p).display())
                    });
                }
            }
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("cpt-demo-collector")
            .enable_all()
            .build()?;
        let serve = ServeConfig::new(store).with_grpc(SocketAddr::from(([127, 0, 0, 1], 0)));
        let collector = runtime
            .block_on(Collector::start(serve))
            .with_context(|| format!("starting the in-process collector ({})", store.display()))?;
        let addr = collector
            .grpc_addr()
            .context("the in-process collector has no gRPC address")?;
        println!(
            "collector: in process, gRPC on {addr}, store {}",
            store.display()
        );
        Ok(InProcessCollector {
            runtime,
            collector,
            addr,
            store: store.to_path_buf(),
        })
    }

    /// Stop it (in-flight batches are committed first); returns the store.
    fn stop(self) -> anyhow::Result<PathBuf> {
        let stats = self.collector.stats();
        self.runtime
            .block_on(self.collector.shutdown())
            .context("stopping the in-process collector")?;
        println!(
            "collector: accepted {} records in {} batches ({} rejected batches, {} refused as overloaded)",
            stats.accepted_records,
            stats.accepted_batches,
            stats.rejected_batches,
            stats.overloaded
        );
        Ok(self.store)
    }
}

struct DriveSummary {
    latencies: Vec<Duration>,
    errors: u64,
    elapsed: Duration,
}

/// Send the requests to A, `concurrency` at a time; alternate sequential
/// and parallel calls; force `forced` of them.
async fn drive(
    config: &DemoConfig,
    a: SocketAddr,
    force_key: &str,
) -> anyhow::Result<DriveSummary> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{a}"))?
        .tcp_nodelay(true)
        .connect()
        .await
        .context("connecting to A")?;
    let client = ServiceAClient::new(channel);
    let next = Arc::new(AtomicU64::new(0));
    let every = config
        .requests
        .checked_div(config.forced)
        .map_or(u64::MAX, |n| n.max(1));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..config.concurrency.max(1) {
        let (mut client, next) = (client.clone(), next.clone());
        let (requests, items, key) = (config.requests, config.items, force_key.to_owned());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
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
                    let cred = ForceAuth::sign(&key, &id, "A", 300);
                    req.metadata_mut().insert(
                        key_of(&header::FORCE),
                        cred.parse().expect("a credential is ASCII"),
                    );
                }
                req.metadata_mut().insert(
                    key_of(&header::REQUEST_ID),
                    id.parse().expect("ids are ASCII"),
                );
                let t = Instant::now();
                match client.run(req).await {
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

/// Read a JSON Lines record file.
///
/// # Errors
///
/// An unreadable file or a line that is not a record (named by line).
pub fn read_records(path: &Path) -> anyhow::Result<Vec<Record>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, l)| Record::from_json(l).with_context(|| format!("{}:{}", path.display(), i + 1)))
        .collect()
}

fn print_summary(config: &DemoConfig, s: &DriveSummary, records: &[Record], emitted: u64) {
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
        config.out.join("records.jsonl").display()
    );
    let services: BTreeSet<&str> = records
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
/// profile by default) into DIR/profile.pb.gz, a gzipped pprof profile:
/// the same bytes `cpt profile -o OUT.pb.gz DIR/records.jsonl` writes.
fn write_profile(out: &Path, records: &[Record]) -> anyhow::Result<(PathBuf, u64)> {
    use cpt_collector::{aggregate::Aggregate, profile, selection::Selection};
    let agg = Aggregate::from_records(&Selection::new(), records);
    let path = out.join("profile.pb.gz");
    std::fs::write(&path, profile::encode_gzip(&agg))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok((path, agg.requests()))
}
