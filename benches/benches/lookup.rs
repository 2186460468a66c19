//! Finding one request among 10⁶ stored records by its request id, through
//! the store's id index, as `cpt show --store` and
//! the collector's `GET /v1/records?request_id=` do.
//!
//! `cargo bench -p cpt-benches --bench lookup` (records: `CPT_LOOKUP_RECORDS`,
//! default 1 000 000). Prints the time per lookup (median, p99, max over
//! 1000 ids, each a fresh query: reader connection, index probe, JSON parse).

use std::time::{Duration, Instant};

use cpt_collector::store::{Durability, Store, StoreQuery};
use cpt_sdk::testing::SplitMix64;
use cpt_sdk::{CriticalPath, Frame, Record, SegmentKind, Trigger};

fn record(i: u64) -> Record {
    let mut p = CriticalPath::new();
    p.push_frames(
        [Frame::new("A", "A1")],
        Duration::from_micros(300),
        SegmentKind::Busy,
    );
    p.push_frames(
        [Frame::new("A", "A1"), Frame::new("B", "B1")],
        Duration::from_micros(200 + i % 100),
        SegmentKind::Busy,
    );
    let mut r = Record::new(
        "A",
        if i.is_multiple_of(1000) {
            Trigger::Forced
        } else {
            Trigger::Sampled
        },
        p,
    );
    r.endpoint = Some("/a.A/Run".into());
    r.start_unix_nanos = Some(1_700_000_000_000_000_000 + i * 1_000_000);
    r.request_id = Some(format!("req-{i:016x}"));
    r.trace_id = Some(format!("{:032x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    r
}

fn main() {
    let n: u64 = std::env::var("CPT_LOOKUP_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("lookup.db");
    let t = Instant::now();
    {
        let mut store = Store::open_with(&path, Durability::Normal).expect("store");
        let batch = 50_000;
        let mut i = 0;
        while i < n {
            let end = (i + batch).min(n);
            let records: Vec<Record> = (i..end).map(record).collect();
            store.insert(&records).expect("insert");
            i = end;
        }
    }
    println!("lookup: stored {n} records in {:.1?}", t.elapsed());

    let store = Store::open_read_only(&path).expect("open");
    let mut rng = SplitMix64::new(16);
    let mut times = Vec::with_capacity(1000);
    for _ in 0..1000 {
        let i = rng.next_u64() % n;
        let q = StoreQuery {
            request_id: Some(format!("req-{i:016x}")),
            ..StoreQuery::default()
        };
        let t = Instant::now();
        let found: Vec<Record> = store
            .query(&q)
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("records");
        times.push(t.elapsed());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].request_id, Some(format!("req-{i:016x}")));
    }
    times.sort();
    println!(
        "lookup by request id among {n} records: median {:.2?}, p99 {:.2?}, max {:.2?} (1000 lookups)",
        times[times.len() / 2],
        times[times.len() * 99 / 100],
        times[times.len() - 1]
    );
}
