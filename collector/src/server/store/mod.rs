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
//! readers), back to back while there is a backlog. Once one has copied all
//! but a few MiB of a WAL longer than `journal_size_limit` (64 MiB), the
//! writer cuts the WAL back between two of its transactions: it copies
//! those few MiB and resets the file, waiting at most 100 ms for readers
//! still in a snapshot. Since profile reads take short snapshots, no reader
//! holds the WAL for long. When the disk cannot keep up with the writes
//! and the checkpoints together, a WAL of 768 MiB is cut whatever is left
//! to copy: the writes wait for that copy, which slows the senders instead
//! of letting the WAL grow.
//!
//! # Reading
//!
//! [`Store::query`] streams the records that match a [`StoreQuery`] from a
//! reader thread with its own connection (WAL readers never block the
//! writer), through a bounded channel, parsing JSON off the caller's thread
//! (chunks of rows in parallel on the rayon pool, delivered in order).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

use crate::profile::aggregate::Aggregator;
use crate::profile::aggregate::packed::{PackedFrames, PackedRow};
use crate::records::EntryServices;
use crate::records::selection::Selection;
use cpt_sdk::Record;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

mod paths;
mod query;
mod wal;

use paths::{FrameIds, PATH_LATENCY_VERSION, PATHS_SCHEMA, PATHS_VERSION, PackedPath, PathRow};
use query::{IdIndex, read_rows};
pub use query::{Records, StoreQuery};
pub use wal::CHECKPOINT_EVERY;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = 5;

/// The first version with the `request_id` / `trace_id` columns and indexes.
const ID_INDEX_VERSION: i64 = 2;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS records (
    id               INTEGER PRIMARY KEY,
    service          TEXT NOT NULL,
    endpoint         TEXT,
    start_unix_nanos INTEGER,
    latency_ns       INTEGER NOT NULL,
    trigger          TEXT NOT NULL,
    labels           TEXT NOT NULL DEFAULT '{}',
    record           TEXT NOT NULL,
    request_id       TEXT,
    trace_id         TEXT
);
CREATE INDEX IF NOT EXISTS records_by_service ON records (service, endpoint, start_unix_nanos);
CREATE INDEX IF NOT EXISTS records_by_start ON records (start_unix_nanos);
CREATE TABLE IF NOT EXISTS batches (
    id                TEXT PRIMARY KEY,
    records           INTEGER NOT NULL,
    committed_unix_ms INTEGER NOT NULL
) WITHOUT ROWID;
";

/// A batch id already committed is ignored (`changes() == 0`).
const INSERT_BATCH_ID: &str =
    "INSERT OR IGNORE INTO batches (id, records, committed_unix_ms) VALUES (?1, ?2, ?3)";

/// Version 1 → 2: the id columns, filled from the stored JSON.
const MIGRATE_1_TO_2: &str = "
ALTER TABLE records ADD COLUMN request_id TEXT;
ALTER TABLE records ADD COLUMN trace_id TEXT;
UPDATE records SET request_id = json_extract(record, '$.request_id'),
                   trace_id = lower(json_extract(record, '$.trace_id'));
";

/// The page size of a new store. A record's row (its JSON is one to a few
/// kB) leaves much of a 4 KiB page unused, and a commit writes whole pages:
/// with 16 KiB pages a store takes about a fifth less space a record and
/// ingests about a quarter faster (`benches/benches/store.rs`).
const PAGE_SIZE: i64 = 16_384;

/// The first version whose id indexes lead with the id bucket.
const BUCKETED_ID_VERSION: i64 = 5;

/// Records `id >> ID_BUCKET_BITS` share a bucket of the id indexes.
pub(super) const ID_BUCKET_BITS: u32 = 14;

/// Partial indexes (records without an id cost nothing in them), bucketed
/// by record id (see the module docs, version 5). The shift is
/// [`ID_BUCKET_BITS`].
const ID_INDEXES: &str = "
CREATE INDEX IF NOT EXISTS records_by_request_id ON records (id >> 14, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS records_by_trace_id ON records (id >> 14, trace_id) WHERE trace_id IS NOT NULL;
";

/// Version 2–4 → 5: the plain id indexes go; `ID_INDEXES` builds the
/// bucketed ones.
const DROP_PLAIN_ID_INDEXES: &str = "
DROP INDEX IF EXISTS records_by_request_id;
DROP INDEX IF EXISTS records_by_trace_id;
";

const INSERT: &str = "INSERT INTO records \
    (service, endpoint, start_unix_nanos, latency_ns, trigger, labels, record, request_id, trace_id) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

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

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// SQLite reported an error.
    #[error("store {path}: {context}: {source}")]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// What the store was doing.
        context: &'static str,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The database was written by a newer cpt.
    #[error(
        "store {path}: schema version {found} is newer than this cpt's ({SCHEMA_VERSION}); upgrade cpt"
    )]
    NewerSchema {
        /// The database file.
        path: PathBuf,
        /// Its `user_version`.
        found: i64,
    },
    /// A query by request or trace id on a store written before the id
    /// index existed (opened read-only, so not migrated).
    #[error(
        "store {path} was written by an older cpt (schema version {found}) and has no request/trace id index; \
         add it with `cpt import --store {path}` (no files: it only upgrades the store, keeping every record) \
         or by starting `cpt serve` on it, then ask again",
        path = path.display()
    )]
    NoIdIndex {
        /// The database file.
        path: PathBuf,
        /// Its `user_version`.
        found: i64,
    },
    /// The collector's Parquet copy of a batch could not be written
    /// (`cpt serve --parquet-dir`); the batch is not acknowledged.
    #[error(
        "parquet dir {}: {message}; the batch is in the store but not acknowledged (the sender retries)",
        dir.display()
    )]
    Parquet {
        /// The Parquet directory.
        dir: PathBuf,
        /// What failed.
        message: String,
    },
    /// A stored record no longer parses.
    #[error("store {path}: record {id} is corrupt: {reason}")]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// The row id.
        id: i64,
        /// Why it does not parse.
        reason: String,
    },
}

/// SQLite integers are i64; u64 nanoseconds beyond i64::MAX (year 2262,
/// or a 292-year latency) saturate.
fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One record ready for insertion: its indexed columns and its JSON form.
#[derive(Clone, Debug)]
struct Row {
    service: String,
    endpoint: Option<String>,
    start_unix_nanos: Option<i64>,
    latency_ns: i64,
    trigger: &'static str,
    labels: String,
    record: String,
    request_id: Option<String>,
    trace_id: Option<String>,
    path: PackedPath,
}

/// A batch serialized for the store, so the (single) writer only runs SQL.
#[derive(Clone, Debug, Default)]
pub struct EncodedBatch {
    rows: Vec<Row>,
    batch_id: Option<String>,
}

impl EncodedBatch {
    /// Serialize `records`.
    pub fn new(records: &[Record]) -> EncodedBatch {
        EncodedBatch {
            rows: records
                .iter()
                .map(|r| Row {
                    service: r.service.clone(),
                    endpoint: r.endpoint.clone(),
                    start_unix_nanos: r.start_unix_nanos.map(to_i64),
                    latency_ns: to_i64(u64::try_from(r.latency.as_nanos()).unwrap_or(u64::MAX)),
                    trigger: r.trigger.as_str(),
                    labels: serde_json::to_string(&r.labels)
                        .expect("string labels always serialize; this is a bug"),
                    record: r.to_json(),
                    request_id: r.request_id.clone(),
                    trace_id: r.trace_id.as_deref().map(str::to_ascii_lowercase),
                    path: PackedPath::new(&r.path),
                })
                .collect(),
            batch_id: None,
        }
    }

    /// Tag the batch with the id its sender gave it: the store keeps the
    /// records of the first batch with this id and ignores later ones (see
    /// the module docs, schema version 3).
    #[must_use]
    pub fn with_batch_id(mut self, id: Option<String>) -> EncodedBatch {
        self.batch_id = id;
        self
    }

    /// The sender's batch id, if any.
    pub fn batch_id(&self) -> Option<&str> {
        self.batch_id.as_deref()
    }

    /// The number of records.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when the batch has no records.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
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
        // Takes effect only on a new (empty) file; a store keeps the page
        // size it was created with.
        conn.pragma_update(None, "page_size", PAGE_SIZE)
            .map_err(err("set page size"))?;
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
        };
        store.check_schema(true)?;
        store.wal = Some(wal::Wal::start(&store.path, limits));
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
        };
        store.check_schema(false)?;
        Ok(store)
    }

    fn sqlite(&self, context: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
        move |source| StoreError::Sqlite {
            path: self.path.clone(),
            context,
            source,
        }
    }

    fn check_schema(&mut self, create: bool) -> Result<(), StoreError> {
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(self.sqlite("read schema version"))?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path: self.path.clone(),
                found: version,
            });
        }
        if create {
            // One transaction; re-read the version inside it so two
            // processes opening an old store migrate it once.
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|source| StoreError::Sqlite {
                    path: self.path.clone(),
                    context: "begin schema transaction",
                    source,
                })?;
            let sqlite = |context| {
                let path = self.path.clone();
                move |source| StoreError::Sqlite {
                    path,
                    context,
                    source,
                }
            };
            let version: i64 = tx
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .map_err(sqlite("read schema version"))?;
            let has_table: bool = tx
                .query_row(
                    "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'records'",
                    [],
                    |r| r.get(0),
                )
                .map_err(sqlite("read schema"))?;
            if has_table && version < ID_INDEX_VERSION {
                tx.execute_batch(MIGRATE_1_TO_2)
                    .map_err(sqlite("migrate schema 1 to 2 (request/trace id columns)"))?;
            }
            if has_table && version < BUCKETED_ID_VERSION {
                tx.execute_batch(DROP_PLAIN_ID_INDEXES).map_err(sqlite(
                    "migrate schema to 5 (drop the plain request/trace id indexes)",
                ))?;
            }
            tx.execute_batch(&format!(
                "{SCHEMA} {ID_INDEXES} {PATHS_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION};"
            ))
            .map_err(sqlite("create schema"))?;
            if has_table && (PATHS_VERSION..PATH_LATENCY_VERSION).contains(&version) {
                tx.execute_batch(paths::MIGRATE_PATH_LATENCY)
                    .map_err(sqlite(
                        "migrate schema 4 to 5 (latency beside the packed paths)",
                    ))?;
            }
            let mut frames = FrameIds::load(&tx).map_err(sqlite("read frames"))?;
            if has_table && version < PATHS_VERSION {
                paths::fill_from_records(&tx, &mut frames).map_err(sqlite(
                    "migrate schema to 4 (packed paths for profiles, from the stored records)",
                ))?;
            }
            tx.commit().map_err(sqlite("commit schema"))?;
            self.frames = Some(frames);
            self.version = SCHEMA_VERSION;
        } else {
            // Fails clearly ("no such table: records") when this is not a store.
            self.conn
                .prepare("SELECT id, record FROM records LIMIT 0")
                .map_err(self.sqlite("check schema (is this a cpt store?)"))?;
            self.version = version;
        }
        Ok(())
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

    /// Store `records` in one transaction: all of them or, on error, none.
    /// Returns once the transaction has committed (see the module docs on
    /// durability).
    ///
    /// # Errors
    ///
    /// When SQLite fails; then nothing of the batch is stored.
    pub fn insert(&mut self, records: &[Record]) -> Result<u64, StoreError> {
        self.insert_encoded(&EncodedBatch::new(records))
    }

    /// [`Store::insert`] for a batch serialized beforehand.
    ///
    /// # Errors
    ///
    /// As [`Store::insert`].
    pub fn insert_encoded(&mut self, batch: &EncodedBatch) -> Result<u64, StoreError> {
        let mut results = self.insert_group(&[batch])?;
        results.pop().expect("one result per batch; this is a bug")
    }

    /// Store several batches in one transaction (one fsync), each batch
    /// all-or-nothing within it (a savepoint per batch). The outer `Err`
    /// means the commit itself failed and nothing was stored; otherwise each
    /// batch has its own result, and every `Ok` batch is durable. A batch
    /// whose [batch id](EncodedBatch::with_batch_id) was committed before
    /// (in this call or an earlier one) stores nothing and answers `Ok(0)`.
    ///
    /// # Errors
    ///
    /// When the transaction cannot begin or commit.
    pub fn insert_group(
        &mut self,
        batches: &[&EncodedBatch],
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        self.insert_group_then(batches, |_| Ok(()))
    }

    /// [`insert_group`](Self::insert_group), calling `before_commit` with
    /// each batch's result once every batch is in the transaction and before
    /// it commits (`Ok(0)`: a batch id committed before). When it fails,
    /// nothing is committed, batch ids included, and its error is returned:
    /// `cpt serve --parquet-dir` writes the new batches' Parquet files there,
    /// so a batch is never in the store (and its id never marked as seen)
    /// without its file.
    ///
    /// # Errors
    ///
    /// When the transaction cannot begin or commit, or `before_commit` fails.
    pub fn insert_group_then(
        &mut self,
        batches: &[&EncodedBatch],
        before_commit: impl FnOnce(&[Result<u64, StoreError>]) -> Result<(), StoreError>,
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        if let Some(wal) = &self.wal {
            wal.maintain(&self.conn);
        }
        let path = self.path.clone();
        let sqlite = |context| {
            let path = path.clone();
            move |source| StoreError::Sqlite {
                path,
                context,
                source,
            }
        };
        let mut tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite("begin transaction"))?;
        let frames = self.frames.get_or_insert_with(FrameIds::default);
        // Frames added to the table in this transaction: forgotten again
        // when their insert is rolled back.
        let mut group_added: Vec<cpt_sdk::Frame> = Vec::new();
        let mut scratch = Default::default();
        let mut results = Vec::with_capacity(batches.len());
        for batch in batches {
            let sp = tx.savepoint().map_err(sqlite("begin savepoint"))?;
            let mut added = Vec::new();
            let inserted = (|| {
                if let Some(id) = &batch.batch_id {
                    let now_ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                    let new = sp
                        .prepare_cached(INSERT_BATCH_ID)?
                        .execute(rusqlite::params![id, batch.rows.len() as i64, now_ms])?;
                    if new == 0 {
                        // Committed before: a resend after a lost ack.
                        return Ok(0);
                    }
                }
                for row in &batch.rows {
                    sp.prepare_cached(INSERT)?.execute(rusqlite::params![
                        row.service,
                        row.endpoint,
                        row.start_unix_nanos,
                        row.latency_ns,
                        row.trigger,
                        row.labels,
                        row.record,
                        row.request_id,
                        row.trace_id,
                    ])?;
                    paths::insert_path(
                        &sp,
                        frames,
                        &mut added,
                        &PathRow {
                            id: sp.last_insert_rowid(),
                            service: &row.service,
                            endpoint: row.endpoint.as_deref(),
                            start_unix_nanos: row.start_unix_nanos,
                            trigger: row.trigger,
                            labels: &row.labels,
                            path: &row.path,
                            latency_ns: row.latency_ns,
                        },
                        &mut scratch,
                    )?;
                }
                Ok::<_, rusqlite::Error>(batch.rows.len() as u64)
            })();
            match inserted {
                Ok(n) => {
                    sp.commit().map_err(sqlite("release savepoint"))?;
                    group_added.append(&mut added);
                    results.push(Ok(n));
                }
                Err(e) => {
                    // Dropping the savepoint rolls this batch back.
                    drop(sp);
                    frames.forget(&added);
                    results.push(Err(sqlite("insert batch")(e)));
                }
            }
        }
        // Dropping `tx` on these errors rolls the whole group back.
        let committed =
            before_commit(&results).and_then(|()| tx.commit().map_err(sqlite("commit")));
        if let Err(e) = committed {
            frames.forget(&group_added);
            return Err(e);
        }
        Ok(results)
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

    /// The records that may match a profile [`Selection`]: service,
    /// endpoint, time range, trigger and labels are pushed down into SQL;
    /// the percentile band is left to the caller (it needs the whole
    /// selection). Records come in insertion order, so percentile ties break
    /// the same way on every run.
    ///
    /// # Errors
    ///
    /// As [`Store::query`].
    pub fn records(&self, sel: &Selection) -> Result<Records, StoreError> {
        self.query(&StoreQuery::from_selection(sel))
    }

    /// Hand the records that may match `sel` (as [`Store::records`]) to `f`
    /// in batches of at most `batch` records; returns how many were read.
    /// The one loop `cpt profile --store` and the collector's `GET /profile`
    /// both read a store with.
    ///
    /// # Errors
    ///
    /// The first error reading the store; batches before it were handed
    /// over, nothing after it is.
    pub fn for_each_batch(
        &self,
        sel: &Selection,
        batch: usize,
        mut f: impl FnMut(&[Record]),
    ) -> Result<u64, StoreError> {
        let batch = batch.max(1);
        let mut buf = Vec::with_capacity(batch);
        let mut n = 0;
        for r in self.records(sel)? {
            buf.push(r?);
            n += 1;
            if buf.len() == batch {
                f(&buf);
                buf.clear();
            }
        }
        if !buf.is_empty() {
            f(&buf);
        }
        Ok(n)
    }

    /// Hand the stored records that match `sel` (every filter but the
    /// percentile band, applied in SQL) to `f` in their packed form, in
    /// insertion order, in batches of at most `batch` rows, with the frames
    /// table they point into; returns how many were read. The records are
    /// those committed when the call began, read in short snapshots (see the
    /// module docs), on a reader thread one batch ahead of `f`.
    ///
    /// `Ok(None)` without calling `f` when the store predates the profile
    /// tables (schema version 4) and was opened read-only: read it with
    /// [`Store::for_each_batch`] instead.
    ///
    /// # Errors
    ///
    /// As [`Store::query`]; batches before an error were handed over.
    pub fn for_each_packed(
        &self,
        sel: &Selection,
        batch: usize,
        f: impl FnMut(&[PackedRow], &PackedFrames),
    ) -> Result<Option<u64>, StoreError> {
        if self.version < PATHS_VERSION {
            return Ok(None);
        }
        self.for_each_packed_after(&StoreQuery::from_selection(sel), 0, batch, f)
            .map(Some)
    }

    /// [`for_each_packed`](Self::for_each_packed) of `query`'s rows with an
    /// id above `after`, on a store with the profile tables.
    fn for_each_packed_after(
        &self,
        query: &StoreQuery,
        after: i64,
        batch: usize,
        mut f: impl FnMut(&[PackedRow], &PackedFrames),
    ) -> Result<u64, StoreError> {
        if query.by_id() && self.version < ID_INDEX_VERSION {
            return Err(StoreError::NoIdIndex {
                path: self.path.clone(),
                found: self.version,
            });
        }
        let query = query.clone();
        let path = self.path.clone();
        let (tx, rx) = mpsc::sync_channel(1);
        let rows = batch.max(1);
        let ids = self.id_index();
        let reader = thread::Builder::new()
            .name("cpt-store-reader".into())
            .spawn(move || paths::read_packed(&path, &query, ids, after, rows, &tx))
            .map_err(|e| StoreError::Sqlite {
                path: self.path.clone(),
                context: "start reader thread",
                source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
            })?;
        let mut frames = PackedFrames::new();
        let mut n = 0;
        let mut result = Ok(());
        for chunk in rx.iter() {
            match chunk {
                Ok((rows, new)) => {
                    for (id, frame) in new {
                        frames.insert(id, frame);
                    }
                    n += rows.len() as u64;
                    if !rows.is_empty() {
                        f(&rows, &frames);
                    }
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        drop(rx);
        let _ = reader.join();
        result.map(|()| n)
    }

    /// Fold the newest `newest` stored records matching `agg`'s selection
    /// (every one with `None`) into it, from the packed paths: what the
    /// collector's pages show. The percentile band applies among the
    /// records folded. Returns how many records match the selection (before
    /// the band) and how many were folded, or `None` for a store that
    /// predates the profile tables (schema version 4), opened read-only.
    ///
    /// # Errors
    ///
    /// As [`fold_into`](Self::fold_into).
    pub fn fold_newest_into(
        &self,
        agg: &mut Aggregator,
        newest: Option<u64>,
        batch: usize,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        if self.version < PATHS_VERSION {
            return Ok(None);
        }
        let query = StoreQuery::from_selection(agg.selection());
        let (matching, after) = paths::count_newest(&self.conn, &query, self.id_index(), newest)
            .map_err(self.sqlite("find the newest records"))?;
        let folded = self.fold_packed_after(agg, &query, after, batch, None, &mut |_| {})?;
        Ok(Some((matching, folded)))
    }

    /// Fold `query`'s packed rows with an id above `after` into `agg`,
    /// showing selected records to `mix` and each batch's size to
    /// `progress`; a path that does not decode is [`StoreError::Corrupt`].
    fn fold_packed_after(
        &self,
        agg: &mut Aggregator,
        query: &StoreQuery,
        after: i64,
        batch: usize,
        mut mix: Option<&mut EntryServices>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64, StoreError> {
        let mut failed = None;
        let n = self.for_each_packed_after(query, after, batch, |rows, frames| {
            progress(rows.len() as u64);
            if failed.is_none()
                && let Err(e) = agg.push_packed(rows, frames, mix.as_deref_mut())
            {
                failed = Some(e);
            }
        })?;
        match failed {
            Some(e) => Err(StoreError::Corrupt {
                path: self.path.clone(),
                id: e.id,
                reason: e.reason,
            }),
            None => Ok(n),
        }
    }

    /// Fold the stored records that `agg`'s selection keeps into it (the
    /// one read `cpt profile --store` and the collector's `GET /profile`
    /// share): from the packed paths ([`Store::for_each_packed`]), or from
    /// the JSON of a store that predates them. Selected records are shown to
    /// `mix` when given. Returns the records read.
    ///
    /// # Errors
    ///
    /// As [`Store::query`], or a packed path that does not decode
    /// ([`StoreError::Corrupt`]).
    pub fn fold_into(
        &self,
        agg: &mut Aggregator,
        batch: usize,
        mix: Option<&mut EntryServices>,
    ) -> Result<u64, StoreError> {
        self.fold_into_reporting(agg, batch, mix, &mut |_| {})
    }

    /// [`fold_into`](Self::fold_into), telling `progress` how many records
    /// each batch held as it is folded (for a progress bar).
    ///
    /// # Errors
    ///
    /// As [`fold_into`](Self::fold_into).
    pub fn fold_into_reporting(
        &self,
        agg: &mut Aggregator,
        batch: usize,
        mut mix: Option<&mut EntryServices>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64, StoreError> {
        let sel = agg.selection().clone();
        if self.version >= PATHS_VERSION {
            let query = StoreQuery::from_selection(&sel);
            return self.fold_packed_after(agg, &query, 0, batch, mix, progress);
        }
        self.for_each_batch(&sel, batch, |records| {
            progress(records.len() as u64);
            if let Some(m) = mix.as_deref_mut() {
                for r in records.iter().filter(|r| sel.matches(r)) {
                    m.observe(r);
                }
            }
            agg.push_batch(records);
        })
    }

    /// Stream the records matching `query`, oldest insert first.
    ///
    /// The query runs on a reader thread with its own read-only connection
    /// and a consistent snapshot; at most a small fixed number of records
    /// are buffered. Dropping the iterator stops the reader.
    ///
    /// # Errors
    ///
    /// When the query cannot be prepared; later failures (including a
    /// stored record that no longer parses) are items of the iterator.
    pub fn query(&self, query: &StoreQuery) -> Result<Records, StoreError> {
        if query.by_id() && self.version < ID_INDEX_VERSION {
            return Err(StoreError::NoIdIndex {
                path: self.path.clone(),
                found: self.version,
            });
        }
        let (sql, params) = query.sql(true, self.id_index());
        // Prepare here so a bad query fails now, not on the first item.
        self.conn
            .prepare(&sql)
            .map_err(self.sqlite("prepare query"))?;
        let path = self.path.clone();
        let limit = query.limit;
        let (tx, rx) = mpsc::sync_channel(READ_AHEAD);
        let reader = thread::Builder::new()
            .name("cpt-store-reader".into())
            .spawn(move || read_rows(&path, &sql, params, 0, limit, &tx))
            .map_err(|e| StoreError::Sqlite {
                path: self.path.clone(),
                context: "start reader thread",
                source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
            })?;
        Ok(Records {
            rx,
            _reader: reader,
        })
    }
}

mod summary;
pub use summary::EndpointSummary;
#[cfg(test)]
mod tests;
