//! The quickstart as a user runs it: the binary, configured only by `CPT_*`
//! variables. Its records hold the shop's own spans and the inventory's path
//! merged in (CPT's "Propagation and merging"), each summing exactly to the
//! request's latency; without a trust secret it says why its calls are
//! blind spots; with `CPT_COLLECTOR_ENDPOINT` it ships to that collector.

use std::path::Path;
use std::process::{Command, Output};

use cpt_sdk::{Record, SegmentKind};

fn run(dir: &Path, env: &[(&str, &str)], requests: u32) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cpt-quickstart"));
    cmd.arg(requests.to_string()).current_dir(dir);
    for var in cpt_sdk::env::VARIABLES {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("run cpt-quickstart");
    assert!(
        out.status.success(),
        "cpt-quickstart failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn records(dir: &Path) -> Vec<Record> {
    std::fs::read_to_string(dir.join("records.jsonl"))
        .expect("records.jsonl written")
        .lines()
        .map(|l| Record::from_json(l).unwrap())
        .collect()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn every_sampled_order_has_the_inventorys_path_merged_and_sums_to_its_latency() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &[("CPT_SAMPLE_RATE", "1"), ("CPT_TRUST_SECRET", "dev-secret")],
        10,
    );
    let log = stdout(&out);
    assert!(
        !log.contains("blind spot"),
        "no misconfiguration warning: {log}"
    );
    let records = records(dir.path());
    assert_eq!(records.len(), 10, "{log}");
    for r in &records {
        assert_eq!(r.service, "shop");
        assert_eq!(r.endpoint.as_deref(), Some("POST /orders/{item}"));
        let path = &r.path;
        let total: std::time::Duration = path.segments().iter().map(|s| s.duration).sum();
        assert_eq!(total, r.latency, "the path sums to the latency");
        assert!(
            path.segments()
                .iter()
                .all(|s| s.kind != SegmentKind::BlindSpot),
            "{path:?}"
        );
        let frames: Vec<(&str, &str)> = path
            .frames()
            .iter()
            .map(|f| (&*f.service, &*f.name))
            .collect();
        for want in [
            ("shop", "POST /orders/{item}"),
            ("shop", "price"),
            ("inventory", "/shop.v1.Inventory/Reserve"),
            ("inventory", "look_up_stock"),
        ] {
            assert!(frames.contains(&want), "{want:?} not in {frames:?}");
        }
    }
}

#[test]
fn without_a_trust_secret_it_says_why_the_inventory_is_a_blind_spot() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &[("CPT_SAMPLE_RATE", "1")], 3);
    let log = stdout(&out);
    assert!(
        log.contains("calls to inventory send no caller secret"),
        "{log}"
    );
    assert!(
        log.contains("internal service inventory trusts no caller"),
        "{log}"
    );
    let records = records(dir.path());
    assert_eq!(records.len(), 3);
    assert!(records.iter().all(|r| {
        r.path
            .segments()
            .iter()
            .any(|s| s.kind == SegmentKind::BlindSpot)
    }));
}

#[test]
fn a_malformed_variable_stops_it_with_the_variable_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cpt-quickstart"))
        .arg("1")
        .current_dir(dir.path())
        .env("CPT_SAMPLE_RATE", "10%")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let log = stdout(&out);
    assert!(log.contains("CPT_SAMPLE_RATE=\"10%\""), "{log}");
}

#[test]
fn with_cpt_collector_endpoint_the_records_reach_that_endpoint() {
    use cpt_exporter::proto;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The HTTP ingest route as `cpt serve` answers it: a protobuf
    // `RecordBatch` in, 200 once it is taken.
    let (batches, received) = std::sync::mpsc::channel::<proto::RecordBatch>();
    let ingest = axum::Router::new().route(
        proto::HTTP_RECORDS_PATH,
        axum::routing::post(move |body: axum::body::Bytes| {
            let batches = batches.clone();
            async move {
                let batch = <proto::RecordBatch as prost::Message>::decode(body)
                    .expect("the exporter sends a RecordBatch");
                batches.send(batch).unwrap();
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, ingest).await });
    let out = run(
        dir.path(),
        &[
            ("CPT_SAMPLE_RATE", "1"),
            ("CPT_TRUST_SECRET", "dev-secret"),
            ("CPT_COLLECTOR_ENDPOINT", &endpoint),
        ],
        5,
    );
    assert!(
        stdout(&out).contains("5 records emitted, 5 exported, 0 failed"),
        "{}",
        stdout(&out)
    );
    let records: Vec<proto::Record> = received.try_iter().flat_map(|b| b.records).collect();
    assert_eq!(records.len(), 5);
    assert!(records.iter().all(|r| r.service == "shop"), "{records:?}");
    assert!(!dir.path().join("records.jsonl").exists());
}
