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
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response};
use tower_layer::Layer;
use tower_service::Service;

pub use body::ResponseBody;
pub use future::ResponseFuture;

use crate::glue;
use crate::stats::{Counters, Stats};
use crate::{Protocol, header};

type NameFn = dyn Fn(&http::Method, &http::Uri) -> String + Send + Sync;

pub(crate) struct ClientConfig {
    pub(crate) callee: Arc<str>,
    pub(crate) name: Option<Box<NameFn>>,
    pub(crate) protocol: Protocol,
    pub(crate) caller_secret: Option<HeaderValue>,
    pub(crate) max_path_bytes: usize,
    pub(crate) counters: Arc<Counters>,
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
    /// `callee`; RPC nodes are named `callee` + `METHOD path`.
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
            }),
        }
    }

    fn config_mut(&mut self) -> &mut ClientConfig {
        Arc::get_mut(&mut self.config)
            .expect("configure a ClientLayer before cloning it or making services")
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
    /// method path (gRPC) or `METHOD path` (HTTP). Use it for HTTP paths
    /// that carry ids (`/items/42`), so that frames name routes
    /// (`GET /items/{id}`) rather than one frame per id.
    #[must_use]
    pub fn with_name_fn(
        mut self,
        f: impl Fn(&http::Method, &http::Uri) -> String + Send + Sync + 'static,
    ) -> Self {
        self.config_mut().name = Some(Box::new(f));
        self
    }

    /// Callee paths larger than this (wire bytes) are ignored and become a
    /// blind spot.
    #[must_use]
    pub fn with_max_path_bytes(mut self, max: usize) -> Self {
        self.config_mut().max_path_bytes = max;
        self
    }

    /// What this layer's services merged or dropped so far.
    pub fn stats(&self) -> Stats {
        self.config.counters.snapshot()
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
        let Some(trigger) = glue::current_trigger() else {
            return ResponseFuture::untraced(self.inner.call(req));
        };
        let config = &self.config;
        let headers = req.headers_mut();
        headers.insert(header::TRIGGER, HeaderValue::from_static(trigger.as_str()));
        headers.insert(header::WANT_PATH, glue::codec_version_header());
        if let Some(secret) = &config.caller_secret {
            headers.insert(header::CALLER_AUTH, secret.clone());
        }
        if config.protocol == Protocol::Http {
            // HTTP/1.1 servers send trailers (a streamed path) only to
            // clients that accept them.
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
        let method = match (&config.name, config.protocol) {
            (Some(f), _) => f(req.method(), req.uri()),
            (None, Protocol::Grpc) => req.uri().path().to_owned(),
            (None, Protocol::Http) => format!("{} {}", req.method(), req.uri().path()),
        };
        let rpc = glue::begin_rpc(&config.callee, &method);
        let fut = {
            let _entered = rpc.enter();
            self.inner.call(req)
        };
        ResponseFuture::traced(
            fut,
            Box::new(PendingCallee {
                rpc,
                config: config.clone(),
                header_path: None,
            }),
        )
    }
}

/// A traced call's open RPC node, until the callee's path is known.
pub(crate) struct PendingCallee {
    rpc: tracing::Span,
    config: Arc<ClientConfig>,
    header_path: Option<HeaderValue>,
}

impl PendingCallee {
    fn span(&self) -> &tracing::Span {
        &self.rpc
    }

    /// Attach what the callee returned (the trailer's path, else the
    /// header's, else a blind spot) and end the RPC node.
    fn resolve(self, trailer_path: Option<HeaderValue>) {
        let config = &self.config;
        let value = trailer_path.or(self.header_path);
        let outcome = match value {
            None => {
                Counters::bump(&config.counters.callee_path_missing);
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
