//! A collector left running: raw records past `--retain-for` or over
//! `--max-store-bytes` are deleted, every request stays in the roll-ups
//! (CPT's average critical path, as sums and counts), and `/metrics` says
//! so; all of it through `kill -9` at any point.

use std::time::{Duration, Instant, SystemTime};

use cpt_collector::aggregate::Aggregate;
use cpt_collector::ingest::CONTENT_TYPE_JSON_LINES;
use cpt_collector::profile::encode_gzip;
use cpt_collector::selection::Selection;
use cpt_collector::store::Store;
use cpt_sdk::Record;
use cpt_sdk::testing::SplitMix64;

use crate::support::*;

const DAY: u64 = 86_400_000_000_000;

fn now_nanos() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap()
}

/// `n` records of batch `batch` (their endpoint) that started up to `days`
/// ago, one in ten forced.
fn spread(batch: &str, n: usize, days: u64, rng: &mut SplitMix64) -> Vec<Record> {
    let now = now_nanos();
    (0..n)
        .map(|i| {
            let mut r = record(batch, i);
            r.endpoint = Some(batch.to_owned());
            // Half of them age out of a two-day window within seconds.
            r.start_unix_nanos = Some(if i % 2 == 0 {
                now - 2 * DAY + 200_000_000 + rng.below(4_000_000_000)
            } else {
                now - rng.below(days * DAY)
            });
            if rng.below(10) == 0 {
                r.trigger = cpt_sdk::Trigger::Forced;
            }
            r
        })
        .collect()
}

fn get(addr: std::net::SocketAddr, path: &str) -> HttpResponse {
    http(addr, "GET", path, "text/plain", b"").expect("HTTP request failed")
}

/// A chunked body's payload.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..line]).unwrap().trim(), 16).unwrap();
        b = &b[line + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

fn records_over_http(addr: std::net::SocketAddr, query: &str) -> Vec<Record> {
    let resp = get(addr, &format!("/v1/records?{query}"));
    assert_eq!(resp.status, 200, "{}", resp.text());
    let body = if resp.header("transfer-encoding") == Some("chunked") {
        dechunk(&resp.body)
    } else {
        resp.body.clone()
    };
    String::from_utf8(body)
        .unwrap()
        .lines()
        .map(|l| Record::from_json(l).unwrap())
        .collect()
}

/// The done-when case: records spread over 10 days sent to
/// `--retain-for 2d --retention-interval 1s`; within 10 s `/v1/records`
/// returns none older than 2 days, and a profile since 10 days ago counts
/// every request with the per-stack totals of a fold of all of them, byte
/// for byte.
#[test]
fn past_the_raw_window_records_go_and_rollups_answer_for_every_request() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.db");
    let served = serve_child(
        &store,
        false,
        &["--retain-for", "2d", "--retention-interval", "1s"].map(std::ffi::OsStr::new),
    );
    let addr = served.http;
    let mut rng = SplitMix64::new(11);
    let mut sent = Vec::new();
    for b in 0..20 {
        let batch = spread("/svc", 100, 10, &mut rng);
        let resp = post_records(addr, CONTENT_TYPE_JSON_LINES, &json_lines(&batch));
        assert_eq!(resp.status, 200, "batch {b}: {}", resp.text());
        sent.extend(batch);
    }
    let cutoff = now_nanos() - 2 * DAY;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let old = records_over_http(addr, "service=A&limit=100000")
            .iter()
            .filter(|r| r.start_unix_nanos.unwrap() < cutoff)
            .count();
        if old == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{old} records older than 2 days still served after 10 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let since = now_nanos() - 10 * DAY - 1_000_000_000;
    let query = format!("service=A&since={since}");
    let resp = get(addr, &format!("/profile?{query}"));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_ne!(resp.header("x-cpt-profile-source"), Some("raw"));
    let sel = Selection::from_query(&query).unwrap();
    let want = Aggregate::from_records(&sel, &sent);
    assert_eq!(
        want.requests(),
        sent.iter()
            .filter(|r| r.trigger == cpt_sdk::Trigger::Sampled)
            .count() as u64
    );
    assert_eq!(
        resp.body,
        encode_gzip(&want),
        "the profile is the fold of every record sent"
    );
    // A label filter cannot be answered from roll-ups over that range.
    let resp = get(addr, &format!("/profile?{query}&label=batch%3D%2Fsvc"));
    assert_eq!(resp.status, 410, "{}", resp.text());
    assert!(resp.text().contains("--retain-for"), "{}", resp.text());
    kill_9(served);
}

/// `cpt serve` bounded to `bound` (`--max-store-bytes`), raw records
/// otherwise kept forever, batches of at most 1 MiB, `/metrics` open.
fn serve_bounded(store: &std::path::Path, bound: &str) -> Served {
    serve_child(
        store,
        false,
        &[
            "--max-store-bytes",
            bound,
            "--max-batch-bytes",
            "1048576",
            "--retain-for",
            "forever",
            "--metrics-open",
        ]
        .map(std::ffi::OsStr::new),
    )
}

/// The done-when case, scaled to a test: under `--max-store-bytes` every
/// batch is acknowledged and the database plus its WAL, sampled as they are
/// written, stay within 10 % of the bound; acknowledged = raw + deleted by
/// retention, and `/metrics` agrees.
#[test]
fn a_store_at_its_size_bound_stays_there_and_loses_no_acknowledged_request() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.db");
    let bound: u64 = 64 << 20;
    let served = serve_bounded(&store, "64MiB");
    let addr = served.http;
    let watch_path = store.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let sampler = std::thread::spawn(move || {
        let (mut most, mut most_wal) = (0u64, 0u64);
        let mut wal = watch_path.clone().into_os_string();
        wal.push("-wal");
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            let size = |p: &std::ffi::OsStr| std::fs::metadata(p).map_or(0, |m| m.len());
            let wal = size(&wal);
            most = most.max(size(watch_path.as_os_str()) + wal);
            most_wal = most_wal.max(wal);
            std::thread::sleep(Duration::from_millis(50));
        }
        (most, most_wal)
    });
    let mut rng = SplitMix64::new(12);
    let mut sent = 0u64;
    let mut bytes = 0u64;
    let mut b = 0;
    while bytes < 3 * bound {
        // As a live fleet sends them: started a moment ago.
        let mut batch = records(&format!("/b{b}"), 400);
        for r in &mut batch {
            r.start_unix_nanos = Some(now_nanos() - rng.below(2_000_000_000));
        }
        let body = json_lines(&batch);
        let resp = post_records(addr, CONTENT_TYPE_JSON_LINES, &body);
        assert_eq!(resp.status, 200, "batch {b}: {}", resp.text());
        sent += batch.len() as u64;
        bytes += body.len() as u64 * 4;
        b += 1;
    }
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (most, most_wal) = sampler.join().unwrap();
    assert!(
        most <= bound + bound / 10,
        "database + WAL reached {most} bytes, over {bound} + 10 % (the WAL at most {most_wal})"
    );
    // The WAL keeps to its share: cut back at a sixteenth of the bound, with
    // no transaction appending more than a quarter of that (deletions) or
    // an eighth and one batch (group commits).
    assert!(
        most_wal <= bound / 8,
        "the WAL reached {most_wal} bytes, over its eighth of {bound}"
    );
    let metrics = get(addr, "/metrics").text();
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from\n{metrics}"))
    };
    let deleted = value("cpt_records_deleted_by_retention_total");
    assert!(deleted > 0, "nothing deleted: the bound was never reached");
    assert_eq!(value("cpt_records_accepted_total"), sent);
    kill_9(served);
    let raw = Store::open_read_only(&store).unwrap().len().unwrap();
    let state = Store::open_read_only(&store).unwrap().state().unwrap();
    assert_eq!(state.deleted_by_retention, deleted);
    assert_eq!(
        raw + deleted,
        sent,
        "acknowledged = raw + deleted by retention"
    );
}

/// Kill -9 while batches arrive and the retention pass deletes and rolls
/// up: after a restart every acknowledged batch (its own endpoint) is
/// counted exactly once, from raw records or roll-ups, and every batch in
/// the store is whole.
#[test]
fn retention_and_rollups_survive_kill_9_at_any_point() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.db");
    let mut rng = SplitMix64::new(13);
    let mut batches: Vec<(Vec<Record>, bool)> = Vec::new();
    for round in 0..3 {
        let served = serve_child(
            &store,
            false,
            &["--retain-for", "2d", "--retention-interval", "1s"].map(std::ffi::OsStr::new),
        );
        let addr = served.http;
        let kill_after = Duration::from_millis(300 + rng.below(1_500));
        let started = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut senders = Vec::new();
        for t in 0..3 {
            let tx = tx.clone();
            let mut rng = SplitMix64::new(100 * round + t);
            senders.push(std::thread::spawn(move || {
                for i in 0.. {
                    let batch = spread(&format!("/r{round}t{t}b{i}"), 50, 5, &mut rng);
                    let acked = http(
                        addr,
                        "POST",
                        "/v1/records",
                        CONTENT_TYPE_JSON_LINES,
                        &json_lines(&batch),
                    )
                    .is_ok_and(|r| r.status == 200);
                    let gone = !acked;
                    tx.send((batch, acked)).unwrap();
                    if gone {
                        return;
                    }
                }
            }));
        }
        drop(tx);
        std::thread::sleep(kill_after.saturating_sub(started.elapsed()));
        kill_9(served);
        for s in senders {
            s.join().unwrap();
        }
        batches.extend(rx.iter());
    }
    // Restarted once more (upgrades nothing, settles nothing): read it.
    let mut s = Store::open(&store).unwrap();
    while !s
        .roll_up(10_000, SystemTime::now(), Duration::from_secs(14 * 86_400))
        .unwrap()
        .caught_up
    {}
    let since = now_nanos() - 6 * DAY;
    let (mut acked, mut found) = (0, 0);
    for (batch, was_acked) in &batches {
        let endpoint = batch[0].endpoint.clone().unwrap();
        let sel = Selection::new()
            .with_service("A")
            .with_endpoint(&endpoint)
            .with_since(since);
        let (got, _) = s
            .profile(
                cpt_collector::aggregate::Aggregator::new(sel.clone()),
                1_000,
            )
            .unwrap();
        let want = Aggregate::from_records(&sel, batch);
        if *was_acked {
            acked += 1;
            assert_eq!(got, want, "acknowledged batch {endpoint}");
        } else if got.requests() > 0 {
            // Committed, the acknowledgement lost to the kill: whole.
            assert_eq!(got, want, "unacknowledged batch {endpoint}");
        }
        found += u64::from(got.requests() > 0);
    }
    assert!(acked > 10, "only {acked} batches acknowledged");
    assert!(found >= acked);
    let state = s.state().unwrap();
    assert!(
        state.deleted_by_retention > 0,
        "retention never ran before the kills: {state:?}"
    );
}

/// `n` records of batch `batch` with random labels (a fresh value for
/// each of four keys on every record), started a moment ago: the shape
/// of a fleet whose labels carry request-scoped values.
fn random_labelled(batch: &str, n: usize, rng: &mut SplitMix64) -> Vec<Record> {
    let now = now_nanos();
    (0..n)
        .map(|i| {
            let mut r = record(batch, i);
            r.start_unix_nanos = Some(now - rng.below(2_000_000_000));
            for key in ["user", "session", "shard", "build"] {
                let value = format!("{:016x}{:08x}", rng.next_u64(), rng.below(1 << 32));
                r.labels.insert(key.into(), value);
            }
            r
        })
        .collect()
}

/// The database file plus its WAL, sampled every 100 ms until `stop`:
/// the largest sum seen and the largest WAL.
fn sample_disk(
    store: std::path::PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(u64, u64)> {
    std::thread::spawn(move || {
        let (mut most, mut most_wal) = (0u64, 0u64);
        let mut wal = store.clone().into_os_string();
        wal.push("-wal");
        let size = |p: &std::ffi::OsStr| std::fs::metadata(p).map_or(0, |m| m.len());
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let w = size(&wal);
            most = most.max(size(store.as_os_str()) + w);
            most_wal = most_wal.max(w);
            std::thread::sleep(Duration::from_millis(100));
        }
        (most, most_wal)
    })
}

/// Eight connections sending records with random labels at once: the
/// database file plus its WAL, as the disk sees them every 100 ms, never
/// pass `--max-store-bytes`, nor does `cpt_store_file_bytes` +
/// `cpt_store_wal_bytes`; acknowledged = raw + deleted by retention.
#[test]
fn the_disk_never_sees_more_than_the_bound_under_eight_senders_of_random_labels() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.db");
    let bound: u64 = 64 << 20;
    let served = serve_bounded(&store, "64MiB");
    let addr = served.http;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_disk(store.clone(), stop.clone());
    // Each sender sends about its share of four times the bound (records
    // take about four times their JSON Lines in the store).
    let senders: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = SplitMix64::new(40 + t);
                let (mut sent, mut bytes, mut b) = (0u64, 0u64, 0);
                while bytes < bound / 2 {
                    let batch = random_labelled(&format!("/s{t}b{b}"), 200, &mut rng);
                    let body = json_lines(&batch);
                    let resp = post_records(addr, CONTENT_TYPE_JSON_LINES, &body);
                    assert_eq!(resp.status, 200, "sender {t} batch {b}: {}", resp.text());
                    sent += batch.len() as u64;
                    bytes += body.len() as u64 * 4;
                    b += 1;
                }
                sent
            })
        })
        .collect();
    let sent: u64 = senders.into_iter().map(|s| s.join().unwrap()).sum();
    // The gauges follow the writer's upkeep within a second.
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (most, most_wal) = sampler.join().unwrap();
    let metrics = get(addr, "/metrics").text();
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from\n{metrics}"))
    };
    let on_disk = value("cpt_store_file_bytes") + value("cpt_store_wal_bytes");
    let (deleted, accepted) = (
        value("cpt_records_deleted_by_retention_total"),
        value("cpt_records_accepted_total"),
    );
    kill_9(served);
    assert!(
        most <= bound,
        "database + WAL reached {most} bytes, over the bound of {bound} (the WAL at most {most_wal})"
    );
    assert!(on_disk <= bound, "/metrics: file + WAL {on_disk} > {bound}");
    assert!(deleted > 0, "nothing deleted: the bound was never reached");
    assert_eq!(accepted, sent);
    let read = Store::open_read_only(&store).unwrap();
    let (raw, deleted) = (
        read.len().unwrap(),
        read.state().unwrap().deleted_by_retention,
    );
    assert_eq!(
        raw + deleted,
        sent,
        "acknowledged = raw + deleted by retention"
    );
}

/// `CptStoreNearlyFull`, as the operations page writes it, under
/// promtool's rule tests: quiet for a store at its working bound (the file
/// at its three quarters, the WAL up to a tenth), firing after 15 minutes
/// for one whose file holds 95 % of the bound. Skipped without promtool
/// unless CPT_REQUIRE_PROMTOOL is set.
#[test]
fn the_store_nearly_full_alert_is_quiet_at_a_working_bound_and_fires_past_it() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/src/operations/retention.md"
    ))
    .unwrap();
    let rules = page
        .split("```yaml\n")
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains("alert: CptStoreNearlyFull"))
        .expect("the operations page has the alert rules");
    if !promtool_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cpt-alerts.yml"), rules).unwrap();
    let bound: u64 = 64 << 20;
    let file_at_share = bound / 4 * 3;
    let tests = format!(
        r#"rule_files: [cpt-alerts.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'cpt_store_max_bytes{{instance="working"}}'
        values: '{bound}x60'
      - series: 'cpt_store_file_bytes{{instance="working"}}'
        values: '{file_at_share}x60'
      - series: 'cpt_store_wal_bytes{{instance="working"}}'
        values: '0 {wal} 0 {wal} 0 {wal} 0 {wal} 0 {wal} {wal}x50'
      - series: 'cpt_store_max_bytes{{instance="full"}}'
        values: '{bound}x60'
      - series: 'cpt_store_file_bytes{{instance="full"}}'
        values: '{full}x60'
      - series: 'cpt_store_wal_bytes{{instance="full"}}'
        values: '0x60'
    alert_rule_test:
      - eval_time: 10m
        alertname: CptStoreNearlyFull
        exp_alerts: []
      - eval_time: 45m
        alertname: CptStoreNearlyFull
        exp_alerts:
          - exp_labels: {{severity: warning, instance: full}}
            exp_annotations:
              summary: "cpt store on full is nearly full"
              description: "Lower --retain-for, raise --max-store-bytes, or add disk. Roll-ups keep every endpoint's profile regardless."
"#,
        wal = bound / 10,
        full = bound / 100 * 95,
    );
    std::fs::write(dir.path().join("tests.yml"), tests).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["test", "rules", "tests.yml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool test rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A sender that keeps sending to a store held at its bound: the roll-ups
/// keep their pace, so `cpt_rollup_backlog_records`, sampled throughout,
/// never holds more than the writer rolls up at once (20 000) and a
/// group, and ends at zero.
#[test]
fn rollups_keep_their_pace_while_a_store_is_held_at_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.db");
    let bound: u64 = 32 << 20;
    let served = serve_bounded(&store, "32MiB");
    let addr = served.http;
    let backlog = move || -> u64 {
        get(addr, "/metrics")
            .text()
            .lines()
            .find_map(|l| l.strip_prefix("cpt_rollup_backlog_records ")?.parse().ok())
            .expect("cpt_rollup_backlog_records in /metrics")
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let sampler = std::thread::spawn(move || {
        let mut seen = Vec::new();
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            seen.push(backlog());
            std::thread::sleep(Duration::from_millis(250));
        }
        seen
    });
    let mut rng = SplitMix64::new(50);
    let (mut bytes, mut b) = (0u64, 0);
    while bytes < 4 * bound {
        let batch = random_labelled(&format!("/p{b}"), 400, &mut rng);
        let body = json_lines(&batch);
        let resp = post_records(addr, CONTENT_TYPE_JSON_LINES, &body);
        assert_eq!(resp.status, 200, "batch {b}: {}", resp.text());
        bytes += body.len() as u64 * 4;
        b += 1;
    }
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = sampler.join().unwrap();
    let last = backlog();
    let deleted: u64 = get(addr, "/metrics")
        .text()
        .lines()
        .find_map(|l| {
            l.strip_prefix("cpt_records_deleted_by_retention_total ")?
                .parse()
                .ok()
        })
        .unwrap();
    kill_9(served);
    assert!(deleted > 0, "the store never reached its bound");
    assert!(seen.len() > 10, "only {} samples", seen.len());
    let most = seen.iter().copied().max().unwrap();
    assert!(
        most <= 20_000 + 2_000,
        "the roll-up backlog reached {most} records (samples: {seen:?})"
    );
    assert_eq!(last, 0, "records left to roll up after the sender stopped");
}
