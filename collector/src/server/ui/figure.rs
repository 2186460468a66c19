//! How a page shows a latency quantile: exact, or marked approximate with
//! the bound of its error.
//!
//! A quantile computed from every value it ranks (the services page from
//! the store, the profile page from the records it folded) is exact, and is
//! shown as a plain number. One read from a histogram (a stack's p50 / p99,
//! a trend's hourly points, a profile folded from roll-ups) is its bucket's
//! midpoint: shown as `≈ 30.41ms ±3.5 %`, the bound being how far the exact
//! value can be from it, with the range itself in the tooltip.

use crate::format::fmt_ns;
use crate::profile::histogram::Quantile;
use crate::server::store::rollup::LatencyHistogram;

/// The quantile as the page shows it (HTML; numbers only, nothing to
/// escape).
pub(super) fn quantile(q: &Quantile) -> String {
    if q.is_exact() {
        return fmt_ns(q.value);
    }
    // Rounded up to a tenth of a percent: never claims more than is known.
    let pct = (q.relative_error() * 1000.0).ceil() / 10.0;
    format!(
        r#"<span class="approx" title="read from a histogram: the exact value lies between {} and {}">≈&nbsp;{}&nbsp;±{pct:.1}&nbsp;%</span>"#,
        fmt_ns(q.lo),
        fmt_ns(q.hi),
        fmt_ns(q.value),
    )
}

/// A quantile a [`LatencyHistogram`] gave (its bucket's midpoint), with
/// the range of that bucket.
pub(super) fn trend_quantile(value: u64) -> Quantile {
    let (lo, hi) = LatencyHistogram::bucket_range(LatencyHistogram::bucket_of(value));
    Quantile {
        value,
        lo,
        hi: hi.saturating_sub(1).max(lo),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exact_quantile_is_a_plain_number_an_approximate_one_says_so() {
        assert_eq!(quantile(&Quantile::exact(55_000_000)), "55.00ms");
        let q = Quantile {
            value: 30_408_703,
            lo: 29_360_128,
            hi: 31_457_279,
        };
        let shown = quantile(&q);
        assert!(shown.contains("≈&nbsp;30.41ms&nbsp;±3.5&nbsp;%"), "{shown}");
        assert!(shown.contains("between 29.36ms and 31.46ms"), "{shown}");
        // A trend's point: within 1.6 % (half a bucket of 1/32).
        let mut h = LatencyHistogram::default();
        h.record(55_000_000);
        let t = trend_quantile(h.quantile(0.5));
        assert!(t.lo <= 55_000_000 && 55_000_000 <= t.hi, "{t:?}");
        assert!(!t.is_exact() && t.relative_error() <= 0.016, "{t:?}");
    }
}
