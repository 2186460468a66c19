//! The causal model by hypothesis refinement (MM §4.1–4.3, Figures 1–3).
//!
//! Every pair of events seen together in a request starts out as a
//! happens-before hypothesis `x → y` (`x`'s time ≤ `y`'s time in every
//! request that has both), every pair of segments seen together as a
//! mutual-exclusion hypothesis (their intervals never overlap), and every
//! pair of call paths that repeat under one parent as a pipeline hypothesis
//! (`A#i` ends before `B#i` starts for every `i`: FIFO). Each request
//! rejects what it contradicts; what survives is the model.
//!
//! # Representation and how far it scales
//!
//! Per endpoint, events are numbered as first seen (segment `s` has events
//! `2s` = start and `2s + 1` = end). Two bitsets per event hold the events
//! seen together with it and those that were once earlier than it (which
//! refutes `x → y`), so a request of `m` events costs `O(m · E / 64)` word
//! operations for `E` event types, and the whole model `E² / 4` bytes:
//! 2 000 event types (1 000 segments) take 1 MB, 20 000 take 100 MB.
//! Segments have two more bitsets (seen together, once overlapping).
//!
//! # Defined behaviour where the paper is silent
//!
//! - A hypothesis is born when its two events are first seen in one
//!   request (MM Figure 3's total grows as new segments appear) and is
//!   tested by that request already.
//! - Equal times satisfy happens-before both ways (MM: "greater than or
//!   equal").
//! - Reported relations leave out what holds by construction (a segment's
//!   own start before its end) and mutual exclusions already implied by a
//!   happens-before between the two segments (`A.end → B.start`).
//! - A request whose segments the model has not seen before (after the
//!   first request) is listed in [`Model::novel`]: the hypotheses it brings
//!   are tested by fewer requests than the rest.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::events::Request;

/// A growable bitset.
#[derive(Clone, Debug, Default)]
pub struct Bits(Vec<u64>);

impl Bits {
    /// Set bit `i`.
    pub fn set(&mut self, i: usize) {
        let w = i / 64;
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << (i % 64);
    }

    /// Bit `i`.
    pub fn get(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    /// `self |= o`; true when a bit changed.
    pub fn or(&mut self, o: &Bits) -> bool {
        if self.0.len() < o.0.len() {
            self.0.resize(o.0.len(), 0);
        }
        let mut changed = false;
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            let n = *a | b;
            changed |= n != *a;
            *a = n;
        }
        changed
    }

    /// Bits set in `self` and not in `o`.
    pub fn and_not_count(&self, o: &Bits) -> usize {
        self.0
            .iter()
            .enumerate()
            .map(|(w, a)| (a & !o.0.get(w).copied().unwrap_or(0)).count_ones() as usize)
            .sum()
    }

    /// Indices set in `self` and not in `o`.
    pub fn and_not_iter<'a>(&'a self, o: &'a Bits) -> impl Iterator<Item = usize> + 'a {
        self.0.iter().enumerate().flat_map(move |(w, a)| {
            let mut x = a & !o.0.get(w).copied().unwrap_or(0);
            std::iter::from_fn(move || {
                if x == 0 {
                    return None;
                }
                let b = x.trailing_zeros() as usize;
                x &= x - 1;
                Some(w * 64 + b)
            })
        })
    }

    fn clear(&mut self) {
        self.0.iter_mut().for_each(|w| *w = 0);
    }
}

/// One segment type of a model.
#[derive(Clone, Debug)]
pub struct Segment {
    /// `CALLPATH#K`.
    pub name: String,
    /// Its call path.
    pub call_path: Arc<str>,
    /// `K`.
    pub k: u32,
    /// Requests it was seen in.
    pub requests: usize,
}

/// A request the model had not seen the shape of.
#[derive(Clone, Debug)]
pub struct Novel {
    /// Requests analysed before it.
    pub after: usize,
    /// Its trace.
    pub trace_id: Box<str>,
    /// The segments it brought.
    pub new_segments: Vec<String>,
}

/// Relation kinds (MM §4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `a → b`: event `a` is never later than event `b`.
    HappensBefore,
    /// `a ∨ b`: segments `a` and `b` never overlap.
    MutualExclusion,
    /// `a ≫ b`: the `i`-th `a` under a parent ends before its `i`-th `b`
    /// starts, for every `i` (call paths).
    Pipeline,
}

impl Kind {
    /// The name in the JSON contract.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::HappensBefore => "happens_before",
            Kind::MutualExclusion => "mutual_exclusion",
            Kind::Pipeline => "pipeline",
        }
    }
}

/// One surviving relation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Relation {
    /// What kind.
    pub kind: Kind,
    /// Event (`CALLPATH#K.start`), segment (`CALLPATH#K`) or call path.
    pub a: String,
    /// The other side.
    pub b: String,
}

/// The causal model of one endpoint.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// The root `service:operation`.
    pub endpoint: Arc<str>,
    /// Segment types, by id.
    pub segments: Vec<Segment>,
    index: FxHashMap<(Arc<str>, u32), u32>,
    /// Per event: events seen together with it.
    seen: Vec<Bits>,
    /// Per event `x`: events `y` once strictly earlier (refutes `x → y`).
    refuted: Vec<Bits>,
    /// Per segment: segments seen together with it.
    seg_seen: Vec<Bits>,
    /// Per segment: segments it once overlapped.
    overlap: Vec<Bits>,
    /// Pipeline hypotheses between call paths: alive?
    pipelines: BTreeMap<(Arc<str>, Arc<str>), bool>,
    /// Requests analysed.
    pub requests: usize,
    /// The request (1-based count) after which the model last changed (a
    /// hypothesis born or rejected).
    pub last_change: usize,
    /// Requests with segments never seen before.
    pub novel: Vec<Novel>,
}

/// Event id of segment `s`'s start (`end = false`) or end.
pub fn event(s: u32, end: bool) -> usize {
    2 * s as usize + usize::from(end)
}

impl Model {
    /// An empty model for an endpoint.
    pub fn new(endpoint: Arc<str>) -> Model {
        Model {
            endpoint,
            ..Default::default()
        }
    }

    /// The segment id of each span of `req`, `None` for segments the model
    /// has not seen.
    pub fn lookup(&self, req: &Request) -> Vec<Option<u32>> {
        req.spans
            .iter()
            .map(|s| self.index.get(&(s.call_path.clone(), s.k)).copied())
            .collect()
    }

    /// Event name, `CALLPATH#K.start` / `.end`.
    pub fn event_name(&self, e: usize) -> String {
        format!(
            "{}.{}",
            self.segments[e / 2].name,
            if e.is_multiple_of(2) { "start" } else { "end" }
        )
    }

    /// Does `x → y` survive (both seen together, never contradicted)?
    pub fn happens_before(&self, x: usize, y: usize) -> bool {
        self.seen.get(x).is_some_and(|s| s.get(y)) && !self.refuted[x].get(y)
    }

    /// Do segments `a` and `b` survive as mutually exclusive?
    pub fn exclusive(&self, a: u32, b: u32) -> bool {
        a != b
            && self
                .seg_seen
                .get(a as usize)
                .is_some_and(|s| s.get(b as usize))
            && !self.overlap[a as usize].get(b as usize)
    }

    /// Does the pipeline `a ≫ b` between call paths survive?
    pub fn pipeline(&self, a: &Arc<str>, b: &Arc<str>) -> bool {
        self.pipelines
            .get(&(a.clone(), b.clone()))
            .copied()
            .unwrap_or(false)
    }

    /// Refine the model with one request (MM §4.2): add the hypotheses its
    /// new pairs bring, reject those it contradicts.
    pub fn observe(&mut self, req: &Request) {
        self.requests += 1;
        let mut changed = false;
        let mut ids = Vec::with_capacity(req.spans.len());
        let mut new_segments = Vec::new();
        for s in &req.spans {
            let key = (s.call_path.clone(), s.k);
            let id = match self.index.get(&key) {
                Some(&id) => id,
                None => {
                    let id = self.segments.len() as u32;
                    self.index.insert(key, id);
                    self.segments.push(Segment {
                        name: s.segment(),
                        call_path: s.call_path.clone(),
                        k: s.k,
                        requests: 0,
                    });
                    for _ in 0..2 {
                        self.seen.push(Bits::default());
                        self.refuted.push(Bits::default());
                    }
                    self.seg_seen.push(Bits::default());
                    self.overlap.push(Bits::default());
                    new_segments.push(s.segment());
                    id
                }
            };
            self.segments[id as usize].requests += 1;
            ids.push(id);
        }
        if !new_segments.is_empty() && self.requests > 1 {
            self.novel.push(Novel {
                after: self.requests - 1,
                trace_id: req.trace_id.clone(),
                new_segments,
            });
        }
        // Happens-before between events.
        let mut evs: Vec<(i64, usize)> = Vec::with_capacity(2 * ids.len());
        let mut all = Bits::default();
        for (s, &id) in req.spans.iter().zip(&ids) {
            evs.push((s.start, event(id, false)));
            evs.push((s.end, event(id, true)));
            all.set(event(id, false));
            all.set(event(id, true));
        }
        evs.sort_unstable();
        let mut before = Bits::default();
        let mut i = 0;
        while i < evs.len() {
            let mut j = i;
            while j < evs.len() && evs[j].0 == evs[i].0 {
                j += 1;
            }
            for &(_, x) in &evs[i..j] {
                changed |= self.seen[x].or(&all);
                changed |= self.refuted[x].or(&before);
            }
            for &(_, x) in &evs[i..j] {
                before.set(x);
            }
            i = j;
        }
        // Mutual exclusion between segments.
        let mut segs = Bits::default();
        for &id in &ids {
            segs.set(id as usize);
        }
        let mut by_start: Vec<usize> = (0..ids.len()).collect();
        by_start.sort_unstable_by_key(|&i| req.spans[i].start);
        for (n, &a) in by_start.iter().enumerate() {
            changed |= self.seg_seen[ids[a] as usize].or(&segs);
            let (sa, ea) = (req.spans[a].start, req.spans[a].end);
            for &b in &by_start[n + 1..] {
                let sb = req.spans[b].start;
                if sb >= ea {
                    break;
                }
                // Overlap: b starts inside a (sa ≤ sb < ea) and has length
                // or a does: zero-length spans at an edge do not overlap.
                let eb = req.spans[b].end;
                if sa.max(sb) < ea.min(eb) {
                    let (x, y) = (ids[a] as usize, ids[b] as usize);
                    if !self.overlap[x].get(y) {
                        self.overlap[x].set(y);
                        self.overlap[y].set(x);
                        changed = true;
                    }
                }
            }
        }
        // Pipelines between call paths repeated under one parent.
        let mut groups: FxHashMap<(u32, &Arc<str>), Vec<usize>> = FxHashMap::default();
        for (i, s) in req.spans.iter().enumerate() {
            if let Some(p) = s.parent {
                groups.entry((p, &s.call_path)).or_default().push(i);
            }
        }
        type Repeats<'r> = Vec<(&'r Arc<str>, Vec<usize>)>;
        let mut by_parent: FxHashMap<u32, Repeats<'_>> = FxHashMap::default();
        for ((p, cp), mut v) in groups {
            if v.len() >= 2 {
                v.sort_by_key(|&i| req.spans[i].k);
                by_parent.entry(p).or_default().push((cp, v));
            }
        }
        for reps in by_parent.values() {
            for (ca, va) in reps {
                for (cb, vb) in reps {
                    if ca == cb {
                        continue;
                    }
                    let fifo = va
                        .iter()
                        .zip(vb)
                        .all(|(&a, &b)| req.spans[a].end <= req.spans[b].start);
                    let key = ((*ca).clone(), (*cb).clone());
                    match self.pipelines.get_mut(&key) {
                        None => {
                            self.pipelines.insert(key, fifo);
                            changed = true;
                        }
                        Some(alive) if *alive && !fifo => {
                            *alive = false;
                            changed = true;
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        if changed {
            self.last_change = self.requests;
        }
    }

    /// Hypotheses still standing: happens-before pairs (ordered, without
    /// an event with itself), mutual-exclusion pairs (unordered) and
    /// pipelines.
    pub fn hypotheses(&self) -> usize {
        let hb: usize = (0..self.seen.len())
            .map(|x| self.seen[x].and_not_count(&self.refuted[x]) - 1)
            .sum();
        let me: usize = (0..self.seg_seen.len())
            .map(|a| self.seg_seen[a].and_not_count(&self.overlap[a]) - 1)
            .sum::<usize>()
            / 2;
        hb + me + self.pipelines.values().filter(|a| **a).count()
    }

    /// The surviving happens-before edges `(x, y)`, without a segment's own
    /// start → end.
    pub fn hb_edges(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for x in 0..self.seen.len() {
            for y in self.seen[x].and_not_iter(&self.refuted[x]) {
                if y != x && !(x % 2 == 0 && y == x + 1) {
                    out.push((x, y));
                }
            }
        }
        out
    }

    /// Surviving mutual exclusions `(a, b)`, `a < b`, not implied by a
    /// happens-before between the two segments.
    pub fn exclusions(&self) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        for a in 0..self.segments.len() as u32 {
            for b in self.seg_seen[a as usize].and_not_iter(&self.overlap[a as usize]) {
                let b = b as u32;
                if b > a
                    && !self.happens_before(event(a, true), event(b, false))
                    && !self.happens_before(event(b, true), event(a, false))
                {
                    out.push((a, b));
                }
            }
        }
        out
    }

    /// How many relations of each kind [`Model::relations`] lists
    /// (happens-before, mutual exclusion, pipeline), without naming them.
    pub fn relation_counts(&self) -> [usize; 3] {
        [
            self.hb_edges().len(),
            self.exclusions().len(),
            self.pipelines.values().filter(|a| **a).count(),
        ]
    }

    /// Visit the relations of [`Model::relations`] one at a time, in the
    /// same order, with their names rendered into reused buffers: a model
    /// of deep call paths has hundreds of thousands of relations whose
    /// names are kilobytes each, too many to hold as strings at once.
    ///
    /// # Errors
    ///
    /// The first error `f` returns.
    pub fn for_each_relation<E>(
        &self,
        mut f: impl FnMut(Kind, &str, &str) -> Result<(), E>,
    ) -> Result<(), E> {
        let (mut a, mut b) = (String::new(), String::new());
        for (x, y) in self.hb_edges() {
            a.clear();
            b.clear();
            self.write_event_name(&mut a, x);
            self.write_event_name(&mut b, y);
            f(Kind::HappensBefore, &a, &b)?;
        }
        for (x, y) in self.exclusions() {
            f(
                Kind::MutualExclusion,
                &self.segments[x as usize].name,
                &self.segments[y as usize].name,
            )?;
        }
        for ((x, y), alive) in &self.pipelines {
            if *alive {
                f(Kind::Pipeline, x, y)?;
            }
        }
        Ok(())
    }

    fn write_event_name(&self, out: &mut String, e: usize) {
        out.push_str(&self.segments[e / 2].name);
        out.push_str(if e.is_multiple_of(2) {
            ".start"
        } else {
            ".end"
        });
    }

    /// The model's relations (see the module docs for what is left out).
    pub fn relations(&self) -> Vec<Relation> {
        let mut out: Vec<Relation> = self
            .hb_edges()
            .into_iter()
            .map(|(x, y)| Relation {
                kind: Kind::HappensBefore,
                a: self.event_name(x),
                b: self.event_name(y),
            })
            .collect();
        for (a, b) in self.exclusions() {
            out.push(Relation {
                kind: Kind::MutualExclusion,
                a: self.segments[a as usize].name.clone(),
                b: self.segments[b as usize].name.clone(),
            });
        }
        for ((a, b), alive) in &self.pipelines {
            if *alive {
                out.push(Relation {
                    kind: Kind::Pipeline,
                    a: a.to_string(),
                    b: b.to_string(),
                });
            }
        }
        out
    }

    /// The happens-before graph's transitive reduction (MM §4.4.1) as
    /// Graphviz, with a segment's own start → end drawn bold, mutual
    /// exclusions dashed and undirected. Events always simultaneous (`x →
    /// y` and `y → x`) are ordered by id so the graph stays acyclic.
    pub fn to_dot(&self) -> String {
        let n = self.seen.len();
        let edge = |x: usize, y: usize| {
            x != y && self.happens_before(x, y) && (!self.happens_before(y, x) || x < y)
        };
        let mut succ: Vec<Bits> = vec![Bits::default(); n];
        for (x, s) in succ.iter_mut().enumerate() {
            for y in 0..n {
                if edge(x, y) {
                    s.set(y);
                }
            }
        }
        let mut two_step = Bits::default();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "digraph \"{}\" {{\n  rankdir=LR;\n  node [shape=box, fontsize=10];",
            esc(&self.endpoint)
        );
        for x in 0..n {
            let _ = writeln!(out, "  e{x} [label=\"{}\"];", esc(&self.event_name(x)));
        }
        for x in 0..n {
            two_step.clear();
            for z in succ[x].and_not_iter(&Bits::default()) {
                two_step.or(&succ[z]);
            }
            for y in succ[x].and_not_iter(&two_step) {
                let own = x % 2 == 0 && y == x + 1;
                let _ = writeln!(
                    out,
                    "  e{x} -> e{y}{};",
                    if own { " [style=bold]" } else { "" }
                );
            }
        }
        for (a, b) in self.exclusions() {
            let _ = writeln!(
                out,
                "  e{} -> e{} [style=dashed, dir=none, constraint=false, label=\"∨\"];",
                event(a, false),
                event(b, false)
            );
        }
        out.push_str("}\n");
        out
    }

    /// Event types.
    pub fn events(&self) -> usize {
        self.seen.len()
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Models per endpoint, refined request by request, with the convergence
/// curve (MM Figure 3) over all of them.
#[derive(Debug, Default)]
pub struct Models {
    /// By endpoint.
    pub by_endpoint: BTreeMap<Arc<str>, Model>,
    /// `(requests analysed, hypotheses left)` at every checkpoint: each of
    /// the first 20 requests, then every 10 %-step (geometric), and the
    /// last.
    pub convergence: Vec<(usize, usize)>,
    /// Requests analysed.
    pub requests: usize,
    next_checkpoint: usize,
}

impl Models {
    /// Refine the model of `req`'s endpoint with it.
    pub fn observe(&mut self, req: &Request) {
        self.by_endpoint
            .entry(req.endpoint.clone())
            .or_insert_with(|| Model::new(req.endpoint.clone()))
            .observe(req);
        self.requests += 1;
        if self.requests >= self.next_checkpoint {
            self.convergence.push((self.requests, self.hypotheses()));
            self.next_checkpoint = if self.requests < 20 {
                self.requests + 1
            } else {
                self.requests + self.requests.div_ceil(10)
            };
        }
    }

    /// Close the curve at the last request.
    pub fn finish(&mut self) {
        if self.convergence.last().map(|c| c.0) != Some(self.requests) && self.requests > 0 {
            self.convergence.push((self.requests, self.hypotheses()));
        }
    }

    /// Hypotheses left over all endpoints.
    pub fn hypotheses(&self) -> usize {
        self.by_endpoint.values().map(Model::hypotheses).sum()
    }
}
