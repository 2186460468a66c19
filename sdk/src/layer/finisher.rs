//! Computing the paths of requests nobody waits for off the request path.
//!
//! A service that is the entry point of a request emits a record and returns
//! no path: its response need not wait for the path computation. The
//! middleware ends such a request with
//! [`request::finish_detached`](crate::request::finish_detached), which
//! stamps the end, hands the node table to one background thread per layer,
//! and returns. The thread computes the path and emits the record to the
//! sink with no subscriber of its own (the sink's work is never traced).
//!
//! The queue is bounded: when it is full the record is dropped and counted
//! ([`Handle::records_dropped`](super::Handle::records_dropped)), never
//! computed on the request's thread. If the thread cannot be started, paths
//! are computed inline as before.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::Shared;
use super::node::{Ended, Request};

/// Requests waiting for their path beyond this are dropped.
const QUEUE: usize = 4096;

type Job = (Arc<Request>, Ended);

/// The background thread's sending side and its counters.
#[derive(Debug, Default)]
pub(crate) struct Finisher {
    /// Started on first use; `None` when the thread could not be started.
    tx: OnceLock<Option<SyncSender<Job>>>,
    /// Handed over and not yet emitted.
    pending: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

impl Finisher {
    /// Hand an ended request over; `Err` gives it back when there is no
    /// thread to take it.
    pub(crate) fn submit(&self, shared: &Arc<Shared>, job: Job) -> Result<(), Job> {
        let tx = self.tx.get_or_init(|| start(Arc::downgrade(shared)));
        let Some(tx) = tx else { return Err(job) };
        self.pending.fetch_add(1, Ordering::Relaxed);
        match tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.pending.fetch_sub(1, Ordering::Relaxed);
                self.dropped.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(TrySendError::Disconnected(job)) => {
                self.pending.fetch_sub(1, Ordering::Relaxed);
                Err(job)
            }
        }
    }

    /// Wait until everything handed over so far was emitted, or `timeout`
    /// passed; true when nothing is pending.
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.pending.load(Ordering::Acquire) == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

fn start(shared: Weak<Shared>) -> Option<SyncSender<Job>> {
    let (tx, rx) = sync_channel(QUEUE);
    std::thread::Builder::new()
        .name("cpt-finish".into())
        .spawn(move || run(&shared, &rx))
        .ok()?;
    Some(tx)
}

fn run(shared: &Weak<Shared>, rx: &Receiver<Job>) {
    // The sink's own work (an exporter, a file) is not part of any request.
    let _quiet = tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::default());
    // Ends when the layer is gone: its sender drops and `recv` fails.
    while let Ok((request, ended)) = rx.recv() {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        // A panicking sink loses its record, not the thread.
        let _ = catch_unwind(AssertUnwindSafe(|| shared.emit(&request, ended)));
        shared.finisher.pending.fetch_sub(1, Ordering::Release);
    }
}
