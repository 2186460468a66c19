//! The client side: [`ClientLayer`] and [`Client`].
//!
//! When the current request is traced, the client
//!
//! 1. makes the RPC node (a child of the current node, named after the callee
//!    and method) and runs the call inside it;
//! 2. sends the trigger, asks for the callee's path (`x-cpt-want-path`) and,
//!    if configured, the caller secret;
//! 3. reads the path from the response headers or trailers when the response
//!    body ends (or is dropped), decodes it and attaches it to the RPC node,
//!    whose end the SDK splices it into: callee segments under the RPC frame,
//!    a network segment for what the caller saw beyond the callee's total, an
//!    overcount clamped away, or, when no usable path came back (none, failed
//!    to decode, over the size limit, or the call failed), one blind-spot leaf
//!    naming the callee.
//!
//! A bad or missing path never fails or delays the call: it only becomes
//! accounting. Untraced calls are passed through with one lookup of the
//! current trigger and no metadata.

mod body;
mod future;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};

use cpt_sdk::env::{CptEnv, EnvError};
use http::{HeaderValue, Request, Response};
use tower_layer::Layer;
use tower_service::Service;

#[cfg(feature = "reqwest")]
pub(crate) use body::Resolver;
pub use body::ResponseBody;
pub use future::ResponseFuture;

use crate::glue;
use crate::stats::{Counters, Stats};
use crate::{Protocol, header};

type NameFn = dyn Fn(&http::Method, &http::Uri) -> String + Send + Sync;

pub(crate) struct ClientConfig {
    pub(crate) callee: Arc<str>,
    pub(crate) name: Option<Arc<NameFn>>,
    pub(crate) protocol: Protocol,
    pub(crate) caller_secret: Option<HeaderValue>,
    pub(crate) max_path_bytes: usize,
    pub(crate) counters: Arc<Counters>,
    /// What a `ReqwestMiddleware` saw of its chain's order.
    #[cfg(feature = "reqwest")]
    pub(crate) order: crate::reqwest::order::OrderChecks,
}

impl ClientConfig {
    /// Warn, once per layer, that calls send no caller secret.
    pub(crate) fn check(&self) {
        if self.caller_secret.is_none() && !self.counters.checked_config.swap(true, Relaxed) {
            tracing::warn!(
                target: "cpt_middleware",
                callee = %self.callee,
                "cpt: calls to {} send no caller secret (CPT_TRUST_SECRET is not set and \
                 ClientLayer::with_caller_secret was not called): {} returns its critical path \
                 only if its trust policy admits this process by address, else each call is a \
                 [blind spot] in this service's records",
                self.callee,
                self.callee,
            );
        }
    }

    /// Ask the callee for its path: the trigger, the codec version this side
    /// reads, the caller secret, and (HTTP) that trailers are accepted.
    pub(crate) fn insert_headers(&self, trigger: cpt_sdk::Trigger, headers: &mut http::HeaderMap) {
        headers.insert(header::TRIGGER, HeaderValue::from_static(trigger.as_str()));
        headers.insert(header::WANT_PATH, glue::codec_version_header());
        if let Some(secret) = &self.caller_secret {
            headers.insert(header::CALLER_AUTH, secret.clone());
        }
        if self.protocol == Protocol::Http {
            // HTTP/1.1 servers send trailers (a streamed path) only to
            // clients that accept them.
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
    }

    /// A copy to configure on its own: the same settings, fresh counters (a
    /// layer configured after cloning is a layer of its own).
    fn detached(&self) -> ClientConfig {
        ClientConfig {
            callee: self.callee.clone(),
            name: self.name.clone(),
            protocol: self.protocol,
            caller_secret: self.caller_secret.clone(),
            max_path_bytes: self.max_path_bytes,
            counters: Counters::new(),
            #[cfg(feature = "reqwest")]
            order: Default::default(),
        }
    }
}

/// A tower [`Layer`] that makes each outbound call an RPC node of the current
/// traced request and merges the callee's critical path into it.
///
/// # Examples
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use cpt_middleware::ClientLayer;
/// let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051")
///     .connect()
///     .await?;
/// let channel = tower::ServiceBuilder::new()
///     .layer(ClientLayer::grpc("B").with_caller_secret("callers-secret"))
///     .service(channel);
/// // let client = my_proto::b_client::BClient::new(channel);
/// # let _ = channel; Ok(()) }
/// ```
///
/// # Cloning
///
/// Clones share their configuration and [`stats`](ClientLayer::stats).
/// Configuring a clone (any `with_*`) gives that clone a configuration and
/// counters of its own; the layer it was cloned from, and the services made
/// before, are unchanged.
#[derive(Clone)]
pub struct ClientLayer {
    config: Arc<ClientConfig>,
}

impl ClientLayer {
    /// A layer for gRPC calls (a tonic `Channel`) to the service named
    /// `callee`; RPC nodes are named `callee` + the method path.
    pub fn grpc(callee: impl Into<Arc<str>>) -> Self {
        Self::new(callee.into(), Protocol::Grpc)
    }

    /// A layer for HTTP calls (a hyper-util client) to the service named
    /// `callee`; RPC nodes are named `callee` + `METHOD route`, the route
    /// being a [`Route`](crate::Route) in the request extensions, else the
    /// path's first segment (`GET /items/*` for `/items/42`).
    pub fn http(callee: impl Into<Arc<str>>) -> Self {
        Self::new(callee.into(), Protocol::Http)
    }

    fn new(callee: Arc<str>, protocol: Protocol) -> Self {
        ClientLayer {
            config: Arc::new(ClientConfig {
                callee,
                name: None,
                protocol,
                caller_secret: None,
                max_path_bytes: glue::DEFAULT_DECODE_MAX_BYTES,
                counters: Counters::new(),
                #[cfg(feature = "reqwest")]
                order: Default::default(),
            }),
        }
    }

    /// The configuration to change: this layer's own (copied first when
    /// clones or services share it, see "Cloning").
    fn config_mut(&mut self) -> &mut ClientConfig {
        if Arc::get_mut(&mut self.config).is_none() {
            self.config = Arc::new(self.config.detached());
        }
        Arc::get_mut(&mut self.config).unwrap_or_else(|| unreachable!("a fresh Arc is unique"))
    }

    /// Send this secret in [`header::CALLER_AUTH`] on traced calls, for a
    /// callee whose trust policy is a [`SharedSecret`](crate::SharedSecret).
    ///
    /// # Panics
    ///
    /// If the secret is not a valid header value.
    #[must_use]
    pub fn with_caller_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        let mut value = HeaderValue::from_bytes(secret.as_ref())
            .expect("with_caller_secret: the secret must be a valid header value");
        value.set_sensitive(true);
        self.config_mut().caller_secret = Some(value);
        self
    }

    /// Name RPC nodes `callee` + this function's result instead of the
    /// method path (gRPC) or `METHOD route` (HTTP). Return a bounded name
    /// (a route such as `GET /items/{id}`, never the raw path of
    /// `/items/42`): each distinct name is a frame of its own.
    #[must_use]
    pub fn with_name_fn(
        mut self,
        f: impl Fn(&http::Method, &http::Uri) -> String + Send + Sync + 'static,
    ) -> Self {
        self.config_mut().name = Some(Arc::new(f));
        self
    }

    /// Callee paths larger than this (wire bytes) are ignored and become a
    /// blind spot.
    #[must_use]
    pub fn with_max_path_bytes(mut self, max: usize) -> Self {
        self.config_mut().max_path_bytes = max;
        self
    }

    /// Configure from the `CPT_*` environment variables
    /// ([`cpt_sdk::env`]): `CPT_TRUST_SECRET` becomes the caller secret.
    /// Unset variables leave the layer as it is; settings made after this
    /// call win.
    ///
    /// # Panics
    ///
    /// With the [`EnvError`]'s message when a variable is malformed; use
    /// [`try_with_default_env`](ClientLayer::try_with_default_env) to handle
    /// the error.
    #[must_use]
    pub fn with_default_env(self) -> Self {
        self.try_with_default_env()
            .unwrap_or_else(|e| panic!("cpt configuration from the environment: {e}"))
    }

    /// [`with_default_env`](ClientLayer::with_default_env), returning the
    /// error.
    ///
    /// # Errors
    ///
    /// A malformed `CPT_*` variable ([`CptEnv::from_env`]).
    pub fn try_with_default_env(self) -> Result<Self, EnvError> {
        Ok(self.with_env(&CptEnv::from_env()?))
    }

    /// Apply what `env` configures (see
    /// [`with_default_env`](ClientLayer::with_default_env)).
    #[must_use]
    pub fn with_env(self, env: &CptEnv) -> Self {
        match &env.trust_secret {
            // `CptEnv` admits visible ASCII only, a valid header value.
            Some(secret) => self.with_caller_secret(secret),
            None => self,
        }
    }

    /// What this layer's services merged or dropped so far.
    pub fn stats(&self) -> Stats {
        self.config.counters.snapshot()
    }

    /// The configuration, shared with what is made from this layer.
    #[cfg_attr(not(feature = "reqwest"), allow(dead_code))]
    pub(crate) fn config(&self) -> &Arc<ClientConfig> {
        &self.config
    }
}

impl fmt::Debug for ClientLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientLayer")
            .field("callee", &self.config.callee)
            .field("protocol", &self.config.protocol)
            .field("max_path_bytes", &self.config.max_path_bytes)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ClientLayer {
    type Service = Client<S>;

    fn layer(&self, inner: S) -> Self::Service {
        self.config.check();
        Client {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`ClientLayer`] makes.
#[derive(Clone)]
pub struct Client<S> {
    inner: S,
    config: Arc<ClientConfig>,
}

impl<S> Client<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming the wrapper.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for Client<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("inner", &self.inner)
            .field("callee", &self.config.callee)
            .finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Client<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: http_body::Body,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let Some(trigger) = cpt_sdk::request::current_trigger() else {
            return ResponseFuture::untraced(self.inner.call(req));
        };
        let config = &self.config;
        config.insert_headers(trigger, req.headers_mut());
        let rpc = match (&config.name, config.protocol) {
            (Some(f), _) => glue::begin_rpc(&config.callee, &f(req.method(), req.uri())),
            // The gRPC method path, borrowed: no copy of it before the name.
            (None, Protocol::Grpc) => glue::begin_rpc(&config.callee, req.uri().path()),
            (None, Protocol::Http) => glue::begin_rpc(
                &config.callee,
                &crate::route::http_name(req.method(), req.uri(), req.extensions()),
            ),
        };
        let fut = {
            let _entered = rpc.enter();
            self.inner.call(req)
        };
        ResponseFuture::traced(fut, PendingCallee::new(rpc, config.clone()))
    }
}

/// A traced call's open RPC node, until the callee's path is known.
pub(crate) struct PendingCallee {
    rpc: tracing::Span,
    config: Arc<ClientConfig>,
    header_path: Option<glue::PathHeaders>,
    /// The callee's [`header::NO_PATH`]: why it could not return its path.
    no_path: Option<HeaderValue>,
}

impl PendingCallee {
    pub(crate) fn new(rpc: tracing::Span, config: Arc<ClientConfig>) -> Box<Self> {
        Box::new(PendingCallee {
            rpc,
            config,
            header_path: None,
            no_path: None,
        })
    }

    fn span(&self) -> &tracing::Span {
        &self.rpc
    }

    /// Take the path out of the response headers (the application does not
    /// see it); the trailers' path, if any, wins over it.
    pub(crate) fn take_header_path(&mut self, headers: &mut http::HeaderMap) {
        self.header_path = glue::PathHeaders::take_from(headers);
        self.no_path = headers.remove(header::NO_PATH);
    }

    /// Attach what the callee returned (the trailer's path, else the
    /// header's, else a blind spot) and end the RPC node.
    pub(crate) fn resolve(self, trailer_path: Option<glue::PathHeaders>) {
        let config = &self.config;
        let value = trailer_path.or(self.header_path);
        let outcome = match value {
            None => {
                Counters::bump(&config.counters.callee_path_missing);
                let no_trailers = self
                    .no_path
                    .as_ref()
                    .is_some_and(|v| v == header::NO_PATH_NO_TRAILERS);
                if no_trailers {
                    if let Some(unsaid) = config.counters.missing.due() {
                        tracing::warn!(
                            target: "cpt_middleware",
                            callee = %config.callee,
                            "cpt: {} trusts this caller but could not return its critical path                              for a traced call{}: it streamed its response from a server that                              sends no trailers (actix-web's HttpResponse::streaming), and the                              path goes in the trailers of a stream. The call shows as                              [blind spot] in the record; a sized body (what handlers return)                              carries the path in its headers",
                            config.callee,
                            crate::stats::more(unsaid),
                        );
                    }
                } else if let Some(unsaid) = config.counters.missing.due() {
                    tracing::warn!(
                        target: "cpt_middleware",
                        callee = %config.callee,
                        "cpt: {} returned no critical path for a traced call{}; it shows as \
                         [blind spot] in the record. Check that {} runs cpt's ServerLayer and \
                         trusts this caller (the same CPT_TRUST_SECRET on both sides{})",
                        config.callee,
                        crate::stats::more(unsaid),
                        config.callee,
                        if config.caller_secret.is_none() {
                            "; this client sends none"
                        } else {
                            ""
                        },
                    );
                }
                None
            }
            Some(value) => match glue::decode_header(&value, config.max_path_bytes) {
                Ok(path) => {
                    Counters::bump(&config.counters.callee_path_merged);
                    Some(path)
                }
                Err(err) => {
                    config.counters.callee_invalid(err.is_oversize(), &err);
                    None
                }
            },
        };
        glue::set_callee(&self.rpc, &config.callee, outcome);
        // Dropping the span (the last handle) ends the RPC node.
    }
}
