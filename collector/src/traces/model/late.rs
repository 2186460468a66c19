//! Children their parent did not wait for, told apart by their times on a
//! clock that agrees with the parent's, so that they are detached while the
//! trace is built, not left to clock-skew repair to drop or cut (see the
//! `skew` module docs, "Children that end after their parent on an
//! agreeing clock"):
//!
//! - a child that starts once its parent has ended: work the parent started
//!   and never waited for (an asynchronous task);
//! - a child of a producer that ends after the producer: the producer's
//!   kind says it is the initiator of an asynchronous request, and ending
//!   after it shows that this child is that request's work, not the
//!   producer's own sending.
//!
//! A clock agrees when it is the parent's own, or when another child of the
//! parent on that clock lies inside the parent as recorded. A server under
//! a client on another host is left to the repair: there the clocks are
//! what is in doubt.

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

    /// True when `child`'s clock is known to agree with its parent's: it is
    /// the parent's own clock, or another attached child of the parent on
    /// the same clock lies inside the parent as recorded. False for a root
    /// and for a server under a client on another host (the two halves of
    /// an RPC, whose clocks are what skew repair is for).
    pub(crate) fn clock_agrees(&self, child: u32) -> bool {
        let s = &self.spans[child as usize];
        let Some(p) = s.parent else {
            return false;
        };
        if self.is_rpc_pair(child as usize) {
            return false;
        }
        let parent = &self.spans[p as usize];
        if s.clock == parent.clock {
            return true;
        }
        let (ps, pe) = (parent.start_ns, parent.end_ns());
        self.children(p).iter().any(|&c| {
            let k = &self.spans[c as usize];
            c != child && k.clock == s.clock && !k.detached && k.start_ns >= ps && k.end_ns() <= pe
        })
    }
}

/// Detach the children their parent did not wait for (see the module docs).
pub(super) fn detach_late_children(trace: &mut Trace) {
    let mut late: Vec<u32> = Vec::new();
    for p in 0..trace.spans.len() as u32 {
        let parent = &trace.spans[p as usize];
        let (ps, pe) = (parent.start_ns, parent.end_ns());
        let producer = parent.kind == SpanKind::Producer;
        let not_waited_for = |c: u32| {
            let s = &trace.spans[c as usize];
            if s.detached {
                return false;
            }
            let starts_after = if s.duration_ns == 0 {
                s.start_ns > pe
            } else {
                s.start_ns >= pe
            };
            let outlives_producer = producer && s.start_ns >= ps && s.end_ns() > pe;
            starts_after || outlives_producer
        };
        late.extend(
            trace
                .children(p)
                .iter()
                .copied()
                .filter(|&c| not_waited_for(c) && trace.clock_agrees(c)),
        );
    }
    for c in late {
        trace.spans[c as usize].detached = true;
    }
}
