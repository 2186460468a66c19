//! The server side: [`ServerLayer`] and [`Server`].
//!
//! For every request the server
//!
//! 1. decides the trigger: a trusted caller's propagated trigger, else an
//!    operator's `x-cpt-force` with a valid credential ([`ForceAuth`]), else,
//!    for an [`Entry`](Role::Entry) service only, its own sampler
//!    ([`Role`]). Untraced requests pay for a header lookup and the sampler,
//!    and nothing after that;
//! 2. makes the request's root node, named after the gRPC method or HTTP
//!    route, and runs the inner service inside it;
//! 3. ends the root when the response is ready and, if a trusted caller asked
//!    for it, returns the path: in the response headers when the whole body
//!    was ready with the headers (unary calls, full HTTP bodies, trailers-only
//!    gRPC errors), else in the trailers, with the root ending at the
//!    stream's last message ([`StreamEnd`]);
//! 4. when this service is the request's entry point (no trusted caller asked
//!    for the path), the SDK emits the record through its sink, with the W3C
//!    trace id from `traceparent` when present and the label [`ROOT_LABEL`]
//!    saying whether it is an entry root.
//!
//! # How "the whole body was ready" is decided
//!
//! When the inner service's future resolves, the server polls the response
//! body (in the same task, without waiting) for up to
//! [`EAGER_FRAMES`] frames. If the body ends (or yields its trailers) within
//! them, the response is complete: the root ends now and the path goes into
//! the headers; the frames are replayed unchanged. If the body is still
//! pending, the response streams: the root ends with the stream. This needs no
//! per-method configuration and matches tonic, whose unary responses are
//! ready with their headers while streaming ones are produced as the body is
//! polled.

mod body;
mod future;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use cpt_sdk::env::{CptEnv, EnvError};
use cpt_sdk::trigger::Sampler;
use cpt_sdk::{Labels, Trigger};
use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

pub use body::ResponseBody;
pub use future::ResponseFuture;

use crate::credential::ForceAuth;
use crate::glue;
use crate::stats::{Counters, Stats};
use crate::trust::{Caller, DefaultTrust, SharedSecret, TrustPolicy};
use crate::{Protocol, header};

/// How many body frames the server polls ahead to tell a complete response
/// from a streaming one.
pub const EAGER_FRAMES: usize = 16;

/// Where a streaming response's root node ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamEnd {
    /// At the stream's last message (CPT's definition): the callee's segment
    /// covers producing the whole stream. The default.
    #[default]
    LastMessage,
    /// At the stream's first message: the segment measures time to first
    /// response; the path still travels in the trailers.
    FirstMessage,
}

/// Whether a service starts traces of its own.
///
/// A process has one `CriticalPathLayer` and so, by default, one sampler for
/// all its services. A backend that samples the untraced calls it receives
/// emits root records of its own, and a profile of every record then mixes
/// backend roots into the entry requests. Mark backends
/// [`Internal`](Role::Internal): they trace a request only when a trusted
/// caller propagated its trigger or an operator forced it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// Samples the requests that arrive without a trusted trigger (the
    /// layer's sampler, else the `CriticalPathLayer`'s). The default: the
    /// service users call.
    #[default]
    Entry,
    /// Never samples on its own: traces only a trusted caller's propagated
    /// trigger or a valid `x-cpt-force`. For services only other services
    /// call.
    Internal,
}

impl Role {
    /// `"entry"` or `"internal"`, as in the [`ROOT_LABEL`] label.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Entry => "entry",
            Role::Internal => "internal",
        }
    }
}

/// The label every record a [`ServerLayer`] emits carries: `entry` when the
/// service is an [`Entry`](Role::Entry) service and started the trace itself
/// (its sampler or an operator's force), so the record covers the whole
/// request as its users saw it; `internal` otherwise (an
/// [`Internal`](Role::Internal) service forced directly, or a trusted caller
/// propagated its trigger without asking for the path). Select entry records
/// with `--label cpt.root=entry`.
pub const ROOT_LABEL: &str = "cpt.root";

type EndpointFn = dyn Fn(&Caller<'_>) -> String + Send + Sync;
type LabelsFn = dyn Fn(&Caller<'_>) -> Labels + Send + Sync;

pub(crate) struct ServerConfig {
    pub(crate) service: Arc<str>,
    pub(crate) protocol: Protocol,
    pub(crate) role: Role,
    pub(crate) trust: Arc<dyn TrustPolicy>,
    /// Whether a trust policy was given (else [`DefaultTrust`]).
    pub(crate) trust_given: bool,
    pub(crate) force: ForceAuth,
    pub(crate) sampler: glue::SharedSampler,
    pub(crate) stream_end: StreamEnd,
    pub(crate) max_path_bytes: usize,
    pub(crate) endpoint: Option<Arc<EndpointFn>>,
    pub(crate) labels: Option<Arc<LabelsFn>>,
    pub(crate) counters: Arc<Counters>,
}

impl ServerConfig {
    /// Warn, once per layer, that an internal service trusts no caller.
    pub(crate) fn check(&self) {
        if self.role == Role::Internal
            && !self.trust_given
            && !self.counters.checked_config.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                target: "cpt_middleware",
                service = %self.service,
                "cpt: internal service {} trusts no caller (CPT_TRUST_SECRET is not set and \
                 ServerLayer::with_trust was not called): it never follows its callers' traces \
                 nor returns its critical path, so its callers' records show it as \
                 [blind spot]; it is traced only when an operator forces a request",
                self.service,
            );
        }
    }

    /// A copy to configure on its own: the same settings, fresh counters (a
    /// layer configured after cloning is a layer of its own).
    fn detached(&self) -> ServerConfig {
        ServerConfig {
            service: self.service.clone(),
            protocol: self.protocol,
            role: self.role,
            trust: self.trust.clone(),
            trust_given: self.trust_given,
            force: self.force.clone(),
            sampler: self.sampler.clone(),
            stream_end: self.stream_end,
            max_path_bytes: self.max_path_bytes,
            endpoint: self.endpoint.clone(),
            labels: self.labels.clone(),
            counters: Counters::new(),
        }
    }
}

/// A tower [`Layer`] that makes each request a critical-path root node and
/// returns its path to trusted callers.
///
/// # Examples
///
/// ```no_run
/// use cpt_middleware::{ForceAuth, ServerLayer, SharedSecret};
/// let layer = ServerLayer::grpc("B")
///     .with_trust(SharedSecret::new("callers-secret"))
///     .with_force_auth(ForceAuth::none().hmac_key("ops-key"));
/// // tonic::transport::Server::builder().layer(layer).add_service(...)
/// # let _ = layer;
/// ```
///
/// # Cloning
///
/// Clones share their configuration and [`stats`](ServerLayer::stats)
/// (tonic's `Server::builder().layer(..)` clones the layer it is given).
/// Configuring a clone (any `with_*`) gives that clone a configuration and
/// counters of its own; the layer it was cloned from, and the services made
/// before, are unchanged.
#[derive(Clone)]
pub struct ServerLayer {
    config: Arc<ServerConfig>,
}

impl ServerLayer {
    /// A layer for a tonic (gRPC) server of service `service`: root nodes are
    /// named after the gRPC method path (`/package.Service/Method`).
    pub fn grpc(service: impl Into<Arc<str>>) -> Self {
        Self::new(service.into(), Protocol::Grpc)
    }

    /// A layer for an HTTP server (axum, hyper) of service `service`: root
    /// nodes are named `METHOD route`, with axum's `MatchedPath` as the route
    /// when present (feature `axum`), else a [`Route`](crate::Route) in the
    /// request extensions, else the path's first segment (`GET /items/*`
    /// for `/items/42`, so that ids never become frames).
    pub fn http(service: impl Into<Arc<str>>) -> Self {
        Self::new(service.into(), Protocol::Http)
    }

    fn new(service: Arc<str>, protocol: Protocol) -> Self {
        ServerLayer {
            config: Arc::new(ServerConfig {
                service,
                protocol,
                role: Role::Entry,
                trust: Arc::new(DefaultTrust),
                trust_given: false,
                force: ForceAuth::none(),
                sampler: None,
                stream_end: StreamEnd::default(),
                max_path_bytes: glue::DEFAULT_ENCODE_MAX_BYTES,
                endpoint: None,
                labels: None,
                counters: Counters::new(),
            }),
        }
    }

    /// The configuration to change: this layer's own (copied first when
    /// clones or services share it, see "Cloning").
    fn config_mut(&mut self) -> &mut ServerConfig {
        if Arc::get_mut(&mut self.config).is_none() {
            self.config = Arc::new(self.config.detached());
        }
        Arc::get_mut(&mut self.config).unwrap_or_else(|| unreachable!("a fresh Arc is unique"))
    }

    /// Whether this service starts traces on its own (default:
    /// [`Role::Entry`]); see [`Role`].
    #[must_use]
    pub fn with_role(mut self, role: Role) -> Self {
        self.config_mut().role = role;
        self
    }

    /// Make this an internal service ([`Role::Internal`]): it never samples
    /// on its own, and traces a request only when a trusted caller
    /// propagated its trigger or an operator forced it. Use it for every
    /// service that only other services call.
    #[must_use]
    pub fn internal(self) -> Self {
        self.with_role(Role::Internal)
    }

    /// Which callers are trusted (default: none, [`DefaultTrust`]).
    #[must_use]
    pub fn with_trust(mut self, trust: impl TrustPolicy) -> Self {
        let config = self.config_mut();
        config.trust = Arc::new(trust);
        config.trust_given = true;
        self
    }

    /// Which `x-cpt-force` credentials are accepted (default: none).
    #[must_use]
    pub fn with_force_auth(mut self, force: ForceAuth) -> Self {
        self.config_mut().force = force;
        self
    }

    /// The sampler deciding requests that arrive without a trusted trigger
    /// (default: the installed `CriticalPathLayer`'s sampler). Each service
    /// in a process can sample at its own rate this way. An
    /// [`internal`](ServerLayer::internal) service consults no sampler.
    #[must_use]
    pub fn with_sampler(mut self, sampler: impl Sampler) -> Self {
        self.config_mut().sampler = Some(Arc::new(sampler));
        self
    }

    /// Where a streaming response's segment ends (default: last message).
    #[must_use]
    pub fn with_stream_end(mut self, end: StreamEnd) -> Self {
        self.config_mut().stream_end = end;
        self
    }

    /// The size limit of a returned path in wire bytes; larger paths are
    /// coarsened and marked truncated by the codec.
    #[must_use]
    pub fn with_max_path_bytes(mut self, max: usize) -> Self {
        self.config_mut().max_path_bytes = max;
        self
    }

    /// Name root nodes with this function instead of the method / route.
    #[must_use]
    pub fn with_endpoint_fn(
        mut self,
        f: impl Fn(&Caller<'_>) -> String + Send + Sync + 'static,
    ) -> Self {
        self.config_mut().endpoint = Some(Arc::new(f));
        self
    }

    /// Label traced requests (A/B arm, region, …); called only for traced
    /// requests.
    #[must_use]
    pub fn on_labels(mut self, f: impl Fn(&Caller<'_>) -> Labels + Send + Sync + 'static) -> Self {
        self.config_mut().labels = Some(Arc::new(f));
        self
    }

    /// Configure from the `CPT_*` environment variables
    /// ([`cpt_sdk::env`]): `CPT_SAMPLE_RATE` / `CPT_SAMPLE_MAX_PER_SECOND`
    /// set the sampler, `CPT_TRUST_SECRET` the trust policy (a
    /// [`SharedSecret`]), `CPT_FORCE_KEY` / `CPT_FORCE_KEY_FILE` add an
    /// accepted force key, `CPT_STATE_DIR` journals the force credentials
    /// accepted there ([`ForceAuth::with_replay_state_dir`]) so that a
    /// restart accepts none of them again. Unset variables leave the layer as it is;
    /// settings made after this call win.
    ///
    /// # Panics
    ///
    /// With the [`EnvError`]'s message (variable, value, what was expected)
    /// when a variable is malformed: a misconfigured service should not
    /// start. Use [`try_with_default_env`](ServerLayer::try_with_default_env)
    /// to handle the error.
    #[must_use]
    pub fn with_default_env(self) -> Self {
        self.try_with_default_env()
            .unwrap_or_else(|e| panic!("cpt configuration from the environment: {e}"))
    }

    /// [`with_default_env`](ServerLayer::with_default_env), returning the
    /// error.
    ///
    /// # Errors
    ///
    /// A malformed `CPT_*` variable ([`CptEnv::from_env`]).
    pub fn try_with_default_env(self) -> Result<Self, EnvError> {
        Ok(self.with_env(&CptEnv::from_env()?))
    }

    /// Apply what `env` configures (see
    /// [`with_default_env`](ServerLayer::with_default_env)).
    #[must_use]
    pub fn with_env(mut self, env: &CptEnv) -> Self {
        if let Some(sampler) = env.sampler() {
            self = self.with_sampler(sampler);
        }
        if let Some(secret) = &env.trust_secret {
            self = self.with_trust(SharedSecret::new(secret));
        }
        if let Some(key) = &env.force_key {
            let force = self.config.force.clone().hmac_key(key);
            self = self.with_force_auth(force);
        }
        if let Some(dir) = &env.state_dir {
            let force = self.config.force.clone().with_replay_state_dir(dir);
            self = self.with_force_auth(force);
        }
        self
    }

    /// What this layer's services ignored or withheld so far.
    pub fn stats(&self) -> Stats {
        self.config.counters.snapshot()
    }

    /// The configuration, shared with what is made from this layer.
    #[cfg_attr(not(feature = "actix-web"), allow(dead_code))]
    pub(crate) fn config(&self) -> &Arc<ServerConfig> {
        &self.config
    }
}

impl fmt::Debug for ServerLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerLayer")
            .field("service", &self.config.service)
            .field("protocol", &self.config.protocol)
            .field("role", &self.config.role)
            .field("force", &self.config.force)
            .field("stream_end", &self.config.stream_end)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ServerLayer {
    type Service = Server<S>;

    fn layer(&self, inner: S) -> Self::Service {
        self.config.check();
        Server {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`ServerLayer`] makes.
#[derive(Clone)]
pub struct Server<S> {
    inner: S,
    config: Arc<ServerConfig>,
}

impl<S> Server<S> {
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

impl<S: fmt::Debug> fmt::Debug for Server<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("inner", &self.inner)
            .field("service", &self.config.service)
            .finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Server<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: http_body::Body,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let config = &self.config;
        let caller = caller_of(&req);
        let Some(decision) = decide(config, &caller) else {
            return ResponseFuture::untraced(self.inner.call(req));
        };
        // Borrowed from the request when it is the gRPC method path.
        let endpoint = match &config.endpoint {
            Some(f) => Cow::Owned(f(&caller)),
            None => config.protocol.endpoint(&caller),
        };
        let ending = begin(config, decision, &caller, &endpoint);
        let fut = {
            let _entered = ending.span().enter();
            self.inner.call(req)
        };
        ResponseFuture::traced(fut, ending)
    }
}

/// Make a traced request's root node (its labels, request id and trace id
/// from the caller's request), named `endpoint`.
pub(crate) fn begin(
    config: &Arc<ServerConfig>,
    decision: Decision,
    caller: &Caller<'_>,
    endpoint: &str,
) -> Box<Ending> {
    let mut labels = config
        .labels
        .as_ref()
        .map(|f| f(caller))
        .unwrap_or_default();
    if !decision.return_path {
        let root = if decision.started_here && config.role == Role::Entry {
            Role::Entry
        } else {
            Role::Internal
        };
        labels.insert(ROOT_LABEL.to_owned(), root.as_str().to_owned());
    }
    if let Some(nonce) = decision.force_nonce {
        labels.insert(cpt_sdk::force::NONCE_LABEL.to_owned(), nonce);
    }
    // A hop that returns its path emits no record, so nothing reads its
    // request id: generate one only for a request that is recorded here.
    let request_id = (!decision.return_path).then(|| {
        caller
            .headers
            .get(header::REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .map_or_else(glue::new_request_id, str::to_owned)
    });
    let trace_id = caller
        .headers
        .get(header::TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .and_then(header::trace_id_from_traceparent)
        .map(str::to_owned);
    let root = glue::begin_root(glue::RootOptions {
        service: config.service.clone(),
        endpoint,
        trigger: decision.trigger,
        request_id,
        trace_id,
        labels,
        emit_record: !decision.return_path,
    });
    Box::new(Ending {
        root,
        config: config.clone(),
        return_path: decision.return_path,
        path_version: decision.path_version,
    })
}

/// Whether and how a request is traced.
pub(crate) struct Decision {
    trigger: Trigger,
    return_path: bool,
    /// The codec version to return the path in.
    path_version: u32,
    /// This service started the trace (its sampler or a force), rather than
    /// continuing a trusted caller's.
    started_here: bool,
    /// The nonce of the credential that forced it, for the record's
    /// [`cpt_sdk::force::NONCE_LABEL`].
    force_nonce: Option<String>,
}

fn caller_of<B>(req: &Request<B>) -> Caller<'_> {
    Caller {
        method: req.method(),
        uri: req.uri(),
        headers: req.headers(),
        extensions: req.extensions(),
    }
}

impl Decision {
    /// This service's own sampler said so.
    fn sampled_here(trigger: Trigger) -> Decision {
        Decision {
            trigger,
            return_path: false,
            path_version: codec_single(),
            started_here: true,
            force_nonce: None,
        }
    }
}

/// The decision for a request that carries neither a trigger nor a force
/// header: an entry service's sampler, else untraced. What [`decide`]
/// comes to for such a request, without a [`Caller`] to look at.
pub(crate) fn decide_unmarked(config: &ServerConfig, path: &str) -> Option<Decision> {
    if config.role == Role::Internal {
        return None;
    }
    glue::sample(&config.sampler, path).map(Decision::sampled_here)
}

/// The trigger decision (see the module docs); `None` is untraced.
pub(crate) fn decide(config: &ServerConfig, caller: &Caller<'_>) -> Option<Decision> {
    let headers = caller.headers;
    let propagated = headers.get(header::TRIGGER);
    let force = headers.get(header::FORCE);
    if propagated.is_some() || force.is_some() {
        if let Some(value) = propagated {
            let trigger = value.to_str().ok().and_then(Trigger::parse);
            if trigger.is_some() && config.trust.is_trusted(caller) {
                let want = headers.get(header::WANT_PATH);
                return trigger.map(|trigger| Decision {
                    trigger,
                    return_path: want.is_some(),
                    path_version: glue::answer_version(want),
                    started_here: false,
                    force_nonce: None,
                });
            }
            if trigger.is_some() {
                Counters::bump(&config.counters.trigger_untrusted);
                let wanted = headers.contains_key(header::WANT_PATH);
                if wanted {
                    Counters::bump(&config.counters.path_withheld);
                }
                if let Some(unsaid) = config.counters.untrusted.due() {
                    tracing::warn!(
                        target: "cpt_middleware",
                        service = %config.service,
                        "cpt: {} ignored the trace trigger of a caller it does not trust{}{}. \
                         Set the same CPT_TRUST_SECRET on the caller and on {} (or give \
                         ServerLayer::with_trust a policy that admits it)",
                        config.service,
                        crate::stats::more(unsaid),
                        if wanted {
                            "; the caller asked for the critical path, got none, and shows \
                             this service as [blind spot]"
                        } else {
                            ""
                        },
                        config.service,
                    );
                }
            }
        }
        if let Some(credential) = force {
            let request_id = headers
                .get(header::REQUEST_ID)
                .and_then(|v| v.to_str().ok());
            match config
                .force
                .verify(&config.service, request_id, credential.as_bytes())
            {
                Ok(()) => {
                    return Some(Decision {
                        trigger: Trigger::Forced,
                        return_path: false,
                        path_version: codec_single(),
                        started_here: true,
                        force_nonce: cpt_sdk::force::parse(credential.as_bytes())
                            .ok()
                            .map(|p| p.nonce().to_owned()),
                    });
                }
                Err(why) => config.counters.force_rejected(&config.service, why),
            }
        }
    }
    decide_unmarked(config, caller.uri.path())
}

/// The open root node of a traced request, until its path is computed.
pub(crate) struct Ending {
    root: tracing::Span,
    config: Arc<ServerConfig>,
    return_path: bool,
    path_version: u32,
}

/// The version of a decision that returns no path (never read).
fn codec_single() -> u32 {
    cpt_sdk::codec::SINGLE_VERSION
}

impl Ending {
    fn at_first_message(&self) -> bool {
        self.config.stream_end == StreamEnd::FirstMessage
    }

    pub(crate) fn span(&self) -> &tracing::Span {
        &self.root
    }

    /// Whether a trusted caller asked for the path.
    #[cfg_attr(not(feature = "actix-web"), allow(dead_code))]
    pub(crate) fn returns_path(&self) -> bool {
        self.return_path
    }

    /// The response cannot carry the path (a stream without trailers): end
    /// the root as an entry service's would, without computing a path no
    /// one receives, and count it in [`Stats::path_unsent`].
    #[cfg_attr(not(feature = "actix-web"), allow(dead_code))]
    pub(crate) fn cannot_return_path(&mut self) {
        if self.return_path {
            self.return_path = false;
            Counters::bump(&self.config.counters.path_unsent);
        }
    }

    /// End the root node now; the encoded path when it is to be returned.
    ///
    /// When no path is returned (this service is the entry point), the path
    /// is computed and the record emitted in the background: the response
    /// does not wait for either.
    pub(crate) fn finish(self) -> Option<OutgoingPath> {
        if !self.return_path {
            cpt_sdk::request::finish_detached(&self.root);
            return None;
        }
        // The SDK emits the record when this service is the entry point.
        let path = cpt_sdk::request::finish(&self.root)?.path;
        let value = glue::encode_header(&path, self.config.max_path_bytes, self.path_version)?;
        Some(OutgoingPath {
            headers: Some(value),
            counters: self.config.counters.clone(),
        })
    }
}

/// A path encoded for the caller that asked for it: counted in
/// [`Stats::paths_returned`] when it goes into a response's headers or
/// trailers, in [`Stats::path_unsent`] when it is dropped without (the
/// response failed, the stream ended in an error).
pub(crate) struct OutgoingPath {
    headers: Option<glue::PathHeaders>,
    counters: Arc<Counters>,
}

impl OutgoingPath {
    /// Put the path in a response's headers or trailers.
    pub(crate) fn insert_into(self, headers: &mut http::HeaderMap) {
        self.send().insert_into(headers);
    }

    /// The headers to send, counted as returned (for header maps of other
    /// `http` versions).
    pub(crate) fn send(mut self) -> glue::PathHeaders {
        Counters::bump(&self.counters.paths_returned);
        self.headers
            .take()
            .expect("an OutgoingPath is sent at most once; this is a bug")
    }
}

impl Drop for OutgoingPath {
    fn drop(&mut self) {
        if self.headers.is_some() {
            Counters::bump(&self.counters.path_unsent);
        }
    }
}
