//! Hostile senders: a record that would poison the store, a small
//! protobuf batch that would expand without bound, slow or stuck senders,
//! idle connections, unary calls with two messages, a missing credential.
//! Each is refused or cut off, and well-behaved senders keep getting 200.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support::*;
use cpt_collector::ingest::{CONTENT_TYPE_JSON_LINES, CONTENT_TYPE_PROTOBUF, proto};
use cpt_collector::serve::ServeConfig;

/// Short connection timeouts so the tests stay fast; the defaults are
/// seconds.
fn short(c: ServeConfig) -> ServeConfig {
    c.with_header_read_timeout(Duration::from_millis(300))
        .with_idle_timeout(Duration::from_millis(300))
        .with_body_timeout(Duration::from_millis(500))
}

fn problem(resp: &HttpResponse) -> (String, String) {
    let json = resp.json();
    (
        json["problems"][0]["at"].as_str().unwrap_or("").to_owned(),
        json["problems"][0]["reason"]
            .as_str()
            .unwrap_or("")
            .to_owned(),
    )
}

// === 1. one record poisons the store ===

#[test]
fn hostile_poison_record_with_a_huge_service_name_is_refused_naming_the_limit() {
    let c = TestCollector::start(|c| c);
    let mut poison = record("p", 0);
    poison.service = "S".repeat(3 << 20);

    let resp = post_records(
        c.http(),
        CONTENT_TYPE_JSON_LINES,
        &json_lines(&[poison.clone()]),
    );
    assert_eq!(resp.status, 400, "{}", resp.text());
    let (at, reason) = problem(&resp);
    assert_eq!(at, "line 1");
    assert!(reason.starts_with("service: 3145728 bytes"), "{reason}");
    assert!(reason.contains("max_string_bytes = 512"), "{reason}");
    assert!(reason.contains("--max-string-bytes"), "{reason}");

    let status = c
        .export(proto::RecordBatch::from_records([&record("p", 1), &poison]))
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("records[1].service: 3145728 bytes"),
        "{}",
        status.message()
    );
    assert!(c.stored().is_empty(), "nothing of either batch is stored");
    assert_eq!(c.stats().rejected_batches, 2);

    // Ordinary records are accepted as before.
    let resp = post_records(
        c.http(),
        CONTENT_TYPE_JSON_LINES,
        &json_lines(&records("ok", 100)),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
}

#[test]
fn hostile_records_over_a_limit_or_with_absurd_values_are_refused() {
    let c = TestCollector::start(|c| c);
    let deep = format!(
        r#"{{"service":"S","trigger":"sampled","latency_ns":3,"path":[{{"stack":[{}],"ns":3}}]}}"#,
        vec![r#""x""#; 300_000].join(",")
    );
    let labels: Vec<String> = (0..65).map(|i| format!(r#""k{i}":"v""#)).collect();
    let many_labels = format!(
        r#"{{"service":"S","trigger":"sampled","latency_ns":3,"labels":{{{}}},"path":[{{"stack":["x"],"ns":3}}]}}"#,
        labels.join(",")
    );
    let long_label = format!(
        r#"{{"service":"S","trigger":"sampled","latency_ns":3,"labels":{{"k":"{}"}},"path":[{{"stack":["x"],"ns":3}}]}}"#,
        "v".repeat(600)
    );
    let long_frame = format!(
        r#"{{"service":"S","trigger":"sampled","latency_ns":3,"path":[{{"stack":["{}"],"ns":3}}]}}"#,
        "f".repeat(5000)
    );
    #[rustfmt::skip]
    let cases: Vec<(&str, String, &str)> = vec![
        ("u64::MAX latency", format!(
            r#"{{"service":"S","trigger":"sampled","latency_ns":{m},"path":[{{"stack":["x"],"ns":{m}}}]}}"#,
            m = u64::MAX
        ), "latency_nanos: 18446744073709551615 ns, over the limit max_latency = 3600s"),
        ("latency 0, no segments",
            r#"{"service":"S","trigger":"sampled","latency_ns":0,"path":[]}"#.into(),
            "segments: empty"),
        // The JSON form drops zero-length segments (the SDK model has none);
        // a record left with no segment is refused.
        ("only 0 ns segments",
            r#"{"service":"S","trigger":"sampled","latency_ns":0,"path":[{"stack":["x"],"ns":0}]}"#.into(),
            "segments: empty"),
        ("300 000-deep stack", deep, "segments[0].stack: stack depth 300000, over the limit max_depth = 128"),
        ("65 labels", many_labels, "labels: 65 labels, over the limit max_labels = 64"),
        ("600-byte label value", long_label, "labels[\"k\"]: 600 bytes, over the limit max_string_bytes = 512"),
        ("5000-byte frame name", long_frame, "frames[0].name: 5000 bytes, over the limit max_frame_string_bytes = 4096"),
    ];
    for (name, line, want) in cases {
        let resp = post_records(c.http(), CONTENT_TYPE_JSON_LINES, line.as_bytes());
        assert_eq!(resp.status, 400, "{name}: {}", resp.text());
        let (at, reason) = problem(&resp);
        assert_eq!(at, "line 1", "{name}");
        assert!(reason.starts_with(want), "{name}: {reason}");
    }
    // Protobuf carries segments as sent: a 0 ns one is refused.
    let mut zero = proto::RecordBatch::from_records([&record("z", 0)]);
    zero.records[0].segments[1].duration_nanos = 0;
    zero.records[0].latency_nanos -= 20_000_000;
    let status = c.export(zero).unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("records[0].segments[1].duration_nanos: zero"),
        "{}",
        status.message()
    );
    assert!(c.stored().is_empty());
}

#[test]
fn hostile_limits_are_configurable() {
    let c = TestCollector::start(|c| {
        c.with_limits(cpt_collector::ingest::IngestLimits::new().with_max_string_bytes(4 << 20))
    });
    let mut big = record("big", 0);
    big.service = "S".repeat(600);
    let resp = post_records(c.http(), CONTENT_TYPE_JSON_LINES, &json_lines(&[big]));
    assert_eq!(resp.status, 200, "{}", resp.text());
}

// === 2. a small protobuf batch expands without bound ===

/// Peak resident memory of process `pid`, in bytes (Linux).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// One record whose segments index one 1 kB frame `depth` times each.
fn amplifying(segments: usize, depth: usize) -> proto::RecordBatch {
    let r = proto::Record {
        service: "A".into(),
        trigger: proto::Trigger::Sampled as i32,
        latency_nanos: segments as u64,
        frames: vec![proto::Frame {
            name: "f".repeat(1000),
            service: "A".into(),
            file: None,
            line: 0,
        }],
        segments: (0..segments)
            .map(|_| proto::Segment {
                stack: vec![0; depth],
                duration_nanos: 1,
                kind: proto::SegmentKind::Busy as i32,
                wait: false,
            })
            .collect(),
        ..Default::default()
    };
    proto::RecordBatch { records: vec![r] }
}

/// The collector runs as a child process, so the memory measured is the
/// server's alone (not the test's, which builds the batches).
#[test]
fn hostile_amplifying_protobuf_batch_is_refused_and_memory_stays_flat() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    let served = serve_child(&store, true, &[]);
    let pid = served.child.id();
    // 101 kB: one segment, 100 000 × the 1 kB frame (100 MB expanded).
    let deep = prost::Message::encode_to_vec(&amplifying(1, 100_000));
    assert!(deep.len() < 110_000, "{}", deep.len());
    // Within the depth limit: 3000 segments × 128 × 1 kB (390 MB expanded)
    // from a 400 kB body, over gRPC.
    let wide = amplifying(3000, 128);
    let before = peak_rss(pid);
    let resp = post_records(served.http, CONTENT_TYPE_PROTOBUF, &deep);
    assert_eq!(resp.status, 400, "{}", resp.text());
    let (at, reason) = problem(&resp);
    assert_eq!(at, "records[0].segments[0].stack");
    assert!(reason.contains("max_depth = 128"), "{reason}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt
        .block_on(grpc_export(served.grpc.unwrap(), wide))
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("max_record_bytes"),
        "{}",
        status.message()
    );
    let grown = peak_rss(pid).saturating_sub(before);
    assert!(
        grown < 64 << 20,
        "the collector's peak memory grew by {} MB while refusing the batches",
        grown >> 20
    );
    let stats = http(served.http, "GET", "/v1/stats", "", b"")
        .unwrap()
        .json();
    assert_eq!(stats["rejected_batches"], 2, "{stats}");
    kill_9(served);
    assert!(stored(&store).is_empty());
}

// === 3. slow senders shut out everyone ===

/// `n` connections that each announce a 100 kB body and send 10 bytes.
fn slow_http_senders(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            write!(
                s,
                "POST /v1/records HTTP/1.1\r\nHost: localhost\r\nContent-Type: {CONTENT_TYPE_JSON_LINES}\r\nContent-Length: 100000\r\n\r\n{{\"service\""
            )
            .unwrap();
            s
        })
        .collect()
}

#[test]
fn hostile_slow_http_senders_do_not_lock_out_a_well_behaved_sender() {
    // Default body timeout (30 s): the slow senders stay for the whole test.
    let c = TestCollector::start(|c| c);
    let slow = slow_http_senders(c.http(), 32);
    // Let the server start receiving all 32 bodies.
    std::thread::sleep(Duration::from_millis(200));
    let resp = post_records(
        c.http(),
        CONTENT_TYPE_JSON_LINES,
        &json_lines(&records("fine", 3)),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(c.stored().len(), 3);
    drop(slow);
}

#[test]
fn hostile_stuck_grpc_streams_do_not_lock_out_a_well_behaved_sender() {
    let c = TestCollector::start(|c| c);
    let addr = c.grpc();
    // 32 connections, each with an Export stream whose body never comes.
    let stuck: Vec<_> = (0..32)
        .map(|_| {
            c.rt.spawn(async move {
                let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                    .unwrap()
                    .connect()
                    .await
                    .unwrap();
                let mut grpc = tonic::client::Grpc::new(channel);
                grpc.ready().await.unwrap();
                let path =
                    http::uri::PathAndQuery::from_static(cpt_collector::ingest::GRPC_EXPORT_PATH);
                let codec =
                    tonic_prost::ProstCodec::<proto::RecordBatch, proto::ExportResponse>::default();
                grpc.client_streaming(
                    tonic::Request::new(tokio_stream::pending::<proto::RecordBatch>()),
                    path,
                    codec,
                )
                .await
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let resp =
        c.rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(20),
                grpc_export(addr, proto::RecordBatch::from_records(&records("fine", 3))),
            )
            .await
        })
        .expect("the export is answered");
    assert_eq!(resp.unwrap().accepted_records, 3);
    for s in stuck {
        s.abort();
    }
}

#[test]
fn hostile_slow_bodies_are_cut_off_after_the_body_timeout() {
    let c = TestCollector::start(short);
    let mut slow = slow_http_senders(c.http(), 1).remove(0);
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut raw = Vec::new();
    let _ = slow.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("not received within 500ms"), "{text}");

    let addr = c.grpc();
    let status = c.rt.block_on(async move {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static(cpt_collector::ingest::GRPC_EXPORT_PATH);
        let codec = tonic_prost::ProstCodec::<proto::RecordBatch, proto::ExportResponse>::default();
        tokio::time::timeout(
            Duration::from_secs(20),
            grpc.client_streaming(
                tonic::Request::new(tokio_stream::pending::<proto::RecordBatch>()),
                path,
                codec,
            ),
        )
        .await
        .expect("the stuck stream is answered")
        .unwrap_err()
    });
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
}

/// Read until the server closes the connection (Ok) or 20 s pass (Err).
fn closed_by_server(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut raw = Vec::new();
    match s.read_to_end(&mut raw) {
        Ok(_) => Ok(raw),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(raw),
        Err(e) => Err(e),
    }
}

#[test]
fn hostile_idle_and_half_sent_header_connections_are_closed() {
    let c = TestCollector::start(short);
    for addr in [c.http(), c.grpc()] {
        let mut idle = TcpStream::connect(addr).unwrap();
        closed_by_server(&mut idle).expect("an idle connection is closed");
    }
    let mut half = TcpStream::connect(c.http()).unwrap();
    half.write_all(b"POST /v1/records HTTP/1.1\r\nHost: localhost\r\nContent-Ty")
        .unwrap();
    closed_by_server(&mut half).expect("a half-sent header is cut off");

    // A keep-alive connection left idle after a request is closed too.
    let mut kept = TcpStream::connect(c.http()).unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let raw = closed_by_server(&mut kept).expect("an idle keep-alive connection is closed");
    assert!(String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 200"));
}

// === smaller findings ===

#[test]
fn hostile_unary_export_with_two_messages_is_refused_whole() {
    let c = TestCollector::start(|c| c);
    let addr = c.grpc();
    let status = c.rt.block_on(async move {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static(cpt_collector::ingest::GRPC_EXPORT_PATH);
        let codec = tonic_prost::ProstCodec::<proto::RecordBatch, proto::ExportResponse>::default();
        let two = tokio_stream::iter([
            proto::RecordBatch::from_records(&records("first", 2)),
            proto::RecordBatch::from_records(&records("second", 2)),
        ]);
        grpc.client_streaming(tonic::Request::new(two), path, codec)
            .await
            .unwrap_err()
    });
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("exactly one RecordBatch"),
        "{}",
        status.message()
    );
    assert!(c.stored().is_empty(), "neither message is stored");
    assert_eq!(c.stats().rejected_batches, 1);
}

#[test]
fn hostile_grpc_batches_tonic_refuses_are_counted_as_rejected() {
    let c = TestCollector::start(|c| c.with_max_batch_bytes(1000));
    let status = c
        .export(proto::RecordBatch::from_records(&records("big", 50)))
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert_eq!(c.stats().rejected_batches, 1);
}

#[test]
fn hostile_ingest_token_is_required_when_configured() {
    let c = TestCollector::start(|c| c.with_ingest_token("s3cret\n"));
    let body = json_lines(&records("t", 2));
    let resp = post_records(c.http(), CONTENT_TYPE_JSON_LINES, &body);
    assert_eq!(resp.status, 401, "{}", resp.text());
    assert_eq!(resp.header("www-authenticate"), Some("Bearer"));
    assert!(resp.text().contains("Bearer <token>"), "{}", resp.text());
    for auth in ["Bearer s3cre", "Bearer s3cret!", "s3cret", "Basic s3cret"] {
        let resp = http_with_headers(
            c.http(),
            "POST",
            "/v1/records",
            &[
                ("Content-Type", CONTENT_TYPE_JSON_LINES),
                ("Authorization", auth),
            ],
            &body,
        )
        .unwrap();
        assert_eq!(resp.status, 401, "{auth}: {}", resp.text());
    }
    let status = c
        .export(proto::RecordBatch::from_records(&records("t", 2)))
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(c.stored().is_empty());

    let resp = http_with_headers(
        c.http(),
        "POST",
        "/v1/records",
        &[
            ("Content-Type", CONTENT_TYPE_JSON_LINES),
            ("Authorization", "Bearer s3cret"),
        ],
        &body,
    )
    .unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(c.stats().rejected_batches, 6);
}

#[test]
fn hostile_client_sends_the_ingest_token_over_http_and_grpc() {
    use cpt_exporter::client::{CollectorClient, Endpoint};
    let c = TestCollector::start(|c| c.with_ingest_token("s3cret"));
    for url in [
        format!("http://{}", c.http()),
        format!("grpc://{}", c.grpc()),
    ] {
        let mut client = CollectorClient::builder(Endpoint::parse(&url).unwrap())
            .with_token("s3cret\n")
            .unwrap()
            .build();
        client.send(&records("client", 2)).unwrap();
        let mut anonymous = CollectorClient::builder(Endpoint::parse(&url).unwrap()).build();
        let err = anonymous.send(&records("anon", 2)).unwrap_err();
        assert!(err.to_string().contains("Bearer"), "{url}: {err}");
    }
    assert_eq!(c.stored().len(), 4);
}

#[test]
fn hostile_profile_query_with_too_many_filters_is_a_400() {
    let c = TestCollector::start(|c| c);
    let query: Vec<String> = (0..1000).map(|i| format!("label=k%3D{i}")).collect();
    let resp = http(
        c.http(),
        "GET",
        &format!("/profile?{}", query.join("&")),
        "text/plain",
        b"",
    )
    .unwrap();
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert!(
        resp.text()
            .contains("1000 parameters, over the limit of 64"),
        "{}",
        resp.text()
    );
    assert!(!resp.text().contains(".db"), "{}", resp.text());
}
