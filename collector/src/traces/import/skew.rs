//! Clock-skew repair before the critical-path walk (CRISP §5.2, Mystery
//! Machine §3).
//!
//! Every span's times come from its own host's clock, so a child can seem
//! to start before, or end after, the parent that waited for it. The walk in
//! [`crisp`](crate::traces::analysis::crisp) needs children inside their parents; this module makes
//! them so, and counts every nanosecond it moves or cuts.
//!
//! # How
//!
//! 1. **Shift (Mystery Machine symmetric delay).** Spans carry a clock
//!    domain (host). When a client span and its server child live in
//!    different domains, the client saw the whole round trip, so the
//!    server's clock offset can be estimated: with
//!    `rtt = client.duration − server.duration`, the server should start
//!    `rtt / 2` after the client started. A domain gets an offset only when
//!    at least one of its server spans does *not* fit inside its client as
//!    recorded (servers that fit are consistent with the clocks as they
//!    are, and we do not invent skew). Among all client/server pairs
//!    that reach the domain, the estimate from the pair with the smallest
//!    non-negative round trip wins (the Mystery Machine's rule: the least
//!    queueing, the least error). When every pair's server is longer than
//!    its client (a negative round trip, which only skew explains), the
//!    domain is shifted so the server that overruns least ends with its
//!    client (CRISP's reference does the same), and step 2 cuts its start
//!    to the client's: no network time is charged for it. Offsets chain: a domain reached only
//!    through another shifted domain inherits that domain's offset. The
//!    offset moves every span of the domain.
//! 2. **Truncate / drop (CRISP).** Top-down, a child that starts before its
//!    (repaired) parent starts at the parent's start; one that ends after it
//!    ends at the parent's end; the descendants follow recursively because
//!    they are checked against the repaired child. A child wholly outside
//!    its parent (ends at or before the parent's start, or starts at or
//!    after its end) is dropped with its subtree. A zero-length child at
//!    either edge of its parent is inside.
//!
//! Roots keep their times: the root's duration is the request's latency.
//! So do detached spans (a consumer under its producer, a `FOLLOWS_FROM`
//! child) and their subtrees: their parent does not wait for them, so
//! running after it ended is no skew, and no walk from above enters them (a
//! span selected as a root inside one is repaired as usual).
//!
//! # Children that end after their parent on an agreeing clock
//!
//! A clock agrees with the parent's when it is the parent's own, or when
//! another child of the parent on that clock lies inside the parent as
//! recorded. A server under a client on another host is left to the
//! repair above: there the clocks are what is in doubt. On an agreeing
//! clock, no offset explains a child that sticks out of its parent, so:
//!
//! - a child that starts once its parent has ended, or a child of a
//!   producer that ends after the producer, is work the parent never
//!   waited for: the model detaches it while the trace is built
//!   (`model/late.rs`): kept, off the path, counted with the other
//!   detached subtrees;
//! - any other child that ends after its parent is one the parent ended
//!   during (a handler whose response is sent from inside a callback span,
//!   as Online Boutique's `currencyservice` does on every call). It is cut
//!   at the parent's end as above, so the path charges it up to the moment
//!   the parent ended, as CRISP's reference and the Jaeger UI do, but the
//!   time after that is no skew: it is counted apart
//!   ([`Adjustments::overhang_spans`], [`Adjustments::overhang_ns`]) and
//!   is not part of the record's `accounting.clock_skew`.
//!
//! How much a child sticks out does not decide between the two: on the
//! Online Boutique set the same callback shape ends from 3 µs to 80 ms after
//! its parent, so a threshold would split one behaviour in two.

use std::collections::HashMap;

use crate::traces::model::Trace;

/// Repair choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepairOptions {
    /// Shift server spans by the symmetric-delay estimate from their client
    /// span instead of truncating them (default on).
    pub shift_rpc: bool,
}

impl Default for RepairOptions {
    fn default() -> Self {
        RepairOptions { shift_rpc: true }
    }
}

/// What the repair changed, for the record's accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adjustments {
    /// Spans whose clock domain was shifted.
    pub shifted_spans: u64,
    /// The largest absolute shift applied, ns.
    pub max_shift_ns: u64,
    /// Spans truncated at either end.
    pub truncated_spans: u64,
    /// Total time cut from truncated spans, ns.
    pub truncated_ns: u64,
    /// Spans dropped (subtree roots and their descendants).
    pub dropped_spans: u64,
    /// Duration of the dropped subtree roots (after their own repair), ns.
    pub dropped_ns: u64,
    /// Time of tolerated sibling overlaps clipped by the walk, ns (filled in
    /// by [`crisp`](crate::traces::analysis::crisp)).
    pub overlap_ns: u64,
    /// Sibling overlaps tolerated by the walk (filled in by [`crisp`](crate::traces::analysis::crisp)).
    pub overlaps: u64,
    /// Children cut at the end of a parent that ended during them, on a
    /// clock that agrees with the parent's: no skew (see the module docs).
    pub overhang_spans: u64,
    /// The time they ran after their parent ended, ns: off the path, and not
    /// part of the record's `accounting.clock_skew`.
    pub overhang_ns: u64,
}

impl Adjustments {
    /// Field-wise sum (max for `max_shift_ns`).
    pub fn add(&mut self, o: &Adjustments) {
        self.shifted_spans += o.shifted_spans;
        self.max_shift_ns = self.max_shift_ns.max(o.max_shift_ns);
        self.truncated_spans += o.truncated_spans;
        self.truncated_ns += o.truncated_ns;
        self.dropped_spans += o.dropped_spans;
        self.dropped_ns += o.dropped_ns;
        self.overlap_ns += o.overlap_ns;
        self.overlaps += o.overlaps;
        self.overhang_spans += o.overhang_spans;
        self.overhang_ns += o.overhang_ns;
    }

    /// The record labels these adjustments are reported under (only the
    /// non-zero ones), see the module docs of [`super`].
    pub fn labels(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("skew.shifted_spans", self.shifted_spans),
            ("skew.max_shift_ns", self.max_shift_ns),
            ("skew.truncated_spans", self.truncated_spans),
            ("skew.truncated_ns", self.truncated_ns),
            ("skew.dropped_spans", self.dropped_spans),
            ("skew.dropped_ns", self.dropped_ns),
            ("skew.overlaps", self.overlaps),
            ("skew.overlap_ns", self.overlap_ns),
            ("overhang.spans", self.overhang_spans),
            ("overhang.ns", self.overhang_ns),
        ]
        .into_iter()
        .filter(|(_, v)| *v != 0)
    }
}

/// Repaired times of every span of a trace.
#[derive(Clone, Debug, Default)]
pub struct Repaired {
    /// Repaired start, ns.
    pub start: Vec<i64>,
    /// Repaired end, ns.
    pub end: Vec<i64>,
    /// False for dropped spans.
    pub kept: Vec<bool>,
    /// The clock-domain offset applied to each span, ns.
    pub shift: Vec<i64>,
    /// Of the time cut from span `i`, the part it ran after its parent's
    /// recorded end on a clock that agrees with the parent's, ns (see the
    /// module docs): counted in [`Adjustments::overhang_ns`], not as skew.
    /// The rest of the cut (the parent's own repair, a start before the
    /// parent's) is skew.
    pub overhang: Vec<i64>,
    /// What changed.
    pub adjustments: Adjustments,
}

impl Repaired {
    /// Repaired duration of span `i` (0 when dropped).
    pub fn duration(&self, i: u32) -> i64 {
        let i = i as usize;
        if self.kept[i] {
            self.end[i] - self.start[i]
        } else {
            0
        }
    }
}

/// True when `parent` (client) and `child` (server) are the two halves of
/// one RPC recorded on different hosts.
pub(crate) fn is_rpc_pair(trace: &Trace, child: usize) -> bool {
    trace.is_rpc_pair(child)
}

/// Repair a trace's times (see the module docs).
///
/// `anchors` are spans analysed as roots (endpoint selection may pick
/// spans below the trace root): they keep their (shifted) times and are
/// never truncated or dropped against their own parents.
pub fn repair(trace: &Trace, opts: &RepairOptions, anchors: &[u32]) -> Repaired {
    let n = trace.spans.len();
    let mut anchor = vec![false; n];
    for &a in anchors {
        anchor[a as usize] = true;
    }
    let mut adj = Adjustments::default();
    let offsets = if opts.shift_rpc {
        domain_offsets(trace)
    } else {
        HashMap::new()
    };
    let mut start = Vec::with_capacity(n);
    let mut end = Vec::with_capacity(n);
    let mut shift = Vec::with_capacity(n);
    for s in &trace.spans {
        let off = offsets.get(&s.clock).copied().unwrap_or(0);
        shift.push(off);
        if off != 0 {
            adj.shifted_spans += 1;
            adj.max_shift_ns = adj.max_shift_ns.max(off.unsigned_abs());
        }
        start.push(s.start_ns.saturating_add(off));
        end.push(s.end_ns().saturating_add(off));
    }
    let mut kept = vec![true; n];
    let mut overhang = vec![0i64; n];
    let mut unwalked = vec![false; n];
    // Parents come before children in `trace.spans`.
    for i in 0..n {
        let Some(p) = trace.spans[i].parent else {
            continue;
        };
        let p = p as usize;
        // Anchors are analysed as roots: not held to their parents' times.
        if anchor[i] {
            continue;
        }
        // A detached span (a consumer, a FOLLOWS_FROM child) is not waited
        // for, so it need not lie inside its parent; no walk from an anchor
        // above it enters its subtree, so nothing there is repaired or
        // counted (an anchor inside it starts a walk of its own).
        if trace.spans[i].detached || unwalked[p] {
            unwalked[i] = true;
            continue;
        }
        if !kept[p] {
            kept[i] = false;
            adj.dropped_spans += 1;
            continue;
        }
        let (ps, pe) = (start[p], end[p]);
        let (s, e) = (start[i], end[i]);
        let outside = if s == e {
            s < ps || s > pe
        } else {
            e <= ps || s >= pe
        };
        if outside {
            kept[i] = false;
            adj.dropped_spans += 1;
            adj.dropped_ns += (e - s) as u64;
            continue;
        }
        let (ns, ne) = (s.max(ps), e.min(pe));
        if (ns, ne) != (s, e) {
            let cut = (e - s) - (ne - ns);
            // The parent's end as recorded (shifted with its clock), before
            // its own repair: what the child ran past it on an agreeing
            // clock is no skew.
            let recorded_end = trace.spans[p].end_ns().saturating_add(shift[p]);
            let over = if trace.clock_agrees(i as u32) {
                (e - recorded_end.max(ne)).clamp(0, cut)
            } else {
                0
            };
            if over > 0 {
                overhang[i] = over;
                adj.overhang_spans += 1;
                adj.overhang_ns += over as u64;
            }
            if cut > over {
                adj.truncated_spans += 1;
                adj.truncated_ns += (cut - over) as u64;
            }
            start[i] = ns;
            end[i] = ne;
        }
    }
    Repaired {
        start,
        end,
        kept,
        shift,
        overhang,
        adjustments: adj,
    }
}

/// Per clock domain, the offset (ns) to add to its times.
fn domain_offsets(trace: &Trace) -> HashMap<u32, i64> {
    // Pairs (client index, server index) across domains.
    let pairs: Vec<(usize, usize)> = (0..trace.spans.len())
        .filter(|&i| is_rpc_pair(trace, i))
        .map(|i| (trace.spans[i].parent.unwrap_or_default() as usize, i))
        .collect();
    let mut offsets: HashMap<u32, i64> = HashMap::new();
    if pairs.is_empty() {
        return offsets;
    }
    for r in trace.roots() {
        offsets.entry(trace.spans[r as usize].clock).or_insert(0);
    }
    // Resolve domains in rounds: a domain is decided once one of its
    // clients' domains is.
    loop {
        let mut progress = false;
        // domain -> (needs shift, best (rtt, offset), best server longer
        // than its client (rtt, offset))
        type Cand = (bool, Option<(i64, i64)>, Option<(i64, i64)>);
        let mut cand: HashMap<u32, Cand> = HashMap::new();
        for &(c, s) in &pairs {
            let (cs, ss) = (&trace.spans[c], &trace.spans[s]);
            if offsets.contains_key(&ss.clock) {
                continue;
            }
            let Some(&coff) = offsets.get(&cs.clock) else {
                continue;
            };
            let c_start = cs.start_ns + coff;
            let c_end = cs.end_ns() + coff;
            let fits = ss.start_ns >= c_start && ss.end_ns() <= c_end;
            let rtt = cs.duration_ns - ss.duration_ns;
            let e = cand.entry(ss.clock).or_insert((false, None, None));
            e.0 |= !fits;
            if rtt >= 0 {
                let off = c_start + rtt / 2 - ss.start_ns;
                if e.1.is_none_or(|(best, _)| rtt < best) {
                    e.1 = Some((rtt, off));
                }
            } else {
                // A server longer than its client can only be skew (the
                // client saw the whole call): end it with its client; the
                // truncation then cuts its start to the client's.
                let off = c_end - ss.end_ns();
                if e.2.is_none_or(|(best, _)| rtt > best) {
                    e.2 = Some((rtt, off));
                }
            }
        }
        for (d, (needs, best, longer)) in cand {
            let off = match (needs, best, longer) {
                (true, Some((_, off)), _) | (true, None, Some((_, off))) => off,
                _ => 0,
            };
            offsets.insert(d, off);
            progress = true;
        }
        if !progress {
            break;
        }
    }
    offsets.retain(|_, o| *o != 0);
    offsets
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::traces::model::{BuildOptions, RawSpan, SpanKind, build};

    fn span<'a>(
        id: &'a str,
        parent: Option<&'a str>,
        kind: SpanKind,
        host: &str,
        s: i64,
        d: i64,
    ) -> RawSpan<'a> {
        RawSpan {
            id: id.into(),
            parent_id: parent.map(Into::into),
            service: Arc::from(host),
            operation: Arc::from(id),
            start_ns: Some(s),
            duration_ns: Some(d),
            kind,
            clock: Arc::from(host),
            error: false,
            follows_from: false,
        }
    }

    #[test]
    fn crisp_truncates_overflowing_children_and_drops_outside_ones() {
        // CRISP 7.json / 9.json shapes: B overflows A's end; D starts after A ends.
        let t = build(
            "t",
            vec![
                span("A", None, SpanKind::Unspecified, "h1", 0, 100),
                span("B", Some("A"), SpanKind::Unspecified, "h2", 10, 100),
                span("C", Some("B"), SpanKind::Unspecified, "h2", 95, 20),
                span("D", Some("A"), SpanKind::Unspecified, "h3", 110, 50),
                span("E", Some("D"), SpanKind::Unspecified, "h3", 120, 30),
            ],
            BuildOptions::default(),
        )
        .unwrap();
        let r = repair(&t, &RepairOptions::default(), &[]);
        let at = |id: &str| t.spans.iter().position(|s| &*s.span_id == id).unwrap();
        assert_eq!((r.start[at("B")], r.end[at("B")]), (10, 100));
        assert_eq!((r.start[at("C")], r.end[at("C")]), (95, 100));
        assert!(!r.kept[at("D")] && !r.kept[at("E")]);
        let a = r.adjustments;
        // C ran 5 past B's recorded end on B's own clock (no skew); the
        // other 10 it lost with B's cut are skew.
        assert_eq!((a.truncated_spans, a.truncated_ns), (2, 10 + 10));
        assert_eq!((a.overhang_spans, a.overhang_ns), (1, 5));
        assert_eq!((a.dropped_spans, a.dropped_ns), (2, 50));
    }

    #[test]
    fn mystery_machine_shifts_a_skewed_server_to_the_middle_of_its_client() {
        // Client 100..200 on h1; server recorded at 1000..1080 on h2 (clock 900+ ahead).
        // rtt = 100 - 80 = 20, so the server should start at 110: offset -890.
        let t = build(
            "t",
            vec![
                span("root", None, SpanKind::Server, "h1", 0, 300),
                span("cli", Some("root"), SpanKind::Client, "h1", 100, 100),
                span("srv", Some("cli"), SpanKind::Server, "h2", 1000, 80),
                span("work", Some("srv"), SpanKind::Internal, "h2", 1010, 50),
            ],
            BuildOptions::default(),
        )
        .unwrap();
        let r = repair(&t, &RepairOptions::default(), &[]);
        let at = |id: &str| t.spans.iter().position(|s| &*s.span_id == id).unwrap();
        assert_eq!((r.start[at("srv")], r.end[at("srv")]), (110, 190));
        assert_eq!((r.start[at("work")], r.end[at("work")]), (120, 170));
        assert_eq!(r.adjustments.shifted_spans, 2);
        assert_eq!(r.adjustments.max_shift_ns, 890);
        assert_eq!(r.adjustments.truncated_ns, 0);
        // Without the shift CRISP drops the server wholly outside its client.
        let r = repair(&t, &RepairOptions { shift_rpc: false }, &[]);
        assert!(!r.kept[at("srv")]);
    }

    #[test]
    fn servers_that_fit_are_not_shifted_and_the_smallest_rtt_wins() {
        let t = build(
            "t",
            vec![
                span("root", None, SpanKind::Server, "h1", 0, 1000),
                span("c1", Some("root"), SpanKind::Client, "h1", 100, 100),
                span("s1", Some("c1"), SpanKind::Server, "h2", 150, 40),
                span("c2", Some("root"), SpanKind::Client, "h1", 300, 100),
                span("s2", Some("c2"), SpanKind::Server, "h2", 390, 90),
            ],
            BuildOptions::default(),
        )
        .unwrap();
        // s2 does not fit (ends at 480 > 400): h2 needs an offset. Pair 2 has
        // rtt 10 (< 60 of pair 1): offset = 300 + 5 - 390 = -85. The whole
        // domain moves, so s1 lands at 65..105 and is truncated to 100..105.
        let r = repair(&t, &RepairOptions::default(), &[]);
        let at = |id: &str| t.spans.iter().position(|s| &*s.span_id == id).unwrap();
        assert_eq!((r.start[at("s2")], r.end[at("s2")]), (305, 395));
        assert_eq!((r.start[at("s1")], r.end[at("s1")]), (100, 105));
        assert_eq!(r.adjustments.truncated_ns, 35);
    }
}
