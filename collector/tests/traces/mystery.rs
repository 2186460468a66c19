//! The Mystery Machine's commands (`cpt traces model`, `slack`,
//! `outliers`) on every trace set of the repository's test data, and their
//! JSON contracts.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::support::testdata;

fn cpt(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cpt"))
        .args(args)
        .output()
        .expect("run cpt");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("output written")).expect("JSON")
}

fn check_set(format: &str, rel: &str) {
    let file = testdata(rel);
    let file = file.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (m, dot, s, o) = (
        dir.path().join("m.json"),
        dir.path().join("m.dot"),
        dir.path().join("s.json"),
        dir.path().join("o.json"),
    );
    let (ok, out, err) = cpt(&[
        "traces",
        "model",
        "--from",
        format,
        file,
        "--json",
        m.to_str().unwrap(),
        "--dot",
        dot.to_str().unwrap(),
    ]);
    assert!(ok, "model on {rel}: {err}");
    assert!(out.contains("hypotheses left"), "{out}");
    let m = json(&m);
    let used = m["traces_used"].as_u64().unwrap();
    assert!(used > 0);
    let rels = m["relations"].as_array().unwrap();
    assert!(!rels.is_empty(), "{rel}: a model with no relation");
    for r in rels {
        let kind = r["kind"].as_str().unwrap();
        assert!(["happens_before", "mutual_exclusion", "pipeline"].contains(&kind));
        assert!(r["a"].is_string() && r["b"].is_string());
        if kind == "happens_before" {
            assert!(
                r["a"].as_str().unwrap().ends_with(".start")
                    || r["a"].as_str().unwrap().ends_with(".end")
            );
        }
    }
    let conv = m["convergence"].as_array().unwrap();
    assert_eq!(conv.last().unwrap()[0].as_u64(), Some(used));
    assert!(
        std::fs::read_to_string(&dot)
            .unwrap()
            .starts_with("digraph")
    );

    let svg = dir.path().join("svg");
    let (ok, out, err) = cpt(&[
        "traces",
        "slack",
        "--from",
        format,
        file,
        "--json",
        s.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "slack on {rel}: {err}");
    assert!(out.contains("call path"), "{out}");
    // Every span the two critical paths disagree on has one cause.
    let count = |after: &str| -> u64 {
        let tail = &out[out.find(after).unwrap() + after.len()..];
        tail.split_whitespace().next().unwrap().parse().unwrap()
    };
    let (model_only, crisp_only) = (
        count("% of spans agree; "),
        count("critical only through the model, "),
    );
    let causes = [
        "skew_clipped",
        "rare_segment",
        "exclusion_or_pipeline",
        "tie",
        "refuted_nesting",
        "other_subtree",
        "later_in_family",
    ];
    let (mut m_sum, mut c_sum) = (0, 0);
    for cause in causes {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some(cause))
            .unwrap_or_else(|| panic!("no row for {cause} in {out}"));
        let n: Vec<u64> = line
            .split_whitespace()
            .take(2)
            .map(|x| x.parse().unwrap())
            .collect();
        m_sum += n[0];
        c_sum += n[1];
    }
    assert_eq!((m_sum, c_sum), (model_only, crisp_only), "{rel}: {out}");
    // Figure 8 always; Figure 10 when some segment has slack to validate on.
    let cdf = std::fs::read_to_string(svg.join("slack-cdf.svg")).unwrap();
    assert!(cdf.starts_with("<svg") && cdf.contains("Slack CDF"));
    if out.contains("MM Figure 10") {
        let bars = std::fs::read_to_string(svg.join("slack-correlation.svg")).unwrap();
        assert!(bars.starts_with("<svg") && bars.contains("Pearson r"));
    }
    let s = json(&s);
    let traces = s["traces"].as_array().unwrap();
    assert_eq!(traces.len() as u64, used);
    for t in traces {
        assert!(t["trace_id"].is_string() && t["latency_us"].as_f64().unwrap() >= 0.0);
        let spans = t["spans"].as_array().unwrap();
        // The root is critical; critical spans have no slack; none is negative.
        assert_eq!(spans[0]["critical"], true);
        for sp in spans {
            let slack = sp["slack_us"].as_f64().unwrap();
            assert!(slack >= 0.0);
            if sp["critical"] == true {
                assert_eq!(slack, 0.0, "{sp}");
            }
            assert!(sp["span_id"].is_string() && sp["call_path"].is_string());
        }
    }

    let (ok, out, err) = cpt(&[
        "traces",
        "outliers",
        "--from",
        format,
        file,
        "--json",
        o.to_str().unwrap(),
    ]);
    assert!(ok, "outliers on {rel}: {err}");
    assert!(out.contains("outliers"), "{out}");
    let o = json(&o);
    for ep in o["endpoints"].as_array().unwrap() {
        assert!(ep["outliers"].as_u64().unwrap() >= 1);
    }
    // The two sides as pprof profiles that read back with all requests.
    let pp = dir.path().join("pprof");
    let (ok, _, err) = cpt(&[
        "traces",
        "outliers",
        "--from",
        format,
        file,
        "--pprof",
        pp.to_str().unwrap(),
    ]);
    assert!(ok, "outliers --pprof on {rel}: {err}");
    let others = cpt_collector::profile::pprof::read_file(&pp.join("0.others.pb.gz")).unwrap();
    let slow = cpt_collector::profile::pprof::read_file(&pp.join("0.outliers.pb.gz")).unwrap();
    assert!(slow.requests() >= 1 && others.requests() > slow.requests());
}

#[test]
fn mystery_machine_commands_on_every_test_set() {
    check_set(
        "jaeger",
        "traces/traceweaver-media/media_load25.jaeger.json.gz",
    );
    check_set(
        "jaeger",
        "traces/traceweaver-hotel/hotel_load25.jaeger.json.gz",
    );
    check_set(
        "nezha",
        "traces/nezha-trainticket/normal/2023-01-30_11_39_trace.csv.gz",
    );
    check_set(
        "nezha",
        "traces/nezha-onlineboutique/normal/2022-08-23_17_00_trace.csv.gz",
    );
}

#[test]
fn mystery_machine_malformed_input_and_bad_root_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{ not json").unwrap();
    let (ok, _, err) = cpt(&["traces", "model", "--from", "jaeger", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("no trace could be read"), "{err}");
    let media = testdata("traces/traceweaver-media/media_load25.jaeger.json.gz");
    let (ok, _, err) = cpt(&[
        "traces",
        "slack",
        "--from",
        "jaeger",
        media.to_str().unwrap(),
        "--root",
        "no-such-service",
    ]);
    assert!(!ok);
    assert!(err.contains("matches --root no-such-service"), "{err}");
    let (ok, _, err) = cpt(&[
        "traces",
        "outliers",
        "--from",
        "jaeger",
        media.to_str().unwrap(),
        "--top",
        "5",
    ]);
    assert!(!ok);
    assert!(err.contains("--top 5 must be a fraction"), "{err}");
}

#[test]
fn anomalies_rank_a_labelled_fault_and_report_precision_and_recall() {
    let o = "traces/nezha-onlineboutique";
    let train = testdata(&format!("{o}/normal/2022-08-23_17_00_trace.csv.gz"));
    let test = testdata(&format!("{o}/fault/2022-08-23_14_30_trace.csv.gz"));
    let (ok, out, err) = cpt(&[
        "traces",
        "anomalies",
        "--from",
        "nezha",
        train.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
        "--fault",
        "productcatalogservice@2022-08-23T14:30:10Z",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("rank") && out.contains("labelled faulty"),
        "{out}"
    );
    assert!(out.contains("PCA") && out.contains("latency"), "{out}");
    let (ok, _, err) = cpt(&[
        "traces",
        "anomalies",
        "--from",
        "nezha",
        train.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
        "--fault",
        "productcatalogservice",
    ]);
    assert!(!ok);
    assert!(err.contains("expected SERVICE@TIME"), "{err}");
}

/// The precision / recall rows `anomalies` prints, as `k → (PCA p, PCA r,
/// latency p, latency r)`, and the "N of M labelled faulty" counts.
fn precision_rows(out: &str) -> (String, Vec<(usize, [f64; 4])>) {
    let head = out
        .lines()
        .find(|l| l.contains("test requests labelled faulty"))
        .unwrap_or_else(|| panic!("no labelled-faulty line in\n{out}"))
        .to_owned();
    let rows = out
        .lines()
        .skip_while(|l| !l.contains("labelled faulty"))
        .skip(2)
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().filter(|w| *w != "/").collect();
            let k = w.first()?.parse().ok()?;
            let v: Vec<f64> = w[1..].iter().filter_map(|x| x.parse().ok()).collect();
            (v.len() == 4).then(|| (k, [v[0], v[1], v[2], v[3]]))
        })
        .collect();
    (head, rows)
}

/// The anomaly table of the documentation (Nezha Online Boutique, two
/// labelled network delays): precision and recall at k for the PCA and the
/// latency ranking. Tolerance ±0.005 (the table prints three decimals; the
/// PCA's SVD may round differently on another CPU).
#[test]
fn anomalies_precision_at_k_matches_the_documented_table() {
    const TOL: f64 = 0.005;
    let o = "traces/nezha-onlineboutique";
    let train = testdata(&format!("{o}/normal/2022-08-23_17_00_trace.csv.gz"));
    const PRODUCT: &str = "productcatalogservice@2022-08-23T14:30:10Z";
    const CURRENCY: &str = "currencyservice@2022-08-23T13:37:08Z";
    const P_LABELS: &str = "930 of 1344 test requests labelled faulty";
    const C_LABELS: &str = "640 of 1156 test requests labelled faulty";
    #[allow(clippy::type_complexity)]
    let cases: [(&str, &str, &str, &str, &[(usize, [f64; 4])]); 4] = [
        (
            "cpt",
            PRODUCT,
            "2022-08-23_14_3",
            P_LABELS,
            &[
                (465, [0.996, 0.498, 0.978, 0.489]),
                (930, [0.954, 0.954, 0.869, 0.869]),
            ],
        ),
        (
            "cpt",
            CURRENCY,
            "2022-08-23_13_3",
            C_LABELS,
            &[
                (320, [0.931, 0.466, 0.988, 0.494]),
                (640, [0.955, 0.955, 0.980, 0.980]),
            ],
        ),
        // CRISP's reference exclusive times as the vectors.
        (
            "crisp",
            PRODUCT,
            "2022-08-23_14_3",
            P_LABELS,
            &[
                (465, [0.996, 0.498, 0.978, 0.489]),
                (930, [0.951, 0.951, 0.869, 0.869]),
            ],
        ),
        (
            "crisp",
            CURRENCY,
            "2022-08-23_13_3",
            C_LABELS,
            &[
                (320, [0.934, 0.467, 0.988, 0.494]),
                (640, [0.955, 0.955, 0.980, 0.980]),
            ],
        ),
    ];
    for (accounting, fault, minutes, labelled, want) in cases {
        let dir = testdata(&format!("{o}/fault"));
        let mut tests: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(minutes)
            })
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        tests.sort();
        assert_eq!(tests.len(), 3, "three test minutes for {fault}");
        let mut args = vec![
            "traces",
            "anomalies",
            "--from",
            "nezha",
            train.to_str().unwrap(),
            "--test",
        ];
        args.extend(tests.iter().map(String::as_str));
        args.extend(["--fault", fault, "--accounting", accounting]);
        let (ok, out, err) = cpt(&args);
        assert!(ok, "{err}");
        let (head, rows) = precision_rows(&out);
        assert!(head.contains(labelled), "{fault}: {head}");
        for (k, w) in want {
            let got = rows
                .iter()
                .find(|(kk, _)| kk == k)
                .unwrap_or_else(|| panic!("{fault}: no row for k = {k} in\n{out}"))
                .1;
            for (g, e) in got.iter().zip(w) {
                assert!(
                    (g - e).abs() <= TOL,
                    "{fault} k = {k}: got {got:?}, documented {w:?}"
                );
            }
        }
    }
}
