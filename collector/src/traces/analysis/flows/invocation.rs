//! Invocations: one parent span and its direct children, with the
//! quantities of Mann et al. §3 (`L(m)`, `P(m)`, `L`) and the invocation
//! graph of §4.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::traces::import::skew::is_rpc_pair;
use crate::traces::model::Trace;

/// One child of an invocation (Mann §3: a method `m`).
#[derive(Clone, Debug, PartialEq)]
pub struct Child {
    /// `service:operation#k`: `k` is the 0-based occurrence among siblings
    /// with the same `service:operation`, in start order, so retries and
    /// repeated calls are distinct children.
    pub key: Arc<str>,
    /// Start, ns after the parent's start.
    pub start: f64,
    /// `L(m)`: the child's latency, ns.
    pub latency: f64,
    /// `P(m)`: ns from the end of the latest sibling that finished before
    /// this child started (or from the parent's start) to this child's
    /// start.
    pub pre: f64,
    /// Whether the child ended before the parent did (the parent waited for
    /// it); `false` for fire-and-forget children still running when the
    /// parent returned.
    pub awaited: bool,
    /// The caller's id of the call ([`Call::id`]; the span's index in its
    /// trace for [`invocations`]).
    pub id: u32,
}

impl Child {
    /// End, ns after the parent's start.
    pub fn end(&self) -> f64 {
        self.start + self.latency
    }
}

/// One parent invocation `I` (Mann §3): a span and its direct children.
#[derive(Clone, Debug, PartialEq)]
pub struct Invocation {
    /// The parent's `service:operation`: models are trained per parent.
    pub parent: Arc<str>,
    /// The trace it came from.
    pub trace_id: Arc<str>,
    /// The parent's start, Unix ns (train/test split by time).
    pub start_unix_ns: i64,
    /// `L`: the parent's latency, ns.
    pub latency: f64,
    /// The children in start order (ties by end, then key).
    pub children: Vec<Child>,
    /// `P(return)`: ns from the end of the latest awaited child (or from
    /// the parent's start when none) to the parent's end: the parent's own
    /// work after its last wait. Every estimator adds it (see the module
    /// docs).
    pub post: f64,
}

/// A child call as a trace records it: ns relative to the parent's start.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The child's service.
    pub service: &'a str,
    /// The child's operation.
    pub operation: &'a str,
    /// Start, ns after the parent's start.
    pub start: i64,
    /// End, ns after the parent's start.
    pub end: i64,
    /// The caller's id of this call, kept as [`Child::id`].
    pub id: u32,
}

impl Invocation {
    /// The invocation of a parent of latency `latency` ns whose children
    /// made `calls`: orders them by start, names repeated calls `#1`, `#2`,
    /// …, and works out each `P(m)`, whether the parent waited for it, and
    /// `P(return)`.
    pub fn new(
        parent: Arc<str>,
        trace_id: Arc<str>,
        start_unix_ns: i64,
        latency: i64,
        calls: &[Call<'_>],
        keys: &mut KeyInterner,
    ) -> Invocation {
        let mut raw: Vec<&Call<'_>> = calls.iter().collect();
        raw.sort_by(|a, b| {
            (a.start, a.end, a.service, a.operation).cmp(&(b.start, b.end, b.service, b.operation))
        });
        let mut seen: FxHashMap<(&str, &str), u32> = FxHashMap::default();
        let mut children = Vec::with_capacity(raw.len());
        for c in raw {
            let k = seen.entry((c.service, c.operation)).or_insert(0);
            let key = keys.child(c.service, c.operation, *k);
            *k += 1;
            children.push(Child {
                key,
                start: c.start as f64,
                latency: (c.end - c.start).max(0) as f64,
                pre: 0.0,
                awaited: c.end <= latency,
                id: c.id,
            });
        }
        for j in 0..children.len() {
            let start = children[j].start;
            let before = children[..j]
                .iter()
                .chain(&children[j + 1..])
                .map(Child::end)
                .filter(|&e| e <= start)
                .fold(0.0f64, f64::max);
            children[j].pre = (start - before).max(0.0);
        }
        let latency = latency.max(0) as f64;
        let last = children
            .iter()
            .filter(|c| c.awaited)
            .map(Child::end)
            .fold(0.0f64, f64::max);
        Invocation {
            parent,
            trace_id,
            start_unix_ns,
            latency,
            post: (latency - last).max(0.0),
            children,
        }
    }

    /// The invocation graph's edges between children (Mann §4): `(i, j)`
    /// when child `i` finished before child `j` started (`i` before `j` in
    /// start order, so the graph is acyclic even with zero-length children).
    pub fn edges(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let c = &self.children;
        (0..c.len()).flat_map(move |j| {
            (0..j).filter_map(move |i| (c[i].end() <= c[j].start).then_some((i, j)))
        })
    }

    /// The child with `key`, if the invocation has it.
    pub fn child(&self, key: &str) -> Option<&Child> {
        self.children.iter().find(|c| &*c.key == key)
    }
}

/// Every invocation of `trace`: each span with at least one child it waits
/// or does not wait for (detached children, which the parent never waits
/// for by construction, are left out), with times as the trace recorded
/// them. A parent and its children ran on one machine, so their clocks
/// agree (Mann §4); no skew repair is applied. A span whose children all
/// ran on another host (a client span and its server span, an RPC hop) is
/// not an invocation and is left out.
pub fn invocations(trace: &Trace, keys: &mut KeyInterner) -> Vec<Invocation> {
    invocations_by_span(trace, keys)
        .into_iter()
        .map(|(_, inv)| inv)
        .collect()
}

/// [`invocations`], each with its parent span's index in the trace.
pub fn invocations_by_span(trace: &Trace, keys: &mut KeyInterner) -> Vec<(u32, Invocation)> {
    let mut out = Vec::new();
    let trace_id: Arc<str> = Arc::from(&*trace.trace_id);
    for (i, span) in trace.spans.iter().enumerate() {
        let kids: Vec<u32> = trace
            .children(i as u32)
            .iter()
            .copied()
            .filter(|&c| !trace.spans[c as usize].is_detached())
            .collect();
        // A span whose children all ran on another host (a client span and
        // its server span: an RPC hop) is not an invocation: Mann §4 relies
        // on one machine's timestamps, and the skew between the hosts would
        // read as waits that never happened (or children outliving their
        // parent). Jaeger and OTLP mark the pair by kind and host; Nezha's
        // CSV has no kinds, so the host alone decides.
        if kids.is_empty()
            || kids.iter().all(|&c| {
                is_rpc_pair(trace, c as usize) || trace.spans[c as usize].clock != span.clock
            })
        {
            continue;
        }
        let p_start = span.start_ns;
        let calls: Vec<Call<'_>> = kids
            .iter()
            .map(|&c| {
                let s = &trace.spans[c as usize];
                Call {
                    service: &s.service,
                    operation: &s.operation,
                    start: s.start_ns - p_start,
                    end: s.end_ns() - p_start,
                    id: c,
                }
            })
            .collect();
        out.push((
            i as u32,
            Invocation::new(
                keys.parent(&span.service, &span.operation),
                trace_id.clone(),
                p_start,
                span.end_ns() - p_start,
                &calls,
                keys,
            ),
        ));
    }
    out
}

/// Interns parent and child keys, so equal keys share one allocation and
/// compare by pointer first.
#[derive(Debug, Default)]
pub struct KeyInterner {
    map: FxHashMap<String, Arc<str>>,
}

impl KeyInterner {
    fn get(&mut self, s: String) -> Arc<str> {
        if let Some(k) = self.map.get(&s) {
            return k.clone();
        }
        let k: Arc<str> = Arc::from(s.as_str());
        self.map.insert(s, k.clone());
        k
    }

    /// `service:operation`.
    pub fn parent(&mut self, service: &str, operation: &str) -> Arc<str> {
        self.get(format!("{service}:{operation}"))
    }

    /// `service:operation#k`.
    pub fn child(&mut self, service: &str, operation: &str, k: u32) -> Arc<str> {
        self.get(format!("{service}:{operation}#{k}"))
    }
}
