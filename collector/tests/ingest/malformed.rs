//! Malformed batches: a clear error naming what is wrong, and nothing of the
//! batch stored, whatever the front end.

use crate::support::*;
use cpt_collector::ingest::{CONTENT_TYPE_JSON_LINES, CONTENT_TYPE_PROTOBUF, proto};

#[test]
fn ingest_malformed_json_lines_names_each_bad_line_and_stores_nothing() {
    let c = TestCollector::start(|c| c);
    let mut body = json_lines(&records("m", 99));
    // Line 100 breaks the sum rule, line 101 is not JSON; 99 good lines before them.
    body.extend(
        br#"{"service":"A","trigger":"sampled","latency_ns":5,"path":[{"stack":["x"],"ns":4}]}"#,
    );
    body.extend(b"\n{oops\n");
    let resp = post_records(c.http(), CONTENT_TYPE_JSON_LINES, &body);
    assert_eq!(resp.status, 400, "{}", resp.text());
    let json = resp.json();
    assert_eq!(json["total_problems"], 2);
    assert_eq!(json["problems"][0]["at"], "line 100");
    assert!(
        json["problems"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("path sums to 4 ns but latency_ns is 5")
    );
    assert_eq!(json["problems"][1]["at"], "line 101");
    assert!(
        json["error"]
            .as_str()
            .unwrap()
            .starts_with("batch rejected, nothing stored: line 100:")
    );
    assert!(
        c.stored().is_empty(),
        "nothing of a rejected batch is stored"
    );
    assert_eq!(c.stats().rejected_batches, 1);
}

#[test]
fn ingest_malformed_protobuf_over_http_names_the_record_and_field() {
    let c = TestCollector::start(|c| c);
    let mut batch = proto::RecordBatch::from_records(&records("m", 5));
    batch.records[3].segments[1].stack = vec![0, 9];
    let body = prost::Message::encode_to_vec(&batch);
    let resp = post_records(c.http(), CONTENT_TYPE_PROTOBUF, &body);
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert_eq!(
        resp.json()["problems"][0]["at"],
        "records[3].segments[1].stack[1]",
        "{}",
        resp.text()
    );
    let garbage = post_records(c.http(), CONTENT_TYPE_PROTOBUF, b"\x0a\x05ab");
    assert_eq!(garbage.status, 400);
    assert!(
        garbage
            .text()
            .contains("not a cpt.collector.v1.RecordBatch"),
        "{}",
        garbage.text()
    );
    assert!(c.stored().is_empty());
}

#[test]
fn ingest_malformed_grpc_batch_is_invalid_argument_and_stores_nothing() {
    let c = TestCollector::start(|c| c);
    let mut batch = proto::RecordBatch::from_records(&records("m", 5));
    batch.records[4].trigger = 0;
    let status = c.export(batch).unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("records[4].trigger: unspecified"),
        "{}",
        status.message()
    );
    assert!(c.stored().is_empty());
}

#[test]
fn ingest_unsupported_content_type_and_oversized_body_are_refused() {
    let c = TestCollector::start(|c| c.with_max_batch_bytes(1000));
    let small = json_lines(&records("m", 1));
    let resp = post_records(c.http(), "text/csv", &small);
    assert_eq!(resp.status, 415);
    assert!(
        resp.text().contains("application/x-ndjson"),
        "{}",
        resp.text()
    );
    let big = json_lines(&records("m", 10));
    assert!(big.len() > 1000);
    let resp = post_records(c.http(), CONTENT_TYPE_JSON_LINES, &big);
    assert_eq!(resp.status, 413, "{}", resp.text());
    assert!(
        resp.text().contains("larger than 1000 bytes"),
        "{}",
        resp.text()
    );
    let status = c
        .export(proto::RecordBatch::from_records(&records("m", 10)))
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(c.stored().is_empty());
}

#[test]
fn ingest_gzip_bodies_are_inflated_within_the_size_limit() {
    use std::io::Write as _;
    let gz = |bytes: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    };
    let c = TestCollector::start(|c| c.with_max_batch_bytes(64 * 1024));
    let sent = records("gz", 10);
    let resp = post_gzip(c.http(), &gz(&json_lines(&sent)));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(c.stored(), sent);
    // 1 MiB of newlines compresses to ~1 KiB but inflates past the limit.
    let bomb = gz(&vec![b'\n'; 1 << 20]);
    assert!(bomb.len() < 64 * 1024);
    let resp = post_gzip(c.http(), &bomb);
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert!(
        resp.text().contains("inflates to more than 65536 bytes"),
        "{}",
        resp.text()
    );
    let resp = post_gzip(c.http(), b"not gzip");
    assert_eq!(resp.status, 400);
    assert!(resp.text().contains("bad gzip body"), "{}", resp.text());
    assert_eq!(c.stored().len(), 10);
}

fn post_gzip(addr: std::net::SocketAddr, body: &[u8]) -> HttpResponse {
    http_with_headers(
        addr,
        "POST",
        "/v1/records",
        &[
            ("Content-Type", CONTENT_TYPE_JSON_LINES),
            ("Content-Encoding", "gzip"),
        ],
        body,
    )
    .unwrap()
}

/// Sends raw bytes as the gRPC request message.
#[derive(Debug, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = proto::ExportResponse;
    type Encoder = RawEncoder;
    type Decoder = tonic_prost::ProstDecoder<proto::ExportResponse>;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstCodec::<proto::RecordBatch, proto::ExportResponse>::default().decoder()
    }
}

#[derive(Debug)]
struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

#[test]
fn ingest_grpc_garbage_is_invalid_argument_naming_the_decode_error() {
    let c = TestCollector::start(|c| c);
    let status = c.rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", c.grpc()))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static(cpt_collector::ingest::GRPC_EXPORT_PATH);
        // Field 1 (records) claims 5 bytes and has 2.
        grpc.unary(tonic::Request::new(b"\x0a\x05ab".to_vec()), path, RawCodec)
            .await
            .unwrap_err()
    });
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("not a cpt.collector.v1.RecordBatch"),
        "{}",
        status.message()
    );
    assert!(c.stored().is_empty());
}
