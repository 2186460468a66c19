//! The example system's messages and gRPC glue, written by hand.
//!
//! The equivalent `.proto` (package `cpt.example`):
//!
//! ```proto
//! message RunRequest { bool parallel = 1; uint64 key = 2; uint32 items = 3; }
//! message RunReply   { uint64 value = 1; }
//! message C1Request  { uint64 key = 1; }
//! message C1Reply    { uint64 value = 1; }
//! message ScanRequest { uint64 key = 1; uint32 items = 2; }
//! message ScanItem   { uint64 value = 1; }
//! service A { rpc Run(RunRequest) returns (RunReply); }
//! service B { rpc B1(RunRequest) returns (RunReply); }
//! service C { rpc C1(C1Request) returns (C1Reply);
//!             rpc Scan(ScanRequest) returns (stream ScanItem); }
//! ```
//!
//! There is no `protoc` here, so instead of `tonic-build` output this module
//! has the messages as `#[derive(prost::Message)]` structs and a small
//! generic server ([`GrpcServer`]) and client ([`GrpcClient`]) doing what
//! generated code does: `tonic::server::Grpc` / `tonic::client::Grpc` with
//! `tonic_prost::ProstCodec`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::Stream;
use http::uri::PathAndQuery;
use tonic::body::Body;
use tonic::codegen::StdError;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// `A.Run` / `B.B1` request.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct RunRequest {
    /// Issue A1's two calls in parallel (CPT Fig. 2b) instead of in
    /// sequence (Fig. 2a).
    #[prost(bool, tag = "1")]
    pub parallel: bool,
    /// A key the services hash (keeps the work honest).
    #[prost(uint64, tag = "2")]
    pub key: u64,
    /// How many items B2 scans from C.
    #[prost(uint32, tag = "3")]
    pub items: u32,
}

/// `A.Run` / `B.B1` reply.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct RunReply {
    /// A value derived from the key.
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `C.C1` request.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct C1Request {
    /// The key to look up.
    #[prost(uint64, tag = "1")]
    pub key: u64,
}

/// `C.C1` reply.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct C1Reply {
    /// The value.
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `C.Scan` request.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct ScanRequest {
    /// First key.
    #[prost(uint64, tag = "1")]
    pub key: u64,
    /// How many items to stream.
    #[prost(uint32, tag = "2")]
    pub items: u32,
}

/// One `C.Scan` item.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct ScanItem {
    /// The value.
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// gRPC method paths.
pub mod method {
    /// `A.Run`.
    pub const A_RUN: &str = "/cpt.example.A/Run";
    /// `B.B1`.
    pub const B_B1: &str = "/cpt.example.B/B1";
    /// `C.C1`.
    pub const C_C1: &str = "/cpt.example.C/C1";
    /// `C.Scan` (server streaming).
    pub const C_SCAN: &str = "/cpt.example.C/Scan";
}

/// A gRPC service name for [`GrpcServer`]'s `NamedService` impl.
pub trait ServiceName: Send + Sync + 'static {
    /// `package.Service`.
    const NAME: &'static str;
}

/// `cpt.example.A`.
#[derive(Clone, Copy, Debug)]
pub struct ServiceA;
impl ServiceName for ServiceA {
    const NAME: &'static str = "cpt.example.A";
}

/// `cpt.example.B`.
#[derive(Clone, Copy, Debug)]
pub struct ServiceB;
impl ServiceName for ServiceB {
    const NAME: &'static str = "cpt.example.B";
}

/// `cpt.example.C`.
#[derive(Clone, Copy, Debug)]
pub struct ServiceC;
impl ServiceName for ServiceC {
    const NAME: &'static str = "cpt.example.C";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Handler = Arc<dyn Fn(http::Request<Body>) -> BoxFuture<http::Response<Body>> + Send + Sync>;

/// A gRPC service: method path → handler, as `tonic-build`'s generated
/// `FooServer` routes them.
pub struct GrpcServer<N> {
    methods: Arc<HashMap<&'static str, Handler>>,
    _name: PhantomData<fn() -> N>,
}

impl<N> Clone for GrpcServer<N> {
    fn clone(&self) -> Self {
        GrpcServer {
            methods: self.methods.clone(),
            _name: PhantomData,
        }
    }
}

impl<N: ServiceName> std::fmt::Debug for GrpcServer<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcServer")
            .field("service", &N::NAME)
            .field("methods", &self.methods.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl<N: ServiceName> Default for GrpcServer<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<N: ServiceName> GrpcServer<N> {
    /// A service with no methods.
    pub fn new() -> Self {
        GrpcServer {
            methods: Arc::new(HashMap::new()),
            _name: PhantomData,
        }
    }

    fn add(mut self, path: &'static str, handler: Handler) -> Self {
        Arc::get_mut(&mut self.methods)
            .expect("add methods before cloning the server")
            .insert(path, handler);
        self
    }

    /// Add a unary method.
    #[must_use]
    pub fn unary<Req, Res, F, Fut>(self, path: &'static str, f: F) -> Self
    where
        Req: prost::Message + Default + Send + 'static,
        Res: prost::Message + Send + 'static,
        F: Fn(Request<Req>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Response<Res>, Status>> + Send + 'static,
    {
        self.add(
            path,
            Arc::new(move |req| {
                let f = f.clone();
                Box::pin(async move {
                    let mut grpc = tonic::server::Grpc::new(ProstCodec::<Res, Req>::default());
                    grpc.unary(tower::service_fn(f), req).await
                })
            }),
        )
    }

    /// Add a server-streaming method.
    #[must_use]
    pub fn server_streaming<Req, Res, S, F, Fut>(self, path: &'static str, f: F) -> Self
    where
        Req: prost::Message + Default + Send + 'static,
        Res: prost::Message + Send + 'static,
        S: Stream<Item = Result<Res, Status>> + Send + 'static,
        F: Fn(Request<Req>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Response<S>, Status>> + Send + 'static,
    {
        self.add(
            path,
            Arc::new(move |req| {
                let f = f.clone();
                Box::pin(async move {
                    let mut grpc = tonic::server::Grpc::new(ProstCodec::<Res, Req>::default());
                    grpc.server_streaming(tower::service_fn(f), req).await
                })
            }),
        )
    }
}

impl<N: ServiceName> NamedService for GrpcServer<N> {
    const NAME: &'static str = N::NAME;
}

impl<N: ServiceName> tower::Service<http::Request<Body>> for GrpcServer<N> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        match self.methods.get(req.uri().path()) {
            Some(handler) => {
                let fut = handler(req);
                Box::pin(async move { Ok(fut.await) })
            }
            None => {
                Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) })
            }
        }
    }
}

/// A gRPC client over any transport (a tonic `Channel`, possibly wrapped in
/// `ClientLayer`), as `tonic-build`'s generated `FooClient`.
#[derive(Clone, Debug)]
pub struct GrpcClient<T> {
    inner: tonic::client::Grpc<T>,
}

impl<T> GrpcClient<T>
where
    T: tonic::client::GrpcService<Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<StdError> + Send,
{
    /// A client over `inner`.
    pub fn new(inner: T) -> Self {
        GrpcClient {
            inner: tonic::client::Grpc::new(inner),
        }
    }

    /// Call a unary method.
    ///
    /// # Errors
    ///
    /// The call's status.
    pub async fn unary<Req, Res>(
        &mut self,
        path: &'static str,
        req: impl tonic::IntoRequest<Req>,
    ) -> Result<Res, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Res: prost::Message + Default + Send + Sync + 'static,
    {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("service not ready: {}", e.into())))?;
        let codec = ProstCodec::<Req, Res>::default();
        let resp = self
            .inner
            .unary(req.into_request(), PathAndQuery::from_static(path), codec)
            .await?;
        Ok(resp.into_inner())
    }

    /// Call a server-streaming method and collect the stream.
    ///
    /// # Errors
    ///
    /// The call's or the stream's status.
    pub async fn server_streaming<Req, Res>(
        &mut self,
        path: &'static str,
        req: Req,
    ) -> Result<Vec<Res>, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Res: prost::Message + Default + Send + Sync + 'static,
    {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("service not ready: {}", e.into())))?;
        let codec = ProstCodec::<Req, Res>::default();
        let mut stream = self
            .inner
            .server_streaming(Request::new(req), PathAndQuery::from_static(path), codec)
            .await?
            .into_inner();
        let mut items = Vec::new();
        while let Some(item) = stream.message().await? {
            items.push(item);
        }
        Ok(items)
    }
}
