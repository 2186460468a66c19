//! Execution flows (Mann, Sandler, Krushevskaja, Guha, Even-dar, *Modeling
//! the Parallel Execution of Black-Box Services*, HotCloud 2011): predict a
//! parent's latency from its children's, and measure how well each of the
//! paper's six estimators does (Mann Table 1).
//!
//! - [`invocation`]: one parent span and its direct children; per child `L(m)`
//!   (latency) and `P(m)` (the time from the latest sibling that finished
//!   before it started, or from the parent's start); the invocation graph
//!   (`a → b` when `a` finished before `b` started).
//! - [`model`]: per parent `service:operation`, the six estimators:
//!   serial, parallel, linear regression, best critical path, aggregate
//!   flow, nearest-neighbour flow.
//! - [`whatif`](mod@whatif): replay traces with one operation's latency scaled and
//!   predict the roots through every ancestor's model.
//! - [`evaluate`]: train on one set of invocations, predict another, and
//!   report the relative error `max(est, actual) / min(est, actual) − 1` at
//!   p50 / p90 / p95 / p99 per method (∞ when one of them is 0).
//!
//! # Defined behaviour where the paper is silent
//!
//! - **Children's identity**: `service:operation#k`, `k` the occurrence
//!   among same-named siblings in start order; a **retried** call is a
//!   second child (`#1`) with its own place in the flow.
//! - **The parent's own time after its last wait** (`P(return)`, the time
//!   from the end of the latest awaited child to the parent's end) is
//!   observable in a test invocation like every `P(m)`; serial, parallel,
//!   critical-path and both flow estimates add it. Linear regression has
//!   an intercept instead.
//! - **Fire-and-forget children** (still running when the parent returned)
//!   have no edge to `return` in the invocation graph; the aggregate flow
//!   keeps `m → return` only when every training invocation with `m`
//!   waited for it. Serial and parallel count them like any child.
//! - **Children with no sibling ordering** in a flow start with the parent
//!   (no predecessor). A test child the flow has never seen is treated so
//!   too, and as awaited. A flow child missing from the test invocation is
//!   skipped: its successors wait for their other predecessors.
//! - **Missing children** in linear regression contribute 0, as a child
//!   unseen in training does. In the critical-path method, a path
//!   applies to a test invocation only when all its children are present;
//!   with none applicable the estimate is `P(return)` alone (the max over
//!   an empty set is 0).
//! - **Nearest neighbour**: flows are compared first by how many children
//!   are present on only one side, then by a score ([`NnChoice`]): by
//!   default the flow's negative log-likelihood with its frequency as a
//!   prior, so a rare flow with very variable latencies cannot capture
//!   ordinary invocations; Mann §4's plain distance is kept as
//!   [`NnChoice::Mann`]. Variances are floored at (10 % of the mean)² and
//!   1 µs².

pub mod invocation;
pub mod model;
pub mod plot;
pub mod synth;
pub mod whatif;

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

pub use invocation::{Call, Child, Invocation, KeyInterner, invocations, invocations_by_span};
pub use model::{Flow, Method, NnChoice, NnFlow, ParentModel, Regression, critical_path};
pub use whatif::{Latencies, Scale, WhatIf, whatif};

/// Models for every parent seen in training.
#[derive(Debug, Default)]
pub struct Models {
    /// By parent `service:operation`.
    pub parents: BTreeMap<Arc<str>, ParentModel>,
}

impl Models {
    /// Train every parent's estimators on the invocations that have at
    /// least `min_children` children (Mann §5 ignores parents with fewer
    /// than five: too simple to benefit).
    pub fn train(train: &[Invocation], min_children: usize) -> Models {
        Models::train_with(train, min_children, NnChoice::default())
    }

    /// [`Models::train`] with the nearest-neighbour flow chosen by `nn`.
    pub fn train_with(train: &[Invocation], min_children: usize, nn: NnChoice) -> Models {
        let mut by_parent: FxHashMap<Arc<str>, Vec<&Invocation>> = FxHashMap::default();
        for inv in train.iter().filter(|i| i.children.len() >= min_children) {
            by_parent.entry(inv.parent.clone()).or_default().push(inv);
        }
        Models {
            parents: by_parent
                .into_iter()
                .map(|(p, invs)| (p.clone(), ParentModel::train_with(p, &invs, nn)))
                .collect(),
        }
    }
}

impl Models {
    /// The learned flows as one Graphviz graph: per parent, the aggregate
    /// flow and the `top` most frequent nearest-neighbour flows (with how
    /// many training invocations had each), edges transitively reduced.
    pub fn to_dot(&self, top: usize) -> String {
        let mut out = String::from("digraph flows {\n  rankdir=LR;\n");
        for (p, (parent, m)) in self.parents.iter().enumerate() {
            out.push_str(&m.aggregate.to_dot(
                &format!("p{p}_agg"),
                &format!("{parent}: aggregate flow ({} invocations)", m.trained),
            ));
            for (f, nn) in m.flows.iter().take(top).enumerate() {
                out.push_str(&nn.flow.to_dot(
                    &format!("p{p}_f{f}"),
                    &format!(
                        "{parent}: flow {} ({} of {} invocations)",
                        f + 1,
                        nn.count,
                        m.trained
                    ),
                ));
            }
        }
        out.push_str("}\n");
        out
    }
}

/// Mann §5's relative error: `max(est, actual) / min(est, actual) − 1`,
/// symmetric in over- and underestimates; ∞ when exactly one is 0, 0 when
/// both are.
pub fn relative_error(estimate: f64, actual: f64) -> f64 {
    let (lo, hi) = if estimate < actual {
        (estimate.max(0.0), actual)
    } else {
        (actual.max(0.0), estimate)
    };
    if hi <= 0.0 {
        0.0
    } else if lo <= 0.0 {
        f64::INFINITY
    } else {
        hi / lo - 1.0
    }
}

/// One method's errors over the test invocations.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Test invocations scored.
    pub n: usize,
    /// Relative error at p50 / p90 / p95 / p99 (nearest rank; may be ∞).
    pub p50: f64,
    /// At p90.
    pub p90: f64,
    /// At p95.
    pub p95: f64,
    /// At p99.
    pub p99: f64,
    /// `estimate / actual` per invocation, sorted (Mann Figure 2, left);
    /// ∞ where the actual latency is 0.
    pub ratios: Vec<f64>,
    /// The relative errors, sorted (Mann Figure 2, right, is their CDF).
    pub errors: Vec<f64>,
}

fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    fn of(mut errors: Vec<f64>, mut ratios: Vec<f64>) -> Summary {
        errors.sort_by(f64::total_cmp);
        ratios.sort_by(f64::total_cmp);
        Summary {
            n: errors.len(),
            p50: nearest_rank(&errors, 0.50),
            p90: nearest_rank(&errors, 0.90),
            p95: nearest_rank(&errors, 0.95),
            p99: nearest_rank(&errors, 0.99),
            ratios,
            errors,
        }
    }
}

/// Mann Table 1 for one train/test split.
#[derive(Clone, Debug, Default)]
pub struct Evaluation {
    /// Per method, in [`Method::ALL`]'s order.
    pub methods: Vec<(Method, Summary)>,
    /// Parents with a model.
    pub parents_trained: usize,
    /// Training invocations used (with at least `min_children` children).
    pub train_invocations: usize,
    /// Test invocations scored.
    pub test_invocations: usize,
    /// Test invocations (with at least `min_children` children) whose
    /// parent never appeared in training: not scored.
    pub unseen_parent: usize,
}

/// Train on `train`, predict every invocation of `test` with at least
/// `min_children` children, and summarise each method's relative errors.
pub fn evaluate(train: &[Invocation], test: &[Invocation], min_children: usize) -> Evaluation {
    evaluate_models(&Models::train(train, min_children), test, min_children)
}

/// [`evaluate`] with models already trained.
pub fn evaluate_models(models: &Models, test: &[Invocation], min_children: usize) -> Evaluation {
    let mut errors: Vec<Vec<f64>> = vec![Vec::new(); Method::ALL.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); Method::ALL.len()];
    let mut eval = Evaluation {
        parents_trained: models.parents.len(),
        train_invocations: models.parents.values().map(|m| m.trained).sum(),
        ..Evaluation::default()
    };
    for inv in test.iter().filter(|i| i.children.len() >= min_children) {
        let Some(model) = models.parents.get(&inv.parent) else {
            eval.unseen_parent += 1;
            continue;
        };
        eval.test_invocations += 1;
        for (m, method) in Method::ALL.iter().enumerate() {
            let est = model.predict(*method, inv);
            errors[m].push(relative_error(est, inv.latency));
            ratios[m].push(if inv.latency > 0.0 {
                est / inv.latency
            } else {
                f64::INFINITY
            });
        }
    }
    eval.methods = Method::ALL
        .iter()
        .zip(errors.into_iter().zip(ratios))
        .map(|(m, (e, r))| (*m, Summary::of(e, r)))
        .collect();
    eval
}

impl Evaluation {
    /// `predict`'s JSON (a contract other tools read): `{"methods":
    /// {"serial": {"n", "p50", "p90", "p95", "p99"}, …}, …}`. ∞ is written
    /// as `null` (JSON has no infinity).
    pub fn to_json(&self) -> serde_json::Value {
        let num = |x: f64| {
            if x.is_finite() {
                serde_json::json!(x)
            } else {
                serde_json::Value::Null
            }
        };
        let methods: serde_json::Map<String, serde_json::Value> = self
            .methods
            .iter()
            .map(|(m, s)| {
                (
                    m.name().to_owned(),
                    serde_json::json!({
                        "n": s.n, "p50": num(s.p50), "p90": num(s.p90),
                        "p95": num(s.p95), "p99": num(s.p99),
                    }),
                )
            })
            .collect();
        serde_json::json!({
            "methods": methods,
            "parents_trained": self.parents_trained,
            "train_invocations": self.train_invocations,
            "test_invocations": self.test_invocations,
            "unseen_parent": self.unseen_parent,
            "relative_error": "max(estimate, actual) / min(estimate, actual) - 1 (Mann et al. Table 1); null is infinity",
        })
    }

    /// Mann Table 1 as text: one row per method, ∞ printed as such.
    pub fn to_table(&self) -> String {
        use std::fmt::Write as _;
        let cell = |x: f64| {
            if x.is_finite() {
                format!("{x:.2}")
            } else {
                "∞".to_owned()
            }
        };
        let mut out = format!(
            "{:<22} {:>7} {:>7} {:>7} {:>7} {:>7}\n",
            "relative error", "n", "50%", "90%", "95%", "99%"
        );
        for (m, s) in &self.methods {
            let _ = writeln!(
                out,
                "{:<22} {:>7} {:>7} {:>7} {:>7} {:>7}",
                m.label(),
                s.n,
                cell(s.p50),
                cell(s.p90),
                cell(s.p95),
                cell(s.p99)
            );
        }
        out
    }
}

#[cfg(test)]
mod synth_tests;
#[cfg(test)]
mod tests;
