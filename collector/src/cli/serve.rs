//! `cpt serve`: run the collector.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use crate::ingest::IngestLimits;
use crate::ingest::limits::{
    DEFAULT_MAX_BATCH_STORED_BYTES, DEFAULT_MAX_FRAME_STRING_BYTES, DEFAULT_MAX_LABELS,
    DEFAULT_MAX_RECORD_BYTES, DEFAULT_MAX_STRING_BYTES,
};
use crate::server::store::Durability;
use crate::server::{
    Collector, DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_GROUP_RECORDS,
    DEFAULT_MAX_PENDING_BATCHES, DEFAULT_MAX_RECEIVING_BODIES, DEFAULT_MAX_STREAMS_PER_CONNECTION,
    DEFAULT_MIN_BODY_RATE, Keep, RetentionConfig, ServeConfig, check_allowed_host, format_duration,
    parse_duration, parse_size,
};

/// Run the collector: accept record batches over gRPC (cpt.collector.v1.Collector/Export) and
/// HTTP (POST /v1/records, JSON Lines or protobuf) into a SQLite store, acknowledging each batch
/// only once it is durable, and answer GET /profile?service=…&percentile=… with a gzipped
/// profile.proto (`go tool pprof http://ADDR/profile?…`).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The SQLite store (created if missing; WAL mode).
    #[arg(long, value_name = "PATH")]
    pub store: PathBuf,
    /// gRPC listen address, or `off`. Port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7070")]
    pub grpc: String,
    /// HTTP listen address (ingest and profiles), or `off`.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7071")]
    pub http: String,
    /// Commit durability: `full` fsyncs every commit (survives power loss), `normal` survives a
    /// killed process but not a machine crash.
    #[arg(long, value_name = "MODE", default_value = "full", value_parser = ["full", "normal"])]
    pub durability: String,
    /// Batches admitted but not yet stored, at most; beyond it requests get HTTP 429 /
    /// RESOURCE_EXHAUSTED (memory stays bounded by this times --max-batch-bytes).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_PENDING_BATCHES, value_parser = at_least_one::<usize>)]
    pub max_pending_batches: usize,
    /// Largest batch body accepted, in bytes (HTTP 413 / OUT_OF_RANGE above).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BATCH_BYTES, value_parser = at_least_one::<usize>)]
    pub max_batch_bytes: usize,
    /// Records committed in one group transaction, at most.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_GROUP_RECORDS, value_parser = at_least_one::<usize>)]
    pub max_group_records: usize,
    /// Request bodies being received at once, at most (429 / RESOURCE_EXHAUSTED beyond). A
    /// batch takes one of the --max-pending-batches slots only once its body has arrived, so
    /// slow senders hold these instead.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_RECEIVING_BODIES, value_parser = at_least_one::<usize>)]
    pub max_receiving_bodies: usize,
    /// Receiving slots one peer address (IP) may hold at once; beyond it that peer gets 429 /
    /// RESOURCE_EXHAUSTED while others still find slots (default: a quarter of
    /// --max-receiving-bodies, at least 1).
    #[arg(long, value_name = "N", value_parser = at_least_one::<usize>)]
    pub max_receiving_bodies_per_peer: Option<usize>,
    /// Bytes per second a request body must average after its first 5 s; a slower sender is cut
    /// (HTTP 408 / DEADLINE_EXCEEDED) and its slot freed. 0: no minimum.
    #[arg(long, value_name = "BYTES_PER_SEC", default_value_t = DEFAULT_MIN_BODY_RATE)]
    pub min_body_rate: u64,
    /// How long a client may take to send a request body (HTTP 408 / DEADLINE_EXCEEDED after).
    #[arg(long, value_name = "DURATION", value_parser = more_than_zero, default_value = "30s")]
    pub body_timeout: Duration,
    /// How long a client may take to send an HTTP/1 request's headers (connection closed after).
    #[arg(long, value_name = "DURATION", value_parser = more_than_zero, default_value = "10s")]
    pub header_read_timeout: Duration,
    /// Close a connection with no request in flight and no traffic for this long.
    #[arg(long, value_name = "DURATION", value_parser = more_than_zero, default_value = "60s")]
    pub idle_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection, at most.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_STREAMS_PER_CONNECTION, value_parser = at_least_one::<u32>)]
    pub max_streams_per_connection: u32,
    /// Connections open on the gRPC and HTTP ports together, at most; one beyond is closed as
    /// soon as it is accepted. Each is a file descriptor: when the open-file limit (raised to
    /// its hard limit at start) cannot hold this and 256 more for the store, it is lowered to
    /// fit, with a warning.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS, value_parser = at_least_one::<usize>)]
    pub max_connections: usize,
    /// Connections one peer address (IP) may have open on both ports together; one beyond is
    /// closed as soon as it is accepted, while other peers still connect (default: a sixteenth
    /// of --max-connections, at least 1).
    #[arg(long, value_name = "N", value_parser = at_least_one::<usize>)]
    pub max_connections_per_peer: Option<usize>,
    /// Require `Authorization: Bearer <token>` on ingest, the token being this file's content
    /// (surrounding whitespace trimmed). Without it anyone who can reach the ports may send
    /// records.
    #[arg(long, value_name = "PATH")]
    pub ingest_token_file: Option<PathBuf>,
    /// Require `Authorization: Bearer <token>` on every read (GET /v1/records, /profile,
    /// /v1/stats and the web pages, which also take the sign-in cookie; /healthz stays open),
    /// the token being this file's content. A role separate from the ingest token. Without it
    /// anyone who can reach the HTTP port reads sampled records, and forced records are served
    /// to no one, by the API or the pages.
    #[arg(long, value_name = "PATH")]
    pub read_token_file: Option<PathBuf>,
    /// Serve both ports over TLS with this PEM certificate chain (with --tls-key). Senders then
    /// use grpcs:// / https:// endpoints, the CLI https:// URLs (--ca-file for a private CA).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Also write every accepted batch as Parquet (schema cpt.records.v1, docs/src/reference/parquet.md) into
    /// DIR/date=YYYY-MM-DD/hour=HH/part-*.parquet; a batch is acknowledged only once it is in
    /// a finished (fsynced, renamed) file. Each group commit closes its own file per hour, for at
    /// most 16 hours (the records of its other hours go to one file in date=mixed/hour=mixed).
    #[arg(long, value_name = "DIR")]
    pub parquet_dir: Option<PathBuf>,
    /// Split a group's Parquet file past this many MiB.
    #[arg(long, value_name = "MIB", default_value_t = 128)]
    pub parquet_max_file_mib: u64,
    /// Longest service, endpoint, request id, trace id, label key or value, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_STRING_BYTES)]
    pub max_string_bytes: usize,
    /// Longest frame name, frame service or source file name, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_FRAME_STRING_BYTES)]
    pub max_frame_string_bytes: usize,
    /// Most labels on a record.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_LABELS)]
    pub max_labels: usize,
    /// Deepest stack of a record (default: the wire codec's limit).
    #[arg(long, value_name = "N", default_value_t = IngestLimits::default().max_depth)]
    pub max_depth: usize,
    /// Most segments on a record (default: the wire codec's limit).
    #[arg(long, value_name = "N", default_value_t = IngestLimits::default().max_segments)]
    pub max_segments: usize,
    /// Most distinct frames on a record (default: the wire codec's limit).
    #[arg(long, value_name = "N", default_value_t = IngestLimits::default().max_frames)]
    pub max_frames: usize,
    /// Most frames over all of a record's stacks (default: the wire codec's limit).
    #[arg(long, value_name = "N", default_value_t = IngestLimits::default().max_stack_frames)]
    pub max_stack_frames: usize,
    /// Largest stored size of one record, in bytes (computed before the record is built).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_RECORD_BYTES)]
    pub max_record_bytes: usize,
    /// Largest stored size of one batch, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BATCH_STORED_BYTES)]
    pub max_batch_stored_bytes: usize,
    /// Longest latency a record may report.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, default_value = "1h")]
    pub max_latency: Duration,
    /// Refuse batches with a record that starts more than this ahead of the collector's clock (a
    /// sender whose clock runs ahead); counted as `clock_ahead` in cpt_batches_rejected_total.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1h")]
    pub max_future_skew: Duration,
    /// Keep raw records this long after their start (e.g. 36h, 7d, 30d; `forever` keeps every
    /// one). Older ones are deleted once rolled up; records that arrive older are rolled up and
    /// counted (too_old), not stored raw. Roll-ups answer profiles beyond it.
    #[arg(long, value_name = "DURATION|forever", default_value = "7d", value_parser = Keep::parse)]
    pub retain_for: Keep,
    /// The most the store takes on disk, its database file plus the WAL (B, KiB, MiB, GiB,
    /// TiB): the raw records that started first are deleted, once rolled up, to keep it
    /// there. Off by default.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_store_bytes: Option<u64>,
    /// How often the retention pass runs (it also runs at start).
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = parse_duration)]
    pub retention_interval: Duration,
    /// Keep hourly roll-ups this long, then merge them into daily ones.
    #[arg(long, value_name = "DURATION", default_value = "14d", value_parser = parse_duration)]
    pub hourly_rollups_for: Duration,
    /// Keep roll-ups (the average critical path of every endpoint) this long (`forever` too); at
    /// least as long as --retain-for. Default: 400d, or as --retain-for when that is longer.
    #[arg(long, value_name = "DURATION|forever", value_parser = Keep::parse)]
    pub rollups_retain_for: Option<Keep>,
    /// Remove --parquet-dir partitions older than this (`forever`: leave them to the lake's own
    /// lifecycle rules). Default: as --retain-for.
    #[arg(long, value_name = "DURATION|forever", value_parser = Keep::parse, requires = "parquet_dir")]
    pub parquet_retain_for: Option<Keep>,
    /// Answer GET /metrics (Prometheus text) without the read token.
    #[arg(long)]
    pub metrics_open: bool,
    /// A host name the HTTP port answers to (repeatable), besides IP addresses and localhost:
    /// a request naming any other host in Host (or HTTP/2 :authority) is refused with 421, so a
    /// web page cannot reach the collector by resolving its own name to it (DNS rebinding).
    /// Give every name browsers and senders use to reach the port.
    #[arg(long = "allowed-host", value_name = "NAME", value_parser = check_allowed_host)]
    pub allowed_hosts: Vec<String>,
    /// The address of a reverse proxy in front of the HTTP port (repeatable): its Forwarded
    /// (host=, proto=) or X-Forwarded-Host / X-Forwarded-Proto headers then name the host and
    /// scheme a request was sent to. From any other peer those headers are ignored.
    #[arg(long = "trusted-proxy", value_name = "ADDR")]
    pub trusted_proxies: Vec<IpAddr>,
    /// Receive OpenTelemetry traces over OTLP/gRPC here (TraceService/Export; the standard port
    /// is 4317), or `off`. Each complete trace becomes critical-path records, as `cpt traces
    /// convert --from otlp` makes them. Same TLS and ingest token as the other ports.
    #[arg(long, value_name = "ADDR", default_value = "off")]
    pub otlp_grpc: String,
    /// Receive OpenTelemetry traces over OTLP/HTTP here (POST /v1/traces, protobuf or JSON, gzip
    /// or not; the standard port is 4318), or `off`.
    #[arg(long, value_name = "ADDR", default_value = "off")]
    pub otlp_http: String,
    /// A trace is complete once its root span has arrived and no span of it has for this long;
    /// then its records are made (a trace whose root never arrives is dropped after six waits).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = more_than_zero)]
    pub otlp_trace_wait: Duration,
    /// Spans held until their trace is complete, at most (about 300 bytes each); beyond it the
    /// oldest traces are completed early (counted in /metrics).
    #[arg(long, value_name = "N", default_value_t = crate::server::otlp::DEFAULT_MAX_PENDING_SPANS, value_parser = at_least_one::<usize>)]
    pub otlp_max_pending_spans: usize,
    /// Resource or span attributes whose values become record labels (on the root span, else its
    /// resource), comma-separated or repeated, e.g. `service.version,deployment.environment`.
    #[arg(long, value_name = "KEYS", value_delimiter = ',')]
    pub otlp_label: Vec<String>,
}

/// A count flag's value: 1 or more (0 would refuse or stall everything).
fn at_least_one<T>(s: &str) -> Result<T, String>
where
    T: std::str::FromStr + Default + PartialEq,
    T::Err: std::fmt::Display,
{
    let n: T = s.trim().parse().map_err(|e| format!("{e}"))?;
    if n == T::default() {
        return Err("must be at least 1 (0 would refuse every request)".to_owned());
    }
    Ok(n)
}

/// A timeout flag's value: a duration longer than 0 (e.g. `30s`).
fn more_than_zero(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| format!("{e} (e.g. 30s)"))?;
    if d.is_zero() {
        return Err("must be longer than 0 (e.g. 30s): 0 would cut every connection".to_owned());
    }
    Ok(d)
}

fn read_token(flag: &str, path: &std::path::Path) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("--{flag} {}: cannot read it", path.display()))?;
    let token = token.trim();
    anyhow::ensure!(
        !token.is_empty(),
        "--{flag} {}: the file is empty; put the token in it",
        path.display()
    );
    anyhow::ensure!(
        token
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b';' && b != b'"' && b != b','),
        "--{flag} {}: the token must be visible ASCII without spaces, `;`, `,` or `\"` (it travels in an HTTP header or cookie)",
        path.display()
    );
    Ok(token.to_owned())
}

/// The retention settings in a line of the start-up log.
fn describe_retention(r: &RetentionConfig) -> String {
    let keep = |k: Keep| match k {
        Keep::Forever => "forever".to_owned(),
        Keep::For(d) => format_duration(d),
    };
    let mut s = format!(
        "raw records kept {}, roll-ups hourly for {} then daily, kept {}",
        keep(r.retain_for),
        format_duration(r.hourly_rollups_for),
        keep(r.rollups_retain_for)
    );
    if let Some(max) = r.max_store_bytes {
        s.push_str(&format!(
            ", store (file + WAL) at most {:.1} MiB",
            max as f64 / f64::from(1 << 20)
        ));
    }
    s.push_str(&format!(" (pass every {})", format_duration(r.interval)));
    s
}

fn parse_addr(flag: &str, s: &str) -> anyhow::Result<Option<SocketAddr>> {
    if s == "off" {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .with_context(|| format!("--{flag} {s:?}: expected IP:PORT (e.g. 127.0.0.1:7070) or `off`"))
}

/// Run `cpt serve` until Ctrl-C or SIGTERM.
///
/// # Errors
///
/// Bad addresses, a store that cannot be opened, an address in use, or a server failure.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let grpc = parse_addr("grpc", &args.grpc)?;
    let http = parse_addr("http", &args.http)?;
    anyhow::ensure!(
        grpc.is_some() || http.is_some(),
        "both --grpc and --http are off: nothing to serve"
    );
    let durability = Durability::parse(&args.durability).expect("clap checked the value");
    let mut config = ServeConfig::new(&args.store)
        .with_durability(durability)
        .with_max_pending_batches(args.max_pending_batches)
        .with_max_batch_bytes(args.max_batch_bytes)
        .with_max_group_records(args.max_group_records)
        .with_max_receiving_bodies(args.max_receiving_bodies)
        .with_body_timeout(args.body_timeout)
        .with_min_body_rate(args.min_body_rate)
        .with_header_read_timeout(args.header_read_timeout)
        .with_idle_timeout(args.idle_timeout)
        .with_max_streams_per_connection(args.max_streams_per_connection)
        .with_max_connections(args.max_connections)
        .with_limits(
            IngestLimits::new()
                .with_max_string_bytes(args.max_string_bytes)
                .with_max_frame_string_bytes(args.max_frame_string_bytes)
                .with_max_labels(args.max_labels)
                .with_max_depth(args.max_depth)
                .with_max_segments(args.max_segments)
                .with_max_frames(args.max_frames)
                .with_max_stack_frames(args.max_stack_frames)
                .with_max_record_bytes(args.max_record_bytes)
                .with_max_batch_stored_bytes(args.max_batch_stored_bytes)
                .with_max_latency(args.max_latency)
                .with_max_future_skew(args.max_future_skew),
        );
    if let Some(n) = args.max_receiving_bodies_per_peer {
        config = config.with_max_receiving_bodies_per_peer(n);
    }
    if let Some(n) = args.max_connections_per_peer {
        config = config.with_max_connections_per_peer(n);
    }
    if let Some(path) = &args.ingest_token_file {
        config = config.with_ingest_token(read_token("ingest-token-file", path)?);
    }
    if let Some(path) = &args.read_token_file {
        config = config.with_read_token(read_token("read-token-file", path)?);
    }
    if let (Some(i), Some(r)) = (&config.ingest_token, &config.read_token) {
        anyhow::ensure!(
            i != r,
            "--ingest-token-file and --read-token-file hold the same token: they are separate roles \
             (a sender must not read); give each its own"
        );
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config = config.with_tls(cert, key);
    }
    if let Some(dir) = &args.parquet_dir {
        anyhow::ensure!(
            args.parquet_max_file_mib > 0,
            "--parquet-max-file-mib must be at least 1"
        );
        config = config
            .with_parquet_dir(dir)
            .with_parquet_max_file_bytes(args.parquet_max_file_mib.saturating_mul(1 << 20));
    }
    config.grpc = grpc;
    config.http = http;
    config.metrics_open = args.metrics_open;
    config.allowed_hosts = args.allowed_hosts.clone();
    config.trusted_proxies = args.trusted_proxies.clone();
    config.otlp = crate::server::OtlpConfig {
        grpc: parse_addr("otlp-grpc", &args.otlp_grpc)?,
        http: parse_addr("otlp-http", &args.otlp_http)?,
        trace_wait: args.otlp_trace_wait,
        max_pending_spans: args.otlp_max_pending_spans,
        labels: args
            .otlp_label
            .iter()
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty())
            .collect(),
    };
    config.retention = RetentionConfig {
        retain_for: args.retain_for,
        max_store_bytes: args.max_store_bytes,
        interval: args.retention_interval,
        hourly_rollups_for: args.hourly_rollups_for,
        rollups_retain_for: args
            .rollups_retain_for
            .unwrap_or_else(|| RetentionConfig::rollups_outliving(args.retain_for)),
        parquet_retain_for: args.parquet_retain_for,
    };
    let retention = describe_retention(&config.retention);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let config_has_token = config.ingest_token.is_some();
    let config_has_read_token = config.read_token.is_some();
    let tls = config.tls.is_some();
    if tls {
        eprintln!("cpt serve: both ports serve TLS only (--tls-cert / --tls-key)");
    }
    let (grpc_scheme, http_scheme) = if tls {
        ("grpcs", "https")
    } else {
        ("grpc", "http")
    };
    rt.block_on(async move {
        let collector = Collector::start(config).await?;
        eprintln!(
            "cpt serve: store {} (WAL, synchronous={})",
            args.store.display(),
            args.durability.to_uppercase()
        );
        if let Some(dir) = &args.parquet_dir {
            eprintln!(
                "cpt serve: parquet {} (each group commit closes its files before the ack)",
                dir.display()
            );
        }
        eprintln!("cpt serve: {retention}");
        if config_has_token {
            eprintln!("cpt serve: ingest requires the bearer token from --ingest-token-file");
        } else {
            eprintln!(
                "cpt serve: ingest is open to anyone who can reach the ports (see --ingest-token-file)"
            );
        }
        if config_has_read_token {
            eprintln!(
                "cpt serve: reads (records, profiles, stats) require the bearer token from --read-token-file"
            );
        } else {
            eprintln!(
                "cpt serve: reads are open to anyone who can reach the http port (sampled records only; \
                 forced records are withheld until --read-token-file is set)"
            );
        }
        if let Some(a) = collector.grpc_addr() {
            eprintln!("cpt serve: grpc listening on {a}");
            eprintln!("cpt serve: exporters send to {grpc_scheme}://{a}");
        }
        if let Some(a) = collector.otlp_grpc_addr() {
            eprintln!("cpt serve: otlp-grpc listening on {a} (OTLP exporters: endpoint {http_scheme}://{a})");
        }
        if let Some(a) = collector.otlp_http_addr() {
            eprintln!(
                "cpt serve: otlp-http listening on {a} (OTLP exporters: endpoint {http_scheme}://{a}/v1/traces)"
            );
        }
        if let Some(a) = collector.http_addr() {
            eprintln!("cpt serve: http listening on {http_scheme}://{a}");
            if config_has_read_token {
                // pprof cannot send the bearer token: fetch, then open.
                eprintln!(
                    "cpt serve: profiles: cpt profile --collector {http_scheme}://{a} --read-token-file FILE \
                     --service SERVICE -o p.pb.gz && go tool pprof -http=: p.pb.gz"
                );
            } else {
                eprintln!(
                    "cpt serve: profiles: go tool pprof -http=: '{http_scheme}://{a}/profile?service=SERVICE'"
                );
            }
            eprintln!(
                "cpt serve: web pages: {http_scheme}://{a}/ ({})",
                if config_has_read_token {
                    "sign in with the token from --read-token-file"
                } else {
                    "open to anyone who can reach the port, forced requests withheld; see --read-token-file"
                }
            );
        }
        collector.run_until(shutdown_signal()).await?;
        eprintln!("cpt serve: stopped");
        Ok(())
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    eprintln!("cpt serve: shutting down (finishing pending batches)");
}
