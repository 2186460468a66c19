//! `--accounting crisp` against CRISP's own conformance goldens: for every
//! case of `testdata/crisp` that uber-research/CRISP keeps a golden for
//! (`testdata/crisp/golden/<case>/`, copied with the licence), cpt's
//! reference accounting writes exactly the reference's numbers:
//! `conformance.cct` byte for byte; `conformance.json` (where the case
//! has no CCT) call path, exclusive µs and frequency; `cp-segments.json`
//! (where it has neither) exclusive µs per call path.

use std::collections::BTreeMap;

use cpt_collector::traces::analysis::crisp_reference::conformance_cct;
use cpt_collector::traces::{Accounting, Endpoint, Format, ImportOptions, RootSelector};

use crate::support::{exclusive, import, testdata};

/// CRISP's `-s S1 -a O1 --rootTrace --conformance` with cpt.
fn reference_cct(file: &str, accounting: Accounting) -> (String, cpt_collector::traces::Import) {
    let opts = ImportOptions {
        roots: RootSelector::Endpoints(vec!["S1:O1".parse::<Endpoint>().unwrap()]),
        accounting,
        ..Default::default()
    };
    let imp = import(&[testdata(&format!("crisp/{file}"))], Format::Jaeger, &opts);
    assert_eq!(imp.analyzed.len(), 1, "{file}: one S1:O1 root");
    let cct = conformance_cct(imp.analyzed.iter().map(|a| a.call_paths.as_slice()));
    (cct, imp)
}

/// `call path → (exclusive µs, frequency)` of a CCT.
fn parse_cct(text: &str) -> BTreeMap<String, (u64, u64)> {
    text.lines()
        .map(|l| {
            let (rest, freq) = l.rsplit_once(" <<").expect("<<freq>>");
            let (path, excl) = rest.rsplit_once(' ').expect("exclusive");
            let freq = freq.trim_end_matches(">>").parse().expect("frequency");
            (path.to_owned(), (excl.parse().expect("µs"), freq))
        })
        .collect()
}

/// The same from CRISP's `conformance.json` (`AnalyzeResponse`).
fn parse_conformance_json(text: &str) -> BTreeMap<String, (u64, u64)> {
    let v: serde_json::Value = serde_json::from_str(text).expect("golden JSON");
    v["report_window_1"]
        .as_array()
        .expect("report_window_1")
        .iter()
        .map(|e| {
            let path = e["call_path"]
                .as_array()
                .expect("call_path")
                .iter()
                .map(|f| {
                    format!(
                        "[{}] {}",
                        f["service"].as_str().unwrap(),
                        f["operation_name"].as_str().unwrap()
                    )
                })
                .collect::<Vec<_>>()
                .join(";");
            let secs: f64 = e["base"]["duration"]
                .as_str()
                .and_then(|d| d.strip_suffix('s'))
                .expect("duration like 0.000070s")
                .parse()
                .unwrap();
            let us = (secs * 1e6).round() as u64;
            (path, (us, e["base"]["frequency"].as_u64().unwrap()))
        })
        .collect()
}

/// Exclusive µs per call path from CRISP's `cp-segments.json`.
fn parse_cp_segments(text: &str) -> BTreeMap<String, u64> {
    let v: serde_json::Value = serde_json::from_str(text).expect("golden JSON");
    let spans = v["spans"].as_array().expect("spans");
    let by_id: BTreeMap<&str, &serde_json::Value> = spans
        .iter()
        .map(|s| (s["spanID"].as_str().unwrap(), s))
        .collect();
    let mut out = BTreeMap::new();
    for s in spans {
        let mut chain = vec![s];
        while let Some(p) = chain.last().unwrap()["parentSpanID"].as_str() {
            chain.push(by_id[p]);
        }
        let key = chain
            .iter()
            .rev()
            .map(|x| {
                format!(
                    "[{}] {}",
                    x["service"].as_str().unwrap(),
                    x["operation"].as_str().unwrap()
                )
            })
            .collect::<Vec<_>>()
            .join(";");
        *out.entry(key).or_default() += s["exclusive"].as_u64().unwrap();
    }
    out
}

fn check(case: &str, file: &str) {
    let (cct, _) = reference_cct(file, Accounting::Crisp);
    let dir = testdata(&format!("crisp/golden/{case}"));
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    if let Some(golden) = read("conformance.cct") {
        assert_eq!(cct, golden, "case {case}: conformance.cct");
    } else if let Some(golden) = read("conformance.json") {
        assert_eq!(
            parse_cct(&cct),
            parse_conformance_json(&golden),
            "case {case}: conformance.json"
        );
    } else if let Some(golden) = read("cp-segments.json") {
        let ours: BTreeMap<String, u64> = parse_cct(&cct)
            .into_iter()
            .map(|(k, (us, _))| (k, us))
            .collect();
        assert_eq!(
            ours,
            parse_cp_segments(&golden),
            "case {case}: cp-segments.json"
        );
    } else {
        panic!("case {case}: no golden in {}", dir.display());
    }
}

macro_rules! golden {
    ($($name:ident: $case:literal => $file:literal,)*) => {
        $(
            #[test]
            fn $name() {
                check($case, $file);
            }
        )*

        /// Every golden folder has a test above.
        #[test]
        fn crisp_reference_every_golden_has_a_test() {
            let mut want: Vec<String> = std::fs::read_dir(testdata("crisp/golden"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            want.sort();
            let mut have = vec![$($case.to_owned()),*];
            have.sort();
            assert_eq!(have, want);
        }
    };
}

golden! {
    crisp_reference_case_1: "1" => "1.json",
    crisp_reference_case_2: "2" => "2.json",
    crisp_reference_case_3_child_equal_to_parent: "3" => "3.json",
    crisp_reference_case_4: "4" => "4.json",
    crisp_reference_case_5_repeated_child: "5" => "5.json",
    crisp_reference_case_6: "6" => "6.json",
    crisp_reference_case_7_child_overflows_parent: "7" => "7.json",
    crisp_reference_case_8_grandchild_overflows: "8" => "8.json",
    crisp_reference_case_9_child_after_parent_dropped: "9" => "9.json",
    crisp_reference_case_10_overlap_counted_twice: "10" => "10.json",
    crisp_reference_case_11: "11" => "11.json",
    crisp_reference_case_12_concurrent_grandchildren: "12" => "12.json",
    crisp_reference_case_13: "13" => "13.json",
    crisp_reference_case_14_overlap_over_allowance: "14" => "14.json",
    crisp_reference_case_15: "15" => "15.json",
    crisp_reference_case_16: "16" => "16.json",
    crisp_reference_case_17: "17" => "17.json",
    crisp_reference_case_18_deep: "18" => "18.json",
    crisp_reference_case_19_overlap_5us: "19" => "19.json",
    crisp_reference_case_20_overlap_5us: "20" => "20.json",
    crisp_reference_case_21_overlap_5us: "21" => "21.json",
    crisp_reference_case_22: "22" => "22.json",
    crisp_reference_case_23_merged_call_paths: "23" => "23.json",
    crisp_reference_case_24_merged_call_paths: "24" => "24.json",
    crisp_reference_case_25_merged_call_paths: "25" => "25.json",
    crisp_reference_case_26_server_outlasts_client: "26" => "26.json",
    crisp_reference_err_pattern1_err1: "err_pattern1_err1" => "err_pattern1/err1.json",
    crisp_reference_err_pattern2_err1: "err_pattern2_err1" => "err_pattern2/err1.json",
    crisp_reference_err_pattern2_err2: "err_pattern2_err2" => "err_pattern2/err2.json",
    crisp_reference_err_pattern3_err1: "err_pattern3_err1" => "err_pattern3/err1.json",
    crisp_reference_err_pattern3_err2: "err_pattern3_err2" => "err_pattern3/err2.json",
    crisp_reference_err_pattern4_err1: "err_pattern4_err1" => "err_pattern4/err1.json",
}

#[test]
fn server_outlasting_its_client_is_skew_in_cpt_accounting_too() {
    // Case 26: server S (504 µs, another process) under its client A
    // (500 µs). S is shifted to end with A and cut to A's start; no
    // network time is charged, and S's child keeps its 59 µs.
    let (_, imp) = reference_cct("26.json", Accounting::Cpt);
    let r = &imp.analyzed[0].record;
    assert_eq!(r.path.accounting.network, std::time::Duration::ZERO);
    assert_eq!(
        exclusive(r),
        [
            ("S1:O1".to_owned(), 300),
            ("S1:O1;S1:O2;S2:O3".to_owned(), 441),
            ("S1:O1;S1:O2;S2:O3;S2:O4".to_owned(), 59),
            ("S1:O1;S1:O6;S3:O7".to_owned(), 200),
        ]
    );
    assert_eq!(
        r.labels.get("skew.shifted_spans").map(String::as_str),
        Some("3")
    );
}

#[test]
fn cpt_accounting_differs_from_the_reference_where_documented() {
    // Case 10: overlapping siblings. The reference charges each child its
    // full duration (the 1 µs overlaps counted twice, taken twice from the
    // parent); cpt cuts the earlier child at the later one's start.
    let (cct, imp) = reference_cct("10.json", Accounting::Cpt);
    assert!(cct.is_empty(), "the CCT is the reference accounting's");
    assert_eq!(
        exclusive(&imp.analyzed[0].record),
        [
            ("S1:O1".to_owned(), 402),
            ("S1:O1;S2:O2".to_owned(), 199),
            ("S1:O1;S3:O3".to_owned(), 99),
            ("S1:O1;S4:O4".to_owned(), 300),
        ]
    );
    let (_, imp) = reference_cct("10.json", Accounting::Crisp);
    assert_eq!(
        exclusive(&imp.analyzed[0].record),
        [
            ("S1:O1".to_owned(), 400),
            ("S1:O1;S2:O2".to_owned(), 200),
            ("S1:O1;S3:O3".to_owned(), 100),
            ("S1:O1;S4:O4".to_owned(), 300),
        ]
    );
}
