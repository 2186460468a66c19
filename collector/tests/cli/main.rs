//! The `cpt` command line on bad or surprising input: what a new user met
//!, each run against the built binary.
#![cfg(feature = "cli")]

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use cpt_collector::profile::read_aggregate;
use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
use cpt_sdk::record::Record;
use cpt_sdk::trigger::Trigger;

/// A sampled record of `service` whose path is one segment per stack.
fn record(service: &str, stacks: &[&[(&str, &str)]], labels: &[(&str, &str)]) -> Record {
    let mut p = CriticalPath::new();
    for stack in stacks {
        p.push_frames(
            stack.iter().map(|(s, n)| Frame::new(*s, *n)),
            Duration::from_millis(2),
            SegmentKind::Busy,
        );
    }
    let mut r = Record::new(service, Trigger::Sampled, p);
    for (k, v) in labels {
        r.labels.insert((*k).into(), (*v).into());
    }
    r
}

fn entry(arm: &str) -> Record {
    record(
        "A",
        &[&[("A", "a1")], &[("A", "a1"), ("A", "a2")]],
        &[("arm", arm)],
    )
}

fn jsonl(recs: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in recs {
        out.extend_from_slice(r.to_json().as_bytes());
        out.push(b'\n');
    }
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn cpt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cpt"))
        .args(args)
        .output()
        .expect("run cpt")
}

/// Run, expecting `success`; return stdout and stderr.
fn run(args: &[&str], success: bool) -> (String, String) {
    let out = cpt(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.success(),
        success,
        "cpt {args:?}: status {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    (stdout, stderr)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn requests(profile: &Path) -> u64 {
    read_aggregate(&std::fs::read(profile).unwrap())
        .unwrap()
        .requests()
}

#[test]
fn profile_skips_a_non_utf8_line_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = jsonl(&[entry("a")]);
    bytes.extend_from_slice(b"\xff\xfe not text\n");
    bytes.extend_from_slice(&jsonl(&[entry("b")]));
    let input = write(dir.path(), "bad.jsonl", &bytes);
    let out = dir.path().join("p.pb.gz");
    let (_, stderr) = run(&["profile", "-o", s(&out), s(&input)], true);
    assert!(
        stderr.contains("bad.jsonl:2: skipped: not UTF-8"),
        "{stderr}"
    );
    assert!(stderr.contains("skipped 1 bad line "), "{stderr}");
    assert_eq!(requests(&out), 2);
    // Same reader, same behaviour in `cpt import`; --strict fails on it.
    let db = dir.path().join("s.db");
    let (_, stderr) = run(&["import", "--store", s(&db), s(&input)], true);
    assert!(
        stderr.contains("bad.jsonl:2: skipped: not UTF-8"),
        "{stderr}"
    );
    let (_, stderr) = run(&["profile", "--strict", "-o", s(&out), s(&input)], false);
    assert!(stderr.contains("bad.jsonl:2: not UTF-8"), "{stderr}");
}

/// The complete lines a truncated gzip stream decodes to before it breaks.
fn complete_lines_before_the_cut(gz: &[u8]) -> usize {
    let mut text = Vec::new();
    let mut d = flate2::read::GzDecoder::new(gz);
    let mut buf = [0u8; 512];
    loop {
        match d.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
        }
    }
    text.iter().filter(|&&b| b == b'\n').count()
}

#[test]
fn truncated_gzip_keeps_complete_records_and_warns() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<Record> = (0..2000)
        .map(|i| entry(if i % 2 == 0 { "a" } else { "b" }))
        .collect();
    let gz = gzip(&jsonl(&recs));
    let cut = &gz[..gz.len() / 2];
    let kept = complete_lines_before_the_cut(cut);
    assert!(kept > 0 && kept < 2000, "{kept}");
    // Gzip is recognised by content: the name says nothing.
    let input = write(dir.path(), "records.jsonl", cut);
    let out = dir.path().join("p.pb.gz");
    let (_, stderr) = run(&["profile", "-o", s(&out), s(&input)], true);
    assert!(
        stderr.contains(&format!(
            "records.jsonl: the gzip stream breaks off after line {kept}"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("kept the records before it"), "{stderr}");
    assert_eq!(requests(&out), kept as u64);
    let (_, stderr) = run(&["profile", "--strict", "-o", s(&out), s(&input)], false);
    assert!(
        stderr.contains("the gzip stream breaks off") && stderr.contains("(--strict)"),
        "{stderr}"
    );
    // `cpt import` keeps the same records.
    let db = dir.path().join("s.db");
    let (_, stderr) = run(&["import", "--store", s(&db), s(&input)], true);
    assert!(
        stderr.contains(&format!("imported {kept} records")),
        "{stderr}"
    );
}

const JAEGER: &str = r#"{"data":[{"traceID":"t1","spans":[
 {"traceID":"t1","spanID":"s1","operationName":"op","references":[],
  "startTime":1000,"duration":100,"processID":"p1","tags":[]}],
 "processes":{"p1":{"serviceName":"S","tags":[]}}}]}"#;

#[test]
fn traces_convert_counts_a_missing_file_as_a_failed_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nonexistent.json");
    let out = dir.path().join("out.jsonl");
    let (_, stderr) = run(
        &[
            "traces",
            "convert",
            "--from",
            "jaeger",
            "-o",
            s(&out),
            s(&missing),
        ],
        false,
    );
    assert!(
        stderr.contains(&format!(
            "cannot open {}: No such file or directory",
            missing.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("1 file (1 unreadable), 0 traces (0 rejected)"),
        "{stderr}"
    );
    assert!(!stderr.contains("unreadable JSON"), "{stderr}");
    assert!(!stderr.contains("rejected: "), "{stderr}");
    assert!(stderr.contains("the file could not be read"), "{stderr}");
    // With a good file next to it: one trace read, one file failed.
    let good = write(dir.path(), "t.json", JAEGER.as_bytes());
    let (_, stderr) = run(
        &[
            "traces",
            "convert",
            "--from",
            "jaeger",
            "-o",
            s(&out),
            s(&good),
            s(&missing),
        ],
        true,
    );
    assert!(
        stderr.contains("2 files (1 unreadable), 1 trace (0 rejected)"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 1);
}

/// `cpt traces convert --otlp-label` puts a root's attribute (its own, else
/// its resource's) on its record, as `cpt serve --otlp-label` does; other
/// formats refuse the flag instead of ignoring it.
#[test]
fn traces_convert_otlp_label_labels_each_root_record() {
    let dir = tempfile::tempdir().unwrap();
    let span = |id: &str, parent: &str, attrs: &str| {
        format!(
            r#"{{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"{id}","parentSpanId":"{parent}","name":"GET /","kind":2,"startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000000005000000","attributes":[{attrs}]}}"#
        )
    };
    let doc = format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"front"}}}},{{"key":"service.version","value":{{"stringValue":"2.1"}}}}]}},"scopeSpans":[{{"spans":[{},{}]}}]}}]}}"#,
        span(
            "00f067aa0ba902b7",
            "",
            r#"{"key":"tenant","value":{"intValue":"7"}}"#
        ),
        span(
            "00f067aa0ba902b8",
            "00f067aa0ba902b7",
            r#"{"key":"tenant","value":{"intValue":"9"}}"#
        ),
    );
    let input = write(dir.path(), "otlp.json", doc.as_bytes());
    let out = dir.path().join("out.jsonl");
    run(
        &[
            "traces",
            "convert",
            "--from",
            "otlp",
            "--otlp-label",
            "service.version, tenant",
            "--otlp-label=absent",
            "-q",
            "-o",
            s(&out),
            s(&input),
        ],
        true,
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 1, "{text}");
    let labels = &records[0]["labels"];
    assert_eq!(labels["service.version"], "2.1", "{text}");
    // The root's own attribute, not its child's.
    assert_eq!(labels["tenant"], "7", "{text}");
    assert!(labels.get("absent").is_none(), "{text}");
    // Without the flag, no such labels.
    run(
        &[
            "traces",
            "convert",
            "--from",
            "otlp",
            "-q",
            "-o",
            s(&out),
            s(&input),
        ],
        true,
    );
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(!text.contains("service.version"), "{text}");
    let (_, stderr) = run(
        &[
            "traces",
            "convert",
            "--from",
            "jaeger",
            "--otlp-label",
            "tenant",
            "-o",
            s(&out),
            s(&input),
        ],
        false,
    );
    assert!(
        stderr.contains("--otlp-label") && stderr.contains("--from otlp"),
        "{stderr}"
    );
}

#[test]
fn traces_convert_quiet_still_says_why_its_only_trace_was_rejected() {
    let dir = tempfile::tempdir().unwrap();
    // A start time in nanoseconds where Jaeger wants microseconds: out of
    // cpt's range.
    let text = JAEGER.replace("\"startTime\":1000", "\"startTime\":1700000000000000000");
    let input = write(dir.path(), "ns.json", text.as_bytes());
    let out = dir.path().join("out.jsonl");
    for quiet in [&["-q"][..], &["--quiet"], &[]] {
        let mut args = vec!["traces", "convert", "--from", "jaeger", "-o", s(&out)];
        args.extend_from_slice(quiet);
        args.push(s(&input));
        let (_, stderr) = run(&args, false);
        assert!(
            stderr.contains("no trace could be analysed (1 trace read, 1 rejected)"),
            "{quiet:?}: {stderr}"
        );
        assert!(
            stderr.contains("rejected: ") && stderr.contains("is out of range"),
            "{quiet:?} must say why the trace was rejected: {stderr}"
        );
    }
}

#[test]
fn a_store_given_as_an_input_file_says_use_store() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "r.jsonl", &jsonl(&[entry("a")]));
    let db = dir.path().join("imp.db");
    run(&["import", "--store", s(&db), s(&input)], true);
    let out = dir.path().join("p.pb.gz");
    let (_, stderr) = run(&["profile", "-o", s(&out), s(&db)], false);
    assert!(
        stderr.contains("imp.db is a cpt store") && stderr.contains(&format!("--store {}", s(&db))),
        "{stderr}"
    );
    assert!(!stderr.contains("UTF-8"), "{stderr}");
    // And the advice works.
    run(&["profile", "--store", s(&db), "-o", s(&out)], true);
    assert_eq!(requests(&out), 1);
}

#[test]
fn a_missing_store_is_one_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("missing.db");
    let out = dir.path().join("p.pb.gz");
    let (_, stderr) = run(&["profile", "--store", s(&db), "-o", s(&out)], false);
    assert_eq!(
        stderr.trim(),
        format!(
            "cpt: error: store {} does not exist (`cpt serve` and `cpt import` create one; check \
             the path)",
            db.display()
        )
    );
    // Records given as the store: say what they are.
    let input = write(dir.path(), "r.jsonl", &jsonl(&[entry("a")]));
    let (_, stderr) = run(&["profile", "--store", s(&input), "-o", s(&out)], false);
    assert!(
        stderr.contains("is not a cpt store") && stderr.contains("give it as an input file"),
        "{stderr}"
    );
}

#[test]
fn merge_of_records_says_a_profile_is_expected() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "records.jsonl", &jsonl(&[entry("a")]));
    let out = dir.path().join("m.pb.gz");
    let (_, stderr) = run(&["merge", "-o", s(&out), s(&input)], false);
    assert!(
        stderr.contains("records.jsonl is not a profile written by cpt profile")
            && stderr.contains("cpt profile -o OUT.pb.gz"),
        "{stderr}"
    );
    // Garbage: the decoder's message appears once, not twice.
    let junk = write(dir.path(), "junk.pb.gz", &gzip(b"\x0f\x0f\x0f\x0f"));
    let (_, stderr) = run(&["merge", "-o", s(&out), s(&junk)], false);
    assert!(
        stderr.contains("not a profile written by cpt profile"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("failed to decode").count(), 1, "{stderr}");
}

#[test]
fn diff_refuses_overlapping_arms() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<Record> = (0..20)
        .map(|i| entry(if i % 2 == 0 { "a" } else { "b" }))
        .collect();
    let input = write(dir.path(), "r.jsonl", &jsonl(&recs));
    let input = s(&input);
    for arms in [
        &["--base", "label=arm=a"][..],
        &["--test", "label=arm=b"],
        &["--base", "label=arm=a", "--test", "endpoint=/x"],
        &["--base", "until=2s", "--test", "since=1s"],
        &[
            "--base",
            "percentile=p0-p60",
            "--test",
            "percentile=p50-p100",
        ],
    ] {
        let mut args = vec!["diff"];
        args.extend_from_slice(arms);
        args.push(input);
        let (stdout, stderr) = run(&args, false);
        assert!(
            stderr.contains("can select the same records"),
            "{arms:?}: {stderr}"
        );
        assert!(!stdout.contains("LARGER THAN NOISE"), "{arms:?}: {stdout}");
    }
    for arms in [
        &["--base", "label=arm=a", "--test", "label=arm=b"][..],
        &["--base", "until=1s", "--test", "since=1s"],
        &[
            "--base",
            "percentile=p0-p50",
            "--test",
            "percentile=p50-p100",
        ],
        &["--base", "trigger=forced", "--test", "trigger=sampled"],
    ] {
        let mut args = vec!["diff"];
        args.extend_from_slice(arms);
        args.push(input);
        run(&args, true);
    }
}

#[test]
fn percentile_needs_both_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "r.jsonl", &jsonl(&[entry("a"), entry("b")]));
    let out = dir.path().join("p.pb.gz");
    let (_, stderr) = run(
        &["profile", "--percentile", "99", "-o", s(&out), s(&input)],
        false,
    );
    assert!(
        stderr.contains("give both bounds")
            && stderr.contains("\"p99-p100\" for the slowest 1%")
            && stderr.contains("\"p0-p99\""),
        "{stderr}"
    );
    let (_, stderr) = run(
        &[
            "profile",
            "--percentile",
            "p50-p100",
            "-o",
            s(&out),
            s(&input),
        ],
        true,
    );
    assert!(
        stderr.contains("before the percentile band p50-p100"),
        "{stderr}"
    );
}

#[test]
fn counts_of_one_are_singular() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = jsonl(&[entry("a")]);
    bytes.extend_from_slice(b"{not a record}\n");
    let input = write(dir.path(), "r.jsonl", &bytes);
    let (stdout, stderr) = run(&["histogram", s(&input)], true);
    assert!(stdout.starts_with("1 request, mean latency"), "{stdout}");
    assert!(stdout.contains("(on the path of 1 request)"), "{stdout}");
    assert!(stderr.contains("skipped 1 bad line "), "{stderr}");
    assert!(stderr.contains("cpt: 1 record read, 1 matched"), "{stderr}");
    let db = dir.path().join("s.db");
    let (_, stderr) = run(&["import", "--store", s(&db), s(&input)], true);
    assert!(
        stderr.contains("imported 1 record into") && stderr.contains("skipped 1 bad line"),
        "{stderr}"
    );
    assert!(!stderr.contains("lines"), "{stderr}");
}

#[test]
fn profile_warns_when_entry_services_mix() {
    let dir = tempfile::tempdir().unwrap();
    // A calls B; B also sampled one of those calls itself and wrote a record
    // whose root is B's handler.
    let a = record("A", &[&[("A", "a1")], &[("A", "a1"), ("B", "b1")]], &[]);
    let b = record("B", &[&[("B", "b1")]], &[]);
    let input = write(dir.path(), "r.jsonl", &jsonl(&[a.clone(), a, b]));
    let out = dir.path().join("p.pb.gz");
    let (_, stderr) = run(&["profile", "-o", s(&out), s(&input)], true);
    assert!(
        stderr.contains("mixes 2 entry services: A (2 records), B (1 record)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("B is called by A") && stderr.contains("--service A"),
        "{stderr}"
    );
    let (_, stderr) = run(
        &["profile", "--service", "A", "-o", s(&out), s(&input)],
        true,
    );
    assert!(!stderr.contains("entry services"), "{stderr}");
}

mod flows;
mod operator;
mod parquet;
mod reference;
mod show;
mod sources;

/// A malformed retention flag, or a size bound too small for one batch, is
/// refused at start with the flag named (and nothing is created).
#[test]
fn serve_refuses_malformed_retention_flags_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    let store = store.to_str().unwrap();
    for (flag, value, says) in [
        ("--retain-for", "7x", "--retain-for"),
        ("--retain-for", "0s", "--retain-for"),
        ("--retention-interval", "soon", "--retention-interval"),
        ("--max-store-bytes", "12 parsecs", "--max-store-bytes"),
        ("--max-store-bytes", "1MiB", "--max-store-bytes"),
        (
            "--hourly-rollups-for",
            "1 fortnight",
            "--hourly-rollups-for",
        ),
        ("--rollups-retain-for", "a year", "--rollups-retain-for"),
    ] {
        let (_, err) = run(
            &[
                "serve",
                "--store",
                store,
                "--grpc",
                "off",
                "--http",
                "127.0.0.1:0",
                flag,
                value,
            ],
            false,
        );
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
    assert!(
        !dir.path().join("s.db").exists(),
        "a refused start creates no store"
    );
}
