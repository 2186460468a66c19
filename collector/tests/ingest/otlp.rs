//! `cpt serve --otlp-grpc / --otlp-http`: OpenTelemetry traces in, the
//! same records as `cpt traces convert --from otlp` of the same spans out;
//! partial success, push-back, bad input, late spans, durability.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cpt_collector::serve::{OtlpConfig, ServeConfig};
use cpt_collector::traces::otlp::pb;
use cpt_collector::traces::{Format, ImportOptions, import_files};
use cpt_sdk::Record;

use crate::support::*;

const WAIT: Duration = Duration::from_millis(300);

fn otlp_on(c: ServeConfig) -> ServeConfig {
    c.with_otlp(OtlpConfig {
        grpc: Some("127.0.0.1:0".parse().unwrap()),
        http: Some("127.0.0.1:0".parse().unwrap()),
        trace_wait: WAIT,
        ..OtlpConfig::default()
    })
}

fn open(mut c: ServeConfig) -> ServeConfig {
    c.metrics_open = true;
    c
}

fn kv(k: &str, v: &str) -> pb::KeyValue {
    pb::KeyValue {
        key: k.into(),
        value: Some(pb::AnyValue {
            value: Some(pb::any_value::Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

fn id(trace: u64, n: u8, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    v[..4].copy_from_slice(&u32::try_from(trace).unwrap().to_be_bytes());
    v[4] = 0xab;
    v[len - 1] = n;
    v
}

#[allow(clippy::too_many_arguments)]
fn span(
    trace: u64,
    n: u8,
    parent: Option<u8>,
    name: &str,
    kind: i32,
    start: u64,
    end: u64,
) -> pb::Span {
    pb::Span {
        trace_id: id(trace, 0, 16),
        span_id: id(trace, n, 8),
        parent_span_id: parent.map(|p| id(trace, p, 8)).unwrap_or_default(),
        name: name.into(),
        kind,
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        ..Default::default()
    }
}

fn resource(service: &str, host: &str, spans: Vec<pb::Span>) -> pb::ResourceSpans {
    pb::ResourceSpans {
        resource: Some(pb::Resource {
            attributes: vec![
                kv("service.name", service),
                kv("host.name", host),
                kv("service.version", "1.4"),
            ],
            ..Default::default()
        }),
        scope_spans: vec![pb::ScopeSpans {
            spans,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Trace `t`: `front GET /api` calls `back` (on another host, its clock
/// `skew` ns off), which queries a database; `front` renders after.
fn trace(t: u64, skew: i64) -> Vec<pb::ResourceSpans> {
    let t0 = an_hour_ago() + (t % 3000) * 1_000_000_000;
    let ms = 1_000_000;
    let b = |x: u64| (x as i64 + skew) as u64;
    vec![
        resource(
            "back",
            "b",
            vec![
                span(t, 3, Some(2), "handle", 2, b(t0 + 12 * ms), b(t0 + 70 * ms)),
                span(
                    t,
                    4,
                    Some(3),
                    "db query",
                    3,
                    b(t0 + 20 * ms),
                    b(t0 + 60 * ms + t * 1000),
                ),
            ],
        ),
        resource(
            "front",
            "a",
            vec![
                span(t, 1, None, "GET /api", 2, t0, t0 + 100 * ms),
                span(t, 2, Some(1), "call back", 3, t0 + 10 * ms, t0 + 72 * ms),
                span(t, 5, Some(1), "render", 1, t0 + 75 * ms, t0 + 95 * ms),
            ],
        ),
    ]
}

fn request(resource_spans: Vec<pb::ResourceSpans>) -> pb::ExportTraceServiceRequest {
    pb::ExportTraceServiceRequest { resource_spans }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The request in the OTLP JSON mapping (hex ids, decimal-string times), as
/// the OpenTelemetry collector's file exporter writes it.
fn to_json(req: &pb::ExportTraceServiceRequest) -> String {
    use serde_json::json;
    let attrs = |a: &[pb::KeyValue]| -> Vec<serde_json::Value> {
        a.iter()
            .map(
                |kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(pb::any_value::Value::StringValue(s)) => {
                        json!({"key": kv.key, "value": {"stringValue": s}})
                    }
                    _ => json!({"key": kv.key, "value": {}}),
                },
            )
            .collect()
    };
    let rs: Vec<_> = req
        .resource_spans
        .iter()
        .map(|rs| {
            json!({
                "resource": {"attributes": attrs(&rs.resource.as_ref().unwrap().attributes)},
                "scopeSpans": rs.scope_spans.iter().map(|ss| json!({
                    "scope": {"name": "test"},
                    "spans": ss.spans.iter().map(|s| json!({
                        "traceId": hex(&s.trace_id),
                        "spanId": hex(&s.span_id),
                        "parentSpanId": hex(&s.parent_span_id),
                        "name": s.name,
                        "kind": s.kind,
                        "startTimeUnixNano": s.start_time_unix_nano.to_string(),
                        "endTimeUnixNano": s.end_time_unix_nano.to_string(),
                        "attributes": attrs(&s.attributes),
                    })).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "resourceSpans": rs }).to_string()
}

fn gzip(b: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// `TraceService/Export` through a stock tonic client.
async fn grpc_export_traces(
    addr: SocketAddr,
    req: pb::ExportTraceServiceRequest,
) -> Result<pb::ExportTraceServiceResponse, tonic::Status> {
    grpc_unary(
        addr,
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        req,
    )
    .await
}

fn post_traces(addr: SocketAddr, headers: &[(&str, &str)], body: &[u8]) -> HttpResponse {
    http_with_headers(addr, "POST", "/v1/traces", headers, body).expect("HTTP request failed")
}

const PB: (&str, &str) = ("Content-Type", "application/x-protobuf");
const JSON: (&str, &str) = ("Content-Type", "application/json");

fn otlp_http(c: &TestCollector) -> SocketAddr {
    c.collector.as_ref().unwrap().otlp_http_addr().unwrap()
}

fn otlp_grpc(c: &TestCollector) -> SocketAddr {
    c.collector.as_ref().unwrap().otlp_grpc_addr().unwrap()
}

/// Wait until the store holds `n` records (at most `within`).
fn wait_for_records(c: &TestCollector, n: usize, within: Duration) -> Vec<Record> {
    let t0 = Instant::now();
    loop {
        let got = c.stored();
        if got.len() >= n || t0.elapsed() > within {
            return got;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sorted(mut v: Vec<Record>) -> Vec<String> {
    v.sort_by(|a, b| (&a.trace_id, &a.request_id).cmp(&(&b.trace_id, &b.request_id)));
    v.iter().map(Record::to_json).collect()
}

fn metrics(c: &TestCollector) -> String {
    let resp = http(c.http(), "GET", "/metrics", "text/plain", b"").unwrap();
    resp.text()
}

fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// Spans of 12 traces sent over gRPC, HTTP protobuf (gzip too) and HTTP
/// JSON, each service's spans in its own request, children before their
/// parents as exporters send them: the records stored are exactly (byte for
/// byte) those `cpt traces convert --from otlp` makes of the same requests
/// written to a file, clock-skew repair and `--otlp-label` labels included.
#[test]
fn otlp_records_are_the_file_imports_byte_for_byte() {
    let labels = vec!["service.version".to_owned(), "absent".to_owned()];
    let c = TestCollector::start(|c| {
        let mut c = open(otlp_on(c));
        c.otlp.labels = labels.clone();
        c
    });
    let dir = tempfile::tempdir().unwrap();
    let mut file = String::new();
    for t in 1..=12u64 {
        let skew = if t % 3 == 0 { 3_000_000 } else { 0 };
        for rs in trace(t, skew) {
            let req = request(vec![rs]);
            file.push_str(&to_json(&req));
            file.push('\n');
            let body = prost::Message::encode_to_vec(&req);
            match t % 4 {
                0 => {
                    let resp =
                        c.rt.block_on(grpc_export_traces(otlp_grpc(&c), req))
                            .unwrap();
                    assert_eq!(resp.partial_success, None);
                }
                1 => {
                    let r = post_traces(otlp_http(&c), &[PB], &body);
                    assert_eq!(r.status, 200, "{}", r.text());
                    assert_eq!(r.header("content-type"), Some("application/x-protobuf"));
                    let resp: pb::ExportTraceServiceResponse =
                        prost::Message::decode(&r.body[..]).unwrap();
                    assert_eq!(resp.partial_success, None);
                }
                2 => {
                    let r = post_traces(
                        otlp_http(&c),
                        &[PB, ("Content-Encoding", "gzip")],
                        &gzip(&body),
                    );
                    assert_eq!(r.status, 200, "{}", r.text());
                }
                _ => {
                    let r = post_traces(otlp_http(&c), &[JSON], to_json(&req).as_bytes());
                    assert_eq!(r.status, 200, "{}", r.text());
                    assert_eq!(r.json(), serde_json::json!({}));
                }
            }
        }
    }
    let path = dir.path().join("spans.jsonl");
    std::fs::write(&path, &file).unwrap();
    let opts = ImportOptions {
        otlp_labels: labels,
        ..ImportOptions::default()
    };
    let imported = import_files(&[path], Format::Otlp, &opts, &|_| {});
    assert_eq!(imported.records().count(), 12);
    let live = wait_for_records(&c, 12, Duration::from_secs(20));
    let want = sorted(imported.records().cloned().collect());
    assert_eq!(sorted(live), want);
    // The skewed traces were repaired, the same way, and every record has
    // its root's version.
    assert!(want.iter().any(|r| r.contains("skew.shifted_spans")));
    assert!(
        want.iter()
            .all(|r| r.contains(r#""service.version":"1.4""#)),
        "{want:?}"
    );
    let m = metrics(&c);
    assert_eq!(metric(&m, "cpt_otlp_spans_accepted_total"), 60);
    assert_eq!(metric(&m, "cpt_otlp_records_stored_total"), 12);
    assert_eq!(
        metric(&m, "cpt_otlp_traces_completed_total{how=\"complete\"}"),
        12
    );
    assert_eq!(metric(&m, "cpt_otlp_pending_spans"), 0);
    if let Some((ok, out)) = crate::metrics::promtool(&m) {
        assert!(ok, "promtool check metrics refused it:\n{out}\n{m}");
    }
}

/// `--otlp-label`: the root's resource attribute becomes a record label,
/// so that `cpt diff` across versions works.
#[test]
fn otlp_labels_come_from_the_roots_attributes() {
    let c = TestCollector::start(|c| {
        c.with_otlp(OtlpConfig {
            http: Some("127.0.0.1:0".parse().unwrap()),
            trace_wait: WAIT,
            labels: vec!["service.version".into(), "absent".into()],
            ..OtlpConfig::default()
        })
    });
    let body = prost::Message::encode_to_vec(&request(trace(1, 0)));
    assert_eq!(post_traces(otlp_http(&c), &[PB], &body).status, 200);
    let got = wait_for_records(&c, 1, Duration::from_secs(20));
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].labels.get("service.version").map(String::as_str),
        Some("1.4")
    );
    assert!(!got[0].labels.contains_key("absent"));
    assert_eq!(got[0].service, "front");
    assert_eq!(got[0].endpoint.as_deref(), Some("GET /api"));
}

/// Spans with bad ids or times are refused one by one, the answer's partial
/// success says how many and why, `/metrics` counts them by reason, and
/// the good spans of the same request make their record.
#[test]
fn otlp_bad_spans_are_refused_with_a_partial_success_and_counted() {
    let c = TestCollector::start(|c| open(otlp_on(c)));
    let mut spans = trace(1, 0);
    let mut bad_trace = span(2, 1, None, "x", 2, an_hour_ago(), an_hour_ago() + 5);
    bad_trace.trace_id = vec![0; 16];
    let zero_time = span(3, 1, None, "x", 2, 0, 5);
    let far = an_hour_ago() + 3 * 3_600_000_000_000;
    let future = span(4, 1, None, "x", 2, far, far + 5);
    spans[1].scope_spans[0]
        .spans
        .extend([bad_trace, zero_time, future]);
    let req = request(spans);
    let r = post_traces(otlp_http(&c), &[JSON], to_json(&req).as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let ps = &r.json()["partialSuccess"];
    assert_eq!(ps["rejectedSpans"], "3");
    let msg = ps["errorMessage"].as_str().unwrap();
    assert!(
        msg.contains("trace id") && msg.contains("--max-future-skew"),
        "{msg}"
    );
    let resp =
        c.rt.block_on(grpc_export_traces(otlp_grpc(&c), req))
            .unwrap();
    assert_eq!(resp.partial_success.unwrap().rejected_spans, 3);
    assert_eq!(wait_for_records(&c, 1, Duration::from_secs(20)).len(), 1);
    let m = metrics(&c);
    assert_eq!(
        metric(&m, "cpt_otlp_spans_refused_total{reason=\"bad_trace_id\"}"),
        2
    );
    assert_eq!(
        metric(&m, "cpt_otlp_spans_refused_total{reason=\"bad_time\"}"),
        2
    );
    assert_eq!(
        metric(&m, "cpt_otlp_spans_refused_total{reason=\"clock_ahead\"}"),
        2
    );
}

/// A body that is no trace export is refused whole (400, nothing held);
/// other media types get 415; without the ingest token, 401.
#[test]
fn otlp_bodies_that_are_no_export_are_refused_whole() {
    let c = TestCollector::start(|c| otlp_on(c).with_ingest_token("s3cret"));
    let auth = ("Authorization", "Bearer s3cret");
    let r = post_traces(otlp_http(&c), &[PB, auth], b"\xff\xff\xff\xff");
    assert_eq!(r.status, 400, "{}", r.text());
    let status: (i32, String) = {
        #[derive(Clone, PartialEq, prost::Message)]
        struct S {
            #[prost(int32, tag = "1")]
            code: i32,
            #[prost(string, tag = "2")]
            message: String,
        }
        let s: S = prost::Message::decode(&r.body[..]).unwrap();
        (s.code, s.message)
    };
    assert_eq!(status.0, 3, "INVALID_ARGUMENT: {}", status.1);
    // Invalid UTF-8 in a span name: protobuf strings must be UTF-8.
    let mut req = request(trace(1, 0));
    req.resource_spans[0].scope_spans[0].spans[0].name = "NAME".into();
    let mut body = prost::Message::encode_to_vec(&req);
    let at = body.windows(4).position(|w| w == b"NAME").unwrap();
    body[at] = 0xff;
    let r = post_traces(otlp_http(&c), &[PB, auth], &body);
    assert_eq!(r.status, 400, "{}", r.text());
    let r = post_traces(otlp_http(&c), &[JSON, auth], b"{\"resourceSpans\": 3}");
    assert_eq!(r.status, 400);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("not OTLP JSON")
    );
    let r = post_traces(otlp_http(&c), &[("Content-Type", "text/plain"), auth], b"x");
    assert_eq!(r.status, 415);
    let body = prost::Message::encode_to_vec(&request(trace(1, 0)));
    let r = post_traces(otlp_http(&c), &[PB], &body);
    assert_eq!(r.status, 401);
    let e =
        c.rt.block_on(grpc_export_traces(otlp_grpc(&c), request(trace(1, 0))))
            .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let r = http_with_headers(otlp_http(&c), "GET", "/v1/traces", &[], b"").unwrap();
    assert_eq!(r.status, 405);
    assert!(c.stored().is_empty());
}

/// Send trace 1 (rooted in `front`) and wait for its one record.
fn store_trace_1(c: &TestCollector) -> Vec<Record> {
    let body = prost::Message::encode_to_vec(&request(trace(1, 0)));
    assert_eq!(post_traces(otlp_http(c), &[PB], &body).status, 200);
    let first = wait_for_records(c, 1, Duration::from_secs(20));
    assert_eq!(first.len(), 1);
    first
}

/// Spans of a trace already completed are counted as late and dropped: the
/// stored record stays the one made when the trace completed.
#[test]
fn otlp_late_spans_are_counted_and_dropped() {
    let c = TestCollector::start(|c| open(otlp_on(c)));
    let first = store_trace_1(&c);
    let late = request(vec![resource(
        "back",
        "b",
        vec![span(
            1,
            9,
            Some(3),
            "late",
            3,
            an_hour_ago(),
            an_hour_ago() + 10,
        )],
    )]);
    let body = prost::Message::encode_to_vec(&late);
    assert_eq!(post_traces(otlp_http(&c), &[PB], &body).status, 200);
    let t0 = Instant::now();
    while metric(&metrics(&c), "cpt_otlp_late_spans_total") == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "late span not counted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(WAIT * 2);
    assert_eq!(c.stored(), first);
}

/// Past `--otlp-max-pending-spans`, the oldest traces are completed early
/// (counted), and a sender whose roots never arrive holds no more than the
/// bound.
#[test]
fn otlp_held_spans_stay_within_the_bound() {
    let c = TestCollector::start(|c| {
        open(c).with_otlp(OtlpConfig {
            http: Some("127.0.0.1:0".parse().unwrap()),
            trace_wait: Duration::from_secs(3600),
            max_pending_spans: 40,
            ..OtlpConfig::default()
        })
    });
    for t in 1..=30u64 {
        // Only `back`'s spans: the root (in `front`) never comes.
        let req = request(vec![trace(t, 0).remove(0)]);
        let body = prost::Message::encode_to_vec(&req);
        assert_eq!(post_traces(otlp_http(&c), &[PB], &body).status, 200);
    }
    std::thread::sleep(Duration::from_millis(500));
    let m = metrics(&c);
    assert!(metric(&m, "cpt_otlp_pending_spans") <= 40, "{m}");
    assert_eq!(
        metric(&m, "cpt_otlp_traces_completed_total{how=\"early\"}"),
        10,
        "{m}"
    );
    assert_eq!(
        metric(&m, "cpt_otlp_traces_dropped_total{reason=\"no_root\"}"),
        10
    );
    assert_eq!(
        metric(&m, "cpt_otlp_spans_dropped_total{reason=\"no_root\"}"),
        20
    );
}

/// A trace with a parent cycle, or a parent in another trace, is dropped
/// with its reason counted, and does not hold up other traces.
#[test]
fn otlp_broken_traces_are_dropped_with_their_reason() {
    let c = TestCollector::start(|c| open(otlp_on(c)));
    let t0 = an_hour_ago();
    let cycle = request(vec![resource(
        "front",
        "a",
        vec![
            span(7, 1, None, "root", 2, t0, t0 + 100),
            span(7, 2, Some(3), "a", 1, t0 + 1, t0 + 50),
            span(7, 3, Some(2), "b", 1, t0 + 2, t0 + 40),
        ],
    )]);
    let mut other = span(8, 2, None, "child", 1, t0 + 1, t0 + 50);
    other.parent_span_id = id(9, 1, 8);
    let elsewhere = request(vec![resource(
        "front",
        "a",
        vec![span(8, 1, None, "root", 2, t0, t0 + 100), other],
    )]);
    for req in [cycle, elsewhere, request(trace(1, 0))] {
        let body = prost::Message::encode_to_vec(&req);
        assert_eq!(post_traces(otlp_http(&c), &[PB], &body).status, 200);
    }
    assert_eq!(wait_for_records(&c, 1, Duration::from_secs(20)).len(), 1);
    std::thread::sleep(WAIT * 2);
    let m = metrics(&c);
    assert_eq!(
        metric(&m, "cpt_otlp_traces_dropped_total{reason=\"parent_cycle\"}"),
        1,
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "cpt_otlp_traces_dropped_total{reason=\"missing_parent\"}"
        ),
        1
    );
    assert_eq!(c.stored().len(), 1);
}

/// A service instrumented with cpt's layer and OpenTelemetry both: its cpt
/// record carries the OpenTelemetry trace id, and the OTLP root of the same
/// service and trace makes no second record (counted).
#[test]
fn otlp_roots_of_a_service_with_cpt_records_are_not_counted_twice() {
    let c = TestCollector::start(|c| open(otlp_on(c)));
    let mut own = record("layer", 0);
    own.service = "front".into();
    own.trace_id = Some(hex(&id(1, 0, 16)).to_uppercase());
    let r = post_records(
        c.http(),
        cpt_collector::ingest::CONTENT_TYPE_JSON_LINES,
        &json_lines(&[own.clone()]),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    for t in [1, 2] {
        let body = prost::Message::encode_to_vec(&request(trace(t, 0)));
        assert_eq!(post_traces(otlp_http(&c), &[PB], &body).status, 200);
    }
    let got = wait_for_records(&c, 2, Duration::from_secs(20));
    std::thread::sleep(WAIT * 2);
    let got = if got.len() < 2 { c.stored() } else { got };
    assert_eq!(got.len(), 2, "the cpt record and trace 2's");
    assert_eq!(got[0], own);
    assert_eq!(
        got[1].trace_id.as_deref(),
        Some(hex(&id(2, 0, 16)).as_str())
    );
    assert_eq!(metric(&metrics(&c), "cpt_otlp_roots_skipped_total"), 1);
}

/// The same service's cpt record arriving after its OTLP trace was
/// completed and stored (a delayed exporter): the record made from the
/// spans stands, and the cpt record is acknowledged, not stored, and
/// counted. Nothing stored changes, so profiles, roll-ups and Parquet
/// count the request once.
#[test]
fn otlp_a_cpt_record_arriving_after_its_trace_was_stored_is_not_counted_twice() {
    let c = TestCollector::start(|c| open(otlp_on(c)));
    let first = store_trace_1(&c);
    assert_eq!(first[0].service, "front");
    let mut late = record("layer", 0);
    late.service = "front".into();
    late.trace_id = Some(hex(&id(1, 0, 16)).to_uppercase());
    // Another request of the same service, in another trace: stored.
    let mut other = record("layer", 1);
    other.service = "front".into();
    other.trace_id = Some(hex(&id(7, 0, 16)));
    let r = post_records(
        c.http(),
        cpt_collector::ingest::CONTENT_TYPE_JSON_LINES,
        &json_lines(&[late, other.clone()]),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let got = c.stored();
    assert_eq!(got.len(), 2, "the OTLP record and the other request's");
    assert_eq!(got[0], first[0]);
    assert_eq!(got[1], other);
    let m = metrics(&c);
    assert_eq!(metric(&m, "cpt_otlp_layer_records_skipped_total"), 1);
    assert_eq!(metric(&m, "cpt_otlp_roots_skipped_total"), 0);
}

/// Spans acknowledged but not yet assembled survive `kill -9`: a restarted
/// collector reads them back and stores their records.
#[test]
fn otlp_held_spans_survive_kill_9_and_are_assembled_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.db");
    let args = |wait: &str| -> Vec<std::ffi::OsString> {
        ["--otlp-http", "127.0.0.1:0", "--otlp-trace-wait", wait]
            .iter()
            .map(Into::into)
            .collect()
    };
    let a = args("1h");
    let a: Vec<&std::ffi::OsStr> = a.iter().map(|s| s.as_os_str()).collect();
    let (served, otlp) = serve_otlp(&store, &a);
    for t in 1..=5 {
        let body = prost::Message::encode_to_vec(&request(trace(t, 0)));
        assert_eq!(post_traces(otlp, &[PB], &body).status, 200);
    }
    kill_9(served);
    assert!(stored(&store).is_empty(), "nothing was complete yet");
    let a = args("200ms");
    let a: Vec<&std::ffi::OsStr> = a.iter().map(|s| s.as_os_str()).collect();
    let (served, _) = serve_otlp(&store, &a);
    let t0 = Instant::now();
    while stored(&store).len() < 5 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "held spans not reassembled"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    kill_9(served);
    let mut traces: Vec<String> = stored(&store)
        .into_iter()
        .filter_map(|r| r.trace_id)
        .collect();
    traces.sort();
    let want: Vec<String> = (1..=5).map(|t| hex(&id(t, 0, 16))).collect();
    assert_eq!(traces, want);
}

/// `cpt serve` as a child with an OTLP/HTTP port; its address.
fn serve_otlp(store: &std::path::Path, args: &[&std::ffi::OsStr]) -> (Served, SocketAddr) {
    let served = serve_child(store, false, args);
    let otlp = crate::otlp_clients::otlp_addr(&served, "otlp-http");
    (served, otlp)
}

/// Four senders export whole traces over OTLP/HTTP while the collector is
/// killed with SIGKILL three times (and restarted on the same store): in
/// the end every acknowledged trace is in exactly one stored record, none
/// twice, whatever was held, half-assembled or being committed at each
/// kill.
#[test]
fn otlp_kill_9_three_times_under_load_loses_no_acknowledged_span() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.db");
    let args: Vec<std::ffi::OsString> =
        ["--otlp-http", "127.0.0.1:0", "--otlp-trace-wait", "300ms"]
            .iter()
            .map(Into::into)
            .collect();
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|s| s.as_os_str()).collect();
    let acked = Arc::new(Mutex::new(std::collections::BTreeSet::<u64>::new()));
    for round in 0..3u64 {
        let (served, addr) = serve_otlp(&store, &args);
        let stop = Arc::new(AtomicBool::new(false));
        let senders: Vec<_> = (0..4u64)
            .map(|t| {
                let (acked, stop) = (acked.clone(), stop.clone());
                std::thread::spawn(move || {
                    for seq in 0.. {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let trace_no = round * 1_000_000 + t * 100_000 + seq + 1;
                        let req = request(trace(trace_no, 0));
                        let body = prost::Message::encode_to_vec(&req);
                        match http_with_headers(addr, "POST", "/v1/traces", &[PB], &body) {
                            Ok(r) if r.status == 200 => {
                                let resp: pb::ExportTraceServiceResponse =
                                    prost::Message::decode(&r.body[..]).unwrap();
                                assert_eq!(resp.partial_success, None);
                                acked.lock().unwrap().insert(trace_no);
                            }
                            Ok(r) if r.status == 429 || r.status == 503 => {}
                            Ok(r) => panic!("unexpected {}: {}", r.status, r.text()),
                            Err(_) => return, // the collector is gone
                        }
                    }
                })
            })
            .collect();
        // Let some traces complete and others be held, then kill.
        let before = acked.lock().unwrap().len();
        let t0 = Instant::now();
        while acked.lock().unwrap().len() < before + 200 {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "too few acknowledgements"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(350));
        kill_9(served);
        stop.store(true, Ordering::Relaxed);
        for s in senders {
            s.join().unwrap();
        }
    }
    let acked = acked.lock().unwrap().clone();
    let want: std::collections::BTreeSet<String> =
        acked.iter().map(|t| hex(&id(*t, 0, 16))).collect();
    // A last start reassembles what the last kill left held.
    let (served, _) = serve_otlp(&store, &args);
    let t0 = Instant::now();
    let mut found;
    loop {
        found = std::collections::BTreeMap::<String, usize>::new();
        for r in stored(&store) {
            *found.entry(r.trace_id.unwrap()).or_default() += 1;
        }
        if want.iter().all(|t| found.contains_key(t)) || t0.elapsed() > Duration::from_secs(60) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    kill_9(served);
    let lost: Vec<&String> = want.iter().filter(|t| !found.contains_key(*t)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged traces lost, e.g. {:?}",
        lost.len(),
        want.len(),
        &lost[..lost.len().min(5)]
    );
    let twice: Vec<_> = found.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "traces stored twice: {twice:?}");
    assert!(want.len() >= 600);
}

/// A span of trace `t` with a 64-bit span number (ids never zero).
fn wide_span(t: u64, n: u64, parent: Option<u64>, name: &str, start: u64, end: u64) -> pb::Span {
    let sid = |n: u64| {
        let mut v = n.to_be_bytes().to_vec();
        v[0] = 0xcd;
        v
    };
    pb::Span {
        trace_id: id(t, 0, 16),
        span_id: sid(n),
        parent_span_id: parent.map(sid).unwrap_or_default(),
        name: name.into(),
        kind: if parent.is_none() { 2 } else { 3 },
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        ..Default::default()
    }
}

/// A trace of 10⁵ spans (a root and 99 999 calls one after another, sent
/// children first in five requests of 20 000 spans) makes the file
/// import's record, its path coarsened to the ingest limits (16 384
/// segments): the same request, latency and total, the folded time counted
/// as truncated and the record as coarsened in `/metrics`. A small trace
/// sent after it is stored byte for byte as the file import makes it,
/// within the wait and a few seconds: the big one holds up no other.
#[test]
fn otlp_a_trace_of_100_000_spans_is_coarsened_to_the_limits_and_holds_up_no_other() {
    let c = TestCollector::start(|c| open(otlp_on(c)));
    let t0 = an_hour_ago();
    let us = 1_000;
    let n: u64 = 100_000;
    let mut spans: Vec<pb::Span> = (1..n)
        .map(|i| {
            wide_span(
                900,
                i,
                Some(0),
                &format!("call {}", i % 7),
                t0 + i * 10 * us,
                t0 + (i + 1) * 10 * us,
            )
        })
        .collect();
    spans.push(wide_span(
        900,
        0,
        None,
        "GET /big",
        t0,
        t0 + (n + 1) * 10 * us,
    ));
    let dir = tempfile::tempdir().unwrap();
    let mut file = String::new();
    for chunk in spans.chunks(20_000) {
        let req = request(vec![resource("front", "a", chunk.to_vec())]);
        file.push_str(&to_json(&req));
        file.push('\n');
        let r = post_traces(otlp_http(&c), &[PB], &prost::Message::encode_to_vec(&req));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let small = request(trace(901, 0));
    file.push_str(&to_json(&small));
    file.push('\n');
    let sent_small = Instant::now();
    let r = post_traces(otlp_http(&c), &[PB], &prost::Message::encode_to_vec(&small));
    assert_eq!(r.status, 200, "{}", r.text());
    let path = dir.path().join("spans.jsonl");
    std::fs::write(&path, &file).unwrap();
    let imported = import_files(&[path], Format::Otlp, &ImportOptions::default(), &|_| {});
    assert_eq!(imported.stats.spans, n + 5);
    assert_eq!(imported.records().count(), 2);
    let live = wait_for_records(&c, 2, Duration::from_secs(60));
    let small_within = sent_small.elapsed();
    assert!(
        small_within < WAIT + Duration::from_secs(30),
        "the small trace took {small_within:?}"
    );
    assert_eq!(live.len(), 2);
    let of = |v: &[Record], endpoint: &str| {
        v.iter()
            .find(|r| r.endpoint.as_deref() == Some(endpoint))
            .cloned()
            .unwrap_or_else(|| panic!("no {endpoint} record"))
    };
    let file: Vec<Record> = imported.records().cloned().collect();
    assert_eq!(
        of(&live, "GET /api").to_json(),
        of(&file, "GET /api").to_json()
    );
    let (got, want) = (of(&live, "GET /big"), of(&file, "GET /big"));
    // Each call, and the root's own time before and after them.
    assert_eq!(
        want.path.segments().len(),
        n as usize + 1,
        "the file's is whole"
    );
    assert!(
        got.path.segments().len() <= 16_384,
        "{}",
        got.path.segments().len()
    );
    assert_eq!(
        (&got.request_id, got.latency, got.path.total()),
        (&want.request_id, want.latency, want.path.total())
    );
    assert_eq!(
        got.path.accounting.truncated,
        want.path.total() - Duration::from_micros(20)
    );
    let m = metrics(&c);
    assert_eq!(metric(&m, "cpt_otlp_spans_accepted_total"), n + 5);
    assert_eq!(metric(&m, "cpt_otlp_records_stored_total"), 2);
    assert_eq!(metric(&m, "cpt_otlp_records_coarsened_total"), 1);
    assert_eq!(metric(&m, "cpt_otlp_records_refused_total"), 0);
    assert_eq!(metric(&m, "cpt_otlp_pending_spans"), 0);
    if let Some((ok, out)) = crate::metrics::promtool(&m) {
        assert!(ok, "promtool check metrics refused it:\n{out}\n{m}");
    }
}

/// Attribute values of megabytes: one that no `--otlp-label` names is not
/// kept at all; a label's is cut to the ingest limit (512 bytes) and
/// counted; the trace makes its record either way. A body over
/// `--max-batch-bytes` is refused whole, saying so.
#[test]
fn otlp_attribute_values_of_megabytes_are_cut_or_left_and_counted() {
    let c = TestCollector::start(|c| {
        let mut c = open(otlp_on(c));
        c.otlp.labels = vec!["tenant".into()];
        c
    });
    let big = "x".repeat(3 << 20);
    let mut spans = trace(902, 0);
    let root = &mut spans[1].scope_spans[0].spans[0];
    root.attributes = vec![kv("tenant", &big), kv("payload", &big)];
    // The second attribute makes the body 6 MiB, over the 4 MiB bound.
    let too_big = prost::Message::encode_to_vec(&request(spans.clone()));
    let r = post_traces(otlp_http(&c), &[PB], &too_big);
    assert_eq!(r.status, 413, "{}", r.text());
    spans[1].scope_spans[0].spans[0].attributes.pop();
    let body = prost::Message::encode_to_vec(&request(spans));
    assert!(body.len() > 3 << 20);
    let r = post_traces(otlp_http(&c), &[PB], &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let got = wait_for_records(&c, 1, Duration::from_secs(20));
    assert_eq!(got.len(), 1);
    let tenant = got[0].labels.get("tenant").expect("the label, cut");
    assert_eq!(tenant.len(), 512);
    assert!(!got[0].labels.contains_key("payload"));
    let m = metrics(&c);
    assert_eq!(metric(&m, "cpt_otlp_names_truncated_total"), 1);
    assert_eq!(metric(&m, "cpt_otlp_records_stored_total"), 1);
}
