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

use super::Stats;
use super::store::{EncodedBatch, StoreError};
use crate::ingest::{BatchError, IngestLimits};
use cpt_sdk::Record;

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) accepted_batches: AtomicU64,
    pub(super) accepted_records: AtomicU64,
    pub(super) rejected_batches: AtomicU64,
    pub(super) overloaded: AtomicU64,
    pub(super) store_errors: AtomicU64,
    pub(super) duplicate_batches: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> Stats {
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
pub(super) struct Job {
    pub(super) batch: EncodedBatch,
    /// The records themselves, kept when they are written as Parquet too.
    pub(super) records: Option<Vec<Record>>,
    pub(super) ack: oneshot::Sender<Result<u64, Arc<StoreError>>>,
    pub(super) _permit: OwnedSemaphorePermit,
}

/// What went wrong with a submitted batch.
#[derive(Debug)]
pub(super) enum SubmitError {
    Overloaded { pending: usize },
    Receiving { max: usize },
    Unauthenticated,
    BodyTimeout { after: Duration },
    Malformed(BatchError),
    TooLarge { limit: usize },
    Store(Arc<StoreError>),
    ShuttingDown,
}

impl SubmitError {
    pub(super) fn count(&self, c: &Counters) {
        let counter = match self {
            SubmitError::Overloaded { .. } | SubmitError::Receiving { .. } => &c.overloaded,
            SubmitError::Malformed(_)
            | SubmitError::TooLarge { .. }
            | SubmitError::Unauthenticated
            | SubmitError::BodyTimeout { .. } => &c.rejected_batches,
            SubmitError::Store(_) | SubmitError::ShuttingDown => &c.store_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn message(&self) -> String {
        match self {
            SubmitError::Overloaded { pending } => format!(
                "collector overloaded: {pending} batches already pending; retry later with backoff"
            ),
            SubmitError::Receiving { max } => format!(
                "collector busy: {max} request bodies already being received; retry later with backoff"
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
                format!("batch not stored (store error; retry later): {e}")
            }
            SubmitError::ShuttingDown => "collector shutting down; retry later".into(),
        }
    }
}

/// The state the gRPC and HTTP front ends share.
#[derive(Debug)]
pub(super) struct Ingest {
    pub(super) admission: Arc<Semaphore>,
    pub(super) receiving: Arc<Semaphore>,
    pub(super) max_pending: usize,
    pub(super) max_receiving: usize,
    pub(super) max_batch_bytes: usize,
    pub(super) limits: IngestLimits,
    pub(super) body_timeout: Duration,
    pub(super) token: Option<Arc<str>>,
    pub(super) jobs: mpsc::Sender<Job>,
    pub(super) counters: Counters,
    pub(super) store_path: PathBuf,
    /// Jobs carry their records (for the Parquet writer).
    pub(super) keep_records: bool,
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
    pub(super) fn authorize(&self, authorization: Option<&[u8]>) -> Result<(), SubmitError> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let presented = authorization
            .and_then(|v| v.strip_prefix(b"Bearer ".as_slice()))
            .unwrap_or_default();
        if constant_time_eq(presented.trim_ascii(), token.as_bytes()) {
            Ok(())
        } else {
            let e = SubmitError::Unauthenticated;
            e.count(&self.counters);
            Err(e)
        }
    }

    /// A slot to receive a body in (none left: refused at once).
    pub(super) fn receive(&self) -> Result<OwnedSemaphorePermit, SubmitError> {
        self.receiving.clone().try_acquire_owned().map_err(|_| {
            let e = SubmitError::Receiving {
                max: self.max_receiving,
            };
            e.count(&self.counters);
            e
        })
    }

    /// A writer permit for a received body (none left: refused at once).
    pub(super) fn admit(&self) -> Result<OwnedSemaphorePermit, SubmitError> {
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
    pub(super) async fn submit(
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
        let limits = self.limits;
        let keep_records = self.keep_records;
        let result = async {
            let (batch, records) = tokio::task::spawn_blocking(move || {
                let records = decode(&limits, &cancelled)?;
                if cancelled.load(Ordering::Relaxed) {
                    return Err(BatchError::new(
                        "body",
                        "the client went away; batch abandoned",
                    ));
                }
                Ok((
                    EncodedBatch::new(&records).with_batch_id(batch_id),
                    keep_records.then_some(records),
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
        drop(cancel);
        match &result {
            Ok(0) => {
                // Only a batch id seen before stores nothing (empty
                // batches are refused while decoding).
                self.counters
                    .duplicate_batches
                    .fetch_add(1, Ordering::Relaxed);
            }
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

/// The header (HTTP) and metadata key (gRPC) that carries a batch's id.
pub(super) const BATCH_ID_HEADER: &str = crate::ingest::BATCH_ID_HEADER;

/// Check a `cpt-batch-id` value: 1 to 64 characters of `[0-9A-Za-z_-]`.
pub(super) fn batch_id(value: Option<&[u8]>) -> Result<Option<String>, SubmitError> {
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

/// Compare without an early exit on the first differing byte, so the time
/// taken does not tell how much of a guessed token was right.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, &y) in b.iter().enumerate() {
        let x = a.get(i).copied().unwrap_or(!y);
        diff |= x ^ y;
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn token_comparison_needs_every_byte() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cre", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret!", b"s3cret"));
        assert!(!constant_time_eq(b"s3creT", b"s3cret"));
        assert!(!constant_time_eq(b"", b"s3cret"));
    }
}
