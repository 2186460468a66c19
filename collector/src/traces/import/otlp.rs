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
use crate::traces::model::{
    BuildOptions, Interner, RawSpan, Reason, SpanKind, TimeUnit, Trace, TraceError, Wide, build,
    span_start_end,
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

/// Read an OTLP JSON file (one document, or one per line) into validated
/// traces (in order of first appearance) and file-level errors.
pub fn read(text: &str, opts: BuildOptions) -> (Vec<Result<Trace, TraceError>>, Vec<TraceError>) {
    let mut out = Vec::new();
    let mut acc = Acc::default();
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
    f: &mut dyn FnMut(Result<Trace, TraceError>),
) -> Vec<TraceError> {
    let mut acc = Acc::default();
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
#[derive(Default)]
struct Acc {
    names: Interner,
    order: Vec<String>,
    by_trace: HashMap<String, Vec<RawSpan<'static>>>,
    bad: HashMap<String, Reason>,
    errors: Vec<TraceError>,
}

impl Acc {
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
        for rs in &doc.resource_spans {
            let mut service: Option<&str> = None;
            let mut host: Option<&str> = None;
            let mut instance: Option<&str> = None;
            for kv in rs.resource.as_ref().map_or(&[][..], |r| &r.attributes[..]) {
                let s = kv.value.as_ref().and_then(|v| v.string.as_deref());
                match &*kv.key {
                    "service.name" => service = s,
                    "host.name" => host = s,
                    "service.instance.id" => instance = s,
                    _ => {}
                }
            }
            let service_name = service.unwrap_or("unknown_service");
            let svc: Arc<str> = self.names.get(service_name);
            let clock: Arc<str> = match (host, instance) {
                (Some(h), _) => self.names.get(&format!("host:{h}")),
                (None, Some(i)) => self.names.get(&format!("instance:{i}")),
                _ => self.names.get(&format!("service:{service_name}")),
            };
            for ss in rs.scope_spans.iter().chain(&rs.library_spans) {
                for raw in &ss.spans {
                    let parsed = serde_json::from_str::<OSpan<'_>>(raw.get());
                    let (tid, res) = match parsed {
                        Ok(s) => (s.trace_id.to_ascii_lowercase(), Ok(s)),
                        Err(e) => match guess(raw.get(), "\"traceId\"") {
                            Some(t) => (t.to_ascii_lowercase(), Err(Reason::Json(e.to_string()))),
                            None => {
                                self.errors.push(TraceError::new(
                                    "<unknown>",
                                    Reason::Json(e.to_string()),
                                ));
                                continue;
                            }
                        },
                    };
                    let v = self.by_trace.entry(tid.clone()).or_insert_with(|| {
                        self.order.push(tid.clone());
                        Vec::new()
                    });
                    let res = res.and_then(|s| {
                        span_start_end(
                            &s.span_id,
                            ("startTimeUnixNano", s.start.0),
                            ("endTimeUnixNano", s.end.0),
                            TimeUnit::Nanos,
                        )
                        .map(|t| (s, t))
                    });
                    match res {
                        Ok((s, (start_ns, duration_ns))) => {
                            let error = status_error(&s.status)
                                || s.attributes.iter().any(|kv| {
                                    kv.value
                                        .as_ref()
                                        .is_some_and(|v| is_error_tag(&kv.key, &v.tag()))
                                });
                            v.push(RawSpan {
                                id: s.span_id.to_ascii_lowercase().into(),
                                parent_id: s
                                    .parent
                                    .as_deref()
                                    .filter(|p| !p.is_empty())
                                    .map(|p| p.to_ascii_lowercase().into()),
                                service: svc.clone(),
                                operation: self.names.get(&s.name),
                                start_ns: Some(start_ns),
                                duration_ns: Some(duration_ns),
                                kind: span_kind(&s.kind),
                                clock: clock.clone(),
                                error,
                                // OTLP has no "follows from" parent: a span
                                // that only links to another has no parent
                                // and is a root of its own.
                                follows_from: false,
                            });
                        }
                        Err(e) => {
                            self.bad.entry(tid).or_insert(e);
                        }
                    }
                }
            }
        }
    }

    fn finish(
        self,
        opts: BuildOptions,
        f: &mut dyn FnMut(Result<Trace, TraceError>),
    ) -> Vec<TraceError> {
        let Acc {
            order,
            mut by_trace,
            mut bad,
            errors,
            ..
        } = self;
        for tid in order {
            let spans = by_trace.remove(&tid).unwrap_or_default();
            f(match bad.remove(&tid) {
                Some(e) => Err(TraceError::new(tid, e)),
                None => build(&tid, spans, opts),
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
        let (traces, errs) = read(&text, BuildOptions::default());
        assert!(errs.is_empty(), "{errs:?}");
        let t = traces.into_iter().next().unwrap().unwrap();
        assert_eq!(t.spans.len(), 2);
        assert_eq!(
            (t.spans[1].kind, t.spans[1].error, t.spans[1].duration_ns),
            (SpanKind::Client, true, 800)
        );
        assert_eq!(&*t.spans[0].service, "svc");
        // The same as one pretty document.
        let (traces, _) = read(&a, BuildOptions::default());
        assert_eq!(traces[0].as_ref().unwrap().spans[0].kind, SpanKind::Server);
    }

    #[test]
    fn negative_durations_reject_the_trace() {
        let a = doc(
            r#"{"traceId":"ab","spanId":"01","name":"root","startTimeUnixNano":"2000","endTimeUnixNano":"1000"}"#,
        );
        let (traces, _) = read(&a, BuildOptions::default());
        assert!(
            traces[0]
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("negative duration")
        );
    }
}
