//! Retention of raw records: deleting those older than the raw window, or
//! the oldest while the store is over its size, in small transactions that
//! never touch a record the roll-ups do not hold yet; and what the store
//! measures for it.

use std::time::Duration;

use rusqlite::TransactionBehavior;

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
}

impl StoreSize {
    /// What `--max-store-bytes` bounds: pages in use plus the WAL.
    pub fn bounded_bytes(&self) -> u64 {
        self.used_bytes.saturating_add(self.wal_bytes)
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
        })
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
    /// transaction. Returns how many were deleted.
    ///
    /// # Errors
    ///
    /// When SQLite fails; nothing is then deleted.
    pub fn delete_started_before(
        &mut self,
        cutoff_unix_nanos: u64,
        max_rows: usize,
    ) -> Result<u64, StoreError> {
        self.delete_rows(
            "SELECT id, start_unix_nanos, trigger FROM records \
             WHERE start_unix_nanos < ?1 AND id <= ?2 ORDER BY start_unix_nanos LIMIT ?3",
            to_i64(cutoff_unix_nanos),
            max_rows,
        )
    }

    /// Delete the `max_rows` raw records stored first (lowest ids) that are
    /// rolled up, in one transaction. Returns how many were deleted.
    ///
    /// Records are stored in about the order they started, but for the
    /// stragglers a batch brings late; deleting in the order they were
    /// stored touches neighbouring rows of every table and index, so that
    /// a transaction appends little more than the rows themselves to the
    /// WAL (deleting by start, scattered over all that arrived within the
    /// senders' jitter, appends several pages a record). Time-based
    /// retention deletes by start ([`Store::delete_started_before`]).
    ///
    /// # Errors
    ///
    /// When SQLite fails; nothing is then deleted.
    pub fn delete_oldest(&mut self, max_rows: usize) -> Result<u64, StoreError> {
        self.delete_rows(
            "SELECT id, start_unix_nanos, trigger FROM records \
             WHERE ?1 = ?1 AND id <= ?2 ORDER BY id LIMIT ?3",
            0,
            max_rows,
        )
    }

    fn delete_rows(
        &mut self,
        select: &str,
        bound: i64,
        max_rows: usize,
    ) -> Result<u64, StoreError> {
        self.keep_wal_short();
        let sqlite = self.sqlite_owned("delete records past retention");
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&sqlite)?;
        let n = (|| {
            let mut state = State::read(&tx)?;
            let rows: Vec<(i64, Option<i64>, bool)> = tx
                .prepare_cached(select)?
                .query_map(
                    rusqlite::params![bound, state.rolled_up_through, to_i64(max_rows as u64)],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, String>(2)? == "forced")),
                )?
                .collect::<Result<_, _>>()?;
            let mut records = tx.prepare_cached("DELETE FROM records WHERE id = ?1")?;
            let mut paths = tx.prepare_cached("DELETE FROM paths WHERE id = ?1")?;
            for (id, start, forced) in &rows {
                state.deleted_forced += u64::from(*forced);
                records.execute([id])?;
                paths.execute([id])?;
                if let Some(s) = start.and_then(|s| u64::try_from(s).ok()) {
                    state.raw_deleted_through =
                        Some(state.raw_deleted_through.map_or(s, |d| d.max(s)));
                }
            }
            state.deleted_by_retention += rows.len() as u64;
            state.write(&tx)?;
            Ok::<_, rusqlite::Error>(rows.len() as u64)
        })();
        n.and_then(|n| tx.commit().map(|()| n)).map_err(sqlite)
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
