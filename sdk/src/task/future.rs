//! [`Tracked`]: a future run inside a node's span.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

pin_project! {
    /// A future polled inside its node's span, like `tracing`'s
    /// `Instrumented`, with two differences that keep blockers exact:
    ///
    /// - dropping it does not enter the span (`Instrumented` enters its span
    ///   to drop the inner future, which makes a cancelled `select!` loser
    ///   look as if it ended after the winner);
    /// - dropping it before it completed marks the node *cancelled*, so it is
    ///   never taken for a blocker.
    ///
    /// Made by [`task::node`](super::node).
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct Tracked<F> {
        #[pin]
        inner: F,
        span: tracing::Span,
        done: bool,
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
        let out = this.inner.poll(cx);
        if out.is_ready() {
            *this.done = true;
        }
        out
    }
}
