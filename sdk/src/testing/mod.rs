//! Test helpers (feature `testing`): [`RecordingSink`], [`ManualClock`],
//! path expectations ([`expect::path`]), the paper cases every crate's tests
//! use ([`fixtures`]: CPT Figure 2a/b/c, Table 1), a deterministic
//! generator ([`SplitMix64`]) and the check for external tools a test needs
//! ([`tools::require`]).
//!
//! ```
//! use cpt_sdk::testing::{expect, ms};
//! use cpt_sdk::{CriticalPath, Frame, SegmentKind};
//!
//! let mut p = CriticalPath::new();
//! p.push_frames([Frame::new("A", "A1")], ms(5), SegmentKind::Busy);
//! p.push_frames([Frame::new("A", "A1"), Frame::new("B", "B1")], ms(20), SegmentKind::Busy);
//! expect::path().segment(["A1"], ms(5)).segment(["A1", "B1"], ms(20)).assert(&p);
//! ```

pub mod expect;
pub mod fixtures;
pub mod log;
mod rng;
pub mod tools;

pub use rng::SplitMix64;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::clock::Clock;
use crate::export::RecordSink;
use crate::record::Record;

/// `Duration::from_millis(n)`.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Keeps every record in memory. Clones share the same store.
#[derive(Clone, Default)]
pub struct RecordingSink {
    inner: Arc<(Mutex<Vec<Record>>, Condvar)>,
}

impl fmt::Debug for RecordingSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordingSink")
            .field("records", &self.len())
            .finish()
    }
}

impl RecordingSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Record>> {
        self.inner.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the records so far.
    pub fn records(&self) -> Vec<Record> {
        self.lock().clone()
    }

    /// Take the records so far, leaving the sink empty.
    pub fn take(&self) -> Vec<Record> {
        std::mem::take(&mut *self.lock())
    }

    /// How many records so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no record arrived yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wait until at least `n` records arrived or `timeout` passed; returns
    /// the count.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> usize {
        let guard = self.lock();
        let (guard, _) = self
            .inner
            .1
            .wait_timeout_while(guard, timeout, |v| v.len() < n)
            .unwrap_or_else(|e| e.into_inner());
        guard.len()
    }

    /// The only record.
    ///
    /// # Panics
    ///
    /// Unless exactly one record arrived.
    #[track_caller]
    pub fn single(&self) -> Record {
        let v = self.lock();
        assert_eq!(v.len(), 1, "expected exactly one record, got {}", v.len());
        v[0].clone()
    }
}

impl RecordSink for RecordingSink {
    fn emit(&self, record: Record) {
        self.lock().push(record);
        self.inner.1.notify_all();
    }
}

/// A clock moved by hand, for exact milliseconds in tests. Clones share the
/// same time.
///
/// With [`ManualClock::with_tokio`] it also follows tokio's (paused) clock,
/// so `sleep`s and [`ManualClock::advance`] (CPU work) add up.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    offset: Arc<AtomicU64>,
    #[cfg(feature = "layer")]
    tokio_origin: Option<tokio::time::Instant>,
}

impl ManualClock {
    /// A clock at zero that moves only by [`ManualClock::advance`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock at zero that also follows `tokio::time::Instant` (pause the
    /// runtime's clock for exact times).
    #[cfg(feature = "layer")]
    pub fn with_tokio() -> Self {
        ManualClock {
            offset: Arc::default(),
            tokio_origin: Some(tokio::time::Instant::now()),
        }
    }

    /// Move time forward by `d` (simulated CPU work when called inside a
    /// span).
    pub fn advance(&self, d: Duration) {
        let n = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.offset.fetch_add(n, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        let manual = Duration::from_nanos(self.offset.load(Ordering::SeqCst));
        #[cfg(feature = "layer")]
        if let Some(origin) = self.tokio_origin {
            return manual + tokio::time::Instant::now().saturating_duration_since(origin);
        }
        manual
    }

    fn unix_nanos(&self) -> u64 {
        u64::try_from(self.now().as_nanos()).unwrap_or(u64::MAX)
    }
}
