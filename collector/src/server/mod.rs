//! `cpt serve`: the long-running collector.
//!
//! It accepts record batches over gRPC (`cpt.collector.v1.Collector/Export`)
//! and HTTP (`POST /v1/records`, JSON Lines or protobuf), stores them in a
//! [`Store`], and answers `GET /profile?…` with a gzipped `profile.proto`.
//!
//! # How a batch flows (maintainers)
//!
//! 1. **Admission.** A request (with the ingest token, when one is set)
//!    first takes one of [`ServeConfig::max_receiving_bodies`] receiving
//!    slots and has [`ServeConfig::body_timeout`] to send its body (HTTP 408
//!    / `DEADLINE_EXCEEDED` after). Only then does it take a permit from a
//!    semaphore of [`ServeConfig::max_pending_batches`] permits. No slot or
//!    no permit left means the collector is behind: the request is refused
//!    at once with HTTP 429 / gRPC `RESOURCE_EXHAUSTED` (and
//!    `Retry-After: 1`) instead of queueing. Slow senders therefore hold
//!    receiving slots, never the writer's. The permit lives until the batch
//!    is acknowledged; bodies are at most [`ServeConfig::max_batch_bytes`]
//!    each, so memory is bounded whatever the load.
//! 2. **Decoding.** The whole body (gunzipped if `Content-Encoding: gzip`,
//!    to at most `max_batch_bytes`) is decoded and checked
//!    ([`crate::ingest`]) against [`ServeConfig::limits`] off the async
//!    workers, stopping between records if the client goes away; one bad
//!    record rejects the batch (HTTP 400 / `INVALID_ARGUMENT`) naming every
//!    bad line or field, and nothing is stored.
//! 3. **Writing.** The batch goes to the single writer thread, which owns the
//!    read-write connection. It takes every batch waiting (up to
//!    [`ServeConfig::max_group_records`] records) and commits them in one
//!    transaction with a savepoint per batch ([`Store::insert_group`]): one
//!    fsync for many batches, each still all-or-nothing.
//!    With [`ServeConfig::parquet_dir`], the group's new batches (not those
//!    whose batch id was committed before) are written as Parquet inside
//!    that transaction, before it commits ([`Store::insert_group_then`]):
//!    one file per hour partition per group (split past
//!    [`ServeConfig::parquet_max_file_bytes`]) for at most 16 hours, the
//!    records of a group's other hours in one `date=mixed/hour=mixed`
//!    file (`ingest/writer.rs`), each finished (footer,
//!    fsync, rename from a hidden `.tmp`, fsync of the directory) in a
//!    hidden staging directory, and moved into its partition once the
//!    store committed (`ingest/staging.rs`). If writing fails the group's files
//!    are deleted and the transaction rolls back, batch ids included (the
//!    senders retry); if the commit fails they are deleted too. A record is
//!    in Parquet iff it is in the store, after `kill -9` too: a start
//!    settles what a killed collector left staged.
//! 4. **Acknowledgement.** Only after the commit returns does the request
//!    answer 200 / `OK`. With [`Durability::Full`] the WAL was fsynced, so
//!    an acknowledged batch survives `kill -9` and power loss.
//!
//! Delivery is at-least-once: a client that times out after the commit but
//! before the answer and retries stores the batch twice.
//!
//! # Where the code is
//!
//! | folder or file | what |
//! |---|---|
//! | `edge/` | the HTTP edge: connections, TLS, the route table and its guard, the read policy, security headers, the HTTP endpoints and the read threads |
//! | `ingest/` | the ingest pipeline: receiving slots, admission, the gRPC export, replayed credentials, the writer's group commit, Parquet staging, and [`otlp`] |
//! | `operations/` | retention and roll-ups between groups, `GET /metrics`, `GET /v1/trend`, the operator's log |
//! | `ui/` | the web pages: `/`, `/ui/profile`, `/ui/request`, `/ui/diff` |
//! | [`store`] | the SQLite store both the server and `cpt import` write |
//! | `mod.rs` (here) | [`ServeConfig`], starting and stopping a [`Collector`] |
//!
//! Each folder's `mod.rs` lists its files.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};

mod edge;
mod ingest;
mod operations;
pub mod store;
mod ui;

use edge::http_api::router;
use edge::listen::ConnLimits;
use ingest::admission::{Counters, Ingest};
use ingest::grpc_api::CollectorService;
use ingest::writer::write_loop;
use store::{Durability, Store, StoreError};

pub use crate::ingest::IngestLimits;
pub use edge::authority::check_allowed_host;
pub use edge::http_api::SOURCE_HEADER;
pub use edge::routes::MAX_TARGET_BYTES;
pub use edge::tls::{TlsError, TlsFiles};
pub use ingest::otlp;
pub use ingest::otlp::OtlpConfig;
pub use operations::retention::{
    DEFAULT_HOURLY_ROLLUPS_FOR, DEFAULT_RETAIN_FOR, DEFAULT_RETENTION_INTERVAL,
    DEFAULT_ROLLUPS_RETAIN_FOR, Keep, RetentionConfig, format_duration, parse_duration, parse_size,
};

/// Default for [`ServeConfig::max_pending_batches`].
pub const DEFAULT_MAX_PENDING_BATCHES: usize = 32;
/// Default for [`ServeConfig::max_batch_bytes`] (4 MiB).
pub const DEFAULT_MAX_BATCH_BYTES: usize = 4 << 20;
/// Default for [`ServeConfig::max_group_records`].
pub const DEFAULT_MAX_GROUP_RECORDS: usize = 20_000;
/// Default for [`ServeConfig::max_receiving_bodies`].
pub const DEFAULT_MAX_RECEIVING_BODIES: usize = 256;
/// Default for [`ServeConfig::min_body_rate`]: 1 KiB/s.
pub const DEFAULT_MIN_BODY_RATE: u64 = 1024;
pub use ingest::receiving::BODY_RATE_GRACE;
/// Default for [`ServeConfig::body_timeout`].
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default for [`ServeConfig::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default for [`ServeConfig::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default for [`ServeConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 8192;
pub use edge::connections::RESERVED_DESCRIPTORS;
/// Default for [`ServeConfig::max_streams_per_connection`].
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 64;
/// Records `GET /v1/records` returns when the query gives no `limit`.
pub const DEFAULT_RECORDS_LIMIT: u64 = 1000;
/// Largest `limit` a `GET /v1/records` query may ask for (400 beyond: page
/// with `since` / `until`). The answer is streamed, so the cap bounds the
/// work one query costs, not memory.
pub const MAX_RECORDS_LIMIT: u64 = 100_000;
/// Most parameters one query may have, on every route of the HTTP port (400
/// beyond, naming the limit).
pub use edge::routes::MAX_QUERY_PARAMS;
/// Most filters (`label=` and the like) one `GET /profile` query may have:
/// [`MAX_QUERY_PARAMS`], as on every route.
pub const MAX_PROFILE_FILTERS: usize = MAX_QUERY_PARAMS;

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
    /// What one record and one batch may hold (400 / `INVALID_ARGUMENT`
    /// beyond, naming the limit).
    pub limits: IngestLimits,
    /// Request bodies being received at once, at most (429 /
    /// `RESOURCE_EXHAUSTED` beyond). Admission to the writer
    /// ([`ServeConfig::max_pending_batches`]) is taken only once a body has
    /// arrived, so slow senders hold these, not the writer's.
    pub max_receiving_bodies: usize,
    /// Receiving slots one peer address may hold at once (429 /
    /// `RESOURCE_EXHAUSTED` beyond, while other peers still find slots).
    /// `None`: a quarter of [`ServeConfig::max_receiving_bodies`], at least
    /// one. See `ingest/receiving.rs` for the rule.
    pub max_receiving_bodies_per_peer: Option<usize>,
    /// How long a client may take to send a request body (HTTP 408 / gRPC
    /// `DEADLINE_EXCEEDED` after).
    pub body_timeout: Duration,
    /// Bytes per second a request body must average once
    /// [`BODY_RATE_GRACE`] has passed; a slower sender is cut (HTTP 408 /
    /// `DEADLINE_EXCEEDED`). `0`: no minimum.
    pub min_body_rate: u64,
    /// How long a client may take to send an HTTP/1 request's headers (the
    /// connection is closed after).
    pub header_read_timeout: Duration,
    /// A connection with no request in flight and no traffic for this long
    /// is closed.
    pub idle_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection, at most.
    pub max_streams_per_connection: u32,
    /// Connections open on the gRPC and HTTP ports together, at most; one
    /// beyond is closed as soon as it is accepted. Lowered at start, with a
    /// warning, when the open-file limit cannot hold it and
    /// [`RESERVED_DESCRIPTORS`]. See `connections.rs` for the rule.
    pub max_connections: usize,
    /// Connections one peer address may have open on both ports together;
    /// one beyond is closed as soon as it is accepted, while other peers
    /// still connect. `None`: a sixteenth of
    /// [`ServeConfig::max_connections`], at least one.
    pub max_connections_per_peer: Option<usize>,
    /// When set, ingest requires `Authorization: Bearer <token>` (HTTP) or
    /// `authorization: Bearer <token>` metadata (gRPC); others get 401 /
    /// `UNAUTHENTICATED`. `None` (the default): anyone who can reach the
    /// port may send records.
    pub ingest_token: Option<String>,
    /// When set, every read (`GET /v1/records`, `GET /profile`,
    /// `GET /v1/stats`) requires `Authorization: Bearer <token>` (or the
    /// `cpt_read_token` cookie); others get 401. A role separate from
    /// [`ServeConfig::ingest_token`]: neither token grants the other's
    /// role. `None` (the default): anyone who can reach the HTTP port reads
    /// sampled records; forced records are withheld from everyone.
    pub read_token: Option<String>,
    /// When set, every accepted batch is also written as Parquet (schema
    /// `cpt.records.v1`) into `DIR/date=YYYY-MM-DD/hour=HH/part-*.parquet`,
    /// and acknowledged only once its file is finished (fsynced and renamed):
    /// each group commit closes its own file per hour, for at most 16 hours
    /// (the others' records in `DIR/date=mixed/hour=mixed/`; see the module
    /// docs).
    pub parquet_dir: Option<PathBuf>,
    /// A group's Parquet file is split once it passes this many bytes.
    pub parquet_max_file_bytes: u64,
    /// Serve both ports over TLS with this certificate and key (`None`:
    /// plaintext).
    pub tls: Option<TlsFiles>,
    /// What is kept and for how long: raw records, roll-ups, Parquet
    /// partitions, the store's size. [`ServeConfig::new`] keeps every raw
    /// record ([`RetentionConfig::keep_everything`]); `cpt serve` starts
    /// from [`RetentionConfig::default`] (raw records for 7 days).
    pub retention: RetentionConfig,
    /// `GET /metrics` answers without the read token (for a Prometheus
    /// that scrapes without credentials). The counters say nothing of any
    /// one request.
    pub metrics_open: bool,
    /// Host names the HTTP port answers to, besides IP addresses and
    /// `localhost` (a request for any other name is refused with 421:
    /// DNS rebinding). See [`ServeConfig::with_allowed_host`].
    pub allowed_hosts: Vec<String>,
    /// Peers whose `Forwarded` / `X-Forwarded-Host` / `X-Forwarded-Proto`
    /// headers name the host and scheme a request was sent to (a reverse
    /// proxy's address); from other peers those headers are ignored.
    pub trusted_proxies: Vec<IpAddr>,
    /// The OpenTelemetry (OTLP) trace receivers: off unless an address is
    /// set ([`otlp`]).
    pub otlp: OtlpConfig,
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
            limits: IngestLimits::default(),
            max_receiving_bodies: DEFAULT_MAX_RECEIVING_BODIES,
            max_receiving_bodies_per_peer: None,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            min_body_rate: DEFAULT_MIN_BODY_RATE,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_streams_per_connection: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: None,
            ingest_token: None,
            read_token: None,
            parquet_dir: None,
            parquet_max_file_bytes: crate::records::parquet::DEFAULT_MAX_FILE_BYTES,
            tls: None,
            retention: RetentionConfig::keep_everything(),
            metrics_open: false,
            allowed_hosts: Vec::new(),
            trusted_proxies: Vec::new(),
            otlp: OtlpConfig::default(),
        }
    }

    /// Answer HTTP requests for `name` too (`cpt serve --allowed-host`; see
    /// [`ServeConfig::allowed_hosts`]); [`Collector::start`] refuses a
    /// value that is not a host name ([`check_allowed_host`]).
    pub fn with_allowed_host(mut self, name: impl Into<String>) -> Self {
        self.allowed_hosts.push(name.into());
        self
    }

    /// Take the forwarded host and scheme from `proxy`
    /// (`cpt serve --trusted-proxy`; see [`ServeConfig::trusted_proxies`]).
    pub fn with_trusted_proxy(mut self, proxy: IpAddr) -> Self {
        self.trusted_proxies.push(proxy);
        self
    }

    /// Set [`ServeConfig::retention`].
    pub fn with_retention(mut self, retention: RetentionConfig) -> Self {
        self.retention = retention;
        self
    }

    /// Set [`ServeConfig::parquet_dir`].
    pub fn with_parquet_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.parquet_dir = Some(dir.into());
        self
    }

    /// Set [`ServeConfig::parquet_max_file_bytes`] (at least 1).
    pub fn with_parquet_max_file_bytes(mut self, bytes: u64) -> Self {
        self.parquet_max_file_bytes = bytes.max(1);
        self
    }

    /// Set [`ServeConfig::limits`].
    pub fn with_limits(mut self, limits: IngestLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Set [`ServeConfig::max_receiving_bodies`] (at least 1).
    pub fn with_max_receiving_bodies(mut self, n: usize) -> Self {
        self.max_receiving_bodies = n.max(1);
        self
    }

    /// Set [`ServeConfig::max_receiving_bodies_per_peer`] (at least 1).
    pub fn with_max_receiving_bodies_per_peer(mut self, n: usize) -> Self {
        self.max_receiving_bodies_per_peer = Some(n.max(1));
        self
    }

    /// Set [`ServeConfig::min_body_rate`] (bytes per second; 0: none).
    pub fn with_min_body_rate(mut self, bytes_per_sec: u64) -> Self {
        self.min_body_rate = bytes_per_sec;
        self
    }

    /// Set [`ServeConfig::body_timeout`].
    pub fn with_body_timeout(mut self, d: Duration) -> Self {
        self.body_timeout = d;
        self
    }

    /// Set [`ServeConfig::header_read_timeout`].
    pub fn with_header_read_timeout(mut self, d: Duration) -> Self {
        self.header_read_timeout = d;
        self
    }

    /// Set [`ServeConfig::idle_timeout`].
    pub fn with_idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d;
        self
    }

    /// Set [`ServeConfig::max_connections`] (at least 1).
    pub fn with_max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Set [`ServeConfig::max_connections_per_peer`] (at least 1).
    pub fn with_max_connections_per_peer(mut self, n: usize) -> Self {
        self.max_connections_per_peer = Some(n.max(1));
        self
    }

    /// Set [`ServeConfig::max_streams_per_connection`] (at least 1).
    pub fn with_max_streams_per_connection(mut self, n: u32) -> Self {
        self.max_streams_per_connection = n.max(1);
        self
    }

    /// Require this bearer token on ingest ([`ServeConfig::ingest_token`]).
    pub fn with_ingest_token(mut self, token: impl Into<String>) -> Self {
        self.ingest_token = Some(token.into());
        self
    }

    /// Require this bearer token on reads ([`ServeConfig::read_token`]).
    pub fn with_read_token(mut self, token: impl Into<String>) -> Self {
        self.read_token = Some(token.into());
        self
    }

    /// Serve both ports over TLS ([`ServeConfig::tls`]).
    pub fn with_tls(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls = Some(TlsFiles {
            cert: cert.into(),
            key: key.into(),
        });
        self
    }

    /// Receive OpenTelemetry traces ([`OtlpConfig`]; `cpt serve --otlp-grpc`,
    /// `--otlp-http`, `--otlp-*`).
    pub fn with_otlp(mut self, otlp: OtlpConfig) -> Self {
        self.otlp = otlp;
        self
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
    /// The Parquet directory cannot be created.
    #[error("--parquet-dir: {0}")]
    Parquet(crate::records::parquet::ParquetError),
    /// What a stopped collector left staged in the Parquet directory cannot
    /// be settled.
    #[error("--parquet-dir: {0}")]
    Staging(String),
    /// The TLS certificate or key cannot be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The writer thread could not start.
    #[error("cannot start the store writer thread: {0}")]
    Writer(std::io::Error),
    /// The configuration cannot work (the message names the setting).
    #[error("{0}")]
    Config(String),
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
    /// Batches acknowledged without storing anything: their batch id was
    /// committed before (a client's resend after a lost acknowledgement).
    pub duplicate_batches: u64,
}

/// A running collector (see the module docs).
#[derive(Debug)]
pub struct Collector {
    grpc_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
    otlp_grpc_addr: Option<SocketAddr>,
    otlp_http_addr: Option<SocketAddr>,
    ingest: Arc<Ingest>,
    stop: watch::Sender<bool>,
    servers: Vec<tokio::task::JoinHandle<Result<(), ServeError>>>,
    /// The OTLP assembler, when a receiver runs.
    assembler: Option<tokio::task::JoinHandle<()>>,
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
        // Before anything is opened: a bad certificate fails the start.
        let tls = config
            .tls
            .as_ref()
            .map(edge::tls::server_config)
            .transpose()?;
        config.retention.check().map_err(ServeError::Config)?;
        for name in &config.allowed_hosts {
            check_allowed_host(name)
                .map_err(|e| ServeError::Config(format!("--allowed-host {e}")))?;
        }
        if let Some(bound) = config.retention.max_store_bytes {
            let least = RetentionConfig::min_store_bytes(config.max_batch_bytes);
            if bound < least {
                return Err(ServeError::Config(format!(
                    "--max-store-bytes {bound}: less than the {least} bytes the store needs to take \
                     a few batches of --max-batch-bytes {} and its WAL; raise it (or lower \
                     --max-batch-bytes)",
                    config.max_batch_bytes
                )));
            }
        }
        let mut store = match config.retention.max_store_bytes {
            Some(bound) => Store::open_bounded(&config.store, config.durability, bound)?,
            None => Store::open_with(&config.store, config.durability)?,
        };
        let gauges = Arc::new(operations::retention::StoreGauges::default());
        let upkeep = operations::retention::Upkeep::new(
            config.retention.clone(),
            config.parquet_dir.clone(),
            gauges.clone(),
        );
        store.set_retention(upkeep.retention())?;
        let store_path = store.path().to_path_buf();
        let max_pending = config.max_pending_batches.max(1);
        let (jobs, rx) = mpsc::channel(max_pending);
        let max_group = config.max_group_records.max(1);
        if let Some(dir) = &config.parquet_dir {
            match ingest::writer::remove_stale_temp_files(dir) {
                Ok(0) => {}
                Ok(n) => eprintln!(
                    "cpt serve: removed {n} unfinished Parquet temp file(s) a stopped collector left in {}",
                    dir.display()
                ),
                Err(e) => eprintln!(
                    "cpt serve: warning: cannot clear unfinished Parquet temp files in {}: {e}",
                    dir.display()
                ),
            }
        }
        let parquet = match &config.parquet_dir {
            Some(dir) => {
                let reader =
                    ingest::staging::open_reader(&store_path).map_err(ServeError::Staging)?;
                // Groups a stopped collector left staged: in place if the
                // store committed them, deleted if not.
                let committed = ingest::staging::max_id(&reader).map_err(ServeError::Staging)?;
                let settled =
                    ingest::staging::settle(dir, committed).map_err(ServeError::Staging)?;
                if settled.published + settled.discarded + settled.orphans > 0 {
                    eprintln!(
                        "cpt serve: Parquet groups a stopped collector left: {} committed (moved into place), \
                         {} not committed (deleted), {} unnamed staged files deleted",
                        settled.published, settled.discarded, settled.orphans
                    );
                }
                Some(ingest::writer::ParquetOut {
                    root: dir.clone(),
                    writer: crate::records::parquet::PartitionedWriter::new(
                        dir.join(ingest::staging::STAGING),
                    )
                    .map_err(ServeError::Parquet)?
                    .with_max_file_bytes(config.parquet_max_file_bytes)
                    .with_max_hour_partitions(ingest::writer::PARQUET_HOURS_PER_GROUP),
                    reader,
                })
            }
            None => None,
        };
        let keep_records = parquet.is_some();
        // Spans a stopped collector acknowledged and held: assembled again.
        let held = if config.otlp.enabled() {
            store.held_spans()?
        } else {
            Vec::new()
        };
        let forced_nonces = Arc::new(ingest::replays::ForcedNonces::load(&store));
        let otlp_counters: Arc<ingest::otlp::counters::Counters> = Arc::default();
        let once = config
            .otlp
            .enabled()
            .then(|| ingest::once::OneSource::new(otlp_counters.clone()));
        let writer = std::thread::Builder::new()
            .name("cpt-store-writer".into())
            .spawn(move || write_loop(store, rx, max_group, parquet, upkeep, once))
            .map_err(ServeError::Writer)?;
        let max_receiving = config.max_receiving_bodies.max(1);
        let conns = edge::connections::fit(
            edge::connections::descriptor_limit(),
            config.max_connections,
            config.max_connections_per_peer,
        );
        if let Some(w) = &conns.warning {
            eprintln!("cpt serve: warning: {w}");
        }
        let ingest = Arc::new(Ingest {
            admission: Arc::new(Semaphore::new(max_pending)),
            receiving: Arc::new(Semaphore::new(max_receiving)),
            max_pending,
            max_receiving,
            peer_slots: Arc::default(),
            max_receiving_per_peer: config
                .max_receiving_bodies_per_peer
                .unwrap_or(max_receiving / 4)
                .clamp(1, max_receiving),
            min_body_rate: config.min_body_rate,
            max_batch_bytes: config.max_batch_bytes,
            limits: config.limits,
            body_timeout: config.body_timeout,
            token: config.ingest_token.clone().map(|t| Arc::from(t.trim())),
            read: edge::access::ReadAccess::new(config.read_token.as_deref()),
            jobs,
            counters: Counters::default(),
            store_path,
            keep_records,
            gauges,
            max_store_bytes: config.retention.max_store_bytes,
            connections: Arc::new(edge::connections::Connections::new(
                conns.max,
                conns.max_per_peer,
            )),
            forced_nonces,
            cpt_traces: Arc::default(),
            otlp_on: config.otlp.enabled(),
            otlp: otlp_counters,
        });
        let (stop, stopped) = watch::channel(false);
        let mut servers = Vec::new();
        let mut grpc_addr = None;
        let mut http_addr = None;

        let conn_limits = ConnLimits {
            header_read_timeout: config.header_read_timeout,
            idle_timeout: config.idle_timeout,
            max_streams: config.max_streams_per_connection.max(1),
        };
        let spawner = Spawner {
            limits: conn_limits,
            tls: tls.clone(),
            stopped: stopped.clone(),
            connections: ingest.connections.clone(),
        };
        if let Some(addr) = config.grpc {
            let listener = bind("grpc", addr).await?;
            grpc_addr = Some(local_addr("grpc", addr, &listener)?);
            let svc = CollectorService {
                ingest: ingest.clone(),
            };
            servers.push(spawner.spawn("grpc", listener, svc));
        }
        if let Some(addr) = config.http {
            let listener = bind("http", addr).await?;
            http_addr = Some(local_addr("http", addr, &listener)?);
            let app = router(ingest.clone())
                .merge(operations::metrics::router(ingest.clone()))
                .merge(operations::trend::router(ingest.clone()))
                .merge(ui::router(
                    ui::UiState::new(
                        ingest.store_path.clone(),
                        ui::ReadGate::new(config.read_token.as_deref()),
                    )
                    .with_tls(tls.is_some()),
                ))
                .fallback(edge::routes::fallback)
                // Every route, the fallback too, is behind the guard.
                .layer(axum::middleware::from_fn_with_state(
                    edge::routes::Guard {
                        read: ingest.read.clone(),
                        authorities: edge::authority::Authorities::new(
                            &config.allowed_hosts,
                            &config.trusted_proxies,
                            tls.is_some(),
                        ),
                        metrics_open: config.metrics_open,
                    },
                    edge::routes::guard,
                ));
            servers.push(spawner.spawn("http", listener, app));
        }
        let mut otlp_grpc_addr = None;
        let mut otlp_http_addr = None;
        let mut assembler = None;
        if config.otlp.enabled() {
            let started = ingest::otlp::start(
                &config.otlp,
                ingest.clone(),
                held,
                ingest.otlp.clone(),
                stopped.clone(),
            );
            assembler = Some(started.task);
            if let Some(addr) = config.otlp.grpc {
                let listener = bind("otlp-grpc", addr).await?;
                otlp_grpc_addr = Some(local_addr("otlp-grpc", addr, &listener)?);
                let svc = ingest::otlp::grpc::TraceService {
                    otlp: started.otlp.clone(),
                };
                servers.push(spawner.spawn("otlp-grpc", listener, svc));
            }
            if let Some(addr) = config.otlp.http {
                let listener = bind("otlp-http", addr).await?;
                otlp_http_addr = Some(local_addr("otlp-http", addr, &listener)?);
                let app = ingest::otlp::http::router(started.otlp.clone());
                servers.push(spawner.spawn("otlp-http", listener, app));
            }
        }
        Ok(Collector {
            grpc_addr,
            http_addr,
            otlp_grpc_addr,
            otlp_http_addr,
            ingest,
            stop,
            servers,
            assembler,
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

    /// The bound OTLP/gRPC address, if receiving OTLP over gRPC.
    pub fn otlp_grpc_addr(&self) -> Option<SocketAddr> {
        self.otlp_grpc_addr
    }

    /// The bound OTLP/HTTP address, if receiving OTLP over HTTP.
    pub fn otlp_http_addr(&self) -> Option<SocketAddr> {
        self.otlp_http_addr
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
        let Collector {
            ingest,
            writer,
            assembler,
            ..
        } = self;
        // The assembler stops with the servers (held spans stay in the
        // store for the next start); it holds the writer's queue too.
        if let Some(a) = assembler {
            let _ = a.await;
        }
        // The servers are gone; dropping the last sender ends the writer
        // after it has committed what was queued.
        drop(ingest);
        let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    }
}

/// Starts the servers of the ports, each on its listener, with the same
/// connection limits, TLS and stop signal.
struct Spawner {
    limits: ConnLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    stopped: watch::Receiver<bool>,
    connections: Arc<edge::connections::Connections>,
}

impl Spawner {
    fn spawn<S, B>(
        &self,
        what: &'static str,
        listener: TcpListener,
        service: S,
    ) -> tokio::task::JoinHandle<Result<(), ServeError>>
    where
        S: tonic::codegen::Service<
                http::Request<hyper::body::Incoming>,
                Response = http::Response<B>,
                Error = std::convert::Infallible,
            > + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (limits, tls) = (self.limits, self.tls.clone());
        let (stopped, conns) = (self.stopped.clone(), self.connections.clone());
        tokio::spawn(async move {
            edge::listen::serve(listener, service, limits, tls, stopped, conns)
                .await
                .map_err(|e| ServeError::Server {
                    what,
                    message: e.to_string(),
                })
        })
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
