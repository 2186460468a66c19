//! CRISP's anomaly detection (Zhang et al., *CRISP*, USENIX ATC 2022, §6.3)
//! over the Mystery Machine's critical paths: each request becomes a vector
//! of critical-path time per call path; a low-rank linear model (PCA, a
//! linear autoencoder) fitted on a training window reconstructs it, and the
//! reconstruction error is the request's anomaly score. The call paths with
//! the largest residuals explain a high score.
//!
//! # Defined behaviour
//!
//! - Features are standardised with the training mean and standard
//!   deviation (floored at 1 % of the mean latency, so a call path that
//!   never varied in training does not turn a 1 µs change into a huge score).
//! - The rank is the smallest that explains `variance` (0.9) of the
//!   training variance, at most `max_rank`.
//! - Time on call paths never seen in training counts as a residual of its
//!   own, scaled like the latency.

use std::sync::Arc;

use nalgebra::{DMatrix, DVector};
use rustc_hash::FxHashMap;

use super::events::Request;
use super::slack::RequestSlack;

/// Critical-path time per call path of one request, ns.
pub type Profile = Vec<(Arc<str>, i64)>;

/// A request's [`Profile`], from its critical path through the model.
pub fn profile(req: &Request, rs: &RequestSlack) -> Profile {
    let mut out: Vec<(Arc<str>, i64)> = Vec::new();
    for (i, s) in req.spans.iter().enumerate() {
        let t = rs.critical_ns[i];
        if t == 0 {
            continue;
        }
        match out.iter_mut().find(|(c, _)| *c == s.call_path) {
            Some((_, v)) => *v += t,
            None => out.push((s.call_path.clone(), t)),
        }
    }
    out
}

/// A request's [`Profile`] under CRISP's reference accounting
/// ([`crisp_reference`](crate::traces::analysis::crisp_reference)): the
/// spans on CRISP's critical path (last-finishing child first, `fraction`
/// the overlap allowance), each charged its duration minus its path
/// children's, summed per call path with negatives zeroed: the vectors
/// CRISP's own anomaly detection is fitted on.
pub fn crisp_profile(req: &Request, fraction: f64) -> Profile {
    use crate::traces::analysis::crisp_reference::critical_path_by;
    let n = req.spans.len();
    let mut children: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (i, s) in req.spans.iter().enumerate() {
        if let Some(p) = s.parent {
            children[p as usize].push(i as u32);
        }
    }
    let path = critical_path_by(
        0,
        |node, out| out.extend_from_slice(&children[node as usize]),
        |i| req.spans[i as usize].start,
        |i| req.spans[i as usize].end,
        fraction,
    );
    let mut out: Profile = Vec::new();
    for r in path {
        let c = &req.spans[r.span as usize].call_path;
        match out.iter_mut().find(|(k, _)| k == c) {
            Some((_, v)) => *v += r.exclusive_ns,
            None => out.push((c.clone(), r.exclusive_ns)),
        }
    }
    for (_, v) in &mut out {
        *v = (*v).max(0);
    }
    out
}

/// A fitted low-rank model of one endpoint's critical-path vectors.
#[derive(Clone, Debug)]
pub struct Pca {
    /// Feature names (call paths).
    pub features: Vec<Arc<str>>,
    index: FxHashMap<Arc<str>, usize>,
    mean: DVector<f64>,
    scale: DVector<f64>,
    /// Principal directions, one per column.
    basis: DMatrix<f64>,
    latency_scale: f64,
}

/// A scored request.
#[derive(Clone, Debug)]
pub struct Score {
    /// Squared reconstruction error.
    pub score: f64,
    /// The call paths with the largest squared residuals, largest first.
    pub top: Vec<(Arc<str>, f64)>,
}

impl Pca {
    /// Fit on training profiles. `None` without at least two.
    pub fn fit(train: &[Profile], variance: f64, max_rank: usize) -> Option<Pca> {
        if train.len() < 2 {
            return None;
        }
        let mut index: FxHashMap<Arc<str>, usize> = FxHashMap::default();
        let mut features = Vec::new();
        for p in train {
            for (c, _) in p {
                if !index.contains_key(c) {
                    index.insert(c.clone(), features.len());
                    features.push(c.clone());
                }
            }
        }
        let (n, d) = (train.len(), features.len());
        let mut x = DMatrix::<f64>::zeros(n, d);
        let mut lat = 0.0;
        for (r, p) in train.iter().enumerate() {
            for (c, v) in p {
                x[(r, index[c])] += *v as f64;
                lat += *v as f64;
            }
        }
        let floor = (0.01 * lat / n as f64).max(1.0);
        let mean = DVector::from_iterator(d, x.column_iter().map(|c| c.mean()));
        let scale =
            DVector::from_iterator(d, x.column_iter().map(|c| c.variance().sqrt().max(floor)));
        for j in 0..d {
            for r in 0..n {
                x[(r, j)] = (x[(r, j)] - mean[j]) / scale[j];
            }
        }
        let svd = x.svd(false, true);
        let v_t = svd.v_t?;
        let mut order: Vec<usize> = (0..svd.singular_values.len()).collect();
        order.sort_by(|&a, &b| svd.singular_values[b].total_cmp(&svd.singular_values[a]));
        let total: f64 = svd.singular_values.iter().map(|s| s * s).sum();
        let mut rank = 0;
        let mut acc = 0.0;
        while rank < order.len() && rank < max_rank && (total <= 0.0 || acc < variance * total) {
            acc += svd.singular_values[order[rank]].powi(2);
            rank += 1;
        }
        let mut basis = DMatrix::<f64>::zeros(d, rank);
        for (k, &i) in order.iter().take(rank).enumerate() {
            for j in 0..d {
                basis[(j, k)] = v_t[(i, j)];
            }
        }
        let lat_mean = lat / n as f64;
        Some(Pca {
            features,
            index,
            mean,
            scale,
            basis,
            latency_scale: lat_mean.max(1.0),
        })
    }

    /// The rank kept.
    pub fn rank(&self) -> usize {
        self.basis.ncols()
    }

    /// Score a profile (see the module docs).
    pub fn score(&self, p: &[(Arc<str>, i64)], top: usize) -> Score {
        let d = self.features.len();
        let mut z = DVector::<f64>::zeros(d);
        let mut unseen: Vec<(Arc<str>, f64)> = Vec::new();
        for (c, v) in p {
            match self.index.get(c) {
                Some(&j) => z[j] += *v as f64,
                None => unseen.push((c.clone(), (*v as f64 / self.latency_scale).powi(2))),
            }
        }
        for j in 0..d {
            z[j] = (z[j] - self.mean[j]) / self.scale[j];
        }
        let proj = &self.basis * (self.basis.transpose() * &z);
        let resid = z - proj;
        let mut parts: Vec<(Arc<str>, f64)> = (0..d)
            .map(|j| (self.features[j].clone(), resid[j] * resid[j]))
            .chain(unseen)
            .collect();
        let score = parts.iter().map(|p| p.1).sum();
        parts.sort_by(|a, b| b.1.total_cmp(&a.1));
        parts.truncate(top);
        Score { score, top: parts }
    }
}

/// Precision and recall of the `k` highest `scores` against `labels`.
pub fn precision_recall_at(scores: &[f64], labels: &[bool], k: usize) -> (f64, f64) {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let k = k.min(idx.len());
    let hit = idx[..k].iter().filter(|&&i| labels[i]).count();
    let pos = labels.iter().filter(|l| **l).count();
    (
        if k == 0 { 0.0 } else { hit as f64 / k as f64 },
        if pos == 0 {
            0.0
        } else {
            hit as f64 / pos as f64
        },
    )
}
