//! Importers lose nothing silently: every file's traces, Zipkin's
//! own merge of span pieces, times in the wrong unit refused.

use std::path::PathBuf;

use cpt_collector::traces::{Format, ImportOptions};

use crate::support::import;

/// Write `text` as `name` in `dir`.
fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).expect("write test file");
    p
}

/// One bare Jaeger trace object (what the Jaeger UI saves): a root and a
/// child, times in µs.
fn bare_jaeger(trace: &str, start_us: i64, dur_us: i64) -> String {
    format!(
        r#"{{"traceID":"{trace}","processes":{{"p1":{{"serviceName":"A"}}}},
          "spans":[
            {{"traceID":"{trace}","spanID":"r","operationName":"GET","references":[],
              "startTime":{start_us},"duration":{dur_us},"processID":"p1"}},
            {{"traceID":"{trace}","spanID":"c","operationName":"db","processID":"p1",
              "references":[{{"refType":"CHILD_OF","traceID":"{trace}","spanID":"r"}}],
              "startTime":{},"duration":{}}}
          ]}}"#,
        start_us + 10,
        dur_us / 2
    )
}

#[test]
fn several_bare_single_trace_jaeger_files_keep_every_trace() {
    let dir = tempfile::tempdir().unwrap();
    // As many files as threads (at least two): the import then reads one
    // file per thread, the path that dropped bare trace objects.
    let n = rayon::current_num_threads().max(2);
    let paths: Vec<PathBuf> = (0..n)
        .map(|i| {
            write(
                &dir,
                &format!("t{i}.json"),
                &bare_jaeger(&format!("t{i}"), 1_700_000_000_000_000 + i as i64, 100),
            )
        })
        .collect();
    for stream_above_bytes in [u64::MAX, 0] {
        let opts = ImportOptions {
            stream_above_bytes,
            ..Default::default()
        };
        let imp = import(&paths, Format::Jaeger, &opts);
        assert!(imp.errors.is_empty(), "{:?}", imp.errors);
        assert_eq!(
            (imp.stats.files, imp.stats.traces, imp.stats.records),
            (n as u64, n as u64, n as u64),
            "streamed above {stream_above_bytes} bytes"
        );
        let mut ids: Vec<String> = imp
            .records()
            .map(|r| r.trace_id.clone().unwrap_or_default())
            .collect();
        ids.sort();
        let mut want: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
        want.sort();
        assert_eq!(ids, want);
    }
}

/// The shape of Zipkin's former `netflix.json`: besides a CLIENT and a
/// SERVER record (no `shared` flag) sharing id `x`, pieces of `x` with no
/// `kind` and no `localEndpoint` (late annotations, one of them an exact
/// copy, one with the error tag), and a kind-less piece on the server's
/// endpoint without times. Zipkin's `Trace.merge` folds the endpoint-less
/// pieces into the client and the server-endpoint piece into the server.
const NETFLIX_SHAPE: &str = r#"[
  {"traceId":"t","id":"root","kind":"SERVER","name":"get","timestamp":1000,"duration":100,
   "localEndpoint":{"serviceName":"apip"}},
  {"traceId":"t","parentId":"root","id":"x","kind":"CLIENT","name":"/m/n","timestamp":1010,"duration":80,
   "localEndpoint":{"serviceName":"apip"},"remoteEndpoint":{"serviceName":"api"}},
  {"traceId":"t","parentId":"root","id":"x","name":"/m/n","timestamp":1012,
   "annotations":[{"timestamp":1012,"value":"wr"}],"tags":{"error":"timeout"}},
  {"traceId":"t","parentId":"root","id":"x","kind":"SERVER","name":"/slp","timestamp":1020,"duration":60,
   "localEndpoint":{"serviceName":"api"}},
  {"traceId":"t","parentId":"root","id":"x","name":"/m/n","timestamp":1012,
   "annotations":[{"timestamp":1012,"value":"wr"}],"tags":{"error":"timeout"}},
  {"traceId":"t","parentId":"root","id":"x","tags":{"http.status_code":"200"},
   "localEndpoint":{"serviceName":"api"}},
  {"traceId":"t","parentId":"x","id":"y","name":"db","timestamp":1030,"duration":20,
   "localEndpoint":{"serviceName":"api"}}
]"#;

#[test]
fn zipkin_pieces_with_and_without_endpoints_merge_as_zipkin_does() {
    use cpt_collector::traces::{BuildOptions, SpanKind, zipkin};
    let (traces, errs) = zipkin::read(NETFLIX_SHAPE, BuildOptions::default());
    assert!(errs.is_empty(), "{errs:?}");
    let t = traces
        .into_iter()
        .next()
        .unwrap()
        .expect("the trace is accepted");
    let ids: Vec<&str> = t.spans.iter().map(|s| &*s.span_id).collect();
    assert_eq!(t.spans.len(), 4, "{ids:?}");
    let by = |id: &str| {
        t.spans
            .iter()
            .position(|s| &*s.span_id == id)
            .unwrap_or_else(|| panic!("{id} in {ids:?}"))
    };
    let (x, srv, y) = (by("x"), by("x#s0"), by("y"));
    // The client absorbed the endpoint-less pieces (their error tag too),
    // keeping its own times; one of them was an exact copy.
    assert_eq!(&*t.spans[x].service, "apip");
    assert_eq!(t.spans[x].kind, SpanKind::Client);
    assert_eq!(
        (t.spans[x].start_ns, t.spans[x].duration_ns),
        (1_010_000, 80_000)
    );
    assert!(t.spans[x].error);
    assert_eq!(t.duplicates_dropped, 1);
    // The server half (with the kind-less piece on its endpoint folded in)
    // is the client's child, and `y` (on the server's endpoint) its child.
    assert_eq!(&*t.spans[srv].service, "api");
    assert_eq!(t.spans[srv].kind, SpanKind::Server);
    assert_eq!(t.spans[srv].parent, Some(x as u32));
    assert_eq!(
        (t.spans[srv].start_ns, t.spans[srv].duration_ns),
        (1_020_000, 60_000)
    );
    assert_eq!(t.spans[y].parent, Some(srv as u32));

    // Two non-shared records of one id on different endpoints that are not
    // client and server are both kept, the second as `a~dup1` (Zipkin
    // would lose one).
    let clash = r#"[
      {"traceId":"t","id":"a","name":"get","timestamp":1000,"duration":100,"localEndpoint":{"serviceName":"s1"}},
      {"traceId":"t","id":"a","name":"get","timestamp":1000,"duration":90,"localEndpoint":{"serviceName":"s2"}}
    ]"#;
    let (traces, _) = zipkin::read(clash, BuildOptions::default());
    let t = traces[0].as_ref().expect("kept");
    let ids: Vec<&str> = t.spans.iter().map(|s| &*s.span_id).collect();
    assert_eq!(ids, ["a", "a~dup1"]);
    assert_eq!(t.duplicates_renamed, 1);
}

#[test]
fn nanoseconds_in_microsecond_fields_are_refused_naming_the_span() {
    let dir = tempfile::tempdir().unwrap();
    // Jaeger: startTime and duration written in ns (1.7e18 "µs" overflows
    // i64 nanoseconds), in a file of its own and beside a good file.
    let ns = 1_700_000_000_000_000_000i64;
    let bad = write(&dir, "ns.json", &bare_jaeger("tns", ns, 100_000));
    let good = write(&dir, "us.json", &bare_jaeger("tus", ns / 1000, 100));
    let imp = import(
        &[bad.clone(), good],
        Format::Jaeger,
        &ImportOptions::default(),
    );
    assert_eq!((imp.stats.traces, imp.stats.rejected), (2, 1));
    assert_eq!(imp.stats.records, 1, "only the good trace has a record");
    let e = imp.errors[0].to_string();
    for want in [
        "trace tns",
        "span r",
        "startTime = 1700000000000000000 µs",
        "unit mistake",
    ] {
        assert!(e.contains(want), "{want:?} not in {e}");
    }
    // A start in range whose end overflows: the sum is named.
    let end = write(
        &dir,
        "end.json",
        &bare_jaeger("tend", 4_000_000_000_000_000, 1_000_000_000_000_000),
    );
    let imp = import(&[end], Format::Jaeger, &ImportOptions::default());
    let e = imp.errors[0].to_string();
    assert!(e.contains("span r: startTime + duration"), "{e}");
    // Zipkin, same mistake.
    let z = write(
        &dir,
        "z.json",
        &format!(
            r#"[{{"traceId":"t","id":"a","name":"get","timestamp":{ns},"duration":100000,
                 "localEndpoint":{{"serviceName":"s"}}}}]"#
        ),
    );
    let imp = import(&[z], Format::Zipkin, &ImportOptions::default());
    assert_eq!((imp.stats.rejected, imp.stats.records), (1, 0));
    let e = imp.errors[0].to_string();
    assert!(
        e.contains("span a: timestamp") && e.contains("unit mistake"),
        "{e}"
    );
}

#[test]
fn zipkin_v1_files_are_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let ep = r#"{"serviceName":"frontend","ipv4":"10.0.0.1","port":8080}"#;
    let with_binary = format!(
        r#"[{{"traceId":"t1","id":"a","name":"get","timestamp":1000,"duration":100,
             "annotations":[{{"timestamp":1000,"value":"sr","endpoint":{ep}}},
                            {{"timestamp":1100,"value":"ss","endpoint":{ep}}}],
             "binaryAnnotations":[{{"key":"http.path","value":"/","endpoint":{ep}}}]}}]"#
    );
    let core_only = format!(
        r#"[{{"traceId":"t1","id":"a","name":"get","timestamp":1000,"duration":100,
             "annotations":[{{"timestamp":1000,"value":"cs","endpoint":{ep}}},
                            {{"timestamp":1100,"value":"cr","endpoint":{ep}}}]}}]"#
    );
    for (name, text) in [("binary.json", with_binary), ("core.json", core_only)] {
        let p = write(&dir, name, &text);
        for stream_above_bytes in [u64::MAX, 0] {
            let opts = ImportOptions {
                stream_above_bytes,
                ..Default::default()
            };
            let imp = import(std::slice::from_ref(&p), Format::Zipkin, &opts);
            assert_eq!(imp.stats.records, 0, "{name}");
            assert_eq!(imp.errors.len(), 1, "{name}: {:?}", imp.errors);
            let e = imp.errors[0].to_string();
            assert!(
                e.contains("Zipkin v1") && e.contains("span a") && e.contains("/api/v2/trace"),
                "{name}: {e}"
            );
        }
    }
}

#[test]
fn streamed_zipkin_files_give_the_records_read_whole_files_give() {
    use cpt_collector::traces::BuildOptions;
    let files: Vec<PathBuf> = [
        "skew.json",
        "yelp.json",
        "smartthings-oauth-authorization.json",
        "smartthings-mobile-web-install.json.gz",
    ]
    .iter()
    .map(|f| crate::support::testdata(&format!("traces/zipkin-lens/{f}")))
    .collect();
    let build = BuildOptions {
        orphans_as_roots: true,
    };
    let whole = ImportOptions {
        build,
        stream_above_bytes: u64::MAX,
        ..Default::default()
    };
    let streamed = ImportOptions {
        build,
        stream_above_bytes: 0,
        ..Default::default()
    };
    let a = import(&files, Format::Zipkin, &whole);
    let b = import(&files, Format::Zipkin, &streamed);
    assert!(a.errors.is_empty() && b.errors.is_empty());
    assert_eq!(a.stats, b.stats);
    let recs = |i: &cpt_collector::traces::Import| -> Vec<String> {
        i.records().map(|r| format!("{r:?}")).collect()
    };
    assert_eq!(recs(&a), recs(&b));
}

#[test]
fn streamed_otlp_files_give_the_records_read_whole_files_give() {
    let dir = tempfile::tempdir().unwrap();
    let doc = |svc: &str, spans: &str| {
        format!(
            r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"{svc}"}}}},{{"key":"host.name","value":{{"stringValue":"{svc}-host"}}}}]}},"scopeSpans":[{{"scope":{{"name":"x"}},"spans":[{spans}]}}]}}]}}"#
        )
    };
    let span = |t: &str, id: &str, parent: &str, kind: u8, start: u64, end: u64| {
        format!(
            r#"{{"traceId":"{t}","spanId":"{id}","parentSpanId":"{parent}","name":"op{id}","kind":{kind},"startTimeUnixNano":"{start}","endTimeUnixNano":"{end}"}}"#
        )
    };
    let t0 = 1_700_000_000_000_000_000u64;
    // Two traces whose spans are spread over three lines, one span with a
    // time out of range (rejecting its trace), and a bad line.
    let lines = [
        doc(
            "front",
            &format!(
                "{},{}",
                span("aa", "01", "", 2, t0, t0 + 9_000),
                span("bb", "01", "", 2, t0, t0 + 5_000)
            ),
        ),
        doc("back", &span("aa", "02", "01", 2, t0 + 1_000, t0 + 8_000)),
        "{not json".to_string(),
        doc(
            "back",
            &format!(
                "{},{}",
                span("bb", "02", "01", 3, t0 + 100, t0 + 4_000),
                span("cc", "01", "", 2, t0, 5_000_000_000_000_000_000)
            ),
        ),
    ];
    let jsonl = write(&dir, "lines.json", &(lines.join("\n") + "\n"));
    let one = write(
        &dir,
        "one.json",
        &format!(
            "\n{}\n",
            doc("front", &span("dd", "01", "", 2, t0, t0 + 1_000)).replace(",\"", ",\n\"")
        ),
    );
    for p in [jsonl, one] {
        let whole = import(
            std::slice::from_ref(&p),
            Format::Otlp,
            &ImportOptions {
                stream_above_bytes: u64::MAX,
                ..Default::default()
            },
        );
        let streamed = import(
            std::slice::from_ref(&p),
            Format::Otlp,
            &ImportOptions {
                stream_above_bytes: 0,
                ..Default::default()
            },
        );
        assert_eq!(whole.stats, streamed.stats, "{}", p.display());
        assert_eq!(whole.errors, streamed.errors);
        let recs = |i: &cpt_collector::traces::Import| -> Vec<String> {
            i.records().map(|r| format!("{r:?}")).collect()
        };
        assert_eq!(recs(&whole), recs(&streamed));
        if p.ends_with("lines.json") {
            // aa and bb analysed; cc (time out of range) and the bad line rejected.
            assert_eq!(
                (whole.stats.records, whole.stats.rejected),
                (2, 2),
                "{:?}",
                whole.errors
            );
        } else {
            assert_eq!(whole.stats.records, 1, "{:?}", whole.errors);
        }
    }
}
