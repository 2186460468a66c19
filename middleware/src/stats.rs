//! [`Stats`]: what the middleware ignored or dropped, counted instead of
//! failing the request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How often a misconfiguration that goes on is said again.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(60);

/// A warning said at its first occurrence, then at most once per
/// [`WARN_EVERY`] with the count of those not said in between.
#[derive(Debug, Default)]
pub(crate) struct Every {
    /// Milliseconds since the process's first warning check, plus one, of
    /// the last line (0: never said).
    last: AtomicU64,
    unsaid: AtomicU64,
}

impl Every {
    /// `Some(n)` when a line is due now, `n` occurrences since the last line
    /// not counting this one; `None` when it is not.
    pub(crate) fn due(&self) -> Option<u64> {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        let now = ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1;
        let last = self.last.load(Relaxed);
        let every = WARN_EVERY.as_millis() as u64;
        if (last == 0 || now.saturating_sub(last) >= every)
            && self
                .last
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            return Some(self.unsaid.swap(0, Relaxed));
        }
        self.unsaid.fetch_add(1, Relaxed);
        None
    }
}

/// " (and N more since the last message)" or nothing.
pub(crate) fn more(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more since the last message)")
    }
}

/// Counters shared by a layer and every service it made.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) force_rejected: AtomicU64,
    pub(crate) trigger_untrusted: AtomicU64,
    pub(crate) path_withheld: AtomicU64,
    pub(crate) paths_returned: AtomicU64,
    pub(crate) callee_path_merged: AtomicU64,
    pub(crate) callee_path_missing: AtomicU64,
    pub(crate) callee_path_invalid: AtomicU64,
    pub(crate) callee_path_oversize: AtomicU64,
    warned_force: AtomicBool,
    warned_invalid: AtomicBool,
    /// The layer's configuration was checked when it wrapped a service.
    pub(crate) checked_config: AtomicBool,
    pub(crate) untrusted: Every,
    pub(crate) missing: Every,
}

impl Counters {
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    /// Count a rejected force and warn the first time.
    pub(crate) fn force_rejected(&self) {
        Self::bump(&self.force_rejected);
        if !self.warned_force.swap(true, Relaxed) {
            tracing::warn!(
                target: "cpt_middleware",
                "ignored an x-cpt-force header without a valid credential \
                 (further ones are only counted in Stats::force_rejected)"
            );
        }
    }

    /// Count a callee path that could not be used and warn the first time.
    pub(crate) fn callee_invalid(&self, oversize: bool, why: &dyn std::fmt::Display) {
        Self::bump(if oversize {
            &self.callee_path_oversize
        } else {
            &self.callee_path_invalid
        });
        if !self.warned_invalid.swap(true, Relaxed) {
            tracing::warn!(
                target: "cpt_middleware",
                "a callee returned an unusable critical path ({why}); it is a blind spot \
                 (further ones are only counted in Stats)"
            );
        }
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            force_rejected: self.force_rejected.load(Relaxed),
            trigger_untrusted: self.trigger_untrusted.load(Relaxed),
            path_withheld: self.path_withheld.load(Relaxed),
            paths_returned: self.paths_returned.load(Relaxed),
            callee_path_merged: self.callee_path_merged.load(Relaxed),
            callee_path_missing: self.callee_path_missing.load(Relaxed),
            callee_path_invalid: self.callee_path_invalid.load(Relaxed),
            callee_path_oversize: self.callee_path_oversize.load(Relaxed),
        }
    }
}

/// A snapshot of a layer's counters (`ServerLayer::stats`, `ClientLayer::stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Server: `x-cpt-force` headers ignored for want of a valid credential.
    pub force_rejected: u64,
    /// Server: propagated triggers ignored because the caller is not trusted.
    pub trigger_untrusted: u64,
    /// Server: paths asked for by untrusted callers and not returned.
    pub path_withheld: u64,
    /// Server: paths returned to trusted callers.
    pub paths_returned: u64,
    /// Client: callee paths merged into the caller's path.
    pub callee_path_merged: u64,
    /// Client: traced calls whose callee returned no path (blind spots).
    pub callee_path_missing: u64,
    /// Client: callee paths that failed to decode (blind spots).
    pub callee_path_invalid: u64,
    /// Client: callee paths over the size limit (blind spots).
    pub callee_path_oversize: u64,
}
