//! [`Tracked`]: a future run inside a node's span.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use pin_project_lite::pin_project;

use crate::clock::Clock;
use crate::request::NodeState;

pin_project! {
    /// A future polled inside its node's span, like `tracing`'s
    /// `Instrumented`, with two differences that keep blockers exact:
    ///
    /// - dropping it does not enter the span (`Instrumented` enters its span
    ///   to drop the inner future, which makes a cancelled `select!` loser
    ///   look as if it ended after the winner);
    /// - dropping it before it completed marks the node *cancelled*, so it is
    ///   never taken for a blocker;
    /// - inside a traced request it sees its wakes (it wraps the waker), so
    ///   time when it was ready to run but its parent was polling a sibling
    ///   is the sibling's on the path, not an unattributed wait (a `join` of
    ///   CPU-bound branches that yield).
    ///
    /// Made by [`task::node`](super::node).
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct Tracked<F> {
        #[pin]
        inner: F,
        span: tracing::Span,
        done: bool,
        waker: WakeState,
    }

    impl<F> PinnedDrop for Tracked<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if !*this.done && !this.span.is_disabled() {
                crate::request::cancelled(this.span);
            }
        }
    }
}

impl<F> Tracked<F> {
    pub(crate) fn new(inner: F, span: tracing::Span) -> Self {
        Tracked {
            inner,
            span,
            done: false,
            waker: WakeState::Unknown,
        }
    }

    /// The node's span.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }
}

impl<F: Future> Future for Tracked<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _enter = this.span.enter();
        if let WakeState::Unknown = this.waker {
            *this.waker = match crate::request::wake_target(this.span) {
                Some((node, clock)) => WakeState::Traced(Arc::new(NodeWaker {
                    node,
                    clock,
                    inner: Mutex::new(cx.waker().clone()),
                })),
                None => WakeState::Untraced,
            };
        }
        let out = match this.waker {
            WakeState::Traced(w) => {
                w.set_inner(cx.waker());
                let waker = Waker::from(w.clone());
                this.inner.poll(&mut Context::from_waker(&waker))
            }
            _ => this.inner.poll(cx),
        };
        if out.is_ready() {
            *this.done = true;
            // Ended now (at this poll's exit), even if its span lives on
            // while a task it spawned runs.
            if let WakeState::Traced(w) = this.waker {
                w.node.request.close(w.node.node, || w.clock.now());
            }
        }
        out
    }
}

/// Whether a [`Tracked`] future reports wakes.
enum WakeState {
    /// Not polled yet.
    Unknown,
    /// Not a node of a traced request: poll with the caller's waker.
    Untraced,
    /// A node: wrap the caller's waker.
    Traced(Arc<NodeWaker>),
}

impl fmt::Debug for WakeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WakeState::Unknown => "Unknown",
            WakeState::Untraced => "Untraced",
            WakeState::Traced(_) => "Traced",
        })
    }
}

/// Records the node's wake, then wakes the caller's waker.
struct NodeWaker {
    node: NodeState,
    clock: Arc<dyn Clock>,
    inner: Mutex<Waker>,
}

impl NodeWaker {
    fn set_inner(&self, w: &Waker) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !inner.will_wake(w) {
            *inner = w.clone();
        }
    }
}

impl Wake for NodeWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let source = crate::request::wake_source();
        self.node
            .request
            .wake(self.node.node, self.clock.now(), source);
        let w = self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone();
        w.wake();
    }
}
