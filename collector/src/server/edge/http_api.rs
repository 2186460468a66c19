//! The HTTP front end: `POST /v1/records`, `GET /v1/records`, `GET /profile`,
//! `GET /v1/stats`, `GET /healthz`.
//!
//! `GET /v1/records?request_id=ID` (or `trace_id=HEX`, or any other selection
//! key but `percentile`, plus `limit=N`, default
//! [`DEFAULT_RECORDS_LIMIT`](crate::server::DEFAULT_RECORDS_LIMIT), at most
//! [`MAX_RECORDS_LIMIT`](crate::server::MAX_RECORDS_LIMIT)) streams the matching
//! records as JSON Lines, oldest first, forced or not when an id is given; an
//! empty body when none matches (yet).
//!
//! Every route is behind the route guard (`routes.rs`): a read handler runs
//! only once the read policy ([`crate::server::edge::access`]) let the caller in, and
//! narrows every selection to what that [`Reader`] may see.

use std::sync::Arc;

use axum::Extension;
use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, StatusCode, header};

use crate::ingest::{self, BatchError, BodyFormat};
use crate::records::query;
use crate::records::selection::Selection;
use crate::server::edge::access::{Reader, Withheld};
use crate::server::ingest::admission::{BodyFailure, Ingest, Reject, SubmitError};
use crate::server::ingest::receiving::PeerIp;
use crate::server::operations::errlog;
use crate::server::store::{ProfileSource, Store, StoreError};
use crate::server::{DEFAULT_RECORDS_LIMIT, MAX_RECORDS_LIMIT};

/// On every `GET /profile` answer: where its numbers came from, `raw`,
/// `rollups` or `rollups+raw` ([`ProfileSource`]).
pub const SOURCE_HEADER: &str = "x-cpt-profile-source";

impl SubmitError {
    fn into_response(self) -> Response {
        let msg = self.message();
        let mut body = serde_json::json!({ "error": msg });
        let status = match &self {
            SubmitError::Overloaded { .. }
            | SubmitError::Receiving { .. }
            | SubmitError::PeerBusy { .. } => StatusCode::TOO_MANY_REQUESTS,
            SubmitError::Unauthenticated => StatusCode::UNAUTHORIZED,
            SubmitError::BodyTimeout { .. } | SubmitError::BodyTooSlow { .. } => {
                StatusCode::REQUEST_TIMEOUT
            }
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
                | SubmitError::PeerBusy { .. }
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

pub(in crate::server) fn router(ingest: Arc<Ingest>) -> Router {
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
    peer: Option<axum::Extension<PeerIp>>,
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
    let receiving = match ingest.receive(peer.map(|p| p.0.0)) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let gzip = match gzip_encoded(&headers) {
        Ok(g) => g,
        Err(e) => {
            ingest.counters.reject(Reject::UnsupportedMediaType);
            return json_response(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &serde_json::json!({ "error": e }),
            );
        }
    };
    let Some(format) = BodyFormat::from_content_type(content_type) else {
        ingest.counters.reject(Reject::UnsupportedMediaType);
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
    let bytes = match ingest.receive_body(body, limit).await {
        Ok(b) => b,
        Err(BodyFailure::Refused(e)) => {
            let closes = matches!(
                e,
                SubmitError::BodyTimeout { .. } | SubmitError::BodyTooSlow { .. }
            );
            let mut resp = e.into_response();
            if closes {
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            return resp;
        }
        Err(BodyFailure::Read(e)) => {
            ingest.counters.reject(Reject::UnreadableBody);
            return json_response(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({ "error": format!("cannot read the request body: {e}") }),
            );
        }
    };
    drop(receiving);
    let batch_id = match crate::server::ingest::admission::batch_id(
        headers
            .get(crate::server::ingest::admission::BATCH_ID_HEADER)
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

/// Whether a body is gzip (`Content-Encoding: gzip`) or plain (none, or
/// `identity`); `Err`: another encoding, with what to do.
pub(in crate::server) fn gzip_encoded(headers: &HeaderMap) -> Result<bool, String> {
    match headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("identity") => Ok(false),
        Some("gzip") => Ok(true),
        Some(other) => Err(format!(
            "unsupported Content-Encoding {other:?}: send the body plain or gzip"
        )),
    }
}

/// Inflate a gzip body, every member of it (RFC 1952 §2.2: a gzip file is
/// a series of members, and `cat a.gz b.gz` is one), refusing more than
/// `limit` bytes of output (a small body may inflate enormously).
pub(in crate::server) fn gunzip(body: &[u8], limit: usize) -> Result<Vec<u8>, BatchError> {
    use std::io::Read as _;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(body)
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

/// The counters; to a reader who may not see forced records (an open
/// collector's), `accepted_records` counts sampled records only, as every
/// other answer it gets leaves forced records out.
async fn get_stats(
    State(ingest): State<Arc<Ingest>>,
    Extension(reader): Extension<Reader>,
) -> Response {
    let s = ingest.counters.snapshot();
    let accepted_records = if reader.sees_forced() {
        s.accepted_records
    } else {
        let forced = ingest
            .counters
            .accepted_forced_records
            .load(std::sync::atomic::Ordering::Relaxed);
        s.accepted_records.saturating_sub(forced)
    };
    json_response(
        StatusCode::OK,
        &serde_json::json!({
            "accepted_batches": s.accepted_batches,
            "accepted_records": accepted_records,
            "rejected_batches": s.rejected_batches,
            "overloaded": s.overloaded,
            "store_errors": s.store_errors,
            "duplicate_batches": s.duplicate_batches,
            "pending_batches": ingest.max_pending - ingest.admission.available_permits(),
        }),
    )
}

impl From<Withheld> for ProfileError {
    fn from(_: Withheld) -> Self {
        ProfileError::Forbidden(Withheld::MESSAGE.into())
    }
}

impl ProfileError {
    fn into_response(self, what: &'static str) -> Response {
        match self {
            ProfileError::BadQuery(msg) => json_response(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({ "error": msg }),
            ),
            ProfileError::Forbidden(msg) => {
                json_response(StatusCode::FORBIDDEN, &serde_json::json!({ "error": msg }))
            }
            ProfileError::Store(StoreError::BeyondRetention(gap)) => json_response(
                StatusCode::GONE,
                &serde_json::json!({ "error": gap.to_string() }),
            ),
            ProfileError::Store(e) => {
                // The detail names the store's file: the operator's log gets
                // it, the client does not.
                errlog::error(what, || e.to_string());
                json_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &serde_json::json!({ "error": format!(
                        "{what}: the store could not be read (the collector's log has the detail); retry later"
                    ) }),
                )
            }
        }
    }
}

async fn get_profile(
    State(ingest): State<Arc<Ingest>>,
    Extension(reader): Extension<Reader>,
    RawQuery(query): RawQuery,
) -> Response {
    let path = ingest.store_path.clone();
    let query = query.unwrap_or_default();
    let built =
        crate::server::edge::reads::run(move || profile_from_store(&path, &query, reader)).await;
    match built {
        Ok(Ok((gz, source))) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"profile.pb.gz\"",
                ),
                (
                    http::HeaderName::from_static(SOURCE_HEADER),
                    source.as_str(),
                ),
            ],
            gz,
        )
            .into_response(),
        Ok(Err(e)) => e.into_response("building a profile failed"),
        Err(e) => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &serde_json::json!({ "error": format!("profile task failed: {e}") }),
        ),
    }
}

enum ProfileError {
    BadQuery(String),
    Forbidden(String),
    Store(StoreError),
}

/// Records per batch folded in parallel for `GET /profile`.
const PROFILE_BATCH: usize = 16 * 1024;

/// Build the gzipped profile for a `GET /profile` query string.
fn profile_from_store(
    path: &std::path::Path,
    query: &str,
    reader: Reader,
) -> Result<(Vec<u8>, ProfileSource), ProfileError> {
    let sel = Selection::from_query(query)
        .map_err(|e| ProfileError::BadQuery(format!("bad profile query {query:?}: {e}")))?;
    let sel = reader.restrict(sel)?;
    let store = Store::open_read_only(path).map_err(ProfileError::Store)?;
    let agg = crate::profile::aggregate::Aggregator::new(sel.clone());
    let (agg, source) = store
        .profile(agg, PROFILE_BATCH)
        .map_err(ProfileError::Store)?;
    Ok((crate::profile::encode_gzip(&agg), source))
}

/// JSON Lines bytes gathered before a chunk of a `GET /v1/records` answer
/// is sent.
const RECORDS_CHUNK_BYTES: usize = 64 * 1024;
/// Chunks in flight between the store reader and the connection: with
/// [`RECORDS_CHUNK_BYTES`], what one answer holds in memory at most (besides
/// one record).
const RECORDS_CHUNKS_IN_FLIGHT: usize = 4;

async fn get_records(
    State(ingest): State<Arc<Ingest>>,
    Extension(reader): Extension<Reader>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    let q = match records_query(&query, reader) {
        Ok(q) => q,
        Err(e) => return e.into_response("reading records failed"),
    };
    let path = ingest.store_path.clone();
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (chunks_tx, chunks) = tokio::sync::mpsc::channel(RECORDS_CHUNKS_IN_FLIGHT);
    crate::server::edge::reads::spawn(move || stream_records(&path, &q, started_tx, &chunks_tx));
    match started.await {
        Ok(Ok(())) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, ingest::CONTENT_TYPE_JSON_LINES)],
            AxumBody::new(ChunkBody(chunks)),
        )
            .into_response(),
        Ok(Err(e)) => ProfileError::Store(e).into_response("reading records failed"),
        Err(_) => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &serde_json::json!({ "error": "records task failed" }),
        ),
    }
}

type Chunk = Result<bytes::Bytes, std::io::Error>;

/// Open the store and run the query (its outcome on `started`), then send
/// the records as JSON Lines chunks until done, the client leaves (the
/// receiver is dropped), or a read fails (an error chunk: the connection is
/// cut, so the client sees a broken answer rather than a short one).
fn stream_records(
    path: &std::path::Path,
    q: &crate::server::store::StoreQuery,
    started: tokio::sync::oneshot::Sender<Result<(), StoreError>>,
    chunks: &tokio::sync::mpsc::Sender<Chunk>,
) {
    let rows = match Store::open_read_only(path).and_then(|s| s.query(q)) {
        Ok(rows) => {
            let _ = started.send(Ok(()));
            rows
        }
        Err(e) => {
            let _ = started.send(Err(e));
            return;
        }
    };
    let mut buf = Vec::with_capacity(RECORDS_CHUNK_BYTES);
    for r in rows {
        match r {
            Ok(r) => {
                buf.extend_from_slice(r.to_json().as_bytes());
                buf.push(b'\n');
                if buf.len() >= RECORDS_CHUNK_BYTES {
                    let chunk = bytes::Bytes::from(std::mem::take(&mut buf));
                    if chunks.blocking_send(Ok(chunk)).is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                errlog::error("reading records failed", || e.to_string());
                let _ = chunks.blocking_send(Err(std::io::Error::other(
                    "the store could not be read; the answer is incomplete",
                )));
                return;
            }
        }
    }
    if !buf.is_empty() {
        let _ = chunks.blocking_send(Ok(bytes::Bytes::from(buf)));
    }
}

/// A response body fed by [`stream_records`].
struct ChunkBody(tokio::sync::mpsc::Receiver<Chunk>);

impl hyper::body::Body for ChunkBody {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|c| c.map(|c| c.map(hyper::body::Frame::data)))
    }
}

/// Split `limit=N` off a `GET /v1/records` query; the rest is a selection.
fn records_query(
    query: &str,
    reader: Reader,
) -> Result<crate::server::store::StoreQuery, ProfileError> {
    let bad = |msg: String| ProfileError::BadQuery(format!("bad records query {query:?}: {msg}"));
    let mut limit = DEFAULT_RECORDS_LIMIT;
    let mut sel = Selection::new();
    for (k, n) in query::decode(query).map_err(|e| bad(e.to_string()))? {
        match k.as_str() {
            "limit" => {
                limit = n
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(format!("limit {n:?}: expected a positive integer")))?;
                if limit > MAX_RECORDS_LIMIT {
                    return Err(bad(format!(
                        "limit {limit} is over the maximum of {MAX_RECORDS_LIMIT}; ask for fewer \
                         and page with since/until"
                    )));
                }
            }
            _ => sel.set(&k, &n).map_err(|e| bad(e.to_string()))?,
        }
    }
    if sel.percentile().is_some() {
        return Err(bad(
            "percentile is a profile's band (GET /profile); records are selected by request_id, \
             trace_id, service, endpoint, since, until, label and trigger"
                .into(),
        ));
    }
    let sel = reader.restrict(sel)?;
    let mut q = crate::server::store::StoreQuery::from_selection(&sel);
    q.limit = Some(limit);
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn gz(text: &str) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(text.as_bytes()).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn every_member_of_a_gzip_body_is_inflated() {
        let mut body = gz("line 1\n");
        body.extend(gz("line 2\n"));
        assert_eq!(gunzip(&body, 1 << 20).unwrap(), b"line 1\nline 2\n");
        // A member cut short, or bytes after the last member that are no
        // member, refuse the body: never half of it.
        let mut cut = body.clone();
        cut.truncate(body.len() - 4);
        assert!(gunzip(&cut, 1 << 20).is_err());
        let mut trailing = body.clone();
        trailing.extend(b"junk");
        assert!(gunzip(&trailing, 1 << 20).is_err());
        // The limit counts the members together.
        assert!(gunzip(&body, 10).is_err());
    }
}
