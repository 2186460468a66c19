//! [`LatencyHistogram`]: request latency at trend resolution.

use std::collections::BTreeMap;

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
const LINEAR: u64 = 2 * SUB;

/// A log-linear histogram of latencies: exact below 64 ns, then 32 buckets
/// per power of two, so a quantile read as its bucket's midpoint is within
/// 1.6 % of the true value (half a bucket of relative width 1/32). Sparse:
/// only buckets with counts are kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: BTreeMap<u16, u64>,
    count: u64,
}

impl LatencyHistogram {
    /// The bucket a value falls in.
    pub fn bucket_of(v: u64) -> u16 {
        if v < LINEAR {
            return v as u16;
        }
        let e = 63 - v.leading_zeros(); // e >= 6
        let sub = (v >> (e - SUB_BITS)) & (SUB - 1);
        (LINEAR + u64::from(e - (SUB_BITS + 1)) * SUB + sub) as u16
    }

    /// The values `[lo, hi)` of a bucket (`hi` saturates at `u64::MAX`).
    pub fn bucket_range(i: u16) -> (u64, u64) {
        let i = u64::from(i);
        if i < LINEAR {
            return (i, i + 1);
        }
        let k = i - LINEAR;
        let e = k / SUB + u64::from(SUB_BITS + 1);
        let shift = e - u64::from(SUB_BITS);
        let lo = (SUB + k % SUB) << shift;
        let hi = (u128::from(lo) + (1u128 << shift)).min(u128::from(u64::MAX)) as u64;
        (lo, hi)
    }

    /// The last bucket.
    pub fn last_bucket() -> u16 {
        Self::bucket_of(u64::MAX)
    }

    /// Count one value.
    pub fn record(&mut self, v: u64) {
        self.add(Self::bucket_of(v), 1);
    }

    /// Add `n` to bucket `b` (a bucket index from [`bucket_of`](Self::bucket_of)).
    pub fn add(&mut self, b: u16, n: u64) {
        if n == 0 {
            return;
        }
        *self.counts.entry(b).or_default() += n;
        self.count += n;
    }

    /// Add another histogram's counts.
    pub fn merge(&mut self, o: &LatencyHistogram) {
        for (&b, &n) in &o.counts {
            self.add(b, n);
        }
    }

    /// Values counted.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The non-empty buckets, ascending.
    pub fn buckets(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.counts.iter().map(|(&b, &n)| (b, n))
    }

    /// The `q`-quantile (`0.0..=1.0`) as the midpoint of its bucket; 0 when
    /// empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (&b, &n) in &self.counts {
            seen += n;
            if seen >= rank {
                let (lo, hi) = Self::bucket_range(b);
                return lo + (hi - lo - 1) / 2;
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_cover_u64_contiguously() {
        let mut prev_hi = 0;
        for i in 0..=LatencyHistogram::last_bucket() {
            let (lo, hi) = LatencyHistogram::bucket_range(i);
            assert_eq!(lo, prev_hi, "bucket {i}");
            assert_eq!(LatencyHistogram::bucket_of(lo), i);
            assert_eq!(LatencyHistogram::bucket_of(hi - 1), i);
            prev_hi = hi;
        }
        assert_eq!(prev_hi, u64::MAX);
    }

    /// The trend's p50 and p99 are within 2 % of the exact order
    /// statistics, over latencies spread across six orders of magnitude.
    #[test]
    fn trend_p50_and_p99_are_within_two_percent() {
        let mut rng = cpt_sdk::testing::SplitMix64::new(7);
        let mut values: Vec<u64> = (0..20_000)
            .map(|_| {
                let exp = rng.next_u64() % 20;
                1_000 + (rng.next_u64() % (1 << exp)) * 997
            })
            .collect();
        let mut h = LatencyHistogram::default();
        for &v in &values {
            h.record(v);
        }
        values.sort_unstable();
        for q in [0.5, 0.99] {
            let rank = ((q * values.len() as f64).ceil() as usize).max(1);
            let exact = values[rank - 1] as f64;
            let got = h.quantile(q) as f64;
            assert!(
                (got - exact).abs() / exact <= 0.02,
                "q{q}: {got} against {exact}"
            );
        }
    }
}
