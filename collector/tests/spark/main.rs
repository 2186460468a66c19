//! Both paths agree: the Spark job `collector/spark/cpt_aggregate.py`, run in
//! local mode on records exported as Parquet, gives the same profiles,
//! histograms and diffs as `cpt profile` / `cpt histogram` / `cpt diff` on
//! the same Parquet directory.
//!
//! The Spark job runs once for every case (one JVM, `--batch`). Python comes
//! from `CPT_SPARK_PYTHON`, else the workspace's `.venv-spark` (what
//! `.ci/run` creates), else `python3`; without pyspark or java the test is
//! skipped loudly, except under `CPT_REQUIRE_SPARK=1` (CI), where it fails.
#![cfg(feature = "cli")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
use cpt_sdk::record::Record;
use cpt_sdk::testing::SplitMix64;
use cpt_sdk::testing::tools::require_spark;
use cpt_sdk::trigger::Trigger;

/// 2023-11-14T22:13:20Z: the records span this hour and the next two.
const T0: u64 = 1_700_000_000_000_000_000;
const SEC: u64 = 1_000_000_000;

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("CPT_SPARK_PYTHON") {
        return p.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv-spark/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

fn job() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("spark/cpt_aggregate.py")
}

/// Several entry services (B's own records too), labels (arm on every
/// record, region on some), 10 % forced, start times over three hours (and
/// some without one), every segment kind, frames with and without source
/// locations, zero-length segments, and whole-millisecond durations so the
/// percentile bands cut through ties (broken by input order).
fn records() -> Vec<Record> {
    use SegmentKind::*;
    let mut rng = SplitMix64::new(15);
    let mut out = Vec::new();
    for i in 0..3000u64 {
        let service = ["A", "A", "A", "B"][rng.below(4) as usize];
        let trigger = if rng.below(10) == 0 {
            Trigger::Forced
        } else {
            Trigger::Sampled
        };
        let root =
            Frame::new(service, "handle").with_location(format!("{service}/src/main.rs"), 10);
        let mut p = CriticalPath::new();
        for _ in 0..2 + rng.below(6) {
            let mut stack = vec![root.clone()];
            let depth = rng.below(3);
            if depth >= 1 {
                stack.push(Frame::new(
                    "C",
                    ["get", "put", "scan"][rng.below(3) as usize],
                ));
            }
            if depth >= 2 {
                stack.push(Frame::new("D", "disk").with_location("d.rs", 7));
            }
            let kind = [Busy, Busy, Busy, Queueing, Network, BlindSpot, Unattributed]
                [rng.below(7) as usize];
            p.push_frames(stack, Duration::from_millis(rng.below(4)), kind);
        }
        let mut r = Record::new(service, trigger, p);
        r.endpoint = Some(["/get", "/put"][rng.below(2) as usize].into());
        r.start_unix_nanos = (i % 50 != 7).then(|| T0 + i * 3 * SEC);
        r.request_id = Some(format!("req-{i}"));
        r.labels
            .insert("arm".into(), ["a", "b"][rng.below(2) as usize].into());
        if rng.below(3) == 0 {
            r.labels.insert("region".into(), "eu".into());
        }
        out.push(r);
    }
    out
}

fn cpt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cpt"))
        .args(args)
        .output()
        .expect("run cpt")
}

fn ok(args: &[&str]) -> Vec<u8> {
    let out = cpt(args);
    assert!(
        out.status.success(),
        "cpt {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The test records written as JSON Lines in `dir` and exported from there
/// with `cpt export`: the Parquet directory.
fn exported(dir: &Path) -> std::path::PathBuf {
    let jsonl = dir.join("records.jsonl");
    let text: String = records().iter().map(|r| r.to_json() + "\n").collect();
    std::fs::write(&jsonl, text).unwrap();
    let pq = dir.join("parquet");
    ok(&["export", s(&jsonl), "--parquet-dir", s(&pq)]);
    pq
}

#[test]
fn spark_and_cpt_profile_agree_on_profiles_histograms_and_diffs() {
    let py = python();
    if !require_spark(&py, "the Spark agreement test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pq = exported(dir.path());

    let since = (T0 + 2000 * SEC).to_string();
    let until = (T0 + 6000 * SEC).to_string();
    #[rustfmt::skip]
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("every-sampled", vec![]),
        ("service-a", vec!["--service", "A"]),
        ("a-arm-a", vec!["--service", "A", "--label", "arm=a"]),
        ("a-arm-b", vec!["--service", "A", "--label", "arm=b"]),
        ("a-arm-b-slowest-5pct", vec!["--service", "A", "--label", "arm=b", "--percentile", "p95-p100"]),
        ("b-all-triggers-faster-half", vec!["--service", "B", "--trigger", "all", "--percentile", "p0-p50"]),
        ("forced", vec!["--trigger", "forced"]),
        ("time-range-endpoint", vec!["--since", &since, "--until", &until, "--endpoint", "/put"]),
        ("eu-tail", vec!["--label", "region=eu", "--label", "arm=a", "--percentile", "p99.9-p100"]),
        ("request-id", vec!["--request-id", "req-42"]),
        ("empty", vec!["--service", "Z"]),
    ];
    let batch = dir.path().join("batch.jsonl");
    let mut lines = String::new();
    for (name, args) in &cases {
        let out = dir.path().join(format!("agg-{name}"));
        let mut argv: Vec<String> = vec![s(&pq).into(), "--output".into(), s(&out).into()];
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        lines.push_str(&serde_json::to_string(&argv).unwrap());
        lines.push('\n');
    }
    std::fs::write(&batch, lines).unwrap();
    let spark = Command::new(&py)
        .arg(job())
        .args(["--batch", s(&batch), "--master", "local[2]"])
        .output()
        .expect("run the Spark job");
    assert!(
        spark.status.success(),
        "cpt_aggregate.py failed: {}",
        String::from_utf8_lossy(&spark.stderr)
    );

    let mut nonempty = 0;
    for (name, args) in &cases {
        let agg = dir.path().join(format!("agg-{name}"));
        let (want, got) = (
            dir.path().join(format!("{name}.cpt.pb.gz")),
            dir.path().join(format!("{name}.spark.pb.gz")),
        );
        let mut from_records = vec!["profile", s(&pq), "-o", s(&want)];
        from_records.extend(args.iter().copied());
        ok(&from_records);
        ok(&["profile", "--from-aggregate", s(&agg), "-o", s(&got)]);
        let (want_b, got_b) = (std::fs::read(&want).unwrap(), std::fs::read(&got).unwrap());
        if want_b != got_b {
            panic!(
                "{name}: the Spark profile differs from cpt profile's\ncpt:   {}\nspark: {}",
                String::from_utf8_lossy(&ok(&[&["folded", s(&pq)][..], &args[..]].concat())),
                String::from_utf8_lossy(&ok(&["folded", "--from-aggregate", s(&agg)])),
            );
        }
        let agg_read = cpt_collector::profile::read_aggregate(&want_b).unwrap();
        if agg_read.requests() > 0 {
            nonempty += 1;
        }
        for format in ["csv", "buckets-csv"] {
            let mut from_records = vec!["histogram", s(&pq), "--format", format];
            from_records.extend(args.iter().copied());
            let want = ok(&from_records);
            let got = ok(&["histogram", "--from-aggregate", s(&agg), "--format", format]);
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want),
                "{name}: histogram --format {format}"
            );
        }
    }
    assert!(
        nonempty >= cases.len() - 1,
        "only the `empty` case may be empty"
    );

    // The diff of two arms: the same report and the same base/test profiles.
    let (d1, d2) = (dir.path().join("diff-cpt"), dir.path().join("diff-spark"));
    let want = ok(&[
        "diff",
        s(&pq),
        "--service",
        "A",
        "--base",
        "label=arm=a",
        "--test",
        "label=arm=b",
        "--format",
        "csv",
        "-o",
        s(&d1),
    ]);
    let base = dir.path().join("agg-a-arm-a");
    let test = dir.path().join("agg-a-arm-b");
    let got = ok(&[
        "diff",
        "--base-aggregate",
        s(&base),
        "--test-aggregate",
        s(&test),
        "--format",
        "csv",
        "-o",
        s(&d2),
    ]);
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&want)
    );
    for f in ["base.pb.gz", "test.pb.gz"] {
        assert_eq!(
            std::fs::read(d1.join(f)).unwrap(),
            std::fs::read(d2.join(f)).unwrap(),
            "diff {f}"
        );
    }
}

#[test]
fn spark_job_refuses_bad_input_with_a_clear_error() {
    let py = python();
    // A bad selection is refused before Spark starts (no java needed).
    let out = Command::new(&py)
        .arg(job())
        .args(["in", "--output", "out", "--percentile", "p99"])
        .output()
        .expect("run python");
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && err.contains("No module named") {
        // python without pyspark still parses: nothing imports pyspark before Spark starts
        panic!("cpt_aggregate.py imported pyspark before parsing its arguments: {err}");
    }
    assert!(!out.status.success());
    assert!(
        err.contains("give both bounds, e.g. \"p99-p100\" for the slowest 1%"),
        "{err}"
    );
    if !require_spark(&py, "the Spark bad-input test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = Command::new(&py)
        .arg(job())
        .args([
            s(&empty),
            "--output",
            s(&dir.path().join("o")),
            "--master",
            "local[1]",
        ])
        .output()
        .expect("run the Spark job");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no Parquet files (an empty directory?)"),
        "{err}"
    );
    assert!(!dir.path().join("o").exists(), "nothing written");
}

/// The `--from-aggregate` side alone (no Spark): an aggregate file written
/// from the same records draws `cpt profile`'s profile, and misuse is
/// refused with a message that says what to do.
#[test]
fn from_aggregate_draws_cpt_profiles_profile_and_refuses_misuse() {
    use cpt_collector::aggregate::Aggregate;
    use cpt_collector::aggregate::file::to_jsonl;
    use cpt_collector::selection::Selection;

    let dir = tempfile::tempdir().unwrap();
    let recs = records();
    let jsonl = dir.path().join("records.jsonl");
    let text: String = recs.iter().map(|r| r.to_json() + "\n").collect();
    std::fs::write(&jsonl, text).unwrap();
    let sel = Selection::from_query("service=A&percentile=p90-p100").unwrap();
    let agg = Aggregate::from_records_with_histograms(&sel, &recs);
    let with_hist = dir.path().join("agg.jsonl");
    std::fs::write(&with_hist, to_jsonl(&agg, &sel, 0)).unwrap();
    let plain = Aggregate::from_records(&sel, &recs);
    let no_hist = dir.path().join("agg-no-hist.jsonl");
    std::fs::write(&no_hist, to_jsonl(&plain, &sel, 0)).unwrap();

    let (want, got) = (dir.path().join("want.pb.gz"), dir.path().join("got.pb.gz"));
    ok(&[
        "profile",
        s(&jsonl),
        "--service",
        "A",
        "--percentile",
        "p90-p100",
        "-o",
        s(&want),
    ]);
    ok(&["profile", "--from-aggregate", s(&no_hist), "-o", s(&got)]);
    assert_eq!(std::fs::read(&want).unwrap(), std::fs::read(&got).unwrap());

    let out = s(&got);
    #[rustfmt::skip]
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["profile", "--from-aggregate", s(&with_hist), "--service", "A", "-o", out],
         "pass these flags to cpt_aggregate.py instead"),
        (vec!["histogram", "--from-aggregate", s(&no_hist)], "computed without per-stack histograms"),
        (vec!["diff", "--from-aggregate", s(&with_hist)], "give --base-aggregate FILE and --test-aggregate FILE"),
        (vec!["profile", "--from-aggregate", s(&jsonl), "-o", out], "not a cpt.aggregate.v1 line"),
        (vec!["profile", "--from-aggregate", s(&with_hist), s(&jsonl), "-o", out], "cannot be used with"),
    ];
    for (args, want) in cases {
        let o = cpt(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: got {err:?}, want {want:?}");
    }
}

/// The Parquet files under `dir` (hidden names skipped, as Spark and cpt do).
fn parquet_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        if p.is_dir() {
            out.extend(parquet_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// `--since`/`--until` prune `date=/hour=` partitions: with a range from
/// 22:40 (inside hour 22) to 00:00 the next day (the start of hour 00, a
/// date boundary), the job opens the files of hours 22 and 23 only. Hour 21
/// (ending before the range) and hour 00 (starting at its end, which is
/// exclusive) each hold a corrupt file that fails the job when read, as the
/// same job without a time range shows; with the range the job succeeds and
/// its profile is byte for byte `cpt profile`'s for the same range on the
/// directory before the corrupt files were added (the exact row filter still
/// cuts hour 22 at 22:40). A range that overlaps no partition opens no file
/// and gives `cpt profile`'s empty profile.
#[test]
fn spark_job_reads_only_the_partitions_a_time_range_overlaps() {
    let py = python();
    if !require_spark(&py, "the Spark partition-pruning test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pq = exported(dir.path());
    // T0 is 2023-11-14T22:13:20Z; the records run to 00:43:17 the next day.
    let (since, until) = ("2023-11-14T22:40:00Z", "2023-11-15T00:00:00Z");
    let sel = ["--since", since, "--until", until, "--trigger", "all"];
    let want = dir.path().join("cpt.pb.gz");
    ok(&[&["profile", s(&pq), "-o", s(&want)][..], &sel[..]].concat());
    // A range no partition overlaps: nothing is read, an empty aggregate.
    let none = [
        "--since",
        "2023-11-14T20:00:00Z",
        "--until",
        "2023-11-14T21:00:00Z",
    ];
    let want_none = dir.path().join("cpt-none.pb.gz");
    ok(&[&["profile", s(&pq), "-o", s(&want_none)][..], &none[..]].concat());

    let in_range = ["date=2023-11-14/hour=22", "date=2023-11-14/hour=23"];
    let all = parquet_files(&pq);
    let read = all
        .iter()
        .filter(|f| in_range.iter().any(|p| f.parent().unwrap().ends_with(p)))
        .count();
    assert!(read >= 2, "hours 22 and 23 hold files: {all:?}");
    assert!(
        pq.join("date=2023-11-15/hour=00").is_dir(),
        "records in hour 00 too"
    );
    for part in ["date=2023-11-14/hour=21", "date=2023-11-15/hour=00"] {
        let d = pq.join(part);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("part-corrupt.parquet"),
            b"PAR1 not a parquet file PAR1",
        )
        .unwrap();
    }
    let total = all.len() + 2;

    let run = |out: &Path, args: &[&str]| {
        Command::new(&py)
            .arg(job())
            .arg(&pq)
            .args(["--output", s(out), "--master", "local[2]"])
            .args(args)
            .output()
            .expect("run the Spark job")
    };
    // Read, the corrupt file fails the job and is named.
    let unpruned = run(&dir.path().join("agg-all"), &["--trigger", "all"]);
    let err = String::from_utf8_lossy(&unpruned.stderr);
    assert!(
        !unpruned.status.success(),
        "the corrupt files were read without error"
    );
    assert!(err.contains("part-corrupt.parquet"), "{err}");
    assert!(
        err.contains(&format!("reading {total} of {total} Parquet files")),
        "{err}"
    );

    // The range and the one overlapping nothing, in one Spark session.
    let (agg, agg_none) = (dir.path().join("agg-range"), dir.path().join("agg-none"));
    let batch = dir.path().join("batch.jsonl");
    let mut lines = String::new();
    for (out, args) in [(&agg, &sel[..]), (&agg_none, &none[..])] {
        let mut argv: Vec<&str> = vec![s(&pq), "--output", s(out)];
        argv.extend(args);
        lines += &(serde_json::to_string(&argv).unwrap() + "\n");
    }
    std::fs::write(&batch, lines).unwrap();
    let pruned = Command::new(&py)
        .arg(job())
        .args(["--batch", s(&batch), "--master", "local[2]"])
        .output()
        .expect("run the Spark job");
    let err = String::from_utf8_lossy(&pruned.stderr);
    assert!(pruned.status.success(), "cpt_aggregate.py failed: {err}");
    assert!(
        err.contains(&format!(
            "reading {read} of {total} Parquet files ({} in date=/hour= partitions outside --since/--until)",
            total - read
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "reading 0 of {total} Parquet files ({total} in date=/hour= partitions outside --since/--until)"
        )),
        "{err}"
    );
    let got_none = dir.path().join("spark-none.pb.gz");
    ok(&[
        "profile",
        "--from-aggregate",
        s(&agg_none),
        "-o",
        s(&got_none),
    ]);
    assert_eq!(
        std::fs::read(&want_none).unwrap(),
        std::fs::read(&got_none).unwrap(),
        "the empty range's profile"
    );
    let got = dir.path().join("spark.pb.gz");
    ok(&["profile", "--from-aggregate", s(&agg), "-o", s(&got)]);
    let read_agg = cpt_collector::profile::read_aggregate(&std::fs::read(&want).unwrap()).unwrap();
    assert!(read_agg.requests() > 0, "the range selects records");
    assert!(
        std::fs::read(&want).unwrap() == std::fs::read(&got).unwrap(),
        "the Spark profile differs from cpt profile's\nspark: {}",
        String::from_utf8_lossy(&ok(&["folded", "--from-aggregate", s(&agg)])),
    );
}
