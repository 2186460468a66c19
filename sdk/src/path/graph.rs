//! A request's node graph: what the tracing layer records and the backwards
//! walk ([`compute`](super::compute)) reads.
//!
//! A [`Graph`] holds the request's [`Node`]s, each with its timeline (in
//! [`Duration`]s since any common origin): creation, first poll, [`Busy`]
//! intervals, explicit [`Resumption`]s, runnable stretches and, for an RPC
//! node, the [`CalleeOutcome`]. The layer builds it from spans; tests and
//! offline tools can build it by hand. Nothing here knows about `tracing`.

use std::num::NonZeroU64;
use std::time::Duration;

use super::table::FrameTable;
use super::{CriticalPath, Frame};

/// A node of a request's graph: its index in the [`Graph`], plus one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(NonZeroU64);

impl NodeId {
    /// The id of the node at `index` in its graph.
    pub fn from_index(index: usize) -> NodeId {
        NodeId(NonZeroU64::new(index as u64 + 1).expect("index + 1 is never zero"))
    }

    /// The node's index in its graph.
    pub fn index(self) -> usize {
        (self.0.get() - 1) as usize
    }
}

/// A frame in a [`Graph`]'s frame table (see [`Graph::frame`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameRef(pub(super) u32);

impl FrameRef {
    /// The reference to entry `i` of a frame table (the layer's frame cache).
    #[cfg(feature = "layer")]
    pub(crate) fn new(i: u32) -> FrameRef {
        FrameRef(i)
    }
}

/// An interval during which a node was entered (being polled / running).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Busy {
    /// When the node was entered.
    pub start: Duration,
    /// When it was exited.
    pub end: Duration,
    /// True when the node was entered inside its parent's busy interval on
    /// the same thread (a future polled by its parent's poll): this time is
    /// taken out of the parent's own busy time.
    pub nested: bool,
}

/// A node continuing after a wait, and what it was blocked on.
///
/// `blocker: None` means nothing explicit is known: the walk then uses the
/// child that ended last inside the wait, and if there is none the wait is
/// unattributed. Framework helpers that know the dependency (the task graph:
/// "which input completed last") set `blocker`; a resumption `at` the node's
/// first poll says what the node was queued behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resumption {
    /// When the node resumed.
    pub at: Duration,
    /// The dependency whose end came last before the resumption.
    pub blocker: Option<NodeId>,
}

/// What a node waited on after it stopped running at `at` (the end of a
/// busy interval), until it next ran: `on` is a wait frame of the graph's
/// table ([`Frame::wait`]), or `None` when nothing names the wait.
///
/// A wait the walk leaves on the node itself (no child or explicit blocker
/// explains it) is named by the latest mark before the wait's end: with
/// `on` set it is a [`SegmentKind::Wait`](super::SegmentKind::Wait) leaf,
/// otherwise an unattributed wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitMark {
    /// When the node stopped running (its exit).
    pub at: Duration,
    /// The wait frame, if any.
    pub on: Option<FrameRef>,
}

/// What came back from a callee for an RPC node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CalleeOutcome {
    /// The callee's decoded critical path.
    Path(CriticalPath),
    /// No usable path came back; the call is one blind-spot leaf naming the
    /// callee.
    BlindSpot {
        /// Who was called (a service name or an address).
        callee: String,
    },
}

/// One node of a request: a span, a task, an outbound RPC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The node this one was created under (`None` for the root).
    pub parent: Option<NodeId>,
    /// The node's frame (service, name, location), from [`Graph::frame`].
    pub frame: FrameRef,
    /// When the node was created.
    pub created: Duration,
    /// When it was first entered; `None` if it never ran.
    pub first_poll: Option<Duration>,
    /// When it ended (its last exit); `None` if it has not ended.
    pub end: Option<Duration>,
    /// Orders nodes whose `end`s are equal (a later event has a larger
    /// number): with a coarse or paused clock, a `select!` winner and the
    /// loser polled just before it end at the same instant.
    pub end_seq: u64,
    /// When it was entered, in any order.
    pub busy: Vec<Busy>,
    /// Explicit resumptions (see [`Resumption`]).
    pub resumptions: Vec<Resumption>,
    /// `(woken, resumed)` intervals: the node was ready to run (its waker
    /// had fired) but was not running yet. Known only for futures whose
    /// wakes are observed (`task::Tracked`); during such a stretch the node
    /// is not waiting on a dependency but queued for its thread, so the time
    /// belongs to whatever its parent was polling instead (a `join!` sibling,
    /// the parent itself) or is the node's queueing.
    pub runnable: Vec<(Duration, Duration)>,
    /// What the node's waits were on, in time order (see [`WaitMark`]).
    pub waits: Vec<WaitMark>,
    /// The callee's outcome, for an RPC node.
    pub callee: Option<CalleeOutcome>,
}

impl Node {
    /// A node created at `created`, not yet run.
    pub fn new(frame: FrameRef, created: Duration) -> Node {
        Node {
            parent: None,
            frame,
            created,
            first_poll: None,
            end: None,
            end_seq: 0,
            busy: Vec::new(),
            resumptions: Vec::new(),
            runnable: Vec::new(),
            waits: Vec::new(),
            callee: None,
        }
    }
}

/// The nodes of one request, and the frames they name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Graph {
    pub(super) frames: FrameTable,
    pub(super) nodes: Vec<Node>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// An empty graph with room for `nodes` nodes.
    pub fn with_capacity(nodes: usize) -> Graph {
        Graph {
            nodes: Vec::with_capacity(nodes),
            ..Graph::default()
        }
    }

    /// Intern a frame: equal frames get the same reference.
    ///
    /// # Panics
    ///
    /// Beyond `u32::MAX` distinct frames.
    pub fn frame(&mut self, frame: Frame) -> FrameRef {
        FrameRef(self.frames.intern(frame))
    }

    /// The frame behind a reference, if it is from this graph.
    pub fn frame_of(&self, r: FrameRef) -> Option<&Frame> {
        self.frames.frames().get(r.0 as usize)
    }

    /// Add a node, returning its id.
    pub fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        NodeId::from_index(self.nodes.len() - 1)
    }

    /// The node behind an id, if the id is from this graph.
    pub fn get(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.index())
    }

    /// The node behind an id, mutably.
    pub fn get_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        self.nodes.get_mut(id.index())
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The nodes, indexed by [`NodeId::index`].
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
}
