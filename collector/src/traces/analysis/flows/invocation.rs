//! Invocations: one parent span and its direct children, with the
//! quantities of Mann et al. §3 (`L(m)`, `P(m)`, `L`) and the invocation
//! graph of §4.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::traces::import::skew::{RepairOptions, Repaired, is_rpc_pair, repair};
use crate::traces::model::{SpanKind, Trace};

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
/// for by construction, are left out).
///
/// - **One clock** (a parent and children recorded by one host): times as
///   the trace recorded them (Mann §4 relies on one machine's timestamps).
/// - **Across clocks** (a parent whose children ran in other processes, as
///   in traces where only servers are instrumented and a root's children
///   are the servers it called): the parent and its children take the
///   importer's skew-repaired times ([`repair`]: a clock domain shifted by
///   the symmetric-delay estimate, children held inside their parent), so
///   the skew between hosts does not read as waits that never happened. A
///   child the repair drops (wholly outside its parent) is left out.
/// - **An RPC hop** (a client span whose children are only its own server
///   spans on another host) is not an invocation: the server span is the
///   same call seen from the other side, and its own children make the
///   server's invocation.
pub fn invocations(trace: &Trace, keys: &mut KeyInterner) -> Vec<Invocation> {
    invocations_by_span(trace, keys)
        .into_iter()
        .map(|(_, inv)| inv)
        .collect()
}

/// True when span `i` is a client span whose only waited-for children are
/// its own server spans on another clock: one RPC seen from both sides.
pub(crate) fn is_rpc_hop(trace: &Trace, i: u32, kids: &[u32]) -> bool {
    trace.spans[i as usize].kind == SpanKind::Client
        && !kids.is_empty()
        && kids.iter().all(|&c| is_rpc_pair(trace, c as usize))
}

/// [`invocations`], each with its parent span's index in the trace.
pub fn invocations_by_span(trace: &Trace, keys: &mut KeyInterner) -> Vec<(u32, Invocation)> {
    let mut out = Vec::new();
    let trace_id: Arc<str> = Arc::from(&*trace.trace_id);
    let multi_clock = trace
        .spans
        .first()
        .is_some_and(|s0| trace.spans.iter().any(|s| s.clock != s0.clock));
    // Repaired once per trace, and only when some parent and child can
    // disagree about the time.
    let repaired: Option<Repaired> = multi_clock.then(|| {
        let roots: Vec<u32> = trace.roots().collect();
        repair(trace, &RepairOptions::default(), &roots)
    });
    for (i, span) in trace.spans.iter().enumerate() {
        let kids: Vec<u32> = trace
            .children(i as u32)
            .iter()
            .copied()
            .filter(|&c| !trace.spans[c as usize].is_detached())
            .collect();
        if kids.is_empty() || is_rpc_hop(trace, i as u32, &kids) {
            continue;
        }
        let across = kids
            .iter()
            .any(|&c| trace.spans[c as usize].clock != span.clock);
        // Times of span `j`: repaired when the invocation spans clocks (and
        // the parent itself survived the repair), else as recorded.
        let rep = repaired.as_ref().filter(|r| across && r.kept[i]);
        let times = |j: u32| -> Option<(i64, i64)> {
            match rep {
                Some(r) => r.kept[j as usize].then(|| (r.start[j as usize], r.end[j as usize])),
                None => {
                    let s = &trace.spans[j as usize];
                    Some((s.start_ns, s.end_ns()))
                }
            }
        };
        let Some((p_start, p_end)) = times(i as u32) else {
            continue;
        };
        let calls: Vec<Call<'_>> = kids
            .iter()
            .filter_map(|&c| {
                let s = &trace.spans[c as usize];
                let (cs, ce) = times(c)?;
                Some(Call {
                    service: &s.service,
                    operation: &s.operation,
                    start: cs - p_start,
                    end: ce - p_start,
                    id: c,
                })
            })
            .collect();
        if calls.is_empty() {
            continue;
        }
        out.push((
            i as u32,
            Invocation::new(
                keys.parent(&span.service, &span.operation),
                trace_id.clone(),
                p_start,
                p_end - p_start,
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
