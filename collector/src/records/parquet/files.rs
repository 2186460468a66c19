//! Finding the Parquet files of an input and checking them.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use arrow_array::RecordBatchReader;
use cpt_sdk::record::Record;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};

use super::batch::from_batch_parallel;
use super::{PARQUET_MAGIC, SCHEMA_KEY, SCHEMA_VERSION, schema};
use crate::records::error::InputError;

/// `true` when `path` is a file whose first bytes are Parquet's magic.
pub fn is_parquet_file(path: &Path) -> bool {
    let mut buf = [0u8; 4];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_ok()
        && &buf == PARQUET_MAGIC
}

/// Names readers skip in a directory: hidden files (a writer's unfinished
/// `.part-*.parquet.tmp`), Hadoop's `_SUCCESS` / `_temporary`, and `*.tmp`.
pub(super) fn skipped(name: &str) -> bool {
    name.starts_with('.') || name.starts_with('_') || name.ends_with(".tmp")
}

/// The files a directory of Parquet files holds: recursively, sorted, without
/// the [skipped](skipped) names.
pub(super) fn dir_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), InputError> {
    let open_err = |error| InputError::Open {
        path: dir.to_path_buf(),
        error,
    };
    let mut entries = fs::read_dir(dir)
        .map_err(open_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(open_err)?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name();
        if skipped(&name.to_string_lossy()) {
            continue;
        }
        let path = e.path();
        if fs::metadata(&path).map_err(open_err)?.is_dir() {
            dir_files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// Check a Parquet file's footer and schema; the reader over it.
fn open_checked(path: &Path, batch_rows: usize) -> Result<ParquetRecordBatchReader, InputError> {
    let (f, meta) = checked_metadata(path, ArrowReaderOptions::new())?;
    ParquetRecordBatchReaderBuilder::new_with_metadata(f, meta)
        .with_batch_size(batch_rows.max(1))
        .build()
        .map_err(|e| InputError::BadParquet {
            path: path.to_path_buf(),
            error: e.to_string(),
        })
}

/// Check a Parquet file's magic, footer, `cpt.schema` entry and columns;
/// the open file and its metadata (read with `options`).
pub(super) fn checked_metadata(
    path: &Path,
    options: ArrowReaderOptions,
) -> Result<(File, ArrowReaderMetadata), InputError> {
    let mut f = File::open(path).map_err(|error| InputError::Open {
        path: path.to_path_buf(),
        error,
    })?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut head = [0u8; 4];
    let mut tail = [0u8; 4];
    let magic_ok = f.read_exact(&mut head).is_ok() && &head == PARQUET_MAGIC;
    if !magic_ok {
        return Err(InputError::NotParquet {
            path: path.to_path_buf(),
            found: if len == 0 {
                "the file is empty".into()
            } else {
                "it does not start with Parquet's magic PAR1".into()
            },
        });
    }
    let tail_ok = len >= 12
        && f.seek(SeekFrom::End(-4)).is_ok()
        && f.read_exact(&mut tail).is_ok()
        && &tail == PARQUET_MAGIC;
    if !tail_ok {
        return Err(InputError::BadParquet {
            path: path.to_path_buf(),
            error: format!(
                "no Parquet footer after {len} bytes: the file is truncated (a copy or download \
                 cut short, or a writer that did not finish)"
            ),
        });
    }
    f.seek(SeekFrom::Start(0))
        .map_err(|error| InputError::Open {
            path: path.to_path_buf(),
            error,
        })?;
    let builder = ArrowReaderMetadata::load(&f, options).map_err(|e| InputError::BadParquet {
        path: path.to_path_buf(),
        error: e.to_string(),
    })?;
    let found = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|kv| kv.key == SCHEMA_KEY))
        .and_then(|kv| kv.value.clone());
    if found.as_deref() != Some(SCHEMA_VERSION) {
        return Err(InputError::NotCptParquet {
            path: path.to_path_buf(),
            found: match found {
                Some(s) => format!("schema {s}"),
                None => format!("no {SCHEMA_KEY} entry in its metadata"),
            },
        });
    }
    let expected = schema();
    let got = builder.schema();
    for want in expected.fields() {
        match got.field_with_name(want.name()) {
            Ok(f) if f.data_type() == want.data_type() => {}
            Ok(f) => {
                return Err(InputError::NotCptParquet {
                    path: path.to_path_buf(),
                    found: format!(
                        "column {} is {} instead of {}",
                        want.name(),
                        f.data_type(),
                        want.data_type()
                    ),
                });
            }
            Err(_) => {
                return Err(InputError::NotCptParquet {
                    path: path.to_path_buf(),
                    found: format!("it has no column {}", want.name()),
                });
            }
        }
    }
    Ok((f, builder))
}

/// The Parquet files of an input: the file itself, or every file under a
/// directory (recursively, in name order, without hidden and `*.tmp` files).
///
/// # Errors
///
/// The path cannot be read, or is a directory without files.
pub(super) fn input_files(path: &Path) -> Result<Vec<PathBuf>, InputError> {
    let is_dir = fs::metadata(path)
        .map_err(|error| InputError::Open {
            path: path.to_path_buf(),
            error,
        })?
        .is_dir();
    if is_dir {
        let mut files = Vec::new();
        dir_files(path, &mut files)?;
        if files.is_empty() {
            return Err(InputError::EmptyDir {
                path: path.to_path_buf(),
            });
        }
        Ok(files)
    } else {
        Ok(vec![path.to_path_buf()])
    }
}

/// The records of a Parquet file, or of every Parquet file under a
/// directory (recursively, in name order, skipping hidden and `*.tmp` files).
///
/// Every file's magic, footer and schema are checked when this is opened,
/// before any record is read, so a bad file in a directory fails the read
/// at once, naming the file.
pub struct ParquetRecords {
    files: Vec<PathBuf>,
    next: usize,
    current: Option<(PathBuf, ParquetRecordBatchReader)>,
    batch_rows: usize,
}

impl std::fmt::Debug for ParquetRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetRecords")
            .field("files", &self.files.len())
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl ParquetRecords {
    /// Open a Parquet file or a directory of them.
    ///
    /// # Errors
    ///
    /// [`InputError::EmptyDir`] for a directory without files,
    /// [`InputError::NotParquet`] for a file in it that is not Parquet,
    /// [`InputError::BadParquet`] for a truncated or corrupt file,
    /// [`InputError::NotCptParquet`] for a Parquet file of another schema.
    pub fn open(path: &Path, batch_rows: usize) -> Result<Self, InputError> {
        let files = input_files(path)?;
        for f in &files {
            open_checked(f, 1)?;
        }
        Ok(ParquetRecords {
            files,
            next: 0,
            current: None,
            batch_rows: batch_rows.max(1),
        })
    }

    /// The files read, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The next batch of records, or `None` after the last file.
    ///
    /// # Errors
    ///
    /// [`InputError::BadParquet`] when a file's data cannot be decoded or
    /// breaks the schema's rules (the message names file and row group).
    pub fn next_batch(&mut self) -> Result<Option<Vec<Record>>, InputError> {
        loop {
            if let Some((path, reader)) = &mut self.current {
                match reader.next() {
                    Some(Ok(batch)) => {
                        return from_batch_parallel(&batch).map(Some).map_err(|error| {
                            InputError::BadParquet {
                                path: path.clone(),
                                error,
                            }
                        });
                    }
                    Some(Err(e)) => {
                        return Err(InputError::BadParquet {
                            path: path.clone(),
                            error: e.to_string(),
                        });
                    }
                    None => self.current = None,
                }
            }
            let Some(path) = self.files.get(self.next).cloned() else {
                return Ok(None);
            };
            self.next += 1;
            let reader = open_checked(&path, self.batch_rows)?;
            debug_assert_eq!(reader.schema().fields().len(), schema().fields().len());
            self.current = Some((path, reader));
        }
    }
}
