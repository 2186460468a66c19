//! Roll-ups: the average critical path of every (service, endpoint), kept
//! per hour and then per day long after the raw records are deleted.
//!
//! A roll-up is what a fold of the period's sampled requests keeps (an
//! [`Aggregate`]: per sample stack the summed nanoseconds, the number of
//! requests it was on the path of and the sum of squares; the request
//! count, summed latency, its sum of squares and histogram; the summed
//! accounting; the first and last request start), with frames as ids into
//! the store's `frames` table, plus a finer latency histogram
//! ([`LatencyHistogram`], p50 and p99 within 2 %) for trends. Every part is
//! a sum, so roll-ups of disjoint sets of requests merge exactly (CPT
//! "Aggregation and Visualization": sums and counts, never means), and a
//! profile answered from roll-ups is byte-identical to the fold of the raw
//! records it replaces.
//!
//! # Tables (schema version 6)
//!
//! - `rollups (id, resolution, bucket, service, endpoint, requests,
//!   first_start_unix_nanos, last_start_unix_nanos, body)`: one row per
//!   period and (service, endpoint). `resolution` is the period in seconds
//!   (3 600 hourly, 86 400 daily, 0 for sampled records without a start
//!   time), `bucket` the period's start in Unix seconds; `body` is the
//!   roll-up in the form [`Rollup::encode`] writes.
//! - `store_state (name, value)`: how far the roll-ups reach and what
//!   retention removed (see [`State`]).
//!
//! # When a record is rolled up
//!
//! The writer rolls up committed records in id order, in small transactions
//! that also advance `rolled_up_through`, the highest record id rolled up
//! ([`Store::roll_up`](super::Store::roll_up)). Retention deletes only
//! records at or below it, in transactions of their own: a sampled record is
//! raw, or rolled up, or both, and never neither, also after `kill -9` at
//! any point. A sampled record that arrives already older than the raw
//! window goes into the roll-ups in its batch's own transaction and is
//! never stored raw.
//!
//! Forced records are not a random sample and are never rolled up: they are
//! kept raw as long as retention keeps raw records (`--retain-for`, and the
//! oldest first past `--max-store-bytes`), then deleted with no roll-up
//! standing for them; one that arrives already older than the raw window is
//! not kept. [`State::too_old_forced`] and [`State::deleted_forced`] count
//! them apart (`/metrics`: `cpt_forced_records_too_old_total`,
//! `cpt_forced_records_deleted_by_retention_total`).

use std::time::Duration;

use cpt_sdk::path::{Accounting, Frame};
use rustc_hash::FxHashMap;

use crate::profile::aggregate::{Aggregate, Detail, NO_FRAMES, StackStats, kind_frame};
use crate::profile::histogram::Histogram;

pub(super) mod answer;
mod codec;
mod latency;
pub(super) mod pass;
mod state;
mod trend;

pub use answer::ProfileSource;
pub use latency::LatencyHistogram;
pub use pass::{CompactStep, RollUpStep};
pub use state::State;
pub use trend::{DEFAULT_TOP, Trend, TrendPoint, TrendQuery};

/// The first schema version with `rollups` and `store_state`.
pub(super) const ROLLUP_VERSION: i64 = 6;

pub(super) const ROLLUP_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS rollups (
    id                     INTEGER PRIMARY KEY,
    resolution             INTEGER NOT NULL,
    bucket                 INTEGER NOT NULL,
    service                TEXT NOT NULL,
    endpoint               TEXT,
    requests               INTEGER NOT NULL,
    first_start_unix_nanos INTEGER,
    last_start_unix_nanos  INTEGER,
    body                   BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS rollups_by_key ON rollups (service, endpoint, resolution, bucket);
CREATE INDEX IF NOT EXISTS rollups_by_time ON rollups (resolution, bucket);
CREATE TABLE IF NOT EXISTS store_state (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
";

/// An hourly roll-up's period, seconds.
pub const HOUR: u64 = 3_600;
/// A daily roll-up's period, seconds.
pub const DAY: u64 = 86_400;
/// The "period" of the sampled records that have no start time.
pub(super) const UNPLACED: u64 = 0;

const NANOS: u64 = 1_000_000_000;

/// The period of `resolution` seconds holding `start_unix_nanos`, as its
/// first second.
pub(super) fn bucket_of(start_unix_nanos: u64, resolution: u64) -> u64 {
    if resolution == UNPLACED {
        return 0;
    }
    start_unix_nanos / NANOS / resolution * resolution
}

/// The synthetic leaves a sample stack may end in, in the order a frame
/// reference below [`SYNTHETIC`] names them.
fn synthetic_frames() -> [Frame; 5] {
    use cpt_sdk::path::SegmentKind::*;
    [
        Frame::new("", NO_FRAMES),
        kind_frame(Queueing).expect("a kind frame"),
        kind_frame(Unattributed).expect("a kind frame"),
        kind_frame(Network).expect("a kind frame"),
        kind_frame(BlindSpot).expect("a kind frame"),
    ]
}

/// Frame references below this are synthetic leaves; a stored frame `id` is
/// referenced as `id + SYNTHETIC`.
const SYNTHETIC: u64 = 8;

/// One sample stack's sums in a roll-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackSums {
    /// Nanoseconds on the critical path, summed over requests.
    pub sum_nanos: u64,
    /// Requests the stack was on the path of.
    pub requests: u64,
    /// Sum over requests of the per-request time squared, ns².
    pub sum_sq: u128,
}

impl StackSums {
    fn add(&mut self, o: &StackSums) {
        self.sum_nanos = self.sum_nanos.saturating_add(o.sum_nanos);
        self.requests += o.requests;
        self.sum_sq = self.sum_sq.saturating_add(o.sum_sq);
    }
}

/// The sums of one period's sampled requests of one (service, endpoint), or
/// of several merged. Stacks are frame references: a stored frame's id in
/// the `frames` table plus 8, or below 8 one of the synthetic leaves
/// (`[no frames]`, `[queueing]`, `[unattributed]`, `[network]`,
/// `[blind spot]`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rollup {
    /// Requests rolled up.
    pub requests: u64,
    /// Their latency, summed, ns.
    pub latency_sum_nanos: u64,
    /// Their latency squared, summed, ns².
    pub latency_sum_sq: u128,
    /// Their latency as a fold's aggregate keeps it.
    pub latency: Histogram,
    /// Their latency at trend resolution.
    pub latency_fine: LatencyHistogram,
    /// Their accounting, summed, ns, in [`Accounting`]'s field order.
    pub accounting: [u64; 7],
    /// The first and last request start, ns since the Unix epoch.
    pub start_range: Option<(u64, u64)>,
    /// Per sample stack (frame references, root first), its sums.
    pub stacks: FxHashMap<Box<[u64]>, StackSums>,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn accounting_ns(a: &Accounting) -> [u64; 7] {
    [
        ns(a.network),
        ns(a.overcount),
        ns(a.blind_spot),
        ns(a.unattributed),
        ns(a.queueing),
        ns(a.truncated),
        ns(a.clock_skew),
    ]
}

impl Rollup {
    /// Add a fold's aggregate of requests not rolled up here yet, naming
    /// each stored frame by `frame_id` (its id in the `frames` table).
    ///
    /// # Errors
    ///
    /// What `frame_id` fails with.
    pub(super) fn absorb<E>(
        &mut self,
        agg: &Aggregate,
        mut frame_id: impl FnMut(&Frame) -> Result<u64, E>,
    ) -> Result<(), E> {
        let synthetic = synthetic_frames();
        let mut refs = Vec::with_capacity(agg.frames().len());
        for f in agg.frames() {
            refs.push(match synthetic.iter().position(|s| s == f) {
                Some(i) => i as u64,
                None => frame_id(f)? + SYNTHETIC,
            });
        }
        for s in agg.stacks() {
            let key: Box<[u64]> = s.stack.iter().map(|&i| refs[i as usize]).collect();
            self.stacks.entry(key).or_default().add(&StackSums {
                sum_nanos: s.sum_nanos,
                requests: s.requests,
                sum_sq: s.detail.as_ref().map_or(0, |d| d.sum_sq),
            });
        }
        self.requests += agg.requests();
        self.latency_sum_nanos = self.latency_sum_nanos.saturating_add(ns(agg.latency_sum()));
        if let Some(d) = agg.latency_detail() {
            self.latency_sum_sq = self.latency_sum_sq.saturating_add(d.sum_sq);
            self.latency.merge(&d.histogram);
        }
        for (a, b) in self
            .accounting
            .iter_mut()
            .zip(accounting_ns(agg.accounting()))
        {
            *a = a.saturating_add(b);
        }
        self.start_range = merge_range(self.start_range, agg.start_range());
        Ok(())
    }

    /// Add another roll-up (of other requests).
    pub fn merge(&mut self, o: &Rollup) {
        for (k, v) in &o.stacks {
            match self.stacks.get_mut(k) {
                Some(s) => s.add(v),
                None => {
                    self.stacks.insert(k.clone(), *v);
                }
            }
        }
        self.requests += o.requests;
        self.latency_sum_nanos = self.latency_sum_nanos.saturating_add(o.latency_sum_nanos);
        self.latency_sum_sq = self.latency_sum_sq.saturating_add(o.latency_sum_sq);
        self.latency.merge(&o.latency);
        self.latency_fine.merge(&o.latency_fine);
        for (a, b) in self.accounting.iter_mut().zip(o.accounting) {
            *a = a.saturating_add(b);
        }
        self.start_range = merge_range(self.start_range, o.start_range);
    }

    /// The aggregate a fold of the same requests gives, frames looked up by
    /// id with `frame` (`None`: the id is not in the table).
    ///
    /// # Errors
    ///
    /// A stored frame id `frame` does not know, as that id.
    pub fn to_aggregate(&self, frame: impl Fn(u64) -> Option<Frame>) -> Result<Aggregate, u64> {
        let synthetic = synthetic_frames();
        let mut index: FxHashMap<u64, u32> = FxHashMap::default();
        let mut by_value: FxHashMap<Frame, u32> = FxHashMap::default();
        let mut frames: Vec<Frame> = Vec::new();
        let mut stacks = Vec::with_capacity(self.stacks.len());
        for (key, sums) in &self.stacks {
            let mut stack = Vec::with_capacity(key.len());
            for &r in key.iter() {
                let i = match index.get(&r) {
                    Some(&i) => i,
                    None => {
                        let f = if r < SYNTHETIC {
                            synthetic.get(r as usize).cloned().ok_or(r)?
                        } else {
                            frame(r - SYNTHETIC).ok_or(r - SYNTHETIC)?
                        };
                        let next = frames.len() as u32;
                        let i = *by_value.entry(f.clone()).or_insert_with(|| {
                            frames.push(f);
                            next
                        });
                        index.insert(r, i);
                        i
                    }
                };
                stack.push(i);
            }
            stacks.push(StackStats {
                stack: stack.into(),
                sum_nanos: sums.sum_nanos,
                requests: sums.requests,
                detail: Some(Detail {
                    sum_sq: sums.sum_sq,
                    histogram: Histogram::new(),
                }),
            });
        }
        let d = |i: usize| Duration::from_nanos(self.accounting[i]);
        let accounting = Accounting {
            network: d(0),
            overcount: d(1),
            blind_spot: d(2),
            unattributed: d(3),
            queueing: d(4),
            truncated: d(5),
            clock_skew: d(6),
        };
        Ok(Aggregate::from_totals(
            frames,
            stacks,
            self.requests,
            self.latency_sum_nanos,
            Some(Detail {
                sum_sq: self.latency_sum_sq,
                histogram: self.latency.clone(),
            }),
            accounting,
            self.start_range,
        ))
    }

    /// Each stack's leaf as a frame reference with its summed nanoseconds
    /// (for trends: which frames the time went to).
    pub fn leaf_sums(&self) -> FxHashMap<u64, u64> {
        let mut out: FxHashMap<u64, u64> = FxHashMap::default();
        for (k, s) in &self.stacks {
            if let Some(&leaf) = k.last() {
                let e = out.entry(leaf).or_default();
                *e = e.saturating_add(s.sum_nanos);
            }
        }
        out
    }

    /// The frame a reference names (`None`: a stored id `frame` lacks).
    pub fn frame_of(r: u64, frame: impl Fn(u64) -> Option<Frame>) -> Option<Frame> {
        if r < SYNTHETIC {
            synthetic_frames().get(r as usize).cloned()
        } else {
            frame(r - SYNTHETIC)
        }
    }
}

fn merge_range(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<(u64, u64)> {
    match (a, b) {
        (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
        (x, None) | (None, x) => x,
    }
}

#[cfg(test)]
mod tests;
