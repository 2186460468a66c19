//! The Figure 1 system traced the way a Rust service author does it without
//! cpt: `tracing` spans exported through `tracing-opentelemetry`, W3C
//! `traceparent` propagated through the same tonic and HTTP clients and
//! servers ([`Config::otel`](crate::system::Config::otel)).
//!
//! [`OtelServerLayer`] extracts the caller's context, opens a server span
//! (`otel.kind = "server"`) parented to it and keeps it entered while the
//! handler and the response body (a gRPC stream) are polled, as tower-http's
//! `TraceLayer` does. [`OtelClientLayer`] opens a client span for each call
//! and injects its context as `traceparent`. Both are pass-throughs when
//! disabled, so one service type serves every configuration of the `fig1`
//! bench.

use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tower::{Layer, Service};
use tracing::Instrument;
use tracing::instrument::Instrumented;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use cpt_middleware::otel::{HeaderExtractor, HeaderInjector};

/// Server side: extract `traceparent`, open a server span under it.
#[derive(Clone, Copy, Debug)]
pub struct OtelServerLayer {
    enabled: bool,
}

impl OtelServerLayer {
    /// A layer that traces when `enabled`, else passes requests through.
    pub fn new(enabled: bool) -> Self {
        OtelServerLayer { enabled }
    }
}

impl<S> Layer<S> for OtelServerLayer {
    type Service = OtelServer<S>;

    fn layer(&self, inner: S) -> OtelServer<S> {
        OtelServer {
            inner,
            enabled: self.enabled,
        }
    }
}

/// The service [`OtelServerLayer`] makes.
#[derive(Clone, Debug)]
pub struct OtelServer<S> {
    inner: S,
    enabled: bool,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for OtelServer<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    type Response = Response<SpanBody<ResB>>;
    type Error = S::Error;
    type Future = ServerFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        if !self.enabled {
            return ServerFuture {
                inner: self.inner.call(req),
                span: tracing::Span::none(),
            };
        }
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(req.headers()));
        let span = tracing::info_span!(
            "rpc.server",
            otel.name = %req.uri().path(),
            otel.kind = "server",
        );
        // An error means the span is disabled (filtered out): nothing to parent.
        let _ = span.set_parent(parent);
        let inner = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        ServerFuture { inner, span }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`OtelServer`]: polled inside the server span,
    /// which then moves into the response body.
    pub struct ServerFuture<F> {
        #[pin]
        inner: F,
        span: tracing::Span,
    }
}

impl<F, B, E> Future for ServerFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<SpanBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = {
            let _entered = this.span.enter();
            std::task::ready!(this.inner.poll(cx))?
        };
        let span = std::mem::replace(this.span, tracing::Span::none());
        Poll::Ready(Ok(response.map(|inner| SpanBody { inner, span })))
    }
}

pin_project_lite::pin_project! {
    /// A response body polled inside the server span; the span ends with
    /// the body (the end of a gRPC stream).
    pub struct SpanBody<B> {
        #[pin]
        inner: B,
        span: tracing::Span,
    }
}

impl<B: http_body::Body> http_body::Body for SpanBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let _entered = this.span.enter();
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Client side: a client span per call, injected as `traceparent`.
#[derive(Clone, Copy, Debug)]
pub struct OtelClientLayer {
    enabled: bool,
}

impl OtelClientLayer {
    /// A layer that traces when `enabled`, else passes requests through.
    pub fn new(enabled: bool) -> Self {
        OtelClientLayer { enabled }
    }
}

impl<S> Layer<S> for OtelClientLayer {
    type Service = OtelClient<S>;

    fn layer(&self, inner: S) -> OtelClient<S> {
        OtelClient {
            inner,
            enabled: self.enabled,
        }
    }
}

/// The service [`OtelClientLayer`] makes.
#[derive(Clone, Debug)]
pub struct OtelClient<S> {
    inner: S,
    enabled: bool,
}

impl<S, ReqB> Service<Request<ReqB>> for OtelClient<S>
where
    S: Service<Request<ReqB>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Instrumented<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        if !self.enabled {
            return self.inner.call(req).instrument(tracing::Span::none());
        }
        let span = tracing::info_span!(
            "rpc.client",
            otel.name = %req.uri().path(),
            otel.kind = "client",
        );
        TraceContextPropagator::new()
            .inject_context(&span.context(), &mut HeaderInjector(req.headers_mut()));
        let fut = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        fut.instrument(span)
    }
}
