//! Import edges seen in public trace files, each on the file's shape:
//! duplicate span ids (Jaeger's `model/converter/json/fixtures/ui_01.json`),
//! consumers that start after the span they hang from ended (jaeger-ui's
//! producer/consumer trace), times out of range in every format, and a
//! bare Zipkin v1 span.

use cpt_collector::traces::{Format, Import, ImportOptions, import_text};

fn run(text: &str, format: Format) -> Import {
    import_text(text, format, &ImportOptions::default(), true, &|_| {})
}

/// Jaeger's `ui_01.json` fixture's shape: two different spans with id `2`
/// (both roots), children of `2`, and a span whose references name
/// another trace's span, `2` as CHILD_OF and `2` as FOLLOWS_FROM. Here
/// with an exact copy of span `3` added.
const UI_01: &str = r#"{"data": [{
  "traceID": "0000000000000001",
  "spans": [
    {"traceID": "0000000000000001", "spanID": "2", "operationName": "test-general-conversion",
     "references": [], "startTime": 1485467191639875, "duration": 5, "tags": [],
     "logs": [{"timestamp": 1485467191639875, "fields": [{"key": "event", "type": "string", "value": "some-event"}]}],
     "processID": "p1", "warnings": null},
    {"traceID": "0000000000000001", "spanID": "2", "operationName": "some-operation",
     "references": [], "startTime": 1485467191639875, "duration": 5,
     "tags": [{"key": "peer.service", "type": "string", "value": "service-y"},
              {"key": "error", "type": "bool", "value": true}],
     "logs": [], "processID": "p1", "warnings": null},
    {"traceID": "0000000000000001", "spanID": "3", "operationName": "some-operation",
     "references": [{"refType": "CHILD_OF", "traceID": "0000000000000001", "spanID": "2"}],
     "startTime": 1485467191639875, "duration": 5, "tags": [], "logs": [], "processID": "p2", "warnings": null},
    {"traceID": "0000000000000001", "spanID": "3", "operationName": "some-operation",
     "references": [{"refType": "CHILD_OF", "traceID": "0000000000000001", "spanID": "2"}],
     "startTime": 1485467191639875, "duration": 5, "tags": [], "logs": [], "processID": "p2", "warnings": null},
    {"traceID": "0000000000000001", "spanID": "4", "operationName": "reference-test",
     "references": [{"refType": "CHILD_OF", "traceID": "00000000000000ff", "spanID": "ff"},
                    {"refType": "CHILD_OF", "traceID": "0000000000000001", "spanID": "2"},
                    {"refType": "FOLLOWS_FROM", "traceID": "0000000000000001", "spanID": "2"}],
     "startTime": 1485467191639875, "duration": 5, "tags": [], "logs": [], "processID": "p2",
     "warnings": ["some span warning"]},
    {"traceID": "0000000000000001", "spanID": "5", "operationName": "preserveParentID-test",
     "references": [{"refType": "CHILD_OF", "traceID": "0000000000000001", "spanID": "4"}],
     "startTime": 1485467191639875, "duration": 4, "tags": [], "logs": [], "processID": "p2",
     "warnings": ["some span warning"]}
  ],
  "processes": {"p1": {"serviceName": "service-x", "tags": []},
                "p2": {"serviceName": "service-y", "tags": []}},
  "warnings": ["some trace warning"]
}]}"#;

#[test]
fn jaeger_duplicate_span_ids_identical_merged_differing_kept_apart_and_labelled() {
    let imp = run(UI_01, Format::Jaeger);
    assert!(
        imp.errors.is_empty(),
        "accepted as Jaeger UI shows it: {:?}",
        imp.errors
    );
    assert_eq!(
        imp.stats.duplicates_dropped, 1,
        "the identical copy of 3 merged"
    );
    assert_eq!(
        imp.stats.duplicates_renamed, 1,
        "the second span 2 kept apart"
    );
    assert_eq!(imp.stats.spans, 5, "2, 2~dup1, 3, 4, 5");
    // Both spans 2 are roots: a record each, both labelled.
    let mut roots: Vec<(&str, Option<&str>)> = imp
        .records()
        .map(|r| {
            (
                r.endpoint.as_deref().unwrap_or(""),
                r.labels
                    .get("import.duplicate_span_ids")
                    .map(String::as_str),
            )
        })
        .collect();
    roots.sort();
    assert_eq!(
        roots,
        [
            ("some-operation", Some("1")),
            ("test-general-conversion", Some("1"))
        ]
    );
    let ids: Vec<&str> = imp
        .records()
        .filter_map(|r| r.request_id.as_deref())
        .collect();
    assert!(ids.contains(&"2") && ids.contains(&"2~dup1"), "{ids:?}");
}

/// jaeger-ui's producer/consumer shape: the producing service's span
/// hands messages to a queue and returns; two consumer spans (other
/// processes) under it start after it ended.
fn producer_consumer(producer_kind: &str) -> String {
    let kind = |k: &str| {
        if k.is_empty() {
            String::new()
        } else {
            format!(r#"{{"key": "span.kind", "type": "string", "value": "{k}"}}"#)
        }
    };
    format!(
        r#"{{"data": [{{"traceID": "pc", "processes": {{
      "p1": {{"serviceName": "orders", "tags": [{{"key": "hostname", "type": "string", "value": "h1"}}]}},
      "p2": {{"serviceName": "billing", "tags": [{{"key": "hostname", "type": "string", "value": "h2"}}]}},
      "p3": {{"serviceName": "mailer", "tags": [{{"key": "hostname", "type": "string", "value": "h3"}}]}}}},
    "spans": [
      {{"traceID": "pc", "spanID": "r", "operationName": "POST /order", "references": [],
        "startTime": 1000, "duration": 100, "processID": "p1", "tags": [{server}]}},
      {{"traceID": "pc", "spanID": "send", "operationName": "send order-created", "references":
        [{{"refType": "CHILD_OF", "traceID": "pc", "spanID": "r"}}],
        "startTime": 1020, "duration": 10, "processID": "p1", "tags": [{producer}]}},
      {{"traceID": "pc", "spanID": "c1", "operationName": "receive order-created", "references":
        [{{"refType": "CHILD_OF", "traceID": "pc", "spanID": "send"}}],
        "startTime": 1500, "duration": 40, "processID": "p2", "tags": [{consumer}]}},
      {{"traceID": "pc", "spanID": "c2", "operationName": "receive order-created", "references":
        [{{"refType": "CHILD_OF", "traceID": "pc", "spanID": "send"}}],
        "startTime": 1700, "duration": 60, "processID": "p3", "tags": [{consumer}]}}
    ]}}]}}"#,
        server = kind("server"),
        producer = kind(producer_kind),
        consumer = kind("consumer"),
    )
}

#[test]
fn consumers_starting_after_their_parent_ended_are_kept_off_the_path() {
    // With the producer marked as such, and with a parent of no kind (the
    // public trace's shape): the consumers are kept, not dropped as skew.
    for producer in ["producer", ""] {
        let imp = run(&producer_consumer(producer), Format::Jaeger);
        assert!(imp.errors.is_empty(), "{:?}", imp.errors);
        assert_eq!(imp.stats.records, 1, "one root");
        let r = imp.records().next().unwrap();
        assert_eq!(
            r.labels.get("skew.dropped_spans"),
            None,
            "producer {producer:?}: nothing dropped as skew: {:?}",
            r.labels
        );
        assert_eq!(
            r.labels.get("async.subtrees").map(String::as_str),
            Some("2"),
            "producer {producer:?}: both consumers counted as not waited for"
        );
        // Off the path: the root's 100 µs are the root's and the sender's.
        let total: u128 = r
            .path
            .segments()
            .iter()
            .map(|s| s.duration.as_micros())
            .sum();
        assert_eq!(total, 100);
        assert!(r.path.segments().iter().all(|s| {
            s.stack
                .iter()
                .all(|f| &*r.path.frame(*f).name != "receive order-created")
        }));
    }
}

/// Times out of range: every time field of every format gets the
/// out-of-range message (naming the field and the value), never "not an
/// integer".
#[test]
fn out_of_range_times_get_the_out_of_range_message_in_every_format() {
    const U64_MAX: &str = "18446744073709551615";
    const HUGE: &str = "100000000000000000000000"; // past u64: a float to JSON readers
    let jaeger = |start: &str, dur: &str| {
        format!(
            r#"{{"data": [{{"traceID": "t", "processes": {{"p": {{"serviceName": "s"}}}}, "spans": [
            {{"traceID": "t", "spanID": "a", "operationName": "o", "references": [],
              "startTime": {start}, "duration": {dur}, "processID": "p"}}]}}]}}"#
        )
    };
    let zipkin = |ts: &str, dur: &str| {
        format!(
            r#"[{{"traceId": "t", "id": "a", "name": "o", "timestamp": {ts}, "duration": {dur},
               "localEndpoint": {{"serviceName": "s"}}}}]"#
        )
    };
    let otlp = |start: &str, end: &str| {
        format!(
            r#"{{"resourceSpans": [{{"resource": {{"attributes": [{{"key": "service.name",
              "value": {{"stringValue": "s"}}}}]}}, "scopeSpans": [{{"spans": [{{
              "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
              "name": "o", "kind": 2, "startTimeUnixNano": {start}, "endTimeUnixNano": {end}}}]}}]}}]}}"#
        )
    };
    let nezha = |start: &str, end: &str| {
        format!(
            "TraceID,SpanID,ParentID,PodName,OperationName,StartTimeUnixNano,EndTimeUnixNano,Duration\n\
             t,a,root,frontend-579b9bff58-t2dbm,Recv.,{start},{end},4\n"
        )
    };
    // The year 2339 in ns, as an OTLP uint64 string.
    let y2339 = "\"11700000000000000000\"";
    let cases: Vec<(Format, String, &str)> = vec![
        (Format::Jaeger, jaeger(U64_MAX, "5"), "startTime"),
        (Format::Jaeger, jaeger(HUGE, "5"), "startTime"),
        (Format::Jaeger, jaeger("1000", U64_MAX), "duration"),
        (Format::Jaeger, jaeger("-5", "5"), "startTime"),
        (Format::Zipkin, zipkin(U64_MAX, "5"), "timestamp"),
        (Format::Zipkin, zipkin("1000", HUGE), "duration"),
        (Format::Otlp, otlp(y2339, "\"1\""), "startTimeUnixNano"),
        (Format::Otlp, otlp("\"1000\"", y2339), "endTimeUnixNano"),
        (Format::Otlp, otlp(U64_MAX, "1"), "startTimeUnixNano"),
        (Format::Otlp, otlp("1000", HUGE), "endTimeUnixNano"),
        (Format::Nezha, nezha(U64_MAX, "1"), "StartTimeUnixNano"),
        (
            Format::Nezha,
            nezha("1000", "99999999999999999999999"),
            "EndTimeUnixNano",
        ),
    ];
    for (format, text, field) in cases {
        let imp = run(&text, format);
        let msg = imp
            .errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ");
        assert!(
            msg.contains(&format!("{field} = ")) && msg.contains("is out of range"),
            "{format:?} {field}: {msg}"
        );
        assert!(!msg.contains("not an integer"), "{format:?} {field}: {msg}");
    }
}

#[test]
fn a_bare_zipkin_v1_object_gets_the_v1_message() {
    let v1 = r#"{"traceId": "a", "id": "b", "name": "get", "timestamp": 1000, "duration": 5,
      "annotations": [{"timestamp": 1000, "value": "sr", "endpoint": {"serviceName": "s"}}],
      "binaryAnnotations": []}"#;
    for text in [v1.to_owned(), format!("[{v1}]")] {
        let imp = run(&text, Format::Zipkin);
        let msg = imp.errors.iter().map(|e| e.to_string()).collect::<String>();
        assert!(
            msg.contains("this is Zipkin v1 JSON, not v2"),
            "{text}: {msg}"
        );
    }
    // A bare v2 object says what a v2 file is.
    let v2 = r#"{"traceId": "a", "id": "b", "name": "get", "timestamp": 1000, "duration": 5}"#;
    let msg = run(v2, Format::Zipkin)
        .errors
        .iter()
        .map(|e| e.to_string())
        .collect::<String>();
    assert!(msg.contains("wrap a single span in [ ]"), "{msg}");
}
