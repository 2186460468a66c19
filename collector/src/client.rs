//! The client services use to ship records to a `cpt serve` collector.
//!
//! [`CollectorClient`] implements the SDK's [`Export`]: put it behind the
//! SDK's asynchronous [`Exporter`](cpt_sdk::export::Exporter), which owns the
//! bounded queue, the batching and the drop counter, and calls
//! [`Export::export`] on its worker thread, never on a request path. The
//! client then sends each batch over gRPC (`Collector/Export`) or HTTP
//! (`POST /v1/records`, protobuf body) and:
//!
//! - **retries with exponential backoff** (jittered within
//!   `[backoff/2, backoff]`, doubling up to
//!   [`CollectorClientBuilder::with_max_backoff`], never shorter than an HTTP
//!   `Retry-After`) when the collector pushes back or cannot be reached:
//!   HTTP 408/429/5xx, gRPC `RESOURCE_EXHAUSTED`/`UNAVAILABLE`/
//!   `DEADLINE_EXCEEDED`/`ABORTED`/`CANCELLED`/`UNKNOWN`, connection errors
//!   and timeouts;
//! - **does not retry** a batch the collector refused as malformed (other
//!   HTTP 4xx, `INVALID_ARGUMENT`, `OUT_OF_RANGE`, …): counted in
//!   [`ClientStats::rejected_records`];
//! - gives up after [`CollectorClientBuilder::with_max_attempts`] attempts:
//!   counted in [`ClientStats::dropped_after_retries`].
//!
//! Either failure is also an `Err` to the exporter, which counts it as
//! failed; records the queue could not take are counted by the exporter as
//! dropped. While a batch is retried, new records wait in the exporter's
//! bounded queue (and are dropped when it is full), so memory stays bounded
//! and requests never wait.
//!
//! ```no_run
//! use cpt_collector::client::{CollectorClient, Endpoint};
//! use cpt_sdk::export::Exporter;
//!
//! let client = CollectorClient::builder(Endpoint::parse("grpc://127.0.0.1:7070")?).build();
//! let stats = client.stats();
//! let (sink, handle) = Exporter::builder().with_queue_capacity(4096).build(client);
//! // CriticalPathLayer::builder().with_sink(sink) …
//! # drop(sink);
//! // at shutdown:
//! handle.flush(std::time::Duration::from_secs(5));
//! println!("exported {} dropped {} retries {}", handle.exported(), handle.dropped(), stats.retries());
//! handle.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use cpt_sdk::Record;
use cpt_sdk::export::{Export, ExportError};
use http::{StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prost::Message;
use tonic::Code;

use crate::ingest::codec::WireCodec;
use crate::ingest::{self, proto};

/// Where the collector listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// gRPC, e.g. `http://127.0.0.1:7070` (plaintext HTTP/2).
    Grpc(Uri),
    /// HTTP ingest URL, e.g. `http://127.0.0.1:7071/v1/records`.
    Http(Uri),
}

/// An endpoint string that is not understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad collector endpoint {input:?}: {reason}")]
pub struct EndpointError {
    input: String,
    reason: String,
}

impl Endpoint {
    /// Parse `grpc://HOST:PORT` (gRPC) or `http://HOST:PORT[/path]` (HTTP;
    /// the path defaults to `/v1/records`).
    ///
    /// # Errors
    ///
    /// Another scheme (TLS is not supported by this client), or an invalid URI.
    pub fn parse(s: &str) -> Result<Endpoint, EndpointError> {
        let err = |reason: &str| EndpointError {
            input: s.to_owned(),
            reason: reason.to_owned(),
        };
        if let Some(rest) = s.strip_prefix("grpc://") {
            let uri: Uri = format!("http://{rest}")
                .parse()
                .map_err(|_| err("not a URI"))?;
            return Ok(Endpoint::Grpc(uri));
        }
        if s.starts_with("http://") {
            let uri: Uri = s.parse().map_err(|_| err("not a URI"))?;
            let uri = if uri.path() == "/" && !s.ends_with('/') {
                format!("{s}{}", ingest::HTTP_RECORDS_PATH)
                    .parse()
                    .map_err(|_| err("not a URI"))?
            } else {
                uri
            };
            return Ok(Endpoint::Http(uri));
        }
        Err(err(
            "expected grpc://HOST:PORT or http://HOST:PORT[/path] (TLS is not supported)",
        ))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Grpc(u) => write!(f, "grpc {u}"),
            Endpoint::Http(u) => write!(f, "http {u}"),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    exported_records: AtomicU64,
    exported_batches: AtomicU64,
    dropped_after_retries: AtomicU64,
    rejected_records: AtomicU64,
    retries: AtomicU64,
    last_error: std::sync::Mutex<Option<String>>,
}

/// A live view of a [`CollectorClient`]'s counters (cheap to clone; read it
/// from any thread while the exporter owns the client).
#[derive(Clone, Debug, Default)]
pub struct ClientStats {
    counters: Arc<Counters>,
}

impl ClientStats {
    fn load(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }

    /// Records the collector acknowledged (durable).
    pub fn exported_records(&self) -> u64 {
        Self::load(&self.counters.exported_records)
    }

    /// Batches the collector acknowledged.
    pub fn exported_batches(&self) -> u64 {
        Self::load(&self.counters.exported_batches)
    }

    /// Records given up on after the last attempt failed.
    pub fn dropped_after_retries(&self) -> u64 {
        Self::load(&self.counters.dropped_after_retries)
    }

    /// Records the collector refused as malformed (never retried).
    pub fn rejected_records(&self) -> u64 {
        Self::load(&self.counters.rejected_records)
    }

    /// Attempts after the first, over all batches.
    pub fn retries(&self) -> u64 {
        Self::load(&self.counters.retries)
    }

    /// The last failure seen (`HTTP 429 Too Many Requests: …`, a connection
    /// error, …), if any.
    pub fn last_error(&self) -> Option<String> {
        self.counters.last_error.lock().ok().and_then(|e| e.clone())
    }

    fn set_last_error(&self, reason: &str) {
        if let Ok(mut e) = self.counters.last_error.lock() {
            *e = Some(reason.to_owned());
        }
    }
}

/// Configures a [`CollectorClient`].
#[derive(Clone, Debug)]
pub struct CollectorClientBuilder {
    endpoint: Endpoint,
    initial_backoff: Duration,
    max_backoff: Duration,
    max_attempts: u32,
    request_timeout: Duration,
    token: Option<Token>,
}

/// The ingest credential; never printed.
#[derive(Clone)]
struct Token(http::HeaderValue);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(…)")
    }
}

/// A token that cannot be sent in an HTTP header.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad ingest token: {0}")]
pub struct TokenError(String);

impl CollectorClientBuilder {
    /// Send `authorization: Bearer <token>` with every batch, for a
    /// collector started with `--ingest-token-file` (surrounding whitespace,
    /// such as a file's final newline, is trimmed). Default: none.
    ///
    /// # Errors
    ///
    /// When the token is empty or has characters a header cannot carry.
    pub fn with_token(mut self, token: &str) -> Result<Self, TokenError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(TokenError("empty".into()));
        }
        let mut value = http::HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| {
            TokenError("has characters an HTTP header cannot carry (use visible ASCII)".into())
        })?;
        value.set_sensitive(true);
        self.token = Some(Token(value));
        Ok(self)
    }

    /// First retry delay (default 100 ms); doubles on each retry.
    pub fn with_initial_backoff(mut self, d: Duration) -> Self {
        self.initial_backoff = d;
        self
    }

    /// Largest retry delay (default 10 s).
    pub fn with_max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff = d;
        self
    }

    /// Attempts per batch, the first included (default 8).
    pub fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Timeout of one attempt (default 10 s).
    pub fn with_request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// The client. Its runtime and connection are made on first use, on the
    /// exporter's worker thread.
    pub fn build(self) -> CollectorClient {
        CollectorClient {
            config: self,
            conn: None,
            stats: ClientStats::default(),
            seed: jitter_seed(),
        }
    }
}

/// Ships batches to a collector with retries; an SDK [`Export`]. See the
/// [module docs](self).
pub struct CollectorClient {
    config: CollectorClientBuilder,
    conn: Option<(tokio::runtime::Runtime, Transport)>,
    stats: ClientStats,
    seed: u64,
}

impl fmt::Debug for CollectorClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectorClient")
            .field("endpoint", &self.config.endpoint)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Why a batch could not be delivered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The collector refused the batch (not retried).
    #[error("collector rejected the batch: {reason}")]
    Rejected {
        /// What it said.
        reason: String,
    },
    /// Every attempt failed.
    #[error("batch dropped after {attempts} attempts: {reason}")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        reason: String,
    },
    /// The client's runtime could not start.
    #[error("cannot start the client runtime: {0}")]
    Runtime(std::io::Error),
}

/// How one attempt failed.
enum Attempt {
    Retry {
        reason: String,
        after: Option<Duration>,
    },
    Refused {
        reason: String,
    },
}

impl CollectorClient {
    /// Configure a client for `endpoint`.
    pub fn builder(endpoint: Endpoint) -> CollectorClientBuilder {
        CollectorClientBuilder {
            endpoint,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            max_attempts: 8,
            request_timeout: Duration::from_secs(10),
            token: None,
        }
    }

    /// A live view of the counters.
    pub fn stats(&self) -> ClientStats {
        self.stats.clone()
    }

    /// Send one batch, retrying as the [module docs](self) say; returns once
    /// the collector acknowledged it (it is durable) or the client gave up.
    /// Blocks the calling thread: call it from the exporter's worker (or
    /// any thread outside an async runtime), never on a request path.
    ///
    /// # Errors
    ///
    /// [`SendError::Rejected`] (not retried) or [`SendError::GaveUp`].
    pub fn send(&mut self, batch: &[Record]) -> Result<(), SendError> {
        if batch.is_empty() {
            return Ok(());
        }
        if self.conn.is_none() {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(SendError::Runtime)?;
            // tonic's lazy channel spawns onto the runtime it is made in.
            let transport = {
                let _enter = rt.enter();
                Transport::new(&self.config.endpoint, self.config.token.clone())
            };
            self.conn = Some((rt, transport));
        }
        let n = batch.len() as u64;
        let pb = proto::RecordBatch::from_records(batch);
        let config = self.config.clone();
        let stats = self.stats.clone();
        let mut seed = self.seed;
        let (rt, transport) = self.conn.as_mut().expect("connected above");
        let result = rt.block_on(async {
            let mut backoff = config.initial_backoff;
            let mut attempt = 1;
            loop {
                let outcome =
                    match tokio::time::timeout(config.request_timeout, transport.send(&pb)).await {
                        Ok(r) => r,
                        Err(_) => Err(Attempt::Retry {
                            reason: format!("no answer within {:?}", config.request_timeout),
                            after: None,
                        }),
                    };
                match outcome {
                    Ok(()) => return Ok(()),
                    Err(Attempt::Refused { reason }) => {
                        stats.set_last_error(&reason);
                        return Err(SendError::Rejected { reason });
                    }
                    Err(Attempt::Retry { reason, after }) => {
                        stats.set_last_error(&reason);
                        if attempt >= config.max_attempts {
                            return Err(SendError::GaveUp {
                                attempts: attempt,
                                reason,
                            });
                        }
                        stats.counters.retries.fetch_add(1, Ordering::Relaxed);
                        let jittered = backoff / 2 + backoff.mul_f64(next_jitter(&mut seed) / 2.0);
                        let delay = after
                            .map_or(jittered, |a| a.max(jittered))
                            .min(config.max_backoff);
                        tokio::time::sleep(delay).await;
                        backoff = (backoff * 2).min(config.max_backoff);
                        attempt += 1;
                    }
                }
            }
        });
        self.seed = seed;
        let c = &self.stats.counters;
        match &result {
            Ok(()) => {
                c.exported_records.fetch_add(n, Ordering::Relaxed);
                c.exported_batches.fetch_add(1, Ordering::Relaxed);
            }
            Err(SendError::Rejected { .. }) => {
                c.rejected_records.fetch_add(n, Ordering::Relaxed);
            }
            Err(_) => {
                c.dropped_after_retries.fetch_add(n, Ordering::Relaxed);
            }
        }
        result
    }
}

impl Export for CollectorClient {
    fn export(&mut self, batch: &[Record]) -> Result<(), ExportError> {
        self.send(batch).map_err(ExportError::new)
    }
}

/// A number in [0, 1) (xorshift; jitter needs no cryptographic quality).
fn next_jitter(seed: &mut u64) -> f64 {
    let mut x = *seed;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *seed = x;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

fn jitter_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ u64::from(std::process::id()).rotate_left(32)) | 1
}

struct Transport {
    token: Option<Token>,
    kind: TransportKind,
}

enum TransportKind {
    Http {
        client: Box<HttpClient<HttpConnector, Full<Bytes>>>,
        uri: Uri,
    },
    Grpc {
        grpc: tonic::client::Grpc<tonic::transport::Channel>,
    },
}

impl Transport {
    fn new(endpoint: &Endpoint, token: Option<Token>) -> Transport {
        Transport {
            token,
            kind: TransportKind::new(endpoint),
        }
    }

    async fn send(&mut self, batch: &proto::RecordBatch) -> Result<(), Attempt> {
        self.kind.send(batch, self.token.as_ref()).await
    }
}

impl TransportKind {
    fn new(endpoint: &Endpoint) -> TransportKind {
        match endpoint {
            Endpoint::Http(uri) => {
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                connector.set_connect_timeout(Some(Duration::from_secs(5)));
                TransportKind::Http {
                    client: Box::new(HttpClient::builder(TokioExecutor::new()).build(connector)),
                    uri: uri.clone(),
                }
            }
            Endpoint::Grpc(uri) => {
                let channel = tonic::transport::Endpoint::from(uri.clone())
                    .connect_timeout(Duration::from_secs(5))
                    .tcp_nodelay(true)
                    .connect_lazy();
                TransportKind::Grpc {
                    grpc: tonic::client::Grpc::new(channel),
                }
            }
        }
    }

    async fn send(
        &mut self,
        batch: &proto::RecordBatch,
        token: Option<&Token>,
    ) -> Result<(), Attempt> {
        match self {
            TransportKind::Http { client, uri } => {
                let mut req = http::Request::post(uri.clone())
                    .header(header::CONTENT_TYPE, ingest::CONTENT_TYPE_PROTOBUF)
                    .body(Full::new(Bytes::from(batch.encode_to_vec())))
                    .expect("a POST with a valid URI always builds; this is a bug");
                if let Some(t) = token {
                    req.headers_mut().insert(header::AUTHORIZATION, t.0.clone());
                }
                let resp = client.request(req).await.map_err(|e| Attempt::Retry {
                    reason: format!("cannot reach the collector: {e}"),
                    after: None,
                })?;
                let status = resp.status();
                let after = resp
                    .headers()
                    .get(header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                // Read the body so the connection can be reused.
                let text = resp
                    .into_body()
                    .collect()
                    .await
                    .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                    .unwrap_or_default();
                if status.is_success() {
                    return Ok(());
                }
                let reason = format!("HTTP {status}: {}", text.trim());
                if status == StatusCode::TOO_MANY_REQUESTS
                    || status == StatusCode::REQUEST_TIMEOUT
                    || status.is_server_error()
                {
                    Err(Attempt::Retry { reason, after })
                } else {
                    Err(Attempt::Refused { reason })
                }
            }
            TransportKind::Grpc { grpc } => {
                grpc.ready().await.map_err(|e| Attempt::Retry {
                    reason: format!("cannot reach the collector: {e}"),
                    after: None,
                })?;
                let path = http::uri::PathAndQuery::from_static(ingest::GRPC_EXPORT_PATH);
                let codec = WireCodec::<proto::RecordBatch, proto::ExportResponse>::default();
                let mut req = tonic::Request::new(batch.clone());
                if let Some(t) = token {
                    let value = tonic::metadata::MetadataValue::try_from(t.0.as_bytes())
                        .expect("a valid header value is valid ASCII metadata; this is a bug");
                    req.metadata_mut().insert("authorization", value);
                }
                match grpc.unary(req, path, codec).await {
                    Ok(_) => Ok(()),
                    Err(status) => {
                        let reason = format!("gRPC {:?}: {}", status.code(), status.message());
                        match status.code() {
                            Code::ResourceExhausted
                            | Code::Unavailable
                            | Code::DeadlineExceeded
                            | Code::Aborted
                            | Code::Cancelled
                            | Code::Unknown => Err(Attempt::Retry {
                                reason,
                                after: None,
                            }),
                            _ => Err(Attempt::Refused { reason }),
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const ENDPOINTS: &[(&str, Option<&str>)] = &[
        ("grpc://127.0.0.1:7070", Some("grpc http://127.0.0.1:7070/")),
        ("http://127.0.0.1:7071", Some("http http://127.0.0.1:7071/v1/records")),
        ("http://127.0.0.1:7071/ingest", Some("http http://127.0.0.1:7071/ingest")),
        ("https://collector:443", None),
        ("127.0.0.1:7070", None),
    ];

    #[test]
    fn endpoints_parse() {
        for (input, want) in ENDPOINTS {
            let got = Endpoint::parse(input).map(|e| e.to_string()).ok();
            assert_eq!(got.as_deref(), *want, "{input}");
        }
    }
}
