//! The last step of [`compute`](super::compute): the walk's pieces (latest
//! first) turned into the path's segments, with each piece's frame stack
//! resolved ([`Stacks`], memoised per node) and callee paths spliced in.

use super::*;

/// Turn pieces (latest first) into the path, resolving stacks and splicing
/// callees (`marks`: how many wait marks the graph has).
#[inline(never)]
pub(super) fn emit<S: Source>(
    graph: &S,
    prep: &[Prep],
    root: usize,
    pieces: &[Piece],
    marks: usize,
    stacks: &mut Stacks,
) -> CriticalPath {
    stacks.reset(prep.len(), graph.frames().len());
    // Size the path once: what the walk found plus what the callees bring.
    let (mut frames, mut segments) = (prep.len().min(graph.frames().len()), pieces.len());
    for piece in pieces {
        if let Piece::Splice { node, .. } = *piece {
            match graph.callee(node) {
                Some(CalleeOutcome::Path(p)) => {
                    frames += p.frames().len();
                    segments += p.segments().len() + 1;
                }
                _ => frames += 1,
            }
        }
    }
    // The named waits' frames: at most one per mark, or per piece.
    frames += marks.min(pieces.len());
    let mut path = CriticalPath::with_capacity(frames, segments);
    for piece in pieces.iter().rev() {
        match *piece {
            Piece::Seg {
                node,
                dur,
                mut kind,
                wait,
            } => {
                let d = Duration::from_nanos(dur);
                let (stack, deep) = stacks.get(graph, prep, root, node, &mut path);
                if kind == SegmentKind::Wait {
                    if named_wait(graph, stacks, stack.clone(), deep, wait, d, &mut path) {
                        continue;
                    }
                    kind = SegmentKind::Unattributed;
                }
                match kind {
                    SegmentKind::Queueing => {
                        path.accounting.queueing = path.accounting.queueing.saturating_add(d)
                    }
                    SegmentKind::Unattributed => {
                        path.accounting.unattributed =
                            path.accounting.unattributed.saturating_add(d)
                    }
                    _ => {}
                }
                if deep {
                    path.accounting.truncated = path.accounting.truncated.saturating_add(d);
                }
                let stack = &stacks.arena[stack];
                path.push_id_slice(stack, d, kind);
            }
            Piece::Splice { node, observed } => {
                let (prefix, deep) = stacks.get(graph, prep, root, node, &mut path);
                let prefix = &stacks.arena[prefix];
                let d = Duration::from_nanos(observed);
                if deep {
                    path.accounting.truncated = path.accounting.truncated.saturating_add(d);
                }
                let callee = match graph.callee(node) {
                    Some(CalleeOutcome::Path(p)) => Callee::Path(p),
                    Some(CalleeOutcome::BlindSpot { callee }) => Callee::BlindSpot { callee },
                    None => {
                        path.push_slice(prefix, d, SegmentKind::Busy);
                        continue;
                    }
                };
                merge::splice_with(&mut path, prefix, d, callee, &mut stacks.callee_map);
            }
        }
    }
    path
}

/// Push a named wait: the node's stack and the wait frame `wait`, unless the
/// stack is as deep as allowed already (false: the wait is then
/// unattributed on the node). Apart from [`emit`]: most paths have none.
#[cold]
#[inline(never)]
fn named_wait<S: Source>(
    graph: &S,
    stacks: &mut Stacks,
    stack: Range<usize>,
    deep: bool,
    wait: u32,
    d: Duration,
    path: &mut CriticalPath,
) -> bool {
    if stack.len() >= MAX_STACK_DEPTH || deep {
        return false;
    }
    let w = stacks.frame_ref_id(graph, FrameRef(wait), path);
    let mut full = Stack::from_slice(&stacks.arena[stack]);
    full.push(w);
    path.push(full, d, SegmentKind::Wait);
    true
}

/// A node whose stack is not resolved yet.
pub(super) const UNKNOWN: (u32, u32, bool) = (u32::MAX, 0, false);

/// Frame stacks of nodes, root first, memoised in one arena; built without
/// recursion. A node's stack is its parent's plus its own frame, so each
/// resolved node costs one copy of its parent's stack, and a segment costs
/// none (it borrows the arena).
#[derive(Debug, Default)]
pub(super) struct Stacks {
    /// Per node: `(start, len, deep)` in `arena`, or [`UNKNOWN`].
    pub(super) memo: Vec<(u32, u32, bool)>,
    pub(super) arena: Vec<FrameId>,
    /// Graph frame -> path frame id, interned on first use: valid when
    /// stamped with the current `generation` (the graph's frame table may
    /// be a thread's whole frame cache, so it is not cleared per request).
    pub(super) frames: Vec<(u32, FrameId)>,
    pub(super) generation: u32,
    /// Scratch for the climb.
    pub(super) chain: Vec<usize>,
    /// Scratch for [`merge::splice_with`].
    pub(super) callee_map: Vec<FrameId>,
    /// The last stack made: `(parent node, frame, memo entry)`. A sibling
    /// with the same frame (the walk meets siblings made at one callsite one
    /// after another) has the same stack: it shares the entry, no copy.
    pub(super) last: Option<(usize, FrameRef, (u32, u32, bool))>,
}

impl Stacks {
    /// Forget the previous request's stacks.
    pub(super) fn reset(&mut self, nodes: usize, frames: usize) {
        self.memo.clear();
        self.memo.resize(nodes, UNKNOWN);
        self.arena.clear();
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.frames.clear();
            self.generation = 1;
        }
        if self.frames.len() < frames {
            self.frames.resize(frames, (0, FrameId(0)));
        }
        self.last = None;
    }

    pub(super) fn get<S: Source>(
        &mut self,
        graph: &S,
        prep: &[Prep],
        root: usize,
        node: usize,
        path: &mut CriticalPath,
    ) -> (Range<usize>, bool) {
        // Known already (most segments: the walk stays in a node a while).
        let (start, len, deep) = self.memo[node];
        if start != UNKNOWN.0 {
            return (start as usize..(start + len) as usize, deep);
        }
        if self.memo[root] == UNKNOWN {
            let f = self.frame_id(graph, root, path);
            self.memo[root] = (self.arena.len() as u32, 1, false);
            self.arena.push(f);
        }
        // The parent known already (the walk meets a node after its
        // parent, mostly): one step, no climb.
        if let Some(p) = prep[node].parent
            && self.memo[p] != UNKNOWN
        {
            self.make(graph, p, node, path);
            let (start, len, deep) = self.memo[node];
            return (start as usize..(start + len) as usize, deep);
        }
        // Climb to a known ancestor; a chain longer than the graph is a cycle.
        self.chain.clear();
        let mut cur = node;
        let mut known = None;
        for _ in 0..=prep.len() {
            if self.memo[cur] != UNKNOWN {
                known = Some(cur);
                break;
            }
            self.chain.push(cur);
            match prep[cur].parent {
                Some(p) => cur = p,
                None => break,
            }
        }
        // Unknown ancestry (not under the root, or a cycle): hang it under the root.
        let mut base = known.unwrap_or(root);
        for i in (0..self.chain.len()).rev() {
            let c = self.chain[i];
            if c == root {
                continue;
            }
            self.make(graph, base, c, path);
            base = c;
        }
        let (start, len, deep) = self.memo[node];
        (start as usize..(start + len) as usize, deep)
    }

    /// Resolve `c`'s stack as `base`'s (known) plus `c`'s frame.
    fn make<S: Source>(&mut self, graph: &S, base: usize, c: usize, path: &mut CriticalPath) {
        let frame = graph.frame(c);
        if let Some((p, f, entry)) = self.last
            && p == base
            && f == frame
        {
            self.memo[c] = entry;
            return;
        }
        let (start, len, mut deep) = self.memo[base];
        let from = self.arena.len();
        self.arena
            .extend_from_within(start as usize..(start + len) as usize);
        if (len as usize) < MAX_STACK_DEPTH {
            let f = self.frame_id(graph, c, path);
            self.arena.push(f);
        } else {
            deep = true;
        }
        self.memo[c] = (from as u32, (self.arena.len() - from) as u32, deep);
        self.last = Some((base, frame, self.memo[c]));
    }

    pub(super) fn frame_id<S: Source>(
        &mut self,
        graph: &S,
        node: usize,
        path: &mut CriticalPath,
    ) -> FrameId {
        self.frame_ref_id(graph, graph.frame(node), path)
    }

    /// The path's id of the graph frame `r`.
    pub(super) fn frame_ref_id<S: Source>(
        &mut self,
        graph: &S,
        r: FrameRef,
        path: &mut CriticalPath,
    ) -> FrameId {
        let frames = graph.frames();
        if r.0 as usize >= frames.len() {
            // A reference from another graph: name it plainly.
            return path.intern(Frame::new("?", "?"));
        }
        let slot = &mut self.frames[r.0 as usize];
        if slot.0 == self.generation {
            return slot.1;
        }
        let id = path.intern_hashed(&frames.frames()[r.0 as usize], frames.hash_of(r.0));
        *slot = (self.generation, id);
        id
    }
}
