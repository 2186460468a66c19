//! The gRPC front end: `cpt.collector.v1.Collector/Export`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::OwnedSemaphorePermit;
use tonic::Status;
use tonic::server::{Grpc, NamedService, UnaryService};

use super::admission::{Ingest, SubmitError};
use crate::ingest::codec::WireCodec;
use crate::ingest::{self, proto};

impl SubmitError {
    fn into_status(self) -> Status {
        let msg = self.message();
        match self {
            SubmitError::Overloaded { .. } => Status::resource_exhausted(msg),
            SubmitError::Malformed(_) => Status::invalid_argument(msg),
            SubmitError::TooLarge { .. } => Status::out_of_range(msg),
            SubmitError::Store(_) | SubmitError::ShuttingDown => Status::unavailable(msg),
        }
    }
}

/// The hand-written tonic service for `cpt.collector.v1.Collector`.
#[derive(Clone, Debug)]
pub(super) struct CollectorService {
    pub(super) ingest: Arc<Ingest>,
}

impl NamedService for CollectorService {
    const NAME: &'static str = ingest::GRPC_SERVICE;
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

impl<B> tonic::codegen::Service<http::Request<B>> for CollectorService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    #[inline]
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != ingest::GRPC_EXPORT_PATH {
            let status = Status::unimplemented(format!(
                "no method {} (this server has {})",
                req.uri().path(),
                ingest::GRPC_EXPORT_PATH
            ));
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        // Admission before the body is read (see the module docs).
        let permit = match self.ingest.admit() {
            Ok(p) => p,
            Err(e) => return Box::pin(std::future::ready(Ok(e.into_status().into_http()))),
        };
        let call = ExportCall {
            ingest: self.ingest.clone(),
            permit: Some(permit),
        };
        let limit = self.ingest.max_batch_bytes;
        Box::pin(async move {
            let mut grpc =
                Grpc::new(WireCodec::<proto::ExportResponse, proto::RecordBatch>::default())
                    .max_decoding_message_size(limit);
            Ok(grpc.unary(call, req).await)
        })
    }
}

struct ExportCall {
    pub(super) ingest: Arc<Ingest>,
    permit: Option<OwnedSemaphorePermit>,
}

impl UnaryService<proto::RecordBatch> for ExportCall {
    type Response = proto::ExportResponse;
    type Future = BoxFuture<tonic::Response<proto::ExportResponse>, Status>;

    fn call(&mut self, request: tonic::Request<proto::RecordBatch>) -> Self::Future {
        let ingest = self.ingest.clone();
        let permit = self
            .permit
            .take()
            .expect("tonic calls a unary service once per request; this is a bug");
        Box::pin(async move {
            let batch = request.into_inner();
            let n = ingest
                .submit(move || ingest::from_proto(batch), permit)
                .await
                .map_err(SubmitError::into_status)?;
            Ok(tonic::Response::new(proto::ExportResponse {
                accepted_records: n,
            }))
        })
    }
}
