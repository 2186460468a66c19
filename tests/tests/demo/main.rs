//! The Figure 1 demo end to end:
//! services A, B and C, records shipped through the SDK exporter and the
//! collector client to an in-process `cpt serve`, `DIR/records.jsonl`
//! beside it, and `DIR/profile.pb.gz`, which `cpt profile` reproduces byte
//! for byte from the file and from the store.
//!
//! One small demo run (shared by the tests) keeps this to a few seconds.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use clap::Parser as _;
use cpt_collector::profile;
use cpt_collector::selection::{Selection, TriggerFilter};
use cpt_collector::store::Store;
use cpt_examples::demo::{self, CollectorMode, DemoConfig, DemoReport};
use cpt_sdk::Trigger;

struct Run {
    dir: tempfile::TempDir,
    report: DemoReport,
    /// Files in the output directory right after the demo, before any test
    /// opened the store.
    files: BTreeSet<String>,
}

/// The demo with every request sampled (so every service shows up in a
/// small run) and a few forced ones, into a temporary directory.
fn demo_run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temp dir");
        let config = DemoConfig::new(dir.path())
            .with_requests(60)
            .with_sample_rate(1.0)
            .with_forced(4)
            .with_flush_timeout(Duration::from_secs(10));
        let report = demo::run(&config).expect("the demo runs");
        let files = std::fs::read_dir(dir.path())
            .expect("the output directory")
            .map(|e| e.expect("a directory entry").file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect();
        Run { dir, report, files }
    })
}

fn out(name: &str) -> PathBuf {
    demo_run().dir.path().join(name)
}

fn line_count(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .count() as u64
}

#[test]
fn demo_fig1_store_holds_every_record_of_records_jsonl() {
    let r = &demo_run().report;
    let lines = line_count(&out("records.jsonl"));
    assert_eq!(r.records_path, out("records.jsonl"));
    assert_eq!(lines, 60, "every request is traced, one record each");
    assert_eq!(r.file_records, lines);
    assert_eq!(r.emitted, lines, "the SDK emitted what the file holds");
    assert_eq!(r.forced_records, 4);
    assert_eq!(r.failed_requests, 0);
    // The store was closed cleanly: no WAL files left beside it.
    let files = &demo_run().files;
    assert!(files.contains("store.db"), "{files:?}");
    assert!(
        !files.contains("store.db-wal") && !files.contains("store.db-shm"),
        "WAL files left behind: {files:?}"
    );

    // Counted here independently of the demo's own check.
    let store = Store::open_read_only(out("store.db")).unwrap();
    assert_eq!(store.len().unwrap(), lines, "store count == file count");
    assert_eq!(r.store_records, Some(lines));
    let e = r.export.expect("shipped to the in-process collector");
    assert_eq!((e.exported, e.dropped, e.failed), (lines, 0, 0));

    // The same records, not just as many: request ids match.
    let ids = |records: Vec<cpt_sdk::Record>| -> BTreeSet<Option<String>> {
        records.into_iter().map(|r| r.request_id).collect()
    };
    let stored: Vec<_> = store
        .records(&Selection::new().with_triggers(TriggerFilter::All))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let file = demo::read_records(&out("records.jsonl")).unwrap();
    assert_eq!(ids(stored), ids(file));
}

#[test]
fn demo_fig1_profile_names_frames_of_services_a_b_c() {
    let r = &demo_run().report;
    let p = profile::decode(&std::fs::read(&r.profile_path).unwrap()).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    // Forced records are left out of the profile.
    assert_eq!(r.profile_requests, 56);
    assert!(
        p.comment
            .iter()
            .any(|&c| s(c) == format!("{}56", profile::REQUESTS_COMMENT))
    );
    assert!(!p.sample.is_empty());
    let name_of_location = |id: u64| {
        let loc = p.location.iter().find(|l| l.id == id).unwrap();
        let f = p
            .function
            .iter()
            .find(|f| f.id == loc.line[0].function_id)
            .unwrap();
        s(f.name).to_owned()
    };
    let mut services = BTreeSet::new();
    for sample in &p.sample {
        for &id in &sample.location_id {
            let name = name_of_location(id);
            for svc in ["A", "B", "C"] {
                if name.ends_with(&format!("({svc})")) {
                    services.insert(svc);
                }
            }
        }
    }
    assert_eq!(services, BTreeSet::from(["A", "B", "C"]));
    // Leaves of each service's own work are on the path.
    let leaves: BTreeSet<String> = p
        .sample
        .iter()
        .map(|s| name_of_location(s.location_id[0]))
        .collect();
    for leaf in ["A1 (A)", "B1 (B)", "C1 (C)"] {
        assert!(leaves.contains(leaf), "{leaf} is a leaf: {leaves:?}");
    }
    // The profile's total is the mean latency of the sampled records.
    let sampled: Vec<_> = demo::read_records(&out("records.jsonl"))
        .unwrap()
        .into_iter()
        .filter(|r| r.trigger == Trigger::Sampled)
        .collect();
    let mean = sampled.iter().map(|r| r.latency.as_nanos()).sum::<u128>() / sampled.len() as u128;
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert!(
        (total as i128 - mean as i128).abs() <= 1,
        "profile total {total} ns vs mean latency {mean} ns"
    );
}

fn cpt(args: &[&str]) {
    let cli =
        cpt_collector::cli::Cli::try_parse_from(std::iter::once("cpt").chain(args.iter().copied()))
            .unwrap();
    cpt_collector::cli::run(cli).unwrap();
}

#[test]
fn demo_fig1_cpt_profile_of_records_jsonl_is_the_demo_profile() {
    let r = &demo_run().report;
    let demo_bytes = std::fs::read(&r.profile_path).unwrap();
    let from_file = out("from-file.pb.gz");
    cpt(&[
        "profile",
        "-o",
        from_file.to_str().unwrap(),
        r.records_path.to_str().unwrap(),
    ]);
    assert!(
        std::fs::read(&from_file).unwrap() == demo_bytes,
        "`cpt profile -o OUT DIR/records.jsonl` differs from DIR/profile.pb.gz"
    );
    let from_store = out("from-store.pb.gz");
    cpt(&[
        "profile",
        "--store",
        out("store.db").to_str().unwrap(),
        "-o",
        from_store.to_str().unwrap(),
    ]);
    assert!(
        std::fs::read(&from_store).unwrap() == demo_bytes,
        "`cpt profile --store DIR/store.db` differs from DIR/profile.pb.gz"
    );
}

#[test]
fn demo_fig1_unreachable_collector_fails_fast_and_counts_every_record() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on: bind one, then let it go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = DemoConfig::new(dir.path())
        .with_requests(20)
        .with_sample_rate(1.0)
        .with_forced(0)
        .with_collector(CollectorMode::External(format!("grpc://127.0.0.1:{port}")))
        .with_flush_timeout(Duration::from_secs(10));
    let t = std::time::Instant::now();
    let err = demo::run(&config)
        .expect_err("nothing was stored")
        .to_string();
    assert!(
        err.contains("acknowledged 0 records") && err.contains("20 failed"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // The file still has every record.
    assert_eq!(line_count(&dir.path().join("records.jsonl")), 20);
}

/// The pprof interop check on the demo's own profile: `go tool pprof` reads
/// it (`-top`, `-traces`, `-raw`, `-svg`), names frames of all three
/// services, and its total is the mean latency of the sampled requests.
/// Without `go` this prints a loud notice and passes, except under
/// `CPT_REQUIRE_PPROF=1` (set by `.ci/run`), where it fails.
#[test]
fn demo_fig1_go_tool_pprof_reads_the_demo_profile() {
    if !cpt_sdk::testing::tools::require(
        "go",
        "version",
        "pprof interop check of the demo's profile",
    ) {
        return;
    }
    let r = &demo_run().report;
    let dir = demo_run().dir.path();
    let pprof = |args: &[&str]| -> String {
        let out = std::process::Command::new("go")
            .args(["tool", "pprof"])
            .args(args)
            .arg(&r.profile_path)
            .env("PPROF_TMPDIR", dir)
            .env("HOME", dir)
            .env("GOCACHE", dir.join("gocache"))
            .output()
            .expect("run go tool pprof");
        assert!(
            out.status.success(),
            "go tool pprof {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    let top = pprof(&["-top", "-unit=ms"]);
    assert!(top.contains("Type: critical_path"), "{top}");
    for frame in ["A1 (A)", "A2 (A)", "B1 (B)", "C1 (C)"] {
        assert!(
            top.lines().any(|l| l.trim_end().ends_with(frame)),
            "no -top row for {frame}:\n{top}"
        );
    }
    // "Showing nodes accounting for X, Y% of Z total": Z is the mean latency.
    let total_ms: f64 = top
        .split(" of ")
        .nth(1)
        .and_then(|rest| rest.split("ms total").next())
        .and_then(|z| z.trim().parse().ok())
        .unwrap_or_else(|| panic!("no total in\n{top}"));
    let sampled: Vec<_> = demo::read_records(&out("records.jsonl"))
        .unwrap()
        .into_iter()
        .filter(|r| r.trigger == Trigger::Sampled)
        .collect();
    let mean_ms =
        sampled.iter().map(|r| r.latency.as_secs_f64()).sum::<f64>() * 1e3 / sampled.len() as f64;
    assert!(
        (total_ms - mean_ms).abs() <= 0.01 * mean_ms + 0.01,
        "pprof total {total_ms} ms vs mean latency {mean_ms} ms\n{top}"
    );

    let traces = pprof(&["-traces"]);
    assert!(
        traces.contains("B1 (B)") && traces.contains("C1 (C)"),
        "{traces}"
    );
    let raw = pprof(&["-raw"]);
    assert!(raw.contains("critical_path/nanoseconds"), "{raw}");
    assert!(
        raw.contains("examples/src/system.rs"),
        "source locations: {raw}"
    );
    let has_dot = std::process::Command::new("dot")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if has_dot || std::env::var("CPT_REQUIRE_PPROF").as_deref() == Ok("1") {
        let svg = pprof(&["-svg"]);
        assert!(svg.contains("<svg") && svg.contains("C1 (C)"), "no SVG");
    }
}
