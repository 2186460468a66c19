//! The collector client behind the SDK's exporter: retries with exponential
//! backoff on push-back and connection errors (not on 400), counts drops,
//! never blocks `emit`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use cpt_collector::ingest::decode_protobuf;
use cpt_exporter::client::{CollectorClient, Endpoint, SendError};
use cpt_sdk::RecordSink;
use cpt_sdk::export::Exporter;

use crate::support::*;

/// A collector stand-in answering with scripted statuses (then 200).
#[derive(Clone, Default)]
pub(crate) struct Script {
    statuses: Arc<Mutex<Vec<u16>>>,
    seen: Arc<Mutex<Vec<(Instant, usize)>>>,
}

async fn scripted(State(s): State<Script>, headers: HeaderMap, body: Bytes) -> StatusCode {
    assert_eq!(headers["content-type"], "application/x-protobuf");
    let n = decode_protobuf(&body)
        .expect("the exporter sends valid batches")
        .len();
    s.seen.lock().unwrap().push((Instant::now(), n));
    let mut statuses = s.statuses.lock().unwrap();
    let code = if statuses.is_empty() {
        200
    } else {
        statuses.remove(0)
    };
    StatusCode::from_u16(code).unwrap()
}

pub(crate) fn start_scripted(statuses: &[u16]) -> (tokio::runtime::Runtime, Script, String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let script = Script {
        statuses: Arc::new(Mutex::new(statuses.to_vec())),
        ..Script::default()
    };
    let app = axum::Router::new()
        .route("/v1/records", post(scripted))
        .with_state(script.clone());
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await });
    (rt, script, url)
}

#[test]
fn client_retries_429_and_503_with_exponential_backoff() {
    let (_rt, script, url) = start_scripted(&[429, 503, 429]);
    let client = CollectorClient::builder(Endpoint::parse(&url).unwrap())
        .with_initial_backoff(Duration::from_millis(40))
        .build();
    let stats = client.stats();
    let (sink, handle) = Exporter::builder()
        .with_interval(Duration::from_millis(10))
        .build(client);
    for r in records("retry", 10) {
        sink.emit(r);
    }
    assert!(handle.flush(Duration::from_secs(20)));
    assert_eq!(
        (handle.exported(), handle.failed(), handle.dropped()),
        (10, 0, 0)
    );
    assert_eq!(
        (stats.exported_records(), stats.exported_batches()),
        (10, 1)
    );
    assert_eq!(stats.retries(), 3);
    let seen = script.seen.lock().unwrap();
    assert_eq!(
        seen.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![10, 10, 10, 10]
    );
    // Backoff doubles: delays are at least 20, 40, 80 ms (jitter keeps each
    // in [backoff/2, backoff]).
    let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1].0 - w[0].0).collect();
    for (gap, min_ms) in gaps.iter().zip([20, 40, 80]) {
        assert!(*gap >= Duration::from_millis(min_ms), "gaps {gaps:?}");
    }
    assert!(
        stats.last_error().unwrap().contains("429"),
        "{:?}",
        stats.last_error()
    );
    handle.shutdown();
}

#[test]
fn client_does_not_retry_a_rejected_batch() {
    let (_rt, script, url) = start_scripted(&[400]);
    let mut client = CollectorClient::builder(Endpoint::parse(&url).unwrap())
        .with_initial_backoff(Duration::from_millis(1))
        .build();
    let err = client.send(&records("bad", 5)).unwrap_err();
    assert!(matches!(err, SendError::Rejected { .. }), "{err}");
    assert!(err.to_string().contains("400"), "{err}");
    let stats = client.stats();
    assert_eq!(
        (
            stats.rejected_records(),
            stats.retries(),
            stats.exported_records()
        ),
        (5, 0, 0)
    );
    assert_eq!(script.seen.lock().unwrap().len(), 1, "not retried");
}

#[test]
fn client_counts_drops_and_never_blocks_when_the_collector_is_down() {
    // A port nobody listens on: every attempt is a connection error.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client =
        CollectorClient::builder(Endpoint::parse(&format!("http://127.0.0.1:{port}")).unwrap())
            .with_max_attempts(3)
            .with_initial_backoff(Duration::from_millis(50))
            .build();
    let stats = client.stats();
    let (sink, handle) = Exporter::builder()
        .with_queue_capacity(8)
        .with_max_batch(4)
        .with_interval(Duration::from_millis(1))
        .build(client);
    let emitted = 1000;
    let batch = records("down", emitted);
    let t0 = Instant::now();
    for r in batch {
        sink.emit(r);
    }
    // 1000 emits against a dead collector take well under a second: emit
    // only does a try_send, whatever the client is doing.
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "emit blocked: {:?}",
        t0.elapsed()
    );
    assert!(handle.flush(Duration::from_secs(60)));
    // Every record is accounted for: shipped (and failed) or dropped.
    let shipped = handle.failed();
    assert_eq!(shipped + handle.dropped(), emitted as u64);
    // The worker sits in backoff (>= 25 ms per retry) while the loop runs,
    // so the bounded queue (8) overflows at once and nearly all are dropped.
    assert!(
        handle.dropped() >= emitted as u64 - 100,
        "dropped {}",
        handle.dropped()
    );
    assert_eq!(stats.dropped_after_retries(), shipped);
    assert_eq!(stats.exported_records(), 0);
    // Two retries per batch (three attempts), batches of at most 4 records.
    let batches = stats.retries() / 2;
    assert_eq!(stats.retries() % 2, 0, "{}", stats.retries());
    assert!(
        batches >= shipped.div_ceil(4) && batches <= shipped,
        "{batches} batches for {shipped} records"
    );
    assert!(
        stats
            .last_error()
            .unwrap()
            .contains("cannot reach the collector")
    );
    handle.shutdown();
}

#[test]
fn client_exports_to_cpt_serve_over_grpc_and_http() {
    let c = TestCollector::start(|c| c);
    for (endpoint, batch) in [
        (format!("grpc://{}", c.grpc()), "via-grpc"),
        (format!("http://{}", c.http()), "via-http"),
    ] {
        let client = CollectorClient::builder(Endpoint::parse(&endpoint).unwrap()).build();
        let stats = client.stats();
        let (sink, handle) = Exporter::builder().with_max_batch(64).build(client);
        for r in records(batch, 200) {
            sink.emit(r);
        }
        handle.shutdown();
        assert_eq!(stats.exported_records(), 200, "{endpoint}: {stats:?}");
        assert!(stats.exported_batches() >= 4, "{stats:?}");
        assert_eq!(stats.retries(), 0);
    }
    let mut got = c.stored();
    assert_eq!(got.len(), 400);
    let mut want = records("via-grpc", 200);
    want.extend(records("via-http", 200));
    got.sort_by(|a, b| a.request_id.cmp(&b.request_id));
    want.sort_by(|a, b| a.request_id.cmp(&b.request_id));
    assert_eq!(got, want);
}

#[test]
fn client_backs_off_on_resource_exhausted_until_the_collector_catches_up() {
    let c = TestCollector::start(|c| c.with_max_pending_batches(1));
    // Stall the writer and fill the single pending slot.
    let blocker = rusqlite::Connection::open(&c.store).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let addr = c.http();
    let first = std::thread::spawn(move || {
        post_records(
            addr,
            cpt_collector::ingest::CONTENT_TYPE_JSON_LINES,
            &json_lines(&records("first", 3)),
        )
    });
    let t0 = Instant::now();
    while http(addr, "GET", "/v1/stats", "text/plain", b"")
        .unwrap()
        .json()["pending_batches"]
        != 1
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the first batch never became pending"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut client =
        CollectorClient::builder(Endpoint::parse(&format!("grpc://{}", c.grpc())).unwrap())
            .with_initial_backoff(Duration::from_millis(20))
            .with_max_backoff(Duration::from_millis(100))
            .with_max_attempts(50)
            .build();
    let stats = client.stats();
    let sender = std::thread::spawn(move || client.send(&records("retried", 5)));
    let t0 = Instant::now();
    while stats.retries() < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the client never retried"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        stats.last_error().unwrap().contains("ResourceExhausted"),
        "{:?}",
        stats.last_error()
    );
    blocker.execute_batch("ROLLBACK").unwrap();
    sender
        .join()
        .unwrap()
        .expect("delivered once the collector caught up");
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(stats.exported_records(), 5);
    assert!(c.stats().overloaded >= 2);
    assert_eq!(c.stored().len(), 8);
}
