//! Writing roll-ups: the pass that rolls up committed records, the roll-up
//! of records too old to keep raw, merging hourly roll-ups into daily ones,
//! and dropping roll-ups past their retention.

use std::time::Duration;

use cpt_sdk::path::Frame;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use rustc_hash::FxHashMap;

use super::{DAY, HOUR, NANOS, Rollup, State, UNPLACED, bucket_of};
use crate::profile::aggregate::Aggregator;
use crate::profile::aggregate::packed::{PackedFrames, PackedRow};
use crate::records::packed::unpack;
use crate::records::selection::{Selection, TriggerFilter};
use crate::server::store::paths::{FrameIds, frames_from};
use crate::server::store::{Store, StoreError};

/// Which roll-up row: a period of one (service, endpoint).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(in crate::server::store) struct Key {
    pub(in crate::server::store) service: String,
    pub(in crate::server::store) endpoint: Option<String>,
    pub(in crate::server::store) resolution: u64,
    pub(in crate::server::store) bucket: u64,
}

/// The period a record that started at `start` is rolled up in: its day
/// once the whole day is older than `hourly_before` (Unix seconds), else
/// its hour; [`UNPLACED`] without a start.
pub(in crate::server::store) fn period_of(start: Option<u64>, hourly_before: u64) -> (u64, u64) {
    match start {
        None => (UNPLACED, 0),
        Some(s) => {
            let day = bucket_of(s, DAY);
            if day + DAY <= hourly_before {
                (DAY, day)
            } else {
                (HOUR, bucket_of(s, HOUR))
            }
        }
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn bad_body(id: i64, e: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(format!("roll-up {id}: {e}").into())
}

/// The roll-up row of `key`, if there is one.
pub(in crate::server::store) fn load(
    conn: &Connection,
    key: &Key,
) -> rusqlite::Result<Option<(i64, Rollup)>> {
    let row: Option<(i64, Vec<u8>)> = conn
        .prepare_cached(
            "SELECT id, body FROM rollups WHERE service = ?1 AND endpoint IS ?2 \
             AND resolution = ?3 AND bucket = ?4",
        )?
        .query_row(
            rusqlite::params![
                key.service,
                key.endpoint,
                to_i64(key.resolution),
                to_i64(key.bucket)
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    match row {
        None => Ok(None),
        Some((id, body)) => Rollup::decode(&body)
            .map(|r| Some((id, r)))
            .map_err(|e| bad_body(id, e)),
    }
}

/// Write `r` as the row of `key` (`id`: the row it replaces).
pub(in crate::server::store) fn save(
    conn: &Connection,
    key: &Key,
    id: Option<i64>,
    r: &Rollup,
) -> rusqlite::Result<()> {
    let (first, last) = match r.start_range {
        Some((a, b)) => (Some(to_i64(a)), Some(to_i64(b))),
        None => (None, None),
    };
    let body = r.encode();
    match id {
        Some(id) => conn
            .prepare_cached(
                "UPDATE rollups SET requests = ?2, first_start_unix_nanos = ?3, \
                 last_start_unix_nanos = ?4, body = ?5 WHERE id = ?1",
            )?
            .execute(rusqlite::params![id, to_i64(r.requests), first, last, body])?,
        None => conn
            .prepare_cached(
                "INSERT INTO rollups (resolution, bucket, service, endpoint, requests, \
                 first_start_unix_nanos, last_start_unix_nanos, body) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(rusqlite::params![
                to_i64(key.resolution),
                to_i64(key.bucket),
                key.service,
                key.endpoint,
                to_i64(r.requests),
                first,
                last,
                body
            ])?,
    };
    Ok(())
}

/// Fold `rows` (one key's sampled records, frames in `pf`) and add them to
/// the key's roll-up row, in the caller's transaction.
pub(in crate::server::store) fn add_rows(
    conn: &Connection,
    key: &Key,
    rows: &[PackedRow],
    pf: &PackedFrames,
    frames: &mut FrameIds,
    added: &mut Vec<Frame>,
) -> rusqlite::Result<()> {
    let mut agg = Aggregator::new(Selection::new().with_triggers(TriggerFilter::All));
    agg.push_packed(rows, pf, None)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    let agg = agg.finish();
    let (id, mut r) = match load(conn, key)? {
        Some((id, r)) => (Some(id), r),
        None => (None, Rollup::default()),
    };
    r.absorb(&agg, |f| frames.id(conn, f, added))?;
    let mut ids = Vec::new();
    for row in rows {
        let mut latency = 0u64;
        // Decoded once already by the fold above.
        let _ = unpack(&row.path, &mut ids, |_, ns, _| {
            latency = latency.saturating_add(ns);
        });
        r.latency_fine.record(latency);
    }
    save(conn, key, id, &r)
}

/// What one [`Store::roll_up`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RollUpStep {
    /// Records read (sampled or not).
    pub records: u64,
    /// Every committed record is rolled up.
    pub caught_up: bool,
}

/// What one [`Store::compact_rollups`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactStep {
    /// Hourly roll-ups merged into daily ones.
    pub merged: u64,
    /// Roll-ups dropped past their retention.
    pub dropped: u64,
    /// There is more to do.
    pub more: bool,
}

fn unix_secs(now: std::time::SystemTime) -> u64 {
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Store {
    /// How many hourly and daily roll-ups the store keeps.
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn rollup_counts(&self) -> Result<(u64, u64), StoreError> {
        let count = |res: u64| -> Result<u64, StoreError> {
            let n: i64 = self
                .conn
                .query_row(
                    "SELECT count(*) FROM rollups WHERE resolution = ?1",
                    [to_i64(res)],
                    |r| r.get(0),
                )
                .map_err(self.sqlite("count roll-ups"))?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        if self.version < super::ROLLUP_VERSION {
            return Ok((0, 0));
        }
        Ok((count(HOUR)?, count(DAY)?))
    }

    /// The frames table by id, brought up to date (the writer's
    /// connection: every frame it committed).
    fn frames_by_id(&mut self) -> rusqlite::Result<&PackedFrames> {
        let pf = self.frames_by_id.get_or_insert_with(PackedFrames::new);
        for (id, f) in frames_from(&self.conn, pf.len())? {
            pf.insert(id, f);
        }
        Ok(pf)
    }

    /// Roll up the next `max_rows` committed records that are not rolled up
    /// yet, oldest id first, in one transaction that also advances
    /// [`State::rolled_up_through`]. Records are rolled up in their hour, or
    /// their day once the whole day is older than `hourly_for`.
    ///
    /// # Errors
    ///
    /// When SQLite fails or a packed path does not decode; nothing of the
    /// step is then committed.
    pub fn roll_up(
        &mut self,
        max_rows: usize,
        now: std::time::SystemTime,
        hourly_for: Duration,
    ) -> Result<RollUpStep, StoreError> {
        self.keep_wal_short();
        let sqlite = self.sqlite_owned("roll up records");
        let hourly_before = unix_secs(now).saturating_sub(hourly_for.as_secs());
        self.frames_by_id().map_err(&sqlite)?;
        let Store {
            conn,
            frames,
            frames_by_id,
            ..
        } = self;
        let (frames, pf) = (
            frames.get_or_insert_with(FrameIds::default),
            frames_by_id.as_ref().expect("loaded above"),
        );
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&sqlite)?;
        let mut added = Vec::new();
        let step = (|| {
            let mut state = State::read(&tx)?;
            let mut groups: FxHashMap<Key, Vec<PackedRow>> = FxHashMap::default();
            let mut n = 0u64;
            let mut last = state.rolled_up_through;
            {
                let mut stmt = tx.prepare_cached(
                    "SELECT id, service, endpoint, start_unix_nanos, trigger, path FROM paths \
                     WHERE id > ?1 ORDER BY id LIMIT ?2",
                )?;
                let mut rows = stmt.query(rusqlite::params![last, to_i64(max_rows as u64)])?;
                while let Some(r) = rows.next()? {
                    n += 1;
                    last = r.get(0)?;
                    let trigger: String = r.get(4)?;
                    if trigger != "sampled" {
                        continue;
                    }
                    let start: Option<i64> = r.get(3)?;
                    let start = start.and_then(|s| u64::try_from(s).ok());
                    let (resolution, bucket) = period_of(start, hourly_before);
                    let service: String = r.get(1)?;
                    groups
                        .entry(Key {
                            service: service.clone(),
                            endpoint: r.get(2)?,
                            resolution,
                            bucket,
                        })
                        .or_default()
                        .push(PackedRow {
                            id: last,
                            service,
                            start_unix_nanos: start,
                            path: r.get(5)?,
                        });
                }
            }
            for (key, rows) in &groups {
                add_rows(&tx, key, rows, pf, frames, &mut added)?;
            }
            // Read to the end: every id given out is rolled up, those of
            // records too old to keep raw (rolled up when they came) and
            // of batches rolled back included.
            let caught_up = n < max_rows as u64;
            state.last_id = state.last_id.max(last);
            state.rolled_up_through = if caught_up { state.last_id } else { last };
            state.write(&tx)?;
            Ok::<_, rusqlite::Error>(RollUpStep {
                records: n,
                caught_up,
            })
        })();
        match step.and_then(|s| tx.commit().map(|()| s)) {
            Ok(s) => Ok(s),
            Err(e) => {
                frames.forget(&added);
                Err(sqlite(e))
            }
        }
    }

    /// Merge up to `max_rows` hourly roll-ups of days wholly older than
    /// `hourly_for` into daily ones, and drop up to `max_rows` roll-ups whose
    /// period ended more than `retain_for` ago (`None`: keep them) and
    /// before the oldest raw record started (a period's roll-up outlives its
    /// raw records), in one transaction.
    ///
    /// # Errors
    ///
    /// When SQLite fails or a roll-up does not decode; nothing of the step
    /// is then committed.
    pub fn compact_rollups(
        &mut self,
        now: std::time::SystemTime,
        hourly_for: Duration,
        retain_for: Option<Duration>,
        max_rows: usize,
    ) -> Result<CompactStep, StoreError> {
        self.keep_wal_short();
        let sqlite = self.sqlite_owned("merge and drop roll-ups");
        let now = unix_secs(now);
        let day_cutoff = bucket_of(
            now.saturating_sub(hourly_for.as_secs())
                .saturating_mul(NANOS),
            DAY,
        );
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&sqlite)?;
        let step = (|| {
            let mut step = CompactStep::default();
            let hourly: Vec<(i64, Key, Vec<u8>)> = tx
                .prepare_cached(
                    "SELECT id, service, endpoint, bucket, body FROM rollups \
                     WHERE resolution = ?1 AND bucket < ?2 LIMIT ?3",
                )?
                .query_map(
                    rusqlite::params![to_i64(HOUR), to_i64(day_cutoff), to_i64(max_rows as u64)],
                    |r| {
                        let bucket: i64 = r.get(3)?;
                        Ok((
                            r.get(0)?,
                            Key {
                                service: r.get(1)?,
                                endpoint: r.get(2)?,
                                resolution: DAY,
                                bucket: bucket_of(
                                    u64::try_from(bucket).unwrap_or(0).saturating_mul(NANOS),
                                    DAY,
                                ),
                            },
                            r.get(4)?,
                        ))
                    },
                )?
                .collect::<Result<_, _>>()?;
            step.more |= hourly.len() >= max_rows;
            let mut days: FxHashMap<Key, Rollup> = FxHashMap::default();
            for (id, key, body) in &hourly {
                let r = Rollup::decode(body).map_err(|e| bad_body(*id, e))?;
                days.entry(key.clone()).or_default().merge(&r);
            }
            for (key, r) in days {
                let (id, mut day) = match load(&tx, &key)? {
                    Some((id, d)) => (Some(id), d),
                    None => (None, Rollup::default()),
                };
                day.merge(&r);
                save(&tx, &key, id, &day)?;
            }
            let mut delete = tx.prepare_cached("DELETE FROM rollups WHERE id = ?1")?;
            for (id, _, _) in &hourly {
                delete.execute([id])?;
            }
            step.merged = hourly.len() as u64;
            if let Some(keep) = retain_for {
                // A period's roll-up is kept while any raw record of it is:
                // the answer counts rolled-up records from their roll-ups.
                let oldest_raw: Option<i64> =
                    tx.query_row("SELECT min(start_unix_nanos) FROM records", [], |r| {
                        r.get(0)
                    })?;
                let cutoff = now
                    .saturating_sub(keep.as_secs())
                    .min(oldest_raw.map_or(u64::MAX, |s| u64::try_from(s).unwrap_or(0) / NANOS));
                for resolution in [HOUR, DAY] {
                    let dropped = tx
                        .prepare_cached(
                            "DELETE FROM rollups WHERE id IN (SELECT id FROM rollups \
                             WHERE resolution = ?1 AND bucket <= ?2 LIMIT ?3)",
                        )?
                        .execute(rusqlite::params![
                            to_i64(resolution),
                            to_i64(cutoff.saturating_sub(resolution)),
                            to_i64(max_rows as u64)
                        ])? as u64;
                    step.more |= dropped >= max_rows as u64;
                    step.dropped += dropped;
                }
            }
            Ok::<_, rusqlite::Error>(step)
        })();
        step.and_then(|s| tx.commit().map(|()| s)).map_err(sqlite)
    }
}
