//! Zipkin v2 JSON: a list of spans (`POST /api/v2/spans`), or a list of
//! traces (`GET /api/v2/traces`), spans of many traces mixed in any order.
//!
//! - Times are µs since the epoch; `duration` may be absent (zero-length;
//!   a span without `timestamp` is placed by [`crate::traces::model::build`]).
//!   A time that overflows nanoseconds (nanoseconds in the µs fields) is
//!   refused, naming the span.
//! - **Pieces are merged as Zipkin's own `Trace.merge` does** (zipkin2
//!   `internal/Trace.java`): the records of one `id` are ordered
//!   non-`shared` first, CLIENT first among those, then by local endpoint
//!   (records without one first); a record absorbs each following one with
//!   the same `shared` flag whose local endpoint does not contradict its own
//!   (a missing endpoint, or missing service / IP / port fields, contradict
//!   nothing). Absorbing fills what the record lacks (kind, name,
//!   timestamp, duration, parent, endpoint fields) and adds the error tags.
//!   So a kind-less piece with no `localEndpoint` (a late-reported part,
//!   as in Zipkin's former `netflix.json`) folds into its typed span, and
//!   `shared` SERVER pieces on one endpoint become one span. A SERVER record
//!   right after a CLIENT one of the same id is `shared` even without the
//!   flag, and a shared record without `parentId` takes the client's.
//!   Beyond Zipkin, a kind-less record still left over (its `shared` flag
//!   differs from the typed record on its endpoint) folds into the first
//!   typed record of the id whose endpoint it does not contradict.
//! - **Shared spans** (Zipkin's B3 model, what remains after the merge):
//!   the CLIENT (or first other non-shared, non-SERVER) record keeps the id;
//!   each shared or SERVER record becomes its own span, child of the client
//!   half, with the id `ID#s0`, `ID#s1`, …; other spans naming the id as
//!   parent hang under the server half on their own local endpoint, else
//!   under the first server half. Two non-shared records of one id that do
//!   not merge (different endpoints) are kept apart, the later one as
//!   `ID~dupK`, and the trace is labelled `import.duplicate_span_ids`.
//! - The clock domain is `localEndpoint.ipv4` / `ipv6`, else its
//!   `serviceName`. A span without a service name is `"unknown"`.
//! - **Zipkin v1** (`binaryAnnotations`, or `cs`/`sr`/`cr`/`ss` annotations
//!   with no `kind` and no `localEndpoint`) is refused with a message: read
//!   as v2 it would lose every service name.
//! - Files above [`ImportOptions::stream_above_bytes`](crate::traces::ImportOptions::stream_above_bytes)
//!   are streamed ([`read_reader`]): only the compact records are held,
//!   not the text.

use std::borrow::{Borrow, Cow};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::tags::{TagValue, is_error_tag};
use crate::traces::model::{
    BuildOptions, Interner, RawSpan, Reason, SpanKind, TimeUnit, Trace, TraceError, Wide, build,
    span_times,
};

#[derive(Deserialize)]
struct ZSpan<'a> {
    #[serde(rename = "traceId", borrow)]
    trace_id: Cow<'a, str>,
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(rename = "parentId", default, borrow)]
    parent_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default)]
    timestamp: Option<Wide>,
    #[serde(default)]
    duration: Option<Wide>,
    #[serde(rename = "localEndpoint", default, borrow)]
    local: Option<Endpoint<'a>>,
    #[serde(default)]
    shared: Option<bool>,
    #[serde(default, borrow)]
    tags: Option<HashMap<Cow<'a, str>, TagValue<'a>>>,
    #[serde(default, borrow)]
    annotations: Option<Vec<Annotation<'a>>>,
    #[serde(rename = "binaryAnnotations", default)]
    binary_annotations: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Annotation<'a> {
    #[serde(default, borrow)]
    value: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Endpoint<'a> {
    #[serde(rename = "serviceName", default, borrow)]
    service: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    ipv4: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    ipv6: Option<Cow<'a, str>>,
    #[serde(default)]
    port: Option<i64>,
}

impl ZSpan<'_> {
    /// Zipkin v1 marks: `binaryAnnotations`, or core annotations (`cs`,
    /// `sr`, `cr`, `ss`) on a record with no `kind` and no `localEndpoint`.
    fn looks_v1(&self) -> bool {
        self.binary_annotations.is_some()
            || (self.kind.is_none()
                && self.local.is_none()
                && self.annotations.as_ref().is_some_and(|a| {
                    a.iter()
                        .any(|a| matches!(a.value.as_deref(), Some("cs" | "sr" | "cr" | "ss")))
                }))
    }
}

/// A local endpoint, interned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Ep {
    service: Option<Arc<str>>,
    ipv4: Option<Arc<str>>,
    ipv6: Option<Arc<str>>,
    port: Option<i64>,
}

impl Ep {
    /// Zipkin's `EndpointTracker.tryMerge`: fields set on both sides must
    /// agree; then the missing ones are filled in.
    fn try_merge(&mut self, o: &Ep) -> bool {
        fn agree<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
            match (a, b) {
                (Some(x), Some(y)) => x == y,
                _ => true,
            }
        }
        let port = |p: &Option<i64>| p.filter(|&p| p != 0);
        if !(agree(&self.service, &o.service)
            && agree(&self.ipv4, &o.ipv4)
            && agree(&self.ipv6, &o.ipv6)
            && agree(&port(&self.port), &port(&o.port)))
        {
            return false;
        }
        fill(&mut self.service, &o.service);
        fill(&mut self.ipv4, &o.ipv4);
        fill(&mut self.ipv6, &o.ipv6);
        if port(&self.port).is_none() {
            self.port = o.port;
        }
        true
    }
}

fn fill<T: Clone>(a: &mut Option<T>, b: &Option<T>) {
    if a.is_none() {
        a.clone_from(b);
    }
}

/// One Zipkin record, compact and owned: what the merge and the tree need.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ZRec {
    id: Box<str>,
    parent_id: Option<Box<str>>,
    /// `None` when the record has no `kind`.
    kind: Option<SpanKind>,
    name: Option<Arc<str>>,
    /// µs; Zipkin treats 0 as absent when merging.
    timestamp: Option<Wide>,
    duration: Option<Wide>,
    local: Option<Ep>,
    shared: bool,
    error: bool,
}

impl ZRec {
    fn new(s: &ZSpan<'_>, names: &mut Interner) -> ZRec {
        let mut intern = |v: &Option<Cow<'_, str>>| v.as_deref().map(|v| names.get(v));
        let local = s.local.as_ref().map(|l| Ep {
            service: intern(&l.service),
            ipv4: intern(&l.ipv4),
            ipv6: intern(&l.ipv6),
            port: l.port,
        });
        ZRec {
            id: Box::from(&*s.id),
            parent_id: s.parent_id.as_deref().map(Box::from),
            kind: s.kind.as_deref().map(SpanKind::parse_lossy),
            name: intern(&s.name),
            timestamp: s.timestamp,
            duration: s.duration,
            local,
            shared: s.shared == Some(true),
            error: s
                .tags
                .as_ref()
                .is_some_and(|t| t.iter().any(|(k, v)| k == "error" || is_error_tag(k, v))),
        }
    }

    /// Zipkin's `Span.Builder.merge`: fill what this record lacks from `o`.
    fn absorb(&mut self, o: &ZRec) {
        fill(&mut self.parent_id, &o.parent_id);
        fill(&mut self.kind, &o.kind);
        fill(&mut self.name, &o.name);
        if self.timestamp.unwrap_or_default().0 == 0 {
            self.timestamp = o.timestamp.or(self.timestamp);
        }
        if self.duration.unwrap_or_default().0 == 0 {
            self.duration = o.duration.or(self.duration);
        }
        match (&mut self.local, &o.local) {
            (None, l) => self.local.clone_from(l),
            (Some(a), Some(b)) => {
                let _ = a.try_merge(b);
            }
            (Some(_), None) => {}
        }
        self.error |= o.error;
    }

    fn is_client(&self) -> bool {
        self.kind == Some(SpanKind::Client)
    }

    fn is_server(&self) -> bool {
        self.kind == Some(SpanKind::Server)
    }
}

/// Zipkin's `CLEANUP_COMPARATOR` within one id: non-shared first (CLIENT
/// first among them), then records without a local endpoint, then by
/// service, IPv4, IPv6 (missing fields last).
fn cleanup_order(a: &ZRec, b: &ZRec) -> Ordering {
    let rank = |r: &ZRec| match (r.shared, r.is_client()) {
        (true, _) => 2,
        (false, true) => 0,
        (false, false) => 1,
    };
    fn nulls_last(a: &Option<Arc<str>>, b: &Option<Arc<str>>) -> Ordering {
        match (a, b) {
            (Some(x), Some(y)) => x.cmp(y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        }
    }
    rank(a)
        .cmp(&rank(b))
        .then_with(|| match (&a.local, &b.local) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (Some(x), Some(y)) => nulls_last(&x.service, &y.service)
                .then_with(|| nulls_last(&x.ipv4, &y.ipv4))
                .then_with(|| nulls_last(&x.ipv6, &y.ipv6)),
        })
}

/// Merge the records of one id as Zipkin's `Trace.merge` does (see the
/// module docs). Returns the merged records and how many records were exact
/// copies of an earlier one.
fn merge_id(recs: Vec<ZRec>) -> (Vec<ZRec>, usize) {
    if recs.len() < 2 {
        return (recs, 0);
    }
    // Exact copies of an earlier record add nothing: dropped and counted.
    let before = recs.len();
    let mut uniq: Vec<ZRec> = Vec::with_capacity(before);
    for r in recs {
        if !uniq.contains(&r) {
            uniq.push(r);
        }
    }
    let copies = before - uniq.len();
    let mut recs = uniq;
    recs.sort_by(cleanup_order);
    let mut out: Vec<ZRec> = Vec::with_capacity(recs.len());
    let mut it = recs.into_iter().peekable();
    while let Some(mut span) = it.next() {
        let mut tracker = span.local.clone().unwrap_or_default();
        while let Some(next) = it.peek() {
            let next_ep = next.local.clone().unwrap_or_default();
            if next.shared != span.shared || !tracker.try_merge(&next_ep) {
                break;
            }
            let next = it.next().expect("peeked");
            span.absorb(&next);
        }
        if let Some(last) = out.last() {
            if last.is_client() && span.is_server() && !span.shared {
                span.shared = true;
            }
            if span.shared && span.parent_id.is_none() {
                span.parent_id.clone_from(&last.parent_id);
            }
        }
        out.push(span);
    }
    // Beyond Zipkin: a kind-less piece left over (its `shared` flag differs
    // from the typed record on its endpoint, e.g. a server's late part
    // without the flag) folds into the first typed record whose endpoint it
    // does not contradict.
    let mut i = 0;
    while i < out.len() {
        if out[i].kind.is_some() || out.len() < 2 {
            i += 1;
            continue;
        }
        let ep = out[i].local.clone().unwrap_or_default();
        let target = out
            .iter()
            .position(|t| t.kind.is_some() && t.local.clone().unwrap_or_default().try_merge(&ep));
        match target {
            Some(t) => {
                let piece = out.remove(i);
                let t = if t > i { t - 1 } else { t };
                out[t].absorb(&piece);
            }
            None => i += 1,
        }
    }
    (out, copies)
}

/// The records of one file, grouped by trace (in order of first
/// appearance), before merging.
#[derive(Default)]
struct Grouped {
    names: Interner,
    order: Vec<Box<str>>,
    by_trace: HashMap<Box<str>, Vec<ZRec>>,
    /// Traces with an unreadable record: the first reason.
    bad: HashMap<Box<str>, String>,
    errors: Vec<TraceError>,
    /// The first record that looks like Zipkin v1: (trace, span).
    v1: Option<(String, String)>,
}

impl Grouped {
    fn entry(&mut self, tid: &str) -> &mut Vec<ZRec> {
        let tid = tid.to_ascii_lowercase();
        if !self.by_trace.contains_key(tid.as_str()) {
            self.order.push(tid.clone().into());
        }
        self.by_trace.entry(tid.into()).or_default()
    }

    /// One element of the top-level list: a span, or a trace (a list of
    /// spans).
    fn add(&mut self, raw: &RawValue) {
        if raw.get().trim_start().starts_with('[') {
            match serde_json::from_str::<Vec<&RawValue>>(raw.get()) {
                Ok(v) => v.into_iter().for_each(|r| self.add_span(r)),
                Err(e) => self
                    .errors
                    .push(TraceError::new("#?", Reason::Json(e.to_string()))),
            }
        } else {
            self.add_span(raw);
        }
    }

    fn add_span(&mut self, raw: &RawValue) {
        match serde_json::from_str::<ZSpan<'_>>(raw.get()) {
            Ok(s) => {
                if self.v1.is_none() && s.looks_v1() {
                    self.v1 = Some((s.trace_id.to_string(), s.id.to_string()));
                }
                let rec = ZRec::new(&s, &mut self.names);
                self.entry(&s.trace_id).push(rec);
            }
            Err(e) => match guess(raw.get(), "\"traceId\"") {
                Some(t) => {
                    self.entry(&t);
                    self.bad
                        .entry(t.to_ascii_lowercase().into())
                        .or_insert_with(|| e.to_string());
                }
                None => self
                    .errors
                    .push(TraceError::new("<unknown>", Reason::Json(e.to_string()))),
            },
        }
    }

    /// The refusal of a Zipkin v1 file, if it is one.
    fn v1_error(&self) -> Option<TraceError> {
        let (t, s) = self.v1.as_ref()?;
        Some(TraceError::new(
            "#1",
            Reason::Unsupported(format!(
                "this is Zipkin v1 JSON, not v2 (span {s} of trace {t} has `binaryAnnotations` \
                 or `cs`/`sr` annotations and no `kind` / `localEndpoint`); read as v2 it would \
                 lose every service name, so the file is refused. Convert it to v2 first, e.g. \
                 POST it to a Zipkin server's /api/v1/spans and fetch /api/v2/trace/{{id}}"
            )),
        ))
    }

    /// Merge and validate the traces, in order, handing each to `f`.
    fn finish(mut self, opts: BuildOptions, f: &mut dyn FnMut(Result<Trace, TraceError>)) {
        let order = std::mem::take(&mut self.order);
        for tid in order {
            let recs = self.by_trace.remove(&tid).unwrap_or_default();
            if let Some(e) = self.bad.remove(&tid) {
                f(Err(TraceError::new(&*tid, Reason::Json(e))));
                continue;
            }
            f(convert(&tid, recs, &mut self.names, opts));
        }
    }
}

/// Read a Zipkin v2 document into validated traces (in order of first
/// appearance) and the errors of what could not be read.
pub fn read(text: &str, opts: BuildOptions) -> (Vec<Result<Trace, TraceError>>, Vec<TraceError>) {
    let body = text.trim_start_matches(|c: char| c.is_whitespace() || c == '\u{feff}');
    if body.starts_with('{') {
        return (Vec::new(), vec![bare_object(body)]);
    }
    let mut g = Grouped::default();
    let mut de = serde_json::Deserializer::from_str(text);
    let res = SpanList::<&RawValue>::new(&mut g)
        .deserialize(&mut de)
        .and_then(|()| de.end());
    let mut out = Vec::new();
    let errors = finish(g, res, opts, &mut |t| out.push(t));
    (out, errors)
}

/// [`read`] from a reader, for large files: only the compact records are
/// held (not the text), and each trace is handed to `f` as soon as it is
/// validated (its records are freed then). Returns the errors of what could
/// not be read.
pub fn read_reader<R: std::io::Read>(
    reader: R,
    opts: BuildOptions,
    f: &mut dyn FnMut(Result<Trace, TraceError>),
) -> Vec<TraceError> {
    use std::io::{BufRead, Read};
    let mut reader = std::io::BufReader::new(reader);
    // A bare object (one span, not a list): read it whole (it is one span)
    // to say what it is.
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) => return vec![TraceError::new("#1", Reason::Json(e.to_string()))],
        };
        let Some(&c) = buf.first() else { break };
        if c.is_ascii_whitespace() {
            reader.consume(1);
            continue;
        }
        if c == b'{' {
            let mut text = String::new();
            if let Err(e) = reader.read_to_string(&mut text) {
                return vec![TraceError::new("#1", Reason::Json(e.to_string()))];
            }
            return vec![bare_object(&text)];
        }
        break;
    }
    let mut g = Grouped::default();
    let mut de = serde_json::Deserializer::from_reader(reader);
    let res = SpanList::<Box<RawValue>>::new(&mut g)
        .deserialize(&mut de)
        .and_then(|()| de.end());
    finish(g, res, opts, f)
}

/// The error for a document that is one JSON object instead of a list:
/// Zipkin v1's message when the object is a v1 span (as it would be inside
/// a list), else what a v2 file looks like.
fn bare_object(body: &str) -> TraceError {
    let mut g = Grouped::default();
    if let Ok(one) = serde_json::from_str::<&RawValue>(body) {
        g.add(one);
    }
    g.v1_error().unwrap_or_else(|| {
        TraceError::new(
            "#1",
            Reason::Json(
                "not a Zipkin v2 span list: the file is one JSON object; a Zipkin v2 file is a \
                 list of spans (`[{...}, ...]`, as /api/v2/trace/{id} returns), so wrap a single \
                 span in [ ]"
                    .into(),
            ),
        )
    })
}

fn finish(
    mut g: Grouped,
    res: Result<(), serde_json::Error>,
    opts: BuildOptions,
    f: &mut dyn FnMut(Result<Trace, TraceError>),
) -> Vec<TraceError> {
    if let Some(e) = g.v1_error() {
        return vec![e];
    }
    if let Err(e) = res {
        if g.order.is_empty() {
            return vec![TraceError::new(
                "#1",
                Reason::Json(format!("not a Zipkin v2 span list: {e}")),
            )];
        }
        // Cut short: the traces read so far may miss spans (a trace's spans
        // may be anywhere in the list), so none is analysed.
        let n = g.order.len();
        return vec![TraceError::new(
            format!("#{} (after {n} traces begun)", n + 1),
            Reason::Json(format!(
                "the span list breaks off ({e}); a trace's spans may be anywhere in a Zipkin \
                 list, so none of the traces begun is analysed"
            )),
        )];
    }
    let errors = std::mem::take(&mut g.errors);
    g.finish(opts, f);
    errors
}

/// The top-level list, element by element (`T` is `&RawValue` for text,
/// `Box<RawValue>` for a reader).
struct SpanList<'g, T> {
    g: &'g mut Grouped,
    _t: std::marker::PhantomData<T>,
}

impl<'g, T> SpanList<'g, T> {
    fn new(g: &'g mut Grouped) -> Self {
        SpanList {
            g,
            _t: std::marker::PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de> + Borrow<RawValue>> DeserializeSeed<'de> for SpanList<'_, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, T: Deserialize<'de> + Borrow<RawValue>> Visitor<'de> for SpanList<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Zipkin v2 list of spans (or of traces)")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(t) = seq.next_element::<T>()? {
            self.g.add(t.borrow());
        }
        Ok(())
    }
}

fn convert(
    tid: &str,
    zs: Vec<ZRec>,
    names: &mut Interner,
    opts: BuildOptions,
) -> Result<Trace, TraceError> {
    // Records per id (ids in order of first appearance), merged.
    let mut ids: Vec<Box<str>> = Vec::new();
    let mut per_id: HashMap<Box<str>, Vec<ZRec>> = HashMap::new();
    for r in zs {
        match per_id.get_mut(&r.id) {
            Some(v) => v.push(r),
            None => {
                ids.push(r.id.clone());
                per_id.insert(r.id.clone(), vec![r]);
            }
        }
    }
    let mut copies = 0;
    // (record, new id, parent override)
    let mut recs: Vec<(ZRec, Option<String>, Option<String>)> = Vec::new();
    // Where children naming an id go: the server halves, with endpoints.
    let mut halves_of: HashMap<Box<str>, Vec<(String, Option<Ep>)>> = HashMap::new();
    for id in &ids {
        let (merged, c) = merge_id(per_id.remove(id).unwrap_or_default());
        copies += c;
        if merged.len() == 1 {
            recs.extend(merged.into_iter().map(|r| (r, None, None)));
            continue;
        }
        let is_half = |r: &ZRec| r.shared || r.is_server();
        let owner = merged
            .iter()
            .position(|r| !r.shared && r.is_client())
            .or_else(|| merged.iter().position(|r| !is_half(r)));
        let mut k = 0;
        let mut halves = Vec::new();
        for (i, r) in merged.into_iter().enumerate() {
            if Some(i) == owner || !is_half(&r) {
                recs.push((r, None, None));
                continue;
            }
            if owner.is_none() && k == 0 {
                // No client: the first server half keeps the id.
                k += 1;
                recs.push((r, None, None));
                continue;
            }
            let new = format!("{id}#s{k}");
            k += 1;
            if owner.is_some() {
                halves.push((new.clone(), r.local.clone()));
            }
            let parent = owner.map(|_| id.to_string());
            recs.push((r, Some(new), parent));
        }
        if !halves.is_empty() {
            halves_of.insert(id.clone(), halves);
        }
    }
    let mut raw = Vec::with_capacity(recs.len());
    for (s, new_id, parent_override) in &recs {
        let local = s.local.as_ref();
        let service = local
            .and_then(|l| l.service.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or("unknown");
        let clock = match local.and_then(|l| l.ipv4.as_deref().or(l.ipv6.as_deref())) {
            Some(ip) => names.get_joined("ip:", ip, ""),
            None => names.get_joined("service:", service, ""),
        };
        let parent = match parent_override {
            Some(p) => Some(p.clone()),
            None => s.parent_id.as_deref().map(|p| match halves_of.get(p) {
                // The server half on this span's own endpoint, else the
                // first one.
                Some(h) => h
                    .iter()
                    .find(|(_, ep)| ep.is_some() && ep.as_ref() == local)
                    .unwrap_or(&h[0])
                    .0
                    .clone(),
                None => p.to_string(),
            }),
        };
        let id: &str = new_id.as_deref().unwrap_or(&s.id);
        let (start_ns, duration_ns) = span_times(
            id,
            s.timestamp.map(|t| ("timestamp", t.0)),
            s.duration.map(|d| ("duration", d.0)),
            TimeUnit::Micros,
        )
        .map_err(|r| TraceError::new(tid, r))?;
        raw.push(RawSpan {
            id: Cow::Owned(id.to_string()),
            parent_id: parent.map(Into::into),
            service: names.get(service),
            operation: match &s.name {
                Some(n) => n.clone(),
                None => names.get(""),
            },
            start_ns,
            duration_ns,
            kind: s.kind.unwrap_or(SpanKind::Unspecified),
            clock,
            error: s.error,
            follows_from: false,
        });
    }
    let mut t = build(tid, raw, opts)?;
    t.duplicates_dropped += copies;
    Ok(t)
}

/// The string value after `key` in a JSON text, found textually.
pub(crate) fn guess(text: &str, key: &str) -> Option<String> {
    let i = text.find(key)?;
    let rest = &text[i + key.len()..];
    let rest = rest
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    let end = rest.find('"')?;
    Some(rest[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_ids_become_client_and_server_halves() {
        let doc = r#"[
          {"traceId":"t","id":"r","kind":"SERVER","name":"get","timestamp":0,"duration":100,"localEndpoint":{"serviceName":"a","ipv4":"1.1.1.1"}},
          {"traceId":"t","parentId":"r","id":"x","kind":"CLIENT","name":"post","timestamp":10,"duration":80,"localEndpoint":{"serviceName":"a","ipv4":"1.1.1.1"}},
          {"traceId":"t","parentId":"r","id":"x","kind":"SERVER","name":"post","timestamp":20,"duration":60,"localEndpoint":{"serviceName":"b","ipv4":"2.2.2.2"},"shared":true},
          {"traceId":"t","parentId":"x","id":"y","name":"work","timestamp":30,"localEndpoint":{"serviceName":"b","ipv4":"2.2.2.2"}}
        ]"#;
        let (traces, errs) = read(doc, BuildOptions::default());
        assert!(errs.is_empty());
        let t = traces.into_iter().next().unwrap().unwrap();
        let by = |id: &str| t.spans.iter().position(|s| &*s.span_id == id).unwrap();
        let srv = by("x#s0");
        assert_eq!(t.spans[srv].parent, Some(by("x") as u32));
        assert_eq!(t.spans[by("y")].parent, Some(srv as u32));
        assert_eq!(t.spans[by("y")].duration_ns, 0);
        assert_ne!(t.spans[srv].clock, t.spans[by("x")].clock);
    }

    #[test]
    fn a_span_with_a_wrong_type_rejects_only_its_trace() {
        let doc = r#"[
          {"traceId":"t1","id":"a","name":"x","timestamp":0,"duration":5},
          {"traceId":"t2","id":"b","name":"x","timestamp":"soon","duration":5}
        ]"#;
        let (traces, errs) = read(doc, BuildOptions::default());
        assert!(errs.is_empty());
        assert!(traces[0].is_ok());
        let e = traces[1].as_ref().unwrap_err();
        assert_eq!(e.trace_id, "t2");
    }
}
