//! Edge cases of the walk and of malformed input, on synthetic Jaeger JSON.

use cpt_collector::traces::{Format, ImportOptions, import_text};

use crate::support::{exclusive, path_string};

/// A Jaeger document: spans `(id, parent, op, start µs, duration µs)`, one
/// service `s`.
fn doc(trace: &str, spans: &[(&str, Option<&str>, &str, i64, i64)]) -> String {
    let spans: Vec<String> = spans
        .iter()
        .map(|(id, parent, op, start, dur)| {
            let refs = parent
                .map(|p| format!(r#"[{{"refType":"CHILD_OF","traceID":"{trace}","spanID":"{p}"}}]"#))
                .unwrap_or_else(|| "[]".into());
            format!(
                r#"{{"traceID":"{trace}","spanID":"{id}","operationName":"{op}","references":{refs},"startTime":{start},"duration":{dur},"tags":[],"processID":"p1"}}"#
            )
        })
        .collect();
    format!(
        r#"{{"traceID":"{trace}","processes":{{"p1":{{"serviceName":"s","tags":[]}}}},"spans":[{}]}}"#,
        spans.join(",")
    )
}

fn envelope(traces: &[String]) -> String {
    format!(r#"{{"data":[{}],"total":0}}"#, traces.join(","))
}

fn run(text: &str) -> cpt_collector::traces::Import {
    import_text(
        text,
        Format::Jaeger,
        &ImportOptions::default(),
        true,
        &|_| {},
    )
}

#[test]
fn edge_equal_end_times_pick_the_longer_child() {
    // B[0,10] and C[5,10] end together: B (earlier start) is the LFC and
    // covers C entirely; C is off the path.
    let t = doc(
        "e1",
        &[
            ("a", None, "A", 0, 20),
            ("b", Some("a"), "B", 0, 10),
            ("c", Some("a"), "C", 5, 5),
        ],
    );
    let imp = run(&envelope(&[t]));
    assert_eq!(path_string(&imp.analyzed[0].record), "s:A;s:B 10|s:A 10");
}

#[test]
fn edge_zero_length_children_are_never_on_the_path() {
    // Z is zero-length in the middle of A; W is zero-length at A's end.
    let t = doc(
        "e2",
        &[
            ("a", None, "A", 0, 20),
            ("z", Some("a"), "Z", 10, 0),
            ("w", Some("a"), "W", 20, 0),
        ],
    );
    let imp = run(&envelope(&[t]));
    let r = &imp.analyzed[0].record;
    assert_eq!(path_string(r), "s:A 20");
    assert_eq!(imp.analyzed[0].shape.path_spans, 1);
}

#[test]
fn edge_children_touching_end_to_start_are_both_on_the_path() {
    let t = doc(
        "e3",
        &[
            ("a", None, "A", 0, 30),
            ("b", Some("a"), "B", 0, 10),
            ("c", Some("a"), "C", 10, 20),
        ],
    );
    let imp = run(&envelope(&[t]));
    let r = &imp.analyzed[0].record;
    assert_eq!(path_string(r), "s:A;s:B 10|s:A;s:C 20");
    assert!(!r.labels.contains_key("skew.overlaps"));
    // Touching is not concurrent.
    assert_eq!(imp.analyzed[0].shape.concurrency, 1);
}

#[test]
fn edge_child_equal_to_parent_takes_all_the_time() {
    let t = doc(
        "e4",
        &[("a", None, "A", 5, 50), ("b", Some("a"), "B", 5, 50)],
    );
    let imp = run(&envelope(&[t]));
    assert_eq!(
        exclusive(&imp.analyzed[0].record),
        vec![("s:A;s:B".to_string(), 50)]
    );
}

#[test]
fn edge_malformed_traces_are_reported_counted_and_skipped() {
    let good = doc("good", &[("a", None, "A", 0, 10)]);
    let missing = doc(
        "missing",
        &[("a", None, "A", 0, 10), ("b", Some("nope"), "B", 1, 1)],
    );
    let cycle = doc(
        "cycle",
        &[
            ("a", None, "A", 0, 10),
            ("b", Some("c"), "B", 1, 1),
            ("c", Some("b"), "C", 1, 1),
        ],
    );
    let dup = doc(
        "dup",
        &[
            ("a", None, "A", 0, 10),
            ("b", Some("a"), "B", 1, 1),
            ("b", Some("a"), "B", 2, 1),
        ],
    );
    let neg = doc("neg", &[("a", None, "A", 0, -5)]);
    let text = envelope(&[good.clone(), missing, cycle, dup, neg, good]);
    let imp = run(&text);
    // `dup`'s two differing spans `b` are both kept (the second as
    // `b~dup1`): three traces rejected, three analysed.
    assert_eq!(
        (imp.stats.traces, imp.stats.rejected, imp.stats.records),
        (6, 3, 3)
    );
    assert_eq!(imp.stats.duplicates_renamed, 1);
    let msgs: Vec<String> = imp.errors.iter().map(|e| e.to_string()).collect();
    for want in [
        "trace missing: span b references missing parent nope",
        "trace cycle: span",
        "trace neg: span a has a negative duration",
    ] {
        assert!(
            msgs.iter().any(|m| m.starts_with(want)),
            "{want:?} not in {msgs:?}"
        );
    }
    // Truncated file: the complete traces before the cut are kept.
    let cut = &text[..text.len() - 40];
    let imp = run(cut);
    assert_eq!(imp.stats.records, 2, "`good` and `dup`");
    assert!(
        imp.errors
            .iter()
            .any(|e| e.to_string().contains("unreadable JSON")),
        "{:?}",
        imp.errors
    );
}

#[test]
fn edge_ten_thousand_deep_chain_does_not_overflow() {
    // Each level starts 1 µs after its parent and ends 1 µs before it.
    const DEPTH: i64 = 10_000;
    let ids: Vec<String> = (0..DEPTH).map(|i| format!("n{i}")).collect();
    let spans: Vec<(&str, Option<&str>, &str, i64, i64)> = (0..DEPTH as usize)
        .map(|i| {
            let parent = if i == 0 {
                None
            } else {
                Some(ids[i - 1].as_str())
            };
            (
                ids[i].as_str(),
                parent,
                "op",
                i as i64,
                2 * (DEPTH - i as i64) + 1,
            )
        })
        .collect();
    let text = envelope(&[doc("deep", &spans)]);
    // Run on a small stack to prove the walk is iterative.
    let imp = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || run_seq(&text))
        .unwrap()
        .join()
        .unwrap();
    let a = &imp.analyzed[0];
    assert_eq!(a.shape.depth, DEPTH as u32);
    assert_eq!(a.record.latency.as_micros() as i64, 2 * DEPTH + 1);
    assert_eq!(a.record.path.total(), a.record.latency);
    assert_eq!(a.shape.path_spans, DEPTH as u32);
    // 1 µs before and after each level's child, the leaf's 3 µs in the middle.
    assert_eq!(a.record.path.segments().len() as i64, 2 * (DEPTH - 1) + 1);
}

fn run_seq(text: &str) -> cpt_collector::traces::Import {
    import_text(
        text,
        Format::Jaeger,
        &ImportOptions::default(),
        false,
        &|_| {},
    )
}

#[test]
fn edge_eighty_thousand_span_trace() {
    // A root with 400 sequential children, each fanning out to 199
    // concurrent grandchildren of staggered lengths: 80,001 spans.
    let mut spans: Vec<(String, Option<String>, i64, i64)> =
        vec![("r".into(), None, 0, 400 * 1000)];
    for c in 0..400i64 {
        let id = format!("c{c}");
        spans.push((id.clone(), Some("r".into()), c * 1000, 1000));
        for g in 0..199i64 {
            spans.push((
                format!("g{c}_{g}"),
                Some(id.clone()),
                c * 1000 + 1,
                1 + (g * 7919) % 997,
            ));
        }
    }
    assert_eq!(spans.len(), 80_001);
    let refs: Vec<(&str, Option<&str>, &str, i64, i64)> = spans
        .iter()
        .map(|(id, p, s, d)| (id.as_str(), p.as_deref(), "op", *s, *d))
        .collect();
    let imp = run(&envelope(&[doc("wide", &refs)]));
    assert!(imp.errors.is_empty(), "{:?}", imp.errors);
    let a = &imp.analyzed[0];
    assert_eq!(a.shape.spans, 80_001);
    assert_eq!(a.shape.concurrency, 199);
    assert_eq!(a.record.path.total().as_micros(), 400_000);
    // Under each child exactly one grandchild (the longest; the others start
    // with it, so none happens before it) is on the path. The children tile
    // the root, which has no own time: 400 children + 400 grandchildren.
    assert_eq!(a.shape.path_spans, 800);
}

#[test]
fn edge_one_pass_reader_hands_over_to_the_robust_one_at_a_bad_trace() {
    // The sequential (one-pass) reader stops at the wrongly typed trace; the
    // robust reader takes over from there, so traces after it still count.
    let good = |id: &str| doc(id, &[("a", None, "A", 0, 10)]);
    let bad = good("bad").replace(r#""duration":10"#, r#""duration":"ten""#);
    let text = envelope(&[good("g1"), bad, good("g2"), good("g3")]);
    for parallel in [false, true] {
        let imp = import_text(
            &text,
            Format::Jaeger,
            &ImportOptions::default(),
            parallel,
            &|_| {},
        );
        assert_eq!(
            (imp.stats.traces, imp.stats.rejected, imp.stats.records),
            (4, 1, 3),
            "parallel={parallel}"
        );
        assert_eq!(imp.errors[0].trace_id, "bad");
        let ids: Vec<_> = imp
            .records()
            .map(|r| r.request_id.clone().unwrap())
            .collect();
        assert_eq!(ids.len(), 3);
    }
}

#[test]
fn edge_many_roots_in_one_trace_stay_linear() {
    // 20,000 parentless spans in one trace (e.g. a Zipkin file whose spans
    // lost their parent ids): every span is a root with its own record.
    let ids: Vec<String> = (0..20_000).map(|i| format!("r{i}")).collect();
    let spans: Vec<(&str, Option<&str>, &str, i64, i64)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), None, "op", i as i64, 5))
        .collect();
    let imp = run(&envelope(&[doc("flat", &spans)]));
    assert_eq!(imp.stats.records, 20_000);
    assert!(
        imp.analyzed
            .iter()
            .all(|a| a.record.latency.as_micros() == 5 && a.shape.spans == 1)
    );
}
