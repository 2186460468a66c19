//! The exporter as a service runs it: behind the SDK's `Exporter`, whose
//! worker thread runs under `NoSubscriber`, with the service's subscriber
//! installed globally. A wrong collector address must still reach the
//! service's log, at the first failed attempt, with the endpoint and what
//! to check. (A test binary of its own: it sets the global subscriber.)
#![cfg(feature = "client")]

use std::time::{Duration, Instant};

use cpt_exporter::{CollectorClient, Endpoint};
use cpt_sdk::export::Exporter;
use cpt_sdk::export::RecordSink as _;
use cpt_sdk::testing::log::LogBuffer;

#[test]
fn a_wrong_collector_address_reaches_the_services_log_within_two_seconds() {
    let log = LogBuffer::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::INFO)
        .init();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let client = CollectorClient::builder(Endpoint::parse(&format!("grpc://{addr}")).unwrap())
        .with_initial_backoff(Duration::from_millis(50))
        .with_max_attempts(3)
        .build();
    // The exporter as the quickstart builds it: its default batch interval.
    let (sink, handle) = Exporter::builder().build(client);
    let start = Instant::now();
    sink.emit(cpt_sdk::testing::fixtures::fig2a_record());
    let line = loop {
        if let Some(line) = log.lines_with("cannot deliver records").into_iter().next() {
            break line;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "nothing logged in 10 s: {:?}",
            log.text()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let waited = start.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "the first failure is logged within 2 s, not {waited:?}: {line}"
    );
    assert!(line.contains("WARN"), "{line}");
    assert!(
        line.contains(&addr.to_string()),
        "names the endpoint: {line}"
    );
    assert!(
        line.contains("CPT_COLLECTOR_ENDPOINT"),
        "and what to check: {line}"
    );
    assert!(
        line.contains("gRPC port"),
        "and which port it must be: {line}"
    );
    handle.shutdown_timeout(Duration::from_secs(5));
}
