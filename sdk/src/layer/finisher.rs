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
//! The thread works in batches: a request handed over to an idle thread
//! wakes it, and the thread then lets [`BATCH_WINDOW`] pass before it takes
//! everything queued, so under load one wake-up (a futex call and two
//! context switches, on a machine whose cores the service needs) serves many
//! requests instead of one each. Records reach the sink at most about
//! `BATCH_WINDOW` later than they would one by one; [`Finisher::flush`]
//! cuts the wait short, and so does a queue that reaches
//! [`HIGH_WATER`].
//!
//! The queue is bounded: when it is full the record is dropped and counted
//! ([`Handle::records_dropped`](super::Handle::records_dropped)), never
//! computed on the request's thread. If the thread cannot be started, paths
//! are computed inline as before.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

use super::Shared;
use super::node::{Ended, Request};

/// Requests waiting for their path beyond this are dropped.
const QUEUE: usize = 4096;

/// How long the thread lets requests gather after it was woken.
pub(crate) const BATCH_WINDOW: Duration = Duration::from_millis(5);

/// A queue this long wakes the thread at once.
pub(crate) const HIGH_WATER: usize = 256;

type Job = (Arc<Request>, Ended);

/// The queue between the layer and its thread.
#[derive(Debug, Default)]
struct Queue {
    jobs: Vec<Job>,
    /// The thread is parked with nothing to do: the next job wakes it.
    idle: bool,
    /// Take what is queued now, without waiting for the window.
    urgent: bool,
    /// The layer is gone: the thread ends.
    closed: bool,
}

#[derive(Debug, Default)]
struct Inner {
    queue: Mutex<Queue>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Plain data: a panic elsewhere leaves it usable.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The background thread's queue and its counters.
#[derive(Debug, Default)]
pub(crate) struct Finisher {
    inner: Arc<Inner>,
    /// Started on first use; `None` when the thread could not be started.
    thread: OnceLock<Option<Thread>>,
    /// Handed over and not yet emitted.
    pending: AtomicU64,
    pub(crate) dropped: AtomicU64,
    /// Batches taken by the thread (each one wake-up or window).
    batches: AtomicU64,
}

impl Finisher {
    /// Hand an ended request over; `Err` gives it back when there is no
    /// thread to take it.
    pub(crate) fn submit(&self, shared: &Arc<Shared>, job: Job) -> Result<(), Job> {
        let thread = self
            .thread
            .get_or_init(|| start(Arc::downgrade(shared), self.inner.clone()));
        let Some(thread) = thread else {
            return Err(job);
        };
        let mut q = self.inner.lock();
        if q.jobs.len() >= QUEUE {
            drop(q);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.pending.fetch_add(1, Ordering::Relaxed);
        q.jobs.push(job);
        let wake = if q.idle {
            q.idle = false;
            true
        } else if q.jobs.len() == HIGH_WATER && !q.urgent {
            q.urgent = true;
            true
        } else {
            false
        };
        drop(q);
        if wake {
            thread.unpark();
        }
        Ok(())
    }

    /// Wait until everything handed over so far was emitted, or `timeout`
    /// passed; true when nothing is pending.
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        if self.pending.load(Ordering::Acquire) == 0 {
            return true;
        }
        self.inner.lock().urgent = true;
        if let Some(Some(thread)) = self.thread.get() {
            thread.unpark();
        }
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

impl Drop for Finisher {
    fn drop(&mut self) {
        let mut q = self.inner.lock();
        q.closed = true;
        drop(q);
        if let Some(Some(thread)) = self.thread.get() {
            thread.unpark();
        }
    }
}

fn start(shared: Weak<Shared>, inner: Arc<Inner>) -> Option<Thread> {
    std::thread::Builder::new()
        .name("cpt-finish".into())
        .spawn(move || run(&shared, &inner))
        .ok()
        .map(|h| h.thread().clone())
}

fn run(shared: &Weak<Shared>, inner: &Inner) {
    // The sink's own work (an exporter, a file) is not part of any request.
    let _quiet = tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::default());
    let mut batch = Vec::new();
    loop {
        // Sleep until there is work (or the layer is gone).
        let mut q = inner.lock();
        while q.jobs.is_empty() && !q.closed {
            q.idle = true;
            drop(q);
            std::thread::park();
            q = inner.lock();
        }
        q.idle = false;
        // Let a batch gather, unless someone is waiting for it.
        if !q.urgent && !q.closed {
            drop(q);
            std::thread::park_timeout(BATCH_WINDOW);
            q = inner.lock();
        }
        q.urgent = false;
        if q.closed {
            return;
        }
        std::mem::swap(&mut batch, &mut q.jobs);
        drop(q);
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.finisher.batches.fetch_add(1, Ordering::Relaxed);
        for (request, ended) in batch.drain(..) {
            // A panicking sink loses its record, not the thread.
            let _ = catch_unwind(AssertUnwindSafe(|| shared.emit_only(&request, ended)));
            shared.finisher.pending.fetch_sub(1, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use tracing_subscriber::prelude::*;

    use crate::Trigger;
    use crate::layer::CriticalPathLayer;
    use crate::request::{self, RequestOptions};

    /// A burst of detached requests costs the thread a few wake-ups, not one
    /// each, and every record still arrives.
    #[test]
    fn finisher_takes_a_burst_in_few_batches() {
        let (layer, handle) = CriticalPathLayer::builder()
            .with_service("A")
            .with_sink(|_: crate::Record| {})
            .build();
        let shared = layer.shared.clone();
        let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        const N: u64 = 200;
        for _ in 0..N {
            let root = tracing::info_span!("root");
            assert!(request::begin(
                &root,
                RequestOptions::new(Some(Trigger::Sampled))
            ));
            root.in_scope(|| tracing::info_span!("child").in_scope(|| {}));
            assert!(request::finish_detached(&root));
        }
        assert!(handle.flush(Duration::from_secs(10)));
        assert_eq!(handle.records_emitted(), N);
        assert_eq!(handle.records_dropped(), 0);
        let batches = shared.finisher.batches.load(Ordering::Relaxed);
        assert!(
            (1..=N / 10).contains(&batches),
            "{N} requests took {batches} batches"
        );
    }
}
