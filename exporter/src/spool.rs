//! A bounded on-disk queue of batches the collector could not take: the
//! [`CollectorClient`](crate::client::CollectorClient)'s spool (in the spirit
//! of the OpenTelemetry Collector's persistent sending queue).
//!
//! # Files
//!
//! A spool is a directory that belongs to one process at a time (see
//! [`SpoolError::Locked`]):
//!
//! - `lock`: the process id of the process that has the spool open, which
//!   holds an exclusive lock on the file while it does.
//! - `NNNNNNNNNNNNNNNNNNNN.seg` (a 20-digit sequence number): append-only
//!   segments. A segment starts with the 12-byte header `CPTSPOOL` + the
//!   format version (`u32` little-endian, 1); then entries, each
//!   `len: u32 LE | crc32(payload): u32 LE | payload`, where the payload is
//!   `id_len: u8 | batch id | records: u32 LE | RecordBatch (protobuf)`.
//!   A new segment starts when the current one would exceed the segment size
//!   (a sixteenth of the spool's bound, 64 KiB to 8 MiB).
//! - `cursor`: where replay stands, `segment: u64 LE | offset: u64 LE |
//!   crc32 of both: u32 LE`, the first entry not yet acknowledged. It is
//!   replaced atomically (written to `cursor.tmp`, fsynced, renamed, the
//!   directory fsynced) after every acknowledged batch; segments wholly
//!   before it are deleted.
//!
//! # Crash safety
//!
//! An entry is appended with one write and fsynced before
//! [`Spool::append`] returns. A crash mid-append leaves a torn tail: on
//! [`Spool::open`] every segment is scanned from the cursor, and an entry
//! that is incomplete, longer than its file or fails its checksum is
//! damage. The scan then looks for the next offset where a whole entry
//! starts (a plausible header, a payload that parses, a matching
//! checksum): if there is one, only the damaged bytes are skipped, every
//! intact entry after them is kept, and the damage is reported in
//! [`Recovery::damaged`] with the records it held (when its own header
//! still says so). If there is none, it was a torn tail: the file is
//! truncated there (the entries before it are kept and replayed) and the
//! tear is reported in [`Recovery::torn`]. Neither is fatal. A file named like a segment that does not start with the header
//! is an error ([`SpoolError::NotASegment`]): the spool does not delete what
//! it did not write.
//!
//! The cursor moves only after the collector acknowledged the batch, so a
//! crash between the acknowledgement and the cursor write replays that one
//! batch again; it carries the same batch id, and `cpt serve` stores a batch
//! id once, so nothing is stored twice. Everything else the spool's
//! bookkeeping does (segments deleted after the cursor moved past them, a
//! cursor that cannot be read: replay from the oldest segment) errs the same
//! way: towards sending again, never towards losing.
//!
//! # Bound
//!
//! The entries not yet acknowledged take at most `max_bytes` (their encoded
//! size, headers included); an append that would go over is refused with
//! [`AppendError::Full`] and the caller counts the batch as dropped: the
//! oldest batches stay. The disk holds at most `max_bytes` plus the
//! acknowledged part of the oldest segment (less than one segment).

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

mod lock;

use lock::DirLock;

const MAGIC: &[u8; 8] = b"CPTSPOOL";
const VERSION: u32 = 1;
/// Bytes of a segment's header.
const HEADER_LEN: u64 = 12;
/// Bytes before an entry's payload (length and checksum).
const ENTRY_HEADER: u64 = 8;
/// A length above this is not an entry, whatever the file says.
const MAX_ENTRY: u64 = 1 << 30;
const CURSOR: &str = "cursor";
const CURSOR_TMP: &str = "cursor.tmp";

fn header() -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..].copy_from_slice(&VERSION.to_le_bytes());
    h
}

/// Why a spool cannot be opened or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpoolError {
    /// A file system operation failed.
    #[error("spool {path}: cannot {what}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Another process has this spool open (it holds the lock on
    /// `DIR/lock`): a spool belongs to one process at a time.
    #[error(
        "spool {dir}: in use by another process{}: give each process a spool directory of \
         its own (CPT_SPOOL_DIR, or CollectorClientBuilder::with_spool)",
        pid.map(|p| format!(" (pid {p}, from {}/lock)", dir.display())).unwrap_or_default()
    )]
    Locked {
        /// The spool directory.
        dir: PathBuf,
        /// The process id the other process wrote in the lock file, when it
        /// could be read.
        pid: Option<u32>,
    },
    /// A file named like a segment is not one.
    #[error(
        "spool {path}: not a cpt spool segment (it does not start with the CPTSPOOL v1 header); \
         move it out of the spool directory, or give the spool a directory of its own"
    )]
    NotASegment {
        /// The file.
        path: PathBuf,
    },
    /// An entry read back for replay is not what was written (the disk
    /// changed under the spool).
    #[error("spool {path}: entry at byte {offset} is damaged: {reason}")]
    Damaged {
        /// The segment.
        path: PathBuf,
        /// Where the entry starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

/// Why [`Spool::append`] did not take a batch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// The spool is full: the batch is not spooled.
    #[error(
        "spool full: {pending} bytes waiting, the batch needs {need} more, the bound is {max} \
         (batch dropped; older spooled batches are kept)"
    )]
    Full {
        /// Bytes of the entries waiting.
        pending: u64,
        /// Bytes the batch would take.
        need: u64,
        /// The bound.
        max: u64,
    },
    /// Writing failed (the batch is not spooled).
    #[error(transparent)]
    Io(#[from] SpoolError),
}

/// A torn or damaged tail found (and cut off) when a spool was opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tear {
    /// The segment.
    pub segment: PathBuf,
    /// Where the file now ends: the entries before it are kept.
    pub offset: u64,
    /// Bytes cut off.
    pub discarded_bytes: u64,
    /// What was wrong at `offset`.
    pub reason: String,
}

impl std::fmt::Display for Tear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} at byte {}; {} bytes cut off, the entries before kept",
            self.segment.display(),
            self.reason,
            self.offset,
            self.discarded_bytes
        )
    }
}

/// Damaged bytes in the middle of a segment, skipped when it was opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The segment.
    pub segment: PathBuf,
    /// Where the damage starts.
    pub offset: u64,
    /// Bytes skipped, up to the next intact entry.
    pub skipped_bytes: u64,
    /// What was wrong at `offset`.
    pub reason: String,
    /// Records lost: what the damaged entry's own header says when it spans
    /// exactly the skipped bytes and still parses; `None` when that cannot
    /// be told (the damage hit the length or the record count).
    pub records_lost: Option<u64>,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} at byte {}; {} bytes skipped ({}), the entries after kept",
            self.segment.display(),
            self.reason,
            self.offset,
            self.skipped_bytes,
            match self.records_lost {
                Some(n) => format!("{n} records lost"),
                None => "an unknown number of records lost".to_owned(),
            }
        )
    }
}

/// The payload length and record count of a whole entry at `pos` of `data`,
/// if one starts there.
fn entry_at(data: &[u8], pos: usize) -> Option<(u64, u32)> {
    let rest = data.get(pos..)?;
    let header = rest.get(..ENTRY_HEADER as usize)?;
    let n = u64::from(u32::from_le_bytes(header[..4].try_into().ok()?));
    if !(5..=MAX_ENTRY).contains(&n) || ENTRY_HEADER + n > rest.len() as u64 {
        return None;
    }
    let payload = &rest[ENTRY_HEADER as usize..(ENTRY_HEADER + n) as usize];
    // Cheap checks before the checksum: a batch id of visible ASCII.
    let (id, records, at) = parse_payload(payload)?;
    if at as u64 > n || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    (crc32fast::hash(payload) == crc).then_some((n, records))
}

/// What [`Spool::open`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Batches waiting for replay.
    pub pending_batches: u64,
    /// Records in them.
    pub pending_records: u64,
    /// Torn tails cut off (a crash while appending), oldest segment first.
    pub torn: Vec<Tear>,
    /// Damaged entries in the middle of a segment, skipped (the intact
    /// entries after them are kept), oldest first.
    pub damaged: Vec<Damage>,
    /// Set when the cursor could not be read: replay starts at the oldest
    /// segment (batches sent before may be sent again; the collector keeps
    /// one copy of each batch id).
    pub cursor_reset: Option<String>,
}

/// One spooled batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpoolEntry {
    /// The id the batch was first sent with.
    pub batch_id: String,
    /// Records in it.
    pub records: u32,
    /// The `RecordBatch`, protobuf-encoded.
    pub body: Vec<u8>,
}

#[derive(Clone, Copy, Debug)]
struct Pos {
    seg: u64,
    offset: u64,
    /// Payload bytes.
    len: u64,
    records: u32,
}

impl Pos {
    fn size(&self) -> u64 {
        ENTRY_HEADER + self.len
    }
}

struct Tail {
    seq: u64,
    file: File,
    len: u64,
}

/// A bounded on-disk queue of batches; see the [module docs](self).
pub struct Spool {
    dir: PathBuf,
    /// Held while the spool is open.
    _lock: DirLock,
    max_bytes: u64,
    segment_bytes: u64,
    entries: VecDeque<Pos>,
    pending_bytes: u64,
    pending_records: u64,
    /// Segment files on disk, in order.
    segments: VecDeque<u64>,
    tail: Option<Tail>,
    next_seq: u64,
    recovery: Recovery,
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool")
            .field("dir", &self.dir)
            .field("max_bytes", &self.max_bytes)
            .field("pending_batches", &self.entries.len())
            .field("pending_bytes", &self.pending_bytes)
            .finish_non_exhaustive()
    }
}

fn io_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> SpoolError + 'a {
    move |source| SpoolError::Io {
        path: path.to_owned(),
        what,
        source,
    }
}

fn seg_name(seq: u64) -> String {
    format!("{seq:020}.seg")
}

fn parse_seg_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Make a rename or a new file in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), SpoolError> {
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir, "fsync the directory"))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Parse a payload's batch id and record count; the body follows.
fn parse_payload(p: &[u8]) -> Option<(String, u32, usize)> {
    let id_len = usize::from(*p.first()?);
    let id = p.get(1..1 + id_len)?;
    let n = p.get(1 + id_len..5 + id_len)?;
    let id = std::str::from_utf8(id).ok()?.to_owned();
    let records = u32::from_le_bytes(n.try_into().ok()?);
    Some((id, records, 5 + id_len))
}

impl Spool {
    /// Open (or create) the spool in `dir`, holding at most `max_bytes` of
    /// batches waiting for replay. Recovers from a crash: see [`Recovery`]
    /// ([`Spool::recovery`]).
    ///
    /// # Errors
    ///
    /// When the directory cannot be created or read, a segment cannot be
    /// read or repaired, or a file named like a segment is not one.
    pub fn open(dir: impl Into<PathBuf>, max_bytes: u64) -> Result<Spool, SpoolError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io_err(&dir, "create the spool directory"))?;
        let lock = DirLock::acquire(&dir)?;
        let mut recovery = Recovery::default();
        let cursor = match read_cursor(&dir) {
            Ok(c) => c,
            Err(reason) => {
                recovery.cursor_reset = Some(reason);
                None
            }
        };
        let mut seqs: Vec<u64> = fs::read_dir(&dir)
            .map_err(io_err(&dir, "list the spool directory"))?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().and_then(parse_seg_name))
            .collect();
        seqs.sort_unstable();
        let mut spool = Spool {
            segment_bytes: (max_bytes / 16).clamp(64 << 10, 8 << 20),
            max_bytes,
            entries: VecDeque::new(),
            pending_bytes: 0,
            pending_records: 0,
            segments: VecDeque::new(),
            tail: None,
            next_seq: seqs
                .last()
                .copied()
                .max(cursor.map(|(s, _)| s))
                .unwrap_or(0)
                + 1,
            recovery,
            dir,
            _lock: lock,
        };
        for &seq in &seqs {
            let path = spool.dir.join(seg_name(seq));
            if cursor.is_some_and(|(s, _)| seq < s) {
                // Acknowledged entirely; its deletion was interrupted.
                fs::remove_file(&path).map_err(io_err(&path, "delete a replayed segment"))?;
                continue;
            }
            let start = match cursor {
                Some((s, off)) if s == seq => off.max(HEADER_LEN),
                _ => HEADER_LEN,
            };
            spool.scan(seq, &path, start)?;
        }
        // Nothing left: start afresh (the cursor stays behind the next segment).
        if spool.entries.is_empty() {
            for seq in std::mem::take(&mut spool.segments) {
                let path = spool.dir.join(seg_name(seq));
                fs::remove_file(&path).map_err(io_err(&path, "delete a replayed segment"))?;
            }
        } else if let Some(&seq) = spool.segments.back() {
            let path = spool.dir.join(seg_name(seq));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io_err(&path, "open the last segment"))?;
            let len = file
                .metadata()
                .map_err(io_err(&path, "read the last segment's size"))?
                .len();
            spool.tail = Some(Tail { seq, file, len });
        }
        spool.recovery.pending_batches = spool.entries.len() as u64;
        spool.recovery.pending_records = spool.pending_records;
        Ok(spool)
    }

    /// Index the entries of segment `seq` from `start`, cutting off a torn tail.
    fn scan(&mut self, seq: u64, path: &Path, start: u64) -> Result<(), SpoolError> {
        let data = fs::read(path).map_err(io_err(path, "read a segment"))?;
        let len = data.len() as u64;
        let header = header();
        if len < HEADER_LEN {
            // A crash while the segment was being created.
            if !header.starts_with(&data) {
                return Err(SpoolError::NotASegment {
                    path: path.to_owned(),
                });
            }
            if len > 0 {
                self.recovery.torn.push(Tear {
                    segment: path.to_owned(),
                    offset: 0,
                    discarded_bytes: len,
                    reason: "incomplete segment header".into(),
                });
            }
            fs::remove_file(path).map_err(io_err(path, "delete an empty segment"))?;
            return Ok(());
        }
        if data[..HEADER_LEN as usize] != header {
            return Err(SpoolError::NotASegment {
                path: path.to_owned(),
            });
        }
        self.segments.push_back(seq);
        let mut pos = start.min(len);
        let tear = loop {
            if pos == len {
                break None;
            }
            let rest = &data[pos as usize..];
            if rest.len() < ENTRY_HEADER as usize {
                break Some("incomplete entry header".to_owned());
            }
            let n = u64::from(u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")));
            let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
            let damage = if n > MAX_ENTRY || ENTRY_HEADER + n > rest.len() as u64 {
                Some(format!(
                    "entry of {n} bytes runs past the end of the file ({} bytes left)",
                    rest.len() as u64 - ENTRY_HEADER
                ))
            } else {
                let payload = &rest[ENTRY_HEADER as usize..(ENTRY_HEADER + n) as usize];
                if crc32fast::hash(payload) != crc {
                    Some("checksum mismatch".to_owned())
                } else if parse_payload(payload).is_none() {
                    Some("malformed entry payload".to_owned())
                } else {
                    None
                }
            };
            if let Some(reason) = damage {
                // The next whole entry after the damage, if any: skip only
                // the damaged bytes. None: a torn tail.
                let Some(next) = (pos as usize + 1..data.len())
                    .find(|&q| entry_at(&data, q).is_some())
                    .map(|q| q as u64)
                else {
                    break Some(reason);
                };
                // The damaged entry's own header, if it spans exactly the
                // skipped bytes, says how many records were lost.
                let records_lost = (pos + ENTRY_HEADER + n == next)
                    .then(|| {
                        parse_payload(&rest[ENTRY_HEADER as usize..(ENTRY_HEADER + n) as usize])
                    })
                    .flatten()
                    .map(|(_, records, _)| u64::from(records));
                self.recovery.damaged.push(Damage {
                    segment: path.to_owned(),
                    offset: pos,
                    skipped_bytes: next - pos,
                    reason,
                    records_lost,
                });
                pos = next;
                continue;
            }
            let payload = &rest[ENTRY_HEADER as usize..(ENTRY_HEADER + n) as usize];
            let Some((_, records, _)) = parse_payload(payload) else {
                break Some("malformed entry payload".to_owned());
            };
            let p = Pos {
                seg: seq,
                offset: pos,
                len: n,
                records,
            };
            self.pending_bytes += p.size();
            self.pending_records += u64::from(records);
            self.entries.push_back(p);
            pos += p.size();
        };
        if let Some(reason) = tear {
            let file = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(io_err(path, "open a torn segment"))?;
            file.set_len(pos)
                .and_then(|()| file.sync_all())
                .map_err(io_err(path, "truncate a torn segment"))?;
            self.recovery.torn.push(Tear {
                segment: path.to_owned(),
                offset: pos,
                discarded_bytes: len - pos,
                reason,
            });
        }
        Ok(())
    }

    /// What opening found: batches waiting, torn tails cut off.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bound on the bytes waiting.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Batches waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Records waiting.
    pub fn pending_records(&self) -> u64 {
        self.pending_records
    }

    /// Bytes waiting (entries with their headers).
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Append a batch (`body`: its protobuf `RecordBatch`, `records`
    /// records) under `batch_id`; durable (fsynced) when this returns `Ok`.
    ///
    /// # Errors
    ///
    /// [`AppendError::Full`] when it does not fit under the bound (nothing
    /// written), [`AppendError::Io`] when writing failed (the segment is
    /// cut back to where it was).
    ///
    /// # Panics
    ///
    /// When `batch_id` is longer than 255 bytes.
    pub fn append(&mut self, batch_id: &str, records: u32, body: &[u8]) -> Result<(), AppendError> {
        let id = batch_id.as_bytes();
        let id_len = u8::try_from(id.len()).expect("batch ids are at most 255 bytes");
        let payload_len = 1 + id.len() as u64 + 4 + body.len() as u64;
        let need = ENTRY_HEADER + payload_len;
        if self.pending_bytes + need > self.max_bytes || payload_len > MAX_ENTRY {
            return Err(AppendError::Full {
                pending: self.pending_bytes,
                need,
                max: self.max_bytes,
            });
        }
        let mut payload = Vec::with_capacity(payload_len as usize);
        payload.push(id_len);
        payload.extend_from_slice(id);
        payload.extend_from_slice(&records.to_le_bytes());
        payload.extend_from_slice(body);
        let mut entry = Vec::with_capacity(need as usize);
        entry.extend_from_slice(&(payload_len as u32).to_le_bytes());
        entry.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        entry.extend_from_slice(&payload);

        let roll = match &self.tail {
            None => true,
            Some(t) => t.len > HEADER_LEN && t.len + need > self.segment_bytes,
        };
        if roll {
            self.new_segment()?;
        }
        let tail = self.tail.as_mut().expect("a segment was opened above");
        let path = self.dir.join(seg_name(tail.seq));
        let offset = tail.len;
        let written = tail
            .file
            .seek(SeekFrom::Start(offset))
            .and_then(|_| tail.file.write_all(&entry))
            .and_then(|()| tail.file.sync_data());
        if let Err(e) = written {
            // Leave no partial entry behind for the next append to follow.
            let _ = tail.file.set_len(offset);
            return Err(io_err(&path, "append to a segment")(e).into());
        }
        tail.len += need;
        let p = Pos {
            seg: tail.seq,
            offset,
            len: payload_len,
            records,
        };
        self.pending_bytes += need;
        self.pending_records += u64::from(records);
        self.entries.push_back(p);
        Ok(())
    }

    fn new_segment(&mut self) -> Result<(), SpoolError> {
        let seq = self.next_seq;
        let path = self.dir.join(seg_name(seq));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_err(&path, "create a segment"))?;
        file.write_all(&header())
            .and_then(|()| file.sync_all())
            .map_err(io_err(&path, "write a segment header"))?;
        sync_dir(&self.dir)?;
        self.next_seq += 1;
        self.segments.push_back(seq);
        self.tail = Some(Tail {
            seq,
            file,
            len: HEADER_LEN,
        });
        Ok(())
    }

    /// The oldest batch waiting, read back and checked.
    ///
    /// # Errors
    ///
    /// When the segment cannot be read, or the entry is not what was
    /// written ([`SpoolError::Damaged`]): [`Spool::pop_front`] skips it.
    pub fn front(&self) -> Result<Option<SpoolEntry>, SpoolError> {
        let Some(p) = self.entries.front().copied() else {
            return Ok(None);
        };
        let path = self.dir.join(seg_name(p.seg));
        let mut buf = vec![0u8; p.size() as usize];
        File::open(&path)
            .and_then(|mut f| {
                f.seek(SeekFrom::Start(p.offset))?;
                f.read_exact(&mut buf)
            })
            .map_err(io_err(&path, "read a spooled batch"))?;
        let damaged = |reason: &str| SpoolError::Damaged {
            path: path.clone(),
            offset: p.offset,
            reason: reason.to_owned(),
        };
        let payload = &buf[ENTRY_HEADER as usize..];
        let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
        if u64::from(u32::from_le_bytes(buf[..4].try_into().expect("4 bytes"))) != p.len
            || crc32fast::hash(payload) != crc
        {
            return Err(damaged("checksum mismatch"));
        }
        let (batch_id, records, at) =
            parse_payload(payload).ok_or_else(|| damaged("malformed entry payload"))?;
        Ok(Some(SpoolEntry {
            batch_id,
            records,
            body: payload[at..].to_vec(),
        }))
    }

    /// Forget the oldest batch (acknowledged, or damaged): the cursor moves
    /// past it durably, and segments left behind are deleted. Returns its
    /// record count (0 when nothing waits).
    ///
    /// # Errors
    ///
    /// When the cursor cannot be written (the batch stays first in line).
    pub fn pop_front(&mut self) -> Result<u32, SpoolError> {
        let Some(p) = self.entries.front().copied() else {
            return Ok(0);
        };
        // The cursor goes to the next entry itself, past any damaged bytes
        // skipped between the two (a restart does not scan them again).
        let (seg, offset) = match self.entries.get(1) {
            Some(next) => (next.seg, next.offset),
            None => (p.seg, p.offset + p.size()),
        };
        write_cursor(&self.dir, seg, offset)?;
        self.entries.pop_front();
        self.pending_bytes -= p.size();
        self.pending_records -= u64::from(p.records);
        // Segments before the next entry's are done; all of them when
        // nothing waits (the next append starts a new one).
        let keep_from = self.entries.front().map_or(u64::MAX, |e| e.seg);
        while let Some(&seq) = self.segments.front() {
            if seq >= keep_from {
                break;
            }
            if self.tail.as_ref().is_some_and(|t| t.seq == seq) {
                self.tail = None;
            }
            let path = self.dir.join(seg_name(seq));
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path, "delete a replayed segment")(e)),
            }
            self.segments.pop_front();
        }
        Ok(p.records)
    }
}

fn read_cursor(dir: &Path) -> Result<Option<(u64, u64)>, String> {
    let path = dir.join(CURSOR);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    if bytes.len() != 20 || crc32fast::hash(&bytes[..16]).to_le_bytes() != bytes[16..20] {
        return Err(format!(
            "{} is damaged ({} bytes, checksum {}); replaying from the oldest segment",
            path.display(),
            bytes.len(),
            if bytes.len() == 20 {
                "wrong"
            } else {
                "missing"
            }
        ));
    }
    let seq = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let off = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    Ok(Some((seq, off)))
}

fn write_cursor(dir: &Path, seq: u64, offset: u64) -> Result<(), SpoolError> {
    let mut bytes = Vec::with_capacity(20);
    bytes.extend_from_slice(&seq.to_le_bytes());
    bytes.extend_from_slice(&offset.to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&bytes).to_le_bytes());
    let tmp = dir.join(CURSOR_TMP);
    let mut f = File::create(&tmp).map_err(io_err(&tmp, "create the cursor"))?;
    f.write_all(&bytes)
        .and_then(|()| f.sync_all())
        .map_err(io_err(&tmp, "write the cursor"))?;
    let path = dir.join(CURSOR);
    fs::rename(&tmp, &path).map_err(io_err(&path, "replace the cursor"))?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests;
