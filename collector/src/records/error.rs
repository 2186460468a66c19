//! Why an input cannot be read, and the magic bytes inputs are recognised by.

use std::io;
use std::path::PathBuf;

use crate::ingest::LineError;

/// The first bytes of every gzip stream.
pub const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// The first 16 bytes of every SQLite 3 database file.
pub const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";
/// The first 4 bytes of every Parquet file.
pub const PARQUET_MAGIC: &[u8; 4] = b"PAR1";

/// Why an input cannot be read (or, under `strict`, why it is rejected).
///
/// The messages name the file and say what to do; they include their cause,
/// so print them with `Display` alone.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// The path cannot be opened (missing, a directory, no permission).
    #[error("cannot open {}: {error}", path.display())]
    Open {
        /// The path.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// A SQLite store was given where a JSON Lines file was expected.
    #[error(
        "{} is a cpt store (a SQLite database), not a JSON Lines or trace file: read it with \
         --store {} (cpt profile, flame, folded, histogram, diff)",
        path.display(),
        path.display()
    )]
    IsStore {
        /// The path.
        path: PathBuf,
    },
    /// The path given as a store does not exist.
    #[error(
        "store {} does not exist (`cpt serve` and `cpt import` create one; check the path)",
        path.display()
    )]
    StoreMissing {
        /// The path.
        path: PathBuf,
    },
    /// The path given as a store is not a SQLite database.
    #[error("{} is not a cpt store (no SQLite header: {found})", path.display())]
    NotAStore {
        /// The path.
        path: PathBuf,
        /// What the file looks like and what to do with it.
        found: String,
    },
    /// A file given as a profile is not one.
    #[error("{} is not a profile written by cpt profile ({found})", path.display())]
    NotAProfile {
        /// The path.
        path: PathBuf,
        /// What the file is instead, and what to do.
        found: String,
    },
    /// A bad line, under [`ReadOptions::strict`](super::input::ReadOptions::strict).
    #[error("{}:{line}: {error} (--strict)", path.display())]
    BadLine {
        /// The input.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong with it.
        error: LineError,
    },
    /// The gzip stream breaks off, under [`ReadOptions::strict`](super::input::ReadOptions::strict).
    #[error(
        "{}: the gzip stream breaks off after line {line} ({error}): the file is truncated or corrupt (--strict)",
        path.display()
    )]
    Truncated {
        /// The input.
        path: PathBuf,
        /// Complete lines read before the break.
        line: u64,
        /// The decompressor's error.
        error: io::Error,
    },
    /// A Parquet file was given where a JSON Lines or trace file was expected.
    #[error(
        "{} is a Parquet file, not a JSON Lines or trace file: cpt profile, flame, folded, \
         histogram, diff, show and import read it (a file or a directory of them)",
        path.display()
    )]
    IsParquet {
        /// The path.
        path: PathBuf,
    },
    /// A Parquet input, but this cpt was built without the `parquet` feature.
    #[error(
        "{}: a Parquet file or directory, and this cpt was built without the `parquet` feature \
         (rebuild with it, or give JSON Lines)",
        path.display()
    )]
    NoParquet {
        /// The path.
        path: PathBuf,
    },
    /// A directory given as input holds no Parquet file.
    #[error(
        "{} is a directory without record files (hidden, `_*` and `*.tmp` files are skipped): \
         give the directory `cpt serve --parquet-dir` or `cpt export --parquet-dir` wrote, \
         or JSON Lines files",
        path.display()
    )]
    EmptyDir {
        /// The path.
        path: PathBuf,
    },
    /// A file in a directory of Parquet files is not Parquet.
    #[error(
        "{} is not a Parquet file ({found}): a directory is read as Parquet files; move the \
         file out, or give JSON Lines files by name",
        path.display()
    )]
    NotParquet {
        /// The file.
        path: PathBuf,
        /// What it looks like.
        found: String,
    },
    /// A Parquet file of another schema.
    #[error(
        "{}: not a cpt records file ({found}, expected cpt.records.v1); write it with \
         `cpt export --parquet-dir` (see docs/src/reference/parquet.md)",
        path.display()
    )]
    NotCptParquet {
        /// The file.
        path: PathBuf,
        /// What was found instead.
        found: String,
    },
    /// A Parquet file that is truncated or corrupt.
    #[error(
        "{}: cannot read this Parquet file: {error}; nothing was read from it. Move it out of \
         the directory (or restore it from where it came) and run again",
        path.display()
    )]
    BadParquet {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: String,
    },
    /// Reading failed (not a gzip problem: an I/O error).
    #[error("{}:{line}: cannot read: {error}", path.display())]
    Read {
        /// The input.
        path: PathBuf,
        /// The line being read.
        line: u64,
        /// Why.
        error: io::Error,
    },
}
