//! Folding records into an [`Aggregate`]: the "average critical path" (CPT
//! "Aggregation and Visualization", Table 1).
//!
//! Every segment of every selected record contributes its duration to the
//! *sample stack* it belongs to: the segment's frame stack, plus a synthetic
//! leaf frame for time the path could not explain in detail
//! (`[queueing]`, `[unattributed]`, `[network]`, `[blind spot]`, see
//! [`kind_frame`]). A stack's value is its time summed over the selection
//! divided by the number of selected requests, so the values add up to the
//! mean request latency. CPT Table 1: requests of 16 ms (A1 6 ms, A1/A2 10 ms)
//! and 8 ms (A1 4 ms, A1/B1 4 ms) give A1 5 ms, A1/A2 5 ms, A1/B1 2 ms, total
//! 12 ms.
//!
//! # Merging (several collectors, several files)
//!
//! An aggregate keeps *sums and counts*, never only means: per stack the
//! summed nanoseconds ([`StackStats::sum_nanos`]) and the number of requests
//! the stack was on the path of ([`StackStats::requests`]), and overall the
//! number of selected requests ([`Aggregate::requests`]). Merging adds sums
//! and counts; a mean is always `sum of sums / sum of request counts`
//! ([`Aggregate::merge`]). Averaging two profiles' means would weigh a
//! collector that saw 10 requests like one that saw 10⁶. The pprof form keeps
//! the same numbers (see [`crate::profile`]).
//!
//! # How the fold is made fast
//!
//! Each record's frames are interned once per record (a record's own frame
//! table is small): a cheap hash of name, service and line, one probe of an
//! open-addressing table, and a comparison of the few bytes with no
//! `memcmp` call. Each segment's sample stack (its frame ids, plus the
//! synthetic kind leaf) is then hashed as a whole and found with one probe
//! in a stack index whose entries point at nodes of a trie of interned
//! stacks; only a stack never seen before walks the trie, one `(parent
//! node, frame) → node` lookup per level. No allocation per segment, only
//! per *new* stack. Per-stack sums live in dense vectors indexed by node.
//! Batches are split over one `Partial` per rayon worker, each with its own
//! interner, and the partials are merged (remapping their few thousand stack
//! ids) at the end, so workers never share a lock.
//!
//! Records decoded from the wire own their strings, a hundred or so small
//! allocations each, and are mostly out of cache when folded: on the
//! aggregate bench about half the fold's time is waiting for those cache
//! misses, which no change to the fold's arithmetic removes.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cpt_sdk::path::{Accounting, Frame, SegmentKind};
use cpt_sdk::record::Record;
use rayon::prelude::*;
use rustc_hash::FxBuildHasher;

use crate::histogram::Histogram;
use crate::selection::Selection;

type FxMap<K, V> = HashMap<K, V, FxBuildHasher>;

/// The synthetic frame that stands for busy time without frames (a segment
/// with an empty stack, as a path coarsened to depth 0 has).
pub const NO_FRAMES: &str = "[no frames]";

/// The synthetic leaf frame that stands for a non-busy segment kind
/// (`None` for [`SegmentKind::Busy`]: busy time is the leaf's own time).
///
/// Synthetic frames have an empty service, so [`frame_label`] shows just the
/// bracketed name.
pub fn kind_frame(kind: SegmentKind) -> Option<Frame> {
    let name = match kind {
        SegmentKind::Busy => return None,
        SegmentKind::Queueing => "[queueing]",
        SegmentKind::Unattributed => "[unattributed]",
        SegmentKind::Network => "[network]",
        SegmentKind::BlindSpot => "[blind spot]",
    };
    Some(Frame::new("", name))
}

/// How a frame is shown in profiles, folded stacks and reports:
/// `"A1 (A)"`, or just the name for a synthetic frame (`"[network]"`).
pub fn frame_label(f: &Frame) -> String {
    if f.service.is_empty() {
        f.name.to_string()
    } else {
        format!("{} ({})", f.name, f.service)
    }
}

const KINDS: [SegmentKind; 4] = [
    SegmentKind::Queueing,
    SegmentKind::Unattributed,
    SegmentKind::Network,
    SegmentKind::BlindSpot,
];

fn kind_slot(kind: SegmentKind) -> usize {
    match kind {
        SegmentKind::Busy => usize::MAX,
        SegmentKind::Queueing => 0,
        SegmentKind::Unattributed => 1,
        SegmentKind::Network => 2,
        SegmentKind::BlindSpot => 3,
    }
}

/// Per-stack totals over a selection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackStats {
    /// Frame ids into [`Aggregate::frames`], root first.
    pub stack: Box<[u32]>,
    /// Time this stack was on the critical path, summed over the selection.
    pub sum_nanos: u64,
    /// How many selected requests had this stack on their path.
    pub requests: u64,
    /// Spread of the per-request times, when computed from records (absent
    /// for aggregates read back from a profile).
    pub detail: Option<Detail>,
}

/// The distribution of one quantity over requests: sum of squares (for the
/// variance, hence confidence intervals) and a histogram of the values taken
/// when present (CPT: "latency histograms for critical path segments").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Detail {
    /// Sum over requests of the per-request time squared, in ns².
    pub sum_sq: u128,
    /// Per-request times of the requests where the quantity is non-zero
    /// (for stacks: empty unless [`Aggregator::with_histograms`]).
    pub histogram: Histogram,
}

impl Detail {
    #[inline]
    fn add(&mut self, v: u64, histogram: bool) {
        let v2 = u128::from(v) * u128::from(v);
        self.sum_sq = self.sum_sq.saturating_add(v2);
        if histogram {
            self.histogram.record(v);
        }
    }

    fn merge(&mut self, o: &Detail) {
        self.sum_sq = self.sum_sq.saturating_add(o.sum_sq);
        self.histogram.merge(&o.histogram);
    }
}

/// The average critical path of a selection. See the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Aggregate {
    frames: Vec<Frame>,
    stacks: Vec<StackStats>,
    requests: u64,
    latency_sum_nanos: u64,
    latency: Option<Detail>,
    accounting: Accounting,
    start_range: Option<(u64, u64)>,
    comments: Vec<String>,
}

impl Default for Aggregate {
    fn default() -> Self {
        Aggregate {
            frames: Vec::new(),
            stacks: Vec::new(),
            requests: 0,
            latency_sum_nanos: 0,
            latency: Some(Detail::default()),
            accounting: Accounting::default(),
            start_range: None,
            comments: Vec::new(),
        }
    }
}

impl Aggregate {
    /// Aggregate the records a selection keeps.
    ///
    /// Records are taken in batches and folded in parallel.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// use cpt_collector::aggregate::Aggregate;
    /// use cpt_collector::selection::Selection;
    /// use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
    /// use cpt_sdk::record::Record;
    /// use cpt_sdk::trigger::Trigger;
    ///
    /// let mut p = CriticalPath::new();
    /// p.push_frames([Frame::new("A", "A1")], Duration::from_millis(3), SegmentKind::Busy);
    /// let agg = Aggregate::from_records(&Selection::new(), [Record::new("A", Trigger::Sampled, p)]);
    /// assert_eq!(agg.requests(), 1);
    /// assert_eq!(agg.mean_latency(), Duration::from_millis(3));
    /// ```
    pub fn from_records<I>(sel: &Selection, records: I) -> Aggregate
    where
        I: IntoIterator,
        I::Item: Borrow<Record> + Send + Sync,
    {
        Self::fold(Aggregator::new(sel.clone()), records)
    }

    /// [`Aggregate::from_records`] with per-stack latency histograms
    /// (see [`Aggregator::with_histograms`]).
    pub fn from_records_with_histograms<I>(sel: &Selection, records: I) -> Aggregate
    where
        I: IntoIterator,
        I::Item: Borrow<Record> + Send + Sync,
    {
        Self::fold(Aggregator::new(sel.clone()).with_histograms(true), records)
    }

    fn fold<I>(mut agg: Aggregator, records: I) -> Aggregate
    where
        I: IntoIterator,
        I::Item: Borrow<Record> + Send + Sync,
    {
        let mut batch = Vec::with_capacity(BATCH);
        for r in records {
            batch.push(r);
            if batch.len() == BATCH {
                agg.push_batch(&batch);
                batch.clear();
            }
        }
        agg.push_batch(&batch);
        agg.finish()
    }

    /// An aggregate from parts (used when reading a profile back).
    ///
    /// Frames and stacks are put in canonical order, equal stacks merged and
    /// empty ones dropped.
    ///
    /// # Panics
    ///
    /// If a stack names a frame index out of range.
    pub fn from_parts(
        frames: Vec<Frame>,
        stacks: Vec<StackStats>,
        requests: u64,
        comments: Vec<String>,
    ) -> Aggregate {
        let latency_sum_nanos = stacks
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.sum_nanos));
        let mut agg = Aggregate {
            frames,
            stacks,
            requests,
            latency_sum_nanos,
            latency: None,
            accounting: Accounting::default(),
            start_range: None,
            comments,
        };
        agg.canonicalize();
        agg
    }

    /// The frame table (canonical order: by service, name, location).
    pub fn frames(&self) -> &[Frame] {
        &self.frames
    }

    /// The sample stacks (canonical order: lexicographic by frame).
    pub fn stacks(&self) -> &[StackStats] {
        &self.stacks
    }

    /// The frames of a stack, root first.
    pub fn stack_frames<'a>(&'a self, s: &'a StackStats) -> impl Iterator<Item = &'a Frame> + 'a {
        s.stack.iter().map(|&i| &self.frames[i as usize])
    }

    /// Number of selected requests.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Summed latency of the selected requests (= sum of all stacks' sums).
    pub fn latency_sum(&self) -> Duration {
        Duration::from_nanos(self.latency_sum_nanos)
    }

    /// Mean latency of the selected requests (zero when none).
    pub fn mean_latency(&self) -> Duration {
        Duration::from_nanos(div_round(u128::from(self.latency_sum_nanos), self.requests))
    }

    /// Distribution of request latency, when computed from records.
    pub fn latency_detail(&self) -> Option<&Detail> {
        self.latency.as_ref()
    }

    /// The selected records' accounting, summed.
    pub fn accounting(&self) -> &Accounting {
        &self.accounting
    }

    /// Earliest and latest `start_unix_nanos` among the selected records.
    pub fn start_range(&self) -> Option<(u64, u64)> {
        self.start_range
    }

    /// Set the earliest and latest request start (when read from a profile).
    pub fn set_start_range(&mut self, first_unix_nanos: u64, last_unix_nanos: u64) {
        self.start_range = Some((first_unix_nanos, last_unix_nanos));
    }

    /// Free-form notes carried into the profile's comments (selection, inputs).
    pub fn comments(&self) -> &[String] {
        &self.comments
    }

    /// Add a note for the profile's comments.
    pub fn push_comment(&mut self, c: impl Into<String>) {
        self.comments.push(c.into());
    }

    /// Each stack's mean time per request in nanoseconds, rounded so that the
    /// values add up exactly to the rounded mean latency (largest remainder
    /// method; ties go to the earlier stack). Same order as [`Aggregate::stacks`].
    pub fn mean_nanos(&self) -> Vec<u64> {
        apportion(
            self.stacks.iter().map(|s| s.sum_nanos),
            self.requests,
            self.latency_sum_nanos,
        )
    }

    /// Merge another aggregate into this one: sums and counts add, so means
    /// stay `sum of sums / sum of counts`. Spread detail survives only if both
    /// sides have it.
    pub fn merge(&mut self, other: &Aggregate) {
        let mut index: FxMap<Frame, u32> = self
            .frames
            .iter()
            .enumerate()
            .map(|(i, f)| (f.clone(), i as u32))
            .collect();
        let remap: Vec<u32> = other
            .frames
            .iter()
            .map(|f| {
                *index.entry(f.clone()).or_insert_with(|| {
                    self.frames.push(f.clone());
                    (self.frames.len() - 1) as u32
                })
            })
            .collect();
        for s in &other.stacks {
            let mut s = s.clone();
            s.stack = s.stack.iter().map(|&i| remap[i as usize]).collect();
            self.stacks.push(s);
        }
        self.requests += other.requests;
        self.latency_sum_nanos = self
            .latency_sum_nanos
            .saturating_add(other.latency_sum_nanos);
        self.latency = match (self.latency.take(), &other.latency) {
            (Some(mut a), Some(b)) => {
                a.merge(b);
                Some(a)
            }
            _ => None,
        };
        self.accounting.add(&other.accounting);
        self.start_range = match (self.start_range, other.start_range) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (x, None) | (None, x) => x,
        };
        for c in &other.comments {
            if !self.comments.contains(c) {
                self.comments.push(c.clone());
            }
        }
        self.canonicalize();
    }

    /// Sort frames and stacks into canonical order, merge equal stacks, drop
    /// unused frames: equal aggregates then encode to equal bytes.
    fn canonicalize(&mut self) {
        let mut order: Vec<u32> = (0..self.frames.len() as u32).collect();
        order.sort_by(|&a, &b| self.frames[a as usize].cmp(&self.frames[b as usize]));
        let mut used = vec![false; self.frames.len()];
        for s in &self.stacks {
            for &f in s.stack.iter() {
                used[f as usize] = true;
            }
        }
        let mut remap = vec![u32::MAX; self.frames.len()];
        let mut frames = Vec::with_capacity(self.frames.len());
        for &old in &order {
            if used[old as usize] {
                remap[old as usize] = frames.len() as u32;
                frames.push(self.frames[old as usize].clone());
            }
        }
        self.frames = frames;
        for s in &mut self.stacks {
            for f in s.stack.iter_mut() {
                *f = remap[*f as usize];
            }
        }
        self.stacks.sort_by(|a, b| a.stack.cmp(&b.stack));
        let mut out: Vec<StackStats> = Vec::with_capacity(self.stacks.len());
        for s in self.stacks.drain(..) {
            match out.last_mut() {
                Some(last) if last.stack == s.stack => {
                    last.sum_nanos = last.sum_nanos.saturating_add(s.sum_nanos);
                    last.requests += s.requests;
                    last.detail = match (last.detail.take(), s.detail) {
                        (Some(mut a), Some(b)) => {
                            a.merge(&b);
                            Some(a)
                        }
                        _ => None,
                    };
                }
                _ => out.push(s),
            }
        }
        out.retain(|s| s.sum_nanos > 0 || s.requests > 0);
        self.stacks = out;
    }
}

/// `round(n / d)`, 0 when `d == 0`.
pub(crate) fn div_round(n: u128, d: u64) -> u64 {
    if d == 0 {
        return 0;
    }
    let d = u128::from(d);
    u64::try_from((n + d / 2) / d).unwrap_or(u64::MAX)
}

/// Divide each sum by `n`, rounding so the results add up to `round(total/n)`.
fn apportion(sums: impl Iterator<Item = u64>, n: u64, total: u64) -> Vec<u64> {
    if n == 0 {
        return sums.map(|_| 0).collect();
    }
    let mut out = Vec::new();
    let mut rems = Vec::new();
    for (i, s) in sums.enumerate() {
        out.push(s / n);
        rems.push((s % n, i));
    }
    let target = div_round(u128::from(total), n);
    let floor_sum: u64 = out.iter().sum();
    let mut extra = target.saturating_sub(floor_sum) as usize;
    rems.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(r, i) in &rems {
        if extra == 0 || r == 0 {
            break;
        }
        out[i] += 1;
        extra -= 1;
    }
    out
}

/// The bytes of a short string folded into one word: two overlapping
/// loads, as `rustc_hash` hashes strings, without its final mixing (the
/// caller mixes once per frame). Longer strings go through `rustc_hash`.
#[inline]
fn str_word(b: &[u8]) -> u64 {
    let n = b.len();
    let (x, y) = if n > 16 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = FxBuildHasher.build_hasher();
        h.write(b);
        return h.finish();
    } else if n >= 8 {
        (w8(b, 0), w8(b, n - 8))
    } else if n >= 4 {
        (u64::from(w4(b, 0)), u64::from(w4(b, n - 4)))
    } else if n > 0 {
        (
            u64::from(b[0]),
            u64::from(b[n - 1]) << 8 | u64::from(b[n / 2]),
        )
    } else {
        (0, 0)
    };
    x ^ y.rotate_left(29) ^ ((n as u64) << 58)
}

#[inline]
fn w8(s: &[u8], i: usize) -> u64 {
    u64::from_ne_bytes(s[i..i + 8].try_into().expect("8 bytes"))
}

#[inline]
fn w4(s: &[u8], i: usize) -> u32 {
    u32::from_ne_bytes(s[i..i + 4].try_into().expect("4 bytes"))
}

/// Hash of name, service and line; the file is left to the comparison
/// (one node name rarely lives in two files), which saves hashing the
/// longest string of the frame.
#[inline]
fn frame_hash(f: &Frame) -> u64 {
    const K1: u64 = 0xf135_7aea_2e62_a9c5;
    const K2: u64 = 0x9e37_79b9_7f4a_7c15;
    let line = f.location.as_ref().map_or(u32::MAX, |l| l.line);
    let h = str_word(f.name.as_bytes()).wrapping_mul(K1) ^ str_word(f.service.as_bytes());
    let h = (h ^ u64::from(line)).wrapping_mul(K2);
    h ^ (h >> 29)
}

/// Byte equality without a `memcmp` call: the strings compared here are a
/// few bytes long, and the call and its length dispatch cost more than the
/// comparison. Short inputs are compared as two overlapping words (the
/// trick `rustc_hash` uses to hash them), longer ones word by word.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n >= 8 {
        let mut i = 0;
        while i + 8 < n {
            if w8(a, i) != w8(b, i) {
                return false;
            }
            i += 8;
        }
        w8(a, n - 8) == w8(b, n - 8)
    } else if n >= 4 {
        w4(a, 0) == w4(b, 0) && w4(a, n - 4) == w4(b, n - 4)
    } else if n > 0 {
        a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1]
    } else {
        true
    }
}

#[inline]
fn same_str(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || same_bytes(a.as_bytes(), b.as_bytes())
}

fn same_frame(a: &Frame, b: &Frame) -> bool {
    same_str(&a.name, &b.name)
        && same_str(&a.service, &b.service)
        && match (&a.location, &b.location) {
            (None, None) => true,
            (Some(x), Some(y)) => x.line == y.line && same_str(&x.file, &y.file),
            _ => false,
        }
}

/// Hash of a sample stack's frame ids (FxHash's multiply-rotate, one step
/// per frame).
#[inline]
fn stack_hash(ids: &[u32]) -> u64 {
    const K: u64 = 0xf135_7aea_2e62_a9c5;
    let mut h = ids.len() as u64;
    for &f in ids {
        h = (h.rotate_left(26) ^ u64::from(f)).wrapping_mul(K);
    }
    h.rotate_left(26)
}

/// A partial's sample stacks (trie nodes some segment ended at) by their
/// frame ids, so a segment finds its node with one hash of its ids, one
/// probe and one comparison instead of a hash lookup per level of the trie.
/// Open addressing with linear probing, at most half full; each entry's ids
/// are kept in one arena.
#[derive(Debug, Default)]
struct StackIndex {
    /// `(hash, node + 1, start of the ids in the arena, their count)`;
    /// node + 1 of 0 marks an empty slot. Length a power of two.
    slots: Vec<(u64, u32, u32, u32)>,
    len: usize,
    arena: Vec<u32>,
}

impl StackIndex {
    /// The node of the stack `ids` (whose [`stack_hash`] is `h`), if present.
    #[inline]
    fn find(&self, h: u64, ids: &[u32]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            let (sh, node1, at, n) = self.slots[i];
            if node1 == 0 {
                return None;
            }
            if sh == h && n as usize == ids.len() {
                let stored = &self.arena[at as usize..][..ids.len()];
                // Elementwise, not `==`: a `memcmp` call costs more than
                // these few ids.
                if stored.iter().zip(ids).all(|(a, b)| a == b) {
                    return Some(node1 - 1);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Add stack `ids` (hash `h`, known absent) ending at `node`.
    fn insert(&mut self, h: u64, ids: &[u32], node: u32) {
        if (self.len + 1) * 2 > self.slots.len() {
            let size = (self.slots.len() * 2).max(256);
            let old = std::mem::replace(&mut self.slots, vec![(0, 0, 0, 0); size]);
            for e in old {
                if e.1 != 0 {
                    self.place(e);
                }
            }
        }
        let at = u32::try_from(self.arena.len())
            .expect("stack arena over 4 Gi frame ids; this is a bug");
        self.arena.extend_from_slice(ids);
        self.place((h, node + 1, at, ids.len() as u32));
        self.len += 1;
    }

    fn place(&mut self, e: (u64, u32, u32, u32)) {
        let mask = self.slots.len() - 1;
        let mut i = e.0 as usize & mask;
        while self.slots[i].1 != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = e;
    }
}

/// Parent of a top-level trie node.
const NO_PARENT: u32 = u32::MAX;

/// Records per work item of [`Aggregator::push_batch`]: small enough to
/// balance two workers when one is slowed, large enough that taking a free
/// partial per item costs nothing.
const CHUNK: usize = 512;

/// Records per batch in [`Aggregate::from_records`].
const BATCH: usize = 16 * 1024;

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
    sel: Selection,
    parts: Vec<Partial>,
    ordinal: u64,
    offered: u64,
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
        let free = Mutex::new(std::mem::take(&mut self.parts));
        let lock = || free.lock().unwrap_or_else(PoisonError::into_inner);
        rs.par_chunks(CHUNK).enumerate().for_each(|(ci, recs)| {
            let taken = lock().pop();
            let mut part = taken.unwrap_or_else(|| {
                let mut p = Partial::new(keep);
                p.histograms = histograms;
                p
            });
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
        agg
    }
}

/// A per-request contribution kept for the percentile band.
#[derive(Debug)]
struct Kept {
    latency: u64,
    ordinal: u64,
    end: usize,
    start_unix_nanos: Option<u64>,
    accounting: Accounting,
}

/// One worker's share: its own interner and dense per-stack sums.
#[derive(Debug)]
struct Partial {
    frames: Vec<Frame>,
    /// Frames by [`frame_hash`]: open addressing with linear probing, at
    /// most half full; `(hash, frame id + 1)`, 0 marking an empty slot.
    /// Frames with one hash are both kept, a probe apart.
    frame_slots: Vec<(u64, u32)>,
    /// Stack trie: node → (parent node or NO_PARENT, frame); every node is a
    /// stack (root..=node), and sums are indexed by node.
    nodes: Vec<(u32, u32)>,
    node_ix: FxMap<u64, u32>,
    sums: Vec<u64>,
    counts: Vec<u64>,
    details: Vec<Detail>,
    kind_frames: [u32; 4],
    /// [`NO_FRAMES`]: busy time whose segment has an empty stack.
    no_frames: u32,
    // per-record scratch, reused
    local: Vec<u32>,
    /// Sample stacks by their frame ids (see [`StackIndex`]).
    stack_ix: StackIndex,
    /// The current segment's sample stack (frame ids), reused.
    key: Vec<u32>,
    cur: Vec<u64>,
    touched: Vec<u32>,
    // totals
    matched: u64,
    requests: u64,
    latency_sum: u64,
    latency: Detail,
    accounting: Accounting,
    start_range: Option<(u64, u64)>,
    // percentile band: contributions kept until finish
    keep: bool,
    histograms: bool,
    kept: Vec<Kept>,
    entries: Vec<(u32, u64)>,
}

impl Partial {
    fn new(keep: bool) -> Self {
        let mut p = Partial {
            frames: Vec::new(),
            frame_slots: vec![(0, 0); 256],
            nodes: Vec::new(),
            node_ix: FxMap::default(),
            sums: Vec::new(),
            counts: Vec::new(),
            details: Vec::new(),
            kind_frames: [0; 4],
            no_frames: 0,
            local: Vec::new(),
            stack_ix: StackIndex::default(),
            key: Vec::new(),
            cur: Vec::new(),
            touched: Vec::new(),
            matched: 0,
            requests: 0,
            latency_sum: 0,
            latency: Detail::default(),
            accounting: Accounting::default(),
            start_range: None,
            keep,
            histograms: false,
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
    fn intern_frame(&mut self, f: &Frame) -> u32 {
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
    fn child(&mut self, parent: u32, frame: u32) -> u32 {
        let key = (u64::from(parent) << 32) | u64::from(frame);
        if let Some(&n) = self.node_ix.get(&key) {
            return n;
        }
        let n = self.nodes.len() as u32;
        self.nodes.push((parent, frame));
        self.node_ix.insert(key, n);
        self.sums.push(0);
        self.counts.push(0);
        self.details.push(Detail::default());
        self.cur.push(0);
        n
    }

    fn push(&mut self, sel: &Selection, r: &Record, ordinal: u64) {
        if !sel.matches(r) {
            return;
        }
        self.matched += 1;
        let path = &r.path;
        self.local.clear();
        for f in path.frames() {
            let id = self.intern_frame(f);
            self.local.push(id);
        }
        let mut latency = 0u64;
        let mut key = std::mem::take(&mut self.key);
        for seg in path.segments() {
            let ns = u64::try_from(seg.duration.as_nanos()).unwrap_or(u64::MAX);
            if ns == 0 {
                continue;
            }
            latency = latency.saturating_add(ns);
            // The sample stack: the segment's frames, then the kind's
            // synthetic leaf. Look the whole stack up at once by its frame
            // ids; walk the trie only for a stack not seen before.
            key.clear();
            key.extend(seg.stack.iter().map(|id| self.local[id.0 as usize]));
            if seg.kind != SegmentKind::Busy {
                key.push(self.kind_frames[kind_slot(seg.kind)]);
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
            let c = &mut self.cur[sid as usize];
            if *c == 0 {
                self.touched.push(sid);
            }
            *c = c.saturating_add(ns);
        }
        self.key = key;
        if self.keep {
            for &s in &self.touched {
                let v = std::mem::take(&mut self.cur[s as usize]);
                self.entries.push((s, v));
            }
            self.touched.clear();
            self.kept.push(Kept {
                latency,
                ordinal,
                end: self.entries.len(),
                start_unix_nanos: r.start_unix_nanos,
                accounting: r.path.accounting,
            });
        } else {
            for &s in &self.touched {
                let s = s as usize;
                let v = std::mem::take(&mut self.cur[s]);
                self.sums[s] = self.sums[s].saturating_add(v);
                self.counts[s] += 1;
                self.details[s].add(v, self.histograms);
            }
            self.touched.clear();
            self.add_request(latency, r.start_unix_nanos, &r.path.accounting);
        }
    }

    fn add_request(&mut self, latency: u64, start: Option<u64>, acc: &Accounting) {
        self.requests += 1;
        self.latency_sum = self.latency_sum.saturating_add(latency);
        self.latency.add(latency, true);
        self.accounting.add(acc);
        if let Some(t) = start {
            self.start_range = Some(match self.start_range {
                Some((a, b)) => (a.min(t), b.max(t)),
                None => (t, t),
            });
        }
    }

    /// Fold the kept contributions whose (latency, ordinal) is in `[lo, hi]`.
    fn fold_kept(&mut self, lo: (u64, u64), hi: (u64, u64)) {
        let kept = std::mem::take(&mut self.kept);
        let entries = std::mem::take(&mut self.entries);
        let mut begin = 0;
        for k in &kept {
            let key = (k.latency, k.ordinal);
            if key >= lo && key <= hi {
                for &(s, v) in &entries[begin..k.end] {
                    let s = s as usize;
                    self.sums[s] = self.sums[s].saturating_add(v);
                    self.counts[s] += 1;
                    self.details[s].add(v, self.histograms);
                }
                self.add_request(k.latency, k.start_unix_nanos, &k.accounting);
            }
            begin = k.end;
        }
    }

    /// The frames of trie node `n`, root first.
    fn stack_of(&self, mut n: u32) -> Box<[u32]> {
        let mut v = Vec::new();
        while n != NO_PARENT {
            let (parent, frame) = self.nodes[n as usize];
            v.push(frame);
            n = parent;
        }
        v.reverse();
        v.into()
    }

    fn into_aggregate(self) -> Aggregate {
        // Only nodes some segment ended at are sample stacks; inner prefixes
        // have no time and no requests and are dropped by canonicalize.
        let stacks: Vec<Box<[u32]>> = (0..self.nodes.len() as u32)
            .map(|n| {
                if self.counts[n as usize] > 0 {
                    self.stack_of(n)
                } else {
                    Box::from([])
                }
            })
            .collect();
        let stacks = stacks
            .into_iter()
            .zip(self.sums)
            .zip(self.counts)
            .zip(self.details)
            .map(|(((stack, sum_nanos), requests), detail)| StackStats {
                stack,
                sum_nanos,
                requests,
                detail: Some(detail),
            })
            .collect();
        let mut agg = Aggregate {
            frames: self.frames,
            stacks,
            requests: self.requests,
            latency_sum_nanos: self.latency_sum,
            latency: Some(self.latency),
            accounting: self.accounting,
            start_range: self.start_range,
            comments: Vec::new(),
        };
        agg.canonicalize();
        agg
    }
}

/// The frame stacks of an aggregate as `A1 (A);A2 (A)` strings with their
/// mean nanoseconds, sorted by value, largest first (for reports).
pub fn ranked_stacks(agg: &Aggregate) -> Vec<(String, u64)> {
    let means = agg.mean_nanos();
    let mut v: Vec<(String, u64)> = agg
        .stacks()
        .iter()
        .zip(means)
        .map(|(s, m)| (stack_label(agg, s, ";"), m))
        .collect();
    v.sort_by(|a, b| match b.1.cmp(&a.1) {
        Ordering::Equal => a.0.cmp(&b.0),
        o => o,
    });
    v
}

/// A stack's frames joined with `sep`, each as [`frame_label`].
pub fn stack_label(agg: &Aggregate, s: &StackStats, sep: &str) -> String {
    let mut out = String::new();
    for (i, f) in agg.stack_frames(s).enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        out.push_str(&frame_label(f));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use cpt_sdk::path::CriticalPath;
    use cpt_sdk::trigger::Trigger;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn a(name: &str) -> Frame {
        Frame::new("A", name)
    }

    /// One segment: stack of (service, name), milliseconds, kind.
    pub(crate) type Seg<'a> = (&'a [(&'a str, &'a str)], u64, SegmentKind);

    /// Build a record from segments.
    pub(crate) fn record(segs: &[Seg<'_>]) -> Record {
        let mut p = CriticalPath::new();
        for (stack, d, kind) in segs {
            p.push_frames(stack.iter().map(|(s, n)| Frame::new(*s, *n)), ms(*d), *kind);
        }
        Record::new("A", Trigger::Sampled, p)
    }

    fn means_by_label(agg: &Aggregate) -> Vec<(String, u64)> {
        agg.stacks()
            .iter()
            .zip(agg.mean_nanos())
            .map(|(s, m)| (stack_label(agg, s, "/"), m))
            .collect()
    }

    /// CPT Table 1: request 1 (16 ms): A1 self 6, A1/A2 10; request 2 (8 ms):
    /// A1 self 4, A1/B1 4. Aggregated: A1 5, A1/A2 5, A1/B1 2, total 12.
    pub(crate) fn table1() -> Vec<Record> {
        const A1: &[(&str, &str)] = &[("A", "A1")];
        const A1A2: &[(&str, &str)] = &[("A", "A1"), ("A", "A2")];
        const A1B1: &[(&str, &str)] = &[("A", "A1"), ("B", "B1")];
        vec![
            record(&[
                (A1, 3, SegmentKind::Busy),
                (A1A2, 10, SegmentKind::Busy),
                (A1, 3, SegmentKind::Busy),
            ]),
            record(&[
                (A1, 2, SegmentKind::Busy),
                (A1B1, 4, SegmentKind::Busy),
                (A1, 2, SegmentKind::Busy),
            ]),
        ]
    }

    #[test]
    fn cpt_table1_aggregation() {
        let agg = Aggregate::from_records(&Selection::new(), table1());
        assert_eq!(agg.requests(), 2);
        assert_eq!(
            means_by_label(&agg),
            vec![
                ("A1 (A)".to_string(), 5_000_000),
                ("A1 (A)/A2 (A)".to_string(), 5_000_000),
                ("A1 (A)/B1 (B)".to_string(), 2_000_000),
            ]
        );
        assert_eq!(agg.mean_latency(), ms(12));
        assert_eq!(agg.mean_nanos().iter().sum::<u64>(), 12_000_000);
        // A1 is on both paths, A2 and B1 on one each.
        let on_path: Vec<u64> = agg.stacks().iter().map(|s| s.requests).collect();
        assert_eq!(on_path, vec![2, 1, 1]);
        // Per-request values: A1 6 and 4 ms → sum of squares 52 ms².
        assert_eq!(
            agg.stacks()[0].detail.as_ref().unwrap().sum_sq,
            52 * 10u128.pow(12)
        );
    }

    #[test]
    fn aggregate_kinds_become_synthetic_leaves() {
        let r = record(&[
            (&[("A", "A1")], 1, SegmentKind::Queueing),
            (&[("A", "A1"), ("B", "rpc")], 2, SegmentKind::Network),
            (&[("A", "A1"), ("C", "rpc")], 3, SegmentKind::BlindSpot),
            (&[("A", "A1")], 4, SegmentKind::Unattributed),
            (&[("A", "A1")], 5, SegmentKind::Busy),
        ]);
        let agg = Aggregate::from_records(&Selection::new(), [r]);
        let got: Vec<String> = means_by_label(&agg).into_iter().map(|(l, _)| l).collect();
        assert_eq!(
            got,
            vec![
                "A1 (A)",
                "A1 (A)/[queueing]",
                "A1 (A)/[unattributed]",
                "A1 (A)/rpc (B)/[network]",
                "A1 (A)/rpc (C)/[blind spot]",
            ]
        );
        assert_eq!(agg.mean_latency(), ms(15));
    }

    /// A path coarsened to depth 0 (the codec's last resort over its size
    /// limit) keeps its time in segments without frames: busy time goes to
    /// `[no frames]`, other kinds to their leaf alone. Folding such a record
    /// used to index past the trie.
    #[test]
    fn aggregate_path_coarsened_to_depth_zero_keeps_its_time() {
        let mut r = record(&[
            (&[("A", "A1")], 4, SegmentKind::Queueing),
            (&[("A", "A1"), ("B", "B1")], 5, SegmentKind::Busy),
            (&[("A", "A1")], 1, SegmentKind::Busy),
        ]);
        r.path.coarsen(0);
        assert!(r.path.segments().iter().all(|s| s.stack.is_empty()));
        let with_frames = record(&[(&[("A", "A1")], 2, SegmentKind::Busy)]);
        let agg = Aggregate::from_records(&Selection::new(), [r, with_frames]);
        assert_eq!(
            means_by_label(&agg),
            vec![
                (NO_FRAMES.to_string(), 3_000_000),
                ("[queueing]".to_string(), 2_000_000),
                ("A1 (A)".to_string(), 1_000_000),
            ]
        );
        assert_eq!(agg.mean_latency(), ms(6));
    }

    #[test]
    fn aggregate_merge_keeps_the_average() {
        // One collector saw request 1 only, another request 2 only.
        let t = table1();
        let mut x = Aggregate::from_records(&Selection::new(), [&t[0]]);
        let y = Aggregate::from_records(&Selection::new(), [&t[1]]);
        assert_eq!(x.mean_latency(), ms(16));
        x.merge(&y);
        let whole = Aggregate::from_records(&Selection::new(), &t);
        assert_eq!(means_by_label(&x), means_by_label(&whole));
        assert_eq!(x.stacks(), whole.stacks());
        assert_eq!(x.mean_latency(), ms(12));
    }

    #[test]
    fn aggregate_is_deterministic_across_batching() {
        // Many records, pushed sequentially vs in parallel batches: same result.
        let mut recs = Vec::new();
        for i in 0..3000u64 {
            let leaf = format!("n{}", i % 37);
            let svc = if i % 3 == 0 { "B" } else { "C" };
            let mut p = CriticalPath::new();
            p.push_frames([a("root")], ms(1 + i % 5), SegmentKind::Busy);
            p.push_frames(
                [a("root"), Frame::new(svc, leaf.as_str())],
                ms(i % 7 + 1),
                SegmentKind::Busy,
            );
            recs.push(Record::new("A", Trigger::Sampled, p));
        }
        let par = Aggregate::from_records(&Selection::new(), &recs);
        let mut seq = Aggregator::new(Selection::new());
        for r in &recs {
            seq.push(r);
        }
        let seq = seq.finish();
        assert_eq!(par, seq);
        assert_eq!(par.requests(), 3000);
    }

    #[test]
    fn aggregate_percentile_band_uses_otherwise_selected_records() {
        // 10 sampled requests of 1..=10 ms plus one forced 100 ms request.
        let mut recs: Vec<Record> = (1..=10)
            .map(|n| record(&[(&[("A", "A1")], n, SegmentKind::Busy)]))
            .collect();
        let mut forced = record(&[(&[("A", "A1")], 100, SegmentKind::Busy)]);
        forced.trigger = Trigger::Forced;
        recs.push(forced);
        let band = crate::selection::PercentileBand::parse("p80-p100").unwrap();
        let agg = Aggregate::from_records(&Selection::new().with_percentile(band), &recs);
        // The forced record is not in the band's population: slowest 2 of 10.
        assert_eq!(agg.requests(), 2);
        assert_eq!(agg.mean_latency(), Duration::from_micros(9500));
        let low = crate::selection::PercentileBand::parse("p0-p80").unwrap();
        let agg = Aggregate::from_records(&Selection::new().with_percentile(low), &recs);
        assert_eq!(agg.requests(), 8);
        assert_eq!(agg.mean_latency(), Duration::from_micros(4500));
    }

    #[test]
    fn aggregate_matches_a_naive_fold() {
        // Records with their own copies of every string (as decoded from
        // the wire), many stacks sharing prefixes, every kind, frames with
        // and without locations, names long and short: the fold's sums and
        // counts equal a straightforward map from frame stacks.
        let mut x = 7u64;
        let mut rnd = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        let kinds = [
            SegmentKind::Busy,
            SegmentKind::Queueing,
            SegmentKind::Unattributed,
            SegmentKind::Network,
            SegmentKind::BlindSpot,
        ];
        let frame = |d: u64, k: u64| {
            let name = if k % 3 == 0 {
                format!("a_rather_long_handler_name_{d}_{k}")
            } else {
                format!("n{d}{k}")
            };
            let f = Frame::new(["A", "B", "svc-c"][(k % 3) as usize], name);
            if k % 2 == 0 {
                f.with_location(format!("src/m{}.rs", k % 4), d as u32)
            } else {
                f
            }
        };
        let mut recs = Vec::new();
        let mut naive: HashMap<(Vec<Frame>, SegmentKind), (u64, u64)> = HashMap::new();
        for _ in 0..500 {
            let mut p = CriticalPath::new();
            let mut mine: HashMap<(Vec<Frame>, SegmentKind), u64> = HashMap::new();
            for _ in 0..1 + rnd(12) {
                let depth = 1 + rnd(6);
                let stack: Vec<Frame> = (0..depth).map(|d| frame(d, rnd(5))).collect();
                let kind = kinds[rnd(5) as usize];
                let d = 1 + rnd(1000);
                p.push_frames(stack.iter().cloned(), Duration::from_nanos(d), kind);
                *mine.entry((stack, kind)).or_default() += d;
            }
            for (k, v) in mine {
                let e = naive.entry(k).or_default();
                e.0 += v;
                e.1 += 1;
            }
            recs.push(Record::new("A", Trigger::Sampled, p));
        }
        let agg = Aggregate::from_records(&Selection::new(), &recs);
        let got: HashMap<Vec<Frame>, (u64, u64)> = agg
            .stacks()
            .iter()
            .map(|s| {
                (
                    agg.stack_frames(s).cloned().collect(),
                    (s.sum_nanos, s.requests),
                )
            })
            .collect();
        let want: HashMap<Vec<Frame>, (u64, u64)> = naive
            .into_iter()
            .map(|((mut stack, kind), v)| {
                stack.extend(kind_frame(kind));
                (stack, v)
            })
            .collect();
        assert_eq!(got, want);
        assert_eq!(agg.requests(), 500);
    }

    #[test]
    fn aggregate_frames_differing_only_by_file_stay_apart() {
        // Same name, service and line hash alike; the file tells them apart.
        let mk = |file: &str| {
            let mut p = CriticalPath::new();
            let f = Frame::new("A", "handler").with_location(file, 12);
            p.push_frames([f], ms(1), SegmentKind::Busy);
            Record::new("A", Trigger::Sampled, p)
        };
        let agg = Aggregate::from_records(&Selection::new(), [mk("a.rs"), mk("b.rs"), mk("a.rs")]);
        let files: Vec<&str> = agg
            .frames()
            .iter()
            .map(|f| &*f.location.as_ref().unwrap().file)
            .collect();
        assert_eq!(files, ["a.rs", "b.rs"]);
        let sums: Vec<u64> = agg.stacks().iter().map(|s| s.sum_nanos).collect();
        assert_eq!(sums, [2_000_000, 1_000_000]);
    }

    #[test]
    fn mean_nanos_add_up_to_rounded_mean() {
        // Three stacks of 1 ns each over 2 requests: means 0.5 each → 2 of 3
        // rounded up so the total is round(1.5) = 2.
        #[rustfmt::skip]
        let cases: &[(&[u64], u64, &[u64])] = &[
            (&[1, 1, 1], 2, &[1, 1, 0]),
            (&[10, 6, 8], 2, &[5, 3, 4]),
            (&[5, 5], 3, &[2, 1]),
            (&[], 0, &[]),
        ];
        for (sums, n, want) in cases {
            let total = sums.iter().sum();
            assert_eq!(
                apportion(sums.iter().copied(), *n, total),
                *want,
                "{sums:?}/{n}"
            );
        }
    }
}
