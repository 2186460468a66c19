//! [`Trigger`]: why a request is traced. Untraced is `Option<Trigger>::None`.
//!
//! [`Sampler`]: the policy that decides whether a request nobody forced is
//! traced. [`DefaultSampler`] takes a probability and a per-second limit.

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Why a request is traced.
///
/// There is deliberately no "untraced" variant: an untraced request has no
/// trigger at all (`Option<Trigger>::None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Trigger {
    /// A service's sampler chose the request, or a trusted caller propagated
    /// that decision.
    Sampled,
    /// An operator forced a trace on this request (with a valid credential).
    /// Forced records are left out of aggregate profiles by default.
    Forced,
}

impl Trigger {
    /// `"sampled"` or `"forced"`, as in records and headers.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Sampled => "sampled",
            Trigger::Forced => "forced",
        }
    }

    /// Parse [`Trigger::as_str`]'s form.
    pub fn parse(s: &str) -> Option<Trigger> {
        match s {
            "sampled" => Some(Trigger::Sampled),
            "forced" => Some(Trigger::Forced),
            _ => None,
        }
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a [`Sampler`] may look at.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct SamplingContext<'a> {
    /// The endpoint (gRPC method, HTTP route) of the request, when known.
    pub endpoint: Option<&'a str>,
}

impl<'a> SamplingContext<'a> {
    /// A context for a request to `endpoint`.
    pub fn new(endpoint: Option<&'a str>) -> Self {
        SamplingContext { endpoint }
    }
}

/// Decides whether a request that nobody forced is traced.
///
/// Return `Some(Trigger::Sampled)` to trace it, `None` to leave it untraced.
/// Called once per request on the request path: it must be cheap and must
/// not block.
///
/// Implemented by [`DefaultSampler`], by closures
/// `Fn(&SamplingContext<'_>) -> Option<Trigger>`, and by `()` (never samples).
///
/// # Examples
///
/// ```
/// use cpt_sdk::trigger::{Sampler, SamplingContext, Trigger};
///
/// let only_checkout = |cx: &SamplingContext<'_>| {
///     (cx.endpoint == Some("/checkout")).then_some(Trigger::Sampled)
/// };
/// assert_eq!(only_checkout.sample(&SamplingContext::new(Some("/checkout"))), Some(Trigger::Sampled));
/// assert_eq!(().sample(&SamplingContext::new(None)), None);
/// ```
pub trait Sampler: Send + Sync + 'static {
    /// The trigger for a new request, or `None` for untraced.
    fn sample(&self, cx: &SamplingContext<'_>) -> Option<Trigger>;
}

impl Sampler for () {
    fn sample(&self, _: &SamplingContext<'_>) -> Option<Trigger> {
        None
    }
}

impl<F> Sampler for F
where
    F: Fn(&SamplingContext<'_>) -> Option<Trigger> + Send + Sync + 'static,
{
    fn sample(&self, cx: &SamplingContext<'_>) -> Option<Trigger> {
        self(cx)
    }
}

/// Samples each request with a fixed probability, at most
/// `max_per_second` of them in any wall-clock second.
///
/// Lock-free: one thread-local random draw and, when a limit is set, one
/// compare-and-swap on a shared window counter.
///
/// # Examples
///
/// ```
/// use cpt_sdk::trigger::{DefaultSampler, Sampler, SamplingContext, Trigger};
///
/// let all_but_few = DefaultSampler::new(1.0).with_max_per_second(2);
/// let cx = SamplingContext::new(None);
/// assert_eq!(all_but_few.sample(&cx), Some(Trigger::Sampled));
/// assert_eq!(all_but_few.sample(&cx), Some(Trigger::Sampled));
/// assert_eq!(all_but_few.sample(&cx), None); // third in the same second
/// ```
#[derive(Debug)]
pub struct DefaultSampler {
    /// `probability * 2^64`, saturating (1.0 samples everything).
    threshold: u64,
    always: bool,
    max_per_second: Option<u32>,
    /// `(second << 32) | count` of the current one-second window.
    window: AtomicU64,
    origin: Instant,
}

impl DefaultSampler {
    /// Sample with `probability` (clamped to `0.0..=1.0`; NaN is 0), no rate
    /// limit.
    pub fn new(probability: f64) -> DefaultSampler {
        let p = if probability.is_nan() {
            0.0
        } else {
            probability.clamp(0.0, 1.0)
        };
        DefaultSampler {
            threshold: (p * 18_446_744_073_709_551_616.0) as u64,
            always: p >= 1.0,
            max_per_second: None,
            window: AtomicU64::new(0),
            origin: Instant::now(),
        }
    }

    /// Sample at most `n` requests per second.
    #[must_use]
    pub fn with_max_per_second(mut self, n: u32) -> DefaultSampler {
        self.max_per_second = Some(n);
        self
    }

    fn admit(&self, limit: u32) -> bool {
        let second = self.origin.elapsed().as_secs() & 0xffff_ffff;
        let mut cur = self.window.load(Ordering::Relaxed);
        loop {
            let (win, count) = (cur >> 32, cur & 0xffff_ffff);
            let next = if win == second {
                if count >= u64::from(limit) {
                    return false;
                }
                cur + 1
            } else {
                (second << 32) | 1
            };
            match self
                .window
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }
}

impl Default for DefaultSampler {
    /// 1 % of requests, at most 100 per second.
    fn default() -> Self {
        DefaultSampler::new(0.01).with_max_per_second(100)
    }
}

impl Sampler for DefaultSampler {
    fn sample(&self, _: &SamplingContext<'_>) -> Option<Trigger> {
        if !self.always && random_u64() >= self.threshold {
            return None;
        }
        match self.max_per_second {
            Some(limit) if !self.admit(limit) => None,
            _ => Some(Trigger::Sampled),
        }
    }
}

/// A thread-local xorshift64* stream seeded from std's random hasher keys.
fn random_u64() -> u64 {
    thread_local! {
        static STATE: Cell<u64> = const { Cell::new(0) };
    }
    STATE.with(|s| {
        let mut x = s.get();
        if x == 0 {
            let mut h = RandomState::new().build_hasher();
            h.write_usize(s as *const _ as usize);
            x = h.finish() | 1;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probability_is_roughly_honoured() {
        let s = DefaultSampler::new(0.25);
        let cx = SamplingContext::new(None);
        let hits = (0..40_000).filter(|_| s.sample(&cx).is_some()).count();
        assert!((9_000..11_000).contains(&hits), "{hits}");
        assert_eq!(DefaultSampler::new(0.0).sample(&cx), None);
        assert_eq!(DefaultSampler::new(f64::NAN).sample(&cx), None);
    }

    #[test]
    fn rate_limit_caps_each_second() {
        let s = DefaultSampler::new(1.0).with_max_per_second(5);
        let cx = SamplingContext::new(None);
        let hits = (0..100).filter(|_| s.sample(&cx).is_some()).count();
        assert!((5..=10).contains(&hits), "{hits}"); // at most two windows in this loop
    }
}
