//! Admission and the hand-off to the writer: a request takes a receiving
//! slot while its body arrives and a writer permit once it has (none left:
//! refused at once), is decoded off the async workers (abandoned if the
//! client goes away), and waits for the writer's acknowledgement (steps 1,
//! 2 and 4 of the parent module's "How a batch flows").

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::ingest::{BatchError, IngestLimits};
use crate::server::Stats;
use crate::server::store::{EncodedBatch, StoreError};
use cpt_sdk::Record;

#[derive(Debug, Default)]
pub(in crate::server) struct Counters {
    pub(in crate::server) accepted_batches: AtomicU64,
    pub(in crate::server) accepted_records: AtomicU64,
    /// Of `accepted_records`, those forced: a reader who may not see
    /// forced records is shown the count without them.
    pub(in crate::server) accepted_forced_records: AtomicU64,
    pub(in crate::server) rejected_batches: AtomicU64,
    pub(in crate::server) overloaded: AtomicU64,
    pub(in crate::server) store_errors: AtomicU64,
    pub(in crate::server) duplicate_batches: AtomicU64,
    /// Rejected batches by [`Reject`] reason.
    pub(in crate::server) rejected_by: [AtomicU64; Reject::ALL.len()],
    /// From admission to acknowledgement, of every batch that was written.
    pub(in crate::server) ack_seconds: Histogram,
}

/// The upper bounds of [`Histogram`]'s buckets, seconds: an
/// acknowledgement is normally tens of milliseconds, a second is trouble.
pub(in crate::server) const BOUNDS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A histogram of durations for `/metrics`: cumulative buckets at [`BOUNDS`].
#[derive(Debug, Default)]
pub(in crate::server) struct Histogram {
    /// Observations per bucket (not cumulative), the last one `+Inf`.
    pub(in crate::server) counts: [AtomicU64; BOUNDS.len() + 1],
    pub(in crate::server) sum_nanos: AtomicU64,
}

impl Histogram {
    /// Count one duration.
    pub(in crate::server) fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BOUNDS.iter().position(|&b| s <= b).unwrap_or(BOUNDS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// Why a batch was rejected (the `reason` label of `/metrics`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::server) enum Reject {
    Malformed,
    TooLarge,
    Unauthenticated,
    BodyTimeout,
    BodyTooSlow,
    UnsupportedMediaType,
    UnreadableBody,
    RefusedByGrpc,
    ClockAhead,
}

impl Reject {
    pub(in crate::server) const ALL: [Reject; 9] = [
        Reject::Malformed,
        Reject::TooLarge,
        Reject::Unauthenticated,
        Reject::BodyTimeout,
        Reject::BodyTooSlow,
        Reject::UnsupportedMediaType,
        Reject::UnreadableBody,
        Reject::RefusedByGrpc,
        Reject::ClockAhead,
    ];

    pub(in crate::server) fn as_str(self) -> &'static str {
        match self {
            Reject::Malformed => "malformed",
            Reject::TooLarge => "too_large",
            Reject::Unauthenticated => "unauthenticated",
            Reject::BodyTimeout => "body_timeout",
            Reject::BodyTooSlow => "body_too_slow",
            Reject::UnsupportedMediaType => "unsupported_media_type",
            Reject::UnreadableBody => "unreadable_body",
            Reject::RefusedByGrpc => "refused_by_grpc",
            Reject::ClockAhead => "clock_ahead",
        }
    }
}

impl Counters {
    /// Count a rejected batch.
    pub(in crate::server) fn reject(&self, why: Reject) {
        self.rejected_batches.fetch_add(1, Ordering::Relaxed);
        self.rejected_by[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(in crate::server) fn snapshot(&self) -> Stats {
        Stats {
            accepted_batches: self.accepted_batches.load(Ordering::Relaxed),
            accepted_records: self.accepted_records.load(Ordering::Relaxed),
            rejected_batches: self.rejected_batches.load(Ordering::Relaxed),
            overloaded: self.overloaded.load(Ordering::Relaxed),
            store_errors: self.store_errors.load(Ordering::Relaxed),
            duplicate_batches: self.duplicate_batches.load(Ordering::Relaxed),
        }
    }
}

/// A batch on its way to the writer; the permit is released when the job is
/// dropped, after the acknowledgement.
pub(in crate::server) struct Job {
    pub(in crate::server) batch: EncodedBatch,
    /// The records themselves, kept when they are written as Parquet too.
    pub(in crate::server) records: Option<Vec<Record>>,
    /// Stored forced records this batch shows to be replays, labelled once
    /// it is committed (`replays.rs`).
    pub(in crate::server) later_uses: Vec<crate::server::ingest::replays::LaterUse>,
    pub(in crate::server) ack: oneshot::Sender<Result<u64, Arc<StoreError>>>,
    /// Who made the records: a cpt exporter, or the OTLP receiver
    /// (`once.rs`).
    pub(in crate::server) source: Source,
    /// `None` for the OTLP assembler's records, which are not admitted
    /// (their spans were, on receipt).
    pub(in crate::server) _permit: Option<OwnedSemaphorePermit>,
}

/// What went wrong with a submitted batch.
#[derive(Debug)]
pub(in crate::server) enum SubmitError {
    Overloaded {
        pending: usize,
    },
    Receiving {
        max: usize,
    },
    PeerBusy {
        max: usize,
    },
    BodyTooSlow {
        min_rate: u64,
        received: usize,
        after: Duration,
    },
    Unauthenticated,
    BodyTimeout {
        after: Duration,
    },
    Malformed(BatchError),
    TooLarge {
        limit: usize,
    },
    Store(Arc<StoreError>),
    ShuttingDown,
}

impl SubmitError {
    pub(in crate::server) fn count(&self, c: &Counters) {
        let counter = match self {
            SubmitError::Overloaded { .. }
            | SubmitError::Receiving { .. }
            | SubmitError::PeerBusy { .. } => &c.overloaded,
            SubmitError::BodyTooSlow { .. } => return c.reject(Reject::BodyTooSlow),
            // A batch refused only for starts ahead of the collector's
            // clock: a sender's clock, not its encoder, is at fault.
            SubmitError::Malformed(e) if e.clock_ahead() == e.total() => {
                return c.reject(Reject::ClockAhead);
            }
            SubmitError::Malformed(_) => return c.reject(Reject::Malformed),
            SubmitError::TooLarge { .. } => return c.reject(Reject::TooLarge),
            SubmitError::Unauthenticated => return c.reject(Reject::Unauthenticated),
            SubmitError::BodyTimeout { .. } => return c.reject(Reject::BodyTimeout),
            SubmitError::Store(_) | SubmitError::ShuttingDown => &c.store_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(in crate::server) fn message(&self) -> String {
        match self {
            SubmitError::Overloaded { pending } => format!(
                "collector overloaded: {pending} batches already pending; retry later with backoff"
            ),
            SubmitError::Receiving { max } => format!(
                "collector busy: {max} request bodies already being received; retry later with backoff"
            ),
            SubmitError::PeerBusy { max } => format!(
                "collector busy for this address: it is already sending {max} request bodies \
                 (each peer address gets at most that many at once); retry later with backoff"
            ),
            SubmitError::BodyTooSlow {
                min_rate,
                received,
                after,
            } => format!(
                "batch rejected, nothing stored: request body too slow ({received} bytes in \
                 {after:.1?}, under the minimum of {min_rate} bytes/s)"
            ),
            SubmitError::Unauthenticated => {
                "ingest requires a credential: send `authorization: Bearer <token>` with the collector's ingest token".into()
            }
            SubmitError::BodyTimeout { after } => format!(
                "batch rejected, nothing stored: request body not received within {after:?}"
            ),
            SubmitError::Malformed(e) => e.to_string(),
            SubmitError::TooLarge { limit } => {
                format!("batch rejected, nothing stored: body larger than {limit} bytes")
            }
            SubmitError::Store(e) => {
                // The detail names the store's or the Parquet directory's
                // files: the operator's log gets it, the client does not.
                crate::server::operations::errlog::error("storing a batch failed", || e.to_string());
                "batch not stored (store error; the collector's log has the detail): retry later"
                    .into()
            }
            SubmitError::ShuttingDown => "collector shutting down; retry later".into(),
        }
    }
}

/// Why a body was not received: refused (counted), or the connection failed.
#[derive(Debug)]
pub(in crate::server) enum BodyFailure {
    Refused(SubmitError),
    Read(String),
}

/// The state the gRPC and HTTP front ends share.
#[derive(Debug)]
pub(in crate::server) struct Ingest {
    pub(in crate::server) admission: Arc<Semaphore>,
    pub(in crate::server) receiving: Arc<Semaphore>,
    pub(in crate::server) max_pending: usize,
    pub(in crate::server) max_receiving: usize,
    pub(in crate::server) max_batch_bytes: usize,
    pub(in crate::server) limits: IngestLimits,
    pub(in crate::server) body_timeout: Duration,
    pub(in crate::server) token: Option<Arc<str>>,
    /// Receiving slots held per peer address, and each one's share.
    pub(in crate::server) peer_slots: Arc<crate::server::ingest::receiving::PeerSlots>,
    pub(in crate::server) max_receiving_per_peer: usize,
    /// Bytes per second a body must average after the grace (0: none).
    pub(in crate::server) min_body_rate: u64,
    /// Who may read (`GET /v1/records`, `/profile`, `/v1/stats`).
    pub(in crate::server) read: crate::server::edge::access::ReadAccess,
    pub(in crate::server) jobs: mpsc::Sender<Job>,
    pub(in crate::server) counters: Counters,
    pub(in crate::server) store_path: PathBuf,
    /// Jobs carry their records (for the Parquet writer).
    pub(in crate::server) keep_records: bool,
    /// What the store holds, as the writer last measured it (`/metrics`).
    pub(in crate::server) gauges: Arc<crate::server::operations::retention::StoreGauges>,
    /// `--max-store-bytes`, for `/metrics`.
    pub(in crate::server) max_store_bytes: Option<u64>,
    /// Connections open on either port, and their bounds.
    pub(in crate::server) connections: Arc<crate::server::edge::connections::Connections>,
    /// Labels replayed forced records before they are stored.
    pub(in crate::server) forced_nonces: Arc<crate::server::ingest::replays::ForcedNonces>,
    /// With an OTLP receiver: the trace ids of cpt records, so that a root
    /// of the same service and trace makes no second record.
    pub(in crate::server) cpt_traces: Arc<crate::server::ingest::otlp::seen::CptTraces>,
    /// Whether an OTLP receiver runs (then `cpt_traces` is kept).
    pub(in crate::server) otlp_on: bool,
    /// The OTLP receivers' counters (`/metrics`).
    pub(in crate::server) otlp: Arc<crate::server::ingest::otlp::counters::Counters>,
}

/// Where a batch of records comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::server) enum Source {
    /// A cpt exporter (SDK records).
    Cpt,
    /// The OTLP receiver's assembler (records made from spans).
    Otlp,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("records", &self.batch.len())
            .finish()
    }
}

impl Ingest {
    /// Check the credential, when one is configured.
    pub(in crate::server) fn authorize(
        &self,
        authorization: Option<&[u8]>,
    ) -> Result<(), SubmitError> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let presented = authorization
            .and_then(crate::server::edge::access::bearer)
            .unwrap_or_default();
        if crate::server::edge::access::constant_time_eq(presented, token.as_bytes()) {
            Ok(())
        } else {
            let e = SubmitError::Unauthenticated;
            e.count(&self.counters);
            Err(e)
        }
    }

    /// A slot to receive a body from `peer` in (its share or every slot
    /// taken: refused at once; see `receiving.rs`).
    pub(in crate::server) fn receive(
        &self,
        peer: Option<std::net::IpAddr>,
    ) -> Result<crate::server::ingest::receiving::Receiving, SubmitError> {
        use crate::server::ingest::receiving::{NoSlot, take_slot};
        take_slot(
            &self.peer_slots,
            &self.receiving,
            peer,
            self.max_receiving_per_peer,
        )
        .map_err(|no| {
            let e = match no {
                NoSlot::Peer => SubmitError::PeerBusy {
                    max: self.max_receiving_per_peer,
                },
                NoSlot::All => SubmitError::Receiving {
                    max: self.max_receiving,
                },
            };
            e.count(&self.counters);
            e
        })
    }

    /// Receive a body of at most `limit` bytes under the body timeout and
    /// the minimum rate.
    pub(in crate::server) async fn receive_body<B>(
        &self,
        body: B,
        limit: usize,
    ) -> Result<bytes::Bytes, BodyFailure>
    where
        B: hyper::body::Body,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        use crate::server::ingest::receiving::{BodyError, collect};
        let e = match collect(body, limit, self.body_timeout, self.min_body_rate).await {
            Ok(b) => return Ok(b),
            Err(BodyError::TooLarge) => SubmitError::TooLarge { limit },
            Err(BodyError::Timeout) => SubmitError::BodyTimeout {
                after: self.body_timeout,
            },
            Err(BodyError::TooSlow { received, after }) => SubmitError::BodyTooSlow {
                min_rate: self.min_body_rate,
                received,
                after,
            },
            Err(BodyError::Read(e)) => return Err(BodyFailure::Read(e)),
        };
        e.count(&self.counters);
        Err(BodyFailure::Refused(e))
    }

    /// A writer permit for a received body (none left: refused at once).
    pub(in crate::server) fn admit(&self) -> Result<OwnedSemaphorePermit, SubmitError> {
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
    /// returns once it is durable. A batch whose `batch_id` the store has
    /// committed before stores nothing and answers `Ok(0)` (counted as a
    /// duplicate): the sender's resend after a lost acknowledgement.
    pub(in crate::server) async fn submit(
        &self,
        batch_id: Option<String>,
        decode: impl FnOnce(&IngestLimits, &AtomicBool) -> Result<Vec<Record>, BatchError>
        + Send
        + 'static,
        permit: OwnedSemaphorePermit,
    ) -> Result<u64, SubmitError> {
        // Set when this future is dropped (the client went away): the
        // blocking decode checks it between records and gives up.
        let cancel = CancelOnDrop(Arc::new(AtomicBool::new(false)));
        let cancelled = cancel.0.clone();
        let admitted = std::time::Instant::now();
        let limits = self.limits;
        let keep_records = self.keep_records;
        let forced_nonces = self.forced_nonces.clone();
        let cpt_traces = self.otlp_on.then(|| self.cpt_traces.clone());
        let result = async {
            let (batch, records, forced, later_uses) = tokio::task::spawn_blocking(move || {
                let mut records = decode(&limits, &cancelled)?;
                let forced = records
                    .iter()
                    .filter(|r| r.trigger == cpt_sdk::Trigger::Forced)
                    .count() as u64;
                let later_uses = forced_nonces.label(&mut records);
                if let Some(seen) = &cpt_traces {
                    seen.note(&records);
                }
                if cancelled.load(Ordering::Relaxed) {
                    return Err(BatchError::new(
                        "body",
                        "the client went away; batch abandoned",
                    ));
                }
                Ok((
                    EncodedBatch::new(&records).with_batch_id(batch_id),
                    keep_records.then_some(records),
                    forced,
                    later_uses,
                ))
            })
            .await
            .map_err(|_| SubmitError::ShuttingDown)?
            .map_err(SubmitError::Malformed)?;
            let (ack, done) = oneshot::channel();
            self.jobs
                .send(Job {
                    batch,
                    records,
                    later_uses,
                    ack,
                    source: Source::Cpt,
                    _permit: Some(permit),
                })
                .await
                .map_err(|_| SubmitError::ShuttingDown)?;
            done.await
                .map_err(|_| SubmitError::ShuttingDown)?
                .map_err(SubmitError::Store)
                .map(|n| (n, forced))
        }
        .await;
        drop(cancel);
        if matches!(result, Ok(_) | Err(SubmitError::Store(_))) {
            self.counters.ack_seconds.observe(admitted.elapsed());
        }
        match &result {
            Ok((0, _)) => {
                // Only a batch id seen before stores nothing (empty
                // batches are refused while decoding).
                self.counters
                    .duplicate_batches
                    .fetch_add(1, Ordering::Relaxed);
            }
            Ok((n, forced)) => {
                self.counters
                    .accepted_batches
                    .fetch_add(1, Ordering::Relaxed);
                self.counters
                    .accepted_records
                    .fetch_add(*n, Ordering::Relaxed);
                self.counters
                    .accepted_forced_records
                    .fetch_add(*forced, Ordering::Relaxed);
            }
            Err(e) => e.count(&self.counters),
        }
        result.map(|(n, _)| n)
    }
}

impl Ingest {
    /// Hand a batch made by the collector itself (the OTLP receivers' held
    /// spans, the assembler's records) to the writer and wait until it is
    /// durable. `records`: the batch's records, when they are written as
    /// Parquet too.
    pub(in crate::server) async fn commit(
        &self,
        batch: EncodedBatch,
        records: Option<Vec<Record>>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<u64, SubmitError> {
        let (ack, done) = oneshot::channel();
        self.jobs
            .send(Job {
                batch,
                records,
                later_uses: Vec::new(),
                ack,
                source: Source::Otlp,
                _permit: permit,
            })
            .await
            .map_err(|_| SubmitError::ShuttingDown)?;
        done.await
            .map_err(|_| SubmitError::ShuttingDown)?
            .map_err(SubmitError::Store)
    }
}

/// The header (HTTP) and metadata key (gRPC) that carries a batch's id.
pub(in crate::server) const BATCH_ID_HEADER: &str = crate::ingest::BATCH_ID_HEADER;

/// Check a `cpt-batch-id` value: 1 to 64 characters of `[0-9A-Za-z_-]`.
pub(in crate::server) fn batch_id(value: Option<&[u8]>) -> Result<Option<String>, SubmitError> {
    let Some(v) = value else { return Ok(None) };
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_');
    if !ok {
        return Err(SubmitError::Malformed(BatchError::new(
            BATCH_ID_HEADER,
            "a batch id is 1 to 64 characters of letters, digits, '-' and '_' \
             (or leave the header out: the batch is then stored without deduplication)",
        )));
    }
    Ok(Some(String::from_utf8_lossy(v).into_owned()))
}

/// Sets its flag when dropped.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
