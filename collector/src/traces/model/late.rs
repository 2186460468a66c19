//! Children that start once their parent has ended, on a clock that agrees
//! with the parent's: work the parent started and never waited for (an
//! asynchronous task), so they are detached while the trace is built, not
//! left to clock-skew repair to drop (see the `skew` module docs, "Late
//! children are not skew when the clocks agree").
//!
//! A clock agrees when it is the parent's own, or when another child of the
//! parent on that clock lies inside the parent as recorded. A server under a
//! client on another host is left to the repair: there the clocks are what
//! is in doubt.

use super::{SpanKind, Trace};

impl Trace {
    /// True when span `child` (a server) and its parent (a client) are the
    /// two halves of one RPC recorded on different hosts.
    pub(crate) fn is_rpc_pair(&self, child: usize) -> bool {
        let s = &self.spans[child];
        match s.parent {
            Some(p) => {
                let p = &self.spans[p as usize];
                s.kind == SpanKind::Server && p.kind == SpanKind::Client && p.clock != s.clock
            }
            None => false,
        }
    }
}

/// Detach the late children whose clock agrees with their parent's (see
/// the module docs).
pub(super) fn detach_late_children(trace: &mut Trace) {
    let mut late: Vec<u32> = Vec::new();
    // Clocks shown to agree with the current parent's.
    let mut agreeing: Vec<u32> = Vec::new();
    for p in 0..trace.spans.len() as u32 {
        let parent = &trace.spans[p as usize];
        let (ps, pe) = (parent.start_ns, parent.end_ns());
        let kids = trace.children(p);
        let starts_late = |c: u32| {
            let s = &trace.spans[c as usize];
            let late = if s.duration_ns == 0 {
                s.start_ns > pe
            } else {
                s.start_ns >= pe
            };
            late && !s.detached && !trace.is_rpc_pair(c as usize)
        };
        if !kids.iter().any(|&c| starts_late(c)) {
            continue;
        }
        agreeing.clear();
        agreeing.push(parent.clock);
        for &c in kids {
            let s = &trace.spans[c as usize];
            if !s.detached && s.start_ns >= ps && s.end_ns() <= pe && !agreeing.contains(&s.clock) {
                agreeing.push(s.clock);
            }
        }
        late.extend(
            kids.iter()
                .copied()
                .filter(|&c| starts_late(c) && agreeing.contains(&trace.spans[c as usize].clock)),
        );
    }
    for c in late {
        trace.spans[c as usize].detached = true;
    }
}
