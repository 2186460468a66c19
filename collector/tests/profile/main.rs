//! The aggregation commands end to end: `cpt profile`, `folded`, `flame`,
//! `histogram`, `diff`, `merge` on JSON Lines files.
#![cfg(feature = "cli")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cpt_collector::profile::read_aggregate;
use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
use cpt_sdk::record::Record;
use cpt_sdk::trigger::Trigger;

use cpt_sdk::testing::ms;

/// CPT Table 1's two requests (16 ms with A2 on the path, 8 ms with B1),
/// labelled arm=a / arm=b, plus a forced 100 ms request.
fn table1_records() -> Vec<Record> {
    let a1 = Frame::new("A", "A1").with_location("a/src/main.rs", 40);
    let mut p = CriticalPath::new();
    p.push_frames([a1.clone()], ms(3), SegmentKind::Busy);
    p.push_frames(
        [a1.clone(), Frame::new("A", "A2")],
        ms(10),
        SegmentKind::Busy,
    );
    p.push_frames([a1.clone()], ms(3), SegmentKind::Busy);
    let mut r1 = Record::new("A", Trigger::Sampled, p);
    r1.start_unix_nanos = Some(1_700_000_000_000_000_000);
    r1.labels.insert("arm".into(), "a".into());
    let mut p = CriticalPath::new();
    p.push_frames([a1.clone()], ms(2), SegmentKind::Busy);
    p.push_frames(
        [a1.clone(), Frame::new("B", "B1")],
        ms(4),
        SegmentKind::Busy,
    );
    p.push_frames([a1.clone()], ms(2), SegmentKind::Busy);
    let mut r2 = Record::new("A", Trigger::Sampled, p);
    r2.start_unix_nanos = Some(1_700_000_060_000_000_000);
    r2.labels.insert("arm".into(), "b".into());
    let mut p = CriticalPath::new();
    p.push_frames([a1], ms(100), SegmentKind::Busy);
    let forced = Record::new("A", Trigger::Forced, p);
    vec![r1, r2, forced]
}

fn write_jsonl(dir: &Path, name: &str, recs: &[Record], extra: &str) -> PathBuf {
    let mut text = String::new();
    for r in recs {
        text.push_str(&r.to_json());
        text.push('\n');
    }
    text.push_str(extra);
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn cpt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cpt"))
        .args(args)
        .output()
        .expect("run cpt")
}

fn ok(args: &[&str]) -> (String, String) {
    let out = cpt(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "cpt {args:?} failed: {stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

fn means(path: &Path) -> Vec<(String, u64)> {
    let agg = read_aggregate(&std::fs::read(path).unwrap()).unwrap();
    agg.stacks()
        .iter()
        .zip(agg.mean_nanos())
        .map(|(s, m)| (cpt_collector::aggregate::stack_label(&agg, s, "/"), m))
        .collect()
}

#[test]
fn cpt_table1_cli_profile_excludes_forced() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_jsonl(dir.path(), "r.jsonl", &table1_records(), "");
    let out = dir.path().join("p.pb.gz");
    let (_, stderr) = ok(&[
        "profile",
        "-o",
        out.to_str().unwrap(),
        input.to_str().unwrap(),
    ]);
    assert!(stderr.contains("go tool pprof -http=:"), "{stderr}");
    assert_eq!(
        means(&out),
        vec![
            ("A1 (A)".into(), 5_000_000),
            ("A1 (A)/A2 (A)".into(), 5_000_000),
            ("A1 (A)/B1 (B)".into(), 2_000_000),
        ]
    );
    // Asking for forced records brings the 100 ms one in.
    ok(&[
        "profile",
        "--trigger",
        "all",
        "-o",
        out.to_str().unwrap(),
        input.to_str().unwrap(),
    ]);
    let agg = read_aggregate(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!((agg.requests(), agg.mean_latency()), (3, ms(124) / 3));
}

#[test]
fn cli_selection_flags() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_jsonl(dir.path(), "r.jsonl", &table1_records(), "");
    let input = input.to_str().unwrap();
    #[rustfmt::skip]
    let cases: &[(&[&str], &str)] = &[
        (&["--label", "arm=b"], "A1 (A) 4000000\nA1 (A);B1 (B) 4000000\n"),
        (&["--percentile", "p50-p100"], "A1 (A) 6000000\nA1 (A);A2 (A) 10000000\n"),
        (&["--since", "2023-11-14T22:14:00Z"], "A1 (A) 4000000\nA1 (A);B1 (B) 4000000\n"),
        (&["--until", "1700000001s"], "A1 (A) 6000000\nA1 (A);A2 (A) 10000000\n"),
        (&["--service", "B"], ""),
        (&["--trigger", "forced"], "A1 (A) 100000000\n"),
    ];
    for (flags, want) in cases {
        let mut args = vec!["folded"];
        args.extend_from_slice(flags);
        args.push(input);
        let (stdout, _) = ok(&args);
        assert_eq!(stdout, *want, "{flags:?}");
    }
}

#[test]
fn cli_bad_selection_flags_are_named() {
    #[rustfmt::skip]
    let cases: &[(&[&str], &str)] = &[
        (&["--percentile", "p99-p9"], "lower bound must be below"),
        (&["--since", "last week"], "--since"),
        (&["--label", "arm"], "expected KEY=VALUE"),
        (&["--trigger", "sometimes"], "trigger \"sometimes\""),
    ];
    for (flags, want) in cases {
        let mut args = vec!["folded"];
        args.extend_from_slice(flags);
        args.push("x.jsonl");
        let out = cpt(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(want),
            "{flags:?}: {stderr}"
        );
    }
    let out = cpt(&["folded"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no input"));
}

#[test]
fn cli_bad_lines_skipped_with_file_line_or_fatal_with_strict() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_jsonl(
        dir.path(),
        "r.jsonl",
        &table1_records(),
        "{\"service\":\"A\"}\n\nnot json\n",
    );
    let input = input.to_str().unwrap();
    let (stdout, stderr) = ok(&["folded", input]);
    assert!(stdout.starts_with("A1 (A) 5000000\n"), "{stdout}");
    assert!(
        stderr.contains("r.jsonl:4: skipped: not a cpt record"),
        "{stderr}"
    );
    assert!(stderr.contains("r.jsonl:6: skipped"), "{stderr}");
    assert!(stderr.contains("skipped 2 bad lines"), "{stderr}");
    let out = cpt(&["folded", "--strict", input]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("r.jsonl:4:") && stderr.contains("--strict"),
        "{stderr}"
    );
    assert!(!stderr.contains("Stack backtrace"), "{stderr}");
}

#[test]
fn cpt_merge_cli_two_collectors() {
    let dir = tempfile::tempdir().unwrap();
    let recs = table1_records();
    let one = write_jsonl(dir.path(), "one.jsonl", &recs[..1], "");
    let two = write_jsonl(dir.path(), "two.jsonl", &recs[1..2], "");
    let (p1, p2, m) = (
        dir.path().join("1.pb.gz"),
        dir.path().join("2.pb.gz"),
        dir.path().join("m.pb.gz"),
    );
    ok(&["profile", "-o", p1.to_str().unwrap(), one.to_str().unwrap()]);
    ok(&["profile", "-o", p2.to_str().unwrap(), two.to_str().unwrap()]);
    let (_, stderr) = ok(&[
        "merge",
        p1.to_str().unwrap(),
        p2.to_str().unwrap(),
        "-o",
        m.to_str().unwrap(),
    ]);
    assert!(
        stderr.contains("2 requests, mean latency 12.00ms"),
        "{stderr}"
    );
    assert_eq!(
        means(&m),
        vec![
            ("A1 (A)".into(), 5_000_000),
            ("A1 (A)/A2 (A)".into(), 5_000_000),
            ("A1 (A)/B1 (B)".into(), 2_000_000),
        ]
    );
    // Profiles are accepted as inputs by the drawing commands too.
    let (folded, _) = ok(&["folded", m.to_str().unwrap()]);
    assert_eq!(
        folded,
        "A1 (A) 5000000\nA1 (A);A2 (A) 5000000\nA1 (A);B1 (B) 2000000\n"
    );
    let out = cpt(&["merge", one.to_str().unwrap(), "-o", m.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a profile written by cpt profile")
    );
}

#[test]
fn cli_flame_histogram_diff() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_jsonl(dir.path(), "r.jsonl", &table1_records(), "");
    let input = input.to_str().unwrap();
    let svg = dir.path().join("f.svg");
    ok(&["flame", "-o", svg.to_str().unwrap(), input]);
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.contains("<svg") && svg.contains("B1 (B)"));

    let (csv, _) = ok(&["histogram", "--format", "csv", input]);
    assert!(
        csv.starts_with("stack,mean_per_request_ns,on_path"),
        "{csv}"
    );
    assert!(
        csv.contains("A1 (A);A2 (A),5000000,1,0.500000,10000000,"),
        "{csv}"
    );

    let out_dir = dir.path().join("diff");
    let diff_svg = dir.path().join("diff.svg");
    let (report, stderr) = ok(&[
        "diff",
        "--base",
        "label=arm=a",
        "--test",
        "label=arm=b",
        "--all",
        "-o",
        out_dir.to_str().unwrap(),
        "--flame",
        diff_svg.to_str().unwrap(),
        input,
    ]);
    let diff_svg = std::fs::read_to_string(diff_svg).unwrap();
    assert!(
        diff_svg.contains("B1 (B)") && diff_svg.contains("cpt diff"),
        "no diff flame"
    );
    assert!(stderr.contains("go tool pprof -diff_base"), "{stderr}");
    assert!(
        report.contains("base: 1 request, mean latency 16.00ms"),
        "{report}"
    );
    assert!(
        report.contains("change in mean latency: -8.00ms"),
        "{report}"
    );
    assert!(
        report.contains("-10.00ms") && report.contains("A1 (A);A2 (A)"),
        "{report}"
    );
    assert!(out_dir.join("base.pb.gz").exists() && out_dir.join("test.pb.gz").exists());
    let out = cpt(&["diff", "--base", "colour=red", input]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown selection key \"colour\""));
}

#[test]
fn cli_profile_is_byte_identical_to_the_library_profile() {
    // What the demo writes in-process (Aggregate::from_records + encode_gzip)
    // and what `cpt profile` writes from the JSON Lines file are the same bytes.
    let recs = table1_records();
    let lib =
        cpt_collector::profile::encode_gzip(&cpt_collector::aggregate::Aggregate::from_records(
            &cpt_collector::selection::Selection::new(),
            &recs,
        ));
    let dir = tempfile::tempdir().unwrap();
    let input = write_jsonl(dir.path(), "r.jsonl", &recs, "");
    let out = dir.path().join("p.pb.gz");
    ok(&[
        "profile",
        "-o",
        out.to_str().unwrap(),
        input.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read(&out).unwrap(), lib);
}
