//! Overload: when `max_pending_batches` batches wait for the writer, further
//! batches are refused as soon as their bodies have arrived (HTTP 429 +
//! Retry-After, gRPC RESOURCE_EXHAUSTED), so memory stays bounded; once the
//! writer catches up, batches are accepted again.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::*;
use cpt_collector::ingest::{CONTENT_TYPE_JSON_LINES, proto};

fn pending(c: &TestCollector) -> u64 {
    let resp = http(c.http(), "GET", "/v1/stats", "text/plain", b"").unwrap();
    resp.json()["pending_batches"].as_u64().unwrap()
}

#[test]
fn ingest_overload_pushes_back_with_429_and_resource_exhausted() {
    const MAX_PENDING: usize = 2;
    let c = TestCollector::start(|c| c.with_max_pending_batches(MAX_PENDING));
    // Stall the writer: another connection holds SQLite's write lock.
    let blocker = rusqlite::Connection::open(&c.store).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();

    let addr = c.http();
    let stuck: Vec<_> = (0..MAX_PENDING)
        .map(|i| {
            let body = json_lines(&records(&format!("stuck{i}"), 10));
            std::thread::spawn(move || post_records(addr, CONTENT_TYPE_JSON_LINES, &body))
        })
        .collect();
    let t0 = Instant::now();
    while pending(&c) < MAX_PENDING as u64 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "batches never became pending"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // A flood while the writer is stalled: every request is refused at once.
    let flood = 50;
    let body = json_lines(&records("flood", 10));
    for _ in 0..flood {
        let resp = post_records(addr, CONTENT_TYPE_JSON_LINES, &body);
        assert_eq!(resp.status, 429, "{}", resp.text());
        assert_eq!(resp.header("retry-after"), Some("1"));
        assert!(
            resp.text().contains("collector overloaded"),
            "{}",
            resp.text()
        );
    }
    let status = c
        .export(proto::RecordBatch::from_records(&records("flood", 10)))
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(pending(&c), MAX_PENDING as u64, "the queue did not grow");

    // Refused before the body is read: a request that declares 64 MiB
    // (over max_batch_bytes) and sends none of it gets its 413 right away.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "POST /v1/records HTTP/1.1\r\nHost: localhost\r\nContent-Type: {CONTENT_TYPE_JSON_LINES}\r\nContent-Length: {}\r\n\r\n",
        64 << 20
    )
    .unwrap();
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"HTTP/1.1 413");

    // The writer catches up: the pending batches are acknowledged, and new
    // batches are accepted again.
    blocker.execute_batch("ROLLBACK").unwrap();
    for t in stuck {
        let resp = t.join().unwrap();
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    assert_eq!(
        post_records(addr, CONTENT_TYPE_JSON_LINES, &body).status,
        200
    );
    let stats = c.stats();
    assert_eq!(stats.overloaded, flood + 1);
    assert_eq!(stats.accepted_batches, MAX_PENDING as u64 + 1);
    assert_eq!(c.stored().len(), 10 * (MAX_PENDING + 1));
}
