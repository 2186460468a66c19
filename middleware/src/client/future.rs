//! The client's response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use super::body::Resolver;
use super::{PendingCallee, ResponseBody};

pin_project! {
    /// Response future of a [`Client`](super::Client).
    ///
    /// Polls the call inside the RPC node; on the response, takes the path
    /// out of the headers and hands the node to the body, which ends it.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        pending: Resolver,
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn untraced(inner: F) -> Self {
        ResponseFuture {
            inner,
            pending: Resolver(None),
        }
    }

    pub(super) fn traced(inner: F, pending: Box<PendingCallee>) -> Self {
        ResponseFuture {
            inner,
            pending: Resolver(Some(pending)),
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("traced", &self.pending.0.is_some())
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = {
            let _entered = this.pending.0.as_ref().map(|p| p.span().enter());
            ready!(this.inner.poll(cx))
        };
        let Some(mut pending) = this.pending.0.take() else {
            return Poll::Ready(res.map(|r| r.map(|b| ResponseBody::new(b, Resolver(None)))));
        };
        match res {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                pending.take_header_path(&mut parts.headers);
                Poll::Ready(Ok(Response::from_parts(
                    parts,
                    ResponseBody::new(body, Resolver(Some(pending))),
                )))
            }
            Err(err) => {
                // The call failed: the whole RPC is a blind spot.
                pending.resolve(None);
                Poll::Ready(Err(err))
            }
        }
    }
}
