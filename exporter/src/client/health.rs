//! What the collector client says in the service's log when it cannot
//! deliver: the first failure at once (with the endpoint, the error and what
//! to check), then while the collector stays unreachable at most one summary
//! per [`SUMMARY_EVERY`] of what was spooled and dropped meanwhile, and one
//! line when it answers again. Refused batches (a wrong token, a record the
//! collector will not take, a gRPC endpoint that is the collector's HTTP
//! port) are said the same way, rate-limited.
//!
//! Through `tracing` (target `cpt_exporter`), so the lines go wherever the
//! service's own logs go. The SDK's exporter calls the client on a worker
//! thread that runs under `NoSubscriber` (so that the exporter never traces
//! itself), where a line would reach no one: each line is written to the
//! subscriber of the thread that sends, unless that is `NoSubscriber`, then
//! to the process's global subscriber, and to stderr when the process has
//! none ([`to_service_log`]).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tracing::Dispatch;
use tracing::subscriber::NoSubscriber;

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

/// How loud a line is.
#[derive(Clone, Copy)]
enum Level {
    Warn,
    Info,
}

/// The process's global subscriber, once one is set (it never changes
/// after that). Read on a thread of its own, where no scoped default hides
/// it.
fn global_dispatch() -> Option<Dispatch> {
    static GLOBAL: OnceLock<Dispatch> = OnceLock::new();
    if let Some(d) = GLOBAL.get() {
        return Some(d.clone());
    }
    if !tracing::dispatcher::has_been_set() {
        return None;
    }
    let d = std::thread::Builder::new()
        .name("cpt-exporter-log".into())
        .spawn(|| tracing::dispatcher::get_default(Dispatch::clone))
        .ok()?
        .join()
        .ok()?;
    Some(GLOBAL.get_or_init(|| d).clone())
}

/// Write one line where the service's logs go (see the module docs).
fn to_service_log(level: Level, endpoint: &Endpoint, error: Option<&str>, line: &str) {
    let emit = || match level {
        Level::Warn => tracing::warn!(
            target: "cpt_exporter",
            collector = %endpoint,
            error = error.unwrap_or(""),
            "{line}"
        ),
        Level::Info => tracing::info!(target: "cpt_exporter", collector = %endpoint, "{line}"),
    };
    if !tracing::dispatcher::get_default(|d| d.is::<NoSubscriber>()) {
        return emit();
    }
    match global_dispatch() {
        Some(global) if !global.is::<NoSubscriber>() => {
            tracing::dispatcher::with_default(&global, emit)
        }
        _ => eprintln!("{line}"),
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
                let line = format!(
                    "cpt: cannot deliver records to the collector at {endpoint}: {reason}; \
                     retrying with backoff (check CPT_COLLECTOR_ENDPOINT, that `cpt serve` \
                     listens there, and that {} is its {} port; further failures are \
                     summarised every {}s)",
                    endpoint.address(),
                    endpoint.protocol(),
                    SUMMARY_EVERY.as_secs(),
                );
                to_service_log(Level::Warn, endpoint, Some(reason), &line);
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
                    let line = format!(
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
                    to_service_log(Level::Warn, endpoint, Some(reason), &line);
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
            let line = format!(
                "cpt: the collector at {endpoint} refused {} batch(es) since the last message \
                 ({} records refused in all), last: {reason}; refused batches are not retried \
                 (a 401 means the ingest token is missing or wrong)",
                self.refusals_since_line,
                stats.rejected_records(),
            );
            to_service_log(Level::Warn, endpoint, Some(reason), &line);
            self.last_refusal = Some(now);
            self.refusals_since_line = 0;
        }
    }

    /// An attempt succeeded.
    pub(super) fn delivered(&mut self, endpoint: &Endpoint, stats: &ClientStats) {
        if let Some(since) = self.failing_since.take() {
            let line = format!(
                "cpt: the collector at {endpoint} answers again after {}s; {} records wait in \
                 the spool to be replayed, {} were dropped in all",
                since.elapsed().as_secs(),
                stats.spool_pending_records(),
                stats.dropped_after_retries(),
            );
            to_service_log(Level::Info, endpoint, None, &line);
            self.last_line = None;
            self.failures_since_line = 0;
        }
    }
}
