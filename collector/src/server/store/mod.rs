//! The record store: one SQLite database (bundled SQLite, WAL mode).
//!
//! # Schema
//!
//! One row per record in `records`: the columns a selection filters on
//! (`service`, `endpoint`, `start_unix_nanos`, `latency_ns`, `trigger`, and
//! `labels` as a JSON object) plus the record itself in its JSON Lines form
//! (`record`), which is what queries return. `PRAGMA user_version` is the
//! schema version ([`SCHEMA_VERSION`]).
//!
//! Version 2 added `request_id` and `trace_id` columns with an index each,
//! so one request is found among millions of records by its id
//! ([`StoreQuery::request_id`], [`StoreQuery::trace_id`]). A version 1 store
//! opened for writing ([`Store::open`]: `cpt serve`, `cpt import`) is
//! migrated in one transaction (columns filled from the stored records,
//! indexes built, nothing else changed). Opened read-only it still answers
//! every other query; a query by id fails with [`StoreError::NoIdIndex`],
//! which says how to migrate it, rather than scanning every record.
//!
//! Version 3 added `batches`: the id of every batch stored with a batch id
//! (the `cpt-batch-id` header or gRPC metadata the client sends, stable
//! across its retries and spool replays), written in the same transaction
//! as the batch's records. A batch whose id is already there is not stored
//! again ([`Store::insert_group`] answers `Ok(0)` for it), so a batch
//! resent after a lost acknowledgement is stored exactly once. One row per
//! batch (about 60 bytes), kept as long as the store. Batches without an id
//! (older clients, JSON Lines senders that set no header) are stored as
//! before. Opening a version 2 store for writing adds the table; nothing
//! else changes.
//!
//! Version 4 added the profile tables `frames` and `paths` (see `paths`):
//! each record's path packed as ids into a table of distinct frames, beside
//! the columns a selection filters on, written in the same transaction as
//! the record. Profiles ([`Store::for_each_packed`]) read them, never the
//! JSON; everything else (`cpt show`, `/v1/records`, the Parquet export)
//! still reads `records`. Opening an older store for writing fills them from
//! the stored JSON in the schema transaction; read-only, an older store is
//! profiled from its JSON as before.
//!
//! Version 5 made the id indexes cheap to write. Request and trace ids are
//! random, so a plain index on them takes each new record's entry to a
//! random page of the whole index: once the index outgrows the cache,
//! every record of a commit rewrites a page of its own, and ingest slows as
//! the store grows. The version 5 indexes are keyed on the record's id
//! bucket first (`id >> 14`, 16 384 consecutive records a bucket), then the
//! request or trace id: a commit writes only into the newest bucket's few
//! pages. A lookup seeks the id in each bucket, one index seek per 16 384
//! records (about a millisecond at five million). Opening an older store
//! for writing rebuilds the two indexes in the schema transaction; read
//! only, its plain indexes still answer. Version 5 also keeps each
//! record's latency in `paths`, so the endpoints' summary
//! ([`Store::endpoints`]) scans that compact table, not `records`.
//!
//! `otlp_spans` holds the OpenTelemetry spans `cpt serve --otlp-*` has
//! acknowledged whose trace is not complete yet (one row per trace and
//! request, the spans as a protobuf blob (JSON text in rows of the first
//! encoding); [`EncodedBatch::with_held_spans`]); the
//! batch that stores a trace's records deletes its rows
//! ([`EncodedBatch::with_released_traces`]), and a collector that starts
//! reads what is left ([`Store::held_spans`]). Any version gets the table
//! when opened for writing: an older `cpt` ignores it.
//!
//! # Durability
//!
//! The database runs in WAL mode with `synchronous = FULL` by default: a
//! commit returns only after the WAL has been fsynced, so a batch whose
//! insert returned `Ok` survives a process kill *and* a power loss.
//! [`Durability::Normal`] (`synchronous = NORMAL`) skips that fsync: a
//! committed batch still survives the process being killed (the WAL write
//! reached the kernel before the commit returned), but the last commits may
//! be lost if the machine itself goes down.
//!
//! # Batches
//!
//! [`Store::insert`] stores a batch in one transaction: all of it or none.
//! [`Store::insert_group`] commits several batches in one transaction (one
//! fsync) while keeping each batch all-or-nothing with a savepoint: this is
//! the collector's group commit.
//!
//! # The WAL
//!
//! A store opened for writing keeps its WAL bounded: the writer never
//! checkpoints on commit (`wal_autocheckpoint = 0`, so a commit never waits
//! for a checkpoint of a long WAL); a background thread with its own
//! connection runs passive checkpoints (which never block the writer or
//! readers), back to back while there is a backlog. Once one has left at
//! most 4 096 pages uncopied (64 MiB with a new store's 16 KiB pages) of a
//! WAL longer than `journal_size_limit` (64 MiB), the writer cuts the WAL
//! back between two of its transactions: it copies what is left and resets
//! the file, waiting at most 100 ms for readers still in a snapshot. Record
//! streams take short snapshots; a profile reads in one snapshot for as
//! long as it reads (`snapshot`), which from the roll-ups is tens of
//! milliseconds.
//! When the disk cannot keep up with the writes and the checkpoints
//! together, a WAL of 768 MiB is cut whatever is left to copy: the writes
//! wait for that copy, which slows the senders instead of letting the WAL
//! grow. A store bounded by `--max-store-bytes` ([`Store::open_bounded`])
//! scales all three down with the bound, so the WAL stays within a
//! sixteenth of it.
//!
//! # Size
//!
//! A store this build creates has `auto_vacuum = INCREMENTAL`: its file can
//! give free pages back to the disk a few at a time while the writer goes
//! on ([`Store::shrink`]), which `cpt serve --max-store-bytes` does while
//! the file is over its share of the bound. SQLite takes the mode only
//! before the first table exists: an older store keeps its length (its
//! free pages are reused before it grows) until it is rebuilt, with the
//! collector stopped, by `sqlite3 STORE 'PRAGMA auto_vacuum = INCREMENTAL;
//! VACUUM;'` (which needs room for a copy of the store).
//!
//! # The raw-deleted mark
//!
//! `raw_deleted_through` ([`State`]) says which raw records may be gone:
//! those that started at or before it. Deletions keep it before every
//! record they keep ([`Store::delete_oldest`]). A store opened for writing
//! whose mark passed the records it keeps (a deletion in id order of a
//! record stamped far ahead, before deletions kept what started earlier)
//! gets it back: the mark becomes the nanosecond before the earliest start
//! still stored, or, with no raw record left, the time it was opened
//! ([`Store::recover_raw_deleted_mark`]). Records deleted before that and
//! started after the new mark (the record stamped ahead, stragglers of the
//! same seconds) are then taken as still raw: a profile over those moments
//! may miss them rather than refuse.
//!
//! # Reading
//!
//! [`Store::query`] streams the records that match a [`StoreQuery`] from a
//! reader thread with its own connection (WAL readers never block the
//! writer), through a bounded channel, parsing JSON off the caller's thread
//! (chunks of rows in parallel on the rayon pool, delivered in order).

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

mod error;
mod insert;
mod paths;
mod query;
mod read;
mod retention;
pub mod rollup;
mod schema;
mod snapshot;
mod wal;

pub use error::StoreError;
pub use insert::EncodedBatch;
use paths::FrameIds;
use query::IdIndex;
pub use query::{Records, StoreQuery};
pub(crate) use retention::unix_nanos;
pub use retention::{Retention, StoreSize};
pub use rollup::answer::RetentionGap;
pub use rollup::{ProfileSource, State};
use schema::{BUCKETED_ID_VERSION, ID_BUCKET_BITS, ID_INDEX_VERSION, PAGE_SIZE};
pub use wal::CHECKPOINT_EVERY;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = 6;

/// Records buffered between the reader thread and the consumer.
const READ_AHEAD: usize = 1024;
/// Rows parsed together (in parallel) by the reader.
const PARSE_CHUNK: usize = 512;
/// Rows per read transaction: a read never holds one snapshot longer than
/// it takes to read this many rows.
pub const SNAPSHOT_ROWS: usize = 4096;

/// How hard a commit works to be durable (SQLite's `synchronous`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous = FULL`: each commit fsyncs the WAL. Survives process
    /// kills and power loss.
    #[default]
    Full,
    /// `synchronous = NORMAL`: survives process kills, not power loss.
    Normal,
}

impl Durability {
    /// Parse `full` or `normal`.
    pub fn parse(s: &str) -> Option<Durability> {
        match s {
            "full" => Some(Durability::Full),
            "normal" => Some(Durability::Normal),
            _ => None,
        }
    }

    fn pragma(self) -> &'static str {
        match self {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        }
    }
}

/// SQLite integers are i64; u64 nanoseconds beyond i64::MAX (year 2262,
/// or a 292-year latency) saturate.
fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// An open store.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
    /// The schema version after opening (older only when read-only).
    version: i64,
    /// The `frames` table, for a store opened for writing.
    frames: Option<FrameIds>,
    /// The WAL's upkeep, for a store opened for writing.
    wal: Option<wal::Wal>,
    /// The `frames` table by id, for the writer's roll-ups.
    frames_by_id: Option<crate::profile::aggregate::packed::PackedFrames>,
    /// What the writer keeps raw.
    retention: Retention,
    /// How hard the writer's commits work to be durable.
    durability: Durability,
}

/// A connection that only reads an existing store.
///
/// Read-write with `query_only` when the file allows it, so that when it is
/// the last connection to close SQLite checkpoints and removes the
/// `-wal`/`-shm` files (a read-only connection cannot, and leaves them beside
/// the store); read-only otherwise. Never creates the file.
fn open_reader(path: &Path) -> Result<Connection, rusqlite::Error> {
    let rw = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .and_then(|c| c.pragma_update(None, "query_only", true).map(|()| c));
    match rw {
        Ok(c) => Ok(c),
        Err(_) => Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        ),
    }
}

impl Store {
    /// Open (creating if needed) the store at `path` for reading and
    /// writing, with [`Durability::Full`].
    ///
    /// # Examples
    ///
    /// ```
    /// use cpt_collector::store::{Store, StoreQuery};
    /// use cpt_sdk::{CriticalPath, Frame, Record, SegmentKind, Trigger};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("cpt.db");
    ///
    /// let mut p = CriticalPath::new();
    /// p.push_frames([Frame::new("A", "A1")], std::time::Duration::from_millis(3), SegmentKind::Busy);
    /// let mut store = Store::open(&path)?;
    /// store.insert(&[Record::new("A", Trigger::Sampled, p)])?; // durable when it returns
    ///
    /// let query = StoreQuery { service: Some("A".into()), ..StoreQuery::default() };
    /// let records: Vec<Record> = store.query(&query)?.collect::<Result<_, _>>()?;
    /// assert_eq!(records.len(), 1);
    /// # Ok::<(), cpt_collector::store::StoreError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// When SQLite cannot open or initialise the file, or it holds a newer
    /// schema.
    pub fn open(path: impl AsRef<Path>) -> Result<Store, StoreError> {
        Store::open_with(path, Durability::Full)
    }

    /// Open (creating if needed) for reading and writing with the given
    /// durability.
    ///
    /// # Errors
    ///
    /// As [`Store::open`].
    pub fn open_with(path: impl AsRef<Path>, durability: Durability) -> Result<Store, StoreError> {
        Store::open_with_limits(path, durability, wal::Limits::default())
    }

    /// [`Store::open_with`] for a store bounded to `max_bytes` (pages in
    /// use plus the WAL, `cpt serve --max-store-bytes`): the WAL is cut back
    /// past a thirty-second of that, and at a sixteenth whatever is left to
    /// copy (at most its usual 64 and 768 MiB), so that it does not take the
    /// room of the records.
    ///
    /// # Errors
    ///
    /// As [`Store::open`].
    pub fn open_bounded(
        path: impl AsRef<Path>,
        durability: Durability,
        max_bytes: u64,
    ) -> Result<Store, StoreError> {
        let mut limits = wal::Limits::default();
        limits.journal_size_limit = limits.journal_size_limit.min(max_bytes / 32).max(1 << 20);
        limits.hard_limit = limits.hard_limit.min(max_bytes / 16).max(4 << 20);
        limits.cut_within_frames = limits
            .cut_within_frames
            .min(i64::try_from(limits.journal_size_limit / PAGE_SIZE as u64).unwrap_or(i64::MAX))
            .max(64);
        Store::open_with_limits(path, durability, limits)
    }

    fn open_with_limits(
        path: impl AsRef<Path>,
        durability: Durability,
        limits: wal::Limits,
    ) -> Result<Store, StoreError> {
        let path = path.as_ref().to_path_buf();
        let err = |context| {
            let path = path.clone();
            move |source| StoreError::Sqlite {
                path,
                context,
                source,
            }
        };
        let conn = Connection::open(&path).map_err(err("open"))?;
        conn.busy_timeout(wal::WRITER_BUSY_TIMEOUT)
            .map_err(err("set busy timeout"))?;
        // Both take effect only on a new (empty) file: a store keeps the
        // page size and the auto-vacuum mode it was created with.
        conn.pragma_update(None, "page_size", PAGE_SIZE)
            .map_err(err("set page size"))?;
        conn.pragma_update(None, "auto_vacuum", schema::AUTO_VACUUM_INCREMENTAL)
            .map_err(err("let the file give free pages back"))?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(err("enable WAL"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(err("enable WAL")(rusqlite::Error::InvalidParameterName(
                format!("journal_mode is {mode}, not wal"),
            )));
        }
        conn.pragma_update(None, "synchronous", durability.pragma())
            .map_err(err("set synchronous"))?;
        // The background checkpointer keeps the WAL short; a commit never
        // runs a checkpoint itself.
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(err("turn off checkpoints on commit"))?;
        conn.pragma_update(None, "journal_size_limit", limits.journal_size_limit as i64)
            .map_err(err("set journal_size_limit"))?;
        let mut store = Store {
            conn,
            path,
            version: 0,
            frames: None,
            wal: None,
            frames_by_id: None,
            retention: Retention::default(),
            durability,
        };
        store.check_schema(true)?;
        store.recover_raw_deleted_mark(unix_nanos(std::time::SystemTime::now()))?;
        store.wal = Some(wal::Wal::start(&store.path, &mut store.conn, limits));
        Ok(store)
    }

    /// Open an existing store for reading only.
    ///
    /// # Errors
    ///
    /// When the file does not exist or is not a cpt store of a known schema.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Store, StoreError> {
        let path = path.as_ref().to_path_buf();
        let conn = open_reader(&path).map_err(|source| StoreError::Sqlite {
            path: path.clone(),
            context: "open read-only",
            source,
        })?;
        let _ = conn.busy_timeout(std::time::Duration::from_secs(10));
        let mut store = Store {
            conn,
            path,
            version: 0,
            frames: None,
            wal: None,
            frames_by_id: None,
            retention: Retention::default(),
            durability: Durability::default(),
        };
        store.check_schema(false)?;
        Ok(store)
    }

    /// The WAL length at which the writer cuts it back whatever is left to
    /// copy: a WAL reaches at most this plus one write transaction (more
    /// only while readers hold it), so the writer keeps its transactions
    /// a small part of it ([`Store::open_bounded`]).
    pub fn wal_cut_bytes(&self) -> u64 {
        self.wal
            .as_ref()
            .map_or(wal::WAL_HARD_LIMIT, wal::Wal::hard_limit)
    }

    /// The bytes the writer's last transaction appended to the WAL: what
    /// the retention sizes its transactions by (`None` for a read-only
    /// store, or when SQLite does not report them).
    pub fn last_commit_wal_bytes(&self) -> Option<u64> {
        self.wal.as_ref().and_then(wal::Wal::last_commit_bytes)
    }

    /// Cut the WAL back when it is long (see the module docs, "The WAL"):
    /// before every write transaction of the writer.
    fn keep_wal_short(&self) {
        if let Some(wal) = &self.wal {
            wal.maintain(&self.conn);
        }
    }

    /// [`sqlite`](Self::sqlite) that does not borrow the store.
    fn sqlite_owned(
        &self,
        context: &'static str,
    ) -> impl Fn(rusqlite::Error) -> StoreError + use<> {
        let path = self.path.clone();
        move |source| StoreError::Sqlite {
            path: path.clone(),
            context,
            source,
        }
    }

    fn sqlite(&self, context: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
        move |source| StoreError::Sqlite {
            path: self.path.clone(),
            context,
            source,
        }
    }

    /// How this store's id indexes are laid out.
    fn id_index(&self) -> IdIndex {
        IdIndex::of_version(self.version)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version of the file (older than [`SCHEMA_VERSION`] only
    /// for a store opened read-only that was written by an older cpt).
    pub fn schema_version(&self) -> i64 {
        self.version
    }

    /// The number of stored records.
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn len(&self) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn
            .query_row("SELECT count(*) FROM records", [], |r| r.get(0))
            .map_err(self.sqlite("count records"))?;
        Ok(n as u64)
    }

    /// True when the store holds no record.
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len()? == 0)
    }
}

mod summary;
pub use summary::EndpointSummary;
#[cfg(test)]
mod mark_tests;
#[cfg(test)]
mod tests;
