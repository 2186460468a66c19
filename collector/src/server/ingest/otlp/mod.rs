//! The OpenTelemetry receivers of `cpt serve` (`--otlp-grpc`,
//! `--otlp-http`): OTLP trace exports in, critical-path records out.
//!
//! # How a span flows
//!
//! 1. **Receipt** (`grpc.rs`: `opentelemetry.proto.collector.trace.v1.TraceService/Export`;
//!    `http.rs`: `POST /v1/traces`, protobuf or JSON, gzip or not). The
//!    same edge as record batches: the ingest token, a receiving slot
//!    while the body arrives, then a writer permit (none left: 429 /
//!    `UNAVAILABLE` with `Retry-After`).
//! 2. **Sorting** (`spans.rs`): every span converted by the OTLP
//!    importer's code, checked (ids, times, `--max-future-skew`) and held
//!    by trace id. A span that fails a check is refused on its own: the
//!    answer's partial success says how many and why.
//! 3. **Holding**: the request's spans are stored in the store's
//!    `otlp_spans` table through the writer's group commit, and only then
//!    acknowledged: an acknowledged span survives `kill -9`. A collector
//!    that starts reads them back and assembles them again.
//! 4. **Assembly** (`assembler.rs`): a trace is complete once its root has
//!    arrived and no span of it for `--otlp-trace-wait`; at most
//!    `--otlp-max-pending-spans` are held (beyond, the oldest traces are
//!    completed early). Its records are made by the importer's own code
//!    ([`crate::traces::trace_records`]: clock-skew repair, the critical
//!    path, one record per root), so they are byte for byte what
//!    `cpt traces convert --from otlp` makes of the same spans, plus the
//!    root's `--otlp-label` attributes.
//! 5. **Storing**: the records and the deletion of the trace's held spans
//!    go in one savepoint of a group commit, through the same writer and
//!    ingest limits as record batches.
//!
//! A root of a service that also sends cpt records for the same trace (the
//! cpt layer beside `tracing-opentelemetry`) makes no record: the cpt
//! record, whose trace id is the OpenTelemetry trace id, already stands
//! for that request (`seen.rs`).
//!
//! # Where the code is
//!
//! | file | what |
//! |---|---|
//! | `grpc.rs`, `http.rs` | the two receivers |
//! | `spans.rs` | a request's spans converted, checked and sorted by trace |
//! | `assembler.rs` | the held traces, their completion, the assembler task |
//! | `counters.rs` | the `cpt_otlp_*` series of `/metrics` |
//! | `seen.rs` | the trace ids of cpt records (counted once) |
//! | `mod.rs` (here) | [`OtlpConfig`], receipt to durable hold, the start |

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cpt_sdk::Record;
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::ingest::BatchError;
use crate::server::ingest::admission::{Ingest, SubmitError};
use crate::server::store::EncodedBatch;
use crate::traces::otlp::pb;

pub(crate) mod assembler;
pub(in crate::server) mod counters;
pub(in crate::server) mod grpc;
pub(in crate::server) mod http;
mod row;
pub(in crate::server) mod seen;
pub(crate) mod spans;

pub(crate) use counters::{Counters, Dropped};
pub(crate) use seen::CptTraces;
use spans::Encoding;

/// Default of [`OtlpConfig::trace_wait`] (the tail-sampling processor's
/// decision wait).
pub const DEFAULT_TRACE_WAIT: Duration = Duration::from_secs(10);
/// Default of [`OtlpConfig::max_pending_spans`]: about 300 MB of held spans.
pub const DEFAULT_MAX_PENDING_SPANS: usize = 1_000_000;
/// The path of the OTLP/HTTP trace export.
pub const HTTP_TRACES_PATH: &str = "/v1/traces";
/// The gRPC method of the OTLP trace export.
pub const GRPC_EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// The OTLP receivers' settings ([`crate::server::ServeConfig::otlp`]).
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// OTLP/gRPC listen address (`None`: none; the standard port is 4317).
    pub grpc: Option<SocketAddr>,
    /// OTLP/HTTP listen address (`None`: none; the standard port is 4318).
    pub http: Option<SocketAddr>,
    /// A trace is complete once its root arrived and no span of it for
    /// this long.
    pub trace_wait: Duration,
    /// Spans held at most; beyond, the oldest traces are completed early.
    pub max_pending_spans: usize,
    /// Resource or span attributes whose values (on the root span, else its
    /// resource) become record labels.
    pub labels: Vec<String>,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            grpc: None,
            http: None,
            trace_wait: DEFAULT_TRACE_WAIT,
            max_pending_spans: DEFAULT_MAX_PENDING_SPANS,
            labels: Vec::new(),
        }
    }
}

impl OtlpConfig {
    /// Whether a receiver is on.
    pub fn enabled(&self) -> bool {
        self.grpc.is_some() || self.http.is_some()
    }
}

/// Nanoseconds since the Unix epoch now.
pub(crate) fn unix_nanos_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Commits to the writer on the assembler's behalf.
#[derive(Clone, Debug)]
pub(crate) struct Commit {
    ingest: Arc<Ingest>,
}

impl Commit {
    /// Store `records` and release the held spans of `released` in one
    /// savepoint. `Err`: nothing stored (the counters and the log say why).
    pub(crate) async fn commit(
        &self,
        records: Vec<Record>,
        released: Vec<String>,
    ) -> Result<(), ()> {
        let batch = EncodedBatch::new(&records).with_released_traces(released);
        let keep = self.ingest.keep_records.then_some(records);
        self.ingest
            .commit(batch, keep, None)
            .await
            .map(|_| ())
            .map_err(|e| {
                let _ = e.message();
            })
    }
}

/// The receivers' shared state.
#[derive(Debug)]
pub(in crate::server) struct Otlp {
    pub(in crate::server) ingest: Arc<Ingest>,
    tx: mpsc::Sender<assembler::Msg>,
    labels: Arc<[String]>,
    pub(crate) counters: Arc<Counters>,
}

impl Otlp {
    /// Sort a received body's spans, hold them durably, hand them to the
    /// assembler, and say what was refused.
    pub(in crate::server) async fn accept(
        &self,
        body: bytes::Bytes,
        encoding: Encoding,
        gzip: bool,
        permit: OwnedSemaphorePermit,
    ) -> Result<pb::ExportTraceServiceResponse, SubmitError> {
        let labels = self.labels.clone();
        let limits = self.ingest.limits;
        let limit = self.ingest.max_batch_bytes;
        let sorted = tokio::task::spawn_blocking(move || {
            let plain;
            let body: &[u8] = if gzip {
                plain = crate::server::edge::http_api::gunzip(&body, limit)?;
                &plain
            } else {
                &body
            };
            let received = spans::receive(body, encoding, &labels, &limits, unix_nanos_now())
                .map_err(|m| BatchError::new("body", m))?;
            let rows = row::rows(&received.traces);
            Ok::<_, BatchError>((received, rows))
        })
        .await
        .map_err(|_| SubmitError::ShuttingDown)?;
        let (received, rows) = match sorted {
            Ok(x) => x,
            Err(e) => {
                let e = SubmitError::Malformed(e);
                e.count(&self.ingest.counters);
                return Err(e);
            }
        };
        let c = &self.counters;
        for (i, n) in received.refused.iter().enumerate() {
            c.refused[i].fetch_add(*n, Ordering::Relaxed);
        }
        c.truncated.fetch_add(received.truncated, Ordering::Relaxed);
        let refused = received.refused_total();
        let refusal = (refused > 0).then(|| received.refusal_message());
        if received.spans > 0 {
            let batch = EncodedBatch::new(&[]).with_held_spans(rows);
            self.ingest
                .commit(batch, None, Some(permit))
                .await
                .inspect_err(|e| {
                    e.count(&self.ingest.counters);
                })?;
            c.spans.fetch_add(received.spans as u64, Ordering::Relaxed);
            // Durable now; an assembler that has stopped finds them in the
            // store at the next start.
            let _ = self.tx.send(assembler::Msg::Spans(received.traces)).await;
        }
        c.requests.fetch_add(1, Ordering::Relaxed);
        Ok(pb::ExportTraceServiceResponse {
            partial_success: refusal.map(|error_message| pb::ExportTracePartialSuccess {
                rejected_spans: i64::try_from(refused).unwrap_or(i64::MAX),
                error_message,
            }),
        })
    }
}

/// The running receivers' shared parts.
#[derive(Debug)]
pub(in crate::server) struct Started {
    pub(in crate::server) otlp: Arc<Otlp>,
    pub(in crate::server) task: tokio::task::JoinHandle<()>,
}

/// Start the assembler with the spans held in the store (`held`: its
/// `otlp_spans` rows).
pub(in crate::server) fn start(
    config: &OtlpConfig,
    ingest: Arc<Ingest>,
    held: Vec<(String, Vec<u8>)>,
    counters: Arc<Counters>,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> Started {
    let (tx, rx) = mpsc::channel(64);
    let mut restored: Vec<(String, Vec<spans::HeldSpan>)> = Vec::new();
    let mut unreadable = Vec::new();
    for (trace, row) in held {
        match row::decode(&row) {
            Ok(s) => {
                counters
                    .restored_spans
                    .fetch_add(s.len() as u64, Ordering::Relaxed);
                restored.push((trace, s));
            }
            Err(e) => {
                crate::server::operations::errlog::error(
                    "a held OTLP span row cannot be read; dropped",
                    || format!("trace {trace}: {e}"),
                );
                counters.unreadable_rows.fetch_add(1, Ordering::Relaxed);
                unreadable.push(trace);
            }
        }
    }
    let pending = assembler::Pending::new(config.max_pending_spans, config.trace_wait);
    let completion = Arc::new(assembler::Completion {
        import: crate::traces::ImportOptions::default(),
        limits: ingest.limits,
        counters: counters.clone(),
        cpt_traces: ingest.cpt_traces.clone(),
    });
    let commit = Commit {
        ingest: ingest.clone(),
    };
    let retry = tx.clone();
    let task = tokio::spawn(async move {
        let mut stopped = stopped;
        let run = assembler::run(pending, rx, retry, completion, commit);
        tokio::select! {
            () = run => {}
            _ = stopped.wait_for(|s| *s) => {}
        }
    });
    // Before any request: the restored spans are the oldest.
    let restore_tx = tx.clone();
    tokio::spawn(async move {
        if !unreadable.is_empty() {
            let _ = restore_tx.send(assembler::Msg::Release(unreadable)).await;
        }
        for chunk in restored.chunks(1024) {
            let _ = restore_tx
                .send(assembler::Msg::Restored(chunk.to_vec()))
                .await;
        }
    });
    Started {
        otlp: Arc::new(Otlp {
            ingest,
            tx,
            labels: config.labels.clone().into(),
            counters,
        }),
        task,
    }
}
