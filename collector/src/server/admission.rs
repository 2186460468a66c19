//! Admission and the hand-off to the writer: a batch takes a permit before
//! its body is read (none left: refused at once), is decoded off the async
//! workers, and waits for the writer's acknowledgement (steps 1, 2 and 4 of
//! the parent module's "How a batch flows").

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::Stats;
use super::store::{EncodedBatch, StoreError};
use crate::ingest::BatchError;
use cpt_sdk::Record;

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) accepted_batches: AtomicU64,
    pub(super) accepted_records: AtomicU64,
    pub(super) rejected_batches: AtomicU64,
    pub(super) overloaded: AtomicU64,
    pub(super) store_errors: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> Stats {
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
pub(super) struct Job {
    pub(super) batch: EncodedBatch,
    pub(super) ack: oneshot::Sender<Result<u64, Arc<StoreError>>>,
    pub(super) _permit: OwnedSemaphorePermit,
}

/// What went wrong with a submitted batch.
#[derive(Debug)]
pub(super) enum SubmitError {
    Overloaded { pending: usize },
    Malformed(BatchError),
    TooLarge { limit: usize },
    Store(Arc<StoreError>),
    ShuttingDown,
}

impl SubmitError {
    pub(super) fn count(&self, c: &Counters) {
        let counter = match self {
            SubmitError::Overloaded { .. } => &c.overloaded,
            SubmitError::Malformed(_) | SubmitError::TooLarge { .. } => &c.rejected_batches,
            SubmitError::Store(_) | SubmitError::ShuttingDown => &c.store_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn message(&self) -> String {
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
}

/// The state the gRPC and HTTP front ends share.
#[derive(Debug)]
pub(super) struct Ingest {
    pub(super) admission: Arc<Semaphore>,
    pub(super) max_pending: usize,
    pub(super) max_batch_bytes: usize,
    pub(super) jobs: mpsc::Sender<Job>,
    pub(super) counters: Counters,
    pub(super) store_path: PathBuf,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("records", &self.batch.len())
            .finish()
    }
}

impl Ingest {
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
    /// returns once it is durable.
    pub(super) async fn submit(
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
