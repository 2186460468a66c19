//! Interop with the real viewer: `go tool pprof` must read every profile cpt
//! writes (-top, -traces, -raw, -svg, -diff_base).
//!
//! Needs `go` (Debian `golang-go`) and, for -svg, graphviz's `dot`. When they
//! are missing the tests print a loud notice and pass, unless
//! `CPT_REQUIRE_PPROF=1` (set by `.ci/run`), where they fail.

use std::path::Path;
use std::process::Command;

use cpt_collector::aggregate::Aggregate;
use cpt_collector::profile::encode_gzip;
use cpt_collector::selection::Selection;
use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
use cpt_sdk::record::Record;
use cpt_sdk::trigger::Trigger;

use cpt_sdk::testing::ms;

/// Whether the tool is usable; if not, shout, and fail under CPT_REQUIRE_PPROF=1.
fn require(tool: &str, arg: &str, what: &str) -> bool {
    cpt_sdk::testing::tools::require(tool, arg, &format!("pprof interop test ({what})"))
}

/// Run `go tool pprof ARGS`, returning stdout; panics with stderr on failure.
fn pprof(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .current_dir(dir)
        .env("PPROF_TMPDIR", dir)
        .env("HOME", dir)
        .env("GOCACHE", dir.join("gocache"))
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("run go tool pprof");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed: {stderr}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// CPT Figure 1's system: A1 calls A2 and B1 in parallel; in request 1 A2 is
/// on the path (16 ms), in request 2 B1 (8 ms, with 1 ms network and C1
/// under B1). A third request (12 ms) goes through a blind spot.
fn fig1_records() -> Vec<Record> {
    let a1 = Frame::new("A", "A1").with_location("a/src/main.rs", 40);
    let a2 = Frame::new("A", "A2").with_location("a/src/a2.rs", 7);
    let b1 = Frame::new("B", "B1").with_location("b/src/lib.rs", 12);
    let c1 = Frame::new("C", "C1");
    let mut p = CriticalPath::new();
    p.push_frames([a1.clone()], ms(3), SegmentKind::Busy);
    p.push_frames([a1.clone(), a2.clone()], ms(10), SegmentKind::Busy);
    p.push_frames([a1.clone()], ms(3), SegmentKind::Busy);
    let r1 = Record::new("A", Trigger::Sampled, p);
    let mut p = CriticalPath::new();
    p.push_frames([a1.clone()], ms(2), SegmentKind::Busy);
    p.push_frames([a1.clone(), b1.clone()], ms(1), SegmentKind::Network);
    p.push_frames([a1.clone(), b1.clone(), c1], ms(3), SegmentKind::Busy);
    p.push_frames([a1.clone()], ms(2), SegmentKind::Busy);
    let r2 = Record::new("A", Trigger::Sampled, p);
    let mut p = CriticalPath::new();
    p.push_frames([a1.clone()], ms(4), SegmentKind::Busy);
    p.push_frames([a1.clone(), b1], ms(8), SegmentKind::BlindSpot);
    let r3 = Record::new("A", Trigger::Sampled, p);
    vec![r1, r2, r3]
}

fn write(dir: &Path, name: &str, recs: &[Record]) {
    let agg = Aggregate::from_records(&Selection::new(), recs);
    std::fs::write(dir.join(name), encode_gzip(&agg)).unwrap();
}

/// The value in milliseconds of the `-top` row naming `frame` (flat column).
fn top_flat_ms(top: &str, frame: &str) -> f64 {
    let line = top
        .lines()
        .find(|l| l.trim_end().ends_with(frame))
        .unwrap_or_else(|| panic!("no row for {frame} in\n{top}"));
    let flat = line.split_whitespace().next().unwrap();
    parse_ms(flat)
}

fn parse_ms(v: &str) -> f64 {
    if let Some(x) = v.strip_suffix("ms") {
        x.parse().unwrap()
    } else if let Some(x) = v.strip_suffix("us") {
        x.parse::<f64>().unwrap() / 1e3
    } else if let Some(x) = v.strip_suffix('s') {
        x.parse::<f64>().unwrap() * 1e3
    } else {
        v.parse::<f64>().unwrap() // "0"
    }
}

#[test]
fn pprof_top_shows_frames_and_mean_latency_total() {
    if !require("go", "version", "-top") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "p.pb.gz", &fig1_records());
    let top = pprof(dir.path(), &["-top", "-unit=ms", "p.pb.gz"]);
    // Mean latency (16 + 8 + 12) / 3 = 12 ms.
    assert!(top.contains("Type: critical_path"), "{top}");
    assert!(top.contains("of 12ms total"), "{top}");
    // A1 self: (6 + 4 + 4) / 3 = 4.67 ms; A2 10/3; C1 1; network 1/3; blind spot 8/3.
    let cases = [
        ("A1 (A)", 14.0 / 3.0),
        ("A2 (A)", 10.0 / 3.0),
        ("C1 (C)", 1.0),
        ("[network]", 1.0 / 3.0),
        ("[blind spot]", 8.0 / 3.0),
    ];
    for (frame, want) in cases {
        let got = top_flat_ms(&top, frame);
        assert!(
            (got - want).abs() < 0.01,
            "{frame}: {got} ms, want {want:.3}\n{top}"
        );
    }
    // The request-count sample type is there too.
    let top = pprof(dir.path(), &["-top", "-sample_index=requests", "p.pb.gz"]);
    assert!(top.contains("Type: requests"), "{top}");
    let comments = pprof(dir.path(), &["-comments", "p.pb.gz"]);
    assert!(comments.contains("cpt.requests=3"), "{comments}");
}

#[test]
fn pprof_traces_show_stacks_leaf_first() {
    if !require("go", "version", "-traces") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "p.pb.gz", &fig1_records());
    let traces = pprof(dir.path(), &["-traces", "p.pb.gz"]);
    // Leaf first, then its callers.
    let want = "[network]\n             B1 (B)\n             A1 (A)";
    assert!(traces.contains(want), "{traces}");
    assert!(
        traces.contains("C1 (C)\n             B1 (B)\n             A1 (A)"),
        "{traces}"
    );
}

#[test]
fn pprof_raw_shows_sample_types_and_source_locations() {
    if !require("go", "version", "-raw") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "p.pb.gz", &fig1_records());
    let raw = pprof(dir.path(), &["-raw", "p.pb.gz"]);
    assert!(
        raw.contains(
            "critical_path/nanoseconds[dflt] requests/count critical_path_sum/nanoseconds"
        ),
        "{raw}"
    );
    assert!(raw.contains("B1 (B) b/src/lib.rs:12"), "{raw}");
    assert!(raw.contains("A2 (A) a/src/a2.rs:7"), "{raw}");
    // Sum of the default sample type over samples = 12 ms (mean latency).
    let mut total = 0i64;
    let mut in_samples = false;
    for line in raw.lines() {
        if line.starts_with("Samples:") {
            in_samples = true;
            continue;
        }
        if line.starts_with("Locations") {
            break;
        }
        if in_samples && line.contains(':') && !line.contains('/') {
            total += line
                .split_whitespace()
                .next()
                .unwrap()
                .parse::<i64>()
                .unwrap();
        }
    }
    assert_eq!(total, 12_000_000, "{raw}");
}

#[test]
fn pprof_svg_renders_call_graph() {
    if !require("go", "version", "-svg") || !require("dot", "-V", "-svg (graphviz)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "p.pb.gz", &fig1_records());
    let svg = pprof(dir.path(), &["-svg", "p.pb.gz"]);
    assert!(svg.contains("<svg"), "{}", &svg[..svg.len().min(300)]);
    for frame in ["A1 (A)", "B1 (B)", "C1 (C)", "[blind spot]"] {
        assert!(svg.contains(frame), "svg lacks {frame}");
    }
}

#[test]
fn pprof_diff_base_shows_changes() {
    if !require("go", "version", "-diff_base") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recs = fig1_records();
    // CPT Table 1: base = request 1 (A2 on the path), test = request 2 (B1).
    write(dir.path(), "base.pb.gz", &recs[..1]);
    write(dir.path(), "test.pb.gz", &recs[1..2]);
    let top = pprof(
        dir.path(),
        &["-top", "-unit=ms", "-diff_base", "base.pb.gz", "test.pb.gz"],
    );
    // A2 10 ms → 0, C1 0 → 3 ms, A1 self 6 → 4 ms.
    let cases = [
        ("A2 (A)", -10.0),
        ("C1 (C)", 3.0),
        ("A1 (A)", -2.0),
        ("[network]", 1.0),
    ];
    for (frame, want) in cases {
        let got = top_flat_ms(&top, frame);
        assert!(
            (got - want).abs() < 0.01,
            "{frame}: {got} ms, want {want}\n{top}"
        );
    }
}
