//! The server's response body: replays frames the response future polled
//! ahead, and ends the request's root node at the stream's last message,
//! adding the path to the trailers.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::Ending;
use super::OutgoingPath;

pin_project! {
    /// Response body of a [`Server`](super::Server).
    ///
    /// Untraced requests pass the inner body through untouched. For a traced
    /// streaming response the request's root node stays open until the
    /// body's last message (CPT's definition of a stream's segment; or its
    /// first message with [`StreamEnd::FirstMessage`](super::StreamEnd)), and
    /// the path is added to the trailers frame, or sent in a trailers frame of
    /// its own if the body ended without one.
    pub struct ResponseBody<B>
    where
        B: Body,
    {
        #[pin]
        inner: MaybeBoxed<B>,
        buffered: VecDeque<Frame<B::Data>>,
        buffered_err: Option<B::Error>,
        ending: Option<Box<Ending>>,
        ready_path: Option<OutgoingPath>,
        // The inner body already ended (seen while polling ahead): replay the
        // buffered frames and never poll it again.
        inner_done: bool,
        done: bool,
    }
}

pin_project! {
    #[project = MaybeBoxedProj]
    enum MaybeBoxed<B> {
        Plain { #[pin] body: B },
        Boxed { body: Pin<Box<B>> },
    }
}

type PollFrame<D, E> = Poll<Option<Result<Frame<D>, E>>>;

impl<B: Body> ResponseBody<B> {
    pub(super) fn plain(body: B) -> Self {
        ResponseBody {
            inner: MaybeBoxed::Plain { body },
            buffered: VecDeque::new(),
            buffered_err: None,
            ending: None,
            ready_path: None,
            inner_done: false,
            done: false,
        }
    }

    pub(super) fn replay(
        body: Pin<Box<B>>,
        buffered: VecDeque<Frame<B::Data>>,
        buffered_err: Option<B::Error>,
        ending: Option<Box<Ending>>,
        ready_path: Option<OutgoingPath>,
        inner_done: bool,
    ) -> Self {
        ResponseBody {
            inner: MaybeBoxed::Boxed { body },
            buffered,
            buffered_err,
            ending,
            ready_path,
            inner_done,
            done: false,
        }
    }
}

impl<B: Body> MaybeBoxed<B> {
    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> PollFrame<B::Data, B::Error> {
        match self.project() {
            MaybeBoxedProj::Plain { body } => body.poll_frame(cx),
            MaybeBoxedProj::Boxed { body } => body.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            MaybeBoxed::Plain { body } => body.is_end_stream(),
            MaybeBoxed::Boxed { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            MaybeBoxed::Plain { body } => body.size_hint(),
            MaybeBoxed::Boxed { body } => body.size_hint(),
        }
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
        if *this.done {
            return Poll::Ready(None);
        }
        if let Some(frame) = this.buffered.pop_front() {
            first_message(this.ending, this.ready_path, &frame);
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(err) = this.buffered_err.take() {
            // The stream failed: the root ends here, there is no trailer to
            // carry a path.
            drop(this.ending.take().map(|e| e.finish()));
            return Poll::Ready(Some(Err(err)));
        }
        if *this.inner_done {
            *this.done = true;
            return Poll::Ready(None);
        }
        let polled = {
            // The stream is produced as it is polled: that is the root's work.
            let _entered = this.ending.as_ref().map(|e| e.span().clone().entered());
            ready!(this.inner.poll_frame(cx))
        };
        match polled {
            Some(Ok(frame)) => {
                if !frame.is_trailers() {
                    first_message(this.ending, this.ready_path, &frame);
                    return Poll::Ready(Some(Ok(frame)));
                }
                let mut trailers = frame
                    .into_trailers()
                    .unwrap_or_else(|_| unreachable!("checked is_trailers"));
                if let Some(value) = take_path(this.ending, this.ready_path) {
                    value.insert_into(&mut trailers);
                }
                *this.done = true;
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Some(Err(err)) => {
                drop(this.ending.take().map(|e| e.finish()));
                Poll::Ready(Some(Err(err)))
            }
            None => {
                *this.done = true;
                match take_path(this.ending, this.ready_path) {
                    Some(value) => {
                        let mut trailers = HeaderMap::with_capacity(2);
                        value.insert_into(&mut trailers);
                        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
                    }
                    None => Poll::Ready(None),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
            || (self.buffered.is_empty()
                && self.buffered_err.is_none()
                && self.ending.is_none()
                && self.ready_path.is_none()
                && (self.inner_done || self.inner.is_end_stream()))
    }

    fn size_hint(&self) -> SizeHint {
        let buffered: u64 = self
            .buffered
            .iter()
            .filter_map(|f| f.data_ref())
            .map(|d| d.remaining() as u64)
            .sum();
        if self.inner_done {
            return SizeHint::with_exact(buffered);
        }
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(buffered));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(buffered));
        }
        hint
    }
}

impl<B: Body> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("buffered_frames", &self.buffered.len())
            .field("traced", &self.ending.is_some())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// With [`StreamEnd::FirstMessage`](super::StreamEnd), the first data frame
/// ends the root; its path waits for the trailers.
fn first_message<D>(
    ending: &mut Option<Box<Ending>>,
    ready_path: &mut Option<OutgoingPath>,
    frame: &Frame<D>,
) {
    if frame.is_data() && ending.as_ref().is_some_and(|e| e.at_first_message()) {
        *ready_path = ending.take().and_then(|e| e.finish());
    }
}

fn take_path(
    ending: &mut Option<Box<Ending>>,
    ready_path: &mut Option<OutgoingPath>,
) -> Option<OutgoingPath> {
    match ending.take() {
        Some(e) => e.finish(),
        None => ready_path.take(),
    }
}
