//! The [`Clock`] seam: every timestamp the layer records comes from one.
//!
//! [`SystemClock`] (the default) reads [`std::time::Instant`].
//! [`TokioClock`] reads `tokio::time::Instant`, so a test that pauses tokio's
//! clock (`tokio::time::pause`) gets exact milliseconds from `sleep`s. The
//! `testing` feature adds `ManualClock`, advanced by hand.

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A monotonic clock: time since the clock's own origin.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time since the clock's origin; never decreases.
    fn now(&self) -> Duration;

    /// Wall-clock time in nanoseconds since the Unix epoch (for
    /// [`Record::start_unix_nanos`](crate::Record::start_unix_nanos)).
    fn unix_nanos(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// The default clock: [`Instant::now`] since the clock was made.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> SystemClock {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// tokio's clock (`tokio::time::Instant`), which honours
/// `tokio::time::pause` and `advance` in tests.
#[cfg(feature = "layer")]
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

#[cfg(feature = "layer")]
impl TokioClock {
    /// A clock whose origin is tokio's now.
    pub fn new() -> TokioClock {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

#[cfg(feature = "layer")]
impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

#[cfg(feature = "layer")]
impl Clock for TokioClock {
    fn now(&self) -> Duration {
        tokio::time::Instant::now().saturating_duration_since(self.origin)
    }
}
