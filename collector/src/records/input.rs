//! Opening input paths and reading JSON Lines records from them.
//!
//! - [`open`]: a path (`-` = stdin) as a buffered reader, gunzipped when the
//!   content starts with the gzip magic (whatever the file is called). A SQLite
//!   store is refused with a message that says to pass it as the store.
//! - [`RecordReader`]: the records of a JSON Lines input in batches, parsed in
//!   parallel. Bad lines are skipped with a [`Warning`] naming `FILE:LINE`; a
//!   gzip stream that breaks off keeps the records before the break and warns
//!   once. [`ReadOptions::strict`] turns both into an [`InputError`].
//! - [`check_store`]: a path given as a store exists and is a SQLite file.
//!
//! Reading a profile file with the same care is
//! [`profile::pprof::read_file`](crate::profile::pprof::read_file).

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use cpt_sdk::record::Record;
use flate2::read::MultiGzDecoder;
use rayon::prelude::*;

use crate::ingest::LineError;

pub use super::error::{GZIP_MAGIC, InputError, PARQUET_MAGIC, SQLITE_MAGIC};

/// An opened input.
pub struct Opened {
    /// The content (decompressed when `gzip`).
    pub reader: Box<dyn BufRead + Send>,
    /// The content was gzip.
    pub gzip: bool,
    /// The path as given (`-` for stdin).
    pub path: PathBuf,
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened")
            .field("gzip", &self.gzip)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Read up to `n` bytes (fewer only at the end of the input).
fn head(r: &mut dyn Read, n: usize) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(n);
    r.take(n as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Open `path` (`-` = stdin) for reading: gunzipped when its content starts
/// with the gzip magic, refused when it is a SQLite database.
///
/// # Errors
///
/// [`InputError::Open`] when the path cannot be opened or read,
/// [`InputError::IsStore`] for a SQLite file.
pub fn open(path: &Path) -> Result<Opened, InputError> {
    let open_err = |error| InputError::Open {
        path: path.to_path_buf(),
        error,
    };
    let mut raw: Box<dyn Read + Send> = if path == Path::new("-") {
        Box::new(io::stdin())
    } else {
        let f = File::open(path).map_err(open_err)?;
        if f.metadata().is_ok_and(|m| m.is_dir()) {
            return Err(open_err(io::Error::new(
                io::ErrorKind::IsADirectory,
                "is a directory",
            )));
        }
        Box::new(f)
    };
    let first = head(&mut raw, SQLITE_MAGIC.len()).map_err(open_err)?;
    if first.as_slice() == SQLITE_MAGIC {
        return Err(InputError::IsStore {
            path: path.to_path_buf(),
        });
    }
    if first.starts_with(PARQUET_MAGIC) {
        return Err(InputError::IsParquet {
            path: path.to_path_buf(),
        });
    }
    let gzip = first.starts_with(&GZIP_MAGIC);
    let whole = io::Cursor::new(first).chain(raw);
    let reader: Box<dyn BufRead + Send> = if gzip {
        Box::new(BufReader::with_capacity(
            1 << 16,
            MultiGzDecoder::new(whole),
        ))
    } else {
        Box::new(BufReader::with_capacity(1 << 16, whole))
    };
    Ok(Opened {
        reader,
        gzip,
        path: path.to_path_buf(),
    })
}

/// A directory, or a file that starts with Parquet's magic: an input read
/// as Parquet.
pub fn is_parquet_input(path: &Path) -> bool {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => true,
        Ok(_) => {
            let mut buf = [0u8; 4];
            File::open(path)
                .and_then(|mut f| f.read_exact(&mut buf))
                .is_ok()
                && &buf == PARQUET_MAGIC
        }
        Err(_) => false,
    }
}

/// Check that `path`, given as a store, exists and is a SQLite database.
///
/// # Errors
///
/// [`InputError::StoreMissing`], [`InputError::NotAStore`] (saying what the
/// file looks like), or [`InputError::Open`].
pub fn check_store(path: &Path) -> Result<(), InputError> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(InputError::StoreMissing {
                path: path.to_path_buf(),
            });
        }
        Err(error) => {
            return Err(InputError::Open {
                path: path.to_path_buf(),
                error,
            });
        }
    };
    let first = head(&mut f, SQLITE_MAGIC.len()).map_err(|error| InputError::Open {
        path: path.to_path_buf(),
        error,
    })?;
    if first.as_slice() == SQLITE_MAGIC {
        return Ok(());
    }
    let found = if first.is_empty() {
        "the file is empty".to_owned()
    } else if first.starts_with(&GZIP_MAGIC) {
        "it is gzip, e.g. records or a profile: give record files as inputs, without --store"
            .to_owned()
    } else if first.trim_ascii_start().starts_with(b"{") {
        "it holds JSON Lines records: give it as an input file, without --store".to_owned()
    } else {
        "give the file `cpt serve --store` or `cpt import --store` wrote".to_owned()
    };
    Err(InputError::NotAStore {
        path: path.to_path_buf(),
        found,
    })
}

/// How to read JSON Lines.
#[derive(Clone, Copy, Debug)]
pub struct ReadOptions {
    /// A bad line or a broken gzip tail is an error instead of a warning.
    pub strict: bool,
    /// Lines parsed per parallel batch (at least 1).
    pub batch_lines: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            strict: false,
            batch_lines: 8 * 1024,
        }
    }
}

/// What a [`RecordReader`] has read so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Records returned.
    pub records: u64,
    /// Lines skipped as bad.
    pub bad_lines: u64,
    /// The gzip stream broke off (the rest of the input is lost).
    pub truncated: bool,
}

/// What a warning is about.
#[derive(Debug)]
#[non_exhaustive]
pub enum WarningKind {
    /// The line was skipped.
    BadLine(LineError),
    /// The gzip stream breaks off after the line; the rest is lost.
    Truncated(io::Error),
}

/// Something skipped while reading (an error under [`ReadOptions::strict`]).
#[derive(Debug)]
pub struct Warning {
    /// The input.
    pub path: PathBuf,
    /// The bad line, or the last complete line before a break.
    pub line: u64,
    /// What happened.
    pub kind: WarningKind,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            WarningKind::BadLine(e) => {
                write!(f, "{}:{}: skipped: {e}", self.path.display(), self.line)
            }
            WarningKind::Truncated(e) => write!(
                f,
                "{}: the gzip stream breaks off after line {} ({e}); kept the records before it, \
                 the rest of the file is lost (truncated download or copy?)",
                self.path.display(),
                self.line
            ),
        }
    }
}

/// The records of a JSON Lines input, in batches parsed in parallel.
///
/// Blank lines are ignored. A line that is not UTF-8 or not a record is
/// skipped with a [`Warning`]; a gzip stream that breaks off ends the input
/// with a [`Warning`] and keeps every complete line before it. Under
/// [`ReadOptions::strict`] both are an [`InputError`] instead.
pub struct RecordReader {
    input: Opened,
    #[cfg(feature = "parquet")]
    parquet: Option<crate::records::parquet::ParquetRecords>,
    opts: ReadOptions,
    line: u64,
    done: bool,
    stats: ReadStats,
}

impl fmt::Debug for RecordReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordReader")
            .field("input", &self.input)
            .field("line", &self.line)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl RecordReader {
    /// [`open`] `path` and read it; a Parquet file (recognised by its magic
    /// `PAR1`) or a directory (read as Parquet files, recursively) is read
    /// as Parquet records of schema `cpt.records.v1`.
    ///
    /// # Errors
    ///
    /// As [`open`], and for Parquet as
    /// [`ParquetRecords::open`](crate::records::parquet::ParquetRecords::open).
    pub fn open(path: &Path, opts: ReadOptions) -> Result<Self, InputError> {
        if path != Path::new("-") && is_parquet_input(path) {
            return Self::open_parquet(path, opts);
        }
        Ok(Self::new(open(path)?, opts))
    }

    #[cfg(feature = "parquet")]
    fn open_parquet(path: &Path, opts: ReadOptions) -> Result<Self, InputError> {
        let records = crate::records::parquet::ParquetRecords::open(path, opts.batch_lines)?;
        let mut reader = Self::new(
            Opened {
                reader: Box::new(io::empty()),
                gzip: false,
                path: path.to_path_buf(),
            },
            opts,
        );
        reader.parquet = Some(records);
        Ok(reader)
    }

    #[cfg(not(feature = "parquet"))]
    fn open_parquet(path: &Path, _: ReadOptions) -> Result<Self, InputError> {
        Err(InputError::NoParquet {
            path: path.to_path_buf(),
        })
    }

    /// Read an opened input.
    pub fn new(input: Opened, opts: ReadOptions) -> Self {
        RecordReader {
            input,
            opts: ReadOptions {
                batch_lines: opts.batch_lines.max(1),
                ..opts
            },
            line: 0,
            done: false,
            stats: ReadStats::default(),
            #[cfg(feature = "parquet")]
            parquet: None,
        }
    }

    /// The path being read.
    pub fn path(&self) -> &Path {
        &self.input.path
    }

    /// What has been read so far.
    pub fn stats(&self) -> ReadStats {
        self.stats
    }

    /// The next batch of records (possibly empty when all its lines were bad),
    /// or `None` at the end of the input. Skipped lines and a broken gzip tail
    /// are passed to `warn`, in input order.
    ///
    /// # Errors
    ///
    /// An I/O error, or under `strict` the first bad line or a broken gzip
    /// stream.
    pub fn next_batch(
        &mut self,
        warn: &mut dyn FnMut(Warning),
    ) -> Result<Option<Vec<Record>>, InputError> {
        #[cfg(feature = "parquet")]
        if let Some(p) = &mut self.parquet {
            let batch = p.next_batch()?;
            if let Some(b) = &batch {
                self.stats.records += b.len() as u64;
            }
            return Ok(batch);
        }
        if self.done {
            return Ok(None);
        }
        let mut lines: Vec<(u64, Vec<u8>)> = Vec::with_capacity(self.opts.batch_lines.min(1 << 16));
        let mut broken: Option<io::Error> = None;
        while lines.len() < self.opts.batch_lines {
            let mut buf = Vec::new();
            match self.input.reader.read_until(b'\n', &mut buf) {
                Ok(0) => {
                    self.done = true;
                    break;
                }
                Ok(_) => {
                    self.line += 1;
                    if !buf.trim_ascii().is_empty() {
                        lines.push((self.line, buf));
                    }
                }
                // A gzip stream that breaks off (or turns corrupt): what was
                // decoded before is good, the partial line is dropped.
                Err(e) if self.input.gzip && e.kind() != io::ErrorKind::Interrupted => {
                    self.done = true;
                    broken = Some(e);
                    break;
                }
                Err(error) => {
                    self.done = true;
                    return Err(InputError::Read {
                        path: self.input.path.clone(),
                        line: self.line + 1,
                        error,
                    });
                }
            }
        }
        if lines.is_empty() && broken.is_none() && self.done {
            return Ok(None);
        }
        let parsed: Vec<(u64, Result<Record, LineError>)> = lines
            .par_iter()
            .map(|(n, bytes)| {
                let r = std::str::from_utf8(bytes)
                    .map_err(LineError::Utf8)
                    .and_then(|t| Record::from_json(t.trim()).map_err(LineError::Record));
                (*n, r)
            })
            .collect();
        drop(lines);
        let mut out = Vec::with_capacity(parsed.len());
        for (line, r) in parsed {
            match r {
                Ok(r) => out.push(r),
                Err(error) if self.opts.strict => {
                    self.done = true;
                    return Err(InputError::BadLine {
                        path: self.input.path.clone(),
                        line,
                        error,
                    });
                }
                Err(e) => {
                    self.stats.bad_lines += 1;
                    warn(Warning {
                        path: self.input.path.clone(),
                        line,
                        kind: WarningKind::BadLine(e),
                    });
                }
            }
        }
        self.stats.records += out.len() as u64;
        if let Some(error) = broken {
            if self.opts.strict {
                return Err(InputError::Truncated {
                    path: self.input.path.clone(),
                    line: self.line,
                    error,
                });
            }
            self.stats.truncated = true;
            warn(Warning {
                path: self.input.path.clone(),
                line: self.line,
                kind: WarningKind::Truncated(error),
            });
        }
        Ok(Some(out))
    }

    /// Every remaining record (for small inputs and tests).
    ///
    /// # Errors
    ///
    /// As [`RecordReader::next_batch`].
    pub fn read_all(&mut self, warn: &mut dyn FnMut(Warning)) -> Result<Vec<Record>, InputError> {
        let mut all = Vec::new();
        while let Some(mut b) = self.next_batch(warn)? {
            all.append(&mut b);
        }
        Ok(all)
    }
}

/// Read a whole input into `out` (gunzipped as [`open`] does), for formats
/// that parse a document at once (`cpt traces`).
///
/// A gzip stream that breaks off keeps what was decoded before the break and
/// returns the decompressor's error as `Ok(Some(_))`, for the caller to warn
/// about.
///
/// # Errors
///
/// As [`open`], or an I/O error of a plain file.
pub fn read_to_end(path: &Path, out: &mut Vec<u8>) -> Result<Option<io::Error>, InputError> {
    let mut input = open(path)?;
    match input.reader.read_to_end(out) {
        Ok(_) => Ok(None),
        Err(e) if input.gzip => Ok(Some(e)),
        Err(error) => Err(InputError::Read {
            path: path.to_path_buf(),
            line: 0,
            error,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    const GOOD: &str =
        r#"{"service":"S","trigger":"sampled","latency_ns":3,"path":[{"stack":["x"],"ns":3}]}"#;

    fn gz(text: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(text).unwrap();
        e.finish().unwrap()
    }

    fn reader(bytes: Vec<u8>, strict: bool) -> RecordReader {
        let gzip = bytes.starts_with(&GZIP_MAGIC);
        let cursor = io::Cursor::new(bytes);
        let reader: Box<dyn BufRead + Send> = if gzip {
            Box::new(BufReader::new(MultiGzDecoder::new(cursor)))
        } else {
            Box::new(BufReader::new(cursor))
        };
        RecordReader::new(
            Opened {
                reader,
                gzip,
                path: "t.jsonl".into(),
            },
            ReadOptions {
                strict,
                batch_lines: 3,
            },
        )
    }

    #[test]
    fn bad_lines_are_skipped_across_batches_with_their_numbers() {
        let mut text = Vec::new();
        for i in 0..7 {
            if i == 2 {
                text.extend_from_slice(b"\xff\xfe\n");
            } else if i == 5 {
                text.extend_from_slice(b"{\"service\":\n");
            } else {
                text.extend_from_slice(GOOD.as_bytes());
                text.push(b'\n');
            }
        }
        let mut warned = Vec::new();
        let recs = reader(text, false)
            .read_all(&mut |w| warned.push(w.line))
            .unwrap();
        assert_eq!((recs.len(), warned), (5, vec![3, 6]));
    }

    #[test]
    fn truncated_gzip_keeps_complete_lines() {
        let text = format!("{GOOD}\n").repeat(500);
        let full = gz(text.as_bytes());
        let cut = full[..full.len() / 2].to_vec();
        let mut warnings = Vec::new();
        let mut r = reader(cut.clone(), false);
        let recs = r.read_all(&mut |w| warnings.push(w.to_string())).unwrap();
        assert!(!recs.is_empty() && recs.len() < 500, "{}", recs.len());
        assert!(r.stats().truncated);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("breaks off"), "{warnings:?}");
        let err = reader(cut, true).read_all(&mut |_| {}).unwrap_err();
        assert!(matches!(err, InputError::Truncated { .. }), "{err}");
    }
}
