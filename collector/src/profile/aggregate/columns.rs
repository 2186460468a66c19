//! Folding Parquet straight from Arrow arrays, without building records.
//!
//! [`Aggregator::push_parquet`] reads the units of a
//! [`ScanPlan`] on the rayon pool, each into whichever partial is free. A
//! row is matched against the selection on its columns; a selected row's
//! frames are found by their dictionary keys (service, name, file, line),
//! mapped to the partial's frame ids once per dictionary, not once per row,
//! and its segments are folded as the partial folds a record's. A frame
//! equal to the previous segment's frame at the same depth (stacks share
//! their prefixes) is not even looked up. Rows are checked as
//! [`from_batch`](crate::records::parquet::from_batch) checks them (trigger
//! and segment kind known, no empty stack, no negative duration, segments
//! summing to `latency_ns`); the first bad row in input order fails the read,
//! naming the file and the row.

use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, DictionaryArray, Int64Array, ListArray, MapArray, RecordBatch, StringArray,
    StructArray,
};
use cpt_sdk::path::{Accounting, Frame, Location, SegmentKind};
use cpt_sdk::trigger::Trigger;
use rustc_hash::FxHashMap;

use super::fold::{Arm, Partial, arms, slot_parts, take_parts};
use super::intern::Flat;
use super::*;
use crate::records::parquet::{ScanColumns, ScanPlan, ScanUnit};
use crate::records::selection::RecordKeys;
use crate::records::{EntryServices, InputError};

/// Rows per Arrow batch a unit is decoded in. A batch's frame columns hold
/// a value per frame of every segment, tens a row; at 4 Ki rows each array
/// stays within what the allocator keeps in its heap, where larger
/// batches' arrays are mapped and unmapped afresh for every batch (page
/// faults and zeroing: a tenth of the scan's time at 16 Ki rows, and a
/// third more memory).
const SCAN_BATCH_ROWS: usize = 4 * 1024;

impl Aggregator {
    /// Offer every row of a planned Parquet scan, folded in parallel (one
    /// unit per work item) without building records. Selected rows are also
    /// shown to `mix` when given; `progress` is told the rows of each unit
    /// read. Returns the rows read.
    ///
    /// # Errors
    ///
    /// The first unreadable unit or bad row in input order
    /// ([`InputError::BadParquet`] naming the file and row); the aggregate
    /// then holds part of the scan and is to be dropped.
    pub fn push_parquet(
        &mut self,
        plan: &ScanPlan,
        mix: Option<&mut EntryServices>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<u64, InputError> {
        push_parquet(&mut [self], plan, mix, progress)
    }
}

/// [`Aggregator::push_parquet`] for several aggregators at once (the arms
/// of a diff): each row is read and checked once and folded into every
/// aggregator whose selection keeps it; `mix` sees what the first keeps.
/// The plan must cover every aggregator's time range.
///
/// # Errors
///
/// As [`Aggregator::push_parquet`].
///
/// # Panics
///
/// If `aggs` is empty.
pub fn push_parquet(
    aggs: &mut [&mut Aggregator],
    plan: &ScanPlan,
    mix: Option<&mut EntryServices>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u64, InputError> {
    assert!(!aggs.is_empty(), "push_parquet needs an aggregator");
    let cols = ScanColumns {
        endpoint: aggs.iter().any(|a| a.sel.endpoint().is_some()),
        labels: aggs.iter().any(|a| !a.sel.labels().is_empty()),
        ids: aggs
            .iter()
            .any(|a| a.sel.request_id().is_some() || a.sel.trace_id().is_some()),
    };
    let observe = mix.is_some();
    let mut parts = take_parts(aggs);
    let arms = arms(aggs, &parts);
    let slots = parts.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let slots: Vec<Vec<Partial>> = (0..slots).map(|_| slot_parts(&mut parts, &arms)).collect();
    let free = Mutex::new(slots);
    let lock = || free.lock().unwrap_or_else(PoisonError::into_inner);
    // Workers take units from one queue, the largest first (in input order
    // among equals), so that the last units left, the small ones, even out
    // the workers' ends; results go back to input order.
    let units = plan.units();
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(units[i].len()));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = rayon::current_num_threads().clamp(1, units.len().max(1));
    let mut results: Vec<(usize, Result<EntryServices, InputError>)> = (0..workers)
        .into_par_iter()
        .flat_map_iter(|_| {
            let mut done = Vec::new();
            loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&i) = order.get(k) else { break };
                let unit = &units[i];
                let taken = lock().pop();
                let mut slot = taken.unwrap_or_else(|| arms.iter().map(Arm::fresh).collect());
                let mut seen = EntryServices::default();
                let r = fold_unit(&mut slot, &arms, unit, cols, observe.then_some(&mut seen));
                lock().push(slot);
                progress(unit.len() as u64);
                done.push((i, r.map(|()| seen)));
            }
            done
        })
        .collect();
    results.sort_unstable_by_key(|(i, _)| *i);
    let results = results.into_iter().map(|(_, r)| r);
    drop(arms);
    for slot in free.into_inner().unwrap_or_else(PoisonError::into_inner) {
        for (p, part) in parts.iter_mut().zip(slot) {
            p.push(part);
        }
    }
    for (a, p) in aggs.iter_mut().zip(parts) {
        a.parts = p;
        a.ordinal += plan.rows();
        a.offered += plan.rows();
    }
    let mut all = EntryServices::default();
    for r in results {
        all.merge(r?);
    }
    if let Some(m) = mix {
        m.merge(all);
    }
    Ok(plan.rows())
}

/// A dictionary-encoded string column.
struct Dict<'a> {
    keys: &'a [i32],
    array: &'a DictionaryArray<Int32Type>,
    values: &'a StringArray,
}

impl<'a> Dict<'a> {
    fn of(a: &'a dyn Array, name: &str) -> Result<Dict<'a>, String> {
        let array = a
            .as_any()
            .downcast_ref::<DictionaryArray<Int32Type>>()
            .ok_or_else(|| format!("column {name} is not a dictionary of strings"))?;
        let values = array
            .values()
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| format!("column {name}'s dictionary is not strings"))?;
        Ok(Dict {
            keys: array.keys().values(),
            array,
            values,
        })
    }

    #[inline]
    fn key(&self, i: usize) -> i32 {
        if self.array.is_valid(i) {
            self.keys[i]
        } else {
            -1
        }
    }

    #[inline]
    fn get(&self, i: usize) -> Option<&'a str> {
        self.array
            .is_valid(i)
            .then(|| self.values.value(self.keys[i] as usize))
    }

    /// The dictionary (its values), shared.
    fn dictionary(&self) -> &'a ArrayRef {
        self.array.values()
    }
}

/// Whether two arrays are the same allocation.
fn same_array(a: &ArrayRef, b: &ArrayRef) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

fn column<'a, T: 'static>(b: &'a RecordBatch, name: &str) -> Result<&'a T, String> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| format!("column {name} is missing or of another type"))
}

fn dict_column<'a>(b: &'a RecordBatch, name: &str) -> Result<Dict<'a>, String> {
    Dict::of(
        b.column_by_name(name)
            .ok_or_else(|| format!("column {name} is missing"))?
            .as_ref(),
        name,
    )
}

fn child<'a>(s: &'a StructArray, name: &str) -> Result<&'a dyn Array, String> {
    s.column_by_name(name)
        .map(AsRef::as_ref)
        .ok_or_else(|| format!("field {name} is missing"))
}

fn non_negative(v: i64, what: &str, row: u64) -> Result<u64, String> {
    u64::try_from(v).map_err(|_| format!("row {row}: {what} is negative ({v})"))
}

/// A frame as dictionary keys: service, name, file (-1: none), line
/// (`i64::MIN`: none).
type FrameKey = (i32, i32, i32, i64);

/// Per-unit state that outlives a batch: the frame keys → partial frame ids
/// of the current dictionaries.
#[derive(Default)]
struct Frames {
    /// The frame service, name and file dictionaries `ids` is keyed by,
    /// held so that a later batch's dictionary cannot take their place in
    /// memory and pass for them.
    dicts: Option<[ArrayRef; 3]>,
    /// Per aggregator.
    ids: Vec<FxHashMap<FrameKey, u32>>,
}

fn fold_unit(
    parts: &mut [Partial],
    arms: &[Arm<'_>],
    unit: &ScanUnit,
    cols: ScanColumns,
    mut mix: Option<&mut EntryServices>,
) -> Result<(), InputError> {
    let bad = |error: String| InputError::BadParquet {
        path: unit.path().to_path_buf(),
        error,
    };
    let reader = unit.read(cols, SCAN_BATCH_ROWS)?;
    let mut frames = Frames {
        dicts: None,
        ids: vec![FxHashMap::default(); arms.len()],
    };
    let mut flat = Flat::default();
    let mut row0 = 0u64;
    for batch in reader {
        let batch = batch.map_err(|e| bad(e.to_string()))?;
        fold_batch(
            parts,
            arms,
            &batch,
            &mut frames,
            &mut flat,
            (unit.first_row() + row0, unit.file_row() + row0),
            mix.as_deref_mut(),
        )
        .map_err(bad)?;
        row0 += batch.num_rows() as u64;
    }
    Ok(())
}

/// Fold one batch into every arm keeping its rows; `at` is (row in the
/// plan, row in file) of its first row.
fn fold_batch(
    parts: &mut [Partial],
    arms: &[Arm<'_>],
    b: &RecordBatch,
    frames: &mut Frames,
    flat: &mut Flat,
    at: (u64, u64),
    mix: Option<&mut EntryServices>,
) -> Result<(), String> {
    let service = dict_column(b, "service")?;
    let trigger = dict_column(b, "trigger")?;
    let endpoint = b
        .column_by_name("endpoint")
        .map(|c| Dict::of(c.as_ref(), "endpoint"))
        .transpose()?;
    let latency = column::<Int64Array>(b, "latency_ns")?;
    let start = column::<Int64Array>(b, "start_unix_nanos")?;
    let request_id = b
        .column_by_name("request_id")
        .and_then(|c| c.as_any().downcast_ref::<StringArray>());
    let trace_id = b
        .column_by_name("trace_id")
        .and_then(|c| c.as_any().downcast_ref::<StringArray>());
    let labels = b
        .column_by_name("labels")
        .and_then(|c| c.as_any().downcast_ref::<MapArray>());
    let label_kv = match labels {
        Some(m) => Some((
            m.keys()
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or("label keys are not strings")?,
            m.values()
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or("label values are not strings")?,
        )),
        None => None,
    };
    let path = column::<ListArray>(b, "path")?;
    let acc_cols = crate::records::parquet::ACCOUNTING
        .iter()
        .map(|n| column::<Int64Array>(b, n))
        .collect::<Result<Vec<_>, _>>()?;
    let segs = path
        .values()
        .as_any()
        .downcast_ref::<StructArray>()
        .ok_or("path is not a list of structs")?;
    let seg_ns = child(segs, "ns")?
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or("field ns is not int64")?;
    let seg_kind = Dict::of(child(segs, "kind")?, "kind")?;
    let stacks = child(segs, "stack")?
        .as_any()
        .downcast_ref::<ListArray>()
        .ok_or("field stack is not a list")?;
    let fr = stacks
        .values()
        .as_any()
        .downcast_ref::<StructArray>()
        .ok_or("stack is not a list of structs")?;
    let f_service = Dict::of(child(fr, "service")?, "service")?;
    let f_name = Dict::of(child(fr, "name")?, "name")?;
    let f_file = Dict::of(child(fr, "file")?, "file")?;
    let f_line = child(fr, "line")?
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or("field line is not int64")?;

    // Small dictionaries, parsed once per batch.
    let triggers: Vec<Option<Trigger>> = (0..trigger.values.len())
        .map(|i| Trigger::parse(trigger.values.value(i)))
        .collect();
    let kinds: Vec<Option<SegmentKind>> = (0..seg_kind.values.len())
        .map(|i| SegmentKind::parse(seg_kind.values.value(i)))
        .collect();
    let dicts = [
        f_service.dictionary(),
        f_name.dictionary(),
        f_file.dictionary(),
    ];
    let same = frames
        .dicts
        .as_ref()
        .is_some_and(|held| held.iter().zip(dicts).all(|(a, b)| same_array(a, b)));
    if !same {
        frames.dicts = Some(dicts.map(Arc::clone));
        frames.ids.iter_mut().for_each(FxHashMap::clear);
    }
    // Selected rows per entry service key, and (entry, frame service) key
    // pairs seen, for `mix`.
    let mut entry_rows: FxHashMap<i32, u64> = FxHashMap::default();
    let mut callees: rustc_hash::FxHashSet<(i32, i32)> = rustc_hash::FxHashSet::default();

    let seg_off = path.value_offsets();
    let stack_off = stacks.value_offsets();
    let ns_v = seg_ns.values();
    let line_v = f_line.values();
    let mut prev: Vec<(FrameKey, u32)> = Vec::new();
    for row in 0..b.num_rows() {
        let file_row = at.1 + row as u64;
        let tk = trigger.key(row);
        let trig = usize::try_from(tk)
            .ok()
            .and_then(|k| triggers[k])
            .ok_or_else(|| {
                format!(
                    "row {file_row}: unknown trigger {:?} (expected \"sampled\" or \"forced\")",
                    trigger.get(row).unwrap_or("")
                )
            })?;
        let (s0, s1) = (seg_off[row] as usize, seg_off[row + 1] as usize);
        let lat = non_negative(latency.value(row), "latency_ns", file_row)?;
        // Every row is checked, selected or not.
        let mut sum: u64 = 0;
        for s in s0..s1 {
            if usize::try_from(seg_kind.key(s))
                .ok()
                .and_then(|k| kinds[k])
                .is_none()
            {
                return Err(format!(
                    "row {file_row}: segment {}: unknown kind {:?}",
                    s - s0,
                    seg_kind.get(s).unwrap_or("")
                ));
            }
            if stack_off[s] == stack_off[s + 1] {
                return Err(format!("row {file_row}: segment {}: empty stack", s - s0));
            }
            let d = non_negative(ns_v[s], "a segment's ns", file_row)?;
            sum = sum
                .checked_add(d)
                .ok_or_else(|| format!("row {file_row}: segment durations overflow"))?;
        }
        if sum != lat {
            return Err(format!(
                "row {file_row}: path sums to {sum} ns but latency_ns is {lat}"
            ));
        }
        let start_ns = if start.is_valid(row) {
            Some(non_negative(
                start.value(row),
                "start_unix_nanos",
                file_row,
            )?)
        } else {
            None
        };
        let label = |k: &str| -> Option<&str> {
            let (m, (keys, values)) = (labels?, label_kv?);
            let off = m.value_offsets();
            (off[row] as usize..off[row + 1] as usize)
                .find(|&l| keys.value(l) == k)
                .map(|l| values.value(l))
        };
        let svc = service.get(row).unwrap_or("");
        let keys = RecordKeys {
            service: svc,
            endpoint: endpoint.as_ref().and_then(|e| e.get(row)),
            trigger: trig,
            start_unix_nanos: start_ns,
            request_id: request_id.and_then(|a| a.is_valid(row).then(|| a.value(row))),
            trace_id: trace_id.and_then(|a| a.is_valid(row).then(|| a.value(row))),
            label: &label,
        };
        let mut acc = [Duration::ZERO; 7];
        let mut any = false;
        for (k, arm) in arms.iter().enumerate() {
            if !arm.sel.matches_keys(&keys) {
                continue;
            }
            if !any {
                any = true;
                for (a, col) in acc.iter_mut().zip(&acc_cols) {
                    *a = Duration::from_nanos(non_negative(
                        col.value(row),
                        "an accounting field",
                        file_row,
                    )?);
                }
            }
            let observe = k == 0 && mix.is_some();
            let entry_key = service.key(row);
            if observe {
                *entry_rows.entry(entry_key).or_default() += 1;
            }
            let (part, ids) = (&mut parts[k], &mut frames.ids[k]);
            flat.clear();
            prev.clear();
            for s in s0..s1 {
                let (f0, f1) = (stack_off[s] as usize, stack_off[s + 1] as usize);
                for (depth, f) in (f0..f1).enumerate() {
                    let key: FrameKey = (
                        f_service.key(f),
                        f_name.key(f),
                        f_file.key(f),
                        if f_line.is_valid(f) {
                            line_v[f]
                        } else {
                            i64::MIN
                        },
                    );
                    if let Some(&(k, id)) = prev.get(depth)
                        && k == key
                    {
                        flat.ids.push(id);
                        continue;
                    }
                    prev.truncate(depth);
                    let id = match ids.get(&key) {
                        Some(&id) => id,
                        None => {
                            let frame = make_frame(&f_service, &f_name, &f_file, f_line, f)
                                .map_err(|e| format!("row {file_row}: {e}"))?;
                            let id = part.intern_frame(&frame);
                            ids.insert(key, id);
                            id
                        }
                    };
                    if observe {
                        callees.insert((entry_key, key.0));
                    }
                    flat.ids.push(id);
                    prev.push((key, id));
                }
                let kind = kinds[seg_kind.keys[s] as usize].expect("checked above");
                flat.end_segment(ns_v[s] as u64, kind);
            }
            let accounting = Accounting {
                network: acc[0],
                overcount: acc[1],
                blind_spot: acc[2],
                unattributed: acc[3],
                queueing: acc[4],
                truncated: acc[5],
                clock_skew: acc[6],
            };
            part.push_flat(flat, start_ns, &accounting, arm.base + at.0 + row as u64);
        }
    }
    if let Some(m) = mix {
        for (k, n) in entry_rows {
            let s = usize::try_from(k).map_or("", |k| service.values.value(k));
            m.observe_service(s, n);
        }
        for (e, c) in callees {
            let s = usize::try_from(e).map_or("", |k| service.values.value(k));
            let c = usize::try_from(c).map_or("", |k| f_service.values.value(k));
            m.observe_callee(s, c);
        }
    }
    Ok(())
}

/// The frame at row `f` of the frame columns.
fn make_frame(
    service: &Dict<'_>,
    name: &Dict<'_>,
    file: &Dict<'_>,
    line: &Int64Array,
    f: usize,
) -> Result<Frame, String> {
    let location = match file.get(f) {
        Some(path) => {
            let l = line.is_valid(f).then(|| line.value(f));
            Some(Location {
                file: Arc::from(path),
                line: u32::try_from(l.unwrap_or(0))
                    .map_err(|_| format!("frame line {l:?} out of range"))?,
            })
        }
        None => None,
    };
    Ok(Frame {
        service: Arc::from(service.get(f).unwrap_or("")),
        name: Arc::from(name.get(f).unwrap_or("")),
        location,
    })
}
