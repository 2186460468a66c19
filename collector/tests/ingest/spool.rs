//! Nothing lost on the way to the collector: the client's on-disk spool
//! across an outage, a lost acknowledgement, a full spool and a torn tail,
//! and the collector's batch-id deduplication under them.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cpt_collector::ingest::{BATCH_ID_HEADER, proto};
use cpt_exporter::client::{ClientStats, CollectorClient, Endpoint, SendError};
use cpt_sdk::RecordSink;
use cpt_sdk::export::{ExportHandle, Exporter};

use crate::support::*;

/// A local port nobody listens on (yet).
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Wait for `cond` (at most a minute: this is no timing assertion).
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How many times each request id is stored.
fn copies(c: &TestCollector) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for r in c.stored() {
        *m.entry(r.request_id.unwrap()).or_insert(0) += 1;
    }
    m
}

fn quick_client(endpoint: &str) -> cpt_exporter::client::CollectorClientBuilder {
    CollectorClient::builder(Endpoint::parse(endpoint).unwrap())
        .with_max_attempts(2)
        .with_initial_backoff(Duration::from_millis(5))
        .with_max_backoff(Duration::from_millis(40))
        .with_request_timeout(Duration::from_secs(5))
}

const THREADS: usize = 4;
const PER_THREAD: usize = 500;

/// `THREADS` threads emit `PER_THREAD` records each, tagged `phase`.
fn emit_under_load(sink: &Exporter, phase: &str) -> Vec<String> {
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let sink = sink.clone();
            let tag = format!("{phase}-{t}");
            std::thread::spawn(move || {
                let mut ids = Vec::new();
                for r in records(&tag, PER_THREAD) {
                    ids.push(r.request_id.clone().unwrap());
                    sink.emit(r);
                }
                ids
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect()
}

/// The outage: records emitted while the collector is down (until the
/// client has given up on some batch), then the collector comes up on the
/// same address and more records are emitted; the exporter is shut down.
fn outage(
    client: CollectorClient,
    stats: &ClientStats,
    grpc: SocketAddr,
) -> (TestCollector, ExportHandle, Vec<String>) {
    let (sink, handle) = Exporter::builder()
        .with_queue_capacity(100_000)
        .with_max_batch(50)
        .with_interval(Duration::from_millis(5))
        .build(client);
    let mut emitted = emit_under_load(&sink, "down");
    // The collector is really down for these: the client gave up on some.
    wait_for("a batch given up on", || {
        stats.spooled_records() + stats.dropped_after_retries() > 0
    });
    let c = TestCollector::start(|c| c.with_grpc(grpc));
    emitted.extend(emit_under_load(&sink, "up"));
    drop(sink);
    (c, handle, emitted)
}

#[test]
fn spool_outage_under_load_stores_every_record_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let grpc = free_port();
    let client = quick_client(&format!("grpc://{grpc}"))
        .with_spool(dir.path().join("spool"), 64 << 20)
        .build();
    let stats = client.stats();
    let (c, handle, emitted) = outage(client, &stats, grpc);
    assert!(handle.flush(Duration::from_secs(60)));
    wait_for("the spool to drain", || stats.spool_pending_records() == 0);
    let queue_dropped = handle.dropped();
    handle.shutdown();

    assert_eq!(queue_dropped, 0, "the queue is large enough for the test");
    let copies = copies(&c);
    let lost: Vec<_> = emitted
        .iter()
        .filter(|id| !copies.contains_key(*id))
        .collect();
    let twice: Vec<_> = copies.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        lost.is_empty(),
        "{} lost, e.g. {:?}",
        lost.len(),
        lost.first()
    );
    assert!(twice.is_empty(), "{} stored twice: {twice:?}", twice.len());
    assert_eq!(copies.len(), emitted.len());
    // It went through the spool, and nothing was given up on.
    assert!(stats.spooled_records() > 0, "{stats:?}");
    assert_eq!(stats.replayed_records(), stats.spooled_records());
    assert_eq!(stats.dropped_after_retries(), 0, "{stats:?}");
    assert_eq!(stats.spool_dropped_records(), 0);
    assert_eq!(stats.exported_records(), emitted.len() as u64);
}

#[test]
fn without_a_spool_the_same_outage_loses_records_counted_as_given_up() {
    let grpc = free_port();
    let client = quick_client(&format!("grpc://{grpc}")).build();
    let stats = client.stats();
    let (c, handle, emitted) = outage(client, &stats, grpc);
    handle.shutdown();
    let stored = c.stored().len() as u64;
    let given_up = stats.dropped_after_retries();
    assert!(given_up > 0, "{stats:?}");
    assert!(stored < emitted.len() as u64);
    // Every record emitted is stored or counted as given up (none dropped
    // at the queue, none stored twice).
    assert_eq!(stored + given_up, emitted.len() as u64, "{stats:?}");
    assert_eq!(copies(&c).values().filter(|n| **n > 1).count(), 0);
    assert_eq!(stats.spooled_records(), 0);
}

/// A TCP proxy to `upstream` that, on its first `lose` connections, lets
/// the request through, waits for the answer (the collector answers only
/// once the batch is committed) and then closes the client's connection
/// without passing it on: a lost acknowledgement.
fn ack_losing_proxy(upstream: SocketAddr, lose: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let n = seen.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut up = TcpStream::connect(upstream).unwrap();
                let (mut from_client, mut to_up) =
                    (client.try_clone().unwrap(), up.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_client, &mut to_up);
                    let _ = to_up.shutdown(Shutdown::Write);
                });
                if n < lose {
                    let mut first = [0u8; 1];
                    let _ = up.read(&mut first);
                    let _ = client.shutdown(Shutdown::Both);
                } else {
                    let _ = std::io::copy(&mut up, &mut client);
                    let _ = client.shutdown(Shutdown::Write);
                }
            });
        }
    });
    addr
}

#[test]
fn a_replay_after_a_lost_ack_stores_nothing_twice() {
    let c = TestCollector::start(|c| c);
    let proxy = ack_losing_proxy(c.http(), 1);
    let dir = tempfile::tempdir().unwrap();
    let mut client = CollectorClient::builder(Endpoint::parse(&format!("http://{proxy}")).unwrap())
        .with_max_attempts(1)
        .with_spool(dir.path(), 1 << 20)
        .build();
    let stats = client.stats();
    let batch = records("lost-ack", 25);
    // Committed by the collector, but the client never hears so: spooled.
    client.send(&batch).unwrap();
    assert_eq!(stats.spooled_records(), 25, "{stats:?}");
    assert_eq!(c.stored().len(), 25);
    // The replay resends the batch under the same id: acknowledged, not
    // stored again.
    assert_eq!(client.replay(), 25);
    assert_eq!(stats.spool_pending_records(), 0);
    assert_eq!(c.stored(), batch);
    assert_eq!(c.stats().duplicate_batches, 1);
    assert_eq!(c.stats().accepted_records, 25);
}

#[test]
fn the_collector_stores_a_batch_id_once_over_grpc_and_http_and_refuses_a_bad_one() {
    let c = TestCollector::start(|c| c);
    let batch = records("dedup", 3);
    let body = protobuf(&batch);
    for _ in 0..2 {
        let r = http_with_headers(
            c.http(),
            "POST",
            "/v1/records",
            &[
                ("Content-Type", "application/x-protobuf"),
                (BATCH_ID_HEADER, "same-id-1"),
            ],
            &body,
        )
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // Over gRPC, with metadata, twice.
    let send = |id: &str| {
        c.rt.block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", c.grpc()))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.unwrap();
            let codec =
                tonic_prost::ProstCodec::<proto::RecordBatch, proto::ExportResponse>::default();
            let path =
                http::uri::PathAndQuery::from_static(cpt_collector::ingest::GRPC_EXPORT_PATH);
            let mut req = tonic::Request::new(proto::RecordBatch::from_records(&batch));
            req.metadata_mut()
                .insert(BATCH_ID_HEADER, id.parse().unwrap());
            grpc.unary(req, path, codec).await
        })
    };
    send("same-id-2").unwrap();
    send("same-id-2").unwrap();
    // Without an id (an old client) a batch is stored every time.
    post_records(c.http(), "application/x-protobuf", &body);
    post_records(c.http(), "application/x-protobuf", &body);
    assert_eq!(c.stored().len(), 3 * 4);
    assert_eq!(c.stats().duplicate_batches, 2);

    let r = http_with_headers(
        c.http(),
        "POST",
        "/v1/records",
        &[
            ("Content-Type", "application/x-protobuf"),
            (BATCH_ID_HEADER, "not an id!"),
        ],
        &body,
    )
    .unwrap();
    assert_eq!(r.status, 400);
    assert!(r.text().contains("cpt-batch-id"), "{}", r.text());
    let e = send(&"x".repeat(65)).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("1 to 64 characters"),
        "{}",
        e.message()
    );
    assert_eq!(c.stored().len(), 12);
}

/// Spool entry bytes of a batch of `records` (see the spool's file format).
fn entry_bytes(records: &[cpt_sdk::Record]) -> u64 {
    8 + 1 + 32 + 4 + prost::Message::encoded_len(&proto::RecordBatch::from_records(records)) as u64
}

#[test]
fn a_full_spool_drops_the_excess_counted_and_still_delivers_the_older_batches() {
    let dir = tempfile::tempdir().unwrap();
    let grpc = free_port();
    let batches: Vec<_> = (0..5).map(|b| records(&format!("full-{b}"), 10)).collect();
    // Room for three batches, not four.
    let max = entry_bytes(&batches[0]) * 3 + entry_bytes(&batches[0]) / 2;
    let mut client = quick_client(&format!("grpc://{grpc}"))
        .with_spool(dir.path(), max)
        .build();
    let stats = client.stats();
    for (i, b) in batches.iter().enumerate() {
        match client.send(b) {
            Ok(()) => assert!(i < 3, "batch {i} should not fit"),
            Err(SendError::Spool { spool, .. }) => {
                assert!(i >= 3, "batch {i} should fit: {spool}");
                assert!(spool.to_string().contains("spool full"), "{spool}");
            }
            Err(e) => panic!("batch {i}: {e}"),
        }
    }
    assert_eq!(stats.spooled_records(), 30);
    assert_eq!(stats.spool_dropped_records(), 20);
    assert_eq!(stats.dropped_after_retries(), 20);
    assert_eq!(stats.spool_pending_records(), 30);

    let c = TestCollector::start(|c| c.with_grpc(grpc));
    assert_eq!(client.replay(), 30);
    let want: Vec<_> = batches[..3].iter().flatten().cloned().collect();
    assert_eq!(c.stored(), want, "the three oldest batches, in order");
    assert_eq!(stats.spool_pending_records(), 0);
    // Its connection closes before the collector shuts down.
    drop(client);
}

/// The newest segment file in `dir`.
fn last_segment(dir: &Path) -> std::path::PathBuf {
    let mut segs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs.pop().expect("a segment")
}

#[test]
fn a_torn_spool_tail_after_a_crash_replays_the_entries_before_it_and_reports_the_tear() {
    let dir = tempfile::tempdir().unwrap();
    let grpc = free_port();
    let batches: Vec<_> = (0..3).map(|b| records(&format!("torn-{b}"), 10)).collect();
    {
        let mut client = quick_client(&format!("grpc://{grpc}"))
            .with_spool(dir.path(), 1 << 20)
            .build();
        for b in &batches {
            client.send(b).unwrap();
        }
        assert_eq!(client.stats().spool_pending_records(), 30);
    }
    // The process dies in the middle of appending a fourth batch: the
    // entry's length and checksum and part of its payload are on disk.
    let seg = last_segment(dir.path());
    let intact = std::fs::metadata(&seg).unwrap().len();
    let fourth = protobuf(&records("torn-3", 10));
    let mut f = std::fs::OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&(fourth.len() as u32 + 37).to_le_bytes())
        .unwrap();
    f.write_all(&[0xde, 0xad, 0xbe, 0xef]).unwrap();
    f.write_all(&fourth[..fourth.len() / 2]).unwrap();
    drop(f);

    // The service restarts with the collector up.
    let c = TestCollector::start(|c| c.with_grpc(grpc));
    let mut client = quick_client(&format!("grpc://{grpc}"))
        .with_spool(dir.path(), 1 << 20)
        .build();
    let stats = client.stats();
    assert_eq!(stats.spool_tears(), 1);
    let reported = stats.last_error().unwrap();
    assert!(reported.contains("torn tail"), "{reported}");
    assert!(
        reported.contains(&format!("at byte {intact}")),
        "{reported}"
    );
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), intact);
    assert_eq!(stats.spool_pending_records(), 30);
    assert_eq!(client.replay(), 30);
    let want: Vec<_> = batches.iter().flatten().cloned().collect();
    assert_eq!(c.stored(), want);
}
