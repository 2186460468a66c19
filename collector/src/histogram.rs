//! Per-segment latency histograms (CPT "Aggregation and Visualization":
//! "aggregation tools collect latency histograms for critical path segments,
//! and this data is consulted early on when latency problems are
//! investigated").
//!
//! A profile value mixes two things: how often a frame stack is on the path
//! and how long it takes when it is. "A subcomponent that always takes 5ms …
//! \[and one\] on the critical path only 1% of the time but \[taking\] 500ms …
//! will also show up … as taking 5ms." The [`Report`] separates them: for
//! each sample stack, the fraction of requests it is on the path of, and the
//! distribution (p50/p90/p99/max) of its per-request time when it is.
//!
//! [`Histogram`] is log-linear: exact below 16 ns, then 8 buckets per power
//! of two (relative bucket width ≤ 12.5 %), 496 buckets for all of `u64`.

use std::fmt::Write as _;
use std::time::Duration;

use crate::aggregate::{Aggregate, stack_label};

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
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, hi) = Self::bucket_range(i);
                let mid = lo + (hi - lo - 1) / 2;
                return mid.clamp(self.min, self.max);
            }
        }
        self.max
    }
}

/// One row of a histogram [`Report`].
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The stack, frames joined with `;`.
    pub stack: String,
    /// Mean time per selected request (the profile value), ns.
    pub mean_per_request_nanos: u64,
    /// Requests with this stack on the path.
    pub on_path: u64,
    /// `on_path / requests`.
    pub fraction_on_path: f64,
    /// Mean time when on the path, ns.
    pub mean_when_on_path_nanos: u64,
    /// Median / 90th / 99th percentile / max time when on the path, ns.
    pub p50_nanos: u64,
    /// 90th percentile when on the path, ns.
    pub p90_nanos: u64,
    /// 99th percentile when on the path, ns.
    pub p99_nanos: u64,
    /// Largest time when on the path, ns.
    pub max_nanos: u64,
    /// The distribution itself (empty if the aggregate has no detail).
    pub histogram: Histogram,
}

/// Per-stack latency distribution of an aggregate, largest mean first.
#[derive(Clone, Debug)]
pub struct Report {
    /// Selected requests.
    pub requests: u64,
    /// Latency distribution of the requests themselves.
    pub latency: Histogram,
    /// Mean latency, ns.
    pub mean_latency_nanos: u64,
    /// One row per sample stack.
    pub rows: Vec<Row>,
}

impl Report {
    /// Build the report; rows sorted by mean per request, descending.
    ///
    /// Per-stack distributions need an aggregate built with histograms
    /// ([`crate::aggregate::Aggregator::with_histograms`]); without them
    /// the quantile columns are 0.
    pub fn new(agg: &Aggregate) -> Report {
        let n = agg.requests();
        let mut rows: Vec<Row> = agg
            .stacks()
            .iter()
            .zip(agg.mean_nanos())
            .map(|(s, mean)| {
                let h = s
                    .detail
                    .as_ref()
                    .map(|d| d.histogram.clone())
                    .unwrap_or_default();
                Row {
                    stack: stack_label(agg, s, ";"),
                    mean_per_request_nanos: mean,
                    on_path: s.requests,
                    fraction_on_path: if n == 0 {
                        0.0
                    } else {
                        s.requests as f64 / n as f64
                    },
                    mean_when_on_path_nanos: crate::aggregate::div_round(
                        u128::from(s.sum_nanos),
                        s.requests,
                    ),
                    p50_nanos: h.quantile(0.5),
                    p90_nanos: h.quantile(0.9),
                    p99_nanos: h.quantile(0.99),
                    max_nanos: h.max(),
                    histogram: h,
                }
            })
            .collect();
        rows.sort_by(|a, b| {
            b.mean_per_request_nanos
                .cmp(&a.mean_per_request_nanos)
                .then_with(|| a.stack.cmp(&b.stack))
        });
        Report {
            requests: n,
            latency: agg
                .latency_detail()
                .map(|d| d.histogram.clone())
                .unwrap_or_default(),
            mean_latency_nanos: agg.mean_latency().as_nanos() as u64,
            rows,
        }
    }

    /// CSV, one row per stack: `stack,mean_per_request_ns,on_path,fraction_on_path,
    /// mean_when_on_path_ns,p50_ns,p90_ns,p99_ns,max_ns`.
    pub fn to_csv(&self) -> String {
        let mut out = String::from(
            "stack,mean_per_request_ns,on_path,fraction_on_path,mean_when_on_path_ns,p50_ns,p90_ns,p99_ns,max_ns\n",
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "{},{},{},{:.6},{},{},{},{},{}",
                csv_field(&r.stack),
                r.mean_per_request_nanos,
                r.on_path,
                r.fraction_on_path,
                r.mean_when_on_path_nanos,
                r.p50_nanos,
                r.p90_nanos,
                r.p99_nanos,
                r.max_nanos
            );
        }
        out
    }

    /// CSV in long form, one row per (stack, non-empty bucket):
    /// `stack,lo_ns,hi_ns,count` (`hi` exclusive). The request latency itself
    /// is the stack `[request]`.
    pub fn buckets_csv(&self) -> String {
        let mut out = String::from("stack,lo_ns,hi_ns,count\n");
        for (lo, hi, c) in self.latency.buckets() {
            let _ = writeln!(out, "[request],{lo},{hi},{c}");
        }
        for r in &self.rows {
            for (lo, hi, c) in r.histogram.buckets() {
                let _ = writeln!(out, "{},{lo},{hi},{c}", csv_field(&r.stack));
            }
        }
        out
    }

    /// A text table of the `top` rows, and for the first `charts` rows a bar
    /// chart of their distribution (buckets coalesced to powers of two).
    pub fn to_text(&self, top: usize, charts: usize) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}, mean latency {}, p50 {}, p99 {}, max {}",
            crate::records::plural(self.requests, "request"),
            fmt_ns(self.mean_latency_nanos),
            fmt_ns(self.latency.quantile(0.5)),
            fmt_ns(self.latency.quantile(0.99)),
            fmt_ns(self.latency.max())
        );
        let _ = writeln!(
            out,
            "{:>10} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}  stack",
            "mean/req", "on-path", "when-on", "p50", "p90", "p99", "max"
        );
        for r in self.rows.iter().take(top) {
            let _ = writeln!(
                out,
                "{:>10} {:>6.1}% {:>10} {:>10} {:>10} {:>10} {:>10}  {}",
                fmt_ns(r.mean_per_request_nanos),
                r.fraction_on_path * 100.0,
                fmt_ns(r.mean_when_on_path_nanos),
                fmt_ns(r.p50_nanos),
                fmt_ns(r.p90_nanos),
                fmt_ns(r.p99_nanos),
                fmt_ns(r.max_nanos),
                r.stack
            );
        }
        if self.rows.len() > top {
            let _ = writeln!(out, "… {} more stacks (--top)", self.rows.len() - top);
        }
        for r in self.rows.iter().take(charts) {
            if r.histogram.count() == 0 {
                continue;
            }
            let _ = writeln!(
                out,
                "\n{} (on the path of {})",
                r.stack,
                crate::records::plural(r.on_path, "request")
            );
            out.push_str(&bars(&r.histogram));
        }
        out
    }
}

/// Bars per power-of-two range.
fn bars(h: &Histogram) -> String {
    let mut pow: Vec<(u64, u64, u64)> = Vec::new();
    for (lo, hi, c) in h.buckets() {
        let p = 63 - lo.max(1).leading_zeros();
        let plo = 1u64 << p;
        match pow.last_mut() {
            Some(last) if last.0 == plo => last.2 += c,
            _ => pow.push((plo, hi.max(plo.saturating_mul(2)), c)),
        }
    }
    let max = pow.iter().map(|p| p.2).max().unwrap_or(1);
    let mut out = String::new();
    for (lo, hi, c) in pow {
        let w = ((c as f64 / max as f64) * 40.0).round() as usize;
        let _ = writeln!(
            out,
            "  [{:>9}, {:>9}) {:>8} {}",
            fmt_ns(lo),
            fmt_ns(hi),
            c,
            "#".repeat(w.max(1))
        );
    }
    out
}

/// Nanoseconds for humans: `850ns`, `12.5µs`, `3.20ms`, `1.500s`.
pub fn fmt_ns(ns: u64) -> String {
    let d = Duration::from_nanos(ns);
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}µs", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", ns as f64 / 1e6)
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

/// Quote a CSV field when it needs it.
pub(crate) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selection::Selection;

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

    #[test]
    fn cpt_table1_histogram_separates_frequency_from_duration() {
        let agg = Aggregate::from_records_with_histograms(
            &Selection::new(),
            crate::aggregate::tests::table1(),
        );
        let rep = Report::new(&agg);
        let row = |s: &str| rep.rows.iter().find(|r| r.stack == s).unwrap().clone();
        // A1/A2: 5 ms per request on average, but 10 ms on the one path it is on.
        let a2 = row("A1 (A);A2 (A)");
        assert_eq!(a2.mean_per_request_nanos, 5_000_000);
        assert_eq!(a2.on_path, 1);
        assert_eq!(a2.fraction_on_path, 0.5);
        assert_eq!(a2.mean_when_on_path_nanos, 10_000_000);
        assert_eq!(a2.max_nanos, 10_000_000);
        let a1 = row("A1 (A)");
        assert_eq!((a1.on_path, a1.mean_when_on_path_nanos), (2, 5_000_000));
        let csv = rep.to_csv();
        assert!(
            csv.contains("A1 (A);B1 (B),2000000,1,0.500000,4000000,"),
            "{csv}"
        );
        let text = rep.to_text(10, 1);
        assert!(
            text.starts_with("2 requests, mean latency 12.00ms"),
            "{text}"
        );
        let long = rep.buckets_csv();
        assert!(long.contains("[request],"), "{long}");
    }
}
