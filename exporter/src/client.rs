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
//!   counted in [`ClientStats::dropped_after_retries`], unless a spool
//!   takes the batch (below).
//!
//! Every batch carries a **batch id** (the `cpt-batch-id` header or gRPC
//! metadata, [`proto::BATCH_ID_HEADER`]): 32 hex digits, a random prefix per
//! client and a counter, the same on every retry and replay of the batch.
//! `cpt serve` stores a batch id once, so a batch resent because its
//! acknowledgement was lost (the collector committed, then the connection
//! dropped) is not stored twice.
//!
//! # When the collector is down: the spool
//!
//! With [`CollectorClientBuilder::with_spool`] (or `CPT_SPOOL_DIR`, through
//! [`CollectorClientBuilder::with_env`]) a batch the client gave up on is
//! appended to a bounded on-disk [`Spool`] instead of being lost, and
//! returns `Ok` to the exporter (it is durable on disk). While anything is
//! spooled, new batches are appended behind it (order is kept) and the
//! spool is replayed, oldest first, one attempt per batch, at most every
//! backoff interval (doubling up to the maximum backoff while the
//! collector stays down): before a new batch is sent, when the exporter is
//! idle ([`Export::idle`]) and at its final flush. A replay slice lasts at
//! most [`REPLAY_SLICE`] before the worker goes back to its queue. Only when
//! the spool is full is a batch dropped: counted in
//! [`ClientStats::spool_dropped_records`] (and `dropped_after_retries`),
//! the older spooled batches stay. A spool left by an earlier run (or a
//! crash) is replayed by the next client that opens it; see [`Spool`] for
//! the file format and its crash safety. The request path is unchanged: it
//! still does one `try_send` into the exporter's queue; the spool is
//! written on the exporter's worker thread only.
//!
//! Either failure is also an `Err` to the exporter, which counts it as
//! failed; records the queue could not take are counted by the exporter as
//! dropped. While a batch is retried, new records wait in the exporter's
//! bounded queue (and are dropped when it is full), so memory stays bounded
//! and requests never wait.
//!
//! ```no_run
//! use cpt_exporter::client::{CollectorClient, Endpoint};
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
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cpt_sdk::Record;
use cpt_sdk::export::{Export, ExportError};
use prost::Message;

use crate::proto;
use crate::spool::{AppendError, Spool, SpoolError};

mod health;
mod transport;

use transport::{Attempt, Tls, Token, Transport};
pub use transport::{CaFileError, Endpoint, EndpointError};

/// The spool's bound when none is given (`CPT_SPOOL_MAX_BYTES` unset).
pub const DEFAULT_SPOOL_MAX_BYTES: u64 = 64 << 20;
/// How long one replay of the spool may keep the exporter's worker from its
/// queue before it takes new records again.
pub const REPLAY_SLICE: Duration = Duration::from_millis(250);

#[derive(Debug, Default)]
struct Counters {
    exported_records: AtomicU64,
    exported_batches: AtomicU64,
    dropped_after_retries: AtomicU64,
    rejected_records: AtomicU64,
    retries: AtomicU64,
    spooled_records: AtomicU64,
    replayed_records: AtomicU64,
    spool_dropped_records: AtomicU64,
    spool_pending_records: AtomicU64,
    spool_tears: AtomicU64,
    last_error: std::sync::Mutex<Option<String>>,
}

/// A live view of a [`CollectorClient`]'s counters (cheap to clone; read it
/// from any thread while the exporter owns the client). Its `Debug` prints
/// the counters' current values.
#[derive(Clone, Default)]
pub struct ClientStats {
    counters: Arc<Counters>,
}

impl fmt::Debug for ClientStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientStats")
            .field("exported_records", &self.exported_records())
            .field("exported_batches", &self.exported_batches())
            .field("dropped_after_retries", &self.dropped_after_retries())
            .field("rejected_records", &self.rejected_records())
            .field("retries", &self.retries())
            .field("spooled_records", &self.spooled_records())
            .field("replayed_records", &self.replayed_records())
            .field("spool_dropped_records", &self.spool_dropped_records())
            .field("spool_pending_records", &self.spool_pending_records())
            .field("spool_tears", &self.spool_tears())
            .field("last_error", &self.last_error())
            .finish()
    }
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

    /// Records given up on after the last attempt failed, and not spooled
    /// (no spool, or it was full): lost.
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

    /// Records appended to the spool (the collector could not take them, or
    /// older batches were waiting there).
    pub fn spooled_records(&self) -> u64 {
        Self::load(&self.counters.spooled_records)
    }

    /// Records delivered from the spool (also in
    /// [`exported_records`](Self::exported_records)).
    pub fn replayed_records(&self) -> u64 {
        Self::load(&self.counters.replayed_records)
    }

    /// Records dropped because the spool was full (or could not be written,
    /// or a spooled batch was found damaged): lost.
    pub fn spool_dropped_records(&self) -> u64 {
        Self::load(&self.counters.spool_dropped_records)
    }

    /// Records waiting in the spool now.
    pub fn spool_pending_records(&self) -> u64 {
        Self::load(&self.counters.spool_pending_records)
    }

    /// Torn tails found (and cut off) and damaged entries skipped when the
    /// spool was opened (a crash while appending, a corrupted disk);
    /// [`last_error`](Self::last_error) describes the last, with the records
    /// lost.
    pub fn spool_tears(&self) -> u64 {
        Self::load(&self.counters.spool_tears)
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
    spool: Option<(PathBuf, u64)>,
    tls: Tls,
}

/// A token that cannot be sent in an HTTP header.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad ingest token: {0}")]
pub struct TokenError(String);

impl CollectorClientBuilder {
    /// Trust the certificate authorities of this PEM file for a `grpcs://`
    /// or `https://` endpoint (a private CA, or the collector's self-signed
    /// certificate), instead of the system's roots.
    ///
    /// # Errors
    ///
    /// When the file cannot be read or holds no usable certificate.
    pub fn with_ca_file(mut self, path: impl AsRef<std::path::Path>) -> Result<Self, CaFileError> {
        self.tls = Tls::from_ca_file(path.as_ref())?;
        Ok(self)
    }

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

    /// Keep batches the collector could not take in a bounded on-disk spool
    /// in `dir` (a directory of this process's own), at most `max_bytes`
    /// of them, and replay them when it answers again (see the
    /// [module docs](self#when-the-collector-is-down-the-spool)). Default: no
    /// spool (given-up batches are lost and counted).
    pub fn with_spool(mut self, dir: impl Into<PathBuf>, max_bytes: u64) -> Self {
        self.spool = Some((dir.into(), max_bytes.max(1)));
        self
    }

    /// Apply the `CPT_*` settings of the record shipper found in `env`:
    /// `CPT_SPOOL_DIR` turns the spool on (`CPT_SPOOL_MAX_BYTES` bounds it,
    /// default [`DEFAULT_SPOOL_MAX_BYTES`]). Unset variables leave the
    /// builder's settings alone.
    pub fn with_env(mut self, env: &cpt_sdk::env::CptEnv) -> Self {
        if let Some(dir) = &env.spool_dir {
            let max = env
                .spool_max_bytes
                .or(self.spool.as_ref().map(|s| s.1))
                .unwrap_or(DEFAULT_SPOOL_MAX_BYTES);
            self.spool = Some((dir.clone(), max));
        } else if let (Some(max), Some(spool)) = (env.spool_max_bytes, &mut self.spool) {
            spool.1 = max;
        }
        self
    }

    /// [`with_env`](Self::with_env) with the process environment.
    ///
    /// # Errors
    ///
    /// A malformed `CPT_*` variable ([`CptEnv::from_env`](cpt_sdk::env::CptEnv::from_env)).
    pub fn try_with_default_env(self) -> Result<Self, cpt_sdk::env::EnvError> {
        Ok(self.with_env(&cpt_sdk::env::CptEnv::from_env()?))
    }

    /// The client. Its runtime and connection are made on first use, on the
    /// exporter's worker thread; the spool, if any, is opened (and
    /// recovered) here.
    ///
    /// # Panics
    ///
    /// When the spool cannot be opened; [`try_build`](Self::try_build)
    /// returns that error instead.
    pub fn build(self) -> CollectorClient {
        self.try_build()
            .unwrap_or_else(|e| panic!("cpt collector client: {e}"))
    }

    /// [`build`](Self::build), returning the spool's error.
    ///
    /// # Errors
    ///
    /// When the spool directory cannot be created or read, or holds a file
    /// that is not a spool segment ([`SpoolError`]).
    pub fn try_build(self) -> Result<CollectorClient, SpoolError> {
        let stats = ClientStats::default();
        let spool = match &self.spool {
            None => None,
            Some((dir, max)) => {
                let spool = Spool::open(dir, *max)?;
                let r = spool.recovery();
                let c = &stats.counters;
                c.spool_pending_records
                    .store(r.pending_records, Ordering::Relaxed);
                c.spool_tears
                    .store((r.torn.len() + r.damaged.len()) as u64, Ordering::Relaxed);
                if let Some(tear) = r.torn.last() {
                    stats.set_last_error(&format!(
                        "spool torn tail (a crash while appending): {tear}"
                    ));
                }
                for damage in &r.damaged {
                    stats.set_last_error(&format!(
                        "spool damaged entry skipped (the entries after it are replayed): {damage}"
                    ));
                }
                if let Some(reset) = &r.cursor_reset {
                    stats.set_last_error(&format!("spool cursor reset: {reset}"));
                }
                Some(spool)
            }
        };
        Ok(CollectorClient {
            replay_backoff: self.initial_backoff,
            config: self,
            conn: None,
            stats,
            seed: jitter_seed(),
            ids: BatchIds::new(),
            spool,
            next_replay: Instant::now(),
            health: health::Health::default(),
        })
    }
}

/// Batch ids: a random 64-bit prefix per client and a counter, as 32 hex
/// digits.
struct BatchIds {
    prefix: u64,
    next: u64,
}

impl BatchIds {
    fn new() -> BatchIds {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded from the OS's randomness.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(jitter_seed());
        h.write_u32(std::process::id());
        BatchIds {
            prefix: h.finish(),
            next: 0,
        }
    }

    fn next_id(&mut self) -> String {
        let id = format!("{:016x}{:016x}", self.prefix, self.next);
        self.next += 1;
        id
    }
}

/// Ships batches to a collector with retries; an SDK [`Export`]. See the
/// [module docs](self).
pub struct CollectorClient {
    config: CollectorClientBuilder,
    conn: Option<(tokio::runtime::Runtime, Transport)>,
    stats: ClientStats,
    seed: u64,
    ids: BatchIds,
    spool: Option<Spool>,
    /// No replay before this.
    next_replay: Instant,
    /// The wait after the next failed replay.
    replay_backoff: Duration,
    /// What the log has been told about the collector.
    health: health::Health,
}

impl fmt::Debug for CollectorClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectorClient")
            .field("endpoint", &self.config.endpoint)
            .field("spool", &self.spool)
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
    #[error("batch dropped after {attempts} attempts to the collector at {endpoint}: {reason}")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// The collector's endpoint.
        endpoint: String,
        /// The last failure.
        reason: String,
    },
    /// The client's runtime could not start.
    #[error("cannot start the client runtime: {0}")]
    Runtime(std::io::Error),
    /// The collector could not take the batch and neither could the spool
    /// (full, or writing failed): the batch is dropped.
    #[error("batch dropped: the collector could not take it ({reason}) and {spool}")]
    Spool {
        /// Why the collector could not take it.
        reason: String,
        /// Why the spool could not.
        spool: AppendError,
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
            spool: None,
            tls: Tls::default(),
        }
    }

    /// A live view of the counters.
    pub fn stats(&self) -> ClientStats {
        self.stats.clone()
    }

    /// Send one batch, retrying as the [module docs](self) say; returns once
    /// the collector acknowledged it (it is durable), the spool took it
    /// (durable on disk, replayed later), or the client gave up.
    /// Blocks the calling thread: call it from the exporter's worker (or
    /// any thread outside an async runtime), never on a request path.
    ///
    /// # Errors
    ///
    /// [`SendError::Rejected`] (not retried), [`SendError::GaveUp`] (no
    /// spool) or [`SendError::Spool`] (the spool is full).
    pub fn send(&mut self, batch: &[Record]) -> Result<(), SendError> {
        if batch.is_empty() {
            return Ok(());
        }
        let n = batch.len() as u64;
        let pb = proto::RecordBatch::from_records(batch);
        let id = self.ids.next_id();
        if self.spooled() > 0 {
            if Instant::now() >= self.next_replay {
                self.replay_for(Some(REPLAY_SLICE));
            }
            if self.spooled() > 0 {
                // Behind older batches: keep the order.
                return self.spool_batch(&id, &pb, n, "older batches are waiting in the spool");
            }
        }
        let result = self.deliver(&id, &pb, self.config.max_attempts);
        let c = &self.stats.counters;
        match result {
            Ok(()) => {
                c.exported_records.fetch_add(n, Ordering::Relaxed);
                c.exported_batches.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            // Counted in `rejected_records` by `deliver`, before its warning.
            Err(SendError::Rejected { .. }) => result,
            Err(SendError::GaveUp { reason, .. }) if self.spool.is_some() => {
                self.replay_failed();
                self.spool_batch(&id, &pb, n, &reason)
            }
            Err(_) => {
                c.dropped_after_retries.fetch_add(n, Ordering::Relaxed);
                result
            }
        }
    }

    /// Deliver what waits in the spool now, oldest first, one attempt per
    /// batch, until the spool is empty or an attempt fails (the collector is
    /// still down). Returns the records delivered. Without a spool it does
    /// nothing. The exporter's worker calls this by itself (when idle, before
    /// new batches, at its final flush); call it directly only when driving
    /// the client without an exporter.
    pub fn replay(&mut self) -> u64 {
        self.replay_for(None)
    }

    fn spooled(&self) -> usize {
        self.spool.as_ref().map_or(0, Spool::len)
    }

    /// Wait longer before the next replay (the collector is still down).
    fn replay_failed(&mut self) {
        self.next_replay = Instant::now() + self.replay_backoff;
        self.replay_backoff = (self.replay_backoff * 2).min(self.config.max_backoff);
    }

    fn spool_batch(
        &mut self,
        id: &str,
        pb: &proto::RecordBatch,
        n: u64,
        reason: &str,
    ) -> Result<(), SendError> {
        let spool = self
            .spool
            .as_mut()
            .expect("spool_batch is only called with a spool; this is a bug");
        let c = &self.stats.counters;
        let records = u32::try_from(n).unwrap_or(u32::MAX);
        let result = spool.append(id, records, &pb.encode_to_vec());
        c.spool_pending_records
            .store(spool.pending_records(), Ordering::Relaxed);
        match result {
            Ok(()) => {
                c.spooled_records.fetch_add(n, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                c.spool_dropped_records.fetch_add(n, Ordering::Relaxed);
                c.dropped_after_retries.fetch_add(n, Ordering::Relaxed);
                let e = SendError::Spool {
                    reason: reason.to_owned(),
                    spool: e,
                };
                self.stats.set_last_error(&e.to_string());
                Err(e)
            }
        }
    }

    /// Replay until the spool is empty, an attempt fails, or `budget` is
    /// used up.
    fn replay_for(&mut self, budget: Option<Duration>) -> u64 {
        let start = Instant::now();
        let mut delivered = 0;
        while let Some(spool) = self.spool.as_mut() {
            let c = &self.stats.counters;
            let entry = match spool.front() {
                Ok(None) => {
                    self.replay_backoff = self.config.initial_backoff;
                    break;
                }
                Ok(Some(e)) => match proto::RecordBatch::decode(&*e.body) {
                    Ok(pb) => Ok((e.batch_id, pb)),
                    Err(err) => Err(format!(
                        "spooled batch {} does not decode: {err}",
                        e.batch_id
                    )),
                },
                Err(e) => Err(e.to_string()),
            };
            let (id, pb) = match entry {
                Ok(x) => x,
                Err(reason) => {
                    // Damaged on disk since it was written: skip it.
                    self.stats.set_last_error(&reason);
                    match spool.pop_front() {
                        Ok(n) => {
                            c.spool_dropped_records
                                .fetch_add(u64::from(n), Ordering::Relaxed);
                            continue;
                        }
                        Err(e) => {
                            self.stats.set_last_error(&e.to_string());
                            self.replay_failed();
                            break;
                        }
                    }
                }
            };
            let n = pb.records.len() as u64;
            match self.deliver(&id, &pb, 1) {
                Ok(()) => {
                    let c = &self.stats.counters;
                    c.exported_records.fetch_add(n, Ordering::Relaxed);
                    c.exported_batches.fetch_add(1, Ordering::Relaxed);
                    c.replayed_records.fetch_add(n, Ordering::Relaxed);
                    delivered += n;
                    let spool = self.spool.as_mut().expect("replaying a spool");
                    if let Err(e) = spool.pop_front() {
                        // The cursor did not move: the batch goes again
                        // later, and the collector ignores its id then.
                        self.stats.set_last_error(&e.to_string());
                        self.replay_failed();
                        break;
                    }
                }
                Err(SendError::Rejected { .. }) => {
                    let spool = self.spool.as_mut().expect("replaying a spool");
                    if let Err(e) = spool.pop_front() {
                        self.stats.set_last_error(&e.to_string());
                        self.replay_failed();
                        break;
                    }
                }
                Err(_) => {
                    self.replay_failed();
                    break;
                }
            }
            if budget.is_some_and(|b| start.elapsed() >= b) {
                break;
            }
        }
        if let Some(spool) = &self.spool {
            self.stats
                .counters
                .spool_pending_records
                .store(spool.pending_records(), Ordering::Relaxed);
        }
        delivered
    }

    /// One batch, up to `max_attempts` attempts with backoff. A refused
    /// batch's records are counted in `rejected_records` here, before the
    /// line that reports the total.
    fn deliver(
        &mut self,
        id: &str,
        pb: &proto::RecordBatch,
        max_attempts: u32,
    ) -> Result<(), SendError> {
        if self.conn.is_none() {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(SendError::Runtime)?;
            // tonic's lazy channel spawns onto the runtime it is made in.
            let transport = {
                let _enter = rt.enter();
                Transport::new(
                    &self.config.endpoint,
                    self.config.token.clone(),
                    &self.config.tls,
                )
            };
            self.conn = Some((rt, transport));
        }
        let id = http::HeaderValue::from_str(id)
            .expect("batch ids are hex digits, a valid header value; this is a bug");
        let config = self.config.clone();
        let stats = self.stats.clone();
        let mut seed = self.seed;
        let health = &mut self.health;
        let (rt, transport) = self.conn.as_mut().expect("connected above");
        let result = rt.block_on(async {
            let mut backoff = config.initial_backoff;
            let mut attempt = 1;
            loop {
                let outcome =
                    match tokio::time::timeout(config.request_timeout, transport.send(pb, &id))
                        .await
                    {
                        Ok(r) => r,
                        Err(_) => Err(Attempt::Retry {
                            reason: format!("no answer within {:?}", config.request_timeout),
                            after: None,
                        }),
                    };
                match outcome {
                    Ok(()) => {
                        health.delivered(&config.endpoint, &stats);
                        return Ok(());
                    }
                    Err(Attempt::Refused { reason }) => {
                        stats.set_last_error(&reason);
                        stats
                            .counters
                            .rejected_records
                            .fetch_add(pb.records.len() as u64, Ordering::Relaxed);
                        health.refused(&config.endpoint, &reason, &stats);
                        return Err(SendError::Rejected { reason });
                    }
                    Err(Attempt::Retry { reason, after }) => {
                        stats.set_last_error(&reason);
                        health.unreachable(&config.endpoint, &reason, &stats);
                        if attempt >= max_attempts {
                            return Err(SendError::GaveUp {
                                attempts: attempt,
                                endpoint: config.endpoint.to_string(),
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
        result
    }
}

impl Export for CollectorClient {
    fn export(&mut self, batch: &[Record]) -> Result<(), ExportError> {
        self.send(batch).map_err(ExportError::new)
    }

    /// Replay the spool when a replay is due.
    fn idle(&mut self) -> Result<(), ExportError> {
        if self.spooled() > 0 && Instant::now() >= self.next_replay {
            self.replay_for(Some(REPLAY_SLICE));
        }
        Ok(())
    }

    /// Replay the spool (the exporter's final flush): what the collector
    /// does not take now stays on disk for the next run.
    fn flush(&mut self) -> Result<(), ExportError> {
        if self.spooled() > 0 {
            self.replay_for(None);
        }
        Ok(())
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
