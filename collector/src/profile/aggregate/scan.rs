//! A JSON Lines record scanner for the fold: one pass over a line's bytes
//! that checks it as [`Record::from_json`] checks it and hands the fold
//! only what it uses, without building the record.
//!
//! Strings are borrowed from the line (an escaped one is decoded by
//! `serde_json`, the only allocation); frames are interned on the fly into
//! the scanner's own frame table by a cheap hash of the borrowed name,
//! service and line, so a frame costs one probe and a few byte comparisons;
//! a segment's stack goes into a reused buffer of frame ids. Fields the
//! selections do not look at (`endpoint`, ids, labels) are checked but not
//! kept, and unknown fields are skipped with their syntax checked.
//!
//! The scanner accepts only lines it is sure `Record::from_json` accepts,
//! and reads them as it does: anything else (a duplicate field, a number
//! that is not a plain non-negative integer, nesting deeper than
//! [`MAX_DEPTH`], a record written as an array, any error) makes it refuse
//! the line, and the caller hands the line to `Record::from_json`, which
//! decides with its own message.

use std::borrow::Cow;
use std::time::Duration;

use cpt_sdk::path::{Accounting, Cause, Location, SegmentKind};
use cpt_sdk::trigger::Trigger;
use rustc_hash::FxHashMap;

use super::intern::{Flat, frame_hash_parts, same_bytes};
use super::*;

/// Nesting the scanner follows (the record object is depth 1); deeper
/// lines go to `Record::from_json` (whose limit is 128).
pub(super) const MAX_DEPTH: u32 = 64;

/// What of a record the selections look at besides service, trigger and
/// start time.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Wanted {
    pub(super) endpoint: bool,
    pub(super) ids: bool,
    pub(super) labels: bool,
}

/// The fields of one scanned line that are not its path.
#[derive(Debug, Default)]
pub(super) struct Head<'a> {
    pub(super) service: Cow<'a, str>,
    pub(super) endpoint: Option<Cow<'a, str>>,
    pub(super) trigger: Option<Trigger>,
    pub(super) latency_ns: u64,
    pub(super) start_unix_nanos: Option<u64>,
    pub(super) request_id: Option<Cow<'a, str>>,
    pub(super) trace_id: Option<Cow<'a, str>>,
    /// Labels in input order (a repeated key: the last one counts).
    pub(super) labels: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    pub(super) accounting: Accounting,
}

impl<'a> Head<'a> {
    /// A label's value (the last one given for the key).
    pub(super) fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| &**v)
    }
}

/// Frames interned by their borrowed parts: ids local to one scanner,
/// mapped to each partial's ids by the caller.
#[derive(Debug, Default)]
pub(super) struct Frames {
    pub(super) frames: Vec<Frame>,
    /// Frame id → its (service, name) id.
    sn: Vec<u32>,
    /// `(hash, frame id + 1)`, open addressing, at most half full.
    slots: Vec<(u64, u32)>,
    /// `(hash, (service, name) id + 1)`, likewise.
    sn_slots: Vec<(u64, u32)>,
    /// (service, name) id → a frame with that service and name.
    sn_frame: Vec<u32>,
    /// (service, name) id → (record generation, the frame it last stood
    /// for in that record).
    last: Vec<(u32, u32)>,
    generation: u32,
    /// Stack entries written out in full (`service` and `file` given) by
    /// their exact bytes: the same bytes are the same frame wherever they
    /// stand, so a repeated entry is found without parsing it. At most
    /// [`SPELLED_MAX`] entries.
    spelled: FxHashMap<Box<[u8]>, u32>,
}

/// The most entries [`Frames::spelled`] keeps.
const SPELLED_MAX: usize = 1 << 14;

/// Insert `(h, v)` into an open-addressing table (grown to stay at most half
/// full; `len` entries before this one).
fn place(slots: &mut Vec<(u64, u32)>, len: usize, h: u64, v: u32) {
    if (len + 1) * 2 > slots.len() {
        let size = (slots.len() * 2).max(256);
        let old = std::mem::replace(slots, vec![(0, 0); size]);
        for e in old.into_iter().filter(|e| e.1 != 0) {
            put(slots, e);
        }
    }
    put(slots, (h, v));
}

fn put(slots: &mut [(u64, u32)], e: (u64, u32)) {
    let mask = slots.len() - 1;
    let mut i = e.0 as usize & mask;
    while slots[i].1 != 0 {
        i = (i + 1) & mask;
    }
    slots[i] = e;
}

impl Frames {
    /// Start a record: no frame stands for a (service, name) yet.
    fn begin_record(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.last.iter_mut().for_each(|e| e.0 = 0);
            self.generation = 1;
        }
    }

    /// The frame of a stack entry written out in full seen before, as
    /// [`Frames::resolve`] would find it.
    #[inline]
    fn spelled(&mut self, raw: &[u8]) -> Option<u32> {
        let id = *self.spelled.get(raw)?;
        let sn = self.sn[id as usize];
        self.last[sn as usize] = (self.generation, id);
        Some(id)
    }

    fn remember_spelled(&mut self, raw: &[u8], id: u32) {
        if self.spelled.len() < SPELLED_MAX {
            self.spelled.insert(raw.into(), id);
        }
    }

    /// The (service, name) id, if some frame had them.
    #[inline]
    fn find_sn(&self, service: &str, name: &str) -> Option<u32> {
        if self.sn_slots.is_empty() {
            return None;
        }
        let h = frame_hash_parts(name.as_bytes(), service.as_bytes(), None);
        let mask = self.sn_slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            let (sh, id1) = self.sn_slots[i];
            if id1 == 0 {
                return None;
            }
            if sh == h {
                let f = &self.frames[self.sn_frame[id1 as usize - 1] as usize];
                if same_bytes(f.name.as_bytes(), name.as_bytes())
                    && same_bytes(f.service.as_bytes(), service.as_bytes())
                {
                    return Some(id1 - 1);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// The frame a stack entry stands for, as `Record::from_json` resolves
    /// it: without `file`, the frame its (service, name) last stood for in
    /// this record, if any; else the frame at `file` (none when `""`).
    #[inline]
    pub(super) fn resolve(
        &mut self,
        service: &str,
        name: &str,
        file: Option<&str>,
        line: Option<u32>,
    ) -> u32 {
        if file.is_none()
            && let Some(sn) = self.find_sn(service, name)
        {
            let (generation, id) = self.last[sn as usize];
            if generation == self.generation {
                return id;
            }
        }
        let location = file
            .filter(|f| !f.is_empty())
            .map(|f| (f, line.unwrap_or(0)));
        let id = self.intern(service, name, location);
        let sn = self.sn[id as usize];
        self.last[sn as usize] = (self.generation, id);
        id
    }

    #[inline]
    fn intern(&mut self, service: &str, name: &str, location: Option<(&str, u32)>) -> u32 {
        let h = frame_hash_parts(name.as_bytes(), service.as_bytes(), location.map(|l| l.1));
        if !self.slots.is_empty() {
            let mask = self.slots.len() - 1;
            let mut i = h as usize & mask;
            loop {
                let (sh, id1) = self.slots[i];
                if id1 == 0 {
                    break;
                }
                if sh == h {
                    let f = &self.frames[id1 as usize - 1];
                    let same_location = match (&f.location, location) {
                        (None, None) => true,
                        (Some(l), Some((file, line))) => {
                            l.line == line && same_bytes(l.file.as_bytes(), file.as_bytes())
                        }
                        _ => false,
                    };
                    if same_location
                        && same_bytes(f.name.as_bytes(), name.as_bytes())
                        && same_bytes(f.service.as_bytes(), service.as_bytes())
                    {
                        return id1 - 1;
                    }
                }
                i = (i + 1) & mask;
            }
        }
        let id = self.frames.len() as u32;
        let sn = match self.find_sn(service, name) {
            Some(sn) => sn,
            None => {
                let sn = self.sn_frame.len() as u32;
                let hs = frame_hash_parts(name.as_bytes(), service.as_bytes(), None);
                place(&mut self.sn_slots, self.sn_frame.len(), hs, sn + 1);
                self.sn_frame.push(id);
                self.last.push((0, 0));
                sn
            }
        };
        self.frames.push(Frame {
            service: Arc::from(service),
            name: Arc::from(name),
            location: location.map(|(file, line)| Location {
                file: Arc::from(file),
                line,
            }),
        });
        self.sn.push(sn);
        place(&mut self.slots, self.frames.len() - 1, h, id + 1);
        id
    }
}

/// The first byte at or after `i` that is `"`, `\` or a control character
/// (`b.len()` if none), eight bytes at a time.
#[inline]
fn find_special(b: &[u8], mut i: usize) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    while i + 8 <= b.len() {
        let w = u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let q = w ^ (LO * u64::from(b'"'));
        let bs = w ^ (LO * u64::from(b'\\'));
        // A byte is flagged when it is zero (after the xor) or below 0x20;
        // the lowest flagged byte is exact, which is the one taken.
        let m =
            (q.wrapping_sub(LO) & !q | bs.wrapping_sub(LO) & !bs | w.wrapping_sub(LO * 0x20) & !w)
                & HI;
        if m != 0 {
            return i + (m.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\\' || c < 0x20 {
            return i;
        }
        i += 1;
    }
    i
}

/// How a skipped string is checked when it has escapes: as a string field
/// (`serde_json`'s strict decoding) or as an ignored value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    Str,
    Ignored,
}

/// A position in one line (valid UTF-8, so every cut at an ASCII byte is
/// a `str` boundary).
struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Cursor<'a> {
    #[inline]
    fn b(&self) -> &'a [u8] {
        self.s.as_bytes()
    }

    /// The next byte after whitespace (not consumed).
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        let b = self.b();
        while let Some(&c) = b.get(self.i) {
            if c == b' ' || c == b'\n' || c == b'\t' || c == b'\r' {
                self.i += 1;
            } else {
                return Some(c);
            }
        }
        None
    }

    #[inline]
    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    #[inline]
    fn expect(&mut self, c: u8) -> Option<()> {
        self.eat(c).then_some(())
    }

    /// `null`, consumed if next.
    #[inline]
    fn null(&mut self) -> Option<bool> {
        if self.peek() != Some(b'n') {
            return Some(false);
        }
        self.literal(b"null")?;
        Some(true)
    }

    fn literal(&mut self, lit: &[u8]) -> Option<()> {
        let b = self.b();
        if b.get(self.i..self.i + lit.len()) == Some(lit) {
            self.i += lit.len();
            Some(())
        } else {
            None
        }
    }

    /// A string's raw content (between the quotes) and whether it has
    /// escapes; the escapes themselves are checked by the caller.
    #[inline]
    fn raw_str(&mut self) -> Option<(usize, usize, bool)> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let b = self.b();
        let start = self.i + 1;
        let mut i = start;
        let mut escaped = false;
        loop {
            i = find_special(b, i);
            match b.get(i) {
                Some(b'"') => {
                    self.i = i + 1;
                    return Some((start, i, escaped));
                }
                Some(b'\\') => {
                    escaped = true;
                    i += 2;
                }
                _ => return None,
            }
        }
    }

    /// A string, borrowed unless it has escapes.
    #[inline]
    fn str(&mut self) -> Option<Cow<'a, str>> {
        let (start, end, escaped) = self.raw_str()?;
        if escaped {
            serde_json::from_str::<String>(&self.s[start - 1..=end])
                .ok()
                .map(Cow::Owned)
        } else {
            Some(Cow::Borrowed(&self.s[start..end]))
        }
    }

    /// A string checked but not kept.
    #[inline]
    fn skip_str(&mut self, check: Check) -> Option<()> {
        let (start, end, escaped) = self.raw_str()?;
        if escaped {
            let text = &self.s[start - 1..=end];
            let ok = match check {
                Check::Str => serde_json::from_str::<String>(text).is_ok(),
                Check::Ignored => serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok(),
            };
            ok.then_some(())
        } else {
            Some(())
        }
    }

    /// A non-negative integer without fraction or exponent, as `u64`.
    #[inline]
    fn u64(&mut self) -> Option<u64> {
        let first = self.peek()?;
        let b = self.b();
        let mut i = self.i + 1;
        let mut v = u64::from(first.wrapping_sub(b'0'));
        if v > 9 {
            return None;
        }
        if v != 0 {
            while let Some(&c) = b.get(i) {
                let d = c.wrapping_sub(b'0');
                if d > 9 {
                    break;
                }
                v = v.checked_mul(10)?.checked_add(u64::from(d))?;
                i += 1;
            }
        }
        // A fraction, an exponent or a leading zero: `Record::from_json`
        // decides.
        if matches!(b.get(i), Some(b'.' | b'e' | b'E' | b'0'..=b'9')) {
            return None;
        }
        self.i = i;
        Some(v)
    }

    /// Any JSON number, checked, not kept.
    fn skip_number(&mut self) -> Option<()> {
        let b = self.b();
        let mut i = self.i;
        let digits = |i: &mut usize| {
            let s = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i > s
        };
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                digits(&mut i);
            }
            _ => return None,
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            if !digits(&mut i) {
                return None;
            }
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if !digits(&mut i) {
                return None;
            }
        }
        if b.get(i).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        self.i = i;
        Some(())
    }

    /// Any JSON value, checked, not kept; `depth` is the nesting of the
    /// value's container.
    fn skip(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'"' => self.skip_str(Check::Ignored),
            b'{' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                self.i += 1;
                if self.eat(b'}') {
                    return Some(());
                }
                loop {
                    self.skip_str(Check::Ignored)?;
                    self.expect(b':')?;
                    self.skip(depth + 1)?;
                    if !self.eat(b',') {
                        return self.expect(b'}');
                    }
                }
            }
            b'[' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                self.i += 1;
                if self.eat(b']') {
                    return Some(());
                }
                loop {
                    self.skip(depth + 1)?;
                    if !self.eat(b',') {
                        return self.expect(b']');
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.skip_number(),
        }
    }

    /// The members of an object, each key handed to `member` with the
    /// cursor at its value (which `member` must consume).
    #[inline]
    fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, Cow<'a, str>) -> Option<()>,
    ) -> Option<()> {
        self.expect(b'{')?;
        if self.eat(b'}') {
            return Some(());
        }
        loop {
            let key = self.str()?;
            self.expect(b':')?;
            member(self, key)?;
            if !self.eat(b',') {
                return self.expect(b'}');
            }
        }
    }

    /// The elements of an array, each handed to `element`.
    #[inline]
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.expect(b'[')?;
        if self.eat(b']') {
            return Some(());
        }
        loop {
            element(self)?;
            if !self.eat(b',') {
                return self.expect(b']');
            }
        }
    }

    /// `null` or a string.
    #[inline]
    fn opt_str(&mut self) -> Option<Option<Cow<'a, str>>> {
        if self.null()? {
            return Some(None);
        }
        self.str().map(Some)
    }

    /// `null` or a string, checked, not kept.
    #[inline]
    fn skip_opt_str(&mut self) -> Option<()> {
        if self.null()? {
            return Some(());
        }
        self.skip_str(Check::Str)
    }
}

/// Mark field `bit` seen; `None` when it was already (a duplicate field,
/// which `Record::from_json` refuses).
#[inline]
fn once(seen: &mut u32, bit: u32) -> Option<()> {
    let b = 1 << bit;
    if *seen & b != 0 {
        return None;
    }
    *seen |= b;
    Some(())
}

/// Scan one line (trimmed, valid UTF-8) into `head` and `flat` (the
/// segments' stacks as ids of `frames`). `None`: the scanner refuses the
/// line (see the [module docs](self)); `head` and `flat` are then
/// meaningless.
pub(super) fn scan_line<'a>(
    text: &'a str,
    want: Wanted,
    frames: &mut Frames,
    head: &mut Head<'a>,
    flat: &mut Flat,
) -> Option<()> {
    let mut c = Cursor { s: text, i: 0 };
    head.endpoint = None;
    head.start_unix_nanos = None;
    head.request_id = None;
    head.trace_id = None;
    head.trigger = None;
    head.labels.clear();
    head.accounting = Accounting::default();
    flat.clear();
    frames.begin_record();
    let mut seen = 0u32;
    // Where `path` starts when it comes before `service` (whose frames
    // inherit the record's service): it is scanned once the service is known.
    let mut path_at = None;
    c.object(|c, key| {
        match &*key {
            "service" => {
                once(&mut seen, 0)?;
                head.service = c.str()?;
            }
            "endpoint" => {
                once(&mut seen, 1)?;
                if want.endpoint {
                    head.endpoint = c.opt_str()?;
                } else {
                    c.skip_opt_str()?;
                }
            }
            "trigger" => {
                once(&mut seen, 2)?;
                head.trigger = Some(Trigger::parse(&c.str()?)?);
            }
            "latency_ns" => {
                once(&mut seen, 3)?;
                head.latency_ns = c.u64()?;
            }
            "start_unix_nanos" => {
                once(&mut seen, 4)?;
                head.start_unix_nanos = if c.null()? { None } else { Some(c.u64()?) };
            }
            "request_id" => {
                once(&mut seen, 5)?;
                if want.ids {
                    head.request_id = c.opt_str()?;
                } else {
                    c.skip_opt_str()?;
                }
            }
            "trace_id" => {
                once(&mut seen, 6)?;
                if want.ids {
                    head.trace_id = c.opt_str()?;
                } else {
                    c.skip_opt_str()?;
                }
            }
            "labels" => {
                once(&mut seen, 7)?;
                if !c.null()? {
                    c.object(|c, k| {
                        if want.labels {
                            let v = c.str()?;
                            head.labels.push((k, v));
                            Some(())
                        } else {
                            c.skip_str(Check::Str)
                        }
                    })?;
                }
            }
            "path" => {
                once(&mut seen, 8)?;
                if seen & 1 != 0 {
                    path(c, &head.service, frames, flat)?;
                } else {
                    path_at = Some(c.i);
                    c.skip(1)?;
                }
            }
            "accounting" => {
                once(&mut seen, 9)?;
                if !c.null()? {
                    accounting(c, &mut head.accounting)?;
                }
            }
            _ => c.skip(1)?,
        }
        Some(())
    })?;
    if c.peek().is_some() {
        return None;
    }
    // Required: service, trigger, latency_ns, path.
    if seen & 0b1_0000_1101 != 0b1_0000_1101 {
        return None;
    }
    if let Some(at) = path_at {
        let mut c = Cursor { s: text, i: at };
        path(&mut c, &head.service, frames, flat)?;
    }
    // The checks of `Record::from_json`: segments summing to the latency.
    let mut sum: u64 = 0;
    for &(_, ns, _) in &flat.segs {
        sum = sum.checked_add(ns)?;
    }
    (sum == head.latency_ns).then_some(())
}

/// The `accounting` object: `{cause}_ns` keys, unknown keys ignored, a
/// repeated one refused.
fn accounting(c: &mut Cursor<'_>, a: &mut Accounting) -> Option<()> {
    let mut seen = 0u32;
    c.object(|c, key| {
        match key.strip_suffix("_ns").and_then(Cause::from_name) {
            Some(cause) => {
                once(&mut seen, cause as u32)?;
                a.set(cause, Duration::from_nanos(c.u64()?));
            }
            None => c.skip(2)?,
        }
        Some(())
    })
}

/// The `path` array: each segment's stack resolved to frame ids.
fn path(c: &mut Cursor<'_>, service: &str, frames: &mut Frames, flat: &mut Flat) -> Option<()> {
    c.array(|c| {
        let mut seen = 0u32;
        let mut ns = 0;
        let mut kind = SegmentKind::Busy;
        let mut wait = false;
        c.object(|c, key| {
            match &*key {
                "stack" => {
                    once(&mut seen, 0)?;
                    // A bare name's service is the entry's before it (the
                    // record's for the first).
                    let mut parent = None;
                    let before = flat.ids.len();
                    c.array(|c| {
                        let id = frame(c, parent, service, frames)?;
                        flat.ids.push(id);
                        parent = Some(id);
                        Some(())
                    })?;
                    if flat.ids.len() == before {
                        return None;
                    }
                }
                "ns" => {
                    once(&mut seen, 1)?;
                    ns = c.u64()?;
                }
                "kind" => {
                    once(&mut seen, 2)?;
                    if !c.null()? {
                        kind = SegmentKind::parse(&c.str()?)?;
                    }
                }
                // A named wait: `"kind":"unattributed","wait":true`.
                "wait" => {
                    once(&mut seen, 3)?;
                    match c.peek() {
                        Some(b't') => {
                            c.literal(b"true")?;
                            wait = true;
                        }
                        Some(b'f') => c.literal(b"false")?,
                        _ => {
                            c.null()?;
                        }
                    }
                }
                _ => c.skip(3)?,
            }
            Some(())
        })?;
        if seen & 0b11 != 0b11 {
            return None;
        }
        if wait {
            // As `Record::from_json` reads it (which names a bad one).
            match kind {
                SegmentKind::Unattributed | SegmentKind::Wait => kind = SegmentKind::Wait,
                _ => return None,
            }
        }
        flat.end_segment(ns, kind);
        Some(())
    })
}

/// One stack entry (a bare name or `{"name", "service", "file", "line"}`)
/// as a frame id; a missing service is the `parent` frame's (the record's
/// `service` when `None`).
#[inline]
fn frame(
    c: &mut Cursor<'_>,
    parent: Option<u32>,
    service: &str,
    frames: &mut Frames,
) -> Option<u32> {
    let inherited = |frames: &Frames| -> Arc<str> {
        match parent {
            Some(p) => Arc::clone(&frames.frames[p as usize].service),
            None => Arc::from(service),
        }
    };
    if c.peek()? == b'"' {
        let name = c.str()?;
        return Some(match parent {
            None => frames.resolve(service, &name, None, None),
            Some(_) => {
                let s = inherited(frames);
                frames.resolve(&s, &name, None, None)
            }
        });
    }
    let b = c.b();
    let start = c.i;
    // An entry written out in full before: its bytes up to the first `}`.
    let end = memchr::memchr(b'}', b.get(start..)?).map(|e| start + e + 1);
    if let Some(end) = end
        && let Some(id) = frames.spelled(&b[start..end])
    {
        c.i = end;
        return Some(id);
    }
    let (mut name, mut given, mut file, mut line) = (None, None, None, None);
    let mut seen = 0u32;
    c.object(|c, key| {
        match &*key {
            "name" => {
                once(&mut seen, 0)?;
                name = Some(c.str()?);
            }
            "service" => {
                once(&mut seen, 1)?;
                given = c.opt_str()?;
            }
            "file" => {
                once(&mut seen, 2)?;
                file = c.opt_str()?;
            }
            "line" => {
                once(&mut seen, 3)?;
                line = if c.null()? {
                    None
                } else {
                    Some(u32::try_from(c.u64()?).ok()?)
                };
            }
            _ => c.skip(4)?,
        }
        Some(())
    })?;
    let name = name?;
    let spelled = given.is_some() && file.is_some();
    let id = match (given, parent) {
        (Some(s), _) => frames.resolve(&s, &name, file.as_deref(), line),
        (None, None) => frames.resolve(service, &name, file.as_deref(), line),
        (None, Some(_)) => {
            let s = inherited(frames);
            frames.resolve(&s, &name, file.as_deref(), line)
        }
    };
    // Neither service nor location depends on what came before: the same
    // bytes are this frame wherever they stand.
    if spelled && end == Some(c.i) {
        frames.remember_spelled(&b[start..c.i], id);
    }
    Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_special_finds_the_first_quote_backslash_or_control_byte() {
        let cases: &[(&[u8], usize)] = &[
            (b"abc\"", 3),
            (b"abcdefghijk\"", 11),
            (b"abcdefgh\\ijk\"", 8),
            (b"abcdefghij\tk\"", 10),
            (b"\x1f", 0),
            (b"abcdefghijklmnop", 16),
            (b"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"", 8),
            (b"  \x7f\x80\xff \" ", 6),
        ];
        for &(b, want) in cases {
            assert_eq!(find_special(b, 0), want, "{b:?}");
        }
    }
}
