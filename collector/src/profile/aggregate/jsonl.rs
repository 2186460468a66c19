//! Folding JSON Lines without building records.
//!
//! [`push_json_block`] cuts a block of whole lines
//! ([`records::blocks`](crate::records::blocks)) into chunks and scans the
//! chunks on the rayon pool, each with whichever worker slot is free (a
//! scanner frame table and one partial per aggregator). A line is scanned
//! once ([`scan`](super::scan): borrowed strings, frames interned by their
//! borrowed parts, no allocation per segment or frame), checked as
//! [`Record::from_json`] checks it, matched against every aggregator's
//! selection (the arms of a diff read the input once), and folded into
//! each one that keeps it, the scanner's frame ids mapped to the partial's
//! once per frame. A line the scanner refuses is handed to
//! [`Record::from_json`], so a bad line is reported with the same message
//! as ever, and a line only it accepts is still folded.

use rustc_hash::{FxHashMap, FxHashSet};

use super::fold::{Arm, Partial, arms, slot_parts, take_parts};
use super::intern::Flat;
use super::scan::{Frames, Head, Wanted, scan_line};
use super::*;
use crate::ingest::LineError;
use crate::records::EntryServices;
use crate::records::blocks::Block;
use crate::records::selection::RecordKeys;

/// What one chunk of lines gave.
struct ChunkResult {
    /// Lines in the chunk.
    lines: u64,
    records: u64,
    /// Bad lines by their index in the chunk.
    bad: Vec<(u64, LineError)>,
    seen: EntryServices,
}

/// A block's outcome: the records parsed and its bad lines in order.
#[derive(Debug, Default)]
pub struct BlockResult {
    /// Lines that were records (selected or not).
    pub records: u64,
    /// Lines that were not, with their 1-based numbers, in order.
    pub bad: Vec<(u64, LineError)>,
}

/// A worker's state for one chunk: a scanner's frame table, one partial
/// per arm and, per arm, the scanner's frame ids → that partial's.
struct Slot {
    frames: Frames,
    parts: Vec<Partial>,
    remap: Vec<Vec<u32>>,
    /// The scanned line's stacks (scanner ids), and one arm's (its ids).
    scanned: Flat,
    mapped: Flat,
}

impl Slot {
    fn new(frames: Frames, parts: Vec<Partial>) -> Slot {
        Slot {
            frames,
            remap: vec![Vec::new(); parts.len()],
            parts,
            scanned: Flat::default(),
            mapped: Flat::default(),
        }
    }
}

impl Aggregator {
    /// Offer every line of a block of JSON Lines (the chunks of about
    /// `chunk_bytes` folded in parallel) without building records; selected
    /// records are also shown to `mix` when given. Blank lines are ignored;
    /// lines that are not records are returned, in order, for the caller to
    /// warn about or fail on. The lines' numbers order them for the
    /// percentile band's ties, so call this once per block, in input order.
    pub fn push_json_block(
        &mut self,
        block: &Block,
        chunk_bytes: usize,
        mix: Option<&mut EntryServices>,
    ) -> BlockResult {
        push_json_block(&mut [self], block, chunk_bytes, mix)
    }
}

/// [`Aggregator::push_json_block`] for several aggregators at once (the
/// arms of a diff): each line is parsed once and folded into every
/// aggregator whose selection keeps it. `mix` sees what the first one
/// keeps.
///
/// # Panics
///
/// If `aggs` is empty.
pub fn push_json_block(
    aggs: &mut [&mut Aggregator],
    block: &Block,
    chunk_bytes: usize,
    mix: Option<&mut EntryServices>,
) -> BlockResult {
    assert!(!aggs.is_empty(), "push_json_block needs an aggregator");
    let want = Wanted {
        endpoint: aggs.iter().any(|a| a.sel.endpoint().is_some()),
        ids: aggs
            .iter()
            .any(|a| a.sel.request_id().is_some() || a.sel.trace_id().is_some()),
        labels: aggs.iter().any(|a| !a.sel.labels().is_empty()),
    };
    let observe = mix.is_some();
    let mut frames = std::mem::take(&mut aggs[0].json_frames);
    let mut parts = take_parts(aggs);
    let arms = arms(aggs, &parts);
    let slots = parts.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let slots: Vec<Slot> = (0..slots)
        .map(|_| {
            Slot::new(
                frames.pop().unwrap_or_default(),
                slot_parts(&mut parts, &arms),
            )
        })
        .collect();
    let free = Mutex::new(slots);
    let lock = || free.lock().unwrap_or_else(PoisonError::into_inner);
    let chunks = block.pieces(chunk_bytes);
    let results: Vec<ChunkResult> = chunks
        .par_iter()
        .map(|&(at, bytes)| {
            let taken = lock().pop();
            let mut slot = taken.unwrap_or_else(|| {
                Slot::new(Frames::default(), arms.iter().map(Arm::fresh).collect())
            });
            let r = fold_lines(&mut slot, &arms, want, bytes, at as u64, observe);
            lock().push(slot);
            r
        })
        .collect();
    drop(arms);
    for slot in free.into_inner().unwrap_or_else(PoisonError::into_inner) {
        frames.push(slot.frames);
        for (p, part) in parts.iter_mut().zip(slot.parts) {
            p.push(part);
        }
    }
    let mut out = BlockResult::default();
    let mut all = EntryServices::default();
    let mut line = block.first_line;
    for r in results {
        out.records += r.records;
        out.bad
            .extend(r.bad.into_iter().map(|(i, e)| (line + i, e)));
        line += r.lines;
        all.merge(r.seen);
    }
    for (a, p) in aggs.iter_mut().zip(parts) {
        a.parts = p;
        // A line's ordinal is the block's base plus the line's offset in
        // the block: in input order, which is all the band's ties need.
        a.ordinal += block.bytes.len() as u64;
        a.offered += out.records;
    }
    aggs[0].json_frames = frames;
    if let Some(m) = mix {
        m.merge(all);
    }
    out
}

/// Fold the lines of one chunk, at byte `offset` of its block, into every
/// arm that keeps them.
fn fold_lines(
    slot: &mut Slot,
    arms: &[Arm<'_>],
    want: Wanted,
    bytes: &[u8],
    offset: u64,
    observe: bool,
) -> ChunkResult {
    let mut out = ChunkResult {
        lines: 0,
        records: 0,
        bad: Vec::new(),
        seen: EntryServices::default(),
    };
    // Selected records per entry service, and (entry, frame) pairs seen,
    // for `mix`.
    let mut entries: FxHashMap<String, (u32, u64)> = FxHashMap::default();
    let mut callees: FxHashSet<(u32, u32)> = FxHashSet::default();
    // Per frame, the entry (+ 1) it was last noted as a callee of: a frame
    // on every path is noted once, not once per record.
    let mut noted: Vec<u32> = Vec::new();
    let mut head = Head::default();
    let mut start = 0;
    let ends = memchr::memchr_iter(b'\n', bytes)
        .chain((!bytes.ends_with(b"\n") && !bytes.is_empty()).then_some(bytes.len()));
    for (i, end) in ends.enumerate() {
        out.lines += 1;
        let raw = &bytes[start..end];
        let index = offset + start as u64;
        start = end + 1;
        let line = i as u64;
        if raw.trim_ascii().is_empty() {
            continue;
        }
        let text = match std::str::from_utf8(raw) {
            Ok(t) => t.trim(),
            Err(e) => {
                out.bad.push((line, LineError::Utf8(e)));
                continue;
            }
        };
        if scan_line(text, want, &mut slot.frames, &mut head, &mut slot.scanned).is_none() {
            // The scanner refused the line: the record parser decides.
            match Record::from_json(text) {
                Ok(r) => {
                    out.records += 1;
                    for (k, arm) in arms.iter().enumerate() {
                        if k == 0 && observe && arm.sel.matches(&r) {
                            out.seen.observe(&r);
                        }
                        slot.parts[k].push(arm.sel, &r, arm.base + index);
                    }
                }
                Err(e) => out.bad.push((line, LineError::Record(e))),
            }
            continue;
        }
        out.records += 1;
        let trigger = head.trigger.expect("a scanned record has a trigger");
        let label = |k: &str| head.label(k);
        let keys = RecordKeys {
            service: &head.service,
            endpoint: head.endpoint.as_deref(),
            trigger,
            start_unix_nanos: head.start_unix_nanos,
            request_id: head.request_id.as_deref(),
            trace_id: head.trace_id.as_deref(),
            label: &label,
        };
        for (k, arm) in arms.iter().enumerate() {
            if !arm.sel.matches_keys(&keys) {
                continue;
            }
            let part = &mut slot.parts[k];
            let remap = &mut slot.remap[k];
            let mapped = &mut slot.mapped;
            mapped.ids.clear();
            for &id in &slot.scanned.ids {
                let id = id as usize;
                if id >= remap.len() {
                    remap.resize(slot.frames.frames.len().max(id + 1), u32::MAX);
                }
                let mut to = remap[id];
                if to == u32::MAX {
                    to = part.intern_frame(&slot.frames.frames[id]);
                    remap[id] = to;
                }
                mapped.ids.push(to);
            }
            std::mem::swap(&mut mapped.segs, &mut slot.scanned.segs);
            part.push_flat(
                mapped,
                head.start_unix_nanos,
                &head.accounting,
                arm.base + index,
            );
            std::mem::swap(&mut mapped.segs, &mut slot.scanned.segs);
            if k == 0 && observe {
                let service: &str = &head.service;
                let e = match entries.get_mut(service) {
                    Some(e) => e,
                    None => {
                        let next = entries.len() as u32;
                        entries.entry(service.to_owned()).or_insert((next, 0))
                    }
                };
                e.1 += 1;
                let e = e.0;
                for &f in &slot.scanned.ids {
                    let f = f as usize;
                    if f >= noted.len() {
                        noted.resize(slot.frames.frames.len().max(f + 1), 0);
                    }
                    if noted[f] != e + 1 {
                        noted[f] = e + 1;
                        callees.insert((e, f as u32));
                    }
                }
            }
        }
    }
    if observe {
        let names: FxHashMap<u32, &str> =
            entries.iter().map(|(s, (k, _))| (*k, s.as_str())).collect();
        for (s, (_, n)) in &entries {
            out.seen.observe_service(s, *n);
        }
        for (e, f) in callees {
            if let Some(s) = names.get(&e) {
                out.seen
                    .observe_callee(s, &slot.frames.frames[f as usize].service);
            }
        }
    }
    out
}
