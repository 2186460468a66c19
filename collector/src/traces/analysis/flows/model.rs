//! The six estimators of Mann et al. §3–4, trained per parent
//! `service:operation`.

use std::sync::Arc;

use nalgebra::{DMatrix, DVector};
use rustc_hash::{FxHashMap, FxHashSet};

use super::invocation::Invocation;

/// An estimator of a parent's latency from its children's (Mann §5's six).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// (1) purely sequential children: `Σ (P(m) + L(m))`.
    Serial,
    /// (2) purely parallel children: `max (P(m) + L(m))`.
    Parallel,
    /// (3) least squares on the children's latencies (§3.1).
    LinearRegression,
    /// (4) the longest of the critical paths seen in training (§3.2).
    CriticalPath,
    /// (5) the aggregate flow: the intersection of every training
    /// invocation graph (§4).
    AggregateFlow,
    /// (6) the nearest-neighbour flow: one flow per distinct invocation
    /// graph, the one nearest the test invocation's latencies (§4).
    NearestNeighborFlow,
}

impl Method {
    /// Every method, in Mann Table 1's order of introduction.
    pub const ALL: [Method; 6] = [
        Method::Serial,
        Method::Parallel,
        Method::LinearRegression,
        Method::CriticalPath,
        Method::AggregateFlow,
        Method::NearestNeighborFlow,
    ];

    /// The name in `predict`'s JSON (a contract: `serial`, `parallel`,
    /// `linear_regression`, `critical_path`, `aggregate_flow`,
    /// `nearest_neighbor_flow`).
    pub fn name(self) -> &'static str {
        match self {
            Method::Serial => "serial",
            Method::Parallel => "parallel",
            Method::LinearRegression => "linear_regression",
            Method::CriticalPath => "critical_path",
            Method::AggregateFlow => "aggregate_flow",
            Method::NearestNeighborFlow => "nearest_neighbor_flow",
        }
    }

    /// Mann Table 1's row label.
    pub fn label(self) -> &'static str {
        match self {
            Method::Serial => "Serial",
            Method::Parallel => "Parallel",
            Method::LinearRegression => "Linear Regression",
            Method::CriticalPath => "Critical Path",
            Method::AggregateFlow => "Aggregate Flow",
            Method::NearestNeighborFlow => "Nearest Neighbor Flow",
        }
    }
}

/// An execution flow (Mann §4): which children wait for which, and which
/// the parent waits for before returning. Nodes are child keys
/// (`service:operation#k`) in a topological order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Flow {
    /// Child keys, every edge going from an earlier to a later one.
    pub nodes: Vec<Arc<str>>,
    /// `preds[i]`: indexes into `nodes` of the children node `i` waits for.
    pub preds: Vec<Vec<usize>>,
    /// `awaited[i]`: the parent waits for node `i` before returning (an
    /// edge `i → return`).
    pub awaited: Vec<bool>,
}

impl Flow {
    fn index(&self) -> FxHashMap<&str, usize> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, k)| (&**k, i))
            .collect()
    }

    /// The flow of one invocation graph.
    fn of(inv: &Invocation) -> Flow {
        let n = inv.children.len();
        let mut preds = vec![Vec::new(); n];
        for (i, j) in inv.edges() {
            preds[j].push(i);
        }
        Flow {
            nodes: inv.children.iter().map(|c| c.key.clone()).collect(),
            preds,
            awaited: inv.children.iter().map(|c| c.awaited).collect(),
        }
    }

    /// The edges without those implied by others (the transitive
    /// reduction, Mann §4 footnote 1), `(from, to)` as node indexes: what
    /// a person reads.
    pub fn reduced_edges(&self) -> Vec<(usize, usize)> {
        let n = self.nodes.len();
        // reach[i]: the nodes reachable from i; nodes are in topological
        // order, so one pass from the last node back fills them.
        let mut reach = vec![vec![false; n]; n];
        let mut succs = vec![Vec::new(); n];
        for (j, ps) in self.preds.iter().enumerate() {
            for &i in ps {
                succs[i].push(j);
            }
        }
        for i in (0..n).rev() {
            for &j in &succs[i] {
                reach[i][j] = true;
                let (lo, hi) = reach.split_at_mut(j);
                for (r, &x) in lo[i].iter_mut().zip(&hi[0]) {
                    *r |= x;
                }
            }
        }
        let mut out = Vec::new();
        for (j, ps) in self.preds.iter().enumerate() {
            for &i in ps {
                if !ps.iter().any(|&k| k != i && reach[i][k]) {
                    out.push((i, j));
                }
            }
        }
        out
    }

    /// The flow as a Graphviz subgraph: `start`, the children, `return`.
    pub fn to_dot(&self, id: &str, title: &str) -> String {
        use std::fmt::Write as _;
        let q = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let mut out = format!(
            "  subgraph \"cluster_{id}\" {{\n    label=\"{}\";\n",
            q(title)
        );
        let _ = writeln!(out, "    \"{id}_start\" [label=\"start\", shape=circle];");
        let _ = writeln!(
            out,
            "    \"{id}_return\" [label=\"return\", shape=doublecircle];"
        );
        for (i, k) in self.nodes.iter().enumerate() {
            let _ = writeln!(out, "    \"{id}_{i}\" [label=\"{}\", shape=box];", q(k));
            if self.preds[i].is_empty() {
                let _ = writeln!(out, "    \"{id}_start\" -> \"{id}_{i}\";");
            }
        }
        let reduced = self.reduced_edges();
        for (i, j) in &reduced {
            let _ = writeln!(out, "    \"{id}_{i}\" -> \"{id}_{j}\";");
        }
        for (i, &w) in self.awaited.iter().enumerate() {
            // Only the awaited children nothing else awaited waits for.
            if w && !reduced.iter().any(|&(a, b)| a == i && self.awaited[b]) {
                let _ = writeln!(out, "    \"{id}_{i}\" -> \"{id}_return\";");
            }
        }
        out.push_str("  }\n");
        out
    }

    /// Mann §4's dynamic program: `c(m) = P(m) + L(m) + max c(pred)` over a
    /// topological order, then `c(return)`; plus the invocation's
    /// `P(return)`.
    ///
    /// Children of the invocation the flow does not know run in parallel
    /// with everything (no predecessor) and are waited for; children of the
    /// flow missing from the invocation are skipped (their successors wait
    /// for their other predecessors).
    pub fn predict(&self, inv: &Invocation) -> f64 {
        let at = self.index();
        let mut c = vec![None::<f64>; self.nodes.len()];
        let mut ret = 0.0f64;
        for (i, key) in self.nodes.iter().enumerate() {
            let Some(child) = inv.child(key) else {
                continue;
            };
            let wait = self.preds[i]
                .iter()
                .filter_map(|&p| c[p])
                .fold(0.0f64, f64::max);
            let done = child.pre + child.latency + wait;
            c[i] = Some(done);
            if self.awaited[i] {
                ret = ret.max(done);
            }
        }
        for child in &inv.children {
            if !at.contains_key(&*child.key) {
                ret = ret.max(child.pre + child.latency);
            }
        }
        ret + inv.post
    }
}

/// One nearest-neighbour candidate: a distinct invocation graph, with the
/// mean and variance of each child's latency over the training
/// invocations that had exactly this graph.
#[derive(Clone, Debug)]
pub struct NnFlow {
    /// The flow (the invocation graph itself).
    pub flow: Flow,
    /// Training invocations with this graph.
    pub count: usize,
    /// Per node: mean latency, ns.
    pub mean: Vec<f64>,
    /// Per node: latency variance, ns².
    pub var: Vec<f64>,
    /// Per node: mean `P(m)`, ns.
    pub pre_mean: Vec<f64>,
    /// Per node: `P(m)` variance, ns².
    pub pre_var: Vec<f64>,
}

/// How the nearest-neighbour flow is chosen for a test invocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum NnChoice {
    /// Mann §4 as published: the smallest `Σ (x − mean)² / σ²` over the
    /// flow's children (latency and `P(m)`). A flow seen a handful of
    /// times with very variable latencies is near everything (its σ² is
    /// large), so it can capture most test invocations.
    Mann,
    /// The most probable flow: Mann's distance plus each child's `ln σ²`
    /// (the Gaussian log-likelihood's normaliser Mann leaves out, which
    /// charges a flow for being vague) minus `2 ln(count / trained)` (the
    /// flow's frequency as a prior). A rare noisy flow wins only when the
    /// test invocation is far from every frequent one.
    #[default]
    Likelihood,
    /// Mann's distance over the flows seen in at least 1 % of the training
    /// invocations (and at least 5 of them); the others only when no such
    /// flow exists.
    MinSupport,
}

impl NnChoice {
    /// Every choice, the default first.
    pub const ALL: [NnChoice; 3] = [NnChoice::Likelihood, NnChoice::Mann, NnChoice::MinSupport];

    /// The name `--nn` takes.
    pub fn name(self) -> &'static str {
        match self {
            NnChoice::Mann => "mann",
            NnChoice::Likelihood => "likelihood",
            NnChoice::MinSupport => "min-support",
        }
    }
}

impl std::str::FromStr for NnChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<NnChoice, String> {
        NnChoice::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown nearest-neighbour choice {s:?}: use likelihood, mann or min-support"
                )
            })
    }
}

impl NnFlow {
    /// Mann §4's distance `Σ (L(m) − mean)² / σ²(m)` over the flow's
    /// children, with the number of children present on only one side
    /// first: a flow with the test's exact set of children always wins
    /// over one without. Variances are floored at (10 % of the mean)² and
    /// 1 µs² so a flow seen once (variance 0) is not infinitely far. With
    /// `likelihood`, each child's `ln σ²` is added (see
    /// [`NnChoice::Likelihood`]).
    fn distance(&self, inv: &Invocation, likelihood: bool) -> (usize, f64) {
        let mut missing = 0;
        let mut d = 0.0;
        for (i, key) in self.flow.nodes.iter().enumerate() {
            match inv.child(key) {
                Some(c) => {
                    d += z2(c.latency, self.mean[i], self.var[i]);
                    d += z2(c.pre, self.pre_mean[i], self.pre_var[i]);
                    if likelihood {
                        d += floored(self.mean[i], self.var[i]).ln();
                        d += floored(self.pre_mean[i], self.pre_var[i]).ln();
                    }
                }
                None => missing += 1,
            }
        }
        let idx = self.flow.index();
        missing += inv
            .children
            .iter()
            .filter(|c| !idx.contains_key(&*c.key))
            .count();
        (missing, d)
    }
}

/// The variance floored at (10 % of the mean)² and 1 µs².
fn floored(mean: f64, var: f64) -> f64 {
    var.max((0.1 * mean).powi(2)).max(1e6)
}

/// `(x − mean)² / var`, the variance floored at (10 % of the mean)² and
/// 1 µs² so a flow seen once (variance 0) is not infinitely far.
fn z2(x: f64, mean: f64, var: f64) -> f64 {
    (x - mean).powi(2) / floored(mean, var)
}

/// Least squares weights per child key plus an intercept (the parent's own
/// time), ridge-regularised.
#[derive(Clone, Debug)]
pub struct Regression {
    /// `(key, weight)`.
    pub weights: Vec<(Arc<str>, f64)>,
    /// The constant term, ns.
    pub intercept: f64,
}

impl Regression {
    /// Fit `L ≈ Σ w(m) L(m) + b` over the training invocations.
    ///
    /// Collinear children (always called together with proportional
    /// latencies) and children seen in few invocations make `XᵀX` singular;
    /// a ridge term of 10⁻⁸ × each diagonal entry keeps the system solvable
    /// and splits the weight between them (the prediction is what
    /// matters, not the individual weights). A child absent from an
    /// invocation contributes 0 to that row.
    fn fit(train: &[&Invocation]) -> Option<Regression> {
        let mut keys: Vec<Arc<str>> = Vec::new();
        let mut at: FxHashMap<Arc<str>, usize> = FxHashMap::default();
        for inv in train {
            for c in &inv.children {
                at.entry(c.key.clone()).or_insert_with(|| {
                    keys.push(c.key.clone());
                    keys.len() - 1
                });
            }
        }
        let p = keys.len() + 1;
        let n = train.len();
        if n == 0 {
            return None;
        }
        let mut x = DMatrix::<f64>::zeros(n, p);
        let mut y = DVector::<f64>::zeros(n);
        for (r, inv) in train.iter().enumerate() {
            for c in &inv.children {
                x[(r, at[&c.key])] += c.latency;
            }
            x[(r, p - 1)] = 1.0;
            y[r] = inv.latency;
        }
        let mut xtx = x.transpose() * &x;
        // Ridge relative to each column's own scale (latency columns are
        // ~10¹³ ns², the intercept's is n): shrinks nothing measurably,
        // but makes collinear columns solvable.
        for i in 0..p {
            xtx[(i, i)] += 1e-8 * xtx[(i, i)] + 1e-9;
        }
        let xty = x.transpose() * &y;
        let w = xtx.cholesky()?.solve(&xty);
        Some(Regression {
            weights: keys.into_iter().zip(w.iter().copied()).collect(),
            intercept: w[p - 1],
        })
    }

    /// The prediction; children unseen in training contribute nothing.
    pub fn predict(&self, inv: &Invocation) -> f64 {
        let mut sum = self.intercept;
        for (key, w) in &self.weights {
            if let Some(c) = inv.child(key) {
                sum += w * c.latency;
            }
        }
        sum
    }
}

/// Every estimator trained on one parent's invocations.
#[derive(Clone, Debug)]
pub struct ParentModel {
    /// The parent's `service:operation`.
    pub parent: Arc<str>,
    /// Training invocations.
    pub trained: usize,
    /// (3), when the system could be solved.
    pub regression: Option<Regression>,
    /// (4): the distinct critical paths seen, as child keys from first to
    /// last.
    pub paths: Vec<Vec<Arc<str>>>,
    /// (5).
    pub aggregate: Flow,
    /// (6), the most frequent first.
    pub flows: Vec<NnFlow>,
    /// How (6) picks its flow.
    pub nn: NnChoice,
}

impl ParentModel {
    /// Train every estimator on `train` (invocations of one parent), the
    /// nearest-neighbour flow chosen by [`NnChoice::default`].
    pub fn train(parent: Arc<str>, train: &[&Invocation]) -> ParentModel {
        ParentModel::train_with(parent, train, NnChoice::default())
    }

    /// [`ParentModel::train`] with the nearest-neighbour flow chosen by `nn`.
    pub fn train_with(parent: Arc<str>, train: &[&Invocation], nn: NnChoice) -> ParentModel {
        let mut paths: Vec<Vec<Arc<str>>> = Vec::new();
        let mut seen_paths: FxHashSet<Vec<*const u8>> = FxHashSet::default();
        for inv in train {
            let path = critical_path(inv);
            let id: Vec<*const u8> = path.iter().map(|&i| inv.children[i].key.as_ptr()).collect();
            if seen_paths.insert(id) {
                paths.push(path.iter().map(|&i| inv.children[i].key.clone()).collect());
            }
        }
        ParentModel {
            trained: train.len(),
            regression: Regression::fit(train),
            paths,
            aggregate: aggregate_flow(train),
            flows: nn_flows(train),
            nn,
            parent,
        }
    }

    /// The estimate of `method` for `inv`, ns.
    pub fn predict(&self, method: Method, inv: &Invocation) -> f64 {
        self.predict_as(method, inv, inv)
    }

    /// The estimate of `method` for `inv`, with the nearest-neighbour flow
    /// chosen by `shape` instead of `inv`: a what-if keeps the flow the
    /// recorded request followed and changes only its latencies (chosen
    /// by the changed latencies, a faster child could select another flow
    /// and make the parent slower).
    pub fn predict_as(&self, method: Method, shape: &Invocation, inv: &Invocation) -> f64 {
        let step = |c: &super::invocation::Child| c.pre + c.latency;
        match method {
            Method::Serial => inv.children.iter().map(step).sum::<f64>() + inv.post,
            Method::Parallel => inv.children.iter().map(step).fold(0.0, f64::max) + inv.post,
            Method::LinearRegression => self
                .regression
                .as_ref()
                .map_or(0.0, |r| r.predict(inv))
                .max(0.0),
            Method::CriticalPath => {
                // The max over an empty set of applicable paths is 0.
                let best = self
                    .paths
                    .iter()
                    .filter_map(|path| {
                        path.iter()
                            .map(|k| inv.child(k).map(step))
                            .sum::<Option<f64>>()
                    })
                    .fold(0.0, f64::max);
                best + inv.post
            }
            Method::AggregateFlow => self.aggregate.predict(inv),
            Method::NearestNeighborFlow => {
                let likelihood = self.nn == NnChoice::Likelihood;
                let support = (self.trained / 100).max(5);
                let frequent = self.flows.iter().any(|f| f.count >= support);
                let n = self.trained.max(1) as f64;
                let score = |f: &NnFlow| {
                    let (missing, d) = f.distance(shape, likelihood);
                    let prior = if likelihood {
                        -2.0 * (f.count as f64 / n).ln()
                    } else {
                        0.0
                    };
                    (missing, d + prior)
                };
                let nearest = self
                    .flows
                    .iter()
                    .filter(|f| self.nn != NnChoice::MinSupport || !frequent || f.count >= support)
                    .map(|f| (f, score(f)))
                    .min_by(|(a, (ma, da)), (b, (mb, db))| {
                        ma.cmp(mb)
                            .then(da.total_cmp(db))
                            .then(b.count.cmp(&a.count))
                    })
                    .map(|(f, _)| f);
                match nearest {
                    Some(f) => f.flow.predict(inv),
                    None => self.aggregate.predict(inv),
                }
            }
        }
    }
}

/// Mann §3.2's greedy critical path of one invocation: the awaited child
/// that ends last, then repeatedly the child that ends last before the
/// previous one starts. Indexes into `inv.children`, first to last.
pub fn critical_path(inv: &Invocation) -> Vec<usize> {
    let mut path = Vec::new();
    let mut limit = f64::INFINITY;
    let mut first = true;
    loop {
        let next = inv
            .children
            .iter()
            .enumerate()
            .filter(|(_, c)| if first { c.awaited } else { c.end() <= limit })
            .filter(|(i, _)| !path.contains(i))
            .max_by(|(_, a), (_, b)| {
                a.end()
                    .total_cmp(&b.end())
                    .then(a.start.total_cmp(&b.start))
            });
        let Some((i, c)) = next else { break };
        path.push(i);
        limit = c.start;
        first = false;
    }
    path.reverse();
    path
}

/// Mann §4's aggregate flow: an edge `a → b` when, in every training
/// invocation that has both, `a` finished before `b` started; `a → return`
/// when every invocation that has `a` waited for it. Nodes are ordered by
/// their mean start; an edge against that order (possible only when pairs
/// were seen together in different invocations, making a cycle) is dropped.
fn aggregate_flow(train: &[&Invocation]) -> Flow {
    let mut keys: Vec<Arc<str>> = Vec::new();
    let mut at: FxHashMap<Arc<str>, usize> = FxHashMap::default();
    let mut start_sum: Vec<f64> = Vec::new();
    let mut seen: Vec<u32> = Vec::new();
    let mut always_awaited: Vec<bool> = Vec::new();
    for inv in train {
        for c in &inv.children {
            let i = *at.entry(c.key.clone()).or_insert_with(|| {
                keys.push(c.key.clone());
                start_sum.push(0.0);
                seen.push(0);
                always_awaited.push(true);
                keys.len() - 1
            });
            start_sum[i] += c.start;
            seen[i] += 1;
            always_awaited[i] &= c.awaited;
        }
    }
    let n = keys.len();
    let mut together = vec![0u32; n * n];
    let mut before = vec![0u32; n * n];
    for inv in train {
        let ids: Vec<usize> = inv.children.iter().map(|c| at[&c.key]).collect();
        for (x, &a) in ids.iter().enumerate() {
            for (y, &b) in ids.iter().enumerate() {
                if x != y {
                    together[a * n + b] += 1;
                    let (ca, cb) = (&inv.children[x], &inv.children[y]);
                    if x < y && ca.end() <= cb.start {
                        before[a * n + b] += 1;
                    }
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        let ma = start_sum[a] / f64::from(seen[a]);
        let mb = start_sum[b] / f64::from(seen[b]);
        ma.total_cmp(&mb).then(keys[a].cmp(&keys[b]))
    });
    let pos: Vec<usize> = {
        let mut p = vec![0; n];
        for (i, &k) in order.iter().enumerate() {
            p[k] = i;
        }
        p
    };
    let mut preds = vec![Vec::new(); n];
    for a in 0..n {
        for b in 0..n {
            let t = together[a * n + b];
            if t > 0 && before[a * n + b] == t && pos[a] < pos[b] {
                preds[pos[b]].push(pos[a]);
            }
        }
    }
    Flow {
        nodes: order.iter().map(|&k| keys[k].clone()).collect(),
        preds,
        awaited: order.iter().map(|&k| always_awaited[k]).collect(),
    }
}

/// Mann §4's nearest-neighbour flows: the training invocations grouped by
/// identical invocation graph, most frequent first.
fn nn_flows(train: &[&Invocation]) -> Vec<NnFlow> {
    type Sig = (Vec<*const u8>, Vec<(*const u8, *const u8)>, Vec<*const u8>);
    let mut groups: FxHashMap<Sig, (Flow, Vec<&Invocation>)> = FxHashMap::default();
    let mut order: Vec<Sig> = Vec::new();
    for inv in train {
        // Canonical: keys sorted, edges and awaited children by key, so two
        // invocations whose overlapping children started in another order
        // share their graph.
        let k = |i: usize| inv.children[i].key.as_ptr();
        let mut keys: Vec<*const u8> = (0..inv.children.len()).map(k).collect();
        keys.sort_unstable();
        let mut edges: Vec<(*const u8, *const u8)> =
            inv.edges().map(|(a, b)| (k(a), k(b))).collect();
        edges.sort_unstable();
        let mut awaited: Vec<*const u8> = (0..inv.children.len())
            .filter(|&i| inv.children[i].awaited)
            .map(k)
            .collect();
        awaited.sort_unstable();
        let sig: Sig = (keys, edges, awaited);
        groups
            .entry(sig.clone())
            .or_insert_with(|| {
                order.push(sig);
                (Flow::of(inv), Vec::new())
            })
            .1
            .push(inv);
    }
    let mut out: Vec<NnFlow> = order
        .into_iter()
        .map(|sig| {
            let (flow, invs) = groups.remove(&sig).expect("grouped");
            let n = invs.len() as f64;
            let k = flow.nodes.len();
            let mut mean = vec![0.0; k];
            let mut var = vec![0.0; k];
            let mut pre_mean = vec![0.0; k];
            let mut pre_var = vec![0.0; k];
            let at = flow.index();
            for inv in &invs {
                for c in &inv.children {
                    mean[at[&*c.key]] += c.latency / n;
                    pre_mean[at[&*c.key]] += c.pre / n;
                }
            }
            for inv in &invs {
                for c in &inv.children {
                    let i = at[&*c.key];
                    var[i] += (c.latency - mean[i]).powi(2) / n;
                    pre_var[i] += (c.pre - pre_mean[i]).powi(2) / n;
                }
            }
            drop(at);
            NnFlow {
                count: invs.len(),
                flow,
                mean,
                var,
                pre_mean,
                pre_var,
            }
        })
        .collect();
    out.sort_by_key(|f| std::cmp::Reverse(f.count));
    out
}
