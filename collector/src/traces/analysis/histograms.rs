//! The structural histograms of CRISP §6.2 over all analysed traces: spans
//! per trace, critical-path length (distinct spans on the path), depth, and
//! the maximum degree of concurrency (the most children of one parent
//! active at once; children touching end-to-start are not concurrent).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::traces::Shape;

/// A histogram over small integers: value → number of traces.
pub type Counts = BTreeMap<u32, u64>;

/// The four histograms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histograms {
    /// Spans per trace (under the analysed root).
    pub spans: Counts,
    /// Distinct spans on the critical path.
    pub path_length: Counts,
    /// Depth (the root is 1).
    pub depth: Counts,
    /// Maximum concurrency degree.
    pub concurrency: Counts,
}

impl Histograms {
    /// Count shapes.
    pub fn from_shapes<'a>(shapes: impl IntoIterator<Item = &'a Shape>) -> Self {
        let mut h = Histograms::default();
        for s in shapes {
            *h.spans.entry(s.spans).or_default() += 1;
            *h.path_length.entry(s.path_spans).or_default() += 1;
            *h.depth.entry(s.depth).or_default() += 1;
            *h.concurrency.entry(s.concurrency).or_default() += 1;
        }
        h
    }

    /// The histograms with their names, in a fixed order.
    pub fn named(&self) -> [(&'static str, &Counts); 4] {
        [
            ("spans per trace", &self.spans),
            ("critical-path length (spans)", &self.path_length),
            ("depth", &self.depth),
            ("max concurrency degree", &self.concurrency),
        ]
    }

    /// Text: one block per histogram, values binned into at most `bins`
    /// equal-width bins, with bars.
    pub fn to_text(&self, bins: usize) -> String {
        let mut s = String::new();
        for (name, c) in self.named() {
            let total: u64 = c.values().sum();
            let _ = writeln!(s, "{name} ({total} traces):");
            for (lo, hi, n) in bin(c, bins) {
                let bar = "#".repeat(((n as f64 / total.max(1) as f64) * 50.0).ceil() as usize);
                let label = if lo == hi {
                    format!("{lo}")
                } else {
                    format!("{lo}-{hi}")
                };
                let _ = writeln!(s, "  {label:>11} {n:>8}  {bar}");
            }
        }
        s
    }

    /// CSV: `histogram,value,traces`.
    pub fn to_csv(&self) -> String {
        let mut s = String::from("histogram,value,traces\n");
        for (name, c) in self.named() {
            for (v, n) in c {
                let _ = writeln!(s, "{name},{v},{n}");
            }
        }
        s
    }
}

/// Group counts into at most `bins` equal-width bins `(lo, hi, count)`.
pub fn bin(c: &Counts, bins: usize) -> Vec<(u32, u32, u64)> {
    let (Some((&min, _)), Some((&max, _))) = (c.first_key_value(), c.last_key_value()) else {
        return Vec::new();
    };
    let bins = bins.max(1) as u64;
    let span = u64::from(max - min) + 1;
    let width = span.div_ceil(bins).max(1);
    let mut out: Vec<(u32, u32, u64)> = Vec::new();
    for (&v, &n) in c {
        let b = u64::from(v - min) / width;
        let lo = (u64::from(min) + b * width) as u32;
        let hi = (u64::from(lo) + width - 1).min(u64::from(max)) as u32;
        match out.last_mut() {
            Some(last) if last.0 == lo => last.2 += n,
            _ => out.push((lo, hi, n)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_bins() {
        let shapes = [
            Shape {
                spans: 3,
                depth: 2,
                concurrency: 1,
                path_spans: 2,
            },
            Shape {
                spans: 3,
                depth: 3,
                concurrency: 2,
                path_spans: 3,
            },
            Shape {
                spans: 27,
                depth: 7,
                concurrency: 4,
                path_spans: 9,
            },
        ];
        let h = Histograms::from_shapes(&shapes);
        assert_eq!(h.spans.get(&3), Some(&2));
        assert_eq!(h.concurrency.get(&4), Some(&1));
        assert_eq!(bin(&h.spans, 5), vec![(3, 7, 2), (23, 27, 1)]);
        assert!(h.to_text(10).contains("max concurrency degree (3 traces)"));
    }
}
