//! An endpoint's trend from its roll-ups: per hour (per day where only
//! daily roll-ups are left) the request count, mean and p99 latency, and
//! the mean time of the frames that took the most of it.

use std::collections::BTreeMap;

use rusqlite::types::Value;
use rustc_hash::FxHashMap;

use super::answer::{frame_table, rollup_body};
use super::{NANOS, Rollup, UNPLACED};
use crate::profile::aggregate::frame_label;
use crate::server::store::snapshot::Snapshot;
use crate::server::store::{Store, StoreError};

/// Which trend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrendQuery {
    /// The entry service.
    pub service: String,
    /// One endpoint, or all of the service's.
    pub endpoint: Option<String>,
    /// Periods that end after this (ns since the Unix epoch).
    pub since_unix_nanos: Option<u64>,
    /// Periods that start before this.
    pub until_unix_nanos: Option<u64>,
    /// How many frames to follow (the rest is "other").
    pub top: usize,
}

/// One period of a trend.
#[derive(Clone, Debug, PartialEq)]
pub struct TrendPoint {
    /// The period's start, seconds since the Unix epoch.
    pub start_unix_secs: u64,
    /// Its length, seconds (3 600 or 86 400).
    pub resolution_secs: u64,
    /// Sampled requests in it.
    pub requests: u64,
    /// Their mean latency, ns.
    pub mean_nanos: u64,
    /// Their median latency, ns (within 2 %).
    pub p50_nanos: u64,
    /// Their 99th percentile latency, ns (within 2 %).
    pub p99_nanos: u64,
    /// Mean time per request of each of [`Trend::frames`], in that order,
    /// then of every other frame, ns; they add up to the mean.
    pub frame_nanos: Vec<u64>,
}

/// An endpoint's trend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trend {
    /// The frames followed, largest total first, as profiles name them
    /// (`"A1 (A)"`), each being time spent in that frame itself (the leaf of
    /// the path's stacks).
    pub frames: Vec<String>,
    /// The periods with requests, oldest first.
    pub points: Vec<TrendPoint>,
}

impl Store {
    /// The trend of `q`'s service (and endpoint) from its roll-ups:
    /// requests rolled up so far (the writer rolls records up within
    /// seconds of their commit).
    ///
    /// # Errors
    ///
    /// When SQLite fails or a roll-up does not decode.
    pub fn trend(&self, q: &TrendQuery) -> Result<Trend, StoreError> {
        if self.version < super::ROLLUP_VERSION {
            return Ok(Trend::default());
        }
        let mut sql = String::from(
            "SELECT id, resolution, bucket FROM rollups WHERE service = ?1 AND resolution > 0",
        );
        let mut params = vec![Value::Text(q.service.clone())];
        if let Some(e) = &q.endpoint {
            params.push(Value::Text(e.clone()));
            sql.push_str(&format!(" AND endpoint = ?{}", params.len()));
        }
        if let Some(u) = q.until_unix_nanos {
            params.push(Value::Integer(
                i64::try_from(u.div_ceil(NANOS)).unwrap_or(i64::MAX),
            ));
            sql.push_str(&format!(" AND bucket < ?{}", params.len()));
        }
        if let Some(s) = q.since_unix_nanos {
            params.push(Value::Integer(i64::try_from(s / NANOS).unwrap_or(i64::MAX)));
            sql.push_str(&format!(" AND bucket + resolution > ?{}", params.len()));
        }
        // Rows, bodies and frames from one snapshot: a merge of hours into
        // days between two reads would leave a row missing.
        let snap = Snapshot::begin(&self.path)?;
        let rows: Vec<(i64, u64, u64)> = snap
            .conn()
            .prepare(&sql)
            .and_then(|mut stmt| {
                stmt.query_map(rusqlite::params_from_iter(params), |r| {
                    let (res, bucket): (i64, i64) = (r.get(1)?, r.get(2)?);
                    Ok((
                        r.get(0)?,
                        u64::try_from(res).unwrap_or(0),
                        u64::try_from(bucket).unwrap_or(0),
                    ))
                })?
                .collect()
            })
            .map_err(snap.sqlite("read roll-ups"))?;
        let mut periods: BTreeMap<(u64, u64), Rollup> = BTreeMap::new();
        for (id, res, bucket) in rows {
            debug_assert_ne!(res, UNPLACED);
            periods
                .entry((bucket, res))
                .or_default()
                .merge(&rollup_body(&snap, id)?);
        }
        let leaves: Vec<FxHashMap<u64, u64>> = periods.values().map(Rollup::leaf_sums).collect();
        let mut totals: FxHashMap<u64, u64> = FxHashMap::default();
        for l in &leaves {
            for (&f, &ns) in l {
                let t = totals.entry(f).or_default();
                *t = t.saturating_add(ns);
            }
        }
        let frame_table = frame_table(&snap)?;
        let label = |r: u64| {
            Rollup::frame_of(r, |id| frame_table.get(&id).cloned())
                .map_or_else(|| format!("frame {r}"), |f| frame_label(&f))
        };
        let mut ranked: Vec<(u64, u64, String)> =
            totals.into_iter().map(|(f, t)| (f, t, label(f))).collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.2.cmp(&b.2)));
        ranked.truncate(q.top);
        let mut trend = Trend {
            frames: ranked.iter().map(|r| r.2.clone()).collect(),
            points: Vec::with_capacity(periods.len()),
        };
        for (((bucket, res), r), leaf) in periods.into_iter().zip(leaves) {
            if r.requests == 0 {
                continue;
            }
            let per_request = |ns: u64| ns / r.requests;
            let mean = per_request(r.latency_sum_nanos);
            let mut frame_nanos: Vec<u64> = ranked
                .iter()
                .map(|(f, _, _)| per_request(leaf.get(f).copied().unwrap_or(0)))
                .collect();
            let shown: u64 = frame_nanos.iter().sum();
            frame_nanos.push(mean.saturating_sub(shown));
            trend.points.push(TrendPoint {
                start_unix_secs: bucket,
                resolution_secs: res,
                requests: r.requests,
                mean_nanos: mean,
                p50_nanos: r.latency_fine.quantile(0.5),
                p99_nanos: r.latency_fine.quantile(0.99),
                frame_nanos,
            });
        }
        Ok(trend)
    }
}

impl Trend {
    /// The trend as CSV: one row per period, the followed frames' mean
    /// nanoseconds as columns, then `other`.
    pub fn to_csv(&self) -> String {
        use crate::format::csv_field;
        let mut out = String::from("start,resolution_s,requests,mean_ns,p50_ns,p99_ns");
        for f in &self.frames {
            out.push(',');
            out.push_str(&csv_field(f));
        }
        out.push_str(",other\n");
        for p in &self.points {
            out.push_str(&format!(
                "{},{},{},{},{},{}",
                crate::records::selection::format_time(p.start_unix_secs * NANOS),
                p.resolution_secs,
                p.requests,
                p.mean_nanos,
                p.p50_nanos,
                p.p99_nanos
            ));
            for v in &p.frame_nanos {
                out.push_str(&format!(",{v}"));
            }
            out.push('\n');
        }
        out
    }

    /// The trend as an aligned table for a terminal, with a key of the
    /// frame columns below it.
    pub fn to_text(&self) -> String {
        use crate::format::fmt_ns;
        let mut head = vec![
            "period".to_owned(),
            "requests".to_owned(),
            "mean".to_owned(),
            "p50".to_owned(),
            "p99".to_owned(),
        ];
        head.extend((1..=self.frames.len()).map(|i| format!("#{i}")));
        head.push("other".to_owned());
        let mut rows = vec![head];
        for p in &self.points {
            let t = crate::records::selection::format_time(p.start_unix_secs * NANOS);
            // 2026-11-28T03:00:00Z: the hour is enough.
            let t = t.get(..16).unwrap_or(&t).replace('T', " ");
            let mut row = vec![
                format!(
                    "{t} {}",
                    if p.resolution_secs == super::DAY {
                        "1d"
                    } else {
                        "1h"
                    }
                ),
                p.requests.to_string(),
                fmt_ns(p.mean_nanos),
                fmt_ns(p.p50_nanos),
                fmt_ns(p.p99_nanos),
            ];
            row.extend(p.frame_nanos.iter().map(|&v| fmt_ns(v)));
            rows.push(row);
        }
        let widths: Vec<usize> = (0..rows[0].len())
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for r in &rows {
            let cells: Vec<String> = r
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| {
                    if i == 0 {
                        format!("{c:<w$}")
                    } else {
                        format!("{c:>w$}")
                    }
                })
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        if self.points.is_empty() {
            out.push_str("(no roll-ups for this selection yet)\n");
        }
        for (i, f) in self.frames.iter().enumerate() {
            out.push_str(&format!("#{}: {f}\n", i + 1));
        }
        out
    }
}

/// Frames a trend follows unless `top=` says otherwise.
pub const DEFAULT_TOP: usize = 8;

impl TrendQuery {
    /// From a query's `key=value` pairs (decoded): `service` (required),
    /// `endpoint`, `since` / `until` (as in a selection) or `last=DURATION`,
    /// `top=N`. Other keys are the caller's.
    ///
    /// # Errors
    ///
    /// No service, or a value that does not parse; the message says which.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
        now_unix_nanos: u64,
    ) -> Result<TrendQuery, String> {
        use crate::records::selection::parse_time;
        let mut q = TrendQuery {
            top: DEFAULT_TOP,
            ..TrendQuery::default()
        };
        for (k, v) in pairs {
            if v.is_empty() {
                continue;
            }
            match k {
                "service" => q.service = v.to_owned(),
                "endpoint" => q.endpoint = Some(v.to_owned()),
                "since" => q.since_unix_nanos = Some(parse_time(v).map_err(|e| e.to_string())?),
                "until" => q.until_unix_nanos = Some(parse_time(v).map_err(|e| e.to_string())?),
                "last" => {
                    let d = humantime::parse_duration(v)
                        .map_err(|e| format!("last={v:?}: {e} (expected e.g. 7d, 36h)"))?;
                    q.since_unix_nanos = Some(
                        now_unix_nanos
                            .saturating_sub(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
                    );
                }
                "top" => {
                    q.top = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=20).contains(n))
                        .ok_or_else(|| {
                            format!("top={v:?}: expected a number of frames, 1 to 20")
                        })?;
                }
                _ => {}
            }
        }
        if q.service.is_empty() {
            return Err("a trend is of one service: give service=NAME (and endpoint=NAME)".into());
        }
        Ok(q)
    }
}
