//! A neutral span model that every reader (Jaeger, Zipkin, OTLP) produces,
//! and the validation that turns a reader's raw spans into a [`Trace`].
//!
//! Readers know their format's quirks (Zipkin's shared client/server ids,
//! Jaeger's `processes` table, OTLP's resources); this module knows what a
//! usable trace is: unique span ids, parents that exist, no cycles,
//! non-negative durations. A trace that breaks one of those rules is
//! rejected whole with a [`TraceError`] naming the span, so the caller can
//! count it, report it and go on with the next trace.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::fmt;
use std::sync::Arc;

use rustc_hash::FxHashMap;

mod late;

/// What role a span plays in an RPC (OpenTelemetry / Zipkin `kind`, Jaeger
/// `span.kind` tag).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SpanKind {
    /// Not recorded.
    #[default]
    Unspecified,
    /// In-process work.
    Internal,
    /// The caller's side of an RPC.
    Client,
    /// The callee's side of an RPC.
    Server,
    /// A message sent to a queue.
    Producer,
    /// A message taken from a queue.
    Consumer,
}

impl SpanKind {
    /// Parse the names the formats use (`"server"`, `"SERVER"`,
    /// `"SPAN_KIND_SERVER"`), case-insensitively; unknown names are
    /// [`SpanKind::Unspecified`].
    pub fn parse_lossy(s: &str) -> SpanKind {
        let s = s.strip_prefix("SPAN_KIND_").unwrap_or(s);
        if s.eq_ignore_ascii_case("server") {
            SpanKind::Server
        } else if s.eq_ignore_ascii_case("client") {
            SpanKind::Client
        } else if s.eq_ignore_ascii_case("producer") {
            SpanKind::Producer
        } else if s.eq_ignore_ascii_case("consumer") {
            SpanKind::Consumer
        } else if s.eq_ignore_ascii_case("internal") {
            SpanKind::Internal
        } else {
            SpanKind::Unspecified
        }
    }
}

/// One span of a validated [`Trace`]. Times are nanoseconds since the Unix
/// epoch as the span's own host recorded them (before any clock-skew repair).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// The span id as the file spelled it.
    pub span_id: Box<str>,
    /// Index of the parent span in [`Trace::spans`], `None` for a root.
    pub parent: Option<u32>,
    /// The service (Jaeger process `serviceName`, Zipkin
    /// `localEndpoint.serviceName`, OTLP `service.name`).
    pub service: Arc<str>,
    /// The operation (span name).
    pub operation: Arc<str>,
    /// Start, ns since the Unix epoch, on the span's own clock.
    pub start_ns: i64,
    /// Duration in ns (never negative).
    pub duration_ns: i64,
    /// RPC role.
    pub kind: SpanKind,
    /// The clock domain (host) the times come from: an index into the
    /// trace's own numbering. Two spans with equal `clock` share a clock, so
    /// no skew can exist between them.
    pub clock: u32,
    /// The span is marked as failed (error tag, HTTP ≥ 400, gRPC status).
    pub error: bool,
    /// The parent does not wait for this span: it follows from the parent
    /// (Jaeger `FOLLOWS_FROM`), consumes a message the parent produced
    /// (a `Consumer` span under a `Producer`), or starts once the parent
    /// has ended on a clock that agrees with the parent's (an asynchronous
    /// task; see the `skew` module docs). It and its subtree are never
    /// on the parent's critical path, and clock-skew repair does not hold
    /// them inside the parent (a consumer may run long after the producer
    /// ended). See [`Span::is_detached`] and the `traces` module docs.
    pub detached: bool,
}

impl Span {
    /// True when the parent does not wait for this span (see
    /// [`Span::detached`]).
    pub fn is_detached(&self) -> bool {
        self.detached
    }

    /// End, ns since the Unix epoch.
    pub fn end_ns(&self) -> i64 {
        self.start_ns.saturating_add(self.duration_ns)
    }
}

/// A validated trace: spans with resolved parents, in an order where every
/// parent comes before its children.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// The trace id as the file spelled it.
    pub trace_id: Box<str>,
    /// The spans, parents before children.
    pub spans: Vec<Span>,
    /// Children of span `i` are `children[child_start[i]..child_start[i + 1]]`.
    child_start: Vec<u32>,
    children: Vec<u32>,
    /// Spans whose parent is missing and that were kept as roots
    /// (see [`BuildOptions::orphans_as_roots`]).
    pub orphans: usize,
    /// Exact duplicate span records that were dropped.
    pub duplicates_dropped: usize,
    /// Span records that shared an id with a differing record and were
    /// kept under `ID~dupK` (see [`build`]).
    pub duplicates_renamed: usize,
    /// Labels of root spans, by span id: the attribute values an importer
    /// was asked to carry onto their records (OTLP's `--otlp-label`).
    /// Empty unless the reader set them after [`build`].
    pub root_labels: Vec<RootLabels>,
}

impl Trace {
    /// The children of span `i`, in file order.
    pub fn children(&self, i: u32) -> &[u32] {
        let i = i as usize;
        &self.children[self.child_start[i] as usize..self.child_start[i + 1] as usize]
    }

    /// Indices of the root spans (no parent).
    pub fn roots(&self) -> impl Iterator<Item = u32> + '_ {
        self.spans
            .iter()
            .enumerate()
            .filter(|(_, s)| s.parent.is_none())
            .map(|(i, _)| i as u32)
    }

    /// Depth of every span (roots are 1), iteratively.
    pub fn depths(&self) -> Vec<u32> {
        // Parents come before children, so one forward pass suffices.
        let mut depth = vec![1u32; self.spans.len()];
        for (i, s) in self.spans.iter().enumerate() {
            if let Some(p) = s.parent {
                depth[i] = depth[p as usize] + 1;
            }
        }
        depth
    }
}

/// A span as a reader found it, before validation. Ids may borrow from
/// the document being read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSpan<'a> {
    /// The span id (unique within the trace after the reader's own
    /// disambiguation, e.g. Zipkin's shared client/server ids).
    pub id: Cow<'a, str>,
    /// The parent's id, if any.
    pub parent_id: Option<Cow<'a, str>>,
    /// Service name.
    pub service: Arc<str>,
    /// Operation name.
    pub operation: Arc<str>,
    /// Start, ns since the Unix epoch; `None` when the record has no
    /// timestamp (Zipkin late parts).
    pub start_ns: Option<i64>,
    /// Duration in ns; `None` when the record has none (Zipkin).
    pub duration_ns: Option<i64>,
    /// RPC role.
    pub kind: SpanKind,
    /// Clock domain key (host name, IP, or process id).
    pub clock: Arc<str>,
    /// Marked as failed.
    pub error: bool,
    /// The reader found the parent relation to be "follows from" rather
    /// than "child of" (Jaeger's `FOLLOWS_FROM` reference): the parent does
    /// not wait for this span. [`build`] also detaches a `Consumer` span
    /// whose parent is a `Producer`, whatever the reader says.
    pub follows_from: bool,
}

/// A root span's id and the `(key, value)` labels its record carries
/// ([`Trace::root_labels`]).
pub type RootLabels = (Box<str>, Vec<(String, String)>);

/// Validation choices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildOptions {
    /// Keep spans whose parent is not in the trace as extra roots instead of
    /// rejecting the trace (the Jaeger UI's behaviour). Off by default: a
    /// missing parent usually means lost spans and a wrong critical path.
    pub orphans_as_roots: bool,
}

/// Why a trace was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("trace {trace_id}: {reason}")]
pub struct TraceError {
    /// The trace id, or a placeholder naming the file position when the
    /// trace could not be read far enough to know it.
    pub trace_id: String,
    /// What was wrong.
    pub reason: Reason,
}

/// What was wrong with a rejected trace.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Reason {
    /// The JSON could not be read (truncated, wrong types).
    #[error("unreadable JSON: {0}")]
    Json(String),
    /// The trace has no spans.
    #[error("no spans")]
    Empty,
    /// A span names a parent the trace does not contain.
    #[error("span {span} references missing parent {parent}")]
    MissingParent {
        /// The span.
        span: String,
        /// The parent id it names.
        parent: String,
    },
    /// Following parent references from a span comes back to it.
    #[error("span {span} is in a cycle of parent references")]
    Cycle {
        /// A span on the cycle.
        span: String,
    },
    /// Two different spans share an id.
    #[error("duplicate span id {span} (records differ)")]
    DuplicateSpanId {
        /// The id.
        span: String,
    },
    /// A span's duration is negative.
    #[error("span {span} has a negative duration ({duration_ns} ns)")]
    NegativeDuration {
        /// The span.
        span: String,
        /// The duration found.
        duration_ns: i64,
    },
    /// A span has no timestamp and nothing to place it by.
    #[error("span {span} has no timestamp")]
    MissingTimestamp {
        /// The span.
        span: String,
    },
    /// A span's time does not fit the range cpt works in: nanoseconds since
    /// the Unix epoch from 1970 to [`MAX_TIME_NS`] (year 2116). Such a time
    /// is almost always a unit mistake (nanoseconds in a format's
    /// microsecond fields); it is refused, never clamped.
    #[error(
        "span {span}: {field} = {value} {unit} is out of range (times must lie between 1970 \
         and 2116 in ns since the Unix epoch); {}",
        unit_hint(unit)
    )]
    TimeOutOfRange {
        /// The span.
        span: String,
        /// The field (or sum of fields) as the format names it.
        field: String,
        /// Its value as written, in the format's unit.
        value: i128,
        /// The format's unit for the field (`µs`, `ns`).
        unit: &'static str,
    },
    /// The input is not in a form this reader takes (e.g. Zipkin v1 JSON
    /// given as Zipkin v2); the message says what it is and what to do.
    #[error("{0}")]
    Unsupported(String),
}

/// The likely cause of an out-of-range time given in `unit`.
fn unit_hint(unit: &str) -> &'static str {
    if unit == "µs" {
        "most likely a unit mistake: the file holds nanoseconds (or other units) where the \
         format expects microseconds; convert the times to µs"
    } else {
        "most likely a unit mistake: the format expects nanoseconds since the Unix epoch"
    }
}

/// The latest time accepted, ns since the Unix epoch (2^62 ns, year 2116).
/// Times are refused outside `0..=MAX_TIME_NS`, which keeps every sum and
/// difference of two times (clock offsets, shifted spans) inside `i64`.
pub const MAX_TIME_NS: i64 = 1 << 62;

/// The unit a format writes span times in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimeUnit {
    /// Microseconds (Jaeger, Zipkin).
    Micros,
    /// Nanoseconds (OTLP, Nezha CSV).
    Nanos,
}

impl TimeUnit {
    fn scale(self) -> i128 {
        match self {
            TimeUnit::Micros => 1000,
            TimeUnit::Nanos => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            TimeUnit::Micros => "µs",
            TimeUnit::Nanos => "ns",
        }
    }
}

/// A time field as a file wrote it: any JSON integer (negative, up to
/// `u64`, or larger, which JSON readers see as a float), or a decimal
/// string (protobuf JSON writes 64-bit integers so), kept wide enough that
/// a value outside cpt's range is reported as out of range with its value
/// ([`Reason::TimeOutOfRange`]) rather than as unreadable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Wide(pub i128);

impl<'de> serde::Deserialize<'de> for Wide {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{Error, Visitor};
        struct V;
        impl Visitor<'_> for V {
            type Value = Wide;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer or a decimal string")
            }
            fn visit_i64<E: Error>(self, v: i64) -> Result<Wide, E> {
                Ok(Wide(i128::from(v)))
            }
            fn visit_u64<E: Error>(self, v: u64) -> Result<Wide, E> {
                Ok(Wide(i128::from(v)))
            }
            fn visit_f64<E: Error>(self, v: f64) -> Result<Wide, E> {
                // Integers beyond u64 arrive as floats: out of range anyway,
                // reported with their (saturated) value.
                if v.is_finite() && v.fract() == 0.0 {
                    Ok(Wide(v as i128))
                } else {
                    Err(E::custom(format!("not an integer: {v}")))
                }
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<Wide, E> {
                v.trim()
                    .parse::<i128>()
                    .map(Wide)
                    .map_err(|_| E::custom(format!("not an integer: {v:?}")))
            }
        }
        d.deserialize_any(V)
    }
}

/// A span's start and duration as a format wrote them (in `unit`), in ns,
/// refused when the start or the end falls outside `0..=MAX_TIME_NS` or the
/// duration overflows. `start` and `duration` are `(field name, value)`.
/// A negative duration is passed through for [`build`] to reject.
///
/// # Errors
///
/// [`Reason::TimeOutOfRange`] naming the span, the field and the value.
pub(crate) fn span_times(
    span: &str,
    start: Option<(&str, i128)>,
    duration: Option<(&str, i128)>,
    unit: TimeUnit,
) -> Result<(Option<i64>, Option<i64>), Reason> {
    let out = |field: &str, value: i128| Reason::TimeOutOfRange {
        span: span.to_string(),
        field: field.to_string(),
        value,
        unit: unit.name(),
    };
    let ns = |v: i128| v.saturating_mul(unit.scale());
    let start_ns = match start {
        Some((f, v)) => {
            let t = ns(v);
            if !(0..=i128::from(MAX_TIME_NS)).contains(&t) {
                return Err(out(f, v));
            }
            Some(t as i64)
        }
        None => None,
    };
    let dur_ns = match duration {
        Some((f, v)) => {
            let d = ns(v);
            if d.abs() > i128::from(MAX_TIME_NS) {
                return Err(out(f, v));
            }
            Some(d as i64)
        }
        None => None,
    };
    if let (Some((fs, s)), Some((fd, d)), Some(sn), Some(dn)) = (start, duration, start_ns, dur_ns)
        && i128::from(sn) + i128::from(dn) > i128::from(MAX_TIME_NS)
    {
        return Err(out(&format!("{fs} + {fd}"), s.saturating_add(d)));
    }
    Ok((start_ns, dur_ns))
}

/// A span's start and end, both as a format wrote them (in `unit`), as
/// (start, duration) in ns; see [`span_times`].
///
/// # Errors
///
/// [`Reason::TimeOutOfRange`] naming the span, the field and the value.
pub(crate) fn span_start_end(
    span: &str,
    start: (&str, i128),
    end: (&str, i128),
    unit: TimeUnit,
) -> Result<(i64, i64), Reason> {
    let (Some(s), _) = span_times(span, Some(start), None, unit)? else {
        unreachable!("a start was given")
    };
    let (Some(e), _) = span_times(span, Some(end), None, unit)? else {
        unreachable!("an end was given")
    };
    Ok((s, e - s))
}

impl TraceError {
    /// An error for a trace.
    pub fn new(trace_id: impl Into<String>, reason: Reason) -> Self {
        TraceError {
            trace_id: trace_id.into(),
            reason,
        }
    }
}

/// Validate raw spans into a [`Trace`].
///
/// - exact duplicates (same id and same fields) are dropped and counted;
///   a record that differs from every earlier one with its id is kept as
///   another span, its id suffixed `~dup1`, `~dup2`, … (as Jaeger UI shows
///   both), and counted, and its exact copies are dropped as its
///   duplicates; references to the id go to the first;
/// - a parent id that is absent rejects the trace (or makes the span a root,
///   see [`BuildOptions`]);
/// - a span without a timestamp is placed over its timed children, or, when
///   it has none, as a zero-length span at its parent's start;
///   a missing duration is zero (Zipkin);
/// - cycles and negative durations reject the trace.
///
/// # Errors
///
/// The first problem found, naming the span.
pub fn build(
    trace_id: &str,
    raw: Vec<RawSpan<'_>>,
    opts: BuildOptions,
) -> Result<Trace, TraceError> {
    let err = |reason| TraceError::new(trace_id, reason);
    if raw.is_empty() {
        return Err(err(Reason::Empty));
    }
    let mut raw = raw;
    let n = raw.len();
    // Ids → index of their first record, in one pass over the spans. A
    // repeated id is rare; only then is more looked at: an exact duplicate
    // is dropped and counted, and a record that differs from every earlier
    // one with its id (Jaeger's own fixtures have them; Jaeger UI shows
    // both) is kept under `ID~dupK`, references to the id resolving to the
    // first.
    let mut keep = vec![true; n];
    let mut duplicates_dropped = 0;
    let mut index: FxHashMap<&str, u32> =
        FxHashMap::with_capacity_and_hasher(n, Default::default());
    let mut duplicates_renamed = 0;
    let rename = {
        // Id → every record with it so far, for the ids seen more than once,
        // each with the K of the name it is kept under (0: the id itself).
        let mut repeated: FxHashMap<&str, Vec<(usize, usize)>> = FxHashMap::default();
        let mut rename: Vec<(usize, String)> = Vec::new();
        for (i, s) in raw.iter().enumerate() {
            let first = match index.entry(&*s.id) {
                Entry::Vacant(v) => {
                    v.insert(i as u32);
                    continue;
                }
                Entry::Occupied(o) => *o.get() as usize,
            };
            let same = repeated.entry(&*s.id).or_insert_with(|| vec![(first, 0)]);
            // An exact copy goes under the name of the record it copies, so
            // that it is dropped as that record's duplicate below; a new
            // variant is named after the records with its id before it.
            let k = match same.iter().find(|&&(j, _)| raw[j] == *s) {
                Some(&(_, k)) => k,
                None => {
                    duplicates_renamed += 1;
                    same.len()
                }
            };
            if k > 0 {
                rename.push((i, format!("{}~dup{k}", s.id)));
            }
            same.push((i, k));
            // Without renames every repeat equals the first record.
            keep[i] = false;
            duplicates_dropped += 1;
        }
        rename
    };
    if !rename.is_empty() {
        // Renamed ids may meet other ids: index the records again as they
        // now are.
        drop(index);
        for (i, id) in rename {
            raw[i].id = Cow::Owned(id);
        }
        index = FxHashMap::with_capacity_and_hasher(n, Default::default());
        keep.fill(true);
        duplicates_dropped = 0;
        for (i, s) in raw.iter().enumerate() {
            match index.get(&*s.id) {
                Some(&j) => {
                    if raw[j as usize] == *s {
                        keep[i] = false;
                        duplicates_dropped += 1;
                    } else {
                        return Err(err(Reason::DuplicateSpanId {
                            span: s.id.to_string(),
                        }));
                    }
                }
                None => {
                    index.insert(&s.id, i as u32);
                }
            }
        }
    }
    for (i, s) in raw.iter().enumerate() {
        if let Some(d) = s.duration_ns
            && d < 0
            && keep[i]
        {
            return Err(err(Reason::NegativeDuration {
                span: s.id.to_string(),
                duration_ns: d,
            }));
        }
    }
    // Resolve parents (indices into `raw`).
    let mut parent: Vec<Option<u32>> = vec![None; n];
    let mut orphans = 0;
    for (i, s) in raw.iter().enumerate() {
        if !keep[i] {
            continue;
        }
        if let Some(p) = &s.parent_id {
            match index.get(&**p) {
                Some(&j) => parent[i] = Some(j),
                None if opts.orphans_as_roots => orphans += 1,
                None => {
                    return Err(err(Reason::MissingParent {
                        span: s.id.to_string(),
                        parent: p.to_string(),
                    }));
                }
            }
        }
    }
    drop(index);
    // Children their parent does not wait for (see `Span::detached`): a
    // FOLLOWS_FROM child, a consumer under its producer, and a consumer that
    // starts once its parent has ended (whatever the parent's kind: no span
    // waits for work that begins after it returned).
    let detached: Vec<bool> = (0..n)
        .map(|i| {
            raw[i].follows_from
                || (raw[i].kind == SpanKind::Consumer
                    && parent[i].is_some_and(|p| {
                        let p = &raw[p as usize];
                        p.kind == SpanKind::Producer
                            || matches!(
                                (raw[i].start_ns, p.start_ns, p.duration_ns),
                                (Some(s), Some(ps), Some(pd)) if s >= ps.saturating_add(pd)
                            )
                    }))
        })
        .collect();
    // Cycle check and a parents-first order (iterative; a node's parent chain
    // is walked once overall thanks to the `state` marks).
    const NEW: u8 = 0;
    const ON_WALK: u8 = 1;
    const DONE: u8 = 2;
    let mut state = vec![NEW; n];
    let mut order: Vec<u32> = Vec::with_capacity(n);
    let mut walk: Vec<u32> = Vec::new();
    for start in 0..n {
        if !keep[start] || state[start] != NEW {
            continue;
        }
        walk.clear();
        let mut cur = start as u32;
        loop {
            match state[cur as usize] {
                DONE => break,
                ON_WALK => {
                    return Err(err(Reason::Cycle {
                        span: raw[cur as usize].id.to_string(),
                    }));
                }
                _ => {}
            }
            state[cur as usize] = ON_WALK;
            walk.push(cur);
            match parent[cur as usize] {
                Some(p) => cur = p,
                None => break,
            }
        }
        for &w in walk.iter().rev() {
            state[w as usize] = DONE;
            order.push(w);
        }
    }
    // Renumber in `order`.
    let mut new_of = vec![u32::MAX; n];
    for (k, &i) in order.iter().enumerate() {
        new_of[i as usize] = k as u32;
    }
    // Place untimed spans: over their timed descendants (children come after
    // parents, so walk `order` backwards), else at the parent's start.
    let mut lo: Vec<Option<i64>> = vec![None; n];
    let mut hi: Vec<Option<i64>> = vec![None; n];
    for &i in order.iter().rev() {
        let s = &raw[i as usize];
        let (l, h) = match s.start_ns {
            Some(st) => (
                Some(st),
                Some(st.saturating_add(s.duration_ns.unwrap_or(0))),
            ),
            None => (lo[i as usize], hi[i as usize]),
        };
        // An untimed parent is placed over the children it waited for, not
        // over what runs after it (a detached consumer).
        if let Some(p) = parent[i as usize].filter(|_| !detached[i as usize]) {
            let p = p as usize;
            if let (Some(l), Some(h)) = (l, h) {
                lo[p] = Some(lo[p].map_or(l, |x| x.min(l)));
                hi[p] = Some(hi[p].map_or(h, |x| x.max(h)));
            }
        }
        lo[i as usize] = l;
        hi[i as usize] = h;
    }
    let mut spans: Vec<Span> = Vec::with_capacity(order.len());
    // Few clock domains per trace: a short list compared by pointer first.
    let mut clocks: Vec<Arc<str>> = Vec::new();
    for &i in &order {
        let i = i as usize;
        let p = parent[i].map(|p| new_of[p as usize]);
        let (start_ns, duration_ns) = match (raw[i].start_ns, lo[i], hi[i]) {
            (Some(st), _, _) => (st, raw[i].duration_ns.unwrap_or(0)),
            (None, Some(l), Some(h)) => (l, h - l),
            (None, _, _) => match p {
                Some(p) => (spans[p as usize].start_ns, 0),
                None => {
                    return Err(err(Reason::MissingTimestamp {
                        span: raw[i].id.to_string(),
                    }));
                }
            },
        };
        if !(0..=MAX_TIME_NS).contains(&start_ns) || duration_ns > MAX_TIME_NS - start_ns {
            let (field, value) = if (0..=MAX_TIME_NS).contains(&start_ns) {
                ("end", i128::from(start_ns) + i128::from(duration_ns))
            } else {
                ("start", i128::from(start_ns))
            };
            return Err(err(Reason::TimeOutOfRange {
                span: raw[i].id.to_string(),
                field: field.to_string(),
                value,
                unit: "ns",
            }));
        }
        let c = &raw[i].clock;
        let clock = match clocks.iter().position(|k| Arc::ptr_eq(k, c) || **k == **c) {
            Some(k) => k as u32,
            None => {
                clocks.push(c.clone());
                (clocks.len() - 1) as u32
            }
        };
        let r = &raw[i];
        spans.push(Span {
            span_id: Box::from(&*r.id),
            parent: p,
            service: r.service.clone(),
            operation: r.operation.clone(),
            start_ns,
            duration_ns,
            kind: r.kind,
            clock,
            error: r.error,
            detached: p.is_some() && detached[i],
        });
    }
    // Children in CSR form, in file order within each parent.
    let m = spans.len();
    let mut count = vec![0u32; m + 1];
    for s in &spans {
        if let Some(p) = s.parent {
            count[p as usize + 1] += 1;
        }
    }
    for k in 0..m {
        count[k + 1] += count[k];
    }
    let child_start = count.clone();
    let mut fill = count;
    let mut children = vec![0u32; child_start[m] as usize];
    // File order: iterate the original indices.
    for (i, k) in keep.iter().enumerate() {
        if !k {
            continue;
        }
        let me = new_of[i];
        if let Some(p) = spans[me as usize].parent {
            children[fill[p as usize] as usize] = me;
            fill[p as usize] += 1;
        }
    }
    let mut trace = Trace {
        trace_id: trace_id.into(),
        spans,
        child_start,
        children,
        orphans,
        duplicates_dropped,
        duplicates_renamed,
        root_labels: Vec::new(),
    };
    late::detach_late_children(&mut trace);
    Ok(trace)
}

impl fmt::Display for SpanKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpanKind::Unspecified => "unspecified",
            SpanKind::Internal => "internal",
            SpanKind::Client => "client",
            SpanKind::Server => "server",
            SpanKind::Producer => "producer",
            SpanKind::Consumer => "consumer",
        })
    }
}

/// Interns service / operation / clock names so that a file's many spans
/// share one allocation per distinct string.
#[derive(Debug, Default)]
pub struct Interner {
    map: FxHashMap<Box<str>, Arc<str>>,
    buf: String,
}

impl Interner {
    /// The shared copy of `s`.
    pub fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.map.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.map.insert(s.into(), a.clone());
        a
    }

    /// The shared copy of `a + b + c`, without allocating when known.
    pub fn get_joined(&mut self, a: &str, b: &str, c: &str) -> Arc<str> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.push_str(a);
        buf.push_str(b);
        buf.push_str(c);
        let out = self.get(&buf);
        self.buf = buf;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw<'a>(
        id: &'a str,
        parent: Option<&'a str>,
        start: Option<i64>,
        dur: Option<i64>,
    ) -> RawSpan<'a> {
        RawSpan {
            id: id.into(),
            parent_id: parent.map(Into::into),
            service: Arc::from("s"),
            operation: Arc::from(id),
            start_ns: start,
            duration_ns: dur,
            kind: SpanKind::Unspecified,
            clock: Arc::from("h"),
            error: false,
            follows_from: false,
        }
    }

    #[test]
    fn parents_come_first_and_children_keep_file_order() {
        let t = build(
            "t",
            vec![
                raw("c2", Some("b"), Some(5), Some(1)),
                raw("b", Some("a"), Some(1), Some(8)),
                raw("a", None, Some(0), Some(10)),
                raw("c1", Some("b"), Some(2), Some(1)),
            ],
            BuildOptions::default(),
        )
        .unwrap();
        for (i, s) in t.spans.iter().enumerate() {
            if let Some(p) = s.parent {
                assert!((p as usize) < i);
            }
        }
        let b = t.spans.iter().position(|s| &*s.span_id == "b").unwrap() as u32;
        let names: Vec<_> = t
            .children(b)
            .iter()
            .map(|&c| &*t.spans[c as usize].span_id)
            .collect();
        assert_eq!(names, ["c2", "c1"]);
        assert_eq!(t.roots().count(), 1);
    }

    #[rustfmt::skip]
    const BAD: &[(&str, &str)] = &[
        ("missing", "references missing parent zz"),
        ("cycle", "cycle of parent references"),
        ("negative", "negative duration"),
    ];

    #[test]
    fn malformed_traces_are_rejected_with_a_reason() {
        for (case, want) in BAD {
            let spans = match *case {
                "missing" => vec![
                    raw("a", None, Some(0), Some(1)),
                    raw("b", Some("zz"), Some(0), Some(1)),
                ],
                "cycle" => vec![
                    raw("a", None, Some(0), Some(9)),
                    raw("b", Some("c"), Some(0), Some(1)),
                    raw("c", Some("b"), Some(0), Some(1)),
                ],
                _ => vec![raw("a", None, Some(0), Some(-1))],
            };
            let e = build("t1", spans, BuildOptions::default())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(want) && e.starts_with("trace t1:"),
                "{case}: {e}"
            );
        }
    }

    #[test]
    fn exact_duplicates_are_dropped_and_orphans_can_be_roots() {
        let t = build(
            "t",
            vec![
                raw("a", None, Some(0), Some(9)),
                raw("a", None, Some(0), Some(9)),
                raw("o", Some("x"), Some(1), Some(1)),
            ],
            BuildOptions {
                orphans_as_roots: true,
            },
        )
        .unwrap();
        assert_eq!(
            (
                t.spans.len(),
                t.duplicates_dropped,
                t.orphans,
                t.roots().count()
            ),
            (2, 1, 1, 2)
        );
    }

    #[test]
    fn repeated_ids_exact_copies_dropped_differing_records_kept_as_dup_k() {
        // b twice identically, then a differing b: the copy is dropped, the
        // differing record becomes b~dup2 (the records with id b before
        // it), and c, naming b, hangs under the first b.
        let t = build(
            "t",
            vec![
                raw("a", None, Some(0), Some(100)),
                raw("b", Some("a"), Some(10), Some(20)),
                raw("b", Some("a"), Some(10), Some(20)),
                raw("b", Some("a"), Some(40), Some(5)),
                raw("c", Some("b"), Some(12), Some(3)),
            ],
            BuildOptions::default(),
        )
        .unwrap();
        let ids: Vec<&str> = t.spans.iter().map(|s| &*s.span_id).collect();
        assert_eq!(ids.len(), 4, "{ids:?}");
        assert_eq!((t.duplicates_dropped, t.duplicates_renamed), (1, 1));
        let get = |id: &str| t.spans.iter().position(|s| &*s.span_id == id).unwrap();
        let (b, dup) = (get("b"), get("b~dup2"));
        assert_eq!(t.spans[b].start_ns, 10);
        assert_eq!(t.spans[dup].start_ns, 40);
        assert_eq!(t.spans[get("c")].parent, Some(b as u32));
        assert_eq!(t.spans[dup].parent, Some(get("a") as u32));
    }

    #[test]
    fn an_exact_copy_of_a_record_kept_as_dup_k_is_dropped_as_its_duplicate() {
        // b, a differing b (kept as b~dup1), then an exact copy of that
        // second b, as a reporter that resends a span does: the copy is a
        // duplicate of b~dup1, not a third differing b.
        let t = build(
            "t",
            vec![
                raw("a", None, Some(0), Some(100)),
                raw("b", Some("a"), Some(10), Some(20)),
                raw("b", Some("a"), Some(40), Some(5)),
                raw("b", Some("a"), Some(40), Some(5)),
                raw("c", Some("b"), Some(12), Some(3)),
            ],
            BuildOptions::default(),
        )
        .unwrap();
        let ids: Vec<&str> = t.spans.iter().map(|s| &*s.span_id).collect();
        assert_eq!(ids, ["a", "b", "b~dup1", "c"]);
        assert_eq!((t.duplicates_dropped, t.duplicates_renamed), (1, 1));
        let get = |id: &str| t.spans.iter().position(|s| &*s.span_id == id).unwrap();
        assert_eq!(t.spans[get("b~dup1")].start_ns, 40);
        assert_eq!(t.spans[get("c")].parent, Some(get("b") as u32));
    }

    #[test]
    fn untimed_spans_cover_their_children_or_sit_at_the_parent_start() {
        let t = build(
            "t",
            vec![
                raw("a", None, Some(0), Some(100)),
                raw("u", Some("a"), None, None),
                raw("c", Some("u"), Some(10), Some(20)),
                raw("leaf", Some("a"), None, None),
            ],
            BuildOptions::default(),
        )
        .unwrap();
        let get = |id: &str| t.spans.iter().find(|s| &*s.span_id == id).unwrap();
        assert_eq!((get("u").start_ns, get("u").duration_ns), (10, 20));
        assert_eq!((get("leaf").start_ns, get("leaf").duration_ns), (0, 0));
    }
}
