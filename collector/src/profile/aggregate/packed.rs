//! Folding stored records in their packed form
//! ([`records::packed`](crate::records::packed)): frame ids into the store's
//! frames table, mapped to a partial's frame ids once per frame, not once
//! per row.

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

use cpt_sdk::path::Frame;
use rustc_hash::{FxHashMap, FxHashSet};

use super::fold::{CHUNK, Partial};
use super::intern::Flat;
use super::*;
use crate::records::EntryServices;
use crate::records::packed::{PackedError, unpack};

/// One stored record as the store's profile reader hands it over: the
/// columns a profile needs and the packed path.
#[derive(Debug, Clone)]
pub struct PackedRow {
    /// The store's row id (for messages).
    pub id: i64,
    /// The entry service.
    pub service: String,
    /// The request's start, ns since the Unix epoch.
    pub start_unix_nanos: Option<u64>,
    /// The packed path, frame ids into a [`PackedFrames`].
    pub path: Vec<u8>,
}

/// The frames table packed rows point into (`frames[id]`; `None` for an id
/// the table does not have). Tables only grow: a table read later holds
/// every frame of one read earlier, with the same ids.
#[derive(Debug, Clone)]
pub struct PackedFrames {
    frames: Vec<Option<Frame>>,
    table: u64,
}

static TABLES: AtomicU64 = AtomicU64::new(1);

impl PackedFrames {
    /// A new, empty table (a new id space: partials forget what they mapped
    /// for any other table).
    pub fn new() -> PackedFrames {
        PackedFrames {
            frames: Vec::new(),
            table: TABLES.fetch_add(1, AtomicOrdering::Relaxed),
        }
    }

    /// Add the frame with this id.
    pub fn insert(&mut self, id: u64, frame: Frame) {
        let i = usize::try_from(id).unwrap_or(usize::MAX);
        if i >= self.frames.len() {
            self.frames.resize(i + 1, None);
        }
        self.frames[i] = Some(frame);
    }

    /// The highest id plus one (0 when empty).
    pub fn len(&self) -> u64 {
        self.frames.len() as u64
    }

    /// True when the table has no frame.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
}

impl Default for PackedFrames {
    fn default() -> Self {
        PackedFrames::new()
    }
}

/// Why a packed row cannot be folded.
#[derive(Debug, thiserror::Error)]
#[error("row {id}: {reason}")]
pub struct PackedRowError {
    /// The store's row id.
    pub id: i64,
    /// What is wrong.
    pub reason: String,
}

impl Aggregator {
    /// Offer rows the store already selected (every filter but the
    /// percentile band), folded in parallel without building records;
    /// selected rows are shown to `mix` when given.
    ///
    /// # Errors
    ///
    /// The first row (in order) whose packed path does not decode or names a
    /// frame `frames` lacks; the aggregate then holds part of the batch and is
    /// to be dropped.
    pub fn push_packed(
        &mut self,
        rows: &[PackedRow],
        frames: &PackedFrames,
        mix: Option<&mut EntryServices>,
    ) -> Result<(), PackedRowError> {
        if rows.is_empty() {
            return Ok(());
        }
        let keep = self.sel.percentile().is_some();
        let histograms = self.parts.first().is_some_and(|p| p.histograms);
        let exact = self.parts.first().is_some_and(|p| p.exact.is_some());
        let base = self.ordinal;
        let observe = mix.is_some();
        let fresh = || Partial::with_options(keep, histograms, exact);
        let free = Mutex::new(std::mem::take(&mut self.parts));
        let lock = || free.lock().unwrap_or_else(PoisonError::into_inner);
        let results: Vec<Result<EntryServices, PackedRowError>> = rows
            .par_chunks(CHUNK)
            .enumerate()
            .map(|(ci, chunk)| {
                let mut part = lock().pop().unwrap_or_else(fresh);
                let mut seen = EntryServices::default();
                let r = fold_rows(
                    &mut part,
                    chunk,
                    frames,
                    base + (ci * CHUNK) as u64,
                    observe.then_some(&mut seen),
                );
                lock().push(part);
                r.map(|()| seen)
            })
            .collect();
        self.parts = free.into_inner().unwrap_or_else(PoisonError::into_inner);
        let mut all = EntryServices::default();
        for r in results {
            all.merge(r?);
        }
        if let Some(m) = mix {
            m.merge(all);
        }
        self.ordinal += rows.len() as u64;
        self.offered += rows.len() as u64;
        Ok(())
    }
}

fn fold_rows(
    part: &mut Partial,
    rows: &[PackedRow],
    frames: &PackedFrames,
    first: u64,
    mix: Option<&mut EntryServices>,
) -> Result<(), PackedRowError> {
    if part.packed_table != frames.table {
        part.packed_table = frames.table;
        part.packed_ids.clear();
    }
    let mut flat = Flat::default();
    let mut ids = Vec::new();
    let mut entries: FxHashMap<&str, (u32, u64)> = FxHashMap::default();
    let mut callees: FxHashSet<(u32, u64)> = FxHashSet::default();
    for (i, row) in rows.iter().enumerate() {
        flat.clear();
        let mut missing = None;
        let entry = if mix.is_some() {
            let next = entries.len() as u32;
            let e = entries.entry(row.service.as_str()).or_insert((next, 0));
            e.1 += 1;
            Some(e.0)
        } else {
            None
        };
        let acc = unpack(&row.path, &mut ids, |kind, ns, stack| {
            for &g in stack {
                let gi = usize::try_from(g).unwrap_or(usize::MAX);
                let mapped = part.packed_ids.get(gi).copied().unwrap_or(u32::MAX);
                let id = if mapped != u32::MAX {
                    mapped
                } else {
                    match frames.frames.get(gi).and_then(Option::as_ref) {
                        Some(f) => {
                            let id = part.intern_frame(f);
                            if gi >= part.packed_ids.len() {
                                part.packed_ids.resize(gi + 1, u32::MAX);
                            }
                            part.packed_ids[gi] = id;
                            id
                        }
                        None => {
                            missing = Some(g);
                            0
                        }
                    }
                };
                if let Some(e) = entry {
                    callees.insert((e, g));
                }
                flat.ids.push(id);
            }
            flat.end_segment(ns, kind);
        })
        .map_err(|e: PackedError| PackedRowError {
            id: row.id,
            reason: e.to_string(),
        })?;
        if let Some(g) = missing {
            return Err(PackedRowError {
                id: row.id,
                reason: format!("frame {g} is not in the frames table"),
            });
        }
        part.push_flat(&flat, row.start_unix_nanos, &acc, first + i as u64);
    }
    if let Some(m) = mix {
        let names: FxHashMap<u32, &str> = entries.iter().map(|(s, (k, _))| (*k, *s)).collect();
        for (s, (_, n)) in &entries {
            m.observe_service(s, *n);
        }
        for (e, g) in callees {
            if let (Some(s), Some(Some(f))) = (names.get(&e), frames.frames.get(g as usize)) {
                m.observe_callee(s, &f.service);
            }
        }
    }
    Ok(())
}
