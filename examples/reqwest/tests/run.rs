//! The example as a user runs it: every request sampled, every record one
//! critical path across axum, actix-web and tonic that sums to its latency
//! (the binary checks that itself and fails otherwise).

use std::process::Command;

#[test]
fn every_quote_has_one_path_across_the_three_frameworks() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cpt-example-reqwest"));
    cmd.arg("10").current_dir(dir.path());
    for var in cpt_sdk::env::VARIABLES {
        cmd.env_remove(var);
    }
    let out = cmd.output().expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("10 requests; 10 records, 10 across front (axum), pricing (actix-web) and stock (tonic) summing to their latency; 10 exported"),
        "{stdout}\n{stderr}"
    );
    assert!(
        !stderr.contains("blind spot"),
        "no misconfiguration warning: {stderr}"
    );
    assert!(
        !stderr.contains("Build the client as"),
        "the reqwest chain is in the order cpt asks for: {stderr}"
    );
    let lines = std::fs::read_to_string(dir.path().join("records.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 10);
}
