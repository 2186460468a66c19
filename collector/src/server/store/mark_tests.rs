//! The raw-deleted mark ([`State::raw_deleted_through`]) under size
//! deletion: no record stamped far ahead moves it past the records kept,
//! and a store whose mark was moved there recovers when opened for writing.

use std::time::Duration;

use cpt_sdk::{Record, Trigger};

use super::tests::record;
use super::*;
use crate::profile::aggregate::Aggregator;
use crate::records::selection::Selection;

/// `n` sampled records of arm `arm` that started one a millisecond from
/// `from`.
fn fresh(n: u64, from: u64, arm: &str) -> Vec<Record> {
    (0..n)
        .map(|i| record("A", "/a", from + i * 1_000_000, 3, Trigger::Sampled, arm))
        .collect()
}

/// A time-ranged label profile (which roll-ups cannot answer) over what
/// started since `since`.
fn label_profile(store: &Store, since: u64, arm: &str) -> Result<u64, StoreError> {
    let sel = Selection::new()
        .with_service("A")
        .with_label("arm", arm)
        .with_since(since);
    store
        .profile(Aggregator::new(sel), 1_000)
        .map(|(agg, _)| agg.requests())
}

const YEAR_2262: u64 = 9_200_000_000_000_000_000;

/// A record stamped in 2262 among fresh ones, then size deletion (the
/// records stored first) past it: the raw-deleted mark stays before every
/// record kept, the 2262 record is kept, and a fresh time-ranged label
/// profile still answers from the raw records.
#[test]
fn size_deletion_keeps_a_record_from_the_future_and_its_mark_stays_before_the_records_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path().join("s.db")).unwrap();
    let t0 = unix_nanos(std::time::SystemTime::now()) - 60_000_000_000;
    store.insert(&fresh(500, t0, "a")).unwrap();
    let mut ahead = record("A", "/a", YEAR_2262, 3, Trigger::Sampled, "a");
    ahead.request_id = Some("ahead".into());
    store.insert(&[ahead]).unwrap();
    store.insert(&fresh(500, t0 + 500_000_000, "a")).unwrap();
    let later = t0 + 2_000_000_000;
    store.insert(&fresh(500, later, "b")).unwrap();
    while !store
        .roll_up(
            10_000,
            std::time::SystemTime::now(),
            Duration::from_secs(86_400),
        )
        .unwrap()
        .caught_up
    {}
    // Past the 2262 record (stored 501st) and all of arm a.
    let mut deleted = 0;
    while deleted < 1_000 {
        let n = store
            .delete_oldest(128.min(1_000 - deleted) as usize)
            .unwrap();
        assert!(n > 0, "size deletion stalled after {deleted}");
        deleted += n;
    }
    let state = store.state().unwrap();
    let mark = state.raw_deleted_through.unwrap();
    let earliest_kept = store.oldest_start().unwrap().unwrap();
    assert!(
        mark < earliest_kept,
        "the mark {mark} passes the earliest record kept, {earliest_kept}"
    );
    assert!(mark < later, "{state:?}");
    let kept: Vec<Record> = store
        .query(&StoreQuery::default())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        kept.iter().any(|r| r.start_unix_nanos == Some(YEAR_2262)),
        "the record from the future went with the records stored before it"
    );
    assert_eq!(kept.len() as u64 + state.deleted_by_retention, 1_501);
    // Fresh records, sent seconds after the deleted ones: still raw.
    assert_eq!(label_profile(&store, later, "b").unwrap(), 500);
    // Once everything that started before it is gone, it goes too.
    while store.delete_oldest(128).unwrap() > 0 {}
    assert_eq!(store.len().unwrap(), 0);
    assert_eq!(store.state().unwrap().raw_deleted_through, Some(YEAR_2262));
}

/// A store whose mark was moved to 2262 (by a deletion in id order of a
/// record stamped then) answers every time-ranged label profile "beyond
/// retention"; opened for writing, its mark comes back to just before the
/// earliest record it keeps, and those profiles answer again.
#[test]
fn a_store_whose_raw_deleted_mark_passed_its_records_recovers_when_opened_for_writing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let t0 = unix_nanos(std::time::SystemTime::now()) - 60_000_000_000;
    {
        let mut store = Store::open(&path).unwrap();
        store.insert(&fresh(300, t0, "a")).unwrap();
        let mut state = store.state().unwrap();
        state.raw_deleted_through = Some(YEAR_2262);
        state.deleted_by_retention = 1;
        state.write(&store.conn).unwrap();
    }
    let read = Store::open_read_only(&path).unwrap();
    assert!(
        matches!(
            label_profile(&read, t0, "a"),
            Err(StoreError::BeyondRetention(_))
        ),
        "a poisoned mark makes every ranged label profile beyond retention"
    );
    drop(read);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.state().unwrap().raw_deleted_through, Some(t0 - 1));
    assert_eq!(label_profile(&store, t0, "a").unwrap(), 300);
    // Nothing kept: the mark comes back to the time it was opened.
    drop(store);
    {
        let store = Store::open(&path).unwrap();
        store
            .conn
            .execute_batch("DELETE FROM records; DELETE FROM paths;")
            .unwrap();
        let mut state = store.state().unwrap();
        state.raw_deleted_through = Some(YEAR_2262);
        state.write(&store.conn).unwrap();
    }
    let before = unix_nanos(std::time::SystemTime::now());
    let store = Store::open(&path).unwrap();
    let mark = store.state().unwrap().raw_deleted_through.unwrap();
    assert!(mark >= before && mark < YEAR_2262, "{mark}");
}
