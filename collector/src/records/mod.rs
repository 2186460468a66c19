//! Where records come from and which of them a question is about: one
//! reader for every place that takes records or traces from a path (`cpt
//! profile` and its siblings, `cpt import`, `cpt traces`), and the
//! [`Selection`](selection::Selection) every profile, diff and store query
//! applies (service, endpoint, time range, labels, trigger, percentile
//! band).
//!
//! [`input`] opens a path (`-` is stdin; gzip is recognised by its magic
//! bytes, not by the file name), refuses a SQLite store given where a file
//! was expected (it says to pass it as the store instead), and reads JSON
//! Lines in parallel batches. Bad lines (not UTF-8, not a record) are skipped
//! and reported as [`Warning`]s with their `FILE:LINE`; a gzip stream that is
//! cut off keeps the records read before the cut and warns about the lost
//! tail. With [`ReadOptions::strict`] both are errors instead.
//!
//! A `.parquet` file (recognised by its magic `PAR1`) or a directory of them
//! is read as records of schema `cpt.records.v1` (feature `parquet`, see
//! `parquet` and docs/src/reference/parquet.md), by the same [`RecordReader`].
//!
//! [`EntryServices`] notices a selection that mixes several entry services,
//! in particular records an internal service made of its own traffic.
//!
//! Records are also read from a store (`server::store`, with the `server`
//! feature) and made from imported traces (`traces`). The module is
//! independent of the command line (no clap, no anyhow), so a server reads
//! files the same way.

pub mod blocks;
mod error;
pub mod input;
mod mix;
pub mod packed;
#[cfg(feature = "parquet")]
pub mod parquet;
pub mod query;
pub mod selection;

pub use error::{GZIP_MAGIC, PARQUET_MAGIC, SQLITE_MAGIC};
pub use input::{
    InputError, Opened, ReadOptions, ReadStats, RecordReader, Warning, WarningKind, check_store,
    is_parquet_input, open, read_to_end,
};
pub use mix::EntryServices;
