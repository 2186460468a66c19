//! Roll-ups over a year: how much room they take per endpoint, and how fast
//! they answer a 30-day profile against the fold of the same raw records
//! (the baseline), side by side in one run.
//!
//! The generator gives each of `CPT_ROLLUP_ENDPOINTS` endpoints (default
//! 20, of 4 services) `CPT_ROLLUP_PER_HOUR` requests an hour (default 6)
//! for the last 14 days, which stay hourly roll-ups, and
//! `CPT_ROLLUP_PER_DAY` (default 24) a day for the 351 days before, which
//! go into daily ones: a year. Paths have 4–15 segments drawn from a pool
//! of 64 stacks (`support/records.rs`), so a period holds the few dozen
//! distinct stacks a real endpoint's hour does. Every period's roll-up is
//! independent of every other endpoint's, so the table's size grows
//! linearly with endpoints: the run prints the bytes per endpoint and the
//! size for 1 000 endpoints (measured as the store's file once the raw
//! records are deleted and the file vacuumed).
//!
//! Timed (median of 15, each on a fresh read-only connection): a 30-day,
//! day-aligned profile of one endpoint and of one service (its endpoints),
//! from the roll-ups (`Store::profile`) and, before the raw records are
//! deleted, from the raw records (`Store::fold_into`); then the ratios.
//!
//! Run: `cargo bench -p cpt-benches --bench rollups`. `CPT_ROLLUP_DIR`:
//! where the store goes (default the target's tmp directory).

#[path = "support/records.rs"]
#[allow(dead_code)] // figure1_path is for paths of 25–35 segments
mod records;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use cpt_collector::aggregate::{Aggregate, Aggregator};
use cpt_collector::selection::Selection;
use cpt_collector::store::{Retention, Store};
use cpt_sdk::record::Record;
use cpt_sdk::testing::SplitMix64 as Rng;
use cpt_sdk::trigger::Trigger;
use records::{short_path, stack_pool};

const HOUR: u64 = 3_600_000_000_000;
const DAY: u64 = 24 * HOUR;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_nanos() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap()
}

fn endpoint(e: u64) -> (String, String) {
    (format!("svc{}", e % 4), format!("/svc{}/Method{e}", e % 4))
}

/// The year's records, oldest first, handed over a day at a time.
fn generate(endpoints: u64, per_hour: u64, per_day: u64, mut day: impl FnMut(Vec<Record>)) -> u64 {
    let mut rng = Rng::new(42);
    let stacks = stack_pool(&mut rng);
    let now = now_nanos();
    let mut n = 0;
    for d in (0..365u64).rev() {
        let mut batch = Vec::new();
        let start = now - (d + 1) * DAY;
        for e in 0..endpoints {
            let (service, ep) = endpoint(e);
            let count = if d < 14 { per_hour * 24 } else { per_day };
            for i in 0..count {
                let mut r = Record::new(
                    service.clone(),
                    Trigger::Sampled,
                    short_path(&mut rng, &stacks),
                );
                r.endpoint = Some(ep.clone());
                r.start_unix_nanos = Some(start + i * (DAY / count) + rng.below(DAY / count));
                batch.push(r);
            }
        }
        n += batch.len() as u64;
        day(batch);
    }
    n
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time(path: &Path, f: impl Fn(&Store) -> Aggregate) -> (Duration, Aggregate) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..15 {
        let store = Store::open_read_only(path).unwrap();
        let t = Instant::now();
        let a = f(&store);
        times.push(t.elapsed());
        last = Some(a);
    }
    (median(times), last.unwrap())
}

fn main() {
    let endpoints = env("CPT_ROLLUP_ENDPOINTS", 20);
    let per_hour = env("CPT_ROLLUP_PER_HOUR", 6);
    let per_day = env("CPT_ROLLUP_PER_DAY", 24);
    let dir = std::env::var_os("CPT_ROLLUP_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).to_path_buf());
    let tmp = tempfile::tempdir_in(&dir).unwrap();
    let path = tmp.path().join("rollups.db");
    let mut store = Store::open(&path).unwrap();
    store.set_retention(Retention::default()).unwrap();
    let t = Instant::now();
    let records = generate(endpoints, per_hour, per_day, |day| {
        for chunk in day.chunks(2_000) {
            store.insert(chunk).unwrap();
        }
    });
    let inserted = t.elapsed();
    let t = Instant::now();
    let hourly = Duration::from_secs(14 * 86_400);
    while !store
        .roll_up(20_000, SystemTime::now(), hourly)
        .unwrap()
        .caught_up
    {}
    while store
        .compact_rollups(SystemTime::now(), hourly, None, 5_000)
        .unwrap()
        .more
    {}
    let rolled = t.elapsed();
    let (hours, days) = store.rollup_counts().unwrap();
    println!(
        "{records} records for {endpoints} endpoints over a year: inserted in {:.1} s, \
         rolled up in {:.1} s; {hours} hourly and {days} daily roll-ups",
        inserted.as_secs_f64(),
        rolled.as_secs_f64()
    );

    let since = (now_nanos() / DAY - 30) * DAY;
    let (service, ep) = endpoint(0);
    let one = Selection::new()
        .with_service(service.clone())
        .with_endpoint(ep)
        .with_since(since);
    let svc = Selection::new().with_service(service).with_since(since);
    let raw = |sel: &Selection| {
        let sel = sel.clone();
        move |s: &Store| {
            let mut agg = Aggregator::new(sel.clone());
            s.fold_into(&mut agg, 16_384, None).unwrap();
            agg.finish()
        }
    };
    let rolled_up = |sel: &Selection| {
        let sel = sel.clone();
        move |s: &Store| s.profile(Aggregator::new(sel.clone()), 16_384).unwrap().0
    };
    drop(store);
    let (raw_one, raw_one_agg) = time(&path, raw(&one));
    let (raw_svc, raw_svc_agg) = time(&path, raw(&svc));
    let mut store = Store::open(&path).unwrap();
    while store.delete_oldest(20_000).unwrap() > 0 {}
    drop(store);
    let (roll_one, roll_one_agg) = time(&path, rolled_up(&one));
    let (roll_svc, roll_svc_agg) = time(&path, rolled_up(&svc));
    assert_eq!(
        roll_one_agg, raw_one_agg,
        "the roll-ups answer what the raw records did"
    );
    assert_eq!(
        roll_svc_agg, raw_svc_agg,
        "the roll-ups answer what the raw records did"
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("VACUUM").unwrap();
    drop(conn);
    let bytes = std::fs::metadata(&path).unwrap().len();
    let per_endpoint = bytes as f64 / endpoints as f64;
    println!(
        "roll-ups: {:.1} MiB for {endpoints} endpoints, {:.0} KiB an endpoint-year; \
         1 000 endpoints: {:.2} GiB",
        bytes as f64 / f64::from(1 << 20),
        per_endpoint / 1024.0,
        per_endpoint * 1000.0 / f64::from(1 << 30)
    );
    for (what, n, raw, roll) in [
        ("one endpoint", roll_one_agg.requests(), raw_one, roll_one),
        ("one service", roll_svc_agg.requests(), raw_svc, roll_svc),
    ] {
        println!(
            "30-day profile of {what} ({n} requests): raw {:.2} ms, roll-ups {:.2} ms, \
             ratio raw/roll-ups {:.1}",
            raw.as_secs_f64() * 1e3,
            roll.as_secs_f64() * 1e3,
            raw.as_secs_f64() / roll.as_secs_f64()
        );
    }
}
