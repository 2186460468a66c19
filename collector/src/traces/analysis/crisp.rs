//! The critical path of one trace (CRISP §5.1, Listing 1), computed on the
//! repaired times of [`skew`](crate::traces::import::skew), and its conversion into a
//! [`cpt_sdk::Record`].
//!
//! # The walk
//!
//! A node is on the path during a window `[lo, hi]` of its own span (the
//! root: its whole span). Walking backwards from `hi`:
//!
//! 1. The node's children are clipped to the window; children with nothing
//!    left (or zero length) take no part. They are ordered by end, latest
//!    first; equal ends put the earlier start (the longer child) first, and
//!    then file order.
//! 2. The first child (the *last-finishing child*, LFC) is on the path in
//!    full. The stretch between its end and `hi` is the node's own time.
//! 3. Going down the order, a child `c` is next on the path when it
//!    *happens before* the last chosen child `l`: `c.end <= l.start`
//!    (touching end-to-start counts). Children that do not happen before
//!    `l` overlapped it and are off the path.
//! 4. Clock-skew relaxation (§5.2): `c` also happens before `l` when it
//!    overlaps `l`'s start by at most the threshold (see
//!    [`OverlapThreshold`]), started before `l` started, ended before `l`
//!    ended, and no other child of the node starts or ends inside the
//!    overlap `[l.start, c.end]`. Then `c` is on the path only until
//!    `l.start` (its window is clipped; the clipped time is counted in
//!    [`Adjustments::overlap_ns`](crate::traces::import::skew::Adjustments)), so the time
//!    is never counted twice.
//! 5. Each chosen child is walked the same way over its window; the gaps
//!    between chosen children and the stretch from `lo` to the earliest one
//!    are the node's own time.
//!
//! The walk keeps its own stack (no recursion), so a 10,000-deep chain or an
//! 80,000-span trace does not overflow the thread's stack. Every nanosecond
//! of the root's window lands on exactly one node, so the path's total is
//! the root's duration.
//!
//! # Edge cases (defined here, tested in `collector/tests/traces`)
//!
//! - **equal end times**: the child that started earlier comes first and is
//!   the LFC; the other ends after the LFC's start, so it is off the path.
//! - **zero-length spans**: never on the path, never an event for step 4.
//! - **children touching end-to-start**: both on the path, nothing clipped.
//! - **a child equal to its parent**: the child covers the whole window; the
//!   parent has no own time.
//! - **children the node does not wait for** (detached: a consumer under
//!   its producer, a Jaeger `FOLLOWS_FROM` child; see
//!   [`Span::detached`](crate::traces::model::Span::detached)) are never on its
//!   path, even when they end last; the record counts them in the labels
//!   `async.subtrees` and `async.spans`. Select a consumer's operation with
//!   `--root` to get its own critical path.
//! - **own time of a client span** whose server child (another host) is on
//!   its path is network time ([`SegmentKind::Network`], counted in
//!   [`Accounting::network`](cpt_sdk::Accounting)); any other own time is
//!   busy.

use std::sync::Arc;
use std::time::Duration;

use cpt_sdk::{CriticalPath, Frame, FrameId, Record, SegmentKind, Trigger};
use rustc_hash::FxHashMap;

use crate::traces::import::skew::{Adjustments, Repaired, is_rpc_pair};
use crate::traces::model::{SpanKind, Trace};

/// How much overlap between consecutive siblings is still read as "one
/// after the other" (CRISP §5.2).
///
/// The allowance for a parent is `min(max, fraction × parent duration)`.
/// The paper uses a flat 1 ms; the open-source CRISP a fraction of the
/// parent. The minimum of both keeps the 1 ms cap for long parents and
/// stops short parents (where 1 ms is most of their time) from hiding real
/// concurrency.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OverlapThreshold {
    /// Absolute cap, ns.
    pub max_ns: i64,
    /// Fraction of the parent's duration.
    pub fraction: f64,
}

impl Default for OverlapThreshold {
    fn default() -> Self {
        OverlapThreshold {
            max_ns: 1_000_000,
            fraction: 0.01,
        }
    }
}

impl OverlapThreshold {
    /// No overlap tolerated: strict happens-before.
    pub const STRICT: OverlapThreshold = OverlapThreshold {
        max_ns: 0,
        fraction: 0.0,
    };

    /// The allowance for a parent of this duration.
    pub fn for_parent(&self, parent_ns: i64) -> i64 {
        let frac = (self.fraction * parent_ns as f64).floor();
        let frac = if frac.is_finite() && frac > 0.0 {
            frac as i64
        } else {
            0
        };
        self.max_ns.min(frac).max(0)
    }
}

/// One stretch of the path: span `span` was on it for `ns` nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Index into [`Trace::spans`].
    pub span: u32,
    /// Time on the path, ns.
    pub ns: u64,
    /// Busy or network (see the module docs).
    pub kind: SegmentKind,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    idx: u32,
    s: i64,
    e: i64,
}

#[derive(Clone, Copy, Debug)]
struct Visit {
    node: u32,
    lo: i64,
    cursor: i64,
    /// End (clipped) of the last chosen child; `None` before the LFC.
    last_end: Option<i64>,
    a: usize,
    b: usize,
    pos: usize,
    threshold: i64,
    kind: SegmentKind,
}

/// Reusable buffers for [`walk`], so that many traces on one thread do not
/// allocate per trace.
#[derive(Debug, Default)]
pub struct Scratch {
    entries: Vec<Entry>,
    starts: Vec<i64>,
    ends: Vec<i64>,
    stack: Vec<Visit>,
}

/// What the walk itself adjusted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkStats {
    /// Tolerated sibling overlaps.
    pub overlaps: u64,
    /// Time clipped by them, ns.
    pub overlap_ns: u64,
}

/// Compute the critical path under `root` (see the module docs), appending
/// its pieces to `out` in path order (request start → end).
///
/// # Panics
///
/// If `root` was dropped by the repair (a root never is).
pub fn walk(
    trace: &Trace,
    rep: &Repaired,
    root: u32,
    threshold: &OverlapThreshold,
    scratch: &mut Scratch,
    out: &mut Vec<Piece>,
) -> WalkStats {
    assert!(rep.kept[root as usize], "the walk starts at a kept span");
    let first = out.len();
    let mut stats = WalkStats::default();
    scratch.entries.clear();
    scratch.starts.clear();
    scratch.ends.clear();
    scratch.stack.clear();
    let (lo, hi) = (rep.start[root as usize], rep.end[root as usize]);
    let v = enter(trace, rep, root, lo, hi, threshold, scratch);
    scratch.stack.push(v);
    while let Some(top) = scratch.stack.last().copied() {
        let mut chosen = None;
        let mut pos = top.pos;
        while pos < top.b {
            let c = scratch.entries[pos];
            pos += 1;
            if c.e <= top.cursor {
                chosen = Some((c, c.e));
                break;
            }
            let Some(last_end) = top.last_end else {
                continue;
            };
            let overlap = c.e - top.cursor;
            if c.s < top.cursor
                && c.e < last_end
                && overlap <= top.threshold
                && events_in(scratch, top.a, top.b, top.cursor, c.e) == 2
            {
                stats.overlaps += 1;
                stats.overlap_ns += overlap as u64;
                chosen = Some((c, top.cursor));
                break;
            }
        }
        let t = scratch.stack.last_mut().expect("top exists; this is a bug");
        t.pos = pos;
        match chosen {
            Some((c, win_end)) => {
                push_piece(out, top.node, top.cursor - win_end, top.kind);
                t.cursor = c.s;
                t.last_end = Some(win_end);
                let v = enter(trace, rep, c.idx, c.s, win_end, threshold, scratch);
                scratch.stack.push(v);
            }
            None => {
                push_piece(out, top.node, top.cursor - top.lo, top.kind);
                scratch.entries.truncate(top.a);
                scratch.starts.truncate(top.a);
                scratch.ends.truncate(top.a);
                scratch.stack.pop();
            }
        }
    }
    out[first..].reverse();
    // Merge neighbours on the same span (a node's own time split only by
    // zero-length children).
    let mut w = first;
    for r in first..out.len() {
        if w > first && out[w - 1].span == out[r].span && out[w - 1].kind == out[r].kind {
            out[w - 1].ns += out[r].ns;
        } else {
            out[w] = out[r];
            w += 1;
        }
    }
    out.truncate(w);
    stats
}

fn push_piece(out: &mut Vec<Piece>, span: u32, ns: i64, kind: SegmentKind) {
    if ns > 0 {
        out.push(Piece {
            span,
            ns: ns as u64,
            kind,
        });
    }
}

/// Number of child starts and ends inside `[x, y]`.
fn events_in(scratch: &Scratch, a: usize, b: usize, x: i64, y: i64) -> usize {
    let count = |v: &[i64]| v.partition_point(|&t| t <= y) - v.partition_point(|&t| t < x);
    count(&scratch.starts[a..b]) + count(&scratch.ends[a..b])
}

fn enter(
    trace: &Trace,
    rep: &Repaired,
    node: u32,
    lo: i64,
    hi: i64,
    threshold: &OverlapThreshold,
    scratch: &mut Scratch,
) -> Visit {
    let a = scratch.entries.len();
    let mut network = false;
    for &c in trace.children(node) {
        let ci = c as usize;
        // A child the node does not wait for is never its blocker.
        if !rep.kept[ci] || trace.spans[ci].detached {
            continue;
        }
        let s = rep.start[ci].max(lo);
        let e = rep.end[ci].min(hi);
        if e > s {
            scratch.entries.push(Entry { idx: c, s, e });
            scratch.starts.push(s);
            scratch.ends.push(e);
            network |= is_rpc_pair(trace, ci);
        }
    }
    let b = scratch.entries.len();
    scratch.entries[a..b]
        .sort_unstable_by(|x, y| y.e.cmp(&x.e).then(x.s.cmp(&y.s)).then(x.idx.cmp(&y.idx)));
    scratch.starts[a..b].sort_unstable();
    scratch.ends[a..b].sort_unstable();
    let span = &trace.spans[node as usize];
    Visit {
        node,
        lo,
        cursor: hi,
        last_end: None,
        a,
        b,
        pos: a,
        threshold: threshold.for_parent(rep.duration(node)),
        kind: if network && span.kind == SpanKind::Client {
            SegmentKind::Network
        } else {
            SegmentKind::Busy
        },
    }
}

/// The frame of a span: its service and operation.
pub fn frame_of(trace: &Trace, span: u32) -> Frame {
    let s = &trace.spans[span as usize];
    Frame {
        service: s.service.clone(),
        name: s.operation.clone(),
        location: None,
    }
}

/// Build the record for the path under `root` from its pieces.
///
/// The stack of each segment is the chain of spans from `root` to the
/// piece's span, one frame each ([`frame_of`]). Network pieces are summed in
/// the accounting; the time the repair's [`Adjustments`] cut is
/// `accounting.clock_skew`, and their detail goes into labels (prefix
/// `skew.`); the trace and root span ids and start time are kept.
pub fn to_record(
    trace: &Trace,
    rep: &Repaired,
    root: u32,
    pieces: &[Piece],
    adj: &Adjustments,
) -> Record {
    let mut path = CriticalPath::new();
    // The current stack (spans and their frame ids, root first) and each of
    // its spans' depth in it. Consecutive pieces share most of their stack,
    // so each piece climbs only to the nearest span already on the stack:
    // the walk up the tree is linear in the path's moves, not its depth.
    let mut spans_on: Vec<u32> = Vec::new();
    let mut stack: Vec<FrameId> = Vec::new();
    let mut depth_of: FxHashMap<u32, usize> = FxHashMap::default();
    let mut climb: Vec<u32> = Vec::new();
    let mut network = Duration::ZERO;
    for p in pieces {
        climb.clear();
        let mut cur = p.span;
        let keep = loop {
            if let Some(&k) = depth_of.get(&cur) {
                break k + 1;
            }
            climb.push(cur);
            if cur == root {
                break 0;
            }
            match trace.spans[cur as usize].parent {
                Some(up) => cur = up,
                None => break 0,
            }
        };
        for gone in spans_on.drain(keep..) {
            depth_of.remove(&gone);
        }
        stack.truncate(keep);
        for &sp in climb.iter().rev() {
            depth_of.insert(sp, spans_on.len());
            spans_on.push(sp);
            stack.push(path.intern(frame_of(trace, sp)));
        }
        let d = Duration::from_nanos(p.ns);
        if p.kind == SegmentKind::Network {
            network += d;
        }
        path.push(stack.clone(), d, p.kind);
    }
    path.accounting.network = network;
    path.accounting.clock_skew = Duration::from_nanos(
        adj.truncated_ns
            .saturating_add(adj.dropped_ns)
            .saturating_add(adj.overlap_ns),
    );
    let r = &trace.spans[root as usize];
    let mut rec = Record::new(r.service.to_string(), Trigger::Sampled, path);
    rec.endpoint = Some(r.operation.to_string());
    let start = rep.start[root as usize];
    rec.start_unix_nanos = u64::try_from(start).ok();
    rec.request_id = Some(r.span_id.to_string());
    rec.trace_id = Some(normalize_trace_id(&trace.trace_id));
    for (k, v) in adj.labels() {
        rec.labels.insert(k.to_string(), v.to_string());
    }
    if r.error {
        rec.labels.insert("error".into(), "true".into());
    }
    let (subtrees, spans) = detached_under(trace, root);
    if subtrees > 0 {
        rec.labels
            .insert("async.subtrees".into(), subtrees.to_string());
        rec.labels.insert("async.spans".into(), spans.to_string());
    }
    rec
}

/// Under `root`, the detached children that hang off spans the root waits
/// for (consumers, `FOLLOWS_FROM` children), and how many spans their
/// subtrees hold: work the trace recorded but the root's path leaves out by
/// definition, counted so it is not lost silently.
pub fn detached_under(trace: &Trace, root: u32) -> (u64, u64) {
    let (mut subtrees, mut spans) = (0, 0);
    let mut todo = vec![root];
    let mut inner = Vec::new();
    while let Some(i) = todo.pop() {
        for &c in trace.children(i) {
            if !trace.spans[c as usize].detached {
                todo.push(c);
                continue;
            }
            subtrees += 1;
            inner.push(c);
            while let Some(d) = inner.pop() {
                spans += 1;
                inner.extend_from_slice(trace.children(d));
            }
        }
    }
    (subtrees, spans)
}

/// Lowercase hex trace ids shorter than 32 digits are left-padded with
/// zeros (W3C trace context's rule for 64-bit ids); anything else is kept.
pub fn normalize_trace_id(id: &str) -> String {
    if !id.is_empty() && id.len() <= 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        let mut s = String::with_capacity(32);
        for _ in id.len()..32 {
            s.push('0');
        }
        s.extend(id.chars().map(|c| c.to_ascii_lowercase()));
        s
    } else {
        id.to_string()
    }
}

/// Exclusive time per span on a path (the sum of its pieces), indexed like
/// [`Trace::spans`].
pub fn exclusive_by_span(trace: &Trace, pieces: &[Piece]) -> Vec<u64> {
    let mut v = vec![0u64; trace.spans.len()];
    for p in pieces {
        v[p.span as usize] += p.ns;
    }
    v
}

/// A shareable name for a span's frame, `service:operation`.
pub fn frame_key(trace: &Trace, span: u32) -> (Arc<str>, Arc<str>) {
    let s = &trace.spans[span as usize];
    (s.service.clone(), s.operation.clone())
}
