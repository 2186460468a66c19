//! Records as Parquet: schema `cpt.records.v1` (see the book's `reference/parquet.md`).
//!
//! One row per [`Record`](cpt_sdk::Record); the critical path is a list of segments, each a
//! list of fully spelled-out frames (no JSON Lines abbreviation), so engines
//! such as Apache Spark can explode and fold it without knowing cpt.
//!
//! - [`schema`], [`to_batch`], [`from_batch`]: Record ⇄ Arrow [`RecordBatch`](arrow_array::RecordBatch).
//! - [`PartitionedWriter`]: records into the Hive-partitioned layout
//!   `DIR/date=YYYY-MM-DD/hour=HH/part-<unique>.parquet` (and, for a write
//!   bounded to a few hours, the others' records in
//!   `DIR/date=mixed/hour=mixed/`: [`MIXED_PARTITION`]). A file is written as
//!   `.part-<unique>.parquet.tmp` (hidden: Spark and cpt skip it), fsynced,
//!   renamed, and its directory fsynced: a reader sees a whole file or none.
//! - [`ParquetRecords`]: the records of a file or a directory tree of files,
//!   each checked for the schema before anything is read.
//! - [`ScanPlan`]: the same files as units of work (row ranges of row
//!   groups) for readers that fold without building records: partitions and
//!   row groups outside a time range skipped by their names and statistics,
//!   only the columns a selection needs, frame strings as dictionaries.
//!
//! Files: `batch` (Record ⇄ Arrow), `files` (finding and checking files,
//! [`ParquetRecords`]), `scan` ([`ScanPlan`]), `writer`
//! ([`PartitionedWriter`]).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};

mod batch;
mod files;
mod scan;
mod writer;

pub use batch::{from_batch, from_batch_parallel, from_batch_parallel_in, to_batch};
pub use files::{ParquetRecords, is_parquet_file};
#[cfg(feature = "server")]
pub(crate) use scan::partition_hours;
pub use scan::{ScanColumns, ScanPlan, ScanUnit, UNIT_ROWS};
pub use writer::{PartitionedWriter, partition_of, writer_properties};

/// The key of the file metadata entry naming the schema.
pub const SCHEMA_KEY: &str = "cpt.schema";
/// The schema this module writes and reads.
pub const SCHEMA_VERSION: &str = "cpt.records.v1";
/// The 4 bytes every Parquet file starts (and ends) with.
pub use super::error::PARQUET_MAGIC;
/// Rows per Arrow batch when reading and writing.
pub const BATCH_ROWS: usize = 8 * 1024;
/// A file is finished once its encoded size passes this (see
/// [`PartitionedWriter::with_max_file_bytes`]).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 128 << 20;
/// Files a [`PartitionedWriter`] keeps open at once unless told otherwise
/// ([`PartitionedWriter::with_max_open_files`]).
pub const DEFAULT_MAX_OPEN_FILES: usize = 32;
/// The partition of records of many hours (`date=mixed/hour=mixed`), as
/// its two directory names: a write bounded by
/// [`PartitionedWriter::with_max_hour_partitions`] puts the records of the
/// hours beyond the bound there. Its name keeps the Hive layout's two
/// levels (`date=`, `hour=`), so readers that discover partitions from
/// directory names see the same columns; cpt and the Spark job read its
/// files like any other and select by each record's start time.
pub const MIXED_PARTITION: (&str, &str) = ("date=mixed", "hour=mixed");

pub(crate) const ACCOUNTING: [&str; 7] = [
    "network_ns",
    "overcount_ns",
    "blind_spot_ns",
    "unattributed_ns",
    "queueing_ns",
    "truncated_ns",
    "clock_skew_ns",
];

pub(crate) fn frame_fields() -> Fields {
    Fields::from(vec![
        Field::new("service", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("file", DataType::Utf8, true),
        Field::new("line", DataType::Int64, true),
    ])
}

pub(crate) fn frame_item() -> FieldRef {
    Arc::new(Field::new(
        "element",
        DataType::Struct(frame_fields()),
        false,
    ))
}

pub(crate) fn segment_fields() -> Fields {
    Fields::from(vec![
        Field::new("stack", DataType::List(frame_item()), false),
        Field::new("ns", DataType::Int64, false),
        Field::new("kind", DataType::Utf8, false),
    ])
}

pub(crate) fn segment_item() -> FieldRef {
    Arc::new(Field::new(
        "element",
        DataType::Struct(segment_fields()),
        false,
    ))
}

pub(crate) fn label_fields() -> Fields {
    Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, false),
    ])
}

pub(crate) fn label_entries() -> FieldRef {
    Arc::new(Field::new(
        "key_value",
        DataType::Struct(label_fields()),
        false,
    ))
}

/// The Arrow schema of `cpt.records.v1`.
pub fn schema() -> SchemaRef {
    let mut fields = vec![
        Field::new("service", DataType::Utf8, false),
        Field::new("endpoint", DataType::Utf8, true),
        Field::new("trigger", DataType::Utf8, false),
        Field::new("latency_ns", DataType::Int64, false),
        Field::new("start_unix_nanos", DataType::Int64, true),
        Field::new("request_id", DataType::Utf8, true),
        Field::new("trace_id", DataType::Utf8, true),
        Field::new("labels", DataType::Map(label_entries(), false), false),
        Field::new("path", DataType::List(segment_item()), false),
    ];
    fields.extend(
        ACCOUNTING
            .iter()
            .map(|n| Field::new(*n, DataType::Int64, false)),
    );
    Arc::new(Schema::new(fields))
}

/// Why a Parquet file cannot be written or a batch not converted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParquetError {
    /// A file or directory operation failed.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// The Parquet encoder failed.
    #[error("{}: {error}", path.display())]
    Encode {
        /// The file being written.
        path: PathBuf,
        /// The encoder's message.
        error: parquet::errors::ParquetError,
    },
    /// A row breaks the schema's rules, or a batch is too large.
    #[error("{0}")]
    Other(String),
}

#[cfg(test)]
mod tests;
