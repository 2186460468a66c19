//! The backwards walk: from a request's node graph to its [`CriticalPath`]
//! (CPT Fig. 2).
//!
//! This module is pure: it takes a [`Graph`] of [`Node`]s with their
//! timelines (in [`Duration`]s since any common origin) and returns the path.
//! The tracing layer builds the graph from spans; tests and offline tools can
//! build it by hand.
//!
//! # How the walk works
//!
//! A node's timeline runs from its creation to its end. Before its first
//! poll it is *queued*. After that, at every instant it is either *busy*
//! (it is itself running: entered, and no child of it is entered inside it
//! on the same thread) or *waiting*. Waits end with a [`Resumption`].
//!
//! The walk starts at the root's end with a cursor and moves it backwards,
//! emitting segments that tile the request exactly:
//!
//! - **busy**: the node's own time is on the path (stack: the node).
//! - **wait**: the *blocker* is the dependency whose end came last before the
//!   cursor within the wait (an explicit [`Resumption::blocker`] wins; else
//!   the child node that ended last inside the wait). The walk jumps into the
//!   blocker, whose own critical path covers the time back to the blocker's
//!   start, and then continues in the waiting node from there. Children that
//!   ended before the wait began, or that were still running when it ended,
//!   are off the path (CPT Fig. 2b, 2c).
//! - a child polled *inside* the node's busy time on the same thread (a
//!   `join!` branch, a `select!` arm) is running on the node's behalf: that
//!   slice is the child's (CPU-bound `join!` children serialise, so all of
//!   them are on the path).
//! - a wait with no blocker is **unattributed** on the waiting node, except
//!   while a blocker that the walk just left was *queued* (created, not yet
//!   polled): that time is the blocker's **queueing**. When the node's
//!   [`WaitMark`]s name what it waited on (a timer, a semaphore, a socket),
//!   the wait is a **named wait** instead: a
//!   [`Wait`](SegmentKind::Wait) leaf under the node.
//! - an RPC node with a callee outcome attached is replaced by the callee's
//!   path via [`merge::splice`] (network/undercount,
//!   overcount, blind spot).
//!
//! The segments sum to the root's latency exactly, whatever the input: times
//! are clamped into the root's lifetime, every node is jumped into at most
//! once, the walk is an explicit loop with a step budget (no recursion, so
//! hostile depth cannot overflow the stack), and whatever the budget leaves
//! is reported as unattributed time on the root.

use std::cell::Cell;
use std::ops::Range;
use std::time::Duration;

use super::merge::{self, Callee};
use super::table::FrameTable;
use super::{CriticalPath, Frame, FrameId, SegmentKind, Stack};

// The graph the walk reads; re-exported here, where these types lived
// before `path::graph` existed, so `path::compute::Graph` keeps working.
pub use super::graph::{Busy, CalleeOutcome, FrameRef, Graph, Node, NodeId, Resumption, WaitMark};

mod emit;

use emit::{Stacks, emit};

/// Stacks deeper than this keep their root-most frames; the time of the
/// folded frames is counted in [`Accounting::truncated`](super::Accounting::truncated).
pub const MAX_STACK_DEPTH: usize = 128;

/// Compute the critical path of the request rooted at `root`, which ended at
/// `end`.
///
/// The segments sum exactly to `end - root.created` (zero if `end` is before
/// the root's creation, or if `root` is not in the graph).
pub fn compute(graph: &Graph, root: NodeId, end: Duration) -> CriticalPath {
    compute_from(graph, root, end)
}

/// One node as the walk reads it: what a [`Node`] holds, borrowed, so that
/// the tracing layer can hand its own node table to the walk without first
/// building a [`Graph`] (one `Vec` of intervals per node, moved and freed).
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeView<'a> {
    pub(crate) parent: Option<NodeId>,
    pub(crate) created: Duration,
    pub(crate) first_poll: Option<Duration>,
    pub(crate) end: Option<Duration>,
    pub(crate) end_seq: u64,
    pub(crate) busy: &'a [Busy],
    /// One more busy interval (an enter still open when the request ended).
    pub(crate) open: Option<Busy>,
    pub(crate) resumptions: &'a [Resumption],
    pub(crate) runnable: &'a [(Duration, Duration)],
    pub(crate) waits: &'a [WaitMark],
    pub(crate) callee: Option<&'a CalleeOutcome>,
}

impl NodeView<'_> {
    fn busy(&self) -> impl Iterator<Item = &Busy> + '_ {
        self.busy.iter().chain(self.open.as_ref())
    }
}

/// What [`compute_from`] reads: a request's nodes and the frames they name.
pub(crate) trait Source {
    /// Number of nodes.
    fn len(&self) -> usize;
    /// Node `i` (`i < len()`).
    fn node(&self, i: usize) -> NodeView<'_>;
    /// Node `i`'s frame (what `node(i).frame` says, without the rest).
    fn frame(&self, i: usize) -> FrameRef;
    /// Node `i`'s callee outcome (what `node(i).callee` says).
    fn callee(&self, i: usize) -> Option<&CalleeOutcome>;
    /// The frames [`NodeView::frame`] refers to.
    fn frames(&self) -> &FrameTable;
}

impl Source for Graph {
    fn len(&self) -> usize {
        self.nodes.len()
    }

    #[inline]
    fn node(&self, i: usize) -> NodeView<'_> {
        let n = &self.nodes[i];
        NodeView {
            parent: n.parent,
            created: n.created,
            first_poll: n.first_poll,
            end: n.end,
            end_seq: n.end_seq,
            busy: &n.busy,
            open: None,
            resumptions: &n.resumptions,
            runnable: &n.runnable,
            waits: &n.waits,
            callee: n.callee.as_ref(),
        }
    }

    fn frame(&self, i: usize) -> FrameRef {
        self.nodes[i].frame
    }

    fn callee(&self, i: usize) -> Option<&CalleeOutcome> {
        self.nodes[i].callee.as_ref()
    }

    fn frames(&self) -> &FrameTable {
        &self.frames
    }
}

/// [`compute`] over any [`Source`].
pub(crate) fn compute_from<S: Source>(graph: &S, root: NodeId, end: Duration) -> CriticalPath {
    if root.index() >= graph.len() {
        return CriticalPath::new();
    }
    let root_node = graph.node(root.index());
    let end_ns = ns(end);
    let start_ns = ns(root_node.created).min(end_ns);
    let path = Scratch::with(|sc| {
        prepare(graph, root.index(), start_ns, end_ns, &mut sc.prep);
        walk(&sc.prep, root.index(), start_ns, end_ns, &mut sc.walk);
        emit(
            graph,
            &sc.prep.nodes,
            root.index(),
            &sc.walk.pieces,
            sc.prep.waits.len(),
            &mut sc.stacks,
        )
    });
    debug_assert_eq!(
        path.total(),
        Duration::from_nanos(end_ns - start_ns),
        "critical path must sum to the root's latency; this is a bug"
    );
    path
}

/// Working memory of [`compute`], kept per thread so that computing a
/// request's path allocates little more than the path itself: the path is
/// computed on every traced request's response path, for graphs of a few
/// nodes, where a dozen fresh vectors cost more than the walk.
#[derive(Debug, Default)]
struct Scratch {
    prep: Prepared,
    walk: WalkScratch,
    stacks: Stacks,
}

/// Vectors that grew beyond this many entries for one large request are
/// freed after it, so a thread's scratch stays small (a few hundred KiB at
/// most, whatever requests it saw). A graph that large makes the walk cost
/// far more than allocating its vectors afresh.
const SCRATCH_KEEP: usize = 4096;

thread_local! {
    static SCRATCH: Cell<Option<Box<Scratch>>> = const { Cell::new(None) };
}

impl Scratch {
    /// Run `f` with this thread's scratch, or with fresh buffers when it is
    /// in use (a nested call) or gone (thread teardown).
    fn with<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
        let mut scratch = SCRATCH
            .try_with(Cell::take)
            .ok()
            .flatten()
            .unwrap_or_default();
        let r = f(&mut scratch);
        scratch.trim();
        // Ignored when the thread-local is being destroyed.
        let _ = SCRATCH.try_with(|c| c.set(Some(scratch)));
        r
    }

    /// Free what grew too large; the rest keeps its capacity.
    fn trim(&mut self) {
        let Scratch { prep, walk, stacks } = self;
        trim(&mut prep.nodes);
        trim(&mut prep.own);
        trim(&mut prep.ends);
        trim(&mut prep.nested);
        trim(&mut prep.nested_max);
        trim(&mut prep.explicit);
        trim(&mut prep.runnable);
        trim(&mut prep.waits);
        trim(&mut prep.explicit_pairs);
        trim(&mut prep.ends_pairs);
        trim(&mut prep.nested_pairs);
        trim(&mut prep.busy);
        trim(&mut prep.carve);
        trim(&mut walk.pieces);
        trim(&mut walk.visited);
        trim(&mut walk.on_stack);
        trim(&mut walk.stack);
        trim(&mut walk.own_at);
        trim(&mut walk.nested_at);
        trim(&mut walk.ends_at);
        trim(&mut stacks.memo);
        trim(&mut stacks.arena);
        trim(&mut stacks.frames);
        trim(&mut stacks.chain);
        trim(&mut stacks.callee_map);
    }
}

fn trim<T>(v: &mut Vec<T>) {
    if v.capacity() > SCRATCH_KEEP {
        *v = Vec::new();
    }
}

/// `d` in nanoseconds, saturating (without the `u128` of `as_nanos`).
fn ns(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
}

/// A node's timeline, clamped into the root's lifetime, in nanoseconds.
/// Its interval lists are ranges into the flat arrays of [`Prepared`].
#[derive(Debug, Default, Clone)]
struct Prep {
    created: u64,
    first_poll: u64,
    end: u64,
    ended: bool,
    parent: Option<usize>,
    callee: bool,
    /// Own busy time: entered minus nested children, sorted, disjoint.
    own: Range<usize>,
    /// Ends of children that ended, sorted by end then sequence.
    child_ends: Range<usize>,
    /// Busy intervals of children nested in this node, sorted by start.
    nested: Range<usize>,
    /// Explicit resumptions with a blocker, sorted by time.
    explicit: Range<usize>,
    /// Ready-but-not-running stretches, sorted.
    runnable: Range<usize>,
    /// Wait marks, in time order.
    waits: Range<usize>,
    /// The node ran inside its parent's polls (it has nested intervals).
    polled_by_parent: bool,
}

/// Every node's timeline; flat arrays so that preparing a graph allocates a
/// handful of vectors, not a few per node (and none once the thread's
/// [`Scratch`] has grown).
#[derive(Debug, Default)]
struct Prepared {
    nodes: Vec<Prep>,
    own: Vec<(u64, u64)>,
    /// `(end, seq, child)`.
    ends: Vec<(u64, u64, usize)>,
    /// `(start, end, child)`.
    nested: Vec<(u64, u64, usize)>,
    /// Running maximum of `nested` ends within each node's range:
    /// `(end, child)` of the latest-ending interval so far.
    nested_max: Vec<(u64, usize)>,
    /// `(at, blocker)`.
    explicit: Vec<(u64, usize)>,
    /// `(woken, resumed)`.
    runnable: Vec<(u64, u64)>,
    /// `(at, wait frame or NO_WAIT)`.
    waits: Vec<(u64, u32)>,
    // Working space of `prepare`.
    explicit_pairs: Vec<(usize, (u64, usize))>,
    ends_pairs: Vec<(usize, (u64, u64, usize))>,
    nested_pairs: Vec<(usize, (u64, u64, usize))>,
    busy: Vec<(u64, u64)>,
    carve: Vec<(u64, u64)>,
}

/// Sort `(owner, item)` pairs by owner, move the items to `items`, and
/// give each owner its range (owners without items keep an empty range).
fn group<T: Ord + Copy>(
    pairs: &mut [(usize, T)],
    items: &mut Vec<T>,
    nodes: &mut [Prep],
    range: fn(&mut Prep) -> &mut Range<usize>,
) {
    sort(pairs);
    items.clear();
    items.extend(pairs.iter().map(|&(_, t)| t));
    let mut i = 0;
    while i < pairs.len() {
        let owner = pairs[i].0;
        let start = i;
        while i < pairs.len() && pairs[i].0 == owner {
            i += 1;
        }
        *range(&mut nodes[owner]) = start..i;
    }
}

#[inline(never)]
fn prepare<S: Source>(graph: &S, root: usize, start: u64, stop: u64, pr: &mut Prepared) {
    let clamp = |d: Duration| ns(d).clamp(start, stop);
    let n = graph.len();
    let Prepared {
        nodes,
        own,
        ends,
        nested,
        nested_max,
        explicit,
        runnable,
        waits,
        explicit_pairs,
        ends_pairs,
        nested_pairs,
        busy,
        carve,
    } = pr;
    nodes.clear();
    nodes.reserve(n);
    explicit_pairs.clear();
    ends_pairs.clear();
    nested_pairs.clear();
    runnable.clear();
    waits.clear();
    busy.clear();
    // One pass over the nodes: everything after it reads flat arrays.
    for i in 0..n {
        let node = graph.node(i);
        let created = clamp(node.created);
        let (end, ended) = match node.end {
            Some(e) if i != root => (clamp(e).max(created), true),
            _ => (stop.max(created), i == root),
        };
        let first_poll = node
            .first_poll
            .map_or(end, |p| clamp(p).clamp(created, end));
        let parent = node
            .parent
            .map(NodeId::index)
            .filter(|&p| p < n && p != i && i != root);
        for r in node.resumptions {
            if let Some(b) = r.blocker.map(NodeId::index).filter(|&b| b < n && b != i) {
                explicit_pairs.push((i, (clamp(r.at), b)));
            }
        }
        if let Some(p) = parent
            && ended
        {
            ends_pairs.push((p, (end, node.end_seq, i)));
        }
        // Entered intervals, clipped to the node's run (from its first
        // poll to its end); the nested ones also go to the parent.
        let mut polled_by_parent = false;
        let from = busy.len();
        for iv in node.busy() {
            let (s, e) = (clamp(iv.start).max(first_poll), clamp(iv.end).min(end));
            if s < e {
                busy.push((s, e));
                if iv.nested
                    && let Some(p) = parent
                {
                    nested_pairs.push((p, (s, e, i)));
                    polled_by_parent = true;
                }
            }
        }
        let entered = from..busy.len();
        // Ready-but-not-running stretches, clipped.
        let from = runnable.len();
        runnable.extend(
            node.runnable
                .iter()
                .map(|&(w, r)| (clamp(w).max(first_poll), clamp(r).min(end)))
                .filter(|(w, r)| w < r),
        );
        sort(&mut runnable[from..]);
        // Wait marks: a later mark at the same instant wins, so the order
        // of equal instants is kept.
        let wait_from = waits.len();
        if !node.waits.is_empty() {
            waits.extend(
                node.waits
                    .iter()
                    .map(|w| (clamp(w.at), w.on.map_or(NO_WAIT, |f| f.0))),
            );
            if !waits[wait_from..].is_sorted_by_key(|w| w.0) {
                waits[wait_from..].sort_by_key(|w| w.0);
            }
        }
        nodes.push(Prep {
            created,
            first_poll,
            end,
            ended,
            parent,
            callee: node.callee.is_some(),
            polled_by_parent,
            // Until the own time is computed below: the entered intervals.
            own: entered,
            runnable: from..runnable.len(),
            waits: wait_from..waits.len(),
            ..Prep::default()
        });
    }
    group(explicit_pairs, explicit, nodes, |p| &mut p.explicit);
    group(ends_pairs, ends, nodes, |p| &mut p.child_ends);
    group(nested_pairs, nested, nodes, |p| &mut p.nested);
    nested_max.clear();
    for p in nodes.iter() {
        let mut m = (0, usize::MAX);
        for &(_, e, c) in &nested[p.nested.clone()] {
            if e >= m.0 {
                m = (e, c);
            }
            nested_max.push(m);
        }
    }

    // Own busy time: entered intervals (merged) minus nested ones.
    own.clear();
    for p in nodes.iter_mut() {
        let entered = &mut busy[p.own.clone()];
        sort(entered);
        let len = union_slice(entered);
        let entered = &entered[..len];
        let from = own.len();
        let kids = &nested[p.nested.clone()];
        if kids.is_empty() {
            own.extend_from_slice(entered);
        } else {
            carve.clear();
            carve.extend(kids.iter().map(|&(s, e, _)| (s, e)));
            let len = union_slice(carve);
            subtract_into(entered, &carve[..len], own);
        }
        p.own = from..own.len();
    }
}

/// Sort, checking first: what the layer records is mostly in order already
/// (intervals are pushed as they happen, children after their parents), and
/// sorting those short lists was a tenth of the cost of a small graph.
#[inline(always)]
fn sort<T: Ord>(v: &mut [T]) {
    if v.len() > 1 && !v.is_sorted() {
        v.sort_unstable();
    }
}

/// Merge overlapping sorted intervals to the front of `v`; returns how
/// many there are.
fn union_slice(v: &mut [(u64, u64)]) -> usize {
    let mut w = 0;
    for r in 0..v.len() {
        let (s, e) = v[r];
        if w > 0 && s <= v[w - 1].1 {
            v[w - 1].1 = v[w - 1].1.max(e);
        } else {
            v[w] = (s, e);
            w += 1;
        }
    }
    w
}

/// Append `a` minus `b` (both sorted and disjoint) to `out`.
fn subtract_into(a: &[(u64, u64)], b: &[(u64, u64)], out: &mut Vec<(u64, u64)>) {
    let mut j = 0;
    for &(s, e) in a {
        let mut s = s;
        while j < b.len() && b[j].1 <= s {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].0 < e {
            if b[k].0 > s {
                out.push((s, b[k].0));
            }
            s = s.max(b[k].1);
            k += 1;
        }
        if s < e {
            out.push((s, e));
        }
    }
}

/// No wait frame (a [`WaitMark`] with `on: None`).
const NO_WAIT: u32 = u32::MAX;

/// What the walk found, latest first.
#[derive(Clone, Copy, Debug)]
enum Piece {
    Seg {
        node: usize,
        dur: u64,
        kind: SegmentKind,
        /// For an unattributed wait: the wait frame naming it, or [`NO_WAIT`].
        wait: u32,
    },
    Splice {
        node: usize,
        observed: u64,
    },
}

#[derive(Debug)]
struct WalkFrame {
    node: usize,
    /// The walk may not go below this in this node (inherited floor).
    limit: u64,
    /// A blocker the walk left while it was queued: `(node, created)`.
    queued: Option<(usize, u64)>,
}

/// The walk's state; `pieces` is its result.
#[derive(Debug, Default)]
struct WalkScratch {
    pieces: Vec<Piece>,
    visited: Vec<bool>,
    on_stack: Vec<bool>,
    stack: Vec<WalkFrame>,
    /// Per node: where the cursor last fell in its own busy intervals and
    /// in its nested children's intervals (see [`back_to`]).
    own_at: Vec<u32>,
    nested_at: Vec<u32>,
    /// Per node: where the cursor last fell in its children's ends.
    ends_at: Vec<u32>,
}

/// `v.partition_point(pred)`, searching back from `*at`, the answer for an
/// earlier cursor, and leaving the answer there. The cursor never moves
/// forward, so the points only move back: scanning back costs the length of
/// the list over the whole walk, where a binary search at every step cost a
/// third of the walk over a long request.
fn back_to<T>(v: &[T], at: &mut u32, pred: impl Fn(&T) -> bool) -> usize {
    let mut k = (*at as usize).min(v.len());
    while k > 0 && !pred(&v[k - 1]) {
        k -= 1;
    }
    debug_assert_eq!(k, v.partition_point(&pred), "the cursor moved forward");
    *at = k as u32;
    k
}

#[inline(never)]
fn walk(pr: &Prepared, root: usize, start: u64, stop: u64, ws: &mut WalkScratch) {
    let prep = &pr.nodes[..];
    let WalkScratch {
        pieces,
        visited,
        on_stack,
        stack,
        own_at,
        nested_at,
        ends_at,
    } = ws;
    pieces.clear();
    visited.clear();
    visited.resize(prep.len(), false);
    on_stack.clear();
    on_stack.resize(prep.len(), false);
    visited[root] = true;
    on_stack[root] = true;
    stack.clear();
    stack.push(WalkFrame {
        node: root,
        limit: start,
        queued: None,
    });
    own_at.clear();
    own_at.resize(prep.len(), u32::MAX);
    nested_at.clear();
    nested_at.resize(prep.len(), u32::MAX);
    ends_at.clear();
    ends_at.resize(prep.len(), u32::MAX);
    let mut cursor = stop;
    let work: usize = pr.own.len()
        + pr.nested.len()
        + pr.ends.len()
        + pr.explicit.len()
        + pr.runnable.len()
        + 2 * prep.len();
    let mut budget = work.saturating_mul(8).saturating_add(1024);

    let seg = |pieces: &mut Vec<Piece>, node, lo: u64, hi: u64, kind| {
        if hi > lo {
            pieces.push(Piece::Seg {
                node,
                dur: hi - lo,
                kind,
                wait: NO_WAIT,
            });
        }
    };

    while let Some(top) = stack.last_mut() {
        let n = top.node;
        let p = &prep[n];
        // The node's lists are sliced where first needed: most steps emit a
        // busy segment and need only the first two.
        let floor = p.created.max(top.limit);
        if cursor <= floor || budget == 0 {
            if budget == 0 {
                // Give up on detail; keep the total exact.
                seg(pieces, root, start, cursor, SegmentKind::Unattributed);
                cursor = start;
                break;
            }
            on_stack[n] = false;
            stack.pop();
            continue;
        }
        budget -= 1;
        let t = cursor;

        // Beyond the node's end (defensive; jumps clamp first).
        if t > p.end {
            let lo = p.end.max(floor);
            seg(pieces, n, lo, t, SegmentKind::Unattributed);
            cursor = lo;
            continue;
        }

        let explicit = &pr.explicit[p.explicit.clone()];
        // Queued: created, not yet polled.
        if t <= p.first_poll {
            if let Some(&(_, b)) = latest_in(explicit, floor, t, |e| e.0)
                .filter(|&&(_, b)| eligible(b, visited, on_stack, prep))
            {
                let be = prep[b].end.min(t).max(floor);
                seg(pieces, n, be, t, SegmentKind::Queueing);
                cursor = be;
                jump(stack, pieces, visited, on_stack, prep, b, &mut cursor);
                continue;
            }
            if stack.len() == 1 {
                seg(pieces, n, floor, t, SegmentKind::Queueing);
                cursor = floor;
            } else {
                let q = (n, floor);
                on_stack[n] = false;
                stack.pop();
                if let Some(parent) = stack.last_mut() {
                    parent.queued = Some(q);
                }
            }
            continue;
        }

        // Own busy time.
        let own = &pr.own[p.own.clone()];
        let k = back_to(own, &mut own_at[n], |iv| iv.0 < t);
        let g0 = if k > 0 {
            let (s, e) = own[k - 1];
            if e >= t {
                let lo = s.max(floor);
                seg(pieces, n, lo, t, SegmentKind::Busy);
                cursor = lo;
                continue;
            }
            e.max(p.first_poll)
        } else {
            p.first_poll
        };

        let g0 = g0.max(floor);
        let (nested, child_ends) = (&pr.nested[p.nested.clone()], &pr.ends[p.child_ends.clone()]);

        // Waiting since g0. Explicit blocker, or the child that ended last
        // (only events above the floor can explain time above it). An
        // explicit blocker need not have ended: a task that answered a
        // channel and went on is what the wait was on up to the answer.
        let explicit = latest_in(explicit, g0, t, |e| e.0)
            .filter(|&&(_, b)| !visited[b] && !on_stack[b])
            .copied();
        let inferred = {
            let hi = back_to(child_ends, &mut ends_at[n], |e| e.0 <= t);
            child_ends[..hi]
                .iter()
                .rev()
                .take_while(|e| e.0 > g0)
                .find(|e| eligible(e.2, visited, on_stack, prep))
                .map(|e| (e.0, e.2))
        };
        let blocker = match (explicit, inferred) {
            (Some(x), Some(c)) => Some(if c.0 > x.0 { c } else { x }),
            (x, c) => x.or(c),
        };
        // The node was not waiting on a dependency but its thread was busy
        // elsewhere: it was ready to run (woken, not yet polled), or it is
        // polled by its parent and the parent was still in the same poll
        // (running its own code or a sibling, e.g. after a `yield_now`).
        // That time belongs to what the parent ran, else it is queueing.
        let b_at = blocker.map_or(0, |b| b.0);
        let runnable = &pr.runnable[p.runnable.clone()];
        let rk = runnable.partition_point(|iv| iv.0 < t);
        let ready = (rk > 0 && runnable[rk - 1].1 >= t).then(|| runnable[rk - 1].0);
        if let Some(par) = p
            .parent
            .filter(|_| t > b_at && (ready.is_some() || p.polled_by_parent))
        {
            let lo_w = g0.max(b_at).max(ready.unwrap_or(0));
            let pn = &pr.nested[prep[par].nested.clone()];
            let j = back_to(pn, &mut nested_at[par], |iv| iv.0 < t);
            let pown = &pr.own[prep[par].own.clone()];
            let k = back_to(pown, &mut own_at[par], |iv| iv.0 < t);
            if lo_w < t {
                if j > 0 {
                    let (s, e, c) = pn[j - 1];
                    if e >= t && c != n && !on_stack[c] {
                        on_stack[c] = true;
                        stack.push(WalkFrame {
                            node: c,
                            limit: s.max(lo_w),
                            queued: None,
                        });
                        continue;
                    }
                }
                if k > 0 && pown[k - 1].1 >= t {
                    let lo = pown[k - 1].0.max(lo_w);
                    seg(pieces, par, lo, t, SegmentKind::Busy);
                    cursor = lo;
                    continue;
                }
            }
            // Nothing of the parent's ran at the cursor: stop at its latest
            // activity before the cursor.
            let sibling_end =
                latest_end_before(pn, &pr.nested_max[prep[par].nested.clone()], j, t, Some(n));
            let own_end = if k > 0 { pown[k - 1].1.min(t) } else { 0 };
            let parent_end = sibling_end.max(own_end);
            if ready.is_some() && lo_w < t {
                let lo = lo_w.max(parent_end);
                seg(pieces, n, lo, t, SegmentKind::Queueing);
                cursor = lo;
                continue;
            }
            if parent_end > b_at.max(g0) && parent_end < t {
                // Plain wait down to the parent's last activity, then look again.
                let nested_end = latest_end_before(
                    nested,
                    &pr.nested_max[p.nested.clone()],
                    back_to(nested, &mut nested_at[n], |iv| iv.0 < t),
                    t,
                    None,
                );
                let lo = parent_end.max(nested_end).max(floor);
                unattributed(pieces, top, n, lo, t, &pr.waits[p.waits.clone()]);
                cursor = lo;
                continue;
            }
        }

        if let Some((at, b)) = blocker
            && at == t
        {
            let be = prep[b].end.min(t).max(floor);
            unattributed(pieces, top, n, be, t, &pr.waits[p.waits.clone()]);
            cursor = be;
            jump(stack, pieces, visited, on_stack, prep, b, &mut cursor);
            continue;
        }

        // A child polled inside this node's poll, on its behalf.
        let j = back_to(nested, &mut nested_at[n], |iv| iv.0 < t);
        if j > 0 {
            let (s, e, c) = nested[j - 1];
            if e >= t && !on_stack[c] {
                on_stack[c] = true;
                let limit = s.max(top.limit);
                stack.push(WalkFrame {
                    node: c,
                    limit,
                    queued: None,
                });
                continue;
            }
        }

        // Unattributed down to the latest event before the cursor.
        let nested_end = latest_end_before(nested, &pr.nested_max[p.nested.clone()], j, t, None);
        let lo = g0
            .max(blocker.map_or(0, |b| b.0))
            .max(nested_end)
            .max(floor);
        unattributed(pieces, top, n, lo, t, &pr.waits[p.waits.clone()]);
        cursor = lo;
    }
    if cursor > start {
        seg(pieces, root, start, cursor, SegmentKind::Unattributed);
    }
}

/// The latest end before `t` among `nested[..j]` (skipping `except`'s
/// intervals), or 0. `max` is the running maximum of `nested`'s ends: when
/// the latest-ending interval so far already qualifies it is the answer, and
/// the scan (quadratic over a long walk) is only a fallback.
fn latest_end_before(
    nested: &[(u64, u64, usize)],
    max: &[(u64, usize)],
    j: usize,
    t: u64,
    except: Option<usize>,
) -> u64 {
    if j == 0 {
        return 0;
    }
    let (e, c) = max[j - 1];
    if e < t && Some(c) != except {
        return e;
    }
    nested[..j]
        .iter()
        .filter(|iv| Some(iv.2) != except && iv.1 < t)
        .map(|iv| iv.1)
        .max()
        .unwrap_or(0)
}

fn eligible(b: usize, visited: &[bool], on_stack: &[bool], prep: &[Prep]) -> bool {
    !visited[b] && !on_stack[b] && prep[b].ended
}

/// Emit a wait of `n` over `(lo, hi]`: the part after a queued blocker's
/// creation is that blocker's queueing, the rest unattributed on `n`.
///
/// `marks` (the node's `(at, wait frame)`, in time order) name the wait:
/// each stretch after a mark is named by it (a node that stopped and went
/// on waiting in the same instant, as under a paused clock, has several
/// marks inside one wait).
#[inline(always)]
fn unattributed(
    pieces: &mut Vec<Piece>,
    top: &mut WalkFrame,
    n: usize,
    lo: u64,
    hi: u64,
    marks: &[(u64, u32)],
) {
    if hi <= lo {
        return;
    }
    let mut hi = hi;
    if let Some((q, since)) = top.queued {
        let mid = since.max(lo);
        if hi > mid {
            pieces.push(Piece::Seg {
                node: q,
                dur: hi - mid,
                kind: SegmentKind::Queueing,
                wait: NO_WAIT,
            });
            hi = mid;
        }
        if lo <= since {
            top.queued = None;
        }
    }
    if marks.is_empty() {
        // No named waits on this node (always so without them): one piece.
        if hi > lo {
            pieces.push(Piece::Seg {
                node: n,
                dur: hi - lo,
                kind: SegmentKind::Unattributed,
                wait: NO_WAIT,
            });
        }
        return;
    }
    // Latest first: from the last mark before `hi` back to `lo`.
    let mut k = marks.partition_point(|m| m.0 < hi);
    while hi > lo {
        let (from, wait) = match k.checked_sub(1) {
            Some(i) => (marks[i].0.max(lo), marks[i].1),
            None => (lo, NO_WAIT),
        };
        if hi > from {
            pieces.push(Piece::Seg {
                node: n,
                dur: hi - from,
                kind: if wait == NO_WAIT {
                    SegmentKind::Unattributed
                } else {
                    SegmentKind::Wait
                },
                wait,
            });
        }
        hi = from;
        k = k.saturating_sub(1);
        if k == 0 && hi > lo {
            // Before the first mark: nothing names it.
            pieces.push(Piece::Seg {
                node: n,
                dur: hi - lo,
                kind: SegmentKind::Unattributed,
                wait: NO_WAIT,
            });
            break;
        }
    }
}

/// Jump into blocker `b` at the cursor (which is at or before `b`'s end).
/// An RPC node with a callee outcome is not walked: the callee's path
/// covers it (spliced later).
fn jump(
    stack: &mut Vec<WalkFrame>,
    pieces: &mut Vec<Piece>,
    visited: &mut [bool],
    on_stack: &mut [bool],
    prep: &[Prep],
    b: usize,
    cursor: &mut u64,
) {
    visited[b] = true;
    let limit = stack.last().map_or(0, |f| f.limit);
    if prep[b].callee {
        let lo = prep[b].created.max(limit).min(*cursor);
        if *cursor > lo {
            pieces.push(Piece::Splice {
                node: b,
                observed: *cursor - lo,
            });
        }
        *cursor = lo;
        return;
    }
    on_stack[b] = true;
    stack.push(WalkFrame {
        node: b,
        limit,
        queued: None,
    });
}

fn latest_le<T>(v: &[T], t: u64, key: impl Fn(&T) -> u64) -> Option<&T> {
    let k = v.partition_point(|e| key(e) <= t);
    k.checked_sub(1).map(|i| &v[i])
}

fn latest_in<T>(v: &[T], lo: u64, hi: u64, key: impl Fn(&T) -> u64) -> Option<&T> {
    latest_le(v, hi, &key).filter(|e| key(e) > lo)
}

#[cfg(test)]
mod tests;
