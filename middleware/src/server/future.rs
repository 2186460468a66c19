//! The server's response future.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use http_body::{Body, Frame};
use pin_project_lite::pin_project;

use super::{EAGER_FRAMES, Ending, ResponseBody};

pin_project! {
    /// Response future of a [`Server`](super::Server).
    ///
    /// Polls the inner future inside the request's root node; when it
    /// resolves, ends the root (complete responses) or hands it to the body
    /// (streaming responses).
    pub struct ResponseFuture<F, B> {
        #[pin]
        inner: F,
        ending: Option<Box<Ending>>,
        _body: std::marker::PhantomData<fn() -> B>,
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(super) fn untraced(inner: F) -> Self {
        ResponseFuture {
            inner,
            ending: None,
            _body: std::marker::PhantomData,
        }
    }

    pub(super) fn traced(inner: F, ending: Box<Ending>) -> Self {
        ResponseFuture {
            inner,
            ending: Some(ending),
            _body: std::marker::PhantomData,
        }
    }
}

impl<F, B> std::fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("traced", &self.ending.is_some())
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(ending) = this.ending.as_ref() else {
            let res = ready!(this.inner.poll(cx));
            return Poll::Ready(res.map(|r| r.map(ResponseBody::plain)));
        };
        let res = {
            let _entered = ending.span().enter();
            ready!(this.inner.poll(cx))
        };
        let ending = this
            .ending
            .take()
            .expect("checked above that the request is traced; this is a bug");
        let response = match res {
            Ok(response) => response,
            Err(err) => {
                drop(ending.finish());
                return Poll::Ready(Err(err));
            }
        };
        let (mut parts, body) = response.into_parts();
        if body.is_end_stream() {
            if let Some(value) = ending.finish() {
                value.insert_into(&mut parts.headers);
            }
            return Poll::Ready(Ok(Response::from_parts(parts, ResponseBody::plain(body))));
        }
        // Poll the body ahead without waiting: a body that ends now is a
        // complete response (path in headers), else it streams.
        let mut body = Box::pin(body);
        let mut buffered = VecDeque::new();
        let mut buffered_err = None;
        let mut complete = false;
        let entered = ending.span().clone().entered();
        while buffered.len() < EAGER_FRAMES {
            match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let trailers = frame.is_trailers();
                    buffered.push_back(frame);
                    if trailers {
                        complete = true;
                        break;
                    }
                }
                Poll::Ready(Some(Err(err))) => {
                    buffered_err = Some(err);
                    complete = true;
                    break;
                }
                Poll::Ready(None) => {
                    complete = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        drop(entered);
        let body = if complete {
            if let Some(value) = ending.finish() {
                value.insert_into(&mut parts.headers);
            }
            ResponseBody::replay(body, buffered, buffered_err, None, None, true)
        } else {
            let (ending, ready_path) =
                if ending.at_first_message() && buffered.iter().any(Frame::is_data) {
                    (None, ending.finish())
                } else {
                    (Some(ending), None)
                };
            ResponseBody::replay(body, buffered, buffered_err, ending, ready_path, false)
        };
        Poll::Ready(Ok(Response::from_parts(parts, body)))
    }
}
