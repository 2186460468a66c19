//! Where finished requests' records go.
//!
//! - [`RecordSink`] takes each record on the thread that finished the
//!   request; any `Fn(Record) + Send + Sync` closure is one.
//! - [`Exporter`] is the asynchronous sink: a bounded queue in front of a
//!   worker thread, so emitting a record never blocks the request that
//!   finished.
//! - [`Export`] is what ships a batch (the collector's client implements it;
//!   [`JsonLines`] writes a file, [`json_lines_file`] wires both up).
//! - `RecordingSink` (feature `testing`) keeps records in memory.
//! - [`ExporterBuilder::build`] starts the worker and returns the
//!   [`Exporter`] (a [`RecordSink`] to give the layer) and an
//!   [`ExportHandle`] (counters, flush, shutdown).
//!
//! The request path does one `try_send`: when the queue is full the record
//! is dropped and counted ([`ExportHandle::dropped`]), never waited for. With
//! the `layer` feature the worker runs under `tracing`'s `NoSubscriber`, so
//! whatever the exporter logs or instruments is never traced by us.
//!
//! ```
//! use cpt_sdk::export::{Export, ExportError, Exporter};
//! use cpt_sdk::Record;
//!
//! #[derive(Debug, Default)]
//! struct Count(usize);
//! impl Export for Count {
//!     fn export(&mut self, batch: &[Record]) -> Result<(), ExportError> {
//!         self.0 += batch.len();
//!         Ok(())
//!     }
//! }
//!
//! let (sink, handle) = Exporter::builder().with_queue_capacity(1024).build(Count::default());
//! // CriticalPathLayer::builder().with_sink(sink) …
//! # drop(sink);
//! assert!(handle.flush(std::time::Duration::from_secs(1)));
//! handle.shutdown();
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::record::Record;

mod json_lines;
pub use json_lines::{JsonLines, json_lines_file};

/// Where finished records go.
///
/// Implementations must not block: they are called on the thread that
/// finished the request. Queue, count and drop instead.
pub trait RecordSink: Send + Sync + 'static {
    /// Take one finished record.
    fn emit(&self, record: Record);
}

impl<F> RecordSink for F
where
    F: Fn(Record) + Send + Sync + 'static,
{
    fn emit(&self, record: Record) {
        self(record)
    }
}

/// Ships batches of records somewhere (a collector, a file).
///
/// Called only on the exporter's worker thread, never on a request path:
/// it may block and do I/O.
pub trait Export: Send + 'static {
    /// Ship one batch (in emission order).
    ///
    /// # Errors
    ///
    /// When the batch could not be shipped; it is counted as failed and
    /// dropped (no retry here: a retrying client does that inside).
    fn export(&mut self, batch: &[Record]) -> Result<(), ExportError>;

    /// Make everything shipped so far durable / visible.
    ///
    /// # Errors
    ///
    /// When flushing failed.
    fn flush(&mut self) -> Result<(), ExportError> {
        Ok(())
    }

    /// Called on the worker when a batch interval passed with no record to
    /// ship: time for background work such as replaying batches spooled
    /// while the destination was down. The default does nothing.
    ///
    /// # Errors
    ///
    /// When that work failed (counted like a failed flush: warned once).
    fn idle(&mut self) -> Result<(), ExportError> {
        Ok(())
    }
}

/// Why an [`Export`] failed.
#[derive(Debug, thiserror::Error)]
#[error("exporting records failed: {source}")]
pub struct ExportError {
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl ExportError {
    /// Wrap the underlying error.
    pub fn new(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        ExportError {
            source: source.into(),
        }
    }
}

impl From<std::io::Error> for ExportError {
    fn from(e: std::io::Error) -> Self {
        ExportError::new(e)
    }
}

/// Configures an exporter; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct ExporterBuilder {
    capacity: usize,
    max_batch: usize,
    interval: Duration,
}

impl Default for ExporterBuilder {
    fn default() -> Self {
        ExporterBuilder {
            capacity: 4096,
            max_batch: 512,
            interval: Duration::from_secs(1),
        }
    }
}

impl ExporterBuilder {
    /// Records that may wait in the queue (default 4096); beyond, new records
    /// are dropped and counted.
    #[must_use]
    pub fn with_queue_capacity(mut self, n: usize) -> Self {
        self.capacity = n.max(1);
        self
    }

    /// Largest batch handed to [`Export::export`] (default 512).
    #[must_use]
    pub fn with_max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// Ship a partial batch after this long without a full one (default 1 s).
    #[must_use]
    pub fn with_interval(mut self, d: Duration) -> Self {
        self.interval = d.max(Duration::from_millis(1));
        self
    }

    /// Start the worker thread.
    ///
    /// # Panics
    ///
    /// If the OS cannot start a thread.
    pub fn build(self, export: impl Export) -> (Exporter, ExportHandle) {
        let (tx, rx) = mpsc::sync_channel(self.capacity);
        let stats = Arc::new(Stats::default());
        let worker_stats = stats.clone();
        let worker = std::thread::Builder::new()
            .name("cpt-exporter".into())
            .spawn(move || {
                #[cfg(feature = "layer")]
                let _quiet =
                    tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::new());
                run(rx, export, self.max_batch, self.interval, &worker_stats);
            })
            .expect("cannot start the cpt-exporter thread");
        (
            Exporter {
                tx: tx.clone(),
                stats: stats.clone(),
            },
            ExportHandle {
                tx,
                stats,
                worker: Mutex::new(Some(worker)),
            },
        )
    }
}

enum Msg {
    Record(Box<Record>),
    Flush(SyncSender<()>),
    Shutdown,
}

#[derive(Debug, Default)]
struct Stats {
    dropped: AtomicU64,
    exported: AtomicU64,
    failed: AtomicU64,
    warned: AtomicBool,
}

fn run(
    rx: mpsc::Receiver<Msg>,
    mut export: impl Export,
    max_batch: usize,
    interval: Duration,
    stats: &Stats,
) {
    let mut batch: Vec<Record> = Vec::with_capacity(max_batch);
    let ship = |batch: &mut Vec<Record>, export: &mut dyn Export| {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        match export.export(batch) {
            Ok(()) => {
                stats.exported.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                warn_once(stats, &e);
                stats.failed.fetch_add(n, Ordering::Relaxed);
            }
        }
        batch.clear();
    };
    let mut deadline = Instant::now() + interval;
    loop {
        let wait = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Msg::Record(r)) => {
                batch.push(*r);
                if batch.len() >= max_batch {
                    ship(&mut batch, &mut export);
                    deadline = Instant::now() + interval;
                }
            }
            Ok(Msg::Flush(ack)) => {
                ship(&mut batch, &mut export);
                let _ = ack.send(());
            }
            Ok(Msg::Shutdown) | Err(RecvTimeoutError::Disconnected) => {
                ship(&mut batch, &mut export);
                break;
            }
            Err(RecvTimeoutError::Timeout) => {
                if batch.is_empty() {
                    if let Err(e) = export.idle() {
                        warn_once(stats, &e);
                    }
                } else {
                    ship(&mut batch, &mut export);
                }
                deadline = Instant::now() + interval;
            }
        }
    }
    if let Err(e) = export.flush() {
        warn_once(stats, &e);
    }
}

fn warn_once(stats: &Stats, e: &ExportError) {
    if !stats.warned.swap(true, Ordering::Relaxed) {
        eprintln!("cpt: {e} (further export errors are only counted)");
    }
}

/// The [`RecordSink`] side of an exporter: give it to the layer. Cheap to
/// clone; never blocks.
#[derive(Clone)]
pub struct Exporter {
    tx: SyncSender<Msg>,
    stats: Arc<Stats>,
}

impl Exporter {
    /// A builder with the defaults.
    pub fn builder() -> ExporterBuilder {
        ExporterBuilder::default()
    }
}

impl fmt::Debug for Exporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exporter")
            .field("stats", &self.stats)
            .finish()
    }
}

impl RecordSink for Exporter {
    fn emit(&self, record: Record) {
        match self.tx.try_send(Msg::Record(Box::new(record))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Counters and control of an exporter's worker.
pub struct ExportHandle {
    tx: SyncSender<Msg>,
    stats: Arc<Stats>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for ExportHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportHandle")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl ExportHandle {
    /// Records dropped because the queue was full (or the worker stopped).
    pub fn dropped(&self) -> u64 {
        self.stats.dropped.load(Ordering::Relaxed)
    }

    /// Records shipped successfully.
    pub fn exported(&self) -> u64 {
        self.stats.exported.load(Ordering::Relaxed)
    }

    /// Records in batches whose export failed.
    pub fn failed(&self) -> u64 {
        self.stats.failed.load(Ordering::Relaxed)
    }

    /// Ship everything queued so far; wait at most `timeout`. Returns `true`
    /// when the worker confirmed in time. Call it off the request path.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        let mut msg = Msg::Flush(ack_tx);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return false,
            }
        }
        ack_rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_ok()
    }

    /// Ship what is queued, flush the exporter and stop the worker, waiting
    /// for it. Records emitted afterwards are dropped (and counted).
    ///
    /// This waits as long as the exporter takes (a collector that is down
    /// means retries until they give up); [`shutdown_timeout`](Self::shutdown_timeout)
    /// bounds the wait.
    pub fn shutdown(self) {
        let _ = self.tx.send(Msg::Shutdown);
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = worker {
            let _ = w.join();
        }
    }

    /// [`shutdown`](Self::shutdown), waiting at most `timeout`. Returns
    /// `true` when the worker stopped in time; otherwise it is left to finish
    /// (or to die with the process) and what it still holds may be lost.
    pub fn shutdown_timeout(self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let expired = || deadline.is_some_and(|d| Instant::now() >= d);
        let mut msg = Msg::Shutdown;
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if !expired() => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(TrySendError::Full(_)) => return false,
                // The worker is gone already.
                Err(TrySendError::Disconnected(_)) => break,
            }
        }
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(w) = worker else { return true };
        while !w.is_finished() {
            if expired() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = w.join();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::CriticalPath;
    use crate::trigger::Trigger;

    #[derive(Clone, Default)]
    struct Collect(
        Arc<Mutex<Vec<usize>>>,
        Arc<(Mutex<bool>, std::sync::Condvar)>,
    );

    impl Export for Collect {
        fn export(&mut self, batch: &[Record]) -> Result<(), ExportError> {
            // Block until released: the queue must absorb, then drop.
            let (lock, cv) = &*self.1;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
            self.0.lock().unwrap().push(batch.len());
            Ok(())
        }
    }

    fn record() -> Record {
        Record::new("A", Trigger::Sampled, CriticalPath::new())
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_blocking() {
        let exp = Collect::default();
        let (sink, handle) = Exporter::builder()
            .with_queue_capacity(4)
            .with_max_batch(1)
            .build(exp.clone());
        let start = Instant::now();
        for _ in 0..100 {
            sink.emit(record());
        }
        assert!(start.elapsed() < Duration::from_secs(1), "emit blocked");
        // One record may be in the stuck export, four queued; the rest dropped.
        assert!(handle.dropped() >= 95, "dropped {}", handle.dropped());
        *exp.1.0.lock().unwrap() = true;
        exp.1.1.notify_all();
        assert!(handle.flush(Duration::from_secs(5)));
        assert_eq!(handle.exported() + handle.dropped(), 100);
        handle.shutdown();
        sink.emit(record());
        assert_eq!(
            sink.stats.dropped.load(Ordering::Relaxed) as usize,
            101 - exp.0.lock().unwrap().len()
        );
    }

    #[test]
    fn an_idle_worker_calls_export_idle_between_batches() {
        #[derive(Clone, Default)]
        struct Idle(Arc<AtomicU64>);
        impl Export for Idle {
            fn export(&mut self, _: &[Record]) -> Result<(), ExportError> {
                Ok(())
            }
            fn idle(&mut self) -> Result<(), ExportError> {
                self.0.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
        let idle = Idle::default();
        let (_sink, handle) = Exporter::builder()
            .with_interval(Duration::from_millis(1))
            .build(idle.clone());
        // No record is ever emitted: only idle calls happen.
        let deadline = Instant::now() + Duration::from_secs(30);
        while idle.0.load(Ordering::Relaxed) < 3 {
            assert!(Instant::now() < deadline, "idle was never called");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(handle.exported(), 0);
        handle.shutdown();
    }

    #[test]
    fn shutdown_timeout_returns_when_the_exporter_is_stuck() {
        let exp = Collect::default();
        let (sink, handle) = Exporter::builder()
            .with_queue_capacity(4)
            .with_max_batch(1)
            .build(exp.clone());
        for _ in 0..10 {
            sink.emit(record());
        }
        // The export blocks until released: the worker cannot stop in time.
        let start = Instant::now();
        assert!(!handle.shutdown_timeout(Duration::from_millis(50)));
        assert!(start.elapsed() < Duration::from_secs(2), "shutdown blocked");
        *exp.1.0.lock().unwrap() = true;
        exp.1.1.notify_all();

        // An exporter that is not stuck stops in time, having shipped all.
        let free = Collect::default();
        *free.1.0.lock().unwrap() = true;
        let (sink, handle) = Exporter::builder().build(free.clone());
        sink.emit(record());
        assert!(handle.shutdown_timeout(Duration::from_secs(5)));
        assert_eq!(free.0.lock().unwrap().iter().sum::<usize>(), 1);
    }
}
