//! The HTTP front end: `POST /v1/records`, `GET /v1/records`, `GET /profile`,
//! `GET /v1/stats`, `GET /healthz`.
//!
//! `GET /v1/records?request_id=ID` (or `trace_id=HEX`, or any other selection
//! key but `percentile`, plus `limit=N`, default [`RECORDS_LIMIT`]) returns
//! the matching records as JSON Lines, oldest first, forced or not when an id
//! is given; an empty body when none matches (yet).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::MAX_PROFILE_FILTERS;
use super::admission::{Ingest, SubmitError};
use super::store::{Store, StoreError};
use crate::ingest::{self, BatchError, BodyFormat};

impl SubmitError {
    fn into_response(self) -> Response {
        let msg = self.message();
        let mut body = serde_json::json!({ "error": msg });
        let status = match &self {
            SubmitError::Overloaded { .. } | SubmitError::Receiving { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            SubmitError::Unauthenticated => StatusCode::UNAUTHORIZED,
            SubmitError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            SubmitError::Malformed(e) => {
                body["problems"] = e
                    .problems()
                    .iter()
                    .map(|p| serde_json::json!({ "at": p.at, "reason": p.reason }))
                    .collect();
                body["total_problems"] = e.total().into();
                StatusCode::BAD_REQUEST
            }
            SubmitError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            SubmitError::Store(_) | SubmitError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        };
        let mut resp = json_response(status, &body);
        if matches!(
            self,
            SubmitError::Overloaded { .. }
                | SubmitError::Receiving { .. }
                | SubmitError::Store(_)
                | SubmitError::ShuttingDown
        ) {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response()
}

pub(super) fn router(ingest: Arc<Ingest>) -> Router {
    Router::new()
        .route(
            ingest::HTTP_RECORDS_PATH,
            post(post_records).get(get_records),
        )
        .route("/profile", get(get_profile))
        .route("/v1/stats", get(get_stats))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(ingest)
}

async fn post_records(
    State(ingest): State<Arc<Ingest>>,
    headers: HeaderMap,
    body: AxumBody,
) -> Response {
    if let Err(e) = ingest.authorize(
        headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    ) {
        let mut resp = e.into_response();
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return resp;
    }
    // A receiving slot while the body arrives; the writer's permit only
    // once it has (see the module docs of `server`), so slow senders hold
    // receiving slots, not the writer's.
    let receiving = match ingest.receive() {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let gzip = match headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("identity") => false,
        Some("gzip") => true,
        Some(other) => {
            ingest
                .counters
                .rejected_batches
                .fetch_add(1, Ordering::Relaxed);
            return json_response(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &serde_json::json!({ "error": format!(
                    "unsupported Content-Encoding {other:?}: send the body plain or gzip"
                ) }),
            );
        }
    };
    let Some(format) = BodyFormat::from_content_type(content_type) else {
        ingest
            .counters
            .rejected_batches
            .fetch_add(1, Ordering::Relaxed);
        return json_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &serde_json::json!({ "error": format!(
                "unsupported Content-Type {content_type:?}: send {} (JSON Lines) or {} (protobuf RecordBatch)",
                ingest::CONTENT_TYPE_JSON_LINES, ingest::CONTENT_TYPE_PROTOBUF
            ) }),
        );
    };
    let limit = ingest.max_batch_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        let e = SubmitError::TooLarge { limit };
        e.count(&ingest.counters);
        return e.into_response();
    }
    let timeout = ingest.body_timeout;
    let bytes = match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            let e = SubmitError::TooLarge { limit };
            e.count(&ingest.counters);
            return e.into_response();
        }
        Ok(Err(e)) => {
            ingest
                .counters
                .rejected_batches
                .fetch_add(1, Ordering::Relaxed);
            return json_response(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({ "error": format!("cannot read the request body: {e}") }),
            );
        }
        Err(_) => {
            let e = SubmitError::BodyTimeout { after: timeout };
            e.count(&ingest.counters);
            let mut resp = e.into_response();
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return resp;
        }
    };
    drop(receiving);
    let batch_id = match super::admission::batch_id(
        headers
            .get(super::admission::BATCH_ID_HEADER)
            .map(HeaderValue::as_bytes),
    ) {
        Ok(id) => id,
        Err(e) => {
            e.count(&ingest.counters);
            return e.into_response();
        }
    };
    let permit = match ingest.admit() {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let decode = move |limits: &ingest::IngestLimits, cancelled: &std::sync::atomic::AtomicBool| {
        if gzip {
            format.decode_with(&gunzip(&bytes, limit)?, limits, cancelled)
        } else {
            format.decode_with(&bytes, limits, cancelled)
        }
    };
    match ingest.submit(batch_id, decode, permit).await {
        Ok(n) => json_response(
            StatusCode::OK,
            &serde_json::json!({ "accepted_records": n }),
        ),
        Err(e) => e.into_response(),
    }
}

/// Inflate a gzip body, refusing more than `limit` bytes of output (a small
/// body may inflate enormously).
fn gunzip(body: &[u8], limit: usize) -> Result<Vec<u8>, BatchError> {
    use std::io::Read as _;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| BatchError::new("body", format!("bad gzip body: {e}")))?;
    if out.len() > limit {
        return Err(BatchError::new(
            "body",
            format!("gzip body inflates to more than {limit} bytes"),
        ));
    }
    Ok(out)
}

async fn get_stats(State(ingest): State<Arc<Ingest>>) -> Response {
    let s = ingest.counters.snapshot();
    json_response(
        StatusCode::OK,
        &serde_json::json!({
            "accepted_batches": s.accepted_batches,
            "accepted_records": s.accepted_records,
            "rejected_batches": s.rejected_batches,
            "overloaded": s.overloaded,
            "store_errors": s.store_errors,
            "duplicate_batches": s.duplicate_batches,
            "pending_batches": ingest.max_pending - ingest.admission.available_permits(),
        }),
    )
}

async fn get_profile(State(ingest): State<Arc<Ingest>>, RawQuery(query): RawQuery) -> Response {
    let path = ingest.store_path.clone();
    let query = query.unwrap_or_default();
    let built = tokio::task::spawn_blocking(move || profile_from_store(&path, &query)).await;
    match built {
        Ok(Ok(gz)) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"profile.pb.gz\"",
                ),
            ],
            gz,
        )
            .into_response(),
        Ok(Err(ProfileError::BadQuery(msg))) => json_response(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({ "error": msg }),
        ),
        Ok(Err(ProfileError::Store(e))) => {
            // The detail names the store's file: the operator's log gets it,
            // the client does not.
            eprintln!("cpt serve: GET /profile failed: {e}");
            json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &serde_json::json!({ "error": "the profile could not be built from the store (the collector's log has the detail); retry later" }),
            )
        }
        Err(e) => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &serde_json::json!({ "error": format!("profile task failed: {e}") }),
        ),
    }
}

enum ProfileError {
    BadQuery(String),
    Store(StoreError),
}

/// Build the gzipped profile for a `GET /profile` query string.
/// Records per batch folded in parallel for `GET /profile`.
const PROFILE_BATCH: usize = 16 * 1024;

fn profile_from_store(path: &std::path::Path, query: &str) -> Result<Vec<u8>, ProfileError> {
    let params = query.split('&').filter(|p| !p.is_empty()).count();
    if params > MAX_PROFILE_FILTERS {
        return Err(ProfileError::BadQuery(format!(
            "bad profile query: {params} parameters, over the limit of {MAX_PROFILE_FILTERS}; narrow the selection"
        )));
    }
    let sel = crate::records::selection::Selection::from_query(query)
        .map_err(|e| ProfileError::BadQuery(format!("bad profile query {query:?}: {e}")))?;
    let store = Store::open_read_only(path).map_err(ProfileError::Store)?;
    let mut agg = crate::profile::aggregate::Aggregator::new(sel.clone());
    store
        .fold_into(&mut agg, PROFILE_BATCH, None)
        .map_err(ProfileError::Store)?;
    let agg = agg.finish();
    Ok(crate::profile::encode_gzip(&agg))
}

/// Records `GET /v1/records` returns when the query gives no `limit`.
const RECORDS_LIMIT: u64 = 1000;

async fn get_records(State(ingest): State<Arc<Ingest>>, RawQuery(query): RawQuery) -> Response {
    let path = ingest.store_path.clone();
    let query = query.unwrap_or_default();
    let found = tokio::task::spawn_blocking(move || records_from_store(&path, &query)).await;
    match found {
        Ok(Ok(body)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, ingest::CONTENT_TYPE_JSON_LINES)],
            body,
        )
            .into_response(),
        Ok(Err(ProfileError::BadQuery(msg))) => json_response(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({ "error": msg }),
        ),
        Ok(Err(ProfileError::Store(e))) => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &serde_json::json!({ "error": e.to_string() }),
        ),
        Err(e) => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &serde_json::json!({ "error": format!("records task failed: {e}") }),
        ),
    }
}

/// Split `limit=N` off a `GET /v1/records` query; the rest is a selection.
fn records_query(query: &str) -> Result<super::store::StoreQuery, ProfileError> {
    let bad = |msg: String| ProfileError::BadQuery(format!("bad records query {query:?}: {msg}"));
    let mut limit = RECORDS_LIMIT;
    let mut rest = Vec::new();
    for pair in query.trim_start_matches('?').split('&') {
        match pair.split_once('=') {
            Some(("limit", n)) => {
                limit = n
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(format!("limit {n:?}: expected a positive integer")))?;
            }
            _ => rest.push(pair),
        }
    }
    let sel = crate::records::selection::Selection::from_query(&rest.join("&"))
        .map_err(|e| bad(e.to_string()))?;
    if sel.percentile().is_some() {
        return Err(bad(
            "percentile is a profile's band (GET /profile); records are selected by request_id, \
             trace_id, service, endpoint, since, until, label and trigger"
                .into(),
        ));
    }
    let mut q = super::store::StoreQuery::from_selection(&sel);
    q.limit = Some(limit);
    Ok(q)
}

fn records_from_store(path: &std::path::Path, query: &str) -> Result<Vec<u8>, ProfileError> {
    let q = records_query(query)?;
    let store = Store::open_read_only(path).map_err(ProfileError::Store)?;
    let mut body = Vec::new();
    for r in store.query(&q).map_err(ProfileError::Store)? {
        body.extend_from_slice(r.map_err(ProfileError::Store)?.to_json().as_bytes());
        body.push(b'\n');
    }
    Ok(body)
}
