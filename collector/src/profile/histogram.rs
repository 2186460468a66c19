//! Per-segment latency histograms (CPT "Aggregation and Visualization":
//! "aggregation tools collect latency histograms for critical path segments,
//! and this data is consulted early on when latency problems are
//! investigated").
//!
//! This module is the histogram itself; the per-stack table built from an
//! aggregate's histograms is [`report`](super::report).
//!
//! [`Histogram`] is log-linear: exact below 16 ns, then 8 buckets per power
//! of two (relative bucket width ≤ 12.5 %), 496 buckets for all of `u64`.

const SUB_BITS: u32 = 3;
const SUB: u64 = 1 << SUB_BITS;
const LINEAR: u64 = 2 * SUB;

/// A log-linear histogram of nanosecond values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    min: u64,
    max: u64,
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self::default()
    }

    /// The bucket a value falls in.
    pub fn bucket_of(v: u64) -> usize {
        if v < LINEAR {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // e >= 4
        let sub = (v >> (e - SUB_BITS)) & (SUB - 1);
        (LINEAR + u64::from(e - (SUB_BITS + 1)) * SUB + sub) as usize
    }

    /// The value range `[lo, hi)` of a bucket (`hi` saturates at `u64::MAX`).
    pub fn bucket_range(i: usize) -> (u64, u64) {
        let i = i as u64;
        if i < LINEAR {
            return (i, i + 1);
        }
        let k = i - LINEAR;
        let e = k / SUB + u64::from(SUB_BITS + 1);
        let sub = k % SUB;
        let shift = e - u64::from(SUB_BITS);
        let lo = (SUB + sub) << shift;
        let hi = (u128::from(lo) + (1u128 << shift)).min(u128::from(u64::MAX)) as u64;
        (lo, hi)
    }

    /// A histogram from its non-empty buckets (`(bucket index, count)`, see
    /// [`Histogram::bucket_of`]) and the smallest and largest value counted,
    /// as another process computed them (the aggregate file, see
    /// [`crate::profile::aggregate::file`]).
    ///
    /// # Errors
    ///
    /// A bucket index beyond the last bucket (495), a zero count, `min >
    /// max`, or a `min` / `max` outside the buckets that have counts.
    pub fn from_buckets(
        buckets: impl IntoIterator<Item = (usize, u64)>,
        min: u64,
        max: u64,
    ) -> Result<Histogram, String> {
        let last = Self::bucket_of(u64::MAX);
        let mut h = Histogram::new();
        for (b, c) in buckets {
            if b > last {
                return Err(format!("bucket {b} is beyond the last bucket ({last})"));
            }
            if c == 0 {
                return Err(format!(
                    "bucket {b} has count 0 (list only non-empty buckets)"
                ));
            }
            if b >= h.counts.len() {
                h.counts.resize(b + 1, 0);
            }
            h.counts[b] = h.counts[b]
                .checked_add(c)
                .ok_or_else(|| format!("bucket {b}: count overflows"))?;
            h.count = h
                .count
                .checked_add(c)
                .ok_or_else(|| "total count overflows".to_owned())?;
        }
        if h.count == 0 {
            return Ok(h);
        }
        if min > max {
            return Err(format!("min {min} > max {max}"));
        }
        let first = h.counts.iter().position(|&c| c > 0).unwrap_or(0);
        if Self::bucket_of(min) != first || Self::bucket_of(max) != h.counts.len() - 1 {
            return Err(format!(
                "min {min} / max {max} do not fall in the first / last non-empty bucket \
                 ({first} / {})",
                h.counts.len() - 1
            ));
        }
        h.min = min;
        h.max = max;
        Ok(h)
    }

    /// The non-empty buckets as `(bucket index, count)`, ascending (the
    /// inverse of [`Histogram::from_buckets`]).
    pub fn bucket_counts(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, &c)| (i, c))
    }

    /// Count one value.
    pub fn record(&mut self, v: u64) {
        let b = Self::bucket_of(v);
        if b >= self.counts.len() {
            self.counts.resize(b + 1, 0);
        }
        self.counts[b] += 1;
        if self.count == 0 || v < self.min {
            self.min = v;
        }
        self.max = self.max.max(v);
        self.count += 1;
    }

    /// Add another histogram's counts.
    pub fn merge(&mut self, o: &Histogram) {
        if o.count == 0 {
            return;
        }
        if o.counts.len() > self.counts.len() {
            self.counts.resize(o.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.min = if self.count == 0 {
            o.min
        } else {
            self.min.min(o.min)
        };
        self.max = self.max.max(o.max);
        self.count += o.count;
    }

    /// Number of values counted.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Smallest value counted (0 when empty).
    pub fn min(&self) -> u64 {
        self.min
    }

    /// Largest value counted (0 when empty).
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The non-empty buckets as `(lo, hi, count)`, ascending.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, &c)| {
                let (lo, hi) = Self::bucket_range(i);
                (lo, hi, c)
            })
    }

    /// The `q`-quantile (`0.0..=1.0`), as the midpoint of the bucket holding
    /// it, clamped to `[min, max]` (exact below 16 ns). 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        match self.bucket_of_quantile(q) {
            Some(i) => {
                let (lo, hi) = Self::bucket_range(i);
                let mid = lo + (hi - lo - 1) / 2;
                mid.clamp(self.min, self.max)
            }
            None if self.count == 0 => 0,
            None => self.max,
        }
    }

    /// The bucket holding the `q`-quantile's rank (`None` when empty).
    fn bucket_of_quantile(&self, q: f64) -> Option<usize> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        self.counts.iter().position(|&c| {
            seen += c;
            seen >= rank
        })
    }
}

/// The 0-based index of the `q`-quantile (0..=1) of `n > 0` sorted values by
/// the nearest-rank method: the ⌈q·n⌉-th value (the first for `q = 0`).
/// The one definition of an exact percentile: the trace analyses, the
/// store's endpoint summaries and the profile page all use it, so the pages
/// agree on one selection.
pub fn nearest_rank(q: f64, n: usize) -> usize {
    let x = q.clamp(0.0, 1.0) * n as f64;
    // q·n that is an integer up to rounding (0.55 × 20) is that integer.
    let rank = if (x - x.round()).abs() < 1e-9 {
        x.round()
    } else {
        x.ceil()
    };
    (rank as usize).clamp(1, n.max(1)) - 1
}

/// A quantile as a page shows it: a value, and the range the exact value
/// (nearest rank) is known to lie in; `lo == hi` when it is exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantile {
    /// The value shown, ns.
    pub value: u64,
    /// The smallest the exact value can be, ns.
    pub lo: u64,
    /// The largest the exact value can be, ns.
    pub hi: u64,
}

impl Quantile {
    /// A value known exactly.
    pub fn exact(value: u64) -> Quantile {
        Quantile {
            value,
            lo: value,
            hi: value,
        }
    }

    /// Whether the value is the exact one.
    pub fn is_exact(&self) -> bool {
        self.lo == self.hi
    }

    /// The largest relative error the value can have: the farther end of
    /// `[lo, hi]` from it, over it (0 when exact).
    pub fn relative_error(&self) -> f64 {
        let far = self
            .value
            .abs_diff(self.lo)
            .max(self.value.abs_diff(self.hi));
        if far == 0 {
            0.0
        } else {
            far as f64 / self.value.max(1) as f64
        }
    }
}

impl Histogram {
    /// The `q`-quantile as [`Histogram::quantile`] gives it, with the range
    /// the exact (nearest-rank) value lies in: its bucket, within `[min,
    /// max]`. Exact below 16 ns, and when the bucket holds one distinct
    /// value.
    pub fn quantile_range(&self, q: f64) -> Quantile {
        match self.bucket_of_quantile(q) {
            Some(i) => {
                let (lo, hi) = Self::bucket_range(i);
                Quantile {
                    value: self.quantile(q),
                    lo: lo.max(self.min),
                    hi: (hi - 1).min(self.max),
                }
            }
            None => Quantile::exact(self.quantile(q)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_range_holds_the_exact_value_and_bounds_the_error() {
        // 31.18 ms among values of one bucket [29.36, 31.46) ms: shown as
        // its midpoint 30.41 ms, known within ±3.5 %.
        let mut h = Histogram::new();
        for v in [29_500_000, 31_180_000, 31_400_000] {
            h.record(v);
        }
        let q = h.quantile_range(0.5);
        assert_eq!(q.value, h.quantile(0.5));
        assert!(q.lo <= 31_180_000 && 31_180_000 <= q.hi, "{q:?}");
        assert!(!q.is_exact());
        let err = (q.value as f64 - 31_180_000.0).abs() / q.value as f64;
        assert!(err <= q.relative_error(), "{err} > {}", q.relative_error());
        assert!(q.relative_error() < 0.0625, "{q:?}");
        // One value: its bucket is pinned to it by min and max.
        let mut one = Histogram::new();
        one.record(55_000_000);
        assert_eq!(one.quantile_range(0.5), Quantile::exact(55_000_000));
    }

    #[test]
    fn histogram_buckets_cover_u64_contiguously() {
        let mut prev_hi = 0;
        for i in 0..=Histogram::bucket_of(u64::MAX) {
            let (lo, hi) = Histogram::bucket_range(i);
            assert_eq!(lo, prev_hi, "bucket {i}");
            assert!(hi > lo || hi == u64::MAX);
            assert_eq!(Histogram::bucket_of(lo), i);
            assert_eq!(Histogram::bucket_of(hi - 1), i);
            prev_hi = hi;
        }
        assert_eq!(Histogram::bucket_of(u64::MAX), 495);
    }

    #[test]
    fn histogram_quantiles_within_bucket_width() {
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        #[rustfmt::skip]
        let cases: &[(f64, u64)] = &[(0.5, 500_000), (0.9, 900_000), (0.99, 990_000), (1.0, 1_000_000)];
        for (q, want) in cases {
            let got = h.quantile(*q);
            let err = (got as f64 - *want as f64).abs() / *want as f64;
            assert!(err <= 0.0625, "q{q}: {got} vs {want}");
        }
        assert_eq!((h.min(), h.max(), h.count()), (1000, 1_000_000, 1000));
    }
}
