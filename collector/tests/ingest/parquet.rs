//! `cpt serve --parquet-dir`: a batch is acknowledged only once it is in a
//! finished Parquet file, so every acknowledged record survives `kill -9`,
//! and the directory never holds a file a reader chokes on.

use std::path::Path;

use crate::support::*;
use cpt_collector::ingest::CONTENT_TYPE_JSON_LINES;
use cpt_collector::records::{ReadOptions, RecordReader};
use cpt_sdk::record::Record;

/// `cpt serve --parquet-dir PARQUET` as a child process.
fn serve(store: &Path, parquet: &Path) -> Served {
    serve_child(
        store,
        false,
        &["--parquet-dir".as_ref(), parquet.as_os_str()],
    )
}

/// Every record of the directory, read as `cpt profile` reads it: this fails
/// on any file that is not a whole cpt Parquet file.
fn read_dir(dir: &Path) -> Vec<Record> {
    RecordReader::open(dir, ReadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"))
        .read_all(&mut |w| panic!("{w}"))
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn parquet_acknowledged_batch_is_in_a_finished_file_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (store, pq) = (dir.path().join("s.db"), dir.path().join("pq"));
    let served = serve(&store, &pq);
    let http = served.http;
    let sent = records("one", 25);
    let resp = post_records(http, CONTENT_TYPE_JSON_LINES, &json_lines(&sent));
    assert_eq!(resp.status, 200, "{}", resp.text());
    kill_9(served);
    assert_eq!(read_dir(&pq), sent);
}

/// Four clients send batches while the collector is killed mid-load: every
/// acknowledged batch is whole in the Parquet directory, every batch there is
/// whole and there once, and every file there reads.
#[test]
fn parquet_kill_9_under_load_keeps_acked_batches_and_leaves_no_bad_file() {
    const BATCH: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let (store, pq) = (dir.path().join("s.db"), dir.path().join("pq"));
    let served = serve(&store, &pq);
    let addr = served.http;
    let acked = load_until_killed(addr, BATCH, 40, || kill_9(served));
    assert_batches_whole(&acked, read_dir(&pq), BATCH, "Parquet");
}

/// The records of a store or Parquet directory, counted by request id.
fn counted(records: impl IntoIterator<Item = Record>) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for r in records {
        *out.entry(r.request_id.unwrap_or_default()).or_default() += 1;
    }
    out
}

/// Killed three times under load and restarted each time (a start settles
/// what the killed one left staged): Parquet and the store hold the same
/// records, as many times each (batch names repeat from one run to the
/// next), every acknowledged one included, and nothing is left staged.
#[test]
fn parquet_and_the_store_hold_the_same_records_after_kill_9() {
    const BATCH: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let (store, pq) = (dir.path().join("s.db"), dir.path().join("pq"));
    let mut acked = std::collections::BTreeSet::new();
    for _ in 0..3 {
        let served = serve(&store, &pq);
        let addr = served.http;
        acked.extend(load_until_killed(addr, BATCH, 20, || kill_9(served)));
    }
    // One more start settles the last kill's staging; then stop it.
    kill_9(serve(&store, &pq));
    let in_store = counted(stored(&store));
    let in_parquet = counted(read_dir(&pq));
    assert_eq!(
        in_store.len(),
        in_parquet.len(),
        "records in the store vs in Parquet"
    );
    assert_eq!(in_store, in_parquet);
    for name in &acked {
        for i in 0..BATCH {
            let id = format!("{name}/{i}");
            assert!(
                in_parquet.contains_key(&id),
                "acknowledged {id} not in Parquet"
            );
        }
    }
    let staging = pq.join(".staging");
    let left: Vec<_> = std::fs::read_dir(&staging)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        left.iter().all(|p| p.is_dir()),
        "files left staged: {left:?}"
    );
}

/// A store or Parquet failure answers 503 with `Retry-After` and a body that
/// names no file (the collector's log has the paths).
#[test]
fn a_failed_write_answers_503_naming_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let pq = dir.path().join("pq");
    let c = TestCollector::start(|c| c.with_parquet_dir(&pq));
    // The staging directory replaced by a file: no group can be written.
    let staging = pq.join(".staging");
    std::fs::remove_dir_all(&staging).unwrap();
    std::fs::write(&staging, b"in the way").unwrap();
    let resp = post_records(
        c.http(),
        CONTENT_TYPE_JSON_LINES,
        &json_lines(&records("fails", 3)),
    );
    assert_eq!(resp.status, 503, "{}", resp.text());
    assert_eq!(resp.header("retry-after"), Some("1"));
    let body = resp.text();
    assert!(
        body.contains("the collector's log has the detail"),
        "{body}"
    );
    let root = dir.path().to_string_lossy();
    assert!(
        !body.contains(root.as_ref()),
        "the body names a path: {body}"
    );
    assert!(
        !body.contains("store.db") && !body.contains(".staging"),
        "{body}"
    );
    assert!(c.stored().is_empty());
}

const HOUR: u64 = 3_600_000_000_000;

/// Every entry under `dir` (directories too), relative to it; none when it
/// is missing.
fn entries(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(list) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in list {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p.clone());
            }
            out.push(p.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
        }
    }
    out.sort();
    out
}

/// `cpt serve --parquet-dir`'s finished files (the staging directory
/// aside).
fn parquet_files(pq: &Path) -> Vec<String> {
    entries(pq)
        .into_iter()
        .filter(|e| !e.starts_with(".staging") && e.ends_with(".parquet"))
        .collect()
}

/// One batch whose records started over 5 000 different hours: a bounded
/// number of files (the 16 busiest hours and one mixed partition), every
/// record in them once, and nothing left staged.
#[test]
fn a_batch_over_5000_hours_writes_a_bounded_number_of_files() {
    let dir = tempfile::tempdir().unwrap();
    let pq = dir.path().join("pq");
    let c = TestCollector::start(|c| c.with_parquet_dir(&pq));
    let mut sent = records("hours", 5000);
    for (i, r) in sent.iter_mut().enumerate() {
        r.start_unix_nanos = Some(an_hour_ago() - i as u64 * HOUR);
    }
    let resp = post_records(c.http(), CONTENT_TYPE_JSON_LINES, &json_lines(&sent));
    assert_eq!(resp.status, 200, "{}", resp.text());
    let files = parquet_files(&pq);
    assert!(
        files.len() <= 17,
        "{} files, the first {:?}",
        files.len(),
        &files[..5]
    );
    assert_eq!(
        files
            .iter()
            .filter(|f| f.starts_with("date=mixed/hour=mixed/"))
            .count(),
        1,
        "{files:?}"
    );
    let back = counted(read_dir(&pq));
    assert_eq!(back.len(), 5000);
    assert!(back.values().all(|n| *n == 1), "a record written twice");
    assert_eq!(back, counted(sent));
    assert_eq!(entries(&pq.join(".staging")), Vec::<String>::new());
}

/// A group whose Parquet write fails (a partition directory cannot be
/// created) answers 503 and leaves the staging directory as it was: no
/// file, no directory of the group's other partitions. The resend, once
/// the obstacle is gone, is written once.
#[test]
fn a_failed_parquet_write_leaves_nothing_staged() {
    let dir = tempfile::tempdir().unwrap();
    let pq = dir.path().join("pq");
    let c = TestCollector::start(|c| c.with_parquet_dir(&pq));
    // Three days: the middle one's date directory is blocked by a file.
    let mut sent = records("fails", 3);
    for (i, r) in sent.iter_mut().enumerate() {
        r.start_unix_nanos = Some(an_hour_ago() - (2 - i as u64) * 24 * HOUR);
    }
    let staging = pq.join(".staging");
    let (date, _) = cpt_collector::records::parquet::partition_of(an_hour_ago() - 24 * HOUR);
    let blocker = format!("date={date}");
    std::fs::write(staging.join(&blocker), b"in the way").unwrap();
    let resp = post_records(c.http(), CONTENT_TYPE_JSON_LINES, &json_lines(&sent));
    assert_eq!(resp.status, 503, "{}", resp.text());
    assert_eq!(entries(&staging), std::slice::from_ref(&blocker));
    assert!(parquet_files(&pq).is_empty());
    std::fs::remove_file(staging.join(&blocker)).unwrap();
    let resp = post_records(c.http(), CONTENT_TYPE_JSON_LINES, &json_lines(&sent));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(entries(&staging), Vec::<String>::new());
    assert_eq!(counted(read_dir(&pq)), counted(sent));
}
