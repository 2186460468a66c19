//! [`Selection`]: which records a profile is built from (CPT "Aggregation and
//! Visualization": "select a random sample of requests, meeting whatever
//! criteria are of interest").
//!
//! A selection filters on the entry service, the endpoint, a time range on the
//! request's wall-clock start, user labels (A/B arm, region, …), the trigger
//! (forced records are left out unless asked for: an operator forcing traces
//! on slow requests would bias the average) and a latency percentile band such
//! as `p95-p100`. The band is computed over the records that pass every other
//! filter, so `service=A&percentile=p99-p100` is "the slowest 1 % of A's
//! requests".
//!
//! # Textual form
//!
//! The CLI flags and `cpt serve`'s `GET /profile?…` use the same `key=value`
//! pairs ([`Selection::set`], [`Selection::from_query`]):
//!
//! | key          | value                                                            |
//! |--------------|------------------------------------------------------------------|
//! | `service`    | entry service name, exact                                        |
//! | `endpoint`   | endpoint, exact                                                  |
//! | `since`      | start ≥ this time (inclusive), see [`parse_time`]                |
//! | `until`      | start < this time (exclusive), see [`parse_time`]                |
//! | `label`      | `key=value`; repeat for several (all must match)                 |
//! | `percentile` | band `pLO-pHI`, e.g. `p95-p100`, `p0-p50`, `p99.9-p100`           |
//! | `trigger`    | `sampled` (default), `forced` or `all`; `all` is the default when a request or trace id is given |
//! | `request_id` | the record's `request_id` (`x-request-id`), exact                |
//! | `trace_id`   | the record's OpenTelemetry trace id, exact (hex, case-insensitive) |
//!
//! A request id or trace id selects one request (or the few records of one
//! trace), forced or not: asking for a request by its id means that request,
//! so unless `trigger` is given such a selection keeps every trigger.
//!
//! # Examples
//!
//! ```
//! use cpt_collector::selection::Selection;
//!
//! let sel = Selection::from_query("service=A&label=arm%3Db&percentile=p95-p100").unwrap();
//! assert_eq!(sel.service(), Some("A"));
//! assert_eq!(sel.to_string(), "service=A label=arm=b percentile=p95-p100 trigger=sampled");
//! ```

use std::fmt;
use std::ops::Range;
use std::time::{Duration, UNIX_EPOCH};

use cpt_sdk::record::Record;
use cpt_sdk::trigger::Trigger;

/// What a selection looks at in a record, borrowed.
pub struct RecordKeys<'a> {
    /// The entry service.
    pub service: &'a str,
    /// The endpoint.
    pub endpoint: Option<&'a str>,
    /// The trigger.
    pub trigger: Trigger,
    /// The wall-clock start, ns since the Unix epoch.
    pub start_unix_nanos: Option<u64>,
    /// The request id.
    pub request_id: Option<&'a str>,
    /// The trace id.
    pub trace_id: Option<&'a str>,
    /// A label's value by key.
    pub label: &'a dyn Fn(&str) -> Option<&'a str>,
}

impl fmt::Debug for RecordKeys<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordKeys")
            .field("service", &self.service)
            .field("endpoint", &self.endpoint)
            .field("trigger", &self.trigger)
            .field("start_unix_nanos", &self.start_unix_nanos)
            .finish_non_exhaustive()
    }
}

/// Which triggers a selection keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TriggerFilter {
    /// Only sampled records (the default: forced traces are not a random sample).
    #[default]
    Sampled,
    /// Only forced records.
    Forced,
    /// Both.
    All,
}

impl TriggerFilter {
    /// Whether a record with this trigger is kept.
    pub fn keeps(self, trigger: Trigger) -> bool {
        match self {
            TriggerFilter::Sampled => trigger == Trigger::Sampled,
            TriggerFilter::Forced => trigger == Trigger::Forced,
            TriggerFilter::All => true,
        }
    }

    /// `"sampled"`, `"forced"` or `"all"`.
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerFilter::Sampled => "sampled",
            TriggerFilter::Forced => "forced",
            TriggerFilter::All => "all",
        }
    }

    /// Parse [`TriggerFilter::as_str`]'s form.
    ///
    /// # Errors
    ///
    /// If `s` is none of the three names.
    pub fn parse(s: &str) -> Result<Self, SelectionError> {
        match s {
            "sampled" => Ok(TriggerFilter::Sampled),
            "forced" => Ok(TriggerFilter::Forced),
            "all" => Ok(TriggerFilter::All),
            _ => Err(SelectionError::new(format!(
                "trigger {s:?}: expected \"sampled\", \"forced\" or \"all\""
            ))),
        }
    }
}

/// A latency percentile band `[lo, hi]`, both in `0..=100`.
///
/// The band keeps the records whose latency *rank* (ascending, ties broken by
/// input order) falls in `[round(n·lo/100), round(n·hi/100))`. Adjacent bands
/// (`p0-p50`, `p50-p100`) therefore partition the records exactly, and a
/// non-empty band over a non-empty selection keeps at least one record (the
/// one at rank `round(n·lo/100)`, clamped), so `p99-p100` of 10 requests is
/// the slowest one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PercentileBand {
    lo: f64,
    hi: f64,
}

impl PercentileBand {
    /// The band `[lo, hi]`.
    ///
    /// # Errors
    ///
    /// Unless `0 <= lo < hi <= 100`.
    pub fn new(lo: f64, hi: f64) -> Result<Self, SelectionError> {
        if !(0.0..=100.0).contains(&lo) || !(0.0..=100.0).contains(&hi) || lo.is_nan() {
            return Err(SelectionError::new(format!(
                "percentile band p{lo}-p{hi}: bounds must be within 0..=100"
            )));
        }
        if lo >= hi {
            return Err(SelectionError::new(format!(
                "percentile band p{lo}-p{hi}: the lower bound must be below the upper"
            )));
        }
        Ok(PercentileBand { lo, hi })
    }

    /// Parse `p95-p100`, `95-100` or `p99.9-p100`: both bounds, always.
    ///
    /// # Errors
    ///
    /// If the text is not of that form or the bounds are out of order. A
    /// single bound (`p99`) is refused: it could mean the tail above it
    /// (`p99-p100`) or everything below it (`p0-p99`), and the message offers
    /// both.
    pub fn parse(s: &str) -> Result<Self, SelectionError> {
        let bad = |why: &str| {
            SelectionError::new(format!(
                "percentile band {s:?}: {why} (expected e.g. \"p95-p100\" or \"p0-p50\")"
            ))
        };
        let num = |t: &str| -> Result<f64, SelectionError> {
            let t = t.trim();
            let t = t.strip_prefix(['p', 'P']).unwrap_or(t);
            t.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| bad(&format!("{t:?} is not a number")))
        };
        let (lo, hi) = match s.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let v = num(s)?;
                return Err(SelectionError::new(format!(
                    "percentile band {s:?}: give both bounds, e.g. \"p{v}-p100\" for the slowest \
                     {}% or \"p0-p{v}\" for the rest",
                    ((100.0 - v) * 1e6).round() / 1e6
                )));
            }
        };
        PercentileBand::new(lo, hi)
    }

    /// Lower bound, in percent.
    pub fn lo(&self) -> f64 {
        self.lo
    }

    /// Upper bound, in percent.
    pub fn hi(&self) -> f64 {
        self.hi
    }

    /// The ranks (0-based, ascending latency) this band keeps out of `n`.
    pub fn ranks(&self, n: usize) -> Range<usize> {
        if n == 0 {
            return 0..0;
        }
        let at = |p: f64| ((n as f64) * p / 100.0).round() as usize;
        let lo = at(self.lo).min(n - 1);
        let hi = at(self.hi).clamp(lo + 1, n);
        lo..hi
    }
}

impl fmt::Display for PercentileBand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}-p{}", self.lo, self.hi)
    }
}

/// Most label filters one selection may hold: each is a condition of the
/// store's query, and a query of thousands would be refused by SQLite.
pub const MAX_LABELS: usize = 64;

/// Which records to aggregate. See the [module docs](self).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    service: Option<String>,
    endpoint: Option<String>,
    since: Option<u64>,
    until: Option<u64>,
    labels: Vec<(String, String)>,
    percentile: Option<PercentileBand>,
    /// `None`: the default ([`Selection::triggers`]).
    triggers: Option<TriggerFilter>,
    request_id: Option<String>,
    trace_id: Option<String>,
}

impl Selection {
    /// Every sampled record (forced ones are excluded by default).
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep only records of this entry service.
    #[must_use]
    pub fn with_service(mut self, service: impl Into<String>) -> Self {
        self.service = Some(service.into());
        self
    }

    /// Keep only records of this endpoint.
    #[must_use]
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Keep only records that started at or after this time (Unix nanoseconds).
    /// Records without a start time are then left out.
    #[must_use]
    pub fn with_since(mut self, unix_nanos: u64) -> Self {
        self.since = Some(unix_nanos);
        self
    }

    /// Keep only records that started before this time (Unix nanoseconds).
    /// Records without a start time are then left out.
    #[must_use]
    pub fn with_until(mut self, unix_nanos: u64) -> Self {
        self.until = Some(unix_nanos);
        self
    }

    /// Keep only records carrying this label (repeatable: all must match).
    #[must_use]
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.push((key.into(), value.into()));
        self
    }

    /// Keep only records in this latency percentile band (computed over the
    /// records every other filter keeps).
    #[must_use]
    pub fn with_percentile(mut self, band: PercentileBand) -> Self {
        self.percentile = Some(band);
        self
    }

    /// Which triggers to keep (default: sampled only).
    #[must_use]
    pub fn with_triggers(mut self, triggers: TriggerFilter) -> Self {
        self.triggers = Some(triggers);
        self
    }

    /// Keep only the record(s) of this request id (`x-request-id`).
    #[must_use]
    pub fn with_request_id(mut self, id: impl Into<String>) -> Self {
        self.request_id = Some(id.into());
        self
    }

    /// Keep only the record(s) of this OpenTelemetry trace id (stored
    /// lowercase; the id is lowercased here).
    #[must_use]
    pub fn with_trace_id(mut self, id: impl Into<String>) -> Self {
        self.trace_id = Some(id.into().to_ascii_lowercase());
        self
    }

    /// The request id filter.
    pub fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    /// The trace id filter (lowercase).
    pub fn trace_id(&self) -> Option<&str> {
        self.trace_id.as_deref()
    }

    /// The service filter.
    pub fn service(&self) -> Option<&str> {
        self.service.as_deref()
    }

    /// The endpoint filter.
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// The time range `[since, until)` on `start_unix_nanos`.
    pub fn time_range(&self) -> (Option<u64>, Option<u64>) {
        (self.since, self.until)
    }

    /// The label filters.
    pub fn labels(&self) -> &[(String, String)] {
        &self.labels
    }

    /// The percentile band.
    pub fn percentile(&self) -> Option<PercentileBand> {
        self.percentile
    }

    /// The trigger filter: as set, else [`TriggerFilter::All`] when a
    /// request or trace id is selected (that request, forced or not), else
    /// [`TriggerFilter::Sampled`].
    pub fn triggers(&self) -> TriggerFilter {
        self.triggers
            .unwrap_or(if self.request_id.is_some() || self.trace_id.is_some() {
                TriggerFilter::All
            } else {
                TriggerFilter::Sampled
            })
    }

    /// Whether a record passes every filter except the percentile band
    /// (which needs the whole selection; see [`PercentileBand::ranks`]).
    pub fn matches(&self, r: &Record) -> bool {
        self.matches_keys(&RecordKeys {
            service: &r.service,
            endpoint: r.endpoint.as_deref(),
            trigger: r.trigger,
            start_unix_nanos: r.start_unix_nanos,
            request_id: r.request_id.as_deref(),
            trace_id: r.trace_id.as_deref(),
            label: &|k| r.labels.get(k).map(String::as_str),
        })
    }

    /// [`Selection::matches`] on a record's keys, borrowed from wherever the
    /// record is stored (columns of a Parquet batch, a store row).
    pub fn matches_keys(&self, r: &RecordKeys<'_>) -> bool {
        if !self.triggers().keeps(r.trigger) {
            return false;
        }
        if let Some(id) = &self.request_id
            && r.request_id != Some(id.as_str())
        {
            return false;
        }
        if let Some(id) = &self.trace_id
            && !r.trace_id.is_some_and(|t| t.eq_ignore_ascii_case(id))
        {
            return false;
        }
        if self.service.as_deref().is_some_and(|s| s != r.service) {
            return false;
        }
        if let Some(e) = &self.endpoint
            && r.endpoint != Some(e.as_str())
        {
            return false;
        }
        if self.since.is_some() || self.until.is_some() {
            let Some(start) = r.start_unix_nanos else {
                return false;
            };
            if self.since.is_some_and(|s| start < s) || self.until.is_some_and(|u| start >= u) {
                return false;
            }
        }
        self.labels
            .iter()
            .all(|(k, v)| (r.label)(k).is_some_and(|have| have == v))
    }

    /// Set one filter from its textual `key` and `value` (see the module docs).
    ///
    /// # Errors
    ///
    /// If the key is unknown or the value does not parse; the message names both.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), SelectionError> {
        match key {
            "service" => self.service = Some(non_empty(key, value)?.to_owned()),
            "endpoint" => self.endpoint = Some(non_empty(key, value)?.to_owned()),
            "since" => self.since = Some(parse_time(value)?),
            "until" => self.until = Some(parse_time(value)?),
            "label" => {
                if self.labels.len() >= MAX_LABELS {
                    return Err(SelectionError::new(format!(
                        "more than {MAX_LABELS} label filters, over the limit of {MAX_LABELS}; \
                         narrow the selection another way (service, endpoint, time range)"
                    )));
                }
                let (k, v) = value.split_once('=').ok_or_else(|| {
                    SelectionError::new(format!("label {value:?}: expected key=value"))
                })?;
                self.labels
                    .push((non_empty("label key", k)?.to_owned(), v.to_owned()));
            }
            "percentile" => self.percentile = Some(PercentileBand::parse(value)?),
            "trigger" => self.triggers = Some(TriggerFilter::parse(value)?),
            "request_id" => self.request_id = Some(non_empty(key, value)?.to_owned()),
            "trace_id" => self.trace_id = Some(non_empty(key, value)?.to_ascii_lowercase()),
            _ => {
                return Err(SelectionError::new(format!(
                    "unknown selection key {key:?} (expected service, endpoint, since, until, \
                     label, percentile, trigger, request_id or trace_id)"
                )));
            }
        }
        Ok(())
    }

    /// Apply one `key=value` pair (the first `=` splits, so `label=arm=b` works).
    ///
    /// # Errors
    ///
    /// As [`Selection::set`], or if there is no `=`.
    pub fn set_pair(&mut self, pair: &str) -> Result<(), SelectionError> {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            SelectionError::new(format!("{pair:?}: expected key=value, e.g. label=arm=b"))
        })?;
        self.set(k.trim(), v)
    }

    /// Parse a URL query string (`service=A&percentile=p99-p100`), with
    /// percent-decoding, as `cpt serve`'s `GET /profile` receives it.
    ///
    /// # Errors
    ///
    /// As [`Selection::set`], or on bad percent-encoding.
    pub fn from_query(query: &str) -> Result<Self, SelectionError> {
        let mut sel = Selection::new();
        let pairs = super::query::decode(query).map_err(|e| SelectionError::new(e.to_string()))?;
        for (k, v) in pairs {
            sel.set(&k, &v)?;
        }
        Ok(sel)
    }

    /// The selection as `key=value` pairs, every key explicit (the trigger
    /// too), times as Unix nanoseconds: what [`Selection::from_query`] and
    /// [`Selection::set`] read back to the same selection.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        if let Some(s) = &self.service {
            v.push(("service", s.clone()));
        }
        if let Some(e) = &self.endpoint {
            v.push(("endpoint", e.clone()));
        }
        if let Some(t) = self.since {
            v.push(("since", t.to_string()));
        }
        if let Some(t) = self.until {
            v.push(("until", t.to_string()));
        }
        for (k, val) in &self.labels {
            v.push(("label", format!("{k}={val}")));
        }
        if let Some(b) = self.percentile {
            v.push(("percentile", b.to_string()));
        }
        if let Some(id) = &self.request_id {
            v.push(("request_id", id.clone()));
        }
        if let Some(id) = &self.trace_id {
            v.push(("trace_id", id.clone()));
        }
        v.push(("trigger", self.triggers().as_str().to_owned()));
        v
    }

    /// The selection as a URL query string ([`Selection::pairs`] through
    /// the one encoder, [`super::query::encode`]): `GET /profile?…` of a
    /// collector reads it back to this selection, whatever the names hold.
    pub fn to_query(&self) -> String {
        super::query::encode(self.pairs())
    }
}

impl fmt::Display for Selection {
    /// The selection as space-separated `key=value` pairs (for profile
    /// comments and messages; [`Selection::to_query`] for a URL).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .pairs()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        f.write_str(&parts.join(" "))
    }
}

fn non_empty<'a>(what: &str, v: &'a str) -> Result<&'a str, SelectionError> {
    if v.is_empty() {
        Err(SelectionError::new(format!("{what}: empty value")))
    } else {
        Ok(v)
    }
}

/// Parse a point in time as Unix nanoseconds.
///
/// Accepted: a plain integer (Unix nanoseconds), an integer with a unit
/// suffix `s`, `ms`, `us` or `ns` (Unix time in that unit), or an RFC 3339
/// timestamp (`2026-11-21T22:00:00Z`, fractional seconds allowed).
///
/// # Errors
///
/// If the text is none of these or the time is before 1970 / beyond 2554.
pub fn parse_time(s: &str) -> Result<u64, SelectionError> {
    let t = s.trim();
    let bad = || {
        SelectionError::new(format!(
            "time {s:?}: expected Unix nanoseconds, a number with unit s/ms/us/ns, \
             or RFC 3339 like 2026-11-21T22:00:00Z"
        ))
    };
    let digits = t.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        let n: u64 = digits.parse().map_err(|_| bad())?;
        let mult: u64 = match &t[digits.len()..] {
            "" | "ns" => 1,
            "us" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            _ => return Err(bad()),
        };
        return n.checked_mul(mult).ok_or_else(bad);
    }
    let at = humantime::parse_rfc3339_weak(t).map_err(|_| bad())?;
    let since = at.duration_since(UNIX_EPOCH).map_err(|_| bad())?;
    u64::try_from(since.as_nanos()).map_err(|_| bad())
}

/// Format Unix nanoseconds as RFC 3339 (for reports).
pub fn format_time(unix_nanos: u64) -> String {
    humantime::format_rfc3339_nanos(UNIX_EPOCH + Duration::from_nanos(unix_nanos)).to_string()
}

/// A selection filter that does not parse; the message names the filter and
/// what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad selection: {msg}")]
pub struct SelectionError {
    msg: String,
}

impl SelectionError {
    fn new(msg: String) -> Self {
        SelectionError { msg }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};

    fn rec(service: &str, trigger: Trigger, start: Option<u64>, labels: &[(&str, &str)]) -> Record {
        let mut p = CriticalPath::new();
        p.push_frames(
            [Frame::new(service, "x")],
            Duration::from_millis(1),
            SegmentKind::Busy,
        );
        let mut r = Record::new(service, trigger, p);
        r.start_unix_nanos = start;
        r.endpoint = Some("/e".into());
        for (k, v) in labels {
            r.labels.insert((*k).into(), (*v).into());
        }
        r
    }

    #[test]
    fn selection_filters_service_endpoint_time_labels() {
        let r = rec(
            "A",
            Trigger::Sampled,
            Some(100),
            &[("arm", "b"), ("dc", "x")],
        );
        #[rustfmt::skip]
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("service=A", true),
            ("service=B", false),
            ("endpoint=/e", true),
            ("endpoint=/f", false),
            ("since=100&until=101", true),
            ("since=101", false),
            ("until=100", false),
            ("label=arm%3Db", true),
            ("label=arm=b&label=dc=x", true),
            ("label=arm=a", false),
            ("label=zone=b", false),
            ("trigger=forced", false),
            ("trigger=all", true),
        ];
        for (q, want) in cases {
            let sel = Selection::from_query(q).unwrap();
            assert_eq!(sel.matches(&r), *want, "{q}");
        }
        // A time range excludes records without a start time.
        let no_start = rec("A", Trigger::Sampled, None, &[]);
        assert!(!Selection::from_query("since=0").unwrap().matches(&no_start));
    }

    #[test]
    fn selection_by_request_and_trace_id_keeps_forced_records() {
        let mut r = rec("A", Trigger::Forced, None, &[]);
        r.request_id = Some("req-1".into());
        r.trace_id = Some("4bf92f3577b34da6a3ce929d0e0e4736".into());
        #[rustfmt::skip]
        let cases: &[(&str, bool)] = &[
            ("request_id=req-1", true),
            ("request_id=req-2", false),
            ("trace_id=4bf92f3577b34da6a3ce929d0e0e4736", true),
            ("trace_id=4BF92F3577B34DA6A3CE929D0E0E4736", true),
            ("trace_id=00000000000000000000000000000001", false),
            ("request_id=req-1&trigger=sampled", false),
            ("request_id=req-1&service=B", false),
            ("", false),
        ];
        for (q, want) in cases {
            let sel = Selection::from_query(q).unwrap();
            assert_eq!(sel.matches(&r), *want, "{q}");
        }
        let no_ids = rec("A", Trigger::Forced, None, &[]);
        assert!(!Selection::new().with_request_id("req-1").matches(&no_ids));
        assert_eq!(
            Selection::new().with_request_id("req-1").to_string(),
            "request_id=req-1 trigger=all"
        );
    }

    #[test]
    fn selection_forced_excluded_unless_asked() {
        let forced = rec("A", Trigger::Forced, None, &[]);
        assert!(!Selection::new().matches(&forced));
        assert!(
            Selection::new()
                .with_triggers(TriggerFilter::Forced)
                .matches(&forced)
        );
        assert!(
            Selection::new()
                .with_triggers(TriggerFilter::All)
                .matches(&forced)
        );
    }

    #[test]
    fn selection_percentile_ranks() {
        #[rustfmt::skip]
        let cases: &[(&str, usize, Range<usize>)] = &[
            ("p95-p100", 100, 95..100),
            ("p0-p50",   3,   0..2),
            ("p50-p100", 3,   2..3),
            ("p99-p100", 10,  9..10),   // at least one record
            ("p0-p100",  7,   0..7),
            ("p99.9-p100", 10000, 9990..10000),
            ("p50-p100", 0,   0..0),
        ];
        for (band, n, want) in cases {
            assert_eq!(
                PercentileBand::parse(band).unwrap().ranks(*n),
                *want,
                "{band} of {n}"
            );
        }
    }

    #[test]
    fn selection_bad_input_says_what_is_wrong() {
        #[rustfmt::skip]
        let cases: &[(&str, &str)] = &[
            ("percentile=p100-p95", "lower bound must be below"),
            ("percentile=p95-p101", "within 0..=100"),
            ("percentile=fast", "is not a number"),
            ("percentile=p99", "give both bounds, e.g. \"p99-p100\" for the slowest 1% or \"p0-p99\""),
            ("percentile=95", "\"p95-p100\" for the slowest 5%"),
            ("since=yesterday", "time \"yesterday\""),
            ("since=12parsecs", "time \"12parsecs\""),
            ("label=arm", "expected key=value"),
            ("trigger=maybe", "trigger \"maybe\""),
            ("colour=red", "unknown selection key \"colour\""),
            ("service=", "service: empty value"),
            ("endpoint=%zz", "bad percent-encoding"),
        ];
        for (q, want) in cases {
            let err = Selection::from_query(q).unwrap_err().to_string();
            assert!(err.contains(want), "{q}: got {err:?}, want {want:?}");
        }
    }

    #[test]
    fn parse_time_forms() {
        #[rustfmt::skip]
        let cases: &[(&str, u64)] = &[
            ("1700000000000000000", 1_700_000_000_000_000_000),
            ("1700000000s", 1_700_000_000_000_000_000),
            ("1700000000000ms", 1_700_000_000_000_000_000),
            ("5us", 5_000),
            ("2023-11-14T22:13:20Z", 1_700_000_000_000_000_000),
            ("2023-11-14T22:13:20.5Z", 1_700_000_000_500_000_000),
        ];
        for (s, want) in cases {
            assert_eq!(parse_time(s).unwrap(), *want, "{s}");
        }
        assert_eq!(
            format_time(1_700_000_000_500_000_000),
            "2023-11-14T22:13:20.500000000Z"
        );
    }

    #[test]
    fn selection_display_round_trips_through_set_pair() {
        let sel = Selection::new()
            .with_service("A")
            .with_label("arm", "b")
            .with_percentile(PercentileBand::parse("p95-p100").unwrap())
            .with_triggers(TriggerFilter::All);
        let mut back = Selection::new();
        for pair in sel.to_string().split(' ') {
            back.set_pair(pair).unwrap();
        }
        assert_eq!(back, sel);
    }
}
