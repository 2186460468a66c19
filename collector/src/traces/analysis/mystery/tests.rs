//! The Mystery Machine's cases on hand-made requests: MM Figure 1's three
//! relations each with its counterexample, Figure 2's refinement and
//! critical paths, slack of a parallel branch, the top-5 % differential.

use super::*;

/// A request of root `R` with children `(name, start, end)`.
fn req(id: &str, root_end: i64, children: &[(&str, i64, i64)]) -> Request {
    let mut spans = vec![(None, "svc:R", "r", 0, root_end)];
    for &(name, s, e) in children {
        spans.push((Some(0), name, name, s, e));
    }
    Request::from_spans(id, &spans)
}

fn learn(reqs: &[Request]) -> Model {
    let mut m = Model::new(reqs[0].endpoint.clone());
    for r in reqs {
        m.observe(r);
    }
    m
}

fn has(m: &Model, kind: Kind, a: &str, b: &str) -> bool {
    m.relations()
        .iter()
        .any(|r| r.kind == kind && r.a == a && r.b == b)
}

fn hb(m: &Model, a: &str, b: &str) -> bool {
    has(m, Kind::HappensBefore, a, b)
}

#[test]
fn names_are_call_paths_with_occurrence_in_start_order() {
    let r = Request::from_spans(
        "t",
        &[
            (None, "f:home", "0", 0, 100),
            (Some(0), "db:get", "1", 50, 60),
            (Some(0), "db:get", "2", 10, 20),
            (Some(2), "disk:read", "3", 12, 14),
            (Some(1), "disk:read", "4", 52, 54),
        ],
    );
    let names: Vec<String> = r.spans.iter().map(|s| s.segment()).collect();
    assert_eq!(
        names,
        [
            "f:home#0",
            "f:home;db:get#1",
            "f:home;db:get#0",
            "f:home;db:get;disk:read#0",
            "f:home;db:get;disk:read#1"
        ],
        "the disk read under db:get#0 (started first) is #0 although it is listed later"
    );
}

#[test]
fn figure1_happens_before_survives_until_its_counterexample() {
    // A always ends before B starts.
    let a = req("1", 40, &[("A", 0, 10), ("B", 20, 30)]);
    let b = req("2", 40, &[("A", 5, 12), ("B", 12, 35)]);
    let m = learn(&[a.clone(), b.clone()]);
    assert!(hb(&m, "svc:R;A#0.end", "svc:R;B#0.start"));
    assert!(!hb(&m, "svc:R;B#0.end", "svc:R;A#0.start"));
    // Counterexample: B starts before A ends.
    let c = req("3", 40, &[("A", 0, 25), ("B", 20, 30)]);
    let m = learn(&[a, b, c]);
    assert!(!hb(&m, "svc:R;A#0.end", "svc:R;B#0.start"));
    assert!(hb(&m, "svc:R;A#0.start", "svc:R;B#0.start"));
}

#[test]
fn figure1_mutual_exclusion_in_either_order_until_they_overlap() {
    let a = req("1", 40, &[("A", 0, 10), ("B", 20, 30)]);
    let b = req("2", 40, &[("A", 20, 30), ("B", 0, 10)]);
    let m = learn(&[a.clone(), b.clone()]);
    assert!(has(&m, Kind::MutualExclusion, "svc:R;A#0", "svc:R;B#0"));
    assert!(!hb(&m, "svc:R;A#0.end", "svc:R;B#0.start"));
    assert!(!hb(&m, "svc:R;B#0.end", "svc:R;A#0.start"));
    // Counterexample: they overlap.
    let c = req("3", 40, &[("A", 0, 15), ("B", 10, 30)]);
    let m = learn(&[a, b, c]);
    assert!(!has(&m, Kind::MutualExclusion, "svc:R;A#0", "svc:R;B#0"));
}

#[test]
fn figure1_pipeline_is_fifo_until_the_order_crosses() {
    // Two producers P and two consumers C: C#i starts after P#i ends.
    let a = req(
        "1",
        50,
        &[("P", 0, 10), ("P", 10, 20), ("C", 10, 15), ("C", 20, 30)],
    );
    let b = req(
        "2",
        50,
        &[("P", 0, 5), ("P", 5, 25), ("C", 5, 30), ("C", 30, 40)],
    );
    let m = learn(&[a.clone(), b.clone()]);
    assert!(has(&m, Kind::Pipeline, "svc:R;P", "svc:R;C"));
    assert!(!has(&m, Kind::Pipeline, "svc:R;C", "svc:R;P"));
    // Counterexample: the second producer finishes first and its consumer
    // starts before the first producer has ended.
    let c = req(
        "3",
        50,
        &[("P", 0, 20), ("P", 2, 8), ("C", 9, 15), ("C", 21, 30)],
    );
    let m = learn(&[a, b, c]);
    assert!(!has(&m, Kind::Pipeline, "svc:R;P", "svc:R;C"));
}

/// MM Figure 2: S1 → S2, S1 → N1, S2 → N2, N1 → C1, N2 → C2, C1 → C2.
/// Durations (s1, s2, n1, n2, c1, c2), scheduled as the true model says.
fn fig2(id: &str, d: [i64; 6]) -> Request {
    let [s1, s2, n1, n2, c1, c2] = d;
    let s1e = s1;
    let s2e = s1e + s2;
    let n1e = s1e + n1;
    let n2e = s2e + n2;
    let c1e = n1e + c1;
    let c2s = n2e.max(c1e);
    req(
        id,
        c2s + c2 + 1,
        &[
            ("S1", 0, s1e),
            ("S2", s1e, s2e),
            ("N1", s1e, n1e),
            ("N2", s2e, n2e),
            ("C1", n1e, c1e),
            ("C2", c2s, c2s + c2),
        ],
    )
}

const FIG2: [&str; 6] = ["S1", "S2", "N1", "N2", "C1", "C2"];

/// Segment-level `X.end → Y.start` relations among Figure 2's segments.
fn fig2_edges(m: &Model) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    for x in FIG2 {
        for y in FIG2 {
            if x != y
                && hb(
                    m,
                    &format!("svc:R;{x}#0.end"),
                    &format!("svc:R;{y}#0.start"),
                )
            {
                out.push((x, y));
            }
        }
    }
    out
}

fn critical(m: &Model, r: &Request) -> Vec<String> {
    let s = analyse(m, r);
    s.spans
        .iter()
        .filter(|s| s.critical && s.span > 0)
        .map(|s| {
            r.spans[s.span as usize]
                .call_path
                .trim_start_matches("svc:R;")
                .to_owned()
        })
        .collect()
}

#[test]
fn figure2_refinement_converges_to_the_true_model_and_its_critical_paths() {
    let r1 = fig2("1", [1, 10, 2, 2, 2, 1]);
    let r2 = fig2("2", [1, 2, 5, 2, 6, 1]);
    let r3 = fig2("3", [1, 3, 3, 4, 4, 1]);
    let mut m = Model::new(r1.endpoint.clone());
    assert_eq!(m.hypotheses(), 0, "no traces, no segments yet");
    m.observe(&r1);
    let after1 = m.hypotheses();
    // The first request removes S2 → S1 (S2 happens after S1) ...
    assert!(!hb(&m, "svc:R;S2#0.end", "svc:R;S1#0.start"));
    assert!(hb(&m, "svc:R;N1#0.end", "svc:R;N2#0.start"));
    // ... the second N1 → N2 (they overlap).
    m.observe(&r2);
    assert!(!hb(&m, "svc:R;N1#0.end", "svc:R;N2#0.start"));
    assert!(m.hypotheses() < after1);
    m.observe(&r3);
    let mut truth = vec![
        ("S1", "S2"),
        ("S1", "N1"),
        ("S1", "N2"),
        ("S1", "C1"),
        ("S1", "C2"),
        ("S2", "N2"),
        ("S2", "C2"),
        ("N1", "C1"),
        ("N1", "C2"),
        ("N2", "C2"),
        ("C1", "C2"),
    ];
    truth.sort();
    let mut got = fig2_edges(&m);
    got.sort();
    assert_eq!(got, truth);
    assert!(
        m.exclusions().is_empty(),
        "every unordered pair overlapped once"
    );
    assert_eq!(m.last_change, 3);
    // Step 2: same model, different critical paths.
    assert_eq!(critical(&m, &r1), ["S1", "S2", "N2", "C2"]);
    assert_eq!(critical(&m, &r2), ["S1", "N1", "C1", "C2"]);
}

#[test]
fn slack_of_a_parallel_branch_is_the_gap_to_the_join() {
    // Fan-out: A [0,30] and B [0,10] in parallel, J [30,40] joins both.
    // Variation teaches the model that J waits for A and for B.
    let reqs = [
        req("1", 40, &[("A", 0, 30), ("B", 0, 10), ("J", 30, 40)]),
        req("2", 40, &[("A", 0, 10), ("B", 0, 30), ("J", 30, 40)]),
        req("3", 50, &[("A", 0, 20), ("B", 0, 25), ("J", 25, 50)]),
    ];
    let m = learn(&reqs);
    assert!(hb(&m, "svc:R;B#0.end", "svc:R;J#0.start"));
    assert!(!hb(&m, "svc:R;A#0.end", "svc:R;B#0.start"));
    let s = analyse(&m, &reqs[0]);
    let by = |name: &str| {
        let i = reqs[0]
            .spans
            .iter()
            .position(|s| s.span_id.as_ref() == name)
            .unwrap();
        s.spans[i].clone()
    };
    assert_eq!(by("B").slack_ns, 20, "B ends at 10, J starts at 30");
    assert!(!by("B").critical);
    assert_eq!((by("A").slack_ns, by("A").critical), (0, true));
    assert_eq!((by("J").slack_ns, by("J").critical), (0, true));
    assert_eq!(s.latency_ns, 40);
    assert_eq!(
        s.critical_ns.iter().sum::<i64>(),
        40,
        "the path's delays add up to the latency"
    );
}

#[test]
fn the_critical_path_begins_at_the_root_s_start_though_a_span_ends_before_it() {
    // X ran (by its clock) before the request began: MM §4.4.1's longest
    // path to the root's end is its latency, so X is not on it.
    let reqs = vec![req("1", 100, &[("X", -1000, -900), ("A", 10, 90)])];
    let m = learn(&reqs);
    let s = analyse(&m, &reqs[0]);
    assert_eq!(s.critical_ns.iter().sum::<i64>(), 100);
    assert_eq!(s.critical_ns[1], 0, "X");
    assert_eq!(
        s.path.last(),
        Some(&(0, false)),
        "the path begins at the root's start"
    );
}

#[test]
fn top_five_percent_differential_ranks_the_outliers_cause_first() {
    // 95 requests spend 10 in A and 10 in B one after the other; 5 slow
    // ones spend 100 in B. B's share of the critical path grows among the
    // outliers, A's shrinks.
    let mut reqs = Vec::new();
    for i in 0..100 {
        let b = if i % 20 == 7 { 100 } else { 10 };
        reqs.push(req(
            &i.to_string(),
            10 + b,
            &[("A", 0, 10), ("B", 10, 10 + b)],
        ));
    }
    let m = learn(&reqs);
    let results: Vec<RequestSlack> = reqs.iter().map(|r| analyse(&m, r)).collect();
    let pairs: Vec<(&Request, &RequestSlack)> = reqs.iter().zip(&results).collect();
    let o = outliers(&pairs, 0.05);
    assert_eq!((o.outliers, o.normal, o.threshold_ns), (5, 95, 110));
    assert_eq!(&*o.ranking[0].call_path, "svc:R;B");
    assert!(o.ranking[0].outlier_share > 0.9 && o.ranking[0].normal_share < 0.6);
    let last = o.ranking.last().unwrap();
    assert_eq!(&*last.call_path, "svc:R;A");
    assert!(last.excess() < 0.0);
}

#[test]
fn convergence_curve_counts_what_is_left_and_novel_shapes_are_reported() {
    let mut ms = Models::default();
    ms.observe(&req("1", 40, &[("A", 0, 10), ("B", 20, 30)]));
    ms.observe(&req("2", 40, &[("A", 0, 25), ("B", 20, 30)]));
    ms.observe(&req("3", 40, &[("A", 0, 25), ("B", 20, 30), ("C", 31, 35)]));
    ms.finish();
    let c = &ms.convergence;
    assert_eq!(c.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(c[1].1 < c[0].1, "the overlap rejected A → B");
    assert!(c[2].1 > c[1].1, "C brought new hypotheses");
    let m = &ms.by_endpoint["svc:R"];
    assert_eq!(m.novel.len(), 1);
    assert_eq!(&*m.novel[0].trace_id, "3");
    assert_eq!(m.novel[0].new_segments, ["svc:R;C#0"]);
}

#[test]
fn correlation_with_latency_falls_as_slack_rises() {
    // X runs beside Y; the request ends with the later of the two. Where
    // X is the long one (no slack) latency follows X, where Y is long
    // (slack) it does not.
    let mut reqs = Vec::new();
    for i in 0..40i64 {
        let x = 10 + (i * 7) % 13;
        let y = if i % 2 == 0 { 5 } else { 60 + (i * 11) % 17 };
        let end = x.max(y);
        reqs.push(req(
            &i.to_string(),
            end + 1,
            &[("X", 0, x), ("Y", 0, y), ("Z", end, end + 1)],
        ));
    }
    let m = learn(&reqs);
    let results: Vec<RequestSlack> = reqs.iter().map(|r| analyse(&m, r)).collect();
    let pairs: Vec<(&Request, &RequestSlack)> = reqs.iter().zip(&results).collect();
    let b = correlation_by_slack(&pairs, "svc:R;X#0", 2);
    assert_eq!(b.len(), 2);
    assert_eq!(b[0].slack_max, 0);
    assert!(b[0].r.unwrap() > 0.99);
    assert!(b[1].slack_min > 0);
    assert!(b[1].r.unwrap_or(0.0).abs() < 0.5);
}

#[test]
fn mutual_exclusion_orders_the_critical_path_as_the_request_ran() {
    // A and B share a lock: either order, never overlapping. In request 1
    // B waited for A, so A is critical with no slack (MM §4.1: a static
    // mutual exclusion is a dynamic happens-before).
    let reqs = [
        req("1", 31, &[("A", 0, 10), ("B", 10, 30)]),
        req("2", 31, &[("B", 0, 20), ("A", 20, 30)]),
        req("3", 26, &[("A", 0, 5), ("B", 5, 25)]),
    ];
    let m = learn(&reqs);
    assert!(has(&m, Kind::MutualExclusion, "svc:R;A#0", "svc:R;B#0"));
    let s = analyse(&m, &reqs[0]);
    let a = reqs[0]
        .spans
        .iter()
        .position(|s| &*s.span_id == "A")
        .unwrap();
    assert_eq!((s.spans[a].slack_ns, s.spans[a].critical), (0, true));
    assert_eq!(critical(&m, &reqs[0]), ["A", "B"]);
    assert_eq!(critical(&m, &reqs[1]), ["B", "A"]);
}

#[test]
fn crisp_anomaly_score_is_highest_for_the_unusual_critical_path_and_names_it() {
    // Training: A then B, both varying a little. Test: one request whose B
    // takes ten times as long; the others like training.
    let mk = |id: &str, a: i64, b: i64| req(id, a + b, &[("A", 0, a), ("B", a, a + b)]);
    let train: Vec<Request> = (0..30)
        .map(|i| mk(&format!("t{i}"), 10 + i % 3, 10 + (i * 7) % 4))
        .collect();
    let mut test: Vec<Request> = (0..9)
        .map(|i| mk(&format!("x{i}"), 11 + i % 2, 11))
        .collect();
    test.push(mk("slow", 11, 100));
    let all: Vec<Request> = train.iter().chain(&test).cloned().collect();
    let m = learn(&all);
    let prof = |r: &Request| anomaly::profile(r, &analyse(&m, r));
    let pca = anomaly::Pca::fit(&train.iter().map(prof).collect::<Vec<_>>(), 0.9, 5).unwrap();
    assert!(pca.rank() >= 1);
    let scores: Vec<anomaly::Score> = test.iter().map(|r| pca.score(&prof(r), 2)).collect();
    let best = (0..scores.len())
        .max_by(|&a, &b| scores[a].score.total_cmp(&scores[b].score))
        .unwrap();
    assert_eq!(&*test[best].trace_id, "slow");
    assert_eq!(&*scores[best].top[0].0, "svc:R;B");
    let labels: Vec<bool> = test.iter().map(|r| &*r.trace_id == "slow").collect();
    let s: Vec<f64> = scores.iter().map(|s| s.score).collect();
    assert_eq!(anomaly::precision_recall_at(&s, &labels, 1), (1.0, 1.0));
    assert_eq!(anomaly::precision_recall_at(&s, &labels, 2), (0.5, 1.0));
}

#[test]
fn outlier_sides_as_profiles_split_the_requests_and_the_critical_path_time() {
    let mut reqs = Vec::new();
    for i in 0..20 {
        let b = if i == 3 { 100 } else { 10 };
        reqs.push(req(
            &i.to_string(),
            10 + b,
            &[("A", 0, 10), ("B", 10, 10 + b)],
        ));
    }
    let m = learn(&reqs);
    let results: Vec<RequestSlack> = reqs.iter().map(|r| analyse(&m, r)).collect();
    let pairs: Vec<(&Request, &RequestSlack)> = reqs.iter().zip(&results).collect();
    let o = outliers(&pairs, 0.05);
    let (others, slow) = outliers::side_profiles(&pairs, o.threshold_ns);
    assert_eq!((others.requests(), slow.requests()), (19, 1));
    assert_eq!(
        slow.latency_sum().as_nanos(),
        110,
        "one slow request: 10 in A, 100 in B"
    );
    assert_eq!(others.latency_sum().as_nanos(), 19 * 20);
    let b = crate::profile::aggregate::ranked_stacks(&slow);
    assert!(b[0].0.ends_with("(B)") && b[0].1 == 100, "{b:?}");
}

#[test]
fn crisp_accounting_profile_is_the_reference_exclusive_time_per_call_path() {
    // CRISP's case 10 (µs): A [0, 1000] with B [10, 210], C [209, 309] and
    // D [308, 608], overlapping by 1 µs. The reference charges each child
    // its whole duration and the parent the rest: A 400, B 200, C 100,
    // D 300 (CRISP's conformance golden); the model's critical path cuts
    // the overlaps instead.
    let us = 1_000;
    let r = Request::from_spans(
        "10",
        &[
            (None, "S1:O1", "A", 0, 1000 * us),
            (Some(0), "S2:O2", "B", 10 * us, 210 * us),
            (Some(0), "S3:O3", "C", 209 * us, 309 * us),
            (Some(0), "S4:O4", "D", 308 * us, 608 * us),
        ],
    );
    let mut p = anomaly::crisp_profile(&r, 0.01);
    p.sort();
    let got: Vec<(&str, i64)> = p.iter().map(|(k, v)| (&**k, v / us)).collect();
    assert_eq!(
        got,
        [
            ("S1:O1", 400),
            ("S1:O1;S2:O2", 200),
            ("S1:O1;S3:O3", 100),
            ("S1:O1;S4:O4", 300)
        ]
    );
}
