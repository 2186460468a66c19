//! Why a store operation failed.

use std::path::PathBuf;

use super::SCHEMA_VERSION;

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
    /// The selection needs raw records that retention deleted, and the
    /// roll-ups cannot stand in for them (a label or percentile filter, a
    /// trigger other than sampled, or a range not aligned to the roll-ups'
    /// hours or days).
    #[error("{0}")]
    BeyondRetention(super::RetentionGap),
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
