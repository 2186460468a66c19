//! Ingest with profiles running beside it: `cpt serve` (in process, a store
//! in a temporary directory, durable acknowledgements) takes batches of 200
//! records from 4 HTTP senders, each sending its next batch as soon as the
//! last one is acknowledged, while a reader asks `GET /profile` over the
//! whole store every 20 s and a sampler reads the size of the store's WAL
//! (`STORE-wal`) every 250 ms.
//!
//! Records are shaped as a collector receives them: each sender cycles
//! through 16 batches of generated paths (4–15 segments) and, for every
//! send, stamps each record with the current time as its start and a fresh
//! random request id (a random trace id on every tenth), then encodes the
//! batch. Start times therefore increase and ids never repeat. With
//! `CPT_SOAK_REPLAY=1` the senders instead send the same 16 batches over
//! and over, encoded once, start times and request ids repeating (records
//! far out of time order, as a replay of old files would be): the store's
//! indexes then take their inserts at random pages.
//!
//! Printed at the end: records acknowledged against records stored (the
//! store opened read-only after shutdown, and the collector's
//! `/v1/stats`), acknowledgement latency per batch (p50, p99, max, and the
//! slowest batches with when they were sent), ingest rate per 20 s window
//! and while a profile runs against while none does, each profile's
//! duration, and the WAL's size (max, per window, and each time it was cut
//! back, with the slowest acknowledgement around that moment). Exits non-zero when
//! a stored count differs from the acknowledged one.
//!
//! Run: `cargo bench -p cpt-benches --bench soak`.
//!
//! Environment:
//! - `CPT_SOAK_SECS`: how long the senders send (default 480);
//! - `CPT_SOAK_DIR`: where the temporary store goes (default the
//!   target's tmp directory); the store grows by about 2.7 kB a record,
//!   some 65 MB/s at full speed (the runs on the store page,
//!   `docs/src/operations/store.md`: 29.0 GiB for 11 626 600 records);
//! - `CPT_SOAK_REPLAY=1`: send records out of time order (above);
//! - `CPT_SOAK_MAX_GIB`: the senders stop early, saying so, when the store
//!   (database and WAL) reaches this size (default 14);
//! - `CPT_SOAK_MAX_STORE=4GiB`: soak twice, first without a bound, then
//!   with the collector under `--max-store-bytes` (raw records otherwise
//!   kept forever): the records that started first are deleted, once
//!   rolled up, to keep the store within it. The bounded report then
//!   checks acknowledged = stored + deleted by retention, against the
//!   store and `/metrics`, and that the database + WAL (sampled every
//!   200 ms) never passed the bound; the end compares the ingest rates of
//!   the two runs' last minutes and fails under 70 %.

#[path = "support/records.rs"]
#[allow(dead_code)] // figure1_path is for paths of 25–35 segments
mod records;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cpt_collector::ingest::{self, proto};
use cpt_collector::serve::{Collector, ServeConfig};
use cpt_collector::store::Store;
use cpt_sdk::path::Frame;
use cpt_sdk::record::Record;
use cpt_sdk::testing::SplitMix64 as Rng;
use cpt_sdk::trigger::Trigger;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use records::{short_path, stack_pool};

const SENDERS: usize = 4;
const BATCH: usize = 200;
/// Distinct batches each sender cycles through.
const BATCHES_PER_SENDER: usize = 16;
const PROFILE_EVERY: Duration = Duration::from_secs(20);
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
const WINDOW: Duration = Duration::from_secs(20);

/// A record of 4–15 segments drawn from `stacks`, 10 µs–2 ms each, without
/// a start time or ids (the sender stamps them).
fn record(rng: &mut Rng, stacks: &[Vec<Frame>], i: u64) -> Record {
    let p = short_path(rng, stacks);
    let service = ["A", "B", "C"][rng.below(3) as usize];
    let mut r = Record::new(service, Trigger::Sampled, p);
    r.endpoint = Some(format!("/{service}/Run{}", rng.below(4)));
    r.labels.insert(
        "arm".into(),
        if i.is_multiple_of(2) { "a" } else { "b" }.into(),
    );
    r
}

/// One acknowledged batch: when it was sent (since the start) and how long
/// its acknowledgement took.
#[derive(Clone, Copy)]
struct Ack {
    sent: Duration,
    latency: Duration,
}

#[derive(Default)]
struct SenderLog {
    acks: Vec<Ack>,
    records: u64,
    refused: u64,
    errors: Vec<String>,
    /// Time spent stamping and encoding batches.
    encoding: Duration,
}

/// Stamp `records` with the current time as their start (1 µs apart) and
/// fresh random ids, as requests arriving now would carry, and encode them.
fn stamp_and_encode(records: &mut [Record], rng: &mut Rng) -> Bytes {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    for (j, r) in records.iter_mut().enumerate() {
        r.start_unix_nanos = Some(now + j as u64 * 1_000);
        r.request_id = Some(format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64()));
        r.trace_id =
            (rng.below(10) == 0).then(|| format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64()));
    }
    Bytes::from(prost::Message::encode_to_vec(
        &proto::RecordBatch::from_records(&*records),
    ))
}

/// Sends batches to `url` until `stop`, each as soon as the previous one is
/// acknowledged, stamped and encoded just before it is sent; a refused
/// batch (503, 429) is sent again after its `Retry-After` (at most 1 s).
fn sender(
    url: String,
    mut batches: Vec<Vec<Record>>,
    seed: u64,
    replay: bool,
    t0: Instant,
    stop: Arc<AtomicBool>,
) -> SenderLog {
    // Replayed batches: stamped once with fixed start times and ids.
    let replayed: Vec<Bytes> = if replay {
        batches
            .iter_mut()
            .enumerate()
            .map(|(b, records)| {
                for (j, r) in records.iter_mut().enumerate() {
                    let i = seed * 1_000_000 + (b * BATCH + j) as u64;
                    r.start_unix_nanos = Some(1_700_000_000_000_000_000 + i * 1_000_000);
                    r.request_id = Some(format!("req-{i}"));
                }
                Bytes::from(prost::Message::encode_to_vec(
                    &proto::RecordBatch::from_records(&*records),
                ))
            })
            .collect()
    } else {
        Vec::new()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client: Client<HttpConnector, Full<Bytes>> = {
        let _g = rt.enter();
        Client::builder(TokioExecutor::new()).build_http()
    };
    let mut log = SenderLog::default();
    let mut rng = Rng::new(seed);
    rt.block_on(async {
        let mut k = 0;
        // The batch being sent: a refused one is resent as it was.
        let mut pending: Option<Bytes> = None;
        while !stop.load(Ordering::Relaxed) {
            let body = match &pending {
                Some(b) => b.clone(),
                None if replay => pending.insert(replayed[k % replayed.len()].clone()).clone(),
                None => {
                    let t = Instant::now();
                    let n = batches.len();
                    let b = stamp_and_encode(&mut batches[k % n], &mut rng);
                    log.encoding += t.elapsed();
                    pending.insert(b).clone()
                }
            };
            let sent = Instant::now();
            let req = http::Request::post(&url)
                .header(http::header::CONTENT_TYPE, ingest::CONTENT_TYPE_PROTOBUF)
                .body(Full::new(body))
                .unwrap();
            let resp = match client.request(req).await {
                Ok(r) => r,
                Err(e) => {
                    log.errors.push(format!("sending: {e}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let status = resp.status();
            let body = match resp.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    log.errors.push(format!("reading the acknowledgement: {e}"));
                    continue;
                }
            };
            let latency = sent.elapsed();
            if status.is_success() {
                log.acks.push(Ack {
                    sent: sent - t0,
                    latency,
                });
                log.records += BATCH as u64;
                k += 1;
                pending = None;
            } else if status == http::StatusCode::SERVICE_UNAVAILABLE
                || status == http::StatusCode::TOO_MANY_REQUESTS
            {
                log.refused += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            } else {
                log.errors
                    .push(format!("{status}: {}", String::from_utf8_lossy(&body)));
                if log.errors.len() > 100 {
                    break;
                }
            }
        }
    });
    log
}

/// One `/profile`: when it started (since the start), how long it took,
/// the size of the answer.
struct ProfileRun {
    started: Duration,
    took: Duration,
    bytes: usize,
    error: Option<String>,
}

/// Asks `GET url` every [`PROFILE_EVERY`] (or right after the previous one
/// when that took longer) until `stop`.
fn reader(url: String, t0: Instant, stop: Arc<AtomicBool>) -> Vec<ProfileRun> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A fresh connection for each profile: one kept idle for 20 s may have
    // been closed by the collector's idle timeout meanwhile.
    let client: Client<HttpConnector, Full<Bytes>> = {
        let _g = rt.enter();
        Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build_http()
    };
    let mut runs = Vec::new();
    let mut next = t0 + PROFILE_EVERY;
    loop {
        while Instant::now() < next {
            if stop.load(Ordering::Relaxed) {
                return runs;
            }
            thread::sleep(Duration::from_millis(50));
        }
        let started = Instant::now();
        let result = rt.block_on(async {
            let req = http::Request::get(&url)
                .body(Full::new(Bytes::new()))
                .unwrap();
            let resp = client.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            if status.is_success() {
                Ok(body.len())
            } else {
                Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
            }
        });
        let took = started.elapsed();
        runs.push(ProfileRun {
            started: started - t0,
            took,
            bytes: *result.as_ref().unwrap_or(&0),
            error: result.err(),
        });
        next += PROFILE_EVERY;
        next = next.max(Instant::now());
    }
}

/// `(since the start, WAL bytes)` every [`SAMPLE_EVERY`] until `stop`.
fn sampler(wal: PathBuf, t0: Instant, stop: Arc<AtomicBool>) -> Vec<(Duration, u64)> {
    let mut samples = Vec::new();
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let size = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        samples.push((t0.elapsed(), size));
        next += SAMPLE_EVERY;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            thread::sleep(d);
        }
    }
    samples
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn stats(http: SocketAddr) -> String {
    get(http, "/v1/stats")
}

/// The body of `GET path` (a message when it cannot be had).
fn get(http: SocketAddr, path: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client: Client<HttpConnector, Full<Bytes>> = {
        let _g = rt.enter();
        Client::builder(TokioExecutor::new()).build_http()
    };
    rt.block_on(async {
        let req = http::Request::get(format!("http://{http}{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        match client.request(req).await {
            Ok(resp) => match resp.into_body().collect().await {
                Ok(b) => String::from_utf8_lossy(&b.to_bytes()).trim().to_string(),
                Err(e) => format!("unreadable: {e}"),
            },
            Err(e) => format!("unreachable: {e}"),
        }
    })
}

/// `"accepted_records": N` out of `/v1/stats`' JSON.
fn accepted_records(stats: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(stats).ok()?;
    v.get("accepted_records")?.as_u64()
}

fn main() -> ExitCode {
    // `cargo bench` passes `--bench` (and filters); this bench takes none.
    let secs: u64 = std::env::var("CPT_SOAK_SECS")
        .ok()
        .map(|s| {
            s.parse()
                .expect("CPT_SOAK_SECS: a whole number of seconds, e.g. 480")
        })
        .unwrap_or(480);
    let bound = std::env::var("CPT_SOAK_MAX_STORE").ok().map(|s| {
        cpt_collector::serve::parse_size(&s).unwrap_or_else(|e| panic!("CPT_SOAK_MAX_STORE: {e}"))
    });
    let Some(b) = bound else {
        return if soak(secs, None).ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    };
    // The same soak without the bound, then with it: what the bound costs.
    println!("=== without a bound ===");
    let free = soak(secs, None);
    println!();
    println!("=== with --max-store-bytes {b} ===");
    let bounded = soak(secs, Some(b));
    let ratio = bounded.last_minute / free.last_minute.max(1e-9);
    println!();
    println!(
        "ingest in the last minute: {:.0} records/s without a bound, {:.0} with it: {:.0} %",
        free.last_minute,
        bounded.last_minute,
        100.0 * ratio
    );
    let mut ok = free.ok && bounded.ok;
    if ratio < MIN_PACE_AT_BOUND {
        println!(
            "FAIL: at its bound the store ingests under {:.0} % of the unbounded pace",
            100.0 * MIN_PACE_AT_BOUND
        );
        ok = false;
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The least share of the unbounded pace a bounded store keeps in the
/// soak's last minute.
const MIN_PACE_AT_BOUND: f64 = 0.70;

/// What one soak found.
struct Run {
    /// No check failed.
    ok: bool,
    /// Records acknowledged a second over the last minute of sending.
    last_minute: f64,
}

/// Records acknowledged a second in the last minute (or less) of sending.
fn last_minute_rate(logs: &[SenderLog], sending: Duration) -> f64 {
    let from = sending.saturating_sub(Duration::from_secs(60));
    let acks = logs
        .iter()
        .flat_map(|l| &l.acks)
        .filter(|a| a.sent + a.latency >= from && a.sent + a.latency <= sending)
        .count();
    (acks * BATCH) as f64 / (sending - from).as_secs_f64().max(1e-9)
}

/// One soak of `secs` seconds, under `bound` when given.
fn soak(secs: u64, bound: Option<u64>) -> Run {
    let duration = Duration::from_secs(secs);
    let replay = std::env::var("CPT_SOAK_REPLAY").is_ok_and(|v| v == "1");
    let max_store: u64 = std::env::var("CPT_SOAK_MAX_GIB")
        .ok()
        .map(|s| {
            s.parse::<u64>()
                .expect("CPT_SOAK_MAX_GIB: a whole number of GiB, e.g. 14")
        })
        .unwrap_or(14)
        << 30;
    let base: PathBuf = std::env::var_os("CPT_SOAK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    let store_path = dir.path().join("store.db");
    let wal_path = {
        let mut s = store_path.clone().into_os_string();
        s.push("-wal");
        PathBuf::from(s)
    };

    println!(
        "soak: {SENDERS} HTTP senders, batches of {BATCH} records (4–15 segments), \
         GET /profile every {}s, WAL sampled every {}ms, for {secs}s; {}",
        PROFILE_EVERY.as_secs(),
        SAMPLE_EVERY.as_millis(),
        if replay {
            "replaying 16 batches a sender (start times and ids repeat)"
        } else {
            "records stamped as sent (increasing start times, fresh ids)"
        }
    );
    println!("store: {}", store_path.display());
    println!("load average before: {}", load_average());

    // Each sender's batches of paths, stamped and encoded as they are sent.
    let stacks = stack_pool(&mut Rng::new(7));
    let mut rng = Rng::new(42);
    let mut i = 0u64;
    let pools: Vec<Vec<Vec<Record>>> = (0..SENDERS)
        .map(|_| {
            (0..BATCHES_PER_SENDER)
                .map(|_| {
                    (0..BATCH)
                        .map(|_| {
                            i += 1;
                            record(&mut rng, &stacks, i)
                        })
                        .collect()
                })
                .collect()
        })
        .collect();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut config = ServeConfig::new(&store_path).with_http(loopback);
    if let Some(b) = bound {
        println!(
            "store bounded: --max-store-bytes {b} ({:.2} GiB)",
            b as f64 / (1u64 << 30) as f64
        );
        config = config.with_retention(cpt_collector::serve::RetentionConfig {
            max_store_bytes: Some(b),
            ..cpt_collector::serve::RetentionConfig::keep_everything()
        });
    }
    let collector = rt.block_on(Collector::start(config)).unwrap();
    let http = collector.http_addr().unwrap();

    let t0 = Instant::now();
    let stop_senders = Arc::new(AtomicBool::new(false));
    let stop_watch = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = pools
        .into_iter()
        .enumerate()
        .map(|(n, batches)| {
            let url = format!("http://{http}{}", ingest::HTTP_RECORDS_PATH);
            let stop = stop_senders.clone();
            thread::Builder::new()
                .name(format!("soak-sender-{n}"))
                .spawn(move || sender(url, batches, 1_000 + n as u64, replay, t0, stop))
                .unwrap()
        })
        .collect();
    let reader_thread = {
        let url = format!("http://{http}/profile");
        let stop = stop_senders.clone();
        thread::spawn(move || reader(url, t0, stop))
    };
    let sampler_thread = {
        let stop = stop_watch.clone();
        let wal = wal_path.clone();
        thread::spawn(move || sampler(wal, t0, stop))
    };

    let mut next_tick = t0 + Duration::from_secs(60);
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut largest = 0u64;
    while t0.elapsed() < duration {
        thread::sleep(Duration::from_millis(200));
        let store_size = size(&store_path) + size(&wal_path);
        largest = largest.max(store_size);
        if store_size >= max_store {
            println!(
                "stopping early at {:.1}s: the store reached {:.1} GiB (CPT_SOAK_MAX_GIB)",
                t0.elapsed().as_secs_f64(),
                store_size as f64 / (1u64 << 30) as f64
            );
            break;
        }
        if Instant::now() >= next_tick {
            eprintln!(
                "  {:>4}s  load {}  WAL {:.1} MiB",
                t0.elapsed().as_secs(),
                load_average(),
                mib(size(&wal_path))
            );
            next_tick += Duration::from_secs(60);
        }
    }
    stop_senders.store(true, Ordering::Relaxed);
    let logs: Vec<SenderLog> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    let sending = t0.elapsed();
    let load_end = load_average();
    // A profile still running finishes before the collector stops.
    let profiles = reader_thread.join().unwrap();
    let stats_json = stats(http);
    // The gauges follow the writer's upkeep within a second.
    thread::sleep(Duration::from_secs(2));
    let metrics = get(http, "/metrics");
    rt.block_on(collector.shutdown()).unwrap();
    stop_watch.store(true, Ordering::Relaxed);
    let wal = sampler_thread.join().unwrap();
    let stored = Store::open_read_only(&store_path)
        .and_then(|s| s.len())
        .expect("the store opens read-only and counts its records");
    let state = Store::open_read_only(&store_path)
        .and_then(|s| s.state())
        .expect("the store opens read-only and says what retention deleted");
    let deleted = state.deleted_by_retention + state.too_old;
    let series = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
    };
    let metrics_deleted = series("cpt_records_deleted_by_retention_total")
        .zip(series("cpt_records_too_old_total"))
        .map(|(a, b)| a + b);
    println!(
        "largest database + WAL sampled: {:.2} GiB; deleted by retention: {deleted} \
         (/metrics: {metrics_deleted:?})",
        largest as f64 / (1u64 << 30) as f64
    );

    let ok = report(&Report {
        logs: &logs,
        profiles: &profiles,
        wal: &wal,
        sending,
        load_end: &load_end,
        stats_json: &stats_json,
        stored,
        deleted,
        metrics_deleted,
        store_path: &store_path,
    });
    let mut ok = ok == ExitCode::SUCCESS;
    if let Some(b) = bound {
        println!(
            "database + WAL at most {largest} bytes against --max-store-bytes {b} ({:.1} %)",
            100.0 * largest as f64 / b as f64
        );
        if largest > b {
            println!("FAIL: the database and its WAL passed --max-store-bytes");
            ok = false;
        }
    }
    Run {
        ok,
        last_minute: last_minute_rate(&logs, sending),
    }
}

struct Report<'a> {
    logs: &'a [SenderLog],
    profiles: &'a [ProfileRun],
    wal: &'a [(Duration, u64)],
    sending: Duration,
    load_end: &'a str,
    stats_json: &'a str,
    stored: u64,
    /// Deleted by retention (or too old to store), as the store says.
    deleted: u64,
    /// The same, as `/metrics` says.
    metrics_deleted: Option<u64>,
    store_path: &'a Path,
}

fn report(r: &Report<'_>) -> ExitCode {
    let acked: u64 = r.logs.iter().map(|l| l.records).sum();
    let refused: u64 = r.logs.iter().map(|l| l.refused).sum();
    let errors: Vec<&String> = r.logs.iter().flat_map(|l| &l.errors).collect();
    let mut acks: Vec<Ack> = r.logs.iter().flat_map(|l| l.acks.iter().copied()).collect();
    acks.sort_by_key(|a| a.sent);
    let mut lat: Vec<Duration> = acks.iter().map(|a| a.latency).collect();
    lat.sort();
    let secs = r.sending.as_secs_f64();
    let store_bytes: u64 = ["", "-wal", "-shm"]
        .iter()
        .filter_map(|s| {
            let mut p = r.store_path.as_os_str().to_owned();
            p.push(s);
            std::fs::metadata(PathBuf::from(p)).ok().map(|m| m.len())
        })
        .sum();

    println!();
    println!("load average at the end of sending: {}", r.load_end);
    println!(
        "sent for {secs:.1}s: {} batches acknowledged, {refused} refused and resent, {} errors",
        acks.len(),
        errors.len()
    );
    for e in errors.iter().take(5) {
        println!("  error: {e}");
    }
    let encoding: Duration = r.logs.iter().map(|l| l.encoding).sum();
    println!(
        "senders stamping and encoding: {:.2} ms a batch, {:.1}% of one core",
        ms(encoding) / acks.len().max(1) as f64,
        100.0 * encoding.as_secs_f64() / secs
    );
    println!(
        "store after shutdown: {:.0} MiB ({:.0} bytes a record)",
        mib(store_bytes),
        store_bytes as f64 / r.stored.max(1) as f64
    );

    println!();
    println!("records: acknowledged {acked}, stored {}", r.stored);
    println!("/v1/stats: {}", r.stats_json);
    let stats_accepted = accepted_records(r.stats_json);

    println!();
    println!(
        "ack latency per batch of {BATCH}: p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms",
        ms(percentile(&lat, 0.50)),
        ms(percentile(&lat, 0.99)),
        ms(percentile(&lat, 0.999)),
        ms(percentile(&lat, 1.0)),
    );
    println!(
        "acks over 200 ms: {}, over 1 s: {}",
        lat.iter()
            .filter(|l| **l > Duration::from_millis(200))
            .count(),
        lat.iter().filter(|l| **l > Duration::from_secs(1)).count()
    );
    let mut slowest = acks.clone();
    slowest.sort_by_key(|a| std::cmp::Reverse(a.latency));
    println!("slowest acks (sent at):");
    for a in slowest.iter().take(5) {
        println!(
            "  {:>8.1} ms at {:>6.1}s",
            ms(a.latency),
            a.sent.as_secs_f64()
        );
    }

    // Per window: records acknowledged (by when the ack came), WAL max.
    println!();
    println!("per {}s window:", WINDOW.as_secs());
    println!(
        "  {:>9}  {:>10}  {:>10}  {:>11}  {:>9}",
        "window", "records/s", "ack p99 ms", "ack max ms", "WAL max MiB"
    );
    let windows = (r.sending.as_secs_f64() / WINDOW.as_secs_f64()).ceil() as usize;
    for w in 0..windows {
        let from = WINDOW * w as u32;
        let to = from + WINDOW;
        let done = |a: &&Ack| {
            let t = a.sent + a.latency;
            t >= from && t < to
        };
        let mut wl: Vec<Duration> = acks.iter().filter(done).map(|a| a.latency).collect();
        wl.sort();
        let span = (to.min(r.sending) - from).as_secs_f64();
        let wal_max = r
            .wal
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|(_, b)| *b)
            .max()
            .unwrap_or(0);
        println!(
            "  {:>4}-{:<4}  {:>10.0}  {:>10.1}  {:>11.1}  {:>11.1}",
            from.as_secs(),
            to.as_secs(),
            (wl.len() * BATCH) as f64 / span,
            ms(percentile(&wl, 0.99)),
            ms(percentile(&wl, 1.0)),
            mib(wal_max)
        );
    }

    // Ingest while a profile runs against while none does.
    let in_profile = |t: Duration| {
        r.profiles
            .iter()
            .any(|p| t >= p.started && t < p.started + p.took)
    };
    let profile_time: f64 = r
        .profiles
        .iter()
        .map(|p| {
            let end = (p.started + p.took).min(r.sending);
            end.saturating_sub(p.started).as_secs_f64()
        })
        .sum();
    let (during, outside): (Vec<&Ack>, Vec<&Ack>) =
        acks.iter().partition(|a| in_profile(a.sent + a.latency));
    let lat_of = |v: &[&Ack]| {
        let mut l: Vec<Duration> = v.iter().map(|a| a.latency).collect();
        l.sort();
        l
    };
    let (ld, lo) = (lat_of(&during), lat_of(&outside));
    println!();
    println!(
        "while a profile runs ({profile_time:.1}s): {:.0} records/s, ack p99 {:.1} ms, max {:.1} ms",
        (during.len() * BATCH) as f64 / profile_time.max(1e-9),
        ms(percentile(&ld, 0.99)),
        ms(percentile(&ld, 1.0))
    );
    println!(
        "while none runs ({:.1}s):  {:.0} records/s, ack p99 {:.1} ms, max {:.1} ms",
        secs - profile_time,
        (outside.len() * BATCH) as f64 / (secs - profile_time).max(1e-9),
        ms(percentile(&lo, 0.99)),
        ms(percentile(&lo, 1.0))
    );

    println!();
    println!("GET /profile over the whole store:");
    for p in r.profiles {
        // Records stored when it began: those acknowledged by then.
        let before = acks
            .iter()
            .filter(|a| a.sent + a.latency <= p.started)
            .count()
            * BATCH;
        match &p.error {
            None => println!(
                "  at {:>6.1}s over ~{before:>8} records: {:>7.2} s, {} bytes",
                p.started.as_secs_f64(),
                p.took.as_secs_f64(),
                p.bytes
            ),
            Some(e) => println!(
                "  at {:>6.1}s over ~{before:>8} records: failed after {:.2} s: {e}",
                p.started.as_secs_f64(),
                p.took.as_secs_f64()
            ),
        }
    }

    let wal_max = r.wal.iter().map(|(_, b)| *b).max().unwrap_or(0);
    let wal_last = r.wal.last().map(|(_, b)| *b).unwrap_or(0);
    println!();
    println!(
        "WAL: max {:.1} MiB over {} samples; {:.1} MiB after shutdown",
        mib(wal_max),
        r.wal.len(),
        mib(wal_last)
    );

    // Each time the WAL was cut back by more than 64 MiB between two
    // samples, with the slowest acknowledgement in flight within a second
    // of it: a stall caused by the truncation shows up beside it.
    println!("WAL cut back (from → to, slowest ack in flight within 1 s):");
    for pair in r.wal.windows(2) {
        let ((_, before), (t, after)) = (pair[0], pair[1]);
        if before.saturating_sub(after) <= 64 << 20 {
            continue;
        }
        let near = |a: &&Ack| {
            let (from, to) = (a.sent, a.sent + a.latency);
            to + Duration::from_secs(1) >= t && from <= t + Duration::from_secs(1)
        };
        let slowest = acks
            .iter()
            .filter(near)
            .map(|a| a.latency)
            .max()
            .unwrap_or_default();
        println!(
            "  at {:>6.1}s: {:>7.1} → {:>6.1} MiB, {:>7.1} ms",
            t.as_secs_f64(),
            mib(before),
            mib(after),
            ms(slowest)
        );
    }

    let mut ok = true;
    if acked != r.stored + r.deleted {
        println!(
            "FAIL: {acked} records acknowledged, {} stored in the store and {} deleted by retention",
            r.stored, r.deleted
        );
        ok = false;
    }
    if r.metrics_deleted.unwrap_or(0) != r.deleted {
        println!(
            "FAIL: the store deleted {} records, /metrics says {:?}",
            r.deleted, r.metrics_deleted
        );
        ok = false;
    }
    if stats_accepted != Some(acked) {
        println!(
            "FAIL: {acked} records acknowledged, /v1/stats counts {stats_accepted:?} accepted"
        );
        ok = false;
    }
    if ok {
        println!(
            "acknowledged = stored + deleted by retention: {acked} = {} + {}",
            r.stored, r.deleted
        );
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
