//! Ingest into a growing store, with the id indexes as cpt lays them out
//! (led by the record's id bucket) against the plain indexes on the id
//! alone (the baseline, built on the same schema), side by side in one run.
//!
//! Records have 4–15 segments, start times that increase as a collector's
//! do, and random request ids (and a trace id on every tenth), as requests
//! carry. They are committed four batches of 200 to a transaction, the
//! collector's group commit, `synchronous = FULL`. Printed per arm: records/s
//! per window of 200 000 records, the commit's p50/p99 in the last window,
//! and the time to find one record by request id at the end (median over
//! 200 ids, each a fresh query) and the database's bytes a record; then
//! the ratios.
//!
//! Run: `cargo bench -p cpt-benches --bench store`. Environment:
//! `CPT_STORE_RECORDS` (per arm, default 1 000 000); `CPT_STORE_DIR`
//! (where the two stores go, default the target's tmp directory; about
//! 3 GB each at the default).

#[path = "support/records.rs"]
#[allow(dead_code)] // figure1_path is for paths of 25–35 segments
mod records;

use std::path::Path;
use std::time::{Duration, Instant};

use cpt_collector::store::{EncodedBatch, Store, StoreQuery};
use cpt_sdk::path::Frame;
use cpt_sdk::record::Record;
use cpt_sdk::testing::SplitMix64 as Rng;
use cpt_sdk::trigger::Trigger;
use records::{short_path, stack_pool};

const BATCH: usize = 200;
const GROUP: usize = 4;
const WINDOW: u64 = 200_000;

/// Record `i`: 4–15 segments, started 1 ms after record `i - 1`.
fn record(rng: &mut Rng, stacks: &[Vec<Frame>], i: u64) -> Record {
    let p = short_path(rng, stacks);
    let service = ["A", "B", "C"][rng.below(3) as usize];
    let mut r = Record::new(service, Trigger::Sampled, p);
    r.endpoint = Some(format!("/{service}/Run{}", rng.below(4)));
    r.start_unix_nanos = Some(1_700_000_000_000_000_000 + i * 1_000_000);
    r.request_id = Some(format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64()));
    if i.is_multiple_of(10) {
        r.trace_id = Some(format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64()));
    }
    r
}

/// The id indexes of schema versions 2–4: on the id alone.
const PLAIN: &str = "
DROP INDEX records_by_request_id;
DROP INDEX records_by_trace_id;
CREATE INDEX records_by_request_id ON records (request_id) WHERE request_id IS NOT NULL;
CREATE INDEX records_by_trace_id ON records (trace_id) WHERE trace_id IS NOT NULL;
";

struct Arm {
    /// Records/s per window.
    windows: Vec<f64>,
    last_p50: Duration,
    last_p99: Duration,
    lookup_median: Duration,
    bytes_per_record: f64,
}

fn run(dir: &Path, name: &str, plain: bool, n: u64) -> Arm {
    let path = dir.join(format!("{name}.db"));
    let mut store = Store::open(&path).expect("store");
    if plain {
        // The store's own connection re-prepares its statements.
        rusqlite::Connection::open(&path)
            .and_then(|c| c.execute_batch(PLAIN))
            .expect("plain id indexes");
    }
    let stacks = stack_pool(&mut Rng::new(7));
    let mut rng = Rng::new(42);
    let mut ids = Vec::new();
    let (mut i, mut spent) = (0u64, Duration::ZERO);
    let mut commits = Vec::new();
    let mut windows = Vec::new();
    let (mut last_p50, mut last_p99) = (Duration::ZERO, Duration::ZERO);
    while i < n {
        let batches: Vec<EncodedBatch> = (0..GROUP)
            .map(|_| {
                let recs: Vec<Record> = (0..BATCH)
                    .map(|_| {
                        i += 1;
                        record(&mut rng, &stacks, i)
                    })
                    .collect();
                if i % 5_000 < (BATCH as u64) {
                    ids.push(recs[0].request_id.clone().unwrap());
                }
                EncodedBatch::new(&recs)
            })
            .collect();
        let group: Vec<&EncodedBatch> = batches.iter().collect();
        let t = Instant::now();
        for r in store.insert_group(&group).expect("commit") {
            r.expect("batch");
        }
        let took = t.elapsed();
        spent += took;
        commits.push(took);
        if i % WINDOW == 0 || i >= n {
            commits.sort();
            windows.push(commits.len() as f64 * (BATCH * GROUP) as f64 / spent.as_secs_f64());
            last_p50 = commits[commits.len() / 2];
            last_p99 = commits[commits.len() * 99 / 100];
            println!(
                "  {name}: {i:>8} records  {:>7.0} records/s  commit p50 {:>5.1} ms  p99 {:>5.1} ms",
                windows.last().unwrap(),
                last_p50.as_secs_f64() * 1e3,
                last_p99.as_secs_f64() * 1e3
            );
            commits.clear();
            spent = Duration::ZERO;
        }
    }
    drop(store);
    let bytes_per_record = std::fs::metadata(&path).map_or(0, |m| m.len()) as f64 / n as f64;
    let store = Store::open_read_only(&path).expect("open");
    let mut pick = Rng::new(9);
    let mut times: Vec<Duration> = (0..200)
        .map(|_| {
            let id = &ids[pick.below(ids.len() as u64) as usize];
            let q = StoreQuery {
                request_id: Some(id.clone()),
                ..StoreQuery::default()
            };
            let t = Instant::now();
            let found = store.query(&q).expect("query").count();
            let took = t.elapsed();
            assert_eq!(found, 1, "request id {id}");
            took
        })
        .collect();
    times.sort();
    drop(store);
    let _ = std::fs::remove_file(&path);
    Arm {
        windows,
        last_p50,
        last_p99,
        lookup_median: times[times.len() / 2],
        bytes_per_record,
    }
}

fn main() {
    let n: u64 = std::env::var("CPT_STORE_RECORDS")
        .ok()
        .map(|s| {
            s.parse()
                .expect("CPT_STORE_RECORDS: a whole number of records, e.g. 1000000")
        })
        .unwrap_or(1_000_000);
    let base = std::env::var_os("CPT_STORE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_TARGET_TMPDIR").into());
    std::fs::create_dir_all(&base).expect("CPT_STORE_DIR");
    let dir = tempfile::tempdir_in(&base).expect("a temp dir");
    println!(
        "store: {n} records an arm, groups of {GROUP}×{BATCH}, random request ids, \
         increasing start times"
    );
    let plain = run(dir.path(), "plain", true, n);
    let bucketed = run(dir.path(), "bucketed", false, n);
    let last = |a: &Arm| *a.windows.last().unwrap();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| id indexes | first window | last window | commit p50 / p99 (last) | lookup median | bytes/record |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, a) in [
        ("on the id (baseline)", &plain),
        ("bucket, then id", &bucketed),
    ] {
        println!(
            "| {name} | {:.0}/s | {:.0}/s | {:.1} / {:.1} ms | {:.2} ms | {:.0} |",
            a.windows[0],
            last(a),
            ms(a.last_p50),
            ms(a.last_p99),
            ms(a.lookup_median),
            a.bytes_per_record
        );
    }
    println!(
        "bucketed / plain: ingest in the last window {:.2}×, lookup {:.2}×",
        last(&bucketed) / last(&plain),
        ms(bucketed.lookup_median) / ms(plain.lookup_median)
    );
}
