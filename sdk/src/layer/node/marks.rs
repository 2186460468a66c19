//! What a node's waits were on: the marks its exits leave, the tokio
//! resources it polled, and who woke it (see [`waits`](super::super::waits)
//! for where the names come from). Kept apart from the node table's
//! recording of runs, which most requests are only made of.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use super::super::waits::{self, WaitSite};
use super::{FrameCache, LiveNode, MAX_BUSY, NodeState, Request};
use crate::path::Frame;
use crate::path::graph::{FrameRef, NodeId, WaitMark};

/// What a node's waits were on.
#[derive(Debug, Default)]
pub(super) struct Waits {
    /// In time order (see [`WaitMark`](crate::path::graph::WaitMark)).
    pub(super) marks: Vec<(Duration, Option<Arc<WaitSite>>)>,
    /// The tokio resources it polled and found pending (`tokio-resources`):
    /// in the poll in progress, and in the poll before the wait in
    /// progress, by resource key (its span id).
    pending: SmallVec<[(u64, Arc<WaitSite>); 2]>,
    waited: SmallVec<[(u64, Arc<WaitSite>); 2]>,
}

#[cfg(feature = "tokio-resources")]
/// Resources remembered per poll: a `select!` over more is named by the
/// ones polled last.
const MAX_POLLED: usize = 8;

/// Who woke a node: see [`Request::wake`].
#[derive(Debug)]
pub(crate) enum WakeSource {
    /// A node (of any request) was current on the waking thread.
    Node(NodeState),
    /// A span that is not a node was current.
    Span,
    /// No span was current: the runtime's drivers (I/O, timers) or a
    /// thread outside any span.
    Runtime,
}

impl LiveNode {
    /// The node stopped running at `now`: mark what its wait is on (the
    /// last resource it polled pending), or that nothing names it.
    #[inline]
    pub(super) fn mark_exit(&mut self, now: Duration) {
        // No named wait and no tokio resource polled (always so without
        // them): nothing to mark, no mark to end.
        let Some(w) = self.waits.as_deref_mut() else {
            return;
        };
        let pending = std::mem::take(&mut w.pending);
        let site = pending.last().map(|p| p.1.clone());
        if site.is_some() || w.marks.last().is_some_and(|m| m.1.is_some()) {
            w.push_mark(now, site);
        }
        w.waited = pending;
    }

    /// The wait just ended was ended by the runtime: unless a resource
    /// names it, it is `[io]`.
    pub(super) fn mark_io(&mut self) {
        let Some(exit) = self.last_exit else { return };
        let w = self.waits.get_or_insert_with(Box::default);
        match w.marks.last_mut() {
            Some(last) if last.0 == exit => {
                if last.1.is_none() {
                    last.1 = Some(waits::io_site());
                }
            }
            _ => w.push_mark(exit, Some(waits::io_site())),
        }
    }
}

impl Waits {
    fn push_mark(&mut self, at: Duration, site: Option<Arc<WaitSite>>) {
        if self.marks.len() >= MAX_BUSY {
            if let Some(last) = self.marks.last_mut() {
                *last = (at, site);
            }
        } else {
            self.marks.push((at, site));
        }
    }
}

impl Request {
    /// The node's future was woken (its waker fired) at `now`, by what
    /// `source` says was current on the waking thread: another node of this
    /// request is the blocker of the node's next resumption; the runtime
    /// (no span) names an `[io]` wait when tokio's resources are seen (a
    /// timer would have named itself).
    pub(crate) fn wake(self: &Arc<Self>, node: NodeId, now: Duration, source: WakeSource) {
        let mut st = self.state();
        if let Some(n) = st.nodes.get_mut(node.index()) {
            if n.open.is_some() {
                n.woken_running = true;
                return;
            }
            if n.woken.is_none() {
                n.woken = Some(now);
            }
            match source {
                WakeSource::Node(by)
                    if by.node != node
                        && Arc::ptr_eq(&by.request, self)
                        && n.next_blocker.is_none() =>
                {
                    n.next_blocker = Some(by.node);
                }
                WakeSource::Runtime if waits::io_from_runtime_wakes() => n.woken_by_runtime = true,
                _ => {}
            }
        }
    }

    #[cfg(feature = "tokio-resources")]
    /// The node polled a tokio resource (key: its span id) that was
    /// `ready` or not.
    pub(crate) fn poll_op(&self, node: NodeId, key: u64, site: &Arc<WaitSite>, ready: bool) {
        let mut st = self.state();
        let Some(n) = st.nodes.get_mut(node.index()) else {
            return;
        };
        let polled = n.waits.get_or_insert_with(Box::default);
        if !ready {
            if let Some(i) = polled.pending.iter().position(|p| p.0 == key) {
                polled.pending.remove(i);
            } else if polled.pending.len() >= MAX_POLLED {
                polled.pending.remove(0);
            }
            polled.pending.push((key, site.clone()));
            return;
        }
        // The first of the resources the wait was on to be ready is what
        // ended it: it names the wait (the node's latest mark, made when it
        // stopped running).
        if let Some(i) = polled.waited.iter().position(|p| p.0 == key) {
            let site = polled.waited[i].1.clone();
            polled.waited.clear();
            if let Some(last) = polled.marks.last_mut()
                && Some(last.0) == n.last_exit
            {
                last.1 = Some(site);
            }
        }
    }
}

/// Every node's wait marks, with their sites as frames of `cache`'s
/// table, and node `i`'s range of them (none at all when no node has any).
#[inline]
pub(super) fn wait_marks(
    nodes: &[LiveNode],
    cache: &mut FrameCache,
    service: u32,
    service_name: &Arc<str>,
) -> (Vec<WaitMark>, Vec<(u32, u32)>) {
    let (mut marks, mut ranges) = (Vec::new(), Vec::new());
    if nodes.iter().any(|n| n.waits.is_some()) {
        ranges.reserve(nodes.len());
        for n in nodes {
            let from = marks.len() as u32;
            for (at, site) in n.waits.iter().flat_map(|w| &w.marks) {
                let on = site
                    .as_ref()
                    .map(|s| FrameRef::new(cache.wait(s, service, service_name)));
                marks.push(WaitMark { at: *at, on });
            }
            ranges.push((from, marks.len() as u32));
        }
    }
    (marks, ranges)
}

impl FrameCache {
    /// The frame id of the wait frame of `site` in the service of `slot`
    /// (`service`).
    pub(crate) fn wait(&mut self, site: &Arc<WaitSite>, slot: u32, service: &Arc<str>) -> u32 {
        let key = (Arc::as_ptr(site) as usize, slot);
        // Sites live as long as the site table keeps them; a key whose site
        // was freed and its address reused is caught by the content check.
        if let Some(&id) = self.by_wait.get(&key) {
            let f = &self.table.frames()[id as usize];
            if f.wait_kind() == Some(&*site.kind) && f.location == site.location {
                return id;
            }
        }
        let id = self.table.intern(Frame::wait(
            service.clone(),
            &site.kind,
            site.location.clone(),
        ));
        self.by_wait.insert(key, id);
        id
    }
}
