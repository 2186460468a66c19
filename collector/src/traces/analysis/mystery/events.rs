//! Requests and their events (MM §3, §4.1).
//!
//! A *request* is one selected root span and its subtree, with clock-skew
//! repaired times. Every span is a *segment* named `CALLPATH#K`, where
//! CALLPATH is the `service:operation` frames from the root down to the span
//! joined by `;`, and `K` the 0-based occurrence of that call path in the
//! request. A segment has two *events*, `CALLPATH#K.start` and
//! `CALLPATH#K.end`. ÜberTrace requires `⟨event, task⟩` to be unique in a
//! request; these names are.
//!
//! `K` counts among siblings with the same call path in start order; when
//! the parent itself repeats (`a;b` under `a#0` and under `a#1`) the count
//! goes on across parents, in the parents' own order, so that the name stays
//! unique: the children of `a#0` come first, then those of `a#1`.

use std::fmt::Write as _;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::traces::model::Trace;
use crate::traces::skew::{self, RepairOptions};
use crate::traces::{RootSelector, select_roots};

/// One span of a [`Request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReqSpan {
    /// The span id as the file spelled it.
    pub span_id: Box<str>,
    /// Index of the parent in [`Request::spans`]; `None` for the root.
    pub parent: Option<u32>,
    /// `service:operation` frames from the root, joined by `;`.
    pub call_path: Arc<str>,
    /// Occurrence of the call path in the request (see the module docs).
    pub k: u32,
    /// Repaired start, ns.
    pub start: i64,
    /// Repaired end, ns.
    pub end: i64,
    /// The clock-skew repair cut this span to fit inside its parent (beyond
    /// shifting its clock domain).
    pub clipped: bool,
}

impl ReqSpan {
    /// `CALLPATH#K`.
    pub fn segment(&self) -> String {
        format!("{}#{}", self.call_path, self.k)
    }

    /// Duration, ns.
    pub fn duration(&self) -> i64 {
        self.end - self.start
    }
}

/// One request: a root span and its subtree, parents before children.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The trace it comes from.
    pub trace_id: Box<str>,
    /// The root's `service:operation` (the endpoint a model is per).
    pub endpoint: Arc<str>,
    /// `spans[0]` is the root.
    pub spans: Vec<ReqSpan>,
}

impl Request {
    /// End-to-end latency: the root's duration, ns.
    pub fn latency(&self) -> i64 {
        self.spans[0].duration()
    }

    /// Build a request from spans given as `(parent, service:operation,
    /// span id, start, end)`, parents before children, `spans[0]` the root:
    /// names the call paths and numbers the occurrences.
    ///
    /// # Panics
    ///
    /// When a parent index does not point to an earlier span.
    pub fn from_spans(trace_id: &str, spans: &[(Option<u32>, &str, &str, i64, i64)]) -> Request {
        let mut out: Vec<ReqSpan> = Vec::with_capacity(spans.len());
        let mut paths: FxHashMap<String, Arc<str>> = FxHashMap::default();
        for &(parent, frame, id, start, end) in spans {
            let path = match parent {
                Some(p) => {
                    assert!((p as usize) < out.len(), "parents come before children");
                    format!("{};{frame}", out[p as usize].call_path)
                }
                None => frame.to_owned(),
            };
            let call_path = paths
                .entry(path)
                .or_insert_with_key(|k| Arc::from(k.as_str()))
                .clone();
            out.push(ReqSpan {
                span_id: id.into(),
                parent,
                call_path,
                k: 0,
                start,
                end: end.max(start),
                clipped: false,
            });
        }
        number(&mut out);
        Request {
            trace_id: trace_id.into(),
            endpoint: out[0].call_path.clone(),
            spans: out,
        }
    }
}

/// Assign `K` (see the module docs): level by level, ordered by call path,
/// the parent's `K`, start and position.
fn number(spans: &mut [ReqSpan]) {
    let n = spans.len();
    let mut depth = vec![0u32; n];
    for i in 0..n {
        if let Some(p) = spans[i].parent {
            depth[i] = depth[p as usize] + 1;
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| depth[i]);
    let mut lo = 0;
    while lo < n {
        let d = depth[order[lo]];
        let mut hi = lo;
        while hi < n && depth[order[hi]] == d {
            hi += 1;
        }
        let level = &mut order[lo..hi];
        level.sort_by(|&a, &b| {
            let pk = |i: usize| spans[i].parent.map_or(0, |p| spans[p as usize].k);
            spans[a]
                .call_path
                .cmp(&spans[b].call_path)
                .then(pk(a).cmp(&pk(b)))
                .then(spans[a].start.cmp(&spans[b].start))
                .then(a.cmp(&b))
        });
        let mut k = 0u32;
        for j in 0..level.len() {
            if j > 0 && spans[level[j]].call_path != spans[level[j - 1]].call_path {
                k = 0;
            }
            spans[level[j]].k = k;
            k += 1;
        }
        lo = hi;
    }
}

/// Call paths shared by every request cut with it: a deep call path is
/// hundreds of bytes, and every span of every request has one, so each
/// distinct path is stored once.
#[derive(Debug, Default)]
pub struct CallPaths(FxHashSet<Arc<str>>);

impl CallPaths {
    /// The shared copy of `path`.
    pub fn intern(&mut self, path: &str) -> Arc<str> {
        if let Some(p) = self.0.get(path) {
            return p.clone();
        }
        let p: Arc<str> = Arc::from(path);
        self.0.insert(p.clone());
        p
    }
}

/// The requests of one trace: one per root `sel` selects, with times
/// repaired as `cpt traces convert` repairs them. Spans the repair drops
/// (wholly outside their parent) are left out with their subtrees.
pub fn requests(trace: &Trace, sel: &RootSelector, repair: &RepairOptions) -> Vec<Request> {
    requests_with(trace, sel, repair, &mut CallPaths::default())
}

/// [`requests`], with the call paths shared through `paths` (use one for
/// many traces).
pub fn requests_with(
    trace: &Trace,
    sel: &RootSelector,
    repair: &RepairOptions,
    paths: &mut CallPaths,
) -> Vec<Request> {
    let roots = select_roots(trace, sel);
    if roots.is_empty() {
        return Vec::new();
    }
    let rep = skew::repair(trace, repair, &roots);
    let mut out = Vec::with_capacity(roots.len());
    let mut buf = String::new();
    for &r in &roots {
        let mut spans: Vec<ReqSpan> = Vec::new();
        // (trace index, request index of the parent)
        let mut stack: Vec<(u32, Option<u32>)> = vec![(r, None)];
        while let Some((i, parent)) = stack.pop() {
            let s = &trace.spans[i as usize];
            if !rep.kept[i as usize] {
                continue;
            }
            buf.clear();
            if let Some(p) = parent {
                buf.push_str(&spans[p as usize].call_path);
                buf.push(';');
            }
            let _ = write!(buf, "{}:{}", s.service, s.operation);
            let call_path = paths.intern(&buf);
            let me = spans.len() as u32;
            let (start, end) = (rep.start[i as usize], rep.end[i as usize]);
            let shift = rep.shift[i as usize];
            spans.push(ReqSpan {
                span_id: s.span_id.clone(),
                parent,
                call_path,
                k: 0,
                start,
                end: end.max(start),
                clipped: (start, end)
                    != (
                        s.start_ns.saturating_add(shift),
                        s.end_ns().saturating_add(shift),
                    ),
            });
            for &c in trace.children(i).iter().rev() {
                stack.push((c, Some(me)));
            }
        }
        number(&mut spans);
        out.push(Request {
            trace_id: trace.trace_id.clone(),
            endpoint: spans[0].call_path.clone(),
            spans,
        });
    }
    out
}
