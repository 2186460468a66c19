//! The operator's log of failures a client only sees in general terms.
//!
//! Error bodies never name the store's or the Parquet directory's files; the
//! detail goes to the collector's stderr instead, once per kind per
//! [`INTERVAL`] with the count of the occurrences not printed in between, so
//! a failing disk under load does not flood the log and is never silent.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// At most one line per kind in this interval.
pub(crate) const INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Seen {
    last_printed: Instant,
    suppressed: u64,
}

fn kinds() -> &'static Mutex<HashMap<&'static str, Seen>> {
    static KINDS: OnceLock<Mutex<HashMap<&'static str, Seen>>> = OnceLock::new();
    KINDS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Log `detail()` for a failure of `kind` unless one was logged in the last
/// [`INTERVAL`] (then only count it). Returns whether a line was printed.
pub(crate) fn error(kind: &'static str, detail: impl FnOnce() -> String) -> bool {
    let now = Instant::now();
    let mut kinds = kinds()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let suppressed = match kinds.get_mut(kind) {
        Some(seen) if now.duration_since(seen.last_printed) < INTERVAL => {
            seen.suppressed += 1;
            return false;
        }
        Some(seen) => std::mem::take(&mut seen.suppressed),
        None => 0,
    };
    kinds.insert(
        kind,
        Seen {
            last_printed: now,
            suppressed: 0,
        },
    );
    drop(kinds);
    if suppressed > 0 {
        eprintln!(
            "cpt serve: error: {kind}: {} (and {suppressed} more since the last report)",
            detail()
        );
    } else {
        eprintln!("cpt serve: error: {kind}: {}", detail());
    }
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_kind_is_printed_once_per_interval_and_kinds_are_separate() {
        assert!(super::error("test kind a", || "first".into()));
        assert!(!super::error("test kind a", || "second".into()));
        assert!(super::error("test kind b", || "other kind".into()));
    }
}
