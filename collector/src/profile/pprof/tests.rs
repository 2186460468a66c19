use std::fmt::Write as _;
use std::time::Duration;

use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
use cpt_sdk::record::Record;
use cpt_sdk::trigger::Trigger;

use super::*;
use crate::records::selection::Selection;
use cpt_sdk::testing::fixtures::table1;

/// A compact, stable text form of a profile for golden files.
pub(crate) fn dump(p: &Profile) -> String {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let mut out = String::new();
    let _ = writeln!(out, "strings: {:?}", p.string_table);
    for t in &p.sample_type {
        let _ = writeln!(out, "sample_type: {}/{}", s(t.r#type), s(t.unit));
    }
    let _ = writeln!(out, "default_sample_type: {}", s(p.default_sample_type));
    for f in &p.function {
        let _ = writeln!(
            out,
            "function {}: name={:?} system_name={:?} filename={:?} start_line={}",
            f.id,
            s(f.name),
            s(f.system_name),
            s(f.filename),
            f.start_line
        );
    }
    for l in &p.location {
        let lines: Vec<String> = l
            .line
            .iter()
            .map(|x| format!("{}:{}", x.function_id, x.line))
            .collect();
        let _ = writeln!(out, "location {}: {}", l.id, lines.join(","));
    }
    for smp in &p.sample {
        let _ = writeln!(out, "sample {:?} = {:?}", smp.location_id, smp.value);
    }
    for c in &p.comment {
        let _ = writeln!(out, "comment: {}", s(*c));
    }
    let _ = writeln!(
        out,
        "time_nanos={} duration_nanos={}",
        p.time_nanos, p.duration_nanos
    );
    out
}

fn golden(name: &str, got: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("CPT_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with CPT_UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert_eq!(
        got,
        want,
        "golden file {} differs (CPT_UPDATE_GOLDEN=1 rewrites it)",
        path.display()
    );
}

fn table1_with_locations() -> Vec<Record> {
    let mut recs = table1();
    // Give request 2's B1 a source location and both requests start times.
    let mut p = CriticalPath::new();
    let a1 = Frame::new("A", "A1");
    let b1 = Frame::new("B", "B1").with_location("b/src/lib.rs", 12);
    p.push_frames([a1.clone()], Duration::from_millis(2), SegmentKind::Busy);
    p.push_frames(
        [a1.clone(), b1],
        Duration::from_millis(4),
        SegmentKind::Busy,
    );
    p.push_frames([a1], Duration::from_millis(2), SegmentKind::Busy);
    recs[1] = Record::new("A", Trigger::Sampled, p);
    recs[0].start_unix_nanos = Some(1_700_000_000_000_000_000);
    recs[1].start_unix_nanos = Some(1_700_000_001_000_000_000);
    recs
}

#[test]
fn cpt_table1_profile_golden() {
    let agg = Aggregate::from_records(&Selection::new(), table1_with_locations());
    let p = to_profile(&agg);
    assert_eq!(p.string_table[0], "");
    golden("table1.profile.txt", &dump(&p));
    // Same aggregate, same bytes.
    let again = Aggregate::from_records(&Selection::new(), table1_with_locations());
    assert_eq!(encode_gzip(&agg), encode_gzip(&again));
}

#[test]
fn cpt_table1_profile_values_are_means_and_total_is_mean_latency() {
    let agg = Aggregate::from_records(&Selection::new(), table1());
    let p = to_profile(&agg);
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 12_000_000);
    let sums: i64 = p.sample.iter().map(|s| s.value[2]).sum();
    assert_eq!(sums, 24_000_000);
    assert_eq!(
        p.string_table[p.default_sample_type as usize],
        CRITICAL_PATH
    );
    assert!(
        p.comment
            .iter()
            .any(|&c| p.string_table[c as usize] == "cpt.requests=2")
    );
}

#[test]
fn profile_round_trips_through_bytes() {
    let agg = Aggregate::from_records(&Selection::new(), table1_with_locations());
    let back = read_aggregate(&encode_gzip(&agg)).unwrap();
    assert_eq!(back.frames(), agg.frames());
    assert_eq!(back.requests(), 2);
    assert_eq!(back.mean_latency(), Duration::from_millis(12));
    let strip = |a: &Aggregate| -> Vec<(Box<[u32]>, u64, u64)> {
        a.stacks()
            .iter()
            .map(|s| (s.stack.clone(), s.sum_nanos, s.requests))
            .collect()
    };
    assert_eq!(strip(&back), strip(&agg));
    assert_eq!(back.start_range(), agg.start_range());
    // Re-encoding what was read gives the same profile (minus spread detail).
    assert_eq!(dump(&to_profile(&back)), dump(&to_profile(&agg)));
}

#[test]
fn cpt_merge_two_profiles_keeps_the_average() {
    // Collector 1 saw request 1 (16 ms), collector 2 saw request 2 (8 ms).
    let t = table1();
    let one = encode_gzip(&Aggregate::from_records(&Selection::new(), [&t[0]]));
    let two = encode_gzip(&Aggregate::from_records(&Selection::new(), [&t[1]]));
    let mut merged = read_aggregate(&one).unwrap();
    merged.merge(&read_aggregate(&two).unwrap());
    let p = to_profile(&merged);
    let s = |i: i64| p.string_table[i as usize].clone();
    let mut got: Vec<(String, i64, i64)> = p
        .sample
        .iter()
        .map(|smp| {
            let names: Vec<String> = smp
                .location_id
                .iter()
                .rev()
                .map(|&l| s(p.function[l as usize - 1].name))
                .collect();
            (names.join("/"), smp.value[0], smp.value[1])
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("A1 (A)".into(), 5_000_000, 2),
            ("A1 (A)/A2 (A)".into(), 5_000_000, 1),
            ("A1 (A)/B1 (B)".into(), 2_000_000, 1),
        ]
    );
    assert_eq!(merged.requests(), 2);
}

#[test]
fn profile_from_another_tool_is_read_with_one_request() {
    let mut st = StringTable::new();
    let cpu = st.intern("cpu");
    let ns = st.intern("nanoseconds");
    let main = st.intern("main");
    let work = st.intern("work");
    let file = st.intern("main.go");
    let p = Profile {
        sample_type: vec![ValueType {
            r#type: cpu,
            unit: ns,
        }],
        sample: vec![Sample {
            location_id: vec![1],
            value: vec![70],
            label: vec![],
        }],
        location: vec![Location {
            id: 1,
            line: vec![
                Line {
                    function_id: 2,
                    line: 9,
                    column: 0,
                },
                Line {
                    function_id: 1,
                    line: 3,
                    column: 0,
                },
            ],
            ..Default::default()
        }],
        function: vec![
            Function {
                id: 1,
                name: main,
                system_name: main,
                filename: file,
                start_line: 1,
            },
            Function {
                id: 2,
                name: work,
                system_name: work,
                filename: file,
                start_line: 7,
            },
        ],
        string_table: st.strings,
        ..Default::default()
    };
    let agg = from_profile(&p).unwrap();
    assert_eq!(agg.requests(), 1);
    assert_eq!(agg.stacks().len(), 1);
    let names: Vec<String> = agg
        .stack_frames(&agg.stacks()[0])
        .map(|f| f.name.to_string())
        .collect();
    assert_eq!(names, ["main", "work"]); // inlined lines expand caller first
    assert_eq!(agg.stacks()[0].sum_nanos, 70);
}

#[test]
fn profile_malformed_input_says_what_is_wrong() {
    #[rustfmt::skip]
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![0x1f, 0x8b, 1, 2, 3], "gzip"),
        (vec![0xff, 0xff, 0xff], "not a pprof profile.proto"),
        (Profile { string_table: vec!["".into()], sample: vec![Sample { location_id: vec![7], value: vec![1], label: vec![] }], ..Default::default() }.encode_to_vec(), "names location 7"),
        (Profile { string_table: vec!["x".into()], ..Default::default() }.encode_to_vec(), "string_table[0]"),
        (Profile { string_table: vec!["".into()], comment: vec![9], ..Default::default() }.encode_to_vec(), "string index 9"),
    ];
    for (bytes, want) in cases {
        let err = read_aggregate(&bytes).unwrap_err().to_string();
        assert!(err.contains(want), "got {err:?}, want {want:?}");
    }
}
