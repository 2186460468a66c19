//! OTLP protobuf (`ExportTraceServiceRequest`, as the OTLP gRPC and HTTP
//! exporters send it), read where it lies.
//!
//! Decoding the request into `opentelemetry-proto`'s messages allocates a
//! `Vec` or `String` for every id, name and attribute of every span, only
//! for them to be dropped once the span is converted. This reader walks
//! the wire format with prost's own primitives ([`decode_key`],
//! [`decode_varint`], [`skip_field`]) and borrows every id, name and value
//! from the body. It reads what [`Message::decode`](prost::Message::decode)
//! reads, with protobuf's rules: fields in any order, the last value of a
//! scalar field wins, a message field given twice is merged, unknown
//! fields are skipped, and strings that are read must be UTF-8.
//!
//! The fields that conversion needs are read; the others (trace state,
//! flags, events, links, dropped counts, scope, schema URLs) are skipped
//! without being checked.

use std::borrow::Cow;
use std::sync::Arc;

use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};

use super::{Converted, Interner, Kind, RawSpan, SpanSink, resource_names, root_labels, span_kind};
use crate::traces::import::tags::{TagValue, is_error_tag};
use crate::traces::model::{Reason, TimeUnit, span_start_end};

/// Why a body is not an `ExportTraceServiceRequest`: the message and
/// field where reading stopped, and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtoError {
    at: &'static str,
    what: String,
}

impl std::fmt::Display for ProtoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.at, self.what)
    }
}

impl std::error::Error for ProtoError {}

fn error(at: &'static str, what: impl std::fmt::Display) -> ProtoError {
    ProtoError {
        at,
        what: what.to_string(),
    }
}

/// One field's value as the wire holds it.
#[derive(Clone, Copy)]
enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32,
    Len(&'a [u8]),
    /// A group (a long-deprecated encoding), skipped.
    Group,
}

/// The fields of one message, in wire order.
struct Fields<'a> {
    buf: &'a [u8],
    at: &'static str,
}

impl<'a> Fields<'a> {
    fn of(buf: &'a [u8], at: &'static str) -> Fields<'a> {
        Fields { buf, at }
    }

    fn next(&mut self) -> Option<Result<(u32, Value<'a>), ProtoError>> {
        if self.buf.is_empty() {
            return None;
        }
        Some(self.field().map_err(|e| error(self.at, e)))
    }

    fn field(&mut self) -> Result<(u32, Value<'a>), String> {
        let buf = &mut self.buf;
        let prost = |e: prost::DecodeError| e.to_string();
        let (tag, wire) = decode_key(buf).map_err(prost)?;
        let value = match wire {
            WireType::Varint => Value::Varint(decode_varint(buf).map_err(prost)?),
            WireType::SixtyFourBit => {
                let (b, rest) = buf
                    .split_first_chunk::<8>()
                    .ok_or_else(|| truncated("a 64-bit field"))?;
                *buf = rest;
                Value::Fixed64(u64::from_le_bytes(*b))
            }
            WireType::ThirtyTwoBit => {
                let (_, rest) = buf
                    .split_first_chunk::<4>()
                    .ok_or_else(|| truncated("a 32-bit field"))?;
                *buf = rest;
                Value::Fixed32
            }
            WireType::LengthDelimited => {
                let len = decode_varint(buf).map_err(prost)?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|l| *l <= buf.len())
                    .ok_or_else(|| truncated("a length-delimited field"))?;
                let (v, rest) = buf.split_at(len);
                *buf = rest;
                Value::Len(v)
            }
            WireType::StartGroup | WireType::EndGroup => {
                skip_field(wire, tag, buf, DecodeContext::default()).map_err(prost)?;
                Value::Group
            }
        };
        Ok((tag, value))
    }
}

fn truncated(what: &str) -> String {
    format!("{what} runs past the end of the body")
}

fn wrong_wire(at: &'static str, tag: u32) -> ProtoError {
    error(at, format!("field {tag} has the wrong wire type"))
}

fn len<'a>(at: &'static str, tag: u32, v: Value<'a>) -> Result<&'a [u8], ProtoError> {
    match v {
        Value::Len(b) => Ok(b),
        _ => Err(wrong_wire(at, tag)),
    }
}

fn string<'a>(at: &'static str, tag: u32, v: Value<'a>) -> Result<&'a str, ProtoError> {
    std::str::from_utf8(len(at, tag, v)?)
        .map_err(|_| error(at, format!("field {tag}: a string that is not UTF-8")))
}

fn varint(at: &'static str, tag: u32, v: Value<'_>) -> Result<u64, ProtoError> {
    match v {
        Value::Varint(n) => Ok(n),
        _ => Err(wrong_wire(at, tag)),
    }
}

fn fixed64(at: &'static str, tag: u32, v: Value<'_>) -> Result<u64, ProtoError> {
    match v {
        Value::Fixed64(n) => Ok(n),
        _ => Err(wrong_wire(at, tag)),
    }
}

/// An `AnyValue` as far as conversion reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Any<'a> {
    Str(&'a str),
    Bool(bool),
    Int(i64),
    Double(f64),
    /// Unset, an array, a key-value list or bytes.
    Other,
}

impl<'a> Any<'a> {
    fn tag(self) -> TagValue<'a> {
        match self {
            Any::Str(s) => TagValue::Str(Cow::Borrowed(s)),
            Any::Bool(b) => TagValue::Bool(b),
            Any::Int(i) => TagValue::Num(i as f64),
            Any::Double(d) => TagValue::Num(d),
            Any::Other => TagValue::Other,
        }
    }

    /// Merge one encoding of an `AnyValue` into this one: its `value` is a
    /// oneof, so the last member on the wire wins.
    fn merge(&mut self, buf: &'a [u8]) -> Result<(), ProtoError> {
        const AT: &str = "AnyValue";
        let mut fields = Fields::of(buf, AT);
        while let Some(f) = fields.next() {
            let (tag, v) = f?;
            *self = match tag {
                1 => Any::Str(string(AT, tag, v)?),
                2 => Any::Bool(varint(AT, tag, v)? != 0),
                3 => Any::Int(varint(AT, tag, v)? as i64),
                4 => Any::Double(f64::from_bits(fixed64(AT, tag, v)?)),
                5..=7 => {
                    len(AT, tag, v)?;
                    Any::Other
                }
                _ => continue,
            };
        }
        Ok(())
    }
}

/// A `KeyValue`: its key, and its value if it has one.
#[derive(Clone, Copy, Debug)]
struct Attr<'a> {
    key: &'a str,
    value: Option<Any<'a>>,
}

impl<'a> Attr<'a> {
    fn read(buf: &'a [u8]) -> Result<Attr<'a>, ProtoError> {
        const AT: &str = "KeyValue";
        let mut a = Attr {
            key: "",
            value: None,
        };
        let mut fields = Fields::of(buf, AT);
        while let Some(f) = fields.next() {
            match f? {
                (1, v) => a.key = string(AT, 1, v)?,
                (2, v) => a.value.get_or_insert(Any::Other).merge(len(AT, 2, v)?)?,
                _ => {}
            }
        }
        Ok(a)
    }

    fn tag(&self) -> Option<TagValue<'a>> {
        self.value.map(Any::tag)
    }
}

/// A `Span` as far as conversion reads it; its attributes are in the
/// reader's scratch list.
#[derive(Default)]
struct SpanFields<'a> {
    trace_id: &'a [u8],
    span_id: &'a [u8],
    parent: &'a [u8],
    name: &'a str,
    kind: i32,
    start: u64,
    end: u64,
    /// The status's code, if the span has a status (`0` if it has no code).
    status: Option<i32>,
}

impl<'a> SpanFields<'a> {
    fn read(buf: &'a [u8], attrs: &mut Vec<Attr<'a>>) -> Result<SpanFields<'a>, ProtoError> {
        const AT: &str = "Span";
        let mut s = SpanFields::default();
        attrs.clear();
        let mut fields = Fields::of(buf, AT);
        while let Some(f) = fields.next() {
            let (tag, v) = f?;
            match tag {
                1 => s.trace_id = len(AT, tag, v)?,
                2 => s.span_id = len(AT, tag, v)?,
                4 => s.parent = len(AT, tag, v)?,
                5 => s.name = string(AT, tag, v)?,
                6 => s.kind = varint(AT, tag, v)? as i32,
                7 => s.start = fixed64(AT, tag, v)?,
                8 => s.end = fixed64(AT, tag, v)?,
                9 => attrs.push(Attr::read(len(AT, tag, v)?)?),
                15 => {
                    const STATUS: &str = "Status";
                    let code = s.status.get_or_insert(0);
                    let mut st = Fields::of(len(AT, tag, v)?, STATUS);
                    while let Some(f) = st.next() {
                        match f? {
                            (3, v) => *code = varint(STATUS, 3, v)? as i32,
                            (2, v) => {
                                string(STATUS, 2, v)?;
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(s)
    }
}

/// Lowercase hex of an id's bytes.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// The service and clock domain of a resource's spans, from its
/// attributes (the last of each key wins).
fn resource_of(resource: &[Attr<'_>], names: &mut Interner) -> (Arc<str>, Arc<str>) {
    let (mut service, mut host, mut instance) = (None, None, None);
    for a in resource {
        let s = match a.value {
            Some(Any::Str(s)) => Some(s),
            _ => None,
        };
        match a.key {
            "service.name" => service = s,
            "host.name" => host = s,
            "service.instance.id" => instance = s,
            _ => {}
        }
    }
    resource_names(names, service, host, instance)
}

/// One span converted, with its trace id (lowercase hex).
fn convert(
    s: &SpanFields<'_>,
    attrs: &[Attr<'_>],
    resource: &[Attr<'_>],
    (svc, clock): (&Arc<str>, &Arc<str>),
    names: &mut Interner,
    label_keys: &[String],
) -> (String, Result<Converted, Reason>) {
    let id = hex(s.span_id);
    let res = span_start_end(
        &id,
        ("startTimeUnixNano", i128::from(s.start)),
        ("endTimeUnixNano", i128::from(s.end)),
        TimeUnit::Nanos,
    );
    let res = res.map(|(start_ns, duration_ns)| {
        let error = s.status == Some(2)
            || attrs
                .iter()
                .any(|a| a.value.is_some_and(|v| is_error_tag(a.key, &v.tag())));
        let parent_id: Option<Cow<'static, str>> =
            (!s.parent.is_empty()).then(|| hex(s.parent).into());
        let labels = if parent_id.is_none() {
            root_labels(label_keys, attrs, resource, |a| (a.key, a.tag()))
        } else {
            Vec::new()
        };
        Converted {
            span: RawSpan {
                id: id.into(),
                parent_id,
                service: svc.clone(),
                operation: names.get(s.name),
                start_ns: Some(start_ns),
                duration_ns: Some(duration_ns),
                kind: span_kind(&Some(Kind::Num(i64::from(s.kind)))),
                clock: clock.clone(),
                error,
                follows_from: false,
            },
            labels,
        }
    });
    (hex(s.trace_id), res)
}

/// Every span of one OTLP protobuf request body (`ExportTraceServiceRequest`,
/// as the OTLP gRPC and HTTP exporters send it), converted exactly as
/// [`json_request_spans`](super::json_request_spans) converts the same
/// request in the JSON mapping: ids as lowercase hex, the same service,
/// clock domain, kind and error rules. Spans are handed over in wire
/// order.
///
/// # Errors
///
/// When the body is not such a request; the spans read before the error
/// have been handed over.
pub fn proto_spans(
    body: &[u8],
    names: &mut Interner,
    label_keys: &[String],
    f: &mut SpanSink<'_>,
) -> Result<(), ProtoError> {
    let mut resource: Vec<Attr<'_>> = Vec::new();
    let mut attrs: Vec<Attr<'_>> = Vec::new();
    let mut request = Fields::of(body, "ExportTraceServiceRequest");
    while let Some(field) = request.next() {
        let (tag, v) = field?;
        if tag != 1 {
            continue;
        }
        const RS: &str = "ResourceSpans";
        let rs = len("ExportTraceServiceRequest", tag, v)?;
        // The resource first, wherever it is (a resource given twice is
        // merged: its attributes are those of both).
        resource.clear();
        let mut fields = Fields::of(rs, RS);
        while let Some(field) = fields.next() {
            if let (1, v) = field? {
                let mut r = Fields::of(len(RS, 1, v)?, "Resource");
                while let Some(field) = r.next() {
                    if let (1, v) = field? {
                        resource.push(Attr::read(len("Resource", 1, v)?)?);
                    }
                }
            }
        }
        let (svc, clock) = resource_of(&resource, names);
        let mut fields = Fields::of(rs, RS);
        while let Some(field) = fields.next() {
            let (tag, v) = field?;
            if tag != 2 {
                continue;
            }
            let mut scope = Fields::of(len(RS, tag, v)?, "ScopeSpans");
            while let Some(field) = scope.next() {
                let (tag, v) = field?;
                if tag != 2 {
                    continue;
                }
                let s = SpanFields::read(len("ScopeSpans", tag, v)?, &mut attrs)?;
                let (svc, clock) = (&svc, &clock);
                let (tid, res) = convert(&s, &attrs, &resource, (svc, clock), names, label_keys);
                f(Some(tid), res);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::super::pb;
    use super::*;
    use cpt_sdk::testing::SplitMix64;

    type Out = Vec<(Option<String>, Result<Converted, Reason>)>;

    const KEYS: [&str; 3] = ["service.version", "deployment.environment", "tenant"];

    fn keys() -> Vec<String> {
        KEYS.iter().map(|k| k.to_string()).collect()
    }

    /// What the reader makes of a body.
    fn read(body: &[u8]) -> Result<Out, ProtoError> {
        let mut out = Vec::new();
        let mut names = Interner::default();
        proto_spans(body, &mut names, &keys(), &mut |t, r| out.push((t, r)))?;
        Ok(out)
    }

    /// A decoded `KeyValue` as the reader's.
    fn attr(kv: &pb::KeyValue) -> Attr<'_> {
        use pb::any_value::Value;
        Attr {
            key: &kv.key,
            value: kv.value.as_ref().map(|v| match &v.value {
                Some(Value::StringValue(s)) => Any::Str(s),
                Some(Value::BoolValue(b)) => Any::Bool(*b),
                Some(Value::IntValue(i)) => Any::Int(*i),
                Some(Value::DoubleValue(d)) => Any::Double(*d),
                _ => Any::Other,
            }),
        }
    }

    /// The reference: the body decoded into `opentelemetry-proto`'s
    /// messages by prost, its fields handed to the same conversion.
    fn reference(body: &[u8]) -> Result<Out, prost::DecodeError> {
        let req = pb::ExportTraceServiceRequest::decode(body)?;
        let mut out = Vec::new();
        let mut names = Interner::default();
        let keys = keys();
        for rs in &req.resource_spans {
            let resource: Vec<Attr<'_>> = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter().map(attr))
                .collect();
            let (svc, clock) = resource_of(&resource, &mut names);
            for s in rs.scope_spans.iter().flat_map(|ss| &ss.spans) {
                let fields = SpanFields {
                    trace_id: &s.trace_id,
                    span_id: &s.span_id,
                    parent: &s.parent_span_id,
                    name: &s.name,
                    kind: s.kind,
                    start: s.start_time_unix_nano,
                    end: s.end_time_unix_nano,
                    status: s.status.as_ref().map(|st| st.code),
                };
                let attrs: Vec<Attr<'_>> = s.attributes.iter().map(attr).collect();
                let (tid, res) = convert(
                    &fields,
                    &attrs,
                    &resource,
                    (&svc, &clock),
                    &mut names,
                    &keys,
                );
                out.push((Some(tid), res));
            }
        }
        Ok(out)
    }

    fn kv(key: &str, value: Option<pb::any_value::Value>) -> pb::KeyValue {
        pb::KeyValue {
            key: key.into(),
            value: Some(pb::AnyValue { value }),
            ..Default::default()
        }
    }

    fn text(s: &str) -> Option<pb::any_value::Value> {
        Some(pb::any_value::Value::StringValue(s.into()))
    }

    /// A random value of every kind `AnyValue` has, unset included.
    fn any(rng: &mut SplitMix64) -> Option<pb::any_value::Value> {
        use pb::any_value::Value;
        match rng.below(9) {
            0 => None,
            1 => Some(Value::BoolValue(rng.below(2) == 1)),
            2 => Some(Value::IntValue(rng.next_u64() as i64 % 1000)),
            3 => Some(Value::DoubleValue(rng.below(1000) as f64 / 8.0)),
            4 => Some(Value::BytesValue(vec![1, 2, 3])),
            5 => Some(Value::ArrayValue(pb::ArrayValue {
                values: vec![pb::AnyValue { value: text("x") }],
            })),
            6 => Some(Value::KvlistValue(pb::KeyValueList {
                values: vec![kv("k", text("v"))],
            })),
            7 => text(["", "false", "true", "500", "prod"][rng.below(5) as usize]),
            _ => Some(Value::IntValue([200, 404, 500, 503][rng.below(4) as usize])),
        }
    }

    /// A random request: resources with and without names, hosts and
    /// instances; spans with every field set or not, attributes of every
    /// kind under the keys conversion looks at, statuses, events, links.
    fn random_request(rng: &mut SplitMix64) -> pb::ExportTraceServiceRequest {
        let attr_keys = [
            "error",
            "http.status_code",
            "http.response.status_code",
            "otel.status_code",
            "service.version",
            "deployment.environment",
            "tenant",
            "other",
        ];
        let attrs = |rng: &mut SplitMix64, n: u64| -> Vec<pb::KeyValue> {
            (0..rng.below(n))
                .map(|_| {
                    let mut a = kv(attr_keys[rng.below(8) as usize], any(rng));
                    if rng.below(10) == 0 {
                        a.value = None;
                    }
                    a
                })
                .collect()
        };
        let resource_spans = (0..1 + rng.below(3))
            .map(|r| {
                let mut resource = attrs(rng, 4);
                for (i, key) in ["service.name", "host.name", "service.instance.id"]
                    .iter()
                    .enumerate()
                {
                    if rng.below(3) > 0 {
                        let v = if rng.below(8) == 0 {
                            Some(pb::any_value::Value::IntValue(7))
                        } else {
                            text(&format!("{key}-{r}-{i}"))
                        };
                        resource.push(kv(key, v));
                    }
                }
                let scope_spans = (0..1 + rng.below(2))
                    .map(|_| pb::ScopeSpans {
                        scope: Some(pb::InstrumentationScope {
                            name: "scope".into(),
                            ..Default::default()
                        }),
                        spans: (0..rng.below(6))
                            .map(|_| {
                                let id = |rng: &mut SplitMix64, n: usize| -> Vec<u8> {
                                    match rng.below(12) {
                                        0 => Vec::new(),
                                        1 => vec![0; n],
                                        2 => vec![7; n - 1],
                                        _ => (0..n).map(|_| rng.below(256) as u8).collect(),
                                    }
                                };
                                let start = 1_700_000_000_000_000_000 + rng.below(1_000_000);
                                let end = match rng.below(10) {
                                    0 => 0,
                                    1 => start - 5,
                                    _ => start + rng.below(1_000_000),
                                };
                                pb::Span {
                                    trace_id: id(rng, 16),
                                    span_id: id(rng, 8),
                                    parent_span_id: if rng.below(3) == 0 {
                                        Vec::new()
                                    } else {
                                        id(rng, 8)
                                    },
                                    trace_state: "k=v".into(),
                                    name: format!("op{}", rng.below(5)),
                                    kind: rng.below(7) as i32,
                                    start_time_unix_nano: if rng.below(15) == 0 {
                                        0
                                    } else {
                                        start
                                    },
                                    end_time_unix_nano: end,
                                    attributes: attrs(rng, 5),
                                    events: vec![pb::span::Event {
                                        name: "ev".into(),
                                        attributes: vec![kv("error", text("true"))],
                                        ..Default::default()
                                    }],
                                    links: vec![pb::span::Link {
                                        trace_id: vec![9; 16],
                                        span_id: vec![9; 8],
                                        ..Default::default()
                                    }],
                                    status: (rng.below(2) == 0).then(|| pb::Status {
                                        code: rng.below(3) as i32,
                                        message: "m".into(),
                                    }),
                                    flags: 1,
                                    ..Default::default()
                                }
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect();
                pb::ResourceSpans {
                    resource: (rng.below(6) > 0).then(|| pb::Resource {
                        attributes: resource,
                        ..Default::default()
                    }),
                    scope_spans,
                    schema_url: "https://opentelemetry.io/schemas/1.21.0".into(),
                }
            })
            .collect();
        pb::ExportTraceServiceRequest { resource_spans }
    }

    /// Requests of every shape read as prost's decode of them converts.
    #[test]
    fn random_requests_read_as_the_decoded_message_converts() {
        let mut rng = SplitMix64::new(0x07_1b);
        let mut spans = 0;
        for _ in 0..500 {
            let body = random_request(&mut rng).encode_to_vec();
            let want = reference(&body).unwrap();
            spans += want.len();
            assert_eq!(read(&body).unwrap(), want);
        }
        assert!(spans > 1000, "{spans} spans");
    }

    fn field(tag: u32, msg: &impl Message, buf: &mut Vec<u8>) {
        prost::encoding::message::encode(tag, msg, buf);
    }

    /// Protobuf's rules for a message sent in pieces: fields in any order,
    /// a message field given twice merged, the last scalar winning; two
    /// requests one after the other are one request with both lists.
    #[test]
    fn fields_out_of_order_and_messages_in_pieces_merge_as_protobuf_says() {
        let span = pb::Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: "first".into(),
            kind: 2,
            start_time_unix_nano: 1_700_000_000_000_000_000,
            end_time_unix_nano: 1_700_000_000_000_001_000,
            attributes: vec![kv("tenant", text("a")), kv("service.version", text("1"))],
            ..Default::default()
        };
        // The span again in a second piece: a new name, a status, and the
        // version's value given again with nothing in it (a merge keeps
        // the "1"), then as a number.
        let second = pb::Span {
            name: "second".into(),
            status: Some(pb::Status {
                code: 2,
                message: String::new(),
            }),
            attributes: vec![
                pb::KeyValue {
                    key: "deployment.environment".into(),
                    value: Some(pb::AnyValue { value: None }),
                    ..Default::default()
                },
                kv("other", Some(pb::any_value::Value::IntValue(5))),
            ],
            ..Default::default()
        };
        let mut span_bytes = span.encode_to_vec();
        span_bytes.extend(second.encode_to_vec());
        // A status given twice: the second, without a code, keeps the
        // first's.
        field(
            15,
            &pb::Status {
                code: 0,
                message: "later".into(),
            },
            &mut span_bytes,
        );
        let mut scope = Vec::new();
        prost::encoding::bytes::encode(2, &span_bytes, &mut scope);
        // Scope spans first, then the resource in two pieces.
        let mut rs = Vec::new();
        prost::encoding::bytes::encode(2, &scope, &mut rs);
        field(
            1,
            &pb::Resource {
                attributes: vec![kv("service.name", text("front"))],
                ..Default::default()
            },
            &mut rs,
        );
        field(
            1,
            &pb::Resource {
                attributes: vec![
                    kv("host.name", text("h1")),
                    kv("service.version", text("9")),
                ],
                ..Default::default()
            },
            &mut rs,
        );
        let mut body = Vec::new();
        prost::encoding::bytes::encode(1, &rs, &mut body);
        let mut twice = body.clone();
        twice.extend(&body);
        for body in [body, twice] {
            let want = reference(&body).unwrap();
            let got = read(&body).unwrap();
            assert_eq!(got, want);
            let c = got[0].1.as_ref().unwrap();
            assert_eq!(
                (
                    &*c.span.operation,
                    &*c.span.service,
                    &*c.span.clock,
                    c.span.error
                ),
                ("second", "front", "host:h1", true)
            );
            assert_eq!(
                c.labels,
                vec![
                    ("service.version".to_string(), "1".to_string()),
                    ("tenant".to_string(), "a".to_string()),
                ]
            );
        }
    }

    /// A body cut short, a field of the wrong wire type and a name that is
    /// not UTF-8 are errors that say where; bytes flipped at random are
    /// never a panic, and whatever prost decodes is read the same.
    #[test]
    fn broken_bodies_are_errors_that_say_where_never_panics() {
        let mut rng = SplitMix64::new(0xbad);
        let body = random_request(&mut rng).encode_to_vec();
        let e = read(&body[..body.len() - 3]).unwrap_err();
        assert!(e.to_string().contains("past the end"), "{e}");
        let mut named = pb::ExportTraceServiceRequest {
            resource_spans: vec![pb::ResourceSpans {
                scope_spans: vec![pb::ScopeSpans {
                    spans: vec![pb::Span {
                        name: "NAME".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec();
        let at = named.windows(4).position(|w| w == b"NAME").unwrap();
        named[at] = 0xff;
        let e = read(&named).unwrap_err();
        assert_eq!(e.to_string(), "Span: field 5: a string that is not UTF-8");
        assert!(reference(&named).is_err());
        // Field 7 (the start) as a varint.
        let mut wrong = Vec::new();
        prost::encoding::uint64::encode(7, &5, &mut wrong);
        let mut scope = Vec::new();
        prost::encoding::bytes::encode(2, &wrong, &mut scope);
        let mut rs = Vec::new();
        prost::encoding::bytes::encode(2, &scope, &mut rs);
        let mut body2 = Vec::new();
        prost::encoding::bytes::encode(1, &rs, &mut body2);
        assert_eq!(
            read(&body2).unwrap_err().to_string(),
            "Span: field 7 has the wrong wire type"
        );
        assert!(reference(&body2).is_err());
        let mut decoded = 0;
        for _ in 0..3000 {
            let mut b = body.clone();
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(b.len() as u64) as usize;
                b[i] = rng.below(256) as u8;
            }
            let got = read(&b);
            if let Ok(want) = reference(&b) {
                decoded += 1;
                assert_eq!(got.unwrap(), want);
            }
        }
        assert!(decoded > 100, "{decoded} of the broken bodies still decode");
    }
}
