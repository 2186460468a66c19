//! The client's response body: reads the callee's path from the trailers and
//! ends the RPC node when the body ends or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::PendingCallee;

/// Resolves the RPC node when the body ends, fails or is dropped (and a
/// call whose future is dropped before its response, as a timeout does: a
/// blind spot, its time on the path).
pub(crate) struct Resolver(pub(crate) Option<Box<PendingCallee>>);

impl Resolver {
    pub(crate) fn resolve(&mut self, trailer_path: Option<crate::glue::PathHeaders>) {
        if let Some(pending) = self.0.take() {
            pending.resolve(trailer_path);
        }
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.resolve(None);
    }
}

pin_project! {
    /// Response body of a [`Client`](super::Client).
    ///
    /// For a traced call, takes the callee's path out of the trailers and,
    /// when the body ends (or fails, or is dropped unread), attaches the path
    /// found in the trailers or headers, or a blind spot, to the RPC node and
    /// ends it. Untraced calls pass through.
    pub struct ResponseBody<B> {
        #[pin]
        inner: B,
        pending: Resolver,
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn new(inner: B, pending: Resolver) -> Self {
        ResponseBody { inner, pending }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("traced", &self.pending.0.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for ResponseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = {
            let _entered = this.pending.0.as_ref().map(|p| p.span().clone().entered());
            ready!(this.inner.poll_frame(cx))
        };
        if this.pending.0.is_none() {
            return Poll::Ready(polled);
        }
        match polled {
            Some(Ok(frame)) => {
                if !frame.is_trailers() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                let mut trailers = frame
                    .into_trailers()
                    .unwrap_or_else(|_| unreachable!("checked is_trailers"));
                this.pending
                    .resolve(crate::glue::PathHeaders::take_from(&mut trailers));
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            other => {
                // End of stream or an error: the path, if any, came in the
                // headers.
                this.pending.resolve(None);
                Poll::Ready(other)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
