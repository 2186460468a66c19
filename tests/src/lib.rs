//! Shared helpers for the end-to-end tests in `tests/`: a recording sink, a
//! per-test subscriber and runtime, servers on 127.0.0.1, and readable views
//! of critical paths for assertions.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use cpt_sdk::layer::{Builder, CriticalPathLayer, Handle};
use cpt_sdk::testing::RecordingSink;
use cpt_sdk::{Record, SegmentKind};
use tonic::body::Body;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};
use tower::{Layer, Service};
use tracing_subscriber::prelude::*;

pub use cpt_examples::proto;

/// The records of one test's layer: an [`sdk::testing::RecordingSink`]
/// (records wake waiters on a condvar) and the layer's [`Handle`], so "no
/// more records will come" is decided by the layer (no traced request in
/// flight, its background queue flushed), not by a sleep.
///
/// [`sdk::testing::RecordingSink`]: cpt_sdk::testing::RecordingSink
#[derive(Clone, Debug)]
pub struct Recorder {
    sink: RecordingSink,
    handle: Handle,
}

impl Recorder {
    /// Build `builder`'s layer with a sink recording into a new recorder.
    pub fn layer(builder: Builder) -> (CriticalPathLayer, Recorder) {
        let sink = RecordingSink::new();
        let (layer, handle) = builder.with_sink(sink.clone()).build();
        (layer, Recorder { sink, handle })
    }

    /// The records so far.
    pub fn records(&self) -> Vec<Record> {
        self.sink.records()
    }

    /// Wait (up to 2 s) until at least `n` records arrived, then until the
    /// layer is [settled](Self::settled); return all.
    pub async fn wait_for(&self, n: usize) -> Vec<Record> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while self.sink.len() < n && tokio::time::Instant::now() < deadline {
            // Async: the servers whose requests we wait for run on this thread.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.settled().await
    }

    /// Every record that will come, for tests asserting that none (or no
    /// more) came: waits (up to 2 s) until no traced request is in flight,
    /// then until the layer's background thread has emitted every finished
    /// request's record.
    pub async fn settled(&self) -> Vec<Record> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while self.handle.requests_in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // The background thread does not need this runtime: blocking is fine.
        self.handle.flush(Duration::from_secs(2));
        self.records()
    }
}

/// Run `f` on a current-thread runtime with a subscriber that has a
/// `CriticalPathLayer` recording into the recorder it is given. Servers and
/// clients spawned by `f` run on this thread, under this subscriber.
pub fn run<F, Fut>(f: F) -> Fut::Output
where
    F: FnOnce(Recorder) -> Fut,
    Fut: Future,
{
    run_with(|b| b, f)
}

/// [`run`] with the layer's builder adjusted by `configure` (a sampler, a
/// clock), e.g. `run_with(|b| b.with_sampler(DefaultSampler::new(1.0)), ..)`.
pub fn run_with<F, Fut>(configure: impl FnOnce(Builder) -> Builder, f: F) -> Fut::Output
where
    F: FnOnce(Recorder) -> Fut,
    Fut: Future,
{
    let (layer, recorder) =
        Recorder::layer(configure(CriticalPathLayer::builder().with_service("test")));
    let subscriber = tracing_subscriber::registry().with(layer);
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    rt.block_on(f(recorder))
}

/// Serve a tonic service on 127.0.0.1 behind `layer` (use
/// `tower::layer::util::Identity` for none); returns its address.
pub async fn serve_grpc<L, S, ResBody>(layer: L, svc: S) -> SocketAddr
where
    S: Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    L: Layer<Routes> + Clone + Send + 'static,
    L::Service:
        Service<http::Request<Body>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    <L::Service as Service<http::Request<Body>>>::Future: Send,
    <L::Service as Service<http::Request<Body>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let server = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(svc)
        .serve_with_incoming(TcpIncoming::from(listener));
    tokio::spawn(async move {
        if let Err(e) = server.await {
            eprintln!("test server on {addr} stopped: {e}");
        }
    });
    addr
}

/// A lazily connecting channel to `addr`.
pub fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("a socket address is a valid URI")
        .connect_lazy()
}

/// A segment as `(["service:name", …], duration, kind)`.
pub type SegmentView = (Vec<String>, Duration, SegmentKind);

/// The record's path as [`SegmentView`]s.
pub fn segments(record: &Record) -> Vec<SegmentView> {
    record
        .path
        .segments()
        .iter()
        .map(|s| {
            let stack = record
                .path
                .stack_frames(s)
                .map(|f| format!("{}:{}", f.service, f.name))
                .collect();
            (stack, s.duration, s.kind)
        })
        .collect()
}

/// The record's path, one segment a line, for assertion messages.
pub fn render(record: &Record) -> String {
    let mut out = format!(
        "{} {:?} latency {:?} accounting {:?}\n",
        record.service, record.endpoint, record.latency, record.path.accounting
    );
    for (stack, d, kind) in segments(record) {
        out.push_str(&format!(
            "  {:>12?} {:<12} {}\n",
            d,
            kind.as_str(),
            stack.join(" > ")
        ));
    }
    out
}

/// Sum of the durations of segments matching `pred`.
pub fn time_where(record: &Record, pred: impl Fn(&SegmentView) -> bool) -> Duration {
    segments(record)
        .iter()
        .filter(|s| pred(s))
        .map(|s| s.1)
        .sum()
}

/// Whether a stack has a frame `service:name`.
pub fn has(stack: &[String], frame: &str) -> bool {
    stack.iter().any(|f| f == frame)
}

/// Whether a stack has any frame of `service`.
pub fn has_service(stack: &[String], service: &str) -> bool {
    stack
        .iter()
        .any(|f| f.split_once(':').is_some_and(|(s, _)| s == service))
}

/// Sleep inside a span named `name`: simulated I/O the path attributes to
/// that span.
pub async fn io(name: &'static str, d: Duration) {
    use tracing::Instrument;
    tokio::time::sleep(d)
        .instrument(tracing::info_span!("io", cpt.name = name))
        .await;
}

/// A sampler tracing every request.
pub fn always(_: &cpt_sdk::trigger::SamplingContext<'_>) -> Option<cpt_sdk::Trigger> {
    Some(cpt_sdk::Trigger::Sampled)
}

/// tonic's prost codec, for tests that call `tonic::client::Grpc` directly.
pub type Codec<Req, Res> = tonic_prost::ProstCodec<Req, Res>;

/// The example services' generated servers over closures, so a test states
/// only the behaviour it needs (`cpt_examples::system` implements the same
/// traits on structs, as a service would).
pub mod services {
    use std::future::Future;
    use std::pin::Pin;

    use cpt_examples::proto::service_a_server::{ServiceA, ServiceAServer};
    use cpt_examples::proto::service_b_server::{ServiceB, ServiceBServer};
    use cpt_examples::proto::service_c_server::{ServiceC, ServiceCServer};
    use cpt_examples::proto::{C1Reply, C1Request, RunReply, RunRequest, ScanItem, ScanRequest};
    use tonic::{Request, Response, Status};

    /// `ServiceC.Scan`'s stream.
    pub type ScanStream =
        Pin<Box<dyn futures_util::Stream<Item = Result<ScanItem, Status>> + Send>>;

    /// A closure as a gRPC method handler.
    #[derive(Debug)]
    pub struct Handler<F>(F);

    impl<F> Handler<F> {
        async fn call<Req, Res, Fut>(&self, req: Request<Req>) -> Result<Response<Res>, Status>
        where
            F: Fn(Request<Req>) -> Fut,
            Fut: Future<Output = Result<Response<Res>, Status>>,
        {
            (self.0)(req).await
        }
    }

    #[tonic::async_trait]
    impl<F, Fut> ServiceA for Handler<F>
    where
        F: Fn(Request<RunRequest>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Response<RunReply>, Status>> + Send,
    {
        async fn run(&self, req: Request<RunRequest>) -> Result<Response<RunReply>, Status> {
            self.call(req).await
        }
    }

    #[tonic::async_trait]
    impl<F, Fut> ServiceB for Handler<F>
    where
        F: Fn(Request<RunRequest>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Response<RunReply>, Status>> + Send,
    {
        async fn b1(&self, req: Request<RunRequest>) -> Result<Response<RunReply>, Status> {
            self.call(req).await
        }
    }

    /// `ServiceC` from a `C1` and a `Scan` handler.
    #[derive(Debug)]
    pub struct C<F, G> {
        c1: Handler<F>,
        scan: Handler<G>,
    }

    #[tonic::async_trait]
    impl<F, FutF, G, FutG> ServiceC for C<F, G>
    where
        F: Fn(Request<C1Request>) -> FutF + Send + Sync + 'static,
        FutF: Future<Output = Result<Response<C1Reply>, Status>> + Send,
        G: Fn(Request<ScanRequest>) -> FutG + Send + Sync + 'static,
        FutG: Future<Output = Result<Response<ScanStream>, Status>> + Send,
    {
        async fn c1(&self, req: Request<C1Request>) -> Result<Response<C1Reply>, Status> {
            self.c1.call(req).await
        }

        type ScanStream = ScanStream;

        async fn scan(&self, req: Request<ScanRequest>) -> Result<Response<ScanStream>, Status> {
            self.scan.call(req).await
        }
    }

    /// `ServiceA` whose `Run` is `run`.
    pub fn a<F>(run: F) -> ServiceAServer<Handler<F>>
    where
        Handler<F>: ServiceA,
    {
        ServiceAServer::new(Handler(run))
    }

    /// `ServiceB` whose `B1` is `b1`.
    pub fn b<F>(b1: F) -> ServiceBServer<Handler<F>>
    where
        Handler<F>: ServiceB,
    {
        ServiceBServer::new(Handler(b1))
    }

    /// `ServiceC` with both methods.
    pub fn c<F, G>(c1: F, scan: G) -> ServiceCServer<C<F, G>>
    where
        C<F, G>: ServiceC,
    {
        ServiceCServer::new(C {
            c1: Handler(c1),
            scan: Handler(scan),
        })
    }

    /// A `Scan` handler for tests that do not stream: `UNIMPLEMENTED`.
    pub async fn no_scan(_: Request<ScanRequest>) -> Result<Response<ScanStream>, Status> {
        Err(Status::unimplemented("this test's C does not scan"))
    }
}
