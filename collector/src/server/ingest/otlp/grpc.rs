//! OTLP/gRPC: `opentelemetry.proto.collector.trace.v1.TraceService/Export`,
//! plain or gzip (`grpc-encoding: gzip`), received like
//! `cpt.collector.v1.Collector/Export` (`grpc_api.rs`). Push-back is
//! `UNAVAILABLE`, which the OTLP specification makes retryable (with
//! backoff) for every exporter.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;
use tonic::Status;
use tonic::server::{Grpc, NamedService, UnaryService};

use super::spans::Encoding;
use super::{GRPC_EXPORT_PATH, Otlp};
use crate::ingest::codec::RawCodec;
use crate::server::ingest::admission::SubmitError;
use crate::server::ingest::grpc_api::{BoxFuture, receive};
use crate::traces::otlp::pb;

fn status(e: SubmitError) -> Status {
    match e {
        SubmitError::Overloaded { .. }
        | SubmitError::Receiving { .. }
        | SubmitError::PeerBusy { .. } => Status::unavailable(e.message()),
        e => e.into_status(),
    }
}

/// The tonic service for `opentelemetry.proto.collector.trace.v1.TraceService`.
#[derive(Clone, Debug)]
pub(in crate::server) struct TraceService {
    pub(in crate::server) otlp: Arc<Otlp>,
}

impl NamedService for TraceService {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

impl<B> tonic::codegen::Service<http::Request<B>> for TraceService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
    B::Data: Send,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != GRPC_EXPORT_PATH {
            let status = Status::unimplemented(format!(
                "no method {} (this port has {GRPC_EXPORT_PATH})",
                req.uri().path(),
            ));
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        let otlp = self.otlp.clone();
        Box::pin(async move {
            let resp = match receive(&otlp.ingest, req, true).await {
                Ok((req, permit)) => {
                    let call = Export {
                        otlp: otlp.clone(),
                        permit: Some(permit),
                    };
                    let mut grpc = Grpc::new(RawCodec::<pb::ExportTraceServiceResponse>::default())
                        .max_decoding_message_size(otlp.ingest.max_batch_bytes);
                    grpc.unary(call, req).await
                }
                Err(e) => status(e).into_http(),
            };
            Ok(resp)
        })
    }
}

struct Export {
    otlp: Arc<Otlp>,
    permit: Option<OwnedSemaphorePermit>,
}

impl UnaryService<Bytes> for Export {
    type Response = pb::ExportTraceServiceResponse;
    type Future = BoxFuture<tonic::Response<pb::ExportTraceServiceResponse>, Status>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let otlp = self.otlp.clone();
        let permit = self
            .permit
            .take()
            .expect("tonic calls a unary service once per request; this is a bug");
        Box::pin(async move {
            otlp.accept(request.into_inner(), Encoding::Protobuf, false, permit)
                .await
                .map(tonic::Response::new)
                .map_err(status)
        })
    }
}
