//! reqwest: [`ReqwestMiddleware`], a [`reqwest_middleware::Middleware`]
//! that does for a reqwest call what [`ClientLayer`] does for a tower
//! client (feature `reqwest`).
//!
//! When the current request is traced, each call that passes through it
//!
//! 1. is an RPC node (a child of the current node), named after the callee
//!    and `METHOD route`: a [`Route`] given with
//!    `RequestBuilder::with_extension` (reqwest-middleware's extensions),
//!    else the bounded default
//!    (`GET /items/*` for `/items/42`), or the layer's
//!    [`with_name_fn`](ClientLayer::with_name_fn);
//! 2. carries the trigger, `x-cpt-want-path` and, if configured, the caller
//!    secret;
//! 3. merges the callee's returned path (headers, or trailers of a streamed
//!    body) when the response body ends, fails or is dropped, as the tower
//!    client does: a body read with `bytes()`, `text()`, `json()` or
//!    `bytes_stream()` keeps the node open until its last chunk. No path, a
//!    malformed, oversized or untrusted one, or a failed call (connection
//!    refused, timeout) is one blind-spot leaf naming the callee: counted in
//!    [`Stats`] and warned about, never an error of the call.
//!
//! Untraced calls pass through with one lookup of the current trigger.
//!
//! # Composing
//!
//! The order of `ClientBuilder::with` is the order the middleware runs in,
//! outermost first. Put `ReqwestMiddleware` after `reqwest-retry`'s
//! `RetryTransientMiddleware`, so that each attempt is an RPC node of its
//! own and the wait between attempts is the caller's, on its path; and
//! before `reqwest-tracing`'s `TracingMiddleware`, so that its span is
//! inside the RPC node (its span ends with the response headers, the node
//! with the body: the other way round, the node would outlive its parent).
//! The middleware warns once (`WARN`, target `cpt_middleware`), naming this
//! order, when it finds reqwest-tracing's span around it or the request sent
//! more than once below it.
//!
//! A middleware names one callee. A client that calls several services
//! builds one chain per callee (sharing one `reqwest::Client` if it likes);
//! one chain that calls two hosts is warned about once.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use cpt_middleware::{ClientLayer, ReqwestMiddleware, Route};
//!
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     // configured as a ClientLayer: CPT_TRUST_SECRET is the caller secret
//!     .with(ReqwestMiddleware::from(ClientLayer::http("inventory").with_default_env()))
//!     .build();
//! let stock = client
//!     .get("http://inventory:8080/items/42")
//!     .with_extension(Route::new("/items/{id}")) // node `inventory GET /items/{id}`
//!     .send()
//!     .await?
//!     .text()
//!     .await?;
//! # let _ = stock; Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;

use http::Extensions;
use reqwest_middleware::{Middleware, Next};
use tracing::Instrument as _;

pub(crate) mod order;

use self::order::AttemptProbe;
use crate::ClientLayer;
use crate::client::{ClientConfig, PendingCallee, Resolver, ResponseBody};
use crate::glue;
use crate::route::{self, Route};
use crate::stats::Stats;

/// A [`reqwest_middleware::Middleware`] that makes each call of a traced
/// request an RPC node and merges the callee's critical path into it; see
/// the [module docs](self).
///
/// Made from a [`ClientLayer`] (its configuration: caller secret, naming
/// function, path size limit, environment), with which it shares its
/// [`stats`](ReqwestMiddleware::stats).
#[derive(Clone)]
pub struct ReqwestMiddleware {
    config: Arc<ClientConfig>,
}

impl ReqwestMiddleware {
    /// Calls to the service named `callee`, configured from the `CPT_*`
    /// environment variables: `ClientLayer::http(callee).with_default_env()`.
    ///
    /// # Panics
    ///
    /// When a `CPT_*` variable is malformed (see
    /// [`ClientLayer::with_default_env`]).
    pub fn new(callee: impl Into<Arc<str>>) -> Self {
        ClientLayer::http(callee).with_default_env().into()
    }

    /// What this middleware merged or dropped so far (shared with the
    /// [`ClientLayer`] it was made from).
    pub fn stats(&self) -> Stats {
        self.config.counters.snapshot()
    }
}

impl From<ClientLayer> for ReqwestMiddleware {
    /// The middleware of this layer's configuration; warns, as the layer
    /// does when it wraps a service, when no caller secret is set.
    fn from(layer: ClientLayer) -> Self {
        let config = layer.config().clone();
        config.check();
        ReqwestMiddleware { config }
    }
}

impl fmt::Debug for ReqwestMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReqwestMiddleware")
            .field("callee", &self.config.callee)
            .field("max_path_bytes", &self.config.max_path_bytes)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl Middleware for ReqwestMiddleware {
    async fn handle(
        &self,
        mut req: ::reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<::reqwest::Response> {
        let Some(trigger) = cpt_sdk::request::current_trigger() else {
            return next.run(req, extensions).await;
        };
        let config = &self.config;
        config.insert_headers(trigger, req.headers_mut());
        let name = match &config.name {
            Some(f) => {
                let uri = http::Uri::try_from(req.url().as_str()).unwrap_or_default();
                f(req.method(), &uri)
            }
            None => {
                route::http_name_of_path(req.method(), req.url().path(), extensions.get::<Route>())
            }
        };
        config.order.before(&config.callee, req.url());
        let probe = config.order.probing().then(AttemptProbe::new);
        if let Some(probe) = &probe {
            req = order::with_probe(req, probe);
        }
        let rpc = glue::begin_rpc(&config.callee, &name);
        // Resolves the node as a blind spot if this future is dropped
        // before the response (the caller's own timeout).
        let mut pending = Resolver(Some(PendingCallee::new(rpc.clone(), config.clone())));
        let result = next.run(req, extensions).instrument(rpc).await;
        if let Some(probe) = &probe {
            config.order.after(&config.callee, probe);
        }
        let response = match result {
            Ok(response) => response,
            Err(err) => {
                // The call failed (refused, timed out, …): the whole RPC is
                // a blind spot, and its time stays on the path.
                pending.resolve(None);
                return Err(err);
            }
        };
        Ok(with_callee_body(response, pending))
    }
}

/// The response with the path taken out of its headers and its body
/// wrapped so that the RPC node ends when the body ends (the tower client's
/// [`ResponseBody`]). What `reqwest::Response` keeps beside its
/// `http::Response` (the final URL) is carried over.
fn with_callee_body(response: ::reqwest::Response, mut pending: Resolver) -> ::reqwest::Response {
    use ::reqwest::ResponseBuilderExt as _;
    let url = response.url().clone();
    let (mut parts, body) = http::Response::<::reqwest::Body>::from(response).into_parts();
    if let Some(pending) = pending.0.as_mut() {
        pending.take_header_path(&mut parts.headers);
    }
    if let Ok(marker) = http::Response::builder().url(url).body(()) {
        parts.extensions.extend(marker.into_parts().0.extensions);
    }
    let body = ::reqwest::Body::wrap(ResponseBody::new(body, pending));
    ::reqwest::Response::from(http::Response::from_parts(parts, body))
}
