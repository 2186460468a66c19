//! `store_state`: how far the roll-ups reach and what retention removed.

use rusqlite::{Connection, OptionalExtension};

/// What a store says of its roll-ups and its retention, as committed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// The highest record id rolled up: every sampled record at or below it
    /// is in the roll-ups, and only those may be deleted by retention.
    pub rolled_up_through: i64,
    /// The highest record id ever given out (ids are never reused, also
    /// after the newest records were deleted).
    pub last_id: i64,
    /// Raw records that started at or before this (ns since the Unix
    /// epoch) may be gone; every record that started after it is still
    /// raw. `None` while retention has deleted nothing.
    pub raw_deleted_through: Option<u64>,
    /// Records deleted by retention, in all.
    pub deleted_by_retention: u64,
    /// Records that arrived already older than the raw window: rolled up
    /// (when sampled), never stored raw.
    pub too_old: u64,
    /// The raw window the collector keeps (`cpt serve --retain-for`),
    /// seconds; `None` for `forever` or a store no collector set one on.
    pub retain_for_secs: Option<u64>,
    /// Of [`too_old`](Self::too_old), the forced records: not rolled up
    /// (forced requests are not a random sample), so not kept at all.
    pub too_old_forced: u64,
    /// Of [`deleted_by_retention`](Self::deleted_by_retention), the forced
    /// records (no roll-up stands for them).
    pub deleted_forced: u64,
    /// Roll-ups deleted, the oldest first, because the store was over its
    /// size bound with no raw record left to delete
    /// ([`Store::delete_oldest_rollups`](crate::store::Store::delete_oldest_rollups)).
    pub rollups_deleted_for_size: u64,
}

const KEYS: [&str; 9] = [
    "rolled_up_through",
    "last_id",
    "raw_deleted_through",
    "deleted_by_retention",
    "too_old",
    "retain_for_secs",
    "too_old_forced",
    "deleted_forced",
    "rollups_deleted_for_size",
];

impl State {
    /// Read it (all zero / `None` on a store without the table).
    pub(in crate::server::store) fn read(conn: &Connection) -> rusqlite::Result<State> {
        let has: bool = conn.query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'store_state'",
            [],
            |r| r.get(0),
        )?;
        let mut s = State::default();
        if !has {
            return Ok(s);
        }
        let mut stmt = conn.prepare_cached("SELECT value FROM store_state WHERE name = ?1")?;
        let mut get = |k: &str| -> rusqlite::Result<Option<i64>> {
            stmt.query_row([k], |r| r.get(0)).optional()
        };
        let u = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
        s.rolled_up_through = get(KEYS[0])?.unwrap_or(0);
        s.last_id = get(KEYS[1])?.unwrap_or(0);
        s.raw_deleted_through = u(get(KEYS[2])?);
        s.deleted_by_retention = u(get(KEYS[3])?).unwrap_or(0);
        s.too_old = u(get(KEYS[4])?).unwrap_or(0);
        s.retain_for_secs = u(get(KEYS[5])?);
        s.too_old_forced = u(get(KEYS[6])?).unwrap_or(0);
        s.deleted_forced = u(get(KEYS[7])?).unwrap_or(0);
        s.rollups_deleted_for_size = u(get(KEYS[8])?).unwrap_or(0);
        Ok(s)
    }

    /// Write every field (in the caller's transaction).
    pub(in crate::server::store) fn write(&self, conn: &Connection) -> rusqlite::Result<()> {
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let values = [
            Some(self.rolled_up_through),
            Some(self.last_id),
            self.raw_deleted_through.map(i),
            Some(i(self.deleted_by_retention)),
            Some(i(self.too_old)),
            self.retain_for_secs.map(i),
            Some(i(self.too_old_forced)),
            Some(i(self.deleted_forced)),
            Some(i(self.rollups_deleted_for_size)),
        ];
        let mut set = conn.prepare_cached(
            "INSERT INTO store_state (name, value) VALUES (?1, ?2) \
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        )?;
        let mut unset = conn.prepare_cached("DELETE FROM store_state WHERE name = ?1")?;
        for (k, v) in KEYS.iter().zip(values) {
            match v {
                Some(v) => set.execute(rusqlite::params![k, v])?,
                None => unset.execute([k])?,
            };
        }
        Ok(())
    }
}
