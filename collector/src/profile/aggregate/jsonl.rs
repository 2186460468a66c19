//! Folding JSON Lines without building records.
//!
//! [`Aggregator::push_json_block`] cuts a block of whole lines
//! ([`records::blocks`](crate::records::blocks)) into chunks and parses the
//! chunks on the rayon pool, each into whichever partial is free. A line is
//! parsed into borrowed strings (no allocation for a string without
//! escapes), checked as [`Record::from_json`] checks it, matched against
//! the selection, and its frames interned straight into the partial (a hash
//! of the borrowed name, service and line; an allocation only for a frame
//! the partial has not seen). A line the fast parser refuses is handed to
//! [`Record::from_json`], so a bad line is reported with the same message as
//! ever, and a line only it accepts is still folded.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use cpt_sdk::path::{Accounting, SegmentKind};
use cpt_sdk::trigger::Trigger;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::Deserialize;

use super::fold::{Flat, Partial};
use super::*;
use crate::ingest::LineError;
use crate::records::EntryServices;
use crate::records::blocks::{Block, newlines};
use crate::records::selection::RecordKeys;

#[derive(Deserialize)]
struct WRecord<'a> {
    #[serde(borrow)]
    service: Cow<'a, str>,
    #[serde(default, borrow)]
    endpoint: Option<Cow<'a, str>>,
    #[serde(borrow)]
    trigger: Cow<'a, str>,
    latency_ns: u64,
    #[serde(default)]
    start_unix_nanos: Option<u64>,
    #[serde(default, borrow)]
    request_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    trace_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    labels: Option<BTreeMap<Cow<'a, str>, Cow<'a, str>>>,
    #[serde(borrow)]
    path: Vec<WSegment<'a>>,
    #[serde(default)]
    accounting: Option<WAccounting>,
}

#[derive(Deserialize)]
struct WSegment<'a> {
    #[serde(borrow)]
    stack: Vec<WFrame<'a>>,
    ns: u64,
    #[serde(default, borrow)]
    kind: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct WAccounting {
    #[serde(default)]
    network_ns: u64,
    #[serde(default)]
    overcount_ns: u64,
    #[serde(default)]
    blind_spot_ns: u64,
    #[serde(default)]
    unattributed_ns: u64,
    #[serde(default)]
    queueing_ns: u64,
    #[serde(default)]
    truncated_ns: u64,
    #[serde(default)]
    clock_skew_ns: u64,
}

/// A stack entry: a bare name, or `{"name", "service", "file", "line"}`.
struct WFrame<'a> {
    name: Cow<'a, str>,
    service: Option<Cow<'a, str>>,
    file: Option<Cow<'a, str>>,
    line: Option<u32>,
}

impl<'de: 'a, 'a> Deserialize<'de> for WFrame<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FrameVisitor(std::marker::PhantomData))
    }
}

struct FrameVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> serde::de::Visitor<'de> for FrameVisitor<'a> {
    type Value = WFrame<'a>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a frame")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(WFrame {
            name: Cow::Borrowed(v),
            service: None,
            file: None,
            line: None,
        })
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(WFrame {
            name: Cow::Owned(v.to_owned()),
            service: None,
            file: None,
            line: None,
        })
    }
    fn visit_map<M: serde::de::MapAccess<'de>>(self, mut m: M) -> Result<Self::Value, M::Error> {
        let (mut name, mut service, mut file, mut line) = (None, None, None, None);
        while let Some(key) = m.next_key::<Cow<'de, str>>()? {
            match &*key {
                "name" => name = Some(m.next_value::<Cow<'de, str>>()?),
                "service" => service = m.next_value::<Option<Cow<'de, str>>>()?,
                "file" => file = m.next_value::<Option<Cow<'de, str>>>()?,
                "line" => line = m.next_value::<Option<u32>>()?,
                _ => {
                    m.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        let name = name.ok_or_else(|| serde::de::Error::missing_field("name"))?;
        Ok(WFrame {
            name,
            service,
            file,
            line,
        })
    }
}

/// What one chunk of lines gave.
struct ChunkResult {
    records: u64,
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
        let keep = self.sel.percentile().is_some();
        let histograms = self.parts.first().is_some_and(|p| p.histograms);
        let base = self.ordinal;
        let observe = mix.is_some();
        let sel = &self.sel;
        let fresh = || {
            let mut p = Partial::new(keep);
            p.histograms = histograms;
            p
        };
        let free = Mutex::new(std::mem::take(&mut self.parts));
        let lock = || free.lock().unwrap_or_else(PoisonError::into_inner);
        let chunks = block.chunks(chunk_bytes);
        let results: Vec<ChunkResult> = chunks
            .par_iter()
            .map(|&(first, bytes)| {
                let mut part = lock().pop().unwrap_or_else(fresh);
                let r = fold_lines(
                    &mut part,
                    sel,
                    bytes,
                    first,
                    base + (first - block.first_line),
                    observe,
                );
                lock().push(part);
                r
            })
            .collect();
        self.parts = free.into_inner().unwrap_or_else(PoisonError::into_inner);
        let lines = newlines(&block.bytes) + u64::from(!block.bytes.ends_with(b"\n"));
        // A line's ordinal is `base` plus its index in the block.
        self.ordinal = base + lines;
        let mut out = BlockResult::default();
        let mut all = EntryServices::default();
        for r in results {
            out.records += r.records;
            out.bad.extend(r.bad);
            all.merge(r.seen);
        }
        self.offered += out.records;
        if let Some(m) = mix {
            m.merge(all);
        }
        out
    }
}

/// Fold the lines of one chunk; the first is line `first_line` of the
/// input and has ordinal `first_ordinal`.
fn fold_lines(
    part: &mut Partial,
    sel: &Selection,
    bytes: &[u8],
    first_line: u64,
    first_ordinal: u64,
    observe: bool,
) -> ChunkResult {
    let mut out = ChunkResult {
        records: 0,
        bad: Vec::new(),
        seen: EntryServices::default(),
    };
    let mut flat = Flat::default();
    let mut entries: FxHashMap<String, (u32, u64)> = FxHashMap::default();
    let mut callees: FxHashSet<(u32, u32)> = FxHashSet::default();
    let mut start = 0;
    let ends = memchr::memchr_iter(b'\n', bytes)
        .chain((!bytes.ends_with(b"\n") && !bytes.is_empty()).then_some(bytes.len()));
    for (i, end) in ends.enumerate() {
        let raw = &bytes[start..end];
        start = end + 1;
        let line = first_line + i as u64;
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
        let ordinal = first_ordinal + i as u64;
        let on_selected = |service: &str, ids: &[u32]| {
            if observe {
                let e = match entries.get_mut(service) {
                    Some(e) => e,
                    None => {
                        let next = entries.len() as u32;
                        entries.entry(service.to_owned()).or_insert((next, 0))
                    }
                };
                e.1 += 1;
                let e = e.0;
                callees.extend(ids.iter().map(|&f| (e, f)));
            }
        };
        match fold_line(part, sel, text, &mut flat, ordinal, on_selected) {
            Some(()) => out.records += 1,
            // The fast parser refused the line: the record parser decides.
            None => match Record::from_json(text) {
                Ok(r) => {
                    out.records += 1;
                    if observe && sel.matches(&r) {
                        out.seen.observe(&r);
                    }
                    part.push(sel, &r, ordinal);
                }
                Err(e) => out.bad.push((line, LineError::Record(e))),
            },
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
                out.seen.observe_callee(s, &part.frames[f as usize].service);
            }
        }
    }
    out
}

/// Parse, check and (when selected) fold one line, calling `on_selected`
/// with the entry service and frame ids of a selected one. `None`: the fast
/// parser refuses it.
fn fold_line(
    part: &mut Partial,
    sel: &Selection,
    text: &str,
    flat: &mut Flat,
    ordinal: u64,
    on_selected: impl FnOnce(&str, &[u32]),
) -> Option<()> {
    let w: WRecord<'_> = serde_json::from_str(text).ok()?;
    let trigger = Trigger::parse(&w.trigger)?;
    let mut sum: u64 = 0;
    for seg in &w.path {
        if seg.stack.is_empty() {
            return None;
        }
        if let Some(k) = &seg.kind {
            SegmentKind::parse(k)?;
        }
        sum = sum.checked_add(seg.ns)?;
    }
    if sum != w.latency_ns {
        return None;
    }
    let labels = w.labels.as_ref();
    let label = |k: &str| -> Option<&str> { labels?.get(k).map(|v| &**v) };
    let keys = RecordKeys {
        service: &w.service,
        endpoint: w.endpoint.as_deref(),
        trigger,
        start_unix_nanos: w.start_unix_nanos,
        request_id: w.request_id.as_deref(),
        trace_id: w.trace_id.as_deref(),
        label: &label,
    };
    if !sel.matches_keys(&keys) {
        return Some(());
    }
    // The frame each (service, name) last stood for in this record: an
    // entry without `file` is that frame (see `cpt_sdk::record`).
    let mut last: FxHashMap<(&str, &str), u32> = FxHashMap::default();
    flat.clear();
    for seg in &w.path {
        let mut parent: &str = &w.service;
        for f in &seg.stack {
            let service: &str = f.service.as_deref().unwrap_or(parent);
            let name: &str = &f.name;
            let id = match (&f.file, last.get(&(service, name))) {
                (None, Some(&id)) => id,
                (file, _) => {
                    let location = file
                        .as_deref()
                        .filter(|f| !f.is_empty())
                        .map(|file| (file, f.line.unwrap_or(0)));
                    let id = part.intern_parts(service, name, location);
                    last.insert((service, name), id);
                    id
                }
            };
            flat.ids.push(id);
            parent = service;
        }
        let kind = match &seg.kind {
            None => SegmentKind::Busy,
            Some(k) => SegmentKind::parse(k)?,
        };
        flat.end_segment(seg.ns, kind);
    }
    let a = w.accounting.as_ref();
    let d = |f: fn(&WAccounting) -> u64| Duration::from_nanos(a.map_or(0, f));
    let accounting = Accounting {
        network: d(|a| a.network_ns),
        overcount: d(|a| a.overcount_ns),
        blind_spot: d(|a| a.blind_spot_ns),
        unattributed: d(|a| a.unattributed_ns),
        queueing: d(|a| a.queueing_ns),
        truncated: d(|a| a.truncated_ns),
        clock_skew: d(|a| a.clock_skew_ns),
    };
    part.push_flat(flat, w.start_unix_nanos, &accounting, ordinal);
    on_selected(&w.service, &flat.ids);
    Some(())
}
