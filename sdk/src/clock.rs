//! The [`Clock`] seam: every timestamp the layer records comes from one.
//!
//! [`SystemClock`] (the default) reads the CPU's time-stamp counter through
//! `quanta` where the kernel itself keeps time with it (so it is invariant
//! and synchronised across CPUs), and [`std::time::Instant`] elsewhere.
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

/// The default clock: time since the clock was made, read from the CPU's
/// time-stamp counter where that is safe, else from [`Instant::now`].
///
/// A layer reads the clock three times per traced span; the counter (via
/// the `quanta` crate, calibrated once per process against the OS clock)
/// costs about a third of `Instant::now` (README, "Performance"). It is used
/// only on Linux when the kernel's clocksource is `tsc`, which the kernel
/// selects only after checking that the counter runs at a constant rate and
/// is synchronised across CPUs: readings on different threads then order
/// like `Instant`'s. Everywhere else (other clocksources, as in many VMs;
/// other systems) the clock is `Instant`, and so it is with `CPT_CLOCK=std`.
/// A reading before the origin (a counter a few cycles behind on another
/// CPU) is zero, never negative.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: Instant,
    /// The counter and its reading at the origin, when used.
    tsc: Option<(&'static quanta::Clock, u64)>,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> SystemClock {
        let tsc = tsc().map(|c| (c, c.raw()));
        SystemClock {
            origin: Instant::now(),
            tsc,
        }
    }

    /// A clock that reads [`Instant::now`] even where the counter would do.
    pub fn std() -> SystemClock {
        SystemClock {
            origin: Instant::now(),
            tsc: None,
        }
    }

    /// Whether this clock reads the CPU's time-stamp counter.
    pub fn uses_tsc(&self) -> bool {
        self.tsc.is_some()
    }
}

/// The process's counter clock, if the kernel keeps time with the TSC
/// (calibrated at the first call, well under a millisecond).
fn tsc() -> Option<&'static quanta::Clock> {
    static TSC: std::sync::OnceLock<Option<quanta::Clock>> = std::sync::OnceLock::new();
    TSC.get_or_init(|| kernel_uses_tsc().then(quanta::Clock::new))
        .as_ref()
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn kernel_uses_tsc() -> bool {
    match std::env::var("CPT_CLOCK").as_deref() {
        Ok("std") => return false,
        Ok("auto") | Err(std::env::VarError::NotPresent) => {}
        Ok(other) => eprintln!(
            "cpt: CPT_CLOCK={other:?} is not understood: expected `std` (always read \
             Instant) or `auto` (the time-stamp counter where the kernel keeps time with it); \
             using auto"
        ),
        Err(std::env::VarError::NotUnicode(v)) => eprintln!(
            "cpt: CPT_CLOCK={v:?} is not understood: expected `std` or `auto`; using auto"
        ),
    }
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .is_ok_and(|s| s.trim() == "tsc")
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
fn kernel_uses_tsc() -> bool {
    false
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Duration {
        match self.tsc {
            Some((clock, origin)) => clock.delta(origin, clock.raw()),
            None => self.origin.elapsed(),
        }
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
