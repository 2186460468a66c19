//! Top-down analysis (CRISP §6.1): per endpoint, the aggregate critical
//! path of the requests in latency-percentile windows (P50, P95, P99), as
//! the collector's own [`Aggregate`]s (pprof profiles, flame graphs), and the
//! differential between two windows with confidence intervals
//! ([`crate::profile::diff`]).
//!
//! A window is a percentile band of end-to-end latency within the endpoint
//! ([`PercentileBand`]), by nearest rank like the header's percentiles
//! (`pLO-pHI` holds the pLO request to the pHI request, both included, so
//! the header's p50 is always in the p50 window): the defaults are
//! `P50 = p45-p55` (the typical
//! request), `P95 = p94-p96` and `P99 = p99-p100` (the tail). A whole-range
//! profile would be dominated by the tail's long paths; windows keep each
//! shape apart (CRISP: "the critical path found in P99 latencies may
//! dominate the flame graph and mask the other common cases").

use std::collections::HashMap;
use std::fmt::Write as _;

use cpt_sdk::Record;

use crate::profile::aggregate::{Aggregate, ranked_stacks};
use crate::profile::diff::{DiffOptions, DiffReport, diff};
use crate::records::selection::{PercentileBand, Selection};

use super::{nearest_rank, quantile};
use crate::format::fmt_ns;

/// A named latency window.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    /// Name used in reports and file names (`p50`).
    pub name: String,
    /// The band.
    pub band: PercentileBand,
}

impl Window {
    /// Parse `NAME=BAND` (`p50=p45-p55`) or a bare band (`p99-p100`, named
    /// after itself).
    ///
    /// # Errors
    ///
    /// If the band does not parse.
    pub fn parse(s: &str) -> Result<Window, String> {
        let (name, band) = match s.split_once('=') {
            Some((n, b)) => (n.to_string(), b),
            None => (s.to_string(), s),
        };
        let band = PercentileBand::parse(band).map_err(|e| e.to_string())?;
        Ok(Window { name, band })
    }
}

/// `p50 = p45-p55`, `p95 = p94-p96`, `p99 = p99-p100`.
pub fn default_windows() -> Vec<Window> {
    ["p50=p45-p55", "p95=p94-p96", "p99=p99-p100"]
        .iter()
        .map(|s| Window::parse(s).expect("default windows parse; this is a bug"))
        .collect()
}

/// One endpoint's top-down report.
#[derive(Debug)]
pub struct EndpointReport {
    /// Service of the endpoint's root spans.
    pub service: String,
    /// Operation of the root spans.
    pub endpoint: Option<String>,
    /// Requests (records) of the endpoint.
    pub requests: u64,
    /// Latency P50, P95, P99 over all its requests, ns.
    pub latency_ns: [u64; 3],
    /// One aggregate per window.
    pub windows: Vec<(Window, Aggregate)>,
}

/// The endpoints of the records, most requests first.
pub fn endpoints(records: &[Record]) -> Vec<(String, Option<String>, u64)> {
    let mut m: HashMap<(&str, Option<&str>), u64> = HashMap::new();
    for r in records {
        *m.entry((&r.service, r.endpoint.as_deref())).or_default() += 1;
    }
    let mut v: Vec<_> = m
        .into_iter()
        .map(|((s, e), n)| (s.to_string(), e.map(str::to_string), n))
        .collect();
    v.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| (&a.0, &a.1).cmp(&(&b.0, &b.1))));
    v
}

fn endpoint_selection(service: &str, endpoint: Option<&str>) -> Selection {
    let sel = Selection::new().with_service(service);
    match endpoint {
        Some(e) => sel.with_endpoint(e),
        None => sel,
    }
}

/// The band of `n` requests that keeps exactly the pLO request to the pHI
/// request by nearest rank ([`nearest_rank`]), both included: the
/// definition of the header's percentiles, so the header's pX lies in every
/// window that holds X, however few the requests. (The selection's own
/// bands round `n·p` at both ends, which can leave the median of 2 or 5
/// requests out of `p45-p55`.)
fn nearest_rank_band(band: PercentileBand, n: usize) -> PercentileBand {
    if n == 0 {
        return band;
    }
    let lo = nearest_rank(band.lo() / 100.0, n);
    let hi = nearest_rank(band.hi() / 100.0, n);
    let pct = |k: usize| k as f64 * 100.0 / n as f64;
    PercentileBand::new(pct(lo), pct(hi + 1)).unwrap_or(band)
}

/// Build the window profiles of every endpoint with at least `min_requests`
/// records.
pub fn top_down(records: &[Record], windows: &[Window], min_requests: u64) -> Vec<EndpointReport> {
    let mut out = Vec::new();
    for (service, endpoint, n) in endpoints(records) {
        if n < min_requests {
            continue;
        }
        let base = endpoint_selection(&service, endpoint.as_deref());
        let lat: Vec<u64> = records
            .iter()
            .filter(|r| base.matches(r))
            .map(|r| u64::try_from(r.latency.as_nanos()).unwrap_or(u64::MAX))
            .collect();
        let windows = windows
            .iter()
            .map(|w| {
                let sel = base
                    .clone()
                    .with_percentile(nearest_rank_band(w.band, lat.len()));
                (w.clone(), Aggregate::from_records(&sel, records))
            })
            .collect();
        out.push(EndpointReport {
            latency_ns: [
                quantile(&lat, 0.5),
                quantile(&lat, 0.95),
                quantile(&lat, 0.99),
            ],
            service,
            endpoint,
            requests: n,
            windows,
        });
    }
    out
}

/// The differential between two windows of one endpoint (`test − base`,
/// per stack, with confidence intervals), and the two aggregates (for
/// `go tool pprof -diff_base base test`).
pub fn window_diff(
    records: &[Record],
    service: &str,
    endpoint: Option<&str>,
    base: &Window,
    test: &Window,
    opts: &DiffOptions,
) -> (DiffReport, Aggregate, Aggregate) {
    let sel = endpoint_selection(service, endpoint);
    let n = records.iter().filter(|r| sel.matches(r)).count();
    let b = Aggregate::from_records(
        &sel.clone().with_percentile(nearest_rank_band(base.band, n)),
        records,
    );
    let t = Aggregate::from_records(
        &sel.with_percentile(nearest_rank_band(test.band, n)),
        records,
    );
    (diff(&b, &t, opts), b, t)
}

/// Text: per endpoint, its latency percentiles and, per window, the mean
/// latency and the `top` heaviest stacks.
pub fn to_text(reports: &[EndpointReport], top: usize) -> String {
    let mut s = String::new();
    for r in reports {
        let _ = writeln!(
            s,
            "== {} {} — {}, latency p50 {} p95 {} p99 {}",
            r.service,
            r.endpoint.as_deref().unwrap_or("(any)"),
            crate::format::plural(r.requests, "request"),
            fmt_ns(r.latency_ns[0]),
            fmt_ns(r.latency_ns[1]),
            fmt_ns(r.latency_ns[2])
        );
        for (w, agg) in &r.windows {
            let _ = writeln!(
                s,
                "  [{} = {}] {}, mean critical path {}",
                w.name,
                w.band,
                crate::format::plural(agg.requests(), "request"),
                fmt_ns(u64::try_from(agg.mean_latency().as_nanos()).unwrap_or(u64::MAX))
            );
            for (stack, ns) in ranked_stacks(agg).into_iter().take(top) {
                let _ = writeln!(s, "    {:>10}  {stack}", fmt_ns(ns));
            }
        }
    }
    s
}

/// A file-name-safe form of `service endpoint window`.
pub fn file_stem(service: &str, endpoint: Option<&str>, window: &str) -> String {
    let clean = |t: &str| -> String {
        let s: String = t
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        s.trim_matches('_').to_string()
    };
    format!(
        "{}__{}.{}",
        clean(service),
        clean(endpoint.unwrap_or("any")),
        clean(window)
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cpt_sdk::{CriticalPath, Frame, SegmentKind, Trigger};

    use super::*;

    fn rec(ms: u64, slow: bool) -> Record {
        let mut p = CriticalPath::new();
        p.push_frames(
            [Frame::new("A", "/x")],
            Duration::from_millis(1),
            SegmentKind::Busy,
        );
        let leaf = if slow { "db" } else { "cache" };
        p.push_frames(
            [Frame::new("A", "/x"), Frame::new("B", leaf)],
            Duration::from_millis(ms - 1),
            SegmentKind::Busy,
        );
        let mut r = Record::new("A", Trigger::Sampled, p);
        r.endpoint = Some("/x".into());
        r
    }

    #[test]
    fn the_header_percentiles_lie_in_their_windows_with_few_requests() {
        // n requests of 2..=n+1 ms, each through its own leaf `ms{k}`.
        for n in 1..=30u64 {
            let records: Vec<Record> = (0..n)
                .map(|k| {
                    let mut r = rec(k + 2, false);
                    let mut p = CriticalPath::new();
                    p.push_frames(
                        [
                            Frame::new("A", "/x"),
                            Frame::new("B", format!("ms{}", k + 2)),
                        ],
                        Duration::from_millis(k + 2),
                        SegmentKind::Busy,
                    );
                    r.path = p;
                    r.latency = Duration::from_millis(k + 2);
                    r
                })
                .collect();
            let reports = top_down(&records, &default_windows(), 1);
            let r = &reports[0];
            for (i, (w, agg)) in r.windows.iter().enumerate() {
                let want = format!("ms{} (B)", r.latency_ns[i] / 1_000_000);
                assert!(
                    ranked_stacks(agg).iter().any(|(s, _)| s.ends_with(&want)),
                    "n={n}: header {} = {want} not in window {} ({:?})",
                    w.name,
                    w.band,
                    ranked_stacks(agg)
                );
            }
        }
    }

    #[test]
    fn windows_separate_typical_and_tail_paths() {
        // 95 fast requests through the cache, 5 slow ones through the db.
        let mut records: Vec<Record> = (0..95).map(|i| rec(10 + i % 3, false)).collect();
        records.extend((0..5).map(|i| rec(100 + i, true)));
        let reports = top_down(&records, &default_windows(), 1);
        assert_eq!(reports.len(), 1);
        let r = &reports[0];
        assert_eq!(r.requests, 100);
        let p50 = &r.windows[0].1;
        let p99 = &r.windows[2].1;
        assert!(ranked_stacks(p50)[0].0.contains("cache"));
        assert!(ranked_stacks(p99)[0].0.contains("db"));
        let (d, _, _) = window_diff(
            &records,
            "A",
            Some("/x"),
            &r.windows[0].0,
            &r.windows[2].0,
            &DiffOptions::default(),
        );
        assert!(d.total.change_nanos > 80e6, "{}", d.total.change_nanos);
        assert_eq!(
            file_stem("nginx", Some("/wrk2-api/review/compose"), "p50"),
            "nginx__wrk2-api_review_compose.p50"
        );
    }
}
