//! The gRPC front end: `cpt.collector.v1.Collector/Export`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use tokio::sync::OwnedSemaphorePermit;
use tonic::Status;
use tonic::server::{Grpc, NamedService, UnaryService};

use crate::ingest::codec::RawCodec;
use crate::ingest::{self, BatchError, BodyFormat, proto};
use crate::server::ingest::admission::BodyFailure;
use crate::server::ingest::admission::{Ingest, SubmitError};

impl SubmitError {
    pub(in crate::server) fn into_status(self) -> Status {
        let msg = self.message();
        match self {
            SubmitError::Overloaded { .. }
            | SubmitError::Receiving { .. }
            | SubmitError::PeerBusy { .. } => Status::resource_exhausted(msg),
            SubmitError::Unauthenticated => Status::unauthenticated(msg),
            SubmitError::BodyTimeout { .. } | SubmitError::BodyTooSlow { .. } => {
                Status::deadline_exceeded(msg)
            }
            SubmitError::Malformed(_) => Status::invalid_argument(msg),
            SubmitError::TooLarge { .. } => Status::out_of_range(msg),
            SubmitError::Store(_) | SubmitError::ShuttingDown => Status::unavailable(msg),
        }
    }
}

/// The hand-written tonic service for `cpt.collector.v1.Collector`.
#[derive(Clone, Debug)]
pub(in crate::server) struct CollectorService {
    pub(in crate::server) ingest: Arc<Ingest>,
}

impl NamedService for CollectorService {
    const NAME: &'static str = ingest::GRPC_SERVICE;
}

pub(in crate::server) type BoxFuture<T, E> =
    Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

impl<B> tonic::codegen::Service<http::Request<B>> for CollectorService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
    B::Data: Send,
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
        let ingest = self.ingest.clone();
        Box::pin(async move {
            let resp = match receive(&ingest, req, false).await {
                Ok((req, permit)) => {
                    let ran = Arc::new(AtomicBool::new(false));
                    let call = ExportCall {
                        ingest: ingest.clone(),
                        permit: Some(permit),
                        ran: ran.clone(),
                    };
                    let mut grpc = Grpc::new(RawCodec::<proto::ExportResponse>::default())
                        .max_decoding_message_size(ingest.max_batch_bytes);
                    let resp = grpc.unary(call, req).await;
                    // A request tonic refused before the batch reached
                    // `ExportCall` is a rejected batch too.
                    let failed = resp
                        .headers()
                        .get("grpc-status")
                        .is_some_and(|v| v.as_bytes() != b"0");
                    if failed && !ran.load(Ordering::Relaxed) {
                        ingest
                            .counters
                            .reject(crate::server::ingest::admission::Reject::RefusedByGrpc);
                    }
                    resp
                }
                Err(e) => e.into_status().into_http(),
            };
            Ok(resp)
        })
    }
}

/// Check the credential, receive the whole body under the body deadline
/// (holding a receiving slot, not the writer's), check it is exactly one
/// gRPC message within the size limit (uncompressed, or with `gzip_ok`
/// gzip, which is inflated here), then take the writer's permit.
pub(in crate::server) async fn receive<B>(
    ingest: &Ingest,
    req: http::Request<B>,
    gzip_ok: bool,
) -> Result<(http::Request<Full<Bytes>>, OwnedSemaphorePermit), SubmitError>
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
    B::Data: Send,
{
    ingest.authorize(
        req.headers()
            .get(http::header::AUTHORIZATION)
            .map(http::HeaderValue::as_bytes),
    )?;
    let peer = req
        .extensions()
        .get::<crate::server::ingest::receiving::PeerIp>()
        .map(|p| p.0);
    let receiving = ingest.receive(peer)?;
    let limit = ingest.max_batch_bytes;
    let (parts, body) = req.into_parts();
    let malformed = |reason: String| {
        let e = SubmitError::Malformed(BatchError::new("body", reason));
        e.count(&ingest.counters);
        e
    };
    // One message: a 5-byte frame header and at most `limit` bytes.
    let bytes = match ingest.receive_body(body, limit + 5).await {
        Ok(b) => b,
        Err(BodyFailure::Refused(SubmitError::TooLarge { .. })) => {
            return Err(SubmitError::TooLarge { limit });
        }
        Err(BodyFailure::Refused(e)) => return Err(e),
        Err(BodyFailure::Read(e)) => {
            return Err(malformed(format!("cannot read the request body: {e}")));
        }
    };
    drop(receiving);
    let Some((&compressed, rest)) = bytes.split_first() else {
        return Err(malformed(
            "no message (Export takes one RecordBatch)".into(),
        ));
    };
    let Some(len) = rest
        .get(..4)
        .map(|l| u32::from_be_bytes([l[0], l[1], l[2], l[3]]))
    else {
        return Err(malformed("truncated gRPC message header".into()));
    };
    if compressed != 0 && !gzip_ok {
        return Err(malformed(
            "compressed gRPC messages are not accepted (send without grpc-encoding)".into(),
        ));
    }
    let len = len as usize;
    if len > limit {
        let e = SubmitError::TooLarge { limit };
        e.count(&ingest.counters);
        return Err(e);
    }
    let after = rest.len() - 4;
    if after < len {
        return Err(malformed(format!(
            "truncated gRPC message: {after} of {len} bytes"
        )));
    }
    if after > len {
        return Err(malformed(format!(
            "Export is unary and takes exactly one RecordBatch; the request carries {} more bytes after the first message (nothing stored)",
            after - len
        )));
    }
    let mut parts = parts;
    let bytes = if compressed == 0 {
        bytes
    } else {
        // Inflated here, so that tonic reads one plain message.
        let encoding = parts.headers.remove("grpc-encoding");
        if encoding.as_ref().is_none_or(|e| e.as_bytes() != b"gzip") {
            return Err(malformed(format!(
                "a compressed message with grpc-encoding {encoding:?}: only gzip is accepted"
            )));
        }
        let plain = crate::server::edge::http_api::gunzip(&bytes[5..], limit).map_err(|e| {
            let e = SubmitError::Malformed(e);
            e.count(&ingest.counters);
            e
        })?;
        let mut framed = Vec::with_capacity(plain.len() + 5);
        framed.push(0);
        framed.extend_from_slice(&u32::try_from(plain.len()).unwrap_or(u32::MAX).to_be_bytes());
        framed.extend_from_slice(&plain);
        Bytes::from(framed)
    };
    let permit = ingest.admit()?;
    Ok((http::Request::from_parts(parts, Full::new(bytes)), permit))
}

struct ExportCall {
    ingest: Arc<Ingest>,
    permit: Option<OwnedSemaphorePermit>,
    ran: Arc<AtomicBool>,
}

impl UnaryService<Bytes> for ExportCall {
    type Response = proto::ExportResponse;
    type Future = BoxFuture<tonic::Response<proto::ExportResponse>, Status>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        self.ran.store(true, Ordering::Relaxed);
        let ingest = self.ingest.clone();
        let permit = self
            .permit
            .take()
            .expect("tonic calls a unary service once per request; this is a bug");
        Box::pin(async move {
            let batch_id = crate::server::ingest::admission::batch_id(
                request
                    .metadata()
                    .get(crate::server::ingest::admission::BATCH_ID_HEADER)
                    .map(|v| v.as_bytes()),
            )
            .map_err(|e| {
                e.count(&ingest.counters);
                e.into_status()
            })?;
            let bytes = request.into_inner();
            let n = ingest
                .submit(
                    batch_id,
                    move |limits, cancelled| {
                        BodyFormat::Protobuf.decode_with(&bytes, limits, cancelled)
                    },
                    permit,
                )
                .await
                .map_err(SubmitError::into_status)?;
            Ok(tonic::Response::new(proto::ExportResponse {
                accepted_records: n,
            }))
        })
    }
}
