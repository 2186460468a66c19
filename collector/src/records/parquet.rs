//! Records as Parquet: schema `cpt.records.v1` (see `docs/parquet.md`).
//!
//! One row per [`Record`]; the critical path is a list of segments, each a
//! list of fully spelled-out frames (no JSON Lines abbreviation), so engines
//! such as Apache Spark can explode and fold it without knowing cpt.
//!
//! - [`schema`], [`to_batch`], [`from_batch`]: Record ⇄ Arrow [`RecordBatch`].
//! - [`PartitionedWriter`]: records into the Hive-partitioned layout
//!   `DIR/date=YYYY-MM-DD/hour=HH/part-<unique>.parquet`. A file is written as
//!   `.part-<unique>.parquet.tmp` (hidden: Spark and cpt skip it), fsynced,
//!   renamed, and its directory fsynced: a reader sees a whole file or none.
//! - [`ParquetRecords`]: the records of a file or a directory tree of files,
//!   each checked for the schema before anything is read.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow_array::builder::{Int64Builder, StringBuilder};
use arrow_array::{
    Array, ArrayRef, Int64Array, ListArray, MapArray, RecordBatch, RecordBatchReader, StringArray,
    StructArray,
};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use cpt_sdk::path::{Accounting, CriticalPath, Frame, FrameId, Location, SegmentKind};
use cpt_sdk::record::{Labels, Record};
use cpt_sdk::trigger::Trigger;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use rustc_hash::FxHashMap;

use super::input::InputError;

/// The key of the file metadata entry naming the schema.
pub const SCHEMA_KEY: &str = "cpt.schema";
/// The schema this module writes and reads.
pub const SCHEMA_VERSION: &str = "cpt.records.v1";
/// The 4 bytes every Parquet file starts (and ends) with.
pub use super::input::PARQUET_MAGIC;
/// Rows per Arrow batch when reading and writing.
pub const BATCH_ROWS: usize = 8 * 1024;
/// A file is finished once its encoded size passes this (see
/// [`PartitionedWriter::with_max_file_bytes`]).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 128 << 20;

const ACCOUNTING: [&str; 7] = [
    "network_ns",
    "overcount_ns",
    "blind_spot_ns",
    "unattributed_ns",
    "queueing_ns",
    "truncated_ns",
    "clock_skew_ns",
];

fn frame_fields() -> Fields {
    Fields::from(vec![
        Field::new("service", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("file", DataType::Utf8, true),
        Field::new("line", DataType::Int64, true),
    ])
}

fn frame_item() -> FieldRef {
    Arc::new(Field::new(
        "element",
        DataType::Struct(frame_fields()),
        false,
    ))
}

fn segment_fields() -> Fields {
    Fields::from(vec![
        Field::new("stack", DataType::List(frame_item()), false),
        Field::new("ns", DataType::Int64, false),
        Field::new("kind", DataType::Utf8, false),
    ])
}

fn segment_item() -> FieldRef {
    Arc::new(Field::new(
        "element",
        DataType::Struct(segment_fields()),
        false,
    ))
}

fn label_fields() -> Fields {
    Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, false),
    ])
}

fn label_entries() -> FieldRef {
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

/// Nanoseconds as Parquet's int64 (beyond 292 years they saturate).
fn ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn offset(n: usize) -> Result<i32, ParquetError> {
    i32::try_from(n).map_err(|_| ParquetError::Other("too many frames in one batch".into()))
}

/// The records as one Arrow batch of schema [`schema`].
///
/// # Errors
///
/// Only when one batch holds more than 2³¹ frames, segments or labels.
pub fn to_batch(records: &[Record]) -> Result<RecordBatch, ParquetError> {
    batch_of(&records.iter().collect::<Vec<_>>())
}

fn batch_of(records: &[&Record]) -> Result<RecordBatch, ParquetError> {
    let n = records.len();
    let mut service = StringBuilder::with_capacity(n, n * 8);
    let mut endpoint = StringBuilder::with_capacity(n, n * 16);
    let mut trigger = StringBuilder::with_capacity(n, n * 7);
    let mut latency = Int64Builder::with_capacity(n);
    let mut start = Int64Builder::with_capacity(n);
    let mut request_id = StringBuilder::with_capacity(n, n * 16);
    let mut trace_id = StringBuilder::with_capacity(n, n * 32);
    let (mut keys, mut values, mut label_offsets) =
        (StringBuilder::new(), StringBuilder::new(), vec![0i32]);
    let (mut f_service, mut f_name, mut f_file, mut f_line) = (
        StringBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
        Int64Builder::new(),
    );
    let (mut stack_offsets, mut seg_ns, mut seg_kind, mut path_offsets) =
        (vec![0i32], Vec::new(), StringBuilder::new(), vec![0i32]);
    let mut accounting: [Vec<i64>; 7] = Default::default();
    let (mut frames, mut segments, mut labels) = (0usize, 0usize, 0usize);
    for r in records.iter().copied() {
        service.append_value(&r.service);
        endpoint.append_option(r.endpoint.as_deref());
        trigger.append_value(r.trigger.as_str());
        latency.append_value(ns(r.latency));
        start.append_option(
            r.start_unix_nanos
                .map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
        );
        request_id.append_option(r.request_id.as_deref());
        trace_id.append_option(r.trace_id.as_deref());
        for (k, v) in &r.labels {
            keys.append_value(k);
            values.append_value(v);
        }
        labels += r.labels.len();
        label_offsets.push(offset(labels)?);
        for seg in r.path.segments() {
            for f in r.path.stack_frames(seg) {
                f_service.append_value(&f.service);
                f_name.append_value(&f.name);
                f_file.append_option(f.location.as_ref().map(|l| &*l.file));
                f_line.append_option(f.location.as_ref().map(|l| i64::from(l.line)));
            }
            frames += seg.stack.len();
            stack_offsets.push(offset(frames)?);
            seg_ns.push(ns(seg.duration));
            seg_kind.append_value(seg.kind.as_str());
        }
        segments += r.path.segments().len();
        path_offsets.push(offset(segments)?);
        let a = &r.path.accounting;
        for (col, d) in accounting.iter_mut().zip([
            a.network,
            a.overcount,
            a.blind_spot,
            a.unattributed,
            a.queueing,
            a.truncated,
            a.clock_skew,
        ]) {
            col.push(ns(d));
        }
    }
    let frame_struct = StructArray::new(
        frame_fields(),
        vec![
            Arc::new(f_service.finish()) as ArrayRef,
            Arc::new(f_name.finish()),
            Arc::new(f_file.finish()),
            Arc::new(f_line.finish()),
        ],
        None,
    );
    let stacks = ListArray::new(
        frame_item(),
        OffsetBuffer::new(ScalarBuffer::from(stack_offsets)),
        Arc::new(frame_struct),
        None,
    );
    let seg_struct = StructArray::new(
        segment_fields(),
        vec![
            Arc::new(stacks) as ArrayRef,
            Arc::new(Int64Array::from(seg_ns)),
            Arc::new(seg_kind.finish()),
        ],
        None,
    );
    let path = ListArray::new(
        segment_item(),
        OffsetBuffer::new(ScalarBuffer::from(path_offsets)),
        Arc::new(seg_struct),
        None,
    );
    let entries = StructArray::new(
        label_fields(),
        vec![
            Arc::new(keys.finish()) as ArrayRef,
            Arc::new(values.finish()),
        ],
        None,
    );
    let labels = MapArray::new(
        label_entries(),
        OffsetBuffer::new(ScalarBuffer::from(label_offsets)),
        entries,
        None,
        false,
    );
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(service.finish()),
        Arc::new(endpoint.finish()),
        Arc::new(trigger.finish()),
        Arc::new(latency.finish()),
        Arc::new(start.finish()),
        Arc::new(request_id.finish()),
        Arc::new(trace_id.finish()),
        Arc::new(labels),
        Arc::new(path),
    ];
    columns.extend(
        accounting
            .into_iter()
            .map(|c| Arc::new(Int64Array::from(c)) as ArrayRef),
    );
    RecordBatch::try_new(schema(), columns).map_err(|e| ParquetError::Other(e.to_string()))
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

fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> Result<&'a T, String> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| format!("column {name} is missing or of another type"))
}

fn child<'a, T: 'static>(s: &'a StructArray, name: &str) -> Result<&'a T, String> {
    s.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| format!("field {name} is missing or of another type"))
}

fn opt_str(a: &StringArray, i: usize) -> Option<&str> {
    a.is_valid(i).then(|| a.value(i))
}

fn non_negative(v: i64, what: &str, row: usize) -> Result<u64, String> {
    u64::try_from(v).map_err(|_| format!("row {row}: {what} is negative ({v})"))
}

/// A frame as a batch spells it: service, name, file, line.
type FrameKey<'a> = (&'a str, &'a str, Option<&'a str>, Option<i64>);

/// The records of a batch of schema [`schema`].
///
/// # Errors
///
/// A message naming the row: a missing column, an unknown trigger or
/// segment kind, an empty stack, a negative duration, or segments that do
/// not sum to `latency_ns`.
pub fn from_batch(batch: &RecordBatch) -> Result<Vec<Record>, String> {
    from_rows(batch, 0..batch.num_rows())
}

/// [`from_batch`] on the rayon pool: the batch's rows in contiguous runs, one
/// per thread, joined in row order (building `Record`s is most of reading
/// Parquet; the first error by row is returned, as [`from_batch`] would).
pub fn from_batch_parallel(batch: &RecordBatch) -> Result<Vec<Record>, String> {
    use rayon::prelude::*;
    let n = batch.num_rows();
    let per = n.div_ceil(rayon::current_num_threads().max(1)).max(512);
    if per >= n {
        return from_batch(batch);
    }
    let runs: Vec<Result<Vec<Record>, String>> = (0..n)
        .step_by(per)
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|start| from_rows(batch, start..(start + per).min(n)))
        .collect();
    let mut out = Vec::with_capacity(n);
    for run in runs {
        out.extend(run?);
    }
    Ok(out)
}

fn from_rows(batch: &RecordBatch, rows: std::ops::Range<usize>) -> Result<Vec<Record>, String> {
    let service = column::<StringArray>(batch, "service")?;
    let endpoint = column::<StringArray>(batch, "endpoint")?;
    let trigger = column::<StringArray>(batch, "trigger")?;
    let latency = column::<Int64Array>(batch, "latency_ns")?;
    let start = column::<Int64Array>(batch, "start_unix_nanos")?;
    let request_id = column::<StringArray>(batch, "request_id")?;
    let trace_id = column::<StringArray>(batch, "trace_id")?;
    let labels = column::<MapArray>(batch, "labels")?;
    let path = column::<ListArray>(batch, "path")?;
    let accounting = ACCOUNTING
        .iter()
        .map(|n| column::<Int64Array>(batch, n))
        .collect::<Result<Vec<_>, _>>()?;
    let keys = labels
        .keys()
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or("label keys are not strings")?;
    let values = labels
        .values()
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or("label values are not strings")?;
    let segs = path
        .values()
        .as_any()
        .downcast_ref::<StructArray>()
        .ok_or("path is not a list of structs")?;
    let seg_ns = child::<Int64Array>(segs, "ns")?;
    let seg_kind = child::<StringArray>(segs, "kind")?;
    let stacks = child::<ListArray>(segs, "stack")?;
    let frames = stacks
        .values()
        .as_any()
        .downcast_ref::<StructArray>()
        .ok_or("stack is not a list of structs")?;
    let f_service = child::<StringArray>(frames, "service")?;
    let f_name = child::<StringArray>(frames, "name")?;
    let f_file = child::<StringArray>(frames, "file")?;
    let f_line = child::<Int64Array>(frames, "line")?;

    // Frames repeat across the batch's rows: each distinct frame is built
    // once per batch (one `Arc` per distinct string), found by an Fx hash of
    // its columns (a record has ~150 frame rows: the hashing is most of the
    // decoding), and interned into a record's path once, not once per
    // segment it appears in (`local`: batch frame → the path's id).
    let mut strings: FxHashMap<&str, Arc<str>> = FxHashMap::default();
    let mut index: FxHashMap<FrameKey<'_>, u32> = FxHashMap::default();
    let mut frames: Vec<Frame> = Vec::new();
    let mut local: Vec<Option<FrameId>> = Vec::new();
    let mut touched: Vec<u32> = Vec::new();
    let mut prev: Vec<(FrameKey<'_>, FrameId)> = Vec::new();

    let seg_off = path.value_offsets();
    let stack_off = stacks.value_offsets();
    let label_off = labels.value_offsets();
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let trig = trigger.value(row);
        let trigger = Trigger::parse(trig).ok_or_else(|| {
            format!("row {row}: unknown trigger {trig:?} (expected \"sampled\" or \"forced\")")
        })?;
        let (s0, s1) = (seg_off[row] as usize, seg_off[row + 1] as usize);
        // Sized as the previous record's frame table: a batch's records are
        // alike, and regrowing the table was a fifth of the decoding.
        let mut cp = CriticalPath::with_capacity(touched.len().max(8), s1 - s0);
        for f in touched.drain(..) {
            local[f as usize] = None;
        }
        prev.clear();
        let mut sum: u64 = 0;
        for s in s0..s1 {
            let kind_s = seg_kind.value(s);
            let kind = SegmentKind::parse(kind_s)
                .ok_or_else(|| format!("row {row}: segment {}: unknown kind {kind_s:?}", s - s0))?;
            let (f0, f1) = (stack_off[s] as usize, stack_off[s + 1] as usize);
            if f0 == f1 {
                return Err(format!("row {row}: segment {}: empty stack", s - s0));
            }
            let mut ids = cpt_sdk::path::Stack::new();
            for (depth, f) in (f0..f1).enumerate() {
                let key = (
                    f_service.value(f),
                    f_name.value(f),
                    opt_str(f_file, f),
                    f_line.is_valid(f).then(|| f_line.value(f)),
                );
                // Consecutive segments mostly share their stacks' prefixes:
                // comparing with the previous stack's frame at this depth is
                // cheaper than hashing.
                if let Some((k, id)) = prev.get(depth)
                    && *k == key
                {
                    ids.push(*id);
                    continue;
                }
                prev.truncate(depth);
                let at = match index.get(&key) {
                    Some(&at) => at,
                    None => {
                        let arc = |s: &str| -> Arc<str> {
                            strings.get(s).cloned().unwrap_or_else(|| Arc::from(s))
                        };
                        let location = match key.2 {
                            Some(file) => Some(Location {
                                file: arc(file),
                                line: u32::try_from(key.3.unwrap_or(0)).map_err(|_| {
                                    format!("row {row}: frame line {:?} out of range", key.3)
                                })?,
                            }),
                            None => None,
                        };
                        let fr = Frame {
                            service: arc(key.0),
                            name: arc(key.1),
                            location,
                        };
                        strings.insert(key.0, fr.service.clone());
                        strings.insert(key.1, fr.name.clone());
                        if let Some(l) = &fr.location {
                            strings.insert(key.2.unwrap_or_default(), l.file.clone());
                        }
                        let at = u32::try_from(frames.len())
                            .map_err(|_| format!("row {row}: over 2^32 distinct frames"))?;
                        index.insert(key, at);
                        frames.push(fr);
                        local.push(None);
                        at
                    }
                };
                let id = match local[at as usize] {
                    Some(id) => id,
                    None => {
                        let id = cp.intern(frames[at as usize].clone());
                        local[at as usize] = Some(id);
                        touched.push(at);
                        id
                    }
                };
                ids.push(id);
                prev.push((key, id));
            }
            let d = non_negative(seg_ns.value(s), "a segment's ns", row)?;
            sum = sum
                .checked_add(d)
                .ok_or_else(|| format!("row {row}: segment durations overflow"))?;
            cp.push(ids, Duration::from_nanos(d), kind);
        }
        let latency_ns = non_negative(latency.value(row), "latency_ns", row)?;
        if sum != latency_ns {
            return Err(format!(
                "row {row}: path sums to {sum} ns but latency_ns is {latency_ns}"
            ));
        }
        let mut acc = [Duration::ZERO; 7];
        for (a, col) in acc.iter_mut().zip(&accounting) {
            *a = Duration::from_nanos(non_negative(col.value(row), "an accounting field", row)?);
        }
        cp.accounting = Accounting {
            network: acc[0],
            overcount: acc[1],
            blind_spot: acc[2],
            unattributed: acc[3],
            queueing: acc[4],
            truncated: acc[5],
            clock_skew: acc[6],
        };
        let mut lab = Labels::new();
        for l in label_off[row] as usize..label_off[row + 1] as usize {
            lab.insert(keys.value(l).to_owned(), values.value(l).to_owned());
        }
        out.push(Record {
            service: service.value(row).to_owned(),
            endpoint: opt_str(endpoint, row).map(str::to_owned),
            trigger,
            latency: Duration::from_nanos(latency_ns),
            start_unix_nanos: if start.is_valid(row) {
                Some(non_negative(start.value(row), "start_unix_nanos", row)?)
            } else {
                None
            },
            request_id: opt_str(request_id, row).map(str::to_owned),
            trace_id: opt_str(trace_id, row).map(str::to_owned),
            labels: lab,
            path: cp,
        });
    }
    Ok(out)
}

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
fn skipped(name: &str) -> bool {
    name.starts_with('.') || name.starts_with('_') || name.ends_with(".tmp")
}

/// The files a directory of Parquet files holds: recursively, sorted, without
/// the [skipped](skipped) names.
fn dir_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), InputError> {
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
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(f).map_err(|e| InputError::BadParquet {
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
    builder
        .with_batch_size(batch_rows.max(1))
        .build()
        .map_err(|e| InputError::BadParquet {
            path: path.to_path_buf(),
            error: e.to_string(),
        })
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
        let is_dir = fs::metadata(path)
            .map_err(|error| InputError::Open {
                path: path.to_path_buf(),
                error,
            })?
            .is_dir();
        let files = if is_dir {
            let mut files = Vec::new();
            dir_files(path, &mut files)?;
            if files.is_empty() {
                return Err(InputError::EmptyDir {
                    path: path.to_path_buf(),
                });
            }
            files
        } else {
            vec![path.to_path_buf()]
        };
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
}

/// Writes records into `DIR/date=YYYY-MM-DD/hour=HH/part-<unique>.parquet`,
/// partitioned by each record's start time (or the time it is written when
/// it has none), in UTC.
///
/// Files stay open (as hidden `.part-*.parquet.tmp`) until
/// [`finish`](Self::finish), or until they pass the size bound, when they are
/// finished and a new one is started. Finishing a file closes its Parquet
/// footer, fsyncs it, renames it to its final name and fsyncs the directory:
/// after `finish` returns, its records survive a crash (`kill -9`, power
/// loss) and no reader ever sees a partial file. Dropping the writer without
/// `finish` deletes the unfinished files.
pub struct PartitionedWriter {
    dir: PathBuf,
    max_file_bytes: u64,
    props: WriterProperties,
    open: BTreeMap<(String, u8), OpenFile>,
    finished: Vec<PathBuf>,
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
            props: writer_properties(),
            open: BTreeMap::new(),
            finished: Vec::new(),
        })
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
        let mut parts: BTreeMap<(String, u8), Vec<&Record>> = BTreeMap::new();
        let mut last: Option<(u64, (String, u8))> = None;
        for r in records.iter().copied() {
            let hour_start = r.start_unix_nanos.unwrap_or(now) / 3_600_000_000_000;
            let key = match &last {
                Some((h, k)) if *h == hour_start => k.clone(),
                _ => {
                    let k = partition_of(r.start_unix_nanos.unwrap_or(now));
                    last = Some((hour_start, k.clone()));
                    k
                }
            };
            parts.entry(key).or_default().push(r);
        }
        for (key, recs) in parts {
            for chunk in recs.chunks(BATCH_ROWS) {
                let batch = batch_of(chunk)?;
                let file = self.file(&key)?;
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

    fn file(&mut self, key: &(String, u8)) -> Result<&mut OpenFile, ParquetError> {
        if !self.open.contains_key(key) {
            let part = self
                .dir
                .join(format!("date={}", key.0))
                .join(format!("hour={:02}", key.1));
            if !part.is_dir() {
                fs::create_dir_all(&part).map_err(|error| ParquetError::Io {
                    path: part.clone(),
                    error,
                })?;
                // The new directories' names must be durable too.
                sync_dir(part.parent().unwrap_or(&self.dir))?;
                sync_dir(&self.dir)?;
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
        Ok(std::mem::take(&mut self.finished))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use cpt_sdk::path::SegmentKind;

    fn record(i: u64) -> Record {
        let mut p = CriticalPath::new();
        let a = p.intern(Frame::new("A", "A1").with_location("a.rs", 7));
        let b = p.intern(Frame::new("B", "B1"));
        p.push(vec![a], Duration::from_nanos(5 + i), SegmentKind::Busy);
        p.push(vec![a, b], Duration::from_nanos(20), SegmentKind::Busy);
        p.push(vec![a], Duration::from_nanos(3), SegmentKind::Queueing);
        p.accounting.queueing = Duration::from_nanos(3);
        let mut r = Record::new("A", Trigger::Sampled, p);
        if i % 2 == 0 {
            r.endpoint = Some("/a.A/Run".into());
            r.labels.insert("arm".into(), format!("b{i}"));
            r.start_unix_nanos = Some(1_700_000_000_000_000_000 + i);
            r.request_id = Some(format!("r{i}"));
        } else {
            r.trigger = Trigger::Forced;
        }
        r
    }

    /// A record whose stacks share, change and reorder prefixes: the decoder
    /// reuses the previous stack's frames by depth, so frames must come back
    /// right when a frame moves depth or a prefix changes under a kept leaf.
    fn shuffled_stacks(i: u64) -> Record {
        let mut p = CriticalPath::new();
        let a = p.intern(Frame::new("A", "A1").with_location("a.rs", 7));
        let b = p.intern(Frame::new("B", "B1"));
        let c = p.intern(Frame::new("C", "C1").with_location("a.rs", 9));
        let d = p.intern(Frame::new("C", "C1").with_location("c.rs", 9));
        let stacks: [&[FrameId]; 7] = [
            &[a],
            &[a, b],
            &[a, c, b],
            &[c],
            &[c, a, b],
            &[d, a],
            &[a, d],
        ];
        for k in 0..stacks.len() {
            let s = stacks[(k + i as usize) % stacks.len()];
            p.push(
                s.to_vec(),
                Duration::from_nanos(1 + i + k as u64),
                SegmentKind::Busy,
            );
        }
        Record::new("A", Trigger::Sampled, p)
    }

    #[test]
    fn parallel_decoding_returns_every_row_in_order_with_its_frames() {
        let records: Vec<Record> = (0..3000)
            .map(|i| {
                if i % 3 == 0 {
                    record(i)
                } else {
                    shuffled_stacks(i)
                }
            })
            .collect();
        let batch = to_batch(&records).unwrap();
        // Frame ids are assigned in order of first appearance on reading:
        // compare the stacks as frames.
        type Resolved = (Vec<Vec<Frame>>, Vec<(Duration, SegmentKind)>);
        let resolved = |r: &Record| -> Resolved {
            let p = &r.path;
            let stacks = p.segments().iter();
            (
                stacks
                    .clone()
                    .map(|s| s.stack.iter().map(|&id| p.frame(id).clone()).collect())
                    .collect(),
                stacks.map(|s| (s.duration, s.kind)).collect(),
            )
        };
        let want: Vec<Resolved> = records.iter().map(resolved).collect();
        for got in [
            from_batch_parallel(&batch).unwrap(),
            from_batch(&batch).unwrap(),
        ] {
            assert_eq!(got.len(), records.len());
            assert_eq!(got.iter().map(resolved).collect::<Vec<_>>(), want);
            for (g, r) in got.iter().zip(&records) {
                assert_eq!(
                    (&g.request_id, g.trigger, g.latency),
                    (&r.request_id, r.trigger, r.latency)
                );
            }
        }
    }

    #[test]
    fn parallel_decoding_names_the_first_bad_row_of_the_batch() {
        let records: Vec<Record> = (0..3000).map(record).collect();
        let batch = to_batch(&records).unwrap();
        let at = batch.schema().index_of("trigger").unwrap();
        let triggers: Vec<&str> = (0..3000)
            .map(|i| match i {
                2500 | 2900 => "sometimes",
                _ => "sampled",
            })
            .collect();
        let mut columns = batch.columns().to_vec();
        columns[at] = Arc::new(StringArray::from(triggers));
        let bad = RecordBatch::try_new(batch.schema(), columns).unwrap();
        let e = from_batch_parallel(&bad).unwrap_err();
        assert!(
            e.starts_with("row 2500: unknown trigger \"sometimes\""),
            "{e}"
        );
    }

    #[test]
    fn records_survive_a_round_trip_through_arrow() {
        let recs: Vec<Record> = (0..5).map(record).collect();
        let batch = to_batch(&recs).unwrap();
        assert_eq!(batch.schema(), schema());
        assert_eq!(from_batch(&batch).unwrap(), recs);
    }

    #[test]
    fn partitions_are_utc_dates_and_hours() {
        assert_eq!(partition_of(0), ("1970-01-01".into(), 0));
        // 2023-11-14T22:13:20Z
        assert_eq!(
            partition_of(1_700_000_000_000_000_000),
            ("2023-11-14".into(), 22)
        );
        // 2024-02-29T23:59:59Z (leap day)
        assert_eq!(
            partition_of(1_709_251_199_000_000_000),
            ("2024-02-29".into(), 23)
        );
    }

    #[test]
    fn a_written_directory_reads_back_every_record() {
        let dir = tempfile::tempdir().unwrap();
        let recs: Vec<Record> = (0..40).map(record).collect();
        let mut w = PartitionedWriter::new(dir.path()).unwrap();
        w.write(&recs).unwrap();
        let files = w.finish().unwrap();
        // the even ones are in 2023-11-14 hour 22, the odd ones in "now"
        assert_eq!(files.len(), 2, "{files:?}");
        assert!(
            files
                .iter()
                .any(|f| f.starts_with(dir.path().join("date=2023-11-14/hour=22")))
        );
        let mut r = ParquetRecords::open(dir.path(), 7).unwrap();
        let mut back = Vec::new();
        while let Some(b) = r.next_batch().unwrap() {
            back.extend(b);
        }
        let key = |r: &Record| r.to_json();
        let mut want: Vec<String> = recs.iter().map(key).collect();
        let mut got: Vec<String> = back.iter().map(key).collect();
        want.sort();
        got.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn an_unfinished_writer_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut w = PartitionedWriter::new(dir.path()).unwrap();
            w.write(&[record(0)]).unwrap();
        }
        let mut files = Vec::new();
        dir_files(dir.path(), &mut files).unwrap();
        assert!(files.is_empty(), "{files:?}");
        let mut all = Vec::new();
        for e in fs::read_dir(dir.path().join("date=2023-11-14/hour=22")).unwrap() {
            all.push(e.unwrap().file_name());
        }
        assert!(all.is_empty(), "{all:?}");
    }

    #[test]
    fn files_roll_past_the_size_bound() {
        let dir = tempfile::tempdir().unwrap();
        let recs: Vec<Record> = (0..3000).map(|i| record(i * 2)).collect();
        let mut w = PartitionedWriter::new(dir.path())
            .unwrap()
            .with_max_file_bytes(1);
        for c in recs.chunks(1000) {
            w.write(c).unwrap();
        }
        assert_eq!(w.finish().unwrap().len(), 3);
    }
}
