//! `cpt serve`: the long-running collector.
//!
//! It accepts record batches over gRPC (`cpt.collector.v1.Collector/Export`)
//! and HTTP (`POST /v1/records`, JSON Lines or protobuf), stores them in a
//! [`Store`], and answers `GET /profile?…` with a gzipped `profile.proto`.
//!
//! # How a batch flows (maintainers)
//!
//! 1. **Admission.** Before its body is read, a request takes a permit from
//!    a semaphore of [`ServeConfig::max_pending_batches`] permits. None left
//!    means the writer is behind: the request is refused at once with HTTP
//!    429 / gRPC `RESOURCE_EXHAUSTED` (and `Retry-After: 1`) instead of
//!    queueing. The permit lives until the batch is acknowledged, so at most
//!    `max_pending_batches` bodies of at most [`ServeConfig::max_batch_bytes`]
//!    each are in memory: memory is bounded whatever the load.
//! 2. **Decoding.** The whole body (gunzipped if `Content-Encoding: gzip`,
//!    to at most `max_batch_bytes`) is decoded and checked
//!    ([`crate::ingest`]); one bad record rejects the batch (HTTP 400 /
//!    `INVALID_ARGUMENT`) naming every bad line or field, and nothing is
//!    stored.
//! 3. **Writing.** The batch goes to the single writer thread, which owns the
//!    read-write connection. It takes every batch waiting (up to
//!    [`ServeConfig::max_group_records`] records) and commits them in one
//!    transaction with a savepoint per batch ([`Store::insert_group`]): one
//!    fsync for many batches, each still all-or-nothing.
//! 4. **Acknowledgement.** Only after the commit returns does the request
//!    answer 200 / `OK`. With [`Durability::Full`] the WAL was fsynced, so
//!    an acknowledged batch survives `kill -9` and power loss.
//!
//! Delivery is at-least-once: a client that times out after the commit but
//! before the answer and retries stores the batch twice.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tonic::Status;
use tonic::server::{Grpc, NamedService, UnaryService};

use crate::ingest::codec::WireCodec;
use crate::ingest::{self, BatchError, BodyFormat, proto};
pub mod store;

use crate::server::store::{Durability, EncodedBatch, Store, StoreError};
use cpt_sdk::Record;

/// Default for [`ServeConfig::max_pending_batches`].
pub const DEFAULT_MAX_PENDING_BATCHES: usize = 32;
/// Default for [`ServeConfig::max_batch_bytes`] (4 MiB).
pub const DEFAULT_MAX_BATCH_BYTES: usize = 4 << 20;
/// Default for [`ServeConfig::max_group_records`].
pub const DEFAULT_MAX_GROUP_RECORDS: usize = 20_000;
/// How long a client may take to send an admitted body.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// What `cpt serve` runs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The SQLite store (created if missing).
    pub store: PathBuf,
    /// gRPC listen address (`None`: no gRPC). Port 0 picks a free port.
    pub grpc: Option<SocketAddr>,
    /// HTTP listen address (`None`: no HTTP).
    pub http: Option<SocketAddr>,
    /// Commit durability.
    pub durability: Durability,
    /// Batches admitted but not yet acknowledged, at most; more are refused
    /// with 429 / `RESOURCE_EXHAUSTED`.
    pub max_pending_batches: usize,
    /// Largest accepted batch body (HTTP 413 / gRPC `OUT_OF_RANGE` above).
    pub max_batch_bytes: usize,
    /// Records committed in one group transaction, at most.
    pub max_group_records: usize,
}

impl ServeConfig {
    /// A configuration with the defaults and no listener.
    pub fn new(store: impl Into<PathBuf>) -> ServeConfig {
        ServeConfig {
            store: store.into(),
            grpc: None,
            http: None,
            durability: Durability::Full,
            max_pending_batches: DEFAULT_MAX_PENDING_BATCHES,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            max_group_records: DEFAULT_MAX_GROUP_RECORDS,
        }
    }

    /// Listen for gRPC on `addr`.
    pub fn with_grpc(mut self, addr: SocketAddr) -> Self {
        self.grpc = Some(addr);
        self
    }

    /// Listen for HTTP on `addr`.
    pub fn with_http(mut self, addr: SocketAddr) -> Self {
        self.http = Some(addr);
        self
    }

    /// Set the commit durability.
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Set [`ServeConfig::max_pending_batches`] (at least 1).
    pub fn with_max_pending_batches(mut self, n: usize) -> Self {
        self.max_pending_batches = n.max(1);
        self
    }

    /// Set [`ServeConfig::max_batch_bytes`].
    pub fn with_max_batch_bytes(mut self, n: usize) -> Self {
        self.max_batch_bytes = n;
        self
    }

    /// Set [`ServeConfig::max_group_records`] (at least 1).
    pub fn with_max_group_records(mut self, n: usize) -> Self {
        self.max_group_records = n.max(1);
        self
    }
}

/// Why the collector could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// `grpc` or `http`.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A server failed while running.
    #[error("{what} server failed: {message}")]
    Server {
        /// `grpc` or `http`.
        what: &'static str,
        /// Its error.
        message: String,
    },
    /// The writer thread could not start.
    #[error("cannot start the store writer thread: {0}")]
    Writer(std::io::Error),
}

/// Counters of a running collector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Batches stored and acknowledged.
    pub accepted_batches: u64,
    /// Records stored and acknowledged.
    pub accepted_records: u64,
    /// Batches rejected as malformed (nothing stored).
    pub rejected_batches: u64,
    /// Requests refused because `max_pending_batches` were pending.
    pub overloaded: u64,
    /// Batches the store failed to commit (nothing stored; retryable).
    pub store_errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    accepted_batches: AtomicU64,
    accepted_records: AtomicU64,
    rejected_batches: AtomicU64,
    overloaded: AtomicU64,
    store_errors: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> Stats {
        Stats {
            accepted_batches: self.accepted_batches.load(Ordering::Relaxed),
            accepted_records: self.accepted_records.load(Ordering::Relaxed),
            rejected_batches: self.rejected_batches.load(Ordering::Relaxed),
            overloaded: self.overloaded.load(Ordering::Relaxed),
            store_errors: self.store_errors.load(Ordering::Relaxed),
        }
    }
}

/// A batch on its way to the writer; the permit is released when the job is
/// dropped, after the acknowledgement.
struct Job {
    batch: EncodedBatch,
    ack: oneshot::Sender<Result<u64, Arc<StoreError>>>,
    _permit: OwnedSemaphorePermit,
}

/// What went wrong with a submitted batch.
#[derive(Debug)]
enum SubmitError {
    Overloaded { pending: usize },
    Malformed(BatchError),
    TooLarge { limit: usize },
    Store(Arc<StoreError>),
    ShuttingDown,
}

impl SubmitError {
    fn count(&self, c: &Counters) {
        let counter = match self {
            SubmitError::Overloaded { .. } => &c.overloaded,
            SubmitError::Malformed(_) | SubmitError::TooLarge { .. } => &c.rejected_batches,
            SubmitError::Store(_) | SubmitError::ShuttingDown => &c.store_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn message(&self) -> String {
        match self {
            SubmitError::Overloaded { pending } => format!(
                "collector overloaded: {pending} batches already pending; retry later with backoff"
            ),
            SubmitError::Malformed(e) => e.to_string(),
            SubmitError::TooLarge { limit } => {
                format!("batch rejected, nothing stored: body larger than {limit} bytes")
            }
            SubmitError::Store(e) => {
                format!("batch not stored (store error; retry later): {e}")
            }
            SubmitError::ShuttingDown => "collector shutting down; retry later".into(),
        }
    }

    fn into_status(self) -> Status {
        let msg = self.message();
        match self {
            SubmitError::Overloaded { .. } => Status::resource_exhausted(msg),
            SubmitError::Malformed(_) => Status::invalid_argument(msg),
            SubmitError::TooLarge { .. } => Status::out_of_range(msg),
            SubmitError::Store(_) | SubmitError::ShuttingDown => Status::unavailable(msg),
        }
    }

    fn into_response(self) -> Response {
        let msg = self.message();
        let mut body = serde_json::json!({ "error": msg });
        let status = match &self {
            SubmitError::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
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
            SubmitError::Overloaded { .. } | SubmitError::Store(_) | SubmitError::ShuttingDown
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

/// The state the gRPC and HTTP front ends share.
#[derive(Debug)]
struct Ingest {
    admission: Arc<Semaphore>,
    max_pending: usize,
    max_batch_bytes: usize,
    jobs: mpsc::Sender<Job>,
    counters: Counters,
    store_path: PathBuf,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("records", &self.batch.len())
            .finish()
    }
}

impl Ingest {
    fn admit(&self) -> Result<OwnedSemaphorePermit, SubmitError> {
        self.admission.clone().try_acquire_owned().map_err(|_| {
            let e = SubmitError::Overloaded {
                pending: self.max_pending,
            };
            e.count(&self.counters);
            e
        })
    }

    /// Decode and check a batch off the async workers (CPU-bound: parsing
    /// and serializing a large batch takes milliseconds), then store it;
    /// returns once it is durable.
    async fn submit(
        &self,
        decode: impl FnOnce() -> Result<Vec<Record>, BatchError> + Send + 'static,
        permit: OwnedSemaphorePermit,
    ) -> Result<u64, SubmitError> {
        let result = async {
            let batch = tokio::task::spawn_blocking(move || {
                decode().map(|records| EncodedBatch::new(&records))
            })
            .await
            .map_err(|_| SubmitError::ShuttingDown)?
            .map_err(SubmitError::Malformed)?;
            let (ack, done) = oneshot::channel();
            self.jobs
                .send(Job {
                    batch,
                    ack,
                    _permit: permit,
                })
                .await
                .map_err(|_| SubmitError::ShuttingDown)?;
            done.await
                .map_err(|_| SubmitError::ShuttingDown)?
                .map_err(SubmitError::Store)
        }
        .await;
        match &result {
            Ok(n) => {
                self.counters
                    .accepted_batches
                    .fetch_add(1, Ordering::Relaxed);
                self.counters
                    .accepted_records
                    .fetch_add(*n, Ordering::Relaxed);
            }
            Err(e) => e.count(&self.counters),
        }
        result
    }
}

/// The single writer: group commit of whatever batches are waiting.
fn write_loop(mut store: Store, mut jobs: mpsc::Receiver<Job>, max_group_records: usize) {
    while let Some(first) = jobs.blocking_recv() {
        let mut records = first.batch.len();
        let mut group = vec![first];
        while records < max_group_records {
            match jobs.try_recv() {
                Ok(job) => {
                    records += job.batch.len();
                    group.push(job);
                }
                Err(_) => break,
            }
        }
        let batches: Vec<&EncodedBatch> = group.iter().map(|j| &j.batch).collect();
        match store.insert_group(&batches) {
            Ok(results) => {
                for (job, result) in group.into_iter().zip(results) {
                    let _ = job.ack.send(result.map_err(Arc::new));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                for job in group {
                    let _ = job.ack.send(Err(e.clone()));
                }
            }
        }
    }
}

/// A running collector (see the module docs).
#[derive(Debug)]
pub struct Collector {
    grpc_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
    ingest: Arc<Ingest>,
    stop: watch::Sender<bool>,
    servers: Vec<tokio::task::JoinHandle<Result<(), ServeError>>>,
    writer: std::thread::JoinHandle<()>,
}

impl Collector {
    /// Open the store, bind the listeners and start serving on the current
    /// tokio runtime.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cpt_collector::serve::{Collector, ServeConfig};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = ServeConfig::new("cpt.db")
    ///     .with_grpc("127.0.0.1:7070".parse()?)
    ///     .with_http("127.0.0.1:7071".parse()?);
    /// let collector = Collector::start(config).await?;
    /// println!("gRPC on {:?}", collector.grpc_addr());
    /// collector
    ///     .run_until(async {
    ///         let _ = tokio::signal::ctrl_c().await;
    ///     })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// When the store cannot be opened or an address cannot be bound.
    pub async fn start(config: ServeConfig) -> Result<Collector, ServeError> {
        let store = Store::open_with(&config.store, config.durability)?;
        let store_path = store.path().to_path_buf();
        let max_pending = config.max_pending_batches.max(1);
        let (jobs, rx) = mpsc::channel(max_pending);
        let max_group = config.max_group_records.max(1);
        let writer = std::thread::Builder::new()
            .name("cpt-store-writer".into())
            .spawn(move || write_loop(store, rx, max_group))
            .map_err(ServeError::Writer)?;
        let ingest = Arc::new(Ingest {
            admission: Arc::new(Semaphore::new(max_pending)),
            max_pending,
            max_batch_bytes: config.max_batch_bytes,
            jobs,
            counters: Counters::default(),
            store_path,
        });
        let (stop, stopped) = watch::channel(false);
        let mut servers = Vec::new();
        let mut grpc_addr = None;
        let mut http_addr = None;

        if let Some(addr) = config.grpc {
            let listener = bind("grpc", addr).await?;
            grpc_addr = Some(local_addr("grpc", addr, &listener)?);
            let svc = CollectorService {
                ingest: ingest.clone(),
            };
            let signal = wait_stop(stopped.clone());
            servers.push(tokio::spawn(async move {
                tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming_shutdown(
                        tonic::transport::server::TcpIncoming::from(listener)
                            .with_nodelay(Some(true)),
                        signal,
                    )
                    .await
                    .map_err(|e| ServeError::Server {
                        what: "grpc",
                        message: e.to_string(),
                    })
            }));
        }
        if let Some(addr) = config.http {
            let listener = bind("http", addr).await?;
            http_addr = Some(local_addr("http", addr, &listener)?);
            let app = router(ingest.clone());
            let signal = wait_stop(stopped.clone());
            servers.push(tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(signal)
                    .await
                    .map_err(|e| ServeError::Server {
                        what: "http",
                        message: e.to_string(),
                    })
            }));
        }
        Ok(Collector {
            grpc_addr,
            http_addr,
            ingest,
            stop,
            servers,
            writer,
        })
    }

    /// The bound gRPC address, if serving gRPC.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc_addr
    }

    /// The bound HTTP address, if serving HTTP.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.ingest.counters.snapshot()
    }

    /// Run until `signal` resolves or a server fails, then shut down
    /// gracefully.
    ///
    /// # Errors
    ///
    /// The first server failure.
    pub async fn run_until(mut self, signal: impl Future<Output = ()>) -> Result<(), ServeError> {
        let servers = std::mem::take(&mut self.servers);
        let mut failed = Box::pin(async move {
            let mut set = servers;
            while !set.is_empty() {
                let (res, _, rest) = futures_select_all(set).await;
                set = rest;
                match res {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(join) => {
                        return Err(ServeError::Server {
                            what: "collector",
                            message: join.to_string(),
                        });
                    }
                }
            }
            Ok(())
        });
        tokio::select! {
            res = &mut failed => {
                // One server failed: stop the others too, then the writer.
                let _ = self.stop.send(true);
                self.finish().await;
                res
            }
            () = signal => {
                let _ = self.stop.send(true);
                let res = failed.await;
                self.finish().await;
                res
            }
        }
    }

    /// Stop accepting, let in-flight batches finish, and stop the writer.
    ///
    /// # Errors
    ///
    /// A server failure seen while stopping.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        self.run_until(std::future::ready(())).await
    }

    async fn finish(self) {
        let Collector { ingest, writer, .. } = self;
        // The servers are gone; dropping the last sender ends the writer
        // after it has committed what was queued.
        drop(ingest);
        let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    }
}

/// Wait for the first of several join handles (no `futures` dependency).
async fn futures_select_all<T>(
    mut handles: Vec<tokio::task::JoinHandle<T>>,
) -> (
    Result<T, tokio::task::JoinError>,
    usize,
    Vec<tokio::task::JoinHandle<T>>,
) {
    std::future::poll_fn(move |cx| {
        for i in 0..handles.len() {
            if let Poll::Ready(res) = Pin::new(&mut handles[i]).poll(cx) {
                handles.swap_remove(i);
                return Poll::Ready((res, i, std::mem::take(&mut handles)));
            }
        }
        Poll::Pending
    })
    .await
}

async fn wait_stop(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { what, addr, source })
}

fn local_addr(
    what: &'static str,
    addr: SocketAddr,
    l: &TcpListener,
) -> Result<SocketAddr, ServeError> {
    l.local_addr()
        .map_err(|source| ServeError::Bind { what, addr, source })
}

// === HTTP ===

fn router(ingest: Arc<Ingest>) -> Router {
    Router::new()
        .route(ingest::HTTP_RECORDS_PATH, post(post_records))
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
    // Admission first: an overloaded collector does not even read the body.
    let permit = match ingest.admit() {
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
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, limit).collect()).await
    {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            let e = SubmitError::TooLarge { limit };
            e.count(&ingest.counters);
            return e.into_response();
        }
        Ok(Err(e)) => {
            return json_response(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({ "error": format!("cannot read the request body: {e}") }),
            );
        }
        Err(_) => {
            return json_response(
                StatusCode::REQUEST_TIMEOUT,
                &serde_json::json!({ "error": format!("request body not received within {BODY_TIMEOUT:?}") }),
            );
        }
    };
    let decode = move || {
        if gzip {
            format.decode(&gunzip(&bytes, limit)?)
        } else {
            format.decode(&bytes)
        }
    };
    match ingest.submit(decode, permit).await {
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
        Ok(Err(ProfileError::Store(e))) => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &serde_json::json!({ "error": e.to_string() }),
        ),
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
fn profile_from_store(path: &std::path::Path, query: &str) -> Result<Vec<u8>, ProfileError> {
    let sel = crate::records::selection::Selection::from_query(query)
        .map_err(|e| ProfileError::BadQuery(format!("bad profile query {query:?}: {e}")))?;
    let store = Store::open_read_only(path).map_err(ProfileError::Store)?;
    let mut first_err = None;
    let records = store
        .records(&sel)
        .map_err(ProfileError::Store)?
        .filter_map(|r| match r {
            Ok(r) => Some(r),
            Err(e) => {
                first_err.get_or_insert(e);
                None
            }
        });
    let agg = crate::profile::aggregate::Aggregate::from_records(&sel, records);
    if let Some(e) = first_err {
        return Err(ProfileError::Store(e));
    }
    Ok(crate::profile::encode_gzip(&agg))
}

// === gRPC ===

/// The hand-written tonic service for `cpt.collector.v1.Collector`.
#[derive(Clone, Debug)]
struct CollectorService {
    ingest: Arc<Ingest>,
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
    ingest: Arc<Ingest>,
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
