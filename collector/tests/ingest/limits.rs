//! Each configured limit, triggered: a record over `max_segments`,
//! `max_frames` or `max_stack_frames` is refused naming the limit; an
//! exhausted `max_receiving_bodies` refuses the next sender at once; the
//! HTTP/2 stream cap keeps a connection's extra streams from reaching the
//! server.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cpt_collector::ingest::{CONTENT_TYPE_JSON_LINES, GRPC_EXPORT_PATH, IngestLimits, proto};
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpSocket, TcpStream};

use crate::support::{HttpResponse, TestCollector, json_lines, post_records, record, records};

fn reason(resp: &HttpResponse) -> String {
    resp.json()["problems"][0]["reason"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// The fixture record (CPT Fig. 2a's shape): 4 segments, 3 distinct frames
/// (A1, B1, A2), 6 frames over all its stacks.
#[test]
fn a_record_over_max_segments_max_frames_or_max_stack_frames_is_refused_naming_it() {
    let line = json_lines(&[record("limits", 0)]);
    for (limits, want) in [
        (IngestLimits::new().with_max_segments(3), "max_segments = 3"),
        (IngestLimits::new().with_max_frames(2), "max_frames = 2"),
        (
            IngestLimits::new().with_max_stack_frames(5),
            "max_stack_frames = 5",
        ),
    ] {
        let c = TestCollector::start(|c| c.with_limits(limits));
        let resp = post_records(c.http(), CONTENT_TYPE_JSON_LINES, &line);
        assert_eq!(resp.status, 400, "{want}: {}", resp.text());
        assert!(reason(&resp).contains(want), "{want}: {}", reason(&resp));
        let grpc = c
            .export(proto::RecordBatch::from_records([&record("limits", 0)]))
            .unwrap_err();
        assert_eq!(grpc.code(), tonic::Code::InvalidArgument);
        assert!(grpc.message().contains(want), "{want}: {}", grpc.message());
        assert!(c.stored().is_empty());
    }
    // At the limit, accepted.
    let c = TestCollector::start(|c| {
        c.with_limits(
            IngestLimits::new()
                .with_max_segments(4)
                .with_max_frames(3)
                .with_max_stack_frames(6),
        )
    });
    let resp = post_records(c.http(), CONTENT_TYPE_JSON_LINES, &line);
    assert_eq!(resp.status, 200, "{}", resp.text());
}

async fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(IpAddr::from(from), 0)).unwrap();
    socket.connect(to).await.unwrap()
}

/// A connection from `from` that sent its headers and part of its body.
async fn half_sent(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let mut s = connect_from(from, to).await;
    s.write_all(
        format!(
            "POST /v1/records HTTP/1.1\r\nHost: localhost\r\nContent-Type: {CONTENT_TYPE_JSON_LINES}\r\n\
             Content-Length: 1000\r\n\r\n{{"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    s
}

#[test]
fn exhausted_max_receiving_bodies_refuses_the_next_sender_at_once() {
    let c = TestCollector::start(|c| {
        c.with_max_receiving_bodies(2)
            .with_max_receiving_bodies_per_peer(2)
    });
    let addr = c.http();
    // Two peers hold the two slots (one each: not their share's limit).
    let held = c.rt.block_on(async {
        vec![
            half_sent([127, 0, 0, 2], addr).await,
            half_sent([127, 0, 0, 3], addr).await,
        ]
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t0 = Instant::now();
        let resp = post_records(
            addr,
            CONTENT_TYPE_JSON_LINES,
            &json_lines(&[record("x", 0)]),
        );
        if resp.status == 429 {
            assert!(t0.elapsed() < Duration::from_secs(2), "not refused at once");
            assert!(
                resp.text()
                    .contains("2 request bodies already being received"),
                "{}",
                resp.text()
            );
            assert_eq!(resp.header("retry-after"), Some("1"));
            break;
        }
        assert!(Instant::now() < deadline, "never refused: {}", resp.text());
        std::thread::sleep(Duration::from_millis(50));
    }
    let grpc = c
        .export(proto::RecordBatch::from_records([&record("x", 1)]))
        .unwrap_err();
    assert_eq!(grpc.code(), tonic::Code::ResourceExhausted, "{grpc:?}");
    // Freed slots take senders again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(20);
    while post_records(
        addr,
        CONTENT_TYPE_JSON_LINES,
        &json_lines(&[record("y", 0)]),
    )
    .status
        != 200
    {
        assert!(Instant::now() < deadline, "the slots were never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A request body that never ends.
struct Stuck;

impl hyper::body::Body for Stuck {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        std::task::Poll::Pending
    }
}

/// An HTTP/2 client connection over `io`.
async fn h2<B>(io: TcpStream) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(io),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    send
}

fn export_request<B>(grpc: SocketAddr, body: B) -> http::Request<B> {
    http::Request::post(format!("http://{grpc}{GRPC_EXPORT_PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap()
}

/// The gRPC status of one export from 127.0.0.2 on a new connection, after
/// 4 stuck streams from that address on one connection capped at `cap`
/// concurrent streams; the address's share is 3 receiving slots.
fn export_after_4_stuck_streams(cap: u32) -> Option<String> {
    let c = TestCollector::start(|c| {
        c.with_max_streams_per_connection(cap)
            .with_max_receiving_bodies(16)
            .with_max_receiving_bodies_per_peer(3)
    });
    let grpc = c.grpc();
    c.rt.block_on(async {
        let send = h2(connect_from([127, 0, 0, 2], grpc).await).await;
        for _ in 0..4 {
            let mut send = send.clone();
            let req = export_request(grpc, Stuck);
            tokio::spawn(async move {
                if send.ready().await.is_ok() {
                    let _ = send.send_request(req).await;
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let batch =
            prost::Message::encode_to_vec(&proto::RecordBatch::from_records([&record("after", 0)]));
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(batch.len() as u32).to_be_bytes());
        framed.extend_from_slice(&batch);
        let mut send = h2(connect_from([127, 0, 0, 2], grpc).await).await;
        send.ready().await.unwrap();
        let resp = send
            .send_request(export_request(
                grpc,
                http_body_util::Full::new(Bytes::from(framed)),
            ))
            .await
            .unwrap();
        let in_headers = resp.headers().get("grpc-status").cloned();
        let trailers = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .ok()
            .and_then(|b| b.trailers().cloned());
        in_headers
            .or_else(|| trailers.and_then(|t| t.get("grpc-status").cloned()))
            .map(|v| v.to_str().unwrap_or("?").to_owned())
    })
}

#[test]
fn the_http2_stream_cap_keeps_extra_streams_from_reaching_the_server() {
    // Capped at 2 streams, only 2 of the 4 stuck streams reach the server:
    // the address keeps a free slot of its 3, and the next export is OK.
    assert_eq!(export_after_4_stuck_streams(2).as_deref(), Some("0"));
    // Uncapped (64), all 4 reach it and take the address's 3 slots: the next
    // export is refused with RESOURCE_EXHAUSTED. The cap is what made the
    // difference.
    assert_eq!(export_after_4_stuck_streams(64).as_deref(), Some("8"));
}

/// A sender whose clock runs ahead (here: to 2262, the last year a u64 of
/// nanoseconds reaches) is refused at once, by JSON Lines and protobuf
/// alike, naming `--max-future-skew`, and counted as `clock_ahead`; the
/// store never holds the record, so fresh time-ranged label profiles
/// answer.
#[test]
fn a_record_from_a_clock_in_2262_is_refused_and_fresh_label_profiles_still_answer() {
    let c = TestCollector::start(|mut c| {
        c.metrics_open = true;
        c
    });
    let mut ahead = record("clock", 0);
    ahead.start_unix_nanos = Some(9_214_646_400_000_000_000); // 2262-01-01
    let mut batch = records("clock", 3);
    batch.push(ahead);
    for (content_type, body) in [
        (CONTENT_TYPE_JSON_LINES, json_lines(&batch)),
        (
            cpt_collector::ingest::CONTENT_TYPE_PROTOBUF,
            crate::support::protobuf(&batch),
        ),
    ] {
        let resp = post_records(c.http(), content_type, &body);
        assert_eq!(resp.status, 400, "{content_type}: {}", resp.text());
        let why = reason(&resp);
        assert!(
            why.contains("ahead of the collector's clock") && why.contains("--max-future-skew"),
            "{content_type}: {why}"
        );
    }
    // A minute ahead is within the default hour.
    let mut near = records("fresh", 5);
    near[0].start_unix_nanos = Some(crate::support::an_hour_ago() + 3_660_000_000_000);
    let resp = post_records(c.http(), CONTENT_TYPE_JSON_LINES, &json_lines(&near));
    assert_eq!(resp.status, 200, "{}", resp.text());
    let metrics = crate::support::http(c.http(), "GET", "/metrics", "text/plain", b"")
        .unwrap()
        .text();
    assert!(
        metrics.contains("cpt_batches_rejected_total{reason=\"clock_ahead\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cpt_batches_rejected_total{reason=\"malformed\"} 0"),
        "{metrics}"
    );
    let since = crate::support::an_hour_ago() - 60_000_000_000;
    let profile = crate::support::http(
        c.http(),
        "GET",
        &format!("/profile?label=batch%3Dfresh&since={since}"),
        "text/plain",
        b"",
    )
    .unwrap();
    assert_eq!(profile.status, 200, "{}", profile.text());
    assert!(
        c.stored()
            .iter()
            .all(|r| r.labels.get("batch").map(String::as_str) == Some("fresh")),
        "nothing of the refused batches is stored"
    );
    assert_eq!(c.stored().len(), 5);
}
