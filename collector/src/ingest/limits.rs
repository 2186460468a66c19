//! What one record and one batch may hold at ingest: the single definition
//! of the limits the HTTP and gRPC front ends enforce (and `cpt serve`'s
//! flags set).
//!
//! The limits exist because records come from the network. A record is
//! stored as one JSON row keyed by `(service, endpoint, start)`, so a huge
//! service name slows every later insert, and a protobuf record whose
//! segments index one long frame many times expands by orders of magnitude
//! when stored. Every limit is checked **before** the record is built or
//! stored: for protobuf the expanded size is computed from the frame table
//! and the segments' indices, without expanding anything.
//!
//! Where the wire codec of the middleware has a limit for the same thing
//! ([`DecodeLimits`]: stack depth, segments, frames over all stacks, frame
//! table), the default here is the codec's, so a path a callee may send
//! always fits in a record.
//!
//! The defaults are far above what a real service sends; a limit that is hit
//! is named in the error (`records[3].service: 3145728 bytes, over the limit
//! max_string_bytes = 512`) together with the flag that raises it.

use std::time::Duration;

use cpt_sdk::Record;
use cpt_sdk::codec::DecodeLimits;

/// Limits on what one record and one batch may hold (see the module docs).
///
/// ```
/// use cpt_collector::ingest::IngestLimits;
///
/// let limits = IngestLimits::new().with_max_string_bytes(1024).with_max_labels(16);
/// assert_eq!(limits.max_depth, 128);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct IngestLimits {
    /// Longest service, endpoint, request id, trace id, label key or label
    /// value, in bytes (these are indexed or filtered on). Default 512.
    pub max_string_bytes: usize,
    /// Longest frame name, frame service or source file name, in bytes.
    /// Default 4096.
    pub max_frame_string_bytes: usize,
    /// Most labels on a record. Default 64.
    pub max_labels: usize,
    /// Deepest stack. Default [`DecodeLimits::max_depth`] (128).
    pub max_depth: usize,
    /// Most segments on a record. Default [`DecodeLimits::max_segments`]
    /// (16384).
    pub max_segments: usize,
    /// Most distinct frames on a record (the frame table). Default
    /// [`DecodeLimits::max_tree_entries`] (8192).
    pub max_frames: usize,
    /// Most frames over all of a record's stacks (the sum of their depths).
    /// Default [`DecodeLimits::max_stack_frames`] (262144).
    pub max_stack_frames: usize,
    /// Largest stored size of one record, in bytes (an upper bound of its
    /// JSON row, computed before it is built). Default 1 MiB.
    pub max_record_bytes: usize,
    /// Largest stored size of one batch, in bytes (the sum over its
    /// records). Default 16 MiB.
    pub max_batch_stored_bytes: usize,
    /// Longest latency a record may report. Default 1 hour. Segments must be
    /// non-zero and sum to the latency, so each is within it too.
    pub max_latency: Duration,
    /// How far ahead of this machine's clock a record may start. Default 1
    /// hour. A record from a sender whose clock runs ahead would otherwise
    /// sit past every time range and every retention cutoff.
    pub max_future_skew: Duration,
}

/// Default [`IngestLimits::max_string_bytes`].
pub const DEFAULT_MAX_STRING_BYTES: usize = 512;
/// Default [`IngestLimits::max_frame_string_bytes`].
pub const DEFAULT_MAX_FRAME_STRING_BYTES: usize = 4096;
/// Default [`IngestLimits::max_labels`].
pub const DEFAULT_MAX_LABELS: usize = 64;
/// Default [`IngestLimits::max_record_bytes`].
pub const DEFAULT_MAX_RECORD_BYTES: usize = 1 << 20;
/// Default [`IngestLimits::max_batch_stored_bytes`].
pub const DEFAULT_MAX_BATCH_STORED_BYTES: usize = 16 << 20;
/// Default [`IngestLimits::max_latency`].
pub const DEFAULT_MAX_LATENCY: Duration = Duration::from_secs(3600);
/// Default [`IngestLimits::max_future_skew`].
pub const DEFAULT_MAX_FUTURE_SKEW: Duration = Duration::from_secs(3600);

impl Default for IngestLimits {
    fn default() -> Self {
        let codec = DecodeLimits::default();
        IngestLimits {
            max_string_bytes: DEFAULT_MAX_STRING_BYTES,
            max_frame_string_bytes: DEFAULT_MAX_FRAME_STRING_BYTES,
            max_labels: DEFAULT_MAX_LABELS,
            max_depth: codec.max_depth,
            max_segments: codec.max_segments,
            max_frames: codec.max_tree_entries,
            max_stack_frames: codec.max_stack_frames,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            max_batch_stored_bytes: DEFAULT_MAX_BATCH_STORED_BYTES,
            max_latency: DEFAULT_MAX_LATENCY,
            max_future_skew: DEFAULT_MAX_FUTURE_SKEW,
        }
    }
}

/// The record-level fields [`IngestLimits::header`] checks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Header<'a> {
    pub(crate) service: &'a str,
    pub(crate) endpoint: Option<&'a str>,
    pub(crate) request_id: Option<&'a str>,
    pub(crate) trace_id: Option<&'a str>,
    pub(crate) labels: &'a std::collections::BTreeMap<String, String>,
    pub(crate) latency_ns: u64,
    pub(crate) segments: usize,
    pub(crate) start_unix_nanos: Option<u64>,
}

/// A limit a record is over: the field (relative to the record) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Over {
    pub(crate) field: String,
    pub(crate) reason: String,
}

/// Whether a record refused for `field`'s `reason` starts further ahead of
/// this machine's clock than [`IngestLimits::max_future_skew`].
pub(crate) fn is_clock_ahead(field: &str, reason: &str) -> bool {
    field == START_FIELD && reason.contains(CLOCK_AHEAD)
}

const START_FIELD: &str = "start_unix_nanos";
const CLOCK_AHEAD: &str = "ahead of the collector's clock";

fn over(
    field: impl std::fmt::Display,
    what: impl std::fmt::Display,
    limit: &str,
    max: impl std::fmt::Display,
) -> Over {
    let flag = limit.replace('_', "-");
    Over {
        field: field.to_string(),
        reason: format!(
            "{what}, over the limit {limit} = {max} (the collector's --{flag} sets it)"
        ),
    }
}

/// JSON syntax around one stack entry in a stored row, at most
/// (`{"name":"","service":"","file":"","line":4294967295},`).
const FRAME_OVERHEAD: usize = 56;
/// JSON syntax around one segment, at most (`{"stack":[],"ns":…,"kind":"unattributed"},`).
const SEGMENT_OVERHEAD: usize = 64;
/// The rest of a row: field names, trigger, numbers, accounting.
const RECORD_OVERHEAD: usize = 512;
/// A string's length in a JSON row, quotes and escapes included.
fn json_len(s: &str) -> usize {
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// Where in a record a field is (`frames[3].name`, `segments[7]`), put
/// into words only when an error names it: checking a record within the
/// limits allocates nothing per frame or segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct At {
    list: &'static str,
    index: usize,
    field: &'static str,
}

impl At {
    /// Item `index` of the record's `list` (`frames`, `segments`).
    pub(crate) fn item(list: &'static str, index: usize) -> At {
        At {
            list,
            index,
            field: "",
        }
    }

    /// The item's field `field` (`name`, `stack`).
    pub(crate) fn field(self, field: &'static str) -> At {
        At { field, ..self }
    }
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.list, self.index)?;
        if !self.field.is_empty() {
            write!(f, ".{}", self.field)?;
        }
        Ok(())
    }
}

/// A label's key or value as the error names it: `labels["key"]`, the
/// key at most 32 characters, quoted.
struct LabelAt<'a> {
    key: &'a str,
    of_key: bool,
}

impl std::fmt::Display for LabelAt<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let k = self.key;
        let cut = k.char_indices().nth(32).map_or(k.len(), |(i, _)| i);
        let dots = if cut < k.len() { "…" } else { "" };
        write!(f, "labels[{:?}{dots}]", &k[..cut])?;
        if self.of_key {
            f.write_str(" key")?;
        }
        Ok(())
    }
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $field:ident: $ty:ty;)*) => {
        $(
            $(#[$doc])*
            #[must_use]
            pub fn $name(mut self, v: $ty) -> Self {
                self.$field = v;
                self
            }
        )*
    };
}

impl IngestLimits {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// Set [`IngestLimits::max_string_bytes`].
        with_max_string_bytes: max_string_bytes: usize;
        /// Set [`IngestLimits::max_frame_string_bytes`].
        with_max_frame_string_bytes: max_frame_string_bytes: usize;
        /// Set [`IngestLimits::max_labels`].
        with_max_labels: max_labels: usize;
        /// Set [`IngestLimits::max_depth`].
        with_max_depth: max_depth: usize;
        /// Set [`IngestLimits::max_segments`].
        with_max_segments: max_segments: usize;
        /// Set [`IngestLimits::max_frames`].
        with_max_frames: max_frames: usize;
        /// Set [`IngestLimits::max_stack_frames`].
        with_max_stack_frames: max_stack_frames: usize;
        /// Set [`IngestLimits::max_record_bytes`].
        with_max_record_bytes: max_record_bytes: usize;
        /// Set [`IngestLimits::max_batch_stored_bytes`].
        with_max_batch_stored_bytes: max_batch_stored_bytes: usize;
        /// Set [`IngestLimits::max_latency`].
        with_max_latency: max_latency: Duration;
        /// Set [`IngestLimits::max_future_skew`].
        with_max_future_skew: max_future_skew: Duration;
    }

    /// A record's start against this machine's clock: no more than
    /// [`IngestLimits::max_future_skew`] ahead of `now_unix_nanos`.
    pub(crate) fn start(
        &self,
        start_unix_nanos: Option<u64>,
        now_unix_nanos: u64,
    ) -> Result<(), Over> {
        let Some(start) = start_unix_nanos else {
            return Ok(());
        };
        let skew = u64::try_from(self.max_future_skew.as_nanos()).unwrap_or(u64::MAX);
        if start <= now_unix_nanos.saturating_add(skew) {
            return Ok(());
        }
        Err(Over {
            field: START_FIELD.into(),
            reason: format!(
                "{start} is {} {CLOCK_AHEAD}, over max_future_skew = {} \
                 (--max-future-skew); fix the sender's clock (NTP), or raise the limit",
                rough(Duration::from_nanos(start - now_unix_nanos)),
                rough(self.max_future_skew),
            ),
        })
    }

    pub(crate) fn string(&self, field: impl std::fmt::Display, s: &str) -> Result<(), Over> {
        if s.len() > self.max_string_bytes {
            return Err(over(
                field,
                format_args!("{} bytes", s.len()),
                "max_string_bytes",
                self.max_string_bytes,
            ));
        }
        Ok(())
    }

    pub(crate) fn frame_string(&self, field: impl std::fmt::Display, s: &str) -> Result<(), Over> {
        if s.len() > self.max_frame_string_bytes {
            return Err(over(
                field,
                format_args!("{} bytes", s.len()),
                "max_frame_string_bytes",
                self.max_frame_string_bytes,
            ));
        }
        Ok(())
    }

    /// The record-level fields: service, endpoint, ids, labels, latency,
    /// segment count. Returns their stored size.
    pub(crate) fn header(&self, h: &Header<'_>) -> Result<usize, Over> {
        let Header {
            service,
            endpoint,
            request_id,
            trace_id,
            labels,
            latency_ns,
            segments,
            start_unix_nanos,
        } = *h;
        self.start(start_unix_nanos, now_unix_nanos())?;
        self.string("service", service)?;
        let mut bytes = RECORD_OVERHEAD + json_len(service);
        for (name, v) in [
            ("endpoint", endpoint),
            ("request_id", request_id),
            ("trace_id", trace_id),
        ] {
            if let Some(v) = v {
                self.string(name, v)?;
                bytes += json_len(v) + 16;
            }
        }
        if labels.len() > self.max_labels {
            return Err(over(
                "labels",
                format_args!("{} labels", labels.len()),
                "max_labels",
                self.max_labels,
            ));
        }
        for (k, v) in labels {
            self.string(
                LabelAt {
                    key: k,
                    of_key: true,
                },
                k,
            )?;
            self.string(
                LabelAt {
                    key: k,
                    of_key: false,
                },
                v,
            )?;
            // Stored twice: in the labels column and in the row's JSON.
            bytes += 2 * (json_len(k) + json_len(v) + 2);
        }
        if u128::from(latency_ns) > self.max_latency.as_nanos() {
            return Err(over(
                "latency_nanos",
                format_args!("{latency_ns} ns"),
                "max_latency",
                humantime_secs(self.max_latency),
            ));
        }
        if segments == 0 {
            return Err(Over {
                field: "segments".into(),
                reason: "empty: a record has at least one segment".into(),
            });
        }
        if segments > self.max_segments {
            return Err(over(
                "segments",
                format_args!("{segments} segments"),
                "max_segments",
                self.max_segments,
            ));
        }
        bytes += segments * SEGMENT_OVERHEAD;
        self.record_bytes("segments", bytes)?;
        Ok(bytes)
    }

    /// The stored size of one frame (its strings checked).
    pub(crate) fn frame(
        &self,
        at: At,
        name: &str,
        service: &str,
        file: Option<&str>,
    ) -> Result<usize, Over> {
        self.frame_string(at.field("name"), name)?;
        self.frame_string(at.field("service"), service)?;
        if let Some(f) = file {
            self.frame_string(at.field("file"), f)?;
        }
        Ok(json_len(name) + json_len(service) + file.map_or(0, json_len) + FRAME_OVERHEAD)
    }

    pub(crate) fn frames(&self, n: usize) -> Result<(), Over> {
        if n > self.max_frames {
            return Err(over(
                "frames",
                format_args!("{n} distinct frames"),
                "max_frames",
                self.max_frames,
            ));
        }
        Ok(())
    }

    pub(crate) fn depth(&self, at: impl std::fmt::Display, depth: usize) -> Result<(), Over> {
        if depth > self.max_depth {
            return Err(over(
                at,
                format_args!("stack depth {depth}"),
                "max_depth",
                self.max_depth,
            ));
        }
        Ok(())
    }

    pub(crate) fn stack_frames(&self, at: impl std::fmt::Display, n: usize) -> Result<(), Over> {
        if n > self.max_stack_frames {
            return Err(over(
                at,
                format_args!("{n} frames over all stacks so far"),
                "max_stack_frames",
                self.max_stack_frames,
            ));
        }
        Ok(())
    }

    pub(crate) fn record_bytes(
        &self,
        at: impl std::fmt::Display,
        bytes: usize,
    ) -> Result<(), Over> {
        if bytes > self.max_record_bytes {
            return Err(over(
                at,
                format_args!("the record would store at least {bytes} bytes"),
                "max_record_bytes",
                self.max_record_bytes,
            ));
        }
        Ok(())
    }

    pub(crate) fn batch_bytes(&self, bytes: usize) -> Result<(), Over> {
        if bytes > self.max_batch_stored_bytes {
            return Err(over(
                "batch",
                format_args!("the batch would store at least {bytes} bytes"),
                "max_batch_stored_bytes",
                self.max_batch_stored_bytes,
            ));
        }
        Ok(())
    }

    /// Check a record built from JSON (whose size is bounded by its line)
    /// and return its stored size.
    pub(crate) fn check(&self, r: &Record) -> Result<usize, Over> {
        let latency = u64::try_from(r.latency.as_nanos()).unwrap_or(u64::MAX);
        let segments = r.path.segments();
        let mut bytes = self.header(&Header {
            service: &r.service,
            endpoint: r.endpoint.as_deref(),
            request_id: r.request_id.as_deref(),
            trace_id: r.trace_id.as_deref(),
            labels: &r.labels,
            latency_ns: latency,
            segments: segments.len(),
            start_unix_nanos: r.start_unix_nanos,
        })?;
        let frames = r.path.frames();
        self.frames(frames.len())?;
        let mut cost = Vec::with_capacity(frames.len());
        for (i, f) in frames.iter().enumerate() {
            cost.push(self.frame(
                At::item("frames", i),
                &f.name,
                &f.service,
                f.location.as_ref().map(|l| &*l.file),
            )?);
        }
        let mut stack_frames = 0usize;
        for (i, s) in segments.iter().enumerate() {
            let at = At::item("segments", i);
            self.depth(at.field("stack"), s.stack.len())?;
            if s.duration.is_zero() {
                return Err(Over {
                    field: at.field("ns").to_string(),
                    reason: "zero duration (a segment lasts at least 1 ns)".into(),
                });
            }
            stack_frames += s.stack.len();
            self.stack_frames(at, stack_frames)?;
            bytes += s.stack.iter().map(|id| cost[id.0 as usize]).sum::<usize>();
            self.record_bytes(at, bytes)?;
        }
        Ok(bytes)
    }
}

impl IngestLimits {
    /// [`check`](Self::check) a record, coarsening its path one level at a
    /// time (the deepest frames folded into their parents,
    /// [`CriticalPath::coarsen`](cpt_sdk::CriticalPath::coarsen), the time
    /// that lost its detail counted in `accounting.truncated`) until it is
    /// within the limits, as the SDK's encoder does to fit a path in a
    /// header. `Ok(true)`: it was coarsened. `Err`: over a limit that no
    /// coarsening helps (labels, names, or even its root alone).
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn fit(&self, r: &mut Record) -> Result<bool, Over> {
        let mut failed = match self.check(r) {
            Ok(_) => return Ok(false),
            Err(e) => e,
        };
        // Each depth from the path as it came: folding a folded path again
        // would count its time as truncated twice.
        let whole = r.path.clone();
        let mut depth = whole.depth();
        while depth > 1 {
            depth -= 1;
            r.path.clone_from(&whole);
            r.path.coarsen(depth);
            match self.check(r) {
                Ok(_) => return Ok(true),
                Err(e) => failed = e,
            }
        }
        r.path = whole;
        Err(failed)
    }
}

/// This machine's clock, ns since the Unix epoch.
fn now_unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A duration to the unit that matters: `236 days`, `2h 5m`, `90s`.
fn rough(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s >= 2 * 86_400 => format!("{} days", s / 86_400),
        s if s >= 3_600 => format!("{}h {}m", s / 3_600, s % 3_600 / 60),
        s => format!("{s}s"),
    }
}

fn humantime_secs(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpt_sdk::{CriticalPath, Frame, SegmentKind, Trigger};

    /// A path deeper than the limit is folded to it, total kept and the
    /// folded time counted as truncated; labels over the limit are not
    /// something folding helps.
    #[test]
    fn fit_coarsens_a_path_to_the_limits_and_refuses_what_coarsening_cannot_mend() {
        let limits = IngestLimits::new().with_max_depth(2).with_max_labels(1);
        let mut p = CriticalPath::new();
        let stack = |d: usize| {
            (0..d)
                .map(|i| Frame::new("svc", format!("f{i}")))
                .collect::<Vec<_>>()
        };
        p.push_frames(stack(1), Duration::from_millis(3), SegmentKind::Busy);
        p.push_frames(stack(4), Duration::from_millis(5), SegmentKind::Busy);
        p.push_frames(stack(2), Duration::from_millis(7), SegmentKind::Busy);
        let mut r = Record::new("svc", Trigger::Sampled, p);
        assert!(limits.check(&r).is_err());
        assert_eq!(limits.fit(&mut r), Ok(true));
        assert_eq!(r.path.depth(), 2);
        assert_eq!(r.path.total(), Duration::from_millis(15));
        assert_eq!(r.path.accounting.truncated, Duration::from_millis(5));
        // Within the limits: untouched.
        let before = r.clone();
        assert_eq!(limits.fit(&mut r), Ok(false));
        assert_eq!(r, before);
        r.labels.insert("a".into(), "1".into());
        r.labels.insert("b".into(), "2".into());
        assert!(limits.fit(&mut r).is_err());
    }

    /// An error names the field where the record broke the limit, down to
    /// the frame, segment or label, though a record within them is checked
    /// without putting any of those names into words.
    #[test]
    fn an_error_names_the_frame_segment_or_label_that_broke_the_limit() {
        let field = |limits: IngestLimits, r: &Record| limits.check(r).unwrap_err().field;
        let mut p = CriticalPath::new();
        let frame = |name: &str| Frame::new("svc", name);
        p.push_frames(
            vec![frame("a")],
            Duration::from_millis(1),
            SegmentKind::Busy,
        );
        p.push_frames(
            vec![frame("a"), frame(&"b".repeat(40)), frame("c")],
            Duration::from_millis(1),
            SegmentKind::Busy,
        );
        let mut r = Record::new("svc", Trigger::Sampled, p);
        let long_key = "k".repeat(40);
        r.labels.insert(long_key.clone(), "v".repeat(40));
        assert!(IngestLimits::new().check(&r).is_ok());
        let small = IngestLimits::new().with_max_frame_string_bytes(20);
        assert_eq!(field(small, &r), "frames[1].name");
        let shallow = IngestLimits::new().with_max_depth(2);
        assert_eq!(field(shallow, &r), "segments[1].stack");
        let few = IngestLimits::new().with_max_stack_frames(3);
        assert_eq!(field(few, &r), "segments[1]");
        let short = IngestLimits::new().with_max_string_bytes(39);
        let cut = format!("labels[{:?}…] key", &long_key[..32]);
        assert_eq!(field(short, &r), cut);
        r.labels.clear();
        r.labels.insert("k".into(), "v".repeat(40));
        let short = IngestLimits::new().with_max_string_bytes(39);
        assert_eq!(field(short, &r), "labels[\"k\"]");
    }
}
