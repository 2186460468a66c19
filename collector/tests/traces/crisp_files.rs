//! Every CRISP test trace, with the critical path and the exclusive time per
//! call path derived by hand from the paper's definitions (CRISP §5.1
//! Listing 1, §5.2 relaxations) and our edge-case rules (see
//! `cpt_collector::traces::crisp`). Times in µs; frames `service:operation`.
//! The default overlap allowance is min(1 ms, 1 % of the parent).
//!
//! Derivations of the tricky cases:
//!
//! - **3** A[0,100] ⊃ B[0,100]: a child equal to its parent covers the
//!   whole window; A has no own time → one segment A;B 100.
//! - **7** B[10,110] overflows A[0,100]: truncated to [10,100] (10 µs cut,
//!   §5.2 bullet 2). C[40,50] inside B. Walk: A own 0..10, B own 10..40,
//!   C 40..50, B own 50..100 → A 10, A;B 80, A;B;C 10.
//! - **8** C[20,120] overflows its parent B[10,70]: truncated to [20,70]
//!   (50 µs cut). A own 0..10, B own 10..20, C 20..70, A own 70..100.
//! - **9** B[110,160] starts after A[0,100] ends: dropped with its child C
//!   (§5.2 bullet 3: 2 spans, 50 µs). D[60,90] is the LFC: A 0..60, D, A 90..100.
//! - **10** A[0,1000]; B[10,210], C[209,309], D[308,608] overlap by 1 µs.
//!   Allowance min(1000, 1 % × 1000) = 10 µs. LFC D; C overlaps D's start
//!   by 1 ≤ 10, started before D, ended before D, and the window [308,309]
//!   holds only D's start and C's end → C happens before D, clipped to
//!   [209,308]. Same for B against C (window [209,210]) → B clipped to
//!   [10,209]. A own 0..10 and 608..1000 → A 402, B 199, C 99, D 300;
//!   2 overlaps, 2 µs clipped.
//! - **12 / 13** B[10,70] has C[25,45] and D[30,50]. LFC D; C ends 15 µs
//!   after D starts and B's allowance is min(1000, 1 % × 60) = 0 µs
//!   → C is concurrent with D, off the path. B own 10..30 and 50..70.
//! - **14** A[0,80]: B[10,30], C[20,45], D[40,65]. LFC D; C overlaps D by
//!   5 > 0 (allowance floor(0.8) = 0) → off; B ends at 30 ≤ 40 → on.
//!   A 0..10, B, A 30..40, D, A 65..80.
//! - **16** A[0,110]: B[10,20], C[15,35], D[30,40], E[50,60], F[70,100]
//!   (G[80,90] under F). Chosen backwards: F, E, D; C overlaps D by 5 >
//!   allowance 1 → off; B ends 20 ≤ 30 → on. A own = 0..10, 20..30, 40..50,
//!   60..70, 100..110 = 50.
//! - **19–21** A[0,600]: B[10,210], C[205,305], D[300,600] overlap by 5 µs;
//!   allowance min(1000, 6) = 6 → as in 10: C clipped to [205,300], B to
//!   [10,205]; A own 0..10 only. 2 overlaps, 10 µs clipped.
//! - **err_pattern3/4** A[0,100] ⊃ B[0,100] ⊃ C[70,100]: B equals A, so A
//!   has no own time; C is B's LFC → A;B 70, A;B;C 30.

use cpt_collector::traces::{Endpoint, Format, ImportOptions, RootSelector};

use crate::support::{exclusive, import, path_string, testdata};

struct Case {
    file: &'static str,
    path: &'static str,
    exclusive: &'static [(&'static str, u64)],
    labels: &'static [(&'static str, &'static str)],
}

const A: &str = "S1:O1";

#[rustfmt::skip]
const CASES: &[Case] = &[
    Case { file: "1.json", path: "S1:O1 100", exclusive: &[(A, 100)], labels: &[] },
    Case { file: "2.json", path: "S1:O1 10|S1:O1;S2:O2 50|S1:O1 40",
           exclusive: &[(A, 50), ("S1:O1;S2:O2", 50)], labels: &[] },
    Case { file: "3.json", path: "S1:O1;S2:O2 100", exclusive: &[("S1:O1;S2:O2", 100)], labels: &[] },
    Case { file: "4.json", path: "S1:O1 10|S1:O1;S2:O2 10|S1:O1;S2:O2;S3:O3 10|S1:O1;S2:O2 30|S1:O1 40",
           exclusive: &[(A, 50), ("S1:O1;S2:O2", 40), ("S1:O1;S2:O2;S3:O3", 10)], labels: &[] },
    Case { file: "5.json", path: "S1:O1 10|S1:O1;S2:O2 20|S1:O1 10|S1:O1;S2:O2 10|S1:O1 10|S1:O1;S2:O2 30|S1:O1 10",
           exclusive: &[(A, 40), ("S1:O1;S2:O2", 60)], labels: &[] },
    Case { file: "6.json", path: "S1:O1 10|S1:O1;S2:O2 20|S1:O1 10|S1:O1;S3:O3 10|S1:O1 10|S1:O1;S4:O4 30|S1:O1 10",
           exclusive: &[(A, 40), ("S1:O1;S2:O2", 20), ("S1:O1;S3:O3", 10), ("S1:O1;S4:O4", 30)], labels: &[] },
    Case { file: "7.json", path: "S1:O1 10|S1:O1;S2:O2 30|S1:O1;S2:O2;S3:O3 10|S1:O1;S2:O2 50",
           exclusive: &[(A, 10), ("S1:O1;S2:O2", 80), ("S1:O1;S2:O2;S3:O3", 10)],
           labels: &[("skew.truncated_spans", "1"), ("skew.truncated_ns", "10000")] },
    Case { file: "8.json", path: "S1:O1 10|S1:O1;S2:O2 10|S1:O1;S2:O2;S3:O3 50|S1:O1 30",
           exclusive: &[(A, 40), ("S1:O1;S2:O2", 10), ("S1:O1;S2:O2;S3:O3", 50)],
           labels: &[("skew.truncated_spans", "1"), ("skew.truncated_ns", "50000")] },
    Case { file: "9.json", path: "S1:O1 60|S1:O1;S4:O4 30|S1:O1 10",
           exclusive: &[(A, 70), ("S1:O1;S4:O4", 30)],
           labels: &[("skew.dropped_spans", "2"), ("skew.dropped_ns", "50000")] },
    Case { file: "10.json", path: "S1:O1 10|S1:O1;S2:O2 199|S1:O1;S3:O3 99|S1:O1;S4:O4 300|S1:O1 392",
           exclusive: &[(A, 402), ("S1:O1;S2:O2", 199), ("S1:O1;S3:O3", 99), ("S1:O1;S4:O4", 300)],
           labels: &[("skew.overlaps", "2"), ("skew.overlap_ns", "2000")] },
    Case { file: "11.json", path: "S1:O1 30|S1:O1;S2:O2 30|S1:O1 40",
           exclusive: &[(A, 70), ("S1:O1;S2:O2", 30)], labels: &[] },
    Case { file: "12.json", path: "S1:O1 10|S1:O1;S2:O2 20|S1:O1;S2:O2;S4:O4 20|S1:O1;S2:O2 20|S1:O1 30",
           exclusive: &[(A, 40), ("S1:O1;S2:O2", 40), ("S1:O1;S2:O2;S4:O4", 20)], labels: &[] },
    Case { file: "13.json", path: "S1:O1 10|S1:O1;S2:O2 20|S1:O1;S2:O2;S4:O4 20|S1:O1;S2:O2 20|S1:O1 30",
           exclusive: &[(A, 40), ("S1:O1;S2:O2", 40), ("S1:O1;S2:O2;S4:O4", 20)], labels: &[] },
    Case { file: "14.json", path: "S1:O1 10|S1:O1;S2:O2 20|S1:O1 10|S1:O1;S4:O4 25|S1:O1 15",
           exclusive: &[(A, 35), ("S1:O1;S2:O2", 20), ("S1:O1;S4:O4", 25)], labels: &[] },
    Case { file: "15.json", path: "S1:O1 10|S1:O1;S2:O2 10|S1:O1 5|S1:O1;S3:O2 10|S1:O1 5|S1:O1;S4:O2 10|S1:O1 5|S1:O1;S5:O2 10|S1:O1 5|S1:O1;S6:O2 10|S1:O1 5|S1:O1;S7:O3 15",
           exclusive: &[(A, 35), ("S1:O1;S2:O2", 10), ("S1:O1;S3:O2", 10), ("S1:O1;S4:O2", 10), ("S1:O1;S5:O2", 10), ("S1:O1;S6:O2", 10), ("S1:O1;S7:O3", 15)], labels: &[] },
    Case { file: "16.json", path: "S1:O1 10|S1:O1;S2:O2 10|S1:O1 10|S1:O1;S4:O4 10|S1:O1 10|S1:O1;S5:O5 10|S1:O1 10|S1:O1;S6:O6 10|S1:O1;S6:O6;S7:O7 10|S1:O1;S6:O6 10|S1:O1 10",
           exclusive: &[(A, 50), ("S1:O1;S2:O2", 10), ("S1:O1;S4:O4", 10), ("S1:O1;S5:O5", 10), ("S1:O1;S6:O6", 20), ("S1:O1;S6:O6;S7:O7", 10)], labels: &[] },
    Case { file: "17.json", path: "S1:O1 20|S1:O1;S2:O2 10|S1:O1;S2:O2;S3:O3 20|S1:O1;S2:O2 20|S1:O1 10|S1:O1;S4:O4 10|S1:O1 10",
           exclusive: &[(A, 40), ("S1:O1;S2:O2", 30), ("S1:O1;S2:O2;S3:O3", 20), ("S1:O1;S4:O4", 10)], labels: &[] },
    Case { file: "18.json", path: "S1:O1 10|S1:O1;S2:O2 20|S1:O1;S2:O2;S3:O3 10|S1:O1;S2:O2 10|S1:O1;S2:O2;S4:O4 10|S1:O1;S2:O2 10|S1:O1;S2:O2;S5:O5 10|S1:O1;S2:O2 30|S1:O1 10|S1:O1;S6:O6 20|S1:O1;S6:O6;S7:O7 10|S1:O1;S6:O6;S7:O7;S8:O8 20|S1:O1;S6:O6;S7:O7 10|S1:O1;S6:O6;S7:O7;S9:O9 10|S1:O1;S6:O6;S7:O7 10|S1:O1;S6:O6 20|S1:O1 30",
           exclusive: &[(A, 50), ("S1:O1;S2:O2", 70), ("S1:O1;S2:O2;S3:O3", 10), ("S1:O1;S2:O2;S4:O4", 10), ("S1:O1;S2:O2;S5:O5", 10),
                        ("S1:O1;S6:O6", 40), ("S1:O1;S6:O6;S7:O7", 30), ("S1:O1;S6:O6;S7:O7;S8:O8", 20), ("S1:O1;S6:O6;S7:O7;S9:O9", 10)], labels: &[] },
    Case { file: "19.json", path: "S1:O1 10|S1:O1;S2:O2 195|S1:O1;S3:O3 95|S1:O1;S4:O4 300",
           exclusive: &[(A, 10), ("S1:O1;S2:O2", 195), ("S1:O1;S3:O3", 95), ("S1:O1;S4:O4", 300)],
           labels: &[("skew.overlaps", "2"), ("skew.overlap_ns", "10000")] },
    Case { file: "20.json", path: "S1:O1 10|S1:O1;S2:O2 195|S1:O1;S3:O3 95|S1:O1;S4:O4 300",
           exclusive: &[(A, 10), ("S1:O1;S2:O2", 195), ("S1:O1;S3:O3", 95), ("S1:O1;S4:O4", 300)],
           labels: &[("skew.overlaps", "2"), ("skew.overlap_ns", "10000")] },
    Case { file: "21.json", path: "S1:O1 10|S1:O1;S2:O2 195|S1:O1;S3:O3 95|S1:O1;S4:O4 300",
           exclusive: &[(A, 10), ("S1:O1;S2:O2", 195), ("S1:O1;S3:O3", 95), ("S1:O1;S4:O4", 300)],
           labels: &[("skew.overlaps", "2"), ("skew.overlap_ns", "10000")] },
    Case { file: "22.json", path: "S1:O1 50|S1:O1;S2:O2 50|S1:O1 50|S1:O1;S2:O2 50|S1:O1 50|S1:O1;S2:O2 50",
           exclusive: &[(A, 150), ("S1:O1;S2:O2", 150)], labels: &[] },
    Case { file: "23.json", path: TWO_LEVEL, exclusive: TWO_LEVEL_EXCL, labels: &[] },
    Case { file: "24.json", path: TWO_LEVEL, exclusive: TWO_LEVEL_EXCL, labels: &[] },
    Case { file: "25.json", path: TWO_LEVEL, exclusive: TWO_LEVEL_EXCL, labels: &[] },
    Case { file: "err_pattern1/err1.json", path: "S1:O1 70|S1:O1;S2:O2 30", exclusive: &[(A, 70), ("S1:O1;S2:O2", 30)], labels: &[] },
    Case { file: "err_pattern1/err2.json", path: "S1:O1 70|S1:O1;S2:O2 30", exclusive: &[(A, 70), ("S1:O1;S2:O2", 30)], labels: &[] },
    Case { file: "err_pattern2/err1.json", path: "S1:O1 70|S1:O1;S2:O2 30", exclusive: &[(A, 70), ("S1:O1;S2:O2", 30)], labels: &[] },
    Case { file: "err_pattern2/err2.json", path: "S1:O1 70|S1:O1;S2:O2 30", exclusive: &[(A, 70), ("S1:O1;S2:O2", 30)], labels: &[] },
    Case { file: "err_pattern3/err1.json", path: "S1:O1;S2:O2 70|S1:O1;S2:O2;S3:O3 30", exclusive: &[("S1:O1;S2:O2", 70), ("S1:O1;S2:O2;S3:O3", 30)], labels: &[] },
    Case { file: "err_pattern3/err2.json", path: "S1:O1;S2:O2 70|S1:O1;S2:O2;S3:O3 30", exclusive: &[("S1:O1;S2:O2", 70), ("S1:O1;S2:O2;S3:O3", 30)], labels: &[] },
    Case { file: "err_pattern4/err1.json", path: "S1:O1;S2:O2 70|S1:O1;S2:O2;S3:O3 30", exclusive: &[("S1:O1;S2:O2", 70), ("S1:O1;S2:O2;S3:O3", 30)], labels: &[] },
    Case { file: "err_pattern4/err2.json", path: "S1:O1;S2:O2 70|S1:O1;S2:O2;S3:O3 30", exclusive: &[("S1:O1;S2:O2", 70), ("S1:O1;S2:O2;S3:O3", 30)], labels: &[] },
];

/// 23–25: A[0,700] → B[50,350] (C, D, E: 50 µs each, 50 µs gaps) and
/// F[400,700] (G, H, I likewise); B and F are both S2:O2, their children all
/// S3:O3, so the call paths merge (CRISP §5.1: "we sum them as long as their
/// call chains are exactly the same").
const TWO_LEVEL: &str = "S1:O1 50|S1:O1;S2:O2 50|S1:O1;S2:O2;S3:O3 50|S1:O1;S2:O2 50|S1:O1;S2:O2;S3:O3 50|S1:O1;S2:O2 50|S1:O1;S2:O2;S3:O3 50|S1:O1 50|S1:O1;S2:O2 50|S1:O1;S2:O2;S3:O3 50|S1:O1;S2:O2 50|S1:O1;S2:O2;S3:O3 50|S1:O1;S2:O2 50|S1:O1;S2:O2;S3:O3 50";
const TWO_LEVEL_EXCL: &[(&str, u64)] =
    &[(A, 100), ("S1:O1;S2:O2", 300), ("S1:O1;S2:O2;S3:O3", 300)];

fn s1_o1() -> ImportOptions {
    ImportOptions {
        roots: RootSelector::Endpoints(vec!["S1:O1".parse::<Endpoint>().unwrap()]),
        ..Default::default()
    }
}

#[test]
fn crisp_test_traces_match_hand_derived_paths() {
    assert_eq!(CASES.len(), 33, "every CRISP test file has a case");
    let mut failures = Vec::new();
    for case in CASES {
        let imp = import(
            &[testdata(&format!("crisp/{}", case.file))],
            Format::Jaeger,
            &s1_o1(),
        );
        assert!(imp.errors.is_empty(), "{}: {:?}", case.file, imp.errors);
        assert_eq!(imp.analyzed.len(), 1, "{}: one S1:O1 root", case.file);
        let r = &imp.analyzed[0].record;
        let got_path = path_string(r);
        let got_excl = exclusive(r);
        let want_excl: Vec<(String, u64)> = {
            let mut v: Vec<_> = case
                .exclusive
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect();
            v.sort();
            v
        };
        if got_path != case.path || got_excl != want_excl {
            failures.push(format!(
                "{}:\n  path got  {got_path}\n  path want {}\n  excl got  {got_excl:?}\n  excl want {want_excl:?}",
                case.file, case.path
            ));
        }
        let skew: Vec<(&str, &str)> = r
            .labels
            .iter()
            .filter(|(k, _)| k.starts_with("skew."))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut want_labels = case.labels.to_vec();
        want_labels.sort();
        if skew != want_labels {
            failures.push(format!(
                "{}: labels got {skew:?} want {want_labels:?}",
                case.file
            ));
        }
        // The path's total is the root's latency.
        assert_eq!(r.latency, r.path.total(), "{}", case.file);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn crisp_strict_happens_before_takes_overlapping_siblings_off_the_path() {
    // 10.json without the §5.2 relaxation: C overlaps D's start, so only D
    // and B (which ends before D starts) are on the path.
    let mut opts = s1_o1();
    opts.overlap = cpt_collector::traces::OverlapThreshold::STRICT;
    let imp = import(&[testdata("crisp/10.json")], Format::Jaeger, &opts);
    let r = &imp.analyzed[0].record;
    assert_eq!(
        path_string(r),
        "S1:O1 10|S1:O1;S2:O2 200|S1:O1 98|S1:O1;S4:O4 300|S1:O1 392"
    );
    assert!(!r.labels.contains_key("skew.overlaps"));
}

#[test]
fn crisp_all_files_in_one_run_and_error_tags() {
    let mut files: Vec<_> = (1..=25)
        .map(|i| testdata(&format!("crisp/{i}.json")))
        .collect();
    for p in 1..=4 {
        for e in 1..=2 {
            files.push(testdata(&format!("crisp/err_pattern{p}/err{e}.json")));
        }
    }
    let imp = import(&files, Format::Jaeger, &ImportOptions::default());
    assert!(imp.errors.is_empty());
    assert_eq!(
        (imp.stats.files, imp.stats.traces, imp.stats.records),
        (33, 33, 33)
    );
    // 17.json's root carries `error: true`.
    let r17 = &imp.analyzed[16].record;
    assert_eq!(r17.labels.get("error").map(String::as_str), Some("true"));
    assert_eq!(imp.analyzed[0].record.labels.get("error"), None);
}

#[test]
fn crisp_trace_files_hold_no_upstream_testing_key() {
    // testdata/crisp/README.md: the upstream expected results under
    // "testing" were removed from every trace file (not from the goldens).
    let root = crate::support::testdata("crisp");
    let mut dirs = vec![root.clone()];
    let mut files = 0;
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path != root.join("golden") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "json") {
                let doc: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                assert!(doc.get("testing").is_none(), "{}", path.display());
                assert!(doc.get("data").is_some(), "{}", path.display());
                files += 1;
            }
        }
    }
    // 1–25, err_pattern{1,2,3,4}/err{1,2} and 26.
    assert_eq!(files, 34, "the traces testdata/crisp/README.md lists");
}
