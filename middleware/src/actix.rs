//! actix-web: [`ActixServer`], middleware that does for an actix-web
//! service what [`ServerLayer::http`] does for axum (feature `actix-web`).
//!
//! Wrap an `App` (or a scope) with it. For every request it decides the
//! trigger as [`ServerLayer`] does (a trusted caller's propagated trigger,
//! else an operator's `x-cpt-force` checked by [`ForceAuth`], else, for an
//! entry service only, its sampler), makes the root node, named
//! `METHOD pattern` after the route the request matched
//! (`GET /items/{id}`; the bounded default `GET /items/*` when none did),
//! runs the service inside it, and ends the root when the response is ready:
//!
//! - a response whose size is known (a `String`, `Bytes`, JSON, an empty
//!   body: what handlers return) ends the root when the handler returns,
//!   and the path goes to a trusted caller that asked in the response
//!   headers, as for axum;
//! - a streaming response (`HttpResponse::streaming`) ends the root at its
//!   last chunk (CPT's definition of a stream's segment). actix-web sends no
//!   trailers, so its path cannot be returned: a caller that asked sees the
//!   call as a blind spot, and the response says why in
//!   [`header::NO_PATH`] (`no-trailers`), so the
//!   caller's warning names this cause; the path is counted in
//!   [`Stats::path_unsent`], not in `paths_returned`. An entry service's
//!   record covers the whole stream.
//!
//! actix-web runs each worker on a single-threaded runtime and its services
//! and futures are not `Send`: this middleware needs neither. Untraced
//! requests cost two header lookups (and, for an entry service, the
//! sampler); the headers are copied into `http` 1 types (actix-web is built
//! on `http` 0.2) only for a request that carries a trigger or a force
//! header, or that is traced.
//!
//! ```no_run
//! use actix_web::{App, HttpServer, web};
//! use cpt_middleware::{ActixServer, ServerLayer};
//!
//! # async fn f() -> std::io::Result<()> {
//! HttpServer::new(|| {
//!     App::new()
//!         // an internal service: CPT_TRUST_SECRET, CPT_FORCE_KEY
//!         .wrap(ActixServer::from(ServerLayer::http("pricing").internal().with_default_env()))
//!         .route("/prices/{item}", web::get().to(|| async { "42" }))
//! })
//! .bind(("127.0.0.1", 8080))?
//! .run()
//! .await
//! # }
//! ```
//!
//! [`ForceAuth`]: crate::ForceAuth

use std::borrow::Cow;
use std::fmt;
use std::future::{Future, Ready, ready};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use actix_web::body::{BodySize, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::header::{HeaderName as ActixName, HeaderValue as ActixValue};
use bytes::Bytes;
use pin_project_lite::pin_project;

use crate::glue::PathHeaders;
use crate::server::{self, Decision, Ending, ServerConfig};
use crate::stats::Stats;
use crate::trust::Caller;
use crate::{ServerLayer, header, route};

/// actix-web middleware making each request a critical-path root node and
/// returning its path to trusted callers; see the [module docs](self).
///
/// Made from a [`ServerLayer`] (`ServerLayer::http(service)` and its
/// configuration: role, trust, force credentials, sampler, naming and label
/// functions, environment), with which it shares its
/// [`stats`](ActixServer::stats).
#[derive(Clone)]
pub struct ActixServer {
    config: Arc<ServerConfig>,
}

impl ActixServer {
    /// What this middleware ignored or withheld so far (shared with the
    /// [`ServerLayer`] it was made from).
    pub fn stats(&self) -> Stats {
        self.config.counters.snapshot()
    }
}

impl From<ServerLayer> for ActixServer {
    /// The middleware of this layer's configuration; warns, as the layer
    /// does when it wraps a service, when an internal service trusts no
    /// caller.
    fn from(layer: ServerLayer) -> Self {
        let config = layer.config().clone();
        config.check();
        ActixServer { config }
    }
}

impl fmt::Debug for ActixServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActixServer")
            .field("service", &self.config.service)
            .field("role", &self.config.role)
            .finish_non_exhaustive()
    }
}

impl<S, B> Transform<S, ServiceRequest> for ActixServer
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    type Response = ServiceResponse<RootBody<B>>;
    type Error = actix_web::Error;
    type Transform = ActixService<S>;
    type InitError = ();
    type Future = Ready<Result<ActixService<S>, ()>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(ActixService {
            service,
            config: self.config.clone(),
        }))
    }
}

/// The service [`ActixServer`] wraps each actix service in.
pub struct ActixService<S> {
    service: S,
    config: Arc<ServerConfig>,
}

impl<S> fmt::Debug for ActixService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActixService")
            .field("service", &self.config.service)
            .finish_non_exhaustive()
    }
}

/// A request's parts in `http` 1 types, for the [`Caller`] the trust
/// policy, the force check and the naming and label functions see.
struct Parts {
    method: http::Method,
    uri: http::Uri,
    headers: http::HeaderMap,
    extensions: http::Extensions,
}

impl Parts {
    fn of(req: &ServiceRequest) -> Parts {
        let mut headers = http::HeaderMap::with_capacity(req.headers().len());
        for (name, value) in req.headers() {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name.as_str().as_bytes()),
                http::HeaderValue::from_bytes(value.as_bytes()),
            ) {
                headers.append(name, value);
            }
        }
        let mut extensions = http::Extensions::new();
        if let Some(peer) = req.peer_addr() {
            extensions.insert::<SocketAddr>(peer);
        }
        Parts {
            method: http::Method::from_bytes(req.method().as_str().as_bytes()).unwrap_or_default(),
            uri: req.uri().to_string().parse().unwrap_or_default(),
            headers,
            extensions,
        }
    }

    fn caller(&self) -> Caller<'_> {
        Caller {
            method: &self.method,
            uri: &self.uri,
            headers: &self.headers,
            extensions: &self.extensions,
        }
    }
}

impl<S, B> Service<ServiceRequest> for ActixService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    type Response = ServiceResponse<RootBody<B>>;
    type Error = actix_web::Error;
    type Future = ResponseFuture<S::Future>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let config = &self.config;
        let marked = req.headers().contains_key(header::TRIGGER.as_str())
            || req.headers().contains_key(header::FORCE.as_str());
        let (decision, parts) = if marked {
            let parts = Parts::of(&req);
            (server::decide(config, &parts.caller()), Some(parts))
        } else {
            (server::decide_unmarked(config, req.path()), None)
        };
        let Some(decision) = decision else {
            return ResponseFuture {
                inner: self.service.call(req),
                ending: None,
            };
        };
        let parts = parts.unwrap_or_else(|| Parts::of(&req));
        let ending = begin(config, decision, &req, &parts);
        let inner = {
            let _entered = ending.span().enter();
            self.service.call(req)
        };
        ResponseFuture {
            inner,
            ending: Some(ending),
        }
    }
}

/// The root node, named after the layer's function, else the matched
/// route's pattern, else the bounded default.
fn begin(
    config: &Arc<ServerConfig>,
    decision: Decision,
    req: &ServiceRequest,
    parts: &Parts,
) -> Box<Ending> {
    let caller = parts.caller();
    let endpoint: Cow<'_, str> = match (&config.endpoint, req.match_pattern()) {
        (Some(f), _) => Cow::Owned(f(&caller)),
        (None, Some(pattern)) => Cow::Owned(route::concat(&[req.method().as_str(), " ", &pattern])),
        (None, None) => Cow::Owned(route::http_name_of_path(&parts.method, req.path(), None)),
    };
    server::begin(config, decision, &caller, &endpoint)
}

pin_project! {
    /// Response future of an [`ActixService`]: polls the service inside the
    /// request's root node; ends the root when the response is complete,
    /// else hands it to the [`RootBody`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        ending: Option<Box<Ending>>,
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("traced", &self.ending.is_some())
            .finish_non_exhaustive()
    }
}

impl<F, B> Future for ResponseFuture<F>
where
    F: Future<Output = Result<ServiceResponse<B>, actix_web::Error>>,
    B: MessageBody,
{
    type Output = Result<ServiceResponse<RootBody<B>>, actix_web::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = {
            let _entered = this.ending.as_ref().map(|e| e.span().enter());
            ready!(this.inner.poll(cx))
        };
        let Some(ending) = this.ending.take() else {
            return Poll::Ready(result.map(|res| res.map_body(|_, body| RootBody::plain(body))));
        };
        let mut res = match result {
            Ok(res) => res,
            Err(err) => {
                drop(ending.finish());
                return Poll::Ready(Err(err));
            }
        };
        if matches!(res.response().body().size(), BodySize::Stream) {
            let mut ending = ending;
            if ending.returns_path() {
                // No trailers in actix-web: the path has nowhere to go. Say
                // so to the caller, whose blind spot then names the cause.
                ending.cannot_return_path();
                res.headers_mut().insert(
                    ActixName::from_static(header::NO_PATH_NAME),
                    ActixValue::from_static(header::NO_PATH_NO_TRAILERS),
                );
            }
            return Poll::Ready(Ok(res.map_body(|_, body| RootBody {
                inner: body,
                ending: Finisher(Some(ending)),
            })));
        }
        if let Some(path) = ending.finish() {
            insert_path(res.headers_mut(), path.send());
        }
        Poll::Ready(Ok(res.map_body(|_, body| RootBody::plain(body))))
    }
}

/// The path's headers in actix-web's (`http` 0.2) header map.
fn insert_path(headers: &mut actix_web::http::header::HeaderMap, path: PathHeaders) {
    let mut put = |name: &'static str, value: &http::HeaderValue| {
        if let Ok(mut v) = ActixValue::from_bytes(value.as_bytes()) {
            v.set_sensitive(value.is_sensitive());
            headers.insert(ActixName::from_static(name), v);
        }
    };
    if let Some(frames) = &path.frames {
        put(header::FRAMES_NAME, frames);
    }
    put(header::PATH_NAME, &path.path);
}

/// Ends a streaming response's root when the body ends, fails, or is
/// dropped unfinished (the client went away).
struct Finisher(Option<Box<Ending>>);

impl Finisher {
    fn finish(&mut self) {
        if let Some(ending) = self.0.take() {
            // No trailers in actix-web: a path asked for was given up when
            // the response's headers went (`cannot_return_path`).
            drop(ending.finish());
        }
    }
}

impl Drop for Finisher {
    fn drop(&mut self) {
        self.finish();
    }
}

pin_project! {
    /// Response body of an [`ActixService`]: the service's body, unchanged;
    /// for a traced streaming response, polled inside the root node, which
    /// ends at its last chunk.
    pub struct RootBody<B> {
        #[pin]
        inner: B,
        ending: Finisher,
    }
}

impl<B> RootBody<B> {
    fn plain(inner: B) -> Self {
        RootBody {
            inner,
            ending: Finisher(None),
        }
    }
}

impl<B> fmt::Debug for RootBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RootBody")
            .field("traced", &self.ending.0.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: MessageBody> MessageBody for RootBody<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.inner.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.project();
        let Some(ending) = this.ending.0.as_ref() else {
            return this.inner.poll_next(cx);
        };
        let polled = {
            // The stream is produced as it is polled: that is the root's work.
            let _entered = ending.span().enter();
            ready!(this.inner.poll_next(cx))
        };
        if !matches!(polled, Some(Ok(_))) {
            this.ending.finish();
        }
        Poll::Ready(polled)
    }

    fn try_into_bytes(self) -> Result<Bytes, Self> {
        if self.ending.0.is_some() {
            return Err(self);
        }
        let RootBody { inner, ending } = self;
        inner
            .try_into_bytes()
            .map_err(|inner| RootBody { inner, ending })
    }
}
