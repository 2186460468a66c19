//! Tower middleware for tonic and http that carries critical path tracing
//! across services (CPT "Propagation and merging" and "Triggering").
//!
//! A service author adds one layer to each server and one to each client:
//!
//! - [`ServerLayer`] ([`ServerLayer::grpc`] for
//!   `tonic::transport::Server::builder().layer(...)`, [`ServerLayer::http`]
//!   for axum / hyper) makes each request a root node named after its gRPC
//!   method or HTTP route, decides its trigger, and returns its critical path
//!   to trusted callers that asked (headers for complete responses, trailers
//!   for streams). When the service is the request's entry point the SDK
//!   emits the record.
//! - [`ClientLayer`] ([`ClientLayer::grpc`] over a tonic `Channel`,
//!   [`ClientLayer::http`] over a hyper-util client) makes each call of a
//!   traced request an RPC node, propagates the trigger, and splices the
//!   callee's returned path into the RPC node: network/undercount, overcount
//!   and blind spots are accounted, never errors.
//!
//! ```
//! use std::convert::Infallible;
//! use cpt_middleware::{ClientLayer, ServerLayer};
//! use tower::ServiceBuilder;
//!
//! type Body = String;
//! // Around a server (tonic: `Server::builder().layer(..)`; axum: `Router::layer(..)`):
//! // an internal service, configured from CPT_TRUST_SECRET and CPT_FORCE_KEY.
//! let server = ServiceBuilder::new()
//!     .layer(ServerLayer::grpc("inventory").internal().with_default_env())
//!     .service_fn(|_req: http::Request<Body>| async {
//!         Ok::<_, Infallible>(http::Response::new(Body::new()))
//!     });
//! // Around a client (a tonic `Channel`, a hyper-util client): calls to "inventory".
//! let client = ServiceBuilder::new()
//!     .layer(ClientLayer::grpc("inventory").with_default_env())
//!     .service_fn(|_req: http::Request<Body>| async {
//!         Ok::<_, Infallible>(http::Response::new(Body::new()))
//!     });
//! # let _ = (server, client);
//! ```
//!
//! The repository's `examples/quickstart` is a complete service with both.
//!
//! # Trust and triggering
//!
//! Each entry service samples independently and propagates its decision in
//! [`header::TRIGGER`]; an [internal](ServerLayer::internal) service
//! ([`Role::Internal`]) never samples on its own. A callee honours that trigger, and returns its path,
//! only to callers its [`TrustPolicy`] accepts (default: none;
//! [`SharedSecret`], [`PeerAllowList`], closures). Operators force a trace
//! with [`header::FORCE`] and a credential checked by [`ForceAuth`] (an
//! HMAC-SHA256 over the request id, the service, an expiry and a nonce,
//! compared in constant time, accepted once); an invalid, expired,
//! foreign-service or replayed one is ignored and counted by [`Rejection`]
//! in [`Stats`].
//!
//! # Streams
//!
//! A streaming response's segment ends at its last message (CPT's
//! definition), or at its first with [`StreamEnd::FirstMessage`]; its path
//! travels in the trailers. See [`server`] for how complete and streaming
//! responses are told apart.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `tonic` | yes | peer address from tonic's `TcpConnectInfo` for [`PeerAllowList`] |
//! | `axum` | no | peer address from axum's `ConnectInfo`, root nodes named after `MatchedPath` (else a [`Route`] extension, else `METHOD /first-segment/*`) |
//! | `opentelemetry` | no | `otel::TriggerPropagator` and `HeaderMap` carriers |
//! | `reqwest` | no | `ReqwestMiddleware`: a `reqwest_middleware::Middleware` doing what [`ClientLayer`] does, for reqwest calls |
//! | `actix-web` | no | `ActixServer`: actix-web middleware doing what [`ServerLayer::http`] does, root nodes named after the matched route pattern |
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::borrow::Cow;

#[cfg(feature = "actix-web")]
pub mod actix;
pub mod client;
mod credential;
mod glue;
pub mod header;
#[cfg(feature = "opentelemetry")]
pub mod otel;
mod replay;
#[cfg(feature = "reqwest")]
pub mod reqwest;
mod route;
pub mod server;
mod stats;
mod trust;

#[cfg(feature = "actix-web")]
pub use actix::ActixServer;
pub use client::{Client, ClientLayer};
pub use credential::{ForceAuth, Rejection};
pub use replay::REPLAY_CACHE_CAPACITY;
#[cfg(feature = "reqwest")]
pub use reqwest::ReqwestMiddleware;
pub use route::Route;
pub use server::{ROOT_LABEL, Role, Server, ServerLayer, StreamEnd};
pub use stats::Stats;
pub use trust::{
    Caller, DefaultTrust, LoopbackPeers, Or, PeerAllowList, SharedSecret, TrustPolicy,
};

/// Which protocol a layer speaks: how nodes are named and paths carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Grpc,
    Http,
}

impl Protocol {
    /// The default root node name: the gRPC method path, or `METHOD route`
    /// with axum's `MatchedPath`, a [`Route`] extension, or the bounded
    /// default as the route (see [`Route`]).
    pub(crate) fn endpoint<'a>(self, caller: &Caller<'a>) -> Cow<'a, str> {
        match self {
            Protocol::Grpc => Cow::Borrowed(caller.uri.path()),
            Protocol::Http => {
                #[cfg(feature = "axum")]
                if let Some(route) = caller.extensions.get::<axum::extract::MatchedPath>() {
                    return Cow::Owned(route::concat(&[
                        caller.method.as_str(),
                        " ",
                        route.as_str(),
                    ]));
                }
                Cow::Owned(route::http_name(
                    caller.method,
                    caller.uri,
                    caller.extensions,
                ))
            }
        }
    }
}
