//! Answering a profile from roll-ups where they answer exactly, from raw
//! records for the rest.
//!
//! A selection the roll-ups can answer is one of sampled requests, of any
//! service or endpoint, with no label, percentile band or id filter (and no
//! per-stack histograms asked for). For it, a roll-up row is *used* when
//! every request it holds started inside the selection's range (its first
//! and last start are inside): then all of them are selected. A row some
//! of whose requests are in the range and some not makes its period *raw*:
//! the selection's records of that period come from the raw store (with
//! every other row of an overlapping period). Records not rolled up yet
//! (ids above [`State::rolled_up_through`]) always come from the raw store.
//! Each request is so counted exactly once, and since roll-ups are the
//! sums a fold keeps, the profile is byte-identical to the fold of the raw
//! records, as long as the raw records it needs are still there; when they
//! are not, the answer is [`StoreError::BeyondRetention`].

use std::fmt;

use rusqlite::Connection;
use rusqlite::types::Value;

use super::{NANOS, Rollup, State, UNPLACED};
use crate::profile::aggregate::{Aggregate, Aggregator};
use crate::records::EntryServices;
use crate::records::selection::{Selection, TriggerFilter, format_time};
use crate::server::store::snapshot::Snapshot;
use crate::server::store::{Store, StoreError, StoreQuery};

/// Where a profile's numbers came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileSource {
    /// Raw records only.
    Raw,
    /// Roll-ups only.
    Rollups,
    /// Roll-ups, and raw records for what they do not hold.
    RollupsAndRaw,
}

impl ProfileSource {
    /// `raw`, `rollups` or `rollups+raw` (the `x-cpt-profile-source`
    /// header).
    pub fn as_str(self) -> &'static str {
        match self {
            ProfileSource::Raw => "raw",
            ProfileSource::Rollups => "rollups",
            ProfileSource::RollupsAndRaw => "rollups+raw",
        }
    }
}

impl fmt::Display for ProfileSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProfileSource::Raw => "raw records",
            ProfileSource::Rollups => "roll-ups",
            ProfileSource::RollupsAndRaw => "roll-ups and raw records",
        })
    }
}

/// Why a selection cannot be answered: it needs raw records retention
/// deleted. Its message says how long raw records are kept and what would
/// answer instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetentionGap {
    /// The earliest start the selection needs raw records from (`None`:
    /// from the first).
    pub needs_from: Option<u64>,
    /// Raw records that started up to here may be deleted.
    pub deleted_through: u64,
    /// The raw window the collector keeps, seconds (`None`: not known).
    pub retain_for_secs: Option<u64>,
    /// What of the selection only raw records answer, as the user gave it
    /// (e.g. `the label filter arm=a`); empty when roll-ups answer the
    /// selection for a range on whole hours.
    pub raw_only: Vec<String>,
}

impl fmt::Display for RetentionGap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = match self.retain_for_secs {
            Some(s) => format!(
                "the collector keeps raw records for {} (`cpt serve --retain-for`)",
                crate::server::format_duration(std::time::Duration::from_secs(s))
            ),
            None => "raw records are kept up to `cpt serve --max-store-bytes`".to_owned(),
        };
        let from = match self.needs_from {
            Some(t) => format!("from {}", format_time(t)),
            None => "from the first record (it has no `since`)".to_owned(),
        };
        write!(
            f,
            "this selection needs raw records {from}, but raw records that started up to {} \
             were deleted by retention ({kept}). ",
            format_time(self.deleted_through)
        )?;
        if self.raw_only.is_empty() {
            f.write_str(
                "Roll-ups answer for older requests when the range starts and ends on whole \
                 hours (whole days where only daily roll-ups are left): e.g. since and until at \
                 :00:00, or a range starting after that time.",
            )
        } else {
            write!(
                f,
                "Roll-ups keep older requests only for selections of sampled requests by \
                 service, endpoint and time range, and {} {}: drop {} for older ranges, or give \
                 a `since` after that time.",
                join_and(&self.raw_only),
                if self.raw_only.len() == 1 {
                    "needs the raw records"
                } else {
                    "need the raw records"
                },
                if self.raw_only.len() == 1 {
                    "it"
                } else {
                    "them"
                },
            )
        }
    }
}

/// `a`, `a and b`, `a, b and c`.
fn join_and(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// What of `sel` (and of the fold: per-stack `histograms`) only raw records
/// answer, as the user gave it; empty when the roll-ups can answer it (for
/// some range).
fn raw_only(sel: &Selection, histograms: bool) -> Vec<String> {
    let mut v = Vec::new();
    for (k, val) in sel.labels() {
        v.push(format!("the label filter {k}={val}"));
    }
    if let Some(b) = sel.percentile() {
        v.push(format!("the percentile band {b}"));
    }
    // An id selects its request whatever its trigger: the id is named.
    if sel.triggers() != TriggerFilter::Sampled
        && sel.request_id().is_none()
        && sel.trace_id().is_none()
    {
        v.push(format!("the trigger filter {}", sel.triggers().as_str()));
    }
    if let Some(id) = sel.request_id() {
        v.push(format!("the request id {id}"));
    }
    if let Some(id) = sel.trace_id() {
        v.push(format!("the trace id {id}"));
    }
    if histograms {
        v.push("per-stack histograms".to_owned());
    }
    v
}

/// A roll-up row's period and the starts of its requests.
#[derive(Clone, Debug)]
struct Row {
    id: i64,
    service: String,
    resolution: u64,
    bucket: u64,
    first: Option<u64>,
    last: Option<u64>,
}

impl Row {
    /// `[start, end)` in ns.
    fn period(&self) -> (u64, u64) {
        let a = self.bucket.saturating_mul(NANOS);
        (a, a.saturating_add(self.resolution.saturating_mul(NANOS)))
    }
}

fn overlaps((a, b): (u64, u64), (c, d): (u64, u64)) -> bool {
    a < d && c < b
}

impl Store {
    /// [`fold_profile`](Self::fold_profile), then the finished aggregate.
    ///
    /// # Errors
    ///
    /// As [`fold_profile`](Self::fold_profile).
    pub fn profile(
        &self,
        mut agg: Aggregator,
        batch: usize,
    ) -> Result<(Aggregate, ProfileSource), StoreError> {
        let (_, source) = self.fold_profile(&mut agg, batch, None, &mut |_| {})?;
        Ok((agg.finish(), source))
    }

    /// Fold the records `agg`'s selection keeps into it, from the roll-ups
    /// where they answer exactly (merged when `agg` finishes) and from the
    /// raw records for the rest (the roll-ups module's docs, "When a record
    /// is rolled up", and [`ProfileSource`]), all read in one snapshot of
    /// the store: the answer is the fold of the records committed when it
    /// began, whatever the writer commits meanwhile. Selected records are
    /// shown to `mix` when given (those the roll-ups answer for by their
    /// service and the services on their paths), each batch's size to
    /// `progress`. Returns the raw records read and where the answer comes
    /// from.
    ///
    /// # Errors
    ///
    /// As [`Store::fold_into`], or [`StoreError::BeyondRetention`] when the
    /// raw records the selection needs were deleted.
    pub fn fold_profile(
        &self,
        agg: &mut Aggregator,
        batch: usize,
        mut mix: Option<&mut EntryServices>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(u64, ProfileSource), StoreError> {
        if self.version < super::ROLLUP_VERSION {
            let n = self.fold_into_reporting(agg, batch, mix, progress)?;
            return Ok((n, ProfileSource::Raw));
        }
        let mut snap = Snapshot::begin(&self.path)?;
        let state = State::read(snap.conn()).map_err(snap.sqlite("read the store's state"))?;
        let sel = agg.selection().clone();
        let raw_only = raw_only(&sel, agg.histograms());
        let (since, until) = sel.time_range();
        let gap = |needs_from: Option<u64>| {
            StoreError::BeyondRetention(RetentionGap {
                needs_from,
                deleted_through: state.raw_deleted_through.unwrap_or(0),
                retain_for_secs: state.retain_for_secs,
                raw_only: raw_only.clone(),
            })
        };
        let raw_incomplete = |from: Option<u64>| match (state.raw_deleted_through, from) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(d), Some(f)) => f <= d,
        };
        let query = StoreQuery::from_selection(&sel);
        if !raw_only.is_empty() {
            // Only raw records answer: all of the range's must be there
            // (from the first, without a `since`).
            if raw_incomplete(since) {
                return Err(gap(since));
            }
            let n = self.fold_packed_after(
                Some(&mut snap),
                agg,
                &query,
                (0, None),
                batch,
                mix,
                progress,
            )?;
            return Ok((n, ProfileSource::Raw));
        }
        let range = (since.unwrap_or(0), until.unwrap_or(u64::MAX));
        let rows = rollup_rows(snap.conn(), &sel).map_err(snap.sqlite("read roll-ups"))?;
        // Periods read raw: start with those of rows only partly selected,
        // then take in every row that overlaps one, until none is left.
        let mut raw: Vec<(u64, u64)> = Vec::new();
        let mut used: Vec<Row> = Vec::new();
        for r in rows {
            if r.resolution == UNPLACED {
                // Records without a start: selected only without a range.
                if since.is_none() && until.is_none() {
                    used.push(r);
                }
                continue;
            }
            let (Some(first), Some(last)) = (r.first, r.last) else {
                continue;
            };
            if last < range.0 || first >= range.1 {
                continue; // none of its requests is selected
            }
            if first >= range.0 && last < range.1 {
                used.push(r);
            } else {
                raw.push(r.period());
            }
        }
        loop {
            let (hit, keep): (Vec<Row>, Vec<Row>) = used.into_iter().partition(|r| {
                r.resolution != UNPLACED && raw.iter().any(|&q| overlaps(r.period(), q))
            });
            used = keep;
            if hit.is_empty() {
                break;
            }
            raw.extend(hit.iter().map(Row::period));
        }
        for &(a, b) in &raw {
            let from = a.max(range.0);
            if from < b.min(range.1) && raw_incomplete(Some(from)) {
                return Err(gap(Some(from)));
            }
        }
        // Raw: every selected record not rolled up yet, and the raw periods'
        // records that are.
        let w = state.rolled_up_through;
        let mut folded = self.fold_packed_after(
            Some(&mut snap),
            agg,
            &query,
            (w, None),
            batch,
            mix.as_deref_mut(),
            progress,
        )?;
        raw.sort_unstable();
        raw.dedup();
        for (a, b) in merge_intervals(raw) {
            let mut q = query.clone();
            q.since_unix_nanos = Some(a.max(range.0));
            q.until_unix_nanos = Some(b.min(range.1));
            if q.since_unix_nanos < q.until_unix_nanos {
                folded += self.fold_packed_after(
                    Some(&mut snap),
                    agg,
                    &q,
                    (0, Some(w)),
                    batch,
                    mix.as_deref_mut(),
                    progress,
                )?;
            }
        }
        if used.is_empty() {
            return Ok((folded, ProfileSource::Raw));
        }
        let frames = frame_table(&snap)?;
        let frame = |id: u64| frames.get(&id).cloned();
        let mut sum = Rollup::default();
        for r in &used {
            let body = rollup_body(&snap, r.id)?;
            if let Some(m) = mix.as_deref_mut() {
                m.observe_service(&r.service, body.requests);
                for stack in body.stacks.keys() {
                    for f in stack.iter().filter_map(|&f| Rollup::frame_of(f, frame)) {
                        m.observe_callee(&r.service, &f.service);
                    }
                }
            }
            sum.merge(&body);
        }
        let rolled = sum.to_aggregate(frame).map_err(|id| StoreError::Corrupt {
            path: self.path.clone(),
            id: 0,
            reason: format!("a roll-up names frame {id}, which the frames table lacks"),
        })?;
        agg.merge_aggregate(rolled);
        Ok((
            folded,
            if folded == 0 {
                ProfileSource::Rollups
            } else {
                ProfileSource::RollupsAndRaw
            },
        ))
    }
}

/// The roll-up rows of `sel`'s service and endpoint whose period meets
/// its range (and the records without a start).
fn rollup_rows(conn: &Connection, sel: &Selection) -> rusqlite::Result<Vec<Row>> {
    let (since, until) = sel.time_range();
    let mut sql = String::from(
        "SELECT id, resolution, bucket, first_start_unix_nanos, last_start_unix_nanos, service \
         FROM rollups WHERE 1 = 1",
    );
    let mut params: Vec<Value> = Vec::new();
    if let Some(s) = sel.service() {
        params.push(Value::Text(s.to_owned()));
        sql.push_str(&format!(" AND service = ?{}", params.len()));
    }
    if let Some(e) = sel.endpoint() {
        params.push(Value::Text(e.to_owned()));
        sql.push_str(&format!(" AND endpoint = ?{}", params.len()));
    }
    if let Some(u) = until {
        params.push(Value::Integer(
            i64::try_from(u / NANOS + 1).unwrap_or(i64::MAX),
        ));
        sql.push_str(&format!(" AND bucket < ?{}", params.len()));
    }
    if let Some(s) = since {
        params.push(Value::Integer(i64::try_from(s / NANOS).unwrap_or(i64::MAX)));
        sql.push_str(&format!(
            " AND (resolution = 0 OR bucket + resolution > ?{})",
            params.len()
        ));
    }
    let mut stmt = conn.prepare(&sql)?;
    let u = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
    let rows = stmt.query_map(rusqlite::params_from_iter(params), |r| {
        Ok(Row {
            id: r.get(0)?,
            resolution: u(r.get(1)?).unwrap_or(0),
            bucket: u(r.get(2)?).unwrap_or(0),
            first: u(r.get(3)?),
            last: u(r.get(4)?),
            service: r.get(5)?,
        })
    })?;
    rows.collect()
}

/// The roll-up of row `id`, read in `snap`.
pub(in crate::server::store) fn rollup_body(
    snap: &Snapshot,
    id: i64,
) -> Result<Rollup, StoreError> {
    let body: Vec<u8> = snap
        .conn()
        .prepare_cached("SELECT body FROM rollups WHERE id = ?1")
        .and_then(|mut s| s.query_row([id], |r| r.get(0)))
        .map_err(snap.sqlite("read a roll-up"))?;
    Rollup::decode(&body).map_err(|e| StoreError::Corrupt {
        path: snap.path().to_path_buf(),
        id,
        reason: e.to_string(),
    })
}

/// The whole frames table by id, read in `snap`.
pub(in crate::server::store) fn frame_table(
    snap: &Snapshot,
) -> Result<rustc_hash::FxHashMap<u64, cpt_sdk::path::Frame>, StoreError> {
    Ok(crate::server::store::paths::frames_from(snap.conn(), 0)
        .map_err(snap.sqlite("read frames"))?
        .into_iter()
        .collect())
}

/// Sorted intervals with the overlapping ones joined.
fn merge_intervals(sorted: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (a, b) in sorted {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}
