//! TLS end to end: `cpt serve --tls-cert/--tls-key` on both ports, the
//! exporter's `grpcs://` and `https://` endpoints and the CLI's `https://`
//! URLs, with a certificate generated at test time (rcgen).

use std::path::{Path, PathBuf};
use std::process::Command;

use cpt_exporter::client::{CollectorClient, Endpoint};
use cpt_sdk::Trigger;

use crate::support::{TestCollector, http_with_headers, record, records};

/// A self-signed certificate for `localhost` and 127.0.0.1, its key, and a
/// second, unrelated certificate (a CA the collector's is not signed by).
struct Certs {
    _dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
    other: PathBuf,
}

fn certs() -> Certs {
    let dir = tempfile::tempdir().unwrap();
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let ck = rcgen::generate_simple_self_signed(names.clone()).unwrap();
    let other = rcgen::generate_simple_self_signed(names).unwrap();
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    Certs {
        cert: write("cert.pem", ck.cert.pem()),
        key: write("key.pem", ck.key_pair.serialize_pem()),
        other: write("other.pem", other.cert.pem()),
        _dir: dir,
    }
}

fn client(endpoint: &str, ca: &Path) -> CollectorClient {
    CollectorClient::builder(Endpoint::parse(endpoint).unwrap())
        .with_token("tls-ingest")
        .unwrap()
        .with_ca_file(ca)
        .unwrap()
        .with_max_attempts(2)
        .build()
}

#[test]
fn the_collector_and_the_exporter_talk_over_tls() {
    let certs = certs();
    let c = TestCollector::start(|c| {
        c.with_tls(&certs.cert, &certs.key)
            .with_ingest_token("tls-ingest")
            .with_read_token("tls-read")
    });
    let (grpc, http) = (c.grpc().port(), c.http().port());

    // gRPC over TLS, then HTTPS, each trusting the collector's certificate.
    let mut over_grpc = client(&format!("grpcs://localhost:{grpc}"), &certs.cert);
    over_grpc.send(&records("grpcs", 4)).expect("grpcs export");
    let mut over_https = client(&format!("https://127.0.0.1:{http}"), &certs.cert);
    let mut forced = record("https", 0);
    forced.trigger = Trigger::Forced;
    forced.request_id = Some("tls-req-1".into());
    over_https.send(&[forced]).expect("https export");
    assert_eq!(c.stats().accepted_records, 5);

    // A client trusting another CA is refused by TLS, and nothing is sent.
    let mut wrong_ca = client(&format!("grpcs://localhost:{grpc}"), &certs.other);
    assert!(wrong_ca.send(&records("untrusted", 1)).is_err());
    assert_eq!(c.stats().accepted_records, 5);

    // Plaintext HTTP to the TLS port gets no HTTP answer.
    let plain = http_with_headers(c.http(), "GET", "/healthz", &[], b"");
    assert!(
        plain.map_or(true, |r| r.status != 200),
        "the TLS port answered plaintext"
    );

    // The CLI reads over HTTPS with --ca-file and the read token.
    let url = format!("https://localhost:{http}");
    let show = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cpt"))
            .args(["show", "--collector", &url, "--request-id", "tls-req-1"])
            .args(["--read-token-file", "/dev/null"])
            .args(extra)
            .env("CPT_READ_TOKEN", "tls-read")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // (An empty --read-token-file is refused: the token comes from the env.)
    let (ok, _, err) = show(&["--ca-file", certs.cert.to_str().unwrap()]);
    assert!(!ok && err.contains("empty"), "{err}");
    let cli = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cpt"))
            .args(["show", "--collector", &url, "--request-id", "tls-req-1"])
            .args(extra)
            .env("CPT_READ_TOKEN", "tls-read")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = cli(&["--ca-file", certs.cert.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("tls-req-1"), "{out}");
    let (ok, _, err) = cli(&["--ca-file", certs.other.to_str().unwrap()]);
    assert!(!ok, "a collector outside --ca-file was trusted");
    assert!(err.contains("TLS"), "{err}");
}

#[test]
fn a_bad_certificate_or_key_fails_the_start_saying_which() {
    let certs = certs();
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let start = |cert: &Path, key: &Path| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let config = cpt_collector::serve::ServeConfig::new(dir.path().join("s.db"))
            .with_http("127.0.0.1:0".parse().unwrap())
            .with_tls(cert, key);
        rt.block_on(cpt_collector::serve::Collector::start(config))
            .map(drop)
            .unwrap_err()
            .to_string()
    };
    let err = start(&empty, &certs.key);
    assert!(
        err.contains("--tls-cert") && err.contains("no CERTIFICATE"),
        "{err}"
    );
    let err = start(&certs.cert, &empty);
    assert!(err.contains("--tls-key"), "{err}");
    // A key that is not the certificate's.
    let other_key = dir.path().join("other-key.pem");
    std::fs::write(
        &other_key,
        rcgen::KeyPair::generate().unwrap().serialize_pem(),
    )
    .unwrap();
    let err = start(&certs.cert, &other_key);
    assert!(err.contains("--tls-cert"), "{err}");
}
