//! The order of a reqwest-middleware chain around [`ReqwestMiddleware`]
//! and the calls it makes: what the middleware can see of the others, and
//! the warnings (once per middleware, target `cpt_middleware`) when what it
//! sees loses paths.
//!
//! - **reqwest-tracing outside.** `TracingMiddleware` opens its span
//!   (named `HTTP request`, with an `otel.kind` field) and runs the rest of
//!   the chain inside it. Its span ends with the response headers, the RPC
//!   node with the body: when that span is the current span as this
//!   middleware starts, the RPC node is its child, outlives it, and the
//!   callee's whole path becomes unattributed time on the `HTTP request`
//!   frame.
//! - **A retry inside.** `reqwest::Request::try_clone` clones the request's
//!   extensions, and a retry middleware clones the request once per
//!   attempt. The middleware puts an [`AttemptProbe`] in the request it
//!   passes on; a probe cloned twice or more means the request was sent
//!   more than once inside one RPC node: the failed attempts and the waits
//!   between them are then the last attempt's network time.
//! - **Several callees.** Each middleware names one callee; calls of one
//!   middleware to two different hosts are warned about (replicas of one
//!   service reached by address look the same: the warning says so).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

/// The order that keeps every path, for the warnings.
pub(crate) const ORDER: &str = "ClientBuilder::new(client).with(RetryTransientMiddleware::…)\
     .with(ReqwestMiddleware::…).with(TracingMiddleware::default()): the retry outermost, then \
     cpt, then reqwest-tracing (ClientBuilder::with adds middleware from the outside in)";

/// What one middleware has seen of its chain and warned about.
#[derive(Debug, Default)]
pub(crate) struct OrderChecks {
    tracing_outside: AtomicBool,
    retry_inside: AtomicBool,
    /// `host:port` of the first traced call.
    first_host: OnceLock<String>,
    several_hosts: AtomicBool,
}

/// Whether reqwest-tracing's span is the current span (its middleware runs
/// before this one).
fn in_reqwest_tracing_span() -> bool {
    tracing::Span::current()
        .metadata()
        .is_some_and(|m| m.name() == "HTTP request" && m.fields().field("otel.kind").is_some())
}

impl OrderChecks {
    /// Before the call: reqwest-tracing outside, and the call's host.
    pub(crate) fn before(&self, callee: &str, url: &::reqwest::Url) {
        if !self.tracing_outside.load(Relaxed)
            && in_reqwest_tracing_span()
            && !self.tracing_outside.swap(true, Relaxed)
        {
            tracing::warn!(
                target: "cpt_middleware",
                callee = %callee,
                "cpt: reqwest-tracing's TracingMiddleware runs before (outside) cpt's \
                 ReqwestMiddleware for calls to {}: its `HTTP request` span ends with the \
                 response headers, before cpt's RPC node ends with the body, so the path of {} \
                 is lost as [unattributed] time on that span. Build the client as {ORDER}",
                callee,
                callee,
            );
        }
        if self.several_hosts.load(Relaxed) {
            return;
        }
        let host = url.host_str().unwrap_or("");
        let port = url.port_or_known_default().unwrap_or(0);
        let first = self.first_host.get_or_init(|| format!("{host}:{port}"));
        let same = first
            .rsplit_once(':')
            .is_some_and(|(h, p)| h == host && p.parse() == Ok(port));
        if !same && !self.several_hosts.swap(true, Relaxed) {
            tracing::warn!(
                target: "cpt_middleware",
                callee = %callee,
                "cpt: one ReqwestMiddleware named {} calls {first} and {host}:{port}: every \
                 call through it is an RPC node named {} and a [blind spot] of it names {}. \
                 A client that calls several services needs one ClientWithMiddleware (one \
                 ReqwestMiddleware) per callee; if these are replicas of {} reached by \
                 address, nothing is wrong",
                callee,
                callee,
                callee,
                callee,
            );
        }
    }

    /// After the call: how often the request was sent inside this node.
    pub(crate) fn after(&self, callee: &str, probe: &AttemptProbe) {
        let sent = probe.clones();
        if sent >= 2 && !self.retry_inside.swap(true, Relaxed) {
            tracing::warn!(
                target: "cpt_middleware",
                callee = %callee,
                "cpt: a call to {} was sent {sent} times inside one cpt RPC node: a retry \
                 middleware (reqwest-retry's RetryTransientMiddleware) runs after (inside) \
                 cpt's ReqwestMiddleware, so the failed attempts and the waits between them \
                 show as [network] time of the last attempt. Build the client as {ORDER}",
                callee,
            );
        }
    }

    /// Whether a probe is still worth its cost (no retry seen yet).
    pub(crate) fn probing(&self) -> bool {
        !self.retry_inside.load(Relaxed)
    }
}

/// Put in the extensions of the request this middleware passes on; counts
/// its clones (see the module docs).
#[derive(Debug)]
pub(crate) struct AttemptProbe(Arc<AtomicU32>);

impl AttemptProbe {
    pub(crate) fn new() -> Self {
        AttemptProbe(Arc::new(AtomicU32::new(0)))
    }

    fn clones(&self) -> u32 {
        self.0.load(Relaxed)
    }
}

impl Clone for AttemptProbe {
    fn clone(&self) -> Self {
        self.0.fetch_add(1, Relaxed);
        AttemptProbe(self.0.clone())
    }
}

/// `req` with `probe` in its extensions (reqwest keeps them private: the
/// request goes through `http::Request` and back). A URL that does not come
/// back unchanged from `http::Uri` (one with a fragment, say) is left
/// unprobed, so both conversions are known to succeed.
pub(crate) fn with_probe(req: ::reqwest::Request, probe: &AttemptProbe) -> ::reqwest::Request {
    let round_trips =
        http::Uri::try_from(req.url().as_str()).is_ok_and(|uri| uri == *req.url().as_str());
    if !round_trips {
        return req;
    }
    let Ok(mut http_req) = http::Request::<::reqwest::Body>::try_from(req) else {
        unreachable!("the URL was checked to be a valid http::Uri; this is a bug")
    };
    http_req
        .extensions_mut()
        .insert(AttemptProbe(probe.0.clone()));
    ::reqwest::Request::try_from(http_req)
        .unwrap_or_else(|_| unreachable!("the URL's own text parses as a Url; this is a bug"))
}
