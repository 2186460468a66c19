//! `cpt serve` stops promptly: on SIGTERM or SIGINT it commits what it
//! acknowledged, closes connections that are idle (an exporter's connection
//! whose client runtime is not polled never answers an HTTP/2 `GOAWAY`) and
//! exits, instead of waiting out their idle timeout.

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use cpt_exporter::client::{CollectorClient, Endpoint};

use crate::support::*;

fn stop_with(signal: &str) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.db");
    // An idle timeout far beyond the wait below: only a prompt close passes.
    let mut served = serve_child(
        &store,
        true,
        &[OsStr::new("--idle-timeout"), OsStr::new("300s")],
    );
    let grpc = format!("grpc://{}", served.grpc.unwrap());
    let http = format!("http://{}", served.http);
    let mut grpc_client = CollectorClient::builder(Endpoint::parse(&grpc).unwrap()).build();
    let mut http_client = CollectorClient::builder(Endpoint::parse(&http).unwrap()).build();
    grpc_client.send(&records("over-grpc", 5)).unwrap();
    http_client.send(&records("over-http", 3)).unwrap();
    // Both clients now hold an open, idle connection that nothing polls.

    let start = Instant::now();
    let pid = served.child.id().to_string();
    let killed = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = loop {
        if let Some(status) = served.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "cpt serve still running 60 s after SIG{signal}"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = start.elapsed();
    assert!(status.success(), "SIG{signal}: {status}");
    assert!(
        took < Duration::from_secs(2),
        "SIG{signal} with two idle exporter connections took {took:?} to exit"
    );
    assert_eq!(
        stored(&store).len(),
        8,
        "every acknowledged record is stored"
    );
    drop((grpc_client, http_client));
}

#[test]
fn cpt_serve_exits_within_two_seconds_of_sigterm_with_idle_exporter_connections() {
    stop_with("TERM");
}

#[test]
fn cpt_serve_exits_within_two_seconds_of_ctrl_c_with_idle_exporter_connections() {
    stop_with("INT");
}
