//! OTLP JSON (`ExportTraceServiceRequest` in the protobuf JSON mapping), as
//! the OpenTelemetry collector's file exporter writes it: one document, or
//! one document per line.
//!
//! `resourceSpans[].resource.attributes` gives `service.name` and the clock
//! domain (`host.name`, else `service.instance.id`, else the service);
//! `scopeSpans[]` (or the older `instrumentationLibrarySpans[]`)`.spans[]`
//! gives the spans: hex `traceId` / `spanId` / `parentSpanId` (empty =
//! root), `name`, `kind` (number or `SPAN_KIND_*`), `startTimeUnixNano` /
//! `endTimeUnixNano` (decimal strings or numbers), `attributes`, `status`.
//! Spans of one trace may be spread over resources and lines.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_json::value::RawValue;

use super::tags::{TagValue, is_error_tag};
use super::zipkin::guess;
mod proto;

pub use proto::{ProtoError, proto_spans};

/// The OTLP protobuf messages of the trace service
/// (`opentelemetry.proto.collector.trace.v1` and what it uses), from the
/// `opentelemetry-proto` crate.
pub mod pb {
    pub use opentelemetry_proto::tonic::collector::trace::v1::*;
    pub use opentelemetry_proto::tonic::common::v1::*;
    pub use opentelemetry_proto::tonic::resource::v1::*;
    pub use opentelemetry_proto::tonic::trace::v1::*;
}

use crate::traces::model::{
    BuildOptions, Interner, RawSpan, Reason, RootLabels, SpanKind, TimeUnit, Trace, TraceError,
    Wide, build, span_start_end,
};

#[derive(Deserialize)]
struct Doc<'a> {
    #[serde(rename = "resourceSpans", default, borrow)]
    resource_spans: Vec<ResourceSpans<'a>>,
}

#[derive(Deserialize)]
struct ResourceSpans<'a> {
    #[serde(default, borrow)]
    resource: Option<Resource<'a>>,
    #[serde(rename = "scopeSpans", default, borrow)]
    scope_spans: Vec<ScopeSpans<'a>>,
    #[serde(rename = "instrumentationLibrarySpans", default, borrow)]
    library_spans: Vec<ScopeSpans<'a>>,
}

#[derive(Deserialize)]
struct Resource<'a> {
    #[serde(default, borrow)]
    attributes: Vec<KeyValue<'a>>,
}

#[derive(Deserialize)]
struct ScopeSpans<'a> {
    #[serde(default, borrow)]
    spans: Vec<&'a RawValue>,
}

#[derive(Deserialize)]
struct KeyValue<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(default, borrow)]
    value: Option<AnyValue<'a>>,
}

#[derive(Deserialize)]
struct AnyValue<'a> {
    #[serde(rename = "stringValue", default, borrow)]
    string: Option<Cow<'a, str>>,
    #[serde(rename = "intValue", default)]
    int: Option<Nanos>,
    #[serde(rename = "boolValue", default)]
    boolean: Option<bool>,
    #[serde(rename = "doubleValue", default)]
    double: Option<f64>,
}

impl<'a> AnyValue<'a> {
    fn tag(&self) -> TagValue<'a> {
        if let Some(s) = &self.string {
            TagValue::Str(s.clone())
        } else if let Some(b) = self.boolean {
            TagValue::Bool(b)
        } else if let Some(i) = self.int {
            TagValue::Num(i.0 as f64)
        } else if let Some(d) = self.double {
            TagValue::Num(d)
        } else {
            TagValue::Other
        }
    }
}

#[derive(Deserialize)]
struct OSpan<'a> {
    #[serde(rename = "traceId", borrow)]
    trace_id: Cow<'a, str>,
    #[serde(rename = "spanId", borrow)]
    span_id: Cow<'a, str>,
    #[serde(rename = "parentSpanId", default, borrow)]
    parent: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    kind: Option<Kind>,
    #[serde(rename = "startTimeUnixNano")]
    start: Wide,
    #[serde(rename = "endTimeUnixNano")]
    end: Wide,
    #[serde(default, borrow)]
    attributes: Vec<KeyValue<'a>>,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    code: Option<Kind>,
}

/// An int64 that protobuf JSON writes as a decimal string or a number.
#[derive(Clone, Copy, Debug)]
struct Nanos(i64);

impl<'de> Deserialize<'de> for Nanos {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Nanos;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer or a decimal string")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Nanos, E> {
                Ok(Nanos(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Nanos, E> {
                i64::try_from(v)
                    .map(Nanos)
                    .map_err(|_| E::custom("integer out of range"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Nanos, E> {
                v.parse()
                    .map(Nanos)
                    .map_err(|_| E::custom(format!("not an integer: {v:?}")))
            }
        }
        d.deserialize_any(V)
    }
}

/// An enum that protobuf JSON writes as a number or a name.
#[derive(Clone, Debug)]
enum Kind {
    Num(i64),
    Name(String),
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Kind;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an enum number or name")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Kind, E> {
                Ok(Kind::Num(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Kind, E> {
                Ok(Kind::Num(v as i64))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Kind, E> {
                Ok(Kind::Name(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

fn span_kind(k: &Option<Kind>) -> SpanKind {
    match k {
        Some(Kind::Num(1)) => SpanKind::Internal,
        Some(Kind::Num(2)) => SpanKind::Server,
        Some(Kind::Num(3)) => SpanKind::Client,
        Some(Kind::Num(4)) => SpanKind::Producer,
        Some(Kind::Num(5)) => SpanKind::Consumer,
        Some(Kind::Name(n)) => SpanKind::parse_lossy(n),
        _ => SpanKind::Unspecified,
    }
}

fn status_error(s: &Option<Status>) -> bool {
    match s.as_ref().and_then(|s| s.code.as_ref()) {
        Some(Kind::Num(2)) => true,
        Some(Kind::Name(n)) => n.ends_with("ERROR"),
        _ => false,
    }
}

/// One span of an OTLP request, converted: the span as every reader makes
/// it, and the values of the attributes asked for (only on a root span:
/// the span's own attribute, else its resource's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Converted {
    /// The span.
    pub span: RawSpan<'static>,
    /// `(key, value)` of each key asked for that the root span or its
    /// resource has, in the order asked; empty for other spans.
    pub labels: Vec<(String, String)>,
}

/// What [`json_request_spans`] and [`proto_spans`] hand over for each span: its
/// trace id (lowercase hex; `None` when the span is too broken to tell),
/// and the span or why it cannot be read.
pub type SpanSink<'s> = dyn FnMut(Option<String>, Result<Converted, Reason>) + 's;

/// The service and clock domain of a resource's spans: `service.name`
/// (else `unknown_service`), and `host.name`, else
/// `service.instance.id`, else the service, as the clock.
fn resource_names(
    names: &mut Interner,
    service: Option<&str>,
    host: Option<&str>,
    instance: Option<&str>,
) -> (Arc<str>, Arc<str>) {
    let service_name = service.unwrap_or("unknown_service");
    let svc: Arc<str> = names.get(service_name);
    let clock: Arc<str> = match (host, instance) {
        (Some(h), _) => names.get(&format!("host:{h}")),
        (None, Some(i)) => names.get(&format!("instance:{i}")),
        _ => names.get(&format!("service:{service_name}")),
    };
    (svc, clock)
}

/// A label value of an attribute (strings as they are; numbers and
/// booleans as JSON writes them; other values have none).
fn label_value(v: &TagValue<'_>) -> Option<String> {
    match v {
        TagValue::Str(s) => Some(s.to_string()),
        TagValue::Bool(b) => Some(b.to_string()),
        TagValue::Num(n) if n.fract() == 0.0 && n.abs() < 9.0e15 => Some(format!("{}", *n as i64)),
        TagValue::Num(n) => Some(n.to_string()),
        TagValue::Other => None,
    }
}

/// The labels of a root span: for each key, the value of the span's
/// attribute, else of its resource's (`read` gives an attribute's key and
/// value).
fn root_labels<'v, A: 'v>(
    keys: &[String],
    span: &'v [A],
    resource: &'v [A],
    read: impl Fn(&'v A) -> (&'v str, Option<TagValue<'v>>),
) -> Vec<(String, String)> {
    let find =
        |attrs: &'v [A], k: &str| attrs.iter().rev().map(&read).find(|(key, _)| *key == k)?.1;
    keys.iter()
        .filter_map(|k| {
            let v = find(span, k).or_else(|| find(resource, k))?;
            Some((k.clone(), label_value(&v)?))
        })
        .collect()
}

/// Every span of one OTLP JSON document, converted, in document order.
/// `label_keys`: the attributes whose values root spans carry as labels.
fn json_spans(doc: &Doc<'_>, names: &mut Interner, label_keys: &[String], f: &mut SpanSink<'_>) {
    for rs in &doc.resource_spans {
        let mut service: Option<&str> = None;
        let mut host: Option<&str> = None;
        let mut instance: Option<&str> = None;
        let resource_attrs = rs.resource.as_ref().map_or(&[][..], |r| &r.attributes[..]);
        for kv in resource_attrs {
            let s = kv.value.as_ref().and_then(|v| v.string.as_deref());
            match &*kv.key {
                "service.name" => service = s,
                "host.name" => host = s,
                "service.instance.id" => instance = s,
                _ => {}
            }
        }
        let (svc, clock) = resource_names(names, service, host, instance);
        for ss in rs.scope_spans.iter().chain(&rs.library_spans) {
            for raw in &ss.spans {
                let parsed = serde_json::from_str::<OSpan<'_>>(raw.get());
                let (tid, res) = match parsed {
                    Ok(s) => (s.trace_id.to_ascii_lowercase(), Ok(s)),
                    Err(e) => match guess(raw.get(), "\"traceId\"") {
                        Some(t) => (t.to_ascii_lowercase(), Err(Reason::Json(e.to_string()))),
                        None => {
                            f(None, Err(Reason::Json(e.to_string())));
                            continue;
                        }
                    },
                };
                let res = res.and_then(|s| {
                    span_start_end(
                        &s.span_id,
                        ("startTimeUnixNano", s.start.0),
                        ("endTimeUnixNano", s.end.0),
                        TimeUnit::Nanos,
                    )
                    .map(|t| (s, t))
                });
                let res = res.map(|(s, (start_ns, duration_ns))| {
                    let error = status_error(&s.status)
                        || s.attributes.iter().any(|kv| {
                            kv.value
                                .as_ref()
                                .is_some_and(|v| is_error_tag(&kv.key, &v.tag()))
                        });
                    let parent_id: Option<Cow<'static, str>> = s
                        .parent
                        .as_deref()
                        .filter(|p| !p.is_empty())
                        .map(|p| p.to_ascii_lowercase().into());
                    let labels = if parent_id.is_none() {
                        root_labels(label_keys, &s.attributes, resource_attrs, |kv| {
                            (&*kv.key, kv.value.as_ref().map(AnyValue::tag))
                        })
                    } else {
                        Vec::new()
                    };
                    Converted {
                        span: RawSpan {
                            id: s.span_id.to_ascii_lowercase().into(),
                            parent_id,
                            service: svc.clone(),
                            operation: names.get(&s.name),
                            start_ns: Some(start_ns),
                            duration_ns: Some(duration_ns),
                            kind: span_kind(&s.kind),
                            clock: clock.clone(),
                            error,
                            // OTLP has no "follows from" parent: a span
                            // that only links to another has no parent
                            // and is a root of its own.
                            follows_from: false,
                        },
                        labels,
                    }
                });
                f(Some(tid), res);
            }
        }
    }
}

/// Every span of one OTLP JSON request body (`ExportTraceServiceRequest` in
/// the protobuf JSON mapping, as `POST /v1/traces` takes it), converted as
/// a file of it would be, in document order.
///
/// # Errors
///
/// When the body is not such a document.
pub fn json_request_spans(
    body: &str,
    names: &mut Interner,
    label_keys: &[String],
    f: &mut SpanSink<'_>,
) -> Result<(), String> {
    let doc = serde_json::from_str::<Doc<'_>>(body).map_err(|e| format!("not OTLP JSON: {e}"))?;
    json_spans(&doc, names, label_keys, f);
    Ok(())
}

/// Read an OTLP JSON file (one document, or one per line) into validated
/// traces (in order of first appearance) and file-level errors.
/// `label_keys`: the attributes whose values root spans carry as labels
/// ([`Trace::root_labels`]).
pub fn read(
    text: &str,
    opts: BuildOptions,
    label_keys: &[String],
) -> (Vec<Result<Trace, TraceError>>, Vec<TraceError>) {
    let mut out = Vec::new();
    let mut acc = Acc::new(label_keys);
    let first_line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let json_lines =
        serde_json::from_str::<Doc<'_>>(first_line).is_ok() && text.trim() != first_line.trim();
    if json_lines {
        for (n, line) in text.lines().enumerate() {
            acc.line(n, line);
        }
    } else {
        acc.whole(text);
    }
    let errors = acc.finish(opts, &mut |t| out.push(t));
    (out, errors)
}

/// [`read`] from a reader, for large files: a file of one document per
/// line (what the collector's file exporter writes) is read line by line,
/// holding only the spans read so far, not the text; a single document is
/// read whole. Each trace is handed to `f` once the file is read (its spans
/// are freed then); returns the errors of what could not be read.
pub fn read_reader<R: std::io::BufRead>(
    mut reader: R,
    opts: BuildOptions,
    label_keys: &[String],
    f: &mut dyn FnMut(Result<Trace, TraceError>),
) -> Vec<TraceError> {
    let mut acc = Acc::new(label_keys);
    let mut line = String::new();
    let mut n = 0;
    let mut first: Option<String> = None;
    // The first non-empty line decides: a whole document, or JSON lines.
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) if line.trim().is_empty() => n += 1,
            Ok(_) => {
                first = Some(std::mem::take(&mut line));
                break;
            }
            Err(e) => {
                acc.errors.push(TraceError::new(
                    format!("line {}", n + 1),
                    Reason::Json(e.to_string()),
                ));
                return acc.finish(opts, f);
            }
        }
    }
    let Some(first) = first else {
        return acc.finish(opts, f);
    };
    if serde_json::from_str::<Doc<'_>>(&first).is_err() {
        // One document over many lines: read it whole.
        let mut text = first;
        if let Err(e) = reader.read_to_string(&mut text) {
            acc.errors
                .push(TraceError::new("#1", Reason::Json(e.to_string())));
            return acc.finish(opts, f);
        }
        acc.whole(&text);
        return acc.finish(opts, f);
    }
    acc.line(n, &first);
    n += 1;
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => acc.line(n, &line),
            Err(e) => {
                acc.errors.push(TraceError::new(
                    format!("line {}", n + 1),
                    Reason::Json(e.to_string()),
                ));
                break;
            }
        }
        n += 1;
    }
    acc.finish(opts, f)
}

/// Spans read so far, grouped by trace.
struct Acc<'k> {
    names: Interner,
    label_keys: &'k [String],
    order: Vec<String>,
    by_trace: HashMap<String, Vec<RawSpan<'static>>>,
    /// Labels of root spans, by trace: only roots that have some.
    root_labels: HashMap<String, Vec<RootLabels>>,
    bad: HashMap<String, Reason>,
    errors: Vec<TraceError>,
}

impl<'k> Acc<'k> {
    fn new(label_keys: &'k [String]) -> Self {
        Acc {
            names: Interner::default(),
            label_keys,
            order: Vec::new(),
            by_trace: HashMap::new(),
            root_labels: HashMap::new(),
            bad: HashMap::new(),
            errors: Vec::new(),
        }
    }

    /// Line `n` (0-based) of a JSON-lines file.
    fn line(&mut self, n: usize, line: &str) {
        if line.trim().is_empty() {
            return;
        }
        match serde_json::from_str::<Doc<'_>>(line) {
            Ok(d) => self.doc(&d),
            Err(e) => self.errors.push(TraceError::new(
                format!("line {}", n + 1),
                Reason::Json(e.to_string()),
            )),
        }
    }

    /// A file holding one document.
    fn whole(&mut self, text: &str) {
        match serde_json::from_str::<Doc<'_>>(text) {
            Ok(d) => self.doc(&d),
            Err(e) => self.errors.push(TraceError::new(
                "#1",
                Reason::Json(format!("not OTLP JSON: {e}")),
            )),
        }
    }

    fn doc(&mut self, doc: &Doc<'_>) {
        let Acc {
            names,
            label_keys,
            order,
            by_trace,
            root_labels,
            bad,
            errors,
        } = self;
        json_spans(doc, names, label_keys, &mut |tid, res| {
            let Some(tid) = tid else {
                if let Err(e) = res {
                    errors.push(TraceError::new("<unknown>", e));
                }
                return;
            };
            let v = by_trace.entry(tid.clone()).or_insert_with(|| {
                order.push(tid.clone());
                Vec::new()
            });
            match res {
                Ok(s) => {
                    if !s.labels.is_empty() {
                        let id: Box<str> = s.span.id.as_ref().into();
                        root_labels.entry(tid).or_default().push((id, s.labels));
                    }
                    v.push(s.span);
                }
                Err(e) => {
                    bad.entry(tid).or_insert(e);
                }
            }
        });
    }

    fn finish(
        self,
        opts: BuildOptions,
        f: &mut dyn FnMut(Result<Trace, TraceError>),
    ) -> Vec<TraceError> {
        let Acc {
            order,
            mut by_trace,
            mut root_labels,
            mut bad,
            errors,
            ..
        } = self;
        for tid in order {
            let spans = by_trace.remove(&tid).unwrap_or_default();
            let labels = root_labels.remove(&tid).unwrap_or_default();
            f(match bad.remove(&tid) {
                Some(e) => Err(TraceError::new(tid, e)),
                None => build(&tid, spans, opts).map(|mut t| {
                    t.root_labels = labels;
                    t
                }),
            });
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(spans: &str) -> String {
        format!(
            r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"svc"}}}},{{"key":"host.name","value":{{"stringValue":"h"}}}}]}},"scopeSpans":[{{"scope":{{"name":"x"}},"spans":[{spans}]}}]}}]}}"#
        )
    }

    #[test]
    fn documents_and_json_lines_merge_spans_of_one_trace() {
        let a = doc(
            r#"{"traceId":"AB","spanId":"01","parentSpanId":"","name":"root","kind":2,"startTimeUnixNano":"1000","endTimeUnixNano":"2000"}"#,
        );
        let b = doc(
            r#"{"traceId":"ab","spanId":"02","parentSpanId":"01","name":"child","kind":"SPAN_KIND_CLIENT","startTimeUnixNano":1100,"endTimeUnixNano":1900,"status":{"code":2}}"#,
        );
        let text = format!("{a}\n{b}\n");
        let (traces, errs) = read(&text, BuildOptions::default(), &[]);
        assert!(errs.is_empty(), "{errs:?}");
        let t = traces.into_iter().next().unwrap().unwrap();
        assert_eq!(t.spans.len(), 2);
        assert_eq!(
            (t.spans[1].kind, t.spans[1].error, t.spans[1].duration_ns),
            (SpanKind::Client, true, 800)
        );
        assert_eq!(&*t.spans[0].service, "svc");
        // The same as one pretty document.
        let (traces, _) = read(&a, BuildOptions::default(), &[]);
        assert_eq!(traces[0].as_ref().unwrap().spans[0].kind, SpanKind::Server);
    }

    #[test]
    fn negative_durations_reject_the_trace() {
        let a = doc(
            r#"{"traceId":"ab","spanId":"01","name":"root","startTimeUnixNano":"2000","endTimeUnixNano":"1000"}"#,
        );
        let (traces, _) = read(&a, BuildOptions::default(), &[]);
        assert!(
            traces[0]
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("negative duration")
        );
    }
}
