//! Fair admission: one peer address cannot take every receiving slot. While
//! 127.0.0.2 holds slow HTTP/1 senders or stuck HTTP/2 streams, a sender on
//! 127.0.0.1 is still answered at once (see `server/ingest/receiving.rs`).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cpt_collector::ingest::{CONTENT_TYPE_JSON_LINES, GRPC_EXPORT_PATH, proto};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::{TestCollector, json_lines, post_records, records};

const NOISY: [u8; 4] = [127, 0, 0, 2];

/// A TCP connection to `to` from the loopback address `from`.
async fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(IpAddr::from(from), 0)).unwrap();
    socket.connect(to).await.unwrap()
}

/// A sender on 127.0.0.1 is answered 200 over HTTP and OK over gRPC, each
/// within 2 s.
fn assert_quiet_peer_is_served(c: &TestCollector) {
    let t0 = Instant::now();
    let body = json_lines(&records("quiet-http", 3));
    let http = post_records(c.http(), CONTENT_TYPE_JSON_LINES, &body);
    assert_eq!(http.status, 200, "{}", http.text());
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let t0 = Instant::now();
    let grpc = c.export(proto::RecordBatch::from_records(&records("quiet-grpc", 3)));
    assert!(grpc.is_ok(), "{grpc:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

fn slow_head(len: usize) -> String {
    format!(
        "POST /v1/records HTTP/1.1\r\nHost: localhost\r\nContent-Type: {CONTENT_TYPE_JSON_LINES}\r\n\
         Content-Length: {len}\r\n\r\n"
    )
}

#[test]
fn a_peer_with_260_slow_http1_senders_leaves_room_for_another() {
    let c = TestCollector::start(|c| c);
    let addr = c.http();
    let held = c.rt.block_on(async {
        let mut held = Vec::new();
        for _ in 0..260 {
            let mut s = connect_from(NOISY, addr).await;
            // Headers and 10 of 100 000 promised bytes, then nothing.
            s.write_all(format!("{}{{\"service\"", slow_head(100_000)).as_bytes())
                .await
                .unwrap();
            held.push(s);
        }
        held
    });
    // Once the noisy peer holds its share, its next sender is refused at once.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = c.rt.block_on(async {
            let mut s = connect_from(NOISY, addr).await;
            let body = json_lines(&records("noisy", 1));
            let head = slow_head(body.len()).replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");
            s.write_all(head.as_bytes()).await.unwrap();
            let _ = s.write_all(&body).await;
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            String::from_utf8_lossy(&out).into_owned()
        });
        if r.starts_with("HTTP/1.1 429") {
            assert!(r.contains("this address"), "{r}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the noisy peer was never limited: {r}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_quiet_peer_is_served(&c);
    assert!(c.stats().overloaded >= 1);
    drop(held);
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

#[test]
fn a_peer_with_5x64_stuck_http2_streams_leaves_room_for_another() {
    let c = TestCollector::start(|c| c);
    let grpc = c.grpc();
    let (refused, _conns) = c.rt.block_on(async {
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut conns = Vec::new();
        for _ in 0..5 {
            let io = hyper_util::rt::TokioIo::new(connect_from(NOISY, grpc).await);
            let (send, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(conn);
            for _ in 0..64 {
                let mut send = send.clone();
                let done = done_tx.clone();
                tokio::spawn(async move {
                    let req = http::Request::post(format!("http://{grpc}{GRPC_EXPORT_PATH}"))
                        .header("content-type", "application/grpc")
                        .header("te", "trailers")
                        .body(Stuck)
                        .unwrap();
                    if send.ready().await.is_err() {
                        return;
                    }
                    if let Ok(resp) = send.send_request(req).await {
                        let header = |name: &str| {
                            resp.headers()
                                .get(name)
                                .map(|v| v.to_str().unwrap_or("?").to_owned())
                        };
                        let _ = done.send((header("grpc-status"), header("grpc-message")));
                    }
                });
            }
            conns.push(send);
        }
        // 320 streams, 64 slots for this address: 256 refused at once.
        let mut refused = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while refused.len() < 256 {
            match tokio::time::timeout_at(deadline, done_rx.recv()).await {
                Ok(Some(r)) => refused.push(r),
                _ => break,
            }
        }
        (refused, conns)
    });
    assert_eq!(refused.len(), 256, "streams answered: {refused:?}");
    for (status, msg) in &refused {
        assert_eq!(status.as_deref(), Some("8"), "RESOURCE_EXHAUSTED: {msg:?}");
    }
    assert_quiet_peer_is_served(&c);
}

#[test]
fn a_stalled_body_is_cut_below_the_minimum_rate_before_the_body_timeout() {
    let c = TestCollector::start(|c| {
        c.with_min_body_rate(1000)
            .with_body_timeout(Duration::from_secs(120))
    });
    let addr = c.http();
    let t0 = Instant::now();
    let answer = c.rt.block_on(async {
        let mut s = connect_from(NOISY, addr).await;
        s.write_all(format!("{}{{", slow_head(100_000)).as_bytes())
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    });
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("too slow"), "{answer}");
    let took = t0.elapsed();
    assert!(
        took >= cpt_collector::serve::BODY_RATE_GRACE && took < Duration::from_secs(60),
        "{took:?}"
    );
}
