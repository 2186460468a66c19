//! Why the model's critical path and CRISP's walk disagree: one hand-made
//! case per [`Cause`].

use std::sync::Arc;

use super::model::Model;
use super::slack::analyse;
use super::versus::{Cause, Disagreement, crisp_chain, disagreements};
use super::{Request, requests};
use crate::traces::model::{BuildOptions, RawSpan, SpanKind, build};
use crate::traces::{RepairOptions, RootSelector};

/// A request given as `(parent, name, start, end)`, names doubling as span
/// ids, `spans[0]` the root `R`.
fn tree(id: &str, spans: &[(Option<u32>, &str, i64, i64)]) -> Request {
    let v: Vec<(Option<u32>, &str, &str, i64, i64)> =
        spans.iter().map(|&(p, n, s, e)| (p, n, n, s, e)).collect();
    Request::from_spans(id, &v)
}

fn learn(reqs: &[Request]) -> Model {
    let mut m = Model::new(reqs[0].endpoint.clone());
    for r in reqs {
        m.observe(r);
    }
    m
}

/// The disagreements of `r` under the model of `all`, by span id.
fn why(all: &[Request], r: &Request) -> Vec<(String, bool, Cause)> {
    let m = learn(all);
    let rs = analyse(&m, r);
    disagreements(&m, r, &rs)
        .into_iter()
        .map(|d: Disagreement| {
            (
                r.spans[d.span as usize].span_id.to_string(),
                d.model_only,
                d.cause,
            )
        })
        .collect()
}

#[test]
fn crisp_chain_is_the_last_finishing_child_walk() {
    // R: A (5–30), then B (40–90), which ends last.
    let r = tree(
        "t",
        &[
            (None, "R", 0, 100),
            (Some(0), "A", 5, 30),
            (Some(0), "B", 40, 90),
        ],
    );
    let (on, pred) = crisp_chain(&r);
    assert!(on.iter().all(|&o| o), "every event is on CRISP's walk");
    assert_eq!(pred[1], Some(2 * 2 + 1), "R.end ← B.end");
    assert_eq!(pred[2 * 2], Some(2 + 1), "B.start ← A.end");
    assert_eq!(pred[2], Some(0), "A.start ← R.start");
}

#[test]
fn refuted_nesting_a_sibling_that_only_happened_to_finish_first() {
    // A and B usually overlap, so the model has no A.end → B.start; in
    // this request A ended before B started and CRISP chains B to it.
    let ran = tree(
        "ran",
        &[
            (None, "R", 0, 100),
            (Some(0), "A", 5, 30),
            (Some(0), "B", 40, 90),
        ],
    );
    let usual = tree(
        "usual",
        &[
            (None, "R", 0, 100),
            (Some(0), "A", 5, 60),
            (Some(0), "B", 10, 90),
        ],
    );
    let d = why(&[ran.clone(), usual], &ran);
    assert_eq!(d, [("A".to_owned(), false, Cause::RefutedNesting)]);
}

#[test]
fn other_subtree_the_model_waits_across_subtrees() {
    // q1 (under Q) always starts after p1 (under P) ends, though P and Q
    // overlap: a dependency across subtrees CRISP's nesting cannot see.
    let mk = |id: &str, p1e: i64, q1s: i64| {
        tree(
            id,
            &[
                (None, "R", 0, 100),
                (Some(0), "P", 1, 50),
                (Some(1), "p1", 5, p1e),
                (Some(0), "Q", 10, 90),
                (Some(3), "q1", q1s, 80),
            ],
        )
    };
    let a = mk("a", 20, 25);
    let b = mk("b", 40, 45);
    let d = why(&[a.clone(), b], &a);
    assert!(
        d.contains(&("p1".to_owned(), true, Cause::OtherSubtree)),
        "{d:?}"
    );
    assert!(d.iter().all(|x| x.2 == Cause::OtherSubtree), "{d:?}");
}

#[test]
fn later_in_family_a_span_that_always_outlasts_its_sibling_waits_for_it() {
    // F encloses its sibling U's end (an envelope span): the model learns
    // U.end → F.end; CRISP takes F, the last to finish, as a leaf.
    let mk = |id: &str, f: (i64, i64), u: (i64, i64)| {
        tree(
            id,
            &[
                (None, "R", 0, 100),
                (Some(0), "F", f.0, f.1),
                (Some(0), "U", u.0, u.1),
            ],
        )
    };
    let a = mk("a", (10, 95), (20, 60));
    let b = mk("b", (5, 80), (30, 70));
    let d = why(&[a.clone(), b], &a);
    assert_eq!(d, [("U".to_owned(), true, Cause::LaterInFamily)]);
}

#[test]
fn tie_equally_late_children_are_broken_differently() {
    // A and B end together: CRISP takes the first listed, the model the
    // later in its event order (and A.end → B.end at the equal time).
    let r = tree(
        "t",
        &[
            (None, "R", 0, 60),
            (Some(0), "A", 10, 50),
            (Some(0), "B", 20, 50),
        ],
    );
    let d = why(std::slice::from_ref(&r), &r);
    assert!(!d.is_empty(), "the walks differ on a tie");
    assert!(d.iter().all(|x| x.2 == Cause::Tie), "{d:?}");
}

#[test]
fn exclusion_or_pipeline_a_lock_orders_the_model_path() {
    // A (under P) and B (under Q) take one lock, in either order: a mutual
    // exclusion, no happens-before. In this request A went first, and the
    // model's path goes from A's end to B's start.
    let mk = |id: &str, a: (i64, i64), b: (i64, i64)| {
        tree(
            id,
            &[
                (None, "R", 0, 100),
                (Some(0), "P", 1, 90),
                (Some(1), "A", a.0, a.1),
                (Some(0), "Q", 2, 91),
                (Some(3), "B", b.0, b.1),
            ],
        )
    };
    let a_first = mk("a", (5, 20), (30, 80));
    let b_first = mk("b", (40, 85), (5, 30));
    let d = why(&[a_first.clone(), b_first], &a_first);
    assert!(
        d.contains(&("A".to_owned(), true, Cause::ExclusionOrPipeline)),
        "{d:?}"
    );
}

#[test]
fn rare_segment_a_segment_seen_once_keeps_chance_orderings() {
    // X (under P) appears in one request of 150 and happened to end before
    // B (under Q) started: nothing refuted X.end → B.start. (P ends before
    // or after B, so P.end → B.end is no dependency.)
    let mk = |id: &str, with_x: bool, p_end: i64| {
        let mut s = vec![
            (None, "R", 0, 100),
            (Some(0), "P", 1, p_end),
            (Some(0), "Q", 10, 90),
            (Some(2), "B", 25, 80),
        ];
        if with_x {
            s.push((Some(1), "X", 5, 20));
        }
        tree(id, &s)
    };
    let p_end = |i: i64| if i % 2 == 0 { 50 } else { 85 };
    let odd = mk("odd", true, 50);
    let mut all: Vec<Request> = (0..149)
        .map(|i| mk(&i.to_string(), false, p_end(i)))
        .collect();
    all.push(odd.clone());
    let d = why(&all, &odd);
    assert_eq!(d, [("X".to_owned(), true, Cause::RareSegment)]);
    // Seen in every request, the same ordering is a dependency.
    let all: Vec<Request> = (0..150)
        .map(|i| mk(&i.to_string(), true, p_end(i)))
        .collect();
    assert_eq!(
        why(&all, &all[0]),
        [("X".to_owned(), true, Cause::OtherSubtree)]
    );
}

fn raw<'a>(id: &'a str, parent: Option<&'a str>, s: i64, e: i64) -> RawSpan<'a> {
    RawSpan {
        id: id.into(),
        parent_id: parent.map(Into::into),
        service: Arc::from("svc"),
        operation: Arc::from(id),
        start_ns: Some(s),
        duration_ns: Some(e - s),
        kind: SpanKind::Unspecified,
        clock: Arc::from("h"),
        error: false,
        follows_from: false,
    }
}

#[test]
fn skew_clipped_children_cut_to_their_parents_end_tie_there() {
    // A and B end after R on the record; the repair cuts both to R's end,
    // where the two walks pick different ones.
    let t = build(
        "t",
        vec![
            raw("R", None, 0, 60),
            raw("A", Some("R"), 10, 70),
            raw("B", Some("R"), 20, 80),
        ],
        BuildOptions::default(),
    )
    .expect("a valid trace");
    let reqs = requests(&t, &RootSelector::AllRoots, &RepairOptions::default());
    let r = &reqs[0];
    assert!(r.spans[1..].iter().all(|s| s.clipped && s.end == 60));
    assert!(!r.spans[0].clipped);
    let d = why(&reqs, r);
    assert!(!d.is_empty(), "the walks differ on the cut ends");
    assert!(d.iter().all(|x| x.2 == Cause::SkewClipped), "{d:?}");
    // Unclipped, the same tie is only a tie.
    let plain = tree(
        "p",
        &[
            (None, "svc:R", 0, 60),
            (Some(0), "svc:A", 10, 60),
            (Some(0), "svc:B", 20, 60),
        ],
    );
    let d = why(std::slice::from_ref(&plain), &plain);
    assert!(
        !d.is_empty() && d.iter().all(|x| x.2 == Cause::Tie),
        "{d:?}"
    );
}

#[test]
fn requests_of_many_traces_share_one_copy_of_each_call_path() {
    let t = |id: &str| {
        build(
            id,
            vec![raw("R", None, 0, 60), raw("A", Some("R"), 10, 50)],
            BuildOptions::default(),
        )
        .expect("a valid trace")
    };
    let mut paths = super::CallPaths::default();
    let (sel, rep) = (RootSelector::AllRoots, RepairOptions::default());
    let a = super::requests_with(&t("1"), &sel, &rep, &mut paths);
    let b = super::requests_with(&t("2"), &sel, &rep, &mut paths);
    assert_eq!(&*a[0].spans[1].call_path, "svc:R;svc:A");
    assert!(Arc::ptr_eq(
        &a[0].spans[1].call_path,
        &b[0].spans[1].call_path
    ));
    assert!(Arc::ptr_eq(&a[0].endpoint, &b[0].endpoint));
}

#[test]
fn streamed_relations_are_the_listed_relations() {
    // Happens-before, a mutual exclusion (A, B in either order) and a
    // pipeline (P#i before C#i).
    let r1 = tree(
        "1",
        &[
            (None, "R", 0, 100),
            (Some(0), "A", 5, 20),
            (Some(0), "B", 30, 40),
            (Some(0), "P", 41, 45),
            (Some(0), "P", 50, 55),
            (Some(0), "C", 46, 49),
            (Some(0), "C", 56, 60),
        ],
    );
    let r2 = tree(
        "2",
        &[
            (None, "R", 0, 100),
            (Some(0), "B", 5, 20),
            (Some(0), "A", 30, 40),
            (Some(0), "P", 41, 45),
            (Some(0), "P", 50, 55),
            (Some(0), "C", 46, 49),
            (Some(0), "C", 56, 60),
        ],
    );
    let m = learn(&[r1, r2]);
    let mut streamed = Vec::new();
    m.for_each_relation(|k, a, b| -> Result<(), ()> {
        streamed.push(super::Relation {
            kind: k,
            a: a.to_owned(),
            b: b.to_owned(),
        });
        Ok(())
    })
    .unwrap();
    let listed = m.relations();
    assert_eq!(streamed, listed);
    let counts = m.relation_counts();
    for (i, kind) in [
        super::Kind::HappensBefore,
        super::Kind::MutualExclusion,
        super::Kind::Pipeline,
    ]
    .into_iter()
    .enumerate()
    {
        let n = listed.iter().filter(|r| r.kind == kind).count();
        assert!(n > 0, "{kind:?} present");
        assert_eq!(counts[i], n);
    }
}
