//! [`Record`]: what the entry service emits when a traced request finishes,
//! and its JSON Lines form.
//!
//! # JSON Lines form
//!
//! One JSON object per line:
//!
//! ```json
//! {"service":"A","endpoint":"/a.A/Run","trigger":"sampled","latency_ns":35000000,
//!  "start_unix_nanos":1700000000000000000,"request_id":"9f2c…","trace_id":"4bf92f…",
//!  "labels":{"arm":"b"},
//!  "path":[{"stack":["A1"],"ns":5000000},
//!          {"stack":["A1",{"name":"B1","service":"B"}],"ns":20000000},
//!          {"stack":["A1"],"ns":8000000},
//!          {"stack":["A1","A2"],"ns":2000000,"kind":"unattributed"}],
//!  "accounting":{"network_ns":0,"overcount_ns":0,"blind_spot_ns":0,
//!                "unattributed_ns":2000000,"queueing_ns":0,"truncated_ns":0,
//!                "clock_skew_ns":0}}
//! ```
//!
//! - `service`, `trigger`, `latency_ns` and `path` are required; `endpoint`,
//!   `start_unix_nanos`, `request_id`, `trace_id`, `labels` and `accounting`
//!   may be absent.
//! - A stack entry is a frame. Written as a plain string it is the frame's
//!   name, and its service is the service of the entry before it (the
//!   record's `service` for the first entry). Written as an object it is
//!   `{"name", "service", "file", "line"}` (all but `name` optional, with the
//!   same inheritance for `service`). A frame written without `file` has the
//!   location of the nearest earlier frame of the record with the same
//!   service and name (none if there is none); `"file": ""` says "no
//!   location" explicitly. So a frame's location is written once per record,
//!   and writers use the string form whenever service and location add
//!   nothing.
//! - `kind` is absent for busy segments, else one of `queueing`,
//!   `unattributed`, `network`, `blind_spot` (see [`SegmentKind`]), or
//!   `wait`.
//! - A named wait ([`SegmentKind::Wait`]) is written
//!   `"kind":"unattributed","wait":true`: its last stack entry is the wait
//!   frame (`[sleep]`, `[semaphore]`, `[io]`, … with the place the resource
//!   was created). A reader that predates named waits ignores `wait` and
//!   reads an unattributed wait whose leaf names what was waited on.
//!   `"kind":"wait"` is read as well.
//! - `latency_ns` must equal the sum of the segments' `ns`.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::path::{Accounting, CriticalPath, Frame, FrameId, Location, SegmentKind};
use crate::trigger::Trigger;

/// User labels attached to a request (A/B arm, region, …), sorted by key.
pub type Labels = BTreeMap<String, String>;

/// One traced request, as the entry service emits it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The service that received the request.
    pub service: String,
    /// The endpoint (gRPC method, HTTP route), when known.
    pub endpoint: Option<String>,
    /// Why the request was traced.
    pub trigger: Trigger,
    /// End-to-end latency as the entry service saw it; equals `path.total()`.
    pub latency: Duration,
    /// Wall-clock start, nanoseconds since the Unix epoch, when known.
    pub start_unix_nanos: Option<u64>,
    /// This service's own id for the request, when it has one.
    pub request_id: Option<String>,
    /// The OpenTelemetry / W3C trace id (32 lowercase hex), when present.
    pub trace_id: Option<String>,
    /// User labels.
    pub labels: Labels,
    /// The critical path; its accounting is the record's accounting.
    pub path: CriticalPath,
}

impl Record {
    /// A record whose latency is the path's total.
    pub fn new(service: impl Into<String>, trigger: Trigger, path: CriticalPath) -> Self {
        Record {
            service: service.into(),
            endpoint: None,
            trigger,
            latency: path.total(),
            start_unix_nanos: None,
            request_id: None,
            trace_id: None,
            labels: Labels::new(),
            path,
        }
    }

    /// The record's accounting (the path's).
    pub fn accounting(&self) -> &Accounting {
        &self.path.accounting
    }

    /// Serialize as one JSON line (no trailing newline).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.to_wire()).expect("a record always serializes; this is a bug")
    }

    /// Parse one JSON line.
    ///
    /// # Errors
    ///
    /// If the text is not JSON, lacks a required field, names an unknown
    /// trigger or segment kind, or its segments do not sum to `latency_ns`.
    pub fn from_json(line: &str) -> Result<Record, RecordError> {
        let wire: wire::Record<'_> =
            serde_json::from_str(line).map_err(|e| RecordError::Json(e.to_string()))?;
        Record::from_wire(wire)
    }

    fn to_wire(&self) -> wire::Record<'_> {
        // The location each (service, name) was last written with: a frame
        // written without `file` takes it (see the module docs).
        let mut last: HashMap<(&str, &str), Option<&Location>> = HashMap::new();
        let path = self
            .path
            .segments()
            .iter()
            .map(|seg| {
                let mut parent_service: &str = &self.service;
                let stack = seg
                    .stack
                    .iter()
                    .map(|id| {
                        let f = self.path.frame(*id);
                        let key = (&*f.service, &*f.name);
                        let implied = last.get(&key).copied().unwrap_or(None);
                        let location_implied = implied == f.location.as_ref();
                        let entry = if &*f.service == parent_service && location_implied {
                            wire::Frame::Name(Cow::Borrowed(&*f.name))
                        } else {
                            let (file, line) = match (&f.location, location_implied) {
                                (_, true) => (None, None),
                                (Some(l), false) => (Some(Cow::Borrowed(&*l.file)), Some(l.line)),
                                // Says "no location" against an earlier located frame.
                                (None, false) => (Some("".into()), None),
                            };
                            wire::Frame::Full {
                                name: Cow::Borrowed(&*f.name),
                                service: (&*f.service != parent_service)
                                    .then(|| Cow::Borrowed(&*f.service)),
                                file,
                                line,
                            }
                        };
                        last.insert(key, f.location.as_ref());
                        parent_service = &f.service;
                        entry
                    })
                    .collect();
                // A named wait is written as unattributed with `"wait":
                // true` (see the module docs).
                let (kind, wait) = match seg.kind {
                    SegmentKind::Busy => (None, None),
                    SegmentKind::Wait => {
                        (Some(SegmentKind::Unattributed.as_str().into()), Some(true))
                    }
                    k => (Some(k.as_str().into()), None),
                };
                wire::Segment {
                    stack,
                    ns: duration_ns(seg.duration),
                    kind,
                    wait,
                }
            })
            .collect();
        let a = &self.path.accounting;
        wire::Record {
            service: self.service.as_str().into(),
            endpoint: self.endpoint.as_deref().map(Into::into),
            trigger: self.trigger.as_str().into(),
            latency_ns: duration_ns(self.latency),
            start_unix_nanos: self.start_unix_nanos,
            request_id: self.request_id.as_deref().map(Into::into),
            trace_id: self.trace_id.as_deref().map(Into::into),
            labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
            path,
            accounting: (!a.is_zero()).then_some(wire::Accounting(*a)),
        }
    }

    fn from_wire(w: wire::Record<'_>) -> Result<Record, RecordError> {
        let trigger = Trigger::parse(&w.trigger)
            .ok_or_else(|| RecordError::UnknownTrigger(w.trigger.to_string()))?;
        let mut path = CriticalPath::new();
        // The frame each (service, name) last stood for: a stack entry
        // without `file` is that frame (see the module docs). Keyed by the
        // input's strings, so a repeated frame costs a lookup, no allocation.
        let mut last: HashMap<(Cow<'_, str>, Cow<'_, str>), FrameId> = HashMap::new();
        let mut sum: u64 = 0;
        for (i, seg) in w.path.into_iter().enumerate() {
            if seg.stack.is_empty() {
                return Err(RecordError::EmptyStack { segment: i });
            }
            let mut kind = match &seg.kind {
                None => SegmentKind::Busy,
                Some(k) => SegmentKind::parse(k).ok_or_else(|| RecordError::UnknownKind {
                    segment: i,
                    kind: k.to_string(),
                })?,
            };
            match (seg.wait, kind) {
                (None | Some(false), _) => {}
                (Some(true), SegmentKind::Unattributed | SegmentKind::Wait) => {
                    kind = SegmentKind::Wait;
                }
                (Some(true), other) => {
                    return Err(RecordError::WaitKind {
                        segment: i,
                        kind: other.as_str(),
                    });
                }
            }
            let mut parent: Cow<'_, str> = w.service.clone();
            let mut ids = Vec::with_capacity(seg.stack.len());
            for f in seg.stack {
                let (name, service, file, line) = match f {
                    wire::Frame::Name(name) => (name, None, None, None),
                    wire::Frame::Full {
                        name,
                        service,
                        file,
                        line,
                    } => (name, service, file, line),
                };
                let key = (service.unwrap_or(parent), name);
                let id = match (file, last.get(&key)) {
                    (None, Some(id)) => *id,
                    (file, _) => {
                        let location = file.filter(|f| !f.is_empty()).map(|file| Location {
                            file: shared(&file),
                            line: line.unwrap_or(0),
                        });
                        let id = path.intern(Frame {
                            service: shared(&key.0),
                            name: shared(&key.1),
                            location,
                        });
                        last.insert(key.clone(), id);
                        id
                    }
                };
                ids.push(id);
                parent = key.0;
            }
            sum = sum
                .checked_add(seg.ns)
                .ok_or(RecordError::Overflow { segment: i })?;
            path.push(ids, Duration::from_nanos(seg.ns), kind);
        }
        if sum != w.latency_ns {
            return Err(RecordError::TotalMismatch {
                latency_ns: w.latency_ns,
                path_ns: sum,
            });
        }
        if let Some(a) = w.accounting {
            path.accounting = a.0;
        }
        Ok(Record {
            service: w.service.into_owned(),
            endpoint: w.endpoint.map(|s| s.into_owned()),
            trigger,
            latency: Duration::from_nanos(w.latency_ns),
            start_unix_nanos: w.start_unix_nanos,
            request_id: w.request_id.map(|s| s.into_owned()),
            trace_id: w.trace_id.map(|s| s.into_owned()),
            labels: w.labels.unwrap_or_default(),
            path,
        })
    }
}

/// Durations beyond `u64::MAX` nanoseconds (584 years) saturate.
fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Why a JSON line is not a [`Record`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// Not JSON, or a field has the wrong type or is missing.
    #[error("not a cpt record: {0}")]
    Json(String),
    /// `trigger` is neither `"sampled"` nor `"forced"`.
    #[error("unknown trigger {0:?} (expected \"sampled\" or \"forced\")")]
    UnknownTrigger(String),
    /// A segment's `kind` is not one cpt writes.
    #[error("segment {segment}: unknown kind {kind:?}")]
    UnknownKind {
        /// Index of the segment in `path`.
        segment: usize,
        /// The kind found.
        kind: String,
    },
    /// A segment says `"wait": true` but is not an unattributed wait.
    #[error(
        "segment {segment}: \"wait\": true on a {kind} segment (only unattributed waits name a resource)"
    )]
    WaitKind {
        /// Index of the segment in `path`.
        segment: usize,
        /// The segment's kind.
        kind: &'static str,
    },
    /// A segment has an empty `stack`.
    #[error("segment {segment}: empty stack")]
    EmptyStack {
        /// Index of the segment in `path`.
        segment: usize,
    },
    /// Segment durations overflow `u64` nanoseconds.
    #[error("segment {segment}: durations overflow u64 nanoseconds")]
    Overflow {
        /// Index of the segment in `path`.
        segment: usize,
    },
    /// The segments do not sum to the latency.
    #[error("path sums to {path_ns} ns but latency_ns is {latency_ns}")]
    TotalMismatch {
        /// The record's `latency_ns`.
        latency_ns: u64,
        /// The sum of its segments.
        path_ns: u64,
    },
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json())
    }
}

/// The serde shapes of the JSON Lines form, kept apart from the model.
mod wire {
    use std::borrow::Cow;
    use std::fmt;

    use std::time::Duration;

    use super::Labels;
    use crate::path::Cause;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    pub(super) struct Record<'a> {
        #[serde(borrow)]
        pub(super) service: Cow<'a, str>,
        #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
        pub(super) endpoint: Option<Cow<'a, str>>,
        #[serde(borrow)]
        pub(super) trigger: Cow<'a, str>,
        pub(super) latency_ns: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(super) start_unix_nanos: Option<u64>,
        #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
        pub(super) request_id: Option<Cow<'a, str>>,
        #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
        pub(super) trace_id: Option<Cow<'a, str>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(super) labels: Option<Labels>,
        #[serde(borrow)]
        pub(super) path: Vec<Segment<'a>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(super) accounting: Option<Accounting>,
    }

    #[derive(Serialize, Deserialize)]
    pub(super) struct Segment<'a> {
        #[serde(borrow)]
        pub(super) stack: Vec<Frame<'a>>,
        pub(super) ns: u64,
        #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
        pub(super) kind: Option<Cow<'a, str>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(super) wait: Option<bool>,
    }

    /// A stack entry: a bare name, or `{"name", "service", "file", "line"}`.
    ///
    /// Deserialized by hand: `#[serde(untagged)]` buffers every entry before
    /// trying the variants, which made parsing records several times slower.
    #[derive(Serialize)]
    #[serde(untagged)]
    pub(super) enum Frame<'a> {
        Name(Cow<'a, str>),
        Full {
            name: Cow<'a, str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            service: Option<Cow<'a, str>>,
            #[serde(skip_serializing_if = "Option::is_none")]
            file: Option<Cow<'a, str>>,
            #[serde(skip_serializing_if = "Option::is_none")]
            line: Option<u32>,
        },
    }

    /// A string borrowed from the input when it has no escapes.
    struct Str<'a>(Cow<'a, str>);

    impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_str(StrVisitor(std::marker::PhantomData))
        }
    }

    struct StrVisitor<'a>(std::marker::PhantomData<&'a ()>);

    impl<'de: 'a, 'a> serde::de::Visitor<'de> for StrVisitor<'a> {
        type Value = Str<'a>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Str(Cow::Borrowed(v)))
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Str(Cow::Owned(v.to_owned())))
        }
        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(Str(Cow::Owned(v)))
        }
    }

    impl<'de: 'a, 'a> Deserialize<'de> for Frame<'a> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(FrameVisitor(std::marker::PhantomData))
        }
    }

    struct FrameVisitor<'a>(std::marker::PhantomData<&'a ()>);

    impl<'de: 'a, 'a> serde::de::Visitor<'de> for FrameVisitor<'a> {
        type Value = Frame<'a>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a frame: a name string or {\"name\", \"service\", \"file\", \"line\"}")
        }
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Frame::Name(Cow::Borrowed(v)))
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Frame::Name(Cow::Owned(v.to_owned())))
        }
        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(Frame::Name(Cow::Owned(v)))
        }
        fn visit_map<M: serde::de::MapAccess<'de>>(
            self,
            mut m: M,
        ) -> Result<Self::Value, M::Error> {
            let (mut name, mut service, mut file, mut line) = (None, None, None, None);
            while let Some(key) = m.next_key::<Str<'_>>()? {
                match &*key.0 {
                    "name" => name = Some(m.next_value::<Str<'a>>()?.0),
                    "service" => service = m.next_value::<Option<Str<'a>>>()?.map(|s| s.0),
                    "file" => file = m.next_value::<Option<Str<'a>>>()?.map(|s| s.0),
                    "line" => line = m.next_value::<Option<u32>>()?,
                    _ => {
                        m.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
            }
            let name = name.ok_or_else(|| serde::de::Error::missing_field("name"))?;
            Ok(Frame::Full {
                name,
                service,
                file,
                line,
            })
        }
    }

    /// The accounting object: `{cause}_ns` for every [`Cause`] in
    /// [`Cause::ALL`] order, zeros included. Reading, a missing key is zero,
    /// an unknown key is ignored (a newer writer's cause), a repeated key is
    /// an error.
    pub(super) struct Accounting(pub(super) crate::path::Accounting);

    /// `{cause}_ns`, written without allocating.
    struct NsKey(Cause);

    impl Serialize for NsKey {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_str(&format_args!("{}_ns", self.0.name()))
        }
    }

    impl Serialize for Accounting {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(Some(Cause::ALL.len()))?;
            for (c, d) in self.0.iter() {
                m.serialize_entry(&NsKey(c), &super::duration_ns(d))?;
            }
            m.end()
        }
    }

    impl<'de> Deserialize<'de> for Accounting {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_map(AccountingVisitor)
        }
    }

    struct AccountingVisitor;

    impl<'de> serde::de::Visitor<'de> for AccountingVisitor {
        type Value = Accounting;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an accounting object: {\"network_ns\": …, \"queueing_ns\": …}")
        }
        fn visit_map<M: serde::de::MapAccess<'de>>(self, mut m: M) -> Result<Accounting, M::Error> {
            let mut a = crate::path::Accounting::default();
            let mut seen = [false; Cause::ALL.len()];
            while let Some(key) = m.next_key::<Str<'_>>()? {
                match key.0.strip_suffix("_ns").and_then(Cause::from_name) {
                    Some(c) => {
                        if std::mem::replace(&mut seen[c as usize], true) {
                            return Err(serde::de::Error::custom(format_args!(
                                "duplicate field `{}`",
                                key.0
                            )));
                        }
                        a.set(c, Duration::from_nanos(m.next_value::<u64>()?));
                    }
                    None => {
                        m.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
            }
            Ok(Accounting(a))
        }
    }
}

/// Frame strings decoded on this thread so far, shared: the records one
/// reader decodes (a JSON Lines file, a store query) then hold one copy of
/// each service, name and file instead of one per record, which is most of
/// their memory and most of what aggregating them waits on (cache misses on
/// every record's own strings). Bounded: strings over [`SHARED_LEN`] bytes are
/// not kept, and past [`SHARED_MAX`] strings the table starts over. SipHash,
/// since the strings come from untrusted input.
fn shared(s: &str) -> Arc<str> {
    if s.len() > SHARED_LEN {
        return Arc::from(s);
    }
    thread_local! {
        static SHARED: std::cell::RefCell<std::collections::HashSet<Arc<str>>> =
            std::cell::RefCell::default();
    }
    SHARED.with_borrow_mut(|set| {
        if let Some(a) = set.get(s) {
            return a.clone();
        }
        if set.len() >= SHARED_MAX {
            set.clear();
        }
        let a: Arc<str> = Arc::from(s);
        set.insert(a.clone());
        a
    })
}

/// Distinct frame strings [`shared`] keeps per thread.
const SHARED_MAX: usize = 1 << 16;
/// The longest string [`shared`] keeps.
const SHARED_LEN: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::ms;

    use crate::testing::fixtures::fig2a_record as fig2a;

    /// A named wait is written as an unattributed wait with `"wait": true`:
    /// read back as a named wait, and by a reader that ignores `wait` as an
    /// unattributed wait whose leaf names the resource.
    #[test]
    fn json_named_waits_round_trip_and_read_as_unattributed_without_the_flag() {
        use crate::path::{Frame, SegmentKind};
        let mut p = CriticalPath::new();
        let a1 = Frame::new("A", "A1");
        p.push_frames([a1.clone()], ms(3), SegmentKind::Busy);
        p.push_frames(
            [a1, Frame::wait("A", "semaphore", None)],
            ms(4),
            SegmentKind::Wait,
        );
        let r = Record::new("A", crate::Trigger::Sampled, p);
        let line = r.to_json();
        assert!(
            line.contains(r#""ns":4000000,"kind":"unattributed","wait":true}"#),
            "{line}"
        );
        assert_eq!(Record::from_json(&line).unwrap(), r);
        let old = Record::from_json(&line.replace(r#","wait":true"#, "")).unwrap();
        assert_eq!(old.path.segments()[1].kind, SegmentKind::Unattributed);
        let leaf = old
            .path
            .frame(*old.path.segments()[1].stack.last().unwrap());
        assert_eq!(&*leaf.name, "[semaphore]");
        // `"kind":"wait"` reads too; `wait` on a busy segment is an error.
        let direct = line.replace(r#""kind":"unattributed","wait":true"#, r#""kind":"wait""#);
        assert_eq!(Record::from_json(&direct).unwrap(), r);
        let bad = line.replace(r#""ns":3000000}"#, r#""ns":3000000,"wait":true}"#);
        assert_eq!(
            Record::from_json(&bad),
            Err(RecordError::WaitKind {
                segment: 0,
                kind: "busy"
            })
        );
    }

    #[test]
    fn json_round_trip_keeps_services_locations_and_kinds() {
        let r = fig2a();
        let line = r.to_json();
        assert!(line.contains(r#"{"stack":["A1"],"ns":5000000}"#), "{line}");
        assert!(
            line.contains(r#"{"name":"B1","service":"B","file":"b/src/lib.rs","line":12}"#),
            "{line}"
        );
        let back = Record::from_json(&line).unwrap();
        assert_eq!(back, r);
    }

    /// Records one reader decodes share their frame strings (one copy per
    /// distinct service, name and file), except strings too long to keep.
    #[test]
    fn json_decoded_records_share_frame_strings() {
        let line = fig2a().to_json();
        let (a, b) = (
            Record::from_json(&line).unwrap(),
            Record::from_json(&line).unwrap(),
        );
        assert_eq!(a, b);
        for (fa, fb) in a.path.frames().iter().zip(b.path.frames()) {
            assert!(Arc::ptr_eq(&fa.name, &fb.name), "{fa:?}");
            assert!(Arc::ptr_eq(&fa.service, &fb.service), "{fa:?}");
            if let (Some(la), Some(lb)) = (&fa.location, &fb.location) {
                assert!(Arc::ptr_eq(&la.file, &lb.file), "{fa:?}");
            }
        }
        let long = "x".repeat(SHARED_LEN + 1);
        let mut p = CriticalPath::new();
        p.push_frames([Frame::new("A", long.as_str())], ms(1), SegmentKind::Busy);
        let line = Record::new("A", Trigger::Sampled, p).to_json();
        let (a, b) = (
            Record::from_json(&line).unwrap(),
            Record::from_json(&line).unwrap(),
        );
        assert_eq!(a, b);
        assert!(!Arc::ptr_eq(
            &a.path.frames()[0].name,
            &b.path.frames()[0].name
        ));
    }

    #[test]
    fn json_writes_each_location_once_and_keeps_differing_ones() {
        let mut p = CriticalPath::new();
        let a1 = Frame::new("A", "A1").with_location("a.rs", 3);
        let b1 = Frame::new("B", "B1").with_location("b.rs", 7);
        let b1_other = Frame::new("B", "B1").with_location("b2.rs", 9);
        let b1_bare = Frame::new("B", "B1");
        p.push_frames([a1.clone(), b1.clone()], ms(1), SegmentKind::Busy);
        p.push_frames([a1.clone()], ms(1), SegmentKind::Busy);
        p.push_frames([a1.clone(), b1.clone()], ms(1), SegmentKind::Network);
        p.push_frames([a1.clone(), b1_bare], ms(1), SegmentKind::Busy);
        p.push_frames([a1.clone(), b1_other], ms(1), SegmentKind::Busy);
        p.push_frames([a1, b1], ms(1), SegmentKind::Busy);
        let r = Record::new("A", Trigger::Sampled, p);
        let line = r.to_json();
        assert_eq!(line.matches("a.rs").count(), 1, "{line}");
        assert_eq!(line.matches("b.rs").count(), 2, "{line}");
        assert!(
            line.contains(r#"{"name":"B1","service":"B","file":""}"#),
            "{line}"
        );
        assert_eq!(Record::from_json(&line).unwrap(), r);
    }

    #[test]
    fn json_minimal_record_is_accepted() {
        let r = Record::from_json(
            r#"{"service":"S","trigger":"forced","latency_ns":3,"path":[{"stack":["x","y"],"ns":3}]}"#,
        )
        .unwrap();
        assert_eq!(r.trigger, Trigger::Forced);
        assert_eq!(r.latency, Duration::from_nanos(3));
        assert_eq!(&*r.path.frames()[1].service, "S");
        assert!(r.labels.is_empty() && r.endpoint.is_none() && r.trace_id.is_none());
    }

    #[rustfmt::skip]
    const BAD: &[(&str, &str)] = &[
        ("not json", "not a cpt record"),
        (r#"{"service":"S","trigger":"maybe","latency_ns":1,"path":[{"stack":["x"],"ns":1}]}"#, "unknown trigger"),
        (r#"{"service":"S","trigger":"sampled","latency_ns":2,"path":[{"stack":["x"],"ns":1}]}"#, "sums to 1 ns but latency_ns is 2"),
        (r#"{"service":"S","trigger":"sampled","latency_ns":1,"path":[{"stack":[],"ns":1}]}"#, "empty stack"),
        (r#"{"service":"S","trigger":"sampled","latency_ns":1,"path":[{"stack":["x"],"ns":1,"kind":"nap"}]}"#, "unknown kind"),
        (r#"{"service":"S","trigger":"sampled","latency_ns":0,"path":[{"stack":["x"],"ns":18446744073709551615},{"stack":["y"],"ns":1}]}"#, "overflow"),
        (r#"{"trigger":"sampled","latency_ns":0,"path":[]}"#, "missing field `service`"),
        (r#"{"service":"S","trigger":"sampled","latency_ns":1,"path":[{"stack":[3],"ns":1}]}"#, "expected a frame"),
        (r#"{"service":"S","trigger":"sampled","latency_ns":1,"path":[{"stack":[{"file":"f"}],"ns":1}]}"#, "missing field `name`"),
        (r#"{"service":"S","trigger":"sampled","latency_ns":1,"path":[{"stack":["x"],"ns":1}],"accounting":{"queueing_ns":1,"queueing_ns":2}}"#, "duplicate field `queueing_ns`"),
        (r#"{"service":"S","trigger":"sampled","latency_ns":1,"path":[{"stack":["x"],"ns":1}],"accounting":{"network_ns":-1}}"#, "invalid value"),
    ];

    /// The accounting object keeps the key names and order other tools read:
    /// `{cause}_ns` for every cause, zeros included; keys it does not know
    /// (a newer writer's cause) are skipped, missing ones are zero.
    #[test]
    fn json_accounting_names_every_cause() {
        let mut p = CriticalPath::new();
        p.push_frames(
            [Frame::new("S", "x")],
            Duration::from_nanos(9),
            SegmentKind::Busy,
        );
        p.accounting.network = Duration::from_nanos(1);
        p.accounting.clock_skew = Duration::from_nanos(7);
        let json = Record::new("S", Trigger::Sampled, p).to_json();
        assert!(
            json.contains(r#""accounting":{"network_ns":1,"overcount_ns":0,"blind_spot_ns":0,"unattributed_ns":0,"queueing_ns":0,"truncated_ns":0,"clock_skew_ns":7}"#),
            "{json}"
        );
        let r = Record::from_json(
            r#"{"service":"S","trigger":"sampled","latency_ns":1,"path":[{"stack":["x"],"ns":1}],"accounting":{"truncated_ns":4,"future_cause_ns":5,"note":"x"}}"#,
        )
        .unwrap();
        assert_eq!(
            r.path.accounting,
            Accounting {
                truncated: Duration::from_nanos(4),
                ..Accounting::default()
            }
        );
    }

    #[test]
    fn json_bad_records_say_what_is_wrong() {
        for (line, want) in BAD {
            let err = Record::from_json(line).unwrap_err().to_string();
            assert!(err.contains(want), "{line}: got {err:?}, want {want:?}");
        }
    }
}
