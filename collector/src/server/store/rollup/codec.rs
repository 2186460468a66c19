//! A roll-up's `body`: LEB128 varints, stacks in sorted order so equal
//! roll-ups encode to equal bytes.
//!
//! ```text
//! version (1)
//! requests, latency_sum_nanos, latency_sum_sq (low 64 bits, high 64 bits)
//! latency histogram (the aggregate's): buckets, (bucket, count)…, min, max
//! fine latency histogram: buckets, (bucket delta, count)…
//! accounting: 7 values
//! start range: 0, or 1 then first, last
//! stacks, then per stack: depth, frame references…, sum_nanos, requests,
//!   sum_sq (low, high)
//! ```

use crate::profile::histogram::Histogram;
use crate::records::packed::{PackedError, get, put};

use super::{LatencyHistogram, Rollup, StackSums};

const VERSION: u64 = 1;

fn put_u128(out: &mut Vec<u8>, v: u128) {
    put(out, v as u64);
    put(out, (v >> 64) as u64);
}

fn get_u128(b: &[u8], at: &mut usize) -> Result<u128, PackedError> {
    let lo = get(b, at)?;
    let hi = get(b, at)?;
    Ok(u128::from(lo) | (u128::from(hi) << 64))
}

/// Why a roll-up's body does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("roll-up: {0}")]
pub struct RollupError(pub(super) String);

impl From<PackedError> for RollupError {
    fn from(e: PackedError) -> Self {
        RollupError(e.to_string())
    }
}

impl Rollup {
    /// The roll-up as a `body`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + 24 * self.stacks.len());
        put(&mut out, VERSION);
        put(&mut out, self.requests);
        put(&mut out, self.latency_sum_nanos);
        put_u128(&mut out, self.latency_sum_sq);
        let buckets: Vec<(usize, u64)> = self.latency.bucket_counts().collect();
        put(&mut out, buckets.len() as u64);
        for (b, n) in buckets {
            put(&mut out, b as u64);
            put(&mut out, n);
        }
        put(&mut out, self.latency.min());
        put(&mut out, self.latency.max());
        let fine: Vec<(u16, u64)> = self.latency_fine.buckets().collect();
        put(&mut out, fine.len() as u64);
        let mut prev = 0u64;
        for (b, n) in fine {
            put(&mut out, u64::from(b) - prev);
            prev = u64::from(b);
            put(&mut out, n);
        }
        for a in self.accounting {
            put(&mut out, a);
        }
        match self.start_range {
            None => put(&mut out, 0),
            Some((a, b)) => {
                put(&mut out, 1);
                put(&mut out, a);
                put(&mut out, b);
            }
        }
        let mut stacks: Vec<(&Box<[u64]>, &StackSums)> = self.stacks.iter().collect();
        stacks.sort_unstable_by(|a, b| a.0.cmp(b.0));
        put(&mut out, stacks.len() as u64);
        for (k, s) in stacks {
            put(&mut out, k.len() as u64);
            for &r in k.iter() {
                put(&mut out, r);
            }
            put(&mut out, s.sum_nanos);
            put(&mut out, s.requests);
            put_u128(&mut out, s.sum_sq);
        }
        out
    }

    /// Read a `body`.
    ///
    /// # Errors
    ///
    /// Bytes [`encode`](Self::encode) did not write: another version, cut
    /// short, trailing bytes, an impossible histogram.
    pub fn decode(b: &[u8]) -> Result<Rollup, RollupError> {
        let at = &mut 0;
        let version = get(b, at)?;
        if version != VERSION {
            return Err(RollupError(format!(
                "body version {version}, this cpt reads {VERSION}"
            )));
        }
        let mut r = Rollup {
            requests: get(b, at)?,
            latency_sum_nanos: get(b, at)?,
            latency_sum_sq: get_u128(b, at)?,
            ..Rollup::default()
        };
        let n = get(b, at)?;
        let mut buckets = Vec::new();
        for _ in 0..n {
            let i = usize::try_from(get(b, at)?).unwrap_or(usize::MAX);
            buckets.push((i, get(b, at)?));
        }
        let (min, max) = (get(b, at)?, get(b, at)?);
        r.latency = Histogram::from_buckets(buckets, min, max).map_err(RollupError)?;
        let n = get(b, at)?;
        let mut bucket = 0u64;
        for _ in 0..n {
            bucket = bucket.saturating_add(get(b, at)?);
            let i = u16::try_from(bucket)
                .ok()
                .filter(|&i| i <= LatencyHistogram::last_bucket())
                .ok_or_else(|| RollupError(format!("latency bucket {bucket} out of range")))?;
            r.latency_fine.add(i, get(b, at)?);
        }
        for a in &mut r.accounting {
            *a = get(b, at)?;
        }
        r.start_range = match get(b, at)? {
            0 => None,
            _ => Some((get(b, at)?, get(b, at)?)),
        };
        let n = get(b, at)?;
        for _ in 0..n {
            let depth = get(b, at)?;
            if depth > b.len() as u64 {
                return Err(RollupError(format!("stack depth {depth} past the body")));
            }
            let mut key = Vec::with_capacity(depth as usize);
            for _ in 0..depth {
                key.push(get(b, at)?);
            }
            let s = StackSums {
                sum_nanos: get(b, at)?,
                requests: get(b, at)?,
                sum_sq: get_u128(b, at)?,
            };
            r.stacks.entry(key.into()).or_default().add(&s);
        }
        if *at != b.len() {
            return Err(RollupError("trailing bytes".into()));
        }
        Ok(r)
    }
}
