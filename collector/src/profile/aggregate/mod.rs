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

use super::histogram::{Histogram, Quantile};
use crate::records::selection::Selection;

#[cfg(feature = "parquet")]
mod columns;
#[cfg(feature = "parquet")]
pub use columns::push_parquet;
pub mod file;
mod fold;
mod jsonl;
pub mod packed;

pub use jsonl::{BlockResult, push_json_block};
mod intern;
mod scan;

pub use fold::Aggregator;
use fold::BATCH;

type FxMap<K, V> = HashMap<K, V, FxBuildHasher>;

/// The synthetic frame that stands for busy time without frames (a segment
/// with an empty stack, as a path coarsened to depth 0 has).
pub const NO_FRAMES: &str = "[no frames]";

/// The synthetic leaf frame that stands for a non-busy segment kind
/// (`None` for [`SegmentKind::Busy`]: busy time is the leaf's own time; and
/// for [`SegmentKind::Wait`]: the stack's leaf is already the wait frame,
/// `[sleep src/main.rs:88]`).
///
/// Synthetic frames have an empty service, so [`frame_label`] shows just the
/// bracketed name.
pub fn kind_frame(kind: SegmentKind) -> Option<Frame> {
    let name = match kind {
        SegmentKind::Busy | SegmentKind::Wait => return None,
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

/// How a profile shows named waits (`[sleep src/main.rs:88]` leaves, see
/// [`SegmentKind::Wait`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Waits {
    /// Each resource site apart: `[sleep src/main.rs:88]`,
    /// `[semaphore pool/src/lib.rs:40]`.
    #[default]
    Site,
    /// One leaf per kind: `[sleep]`, `[semaphore]`, `[io]`.
    Kind,
}

/// True for the wait frame of a named wait: a frame of a service (not a
/// synthetic one) named `[kind]` or `[kind file:line]`.
pub fn is_wait_frame(f: &Frame) -> bool {
    !f.service.is_empty() && f.wait_kind().is_some()
}

/// The kinds that get a synthetic leaf frame ([`kind_frame`]).
pub(crate) const KINDS: [SegmentKind; 4] = [
    SegmentKind::Queueing,
    SegmentKind::Unattributed,
    SegmentKind::Network,
    SegmentKind::BlindSpot,
];

fn kind_slot(kind: SegmentKind) -> usize {
    match kind {
        SegmentKind::Busy | SegmentKind::Wait => usize::MAX,
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
    /// Every selected request's latency, ns, when the aggregator kept them
    /// ([`Aggregator::with_exact_latencies`]), so quantiles can be exact.
    latencies: Option<Vec<u64>>,
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
            latencies: None,
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
            latencies: None,
            accounting: Accounting::default(),
            start_range: None,
            comments,
        };
        agg.canonicalize();
        agg
    }

    /// An aggregate from every part a fold keeps, as the store's roll-ups
    /// hold them: frames, stacks with their spread, the request count and
    /// summed latency, the latency's spread, the summed accounting and the
    /// first and last request start. Canonicalized as a fold's result is,
    /// so equal parts give an aggregate equal to the fold of the same
    /// requests.
    ///
    /// # Panics
    ///
    /// If a stack names a frame index out of range.
    #[cfg(feature = "server")]
    pub(crate) fn from_totals(
        frames: Vec<Frame>,
        stacks: Vec<StackStats>,
        requests: u64,
        latency_sum_nanos: u64,
        latency: Option<Detail>,
        accounting: Accounting,
        start_range: Option<(u64, u64)>,
    ) -> Aggregate {
        let mut agg = Aggregate {
            frames,
            stacks,
            requests,
            latency_sum_nanos,
            latency,
            latencies: None,
            accounting,
            start_range,
            comments: Vec::new(),
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

    /// The `q`-quantile of the selected requests' latency: exact (nearest
    /// rank, as the store's endpoint summaries compute it) when the
    /// aggregator kept every latency
    /// ([`Aggregator::with_exact_latencies`]), else from the latency
    /// histogram with the range the exact value lies in.
    pub fn latency_quantile(&self, q: f64) -> Quantile {
        match &self.latencies {
            Some(v) if !v.is_empty() => {
                let mut v = v.clone();
                let i = super::histogram::nearest_rank(q, v.len());
                Quantile::exact(*v.select_nth_unstable(i).1)
            }
            _ => self
                .latency
                .as_ref()
                .map(|d| d.histogram.quantile_range(q))
                .unwrap_or(Quantile::exact(0)),
        }
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
        // Exact latencies survive only if both sides kept them (an empty
        // side has none to keep).
        self.latencies = match (self.latencies.take(), &other.latencies) {
            (a, _) if other.requests == 0 => a,
            (_, b) if self.requests == 0 => b.clone(),
            (Some(mut a), Some(b)) => {
                a.extend_from_slice(b);
                Some(a)
            }
            _ => None,
        };
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
    /// Group named waits as `waits` says: with [`Waits::Kind`], every wait
    /// frame becomes `[kind]` without a location, and stacks that become
    /// equal are merged (their times add up exactly; their request counts
    /// and spreads are added as if they were different requests, so a
    /// request that waited on two sleeps of one node counts twice there).
    pub fn group_waits(&mut self, waits: Waits) {
        if waits == Waits::Site {
            return;
        }
        let mut changed = false;
        for f in &mut self.frames {
            if is_wait_frame(f)
                && let Some(kind) = f.wait_kind()
                && (f.location.is_some() || f.name.len() != kind.len() + 2)
            {
                *f = Frame::wait(f.service.clone(), kind, None);
                changed = true;
            }
        }
        if changed {
            // Equal frames get one index, and equal stacks merge.
            let mut first: HashMap<Frame, u32> = HashMap::new();
            let remap: Vec<u32> = (0..self.frames.len() as u32)
                .map(|i| *first.entry(self.frames[i as usize].clone()).or_insert(i))
                .collect();
            for s in &mut self.stacks {
                for f in s.stack.iter_mut() {
                    *f = remap[*f as usize];
                }
            }
            self.canonicalize();
        }
    }

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
pub(crate) mod tests;
