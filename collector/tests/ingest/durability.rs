//! Durability: a batch acknowledged by `cpt serve` survives `kill -9` of the
//! collector, and no batch is ever half-stored.

use crate::support::*;
use cpt_collector::ingest::{CONTENT_TYPE_JSON_LINES, CONTENT_TYPE_PROTOBUF, proto};

fn serve(store: &std::path::Path) -> Served {
    serve_child(store, true, &[])
}

#[test]
fn ingest_durable_ack_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.db");
    let served = serve(&store);

    let over_http = records("http", 100);
    let resp = post_records(
        served.http,
        CONTENT_TYPE_JSON_LINES,
        &json_lines(&over_http),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    let over_pb = records("pb", 50);
    assert_eq!(
        post_records(served.http, CONTENT_TYPE_PROTOBUF, &protobuf(&over_pb)).status,
        200
    );
    let over_grpc = records("grpc", 30);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ack = rt
        .block_on(grpc_export(
            served.grpc.expect("gRPC is on"),
            proto::RecordBatch::from_records(&over_grpc),
        ))
        .expect("gRPC export acknowledged");
    assert_eq!(ack.accepted_records, 30);

    kill_9(served);

    let mut want = over_http;
    want.extend(over_pb);
    want.extend(over_grpc);
    assert_eq!(
        stored(&store),
        want,
        "every acknowledged record is in the reopened store"
    );
}

/// Several clients send batches while the collector is killed mid-stream:
/// every acknowledged batch is complete in the store, and every batch in the
/// store is complete (all or nothing).
#[test]
fn ingest_kill_9_under_load_keeps_acked_batches_whole() {
    const BATCH: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.db");
    let served = serve(&store);
    let addr = served.http;
    let acked = load_until_killed(addr, BATCH, 20, || kill_9(served));
    let per_batch = assert_batches_whole(&acked, stored(&store), BATCH, "the store");
    assert!(per_batch.len() >= acked.len());
}
