//! Children their parent does not wait for: a Jaeger
//! `FOLLOWS_FROM` child, a consumer under a producer (Jaeger `span.kind`
//! tags, OTLP `SPAN_KIND_PRODUCER`/`SPAN_KIND_CONSUMER`, Zipkin
//! `PRODUCER`/`CONSUMER`) and an OTLP span link are never on the parent's
//! critical path (the Jaeger UI's critical path and CRISP agree).
//!
//! The case of the issue, in every format: producer A [0, 30] µs; consumer B
//! [15, 25] (a child of A by `FOLLOWS_FROM` or by kind) with its own child C
//! [18, 20]. Before the rule the path was {A 15, A→B 3, A→B→C 2, A→B 5,
//! A 5}-like: B was taken as A's blocker. The path must be {A 30}.

use cpt_collector::traces::{Endpoint, Format, Import, ImportOptions, RootSelector, import_text};

use crate::support::path_string;

fn run(text: &str, format: Format) -> Import {
    run_with(text, format, &ImportOptions::default())
}

fn run_with(text: &str, format: Format, opts: &ImportOptions) -> Import {
    let imp = import_text(text, format, opts, true, &|_| {});
    assert!(imp.errors.is_empty(), "{:?}", imp.errors);
    imp
}

/// Nothing of `r` was repaired as clock skew: no `skew.*` label, no
/// `clock_skew` time.
fn assert_no_skew(r: &cpt_sdk::Record) {
    assert!(r.path.accounting.clock_skew.is_zero(), "{:?}", r.labels);
    assert!(
        !r.labels.keys().any(|k| k.starts_with("skew.")),
        "{:?}",
        r.labels
    );
}

/// One Jaeger span: `(id, parent reference, kind tag, op, start µs, dur µs)`.
type JSpan<'a> = (
    &'a str,
    Option<(&'a str, &'a str)>,
    Option<&'a str>,
    &'a str,
    i64,
    i64,
);

fn jaeger(spans: &[JSpan<'_>]) -> String {
    let spans: Vec<String> = spans
        .iter()
        .map(|(id, parent, kind, op, start, dur)| {
            let refs = parent
                .map(|(ty, p)| format!(r#"[{{"refType":"{ty}","traceID":"t","spanID":"{p}"}}]"#))
                .unwrap_or_else(|| "[]".into());
            let tags = kind
                .map(|k| format!(r#"[{{"key":"span.kind","type":"string","value":"{k}"}}]"#))
                .unwrap_or_else(|| "[]".into());
            format!(
                r#"{{"traceID":"t","spanID":"{id}","operationName":"{op}","references":{refs},"startTime":{start},"duration":{dur},"tags":{tags},"processID":"p1"}}"#
            )
        })
        .collect();
    format!(
        r#"{{"data":[{{"traceID":"t","processes":{{"p1":{{"serviceName":"s","tags":[]}}}},"spans":[{}]}}]}}"#,
        spans.join(",")
    )
}

#[test]
fn jaeger_follows_from_consumer_is_not_waited_for() {
    let text = jaeger(&[
        ("a", None, Some("producer"), "A", 0, 30),
        (
            "b",
            Some(("FOLLOWS_FROM", "a")),
            Some("consumer"),
            "B",
            15,
            10,
        ),
        ("c", Some(("CHILD_OF", "b")), None, "C", 18, 2),
    ]);
    let imp = run(&text, Format::Jaeger);
    assert_eq!(imp.analyzed.len(), 1);
    let r = &imp.analyzed[0].record;
    assert_eq!(path_string(r), "s:A 30");
    // Nothing is lost silently: the left-out subtree is counted.
    assert_eq!(
        r.labels.get("async.subtrees").map(String::as_str),
        Some("1")
    );
    assert_eq!(r.labels.get("async.spans").map(String::as_str), Some("2"));
}

#[test]
fn jaeger_follows_from_without_kinds_is_not_waited_for() {
    let text = jaeger(&[
        ("a", None, None, "A", 0, 30),
        ("b", Some(("FOLLOWS_FROM", "a")), None, "B", 15, 10),
    ]);
    assert_eq!(
        path_string(&run(&text, Format::Jaeger).analyzed[0].record),
        "s:A 30"
    );
}

#[test]
fn jaeger_consumer_child_of_producer_is_not_waited_for() {
    // CHILD_OF, but the kinds say it is a message consumed from a queue.
    let text = jaeger(&[
        ("a", None, Some("producer"), "A", 0, 30),
        ("b", Some(("CHILD_OF", "a")), Some("consumer"), "B", 15, 10),
    ]);
    assert_eq!(
        path_string(&run(&text, Format::Jaeger).analyzed[0].record),
        "s:A 30"
    );
}

#[test]
fn jaeger_plain_child_of_a_producer_is_waited_for() {
    // The producer's own work (serialising, sending) is a child it waits for.
    let text = jaeger(&[
        ("a", None, Some("producer"), "A", 0, 30),
        ("b", Some(("CHILD_OF", "a")), None, "send", 15, 10),
    ]);
    assert_eq!(
        path_string(&run(&text, Format::Jaeger).analyzed[0].record),
        "s:A 15|s:A;s:send 10|s:A 5"
    );
}

#[test]
fn jaeger_consumer_after_its_producer_ended_is_not_skew() {
    // The consumer runs long after the producer returned: not a child
    // outside its parent (no truncation, no drop, no clock-skew time).
    let text = jaeger(&[
        ("a", None, Some("producer"), "A", 0, 30),
        (
            "b",
            Some(("FOLLOWS_FROM", "a")),
            Some("consumer"),
            "B",
            500,
            10,
        ),
        ("c", Some(("CHILD_OF", "b")), None, "C", 502, 2),
    ]);
    let imp = run(&text, Format::Jaeger);
    let r = &imp.analyzed[0].record;
    assert_eq!(path_string(r), "s:A 30");
    assert_no_skew(r);
    assert_eq!(r.labels.get("async.spans").map(String::as_str), Some("2"));
}

#[test]
fn jaeger_consumer_selected_as_root_gets_its_own_path() {
    let text = jaeger(&[
        ("a", None, Some("producer"), "A", 0, 30),
        (
            "b",
            Some(("FOLLOWS_FROM", "a")),
            Some("consumer"),
            "B",
            500,
            10,
        ),
        ("c", Some(("CHILD_OF", "b")), None, "C", 502, 2),
    ]);
    let opts = ImportOptions {
        roots: RootSelector::Endpoints(vec!["s:B".parse::<Endpoint>().unwrap()]),
        ..ImportOptions::default()
    };
    let imp = run_with(&text, Format::Jaeger, &opts);
    assert_eq!(imp.analyzed.len(), 1);
    assert_eq!(
        path_string(&imp.analyzed[0].record),
        "s:B 2|s:B;s:C 2|s:B 6"
    );
}

/// One OTLP span: `(id, parent, kind, name, start µs, end µs, links)`.
type OSpan<'a> = (&'a str, &'a str, u8, &'a str, i64, i64, &'a [&'a str]);

/// An OTLP JSON document of one service.
fn otlp(spans: &[OSpan<'_>]) -> String {
    let spans: Vec<String> = spans
        .iter()
        .map(|(id, parent, kind, name, s, e, links)| {
            let links: Vec<String> = links
                .iter()
                .map(|l| format!(r#"{{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"{l}"}}"#))
                .collect();
            format!(
                r#"{{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"{id}","parentSpanId":"{parent}","name":"{name}","kind":{kind},"startTimeUnixNano":"{}","endTimeUnixNano":"{}","links":[{}]}}"#,
                s * 1000,
                e * 1000,
                links.join(",")
            )
        })
        .collect();
    format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"s"}}}}]}},"scopeSpans":[{{"spans":[{}]}}]}}]}}"#,
        spans.join(",")
    )
}

#[test]
fn otlp_consumer_of_a_producer_is_not_waited_for() {
    // SPAN_KIND_PRODUCER = 4, SPAN_KIND_CONSUMER = 5, SPAN_KIND_INTERNAL = 1.
    let text = otlp(&[
        ("00000000000000a1", "", 4, "A", 0, 30, &[]),
        ("00000000000000b1", "00000000000000a1", 5, "B", 15, 25, &[]),
        ("00000000000000c1", "00000000000000b1", 1, "C", 18, 20, &[]),
    ]);
    let imp = run(&text, Format::Otlp);
    assert_eq!(imp.analyzed.len(), 1);
    assert_eq!(path_string(&imp.analyzed[0].record), "s:A 30");
    assert_eq!(
        imp.analyzed[0]
            .record
            .labels
            .get("async.spans")
            .map(String::as_str),
        Some("2")
    );
}

#[test]
fn otlp_span_link_is_not_a_parent() {
    // B only links to A: it is a root of its own, and A's path is A's.
    let text = otlp(&[
        ("00000000000000a1", "", 4, "A", 0, 30, &[]),
        (
            "00000000000000b1",
            "",
            5,
            "B",
            15,
            25,
            &["00000000000000a1"],
        ),
        ("00000000000000c1", "00000000000000b1", 1, "C", 18, 20, &[]),
    ]);
    let imp = run(&text, Format::Otlp);
    let mut paths: Vec<String> = imp
        .analyzed
        .iter()
        .map(|a| path_string(&a.record))
        .collect();
    paths.sort();
    assert_eq!(paths, ["s:A 30", "s:B 3|s:B;s:C 2|s:B 5"]);
}

/// One Zipkin v2 span: `(id, parent, kind, name, start µs, duration µs)`.
type ZSpan<'a> = (&'a str, Option<&'a str>, &'a str, &'a str, i64, i64);

/// A Zipkin v2 span list of one service.
fn zipkin(spans: &[ZSpan<'_>]) -> String {
    let spans: Vec<String> = spans
        .iter()
        .map(|(id, parent, kind, name, ts, d)| {
            let parent = parent.map(|p| format!(r#""parentId":"{p}","#)).unwrap_or_default();
            let kind = if kind.is_empty() { String::new() } else { format!(r#""kind":"{kind}","#) };
            format!(
                r#"{{"traceId":"t1",{parent}"id":"{id}",{kind}"name":"{name}","timestamp":{ts},"duration":{d},"localEndpoint":{{"serviceName":"s","ipv4":"1.1.1.1"}}}}"#
            )
        })
        .collect();
    format!("[{}]", spans.join(","))
}

#[test]
fn zipkin_consumer_of_a_producer_is_not_waited_for() {
    let text = zipkin(&[
        ("a", None, "PRODUCER", "A", 1_000_000, 30),
        ("b", Some("a"), "CONSUMER", "B", 1_000_015, 10),
        ("c", Some("b"), "", "C", 1_000_018, 2),
    ]);
    let imp = run(&text, Format::Zipkin);
    assert_eq!(imp.analyzed.len(), 1);
    assert_eq!(path_string(&imp.analyzed[0].record), "s:A 30");
}

#[test]
fn zipkin_lens_messaging_consumer_is_off_its_producers_path() {
    // Zipkin's own messaging example: `get /` [926119, 928958] publishes a
    // message (PRODUCER `publish`, 13 µs); the CONSUMER `next-message`
    // takes it at 929043, after `get /` returned, and `on-message` handles
    // it. Before the rule the consumer was a child outside its parent,
    // dropped as clock skew (2 spans, 14 µs); now it is a detached subtree.
    let path = crate::support::testdata("traces/zipkin-lens/messaging.json");
    let text = std::fs::read_to_string(path).unwrap();
    let imp = run(&text, Format::Zipkin);
    assert_eq!(imp.analyzed.len(), 1);
    let r = &imp.analyzed[0].record;
    assert_eq!(
        path_string(r),
        "frontend:get / 1356|frontend:get /;frontend:publish 13|frontend:get / 1470"
    );
    assert_no_skew(r);
    assert_eq!(
        r.labels.get("async.subtrees").map(String::as_str),
        Some("1")
    );
    assert_eq!(r.labels.get("async.spans").map(String::as_str), Some("2"));
}

/// Jaeger UI's `traceWithOverlappingChildrenLongerThanParent` shape, built
/// from its description: `parent` [100, 140] µs on process p1; `child`
/// [115, 125] on p2, inside the parent; two "async task" children on p2
/// starting at 200 and 300 µs, after the parent returned. `late_only`
/// leaves out `child`, so nothing shows that p2's clock agrees with p1's.
fn jaeger_async_tasks(late_only: bool) -> String {
    let span = |id: &str, op: &str, pid: &str, start: i64, dur: i64| {
        let refs = if id == "a" {
            "[]".to_owned()
        } else {
            r#"[{"refType":"CHILD_OF","traceID":"t","spanID":"a"}]"#.to_owned()
        };
        format!(
            r#"{{"traceID":"t","spanID":"{id}","operationName":"{op}","references":{refs},"startTime":{start},"duration":{dur},"tags":[],"processID":"{pid}"}}"#
        )
    };
    let mut spans = vec![span("a", "parent", "p1", 100, 40)];
    if !late_only {
        spans.push(span("b", "child", "p2", 115, 10));
    }
    spans.push(span("c", "async task 1", "p2", 200, 60));
    spans.push(span("d", "async task 2", "p2", 300, 50));
    format!(
        r#"{{"data":[{{"traceID":"t","processes":{{"p1":{{"serviceName":"api","tags":[]}},"p2":{{"serviceName":"worker","tags":[]}}}},"spans":[{}]}}]}}"#,
        spans.join(",")
    )
}

#[test]
fn jaeger_async_tasks_after_their_parent_are_detached_when_a_sibling_shows_the_clocks_agree() {
    let imp = run(&jaeger_async_tasks(false), Format::Jaeger);
    assert_eq!(imp.analyzed.len(), 1);
    let r = &imp.analyzed[0].record;
    assert_eq!(
        path_string(r),
        "api:parent 15|api:parent;worker:child 10|api:parent 15"
    );
    // Kept and counted as detached, not dropped as clock skew.
    assert_no_skew(r);
    assert_eq!(
        r.labels.get("async.subtrees").map(String::as_str),
        Some("2")
    );
    assert_eq!(r.labels.get("async.spans").map(String::as_str), Some("2"));
    assert_eq!(imp.stats.adjustments.dropped_spans, 0);
}

#[test]
fn jaeger_late_children_on_a_clock_nothing_vouches_for_are_still_skew() {
    // The same late children without the sibling inside the parent: p2's
    // clock may be off, so they are outside their parent (CRISP 9.json).
    let imp = run(&jaeger_async_tasks(true), Format::Jaeger);
    let r = &imp.analyzed[0].record;
    assert_eq!(path_string(r), "api:parent 40");
    assert_eq!(
        r.labels.get("skew.dropped_spans").map(String::as_str),
        Some("2")
    );
    assert_eq!(r.labels.get("async.subtrees"), None);
}

#[test]
fn jaeger_late_child_on_its_parents_own_clock_is_detached() {
    // One process: no skew can put a child after its parent's end.
    let text = jaeger(&[
        ("a", None, None, "A", 0, 30),
        ("b", Some(("CHILD_OF", "a")), None, "B", 10, 5),
        ("c", Some(("CHILD_OF", "a")), None, "C", 40, 10),
    ]);
    let r = &run(&text, Format::Jaeger).analyzed[0].record;
    assert_eq!(path_string(r), "s:A 10|s:A;s:B 5|s:A 15");
    assert_eq!(r.labels.get("skew.dropped_spans"), None);
    assert_eq!(
        r.labels.get("async.subtrees").map(String::as_str),
        Some("1")
    );
}

#[test]
fn jaeger_producers_plain_child_that_ends_after_it_is_detached() {
    // Zipkin lens's `send` (PRODUCER) and its `handle` child: the handler
    // starts inside the producer and runs on after it returned, on the same
    // process. The producer initiated it and did not wait for it.
    let text = jaeger(&[
        ("a", None, Some("producer"), "A", 0, 30),
        ("b", Some(("CHILD_OF", "a")), None, "handle", 20, 40),
    ]);
    let r = &run(&text, Format::Jaeger).analyzed[0].record;
    assert_eq!(path_string(r), "s:A 30");
    assert_no_skew(r);
    assert_eq!(r.labels.get("overhang.spans"), None);
    assert_eq!(
        r.labels.get("async.subtrees").map(String::as_str),
        Some("1")
    );
}

#[test]
fn jaeger_child_its_parent_ended_during_is_cut_there_and_not_counted_as_skew() {
    // Online Boutique's currencyservice, every call: the server span
    // `Convert` [0, 300] µs ends when its response is sent from inside
    // `GetCurrencyData` [100, 1000], on the same process. The path charges
    // the child up to the parent's end; the 700 µs after it are off the
    // path and counted apart, not as clock skew.
    let text = jaeger(&[
        ("a", None, Some("server"), "Convert", 0, 300),
        (
            "b",
            Some(("CHILD_OF", "a")),
            None,
            "GetCurrencyData",
            100,
            900,
        ),
    ]);
    let imp = run(&text, Format::Jaeger);
    let r = &imp.analyzed[0].record;
    assert_eq!(
        path_string(r),
        "s:Convert 100|s:Convert;s:GetCurrencyData 200"
    );
    assert_no_skew(r);
    assert_eq!(
        r.labels.get("overhang.spans").map(String::as_str),
        Some("1")
    );
    assert_eq!(
        r.labels.get("overhang.ns").map(String::as_str),
        Some("700000")
    );
    assert_eq!(imp.stats.adjustments.overhang_ns, 700_000);
    assert_eq!(imp.stats.adjustments.truncated_spans, 0);
}

#[test]
fn jaeger_child_outliving_its_parent_on_a_clock_nothing_vouches_for_is_skew() {
    // The same shape with the child alone on another process: its clock may
    // be off, so the cut is clock-skew repair (CRISP §5.2, `7.json`).
    let text = r#"{"data":[{"traceID":"t","processes":{"p1":{"serviceName":"api","tags":[]},"p2":{"serviceName":"db","tags":[]}},"spans":[
        {"traceID":"t","spanID":"a","operationName":"Convert","references":[],"startTime":0,"duration":300,"tags":[],"processID":"p1"},
        {"traceID":"t","spanID":"b","operationName":"GetCurrencyData","references":[{"refType":"CHILD_OF","traceID":"t","spanID":"a"}],"startTime":100,"duration":900,"tags":[],"processID":"p2"}]}]}"#;
    let r = &run(text, Format::Jaeger).analyzed[0].record;
    assert_eq!(
        path_string(r),
        "api:Convert 100|api:Convert;db:GetCurrencyData 200"
    );
    assert_eq!(
        r.labels.get("skew.truncated_ns").map(String::as_str),
        Some("700000")
    );
    assert_eq!(r.path.accounting.clock_skew.as_micros(), 700);
    assert_eq!(r.labels.get("overhang.spans"), None);
}
