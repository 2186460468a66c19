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
        let n = v["methods"][m]["n"].as_u64().unwrap();
        assert!(n > 0, "{m}: {v}");
        for q in ["p50", "p90", "p95", "p99"] {
            assert!(
                v["methods"][m][q].is_number() || v["methods"][m][q].is_null(),
                "{m} {q}"
            );
        }
    }
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
