//! `cpt traces predict` and `cpt traces whatif` end to end on the
//! repository's DeathStarBench hotel traces (Mann et al.'s execution flows).

use super::{run, s, write};

fn hotel(level: u32) -> std::path::PathBuf {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../testdata/traces/traceweaver-hotel/hotel_load{level}.jaeger.json.gz"
    ));
    assert!(
        p.exists(),
        "{}: missing; restore testdata/ with `git checkout -- testdata`",
        p.display()
    );
    p
}

#[test]
fn predict_writes_mann_table1_for_all_six_methods() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("t1.json");
    let svg = dir.path().join("fig2.svg");
    let dot = dir.path().join("flows.dot");
    let (out, _) = run(
        &[
            "traces",
            "predict",
            "--from",
            "jaeger",
            "--min-children",
            "3",
            "--train",
            s(&hotel(25)),
            "--test",
            s(&hotel(50)),
            "--json",
            s(&json),
            "--plot",
            s(&svg),
            "--dot",
            s(&dot),
        ],
        true,
    );
    assert!(out.contains("Nearest Neighbor Flow"), "{out}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for m in [
        "serial",
        "parallel",
        "linear_regression",
        "critical_path",
        "aggregate_flow",
        "nearest_neighbor_flow",
    ] {
        assert_eq!(v["methods"][m]["n"].as_u64(), Some(1000), "{m}: {v}");
        for q in ["p50", "p90", "p95", "p99"] {
            assert!(v["methods"][m][q].is_number(), "{m} {q}: {v}");
        }
    }
    // Hotel's one parent with three children: the flows replay it exactly;
    // linear regression is close (Table 1 of the flows accuracy page,
    // `collector/tests/traces/flows_table1.rs` for every set).
    let q = |m: &str, q: &str| v["methods"][m][q].as_f64().unwrap();
    for m in [
        "serial",
        "critical_path",
        "aggregate_flow",
        "nearest_neighbor_flow",
    ] {
        assert_eq!(q(m, "p99"), 0.0, "{m}: {v}");
    }
    assert!((q("linear_regression", "p90") - 0.03).abs() <= 0.01, "{v}");
    assert!((q("parallel", "p50") - 0.66).abs() <= 0.01, "{v}");
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    assert!(
        std::fs::read_to_string(&dot)
            .unwrap()
            .starts_with("digraph flows {")
    );
}

#[test]
fn whatif_moves_the_root_and_names_an_unknown_operation() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("w.json");
    run(
        &[
            "traces",
            "whatif",
            "--from",
            "jaeger",
            "--train",
            s(&hotel(25)),
            "--scale",
            "reservation:/reservation.Reservation/CheckAvailability=0.5",
            "--json",
            s(&json),
        ],
        true,
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let before = v["before"]["mean_us"].as_f64().unwrap();
    let after = v["after"]["mean_us"].as_f64().unwrap();
    assert!(after < before, "halving the slowest leaf: {v}");
    let h = hotel(25);
    for (scale, want) in [
        ("nope:nothing=0.5", "no replayed span is nope:nothing"),
        ("nope=0.5", "SERVICE:OPERATION"),
    ] {
        let args = [
            "traces",
            "whatif",
            "--from",
            "jaeger",
            "--train",
            s(&h),
            "--scale",
            scale,
        ];
        let (_, err) = run(&args, false);
        assert!(err.contains(want), "{scale}: {err}");
    }
}

#[test]
fn predict_on_malformed_input_gives_the_importers_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(dir.path(), "bad.json", b"{\"data\": [ {\"traceID\": ");
    let (_, err) = run(
        &["traces", "predict", "--from", "jaeger", "--train", s(&bad)],
        false,
    );
    assert!(err.contains("no training trace could be read"), "{err}");
    assert!(err.contains("rejected") || err.contains("error"), "{err}");
}

/// `n` requests of the generated page program (one root calling five
/// services, one process each) as a Jaeger file, with or without client
/// spans; request `k` starts at 1 700 000 000 + k seconds.
fn page(dir: &std::path::Path, n: usize, shape: synth::Shape) -> std::path::PathBuf {
    let name = format!("page-{shape:?}.json");
    write(
        dir,
        &name,
        synth::jaeger_json(&synth::page(n, 7, shape)).as_bytes(),
    )
}

use cpt_collector::traces::analysis::flows::synth;

fn table_row<'a>(out: &'a str, label: &str) -> Vec<&'a str> {
    out.lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label} row in\n{out}"))[label.len()..]
        .split_whitespace()
        .collect()
}

#[test]
fn predict_scores_server_only_traces_split_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let f = page(dir.path(), 400, synth::Shape::ServerOnly);
    let json = dir.path().join("t1.json");
    // 100 s after the first request: 100 traces train, 300 test.
    let split = (1_700_000_000i64 + 100) * 1_000_000_000;
    let (out, err) = run(
        &[
            "traces",
            "predict",
            "--from",
            "jaeger",
            "--train",
            s(&f),
            "--split-at",
            &split.to_string(),
            "--json",
            s(&json),
        ],
        true,
    );
    assert!(
        err.contains("split in time: 100 traces train, 300 traces test"),
        "{err}"
    );
    assert!(
        err.contains("1 parent trained on 100 invocations; 300 test invocations scored"),
        "{err}"
    );
    let nn = table_row(&out, "Nearest Neighbor Flow");
    assert_eq!(nn[0], "300", "{out}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let p90 = v["methods"]["nearest_neighbor_flow"]["p90"]
        .as_f64()
        .unwrap();
    assert!(p90 <= 0.10, "NN flow p90 {p90} on the server-only program");
    assert_eq!(
        nn[2],
        format!("{p90:.2}"),
        "the table prints the JSON's p90"
    );
    // The RFC 3339 spelling of the same instant splits the same way.
    let (_, err) = run(
        &[
            "traces",
            "predict",
            "--from",
            "jaeger",
            "--train",
            s(&f),
            "--split-at",
            "2023-11-14T22:15:00Z",
        ],
        true,
    );
    assert!(
        err.contains("split in time: 100 traces train, 300 traces test"),
        "{err}"
    );
}

#[test]
fn predict_without_test_files_splits_at_the_median_start() {
    let dir = tempfile::tempdir().unwrap();
    let f = page(dir.path(), 300, synth::Shape::WithClients);
    let (out, err) = run(
        &["traces", "predict", "--from", "jaeger", "--train", s(&f)],
        true,
    );
    assert!(
        err.contains("split in time: 150 traces train, 150 traces test"),
        "{err}"
    );
    assert!(err.contains("150 test invocations scored"), "{err}");
    // The program's flow is exact: the best estimators are exact at p50.
    assert_eq!(table_row(&out, "Nearest Neighbor Flow")[1], "0.00", "{out}");
    assert_eq!(table_row(&out, "Aggregate Flow")[1], "0.00", "{out}");
}

#[test]
fn predict_says_why_nothing_was_scored() {
    let dir = tempfile::tempdir().unwrap();
    let f = page(dir.path(), 40, synth::Shape::ServerOnly);
    let (_, err) = run(
        &[
            "traces",
            "predict",
            "--from",
            "jaeger",
            "--train",
            s(&f),
            "--min-children",
            "6",
        ],
        false,
    );
    assert!(
        err.contains(
            "has at least 6 children (the most any has is 5 children); rerun with --min-children 5"
        ),
        "{err}"
    );
    // Parents that never recur: one program trains, another tests.
    let other = write(
        dir.path(),
        "batch.json",
        synth::jaeger_json(&synth::rare_sequential(40, 3, (0, 0))).as_bytes(),
    );
    let (_, err) = run(
        &[
            "traces",
            "predict",
            "--from",
            "jaeger",
            "--train",
            s(&f),
            "--test",
            s(&other),
        ],
        false,
    );
    assert!(err.contains("no parent recurs"), "{err}");
    assert!(!err.contains("--min-children"), "not the cause here: {err}");
}
