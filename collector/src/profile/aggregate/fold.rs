//! The parallel fold: [`Aggregator`] splits batches of records over one
//! `Partial` per rayon worker, each with its own interner, and merges the
//! partials at the end.

use super::intern::*;
use super::*;

/// Parent of a top-level trie node.
pub(super) const NO_PARENT: u32 = u32::MAX;

/// Records per work item of [`Aggregator::push_batch`]: small enough to
/// balance two workers when one is slowed, large enough that taking a free
/// partial per item costs nothing.
pub(super) const CHUNK: usize = 512;

/// Records per batch in [`Aggregate::from_records`].
pub(super) const BATCH: usize = 16 * 1024;

/// Incremental, parallel builder of an [`Aggregate`].
///
/// Push records one by one ([`Aggregator::push`]) or in batches
/// ([`Aggregator::push_batch`], folded in parallel), then
/// [`Aggregator::finish`]. With a percentile band the per-request
/// contributions are kept until `finish` (the band needs every latency);
/// without one, records are folded as they come and nothing per request is
/// kept.
#[derive(Debug)]
pub struct Aggregator {
    pub(super) sel: Selection,
    pub(super) parts: Vec<Partial>,
    pub(super) ordinal: u64,
    pub(super) offered: u64,
    /// The JSON Lines scanners' frame tables, kept from block to block.
    pub(super) json_frames: Vec<super::scan::Frames>,
    /// Aggregates of other requests, merged in at the end (roll-ups).
    pub(super) merged: Vec<Aggregate>,
}

impl Aggregator {
    /// A builder for this selection, with one partial per rayon worker.
    pub fn new(sel: Selection) -> Self {
        let keep = sel.percentile().is_some();
        let n = rayon::current_num_threads().max(1);
        Aggregator {
            parts: (0..n).map(|_| Partial::new(keep)).collect(),
            sel,
            ordinal: 0,
            offered: 0,
            json_frames: Vec::new(),
            merged: Vec::new(),
        }
    }

    /// Also collect per-stack latency histograms ([`Detail::histogram`];
    /// off by default: they cost about a sixth of the fold and only
    /// `cpt histogram` needs them). The request-latency histogram and the
    /// sums of squares (for confidence intervals) are always collected.
    #[must_use]
    pub fn with_histograms(mut self, on: bool) -> Self {
        for p in &mut self.parts {
            p.histograms = on;
        }
        self
    }

    /// Also keep every selected request's latency (8 bytes a request), so
    /// that [`Aggregate::latency_quantile`] is exact rather than read from
    /// the latency histogram (within 6.25 %). Off by default; the web pages
    /// turn it on.
    #[must_use]
    pub fn with_exact_latencies(mut self, on: bool) -> Self {
        for p in &mut self.parts {
            p.exact = on.then(Vec::new);
        }
        self
    }

    /// Whether per-stack histograms are collected
    /// ([`with_histograms`](Self::with_histograms)).
    pub fn histograms(&self) -> bool {
        self.parts.first().is_some_and(|p| p.histograms)
    }

    /// The selection.
    pub fn selection(&self) -> &Selection {
        &self.sel
    }

    /// Records offered so far (selected or not).
    pub fn offered(&self) -> u64 {
        self.offered
    }

    /// Records that passed every filter except the percentile band so far.
    pub fn matched(&self) -> u64 {
        self.parts.iter().map(|p| p.matched).sum()
    }

    /// Offer one record.
    pub fn push(&mut self, r: &Record) {
        self.offered += 1;
        let ord = self.ordinal;
        self.ordinal += 1;
        self.parts[0].push(&self.sel, r, ord);
    }

    /// Offer a batch of records, folded in parallel.
    pub fn push_batch<R: Borrow<Record> + Sync>(&mut self, rs: &[R]) {
        if rs.is_empty() {
            return;
        }
        self.offered += rs.len() as u64;
        let base = self.ordinal;
        self.ordinal += rs.len() as u64;
        let sel = &self.sel;
        if rs.len() < 256 {
            for (i, r) in rs.iter().enumerate() {
                self.parts[0].push(sel, r.borrow(), base + i as u64);
            }
            return;
        }
        // Many small work items, each folded into whichever partial is free:
        // a worker slowed by other load on the machine leaves the rest of the
        // batch to the others instead of holding them at the end of it.
        // Which partial folds which record does not change the result.
        let keep = sel.percentile().is_some();
        let histograms = self.parts.first().is_some_and(|p| p.histograms);
        let exact = self.parts.first().is_some_and(|p| p.exact.is_some());
        let free = Mutex::new(std::mem::take(&mut self.parts));
        let lock = || free.lock().unwrap_or_else(PoisonError::into_inner);
        rs.par_chunks(CHUNK).enumerate().for_each(|(ci, recs)| {
            let taken = lock().pop();
            let mut part = taken.unwrap_or_else(|| Partial::with_options(keep, histograms, exact));
            let first = base + (ci * CHUNK) as u64;
            for (i, r) in recs.iter().enumerate() {
                part.push(sel, r.borrow(), first + i as u64);
            }
            lock().push(part);
        });
        self.parts = free.into_inner().unwrap_or_else(PoisonError::into_inner);
    }

    /// Apply the percentile band (if any) and merge the partials.
    pub fn finish(mut self) -> Aggregate {
        if let Some(band) = self.sel.percentile() {
            let mut keys: Vec<(u64, u64)> = self
                .parts
                .iter()
                .flat_map(|p| p.kept.iter().map(|k| (k.latency, k.ordinal)))
                .collect();
            let ranks = band.ranks(keys.len());
            let (lo, hi) = if ranks.is_empty() {
                ((1, 0), (0, 0))
            } else {
                keys.par_sort_unstable();
                (keys[ranks.start], keys[ranks.end - 1])
            };
            drop(keys);
            self.parts.par_iter_mut().for_each(|p| p.fold_kept(lo, hi));
        }
        let mut parts = self.parts.into_iter().map(Partial::into_aggregate);
        let mut agg = parts.next().unwrap_or_default();
        for p in parts {
            agg.merge(&p);
        }
        agg.canonicalize();
        agg.comments.push(format!("cpt selection: {}", self.sel));
        for m in &self.merged {
            agg.merge(m);
        }
        agg
    }

    /// Merge `agg`, the aggregate of requests this selection keeps that are
    /// not offered as records (the store's roll-ups), into the result.
    ///
    /// # Panics
    ///
    /// With a percentile band: the band ranks single requests, which an
    /// aggregate no longer has.
    #[cfg(feature = "server")]
    pub(crate) fn merge_aggregate(&mut self, agg: Aggregate) {
        assert!(
            self.sel.percentile().is_none(),
            "an aggregate cannot be banded by percentile; this is a bug"
        );
        self.merged.push(agg);
    }
}

/// One aggregator's view of an input folded into several at once.
pub(super) struct Arm<'s> {
    pub(super) sel: &'s Selection,
    /// The ordinal of the input's first record.
    pub(super) base: u64,
    pub(super) keep: bool,
    pub(super) histograms: bool,
    pub(super) exact: bool,
}

impl Arm<'_> {
    pub(super) fn fresh(&self) -> Partial {
        Partial::with_options(self.keep, self.histograms, self.exact)
    }
}

/// Take every aggregator's partial folds, to fold one input into all of
/// them at once (they go back when the input is done).
pub(super) fn take_parts(aggs: &mut [&mut Aggregator]) -> Vec<Vec<Partial>> {
    aggs.iter_mut()
        .map(|a| std::mem::take(&mut a.parts))
        .collect()
}

/// Each aggregator's arm, with the partials [`take_parts`] took from it.
pub(super) fn arms<'a>(aggs: &'a [&mut Aggregator], parts: &[Vec<Partial>]) -> Vec<Arm<'a>> {
    aggs.iter()
        .zip(parts)
        .map(|(a, p)| Arm {
            sel: &a.sel,
            base: a.ordinal,
            keep: a.sel.percentile().is_some(),
            histograms: p.first().is_some_and(|p| p.histograms),
            exact: p.first().is_some_and(|p| p.exact.is_some()),
        })
        .collect()
}

/// One worker's partials, one per arm: taken from `parts` while any are
/// left, fresh after.
pub(super) fn slot_parts(parts: &mut [Vec<Partial>], arms: &[Arm<'_>]) -> Vec<Partial> {
    parts
        .iter_mut()
        .zip(arms)
        .map(|(p, arm)| p.pop().unwrap_or_else(|| arm.fresh()))
        .collect()
}

/// A trie node's running totals, side by side so that folding a request's
/// time into a stack touches one place in memory: the current request's
/// time on the stack, and over the requests folded so far the summed time,
/// their number and the sum of squares.
#[derive(Clone, Copy, Debug, Default)]
struct NodeSums {
    cur: u64,
    sum: u64,
    count: u64,
    sum_sq: u128,
}

impl NodeSums {
    #[inline]
    fn add(&mut self, v: u64) {
        self.sum = self.sum.saturating_add(v);
        self.count += 1;
        self.sum_sq = self.sum_sq.saturating_add(u128::from(v) * u128::from(v));
    }
}

/// A per-request contribution kept for the percentile band.
#[derive(Debug)]
pub(super) struct Kept {
    latency: u64,
    ordinal: u64,
    end: usize,
    start_unix_nanos: Option<u64>,
    accounting: Accounting,
}

/// One worker's share: its own interner and dense per-stack sums.
#[derive(Debug)]
pub(super) struct Partial {
    pub(super) frames: Vec<Frame>,
    /// Frames by [`frame_hash`]: open addressing with linear probing, at
    /// most half full; `(hash, frame id + 1)`, 0 marking an empty slot.
    /// Frames with one hash are both kept, a probe apart.
    frame_slots: Vec<(u64, u32)>,
    /// Stack trie: node → (parent node or NO_PARENT, frame); every node is a
    /// stack (root..=node), and sums are indexed by node.
    nodes: Vec<(u32, u32)>,
    node_ix: FxMap<u64, u32>,
    /// Per node: running sums (see [`NodeSums`]) and, when
    /// [`Partial::histograms`], the per-request time histogram.
    node_sums: Vec<NodeSums>,
    hists: Vec<Histogram>,
    kind_frames: [u32; 4],
    /// [`NO_FRAMES`]: busy time whose segment has an empty stack.
    no_frames: u32,
    // per-record scratch, reused
    local: Vec<u32>,
    flat: Flat,
    /// The frames table packed rows were last mapped from, and its ids →
    /// this partial's frame ids (`u32::MAX`: not mapped yet).
    pub(super) packed_table: u64,
    pub(super) packed_ids: Vec<u32>,
    /// Sample stacks by their frame ids (see [`StackIndex`]).
    stack_ix: StackIndex,
    /// The current segment's sample stack (frame ids), reused.
    key: Vec<u32>,
    touched: Vec<u32>,
    // totals
    pub(super) matched: u64,
    requests: u64,
    latency_sum: u64,
    latency: Detail,
    accounting: Accounting,
    start_range: Option<(u64, u64)>,
    // percentile band: contributions kept until finish
    keep: bool,
    pub(super) histograms: bool,
    /// Every request's latency, when kept (`with_exact_latencies`).
    pub(super) exact: Option<Vec<u64>>,
    kept: Vec<Kept>,
    entries: Vec<(u32, u64)>,
}

impl Partial {
    /// A partial that folds as the aggregator's others do: keeping
    /// contributions for a band, per-stack histograms, exact latencies.
    pub(super) fn with_options(keep: bool, histograms: bool, exact: bool) -> Self {
        let mut p = Partial::new(keep);
        p.histograms = histograms;
        p.exact = exact.then(Vec::new);
        p
    }

    pub(super) fn new(keep: bool) -> Self {
        let mut p = Partial {
            frames: Vec::new(),
            frame_slots: vec![(0, 0); 256],
            nodes: Vec::new(),
            node_ix: FxMap::default(),
            node_sums: Vec::new(),
            hists: Vec::new(),
            kind_frames: [0; 4],
            no_frames: 0,
            local: Vec::new(),
            flat: Flat::default(),
            packed_table: 0,
            packed_ids: Vec::new(),
            stack_ix: StackIndex::default(),
            key: Vec::new(),
            touched: Vec::new(),
            matched: 0,
            requests: 0,
            latency_sum: 0,
            latency: Detail::default(),
            accounting: Accounting::default(),
            start_range: None,
            keep,
            histograms: false,
            exact: None,
            kept: Vec::new(),
            entries: Vec::new(),
        };
        for (slot, kind) in KINDS.iter().enumerate() {
            let f = kind_frame(*kind).expect("non-busy kinds have a synthetic frame");
            p.kind_frames[slot] = p.intern_frame(&f);
        }
        p.no_frames = p.intern_frame(&Frame::new("", NO_FRAMES));
        p
    }

    /// Intern a frame: probe for its 64-bit hash and confirm each hit with
    /// a comparison that tries pointer equality of the shared strings
    /// before their bytes (records built in-process share `Arc<str>`s).
    #[inline]
    pub(super) fn intern_frame(&mut self, f: &Frame) -> u32 {
        let h = frame_hash(f);
        let mask = self.frame_slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            let (sh, id1) = self.frame_slots[i];
            if id1 == 0 {
                break;
            }
            if sh == h && same_frame(&self.frames[id1 as usize - 1], f) {
                return id1 - 1;
            }
            i = (i + 1) & mask;
        }
        let id = self.frames.len() as u32;
        self.frames.push(f.clone());
        self.frame_slots[i] = (h, id + 1);
        if self.frames.len() * 2 > self.frame_slots.len() {
            let size = self.frame_slots.len() * 2;
            let old = std::mem::replace(&mut self.frame_slots, vec![(0, 0); size]);
            let mask = self.frame_slots.len() - 1;
            for (h, id1) in old.into_iter().filter(|e| e.1 != 0) {
                let mut i = h as usize & mask;
                while self.frame_slots[i].1 != 0 {
                    i = (i + 1) & mask;
                }
                self.frame_slots[i] = (h, id1);
            }
        }
        id
    }

    /// The trie node for `frame` under `parent`, created on first use.
    #[inline]
    pub(super) fn child(&mut self, parent: u32, frame: u32) -> u32 {
        let key = (u64::from(parent) << 32) | u64::from(frame);
        if let Some(&n) = self.node_ix.get(&key) {
            return n;
        }
        let n = self.nodes.len() as u32;
        self.nodes.push((parent, frame));
        self.node_ix.insert(key, n);
        self.node_sums.push(NodeSums::default());
        self.hists.push(Histogram::default());
        n
    }

    pub(super) fn push(&mut self, sel: &Selection, r: &Record, ordinal: u64) {
        if !sel.matches(r) {
            return;
        }
        let path = &r.path;
        self.local.clear();
        for f in path.frames() {
            let id = self.intern_frame(f);
            self.local.push(id);
        }
        let mut flat = std::mem::take(&mut self.flat);
        flat.clear();
        for seg in path.segments() {
            let ns = u64::try_from(seg.duration.as_nanos()).unwrap_or(u64::MAX);
            flat.ids
                .extend(seg.stack.iter().map(|id| self.local[id.0 as usize]));
            flat.end_segment(ns, seg.kind);
        }
        self.push_flat(&flat, r.start_unix_nanos, &r.path.accounting, ordinal);
        self.flat = flat;
    }

    /// Fold one selected record given as its segments' stacks of this
    /// partial's frame ids (see [`Flat`]).
    pub(super) fn push_flat(
        &mut self,
        flat: &Flat,
        start_unix_nanos: Option<u64>,
        accounting: &Accounting,
        ordinal: u64,
    ) {
        self.matched += 1;
        let mut latency = 0u64;
        let mut key = std::mem::take(&mut self.key);
        let mut begin = 0;
        for &(end, ns, kind) in &flat.segs {
            let stack = &flat.ids[begin..end as usize];
            begin = end as usize;
            if ns == 0 {
                continue;
            }
            latency = latency.saturating_add(ns);
            // The sample stack: the segment's frames, then the kind's
            // synthetic leaf. Look the whole stack up at once by its frame
            // ids; walk the trie only for a stack not seen before.
            key.clear();
            key.extend_from_slice(stack);
            // A named wait's stack ends in its wait frame already.
            if kind != SegmentKind::Busy && kind != SegmentKind::Wait {
                key.push(self.kind_frames[kind_slot(kind)]);
            }
            if key.is_empty() {
                // A path coarsened to depth 0 (the codec's last resort)
                // keeps its time without frames.
                key.push(self.no_frames);
            }
            let h = stack_hash(&key);
            let node = match self.stack_ix.find(h, &key) {
                Some(n) => n,
                None => {
                    let mut node = NO_PARENT;
                    for &f in &key {
                        node = self.child(node, f);
                    }
                    self.stack_ix.insert(h, &key, node);
                    node
                }
            };
            let sid = node;
            let c = &mut self.node_sums[sid as usize].cur;
            if *c == 0 {
                self.touched.push(sid);
            }
            *c = c.saturating_add(ns);
        }
        self.key = key;
        if self.keep {
            for &s in &self.touched {
                let v = std::mem::take(&mut self.node_sums[s as usize].cur);
                self.entries.push((s, v));
            }
            self.touched.clear();
            self.kept.push(Kept {
                latency,
                ordinal,
                end: self.entries.len(),
                start_unix_nanos,
                accounting: *accounting,
            });
        } else {
            for &s in &self.touched {
                let n = &mut self.node_sums[s as usize];
                let v = std::mem::take(&mut n.cur);
                n.add(v);
                if self.histograms {
                    self.hists[s as usize].record(v);
                }
            }
            self.touched.clear();
            self.add_request(latency, start_unix_nanos, accounting);
        }
    }

    pub(super) fn add_request(&mut self, latency: u64, start: Option<u64>, acc: &Accounting) {
        self.requests += 1;
        self.latency_sum = self.latency_sum.saturating_add(latency);
        self.latency.add(latency, true);
        if let Some(exact) = &mut self.exact {
            exact.push(latency);
        }
        self.accounting.add(acc);
        if let Some(t) = start {
            self.start_range = Some(match self.start_range {
                Some((a, b)) => (a.min(t), b.max(t)),
                None => (t, t),
            });
        }
    }

    /// Fold the kept contributions whose (latency, ordinal) is in `[lo, hi]`.
    pub(super) fn fold_kept(&mut self, lo: (u64, u64), hi: (u64, u64)) {
        let kept = std::mem::take(&mut self.kept);
        let entries = std::mem::take(&mut self.entries);
        let mut begin = 0;
        for k in &kept {
            let key = (k.latency, k.ordinal);
            if key >= lo && key <= hi {
                for &(s, v) in &entries[begin..k.end] {
                    self.node_sums[s as usize].add(v);
                    if self.histograms {
                        self.hists[s as usize].record(v);
                    }
                }
                self.add_request(k.latency, k.start_unix_nanos, &k.accounting);
            }
            begin = k.end;
        }
    }

    /// The frames of trie node `n`, root first.
    pub(super) fn stack_of(&self, mut n: u32) -> Box<[u32]> {
        let mut v = Vec::new();
        while n != NO_PARENT {
            let (parent, frame) = self.nodes[n as usize];
            v.push(frame);
            n = parent;
        }
        v.reverse();
        v.into()
    }

    pub(super) fn into_aggregate(self) -> Aggregate {
        // Only nodes some segment ended at are sample stacks; inner prefixes
        // have no time and no requests and are dropped by canonicalize.
        let stacks: Vec<Box<[u32]>> = (0..self.nodes.len() as u32)
            .map(|n| {
                if self.node_sums[n as usize].count > 0 {
                    self.stack_of(n)
                } else {
                    Box::from([])
                }
            })
            .collect();
        let stacks = stacks
            .into_iter()
            .zip(self.node_sums)
            .zip(self.hists)
            .map(|((stack, n), histogram)| StackStats {
                stack,
                sum_nanos: n.sum,
                requests: n.count,
                detail: Some(Detail {
                    sum_sq: n.sum_sq,
                    histogram,
                }),
            })
            .collect();
        let mut agg = Aggregate {
            frames: self.frames,
            stacks,
            requests: self.requests,
            latency_sum_nanos: self.latency_sum,
            latency: Some(self.latency),
            latencies: self.exact,
            accounting: self.accounting,
            start_range: self.start_range,
            comments: Vec::new(),
        };
        agg.canonicalize();
        agg
    }
}
