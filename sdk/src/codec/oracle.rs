//! The codec as it was before it was made faster (session 3), kept as the
//! oracle of the tests in this module: the new encoder must write the same
//! bytes and the new decoder must return the same path or the same error for
//! any input, so the wire form and its errors cannot drift.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use prost::Message;

use super::decode::Kind;
use super::proto::{AccountingProto, PathProto};
use super::strings::StringTable;
use super::{DecodeError, DecodeLimits, EncodeOptions, MIN_MAX_BYTES, VERSION, kind};
use crate::path::{Accounting, CriticalPath, Frame, FrameId, Location, Stack};

const MAX_ENCODE_ENTRIES: usize = 1 << 24;

/// The old `decode`.
pub(super) fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<CriticalPath, DecodeError> {
    if bytes.len() > limits.max_bytes {
        return Err(Kind::TooLarge {
            len: bytes.len(),
            max: limits.max_bytes,
        }
        .into());
    }
    let msg = PathProto::decode(bytes).map_err(Kind::Protobuf)?;
    let depths = validate(&msg, limits)?;
    Ok(build_path(&msg, &depths))
}

/// The old `encode`.
pub(super) fn encode(path: &CriticalPath, options: &EncodeOptions) -> Vec<u8> {
    let limits = &options.decode_limits;
    let max = options.max_bytes.min(limits.max_bytes).max(MIN_MAX_BYTES);
    let total = path
        .segments()
        .iter()
        .fold(0u128, |acc, s| acc.saturating_add(s.duration.as_nanos()));
    if let Ok(total) = u64::try_from(total) {
        // A stack of depth d needs d tree entries of at least 3 bytes each,
        // so deeper cuts cannot fit: start at max / 3.
        let deepest = path.depth().min(max / 3).min(limits.max_depth);
        for depth in (0..=deepest).rev() {
            if let Some(msg) = build(path, depth, total, max, limits)
                && msg.encoded_len() <= max
            {
                return msg.encode_to_vec();
            }
        }
    }
    fallback(path, total).encode_to_vec()
}

/// The wire message for `path` coarsened to `depth`, or `None` when it is
/// over a count of `limits`, or clearly over `max` before it is finished.
fn build(
    path: &CriticalPath,
    depth: usize,
    total: u64,
    max: usize,
    limits: &DecodeLimits,
) -> Option<PathProto> {
    let mut strings = StringTable::default();
    // (parent ref, frame) -> entry index; parent ref 0 is "no parent".
    let mut entries: HashMap<(u32, FrameId), u32> = HashMap::default();
    let mut msg = PathProto {
        version: VERSION,
        ..PathProto::default()
    };
    msg.segment_entry_kind.reserve(path.segments().len());
    msg.segment_duration_nanos.reserve(path.segments().len());
    let mut any_location = false;
    // Entries of the previous segment's (cut) stack: consecutive segments
    // share most of their prefix, so most lookups are skipped.
    let mut prev: Vec<u32> = Vec::new();
    let mut prev_stack: &[FrameId] = &[];
    let mut folded: u128 = 0;
    let mut stack_frames: usize = 0;

    for seg in path.segments() {
        let nanos = u64::try_from(seg.duration.as_nanos()).ok()?;
        if nanos == 0 {
            continue;
        }
        let stack = &seg.stack[..seg.stack.len().min(depth)];
        if stack.len() < seg.stack.len() {
            folded += u128::from(nanos);
        }
        let common = stack
            .iter()
            .zip(prev_stack)
            .take_while(|(a, b)| a == b)
            .count();
        prev.truncate(common);
        for &frame_id in &stack[common..] {
            let parent_ref = prev.last().map_or(0, |p| p + 1);
            let entry = match entries.get(&(parent_ref, frame_id)) {
                Some(e) => *e,
                None => {
                    let i = msg.tree_parent.len();
                    if i >= MAX_ENCODE_ENTRIES {
                        return None;
                    }
                    let i = i as u32;
                    let frame = path.frame(frame_id);
                    msg.tree_parent.push(prev.last().map_or(0, |p| i - p));
                    msg.tree_service.push(strings.intern(&frame.service));
                    msg.tree_name.push(strings.intern(&frame.name));
                    match &frame.location {
                        Some(loc) => {
                            any_location = true;
                            msg.tree_file.push(strings.intern(&loc.file) + 1);
                            msg.tree_line.push(loc.line);
                        }
                        None => {
                            msg.tree_file.push(0);
                            msg.tree_line.push(0);
                        }
                    }
                    entries.insert((parent_ref, frame_id), i);
                    i
                }
            };
            prev.push(entry);
        }
        prev_stack = stack;
        // Cheap early exit: every tree entry costs at least 3 bytes (parent,
        // service, name) and every segment at least 2 (code, duration).
        if msg.segment_entry_kind.len() * 2 + msg.tree_parent.len() * 3 > max
            || msg.tree_parent.len() > limits.max_tree_entries
        {
            return None;
        }

        let entry_ref = prev.last().map_or(0, |e| e + 1);
        let code = (entry_ref << kind::BITS) | kind::to_wire(seg.kind);
        if msg.segment_entry_kind.last() == Some(&code) {
            let last = msg
                .segment_duration_nanos
                .last_mut()
                .expect("the duration column is as long as the entry column");
            // Both are parts of `total`, which fits in u64.
            *last = last.saturating_add(nanos);
        } else {
            msg.segment_entry_kind.push(code);
            msg.segment_duration_nanos.push(nanos);
            stack_frames += stack.len();
            if msg.segment_entry_kind.len() > limits.max_segments
                || stack_frames > limits.max_stack_frames
            {
                return None;
            }
        }
    }
    if !any_location {
        msg.tree_file.clear();
        msg.tree_line.clear();
    }
    msg.strings = strings.into_strings();
    if msg.strings.len() > limits.max_strings {
        return None;
    }

    let mut accounting = accounting_to_wire(&path.accounting);
    if folded > 0 {
        let truncated = u128::from(accounting.truncated_nanos) + folded;
        accounting.truncated_nanos = truncated.min(u128::from(total)) as u64;
    }
    msg.accounting = (accounting != AccountingProto::default()).then_some(accounting);
    Some(msg)
}

/// One busy segment with an empty stack carrying the whole total (clamped
/// to `u64::MAX` ns), all of it truncated.
fn fallback(path: &CriticalPath, total: u128) -> PathProto {
    let total = u64::try_from(total).unwrap_or(u64::MAX);
    let mut accounting = accounting_to_wire(&path.accounting);
    accounting.truncated_nanos = total;
    let (codes, durations) = if total == 0 {
        (Vec::new(), Vec::new())
    } else {
        (vec![kind::to_wire(crate::SegmentKind::Busy)], vec![total])
    };
    PathProto {
        version: VERSION,
        segment_entry_kind: codes,
        segment_duration_nanos: durations,
        accounting: (accounting != AccountingProto::default()).then_some(accounting),
        ..PathProto::default()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn accounting_to_wire(a: &Accounting) -> AccountingProto {
    AccountingProto {
        network_nanos: nanos(a.network),
        overcount_nanos: nanos(a.overcount),
        blind_spot_nanos: nanos(a.blind_spot),
        unattributed_nanos: nanos(a.unattributed),
        queueing_nanos: nanos(a.queueing),
        truncated_nanos: nanos(a.truncated),
        clock_skew_nanos: nanos(a.clock_skew),
    }
}

fn too_many(what: &'static str, count: usize, max: usize) -> Result<(), Kind> {
    if count > max {
        Err(Kind::TooMany { what, count, max })
    } else {
        Ok(())
    }
}

fn same_len(what: &'static str, found: usize, expected: usize) -> Result<(), Kind> {
    if found != expected {
        Err(Kind::ColumnLength {
            what,
            found,
            expected,
        })
    } else {
        Ok(())
    }
}

/// Check everything `build` relies on; return each tree entry's depth.
fn validate(msg: &PathProto, limits: &DecodeLimits) -> Result<Vec<usize>, Kind> {
    if msg.version != VERSION {
        return Err(Kind::Version { found: msg.version });
    }
    let strings = msg.strings.len();
    let entries = msg.tree_parent.len();
    let segments = msg.segment_entry_kind.len();
    too_many("strings", strings, limits.max_strings)?;
    too_many("tree entries", entries, limits.max_tree_entries)?;
    too_many("segments", segments, limits.max_segments)?;
    same_len("tree_service", msg.tree_service.len(), entries)?;
    same_len("tree_name", msg.tree_name.len(), entries)?;
    let has_locations = !(msg.tree_file.is_empty() && msg.tree_line.is_empty());
    if has_locations {
        same_len("tree_file", msg.tree_file.len(), entries)?;
        same_len("tree_line", msg.tree_line.len(), entries)?;
    }
    same_len(
        "segment_duration_nanos",
        msg.segment_duration_nanos.len(),
        segments,
    )?;

    let string = |entry: usize, what: &'static str, index: u32| {
        if (index as usize) < strings {
            Ok(())
        } else {
            Err(Kind::StringIndex {
                entry,
                what,
                index,
                len: strings,
            })
        }
    };
    let mut depths = Vec::with_capacity(entries);
    for (i, &back) in msg.tree_parent.iter().enumerate() {
        let depth = if back == 0 {
            1
        } else {
            // Parents come first: a parent at or after `i` (a forward
            // reference, itself, or a cycle) cannot be written.
            let parent = i
                .checked_sub(back as usize)
                .ok_or(Kind::Parent { entry: i, back })?;
            depths[parent] + 1
        };
        if depth > limits.max_depth {
            return Err(Kind::TooDeep {
                entry: i,
                depth,
                max: limits.max_depth,
            });
        }
        depths.push(depth);
        string(i, "service", msg.tree_service[i])?;
        string(i, "name", msg.tree_name[i])?;
        if has_locations {
            match msg.tree_file[i] {
                0 if msg.tree_line[i] != 0 => {
                    return Err(Kind::LineWithoutFile {
                        entry: i,
                        line: msg.tree_line[i],
                    });
                }
                0 => {}
                file => string(i, "file", file - 1)?,
            }
        }
    }

    let mut total: u64 = 0;
    let mut stack_frames: usize = 0;
    for (s, (&code, &nanos)) in msg
        .segment_entry_kind
        .iter()
        .zip(&msg.segment_duration_nanos)
        .enumerate()
    {
        let entry_ref = code >> kind::BITS;
        if entry_ref as usize > entries {
            return Err(Kind::SegmentEntry {
                segment: s,
                entry_ref,
                entries,
            });
        }
        if kind::from_wire(code & kind::MASK).is_none() {
            return Err(Kind::SegmentCode {
                segment: s,
                code: code & kind::MASK,
            });
        }
        if nanos == 0 {
            return Err(Kind::ZeroDuration { segment: s });
        }
        total = total.checked_add(nanos).ok_or(Kind::DurationOverflow)?;
        if entry_ref > 0 {
            stack_frames = stack_frames.saturating_add(depths[entry_ref as usize - 1]);
        }
    }
    if stack_frames > limits.max_stack_frames {
        return Err(Kind::TooManyStackFrames {
            frames: stack_frames,
            max: limits.max_stack_frames,
        });
    }
    Ok(depths)
}

/// Build the path from a validated message.
fn build_path(msg: &PathProto, depths: &[usize]) -> CriticalPath {
    let strings: Vec<Arc<str>> = msg.strings.iter().map(|s| Arc::from(s.as_str())).collect();
    let has_locations = !msg.tree_file.is_empty();
    let mut path = CriticalPath::new();
    path.reserve(msg.segment_entry_kind.len());
    // Tree entry -> frame id, interned at first use so that the frame table
    // is in first-use order (what `CriticalPath::compact` produces).
    let mut frame_of: Vec<Option<FrameId>> = vec![None; msg.tree_parent.len()];
    let mut chain: Vec<usize> = Vec::new();

    for (&code, &nanos) in msg
        .segment_entry_kind
        .iter()
        .zip(&msg.segment_duration_nanos)
    {
        let entry_ref = (code >> kind::BITS) as usize;
        let kind =
            kind::from_wire(code & kind::MASK).expect("kind checked in `validate`; this is a bug");
        chain.clear();
        if entry_ref > 0 {
            let mut e = entry_ref - 1;
            chain.push(e);
            while msg.tree_parent[e] != 0 {
                e -= msg.tree_parent[e] as usize;
                chain.push(e);
            }
        }
        debug_assert_eq!(chain.len(), chain.first().map_or(0, |e| depths[*e]));
        let mut stack = Stack::with_capacity(chain.len());
        for &e in chain.iter().rev() {
            let id = *frame_of[e].get_or_insert_with(|| {
                let file = if has_locations { msg.tree_file[e] } else { 0 };
                let frame = Frame {
                    service: strings[msg.tree_service[e] as usize].clone(),
                    name: strings[msg.tree_name[e] as usize].clone(),
                    location: (file != 0).then(|| Location {
                        file: strings[file as usize - 1].clone(),
                        line: msg.tree_line[e],
                    }),
                };
                path.intern(frame)
            });
            stack.push(id);
        }
        path.push(stack, Duration::from_nanos(nanos), kind);
    }
    path.accounting = accounting_from_wire(msg.accounting.unwrap_or_default());
    path
}

fn accounting_from_wire(a: AccountingProto) -> Accounting {
    Accounting {
        network: Duration::from_nanos(a.network_nanos),
        overcount: Duration::from_nanos(a.overcount_nanos),
        blind_spot: Duration::from_nanos(a.blind_spot_nanos),
        unattributed: Duration::from_nanos(a.unattributed_nanos),
        queueing: Duration::from_nanos(a.queueing_nanos),
        truncated: Duration::from_nanos(a.truncated_nanos),
        clock_skew: Duration::from_nanos(a.clock_skew_nanos),
    }
}

// --- the new codec against the old one ----------------------------------------

/// Frames with repeats, equal contents behind different `Arc`s, empty and
/// non-ASCII strings, and locations on some.
fn arb_frame() -> impl Strategy<Value = Frame> {
    (
        0usize..4,
        0usize..6,
        prop::option::of((0usize..3, 0u32..2000)),
    )
        .prop_map(|(service, name, location)| {
            const SERVICES: [&str; 4] = ["A", "B", "frontend", ""];
            const NAMES: [&str; 6] = ["A1", "B1", "handle_request", "", "é€", "A"];
            const FILES: [&str; 3] = ["src/main.rs", "examples/src/system.rs", "A1"];
            // A fresh `Arc` per frame: the codec must dedupe by content.
            let frame = Frame::new(SERVICES[service].to_owned(), NAMES[name].to_owned());
            match location {
                Some((file, line)) => frame.with_location(FILES[file].to_owned(), line),
                None => frame,
            }
        })
}

fn arb_kind() -> impl Strategy<Value = crate::SegmentKind> {
    use crate::SegmentKind::*;
    prop::sample::select(vec![Busy, Queueing, Unattributed, Network, BlindSpot])
}

/// A walk over a small pool of frames: neighbouring stacks share prefixes,
/// frames recur at several depths, some durations are huge or zero.
fn arb_path() -> impl Strategy<Value = CriticalPath> {
    (
        prop::collection::vec(arb_frame(), 1..12),
        prop::collection::vec(
            (0usize..4, 0usize..12, arb_kind(), 0u64..4, any::<u64>()),
            0..60,
        ),
        any::<[u32; 7]>(),
    )
        .prop_map(|(pool, steps, acc)| {
            let mut p = CriticalPath::new();
            let mut stack: Vec<Frame> = Vec::new();
            for (op, f, kind, scale, n) in steps {
                match op {
                    0 | 1 if stack.len() < 14 => stack.push(pool[f % pool.len()].clone()),
                    2 => {
                        stack.pop();
                    }
                    _ => {
                        if let Some(last) = stack.last_mut() {
                            *last = pool[f % pool.len()].clone();
                        }
                    }
                }
                let nanos = match scale {
                    0 => 0,
                    1 => n % 1000,
                    2 => n % 10_000_000_000,
                    _ => n,
                };
                p.push_frames(stack.iter().cloned(), Duration::from_nanos(nanos), kind);
            }
            let d = |i: usize| Duration::from_nanos(u64::from(acc[i]) * 1000);
            p.accounting = Accounting {
                network: d(0),
                overcount: d(1),
                blind_spot: d(2),
                unattributed: d(3),
                queueing: d(4),
                truncated: d(5),
                clock_skew: d(6),
            };
            p
        })
}

fn arb_options() -> impl Strategy<Value = EncodeOptions> {
    (
        prop_oneof![Just(usize::MAX), 0usize..3000],
        prop_oneof![Just(usize::MAX), 0usize..3000],
        1usize..40,
        1usize..60,
        0usize..16,
    )
        .prop_map(|(max_bytes, decode_bytes, entries, segments, depth)| {
            EncodeOptions::new()
                .with_max_bytes(max_bytes)
                .with_decode_limits(
                    DecodeLimits::new()
                        .with_max_bytes(decode_bytes)
                        .with_max_tree_entries(entries)
                        .with_max_strings(entries)
                        .with_max_segments(segments)
                        .with_max_depth(depth)
                        .with_max_stack_frames(segments * 3),
                )
        })
}

/// Messages near the valid ones: small indices so that many validate, and
/// every column free to disagree.
fn arb_message() -> impl Strategy<Value = PathProto> {
    let col = |n: u32| prop::collection::vec(0..n, 0..8);
    (
        prop_oneof![Just(VERSION), 0u32..3],
        prop::collection::vec("[a-c]{0,2}", 0..6),
        (col(4), col(7), col(7), col(8), col(3)),
        prop::collection::vec(0u32..80, 0..10),
        prop::collection::vec(prop_oneof![0u64..3, Just(u64::MAX)], 0..10),
        prop::option::of(any::<[u64; 7]>()),
    )
        .prop_map(
            |(version, strings, tree, codes, durations, acc)| PathProto {
                version,
                strings,
                tree_parent: tree.0,
                tree_service: tree.1,
                tree_name: tree.2,
                tree_file: tree.3,
                tree_line: tree.4,
                segment_entry_kind: codes,
                segment_duration_nanos: durations,
                accounting: acc.map(|a| AccountingProto {
                    network_nanos: a[0],
                    overcount_nanos: a[1],
                    blind_spot_nanos: a[2],
                    unattributed_nanos: a[3],
                    queueing_nanos: a[4],
                    truncated_nanos: a[5],
                    clock_skew_nanos: a[6],
                }),
            },
        )
}

/// Both decoders give the same path, or errors with the same message.
fn same_decoding(bytes: &[u8], limits: &DecodeLimits) -> Result<(), TestCaseError> {
    match (super::decode(bytes, limits), decode(bytes, limits)) {
        (Ok(new), Ok(old)) => prop_assert_eq!(new, old),
        (Err(new), Err(old)) => prop_assert_eq!(new.to_string(), old.to_string()),
        (new, old) => prop_assert!(false, "new {new:?}, old {old:?}"),
    }
    Ok(())
}

/// A varint of `value`, padded to `width` bytes (non-canonical when wider
/// than needed, up to the 10 bytes prost still reads, or 11 it rejects).
fn padded_varint(out: &mut Vec<u8>, mut value: u64, width: usize) {
    for i in 0..width {
        let last = i + 1 == width;
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        out.push(if last { byte } else { byte | 0x80 });
    }
}

/// Raw fields: any tag (known or not), any wire type, packed columns of
/// varints of every width (1 to 11 bytes), declared lengths a little off,
/// columns split over several fields or written unpacked.
fn arb_raw_fields() -> impl Strategy<Value = Vec<u8>> {
    let value = prop_oneof![0u64..8, 0u64..300, any::<u64>()];
    let field = (
        1u32..13,
        0u8..6,
        prop::collection::vec((value, 1usize..12), 0..6),
        -2i64..3,
    );
    prop::collection::vec(field, 0..10).prop_map(|fields| {
        let mut out = Vec::new();
        for (tag, wire, values, len_error) in fields {
            match wire {
                // Packed (or, for strings, a string of those bytes).
                0..=2 => {
                    let mut payload = Vec::new();
                    for (v, width) in &values {
                        let need = (64 - v.leading_zeros() as usize).div_ceil(7).max(1);
                        padded_varint(&mut payload, *v, (*width).max(need));
                    }
                    padded_varint(&mut out, u64::from(tag << 3 | 2), 1);
                    let len = (payload.len() as i64 + if wire == 0 { len_error } else { 0 }).max(0);
                    padded_varint(&mut out, len as u64, 1 + usize::from(wire == 1));
                    out.extend_from_slice(&payload);
                }
                // Unpacked varints.
                3 | 4 => {
                    for (v, _) in &values {
                        padded_varint(&mut out, u64::from(tag << 3), 1);
                        let need = (64 - v.leading_zeros() as usize).div_ceil(7).max(1);
                        padded_varint(&mut out, *v, need);
                    }
                }
                // Fixed-width and group wire types.
                _ => {
                    padded_varint(&mut out, u64::from(tag << 3 | (values.len() as u32 % 6)), 1);
                    out.extend(values.iter().map(|(v, _)| *v as u8));
                }
            }
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decode_agrees_with_the_old_decoder_on_raw_fields(bytes in arb_raw_fields()) {
        same_decoding(&bytes, &DecodeLimits::default())?;
    }

    #[test]
    fn encode_writes_the_bytes_the_old_encoder_wrote(p in arb_path(), options in arb_options()) {
        prop_assert_eq!(super::encode(&p, &options), encode(&p, &options));
        let unlimited = EncodeOptions::new().with_max_bytes(usize::MAX);
        prop_assert_eq!(super::encode(&p, &unlimited), encode(&p, &unlimited));
    }

    #[test]
    fn decode_agrees_with_the_old_decoder_on_messages(m in arb_message(), max_depth in 1usize..5) {
        let bytes = m.encode_to_vec();
        same_decoding(&bytes, &DecodeLimits::default())?;
        same_decoding(&bytes, &DecodeLimits::new().with_max_depth(max_depth).with_max_stack_frames(6))?;
    }

    #[test]
    fn decode_agrees_with_the_old_decoder_on_mutated_encodings(
        p in arb_path(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 0..4),
    ) {
        let mut bytes = encode(&p, &EncodeOptions::default());
        same_decoding(&bytes, &DecodeLimits::default())?;
        for (at, byte, op) in edits {
            match op {
                0 if !bytes.is_empty() => { let i = at.index(bytes.len()); bytes[i] = byte; }
                1 => { let i = at.index(bytes.len() + 1); bytes.insert(i, byte); }
                2 if !bytes.is_empty() => { let i = at.index(bytes.len()); bytes.remove(i); }
                _ => { let i = at.index(bytes.len() + 1); bytes.truncate(i); }
            }
        }
        same_decoding(&bytes, &DecodeLimits::default())?;
    }

    #[test]
    fn decode_agrees_with_the_old_decoder_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        same_decoding(&bytes, &DecodeLimits::default())?;
    }
}
