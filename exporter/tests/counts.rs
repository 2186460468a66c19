//! What the client says and what it counts agree: the line that reports a
//! refused batch counts that batch among the "records refused in all", the
//! same number [`ClientStats::rejected_records`] and the SDK exporter's
//! `failed` (the quickstart's shutdown line) count; and two clients refuse to
//! share one spool directory.
#![cfg(feature = "client")]

use std::convert::Infallible;
use std::net::SocketAddr;

use cpt_exporter::spool::SpoolError;
use cpt_exporter::{CollectorClient, Endpoint};
use cpt_sdk::export::Export as _;
use cpt_sdk::testing::fixtures::fig2a_record;
use cpt_sdk::testing::log::LogBuffer;
use http_body_util::Full;
use hyper::body::Bytes;

/// An HTTP collector stand-in that answers every batch `401` (a wrong ingest
/// token: refused, not retried), on a thread of its own.
fn refusing_collector() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(
                        hyper::Response::builder()
                            .status(401)
                            .body(Full::new(Bytes::from_static(b"missing ingest token")))
                            .unwrap(),
                    )
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                );
            }
        });
    });
    addr
}

#[test]
fn the_refusal_line_counts_the_batch_it_reports_as_the_stats_do() {
    let addr = refusing_collector();
    let log = LogBuffer::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut client =
        CollectorClient::builder(Endpoint::parse(&format!("http://{addr}")).unwrap()).build();
    let batch: Vec<_> = (0..5).map(|_| fig2a_record()).collect();
    let result = client.export(&batch);
    assert!(
        result.is_err(),
        "a refused batch is an export error: the SDK counts its 5 records as failed"
    );
    assert_eq!(client.stats().rejected_records(), 5);
    let lines = log.lines_with("refused");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("refused 1 batch(es)") && lines[0].contains("(5 records refused in all)"),
        "the first line counts the batch it reports: {}",
        lines[0]
    );
}

#[test]
fn two_clients_on_one_spool_directory_the_second_is_refused_naming_the_directory_and_pid() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = || Endpoint::parse("http://127.0.0.1:1").unwrap();
    let first = CollectorClient::builder(endpoint())
        .with_spool(dir.path(), 1 << 20)
        .try_build()
        .expect("the first client opens the spool");
    let err = CollectorClient::builder(endpoint())
        .with_spool(dir.path(), 1 << 20)
        .try_build()
        .expect_err("a second client on the same directory is refused");
    assert!(
        matches!(&err, SpoolError::Locked { dir: d, pid: Some(p) } if d == dir.path() && *p == std::process::id()),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains(&dir.path().display().to_string()), "{text}");
    assert!(
        text.contains(&format!("pid {}", std::process::id())),
        "{text}"
    );
    assert!(text.contains("a spool directory of its own"), "{text}");
    // Once the first is gone, the directory is free again.
    drop(first);
    CollectorClient::builder(endpoint())
        .with_spool(dir.path(), 1 << 20)
        .try_build()
        .expect("the directory is free once its holder has closed it");
}
