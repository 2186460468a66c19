//! Roll-ups answer exactly what the raw records would: the average
//! critical path (CPT "Aggregation and Visualization", Table 1's sums and
//! counts) of any aligned range, byte for byte, before and after retention.

use std::time::{Duration, SystemTime};

use cpt_sdk::testing::SplitMix64;
use cpt_sdk::{CriticalPath, Frame, Record, SegmentKind, Trigger};

use super::{DAY, HOUR, NANOS};
use crate::profile::aggregate::{Aggregate, Aggregator};
use crate::profile::encode_gzip;
use crate::records::selection::Selection;
use crate::server::store::{ProfileSource, Retention, Store, StoreError};

const FOURTEEN_DAYS: Duration = Duration::from_secs(14 * DAY);

fn now_nanos() -> u64 {
    super::super::retention::unix_nanos(SystemTime::now())
}

/// A record of CPT Figure 1's shape: A's root, then calls into B and C
/// whose paths were merged (with network time), a random mix per request.
fn record(rng: &mut SplitMix64, start: Option<u64>) -> Record {
    let mut p = CriticalPath::new();
    let service = ["A", "B"][rng.below(2) as usize];
    let root = Frame::new(service, "A1").with_location("a/src/main.rs", 10);
    let ms = |rng: &mut SplitMix64| Duration::from_micros(100 + rng.below(20_000));
    p.push_frames([root.clone()], ms(rng), SegmentKind::Busy);
    for _ in 0..rng.below(4) {
        let callee = [
            Frame::new("B", "B1"),
            Frame::new("C", "C1").with_location("c/src/lib.rs", 7),
            Frame::new("A", "A2"),
        ][rng.below(3) as usize]
            .clone();
        let kind = [
            SegmentKind::Busy,
            SegmentKind::Network,
            SegmentKind::Unattributed,
            SegmentKind::Queueing,
            SegmentKind::BlindSpot,
        ][rng.below(5) as usize];
        p.push_frames([root.clone(), callee], ms(rng), kind);
    }
    p.accounting.network = Duration::from_nanos(rng.below(1000));
    let trigger = if rng.below(10) == 0 {
        Trigger::Forced
    } else {
        Trigger::Sampled
    };
    let mut r = Record::new(service, trigger, p);
    r.endpoint = Some(["/GetQuote", "/Search", "GET /quote/{item}"][rng.below(3) as usize].into());
    r.start_unix_nanos = start;
    r.labels
        .insert("arm".into(), ["a", "b"][rng.below(2) as usize].into());
    r
}

/// `n` records spread over the `days` before now (a few without a start).
fn spread(seed: u64, n: usize, days: u64) -> Vec<Record> {
    let mut rng = SplitMix64::new(seed);
    let now = now_nanos();
    (0..n)
        .map(|_| {
            let start = (rng.below(50) != 0).then(|| now - rng.below(days * DAY * NANOS));
            record(&mut rng, start)
        })
        .collect()
}

fn store_with(records: &[Record], retention: Retention) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path().join("cpt.db")).unwrap();
    store.set_retention(retention).unwrap();
    for chunk in records.chunks(97) {
        store.insert(chunk).unwrap();
    }
    (dir, store)
}

fn roll_up_all(store: &mut Store) {
    loop {
        let step = store
            .roll_up(500, SystemTime::now(), FOURTEEN_DAYS)
            .unwrap();
        if step.caught_up {
            break;
        }
    }
    compact_keeping_rollups_for(store, None);
}

/// Merge and drop roll-ups until nothing is left to do, keeping them for
/// `retain_for`.
fn compact_keeping_rollups_for(store: &mut Store, retain_for: Option<Duration>) {
    while store
        .compact_rollups(SystemTime::now(), FOURTEEN_DAYS, retain_for, 50)
        .unwrap()
        .more
    {}
}

fn raw_fold(store: &Store, sel: &Selection) -> Aggregate {
    let mut agg = Aggregator::new(sel.clone());
    store.fold_into(&mut agg, 256, None).unwrap();
    agg.finish()
}

fn answer(store: &Store, sel: &Selection) -> Result<(Aggregate, ProfileSource), StoreError> {
    store.profile(Aggregator::new(sel.clone()), 256)
}

/// The sorted starts of one hourly roll-up of sampled requests with at
/// least two different starts: one (service, endpoint) in the first hour
/// from `from` on that has such a roll-up.
fn starts_of_a_rollup(records: &[Record], from: u64) -> Vec<u64> {
    let mut h = hour_floor(from);
    loop {
        let mut rows: std::collections::BTreeMap<(&str, Option<&str>), Vec<u64>> =
            Default::default();
        for r in records.iter().filter(|r| r.trigger == Trigger::Sampled) {
            if let Some(s) = r
                .start_unix_nanos
                .filter(|&s| s >= h && s < h + HOUR * NANOS)
            {
                rows.entry((&r.service, r.endpoint.as_deref()))
                    .or_default()
                    .push(s);
            }
        }
        for mut starts in rows.into_values() {
            starts.sort_unstable();
            if starts.len() >= 2 && starts[0] < starts[1] {
                return starts;
            }
        }
        h += HOUR * NANOS;
    }
}

/// A start time that splits one roll-up: one of its requests before it,
/// the rest at or after it.
fn splitting(records: &[Record], from: u64) -> u64 {
    starts_of_a_rollup(records, from)[1]
}

/// The last start of a roll-up of two or more requests.
fn last_of_a_rollup(records: &[Record], from: u64) -> u64 {
    *starts_of_a_rollup(records, from).last().unwrap()
}

fn hour_floor(t: u64) -> u64 {
    t / (HOUR * NANOS) * HOUR * NANOS
}

fn day_floor(t: u64) -> u64 {
    t / (DAY * NANOS) * DAY * NANOS
}

/// Selections roll-ups answer: services, endpoints, hour- and day-aligned
/// ranges on both sides of the hourly/daily boundary, unaligned ones (raw
/// at their edges), and none at all.
fn selections() -> Vec<(Selection, &'static str)> {
    let now = now_nanos();
    let h = hour_floor(now);
    let d = day_floor(now);
    vec![
        (Selection::new(), "everything"),
        (Selection::new().with_service("A"), "service"),
        (
            Selection::new()
                .with_service("A")
                .with_endpoint("GET /quote/{item}"),
            "endpoint",
        ),
        (
            Selection::new()
                .with_service("A")
                .with_since(h - 40 * HOUR * NANOS)
                .with_until(h - 3 * HOUR * NANOS),
            "hours",
        ),
        (
            Selection::new()
                .with_service("B")
                .with_since(d - 20 * DAY * NANOS)
                .with_until(d - 16 * DAY * NANOS),
            "days past the hourly window",
        ),
        (
            Selection::new()
                .with_since(d - 18 * DAY * NANOS)
                .with_until(h - 5 * HOUR * NANOS),
            "days then hours",
        ),
        (
            Selection::new()
                .with_service("A")
                .with_since(h - 30 * HOUR * NANOS + 17 * 60 * NANOS)
                .with_until(h - 2 * HOUR * NANOS - 5 * NANOS),
            "unaligned",
        ),
        (
            Selection::new().with_since(now - 19 * DAY * NANOS - 77),
            "open-ended",
        ),
    ]
}

#[test]
fn rollups_answer_byte_identical_to_the_fold_of_the_raw_records_hourly_and_daily() {
    let records = spread(1, 3_000, 25);
    let (_dir, mut store) = store_with(&records, Retention::default());
    // Half rolled up: the rest comes raw, the answer is the same.
    store
        .roll_up(records.len() / 2, SystemTime::now(), FOURTEEN_DAYS)
        .unwrap();
    for (sel, what) in selections() {
        let (got, _) = answer(&store, &sel).unwrap();
        assert_eq!(got, raw_fold(&store, &sel), "{what}, half rolled up");
    }
    roll_up_all(&mut store);
    let (hourly, daily) = store.rollup_counts().unwrap();
    assert!(hourly > 100 && daily > 5, "{hourly} hourly, {daily} daily");
    for (sel, what) in selections() {
        let want = raw_fold(&store, &sel);
        let (got, source) = answer(&store, &sel).unwrap();
        assert_eq!(got, want, "{what}");
        assert_eq!(encode_gzip(&got), encode_gzip(&want), "{what}: pprof bytes");
        assert!(got.requests() > 0, "{what}: selects something");
        // An unaligned range's edge hours are used whole when all of their
        // requests fall inside it.
        assert_ne!(source, ProfileSource::Raw, "{what}");
    }
    // A range that splits an hour's requests: that hour comes raw. Both
    // ends are checked: `until` is exclusive, so a range ending exactly at
    // a roll-up's last start leaves that request out.
    let cut = splitting(&records, now_nanos() - 30 * HOUR * NANOS);
    for sel in [
        Selection::new().with_since(cut),
        Selection::new().with_until(cut),
        Selection::new().with_until(last_of_a_rollup(&records, now_nanos() - 30 * HOUR * NANOS)),
    ] {
        let (got, source) = answer(&store, &sel).unwrap();
        assert_eq!(got, raw_fold(&store, &sel), "{sel}");
        assert_eq!(source, ProfileSource::RollupsAndRaw, "{sel}");
    }
    // Filters roll-ups do not keep: raw records answer.
    for sel in [
        Selection::new().with_label("arm", "a"),
        Selection::new().with_triggers(crate::records::selection::TriggerFilter::All),
    ] {
        let (got, source) = answer(&store, &sel).unwrap();
        assert_eq!(source, ProfileSource::Raw);
        assert_eq!(got, raw_fold(&store, &sel));
    }
}

#[test]
fn after_retention_rollups_still_count_every_request_and_refuse_what_they_cannot_answer() {
    let records = spread(2, 2_000, 10);
    let (_dir, mut store) = store_with(&records, Retention::default());
    let open = Selection::new()
        .with_service("A")
        .with_since(now_nanos() - 10 * DAY * NANOS - 1);
    let aligned = Selection::new()
        .with_since(hour_floor(now_nanos()) - 100 * HOUR * NANOS)
        .with_until(hour_floor(now_nanos()) - 60 * HOUR * NANOS);
    let before: Vec<Aggregate> = [&open, &aligned]
        .iter()
        .map(|s| raw_fold(&store, s))
        .collect();
    roll_up_all(&mut store);
    let cutoff = now_nanos() - 2 * DAY * NANOS;
    while store.delete_started_before(cutoff, 300).unwrap() == 300 {}
    let state = store.state().unwrap();
    assert!(state.deleted_by_retention > 1_000, "{state:?}");
    assert_eq!(
        store.len().unwrap() + state.deleted_by_retention,
        records.len() as u64,
        "every record is raw or deleted by retention"
    );
    for (sel, want) in [&open, &aligned].into_iter().zip(&before) {
        let (got, source) = answer(&store, sel).unwrap();
        assert_eq!(&got, want, "{sel}");
        assert_eq!(encode_gzip(&got), encode_gzip(want), "{sel}");
        assert_ne!(source, ProfileSource::Raw, "{sel}");
    }
    // A range that starts inside a deleted hour, and a label filter over
    // deleted records, need raw records that are gone.
    let since = splitting(&records, now_nanos() - 80 * HOUR * NANOS);
    for sel in [
        Selection::new().with_since(since),
        Selection::new()
            .with_label("arm", "a")
            .with_since(now_nanos() - 5 * DAY * NANOS),
    ] {
        match answer(&store, &sel) {
            Err(StoreError::BeyondRetention(gap)) => {
                let msg = gap.to_string();
                assert!(msg.contains("deleted by retention"), "{msg}");
            }
            other => panic!("{sel}: {other:?}"),
        }
    }
}

#[test]
fn records_older_than_the_raw_window_are_rolled_up_and_not_stored_raw() {
    let records = spread(3, 600, 6);
    let retention = Retention {
        retain_for: Some(Duration::from_secs(2 * DAY)),
        ..Retention::default()
    };
    let (_dir, mut store) = store_with(&records, retention);
    let (_oracle_dir, oracle) = store_with(&records, Retention::default());
    let cutoff = now_nanos() - 2 * DAY * NANOS;
    let old = records
        .iter()
        .filter(|r| r.start_unix_nanos.is_some_and(|s| s < cutoff))
        .count() as u64;
    assert!(old > 300);
    let state = store.state().unwrap();
    assert_eq!(state.too_old, old);
    assert_eq!(store.len().unwrap(), records.len() as u64 - old);
    roll_up_all(&mut store);
    let sel = Selection::new().with_since(now_nanos() - 7 * DAY * NANOS);
    let (got, _) = answer(&store, &sel).unwrap();
    assert_eq!(got, raw_fold(&oracle, &sel));
}

#[test]
fn record_ids_are_never_given_out_again_after_the_newest_records_are_deleted() {
    let records = spread(4, 50, 1);
    let (_dir, mut store) = store_with(&records, Retention::default());
    roll_up_all(&mut store);
    while store.delete_oldest(1_000).unwrap() > 0 {}
    assert_eq!(store.len().unwrap(), 0);
    let more = spread(5, 30, 1);
    store.insert(&more).unwrap();
    roll_up_all(&mut store);
    let state = store.state().unwrap();
    assert_eq!(state.last_id, 80);
    assert_eq!(state.rolled_up_through, 80);
    let mut all = records.clone();
    all.extend(more);
    let (_oracle_dir, oracle) = store_with(&all, Retention::default());
    let (got, _) = answer(&store, &Selection::new()).unwrap();
    assert_eq!(got, raw_fold(&oracle, &Selection::new()));
}

#[test]
fn a_store_from_before_rollups_is_rolled_up_from_the_records_it_holds() {
    let records = spread(6, 400, 20);
    let (dir, store) = store_with(&records, Retention::default());
    store
        .conn
        .execute_batch(
            "DROP TABLE rollups; DROP TABLE store_state; DROP INDEX batches_by_time; \
             PRAGMA user_version = 5;",
        )
        .unwrap();
    drop(store);
    let read_only = Store::open_read_only(dir.path().join("cpt.db")).unwrap();
    let (old, source) = answer(&read_only, &Selection::new()).unwrap();
    assert_eq!(source, ProfileSource::Raw, "an old store opened read-only");
    drop(read_only);
    let mut store = Store::open(dir.path().join("cpt.db")).unwrap();
    assert_eq!(store.schema_version(), super::super::SCHEMA_VERSION);
    roll_up_all(&mut store);
    assert_eq!(store.state().unwrap().rolled_up_through, 400);
    let (got, source) = answer(&store, &Selection::new()).unwrap();
    assert_eq!(source, ProfileSource::Rollups);
    assert_eq!(got, old);
}

#[test]
fn trend_points_are_the_hours_means_and_p99() {
    let records = spread(7, 800, 3);
    let (_dir, mut store) = store_with(&records, Retention::default());
    roll_up_all(&mut store);
    let trend = store
        .trend(&super::TrendQuery {
            service: "A".into(),
            endpoint: Some("/Search".into()),
            top: 3,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(trend.frames.len(), 3);
    let mut total = 0;
    for p in &trend.points {
        assert_eq!(p.resolution_secs, HOUR);
        let sel = Selection::new()
            .with_service("A")
            .with_endpoint("/Search")
            .with_since(p.start_unix_secs * NANOS)
            .with_until((p.start_unix_secs + HOUR) * NANOS);
        let raw = raw_fold(&store, &sel);
        assert_eq!(p.requests, raw.requests());
        assert_eq!(
            p.mean_nanos,
            raw.latency_sum().as_nanos() as u64 / raw.requests()
        );
        assert_eq!(p.frame_nanos.iter().sum::<u64>(), p.mean_nanos);
        // p50 and p99 against the hour's exact nearest-rank quantiles: within
        // the trend histogram's 2 % (32 buckets per power of two).
        let mut latencies: Vec<u64> = records
            .iter()
            .filter(|r| {
                r.service == "A"
                    && r.endpoint.as_deref() == Some("/Search")
                    && r.trigger == Trigger::Sampled
                    && r.start_unix_nanos.is_some_and(|s| {
                        s >= p.start_unix_secs * NANOS && s < (p.start_unix_secs + HOUR) * NANOS
                    })
            })
            .map(|r| r.latency.as_nanos() as u64)
            .collect();
        latencies.sort_unstable();
        assert_eq!(latencies.len() as u64, p.requests);
        for (q, got) in [(0.5, p.p50_nanos), (0.99, p.p99_nanos)] {
            let rank = ((q * latencies.len() as f64).ceil() as usize).max(1);
            let exact = latencies[rank - 1] as f64;
            assert!(
                (got as f64 - exact).abs() / exact <= 0.02,
                "q{q} of {} requests: {got} against {exact}",
                latencies.len()
            );
        }
        total += p.requests;
    }
    let all = Selection::new().with_service("A").with_endpoint("/Search");
    assert_eq!(
        total,
        raw_fold(&store, &all).requests() - {
            // Requests without a start time have no hour.
            let none: u64 = records
                .iter()
                .filter(|r| {
                    r.start_unix_nanos.is_none()
                        && r.service == "A"
                        && r.endpoint.as_deref() == Some("/Search")
                        && r.trigger == Trigger::Sampled
                })
                .count() as u64;
            none
        }
    );
}

/// Selections whose answer the writer's commits must not change mid-read:
/// everything, one service, and whole days (hourly and daily roll-ups
/// alike are wholly in or out of them).
fn snapshot_selections() -> Vec<Selection> {
    let d = day_floor(now_nanos());
    vec![
        Selection::new(),
        Selection::new().with_service("A"),
        Selection::new()
            .with_since(d - 8 * DAY * NANOS)
            .with_until(d - DAY * NANOS),
    ]
}

#[test]
fn a_profile_taken_while_the_writer_rolls_up_merges_and_deletes_is_the_fold_of_its_snapshot() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    // CPT Table 1: a profile is sums and counts, so an answer that reads a
    // roll-up step's records both raw and rolled up (or neither) is off by
    // whole requests. Every answer must be the fold of the batches
    // committed at some moment while it ran.
    const BATCHES: usize = 240;
    let records = spread(11, BATCHES * 40, 10);
    let batches: Vec<Vec<Record>> = records.chunks(40).map(<[Record]>::to_vec).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cpt.db");
    let mut store = Store::open(&path).unwrap();
    store.set_retention(Retention::default()).unwrap();
    let reader = Store::open_read_only(&path).unwrap();
    // Batches committed (set once `insert` returns) and batches begun (set
    // before it starts): an answer's snapshot holds at least the first
    // read before it and at most the second read after it, even when the
    // writer is preempted between a commit and its announcement.
    let committed = Arc::new(AtomicUsize::new(0));
    let begun = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (committed, begun, answers, done) = (
            committed.clone(),
            begun.clone(),
            answers.clone(),
            done.clone(),
        );
        let batches = batches.clone();
        std::thread::spawn(move || {
            let now = SystemTime::now();
            let cutoff = now_nanos() - 5 * DAY * NANOS;
            for (k, batch) in batches.iter().enumerate() {
                begun.store(k + 1, Ordering::SeqCst);
                store.insert(batch).unwrap();
                committed.store(k + 1, Ordering::SeqCst);
                // Small steps, so that commits land between a profile's reads.
                for _ in 0..3 {
                    store.roll_up(17, now, FOURTEEN_DAYS).unwrap();
                }
                if k % 4 == 0 {
                    // Hours older than two days merged into days, a few at
                    // a time (roll-ups keep adding hours to those days).
                    store
                        .compact_rollups(now, Duration::from_secs(2 * DAY), None, 7)
                        .unwrap();
                }
                if k % 3 == 0 {
                    store.delete_started_before(cutoff, 31).unwrap();
                }
                if k % 5 == 0 {
                    store.delete_oldest(23).unwrap();
                }
                // Keep pace with the reader: hundreds of answers in all.
                while answers.load(Ordering::SeqCst) < k {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            done.store(true, Ordering::SeqCst);
            store
        })
    };
    let sels = snapshot_selections();
    // The selected requests after each number of committed batches.
    let prefix: Vec<Vec<u64>> = sels
        .iter()
        .map(|sel| {
            let mut n = 0;
            let mut v = vec![0];
            for b in &batches {
                n += b.iter().filter(|r| sel.matches(r)).count() as u64;
                v.push(n);
            }
            v
        })
        .collect();
    let mut oracle: std::collections::HashMap<(usize, usize), Aggregate> = Default::default();
    let mut taken = 0usize;
    let mut i = 0usize;
    while !done.load(Ordering::SeqCst) {
        let s = i % sels.len();
        i += 1;
        let before = committed.load(Ordering::SeqCst);
        let (got, _) = answer(&reader, &sels[s]).unwrap();
        let after = begun.load(Ordering::SeqCst);
        answers.fetch_add(1, Ordering::SeqCst);
        taken += 1;
        let Some(k) = (before..=after).find(|&k| prefix[s][k] == got.requests()) else {
            panic!(
                "{}: {} requests, but {}..={} batches committed or begun hold {}..={}",
                sels[s],
                got.requests(),
                before,
                after,
                prefix[s][before],
                prefix[s][after]
            );
        };
        let want = oracle.entry((s, k)).or_insert_with(|| {
            let mut agg = Aggregator::new(sels[s].clone());
            for b in &batches[..k] {
                agg.push_batch(b);
            }
            agg.finish()
        });
        assert_eq!(&got, want, "{} after {k} batches", sels[s]);
    }
    let store = writer.join().unwrap();
    let state = store.state().unwrap();
    assert!(taken >= BATCHES / 2, "{taken} answers");
    assert!(state.deleted_by_retention > 1_000, "{state:?}");
    assert!(
        store.rollup_counts().unwrap().1 > 0,
        "hours merged into days"
    );
}

#[test]
fn rollups_of_a_period_are_kept_while_any_raw_record_of_it_is() {
    let records = spread(12, 1_500, 10);
    let (_dir, mut store) = store_with(&records, Retention::default());
    roll_up_all(&mut store);
    // Roll-ups past two days would go, but their raw records are all kept.
    compact_keeping_rollups_for(&mut store, Some(Duration::from_secs(2 * DAY)));
    for sel in [Selection::new(), Selection::new().with_service("B")] {
        let (got, source) = answer(&store, &sel).unwrap();
        assert_eq!(got, raw_fold(&store, &sel), "{sel}");
        assert_eq!(source, ProfileSource::Rollups, "{sel}");
    }
    // Once the raw records of the first days are gone, so are their roll-ups.
    let cutoff = now_nanos() - 3 * DAY * NANOS;
    while store.delete_started_before(cutoff, 500).unwrap() > 0 {}
    let (hourly, daily) = store.rollup_counts().unwrap();
    compact_keeping_rollups_for(&mut store, Some(Duration::from_secs(2 * DAY)));
    let (hourly_after, daily_after) = store.rollup_counts().unwrap();
    assert!(
        hourly_after + daily_after < hourly + daily,
        "{hourly}+{daily} then {hourly_after}+{daily_after}"
    );
    let oldest = store.oldest_start().unwrap().unwrap();
    let kept: i64 = store
        .conn
        .query_row(
            "SELECT count(*) FROM rollups WHERE resolution > 0 AND (bucket + resolution) * 1000000000 > ?1 \
             AND bucket * 1000000000 <= ?1",
            [oldest as i64],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        kept > 0,
        "the oldest raw record's period keeps its roll-ups"
    );
}

/// Every selection roll-ups do not keep (percentile bands, forced-only or
/// all triggers, a request or trace id, labels, per-stack histograms) is
/// answered from the raw records while roll-ups are present, equal to the
/// fold of the raw records; once retention deleted raw records it needs,
/// it is refused naming that filter alone.
#[test]
fn selections_rollups_do_not_keep_answer_from_raw_records_with_rollups_present() {
    use crate::records::selection::{PercentileBand, TriggerFilter};
    let mut records = spread(13, 1_200, 6);
    for (i, r) in records.iter_mut().enumerate() {
        r.request_id = Some(format!("req-{i}"));
        r.trace_id = Some(format!("{i:032x}"));
    }
    let (_dir, mut store) = store_with(&records, Retention::default());
    roll_up_all(&mut store);
    let since = now_nanos() - DAY * NANOS;
    let picked = records
        .iter()
        .position(|r| {
            r.trigger == Trigger::Sampled && r.start_unix_nanos.is_some_and(|s| s > since)
        })
        .unwrap();
    let cases: Vec<(Selection, bool, &str)> = vec![
        (
            Selection::new().with_percentile(PercentileBand::parse("p90-p100").unwrap()),
            false,
            "the percentile band",
        ),
        (
            Selection::new().with_triggers(TriggerFilter::Forced),
            false,
            "the trigger filter forced",
        ),
        (
            Selection::new().with_triggers(TriggerFilter::All),
            false,
            "the trigger filter all",
        ),
        (
            Selection::new().with_request_id(format!("req-{picked}")),
            false,
            "the request id",
        ),
        (
            Selection::new().with_trace_id(format!("{picked:032x}")),
            false,
            "the trace id",
        ),
        (
            Selection::new().with_label("arm", "b"),
            false,
            "the label filter arm=b",
        ),
        (
            Selection::new().with_service("A"),
            true,
            "per-stack histograms",
        ),
    ];
    for (sel, histograms, _) in &cases {
        let agg = Aggregator::new(sel.clone()).with_histograms(*histograms);
        let (got, source) = store.profile(agg, 256).unwrap();
        let mut want = Aggregator::new(sel.clone()).with_histograms(*histograms);
        store.fold_into(&mut want, 256, None).unwrap();
        assert_eq!(got, want.finish(), "{sel}");
        assert!(got.requests() > 0, "{sel}: selects something");
        assert_eq!(source, ProfileSource::Raw, "{sel}");
    }
    let cutoff = now_nanos() - 3 * DAY * NANOS;
    while store.delete_started_before(cutoff, 500).unwrap() > 0 {}
    for (sel, histograms, named) in &cases {
        for sel in [sel.clone(), sel.clone().with_since(cutoff - HOUR * NANOS)] {
            let agg = Aggregator::new(sel.clone()).with_histograms(*histograms);
            match store.profile(agg, 256) {
                Err(StoreError::BeyondRetention(gap)) => {
                    let msg = gap.to_string();
                    assert!(msg.contains(named), "{sel}: {msg}");
                    let others = cases.iter().map(|c| c.2).filter(|n| n != named);
                    for other in others.filter(|o| !named.starts_with(o) && !o.starts_with(named)) {
                        assert!(!msg.contains(other), "{sel} names {other}: {msg}");
                    }
                }
                other => panic!("{sel}: {other:?}"),
            }
        }
        // After the deleted range, raw records answer again.
        let agg = Aggregator::new(sel.clone().with_since(since)).with_histograms(*histograms);
        assert!(store.profile(agg, 256).is_ok(), "{sel} since a day ago");
    }
}

/// The entry-services tally `cpt profile` warns about mixed selections with
/// is the same from roll-ups as from the raw records: each entry service's
/// request count and the other services on its paths.
#[test]
fn the_entry_services_tally_is_the_same_from_rollups_as_from_raw_records() {
    let records = spread(14, 1_500, 10);
    let (_dir, mut store) = store_with(&records, Retention::default());
    let tally = |store: &Store| {
        let mut mix = crate::records::EntryServices::default();
        let mut agg = Aggregator::new(Selection::new());
        let (_, source) = store
            .fold_profile(&mut agg, 256, Some(&mut mix), &mut |_| {})
            .unwrap();
        let services: Vec<(String, u64)> = mix
            .services()
            .into_iter()
            .map(|(s, n)| (s.to_owned(), n))
            .collect();
        let internal: Vec<(String, String)> = mix
            .internal()
            .into_iter()
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect();
        (services, internal, source, agg.finish())
    };
    let (raw_services, raw_internal, source, raw_agg) = tally(&store);
    assert_eq!(source, ProfileSource::Raw);
    roll_up_all(&mut store);
    let cutoff = now_nanos() - 3 * DAY * NANOS;
    while store.delete_started_before(cutoff, 500).unwrap() > 0 {}
    let (services, internal, source, agg) = tally(&store);
    assert_ne!(source, ProfileSource::Raw);
    assert_eq!(services, raw_services);
    assert_eq!(internal, raw_internal);
    assert_eq!(agg, raw_agg);
}

/// Roll-ups answer byte for byte also when almost every request has a
/// stack of its own (thousands of distinct frames and stacks: the frame
/// table and the stack keys at their largest).
#[test]
fn rollups_answer_byte_identical_with_thousands_of_distinct_stacks() {
    let mut rng = SplitMix64::new(15);
    let now = now_nanos();
    let records: Vec<Record> = (0..2_000)
        .map(|i| {
            let mut p = CriticalPath::new();
            let root = Frame::new("A", "root");
            p.push_frames(
                [root.clone()],
                Duration::from_micros(50 + rng.below(500)),
                SegmentKind::Busy,
            );
            for d in 0..1 + rng.below(4) {
                p.push_frames(
                    [
                        root.clone(),
                        Frame::new("B", format!("handler{}", i % 700)),
                        Frame::new("C", format!("leaf{}-{d}", rng.below(3_000)))
                            .with_location("c/src/lib.rs", (i % 97) as u32),
                    ],
                    Duration::from_micros(10 + rng.below(5_000)),
                    SegmentKind::Busy,
                );
            }
            let mut r = Record::new("A", Trigger::Sampled, p);
            r.endpoint = Some(format!("/e{}", i % 5));
            r.start_unix_nanos = Some(now - rng.below(3 * DAY * NANOS));
            r
        })
        .collect();
    let (_dir, mut store) = store_with(&records, Retention::default());
    let want: Vec<Aggregate> = [Selection::new(), Selection::new().with_endpoint("/e3")]
        .iter()
        .map(|s| raw_fold(&store, s))
        .collect();
    assert!(
        want[0].stacks().len() > 1_500,
        "{} stacks",
        want[0].stacks().len()
    );
    roll_up_all(&mut store);
    while store.delete_started_before(now - DAY * NANOS, 500).unwrap() > 0 {}
    for (sel, want) in [Selection::new(), Selection::new().with_endpoint("/e3")]
        .iter()
        .zip(&want)
    {
        let (got, source) = answer(&store, sel).unwrap();
        assert_ne!(source, ProfileSource::Raw, "{sel}");
        assert_eq!(&got, want, "{sel}");
        assert_eq!(encode_gzip(&got), encode_gzip(want), "{sel}: pprof bytes");
    }
}

/// Forced records are not a random sample and are never rolled up: they
/// are kept raw for the raw window, answered from raw records, and counted
/// apart when they arrive too old to keep or are deleted by retention.
#[test]
fn forced_records_are_kept_raw_for_the_window_and_counted_apart_when_they_go() {
    use crate::records::selection::TriggerFilter;
    let records = spread(16, 1_500, 6);
    let retention = Retention {
        retain_for: Some(Duration::from_secs(4 * DAY)),
        ..Retention::default()
    };
    let (_dir, mut store) = store_with(&records, retention);
    let forced_before = |t: u64| {
        records
            .iter()
            .filter(|r| r.trigger == Trigger::Forced && r.start_unix_nanos.is_some_and(|s| s < t))
            .count() as u64
    };
    let window = now_nanos() - 4 * DAY * NANOS;
    let state = store.state().unwrap();
    assert!(forced_before(window) > 5);
    assert_eq!(state.too_old_forced, forced_before(window));
    roll_up_all(&mut store);
    let forced = Selection::new()
        .with_triggers(TriggerFilter::Forced)
        .with_since(window);
    let (got, source) = answer(&store, &forced).unwrap();
    assert_eq!(source, ProfileSource::Raw);
    assert_eq!(got, raw_fold(&store, &forced));
    assert_eq!(
        got.requests(),
        forced_before(u64::MAX) - forced_before(window)
    );
    // Two days later the raw window has moved: the forced records of those
    // two days go with the rest, counted apart.
    let cutoff = now_nanos() - 2 * DAY * NANOS;
    while store.delete_started_before(cutoff, 300).unwrap() > 0 {}
    let state = store.state().unwrap();
    assert_eq!(
        state.deleted_forced,
        forced_before(cutoff) - forced_before(window)
    );
    assert!(matches!(
        answer(&store, &forced),
        Err(StoreError::BeyondRetention(_))
    ));
}
