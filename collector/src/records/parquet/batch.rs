//! Records ⇄ Arrow batches of schema [`schema`](super::schema).

use std::sync::Arc;
use std::time::Duration;

use arrow_array::builder::{Int64Builder, StringBuilder};
use arrow_array::{
    Array, ArrayRef, Int64Array, ListArray, MapArray, RecordBatch, StringArray, StructArray,
};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use cpt_sdk::path::{Accounting, CriticalPath, Frame, FrameId, Location, SegmentKind};
use cpt_sdk::record::{Labels, Record};
use cpt_sdk::trigger::Trigger;
use rustc_hash::FxHashMap;

use super::{
    ACCOUNTING, ParquetError, frame_fields, frame_item, label_entries, label_fields, schema,
    segment_fields, segment_item,
};

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

pub(super) fn batch_of(records: &[&Record]) -> Result<RecordBatch, ParquetError> {
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
/// per thread (at least 512 rows each), joined in row order (building
/// `Record`s is most of reading Parquet; the first error by row is returned,
/// as [`from_batch`] would).
pub fn from_batch_parallel(batch: &RecordBatch) -> Result<Vec<Record>, String> {
    let n = batch.num_rows();
    from_batch_parallel_in(
        batch,
        n.div_ceil(rayon::current_num_threads().max(1)).max(512),
    )
}

/// [`from_batch_parallel`] with runs of `rows_per_run` rows (at least 1).
pub fn from_batch_parallel_in(
    batch: &RecordBatch,
    rows_per_run: usize,
) -> Result<Vec<Record>, String> {
    use rayon::prelude::*;
    let n = batch.num_rows();
    let per = rows_per_run.max(1);
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
