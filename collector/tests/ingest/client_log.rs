//! A misconfigured record shipper is loud, once: the first failure to reach
//! the collector is logged at once with the address and the error, further
//! ones are summarised (rate-limited), a refusal says what was refused, and
//! the collector answering again is said too.

use std::time::Duration;

use cpt_exporter::client::{CollectorClient, Endpoint, SendError};
use cpt_sdk::testing::log::LogBuffer;

use crate::client::start_scripted;
use crate::support::*;

/// Everything the client logs while `f` runs on this thread.
fn logged(f: impl FnOnce()) -> String {
    let log = LogBuffer::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    log.text()
}

/// An address nothing listens on.
fn closed_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}")
}

#[test]
fn a_wrong_collector_address_is_logged_once_with_the_address_and_the_error() {
    let url = closed_port();
    let mut client = CollectorClient::builder(Endpoint::parse(&url).unwrap())
        .with_initial_backoff(Duration::from_millis(5))
        .with_max_attempts(4)
        .build();
    let log = logged(|| {
        let e = client.send(&records("lost", 3)).unwrap_err();
        assert!(matches!(e, SendError::GaveUp { attempts: 4, .. }), "{e}");
    });
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "four failed attempts, one line:\n{log}");
    let w = warnings[0];
    assert!(w.contains("cannot deliver records to the collector"), "{w}");
    assert!(w.contains(&url), "the line names the address: {w}");
    assert!(
        w.contains("cannot reach the collector"),
        "and the error: {w}"
    );
    assert!(
        w.contains("CPT_COLLECTOR_ENDPOINT"),
        "and what to check: {w}"
    );
}

#[test]
fn a_refused_batch_is_logged_with_the_collectors_answer() {
    let (_rt, _script, url) = start_scripted(&[401]);
    let mut client = CollectorClient::builder(Endpoint::parse(&url).unwrap()).build();
    let log = logged(|| {
        assert!(matches!(
            client.send(&records("refused", 2)),
            Err(SendError::Rejected { .. })
        ));
    });
    assert!(log.contains("refused 1 batch(es)"), "{log}");
    assert!(log.contains("401"), "{log}");
    assert!(log.contains("ingest token"), "{log}");
}

#[test]
fn the_collector_answering_again_is_logged() {
    let (_rt, _script, url) = start_scripted(&[503]);
    let mut client = CollectorClient::builder(Endpoint::parse(&url).unwrap())
        .with_initial_backoff(Duration::from_millis(5))
        .build();
    let log = logged(|| client.send(&records("back", 2)).unwrap());
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(
        lines[0].contains("WARN") && lines[0].contains("503"),
        "{log}"
    );
    assert!(
        lines[1].contains("INFO") && lines[1].contains("answers again"),
        "{log}"
    );
}

#[test]
fn client_stats_debug_prints_the_counters_plainly() {
    let (_rt, _script, url) = start_scripted(&[]);
    let mut client = CollectorClient::builder(Endpoint::parse(&url).unwrap()).build();
    client.send(&records("shown", 3)).unwrap();
    let shown = format!("{:?}", client.stats());
    assert!(shown.starts_with("ClientStats {"), "{shown}");
    assert!(shown.contains("exported_records: 3"), "{shown}");
    assert!(shown.contains("last_error: None"), "{shown}");
    assert!(
        !shown.contains("Mutex") && !shown.contains("Arc"),
        "{shown}"
    );
}

#[test]
fn a_grpc_endpoint_at_the_collectors_http_port_says_so_and_names_both_ports() {
    let c = crate::support::TestCollector::start(|c| c);
    let url = format!("grpc://{}", c.http());
    let mut client = CollectorClient::builder(Endpoint::parse(&url).unwrap()).build();
    let log = logged(|| {
        let e = client.send(&records("wrong-port", 2)).unwrap_err();
        assert!(matches!(e, SendError::Rejected { .. }), "{e}");
    });
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "{log}");
    let w = warnings[0];
    assert!(w.contains(&c.http().to_string()), "names the address: {w}");
    assert!(w.contains("HTTP port"), "says it is the HTTP port: {w}");
    assert!(
        w.contains("--grpc port (127.0.0.1:7070") && w.contains("--http port (127.0.0.1:7071"),
        "names both ports: {w}"
    );
    assert!(w.contains(&format!("http://{}", c.http())), "{w}");
    assert!(c.stored().is_empty());
}
