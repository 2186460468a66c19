//! The example against `cpt serve --otlp-grpc` (in this process): the
//! records the live receiver stores are byte for byte those `cpt traces
//! convert --from otlp` makes of the same spans written to a file, and the
//! critical path is the known one: the longer of the two concurrent calls,
//! then the charge.

use std::time::{Duration, Instant};

use cpt_collector::serve::{Collector, OtlpConfig, ServeConfig};
use cpt_collector::store::{Store, StoreQuery};
use cpt_collector::traces::{Format, ImportOptions, import_files};

fn leaf_ms(r: &cpt_sdk::Record, operation: &str) -> f64 {
    let frames = r.path.frames();
    r.path
        .segments()
        .iter()
        .filter(|s| {
            s.stack
                .last()
                .is_some_and(|f| &*frames[f.0 as usize].name == operation)
        })
        .map(|s| s.duration.as_secs_f64() * 1e3)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_records_are_the_file_imports() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.db");
    let spans = dir.path().join("spans.jsonl");
    let collector = Collector::start(ServeConfig::new(&store).with_otlp(OtlpConfig {
        grpc: Some("127.0.0.1:0".parse().unwrap()),
        trace_wait: Duration::from_millis(300),
        ..OtlpConfig::default()
    }))
    .await
    .unwrap();
    let endpoint = format!("http://{}", collector.otlp_grpc_addr().unwrap());
    let requests = 4;
    cpt_example_otel::run(&endpoint, Some(&spans), requests)
        .await
        .unwrap();
    let read = || -> Vec<String> {
        let s = Store::open(&store).unwrap();
        let mut v: Vec<String> = s
            .query(&StoreQuery::default())
            .unwrap()
            .map(|r| r.unwrap().to_json())
            .collect();
        v.sort();
        v
    };
    let t0 = Instant::now();
    while read().len() < requests {
        assert!(t0.elapsed() < Duration::from_secs(30), "records not stored");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    collector.shutdown().await.unwrap();
    let live = read();
    let imported = import_files(&[spans], Format::Otlp, &ImportOptions::default(), &|_| {});
    let mut file: Vec<String> = imported.records().map(|r| r.to_json()).collect();
    file.sort();
    assert_eq!(live.len(), requests);
    assert_eq!(live, file, "the live records are the file import's");
    for r in imported.records() {
        assert_eq!(r.service, "shop");
        assert_eq!(r.endpoint.as_deref(), Some("POST /checkout"));
        // Reserving (25 ms) ran beside pricing (10 ms): it is on the path,
        // pricing is not; then the charge (30 ms).
        let (reserve, price, charge) = (
            leaf_ms(r, "reserve_stock"),
            leaf_ms(r, "price_cart"),
            leaf_ms(r, "charge_card"),
        );
        assert!((25.0..45.0).contains(&reserve), "reserve {reserve:.1} ms");
        assert!(price < 1.0, "price {price:.1} ms on the path");
        assert!((30.0..50.0).contains(&charge), "charge {charge:.1} ms");
    }
}
