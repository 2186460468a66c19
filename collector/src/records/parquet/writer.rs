//! Writing records as Hive-partitioned Parquet files.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use cpt_sdk::record::Record;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use super::batch::batch_of;
use super::{
    BATCH_ROWS, DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_OPEN_FILES, MIXED_PARTITION, ParquetError,
    SCHEMA_KEY, SCHEMA_VERSION, schema,
};

/// The partition a record goes to: the UTC hour it started in, or the one
/// partition of records of many hours.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Partition {
    /// `date=YYYY-MM-DD/hour=HH`.
    Hour(String, u8),
    /// [`MIXED_PARTITION`].
    Mixed,
}

impl Partition {
    /// Its directory under `root`, and the parent directory in it.
    fn dirs(&self, root: &Path) -> (PathBuf, PathBuf) {
        let date = match self {
            Partition::Hour(date, _) => root.join(format!("date={date}")),
            Partition::Mixed => root.join(MIXED_PARTITION.0),
        };
        let hour = match self {
            Partition::Hour(_, hour) => date.join(format!("hour={hour:02}")),
            Partition::Mixed => date.join(MIXED_PARTITION.1),
        };
        (date, hour)
    }
}

/// The `date=YYYY-MM-DD/hour=HH` partition of a time (ns since the epoch, UTC).
pub fn partition_of(unix_nanos: u64) -> (String, u8) {
    let secs = unix_nanos / 1_000_000_000;
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX);
    let hour = ((secs % 86_400) / 3600) as u8;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (format!("{y:04}-{m:02}-{d:02}"), hour)
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

static FILE_SEQ: AtomicU64 = AtomicU64::new(0);

/// A file name no other writer picks: time, process, a per-process sequence
/// number and a random word (several collectors may share one directory).
fn unique() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now_nanos());
    format!(
        "{:x}-{}-{}-{:08x}",
        now_nanos(),
        std::process::id(),
        FILE_SEQ.fetch_add(1, Ordering::Relaxed),
        h.finish() as u32
    )
}

fn sync_dir(dir: &Path) -> Result<(), ParquetError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|error| ParquetError::Io {
            path: dir.to_path_buf(),
            error,
        })
}

struct OpenFile {
    tmp: PathBuf,
    done: PathBuf,
    writer: ArrowWriter<File>,
    rows: u64,
    /// When it was last written to, in writes of this writer.
    last_write: u64,
}

/// Writes records into `DIR/date=YYYY-MM-DD/hour=HH/part-<unique>.parquet`,
/// partitioned by each record's start time (or the time it is written when
/// it has none), in UTC.
///
/// Files stay open (as hidden `.part-*.parquet.tmp`) until
/// [`finish`](Self::finish), or until they pass the size bound, when they are
/// finished and a new one is started. At most
/// [`with_max_open_files`](Self::with_max_open_files) are open at once: a
/// partition that needs a file beyond that finishes the file written to
/// least recently. With
/// [`with_max_hour_partitions`](Self::with_max_hour_partitions), the records
/// of one write go to a bounded number of partitions (and so of files).
/// Finishing a file closes its Parquet
/// footer, fsyncs it, renames it to its final name and fsyncs the directory:
/// after `finish` returns, its records survive a crash (`kill -9`, power
/// loss) and no reader ever sees a partial file. Dropping the writer without
/// `finish` deletes the unfinished files.
pub struct PartitionedWriter {
    dir: PathBuf,
    max_file_bytes: u64,
    max_open_files: usize,
    max_hour_partitions: Option<usize>,
    props: WriterProperties,
    open: BTreeMap<Partition, OpenFile>,
    finished: Vec<PathBuf>,
    /// Partition directories created since the last successful `finish`
    /// (parents first), removed by `discard` when left empty.
    created: Vec<PathBuf>,
    writes: u64,
}

impl std::fmt::Debug for PartitionedWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionedWriter")
            .field("dir", &self.dir)
            .field("max_file_bytes", &self.max_file_bytes)
            .field("open", &self.open.len())
            .finish_non_exhaustive()
    }
}

/// The writer properties of every cpt Parquet file: Snappy (fast, and what
/// Spark reads by default), dictionary encoding (frames and services repeat
/// on every row), the `cpt.schema` metadata entry.
pub fn writer_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(128 * 1024))
        .set_key_value_metadata(Some(vec![KeyValue::new(
            SCHEMA_KEY.to_owned(),
            SCHEMA_VERSION.to_owned(),
        )]))
        .set_created_by(format!("cpt {}", env!("CARGO_PKG_VERSION")))
        .build()
}

impl PartitionedWriter {
    /// A writer into `dir` (created if missing).
    ///
    /// # Errors
    ///
    /// `dir` cannot be created or is not a directory.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, ParquetError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|error| ParquetError::Io {
            path: dir.clone(),
            error,
        })?;
        Ok(PartitionedWriter {
            dir,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_open_files: DEFAULT_MAX_OPEN_FILES,
            max_hour_partitions: None,
            props: writer_properties(),
            open: BTreeMap::new(),
            finished: Vec::new(),
            created: Vec::new(),
            writes: 0,
        })
    }

    /// Keep at most `n` files open (at least 1): a partition that needs a
    /// file beyond that finishes the open file written to least recently
    /// (default [`DEFAULT_MAX_OPEN_FILES`]).
    #[must_use]
    pub fn with_max_open_files(mut self, n: usize) -> Self {
        self.max_open_files = n.max(1);
        self
    }

    /// Write the records of one [`write`](Self::write) into at most `n`
    /// hour partitions (at least 1): the `n` hours with the most records
    /// (the earlier hour on a tie) get their own partition, and the records
    /// of every other hour go to [`MIXED_PARTITION`], in one file per
    /// write. Without it (the default) every hour gets its partition.
    ///
    /// The files of one write are then at most `n + 1` (and more only past
    /// [`with_max_file_bytes`](Self::with_max_file_bytes)), however many
    /// hours its records started in.
    #[must_use]
    pub fn with_max_hour_partitions(mut self, n: usize) -> Self {
        self.max_hour_partitions = Some(n.max(1));
        self
    }

    /// Finish a file once its encoded size passes `bytes` (at least one
    /// batch goes into every file).
    #[must_use]
    pub fn with_max_file_bytes(mut self, bytes: u64) -> Self {
        self.max_file_bytes = bytes.max(1);
        self
    }

    /// The directory written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether files are open (records written but not yet finished).
    pub fn has_open_files(&self) -> bool {
        !self.open.is_empty()
    }

    /// Add records to the open file of their partition (opening one when
    /// needed), finishing files that pass the size bound.
    ///
    /// # Errors
    ///
    /// A directory or file cannot be created, or encoding fails.
    pub fn write(&mut self, records: &[Record]) -> Result<(), ParquetError> {
        self.write_refs(&records.iter().collect::<Vec<_>>())
    }

    /// [`write`](Self::write) for borrowed records.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write).
    pub fn write_refs(&mut self, records: &[&Record]) -> Result<(), ParquetError> {
        let now = now_nanos();
        let mut parts: BTreeMap<Partition, Vec<&Record>> = BTreeMap::new();
        let mut last: Option<(u64, Partition)> = None;
        for r in records.iter().copied() {
            let hour_start = r.start_unix_nanos.unwrap_or(now) / 3_600_000_000_000;
            let key = match &last {
                Some((h, k)) if *h == hour_start => k.clone(),
                _ => {
                    let (date, hour) = partition_of(r.start_unix_nanos.unwrap_or(now));
                    let k = Partition::Hour(date, hour);
                    last = Some((hour_start, k.clone()));
                    k
                }
            };
            parts.entry(key).or_default().push(r);
        }
        if let Some(max) = self.max_hour_partitions {
            parts = bound_partitions(parts, max);
        }
        for (key, recs) in parts {
            for chunk in recs.chunks(BATCH_ROWS) {
                let batch = batch_of(chunk)?;
                self.writes += 1;
                let writes = self.writes;
                let file = self.file(&key)?;
                file.last_write = writes;
                file.writer
                    .write(&batch)
                    .map_err(|error| ParquetError::Encode {
                        path: file.tmp.clone(),
                        error,
                    })?;
                file.rows += chunk.len() as u64;
                let size = (file.writer.bytes_written() + file.writer.in_progress_size()) as u64;
                if size >= self.max_file_bytes {
                    let f = self.open.remove(&key).expect("just used");
                    self.finished.push(finish_file(f)?);
                }
            }
        }
        Ok(())
    }

    /// Create `dir` if missing, noting it for [`discard`](Self::discard).
    fn create_dir(&mut self, dir: &Path) -> Result<bool, ParquetError> {
        if dir.is_dir() {
            return Ok(false);
        }
        match fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {
                return Ok(false);
            }
            Err(error) => {
                return Err(ParquetError::Io {
                    path: dir.to_path_buf(),
                    error,
                });
            }
        }
        self.created.push(dir.to_path_buf());
        Ok(true)
    }

    fn file(&mut self, key: &Partition) -> Result<&mut OpenFile, ParquetError> {
        if !self.open.contains_key(key) {
            if self.open.len() >= self.max_open_files {
                let oldest = self
                    .open
                    .iter()
                    .min_by_key(|(_, f)| f.last_write)
                    .map(|(k, _)| k.clone())
                    .expect("at least one file is open");
                let f = self.open.remove(&oldest).expect("just found");
                self.finished.push(finish_file(f)?);
            }
            let (date, part) = key.dirs(&self.dir);
            if !self.dir.is_dir() {
                fs::create_dir_all(&self.dir).map_err(|error| ParquetError::Io {
                    path: self.dir.clone(),
                    error,
                })?;
            }
            let new_date = self.create_dir(&date)?;
            if self.create_dir(&part)? {
                // The new directories' names must be durable too.
                sync_dir(&date)?;
                if new_date {
                    sync_dir(&self.dir)?;
                }
            }
            let name = unique();
            let tmp = part.join(format!(".part-{name}.parquet.tmp"));
            let done = part.join(format!("part-{name}.parquet"));
            let f = File::create(&tmp).map_err(|error| ParquetError::Io {
                path: tmp.clone(),
                error,
            })?;
            let writer =
                ArrowWriter::try_new(f, schema(), Some(self.props.clone())).map_err(|error| {
                    ParquetError::Encode {
                        path: tmp.clone(),
                        error,
                    }
                })?;
            self.open.insert(
                key.clone(),
                OpenFile {
                    tmp,
                    done,
                    writer,
                    rows: 0,
                    last_write: 0,
                },
            );
        }
        Ok(self.open.get_mut(key).expect("inserted above"))
    }

    /// Finish every open file (footer, fsync, rename, fsync of the
    /// directory) and return the files finished since the last call, in
    /// the order they were finished.
    ///
    /// # Errors
    ///
    /// Encoding, fsync or rename fails; the files not finished are deleted
    /// (their records were never reported written), and those finished since
    /// the last successful call are kept for [`discard`](Self::discard).
    pub fn finish(&mut self) -> Result<Vec<PathBuf>, ParquetError> {
        let open = std::mem::take(&mut self.open);
        let mut result = Ok(());
        for (_, f) in open {
            if result.is_ok() {
                match finish_file(f) {
                    Ok(p) => self.finished.push(p),
                    Err(e) => result = Err(e),
                }
            } else {
                let _ = fs::remove_file(&f.tmp);
            }
        }
        result?;
        self.created.clear();
        Ok(std::mem::take(&mut self.finished))
    }
}

/// `parts` with at most `max` hour partitions: the `max` with the most
/// records (the earlier hour on a tie) keep theirs, and the records of the
/// others go to [`Partition::Mixed`], in the order of their hours.
fn bound_partitions(
    parts: BTreeMap<Partition, Vec<&Record>>,
    max: usize,
) -> BTreeMap<Partition, Vec<&Record>> {
    if parts.len() <= max {
        return parts;
    }
    let mut by_size: Vec<(Partition, Vec<&Record>)> = parts.into_iter().collect();
    // Stable: the earlier hour first among equals.
    by_size.sort_by_key(|(_, recs)| std::cmp::Reverse(recs.len()));
    let mut rest = by_size.split_off(max);
    rest.sort_by(|a, b| a.0.cmp(&b.0));
    let mut kept: BTreeMap<Partition, Vec<&Record>> = by_size.into_iter().collect();
    let mixed = kept.entry(Partition::Mixed).or_default();
    for (_, recs) in rest {
        mixed.extend(recs);
    }
    kept
}

fn finish_file(f: OpenFile) -> Result<PathBuf, ParquetError> {
    let OpenFile {
        tmp, done, writer, ..
    } = f;
    let fail = |tmp: &Path, e: ParquetError| {
        let _ = fs::remove_file(tmp);
        e
    };
    let file = writer.into_inner().map_err(|error| {
        fail(
            &tmp,
            ParquetError::Encode {
                path: tmp.clone(),
                error,
            },
        )
    })?;
    file.sync_all().map_err(|error| {
        fail(
            &tmp,
            ParquetError::Io {
                path: tmp.clone(),
                error,
            },
        )
    })?;
    drop(file);
    fs::rename(&tmp, &done).map_err(|error| {
        fail(
            &tmp,
            ParquetError::Io {
                path: done.clone(),
                error,
            },
        )
    })?;
    sync_dir(done.parent().expect("a partition directory"))?;
    Ok(done)
}

impl PartitionedWriter {
    /// Undo everything since the last successful [`finish`](Self::finish):
    /// delete the open files and the files finished since (their records
    /// were never reported written). Returns how many finished files were
    /// deleted.
    pub fn discard(&mut self) -> usize {
        for (_, f) in std::mem::take(&mut self.open) {
            drop(f.writer);
            let _ = fs::remove_file(&f.tmp);
        }
        let done = std::mem::take(&mut self.finished);
        for f in &done {
            let _ = fs::remove_file(f);
        }
        if let Some(d) = done.first().and_then(|f| f.parent()) {
            let _ = sync_dir(d);
        }
        // Children before parents; a directory another file is in stays.
        for d in std::mem::take(&mut self.created).iter().rev() {
            let _ = fs::remove_dir(d);
        }
        done.len()
    }
}

impl Drop for PartitionedWriter {
    fn drop(&mut self) {
        for f in self.open.values() {
            let _ = fs::remove_file(&f.tmp);
        }
    }
}
