//! What the collector client says in the service's log when it cannot
//! deliver: the first failure at once (with the address and the error), then
//! while the collector stays unreachable at most one summary per
//! [`SUMMARY_EVERY`] of what was spooled and dropped meanwhile, and one line
//! when it answers again. Refused batches (a wrong token, a record the
//! collector will not take) are said the same way, rate-limited.
//!
//! Through `tracing`, so the lines go wherever the service's own logs go
//! (target `cpt_collector::client`).

use std::time::{Duration, Instant};

use super::{ClientStats, Endpoint};

/// At most one line per this interval while failures go on.
pub(super) const SUMMARY_EVERY: Duration = Duration::from_secs(30);

/// The counters a summary reports the change of.
#[derive(Clone, Copy, Default)]
struct Seen {
    spooled: u64,
    dropped: u64,
}

impl Seen {
    fn of(stats: &ClientStats) -> Seen {
        Seen {
            spooled: stats.spooled_records(),
            dropped: stats.dropped_after_retries(),
        }
    }
}

/// The client's view of its collector, for the log.
#[derive(Default)]
pub(super) struct Health {
    /// Since when attempts fail (`None`: the last one succeeded).
    failing_since: Option<Instant>,
    /// When a line was last written, and the counters then.
    last_line: Option<(Instant, Seen)>,
    /// Attempts that failed since the last line.
    failures_since_line: u64,
    /// When a refusal was last written.
    last_refusal: Option<Instant>,
    refusals_since_line: u64,
}

impl Health {
    /// An attempt failed and will be retried (or the batch spooled).
    pub(super) fn unreachable(&mut self, endpoint: &Endpoint, reason: &str, stats: &ClientStats) {
        let now = Instant::now();
        self.failures_since_line += 1;
        match self.failing_since {
            None => {
                self.failing_since = Some(now);
                tracing::warn!(
                    target: "cpt_collector::client",
                    collector = %endpoint,
                    error = %reason,
                    "cpt: cannot deliver records to the collector at {endpoint}: {reason}; \
                     retrying with backoff (check CPT_COLLECTOR_ENDPOINT and that `cpt serve` \
                     listens there; further failures are summarised every {}s)",
                    SUMMARY_EVERY.as_secs(),
                );
                self.last_line = Some((now, Seen::of(stats)));
                self.failures_since_line = 0;
            }
            Some(since) => {
                let due = self
                    .last_line
                    .is_none_or(|(at, _)| now.duration_since(at) >= SUMMARY_EVERY);
                if due {
                    let then = self.last_line.map(|(_, s)| s).unwrap_or_default();
                    let seen = Seen::of(stats);
                    tracing::warn!(
                        target: "cpt_collector::client",
                        collector = %endpoint,
                        error = %reason,
                        "cpt: the collector at {endpoint} has been unreachable for {}s \
                         ({} failed attempts since the last message; last error: {reason}); \
                         meanwhile {} records were spooled ({} wait in the spool) and {} \
                         dropped",
                        now.duration_since(since).as_secs(),
                        self.failures_since_line,
                        seen.spooled - then.spooled,
                        stats.spool_pending_records(),
                        seen.dropped - then.dropped,
                    );
                    self.last_line = Some((now, seen));
                    self.failures_since_line = 0;
                }
            }
        }
    }

    /// The collector refused a batch (not retried).
    pub(super) fn refused(&mut self, endpoint: &Endpoint, reason: &str, stats: &ClientStats) {
        let now = Instant::now();
        self.refusals_since_line += 1;
        if self
            .last_refusal
            .is_none_or(|at| now.duration_since(at) >= SUMMARY_EVERY)
        {
            tracing::warn!(
                target: "cpt_collector::client",
                collector = %endpoint,
                error = %reason,
                "cpt: the collector at {endpoint} refused {} batch(es) since the last message \
                 ({} records refused in all), last: {reason}; refused batches are not retried \
                 (a 401 means the ingest token is missing or wrong)",
                self.refusals_since_line,
                stats.rejected_records(),
            );
            self.last_refusal = Some(now);
            self.refusals_since_line = 0;
        }
    }

    /// An attempt succeeded.
    pub(super) fn delivered(&mut self, endpoint: &Endpoint, stats: &ClientStats) {
        if let Some(since) = self.failing_since.take() {
            tracing::info!(
                target: "cpt_collector::client",
                collector = %endpoint,
                "cpt: the collector at {endpoint} answers again after {}s; {} records wait in \
                 the spool to be replayed, {} were dropped in all",
                since.elapsed().as_secs(),
                stats.spool_pending_records(),
                stats.dropped_after_retries(),
            );
            self.last_line = None;
            self.failures_since_line = 0;
        }
    }
}
