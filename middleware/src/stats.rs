//! [`Stats`]: what the middleware ignored or dropped, counted instead of
//! failing the request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::credential::Rejection;

/// How often a warning whose cause goes on is said again (a misconfiguration,
/// a refused force credential, an unusable callee path).
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
    force_rejected_by: [AtomicU64; Rejection::ALL.len()],
    /// One per reason.
    force_warnings: [Every; Rejection::ALL.len()],
    pub(crate) trigger_untrusted: AtomicU64,
    pub(crate) path_withheld: AtomicU64,
    pub(crate) paths_returned: AtomicU64,
    pub(crate) path_unsent: AtomicU64,
    pub(crate) callee_path_merged: AtomicU64,
    pub(crate) callee_path_missing: AtomicU64,
    pub(crate) callee_path_invalid: AtomicU64,
    pub(crate) callee_path_oversize: AtomicU64,
    invalid: Every,
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

    /// Count a rejected force by reason, and warn once per reason per
    /// [`WARN_EVERY`] with the number refused since.
    pub(crate) fn force_rejected(&self, service: &str, why: Rejection) {
        Self::bump(&self.force_rejected);
        Self::bump(&self.force_rejected_by[why.index()]);
        let Some(unsaid) = self.force_warnings[why.index()].due() else {
            return;
        };
        if unsaid == 0 {
            tracing::warn!(
                target: "cpt_middleware",
                service,
                reason = ?why,
                "ignored x-cpt-force: {why} (the request is sampled as usual; further ones are \
                 logged at most once a minute per reason and counted in Stats)"
            );
        } else {
            let count = unsaid + 1;
            tracing::warn!(
                target: "cpt_middleware",
                service,
                reason = ?why,
                count,
                "ignored x-cpt-force {count} times in the last minute or more: {why}"
            );
        }
    }

    /// Count a callee path that could not be used and warn, rate-limited.
    pub(crate) fn callee_invalid(&self, oversize: bool, why: &dyn std::fmt::Display) {
        Self::bump(if oversize {
            &self.callee_path_oversize
        } else {
            &self.callee_path_invalid
        });
        if let Some(unsaid) = self.invalid.due() {
            tracing::warn!(
                target: "cpt_middleware",
                "a callee returned an unusable critical path ({why}){}; it is a blind spot \
                 (logged at most once a minute, counted in Stats)",
                more(unsaid),
            );
        }
    }

    fn by(&self, why: Rejection) -> u64 {
        self.force_rejected_by[why.index()].load(Relaxed)
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            force_rejected: self.force_rejected.load(Relaxed),
            force_malformed: self.by(Rejection::Malformed),
            force_old_format: self.by(Rejection::OldFormat),
            force_no_request_id: self.by(Rejection::NoRequestId),
            force_bad_mac: self.by(Rejection::BadMac),
            force_expired: self.by(Rejection::Expired),
            force_foreign_service: self.by(Rejection::ForeignService),
            force_replayed: self.by(Rejection::Replayed),
            force_replay_cache_full: self.by(Rejection::ReplayCacheFull),
            trigger_untrusted: self.trigger_untrusted.load(Relaxed),
            path_withheld: self.path_withheld.load(Relaxed),
            paths_returned: self.paths_returned.load(Relaxed),
            path_unsent: self.path_unsent.load(Relaxed),
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
    /// Server: `x-cpt-force` headers ignored for want of a valid credential
    /// (the sum of the `force_*` reasons below).
    pub force_rejected: u64,
    /// Server: of them, not a credential at all.
    pub force_malformed: u64,
    /// Server: of them, credentials of the format before version 1 (or a
    /// fixed token sent verbatim).
    pub force_old_format: u64,
    /// Server: of them, on requests without `x-request-id`.
    pub force_no_request_id: u64,
    /// Server: of them, with a MAC that does not match.
    pub force_bad_mac: u64,
    /// Server: of them, expired (or expiring too far ahead).
    pub force_expired: u64,
    /// Server: of them, minted for another service.
    pub force_foreign_service: u64,
    /// Server: of them, replays of a credential accepted before.
    pub force_replayed: u64,
    /// Server: of them, refused because the replay cache was full.
    pub force_replay_cache_full: u64,
    /// Server: propagated triggers ignored because the caller is not trusted.
    pub trigger_untrusted: u64,
    /// Server: paths asked for by untrusted callers and not returned.
    pub path_withheld: u64,
    /// Server: paths returned to trusted callers (put in a response's
    /// headers or trailers).
    pub paths_returned: u64,
    /// Server: paths trusted callers asked for that no response carried: a
    /// streamed response whose server sends no trailers (actix-web; the
    /// caller is told so in [`header::NO_PATH`](crate::header::NO_PATH)), or
    /// a response or stream that failed.
    pub path_unsent: u64,
    /// Client: callee paths merged into the caller's path.
    pub callee_path_merged: u64,
    /// Client: traced calls whose callee returned no path (blind spots).
    pub callee_path_missing: u64,
    /// Client: callee paths that failed to decode (blind spots).
    pub callee_path_invalid: u64,
    /// Client: callee paths over the size limit (blind spots).
    pub callee_path_oversize: u64,
}
