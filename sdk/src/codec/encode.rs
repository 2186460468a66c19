//! Writing a [`CriticalPath`] in the wire form, coarsening it to fit.

use rustc_hash::FxHashMap as HashMap;
use std::time::Duration;

use prost::Message;

use super::proto::{AccountingProto, PathProto};
use super::strings::StringTable;
use super::{DecodeLimits, EncodeOptions, MIN_MAX_BYTES, VERSION, kind};
use crate::path::{Accounting, CriticalPath, FrameId};

/// Tree entries beyond this make a depth "not fit" outright: entry refs must
/// stay below 2^29 to be shifted by the kind bits, and no limit a transport
/// accepts comes close.
const MAX_ENCODE_ENTRIES: usize = 1 << 24;

/// Encode `path` in the wire form, in at most `options.max_bytes` bytes and
/// within `options.decode_limits`, so that [`decode`](super::decode) with
/// those limits accepts it.
///
/// Over a limit the path is coarsened (deepest frames folded into their
/// parents, see [`CriticalPath::coarsen`]) one level at a time until it fits;
/// [`Accounting::truncated`] then says how much time lost its detail. If
/// even empty stacks do not fit, the result is one busy segment with an
/// empty stack carrying the whole total, all of it truncated (see the
/// [module docs](super)). Durations beyond `u64::MAX` nanoseconds (584
/// years) are clamped to it.
///
/// Equal paths encode to equal bytes. Frames no segment uses are not
/// written.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cpt_sdk::{CriticalPath, Frame, SegmentKind};
/// use cpt_sdk::codec::{decode, encode, DecodeLimits, EncodeOptions};
///
/// let mut p = CriticalPath::new();
/// let deep: Vec<_> = (0..50).map(|i| Frame::new("B", format!("handler_step_{i}"))).collect();
/// p.push_frames(deep, Duration::from_millis(7), SegmentKind::Busy);
///
/// let bytes = encode(&p, &EncodeOptions::new().with_max_bytes(300));
/// assert!(bytes.len() <= 300);
/// let back = decode(&bytes, &DecodeLimits::default())?;
/// assert_eq!(back.total(), Duration::from_millis(7));
/// assert_eq!(back.accounting.truncated, Duration::from_millis(7));
/// # Ok::<(), cpt_sdk::codec::DecodeError>(())
/// ```
pub fn encode(path: &CriticalPath, options: &EncodeOptions) -> Vec<u8> {
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
