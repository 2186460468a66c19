//! The CPT Figure 1 system: services A, B and C with subcomponents A1, A2,
//! B1, B2, C1, C2.
//!
//! ```text
//!   client ──gRPC──▶ A.Run ─ A1 ─┬─gRPC──▶ B.B1 ─ B1 ─ B2 ─┬─HTTP──────▶ C GET /c1 ─ C1
//!                                │                          └─gRPC stream▶ C.Scan ─ C2 ×n ─ C1
//!                                └─ A2 ─gRPC──▶ C.C1 ─ C1
//! ```
//!
//! A1 calls B1 and A2, in sequence (CPT Fig. 2a) or in parallel (Fig. 2b),
//! per request; A2, B2 and C2 all call C1 (A2 and B2 remotely, C2 locally).
//! Every service has the cpt server layer and every client the cpt client
//! layer; the subcomponents are plain `tracing` spans. Work is simulated by
//! spinning, so it is busy time on the path.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::routing::get;
use bytes::Bytes;
use cpt_middleware::{Client, ClientLayer, ForceAuth, ServerLayer, SharedSecret};
use cpt_sdk::trigger::DefaultSampler;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::otel::{OtelClient, OtelClientLayer, OtelServerLayer};
use crate::proto::service_a_server::{ServiceA, ServiceAServer};
use crate::proto::service_b_client::ServiceBClient;
use crate::proto::service_b_server::{ServiceB, ServiceBServer};
use crate::proto::service_c_client::ServiceCClient;
use crate::proto::service_c_server::{ServiceC, ServiceCServer};
use crate::proto::{C1Reply, C1Request, RunReply, RunRequest, ScanItem, ScanRequest};

/// How long each subcomponent works (spins) per call.
#[derive(Clone, Copy, Debug)]
pub struct Work {
    /// A1 before its calls, and again after.
    pub a1: Duration,
    /// A2 before it calls C1.
    pub a2: Duration,
    /// B1 before it calls B2.
    pub b1: Duration,
    /// B2 between its calls.
    pub b2: Duration,
    /// C1 per lookup (×4 for every tenth key: a slow tail).
    pub c1: Duration,
    /// C2 per streamed item, before it calls C1.
    pub c2: Duration,
}

impl Default for Work {
    fn default() -> Self {
        Work {
            a1: Duration::from_micros(300),
            a2: Duration::from_micros(100),
            b1: Duration::from_micros(200),
            b2: Duration::from_micros(100),
            c1: Duration::from_micros(150),
            c2: Duration::from_micros(50),
        }
    }
}

/// Configuration of the three services.
#[derive(Clone, Debug)]
pub struct Config {
    /// Per-subcomponent work.
    pub work: Work,
    /// Secret the services present to each other (their trust policy).
    pub secret: String,
    /// Key operators sign `x-cpt-force` credentials with.
    pub force_key: String,
    /// A's sampling probability (B and C only trace what a trusted caller
    /// propagates).
    pub sample_rate: f64,
    /// Whether the services have the cpt layers at all (for overhead
    /// benchmarks).
    pub middleware: bool,
    /// Whether the services are also traced with OpenTelemetry: server and
    /// client spans with W3C `traceparent` propagation
    /// ([`otel`](crate::otel)), exported by whatever `tracing-opentelemetry`
    /// layer the subscriber has (the `fig1` bench's peer configuration).
    pub otel: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            work: Work::default(),
            secret: "cpt-demo-secret".into(),
            force_key: "cpt-demo-force-key".into(),
            sample_rate: 0.1,
            middleware: true,
            otel: false,
        }
    }
}

/// Spin for `d`: simulated CPU work (busy time on the path).
pub fn spin(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

fn server_layer(config: &Config, service: &'static str, grpc: bool) -> ServerLayer {
    let layer = if grpc {
        ServerLayer::grpc(service)
    } else {
        ServerLayer::http(service)
    };
    let layer = layer
        .with_trust(SharedSecret::new(&config.secret))
        .with_force_auth(ForceAuth::none().hmac_key(&config.force_key));
    if service == "A" {
        layer.with_sampler(DefaultSampler::new(config.sample_rate))
    } else {
        layer.internal()
    }
}

/// A gRPC channel with the cpt client layer (and the OpenTelemetry one,
/// a pass-through unless [`Config::otel`]).
type Grpc = Client<OtelClient<Channel>>;
type Http = Client<OtelClient<HttpClient<HttpConnector, Full<Bytes>>>>;

/// Serve `svc` on `incoming` with the server layers `config` asks for.
macro_rules! serve_grpc {
    ($config:expr, $service:expr, $svc:expr, $incoming:expr) => {{
        let config: &Config = &$config;
        match (config.middleware, config.otel) {
            (true, false) => {
                tonic::transport::Server::builder()
                    .layer(server_layer(config, $service, true))
                    .add_service($svc)
                    .serve_with_incoming($incoming)
                    .await
            }
            (true, true) => {
                tonic::transport::Server::builder()
                    .layer(OtelServerLayer::new(true))
                    .layer(server_layer(config, $service, true))
                    .add_service($svc)
                    .serve_with_incoming($incoming)
                    .await
            }
            (false, true) => {
                tonic::transport::Server::builder()
                    .layer(OtelServerLayer::new(true))
                    .add_service($svc)
                    .serve_with_incoming($incoming)
                    .await
            }
            (false, false) => {
                tonic::transport::Server::builder()
                    .add_service($svc)
                    .serve_with_incoming($incoming)
                    .await
            }
        }
    }};
}

fn grpc_channel(config: &Config, callee: &'static str, addr: SocketAddr) -> Grpc {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("a socket address is a valid URI")
        .tcp_nodelay(true)
        .connect_lazy();
    let channel = tower::Layer::layer(&OtelClientLayer::new(config.otel), channel);
    let layer = ClientLayer::grpc(callee).with_caller_secret(&config.secret);
    tower::Layer::layer(&layer, channel)
}

// === service C ===

struct CState {
    work: Work,
}

/// C1: look a key up.
fn c1(state: &CState, key: u64) -> u64 {
    let _span = tracing::info_span!("C1").entered();
    let cost = if key.is_multiple_of(10) {
        state.work.c1 * 4
    } else {
        state.work.c1
    };
    spin(cost);
    key.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Serve C: gRPC (`C1`, streaming `Scan`) on one listener, HTTP
/// (`GET /c1?key=`) on another.
///
/// # Errors
///
/// If a server fails.
pub async fn serve_c(
    config: Arc<Config>,
    grpc: TcpListener,
    http: TcpListener,
) -> anyhow::Result<()> {
    let state = Arc::new(CState { work: config.work });
    let svc = ServiceCServer::new(CService(state.clone()));

    let http_app = axum::Router::new()
        .route("/c1", get(c1_http))
        .with_state(state);
    let http_app = if config.middleware {
        http_app.layer(server_layer(&config, "C", false))
    } else {
        http_app
    };
    let http_app = if config.otel {
        http_app.layer(OtelServerLayer::new(true))
    } else {
        http_app
    };
    let http_server = async move {
        use axum::serve::ListenerExt as _;
        let http = http.tap_io(|tcp| {
            // Small request/response exchanges: don't wait for Nagle.
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(
            http,
            http_app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .map_err(anyhow::Error::from)
    };
    let grpc_server = async move {
        let incoming = TcpIncoming::from(grpc).with_nodelay(Some(true));
        serve_grpc!(config, "C", svc, incoming)?;
        Ok(())
    };
    tokio::try_join!(http_server, grpc_server)?;
    Ok(())
}

struct CService(Arc<CState>);

type ScanStream = Pin<Box<dyn futures_util::Stream<Item = Result<ScanItem, Status>> + Send>>;

#[tonic::async_trait]
impl ServiceC for CService {
    async fn c1(&self, req: Request<C1Request>) -> Result<Response<C1Reply>, Status> {
        let value = c1(&self.0, req.get_ref().key);
        Ok(Response::new(C1Reply { value }))
    }

    type ScanStream = ScanStream;

    async fn scan(&self, req: Request<ScanRequest>) -> Result<Response<ScanStream>, Status> {
        let ScanRequest { key, items } = *req.get_ref();
        let state = self.0.clone();
        let stream = futures_util::stream::unfold(0u32, move |i| {
            let state = state.clone();
            async move {
                if i >= items {
                    return None;
                }
                // C2: produce one item, calling C1 locally.
                let value = async {
                    spin(state.work.c2);
                    tokio::task::yield_now().await;
                    c1(&state, key.wrapping_add(u64::from(i)))
                }
                .instrument(tracing::info_span!("C2"))
                .await;
                Some((Ok(ScanItem { value }), i + 1))
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

#[derive(serde::Deserialize)]
struct KeyQuery {
    key: u64,
}

async fn c1_http(State(state): State<Arc<CState>>, Query(q): Query<KeyQuery>) -> String {
    c1(&state, q.key).to_string()
}

// === service B ===

struct BState {
    work: Work,
    c_grpc: ServiceCClient<Grpc>,
    c_http: Http,
    c_http_addr: SocketAddr,
}

/// Serve B (`B.B1`).
///
/// # Errors
///
/// If the server fails.
pub async fn serve_b(
    config: Arc<Config>,
    listener: TcpListener,
    c_grpc: SocketAddr,
    c_http: SocketAddr,
) -> anyhow::Result<()> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let http = HttpClient::builder(TokioExecutor::new()).build(connector);
    let state = Arc::new(BState {
        work: config.work,
        c_grpc: ServiceCClient::new(grpc_channel(&config, "C", c_grpc)),
        c_http: tower::Layer::layer(
            &ClientLayer::http("C").with_caller_secret(&config.secret),
            tower::Layer::layer(&OtelClientLayer::new(config.otel), http),
        ),
        c_http_addr: c_http,
    });
    let svc = ServiceBServer::new(BService(state));
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    serve_grpc!(config, "B", svc, incoming)?;
    Ok(())
}

struct BService(Arc<BState>);

#[tonic::async_trait]
impl ServiceB for BService {
    async fn b1(&self, req: Request<RunRequest>) -> Result<Response<RunReply>, Status> {
        b1(&self.0, *req.get_ref()).await.map(Response::new)
    }
}

async fn b1(state: &BState, req: RunRequest) -> Result<RunReply, Status> {
    async {
        spin(state.work.b1);
        let value = b2(state, req).await?;
        Ok(RunReply { value })
    }
    .instrument(tracing::info_span!("B1"))
    .await
}

/// B2: C1 over HTTP, then C's streaming scan.
async fn b2(state: &BState, req: RunRequest) -> Result<u64, Status> {
    async {
        let uri = format!("http://{}/c1?key={}", state.c_http_addr, req.key);
        let request = http::Request::get(uri)
            .body(Full::new(Bytes::new()))
            .map_err(|e| Status::internal(e.to_string()))?;
        let mut http = state.c_http.clone();
        let response = tower::ServiceExt::oneshot(&mut http, request)
            .await
            .map_err(|e| Status::unavailable(format!("C over HTTP: {e}")))?;
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| Status::unavailable(format!("C over HTTP: {e}")))?
            .to_bytes();
        let first: u64 = std::str::from_utf8(&body)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Status::internal("C returned a bad value"))?;
        spin(state.work.b2);
        let mut items = state
            .c_grpc
            .clone()
            .scan(ScanRequest {
                key: req.key,
                items: req.items,
            })
            .await?
            .into_inner();
        let mut value = first;
        while let Some(item) = items.message().await? {
            value ^= item.value;
        }
        Ok(value)
    }
    .instrument(tracing::info_span!("B2"))
    .await
}

// === service A ===

struct AState {
    work: Work,
    b: ServiceBClient<Grpc>,
    c: ServiceCClient<Grpc>,
}

/// Serve A (`A.Run`).
///
/// # Errors
///
/// If the server fails.
pub async fn serve_a(
    config: Arc<Config>,
    listener: TcpListener,
    b: SocketAddr,
    c_grpc: SocketAddr,
) -> anyhow::Result<()> {
    let state = Arc::new(AState {
        work: config.work,
        b: ServiceBClient::new(grpc_channel(&config, "B", b)),
        c: ServiceCClient::new(grpc_channel(&config, "C", c_grpc)),
    });
    let svc = ServiceAServer::new(AService(state));
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    serve_grpc!(config, "A", svc, incoming)?;
    Ok(())
}

struct AService(Arc<AState>);

#[tonic::async_trait]
impl ServiceA for AService {
    async fn run(&self, req: Request<RunRequest>) -> Result<Response<RunReply>, Status> {
        a1(&self.0, *req.get_ref()).await.map(Response::new)
    }
}

/// A1: work, call B1 and A2 (in sequence or in parallel), work.
async fn a1(state: &AState, req: RunRequest) -> Result<RunReply, Status> {
    async {
        spin(state.work.a1);
        let call_b1 = async { state.b.clone().b1(req).await.map(Response::into_inner) };
        let (b, a2) = if req.parallel {
            tokio::join!(call_b1, a2(state, req.key))
        } else {
            let b = call_b1.await;
            spin(state.work.a1);
            (b, a2(state, req.key).await)
        };
        spin(state.work.a1);
        Ok(RunReply {
            value: b?.value ^ a2?,
        })
    }
    .instrument(tracing::info_span!("A1"))
    .await
}

/// A2: work, then C1.
async fn a2(state: &AState, key: u64) -> Result<u64, Status> {
    async {
        spin(state.work.a2);
        let reply = state.c.clone().c1(C1Request { key }).await?;
        Ok(reply.into_inner().value)
    }
    .instrument(tracing::info_span!("A2"))
    .await
}

/// The addresses of a running system.
#[derive(Clone, Copy, Debug)]
pub struct Addrs {
    /// A's gRPC address.
    pub a: SocketAddr,
    /// B's gRPC address.
    pub b: SocketAddr,
    /// C's gRPC address.
    pub c_grpc: SocketAddr,
    /// C's HTTP address.
    pub c_http: SocketAddr,
}

/// Start A, B and C on loopback ports in this process (spawned on the
/// current runtime); returns their addresses.
///
/// # Errors
///
/// If a listener cannot be bound.
pub async fn start_all(config: Config) -> anyhow::Result<Addrs> {
    let config = Arc::new(config);
    let bind = || TcpListener::bind("127.0.0.1:0");
    let (la, lb, lcg, lch) = (bind().await?, bind().await?, bind().await?, bind().await?);
    let addrs = Addrs {
        a: la.local_addr()?,
        b: lb.local_addr()?,
        c_grpc: lcg.local_addr()?,
        c_http: lch.local_addr()?,
    };
    let report = |name: &'static str| {
        move |r: anyhow::Result<()>| {
            if let Err(e) = r {
                eprintln!("service {name} stopped: {e:#}");
            }
        }
    };
    tokio::spawn({
        let config = config.clone();
        async move { report("C")(serve_c(config, lcg, lch).await) }
    });
    tokio::spawn({
        let config = config.clone();
        async move { report("B")(serve_b(config, lb, addrs.c_grpc, addrs.c_http).await) }
    });
    tokio::spawn(async move { report("A")(serve_a(config, la, addrs.b, addrs.c_grpc).await) });
    Ok(addrs)
}
