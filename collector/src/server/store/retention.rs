//! Retention of raw records: deleting those older than the raw window, or
//! the oldest while the store is over its size, in small transactions that
//! never touch a record the roll-ups do not hold yet; and what the store
//! measures for it.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::rollup::State;
use super::{Store, StoreError, to_i64};

/// How much room a store takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreSize {
    /// The database file's length (pages in use and free pages).
    pub file_bytes: u64,
    /// Pages in use: what deleting records lowers (freed pages are reused
    /// before the file grows).
    pub used_bytes: u64,
    /// The WAL file's length.
    pub wal_bytes: u64,
    /// The length of a page of the database.
    pub page_bytes: u64,
}

impl StoreSize {
    /// What `--max-store-bytes` bounds: what the disk holds, the database
    /// file (free pages included) plus the WAL.
    pub fn bounded_bytes(&self) -> u64 {
        self.file_bytes.saturating_add(self.wal_bytes)
    }

    /// Free pages: room the file holds for new rows, which it gives back
    /// to the disk only by shrinking ([`Store::shrink`]).
    pub fn free_bytes(&self) -> u64 {
        self.file_bytes.saturating_sub(self.used_bytes)
    }
}

/// What the writer keeps raw and how it rolls up: the store's side of
/// `cpt serve --retain-for` and `--hourly-rollups-for`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Raw records whose start is older than this are deleted, and those
    /// arriving that old are only rolled up (`None`: kept forever).
    pub retain_for: Option<Duration>,
    /// Roll-ups are hourly for this long, then daily.
    pub hourly_for: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            retain_for: None,
            hourly_for: Duration::from_secs(14 * 86_400),
        }
    }
}

/// `SystemTime` as ns since the Unix epoch.
pub(crate) fn unix_nanos(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl Store {
    /// Set what the writer keeps raw (see [`Retention`]); the raw window
    /// is noted in the store, so that readers can say how long raw records
    /// are kept.
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn set_retention(&mut self, retention: Retention) -> Result<(), StoreError> {
        self.retention = retention;
        let sqlite = self.sqlite_owned("note the raw window");
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&sqlite)?;
        let mut state = State::read(&tx).map_err(&sqlite)?;
        state.retain_for_secs = retention.retain_for.map(|d| d.as_secs());
        state.write(&tx).and_then(|()| tx.commit()).map_err(sqlite)
    }

    /// The store's roll-up and retention state, as committed.
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn state(&self) -> Result<State, StoreError> {
        State::read(&self.conn).map_err(self.sqlite("read the store's state"))
    }

    /// How much room the store takes now.
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn size(&self) -> Result<StoreSize, StoreError> {
        let pragma = |name: &str| -> Result<u64, StoreError> {
            let v: i64 = self
                .conn
                .query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
                .map_err(self.sqlite("read the store's size"))?;
            Ok(u64::try_from(v).unwrap_or(0))
        };
        let (pages, free, page) = (
            pragma("page_count")?,
            pragma("freelist_count")?,
            pragma("page_size")?,
        );
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        Ok(StoreSize {
            file_bytes: pages * page,
            used_bytes: pages.saturating_sub(free) * page,
            wal_bytes: std::fs::metadata(wal).map_or(0, |m| m.len()),
            page_bytes: page,
        })
    }

    /// True when the file can give free pages back to the disk
    /// ([`Store::shrink`]): a store created with `auto_vacuum =
    /// INCREMENTAL` (every store this build creates). An older store
    /// keeps its length (its free pages are reused before it grows) until
    /// it is rebuilt with `VACUUM` (see `docs/src/operations/retention.md`).
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn can_shrink(&self) -> Result<bool, StoreError> {
        let mode: i64 = self
            .conn
            .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
            .map_err(self.sqlite("read auto_vacuum"))?;
        Ok(mode == super::schema::AUTO_VACUUM_INCREMENTAL)
    }

    /// Give up to `max_pages` free pages back to the disk, moving pages in
    /// use from the end of the file into free ones (`PRAGMA
    /// incremental_vacuum`): one small write transaction, of about twice
    /// that many pages in the WAL. Does nothing on a store that cannot
    /// shrink ([`Store::can_shrink`]).
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn shrink(&mut self, max_pages: u64) -> Result<(), StoreError> {
        self.keep_wal_short();
        let sqlite = self.sqlite_owned("give free pages back to the disk");
        self.with_upkeep_sync(|conn| {
            // The pragma returns no row; stepping it to the end runs it.
            let mut s =
                conn.prepare(&format!("PRAGMA incremental_vacuum({})", max_pages.max(1)))?;
            let mut rows = s.query([])?;
            while rows.next()?.is_some() {}
            Ok(())
        })
        .map_err(sqlite)
    }

    /// Run one of the writer's upkeep transactions (deletions, roll-ups,
    /// shrinking) with `synchronous = NORMAL`: its commit does not wait for
    /// an fsync of its own. Losing it to a power cut loses nothing
    /// acknowledged (the records it deletes are then still there, rolled
    /// up or not, and the state it moves goes back with them), and it is
    /// never lost alone: SQLite replays the WAL only up to its first frame
    /// that did not reach the disk, and the next group commit's fsync
    /// carries this one's frames to it.
    pub(super) fn with_upkeep_sync<T>(
        &mut self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        let relax = self.durability == super::Durability::Full;
        if relax {
            self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        }
        let out = f(&mut self.conn);
        if relax {
            self.conn
                .pragma_update(None, "synchronous", self.durability.pragma())?;
        }
        out
    }

    /// The oldest raw record's start (ns since the Unix epoch).
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn oldest_start(&self) -> Result<Option<u64>, StoreError> {
        let v: Option<i64> = self
            .conn
            .query_row("SELECT min(start_unix_nanos) FROM records", [], |r| {
                r.get(0)
            })
            .map_err(self.sqlite("find the oldest record"))?;
        Ok(v.and_then(|v| u64::try_from(v).ok()))
    }

    /// Delete up to `max_rows` raw records that started before
    /// `cutoff_unix_nanos` and are rolled up, oldest first, in one
    /// transaction (see [`Store::delete_oldest`] for the records it keeps).
    /// Returns how many were deleted.
    ///
    /// # Errors
    ///
    /// When SQLite fails; nothing is then deleted.
    pub fn delete_started_before(
        &mut self,
        cutoff_unix_nanos: u64,
        max_rows: usize,
    ) -> Result<u64, StoreError> {
        self.delete_rows(to_i64(cutoff_unix_nanos).saturating_sub(1), max_rows)
    }

    /// Delete up to `max_rows` roll-ups, the oldest periods first (daily
    /// ones before hourly ones, which are newer), in one transaction, for a
    /// store over its size bound with no raw record left to delete: the
    /// roll-ups of ever-new endpoints would otherwise outgrow any bound.
    /// A period's roll-up stays while a raw record of it is kept, and the
    /// roll-ups of records without a start time stay. Counted in
    /// [`State::rollups_deleted_for_size`]. Returns how many were deleted.
    ///
    /// # Errors
    ///
    /// When SQLite fails; nothing is then deleted.
    pub fn delete_oldest_rollups(&mut self, max_rows: usize) -> Result<u64, StoreError> {
        use super::rollup::{DAY, HOUR};
        self.keep_wal_short();
        let sqlite = self.sqlite_owned("delete the oldest roll-ups over the size bound");
        let limit = to_i64(max_rows as u64).max(1);
        self.with_upkeep_sync(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let oldest_raw: Option<i64> =
                tx.query_row("SELECT min(start_unix_nanos) FROM records", [], |r| {
                    r.get(0)
                })?;
            // Periods that end by the oldest raw record's start.
            let before = oldest_raw.map_or(i64::MAX, |s| s.div_euclid(1_000_000_000));
            let mut deleted = 0i64;
            for resolution in [DAY, HOUR] {
                if deleted >= limit {
                    break;
                }
                let resolution = to_i64(resolution);
                deleted += tx
                    .prepare_cached(
                        "DELETE FROM rollups WHERE id IN (SELECT id FROM rollups \
                         INDEXED BY rollups_by_time WHERE resolution = ?1 AND bucket <= ?2 \
                         ORDER BY bucket LIMIT ?3)",
                    )?
                    .execute(rusqlite::params![
                        resolution,
                        before.saturating_sub(resolution),
                        limit - deleted
                    ])? as i64;
            }
            let deleted = u64::try_from(deleted).unwrap_or(0);
            if deleted > 0 {
                let mut state = State::read(&tx)?;
                state.rollups_deleted_for_size += deleted;
                state.write(&tx)?;
            }
            tx.commit()?;
            Ok(deleted)
        })
        .map_err(sqlite)
    }

    /// Delete about the `max_rows` raw records stored first (lowest ids)
    /// that are rolled up, in one transaction. Returns how many were
    /// deleted.
    ///
    /// Records are stored in about the order they started, so deleting in
    /// the order they were stored touches neighbouring rows of every table
    /// and index, and a transaction appends little more than the rows
    /// themselves to the WAL (deleting by start, scattered over all that
    /// arrived within the senders' jitter, appends several pages a
    /// record); the rows go by id range.
    ///
    /// The store's mark, [`State::raw_deleted_through`], becomes the
    /// latest start deleted, and it never passes a record kept: among the
    /// records stored first, those that started later than the earliest
    /// start of the records kept are kept too (they go in a later
    /// deletion, or by `--retain-for`), and a record that started earlier
    /// than the first ones (a straggler stored late) goes with them once
    /// rolled up. A record stamped far ahead (a sender whose clock runs
    /// fast) is kept until every record that started before it is gone or
    /// its start falls out of `--retain-for`; a record not rolled up yet
    /// holds back every record that started after it. Records without a
    /// start time have no place in that order and go first.
    ///
    /// # Errors
    ///
    /// When SQLite fails; nothing is then deleted.
    pub fn delete_oldest(&mut self, max_rows: usize) -> Result<u64, StoreError> {
        self.keep_wal_short();
        let sqlite = self.sqlite_owned("delete records over the size bound");
        let limit = to_i64(max_rows as u64).max(1);
        self.with_upkeep_sync(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut state = State::read(&tx)?;
            let rolled = state.rolled_up_through;
            // Records stamped ahead of the clock cannot go before the
            // records arriving now (they started later): leave them out of
            // the window, where they would take its room, unless nothing
            // else is left.
            let window_under = |cap: i64| -> rusqlite::Result<Vec<(i64, Option<i64>)>> {
                tx.prepare_cached(
                    "SELECT id, start_unix_nanos FROM records NOT INDEXED WHERE id <= ?1 \
                     AND (start_unix_nanos IS NULL OR start_unix_nanos <= ?2) \
                     ORDER BY id LIMIT ?3",
                )?
                .query_map(rusqlite::params![rolled, cap, limit], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?
                .collect()
            };
            let mut cap = to_i64(unix_nanos(std::time::SystemTime::now()));
            let mut window = window_under(cap)?;
            if window.is_empty() {
                cap = i64::MAX;
                window = window_under(cap)?;
            }
            let (Some(&(first, _)), Some(&(last, _))) = (window.first(), window.last()) else {
                return Ok(0);
            };
            // The earliest start kept: walk the starts from the earliest,
            // past the window's and the rolled-up stragglers' (which go
            // too), to the first record that stays.
            let in_window = |id: i64, start: i64| id <= last && start <= cap;
            let window_latest = window.iter().filter_map(|w| w.1).max().unwrap_or(i64::MIN);
            let mut stragglers: Vec<(i64, i64)> = Vec::new();
            let mut floor = i64::MAX;
            {
                let mut walk = tx.prepare_cached(
                    "SELECT id, start_unix_nanos FROM records INDEXED BY records_by_start \
                     WHERE start_unix_nanos IS NOT NULL ORDER BY start_unix_nanos",
                )?;
                let mut rows = walk.query([])?;
                while let Some(r) = rows.next()? {
                    let (id, start): (i64, i64) = (r.get(0)?, r.get(1)?);
                    if in_window(id, start) {
                        continue;
                    }
                    if id <= rolled && start < window_latest && (stragglers.len() as i64) < limit {
                        stragglers.push((id, start));
                        continue;
                    }
                    floor = start;
                    break;
                }
            }
            let mut deleted = 0u64;
            let mut latest: Option<i64> = None;
            for (_, start) in &window {
                if let Some(s) = start.filter(|s| *s <= floor) {
                    latest = latest.max(Some(s));
                }
            }
            // The forced records among them, counted apart (no roll-up
            // stands for them).
            state.deleted_forced += tx
                .prepare_cached(
                    "SELECT count(*) FROM records WHERE id BETWEEN ?1 AND ?2 \
                     AND (start_unix_nanos IS NULL OR start_unix_nanos <= ?3) \
                     AND trigger = 'forced'",
                )?
                .query_row(rusqlite::params![first, last, floor.min(cap)], |r| {
                    r.get::<_, i64>(0)
                })?
                .unsigned_abs();
            for table in ["records", "paths"] {
                let n = tx
                    .prepare_cached(&format!(
                        "DELETE FROM {table} WHERE id BETWEEN ?1 AND ?2 \
                         AND (start_unix_nanos IS NULL OR start_unix_nanos <= ?3)"
                    ))?
                    .execute(rusqlite::params![first, last, floor.min(cap)])?;
                if table == "records" {
                    deleted = n as u64;
                }
            }
            let mut records = tx
                .prepare_cached("DELETE FROM records WHERE id = ?1 RETURNING trigger = 'forced'")?;
            let mut paths = tx.prepare_cached("DELETE FROM paths WHERE id = ?1")?;
            for (id, start) in &stragglers {
                if let Some(forced) = records
                    .query_row([id], |r| r.get::<_, bool>(0))
                    .optional()?
                {
                    deleted += 1;
                    state.deleted_forced += u64::from(forced);
                }
                paths.execute([id])?;
                latest = latest.max(Some(*start));
            }
            drop((records, paths));
            if let Some(s) = latest.and_then(|s| u64::try_from(s).ok()) {
                state.raw_deleted_through = Some(state.raw_deleted_through.map_or(s, |d| d.max(s)));
            }
            if deleted > 0 {
                state.deleted_by_retention += deleted;
                state.write(&tx)?;
            }
            tx.commit()?;
            Ok(deleted)
        })
        .map_err(sqlite)
    }

    /// Delete up to `max_rows` rolled-up records by start, up to `through`
    /// (inclusive), never past the earliest start of a record not rolled
    /// up yet.
    fn delete_rows(&mut self, through: i64, max_rows: usize) -> Result<u64, StoreError> {
        self.keep_wal_short();
        let sqlite = self.sqlite_owned("delete records past retention");
        let limit = to_i64(max_rows as u64);
        self.with_upkeep_sync(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut state = State::read(&tx)?;
            // Never past a record not rolled up yet (the rows above the
            // roll-up mark, read by id: a short range).
            let pending: Option<i64> = tx
                .prepare_cached(
                    "SELECT min(start_unix_nanos) FROM records NOT INDEXED WHERE id > ?1",
                )?
                .query_row([state.rolled_up_through], |r| r.get(0))?;
            let bound = pending.map_or(through, |p| through.min(p - 1));
            let rows: Vec<(i64, i64, bool)> = tx
                .prepare_cached(
                    "SELECT id, start_unix_nanos, trigger FROM records INDEXED BY records_by_start \
                     WHERE start_unix_nanos <= ?1 ORDER BY start_unix_nanos LIMIT ?2",
                )?
                .query_map(rusqlite::params![bound, limit], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get::<_, String>(2)? == "forced"))
                })?
                .collect::<Result<_, _>>()?;
            let mut records = tx.prepare_cached("DELETE FROM records WHERE id = ?1")?;
            let mut paths = tx.prepare_cached("DELETE FROM paths WHERE id = ?1")?;
            for (id, start, forced) in &rows {
                state.deleted_forced += u64::from(*forced);
                records.execute([id])?;
                paths.execute([id])?;
                if let Ok(s) = u64::try_from(*start) {
                    state.raw_deleted_through =
                        Some(state.raw_deleted_through.map_or(s, |d| d.max(s)));
                }
            }
            drop((records, paths));
            if !rows.is_empty() {
                state.deleted_by_retention += rows.len() as u64;
                state.write(&tx)?;
            }
            tx.commit()?;
            Ok(rows.len() as u64)
        })
        .map_err(sqlite)
    }

    /// Bring a mark that passes the records kept back to them: when
    /// [`State::raw_deleted_through`] is later than the earliest start of
    /// a raw record still stored (or, with none stored, later than
    /// `now_unix_nanos`), it becomes the nanosecond before that start (or
    /// `now_unix_nanos`). A store whose deletions went by id, before they
    /// kept what started earlier, may hold such a mark: one record stamped
    /// far ahead and deleted made every time-ranged selection that needs
    /// raw records answer "beyond retention". Records deleted before the
    /// mark was brought back and that started after it (that one record,
    /// and stragglers of the same seconds) are then taken as still raw.
    /// Returns the mark before and after, when it moved.
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn recover_raw_deleted_mark(
        &mut self,
        now_unix_nanos: u64,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        let sqlite = self.sqlite_owned("bring the raw-deleted mark back to the records kept");
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&sqlite)?;
        let moved = (|| {
            let mut state = State::read(&tx)?;
            let Some(mark) = state.raw_deleted_through else {
                return Ok(None);
            };
            let earliest: Option<i64> =
                tx.query_row("SELECT min(start_unix_nanos) FROM records", [], |r| {
                    r.get(0)
                })?;
            let ceiling = match earliest.and_then(|e| u64::try_from(e).ok()) {
                Some(e) => e.saturating_sub(1),
                None => now_unix_nanos,
            };
            if mark <= ceiling {
                return Ok(None);
            }
            state.raw_deleted_through = Some(ceiling);
            state.write(&tx)?;
            Ok::<_, rusqlite::Error>(Some((mark, ceiling)))
        })();
        moved.and_then(|m| tx.commit().map(|()| m)).map_err(sqlite)
    }

    /// Forget up to `max_rows` batch ids committed before `before_unix_ms`
    /// (a batch resent after that is stored again). Returns how many.
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn forget_batches_before(
        &mut self,
        before_unix_ms: i64,
        max_rows: usize,
    ) -> Result<u64, StoreError> {
        let n = self
            .conn
            .execute(
                "DELETE FROM batches WHERE id IN (SELECT id FROM batches \
                 WHERE committed_unix_ms < ?1 LIMIT ?2)",
                rusqlite::params![before_unix_ms, to_i64(max_rows as u64)],
            )
            .map_err(self.sqlite("forget old batch ids"))?;
        Ok(n as u64)
    }
}
