//! Outliers (MM §4.4.3): split the requests at the top `q` of latency,
//! aggregate the critical path of each side separately, and rank call paths
//! by how much larger their share of the critical path is among the
//! outliers than among the rest.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::events::Request;
use super::slack::RequestSlack;

/// One call path's shares.
#[derive(Clone, Debug)]
pub struct Differential {
    /// The call path.
    pub call_path: Arc<str>,
    /// Its share of the critical path (attributed time / latency, summed
    /// over the side) among the outliers, 0..=1.
    pub outlier_share: f64,
    /// Among the other requests.
    pub normal_share: f64,
    /// Mean slack among the outliers (spans of the call path), ns.
    pub outlier_slack_ns: f64,
    /// Among the others.
    pub normal_slack_ns: f64,
}

impl Differential {
    /// `outlier_share − normal_share`: what the ranking sorts by.
    pub fn excess(&self) -> f64 {
        self.outlier_share - self.normal_share
    }
}

/// The split and the ranking.
#[derive(Clone, Debug, Default)]
pub struct Outliers {
    /// Latency at or above which a request is an outlier, ns.
    pub threshold_ns: i64,
    /// Outlier requests.
    pub outliers: usize,
    /// The others.
    pub normal: usize,
    /// Call paths, largest excess first.
    pub ranking: Vec<Differential>,
}

/// Split `results` at the top `top` fraction (0.05: the slowest 5 %, at
/// least one request) of latency and rank call paths (MM §4.4.3).
pub fn outliers(results: &[(&Request, &RequestSlack)], top: f64) -> Outliers {
    if results.is_empty() {
        return Outliers::default();
    }
    let mut lat: Vec<i64> = results.iter().map(|r| r.1.latency_ns).collect();
    lat.sort_unstable();
    let k = ((top.clamp(0.0, 1.0) * lat.len() as f64).ceil() as usize).clamp(1, lat.len());
    let threshold_ns = lat[lat.len() - k];
    // call path → [side] (critical ns, slack ns sum, spans)
    let mut agg: BTreeMap<Arc<str>, [(f64, f64, usize); 2]> = BTreeMap::new();
    let mut total = [0f64; 2];
    let mut count = [0usize; 2];
    for (req, rs) in results {
        let side = usize::from(rs.latency_ns >= threshold_ns);
        total[side] += rs.latency_ns as f64;
        count[side] += 1;
        for (i, s) in req.spans.iter().enumerate() {
            let e = &mut agg.entry(s.call_path.clone()).or_default()[side];
            e.0 += rs.critical_ns[i] as f64;
            e.1 += rs.spans[i].slack_ns as f64;
            e.2 += 1;
        }
    }
    let share = |v: f64, side: usize| {
        if total[side] > 0.0 {
            v / total[side]
        } else {
            0.0
        }
    };
    let mean = |v: f64, n: usize| if n > 0 { v / n as f64 } else { 0.0 };
    let mut ranking: Vec<Differential> = agg
        .into_iter()
        .map(|(call_path, s)| Differential {
            call_path,
            outlier_share: share(s[1].0, 1),
            normal_share: share(s[0].0, 0),
            outlier_slack_ns: mean(s[1].1, s[1].2),
            normal_slack_ns: mean(s[0].1, s[0].2),
        })
        .collect();
    ranking.sort_by(|a, b| {
        b.excess()
            .total_cmp(&a.excess())
            .then(a.call_path.cmp(&b.call_path))
    });
    Outliers {
        threshold_ns,
        outliers: count[1],
        normal: count[0],
        ranking,
    }
}

/// The two sides of the split as profiles of critical-path time per call
/// path (`(others, outliers)`), so `go tool pprof -diff_base others.pb.gz
/// outliers.pb.gz` shows what the outliers spend more on (the profiles'
/// default value is the mean per request).
pub fn side_profiles(
    results: &[(&Request, &RequestSlack)],
    threshold_ns: i64,
) -> (
    crate::profile::aggregate::Aggregate,
    crate::profile::aggregate::Aggregate,
) {
    use crate::profile::aggregate::{Aggregate, StackStats};
    use cpt_sdk::path::Frame;
    let mut frames: Vec<Frame> = Vec::new();
    let mut frame_ids: rustc_hash::FxHashMap<String, u32> = Default::default();
    // [side]: call path → (stack, sum, requests), and requests per side.
    type Side = BTreeMap<Arc<str>, (Box<[u32]>, u64, u64)>;
    let mut sides: [Side; 2] = Default::default();
    let mut count = [0u64; 2];
    for (req, rs) in results {
        let side = usize::from(rs.latency_ns >= threshold_ns);
        count[side] += 1;
        let mut per: BTreeMap<Arc<str>, u64> = BTreeMap::new();
        for (i, s) in req.spans.iter().enumerate() {
            let t = u64::try_from(rs.critical_ns[i]).unwrap_or(0);
            if t > 0 {
                *per.entry(s.call_path.clone()).or_default() += t;
            }
        }
        for (cp, t) in per {
            let e = sides[side].entry(cp.clone()).or_insert_with(|| {
                let stack: Vec<u32> = cp
                    .split(';')
                    .map(|f| {
                        *frame_ids.entry(f.to_owned()).or_insert_with(|| {
                            let (svc, op) = f.split_once(':').unwrap_or((f, ""));
                            frames.push(Frame::new(svc, op));
                            (frames.len() - 1) as u32
                        })
                    })
                    .collect();
                (stack.into_boxed_slice(), 0, 0)
            });
            e.1 += t;
            e.2 += 1;
        }
    }
    let make = |side: usize| {
        let stacks = sides[side]
            .values()
            .map(|(stack, sum, n)| StackStats {
                stack: stack.clone(),
                sum_nanos: *sum,
                requests: *n,
                detail: None,
            })
            .collect();
        Aggregate::from_parts(
            frames.clone(),
            stacks,
            count[side],
            vec![format!(
                "Mystery Machine outlier split at {threshold_ns} ns: {}",
                if side == 1 { "outliers" } else { "others" }
            )],
        )
    };
    (make(0), make(1))
}
