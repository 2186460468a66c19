//! What if a call were faster? Replay traces through the learned models
//! with one operation's latency scaled, and predict the roots (Mann §6,
//! "measuring the impact of a change").

use super::invocation::{KeyInterner, invocations_by_span};
use super::{Method, Models};
use crate::traces::model::Trace;

/// A change to replay: every span of `service:operation` takes `factor`
/// times as long (`0.5`: twice as fast).
#[derive(Clone, Debug, PartialEq)]
pub struct Scale {
    /// `service:operation`.
    pub key: String,
    /// The multiplier, ≥ 0.
    pub factor: f64,
}

impl std::str::FromStr for Scale {
    type Err = String;

    fn from_str(s: &str) -> Result<Scale, String> {
        let (key, factor) = s.rsplit_once('=').ok_or_else(|| {
            format!("--scale {s:?}: expected SERVICE:OPERATION=FACTOR, e.g. 'db:query=0.5'")
        })?;
        if !key.contains(':') {
            return Err(format!(
                "--scale {s:?}: {key:?} is not SERVICE:OPERATION (the operation is needed: a service has many)"
            ));
        }
        let factor: f64 = factor
            .trim()
            .parse()
            .map_err(|_| format!("--scale {s:?}: {factor:?} is not a number"))?;
        if !(factor.is_finite() && factor >= 0.0) {
            return Err(format!(
                "--scale {s:?}: the factor must be a finite number ≥ 0"
            ));
        }
        Ok(Scale {
            key: key.trim().to_owned(),
            factor,
        })
    }
}

/// Mean and percentiles of root latencies, ns.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Latencies {
    /// Mean.
    pub mean: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Latencies {
    fn of(mut v: Vec<f64>) -> Latencies {
        if v.is_empty() {
            return Latencies::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Latencies {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
        }
    }

    /// `{"mean_us", "p50_us", "p90_us", "p99_us"}` (the `whatif` JSON
    /// contract).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "mean_us": self.mean / 1e3, "p50_us": self.p50 / 1e3,
            "p90_us": self.p90 / 1e3, "p99_us": self.p99 / 1e3,
        })
    }
}

/// The roots before and after the change.
#[derive(Clone, Debug, Default)]
pub struct WhatIf {
    /// Root spans replayed.
    pub roots: usize,
    /// The roots' latencies as recorded.
    pub actual: Latencies,
    /// As the models predict them without the change (the baseline the
    /// change is measured against: the same model error on both sides).
    pub before: Latencies,
    /// As the models predict them with the change.
    pub after: Latencies,
    /// Spans whose latency came from a model (the others are as recorded).
    pub modelled_spans: usize,
    /// Spans the change scaled.
    pub scaled_spans: usize,
}

impl WhatIf {
    /// `{"before": {...}, "after": {...}, "actual": {...}, "roots": N}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "before": self.before.to_json(),
            "after": self.after.to_json(),
            "actual": self.actual.to_json(),
            "roots": self.roots,
            "modelled_spans": self.modelled_spans,
            "scaled_spans": self.scaled_spans,
        })
    }
}

/// Replay `traces` with `scales` applied: each span's latency is, bottom
/// up, its parent model's `method` estimate from its children's (already
/// replayed) latencies when its `service:operation` has a model, else its
/// recorded latency moved as far as the end of its last-ending awaited
/// child moves, each child keeping its recorded start (an RPC hop's client
/// span moves with its server span); a scaled operation's latency is then
/// multiplied by its factor. The change reaches the root through every ancestor's model.
/// Each invocation keeps the execution flow its recorded latencies select
/// ([`ParentModel::predict_as`](super::ParentModel::predict_as)).
pub fn whatif(
    models: &Models,
    traces: &[Trace],
    scales: &[Scale],
    method: Method,
    keys: &mut KeyInterner,
) -> WhatIf {
    let mut out = WhatIf::default();
    let (mut actual, mut before, mut after) = (Vec::new(), Vec::new(), Vec::new());
    for trace in traces {
        let n = trace.spans.len();
        let mut inv_of = vec![None; n];
        for (i, inv) in invocations_by_span(trace, keys) {
            inv_of[i as usize] = Some(inv);
        }
        let factor: Vec<Option<f64>> = trace
            .spans
            .iter()
            .map(|s| {
                scales
                    .iter()
                    .find(|sc| {
                        sc.key
                            .split_once(':')
                            .is_some_and(|(svc, op)| *s.service == *svc && *s.operation == *op)
                    })
                    .map(|sc| sc.factor)
            })
            .collect();
        let depth = trace.depths();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(depth[i]));
        let mut base = vec![0.0f64; n];
        let mut new = vec![0.0f64; n];
        for i in order {
            let recorded = trace.spans[i].duration_ns.max(0) as f64;
            let model = inv_of[i]
                .as_ref()
                .and_then(|inv| models.parents.get(&inv.parent).map(|m| (m, inv)));
            (base[i], new[i]) = match model {
                Some((m, inv)) => {
                    out.modelled_spans += 1;
                    let with = |lat: &[f64]| {
                        let mut v = inv.clone();
                        for c in &mut v.children {
                            c.latency = lat[c.id as usize];
                        }
                        m.predict_as(method, inv, &v)
                    };
                    (with(&base), with(&new))
                }
                None => {
                    // No model (an RPC hop, a leaf, a parent below
                    // --min-children): the recorded latency, moved as its
                    // last-ending awaited child's end moves when each child
                    // keeps its recorded start and takes its replayed
                    // latency.
                    let span = &trace.spans[i];
                    let kids: Vec<usize> = trace
                        .children(i as u32)
                        .iter()
                        .map(|&c| c as usize)
                        .filter(|&c| {
                            let k = &trace.spans[c];
                            !k.is_detached() && k.end_ns() <= span.end_ns()
                        })
                        .collect();
                    let end = |lat: &[f64]| {
                        kids.iter()
                            .map(|&c| (trace.spans[c].start_ns - span.start_ns) as f64 + lat[c])
                            .fold(f64::NEG_INFINITY, f64::max)
                    };
                    let delta = if kids.is_empty() {
                        0.0
                    } else {
                        end(&new) - end(&base)
                    };
                    (recorded, (recorded + delta).max(0.0))
                }
            };
            if let Some(f) = factor[i] {
                out.scaled_spans += 1;
                new[i] *= f;
            }
        }
        for r in trace.roots() {
            let r = r as usize;
            actual.push(trace.spans[r].duration_ns.max(0) as f64);
            before.push(base[r]);
            after.push(new[r]);
        }
    }
    out.roots = actual.len();
    out.actual = Latencies::of(actual);
    out.before = Latencies::of(before);
    out.after = Latencies::of(after);
    out
}
