//! Per-stack latency report of an aggregate (CPT "Aggregation and
//! Visualization").
//!
//! A profile value mixes two things: how often a frame stack is on the path
//! and how long it takes when it is. "A subcomponent that always takes 5ms …
//! \[and one\] on the critical path only 1% of the time but \[taking\] 500ms …
//! will also show up … as taking 5ms." The [`Report`] separates them: for
//! each sample stack, the fraction of requests it is on the path of, and the
//! distribution (p50/p90/p99/max) of its per-request time when it is, from
//! the stack's [`Histogram`].

use std::fmt::Write as _;

use super::aggregate::{Aggregate, stack_label};
use super::histogram::Histogram;
use crate::format::{csv_field, fmt_ns};

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
    /// ([`crate::profile::aggregate::Aggregator::with_histograms`]); without them
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
                    mean_when_on_path_nanos: crate::profile::aggregate::div_round(
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
            crate::format::plural(self.requests, "request"),
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
                crate::format::plural(r.on_path, "request")
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::aggregate::Aggregate;
    use crate::records::selection::Selection;

    #[test]
    fn cpt_table1_histogram_separates_frequency_from_duration() {
        let agg = Aggregate::from_records_with_histograms(
            &Selection::new(),
            cpt_sdk::testing::fixtures::table1(),
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
