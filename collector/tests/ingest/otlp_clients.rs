//! Real OpenTelemetry clients against `cpt serve`: the Python SDK with its
//! stock OTLP/gRPC and OTLP/HTTP exporters (`tests/otel/services.py`, in
//! the virtual environment `.ci/run` makes). The records and the profile
//! the live receiver makes are byte for byte those `cpt traces convert
//! --from otlp` makes of the same spans written to a file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cpt_sdk::Record;

use crate::support::*;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The Python of the OpenTelemetry SDK's virtual environment:
/// `CPT_OTEL_PYTHON`, else the workspace's `.venv-otel`. `None` (the test
/// skips) when there is none, unless `CPT_REQUIRE_OTEL` is set (CI).
fn otel_python() -> Option<PathBuf> {
    let python = std::env::var_os("CPT_OTEL_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv-otel/bin/python"));
    let ok = Command::new(&python)
        .args(["-c", "import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.grpc, opentelemetry.exporter.otlp.proto.http"])
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(python);
    }
    assert!(
        std::env::var_os("CPT_REQUIRE_OTEL").is_none(),
        "CPT_REQUIRE_OTEL is set but {} has no OpenTelemetry SDK (see .ci/run)",
        python.display()
    );
    eprintln!(
        "skipped: no OpenTelemetry SDK at {} (see .ci/run)",
        python.display()
    );
    None
}

fn cpt(args: &[&std::ffi::OsStr]) {
    let out = Command::new(env!("CARGO_BIN_EXE_cpt"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cpt {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Time on the path per leaf operation, in ms.
fn leaf_ms(r: &Record, operation: &str) -> f64 {
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

#[test]
fn otlp_python_sdk_over_grpc_and_http_makes_the_file_imports_profile() {
    let Some(python) = otel_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.db");
    let spans = dir.path().join("spans.jsonl");
    let served = serve_child(
        &store,
        false,
        &[
            "--otlp-grpc".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--otlp-http".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--otlp-trace-wait".as_ref(),
            "500ms".as_ref(),
        ],
    );
    let grpc = otlp_addr(&served, "otlp-grpc");
    let http = otlp_addr(&served, "otlp-http");
    let requests = 5;
    let status = Command::new(&python)
        .arg(workspace().join("tests/otel/services.py"))
        .args(["--grpc", &grpc.to_string()])
        .args(["--http", &format!("http://{http}")])
        .arg("--spans-file")
        .arg(&spans)
        .args(["--requests", &requests.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let t0 = Instant::now();
    while stored(&store).len() < requests {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "records not stored within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(600));
    kill_9(served);
    let live = stored(&store);
    assert_eq!(live.len(), requests, "one record per request, no more");

    // The same spans from the file.
    let converted = dir.path().join("converted.jsonl");
    cpt(&[
        "traces".as_ref(),
        "convert".as_ref(),
        "--from".as_ref(),
        "otlp".as_ref(),
        "-q".as_ref(),
        spans.as_os_str(),
        "-o".as_ref(),
        converted.as_os_str(),
    ]);
    let mut file: Vec<String> = std::fs::read_to_string(&converted)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let mut got: Vec<String> = live.iter().map(Record::to_json).collect();
    file.sort();
    got.sort();
    assert_eq!(got, file, "the live records are the file import's");

    let (from_store, from_file) = (dir.path().join("live.pb.gz"), dir.path().join("file.pb.gz"));
    cpt(&[
        "profile".as_ref(),
        "--store".as_ref(),
        store.as_os_str(),
        "--service".as_ref(),
        "frontend".as_ref(),
        "-o".as_ref(),
        from_store.as_os_str(),
    ]);
    cpt(&[
        "profile".as_ref(),
        converted.as_os_str(),
        "--service".as_ref(),
        "frontend".as_ref(),
        "-o".as_ref(),
        from_file.as_os_str(),
    ]);
    assert_eq!(
        std::fs::read(&from_store).unwrap(),
        std::fs::read(&from_file).unwrap(),
        "the live profile is byte for byte the file import's"
    );

    // The paths: the known sleeps, on the services that slept.
    for r in &live {
        assert_eq!(r.service, "frontend");
        assert_eq!(r.endpoint.as_deref(), Some("GET /checkout"));
        assert!(r.latency >= Duration::from_millis(95), "{:?}", r.latency);
        for (op, ms) in [
            ("GET /cart", 30.0),
            ("SELECT account", 40.0),
            ("render", 15.0),
        ] {
            let on = leaf_ms(r, op);
            assert!(
                on >= ms && on < ms + 25.0,
                "{op}: {on:.1} ms on the path, slept {ms} ms"
            );
        }
    }
}

/// The address `cpt serve` printed for `what` (`otlp-grpc`, `otlp-http`).
pub(crate) fn otlp_addr(served: &Served, what: &str) -> std::net::SocketAddr {
    let prefix = format!("cpt serve: {what} listening on ");
    served
        .log
        .iter()
        .find_map(|l| l.strip_prefix(&prefix)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {what} address in {:?}", served.log))
}
