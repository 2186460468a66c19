//! What a request's spans become on receipt: each span converted by the
//! OTLP importer's own code ([`otlp::proto_spans`], [`otlp::json_request_spans`])
//! and checked, then held ([`HeldSpan`]) by trace id.
//!
//! A span the receiver cannot use is refused on its own (the request's
//! partial success says how many and why, `/metrics` counts them by
//! [`Refusal`]); names and label values over the ingest limits are cut to
//! them and counted ([`Counters::truncated`](super::Counters)).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ingest::IngestLimits;
use crate::traces::model::{Interner, RawSpan, Reason, SpanKind};
use crate::traces::otlp::{self, Converted};

/// A span held until its trace is complete: what the importer's
/// [`RawSpan`] holds, owned, and the root's labels. Stored in the store's
/// `otlp_spans` table (`row.rs`; the short JSON keys are those of the first
/// encoding, still read).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeldSpan {
    #[serde(rename = "i")]
    pub(crate) id: String,
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    pub(crate) parent: Option<String>,
    #[serde(rename = "s")]
    pub(crate) service: Arc<str>,
    #[serde(rename = "o")]
    pub(crate) operation: Arc<str>,
    #[serde(rename = "t")]
    pub(crate) start_ns: i64,
    #[serde(rename = "d")]
    pub(crate) duration_ns: i64,
    #[serde(rename = "k")]
    pub(crate) kind: u8,
    #[serde(rename = "c")]
    pub(crate) clock: Arc<str>,
    #[serde(rename = "e", default, skip_serializing_if = "is_false")]
    pub(crate) error: bool,
    #[serde(rename = "l", default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) labels: Vec<(String, String)>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

const KINDS: [SpanKind; 6] = [
    SpanKind::Unspecified,
    SpanKind::Internal,
    SpanKind::Client,
    SpanKind::Server,
    SpanKind::Producer,
    SpanKind::Consumer,
];

impl HeldSpan {
    fn from_converted(c: Converted) -> HeldSpan {
        let s = c.span;
        HeldSpan {
            id: s.id.into_owned(),
            parent: s.parent_id.map(|p| p.into_owned()),
            service: s.service,
            operation: s.operation,
            start_ns: s.start_ns.unwrap_or(0),
            duration_ns: s.duration_ns.unwrap_or(0),
            kind: KINDS.iter().position(|k| *k == s.kind).unwrap_or(0) as u8,
            clock: s.clock,
            error: s.error,
            labels: c.labels,
        }
    }

    /// The span as the importer's reader would have made it. Its names
    /// are shared as they are: those of spans that arrived in one request
    /// are one copy already, and the critical path compares names by
    /// value where copies differ.
    pub(crate) fn to_raw(&self) -> RawSpan<'_> {
        RawSpan {
            id: self.id.as_str().into(),
            parent_id: self.parent.as_deref().map(Into::into),
            service: self.service.clone(),
            operation: self.operation.clone(),
            start_ns: Some(self.start_ns),
            duration_ns: Some(self.duration_ns),
            kind: KINDS
                .get(usize::from(self.kind))
                .copied()
                .unwrap_or_default(),
            clock: self.clock.clone(),
            error: self.error,
            follows_from: false,
        }
    }

    pub(crate) fn is_root(&self) -> bool {
        self.parent.is_none()
    }
}

/// Why a span was refused (the `reason` label of
/// `cpt_otlp_spans_refused_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The trace id is not 16 bytes (32 hex digits), or is all zeros.
    TraceId,
    /// The span id is not 8 bytes (16 hex digits), or is all zeros.
    SpanId,
    /// The parent span id is neither empty nor 8 bytes.
    ParentId,
    /// A start or end time of 0, or an end before the start, or a time
    /// outside what nanoseconds since 1970 can hold.
    Time,
    /// Starts further ahead of the collector's clock than
    /// `--max-future-skew`.
    ClockAhead,
    /// The span could not be read (a JSON span of the wrong shape).
    Unreadable,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 6] = [
        Refusal::TraceId,
        Refusal::SpanId,
        Refusal::ParentId,
        Refusal::Time,
        Refusal::ClockAhead,
        Refusal::Unreadable,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refusal::TraceId => "bad_trace_id",
            Refusal::SpanId => "bad_span_id",
            Refusal::ParentId => "bad_parent_id",
            Refusal::Time => "bad_time",
            Refusal::ClockAhead => "clock_ahead",
            Refusal::Unreadable => "unreadable",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Refusal::TraceId => "trace id not 16 bytes or all zeros",
            Refusal::SpanId => "span id not 8 bytes or all zeros",
            Refusal::ParentId => "parent span id neither empty nor 8 bytes",
            Refusal::Time => "start or end time 0, out of range, or end before start",
            Refusal::ClockAhead => {
                "start further ahead of the collector's clock than --max-future-skew"
            }
            Refusal::Unreadable => "span of the wrong shape",
        }
    }
}

/// The spans of one request, held by trace, and what was refused.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// Per trace id, its spans in request order; traces in order of first
    /// appearance.
    pub(crate) traces: Vec<(String, Vec<HeldSpan>)>,
    /// Spans accepted.
    pub(crate) spans: usize,
    /// Spans refused, per [`Refusal`].
    pub(crate) refused: [u64; Refusal::ALL.len()],
    /// Names and label values cut to the ingest limits.
    pub(crate) truncated: u64,
}

impl Received {
    /// Refused spans in all.
    pub(crate) fn refused_total(&self) -> u64 {
        self.refused.iter().sum()
    }

    /// The partial success's message: how many were refused for what.
    pub(crate) fn refusal_message(&self) -> String {
        let parts: Vec<String> = Refusal::ALL
            .iter()
            .zip(self.refused)
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{n} {}", r.message()))
            .collect();
        if parts.is_empty() {
            return String::new();
        }
        format!("spans refused: {}", parts.join("; "))
    }
}

/// Where `s` is cut to at most `max` bytes at a character boundary, if it
/// is longer.
fn cut_at(s: &str, max: usize) -> Option<usize> {
    if s.len() <= max {
        return None;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Some(end)
}

/// `s` cut to at most `max` bytes at a character boundary; counts a cut.
fn cut(s: &mut String, max: usize, truncated: &mut u64) {
    if let Some(end) = cut_at(s, max) {
        s.truncate(end);
        *truncated += 1;
    }
}

/// [`cut`] for a shared name.
fn cut_name(s: &mut Arc<str>, max: usize, truncated: &mut u64) {
    if let Some(end) = cut_at(s, max) {
        *s = Arc::from(&s[..end]);
        *truncated += 1;
    }
}

fn is_hex_id(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit()) && s.bytes().any(|b| b != b'0')
}

/// Sort out the converted spans of a request. Spans are kept in arrival
/// order with the index of their trace, and shared out to their traces
/// at the end ([`Sorter::finish`]), each trace's list made at its size:
/// growing a list per trace span by span was a fifth of the receiver's
/// time.
struct Sorter<'l> {
    out: Received,
    index: rustc_hash::FxHashMap<String, usize>,
    spans: Vec<(usize, HeldSpan)>,
    counts: Vec<usize>,
    limits: &'l IngestLimits,
    now_unix_nanos: u64,
}

impl Sorter<'_> {
    fn take(&mut self, tid: Option<String>, res: Result<Converted, Reason>) {
        let refuse = |out: &mut Received, r: Refusal| out.refused[r as usize] += 1;
        let Some(tid) = tid.filter(|t| is_hex_id(t, 32)) else {
            return refuse(&mut self.out, Refusal::TraceId);
        };
        let c = match res {
            Ok(c) => c,
            Err(Reason::Json(_)) => return refuse(&mut self.out, Refusal::Unreadable),
            Err(_) => return refuse(&mut self.out, Refusal::Time),
        };
        if !is_hex_id(&c.span.id, 16) {
            return refuse(&mut self.out, Refusal::SpanId);
        }
        if c.span
            .parent_id
            .as_deref()
            .is_some_and(|p| !is_hex_id(p, 16))
        {
            return refuse(&mut self.out, Refusal::ParentId);
        }
        let (Some(start), Some(duration)) = (c.span.start_ns, c.span.duration_ns) else {
            return refuse(&mut self.out, Refusal::Time);
        };
        if start <= 0 || duration < 0 {
            return refuse(&mut self.out, Refusal::Time);
        }
        if self
            .limits
            .start(u64::try_from(start).ok(), self.now_unix_nanos)
            .is_err()
        {
            return refuse(&mut self.out, Refusal::ClockAhead);
        }
        let mut held = HeldSpan::from_converted(c);
        let t = &mut self.out.truncated;
        cut_name(&mut held.service, self.limits.max_string_bytes, t);
        cut_name(&mut held.operation, self.limits.max_frame_string_bytes, t);
        held.labels.truncate(self.limits.max_labels);
        for (_, v) in &mut held.labels {
            cut(v, self.limits.max_string_bytes, t);
        }
        self.out.spans += 1;
        // A request's spans are mostly of few traces: look the trace up
        // before making a key of its id.
        let i = match self.index.get(&tid) {
            Some(&i) => i,
            None => {
                let i = self.out.traces.len();
                self.out.traces.push((tid.clone(), Vec::new()));
                self.counts.push(0);
                self.index.insert(tid, i);
                i
            }
        };
        self.counts[i] += 1;
        self.spans.push((i, held));
    }

    /// Each trace's spans, in request order.
    fn finish(mut self) -> Received {
        for ((_, spans), n) in self.out.traces.iter_mut().zip(&self.counts) {
            spans.reserve_exact(*n);
        }
        for (i, span) in self.spans {
            self.out.traces[i].1.push(span);
        }
        self.out
    }
}

/// How a request body is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// `application/x-protobuf` (and gRPC).
    Protobuf,
    /// `application/json` (the OTLP JSON mapping: hex ids).
    Json,
}

/// Decode a request body and sort its spans. `Err`: the body as a whole is
/// not an OTLP trace request (nothing held).
pub(crate) fn receive(
    body: &[u8],
    encoding: Encoding,
    label_keys: &[String],
    limits: &IngestLimits,
    now_unix_nanos: u64,
) -> Result<Received, String> {
    let mut names = Interner::default();
    let mut sorter = Sorter {
        out: Received::default(),
        index: rustc_hash::FxHashMap::default(),
        // A span takes about a hundred bytes on the wire; the estimate is
        // capped, so that a body of garbage reserves little.
        spans: Vec::with_capacity((body.len() / 100).min(1 << 14)),
        counts: Vec::new(),
        limits,
        now_unix_nanos,
    };
    match encoding {
        Encoding::Protobuf => {
            otlp::proto_spans(body, &mut names, label_keys, &mut |t, r| sorter.take(t, r))
                .map_err(|e| format!("not an OTLP ExportTraceServiceRequest: {e}"))?;
        }
        Encoding::Json => {
            let text = std::str::from_utf8(body)
                .map_err(|e| format!("not OTLP JSON: the body is not UTF-8 ({e})"))?;
            otlp::json_request_spans(text, &mut names, label_keys, &mut |t, r| {
                sorter.take(t, r);
            })?;
        }
    }
    Ok(sorter.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traces::otlp::pb;

    fn limits() -> IngestLimits {
        IngestLimits::default()
    }

    fn request(spans: Vec<pb::Span>) -> pb::ExportTraceServiceRequest {
        let kv = |k: &str, v: &str| pb::KeyValue {
            key: k.into(),
            value: Some(pb::AnyValue {
                value: Some(pb::any_value::Value::StringValue(v.into())),
            }),
            ..Default::default()
        };
        pb::ExportTraceServiceRequest {
            resource_spans: vec![pb::ResourceSpans {
                resource: Some(pb::Resource {
                    attributes: vec![kv("service.name", "front"), kv("service.version", "1.2")],
                    ..Default::default()
                }),
                scope_spans: vec![pb::ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn span(trace: u8, id: u8, parent: Option<u8>, start: u64, end: u64) -> pb::Span {
        pb::Span {
            trace_id: vec![trace; 16],
            span_id: vec![id; 8],
            parent_span_id: parent.map(|p| vec![p; 8]).unwrap_or_default(),
            name: format!("op{id}"),
            kind: 2,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            ..Default::default()
        }
    }

    const NOW: u64 = 1_700_000_000_000_000_000;

    #[test]
    fn protobuf_and_json_of_one_request_hold_the_same_spans() {
        let req = request(vec![
            span(1, 1, None, NOW, NOW + 1000),
            span(1, 2, Some(1), NOW + 10, NOW + 900),
        ]);
        let body = prost::Message::encode_to_vec(&req);
        let keys = vec!["service.version".to_string()];
        let a = receive(&body, Encoding::Protobuf, &keys, &limits(), NOW).unwrap();
        let json = format!(
            r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"front"}}}},{{"key":"service.version","value":{{"stringValue":"1.2"}}}}]}},"scopeSpans":[{{"spans":[
            {{"traceId":"{t}","spanId":"{a}","name":"op1","kind":2,"startTimeUnixNano":"{s0}","endTimeUnixNano":"{e0}"}},
            {{"traceId":"{t}","spanId":"{b}","parentSpanId":"{a}","name":"op2","kind":2,"startTimeUnixNano":"{s1}","endTimeUnixNano":"{e1}"}}]}}]}}]}}"#,
            t = "01".repeat(16),
            a = "01".repeat(8),
            b = "02".repeat(8),
            s0 = NOW,
            e0 = NOW + 1000,
            s1 = NOW + 10,
            e1 = NOW + 900,
        );
        let b = receive(json.as_bytes(), Encoding::Json, &keys, &limits(), NOW).unwrap();
        assert_eq!(a.traces, b.traces);
        assert_eq!(a.spans, 2);
        assert_eq!(
            a.traces[0].1[0].labels,
            vec![("service.version".to_string(), "1.2".to_string())]
        );
        assert!(a.traces[0].1[1].labels.is_empty(), "labels on roots only");
    }

    #[test]
    fn bad_ids_and_times_are_refused_one_by_one_with_their_reason() {
        let mut short = span(1, 3, None, NOW, NOW + 5);
        short.trace_id = vec![1; 15];
        let mut zero_span = span(1, 4, None, NOW, NOW + 5);
        zero_span.span_id = vec![0; 8];
        let mut bad_parent = span(1, 5, None, NOW, NOW + 5);
        bad_parent.parent_span_id = vec![1; 3];
        let far = NOW + 2 * 3_600_000_000_000;
        let req = request(vec![
            span(1, 1, None, NOW, NOW + 1000),
            short,
            zero_span,
            bad_parent,
            span(1, 6, None, 0, 5),
            span(1, 7, None, NOW + 10, NOW),
            span(1, 8, None, far, far + 1),
        ]);
        let got = receive(
            &prost::Message::encode_to_vec(&req),
            Encoding::Protobuf,
            &[],
            &limits(),
            NOW,
        )
        .unwrap();
        assert_eq!(got.spans, 1);
        assert_eq!(got.refused, [1, 1, 1, 2, 1, 0]);
        let msg = got.refusal_message();
        assert!(msg.contains("2 start or end time 0"), "{msg}");
    }

    #[test]
    fn long_names_are_cut_to_the_limit_and_counted() {
        let mut s = span(1, 1, None, NOW, NOW + 1000);
        s.name = "é".repeat(5000);
        let got = receive(
            &prost::Message::encode_to_vec(&request(vec![s])),
            Encoding::Protobuf,
            &[],
            &limits(),
            NOW,
        )
        .unwrap();
        let op = &got.traces[0].1[0].operation;
        assert!(op.len() <= limits().max_frame_string_bytes && op.len() > 4000);
        assert_eq!(got.truncated, 1);
    }

    #[test]
    fn a_body_that_is_no_request_is_refused_whole() {
        assert!(receive(b"\xff\xff\xff", Encoding::Protobuf, &[], &limits(), NOW).is_err());
        assert!(receive(b"{\"x\":", Encoding::Json, &[], &limits(), NOW).is_err());
        assert!(receive(b"\xff{}", Encoding::Json, &[], &limits(), NOW).is_err());
    }
}
