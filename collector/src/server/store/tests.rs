use super::*;
use crate::profile::aggregate::Aggregator;
use crate::records::selection::Selection;
use crate::records::selection::TriggerFilter;
use cpt_sdk::Record;
use cpt_sdk::Trigger;
use cpt_sdk::{CriticalPath, Frame, SegmentKind};
use rusqlite::params_from_iter;
use rusqlite::types::Value;
use std::time::Duration;

pub(super) fn record(
    service: &str,
    endpoint: &str,
    start: u64,
    ms: u64,
    trigger: Trigger,
    arm: &str,
) -> Record {
    let mut p = CriticalPath::new();
    p.push_frames(
        [Frame::new(service, "root")],
        Duration::from_millis(ms),
        SegmentKind::Busy,
    );
    let mut r = Record::new(service, trigger, p);
    r.endpoint = Some(endpoint.into());
    r.start_unix_nanos = Some(start);
    r.labels.insert("arm".into(), arm.into());
    r
}

fn sample() -> Vec<Record> {
    vec![
        record("A", "/a", 100, 1, Trigger::Sampled, "a"),
        record("A", "/a", 200, 2, Trigger::Forced, "b"),
        record("A", "/b", 300, 3, Trigger::Sampled, "b"),
        record("B", "/a", 400, 4, Trigger::Sampled, "a"),
    ]
}

fn latencies(store: &Store, q: StoreQuery) -> Vec<u128> {
    store
        .query(&q)
        .unwrap()
        .map(|r| r.unwrap().latency.as_millis())
        .collect()
}

/// SQLite's plan for `sql`, its steps joined by "; ".
fn plan(store: &Store, sql: &str, params: Vec<Value>) -> String {
    store
        .conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap()
        .query_map(params_from_iter(params), |r| r.get::<_, String>(3))
        .unwrap()
        .map(Result::unwrap)
        .collect::<Vec<_>>()
        .join("; ")
}

#[test]
fn store_round_trips_records_and_filters() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path().join("s.db")).unwrap();
    assert_eq!(store.insert(&sample()).unwrap(), 4);
    let all: Vec<Record> = store
        .query(&StoreQuery::default())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(all, sample());

    let q = |f: fn(&mut StoreQuery)| {
        let mut q = StoreQuery::default();
        f(&mut q);
        q
    };
    #[rustfmt::skip]
    let cases: Vec<(&str, StoreQuery, Vec<u128>)> = vec![
        ("service", q(|q| q.service = Some("A".into())), vec![1, 2, 3]),
        ("endpoint", q(|q| { q.service = Some("A".into()); q.endpoint = Some("/a".into()) }), vec![1, 2]),
        ("since", q(|q| q.since_unix_nanos = Some(200)), vec![2, 3, 4]),
        ("until", q(|q| q.until_unix_nanos = Some(300)), vec![1, 2]),
        ("trigger", q(|q| q.trigger = Some(Trigger::Forced)), vec![2]),
        ("label", q(|q| q.labels = vec![("arm".into(), "b".into())]), vec![2, 3]),
        ("label missing", q(|q| q.labels = vec![("zone".into(), "b".into())]), vec![]),
        ("service+label", q(|q| { q.service = Some("A".into()); q.labels = vec![("arm".into(), "b".into())] }), vec![2, 3]),
        ("service+trigger+range", q(|q| { q.service = Some("A".into()); q.trigger = Some(Trigger::Sampled); q.since_unix_nanos = Some(150) }), vec![3]),
    ];
    for (name, query, want) in cases {
        assert_eq!(latencies(&store, query), want, "{name}");
    }
}

#[test]
fn store_query_uses_the_index_and_never_sorts_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.db")).unwrap();
    let query = StoreQuery {
        service: Some("A".into()),
        since_unix_nanos: Some(1),
        ..StoreQuery::default()
    };
    for (q, chunked) in [
        (query.clone(), false),
        (StoreQuery::default(), false),
        (query, true),
        (StoreQuery::default(), true),
    ] {
        let (sql, mut params) = if chunked {
            q.sql(true, IdIndex::Bucketed)
        } else {
            q.to_sql()
        };
        if chunked {
            params.extend([Value::Integer(0), Value::Integer(100), Value::Integer(10)]);
        }
        let plan = plan(&store, &sql, params);
        assert!(!plan.contains("TEMP B-TREE"), "{sql}: {plan}");
        if q.service.is_some() {
            assert!(plan.contains("INDEX records_by_service"), "{sql}: {plan}");
        }
    }
}

#[test]
fn store_group_commit_keeps_each_batch_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut store = Store::open(&path).unwrap();
    let a = EncodedBatch::new(&sample()[..2]);
    let b = EncodedBatch::new(&sample()[2..]);
    let results = store.insert_group(&[&a, &b]).unwrap();
    assert_eq!(
        results.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        vec![2, 2]
    );
    drop(store);
    let reopened = Store::open_read_only(&path).unwrap();
    assert_eq!(reopened.len().unwrap(), 4);
}

/// What `cpt serve --parquet-dir` relies on: when the work done before the
/// commit (writing the group's Parquet files) fails, nothing of the group is
/// committed, its batch ids included, so the sender's retry is stored (not
/// taken for a duplicate); once committed, the same id stores nothing and
/// the hook sees it as `Ok(0)`.
#[test]
fn store_failed_before_commit_rolls_back_records_and_batch_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut store = Store::open(&path).unwrap();
    let a = EncodedBatch::new(&sample()[..2]).with_batch_id(Some("batch-a".into()));
    let failed = store.insert_group_then(&[&a], |results| {
        assert_eq!(results.len(), 1);
        assert_eq!(*results[0].as_ref().unwrap(), 2);
        Err(StoreError::Parquet {
            dir: dir.path().to_path_buf(),
            message: "disk full".into(),
        })
    });
    assert!(matches!(failed, Err(StoreError::Parquet { .. })));
    assert_eq!(store.len().unwrap(), 0);

    // What the hook sees for `a` when the commit goes through.
    let commit = |store: &mut Store| {
        let mut seen = Vec::new();
        store
            .insert_group_then(&[&a], |results| {
                seen.extend(results.iter().map(|r| *r.as_ref().unwrap()));
                Ok(())
            })
            .unwrap();
        seen
    };
    assert_eq!(commit(&mut store), vec![2], "the retry is stored");
    assert_eq!(
        commit(&mut store),
        vec![0],
        "a committed batch id is a duplicate"
    );
    assert_eq!(store.len().unwrap(), 2);
}

/// Reading a store that nobody else has open leaves nothing beside it,
/// and a reader cannot write.
#[test]
fn store_reader_leaves_no_wal_files_and_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut store = Store::open(&path).unwrap();
    let stored = store.insert(&sample()).unwrap();
    assert!(stored > 0);
    drop(store);
    let files = || {
        let mut v: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(files(), ["s.db"]);
    let reader = Store::open_read_only(&path).unwrap();
    assert_eq!(reader.len().unwrap(), stored);
    let err = reader
        .conn
        .execute_batch("DELETE FROM records")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("readonly") || err.contains("read-only"),
        "{err}"
    );
    drop(reader);
    let n = Store::open_read_only(&path)
        .unwrap()
        .records(
            &crate::records::selection::Selection::new()
                .with_triggers(crate::records::selection::TriggerFilter::All),
        )
        .unwrap()
        .count();
    assert_eq!(n as u64, stored);
    assert_eq!(files(), ["s.db"]);
    assert!(Store::open_read_only(dir.path().join("missing.db")).is_err());
    assert_eq!(files(), ["s.db"], "a reader never creates a store");
}

#[test]
fn store_rejects_a_file_that_is_not_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE t (x)")
        .unwrap();
    let err = Store::open_read_only(&path).unwrap_err().to_string();
    assert!(
        err.contains("is this a cpt store?") && err.contains("no such table: records"),
        "{err}"
    );
    Connection::open(&path)
        .unwrap()
        .execute_batch("PRAGMA user_version = 99")
        .unwrap();
    let err = Store::open(&path).unwrap_err().to_string();
    assert!(err.contains("schema version 99 is newer"), "{err}");
}

fn with_ids(mut r: Record, request_id: &str, trace_id: &str) -> Record {
    r.request_id = Some(request_id.into());
    r.trace_id = Some(trace_id.into());
    r
}

/// A store as cpt wrote it before the id index (schema version 1).
fn write_v1_store(path: &Path, records: &[Record]) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "CREATE TABLE records (id INTEGER PRIMARY KEY, service TEXT NOT NULL, endpoint TEXT,
            start_unix_nanos INTEGER, latency_ns INTEGER NOT NULL, trigger TEXT NOT NULL,
            labels TEXT NOT NULL DEFAULT '{}', record TEXT NOT NULL);
         CREATE INDEX records_by_service ON records (service, endpoint, start_unix_nanos);
         CREATE INDEX records_by_start ON records (start_unix_nanos);
         PRAGMA user_version = 1;",
    )
    .unwrap();
    for r in records {
        conn.execute(
            "INSERT INTO records (service, endpoint, start_unix_nanos, latency_ns, trigger, record)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            rusqlite::params![
                r.service,
                r.endpoint,
                r.start_unix_nanos.map(to_i64),
                r.latency.as_nanos() as i64,
                r.trigger.as_str(),
                r.to_json()
            ],
        )
        .unwrap();
    }
}

fn id_records() -> Vec<Record> {
    let s = sample();
    vec![
        with_ids(s[0].clone(), "req-1", "4bf92f3577b34da6a3ce929d0e0e4736"),
        with_ids(s[1].clone(), "req-2", "4bf92f3577b34da6a3ce929d0e0e4736"),
        with_ids(s[2].clone(), "req-3", "00f067aa0ba902b700f067aa0ba902b7"),
        s[3].clone(),
    ]
}

#[test]
fn store_finds_records_by_request_and_trace_id_through_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path().join("s.db")).unwrap();
    store.insert(&id_records()).unwrap();
    let q = |request: Option<&str>, trace: Option<&str>| StoreQuery {
        request_id: request.map(Into::into),
        trace_id: trace.map(Into::into),
        ..StoreQuery::default()
    };
    assert_eq!(latencies(&store, q(Some("req-2"), None)), vec![2]);
    assert_eq!(latencies(&store, q(Some("nope"), None)), Vec::<u128>::new());
    assert_eq!(
        latencies(&store, q(None, Some("4BF92F3577B34DA6A3CE929D0E0E4736"))),
        vec![1, 2]
    );
    let limited = StoreQuery {
        limit: Some(1),
        ..q(None, Some("4bf92f3577b34da6a3ce929d0e0e4736"))
    };
    assert_eq!(latencies(&store, limited), vec![1]);
    for (query, index) in [
        (q(Some("req-2"), None), "records_by_request_id"),
        (
            q(None, Some("4bf92f3577b34da6a3ce929d0e0e4736")),
            "records_by_trace_id",
        ),
    ] {
        let (sql, params) = query.to_sql();
        let plan = plan(&store, &sql, params);
        assert!(plan.contains(index), "{sql}: {plan}");
        // A seek by bucket and id, not a scan of the index.
        let column = index.strip_prefix("records_by_").unwrap();
        assert!(
            plan.contains(&format!("<expr>=? AND {column}=?")),
            "{sql}: {plan}"
        );
        assert!(!plan.contains("TEMP B-TREE"), "{sql}: {plan}");
    }
}

/// Records with request ids `req-0`… and, every 1 000th, trace id `t`; a
/// latency of `i` ms for record `i`.
fn numbered_with_ids(n: u64) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let mut r = record("A", "/a", 1_000 + i, i, Trigger::Sampled, "a");
            r.request_id = Some(format!("req-{i}"));
            if i % 1_000 == 0 {
                r.trace_id = Some("4bf92f3577b34da6a3ce929d0e0e4736".into());
            }
            r
        })
        .collect()
}

/// The id indexes lead with the record's id bucket: a lookup finds ids in
/// the first bucket, a middle one and the newest (partly filled) one, and
/// a trace id across all of them, for records, profiles and counts alike.
#[test]
fn store_finds_ids_in_every_bucket_of_the_id_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path().join("s.db")).unwrap();
    let bucket = 1u64 << ID_BUCKET_BITS;
    let n = 2 * bucket + 100;
    store.insert(&numbered_with_ids(n)).unwrap();
    let by_request = |i: u64| StoreQuery {
        request_id: Some(format!("req-{i}")),
        ..StoreQuery::default()
    };
    // Record i has row id i + 1.
    for i in [0, bucket - 2, bucket - 1, bucket + 7, 2 * bucket - 1, n - 1] {
        assert_eq!(
            latencies(&store, by_request(i)),
            vec![u128::from(i)],
            "req-{i}"
        );
        assert_eq!(store.count(&by_request(i)).unwrap(), 1, "req-{i}");
    }
    assert_eq!(latencies(&store, by_request(n)), Vec::<u128>::new());
    let by_trace = StoreQuery {
        trace_id: Some("4BF92F3577B34DA6A3CE929D0E0E4736".into()),
        ..StoreQuery::default()
    };
    let want: Vec<u128> = (0..n).step_by(1_000).map(u128::from).collect();
    assert!(want.len() > 30);
    assert_eq!(latencies(&store, by_trace), want);
    let sel = Selection::new().with_request_id(format!("req-{}", n - 1));
    let mut rows = 0;
    store
        .for_each_packed(&sel, 10, |r, _| rows += r.len())
        .unwrap();
    assert_eq!(rows, 1);
    let index_sql: Vec<String> = store
        .conn
        .prepare("SELECT sql FROM sqlite_master WHERE name LIKE 'records_by_%_id' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(index_sql.len(), 2);
    for sql in index_sql {
        assert!(sql.contains(&format!("id >> {ID_BUCKET_BITS}")), "{sql}");
    }
}

/// A store written before the bucketed id indexes and `paths.latency_ns`
/// (schema version 4): today's schema with the plain indexes and without
/// that column.
fn write_v4_store(path: &Path, records: &[Record]) {
    let mut store = Store::open(path).unwrap();
    store.insert(records).unwrap();
    drop(store);
    Connection::open(path)
        .unwrap()
        .execute_batch(
            "DROP INDEX records_by_request_id;
             DROP INDEX records_by_trace_id;
             CREATE INDEX records_by_request_id ON records (request_id) WHERE request_id IS NOT NULL;
             CREATE INDEX records_by_trace_id ON records (trace_id) WHERE trace_id IS NOT NULL;
             ALTER TABLE paths DROP COLUMN latency_ns;
             PRAGMA user_version = 4;",
        )
        .unwrap();
}

#[test]
fn store_v4_answers_ids_through_its_plain_index_and_open_buckets_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v4.db");
    let records = numbered_with_ids(3_000);
    write_v4_store(&path, &records);
    let by_request = StoreQuery {
        request_id: Some("req-2500".into()),
        ..StoreQuery::default()
    };
    let by_trace = StoreQuery {
        trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        ..StoreQuery::default()
    };
    let plan_of = |store: &Store, q: &StoreQuery| -> String {
        let (sql, params) = q.sql(false, store.id_index());
        plan(store, &sql, params)
    };

    let old = Store::open_read_only(&path).unwrap();
    assert_eq!(old.schema_version(), 4);
    let summary = old.endpoints(Trigger::Sampled, None, None).unwrap();
    assert_eq!(summary.len(), 1);
    assert_eq!(summary[0].requests, 3_000);
    assert_eq!(latencies(&old, by_request.clone()), vec![2500]);
    assert_eq!(latencies(&old, by_trace.clone()), vec![0, 1000, 2000]);
    let p = plan_of(&old, &by_request);
    assert!(
        p.contains("INDEX records_by_request_id (request_id=?)"),
        "{p}"
    );
    drop(old);

    let migrated = Store::open(&path).unwrap();
    assert_eq!(migrated.schema_version(), SCHEMA_VERSION);
    // The endpoints' summary now comes from `paths`, its latencies filled
    // from `records`, and says the same.
    let unfilled: i64 = migrated
        .conn
        .query_row(
            "SELECT count(*) FROM paths p JOIN records r USING (id) \
             WHERE p.latency_ns IS NOT r.latency_ns",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(unfilled, 0);
    assert_eq!(
        migrated.endpoints(Trigger::Sampled, None, None).unwrap(),
        summary
    );
    let p = plan_of(&migrated, &by_request);
    assert!(
        p.contains("INDEX records_by_request_id (<expr>=? AND request_id=?)"),
        "{p}"
    );
    assert_eq!(latencies(&migrated, by_request), vec![2500]);
    assert_eq!(latencies(&migrated, by_trace), vec![0, 1000, 2000]);
    let stored: Vec<String> = migrated
        .query(&StoreQuery::default())
        .unwrap()
        .map(|r| r.unwrap().to_json())
        .collect();
    let written: Vec<String> = records.iter().map(Record::to_json).collect();
    assert!(stored == written, "migration keeps every record as it was");
}

#[test]
fn store_v1_read_only_refuses_id_queries_and_open_migrates_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    write_v1_store(&path, &id_records());
    let by_id = StoreQuery {
        request_id: Some("req-2".into()),
        ..StoreQuery::default()
    };

    let old = Store::open_read_only(&path).unwrap();
    assert_eq!(old.schema_version(), 1);
    let err = old.query(&by_id).unwrap_err().to_string();
    assert!(
        err.contains("older cpt (schema version 1)")
            && err.contains(&format!("cpt import --store {}", path.display())),
        "{err}"
    );
    // Every other query still works on the old file, which is unchanged.
    assert_eq!(latencies(&old, StoreQuery::default()), vec![1, 2, 3, 4]);
    drop(old);
    let version: i64 = Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 1, "a reader does not migrate");

    let migrated = Store::open(&path).unwrap();
    assert_eq!(migrated.schema_version(), SCHEMA_VERSION);
    assert_eq!(latencies(&migrated, by_id.clone()), vec![2]);
    let by_trace = StoreQuery {
        trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        ..StoreQuery::default()
    };
    assert_eq!(latencies(&migrated, by_trace), vec![1, 2]);
    assert_eq!(
        migrated
            .query(&StoreQuery::default())
            .unwrap()
            .map(Result::unwrap)
            .collect::<Vec<_>>(),
        id_records(),
        "migration keeps every record as it was"
    );
    drop(migrated);
    // Reopening a migrated store is a no-op.
    let again = Store::open_read_only(&path).unwrap();
    assert_eq!(latencies(&again, by_id), vec![2]);
}

#[test]
fn store_uses_wal_and_full_sync() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.db")).unwrap();
    let mode: String = store
        .conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    let sync: i64 = store
        .conn
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .unwrap();
    assert_eq!((mode.as_str(), sync), ("wal", 2));
}

fn page_size(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap()
}

/// A new store gets 16 KiB pages; a store created with another page size
/// keeps it, and opening it for writing and writing to it works as before.
#[test]
fn a_new_store_has_16_kib_pages_and_an_older_one_keeps_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let new = dir.path().join("new.db");
    Store::open(&new).unwrap().insert(&sample()).unwrap();
    assert_eq!(page_size(&new), PAGE_SIZE);

    let old = dir.path().join("old.db");
    write_v1_store(&old, &sample());
    assert_eq!(page_size(&old), 4096);
    let mut store = Store::open(&old).unwrap();
    store.insert(&sample()).unwrap();
    assert_eq!(
        latencies(&store, StoreQuery::default()),
        vec![1, 2, 3, 4, 1, 2, 3, 4]
    );
    drop(store);
    assert_eq!(page_size(&old), 4096);
}

#[test]
fn store_query_stream_can_be_dropped_early() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path().join("s.db")).unwrap();
    let many: Vec<Record> = (0..5000)
        .map(|i| record("A", "/a", i, 1, Trigger::Sampled, "a"))
        .collect();
    store.insert(&many).unwrap();
    let mut it = store.query(&StoreQuery::default()).unwrap();
    assert!(it.next().unwrap().is_ok());
    drop(it);
    assert_eq!(store.len().unwrap(), 5000);
}

/// Records with several frames, shared and not, across services.
fn varied(n: u64) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let mut p = CriticalPath::new();
            let root = Frame::new("A", "root").with_location("a.rs", 1);
            let mid = Frame::new("B", format!("b{}", i % 5).as_str());
            p.push_frames(
                [root.clone()],
                Duration::from_micros(1 + i),
                SegmentKind::Busy,
            );
            p.push_frames(
                [root.clone(), mid],
                Duration::from_micros(3),
                SegmentKind::Network,
            );
            p.push_frames([root], Duration::from_micros(i % 3), SegmentKind::Queueing);
            p.accounting.network = Duration::from_nanos(i);
            let mut r = Record::new(if i % 4 == 0 { "B" } else { "A" }, Trigger::Sampled, p);
            r.start_unix_nanos = Some(1000 + i);
            r.labels
                .insert("arm".into(), ["a", "b"][i as usize % 2].into());
            if i % 9 == 0 {
                r.trigger = Trigger::Forced;
            }
            r
        })
        .collect()
}

/// The profile `fold_into` builds for `sel`, and the one the records
/// themselves fold into.
fn both_folds(store: &Store, sel: &Selection, records: &[Record]) -> (Aggregate, Aggregate) {
    let mut agg = Aggregator::new(sel.clone());
    store.fold_into(&mut agg, 7, None).unwrap();
    (agg.finish(), Aggregate::from_records(sel, records))
}

use crate::profile::aggregate::Aggregate;

#[test]
fn store_profiles_from_packed_paths_equal_the_records_folds() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path().join("s.db")).unwrap();
    let records = varied(300);
    for chunk in records.chunks(41) {
        store.insert(chunk).unwrap();
    }
    let frames: i64 = store
        .conn
        .query_row("SELECT count(*) FROM frames", [], |r| r.get(0))
        .unwrap();
    assert_eq!(frames, 6, "one row per distinct frame");
    for q in [
        "",
        "trigger=all",
        "label=arm%3Db&percentile=p50-p100",
        "service=B&since=1100ns&until=1200ns",
        "percentile=p0-p10",
    ] {
        let sel = Selection::from_query(q).unwrap();
        let (got, want) = both_folds(&store, &sel, &records);
        assert_eq!(
            crate::profile::encode_gzip(&got),
            crate::profile::encode_gzip(&want),
            "{q}"
        );
        assert!(want.requests() > 0, "{q}");
    }
}

/// What the collector's pages fold: the newest N matching records, from
/// the packed paths, equal to folding those records themselves (with
/// histograms, a percentile band applied among them, labels and time), and
/// the count of every match.
#[test]
fn the_newest_records_fold_from_packed_paths_as_from_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path().join("s.db")).unwrap();
    let records = varied(300);
    for chunk in records.chunks(70) {
        store.insert(chunk).unwrap();
    }
    let band = crate::records::selection::PercentileBand::parse("p50-p100").unwrap();
    let sels = [
        Selection::new(),
        Selection::new().with_service("A").with_label("arm", "b"),
        Selection::new().with_service("A").with_percentile(band),
        Selection::new()
            .with_triggers(TriggerFilter::All)
            .with_since(1_050)
            .with_until(1_200),
    ];
    for sel in sels {
        let kept: Vec<&Record> = records.iter().filter(|r| sel.matches(r)).collect();
        for newest in [
            Some(1),
            Some(17),
            Some(kept.len() as u64),
            Some(10_000),
            None,
        ] {
            let mut agg = Aggregator::new(sel.clone()).with_histograms(true);
            let counts = store.fold_newest_into(&mut agg, newest, 7).unwrap();
            let n = newest.map_or(kept.len(), |n| (n as usize).min(kept.len()));
            let tail: Vec<Record> = kept[kept.len() - n..]
                .iter()
                .map(|r| (*r).clone())
                .collect();
            let mut want = Aggregator::new(sel.clone()).with_histograms(true);
            want.push_batch(&tail);
            assert_eq!(
                counts,
                Some((kept.len() as u64, n as u64)),
                "{sel:?} {newest:?}"
            );
            assert_eq!(
                crate::profile::encode_gzip(&agg.finish()),
                crate::profile::encode_gzip(&want.finish()),
                "{sel:?} newest {newest:?}"
            );
        }
    }
}

#[test]
fn a_group_rolled_back_forgets_its_new_frames() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path().join("s.db")).unwrap();
    let records = varied(10);
    let batch = EncodedBatch::new(&records);
    let failed = store.insert_group_then(&[&batch], |_| {
        Err(StoreError::Parquet {
            dir: "x".into(),
            message: "refused".into(),
        })
    });
    assert!(failed.is_err());
    // The frames the failed group inserted are gone from the table and
    // from the writer's copy: the next insert adds them again.
    store.insert(&records).unwrap();
    let sel = Selection::new().with_triggers(TriggerFilter::All);
    let (got, want) = both_folds(&store, &sel, &records);
    assert_eq!(got.stacks(), want.stacks());
}

#[test]
fn opening_an_older_store_for_writing_packs_its_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let records = varied(50);
    write_v1_store(&path, &records);
    let sel = Selection::new().with_triggers(TriggerFilter::All);
    let old = Store::open_read_only(&path).unwrap();
    assert_eq!(old.for_each_packed(&sel, 10, |_, _| {}).unwrap(), None);
    // Read-only, the old store is profiled from its JSON.
    let (got, want) = both_folds(&old, &sel, &records);
    assert_eq!(got.stacks(), want.stacks());
    let summary = old.endpoints(Trigger::Sampled, None, None).unwrap();
    drop(old);
    let migrated = Store::open(&path).unwrap();
    // Summarised from `paths` now, with the latencies the migration wrote.
    assert_eq!(
        migrated.endpoints(Trigger::Sampled, None, None).unwrap(),
        summary
    );
    let mut rows = 0;
    let n = migrated
        .for_each_packed(&sel, 10, |r, _| rows += r.len())
        .unwrap();
    assert_eq!((n, rows), (Some(50), 50));
    let (got, want) = both_folds(&migrated, &sel, &records);
    assert_eq!(
        crate::profile::encode_gzip(&got),
        crate::profile::encode_gzip(&want)
    );
}

fn wal_bytes(db: &Path) -> u64 {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map_or(0, |m| m.len())
}

/// Wait (polling, up to a minute on a loaded machine) until `ok` holds.
fn eventually(mut ok: impl FnMut() -> bool) -> bool {
    for _ in 0..600 {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn a_profile_read_in_progress_does_not_pin_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut store = Store::open_with(&path, Durability::Normal).unwrap();
    let records = varied(200);
    for _ in 0..(3 * SNAPSHOT_ROWS / 200) {
        store.insert(&records).unwrap();
    }
    let reader = Store::open_read_only(&path).unwrap();
    let sel = Selection::new().with_triggers(TriggerFilter::All);
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut first = true;
            reader
                .for_each_packed(&sel, SNAPSHOT_ROWS, |_, _| {
                    if std::mem::take(&mut first) {
                        // Hold the read after its first chunk until the
                        // writer has filled the WAL and it was cut back.
                        wait.recv().unwrap();
                    }
                })
                .unwrap();
            done.send(()).unwrap();
        });
        let mut grew = 0;
        for _ in 0..20 {
            store.insert(&records).unwrap();
            grew = grew.max(wal_bytes(&path));
        }
        assert!(grew > 0);
        // Mid-read, the checkpointer catches up and truncates the WAL.
        assert!(
            eventually(|| wal_bytes(&path) == 0),
            "WAL still {} bytes with a read in progress",
            wal_bytes(&path)
        );
        go.send(()).unwrap();
        finished.recv().unwrap();
    });
}

/// How many inserts of `records` write `bytes` of WAL, from what the first
/// one (made here) wrote.
fn batches_for(store: &mut Store, records: &[Record], bytes: u64) -> u64 {
    let before = wal_bytes(store.path());
    store.insert(records).unwrap();
    let one = wal_bytes(store.path()).saturating_sub(before).max(4096);
    bytes / one + 1
}

/// Small WAL limits, so that a test writes many WALs' worth in little time.
fn small_limits() -> wal::Limits {
    wal::Limits {
        journal_size_limit: 512 << 10,
        cut_within_frames: 128,
        hard_limit: 1 << 40,
        checkpoint_every: Duration::from_millis(20),
    }
}

#[test]
fn the_writer_cuts_the_wal_back_under_continuous_writes_and_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let limits = small_limits();
    let mut store = Store::open_with_limits(&path, Durability::Normal, limits).unwrap();
    let records = varied(200);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let written = 256 * limits.journal_size_limit;
    let mut sizes = Vec::new();
    std::thread::scope(|s| {
        // Profiles read beside the writes all along, in short snapshots.
        s.spawn(|| {
            let reader = Store::open_read_only(&path).unwrap();
            let sel = Selection::new().with_triggers(TriggerFilter::All);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                reader.for_each_packed(&sel, 512, |_, _| {}).unwrap();
            }
        });
        // Writes back to back (no pause for another connection to take the
        // write lock in) until 256 WALs of the limit's size went by.
        for _ in 0..batches_for(&mut store, &records, written) {
            store.insert(&records).unwrap();
            sizes.push(wal_bytes(&path));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let cuts = store.wal.as_ref().unwrap().cuts();
    assert!(cuts >= 8, "the writer cut the WAL {cuts} times");
    // Without the cuts the WAL holds about all that went through it. With
    // them it is a few times the limit most of the time; how far it gets
    // between two cuts depends on the machine's load (checkpoints run on
    // their own thread, and a cut waits for readers), so the longest is
    // held to a generous bound and the usual size to a tight one.
    sizes.sort_unstable();
    let (median, longest) = (sizes[sizes.len() / 2], sizes[sizes.len() - 1]);
    assert!(
        median <= 8 * limits.journal_size_limit && longest < written / 2,
        "the WAL was {median} bytes after the median write and reached {longest} \
         of {written} written (limit {}), {cuts} cuts",
        limits.journal_size_limit
    );
}

#[test]
fn a_wal_at_the_hard_limit_is_cut_when_the_checkpoints_fall_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    // The checkpointer never runs: only the hard limit keeps the WAL short.
    let limits = wal::Limits {
        hard_limit: 2 << 20,
        checkpoint_every: Duration::from_secs(3600),
        ..small_limits()
    };
    let mut store = Store::open_with_limits(&path, Durability::Normal, limits).unwrap();
    let records = varied(200);
    let mut longest = 0u64;
    for _ in 0..batches_for(&mut store, &records, 20 * limits.hard_limit) {
        store.insert(&records).unwrap();
        longest = longest.max(wal_bytes(&path));
    }
    let batch = {
        // The WAL one batch adds, at most: what may pass the limit before
        // the next cut.
        let before = wal_bytes(&path);
        store.insert(&records).unwrap();
        wal_bytes(&path).saturating_sub(before)
    };
    assert!(store.wal.as_ref().unwrap().cuts() > 0);
    assert!(
        longest <= limits.hard_limit + 2 * batch.max(1 << 20),
        "the WAL reached {longest} bytes with a hard limit of {}",
        limits.hard_limit
    );
}

/// Held OTLP spans read back as the bytes they were written as: the
/// protobuf rows of today and the JSON text rows of the first encoding.
#[test]
fn held_spans_read_back_blob_and_text_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut store = Store::open(&path).unwrap();
    let blob = vec![0x0a, 0x01, b's', 0xff];
    let batch = EncodedBatch::new(&[]).with_held_spans(vec![("t1".into(), blob.clone())]);
    store.insert_encoded(&batch).unwrap();
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "INSERT INTO otlp_spans (trace_id, spans) VALUES ('t2', '[{\"i\":\"x\"}]')",
            [],
        )
        .unwrap();
    assert_eq!(
        store.held_spans().unwrap(),
        vec![
            ("t1".to_owned(), blob),
            ("t2".to_owned(), b"[{\"i\":\"x\"}]".to_vec())
        ]
    );
}
