//! Each estimator on hand-made invocations whose answers are worked out
//! here, named after Mann et al.'s terms. Times are in ms for reading;
//! invocations hold ns.

use std::sync::Arc;

use super::invocation::Call;
use super::*;

const MS: i64 = 1_000_000;

/// Invocations of parent `P` built from `(latency ms, [(child, start ms,
/// end ms)])`, sharing one key interner (flows compare keys by identity).
struct Kit(KeyInterner);

impl Kit {
    fn new() -> Kit {
        Kit(KeyInterner::default())
    }

    fn inv(&mut self, latency: i64, calls: &[(&str, i64, i64)]) -> Invocation {
        let calls: Vec<Call<'_>> = calls
            .iter()
            .enumerate()
            .map(|(i, &(op, s, e))| Call {
                service: "S",
                operation: op,
                start: s * MS,
                end: e * MS,
                id: i as u32,
            })
            .collect();
        let parent = self.0.parent("P", "run");
        Invocation::new(parent, "t".into(), 0, latency * MS, &calls, &mut self.0)
    }
}

fn ms(x: f64) -> f64 {
    x / MS as f64
}

fn predict(model: &ParentModel, m: Method, inv: &Invocation) -> f64 {
    (ms(model.predict(m, inv)) * 1e6).round() / 1e6
}

fn train(invs: &[Invocation]) -> ParentModel {
    let refs: Vec<&Invocation> = invs.iter().collect();
    ParentModel::train(invs[0].parent.clone(), &refs)
}

#[test]
fn mann_p_is_time_since_the_latest_sibling_that_finished() {
    let mut k = Kit::new();
    // a [0,4], b [1,3], c [6,9]: c's latest finished sibling is a (4), so
    // P(c) = 2; a and b start with the parent: P = 0 and 1.
    let inv = k.inv(10, &[("a", 0, 4), ("b", 1, 3), ("c", 6, 9)]);
    let pre: Vec<f64> = inv.children.iter().map(|c| ms(c.pre)).collect();
    assert_eq!(pre, [0.0, 1.0, 2.0]);
    assert_eq!(ms(inv.post), 1.0, "P(return): 9 → 10");
    let edges: Vec<(usize, usize)> = inv.edges().collect();
    assert_eq!(edges, [(0, 2), (1, 2)], "a → c and b → c; a ∥ b");
}

#[test]
fn mann_serial_and_parallel_are_the_crude_bounds() {
    let mut k = Kit::new();
    // Sequential: a [0,3] then b [3,8]; the parent returns at 9.
    let seq = k.inv(9, &[("a", 0, 3), ("b", 3, 8)]);
    // Parallel: a [0,3] and b [0,8]; the parent returns at 9.
    let par = k.inv(9, &[("a", 0, 3), ("b", 0, 8)]);
    let m = train(&[seq.clone(), par.clone()]);
    // Serial: Σ (P + L) + P(return) = (0+3) + (0+5) + 1 = 9 on the
    // sequential one, (0+3) + (0+8) + 1 = 12 on the parallel one.
    assert_eq!(predict(&m, Method::Serial, &seq), 9.0);
    assert_eq!(predict(&m, Method::Serial, &par), 12.0);
    // Parallel: max (P + L) + P(return) = 5 + 1 = 6 (under) and 8 + 1 = 9.
    assert_eq!(predict(&m, Method::Parallel, &seq), 6.0);
    assert_eq!(predict(&m, Method::Parallel, &par), 9.0);
}

#[test]
fn mann_two_batch_fan_out_aggregate_flow_underestimates_and_nn_flow_is_exact() {
    let mut k = Kit::new();
    // Two batches: {a, b} in parallel, then c. Kind 1 waits for both before
    // c; kind 2 (say, a cache hit) starts c as soon as a is back.
    let kind1 = |k: &mut Kit, a: i64, b: i64, c: i64| {
        let end1 = a.max(b);
        k.inv(end1 + c, &[("a", 0, a), ("b", 0, b), ("c", end1, end1 + c)])
    };
    let kind2 = |k: &mut Kit, a: i64, b: i64, c: i64| {
        k.inv((a + c).max(b), &[("a", 0, a), ("b", 0, b), ("c", a, a + c)])
    };
    // Kind 1 happens when b is slow, kind 2 when b is quick.
    let train_set = vec![
        kind1(&mut k, 2, 10, 5),
        kind1(&mut k, 3, 11, 5),
        kind2(&mut k, 2, 4, 3),
        kind2(&mut k, 3, 5, 4),
    ];
    let m = train(&train_set);
    // The aggregate flow keeps a → c (in every graph) but not b → c (kind 2
    // starts c while b runs).
    let agg = &m.aggregate;
    let at = |key: &str| agg.nodes.iter().position(|n| &**n == key).unwrap();
    assert!(agg.preds[at("S:c#0")].contains(&at("S:a#0")));
    assert!(!agg.preds[at("S:c#0")].contains(&at("S:b#0")));
    assert_eq!(m.flows.len(), 2, "one flow per distinct invocation graph");
    // Test: a kind-1 request where b is the slow one: a [0,2], b [0,10], c
    // [10,15]; the parent returns at 15.
    let test = kind1(&mut k, 2, 10, 5);
    // Aggregate: c = P(c) 0 + L(c) 5 + c(a) 2 = 7; return = max(7, c(b) 10)
    // = 10: an underestimate.
    assert_eq!(predict(&m, Method::AggregateFlow, &test), 10.0);
    // Nearest neighbour picks kind 1's flow (its mean latencies a 2.5, b
    // 10.5, c 5 are nearest), where c waits for b: c = 0 + 5 + 10 = 15,
    // exact.
    assert_eq!(predict(&m, Method::NearestNeighborFlow, &test), 15.0);
    assert_eq!(relative_error(15.0, 15.0), 0.0);
    assert!((relative_error(10.0, 15.0) - 0.5).abs() < 1e-12);
}

#[test]
fn mann_fire_and_forget_child_has_no_edge_to_return() {
    let mut k = Kit::new();
    // a [0,5] awaited; f [5,50] still running when the parent returns at 6.
    let invs: Vec<Invocation> = (0..3)
        .map(|i| k.inv(6 + i, &[("a", 0, 5 + i), ("f", 5 + i, 50)]))
        .collect();
    let m = train(&invs);
    let f = m
        .aggregate
        .nodes
        .iter()
        .position(|n| &**n == "S:f#0")
        .unwrap();
    assert!(!m.aggregate.awaited[f], "f → return only if always awaited");
    let test = k.inv(8, &[("a", 0, 7), ("f", 7, 60)]);
    // Flows: c(a) 7 + P(return) 1 = 8, exact; f is not waited for.
    assert_eq!(predict(&m, Method::AggregateFlow, &test), 8.0);
    assert_eq!(predict(&m, Method::NearestNeighborFlow, &test), 8.0);
    // Serial counts f like any child: 7 + 53 + 1 = 61.
    assert_eq!(predict(&m, Method::Serial, &test), 61.0);
}

#[test]
fn mann_retried_child_is_a_second_child_after_the_first() {
    let mut k = Kit::new();
    // a fails and is retried: a#0 [0,3], a#1 [3,8]; then b [8,9].
    let invs: Vec<Invocation> = (0..2)
        .map(|_| k.inv(10, &[("a", 0, 3), ("a", 3, 8), ("b", 8, 9)]))
        .collect();
    let keys: Vec<&str> = invs[0].children.iter().map(|c| &*c.key).collect();
    assert_eq!(keys, ["S:a#0", "S:a#1", "S:b#0"]);
    let m = train(&invs);
    // Critical path: b, before it a#1, before that a#0.
    assert_eq!(m.paths.len(), 1);
    let path: Vec<&str> = m.paths[0].iter().map(|k| &**k).collect();
    assert_eq!(path, ["S:a#0", "S:a#1", "S:b#0"]);
    // A test request whose retry is slower: a#1 [3,13], b [13,14], parent 15.
    let test = k.inv(15, &[("a", 0, 3), ("a", 3, 13), ("b", 13, 14)]);
    for method in [
        Method::CriticalPath,
        Method::AggregateFlow,
        Method::NearestNeighborFlow,
        Method::Serial,
    ] {
        assert_eq!(predict(&m, method, &test), 15.0, "{method:?}");
    }
}

#[test]
fn mann_best_critical_path_is_the_longest_path_seen_in_training() {
    let mut k = Kit::new();
    // Two shapes seen: a → c, and b alone (b ends last).
    let shape1 = k.inv(9, &[("a", 0, 4), ("b", 0, 2), ("c", 4, 8)]);
    let shape2 = k.inv(11, &[("a", 0, 2), ("b", 0, 10), ("c", 2, 5)]);
    let m = train(&[shape1, shape2]);
    assert_eq!(m.paths.len(), 2);
    // Test: a [0,3], b [0,9], c [3,5]; parent 10. Paths: a,c = 3 + 2 = 5;
    // b = 9; the best (longest) is 9, + P(return) 1 = 10.
    let test = k.inv(10, &[("a", 0, 3), ("b", 0, 9), ("c", 3, 5)]);
    assert_eq!(predict(&m, Method::CriticalPath, &test), 10.0);
}

#[test]
fn mann_linear_regression_recovers_a_linear_parent() {
    let mut k = Kit::new();
    // L = a + 2 b + 1 ms, with varied a and b.
    let invs: Vec<Invocation> = [(1, 1), (2, 1), (1, 3), (4, 2), (3, 5), (2, 2)]
        .iter()
        .map(|&(a, b)| k.inv(a + 2 * b + 1, &[("a", 0, a), ("b", 0, b)]))
        .collect();
    let m = train(&invs);
    let test = k.inv(5 + 2 * 7 + 1, &[("a", 0, 5), ("b", 0, 7)]);
    let est = ms(m.predict(Method::LinearRegression, &test));
    assert!((est - 20.0).abs() < 1e-3, "{est}");
    // A child never seen in training adds nothing.
    let unseen = k.inv(5 + 2 * 7 + 1, &[("a", 0, 5), ("b", 0, 7), ("z", 0, 100)]);
    let est2 = ms(m.predict(Method::LinearRegression, &unseen));
    assert!((est2 - est).abs() < 1e-9);
}

#[test]
fn mann_missing_child_is_skipped_and_an_unseen_child_runs_in_parallel() {
    let mut k = Kit::new();
    // a [0,2] → b [2,5] → c [5,6]; parent 6.
    let invs: Vec<Invocation> = (0..2)
        .map(|_| k.inv(6, &[("a", 0, 2), ("b", 2, 5), ("c", 5, 6)]))
        .collect();
    let m = train(&invs);
    // b missing (not called this time): c waits for a: 2 + P(c) 1 + 1 = 4,
    // plus P(return) 0.
    let test = k.inv(4, &[("a", 0, 2), ("c", 3, 4)]);
    assert_eq!(predict(&m, Method::AggregateFlow, &test), 4.0);
    // An unseen child z [0,9] runs in parallel from the start and is
    // waited for: the estimate is at least its 9 ms.
    let test2 = k.inv(9, &[("a", 0, 2), ("b", 2, 5), ("c", 5, 6), ("z", 0, 9)]);
    assert_eq!(predict(&m, Method::AggregateFlow, &test2), 9.0);
}

#[test]
fn mann_table1_relative_error_is_symmetric_and_infinite_at_zero() {
    assert_eq!(relative_error(10.0, 5.0), relative_error(5.0, 10.0));
    assert_eq!(relative_error(0.0, 5.0), f64::INFINITY);
    assert_eq!(relative_error(0.0, 0.0), 0.0);
}

#[test]
fn evaluate_scores_only_parents_with_enough_children_and_reports_unseen_ones() {
    let mut k = Kit::new();
    let train_set: Vec<Invocation> = (0..4)
        .map(|_| k.inv(6, &[("a", 0, 2), ("b", 2, 5), ("c", 5, 6)]))
        .collect();
    let mut test = vec![
        k.inv(6, &[("a", 0, 2), ("b", 2, 5), ("c", 5, 6)]),
        k.inv(3, &[("a", 0, 3)]),
    ];
    let other = k.0.parent("Q", "other");
    let mut q = k.inv(6, &[("a", 0, 2), ("b", 2, 5), ("c", 5, 6)]);
    q.parent = other;
    test.push(q);
    let e = evaluate(&train_set, &test, 3);
    assert_eq!(
        e.test_invocations, 1,
        "the one-child invocation is below min_children"
    );
    assert_eq!(e.unseen_parent, 1);
    let nn = &e
        .methods
        .iter()
        .find(|(m, _)| *m == Method::NearestNeighborFlow)
        .unwrap()
        .1;
    assert_eq!((nn.n, nn.p99), (1, 0.0));
    let json = e.to_json();
    assert_eq!(json["methods"]["nearest_neighbor_flow"]["n"], 1);
    assert!(e.to_table().contains("Nearest Neighbor Flow"));
}

/// A trace `R` (root, service F) → `M` (service S) → `x`, `y` in sequence:
/// x [0, x], y [x, x + y], M returns 1 ms after y, R 1 ms after M.
fn three_levels(n: usize, x: i64, y: i64) -> crate::traces::model::Trace {
    use crate::traces::model::{BuildOptions, RawSpan, SpanKind, build};
    let span =
        |id: &'static str, parent: Option<&'static str>, svc: &str, op: &str, s: i64, d: i64| {
            RawSpan {
                id: id.into(),
                parent_id: parent.map(Into::into),
                service: Arc::from(svc),
                operation: Arc::from(op),
                start_ns: Some(1_000_000_000 + s * MS),
                duration_ns: Some(d * MS),
                kind: SpanKind::Unspecified,
                clock: Arc::from(svc),
                error: false,
                follows_from: false,
            }
        };
    let m_end = x + y + 1;
    build(
        &format!("t{n}"),
        vec![
            span("r", None, "F", "root", 0, m_end + 1),
            span("m", Some("r"), "S", "mid", 0, m_end),
            span("x", Some("m"), "S", "x", 0, x),
            span("y", Some("m"), "S", "y", x, y),
        ],
        BuildOptions::default(),
    )
    .unwrap()
}

#[test]
fn mann_what_if_a_child_were_twice_as_fast_propagates_to_the_root() {
    let traces: Vec<_> = (0..4).map(|n| three_levels(n, 4, 4 + n as i64)).collect();
    let mut keys = KeyInterner::default();
    let invs: Vec<Invocation> = traces
        .iter()
        .flat_map(|t| invocations(t, &mut keys))
        .collect();
    let models = Models::train(&invs, 1);
    // F:root calls S:mid in another process with no client span between
    // them (only servers instrumented): both are invocations.
    assert_eq!(models.parents.len(), 2, "F:root and S:mid");
    let half_y = vec!["S:y=0.5".parse::<Scale>().unwrap()];
    let w = whatif(
        &models,
        &traces[..1],
        &half_y,
        Method::NearestNeighborFlow,
        &mut keys,
    );
    // Trace 0: x 4, y 4; M = 4 + 4 + 1 = 9, R = 10. With y at 2 ms: M = 7,
    // R = 8.
    assert_eq!(w.roots, 1);
    assert_eq!(ms(w.actual.mean), 10.0);
    assert_eq!(
        ms(w.before.mean),
        10.0,
        "the models reproduce the recorded root"
    );
    assert_eq!(ms(w.after.mean), 8.0);
    assert_eq!((w.scaled_spans, w.modelled_spans), (1, 2));
    let j = w.to_json();
    assert_eq!(j["after"]["mean_us"], 8000.0);
    assert!("S=0.5".parse::<Scale>().is_err(), "the operation is needed");
    assert!("S:y=-1".parse::<Scale>().is_err());
}

/// A parent `R` whose children are `a` and `b` in parallel, then `c` after
/// both; with seeded variation, so flows and fits have something to learn.
fn fan_out_join(n: usize, a_scale: f64) -> Vec<crate::traces::model::Trace> {
    use crate::traces::model::{BuildOptions, RawSpan, SpanKind, build};
    let mut rng = cpt_sdk::testing::SplitMix64::new(7);
    (0..n)
        .map(|i| {
            let a = ((2.0 + 6.0 * rng.unit()) * a_scale * MS as f64) as i64;
            let b = ((3.0 + 3.0 * rng.unit()) * MS as f64) as i64;
            let c = ((1.0 + rng.unit()) * MS as f64) as i64;
            let join = a.max(b);
            let end = join + c + MS / 2;
            let span =
                |id: &'static str, parent: Option<&'static str>, op: &str, s: i64, d: i64| {
                    RawSpan {
                        id: id.into(),
                        parent_id: parent.map(Into::into),
                        service: Arc::from("S"),
                        operation: Arc::from(op),
                        start_ns: Some(1_000_000_000 + s),
                        duration_ns: Some(d),
                        kind: SpanKind::Unspecified,
                        clock: Arc::from("S"),
                        error: false,
                        follows_from: false,
                    }
                };
            build(
                &format!("t{i}"),
                vec![
                    span("r", None, "root", 0, end),
                    span("a", Some("r"), "a", 0, a),
                    span("b", Some("r"), "b", 0, b),
                    span("c", Some("r"), "c", join, c),
                ],
                BuildOptions::default(),
            )
            .unwrap()
        })
        .collect()
}

#[test]
fn mann_what_if_matches_a_child_made_twice_as_fast_for_real() {
    // Train on the system as it is; replay it with a halved; compare with
    // the same requests where a really took half as long (same seed).
    let train_traces = fan_out_join(400, 1.0);
    let real_after = fan_out_join(400, 0.5);
    let mut keys = KeyInterner::default();
    let invs: Vec<Invocation> = train_traces
        .iter()
        .flat_map(|t| invocations(t, &mut keys))
        .collect();
    let models = Models::train(&invs, 1);
    let scale = vec!["S:a=0.5".parse::<Scale>().unwrap()];
    let w = whatif(
        &models,
        &train_traces,
        &scale,
        Method::NearestNeighborFlow,
        &mut keys,
    );
    let truth: Vec<f64> = real_after
        .iter()
        .map(|t| t.spans[0].duration_ns as f64)
        .collect();
    let truth_mean = truth.iter().sum::<f64>() / truth.len() as f64;
    let err = (w.after.mean - truth_mean).abs() / truth_mean;
    assert!(
        err < 0.02,
        "predicted mean {} ms, real {} ms",
        ms(w.after.mean),
        ms(truth_mean)
    );
    assert!(
        w.after.mean < w.before.mean * 0.95,
        "halving a visibly helps"
    );
}

#[test]
fn mann_flow_edges_omit_those_implied_by_transitivity() {
    let mut k = Kit::new();
    // a → b → c in sequence: a → c is implied (Mann §4, footnote 1).
    let invs = vec![k.inv(6, &[("a", 0, 2), ("b", 2, 4), ("c", 4, 6)])];
    let m = train(&invs);
    let f = &m.aggregate;
    assert_eq!(f.preds[2].len(), 2, "the flow keeps a → c for the program");
    assert_eq!(f.reduced_edges(), [(0, 1), (1, 2)]);
    let models = Models {
        parents: [(m.parent.clone(), m)].into_iter().collect(),
    };
    let dot = models.to_dot(3);
    assert!(dot.starts_with("digraph flows {"), "{dot}");
    assert!(dot.contains("\"p0_agg_0\" -> \"p0_agg_1\""), "{dot}");
    assert!(!dot.contains("\"p0_agg_0\" -> \"p0_agg_2\""), "{dot}");
    assert!(dot.contains("\"p0_agg_2\" -> \"p0_agg_return\""), "{dot}");
}

#[test]
fn mann_invocation_is_one_machine_so_an_rpc_hop_is_not_one() {
    use crate::traces::model::{BuildOptions, RawSpan, SpanKind, build};
    // F's server span calls x and y (client spans on F's host); x's server
    // span runs on host G, whose clock is 5 ms ahead.
    let span =
        |id: &'static str, parent: Option<&'static str>, svc: &str, kind, s: i64, d: i64| RawSpan {
            id: id.into(),
            parent_id: parent.map(Into::into),
            service: Arc::from(svc),
            operation: Arc::from(id),
            start_ns: Some(1_000_000_000 + s * MS),
            duration_ns: Some(d * MS),
            kind,
            clock: Arc::from(svc),
            error: false,
            follows_from: false,
        };
    let t = build(
        "t",
        vec![
            span("r", None, "F", SpanKind::Server, 0, 10),
            span("x", Some("r"), "F", SpanKind::Client, 0, 4),
            span("xs", Some("x"), "G", SpanKind::Server, 6, 2),
            span("y", Some("r"), "F", SpanKind::Client, 4, 5),
        ],
        BuildOptions::default(),
    )
    .unwrap();
    let mut keys = KeyInterner::default();
    let invs = invocations(&t, &mut keys);
    let parents: Vec<&str> = invs.iter().map(|i| &*i.parent).collect();
    assert_eq!(parents, ["F:r"], "x → xs is an RPC hop across clocks");
    assert_eq!(invs[0].children.len(), 2);
}
