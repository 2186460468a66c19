//! How the collector writes numbers and fields for people and for CSV,
//! shared by every report (the profile reports, the trace analyses, the CLI)
//! and by the record reader's warnings. It depends on nothing else here.

use std::time::Duration;

/// Nanoseconds for humans: `850ns`, `12.5µs`, `3.20ms`, `1.500s`.
pub fn fmt_ns(ns: u64) -> String {
    let d = Duration::from_nanos(ns);
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}µs", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", ns as f64 / 1e6)
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

/// Quote a CSV field when it needs it.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// `1 request`, `2 requests`: a count with its noun, singular for one.
pub fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("{n} {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
