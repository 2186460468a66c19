//! Critical path and slack over the model (MM §4.4.1–4.4.2, Figure 2).
//!
//! Per request, the events form a DAG: an edge `x → y` for every
//! happens-before the model keeps between two events of the request, and
//! the dynamic edges MM §4.1 derives from the static relations (a mutual
//! exclusion `A ∨ B` becomes `A.end → B.start` in the order this request
//! ran them; a pipeline `A ≫ B` becomes `A#i.end → B#i.start`).
//!
//! An event happens when its last predecessor has happened plus a delay of
//! its own, `d(y) = t(y) − max t(pred)` (for a span's end after its last
//! child: the span's own work; for the start of a call: the caller's work
//! before it). The weight of a path is the sum of the delays on it, so the
//! longest path from the first event to a given one is its time since the
//! request began, and `CP`, the longest to the last event, is the latency.
//! The critical path walks back from the root's end through each event's
//! last predecessor (ties: the later event in time order, MM's "first
//! discovered") to the root's start, where the request began: an event
//! before it (a detached span on a clock far off) is never on the path.
//!
//! **Slack** of a segment `S` (MM §4.4.2): `CP − CP_start − D_S − CP_end`,
//! where `CP_start + D_S` is the longest path to `S`'s end (the longest to
//! its start plus its duration when nothing inside `S` ends it later) and
//! `CP_end` the longest path from `S`'s end to the root's end: by how much
//! `S` could end later, every other delay unchanged, before the request
//! does. Zero on the critical path. An event from which no path leads to
//! the root's end (a detached span still running after it) may move freely
//! until the root's end: its slack is the time left until then.

use std::sync::Arc;

use super::events::Request;
use super::model::{Model, event};

/// Slack of one span of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanSlack {
    /// Index in [`Request::spans`].
    pub span: u32,
    /// Slack, ns.
    pub slack_ns: i64,
    /// On the critical path (its end is).
    pub critical: bool,
}

/// A request's critical path and slack.
#[derive(Clone, Debug, Default)]
pub struct RequestSlack {
    /// Latency (`CP`), ns.
    pub latency_ns: i64,
    /// Per span, in request order.
    pub spans: Vec<SpanSlack>,
    /// Critical-path time attributed to each span, ns: the delays of the
    /// critical events, a span's end counting for the span, a start for the
    /// caller. Sums to the latency.
    pub critical_ns: Vec<i64>,
    /// The critical path's events `(span, is end)`, from the root's end
    /// back to the first.
    pub path: Vec<(u32, bool)>,
}

/// Critical path and slack of `req` under `model` (which must have
/// observed every segment of it: refine first, analyse after).
///
/// # Panics
///
/// When the model has not seen one of the request's segments.
pub fn analyse(model: &Model, req: &Request) -> RequestSlack {
    let ids: Vec<u32> = model
        .lookup(req)
        .into_iter()
        .map(|i| i.expect("the model observed this request"))
        .collect();
    let n = req.spans.len();
    let mut depth = vec![0u32; n];
    for i in 0..n {
        if let Some(p) = req.spans[i].parent {
            depth[i] = depth[p as usize] + 1;
        }
    }
    // Events: (time, tie key, span, is end). At equal times ends come
    // before starts (an end at t may enable a start at t), outer starts
    // before inner ones and inner ends before outer ones.
    let mut raw: Vec<(i64, (u8, i64), usize, bool)> = Vec::with_capacity(2 * n);
    for (i, s) in req.spans.iter().enumerate() {
        raw.push((s.start, (1, i64::from(depth[i])), i, false));
        raw.push((s.end, (0, -i64::from(depth[i])), i, true));
    }
    let m0 = raw.len();
    let mev: Vec<usize> = raw.iter().map(|e| event(ids[e.2], e.3)).collect();
    // Edges x → y of this request's graph (indices into `raw`): the model's
    // happens-before, oriented by time, at equal times one way only (the
    // model's, or by the tie key when it holds both ways); a span's own
    // start → end; the dynamic edges of mutual exclusions and pipelines.
    let mut adj = vec![false; m0 * m0];
    let spos = |i: usize, end: bool| 2 * i + usize::from(end);
    for x in 0..m0 {
        for y in 0..m0 {
            if x == y || raw[x].2 == raw[y].2 || raw[x].0 > raw[y].0 {
                continue;
            }
            if model.happens_before(mev[x], mev[y])
                && (raw[x].0 < raw[y].0
                    || !model.happens_before(mev[y], mev[x])
                    || (raw[x].1, raw[x].2) < (raw[y].1, raw[y].2))
            {
                adj[x * m0 + y] = true;
            }
        }
    }
    for i in 0..n {
        adj[spos(i, false) * m0 + spos(i, true)] = true;
    }
    for a in 0..n {
        for b in 0..n {
            let (sa, sb) = (&req.spans[a], &req.spans[b]);
            if a == b || sa.end > sb.start {
                continue;
            }
            let pipelined = sa.k == sb.k
                && sa.parent.is_some()
                && sa.parent == sb.parent
                && sa.call_path != sb.call_path
                && model.pipeline(&sa.call_path, &sb.call_path);
            if pipelined || model.exclusive(ids[a], ids[b]) {
                adj[spos(a, true) * m0 + spos(b, false)] = true;
                // Keep the graph acyclic at equal times.
                adj[spos(b, false) * m0 + spos(a, true)] = false;
            }
        }
    }
    // Topological order (Kahn), earliest (time, tie key) first; a cycle
    // the model could leave among simultaneous events is broken there.
    let mut indeg: Vec<usize> = (0..m0)
        .map(|y| (0..m0).filter(|&x| adj[x * m0 + y]).count())
        .collect();
    let mut done = vec![false; m0];
    let mut order: Vec<usize> = Vec::with_capacity(m0);
    type Key = std::cmp::Reverse<(i64, (u8, i64), usize, usize)>;
    let mut heap: std::collections::BinaryHeap<Key> = (0..m0)
        .filter(|&x| indeg[x] == 0)
        .map(|x| std::cmp::Reverse((raw[x].0, raw[x].1, raw[x].2, x)))
        .collect();
    while order.len() < m0 {
        let x = match heap.pop() {
            Some(std::cmp::Reverse((.., x))) if !done[x] => x,
            Some(_) => continue,
            None => (0..m0)
                .filter(|&x| !done[x])
                .min_by_key(|&x| (raw[x].0, raw[x].1, raw[x].2))
                .expect("an event is left"),
        };
        done[x] = true;
        order.push(x);
        for y in 0..m0 {
            if adj[x * m0 + y] && !done[y] {
                indeg[y] -= 1;
                if indeg[y] == 0 {
                    heap.push(std::cmp::Reverse((raw[y].0, raw[y].1, raw[y].2, y)));
                }
            }
        }
    }
    let mut rank = vec![0usize; m0];
    for (p, &x) in order.iter().enumerate() {
        rank[x] = p;
    }
    let m = m0;
    let evs: Vec<(usize, bool)> = order.iter().map(|&x| (raw[x].2, raw[x].3)).collect();
    let time: Vec<i64> = order.iter().map(|&x| raw[x].0).collect();
    let mut pos = vec![[0usize; 2]; n];
    for (p, e) in evs.iter().enumerate() {
        pos[e.0][usize::from(e.1)] = p;
    }
    // Forward: each event's predecessors (edges from earlier in the
    // order), its delay and its binding predecessor: the latest, a span's
    // own start first among equals, then the later in the order.
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); m];
    let mut delay = vec![0i64; m];
    let mut binding: Vec<Option<usize>> = vec![None; m];
    for (y, &oy) in order.iter().enumerate() {
        let p: Vec<usize> = (0..m0)
            .filter(|&x| adj[x * m0 + oy] && rank[x] < y)
            .map(|x| rank[x])
            .collect();
        let own = |x: usize| evs[x].0 == evs[y].0;
        let best = p.iter().copied().max_by_key(|&x| (time[x], own(x), x));
        delay[y] = best.map_or(0, |x| time[y] - time[x]);
        binding[y] = best;
        preds[y] = p;
    }
    // Backward: the latest each event may happen without delaying the
    // root's end.
    let sink = pos[0][1];
    let t_end = time[sink];
    let mut latest = vec![i64::MAX; m];
    latest[sink] = t_end;
    for y in (0..m).rev() {
        if latest[y] == i64::MAX {
            latest[y] = t_end.max(time[y]);
        }
        for &x in &preds[y] {
            latest[x] = latest[x].min(latest[y] - delay[y]);
        }
    }
    // Critical path: back from the sink through binding predecessors, to
    // the root's start. The request begins there: an event before it (a
    // detached subtree whose clock is far off) cannot have delayed it, so
    // the walk stops at the root's start, or at the first step that would
    // cross it, and the path's delays add up to the latency.
    let t_start = time[pos[0][0]];
    let mut on_path = vec![false; m];
    let mut critical_ns = vec![0i64; n];
    let mut path = Vec::new();
    let mut cur = Some(sink);
    while let Some(y) = cur {
        on_path[y] = true;
        path.push((evs[y].0 as u32, evs[y].1));
        let (span, is_end) = evs[y];
        let owner = if is_end {
            span
        } else {
            req.spans[span].parent.map_or(span, |p| p as usize)
        };
        cur = binding[y].filter(|_| y != pos[0][0]);
        if let Some(x) = cur {
            critical_ns[owner] += time[y] - time[x].max(t_start);
            if time[x] < t_start {
                cur = None;
            }
        }
    }
    let spans = (0..n)
        .map(|i| SpanSlack {
            span: i as u32,
            slack_ns: (latest[pos[i][1]] - time[pos[i][1]]).max(0),
            critical: on_path[pos[i][1]],
        })
        .collect();
    RequestSlack {
        latency_ns: req.latency(),
        spans,
        critical_ns,
        path,
    }
}

/// Slack percentiles of one call path over many requests.
#[derive(Clone, Debug)]
pub struct PathSlack {
    /// The call path.
    pub call_path: Arc<str>,
    /// Spans.
    pub count: usize,
    /// How many were critical.
    pub critical: usize,
    /// p10 / p50 / p90 slack, ns.
    pub p10: i64,
    /// Median.
    pub p50: i64,
    /// p90.
    pub p90: i64,
}

/// Per call path: count and slack percentiles (nearest rank), by call path.
pub fn per_call_path(results: &[(&Request, &RequestSlack)]) -> Vec<PathSlack> {
    let mut by: std::collections::BTreeMap<Arc<str>, (Vec<i64>, usize)> = Default::default();
    for (req, rs) in results {
        for s in &rs.spans {
            let e = by
                .entry(req.spans[s.span as usize].call_path.clone())
                .or_default();
            e.0.push(s.slack_ns);
            e.1 += usize::from(s.critical);
        }
    }
    by.into_iter()
        .map(|(call_path, (mut v, critical))| {
            v.sort_unstable();
            let q = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
            PathSlack {
                count: v.len(),
                critical,
                p10: q(0.1),
                p50: q(0.5),
                p90: q(0.9),
                call_path,
            }
        })
        .collect()
}

/// One bucket of MM Figure 10.
#[derive(Clone, Debug)]
pub struct Bucket {
    /// Requests in it.
    pub n: usize,
    /// Smallest and largest slack in it, ns.
    pub slack_min: i64,
    /// Largest.
    pub slack_max: i64,
    /// Pearson correlation between the segment's duration and the
    /// end-to-end latency; `None` when one of them does not vary.
    pub r: Option<f64>,
}

/// MM Figures 9–10: the requests that have segment `segment`
/// (`CALLPATH#K`), sorted by its slack and cut into `buckets` equal-size
/// buckets; per bucket the correlation between the segment's duration and
/// the request's latency. It should fall as slack rises.
pub fn correlation_by_slack(
    results: &[(&Request, &RequestSlack)],
    segment: &str,
    buckets: usize,
) -> Vec<Bucket> {
    let mut pts: Vec<(i64, f64, f64)> = Vec::new();
    for (req, rs) in results {
        if let Some(s) = req.spans.iter().position(|s| s.segment() == segment) {
            pts.push((
                rs.spans[s].slack_ns,
                req.spans[s].duration() as f64,
                req.latency() as f64,
            ));
        }
    }
    pts.sort_by_key(|p| p.0);
    let buckets = buckets.max(1).min(pts.len().max(1));
    let mut out = Vec::new();
    for b in 0..buckets {
        let (lo, hi) = (b * pts.len() / buckets, (b + 1) * pts.len() / buckets);
        let part = &pts[lo..hi];
        if part.is_empty() {
            continue;
        }
        out.push(Bucket {
            n: part.len(),
            slack_min: part[0].0,
            slack_max: part[part.len() - 1].0,
            r: pearson(part.iter().map(|p| (p.1, p.2))),
        });
    }
    out
}

/// Pearson's r; `None` for fewer than two points or no variance.
pub fn pearson(pts: impl Iterator<Item = (f64, f64)>) -> Option<f64> {
    let v: Vec<(f64, f64)> = pts.collect();
    if v.len() < 2 {
        return None;
    }
    let n = v.len() as f64;
    let (mx, my) = (
        v.iter().map(|p| p.0).sum::<f64>() / n,
        v.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (x, y) in v {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
        syy += (y - my) * (y - my);
    }
    if sxx <= 0.0 || syy <= 0.0 {
        None
    } else {
        Some(sxy / (sxx * syy).sqrt())
    }
}
