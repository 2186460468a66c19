//! The critical-path model: frames, segments, accounting.
//!
//! This module is pure data. It knows nothing of `tracing` or `tokio`, so the
//! collector and the offline trace importers can use it with the `layer`
//! feature turned off.
//!
//! A [`CriticalPath`] is an ordered list of [`Segment`]s. Each segment is a
//! frame stack (root → leaf, as [`FrameId`]s into the path's own frame table)
//! and a duration. The durations sum exactly to the request's latency (CPT:
//! "the length of the critical path is the total latency"); time the path
//! cannot explain in detail is still on the path, as a segment whose
//! [`SegmentKind`] says why, and is totalled in [`Accounting`].

mod accounting;
pub mod coarsen;
pub mod compute;
pub mod graph;
pub mod merge;
mod table;
pub(crate) use table::FrameTable;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

pub use accounting::{Accounting, Cause};

/// Where a node's code lives, when the instrumentation knows it
/// (`tracing::Metadata::file` / `line`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    /// Source file, as the compiler named it.
    pub file: Arc<str>,
    /// 1-based line number.
    pub line: u32,
}

/// One entry of a frame stack: a named node of some service.
///
/// Frames with the same service, name and location are the same frame: a
/// [`CriticalPath`] interns them in its frame table and profiles merge them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// The service the node ran in (`"A"`, `"frontend"`).
    pub service: Arc<str>,
    /// The node's name: the span name, task name, or RPC method.
    pub name: Arc<str>,
    /// Where the node's code is, if known.
    pub location: Option<Location>,
}

impl Frame {
    /// A frame with no source location.
    pub fn new(service: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        Frame {
            service: service.into(),
            name: name.into(),
            location: None,
        }
    }

    /// The same frame with a source location.
    #[must_use]
    pub fn with_location(mut self, file: impl Into<Arc<str>>, line: u32) -> Self {
        self.location = Some(Location {
            file: file.into(),
            line,
        });
        self
    }
}

impl Frame {
    /// The wait frame of a resource of `kind` (`"sleep"`, `"semaphore"`,
    /// `"io"`, …) in `service`, created at `location` when known.
    ///
    /// Its name says both, `[sleep waits/src/lib.rs:88]` (the file shortened
    /// to the crate's directory and what follows, see [`short_file`]), so
    /// that every view, pprof's `-top` included, tells two sleeps apart
    /// without knowing about named waits; `[io]` without a location. The
    /// full location is the frame's location.
    pub fn wait(service: impl Into<Arc<str>>, kind: &str, location: Option<Location>) -> Self {
        let name = match &location {
            Some(l) => format!("[{kind} {}:{}]", short_file(&l.file), l.line),
            None => format!("[{kind}]"),
        };
        Frame {
            service: service.into(),
            name: Arc::from(name),
            location,
        }
    }

    /// The kind of a wait frame's name (`"sleep"` for `[sleep src/a.rs:3]`
    /// or `[sleep]`), when the name has that shape.
    pub fn wait_kind(&self) -> Option<&str> {
        let inner = self.name.strip_prefix('[')?.strip_suffix(']')?;
        Some(inner.split_once(' ').map_or(inner, |(kind, _)| kind))
    }
}

/// A source file as wait frames name it: from the directory above the last
/// `src/` on (`inventory/src/main.rs` for
/// `/home/u/inventory/src/main.rs`, `deadpool-0.12.1/src/managed/mod.rs` for
/// a dependency), or the whole path when it has no `src/`.
pub fn short_file(file: &str) -> &str {
    let unix = file.rfind("/src/");
    let windows = file.rfind("\\src\\");
    match unix.max(windows) {
        Some(i) => {
            let before = &file[..i];
            let start = before.rfind(['/', '\\']).map_or(0, |j| j + 1);
            &file[start..]
        }
        None => file,
    }
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.service)
    }
}

/// Index of a [`Frame`] in a [`CriticalPath`]'s frame table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(pub u32);

/// Why a segment is on the path.
///
/// Every kind other than [`SegmentKind::Busy`] is time the path could not
/// explain in detail; it is still on the path (totals stay exact) and is also
/// summed in [`Accounting`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SegmentKind {
    /// The leaf node was busy (entered / being polled): its own time.
    #[default]
    Busy,
    /// The leaf node existed but had not been polled yet (created early,
    /// polled late): queueing before its first poll.
    Queueing,
    /// The leaf node was waiting and no instrumented dependency ended inside
    /// the wait: an in-process blind spot, kept on the node itself.
    Unattributed,
    /// The leaf is an RPC node: the caller observed more time than the callee
    /// reported (network, serialization, queues outside the handler).
    Network,
    /// The leaf is an RPC node whose callee returned no usable path; the
    /// whole call is one leaf naming the callee.
    BlindSpot,
    /// A named wait: the node (the frame before the leaf) waited on what
    /// the leaf frame names, a *wait frame* such as `[sleep]` or
    /// `[semaphore]` with the place the resource was created (see
    /// [`Frame::wait`]). The stack is never empty. Not in [`Accounting`]:
    /// the path says what the time was.
    Wait,
}

impl SegmentKind {
    /// The name used in JSON and in profiles (`"busy"`, `"network"`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentKind::Busy => "busy",
            SegmentKind::Queueing => "queueing",
            SegmentKind::Unattributed => "unattributed",
            SegmentKind::Network => "network",
            SegmentKind::BlindSpot => "blind_spot",
            SegmentKind::Wait => "wait",
        }
    }

    /// Parse the name [`SegmentKind::as_str`] gives.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "busy" => SegmentKind::Busy,
            "queueing" => SegmentKind::Queueing,
            "unattributed" => SegmentKind::Unattributed,
            "network" => SegmentKind::Network,
            "blind_spot" => SegmentKind::BlindSpot,
            "wait" => SegmentKind::Wait,
            _ => return None,
        })
    }
}

impl fmt::Display for SegmentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A segment's frame stack: frame ids, root first. Stacks up to
/// [`STACK_INLINE`] frames deep (all of the Figure 1 system's) are stored in
/// the segment itself: computing, decoding and merging paths make one stack
/// per segment, and a heap allocation each was the largest part of their
/// cost.
pub type Stack = SmallVec<[FrameId; STACK_INLINE]>;

/// Frames a [`Stack`] holds without allocating.
pub const STACK_INLINE: usize = 10;

/// A stretch of the critical path: a frame stack (root → leaf) and a duration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Frame ids into the owning path's frame table, root first.
    pub stack: Stack,
    /// How long this stack was on the path.
    pub duration: Duration,
    /// Why it is on the path.
    pub kind: SegmentKind,
}

/// A request's critical path: an interned frame table, the ordered segments,
/// and the accounting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CriticalPath {
    frames: FrameTable,
    segments: Vec<Segment>,
    /// What the path could not explain in detail.
    pub accounting: Accounting,
}

impl CriticalPath {
    /// An empty path.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty path with room for `frames` distinct frames and `segments`
    /// segments.
    pub fn with_capacity(frames: usize, segments: usize) -> Self {
        CriticalPath {
            frames: FrameTable::with_capacity(frames),
            segments: Vec::with_capacity(segments),
            accounting: Accounting::default(),
        }
    }

    /// Intern a frame, returning its id (the same id for an equal frame).
    pub fn intern(&mut self, frame: Frame) -> FrameId {
        FrameId(self.frames.intern(frame))
    }

    /// Intern a frame of another path (`from`, id `id`): its hash is known,
    /// and it is cloned only if it is new here.
    pub(crate) fn intern_from(&mut self, from: &CriticalPath, id: FrameId) -> FrameId {
        FrameId(
            self.frames
                .intern_hashed(from.frame(id), from.frames.hash_of(id.0)),
        )
    }

    /// Intern a frame of a table (a graph's) whose hash is known.
    pub(crate) fn intern_hashed(&mut self, frame: &Frame, hash: u64) -> FrameId {
        FrameId(self.frames.intern_hashed(frame, hash))
    }

    /// The frame behind an id.
    ///
    /// # Panics
    ///
    /// If the id did not come from this path.
    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames.frames()[id.0 as usize]
    }

    /// The frame table, indexed by [`FrameId`].
    pub fn frames(&self) -> &[Frame] {
        self.frames.frames()
    }

    /// The segments in critical-path order (request start → response).
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Append a segment. A zero-length segment is dropped; a segment whose
    /// stack and kind equal the previous one's is merged into it.
    ///
    /// # Panics
    ///
    /// If a frame id did not come from this path's table.
    pub fn push(&mut self, stack: impl Into<Stack>, duration: Duration, kind: SegmentKind) {
        let stack = stack.into();
        if self.extend_last(&stack, duration, kind) {
            return;
        }
        self.segments.push(Segment {
            stack,
            duration,
            kind,
        });
    }

    /// [`push`](Self::push) from a borrowed stack: allocates only when the
    /// segment does not merge into the previous one.
    ///
    /// # Panics
    ///
    /// If a frame id did not come from this path's table.
    pub fn push_slice(&mut self, stack: &[FrameId], duration: Duration, kind: SegmentKind) {
        if self.extend_last(stack, duration, kind) {
            return;
        }
        self.segments.push(Segment {
            stack: Stack::from_slice(stack),
            duration,
            kind,
        });
    }

    /// Checks `stack`; true when nothing is left to append (empty, or merged
    /// into the previous segment).
    fn extend_last(&mut self, stack: &[FrameId], duration: Duration, kind: SegmentKind) -> bool {
        self.check_ids(stack);
        self.merge_last(stack, duration, kind)
    }

    /// # Panics
    ///
    /// If a frame id in `stack` did not come from this path's table.
    pub(crate) fn check_ids(&self, stack: &[FrameId]) {
        assert!(
            stack.iter().all(|f| (f.0 as usize) < self.frames.len()),
            "segment names a frame this path does not have; this is a bug"
        );
    }

    /// [`push`](Self::push) of the stack `ids` (`len` of them), whose ids
    /// the caller took from this path's table (checked in debug builds
    /// only). The stack is built in place in the segment list: building it
    /// first and moving it in cost more than the rest of the push.
    pub(crate) fn push_ids<I>(&mut self, ids: I, len: usize, duration: Duration, kind: SegmentKind)
    where
        I: Iterator<Item = FrameId> + Clone,
    {
        if duration.is_zero() {
            return;
        }
        if let Some(last) = self.segments.last_mut()
            && last.kind == kind
            && last.stack.len() == len
            && last.stack.iter().copied().eq(ids.clone())
        {
            last.duration = last.duration.saturating_add(duration);
            return;
        }
        self.segments.push(Segment {
            stack: Stack::new(),
            duration,
            kind,
        });
        let last = self.segments.last_mut().expect("just pushed");
        last.stack.reserve(len);
        last.stack.extend(ids);
        debug_assert_eq!(last.stack.len(), len);
        debug_assert!(
            last.stack
                .iter()
                .all(|f| (f.0 as usize) < self.frames.len())
        );
    }

    /// [`push_ids`](Self::push_ids) of a borrowed stack of ids from this
    /// path's table (checked in debug builds only): compared and copied as
    /// a slice, not element by element.
    pub(crate) fn push_id_slice(&mut self, ids: &[FrameId], duration: Duration, kind: SegmentKind) {
        if duration.is_zero() {
            return;
        }
        if let Some(last) = self.segments.last_mut()
            && last.kind == kind
            && last.stack[..] == *ids
        {
            last.duration = last.duration.saturating_add(duration);
            return;
        }
        let stack = if ids.len() <= STACK_INLINE {
            let mut buf = [FrameId(0); STACK_INLINE];
            buf[..ids.len()].copy_from_slice(ids);
            Stack::from_buf_and_len(buf, ids.len())
        } else {
            Stack::from_slice(ids)
        };
        self.segments.push(Segment {
            stack,
            duration,
            kind,
        });
        let last = self.segments.last().expect("just pushed");
        debug_assert!(
            last.stack
                .iter()
                .all(|f| (f.0 as usize) < self.frames.len())
        );
    }

    /// [`push_id_slice`](Self::push_id_slice) of the stack `prefix`
    /// followed by `map[id]` for each of `ids` (a callee's segment spliced
    /// under the caller's RPC frame, `map` taking the callee's frame ids to
    /// this path's; all checked in debug builds only). A stack that fits
    /// inline is assembled once, in the buffer the segment is made from.
    #[inline]
    pub(crate) fn push_prefixed(
        &mut self,
        prefix: &[FrameId],
        ids: &[FrameId],
        map: &[FrameId],
        duration: Duration,
        kind: SegmentKind,
    ) {
        let len = prefix.len() + ids.len();
        if len > STACK_INLINE {
            let stack = prefix
                .iter()
                .copied()
                .chain(ids.iter().map(|id| map[id.0 as usize]));
            self.push_ids(stack, len, duration, kind);
            return;
        }
        if duration.is_zero() {
            return;
        }
        let mut buf = [FrameId(0); STACK_INLINE];
        buf[..prefix.len()].copy_from_slice(prefix);
        for (b, id) in buf[prefix.len()..len].iter_mut().zip(ids) {
            *b = map[id.0 as usize];
        }
        if let Some(last) = self.segments.last_mut()
            && last.kind == kind
            && last.stack[..] == buf[..len]
        {
            last.duration = last.duration.saturating_add(duration);
            return;
        }
        debug_assert!(
            buf[..len]
                .iter()
                .all(|f| (f.0 as usize) < self.frames.len())
        );
        self.segments.push(Segment {
            stack: Stack::from_buf_and_len(buf, len),
            duration,
            kind,
        });
    }

    /// True when nothing is left to append: `duration` is zero, or the
    /// previous segment has the same stack and kind and now includes it.
    fn merge_last(&mut self, stack: &[FrameId], duration: Duration, kind: SegmentKind) -> bool {
        if duration.is_zero() {
            return true;
        }
        if let Some(last) = self.segments.last_mut()
            && last.kind == kind
            && last.stack[..] == *stack
        {
            last.duration = last.duration.saturating_add(duration);
            return true;
        }
        false
    }

    /// Append a segment given by frames rather than ids (interning them).
    pub fn push_frames(
        &mut self,
        stack: impl IntoIterator<Item = Frame>,
        duration: Duration,
        kind: SegmentKind,
    ) {
        let ids: Stack = stack.into_iter().map(|f| self.intern(f)).collect();
        self.push(ids, duration, kind);
    }

    /// Make room for `segments` more segments (computing, decoding and
    /// splicing know how many are coming; growing one at a time copied the
    /// list over and over).
    pub fn reserve(&mut self, segments: usize) {
        self.segments.reserve(segments);
    }

    /// The sum of all segment durations: the request's latency.
    pub fn total(&self) -> Duration {
        self.segments
            .iter()
            .fold(Duration::ZERO, |acc, s| acc.saturating_add(s.duration))
    }

    /// The frames of a segment's stack, root first.
    pub fn stack_frames<'a>(&'a self, seg: &'a Segment) -> impl Iterator<Item = &'a Frame> + 'a {
        seg.stack.iter().map(move |id| self.frame(*id))
    }

    /// Drop frames no segment refers to and renumber the rest in first-use
    /// order, so equal paths have equal tables.
    pub fn compact(&mut self) {
        let mut map: Vec<Option<FrameId>> = vec![None; self.frames.len()];
        let mut frames = Vec::new();
        for seg in &mut self.segments {
            for id in &mut seg.stack {
                let new = *map[id.0 as usize].get_or_insert_with(|| {
                    frames.push(self.frames.frames()[id.0 as usize].clone());
                    FrameId((frames.len() - 1) as u32)
                });
                *id = new;
            }
        }
        self.frames.rebuild(frames);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::ms;

    #[test]
    fn push_merges_equal_neighbours_and_drops_empty() {
        let mut p = CriticalPath::new();
        let a1 = p.intern(Frame::new("A", "A1"));
        let b1 = p.intern(Frame::new("B", "B1"));
        p.push(vec![a1], ms(2), SegmentKind::Busy);
        p.push(vec![a1], ms(3), SegmentKind::Busy);
        p.push(vec![a1, b1], Duration::ZERO, SegmentKind::Busy);
        p.push(vec![a1], ms(1), SegmentKind::Unattributed);
        assert_eq!(p.segments().len(), 2);
        assert_eq!(p.segments()[0].duration, ms(5));
        assert_eq!(p.total(), ms(6));
    }

    #[test]
    fn intern_is_stable_and_compact_renumbers() {
        let mut p = CriticalPath::new();
        let unused = p.intern(Frame::new("A", "unused"));
        let a1 = p.intern(Frame::new("A", "A1"));
        assert_eq!(p.intern(Frame::new("A", "A1")), a1);
        assert_ne!(unused, a1);
        p.push(vec![a1], ms(1), SegmentKind::Busy);
        p.compact();
        assert_eq!(p.frames().len(), 1);
        assert_eq!(p.segments()[0].stack[..], [FrameId(0)]);
        assert_eq!(&*p.frame(FrameId(0)).name, "A1");
    }
}
