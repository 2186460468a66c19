//! Per-request and per-span state.
//!
//! # How the recording works
//!
//! A traced request is one [`Request`], shared by `Arc` between the spans
//! that are its nodes. Each such span carries a [`NodeState`] in its registry
//! extensions: the request and the node's index in the request's node table.
//! Nothing is keyed by span id (the registry reuses ids after close).
//!
//! The node table lives behind the request's mutex. Enter and exit append to
//! it (busy intervals); close stamps the node's end; the root's end (finish,
//! or close) takes the table out, hands it to
//! [`compute`]. Events for a request that already finished find an empty
//! table and do nothing.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::Duration;

use std::hash::BuildHasher;

use rustc_hash::{FxBuildHasher, FxHashMap};
use smallvec::SmallVec;
use tracing::Metadata;

use crate::path::compute;
use crate::path::compute::NodeView;
use crate::path::graph::{Busy, CalleeOutcome, FrameRef, NodeId, Resumption, WaitMark};
use crate::path::{CriticalPath, Frame, FrameTable, Location};
use crate::record::{Labels, Record};
use crate::trigger::Trigger;

mod marks;

use marks::Waits;
pub(crate) use marks::WakeSource;

/// Nodes per request beyond this are not recorded (their spans are ignored).
pub(crate) const MAX_NODES: usize = 1 << 16;
/// Busy intervals per node beyond this extend the last one.
pub(crate) const MAX_BUSY: usize = 1 << 12;

/// The extension a traced span carries: which request, which node.
#[derive(Clone, Debug)]
pub(crate) struct NodeState {
    pub(crate) request: Arc<Request>,
    pub(crate) node: NodeId,
}

/// One traced request.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) trigger: Trigger,
    pub(crate) service: Arc<str>,
    pub(crate) endpoint: Option<String>,
    pub(crate) trace_id: Option<String>,
    pub(crate) request_id: Option<String>,
    pub(crate) emit_record: bool,
    pub(crate) start_unix_nanos: u64,
    pub(crate) labels: Mutex<Labels>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    nodes: Vec<LiveNode>,
    /// Exit counter: orders exits at equal clock readings.
    seq: u64,
    finished: bool,
}

#[derive(Debug)]
struct LiveNode {
    parent: Option<NodeId>,
    meta: &'static Metadata<'static>,
    name: Option<Arc<str>>,
    created: Duration,
    first_poll: Option<Duration>,
    last_exit: Option<Duration>,
    exit_seq: u64,
    cancelled: bool,
    closed: Option<Duration>,
    /// Inline for the usual span entered once: no allocation per node.
    busy: SmallVec<[Busy; 1]>,
    /// The outermost enter in progress: start, thread, nested.
    open: Option<(Duration, u32, bool)>,
    depth: u32,
    resumptions: Vec<Resumption>,
    next_blocker: Option<NodeId>,
    callee: Option<Box<CalleeOutcome>>,
    /// Earliest wake since the last exit (set only by `task::Tracked`).
    woken: Option<Duration>,
    /// Woken while running (a self-wake, `yield_now`): runnable at exit.
    woken_running: bool,
    /// `(woken, resumed)`: ready to run but not running.
    runnable: Vec<(Duration, Duration)>,
    /// Woken from outside any span (the runtime's drivers) since it last ran.
    woken_by_runtime: bool,
    /// What its waits were on, made at its first named wait or tokio
    /// resource polled: most nodes have none, and carry one pointer.
    waits: Option<Box<Waits>>,
}

impl LiveNode {
    fn new(
        parent: Option<NodeId>,
        meta: &'static Metadata<'static>,
        name: Option<Arc<str>>,
        now: Duration,
    ) -> LiveNode {
        LiveNode {
            parent,
            meta,
            name,
            created: now,
            first_poll: None,
            last_exit: None,
            exit_seq: 0,
            cancelled: false,
            closed: None,
            busy: SmallVec::new(),
            open: None,
            depth: 0,
            resumptions: Vec::new(),
            next_blocker: None,
            callee: None,
            woken: None,
            woken_running: false,
            runnable: Vec::new(),
            woken_by_runtime: false,
            waits: None,
        }
    }
}

/// A small per-thread token telling threads apart (no `Thread` handle clone).
pub(crate) fn thread_token() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    thread_local! {
        static TOKEN: Cell<u32> = const { Cell::new(0) };
    }
    TOKEN.with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        let v = NEXT.fetch_add(1, Ordering::Relaxed).max(1);
        t.set(v);
        v
    })
}

/// The name and source location of a callsite's frame, made once per
/// callsite for the life of the process (callsites are static and finite), so
/// a request's frames cost reference counts, not string copies.
fn callsite_frame(meta: &'static Metadata<'static>) -> (Arc<str>, Option<Location>) {
    type Cache = RwLock<FxHashMap<usize, (Arc<str>, Option<Location>)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Cache::default);
    let key = meta as *const Metadata<'static> as usize;
    if let Some(f) = cache.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return f.clone();
    }
    // Helper spans (target "cpt") would all point into this crate.
    let location = match (meta.file(), meta.line(), meta.target() == "cpt") {
        (Some(file), Some(line), false) => Some(Location {
            file: Arc::from(file),
            line,
        }),
        _ => None,
    };
    let f = (Arc::<str>::from(meta.name()), location);
    cache
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_insert(f)
        .clone()
}

/// Node tables a request may take: a finished request's emptied table
/// (its capacity), kept per thread so that a request does not regrow its
/// table from nothing, copying its nodes at each doubling.
const SPARE_TABLES: usize = 4;
/// Tables larger than this are freed, not kept.
const SPARE_CAPACITY: usize = 1024;

thread_local! {
    static SPARE: RefCell<Vec<Vec<LiveNode>>> = const { RefCell::new(Vec::new()) };
}

fn spare_nodes() -> Vec<LiveNode> {
    SPARE
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| Vec::with_capacity(8))
}

fn recycle_nodes(mut nodes: Vec<LiveNode>) {
    let _ = SPARE_BUSY.try_with(|spare| {
        let mut spare = spare.borrow_mut();
        for n in &mut nodes {
            if spare.len() >= SPARE_BUSY_LISTS {
                break;
            }
            if n.busy.spilled() && n.busy.capacity() <= SPARE_BUSY_CAPACITY {
                let mut list = std::mem::take(&mut n.busy).into_vec();
                list.clear();
                spare.push(list);
            }
        }
    });
    nodes.clear();
    if nodes.capacity() == 0 || nodes.capacity() > SPARE_CAPACITY {
        return;
    }
    let _ = SPARE.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_TABLES {
            s.push(nodes);
        }
    });
}

/// Busy lists (of nodes entered more than once) a thread keeps for the next
/// nodes that need one, so that a node polled a few times takes a list
/// from here instead of allocating and regrowing one.
const SPARE_BUSY_LISTS: usize = 64;
/// Busy lists longer than this are freed, not kept.
const SPARE_BUSY_CAPACITY: usize = 64;
/// A new busy list's room: most nodes are polled fewer times.
const FIRST_BUSY_CAPACITY: usize = 8;

thread_local! {
    static SPARE_BUSY: RefCell<Vec<Vec<Busy>>> = const { RefCell::new(Vec::new()) };
}

/// Move a full inline busy list to the heap: a kept list if this thread has
/// one, else a new one with room for [`FIRST_BUSY_CAPACITY`] intervals.
#[cold]
fn spill_busy(busy: &mut SmallVec<[Busy; 1]>) {
    let mut list = SPARE_BUSY
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default();
    list.reserve(FIRST_BUSY_CAPACITY.max(busy.len() + 1));
    list.extend(busy.drain(..));
    // The list has more room than the inline buffer: adopted, not copied.
    *busy = SmallVec::from_vec(list);
}

/// What the root's end produced.
#[derive(Clone, Debug)]
pub(crate) struct Outcome {
    pub(crate) path: CriticalPath,
    pub(crate) latency: Duration,
}

/// Everything `begin` knows about a request.
#[derive(Debug)]
pub(crate) struct RequestInit {
    pub(crate) trigger: Trigger,
    pub(crate) service: Arc<str>,
    pub(crate) name: Option<Arc<str>>,
    pub(crate) endpoint: Option<String>,
    pub(crate) trace_id: Option<String>,
    pub(crate) request_id: Option<String>,
    pub(crate) emit_record: bool,
    pub(crate) labels: Labels,
    pub(crate) start_unix_nanos: u64,
}

impl Request {
    /// A request whose root node is created now (and entered now if
    /// `entered`).
    pub(crate) fn new(
        init: RequestInit,
        meta: &'static Metadata<'static>,
        now: Duration,
        entered: bool,
    ) -> Arc<Request> {
        let mut root = LiveNode::new(None, meta, init.name, now);
        if entered {
            root.first_poll = Some(now);
            root.open = Some((now, thread_token(), false));
            root.depth = 1;
        }
        Arc::new(Request {
            trigger: init.trigger,
            service: init.service,
            endpoint: init.endpoint,
            trace_id: init.trace_id,
            request_id: init.request_id,
            emit_record: init.emit_record,
            start_unix_nanos: init.start_unix_nanos,
            labels: Mutex::new(init.labels),
            state: Mutex::new(State {
                nodes: {
                    let mut nodes = spare_nodes();
                    nodes.push(root);
                    nodes
                },
                seq: 0,
                finished: false,
            }),
        })
    }

    /// The root node's id.
    pub(crate) fn root() -> NodeId {
        NodeId::from_index(0)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn labels(&self) -> MutexGuard<'_, Labels> {
        self.labels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add a child node of `parent` created now.
    pub(crate) fn add_child(
        &self,
        parent: NodeId,
        meta: &'static Metadata<'static>,
        name: Option<Arc<str>>,
        now: Duration,
    ) -> Option<NodeId> {
        let mut st = self.state();
        if st.finished || st.nodes.len() >= MAX_NODES {
            return None;
        }
        st.nodes.push(LiveNode::new(Some(parent), meta, name, now));
        Some(NodeId::from_index(st.nodes.len() - 1))
    }

    pub(crate) fn enter(&self, node: NodeId, now: Duration) {
        let token = thread_token();
        let mut st = self.state();
        let parent_here = st
            .nodes
            .get(node.index())
            .and_then(|n| n.parent)
            .and_then(|p| st.nodes.get(p.index()))
            .is_some_and(|p| p.open.is_some_and(|o| o.1 == token));
        let Some(n) = st.nodes.get_mut(node.index()) else {
            return;
        };
        n.depth += 1;
        if n.depth > 1 {
            return;
        }
        if n.first_poll.is_none() {
            n.first_poll = Some(now);
        }
        if let Some(w) = n.woken.take()
            && w < now
        {
            n.runnable.push((w, now));
        }
        if let Some(b) = n.next_blocker.take() {
            n.resumptions.push(Resumption {
                at: now,
                blocker: Some(b),
            });
        }
        if std::mem::take(&mut n.woken_by_runtime) {
            n.mark_io();
        }
        n.open = Some((now, token, parent_here));
    }

    pub(crate) fn exit(&self, node: NodeId, now: Duration) {
        let mut st = self.state();
        st.seq += 1;
        let seq = st.seq;
        let Some(n) = st.nodes.get_mut(node.index()) else {
            return;
        };
        n.depth = n.depth.saturating_sub(1);
        if n.depth > 0 {
            return;
        }
        if let Some((start, _, nested)) = n.open.take() {
            if n.busy.len() >= MAX_BUSY {
                if let Some(last) = n.busy.last_mut() {
                    last.end = now;
                }
            } else {
                if !n.busy.spilled() && n.busy.len() == n.busy.capacity() {
                    spill_busy(&mut n.busy);
                }
                n.busy.push(Busy {
                    start,
                    end: now,
                    nested,
                });
            }
            n.mark_exit(now);
            n.last_exit = Some(now);
            n.exit_seq = seq;
            if std::mem::take(&mut n.woken_running) {
                n.woken = Some(now);
            }
        }
    }

    /// The node's span closed; `now` is read only if it never ran (a node
    /// that ran ends at its last exit).
    pub(crate) fn close(&self, node: NodeId, now: impl FnOnce() -> Duration) {
        let mut st = self.state();
        if let Some(n) = st.nodes.get_mut(node.index()) {
            n.closed = Some(if n.last_exit.is_some() {
                Duration::ZERO
            } else {
                now()
            });
        }
    }

    /// The node's future was dropped before completing: it can never be a
    /// blocker.
    pub(crate) fn cancel(&self, node: NodeId) {
        let mut st = self.state();
        if let Some(n) = st.nodes.get_mut(node.index()) {
            n.cancelled = true;
        }
    }

    /// The next time `node` resumes (or first runs), it was blocked on `blocker`.
    pub(crate) fn note_blocker(&self, node: NodeId, blocker: NodeId) {
        let mut st = self.state();
        if let Some(n) = st.nodes.get_mut(node.index()) {
            n.next_blocker = Some(blocker);
        }
    }

    pub(crate) fn set_callee(&self, node: NodeId, outcome: CalleeOutcome) -> bool {
        let mut st = self.state();
        match st.nodes.get_mut(node.index()) {
            Some(n) => {
                n.callee = Some(Box::new(outcome));
                true
            }
            None => false,
        }
    }

    /// True once the request finished.
    pub(crate) fn is_finished(&self) -> bool {
        self.state().finished
    }

    /// Drop a request that never became visible.
    pub(crate) fn abandon(&self) {
        let mut st = self.state();
        st.finished = true;
        st.nodes.clear();
    }

    /// End the request now (once), leaving the path to compute: what
    /// happens to its nodes from here on is not recorded.
    pub(crate) fn end(&self, now: Duration) -> Option<Ended> {
        let mut st = self.state();
        if st.finished {
            return None;
        }
        st.finished = true;
        Some(Ended {
            nodes: std::mem::take(&mut st.nodes),
            now,
        })
    }
}

/// A request that ended and whose path is not computed yet.
#[derive(Debug)]
pub(crate) struct Ended {
    nodes: Vec<LiveNode>,
    now: Duration,
}

impl Ended {
    /// Compute the path of `request`, which ended as `self`. The walk reads
    /// the node table in place ([`compute::Source`]): no `Graph` is built,
    /// so no interval list is moved or freed per node.
    pub(crate) fn outcome(self, request: &Request) -> Outcome {
        FrameCache::with(|cache| self.outcome_in(request, cache))
    }

    fn outcome_in(&self, request: &Request, cache: &mut FrameCache) -> Outcome {
        let service = cache.service_slot(&request.service);
        let mut refs: SmallVec<[FrameRef; 64]> = SmallVec::with_capacity(self.nodes.len());
        // A request names a few callsites: they are found by a scan first
        // (no hashing), then in the thread's cache, which knows every frame
        // this thread made before with its hash.
        let mut few: SmallVec<[(usize, FrameRef); FEW_CALLSITES]> = SmallVec::new();
        for n in &self.nodes {
            let frame = match &n.name {
                Some(name) => FrameRef::new(cache.named(n.meta, service, &request.service, name)),
                None => {
                    let key = n.meta as *const Metadata<'static> as usize;
                    if let Some(&(_, r)) = few.iter().rev().find(|e| e.0 == key) {
                        r
                    } else {
                        let r = FrameRef::new(cache.callsite(n.meta, service, &request.service));
                        if few.len() < FEW_CALLSITES {
                            few.push((key, r));
                        }
                        r
                    }
                }
            };
            refs.push(frame);
        }
        // Wait marks, with their sites as frames of the cache's table.
        let (marks, ranges) = marks::wait_marks(&self.nodes, cache, service, &request.service);
        let live = LiveGraph {
            nodes: &self.nodes,
            refs: &refs,
            frames: cache.table(),
            now: self.now,
            marks: &marks,
            ranges: &ranges,
        };
        let path = compute::compute_from(&live, Request::root(), self.now);
        let latency = path.total();
        Outcome { path, latency }
    }
}

/// Callsites a request's frames are looked up among by a scan.
const FEW_CALLSITES: usize = 16;

/// Frames a thread's [`FrameCache`] keeps; beyond this (many dynamic names)
/// it starts over before the next request.
const CACHE_FRAMES: usize = 1024;
/// Services a thread's [`FrameCache`] tells apart before it starts over.
const CACHE_SERVICES: usize = 16;

/// The frames a thread's finished requests named, so that a request's nodes
/// find their frames (and the frames' hashes) without building, hashing or
/// comparing a [`Frame`] seen before, and without a per-request frame table:
/// the walk reads frame ids of [`FrameCache::table`].
///
/// Keys: the callsite (`&'static Metadata`, stable for the process), the
/// service (a slot in `services`, found by pointer and then by content),
/// and for a dynamically named node (`cpt.name`) the name, by its hash and
/// then its content. The table interns, so two keys naming equal frames
/// share an id.
#[derive(Debug, Default)]
pub(crate) struct FrameCache {
    table: FrameTable,
    services: SmallVec<[Arc<str>; 4]>,
    /// `(callsite, service slot)` -> frame id in `table`.
    by_callsite: FxHashMap<(usize, u32), u32>,
    /// `(callsite, service slot, name hash)` -> frame id in `table`.
    by_name: FxHashMap<(usize, u32, u64), u32>,
    /// `(wait site, service slot)` -> frame id in `table`.
    by_wait: FxHashMap<(usize, u32), u32>,
}

thread_local! {
    static FRAME_CACHE: Cell<Option<Box<FrameCache>>> = const { Cell::new(None) };
}

impl FrameCache {
    /// Run `f` with this thread's cache, or with a fresh one when it is in
    /// use (a nested call) or gone (thread teardown).
    pub(crate) fn with<R>(f: impl FnOnce(&mut FrameCache) -> R) -> R {
        let mut cache = FRAME_CACHE
            .try_with(Cell::take)
            .ok()
            .flatten()
            .unwrap_or_default();
        if cache.table.len() > CACHE_FRAMES || cache.services.len() > CACHE_SERVICES {
            *cache = FrameCache::default();
        }
        let r = f(&mut cache);
        let _ = FRAME_CACHE.try_with(|c| c.set(Some(cache)));
        r
    }

    /// The slot of `service` (added if new).
    pub(crate) fn service_slot(&mut self, service: &Arc<str>) -> u32 {
        let i = match self
            .services
            .iter()
            .position(|s| Arc::ptr_eq(s, service) || **s == **service)
        {
            Some(i) => i,
            None => {
                self.services.push(service.clone());
                self.services.len() - 1
            }
        };
        i as u32
    }

    /// The frame id of callsite `meta` in the service of `slot` (`service`).
    pub(crate) fn callsite(
        &mut self,
        meta: &'static Metadata<'static>,
        slot: u32,
        service: &Arc<str>,
    ) -> u32 {
        let key = (meta as *const Metadata<'static> as usize, slot);
        if let Some(&id) = self.by_callsite.get(&key) {
            return id;
        }
        let (name, location) = callsite_frame(meta);
        let id = self.table.intern(Frame {
            service: service.clone(),
            name,
            location,
        });
        self.by_callsite.insert(key, id);
        id
    }

    /// The frame id of a node of callsite `meta` named `name` in the
    /// service of `slot` (`service`).
    pub(crate) fn named(
        &mut self,
        meta: &'static Metadata<'static>,
        slot: u32,
        service: &Arc<str>,
        name: &Arc<str>,
    ) -> u32 {
        let key = (
            meta as *const Metadata<'static> as usize,
            slot,
            FxBuildHasher.hash_one(&**name),
        );
        if let Some(&id) = self.by_name.get(&key)
            && *self.table.frames()[id as usize].name == **name
        {
            return id;
        }
        let (_, location) = callsite_frame(meta);
        let id = self.table.intern(Frame {
            service: service.clone(),
            name: name.clone(),
            location,
        });
        // A hash collision keeps the first name's entry; the other name is
        // still found (interned) each time, just not by the map.
        self.by_name.entry(key).or_insert(id);
        id
    }

    /// The frames, indexed by the ids the lookups give.
    pub(crate) fn table(&self) -> &FrameTable {
        &self.table
    }
}

/// An ended request's node table as the walk reads it.
struct LiveGraph<'a> {
    nodes: &'a [LiveNode],
    refs: &'a [FrameRef],
    frames: &'a FrameTable,
    now: Duration,
    /// Every node's wait marks; node `i`'s are `marks[ranges[i]]` (no
    /// ranges: no node has any).
    marks: &'a [WaitMark],
    ranges: &'a [(u32, u32)],
}

impl compute::Source for LiveGraph<'_> {
    fn len(&self) -> usize {
        self.nodes.len()
    }

    // Inlined into the walk's preparation, which reads every field once.
    #[inline(always)]
    fn node(&self, i: usize) -> NodeView<'_> {
        let n = &self.nodes[i];
        NodeView {
            parent: n.parent,
            created: n.created,
            first_poll: n.first_poll,
            end: if i == 0 || n.cancelled {
                None
            } else {
                n.closed.map(|c| n.last_exit.unwrap_or(c))
            },
            end_seq: n.exit_seq,
            busy: &n.busy,
            open: n.open.map(|(start, _, nested)| Busy {
                start,
                end: self.now,
                nested,
            }),
            resumptions: &n.resumptions,
            runnable: &n.runnable,
            waits: match self.ranges.get(i) {
                Some(&(from, to)) => &self.marks[from as usize..to as usize],
                None => &[],
            },
            callee: n.callee.as_deref(),
        }
    }

    fn frame(&self, i: usize) -> FrameRef {
        self.refs[i]
    }

    fn callee(&self, i: usize) -> Option<&CalleeOutcome> {
        self.nodes[i].callee.as_deref()
    }

    fn frames(&self) -> &FrameTable {
        self.frames
    }
}

impl Drop for Ended {
    fn drop(&mut self) {
        recycle_nodes(std::mem::take(&mut self.nodes));
    }
}

impl Request {
    /// The record of a finished request, taking its path.
    pub(crate) fn record(&self, outcome: Outcome) -> Record {
        let mut r = Record::new(self.service.to_string(), self.trigger, outcome.path);
        r.latency = outcome.latency;
        r.endpoint = self.endpoint.clone();
        r.start_unix_nanos = Some(self.start_unix_nanos);
        r.request_id = self.request_id.clone();
        r.trace_id = self.trace_id.clone();
        r.labels = self.labels().clone();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two callsites named "same", on different lines.
    fn two_callsites() -> (&'static Metadata<'static>, &'static Metadata<'static>) {
        tracing::subscriber::with_default(tracing_subscriber::registry(), || {
            let a = tracing::info_span!("same").metadata().expect("enabled");
            let b = tracing::info_span!("same").metadata().expect("enabled");
            (a, b)
        })
    }

    fn frame(cache: &FrameCache, id: u32) -> &Frame {
        &cache.table().frames()[id as usize]
    }

    #[test]
    fn frame_cache_tells_callsites_and_services_apart() {
        let (m1, m2) = two_callsites();
        let mut cache = FrameCache::default();
        let a: Arc<str> = Arc::from("A");
        let a_again: Arc<str> = Arc::from("A");
        let b: Arc<str> = Arc::from("B");
        let (sa, sb) = (cache.service_slot(&a), cache.service_slot(&b));
        assert_eq!(cache.service_slot(&a_again), sa, "a service is its name");
        let a1 = cache.callsite(m1, sa, &a);
        let a2 = cache.callsite(m2, sa, &a);
        let b1 = cache.callsite(m1, sb, &b);
        assert_ne!(a1, a2, "same name, different line");
        assert_ne!(a1, b1, "same callsite, different service");
        assert_eq!(cache.callsite(m1, sa, &a_again), a1);
        let line = |m: &Metadata<'_>| m.line().expect("line");
        assert_eq!(
            frame(&cache, a1).location.as_ref().map(|l| l.line),
            Some(line(m1))
        );
        assert_eq!(
            frame(&cache, a2).location.as_ref().map(|l| l.line),
            Some(line(m2))
        );
        assert_eq!(&*frame(&cache, b1).service, "B");
        assert_eq!(&*frame(&cache, a2).name, "same");
        // Each id's hash is its frame's, as the path's table expects.
        for id in [a1, a2, b1] {
            assert_eq!(
                cache.table().hash_of(id),
                FrameTable::hash(frame(&cache, id))
            );
        }
    }

    #[test]
    fn frame_cache_names_dynamic_nodes_by_content() {
        let (m1, m2) = two_callsites();
        let mut cache = FrameCache::default();
        let a: Arc<str> = Arc::from("A");
        let s = cache.service_slot(&a);
        let b1 = cache.named(m1, s, &a, &Arc::from("B1"));
        // Another allocation of the same name: the same frame.
        assert_eq!(cache.named(m1, s, &a, &Arc::from("B1")), b1);
        let b2 = cache.named(m1, s, &a, &Arc::from("B2"));
        assert_ne!(b1, b2);
        assert_eq!(&*frame(&cache, b2).name, "B2");
        // Same name at another callsite: another location, another frame.
        let other = cache.named(m2, s, &a, &Arc::from("B1"));
        assert_ne!(other, b1);
        // A dynamic name equal to the callsite's own is the callsite's frame.
        assert_eq!(
            cache.named(m1, s, &a, &Arc::from("same")),
            cache.callsite(m1, s, &a)
        );
        // A map entry that names another frame (a hash collision) is not
        // believed.
        let key = (m1 as *const Metadata<'static> as usize, s, 0xdead);
        let x: Arc<str> = Arc::from("X");
        let hx = FxBuildHasher.hash_one(&*x);
        cache.by_name.insert((key.0, key.1, hx), b1);
        let id = cache.named(m1, s, &a, &x);
        assert_eq!(&*frame(&cache, id).name, "X");
        assert_ne!(id, b1);
    }

    #[test]
    fn frame_cache_starts_over_when_full() {
        let (m1, _) = two_callsites();
        let a: Arc<str> = Arc::from("A");
        std::thread::spawn(move || {
            FrameCache::with(|cache| {
                let s = cache.service_slot(&a);
                for i in 0..=CACHE_FRAMES {
                    cache.named(m1, s, &a, &Arc::from(format!("n{i}")));
                }
                assert!(cache.table().len() > CACHE_FRAMES);
            });
            FrameCache::with(|cache| {
                assert_eq!(cache.table().len(), 0, "a full cache starts over");
                let s = cache.service_slot(&a);
                cache.callsite(m1, s, &a);
            });
            FrameCache::with(|cache| assert_eq!(cache.table().len(), 1, "kept otherwise"));
        })
        .join()
        .expect("no panic");
    }

    fn busy(at: u64) -> Busy {
        Busy {
            start: Duration::from_nanos(at),
            end: Duration::from_nanos(at + 1),
            nested: false,
        }
    }

    #[test]
    fn a_finished_requests_busy_lists_serve_the_next_nodes() {
        let (m1, _) = two_callsites();
        std::thread::spawn(move || {
            let mut n = LiveNode::new(None, m1, None, Duration::ZERO);
            n.busy.push(busy(0));
            spill_busy(&mut n.busy);
            assert!(n.busy.spilled());
            assert!(
                n.busy.capacity() >= FIRST_BUSY_CAPACITY,
                "room for a few polls"
            );
            assert_eq!(n.busy[..], [busy(0)], "the inline interval moved along");
            n.busy.push(busy(2));
            let heap = n.busy.as_ptr();
            recycle_nodes(vec![n]);
            let mut next: SmallVec<[Busy; 1]> = SmallVec::new();
            next.push(busy(5));
            spill_busy(&mut next);
            assert_eq!(next.as_ptr(), heap, "the kept list, not a new one");
            assert_eq!(next[..], [busy(5)], "and nothing of the old node's");
        })
        .join()
        .expect("no panic");
    }
}
