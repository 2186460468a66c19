//! What is computed from imported traces: the critical path itself
//! ([`crisp`], CRISP Listing 1) and the analyses of CRISP §6 over it: top-down per endpoint
//! ([`topdown`]: percentile-window profiles and their diff, through the
//! collector's own aggregation), bottom-up over all endpoints
//! ([`bottomup`]: operations ranked by critical-path time and by the number
//! of endpoints they affect), the §6.2 histograms ([`histograms`]) and the
//! operations × traces heat map ([`heatmap`], a self-contained HTML page).

use std::sync::Arc;

use cpt_sdk::{Record, SegmentKind};

pub mod bottomup;
pub mod crisp;
pub mod crisp_reference;
pub mod flows;
pub mod heatmap;
pub mod histograms;
pub mod mystery;
pub mod topdown;

/// An operation: service and span name.
pub type Operation = (Arc<str>, Arc<str>);

/// Exclusive time per operation on one record's critical path: the time of
/// the segments whose leaf frame is the operation, in first-seen order.
///
/// Network segments (a client span's own time around its server span) count
/// for the client operation, as they do on the path.
pub fn exclusive_by_operation(r: &Record) -> Vec<(Operation, u64)> {
    let mut out: Vec<(Operation, u64)> = Vec::new();
    for seg in r.path.segments() {
        let Some(&leaf) = seg.stack.last() else {
            continue;
        };
        let f = r.path.frame(leaf);
        let ns = u64::try_from(seg.duration.as_nanos()).unwrap_or(u64::MAX);
        match out.iter_mut().find(|((s, n), _)| {
            Arc::ptr_eq(s, &f.service) && Arc::ptr_eq(n, &f.name)
                || (**s == *f.service && **n == *f.name)
        }) {
            Some((_, v)) => *v += ns,
            None => out.push(((f.service.clone(), f.name.clone()), ns)),
        }
    }
    out
}

/// Whether a segment kind is own work (busy) rather than a gap the path
/// could not explain in detail.
pub fn is_busy(kind: SegmentKind) -> bool {
    kind == SegmentKind::Busy
}

/// The `q`-quantile (0..=1) of values by the nearest-rank method on a
/// sorted copy; 0 for no values.
pub fn quantile(values: &[u64], q: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    v[nearest_rank(q, v.len())]
}

/// The one definition of a percentile, shared with the collector's pages
/// (the `topdown` header and its windows use it here).
pub use crate::profile::histogram::nearest_rank;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_nearest_rank() {
        let v = [5, 1, 3, 2, 4];
        assert_eq!(quantile(&v, 0.5), 3);
        assert_eq!(quantile(&v, 0.99), 5);
        assert_eq!(quantile(&v, 0.0), 1);
        assert_eq!(quantile(&[], 0.5), 0);
    }
}
