//! Batches in over gRPC and HTTP (JSON Lines and protobuf) come back out of
//! the store unchanged.

use crate::support::*;
use cpt_collector::ingest::{CONTENT_TYPE_JSON_LINES, CONTENT_TYPE_PROTOBUF, proto};

#[test]
fn ingest_grpc_round_trip() {
    let c = TestCollector::start(|c| c);
    let sent = records("grpc", 25);
    let resp = c
        .export(proto::RecordBatch::from_records(&sent))
        .expect("export ok");
    assert_eq!(resp.accepted_records, 25);
    assert_eq!(c.stored(), sent);
    assert_eq!(c.stats().accepted_batches, 1);
}

#[test]
fn ingest_http_json_lines_round_trip() {
    let c = TestCollector::start(|c| c);
    let sent = records("jsonl", 10);
    let resp = post_records(c.http(), CONTENT_TYPE_JSON_LINES, &json_lines(&sent));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["accepted_records"], 10);
    assert_eq!(c.stored(), sent);
}

#[test]
fn ingest_http_protobuf_round_trip() {
    let c = TestCollector::start(|c| c);
    let sent = records("pb", 10);
    let resp = post_records(c.http(), CONTENT_TYPE_PROTOBUF, &protobuf(&sent));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["accepted_records"], 10);
    assert_eq!(c.stored(), sent);
}

#[test]
fn ingest_batches_from_both_front_ends_land_in_one_store_in_order() {
    let c = TestCollector::start(|c| c);
    let a = records("a", 3);
    let b = records("b", 4);
    c.export(proto::RecordBatch::from_records(&a)).unwrap();
    assert_eq!(
        post_records(c.http(), CONTENT_TYPE_JSON_LINES, &json_lines(&b)).status,
        200
    );
    let mut want = a;
    want.extend(b);
    assert_eq!(c.stored(), want);
}

#[test]
fn serve_profile_query_returns_a_gzipped_profile_of_the_selection() {
    let c = TestCollector::start(|c| c);
    assert_eq!(
        post_records(
            c.http(),
            CONTENT_TYPE_JSON_LINES,
            &json_lines(&records("p", 20))
        )
        .status,
        200
    );
    let resp = http(
        c.http(),
        "GET",
        "/profile?service=A&percentile=p50-p100",
        "text/plain",
        b"",
    )
    .unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(&resp.body[..2], &[0x1f, 0x8b], "gzip magic");
    let bad = http(
        c.http(),
        "GET",
        "/profile?percentile=p200",
        "text/plain",
        b"",
    )
    .unwrap();
    assert_eq!(bad.status, 400);
    assert!(
        bad.json()["error"]
            .as_str()
            .unwrap()
            .contains("bad profile query"),
        "{}",
        bad.text()
    );
}
