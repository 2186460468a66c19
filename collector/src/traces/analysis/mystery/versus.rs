//! Where the critical path through the model and CRISP's
//! last-finishing-child walk (as `cpt traces convert` walks it) disagree
//! about a span, and why.
//!
//! Both are chains of events walked back from the root's end: the model's
//! through each event's latest predecessor in the request's graph
//! ([`super::slack`]), CRISP's from a span's end to its last-finishing
//! child's end, from a child's start to the end of the sibling that
//! finished last before it started, and to the parent's start when none
//! did. A span critical in one and not in the other lies on a stretch where
//! the chains part; walking forward from it along its own chain, the first
//! event on the other chain is where they join again, and the two steps
//! into that event (the model's and CRISP's) say why they parted. Each
//! disagreeing span gets the first [`Cause`] that fits that join, in the
//! order of [`Cause::ALL`].

use std::sync::Arc;

use super::events::Request;
use super::model::{Model, event};
use super::slack::RequestSlack;

/// Segments seen in fewer than this fraction of their endpoint's requests
/// are [`Cause::RareSegment`].
pub const RARE: f64 = 0.01;

/// Why the two critical paths part (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// One of the two steps is an event the clock-skew repair moved: a
    /// span cut to fit its parent, now ending with the parent's end (or
    /// starting with its start). Such ends tie with each other and with
    /// the parent, and the walks break the tie differently; without the
    /// cut the span would not have been a candidate at all.
    SkewClipped,
    /// A span at the join belongs to a segment the model saw in fewer than
    /// [`RARE`] of the requests: orderings chance never contradicted
    /// survive for it, so the model waits on events that are not real
    /// dependencies.
    RareSegment,
    /// The model's step is a mutual exclusion or pipeline turned into this
    /// request's order, not a happens-before: CRISP's walk knows neither.
    ExclusionOrPipeline,
    /// The two steps are equally late: both walks are right, they break the
    /// tie differently.
    Tie,
    /// CRISP's step is not in the model: some request contradicted it (a
    /// sibling that sometimes overlaps the next one, a child that sometimes
    /// outlives its parent), so the model waits for an earlier event.
    RefutedNesting,
    /// The model waits for a later event outside the span's family (not its
    /// parent, a child or a sibling): a dependency across subtrees learned
    /// over all requests, which the nesting walk never looks at.
    OtherSubtree,
    /// The model waits for a later event in the span's family that CRISP's
    /// walk passes over: a sibling's start (a call that always starts after
    /// another started, though they overlap) or a child's event that is not
    /// the last-finishing child's end.
    LaterInFamily,
}

impl Cause {
    /// Every cause, in the order they are tried.
    pub const ALL: [Cause; 7] = [
        Cause::SkewClipped,
        Cause::RareSegment,
        Cause::ExclusionOrPipeline,
        Cause::Tie,
        Cause::RefutedNesting,
        Cause::OtherSubtree,
        Cause::LaterInFamily,
    ];

    /// Name in reports and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::SkewClipped => "skew_clipped",
            Cause::RareSegment => "rare_segment",
            Cause::ExclusionOrPipeline => "exclusion_or_pipeline",
            Cause::Tie => "tie",
            Cause::RefutedNesting => "refuted_nesting",
            Cause::OtherSubtree => "other_subtree",
            Cause::LaterInFamily => "later_in_family",
        }
    }
}

/// An event of a request: `(span, is end)`.
pub type Ev = (u32, bool);

/// One span on which the two walks disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disagreement {
    /// Index in [`Request::spans`].
    pub span: u32,
    /// Critical through the model only (else in CRISP's walk only).
    pub model_only: bool,
    /// Why.
    pub cause: Cause,
    /// Where the chains join again.
    pub join: Ev,
    /// The model's step into the join (`None`: the join has no predecessor
    /// in the model's graph).
    pub model_step: Option<Ev>,
    /// CRISP's step into the join.
    pub crisp_step: Option<Ev>,
}

fn ix(e: Ev) -> usize {
    2 * e.0 as usize + usize::from(e.1)
}

fn ev(i: usize) -> Ev {
    ((i / 2) as u32, i % 2 == 1)
}

/// CRISP's walk as a chain of events: `on[e]` for the events on it and
/// `pred[e]` the one before (indexed `2 · span + is end`).
pub fn crisp_chain(req: &Request) -> (Vec<bool>, Vec<Option<usize>>) {
    let n = req.spans.len();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, s) in req.spans.iter().enumerate() {
        if let Some(p) = s.parent {
            children[p as usize].push(i);
        }
    }
    let mut on = vec![false; 2 * n];
    let mut pred = vec![None; 2 * n];
    let mut crit = vec![false; n];
    crit[0] = true;
    let mut stack = vec![0usize];
    while let Some(p) = stack.pop() {
        on[2 * p] = true;
        on[2 * p + 1] = true;
        // The event waiting for the next chosen child's end.
        let mut waiting = 2 * p + 1;
        let mut boundary = req.spans[p].end;
        loop {
            let next = children[p]
                .iter()
                .copied()
                .filter(|&c| !crit[c] && req.spans[c].end <= boundary)
                .max_by_key(|&c| (req.spans[c].end, std::cmp::Reverse(c)));
            let Some(c) = next else { break };
            crit[c] = true;
            stack.push(c);
            pred[waiting] = Some(2 * c + 1);
            waiting = 2 * c;
            boundary = req.spans[c].start;
        }
        pred[waiting] = Some(2 * p);
    }
    (on, pred)
}

/// The spans CRISP's walk puts on the critical path (CRISP Listing 1, as
/// `cpt traces convert` walks it, without its overlap tolerance): from each
/// critical span, its last-finishing child, then the child that finished
/// last before that one started, and so on.
pub fn crisp_critical(req: &Request) -> Vec<bool> {
    // A span is on the walk exactly when its start event is.
    let (on, _) = crisp_chain(req);
    on.chunks(2).map(|start_end| start_end[0]).collect()
}

/// How the model's critical path compares with CRISP's walk over many
/// requests: spans on both, on the model's only, on CRISP's only, on neither.
pub fn compare_with_crisp(results: &[(&Request, &RequestSlack)]) -> [usize; 4] {
    let mut c = [0usize; 4];
    for (req, rs) in results {
        let crisp = crisp_critical(req);
        for s in &rs.spans {
            let k = match (s.critical, crisp[s.span as usize]) {
                (true, true) => 0,
                (true, false) => 1,
                (false, true) => 2,
                (false, false) => 3,
            };
            c[k] += 1;
        }
    }
    c
}

/// The spans on which `rs` (the model's critical path of `req`) and
/// CRISP's walk disagree, each with its [`Cause`].
pub fn disagreements(model: &Model, req: &Request, rs: &RequestSlack) -> Vec<Disagreement> {
    let n = req.spans.len();
    let (crisp_on, crisp_pred) = crisp_chain(req);
    let mut crisp_next = vec![None; 2 * n];
    for (e, p) in crisp_pred.iter().enumerate() {
        if let (true, Some(p)) = (crisp_on[e], p) {
            crisp_next[*p] = Some(e);
        }
    }
    let mut model_on = vec![false; 2 * n];
    let mut model_pred = vec![None; 2 * n];
    let mut model_next = vec![None; 2 * n];
    for (j, &e) in rs.path.iter().enumerate() {
        model_on[ix(e)] = true;
        if let Some(&p) = rs.path.get(j + 1) {
            model_pred[ix(e)] = Some(ix(p));
            model_next[ix(p)] = Some(ix(e));
        }
    }
    let ids: Vec<Option<u32>> = model.lookup(req);
    let mev = |e: usize| ids[e / 2].map(|s| event(s, e % 2 == 1));
    let hb = |x: usize, y: usize| match (mev(x), mev(y)) {
        (Some(a), Some(b)) => model.happens_before(a, b),
        _ => false,
    };
    let time = |e: usize| {
        let s = &req.spans[e / 2];
        if e % 2 == 1 { s.end } else { s.start }
    };
    let rare = |e: usize| {
        ids[e / 2].is_none_or(|s| {
            (model.segments[s as usize].requests as f64) < RARE * model.requests as f64
        })
    };
    let family = |x: usize, y: usize| {
        let (a, b) = (&req.spans[x / 2], &req.spans[y / 2]);
        x / 2 == y / 2
            || a.parent == Some((y / 2) as u32)
            || b.parent == Some((x / 2) as u32)
            || (a.parent.is_some() && a.parent == b.parent)
    };
    // An event whose time the repair set: a clipped span's bound equal to
    // its parent's.
    let cut = |e: usize| {
        let s = &req.spans[e / 2];
        s.clipped
            && s.parent.is_some_and(|p| {
                let p = &req.spans[p as usize];
                if e % 2 == 1 {
                    s.end == p.end
                } else {
                    s.start == p.start
                }
            })
    };
    let classify = |x: Option<usize>, c: Option<usize>, y: usize| {
        let involved = [x, c, Some(y)];
        if [x, c].iter().flatten().any(|&e| cut(e)) {
            Cause::SkewClipped
        } else if involved.iter().flatten().any(|&e| rare(e)) {
            Cause::RareSegment
        } else if x.is_some_and(|x| !hb(x, y) && x / 2 != y / 2) {
            Cause::ExclusionOrPipeline
        } else if x.zip(c).is_some_and(|(x, c)| time(x) == time(c)) {
            Cause::Tie
        } else if x.is_none() || c.is_some_and(|c| c / 2 != y / 2 && !hb(c, y)) {
            Cause::RefutedNesting
        } else if x.is_some_and(|x| !family(x, y)) {
            Cause::OtherSubtree
        } else {
            Cause::LaterInFamily
        }
    };
    let mut out = Vec::new();
    for (i, s) in rs.spans.iter().enumerate() {
        let end = 2 * i + 1;
        let (model_crit, crisp_crit) = (s.critical, crisp_on[end]);
        if model_crit == crisp_crit {
            continue;
        }
        // Walk forward along the span's own chain to the other chain.
        let (mut e, next, other_on) = if model_crit {
            (end, &model_next, &crisp_on)
        } else {
            (end, &crisp_next, &model_on)
        };
        let join = loop {
            match next[e] {
                Some(y) if other_on[y] => break Some((e, y)),
                Some(y) => e = y,
                None => break None,
            }
        };
        let Some((last, y)) = join else { continue };
        let (x, c) = if model_crit {
            (Some(last), crisp_pred[y])
        } else {
            (model_pred[y], Some(last))
        };
        out.push(Disagreement {
            span: i as u32,
            model_only: model_crit,
            cause: classify(x, c, y),
            join: ev(y),
            model_step: x.map(ev),
            crisp_step: c.map(ev),
        });
    }
    out
}

/// An example of a cause: the first disagreement met.
#[derive(Clone, Debug)]
pub struct Example {
    /// The trace.
    pub trace_id: Box<str>,
    /// The disagreeing span.
    pub span_id: Box<str>,
    /// `CALLPATH#K` of the span.
    pub segment: String,
    /// Critical through the model only.
    pub model_only: bool,
    /// The join, the model's and CRISP's steps into it, as
    /// `CALLPATH#K.start|end`.
    pub join: String,
    /// The model's step.
    pub model_step: Option<String>,
    /// CRISP's step.
    pub crisp_step: Option<String>,
}

/// The disagreements of one cause over many requests.
#[derive(Clone, Debug)]
pub struct Row {
    /// The cause.
    pub cause: Cause,
    /// Spans critical only through the model.
    pub model_only: usize,
    /// Spans critical only in CRISP's walk.
    pub crisp_only: usize,
    /// The first met.
    pub example: Option<Example>,
    /// The call path with the most disagreements of this cause, and how
    /// many.
    pub top_call_path: Option<(Arc<str>, usize)>,
}

/// Per cause, in the order of [`Cause::ALL`], and the spans both walks
/// agree on.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// By cause.
    pub rows: Vec<Row>,
    /// Spans both walks agree on.
    pub agree: usize,
}

/// Count the disagreements of many requests by cause, with an example each.
pub fn tally<'a>(
    models: impl Fn(&Arc<str>) -> &'a Model,
    results: &[(&Request, &RequestSlack)],
) -> Tally {
    let mut per_path: Vec<rustc_hash::FxHashMap<Arc<str>, usize>> =
        vec![Default::default(); Cause::ALL.len()];
    let mut t = Tally {
        rows: Cause::ALL
            .iter()
            .map(|&cause| Row {
                cause,
                model_only: 0,
                crisp_only: 0,
                example: None,
                top_call_path: None,
            })
            .collect(),
        agree: 0,
    };
    for (req, rs) in results {
        let d = disagreements(models(&req.endpoint), req, rs);
        t.agree += req.spans.len() - d.len();
        for x in d {
            let c = Cause::ALL.iter().position(|&c| c == x.cause).unwrap_or(0);
            let row = &mut t.rows[c];
            if x.model_only {
                row.model_only += 1;
            } else {
                row.crisp_only += 1;
            }
            let sp = &req.spans[x.span as usize];
            *per_path[c].entry(sp.call_path.clone()).or_default() += 1;
            if row.example.is_none() {
                let name = |e: Ev| {
                    format!(
                        "{}.{}",
                        req.spans[e.0 as usize].segment(),
                        if e.1 { "end" } else { "start" }
                    )
                };
                row.example = Some(Example {
                    trace_id: req.trace_id.clone(),
                    span_id: sp.span_id.clone(),
                    segment: sp.segment(),
                    model_only: x.model_only,
                    join: name(x.join),
                    model_step: x.model_step.map(name),
                    crisp_step: x.crisp_step.map(name),
                });
            }
        }
    }
    for (row, paths) in t.rows.iter_mut().zip(per_path) {
        row.top_call_path = paths
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
    }
    t
}
