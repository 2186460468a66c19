//! Jaeger query-API JSON (`GET /api/traces/{id}` and `/api/traces?…`
//! responses): `{"data":[{traceID, processes, spans}, …], …}`.
//!
//! Also accepted: a bare array of trace objects, and a single trace object.
//! Times are µs since the epoch. A span's parent is its first `CHILD_OF`
//! reference in the same trace, else its first `FOLLOWS_FROM` (then the
//! parent does not wait for it: [`Span::detached`](crate::traces::model::Span::detached)). Its clock
//! domain is its process's `hostname` (or `ip`) tag, else the process id.
//!
//! Reading is two-pass: the document is split into one raw JSON slice per
//! trace (a cheap scan that survives a truncated file: every complete trace
//! before the cut is kept and the cut one is reported), then each trace is
//! parsed on its own, in parallel, so one trace with a wrong type is one
//! rejected trace.

use std::borrow::Cow;
use std::fmt;

use rustc_hash::FxHashMap;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::tags::{TagValue, is_error_tag};
use crate::traces::model::{
    BuildOptions, Interner, RawSpan, Reason, SpanKind, TimeUnit, Trace, TraceError, Wide, build,
    span_times,
};

/// Split a Jaeger document into one raw slice per trace.
///
/// Returns the slices read and, when the document is cut short or is not
/// Jaeger JSON, the error (the slices before it are still returned).
pub fn split(doc: &str) -> (Vec<&RawValue>, Option<TraceError>) {
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_str(doc);
    let res = (&mut de).deserialize_any(DocVisitor { out: &mut out });
    let res = res.and_then(|()| de.end());
    if let Err(e) = &res
        && out.is_empty()
        && e.to_string().starts_with(SINGLE)
    {
        // One trace object: the document's first value. Anything after it is
        // reported as [`for_each`] reports it, with the trace still kept.
        let mut de = serde_json::Deserializer::from_str(doc);
        return match <&RawValue>::deserialize(&mut de) {
            Ok(raw) => {
                let err = de.end().err().map(|e| cut_after(1, &e));
                (vec![raw], err)
            }
            Err(e) => (
                vec![],
                Some(TraceError::new("#1", Reason::Json(e.to_string()))),
            ),
        };
    }
    let err = res.err().map(|e| cut_after(out.len(), &e));
    (out, err)
}

/// The error of a document that breaks off after `complete` traces.
fn cut_after(complete: usize, e: &serde_json::Error) -> TraceError {
    TraceError::new(
        format!("#{} (after {complete} complete traces)", complete + 1),
        Reason::Json(e.to_string()),
    )
}

struct DocVisitor<'v, 'a> {
    out: &'v mut Vec<&'a RawValue>,
}

impl<'de, 'v> Visitor<'de> for DocVisitor<'v, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a Jaeger document {"data":[…]}, an array of traces, or one trace"#)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        TracesSeed { out: self.out }.visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (mut data, mut single) = (false, false);
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match &*key {
                "data" => {
                    data = true;
                    map.next_value_seed(TracesSeed {
                        out: &mut *self.out,
                    })?;
                }
                "traceID" | "spans" | "processes" => {
                    single = true;
                    map.next_value::<IgnoredAny>()?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        match (single, data) {
            (true, true) => Err(de::Error::custom(BOTH)),
            // One trace object, not an envelope: `split` takes the whole
            // document as the trace.
            (true, false) => Err(de::Error::custom(SINGLE)),
            _ => Ok(()),
        }
    }
}

const SINGLE: &str = "\u{0}single trace object";

/// A document that is neither an envelope nor one trace, as both readers
/// say it.
const BOTH: &str = "the document has both `data` (a list of traces) and a trace's own fields \
                    (`traceID`, `spans`, `processes`)";

struct TracesSeed<'v, 'a> {
    out: &'v mut Vec<&'a RawValue>,
}

impl<'de, 'v> DeserializeSeed<'de> for TracesSeed<'v, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, 'v> Visitor<'de> for TracesSeed<'v, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of Jaeger traces")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(t) = seq.next_element::<&'de RawValue>()? {
            self.out.push(t);
        }
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        // `"data": null` — an empty answer.
        Ok(())
    }
}

#[derive(Deserialize)]
struct JTrace<'a> {
    #[serde(rename = "traceID", borrow)]
    trace_id: Cow<'a, str>,
    #[serde(borrow)]
    spans: Vec<JSpan<'a>>,
    #[serde(default, borrow)]
    processes: FxHashMap<Cow<'a, str>, JProcess<'a>>,
}

#[derive(Deserialize)]
struct JSpan<'a> {
    #[serde(rename = "traceID", default, borrow, deserialize_with = "borrowed_opt")]
    trace_id: Option<Cow<'a, str>>,
    #[serde(rename = "spanID", borrow)]
    span_id: Cow<'a, str>,
    #[serde(rename = "operationName", borrow)]
    operation: Cow<'a, str>,
    #[serde(default, borrow)]
    references: Refs<'a>,
    #[serde(rename = "startTime")]
    start_us: Wide,
    #[serde(rename = "duration")]
    duration_us: Wide,
    #[serde(default)]
    tags: SpanTags,
    #[serde(
        rename = "processID",
        default,
        borrow,
        deserialize_with = "borrowed_opt"
    )]
    process_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    process: Option<JProcess<'a>>,
}

#[derive(Deserialize)]
struct JRef<'a> {
    #[serde(rename = "refType", borrow)]
    ref_type: Cow<'a, str>,
    #[serde(rename = "traceID", default, borrow, deserialize_with = "borrowed_opt")]
    trace_id: Option<Cow<'a, str>>,
    #[serde(rename = "spanID", borrow)]
    span_id: Cow<'a, str>,
}

#[derive(Deserialize)]
struct JTag<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow)]
    value: TagValue<'a>,
}

#[derive(Deserialize)]
struct JProcess<'a> {
    #[serde(rename = "serviceName", borrow)]
    service: Cow<'a, str>,
    #[serde(default, borrow)]
    tags: ProcessTags<'a>,
}

/// An optional string borrowed from the document when it has no escapes
/// (serde borrows a `Cow<str>` field, but not one inside an `Option`: that
/// would be one allocation per span and per reference).
fn borrowed_opt<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Borrowed<'a>>::deserialize(d)?.map(|b| b.0))
}

/// The span tags we use (kind, error), read without collecting the array.
#[derive(Default)]
struct SpanTags {
    kind: SpanKind,
    error: bool,
}

impl<'de> Deserialize<'de> for SpanTags {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SpanTags;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of tags")
            }
            fn visit_unit<E: de::Error>(self) -> Result<SpanTags, E> {
                Ok(SpanTags::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SpanTags, A::Error> {
                let mut t = SpanTags::default();
                while let Some(tag) = seq.next_element::<JTag<'de>>()? {
                    if tag.key == "span.kind" {
                        if let TagValue::Str(v) = &tag.value {
                            t.kind = SpanKind::parse_lossy(v);
                        }
                    } else {
                        t.error |= is_error_tag(&tag.key, &tag.value);
                    }
                }
                Ok(t)
            }
        }
        d.deserialize_any(V)
    }
}

/// The process tags we use: the host (`hostname`, `host.name`, else `ip`).
#[derive(Default)]
struct ProcessTags<'a> {
    host: Option<Cow<'a, str>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for ProcessTags<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = ProcessTags<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of tags")
            }
            fn visit_unit<E: de::Error>(self) -> Result<ProcessTags<'a>, E> {
                Ok(ProcessTags::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ProcessTags<'a>, A::Error> {
                let mut host: Option<Cow<'a, str>> = None;
                let mut ip: Option<Cow<'a, str>> = None;
                while let Some(tag) = seq.next_element::<JTag<'a>>()? {
                    if let TagValue::Str(v) = tag.value {
                        match &*tag.key {
                            "hostname" | "host.name" => host = Some(v),
                            "ip" => ip = Some(v),
                            _ => {}
                        }
                    }
                }
                Ok(ProcessTags { host: host.or(ip) })
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A span's references, keeping the first `CHILD_OF` and the first
/// `FOLLOWS_FROM` without collecting the array.
#[derive(Default)]
struct Refs<'a> {
    child_of: Option<JRef<'a>>,
    follows_from: Option<JRef<'a>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Refs<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Refs<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of references")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Refs<'a>, E> {
                Ok(Refs::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Refs<'a>, A::Error> {
                let mut r = Refs::default();
                while let Some(x) = seq.next_element::<JRef<'a>>()? {
                    match &*x.ref_type {
                        "CHILD_OF" if r.child_of.is_none() => r.child_of = Some(x),
                        "FOLLOWS_FROM" if r.follows_from.is_none() => r.follows_from = Some(x),
                        _ => {}
                    }
                }
                Ok(r)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// Parse and validate one trace slice from [`split`].
///
/// # Errors
///
/// The trace's JSON is not a Jaeger trace, or [`build`] rejects it.
pub fn parse_trace(
    raw: &RawValue,
    names: &mut Interner,
    opts: BuildOptions,
) -> Result<Trace, TraceError> {
    let t: JTrace<'_> = serde_json::from_str(raw.get())
        .map_err(|e| TraceError::new(guess_trace_id(raw.get()), Reason::Json(e.to_string())))?;
    convert(t, names, opts)
}

/// Read every trace of a document in one pass, handing each to `f`. The
/// document may be the envelope `{"data":[…]}`, a bare array of traces, or
/// one bare trace object, as [`split`] accepts.
///
/// This is the fast path: one scan, no per-trace slices. It stops at the
/// first JSON error (serde cannot resynchronise inside a document) and
/// returns how many traces it handed over with the error; the caller then
/// reads the rest with [`split`] + [`parse_trace`], which isolate the bad
/// trace.
///
/// # Errors
///
/// `(traces handed over, the JSON error)`.
pub fn for_each(
    doc: &str,
    names: &mut Interner,
    opts: BuildOptions,
    f: &mut dyn FnMut(Result<Trace, TraceError>),
) -> Result<usize, (usize, serde_json::Error)> {
    drive(serde_json::Deserializer::from_str(doc), names, opts, f)
}

/// [`for_each`] over a reader (files too large to hold in memory): strings
/// are copied out of the stream instead of borrowed, and a JSON error ends
/// the read (there is nothing to resynchronise on).
///
/// # Errors
///
/// `(traces handed over, the JSON or I/O error)`.
pub fn for_each_reader<R: std::io::Read>(
    reader: R,
    names: &mut Interner,
    opts: BuildOptions,
    f: &mut dyn FnMut(Result<Trace, TraceError>),
) -> Result<usize, (usize, serde_json::Error)> {
    drive(
        serde_json::Deserializer::from_reader(reader),
        names,
        opts,
        f,
    )
}

/// Feed a whole Jaeger document to [`FastDoc`], counting the traces handed
/// over even when the JSON breaks off.
fn drive<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
    names: &mut Interner,
    opts: BuildOptions,
    f: &mut dyn FnMut(Result<Trace, TraceError>),
) -> Result<usize, (usize, serde_json::Error)> {
    let mut n = 0usize;
    let res = (&mut de).deserialize_any(FastDoc {
        n: &mut n,
        names,
        opts,
        f,
    });
    match res.and_then(|()| de.end()) {
        Ok(()) => Ok(n),
        Err(e) => Err((n, e)),
    }
}

struct FastDoc<'x> {
    n: &'x mut usize,
    names: &'x mut Interner,
    opts: BuildOptions,
    f: &'x mut dyn FnMut(Result<Trace, TraceError>),
}

impl<'de> Visitor<'de> for FastDoc<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a Jaeger document {"data":[…]}, an array of traces, or one trace"#)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        let FastDoc { n, names, opts, f } = self;
        FastTraces { n, names, opts, f }.visit_seq(seq)
    }

    /// The envelope `{"data":[…]}`, or one bare trace object
    /// `{"traceID", "spans", "processes"}` (what the Jaeger UI saves), read
    /// field by field as it streams past.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let FastDoc { n, names, opts, f } = self;
        let mut data = false;
        let mut trace_id: Option<Cow<'de, str>> = None;
        let mut spans: Option<Vec<JSpan<'de>>> = None;
        let mut processes: Option<FxHashMap<Cow<'de, str>, JProcess<'de>>> = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match &*key {
                "data" => {
                    data = true;
                    map.next_value_seed(FastTraces {
                        n: &mut *n,
                        names: &mut *names,
                        opts,
                        f: &mut *f,
                    })?;
                }
                // A field twice is refused, as `parse_trace` refuses it.
                "traceID" if trace_id.is_some() => {
                    return Err(de::Error::duplicate_field("traceID"));
                }
                "spans" if spans.is_some() => return Err(de::Error::duplicate_field("spans")),
                "processes" if processes.is_some() => {
                    return Err(de::Error::duplicate_field("processes"));
                }
                "traceID" => trace_id = Some(map.next_value()?),
                "spans" => spans = Some(map.next_value()?),
                "processes" => processes = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let single = trace_id.is_some() || spans.is_some() || processes.is_some();
        if single && data {
            return Err(de::Error::custom(BOTH));
        }
        if single {
            let trace_id = trace_id.ok_or_else(|| de::Error::missing_field("traceID"))?;
            let spans = spans.ok_or_else(|| de::Error::missing_field("spans"))?;
            *n += 1;
            f(convert(
                JTrace {
                    trace_id,
                    spans,
                    processes: processes.unwrap_or_default(),
                },
                names,
                opts,
            ));
        }
        Ok(())
    }
}

struct FastTraces<'x> {
    n: &'x mut usize,
    names: &'x mut Interner,
    opts: BuildOptions,
    f: &'x mut dyn FnMut(Result<Trace, TraceError>),
}

impl<'de> DeserializeSeed<'de> for FastTraces<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for FastTraces<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of Jaeger traces")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(t) = seq.next_element::<JTrace<'de>>()? {
            *self.n += 1;
            (self.f)(convert(t, self.names, self.opts));
        }
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

fn convert(t: JTrace<'_>, names: &mut Interner, opts: BuildOptions) -> Result<Trace, TraceError> {
    // Process id -> (service, clock).
    let mut procs: Vec<(&str, Names)> = Vec::with_capacity(t.processes.len());
    for (pid, p) in &t.processes {
        procs.push((pid, process_names(pid, p, names)));
    }
    let mut spans = Vec::with_capacity(t.spans.len());
    for s in &t.spans {
        let (service, clock) = match (&s.process, s.process_id.as_deref()) {
            (Some(p), pid) => process_names(pid.unwrap_or(&p.service), p, names),
            (None, Some(pid)) => match procs.iter().find(|(k, _)| *k == pid) {
                Some((_, v)) => v.clone(),
                None => {
                    return Err(TraceError::new(
                        &*t.trace_id,
                        Reason::Json(format!("span {} names unknown process {pid:?}", s.span_id)),
                    ));
                }
            },
            (None, None) => {
                return Err(TraceError::new(
                    &*t.trace_id,
                    Reason::Json(format!("span {} has no process", s.span_id)),
                ));
            }
        };
        let same_trace = |r: &JRef<'_>| {
            r.trace_id.as_deref().is_none_or(|id| id == &*t.trace_id)
                || s.trace_id
                    .as_deref()
                    .is_some_and(|own| r.trace_id.as_deref() == Some(own))
        };
        let child_of = s.references.child_of.as_ref().filter(|r| same_trace(r));
        let follows_from = s.references.follows_from.as_ref().filter(|r| same_trace(r));
        let parent = child_of
            .or(follows_from)
            .map(|r| Cow::Borrowed(&*r.span_id));
        let (start_ns, duration_ns) = span_times(
            &s.span_id,
            Some(("startTime", s.start_us.0)),
            Some(("duration", s.duration_us.0)),
            TimeUnit::Micros,
        )
        .map_err(|r| TraceError::new(&*t.trace_id, r))?;
        spans.push(RawSpan {
            id: Cow::Borrowed(&*s.span_id),
            parent_id: parent,
            service,
            operation: names.get(&s.operation),
            start_ns,
            duration_ns,
            kind: s.tags.kind,
            clock,
            error: s.tags.error,
            follows_from: child_of.is_none() && follows_from.is_some(),
        });
    }
    build(&t.trace_id, spans, opts)
}

/// A process's (service, clock domain).
type Names = (std::sync::Arc<str>, std::sync::Arc<str>);

fn process_names(pid: &str, p: &JProcess<'_>, names: &mut Interner) -> Names {
    let clock = match &p.tags.host {
        Some(h) => names.get_joined("host:", h, ""),
        None => names.get_joined("process:", &p.service, pid),
    };
    (names.get(&p.service), clock)
}

/// Best-effort trace id of an unparseable trace slice, for the report.
fn guess_trace_id(text: &str) -> String {
    #[derive(Deserialize)]
    struct Id<'a> {
        #[serde(rename = "traceID", borrow)]
        trace_id: Cow<'a, str>,
    }
    // The id may sit after the bad field; scan for it textually.
    if let Some(i) = text.find("\"traceID\"") {
        let rest = &text[i + 9..];
        if let Some(q1) = rest.find('"') {
            let rest = &rest[q1 + 1..];
            if let Some(q2) = rest.find('"') {
                return rest[..q2].to_string();
            }
        }
    }
    serde_json::from_str::<Id<'_>>(text)
        .map(|i| i.trace_id.into_owned())
        .unwrap_or_else(|_| "<unknown>".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"{"data":[
      {"traceID":"t1","processes":{"p1":{"serviceName":"A","tags":[{"key":"hostname","type":"string","value":"h1"}]}},
       "spans":[{"traceID":"t1","spanID":"a","operationName":"GET","references":[],"startTime":10,"duration":5,
                 "tags":[{"key":"span.kind","type":"string","value":"server"},{"key":"error","type":"bool","value":true}],"processID":"p1"}]},
      {"traceID":"t2","processes":{"p1":{"serviceName":"A"}},
       "spans":[{"traceID":"t2","spanID":"a","operationName":"GET","references":[],"startTime":10,"duration":"oops","processID":"p1"}]}
    ],"total":0}"#;

    /// The first trace of [`TWO`] on its own, a bare trace object.
    fn t1() -> &'static str {
        let start = TWO.find("{\"traceID\":\"t1\"").unwrap();
        let end = TWO.find(",\n      {\"traceID\":\"t2\"").unwrap();
        &TWO[start..end]
    }

    /// [`for_each`] over `doc`: the traces it handed over, and its result.
    fn one_pass(doc: &str) -> (usize, Result<usize, (usize, serde_json::Error)>) {
        let mut read = 0;
        let res = for_each(
            doc,
            &mut Interner::default(),
            BuildOptions::default(),
            &mut |t| {
                read += usize::from(t.is_ok());
            },
        );
        (read, res)
    }

    #[test]
    fn one_bad_trace_is_rejected_alone() {
        let (raws, err) = split(TWO);
        assert!(err.is_none());
        assert_eq!(raws.len(), 2);
        let mut names = Interner::default();
        let t = parse_trace(raws[0], &mut names, BuildOptions::default()).unwrap();
        let s = &t.spans[0];
        assert_eq!(
            (s.start_ns, s.duration_ns, s.kind, s.error),
            (10_000, 5_000, SpanKind::Server, true)
        );
        let e = parse_trace(raws[1], &mut names, BuildOptions::default()).unwrap_err();
        assert_eq!(e.trace_id, "t2");
        assert!(e.to_string().contains("unreadable JSON"), "{e}");
    }

    #[test]
    fn truncated_document_keeps_complete_traces() {
        let cut = &TWO[..TWO.find("{\"traceID\":\"t2\"").unwrap() + 30];
        let (raws, err) = split(cut);
        assert_eq!(raws.len(), 1);
        let e = err.unwrap().to_string();
        assert!(
            e.contains("after 1 complete traces") && e.contains("EOF"),
            "{e}"
        );
    }

    #[test]
    fn a_single_trace_object_with_text_after_it_is_kept_by_both_readers() {
        // One bare trace object (what the Jaeger UI saves), then the rest of
        // an envelope it was cut out of.
        let doc = format!("{}\n], \"total\": 0}}", t1());
        let (raws, err) = split(&doc);
        assert_eq!(raws.len(), 1, "the trace before the stray text is kept");
        let e = err.expect("the stray text is reported").to_string();
        assert!(
            e.contains("after 1 complete traces") && e.contains("trailing characters"),
            "{e}"
        );
        let (read, res) = one_pass(&doc);
        assert_eq!((read, res.map_err(|(n, _)| n)), (1, Err(1)));
    }

    #[test]
    fn a_single_trace_object_with_a_field_twice_is_refused_by_both_readers() {
        let doc = t1().replacen(
            "{\"traceID\":\"t1\"",
            "{\"traceID\":\"t0\",\"traceID\":\"t1\"",
            1,
        );
        let (read, res) = one_pass(&doc);
        let (n, e) = res.expect_err("a field twice is refused");
        assert_eq!((read, n), (0, 0));
        assert!(e.to_string().contains("duplicate field `traceID`"), "{e}");
        let (raws, err) = split(&doc);
        assert!(err.is_none());
        let e =
            parse_trace(raws[0], &mut Interner::default(), BuildOptions::default()).unwrap_err();
        assert!(e.to_string().contains("duplicate field `traceID`"), "{e}");
    }

    #[test]
    fn an_envelope_with_a_trace_s_own_fields_is_refused_alike_by_both_readers() {
        // `traceID` beside `data`: neither an envelope nor one trace. Both
        // readers keep the traces in `data` and report the document.
        let doc = format!("{{\"traceID\":\"t0\",\"data\":[{}]}}", t1());
        let (raws, err) = split(&doc);
        assert_eq!(raws.len(), 1);
        let e = err.expect("the document is refused").to_string();
        assert!(e.contains("has both `data`"), "{e}");
        let (read, res) = one_pass(&doc);
        let (n, e) = res.expect_err("the document is refused");
        assert_eq!((read, n), (1, 1));
        assert!(e.to_string().contains("has both `data`"), "{e}");
    }
}
