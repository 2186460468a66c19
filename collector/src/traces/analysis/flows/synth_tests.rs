//! The estimators on generated programs whose flow is known
//! ([`super::synth`]): the same requests recorded with and without client
//! spans, and rare noisy flows that capture Mann's nearest-neighbour
//! distance.

use super::synth::{self, Shape};
use super::*;

/// Invocations of `traces`, the first half (in start order) to train and
/// the second to test, as `predict` splits them without `--test`.
fn halves(traces: &[crate::traces::model::Trace]) -> (Vec<Invocation>, Vec<Invocation>) {
    let mut keys = KeyInterner::default();
    let (a, b) = traces.split_at(traces.len() / 2);
    let inv = |ts: &[crate::traces::model::Trace], keys: &mut KeyInterner| -> Vec<Invocation> {
        ts.iter().flat_map(|t| invocations(t, keys)).collect()
    };
    let train = inv(a, &mut keys);
    let test = inv(b, &mut keys);
    (train, test)
}

fn summary(e: &Evaluation, m: Method) -> &Summary {
    &e.methods
        .iter()
        .find(|(x, _)| *x == m)
        .expect("every method")
        .1
}

/// Per-request agreement between the two shapes: the nearest-neighbour
/// estimate of the root differs by at most this share of the root's
/// latency. The shapes differ only by the network time the client spans
/// add (2 × 100 µs per call on calls of 2–8 ms), which moves `P(m)` and
/// `L(m)` but not the root.
const SHAPE_TOLERANCE: f64 = 0.02;

#[test]
fn server_only_traces_are_invocations_and_predict_like_traces_with_client_spans() {
    let n = 1_200;
    let servers = synth::page(n, 7, Shape::ServerOnly);
    let clients = synth::page(n, 7, Shape::WithClients);
    let (s_train, s_test) = halves(&servers);
    let (c_train, c_test) = halves(&clients);
    // Server-only: the root's five children run in five other processes;
    // every root is an invocation (the RPC-hop rule used to skip them all).
    assert_eq!(s_test.len(), n / 2, "one invocation per root");
    assert!(s_test.iter().all(|i| i.children.len() == 5));
    // With client spans: the root's invocation has the five client spans;
    // each client span and its server span are one RPC, not an invocation.
    assert_eq!(c_test.len(), n / 2);
    assert!(c_test.iter().all(|i| &*i.parent == "frontend:GET /home"));

    let s_models = Models::train(&s_train, 5);
    let c_models = Models::train(&c_train, 5);
    let s_eval = evaluate_models(&s_models, &s_test, 5);
    assert_eq!(s_eval.test_invocations, n / 2, "every test root scored");
    let nn = summary(&s_eval, Method::NearestNeighborFlow);
    assert!(
        nn.p90 <= 0.10,
        "NN flow p90 on server-only traces: {}",
        nn.p90
    );

    let (sm, cm) = (&s_models.parents, &c_models.parents);
    let (sm, cm) = (&sm[&s_test[0].parent], &cm[&c_test[0].parent]);
    let mut worst = 0.0f64;
    for (s, c) in s_test.iter().zip(&c_test) {
        assert_eq!(s.latency, c.latency, "the same request in both shapes");
        let a = sm.predict(Method::NearestNeighborFlow, s);
        let b = cm.predict(Method::NearestNeighborFlow, c);
        worst = worst.max((a - b).abs() / s.latency);
    }
    assert!(
        worst <= SHAPE_TOLERANCE,
        "server-only and client-span estimates differ by up to {worst:.4} of the latency"
    );
}

#[test]
fn server_only_children_on_skewed_clocks_take_the_repaired_times() {
    use crate::traces::model::{BuildOptions, RawSpan, SpanKind, build};
    use std::sync::Arc;
    // F's server span (host F) has two server children on host G, whose
    // clock runs 5 ms ahead: as recorded, y ends 4 ms after F returned.
    let span =
        |id: &'static str, parent: Option<&'static str>, host: &str, s: i64, d: i64| RawSpan {
            id: id.into(),
            parent_id: parent.map(Into::into),
            service: Arc::from(host),
            operation: Arc::from(id),
            start_ns: Some(1_000_000_000 + s * 1_000_000),
            duration_ns: Some(d * 1_000_000),
            kind: SpanKind::Server,
            clock: Arc::from(host),
            error: false,
            follows_from: false,
        };
    let t = build(
        "t",
        vec![
            span("r", None, "F", 0, 10),
            span("x", Some("r"), "G", 6, 3),
            span("y", Some("r"), "G", 9, 5),
        ],
        BuildOptions::default(),
    )
    .unwrap();
    let mut keys = KeyInterner::default();
    let invs = invocations(&t, &mut keys);
    assert_eq!(invs.len(), 1, "the root is an invocation");
    let y = invs[0].child("G:y#0").expect("y");
    // Held inside its parent by the repair: [9, 10] ms, not [9, 14].
    assert_eq!((y.start, y.end()), (9e6, 10e6));
    assert!(y.awaited, "the parent waited for it");
}

#[test]
fn rare_noisy_sequential_flows_capture_mann_distance_but_not_the_default() {
    // 6 000 requests; in the training half 25 run a then b, 10 run b then
    // a, with very variable latencies; the rest run them at once.
    let traces = synth::rare_sequential(6_000, 11, (50, 20));
    let (train, test) = halves(&traces);
    let at = |nn: NnChoice| evaluate_models(&Models::train_with(&train, 5, nn), &test, 5);
    let mann = at(NnChoice::Mann);
    let default = at(NnChoice::default());
    let lr = summary(&default, Method::LinearRegression).p90;
    let mann_nn = summary(&mann, Method::NearestNeighborFlow).p90;
    let nn = summary(&default, Method::NearestNeighborFlow).p90;
    assert!(
        mann_nn > lr,
        "Mann's distance is captured by the rare flows here (NN p90 {mann_nn} vs regression {lr})"
    );
    assert!(nn <= lr, "default NN p90 {nn} > linear regression {lr}");
    assert!(nn <= 0.05, "default NN p90 {nn}");
    let support = at(NnChoice::MinSupport);
    assert!(summary(&support, Method::NearestNeighborFlow).p90 <= lr);
}
