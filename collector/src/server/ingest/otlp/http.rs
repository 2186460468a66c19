//! OTLP/HTTP: `POST /v1/traces`, `application/x-protobuf` or
//! `application/json`, plain or gzip, answered as the OTLP specification
//! says: 200 with an `ExportTraceServiceResponse` (its partial success
//! naming refused spans) in the request's encoding; 400 for a body that is
//! no trace export, 401 without the ingest token, 415 for other encodings,
//! 429 / 503 with `Retry-After` when the collector must push back.

use std::sync::Arc;

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{HeaderMap, HeaderValue, StatusCode, header};

use super::spans::Encoding;
use super::{HTTP_TRACES_PATH, Otlp};
use crate::server::ingest::admission::{BodyFailure, Reject, SubmitError};
use crate::server::ingest::receiving::PeerIp;

/// `google.rpc.Status`, the body of an OTLP/HTTP error answer.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

const PROTOBUF: &str = "application/x-protobuf";
const JSON: &str = "application/json";

pub(in crate::server) fn router(otlp: Arc<Otlp>) -> Router {
    Router::new()
        .route(HTTP_TRACES_PATH, post(export))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                format!("this port takes OTLP trace exports: POST {HTTP_TRACES_PATH}\n"),
            )
        })
        .with_state(otlp)
}

/// An answer in the request's encoding.
fn answer(encoding: Encoding, status: StatusCode, proto: Vec<u8>, json: String) -> Response {
    match encoding {
        Encoding::Protobuf => (status, [(header::CONTENT_TYPE, PROTOBUF)], proto).into_response(),
        Encoding::Json => (status, [(header::CONTENT_TYPE, JSON)], json).into_response(),
    }
}

fn error(encoding: Encoding, e: &SubmitError) -> Response {
    let (status, code) = match e {
        SubmitError::Overloaded { .. }
        | SubmitError::Receiving { .. }
        | SubmitError::PeerBusy { .. } => (StatusCode::TOO_MANY_REQUESTS, 8),
        SubmitError::Unauthenticated => (StatusCode::UNAUTHORIZED, 16),
        SubmitError::BodyTimeout { .. } | SubmitError::BodyTooSlow { .. } => {
            (StatusCode::REQUEST_TIMEOUT, 4)
        }
        SubmitError::Malformed(_) => (StatusCode::BAD_REQUEST, 3),
        SubmitError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, 11),
        SubmitError::Store(_) | SubmitError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, 14),
    };
    let message = e.message();
    let proto = prost::Message::encode_to_vec(&RpcStatus {
        code,
        message: message.clone(),
    });
    let json = serde_json::json!({ "code": code, "message": message }).to_string();
    let mut resp = answer(encoding, status, proto, json);
    let h = resp.headers_mut();
    if matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    if status == StatusCode::UNAUTHORIZED {
        h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    if status == StatusCode::REQUEST_TIMEOUT {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

async fn export(
    State(otlp): State<Arc<Otlp>>,
    peer: Option<axum::Extension<PeerIp>>,
    headers: HeaderMap,
    body: AxumBody,
) -> Response {
    let ingest = &otlp.ingest;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let encoding = match mime.as_str() {
        PROTOBUF => Encoding::Protobuf,
        JSON => Encoding::Json,
        _ => {
            ingest.counters.reject(Reject::UnsupportedMediaType);
            return (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "unsupported Content-Type {content_type:?}: send {PROTOBUF} or {JSON} (OTLP/HTTP)\n"
                ),
            )
                .into_response();
        }
    };
    if let Err(e) = ingest.authorize(
        headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    ) {
        return error(encoding, &e);
    }
    let gzip = match crate::server::edge::http_api::gzip_encoded(&headers) {
        Ok(g) => g,
        Err(e) => {
            ingest.counters.reject(Reject::UnsupportedMediaType);
            return (StatusCode::UNSUPPORTED_MEDIA_TYPE, format!("{e}\n")).into_response();
        }
    };
    let receiving = match ingest.receive(peer.map(|p| p.0.0)) {
        Ok(r) => r,
        Err(e) => return error(encoding, &e),
    };
    let limit = ingest.max_batch_bytes;
    let bytes = match ingest.receive_body(body, limit).await {
        Ok(b) => b,
        Err(BodyFailure::Refused(e)) => return error(encoding, &e),
        Err(BodyFailure::Read(e)) => {
            ingest.counters.reject(Reject::UnreadableBody);
            return (
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {e}\n"),
            )
                .into_response();
        }
    };
    drop(receiving);
    let permit = match ingest.admit() {
        Ok(p) => p,
        Err(e) => return error(encoding, &e),
    };
    match otlp.accept(bytes, encoding, gzip, permit).await {
        Ok(resp) => {
            let json = match &resp.partial_success {
                Some(p) => serde_json::json!({ "partialSuccess": {
                    "rejectedSpans": p.rejected_spans.to_string(),
                    "errorMessage": p.error_message,
                }})
                .to_string(),
                None => "{}".to_owned(),
            };
            answer(
                encoding,
                StatusCode::OK,
                prost::Message::encode_to_vec(&resp),
                json,
            )
        }
        Err(e) => error(encoding, &e),
    }
}
