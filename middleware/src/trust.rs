//! [`TrustPolicy`]: which callers a server honours a propagated trigger from
//! and returns critical paths to.
//!
//! A critical path reveals internal topology and timing, so the default
//! ([`DefaultTrust`]) trusts no caller: every request is sampled by the
//! service itself and nothing is returned. Configure trust with a
//! [`SharedSecret`] (callers send it in [`header::CALLER_AUTH`]), a
//! [`PeerAllowList`] of addresses, a closure, or a combination
//! ([`TrustPolicy::or`]).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::{Extensions, HeaderMap, Method, Uri};
use subtle::ConstantTimeEq;

use crate::header;

/// What a [`TrustPolicy`] sees of an incoming request.
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The request URI (for gRPC, the path is `/package.Service/Method`).
    pub uri: &'a Uri,
    /// The request headers (gRPC metadata).
    pub headers: &'a HeaderMap,
    /// The request extensions (connection info, TLS peer certificates, …).
    pub extensions: &'a Extensions,
}

impl Caller<'_> {
    /// The caller's address, when the server put one in the request
    /// extensions: a plain [`SocketAddr`], tonic's `TcpConnectInfo` (feature
    /// `tonic`) or axum's `ConnectInfo<SocketAddr>` (feature `axum`).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        if let Some(addr) = self.extensions.get::<SocketAddr>() {
            return Some(*addr);
        }
        #[cfg(feature = "tonic")]
        if let Some(info) = self
            .extensions
            .get::<tonic::transport::server::TcpConnectInfo>()
            && let Some(addr) = info.remote_addr()
        {
            return Some(addr);
        }
        #[cfg(feature = "axum")]
        if let Some(info) = self
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            return Some(info.0);
        }
        None
    }
}

/// Decides whether a caller is trusted.
///
/// A trusted caller's propagated trigger is honoured (the callee traces the
/// request because the caller does) and, when it asks, it receives the
/// callee's critical path. An untrusted caller gets neither: the service
/// samples for itself and returns nothing.
///
/// Implemented for closures `Fn(&Caller<'_>) -> bool` and for `()` (trusts no
/// one).
pub trait TrustPolicy: Send + Sync + 'static {
    /// Whether this caller is trusted.
    fn is_trusted(&self, caller: &Caller<'_>) -> bool;

    /// Trust a caller either policy trusts.
    fn or<P: TrustPolicy>(self, other: P) -> Or<Self, P>
    where
        Self: Sized,
    {
        Or(self, other)
    }
}

/// The default policy: trusts no caller.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultTrust;

impl TrustPolicy for DefaultTrust {
    fn is_trusted(&self, _: &Caller<'_>) -> bool {
        false
    }
}

impl TrustPolicy for () {
    fn is_trusted(&self, _: &Caller<'_>) -> bool {
        false
    }
}

impl<F> TrustPolicy for F
where
    F: Fn(&Caller<'_>) -> bool + Send + Sync + 'static,
{
    fn is_trusted(&self, caller: &Caller<'_>) -> bool {
        self(caller)
    }
}

impl<P: TrustPolicy + ?Sized> TrustPolicy for Arc<P> {
    fn is_trusted(&self, caller: &Caller<'_>) -> bool {
        (**self).is_trusted(caller)
    }
}

impl TrustPolicy for Box<dyn TrustPolicy> {
    fn is_trusted(&self, caller: &Caller<'_>) -> bool {
        (**self).is_trusted(caller)
    }
}

/// Trusts callers either policy trusts ([`TrustPolicy::or`]).
#[derive(Clone, Copy, Debug)]
pub struct Or<A, B>(A, B);

impl<A: TrustPolicy, B: TrustPolicy> TrustPolicy for Or<A, B> {
    fn is_trusted(&self, caller: &Caller<'_>) -> bool {
        self.0.is_trusted(caller) || self.1.is_trusted(caller)
    }
}

/// Trusts callers that present a shared secret in [`header::CALLER_AUTH`]
/// (compared in constant time).
///
/// The client side sends it with `ClientLayer::with_caller_secret`. Send it
/// only over connections you would send the secret over (TLS, or a private
/// network).
#[derive(Clone)]
pub struct SharedSecret {
    secret: Arc<[u8]>,
}

impl SharedSecret {
    /// Trust callers presenting `secret`.
    ///
    /// # Panics
    ///
    /// If `secret` is empty (an empty secret would trust everyone who sends
    /// an empty header).
    pub fn new(secret: impl AsRef<[u8]>) -> Self {
        let secret = secret.as_ref();
        assert!(
            !secret.is_empty(),
            "SharedSecret::new: the secret must not be empty"
        );
        SharedSecret {
            secret: secret.into(),
        }
    }
}

impl fmt::Debug for SharedSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSecret").finish_non_exhaustive()
    }
}

impl TrustPolicy for SharedSecret {
    fn is_trusted(&self, caller: &Caller<'_>) -> bool {
        caller
            .headers
            .get(header::CALLER_AUTH)
            .is_some_and(|v| bool::from(v.as_bytes().ct_eq(&self.secret)))
    }
}

/// Trusts callers whose peer IP address is on a list (see
/// [`Caller::peer_addr`] for where the address comes from). Requests whose
/// peer address is unknown are not trusted.
#[derive(Clone, Debug, Default)]
pub struct PeerAllowList {
    ips: Arc<[IpAddr]>,
}

impl PeerAllowList {
    /// Trust exactly these addresses.
    pub fn new(ips: impl IntoIterator<Item = IpAddr>) -> Self {
        PeerAllowList {
            ips: ips.into_iter().collect(),
        }
    }

    /// Trust the loopback addresses (`127.0.0.0/8`, `::1`).
    pub fn loopback() -> LoopbackPeers {
        LoopbackPeers
    }
}

impl TrustPolicy for PeerAllowList {
    fn is_trusted(&self, caller: &Caller<'_>) -> bool {
        caller.peer_addr().is_some_and(|a| {
            let ip = a.ip().to_canonical();
            self.ips.iter().any(|allowed| allowed.to_canonical() == ip)
        })
    }
}

/// Trusts callers connecting from a loopback address ([`PeerAllowList::loopback`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct LoopbackPeers;

impl TrustPolicy for LoopbackPeers {
    fn is_trusted(&self, caller: &Caller<'_>) -> bool {
        caller
            .peer_addr()
            .is_some_and(|a| a.ip().to_canonical().is_loopback())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller_with<'a>(headers: &'a HeaderMap, ext: &'a Extensions, uri: &'a Uri) -> Caller<'a> {
        Caller {
            method: &Method::POST,
            uri,
            headers,
            extensions: ext,
        }
    }

    #[test]
    fn default_trusts_no_one() {
        let (h, e, u) = (HeaderMap::new(), Extensions::new(), Uri::from_static("/a"));
        let c = caller_with(&h, &e, &u);
        assert!(!DefaultTrust.is_trusted(&c));
        assert!(!().is_trusted(&c));
        assert!((|_: &Caller<'_>| true).is_trusted(&c));
    }

    #[test]
    fn shared_secret_checks_header() {
        let p = SharedSecret::new("s3cret");
        let (e, u) = (Extensions::new(), Uri::from_static("/a"));
        let mut h = HeaderMap::new();
        assert!(!p.is_trusted(&caller_with(&h, &e, &u)));
        h.insert(header::CALLER_AUTH, "wrong!".parse().unwrap());
        assert!(!p.is_trusted(&caller_with(&h, &e, &u)));
        h.insert(header::CALLER_AUTH, "s3cret".parse().unwrap());
        assert!(p.is_trusted(&caller_with(&h, &e, &u)));
    }

    #[test]
    fn allow_list_checks_peer() {
        let p = PeerAllowList::new(["10.0.0.1".parse().unwrap()]);
        let (h, u) = (HeaderMap::new(), Uri::from_static("/a"));
        let mut e = Extensions::new();
        assert!(!p.is_trusted(&caller_with(&h, &e, &u)), "unknown peer");
        e.insert(SocketAddr::from(([10, 0, 0, 2], 5)));
        assert!(!p.is_trusted(&caller_with(&h, &e, &u)));
        e.insert(SocketAddr::from(([10, 0, 0, 1], 5)));
        assert!(p.is_trusted(&caller_with(&h, &e, &u)));
        assert!(!PeerAllowList::loopback().is_trusted(&caller_with(&h, &e, &u)));
        let or = PeerAllowList::loopback().or(p);
        assert!(or.is_trusted(&caller_with(&h, &e, &u)));
    }
}
