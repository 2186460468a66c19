//! `cpt serve --parquet-dir`: a batch is acknowledged only once it is in a
//! finished Parquet file, so every acknowledged record survives `kill -9`,
//! and the directory never holds a file a reader chokes on.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::support::*;
use cpt_collector::ingest::CONTENT_TYPE_JSON_LINES;
use cpt_collector::records::{ReadOptions, RecordReader};
use cpt_sdk::record::Record;

/// `cpt serve --parquet-dir` as a child process; its HTTP address.
fn serve(store: &Path, parquet: &Path) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cpt"))
        .args(["serve", "--store"])
        .arg(store)
        .arg("--parquet-dir")
        .arg(parquet)
        .args(["--grpc", "off", "--http", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cpt serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let http = loop {
        let line = lines
            .next()
            .expect("cpt serve exited before listening")
            .unwrap();
        if let Some(a) = line.strip_prefix("cpt serve: http listening on http://") {
            break a.parse().unwrap();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, http)
}

fn kill_9(mut child: Child) {
    // Child::kill sends SIGKILL on Unix: no shutdown code runs.
    child.kill().unwrap();
    child.wait().unwrap();
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
    let (child, http) = serve(&store, &pq);
    let sent = records("one", 25);
    let resp = post_records(http, CONTENT_TYPE_JSON_LINES, &json_lines(&sent));
    assert_eq!(resp.status, 200, "{}", resp.text());
    kill_9(child);
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
    let (child, addr) = serve(&store, &pq);
    let acked = load_until_killed(addr, BATCH, 40, || kill_9(child));
    assert_batches_whole(&acked, read_dir(&pq), BATCH, "Parquet");
}
