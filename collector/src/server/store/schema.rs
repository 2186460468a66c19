//! The schema: its tables, and the upgrade of an older store when it is
//! opened for writing (see the parent module's docs, version by version).

use rusqlite::TransactionBehavior;

use super::paths::{self, FrameIds, PATH_LATENCY_VERSION, PATHS_SCHEMA, PATHS_VERSION};
use super::rollup::ROLLUP_SCHEMA;
use super::{SCHEMA_VERSION, Store, StoreError};

/// The first version with the `request_id` / `trace_id` columns and indexes.
pub(super) const ID_INDEX_VERSION: i64 = 2;

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
CREATE TABLE IF NOT EXISTS otlp_spans (
    trace_id TEXT NOT NULL,
    spans    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS otlp_spans_by_trace ON otlp_spans (trace_id);
CREATE TABLE IF NOT EXISTS batches (
    id                TEXT PRIMARY KEY,
    records           INTEGER NOT NULL,
    committed_unix_ms INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Batch ids are forgotten by age once retention runs (version 6).
const BATCHES_BY_TIME: &str =
    "CREATE INDEX IF NOT EXISTS batches_by_time ON batches (committed_unix_ms);";

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
pub(super) const PAGE_SIZE: i64 = 16_384;

/// `PRAGMA auto_vacuum`'s value for `INCREMENTAL`: a store created with it
/// keeps a map of its pages, so that free pages can be given back to the
/// disk a few at a time (`PRAGMA incremental_vacuum`) while the writer
/// goes on, which `--max-store-bytes` needs to bring a file over its share
/// back under it. SQLite takes the mode only before the first table is
/// created; an older store keeps `NONE` until a `VACUUM` rebuilds it.
pub(super) const AUTO_VACUUM_INCREMENTAL: i64 = 2;

/// The first version whose id indexes lead with the id bucket.
pub(super) const BUCKETED_ID_VERSION: i64 = 5;

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

impl Store {
    pub(super) fn check_schema(&mut self, create: bool) -> Result<(), StoreError> {
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
                "{SCHEMA} {ID_INDEXES} {PATHS_SCHEMA} {ROLLUP_SCHEMA} {BATCHES_BY_TIME} \
                 PRAGMA user_version = {SCHEMA_VERSION};"
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
}
