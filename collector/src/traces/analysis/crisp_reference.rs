//! CRISP's reference accounting (`--accounting crisp`): the critical path
//! and exclusive times exactly as the open-source CRISP computes them
//! (its Python implementation is the specification its `CONFORMANCE.md`
//! names), so numbers can be compared with CRISP's own.
//!
//! # How it differs from cpt's walk ([`crisp`](super::crisp))
//!
//! - **Full durations.** Every span on the path is charged its whole
//!   (repaired) duration; its parent is charged its duration minus the
//!   durations of its children on the path. Where two consecutive
//!   children overlap (within the allowance), the overlap is counted in
//!   both and taken twice from the parent; cpt's walk cuts the earlier
//!   child at the later one's start instead, so no instant is counted
//!   twice.
//! - **Negative times are zeroed per call path.** Summed per call path
//!   within a trace, a negative exclusive time (children longer than their
//!   parent after the overlap above) becomes 0, so the path's total can
//!   exceed the root's duration. cpt's segments always sum to it.
//! - **Happens-before** is strict (`end < start`), or the overlap rule:
//!   the earlier child ends before the later one ends, started before it,
//!   overlaps it by less than `fraction` of the parent's duration (no
//!   absolute cap), and exactly two child events (starts or ends, of all
//!   the parent's children, zero-length ones included) lie in the overlap,
//!   bounds included.
//! - **Order.** Children are sorted by end time, ties broken by the later
//!   child in the file first (CRISP's stable ascending sort, reversed).
//! - **Zero-length leaves.** A zero-length span on the path with no
//!   children on it is written with 1 µs in the folded output, which is
//!   not taken from its parent (the reference's CCT; its per-span
//!   segments say 0).
//! - **No network time.** Client spans' own time is plain exclusive time.
//!
//! Clock skew is repaired as in the default mode ([`skew`](crate::traces::import::skew)):
//! a server that outlasts its client is shifted to end with it and cut to
//! its start, in both modes.

use std::fmt::Write as _;
use std::str::FromStr;

use rustc_hash::FxHashMap;

use super::crisp::Piece;
use crate::traces::import::skew::Repaired;
use crate::traces::model::Trace;

/// How a critical path's time is shared between its spans.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Accounting {
    /// cpt's walk: each instant of the root's span on exactly one span;
    /// overlapping siblings cut at the later one's start (CRISP §5.2 as
    /// cpt defines it); a client's own time around its server is network.
    #[default]
    Cpt,
    /// CRISP's reference implementation (see the module docs).
    Crisp,
}

impl FromStr for Accounting {
    type Err = String;

    fn from_str(s: &str) -> Result<Accounting, String> {
        match s {
            "cpt" => Ok(Accounting::Cpt),
            "crisp" => Ok(Accounting::Crisp),
            _ => Err(format!(
                "unknown accounting {s:?}: use cpt (the default) or crisp (CRISP's reference)"
            )),
        }
    }
}

/// One span on the reference's critical path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefSpan {
    /// Index into [`Trace::spans`].
    pub span: u32,
    /// Its duration minus its path children's, ns (may be negative).
    pub exclusive_ns: i64,
    /// No child of it is on the path.
    pub leaf: bool,
}

/// The reference's critical path under `root`, in its order (a span, then
/// the paths of its chosen children, the last-finishing first), with
/// `fraction` the overlap allowance (CRISP's default 0.01).
pub fn critical_path(trace: &Trace, rep: &Repaired, root: u32, fraction: f64) -> Vec<RefSpan> {
    critical_path_by(
        root,
        |node, kids| {
            kids.extend(
                trace
                    .children(node)
                    .iter()
                    .copied()
                    .filter(|&c| rep.kept[c as usize] && !trace.spans[c as usize].detached),
            );
        },
        |i| rep.start[i as usize],
        |i| rep.end[i as usize],
        fraction,
    )
}

/// [`critical_path`] over any tree: `kids(node, out)` appends a node's
/// children in file order, `start` and `end` give a node's times.
pub fn critical_path_by(
    root: u32,
    mut kids_of: impl FnMut(u32, &mut Vec<u32>),
    start: impl Fn(u32) -> i64,
    end: impl Fn(u32) -> i64,
    fraction: f64,
) -> Vec<RefSpan> {
    let mut out = Vec::new();
    let mut stack = vec![root];
    let mut kids: Vec<u32> = Vec::new();
    while let Some(node) = stack.pop() {
        kids.clear();
        kids_of(node, &mut kids);
        // Stable ascending by end, then reversed: the later child in file
        // order first on equal ends.
        let mut order: Vec<(usize, u32)> = kids.iter().copied().enumerate().collect();
        order.sort_by(|a, b| end(b.1).cmp(&end(a.1)).then(b.0.cmp(&a.0)));
        let p_dur = end(node) - start(node);
        let mut chosen: Vec<u32> = Vec::new();
        if let Some(&(_, first)) = order.first() {
            chosen.push(first);
            let mut later = first;
            for &(_, c) in &order[1..] {
                if happens_before(&kids, &start, &end, p_dur, fraction, c, later) {
                    chosen.push(c);
                    later = c;
                }
            }
        }
        let children_ns: i64 = chosen.iter().map(|&c| end(c) - start(c)).sum();
        out.push(RefSpan {
            span: node,
            exclusive_ns: p_dur - children_ns,
            leaf: chosen.is_empty(),
        });
        // Depth first, the last-finishing child next.
        stack.extend(chosen.iter().rev());
    }
    out
}

/// CRISP's `happensBefore(parent, children, before, later)`.
fn happens_before(
    kids: &[u32],
    start: &impl Fn(u32) -> i64,
    end: &impl Fn(u32) -> i64,
    p_dur: i64,
    fraction: f64,
    before: u32,
    later: u32,
) -> bool {
    let (bs, be) = (start(before), end(before));
    let (ls, le) = (start(later), end(later));
    if be < ls {
        return true;
    }
    if p_dur <= 0 || !(be < le && bs < ls) {
        return false;
    }
    if ((be - ls) as f64 / p_dur as f64) >= fraction {
        return false;
    }
    let inside = |t: i64| (ls..=be).contains(&t);
    let events: usize = kids
        .iter()
        .map(|&c| usize::from(inside(start(c))) + usize::from(inside(end(c))))
        .sum();
    events == 2
}

/// A span's call path as CRISP's folded output names it:
/// `[service] operation;[service] operation` from `root` down (`;` in a
/// name becomes `_`).
pub fn call_path(trace: &Trace, root: u32, span: u32) -> String {
    let mut chain = vec![span];
    let mut cur = span;
    while cur != root {
        match trace.spans[cur as usize].parent {
            Some(p) => {
                chain.push(p);
                cur = p;
            }
            None => break,
        }
    }
    let mut s = String::new();
    for (k, &i) in chain.iter().rev().enumerate() {
        let sp = &trace.spans[i as usize];
        if k > 0 {
            s.push(';');
        }
        let _ = write!(
            s,
            "[{}] {}",
            sp.service.replace(';', "_"),
            sp.operation.replace(';', "_")
        );
    }
    s
}

/// Per call path of one path: (exclusive ns after zeroing negatives,
/// spans), in first-seen order, with the span that first had it.
pub fn by_call_path(trace: &Trace, root: u32, path: &[RefSpan]) -> Vec<(String, u32, i64, u64)> {
    let mut at: FxHashMap<String, usize> = FxHashMap::default();
    let mut rows: Vec<(String, u32, i64, u64)> = Vec::new();
    for r in path {
        let excl = if r.leaf && r.exclusive_ns == 0 {
            // The reference's folded output shows a zero-length leaf as 1 µs.
            1_000
        } else {
            r.exclusive_ns
        };
        let key = call_path(trace, root, r.span);
        match at.get(&key) {
            Some(&k) => {
                rows[k].2 += excl;
                rows[k].3 += 1;
            }
            None => {
                at.insert(key.clone(), rows.len());
                rows.push((key, r.span, excl, 1));
            }
        }
    }
    for row in &mut rows {
        row.2 = row.2.max(0);
    }
    rows
}

/// The path as record pieces: one per call path (its first span), with
/// its zeroed exclusive time, in path order. Pieces of 0 ns are kept so
/// every call path on the path shows.
pub fn pieces(trace: &Trace, root: u32, path: &[RefSpan], out: &mut Vec<Piece>) {
    for (_, span, ns, _) in by_call_path(trace, root, path) {
        out.push(Piece {
            span,
            ns: ns as u64,
            kind: cpt_sdk::SegmentKind::Busy,
        });
    }
}

/// CRISP's conformance CCT (`conformance.cct`) of several paths, each
/// given as its [`by_call_path`] rows `(call path, exclusive ns, spans)`:
/// one line per call path, `CALLPATH EXCLUSIVE_US <<FREQUENCY>>`, exclusive
/// time summed over the paths and frequency the number of spans, lines in
/// byte order, one trailing newline (an empty string for no paths).
pub fn conformance_cct<'a>(paths: impl IntoIterator<Item = &'a [(String, i64, u64)]>) -> String {
    let mut acc: std::collections::BTreeMap<&str, (i64, u64)> = Default::default();
    for rows in paths {
        for (key, ns, freq) in rows {
            let e = acc.entry(key.as_str()).or_default();
            e.0 += ns;
            e.1 += freq;
        }
    }
    let mut s = String::new();
    for (k, (ns, f)) in acc {
        let _ = writeln!(s, "{k} {} <<{f}>>", ns.div_euclid(1000));
    }
    s
}
