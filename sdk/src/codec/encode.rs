//! Writing a [`CriticalPath`] in the wire form, coarsening it to fit.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap as HashMap;

use super::proto::{AccountingProto, PathOut};
use super::split::{SplitPath, fingerprint};
use super::strings::StringTable;
use super::{DecodeLimits, EncodeOptions, MIN_MAX_BYTES, SINGLE_VERSION, VERSION, kind};
use crate::path::{Accounting, Cause, CriticalPath, FrameId, SegmentKind};

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
    match encode_form(path, options, Form::Single) {
        Encoded::Single(bytes) => bytes,
        Encoded::Split(_) => unreachable!("asked for the single form; this is a bug"),
    }
}

/// Encode `path` in the split form (version [`VERSION`]): a frame
/// dictionary and the segments that refer to it, as the
/// [module docs](super) describe.
///
/// Everything [`encode`] promises holds for the pair: the two parts
/// together are at most `options.max_bytes` bytes (coarsened as `encode`
/// does until they are), and [`decode_frames`](super::decode_frames) +
/// [`decode_split`](super::decode_split) with `options.decode_limits`
/// accept them. Paths over the same frames (the same stacks, whatever
/// their durations, kinds and accounting) have byte-identical
/// dictionaries.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cpt_sdk::{CriticalPath, Frame, SegmentKind};
/// use cpt_sdk::codec::{decode_frames, decode_split, encode_split, DecodeLimits, EncodeOptions};
///
/// let path = |ms| {
///     let mut p = CriticalPath::new();
///     p.push_frames([Frame::new("B", "B1")], Duration::from_millis(ms), SegmentKind::Busy);
///     p
/// };
/// let (one, two) = (path(4), path(9));
/// let a = encode_split(&one, &EncodeOptions::default());
/// let b = encode_split(&two, &EncodeOptions::default());
/// assert_eq!(a.frames, b.frames);
/// let limits = DecodeLimits::default();
/// let frames = decode_frames(&a.frames, &limits)?;
/// assert_eq!(decode_split(&frames, &b.segments, &limits)?, two);
/// # Ok::<(), cpt_sdk::codec::DecodeError>(())
/// ```
pub fn encode_split(path: &CriticalPath, options: &EncodeOptions) -> SplitPath {
    match encode_form(path, options, Form::Split) {
        Encoded::Split(split) => split,
        Encoded::Single(_) => unreachable!("asked for the split form; this is a bug"),
    }
}

/// Which wire form to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// One message, version [`SINGLE_VERSION`].
    Single,
    /// A dictionary and a segments message, version [`VERSION`].
    Split,
}

enum Encoded {
    Single(Vec<u8>),
    Split(SplitPath),
}

fn encode_form(path: &CriticalPath, options: &EncodeOptions, form: Form) -> Encoded {
    // Every hop encodes a path on its response path: the builder's tables
    // and columns are taken from this thread's last encode and given back,
    // instead of allocated and freed each time (ten allocations a path).
    let scratch = SCRATCH.try_with(|s| s.take()).unwrap_or_default();
    let (bytes, scratch) = encode_with(path, options, form, scratch);
    if scratch.worth_keeping() {
        // Fails only while the thread is exiting: the buffers are dropped.
        let _ = SCRATCH.try_with(|s| s.set(scratch));
    }
    bytes
}

thread_local! {
    /// The buffers of this thread's last [`encode`] (empty while one runs).
    static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::new(Scratch::default());
}

/// A [`Builder`]'s buffers that outlive it: everything that does not borrow
/// the path.
#[derive(Debug, Default)]
struct Scratch {
    frame_strings: Vec<[u32; 3]>,
    entries: HashMap<(u32, FrameId), u32>,
    prev: Vec<u32>,
    /// `PathOut`'s u32 columns, in `PathOut::u32_columns` order.
    columns: [Vec<u32>; 6],
    durations: Vec<u64>,
}

impl Scratch {
    /// Buffers from a path this large or larger are not kept: one unusual
    /// path must not pin its memory in every thread that encoded one.
    const MAX_KEPT: usize = 4096;

    fn worth_keeping(&self) -> bool {
        self.entries.capacity() <= Self::MAX_KEPT
            && self.durations.capacity() <= Self::MAX_KEPT
            && self.frame_strings.capacity() <= Self::MAX_KEPT
            && self.columns.iter().all(|c| c.capacity() <= Self::MAX_KEPT)
    }
}

fn encode_with(
    path: &CriticalPath,
    options: &EncodeOptions,
    form: Form,
    scratch: Scratch,
) -> (Encoded, Scratch) {
    let mut builder = Builder::new(path, scratch);
    let bytes = build_and_encode(&mut builder, path, options, form);
    (bytes, builder.into_scratch())
}

/// The message's encoding in `form`, or `None` when it is over `max` bytes
/// (both parts together, in the split form).
fn encode_msg(msg: &mut PathOut<'_>, form: Form, max: usize) -> Option<Encoded> {
    match form {
        Form::Single => {
            msg.version = SINGLE_VERSION;
            let sizes = msg.sizes();
            (sizes.total <= max).then(|| Encoded::Single(msg.encode(&sizes)))
        }
        Form::Split => {
            msg.version = VERSION;
            let sizes = msg.sizes();
            if sizes.split_total() > max {
                return None;
            }
            let frames = msg.encode_frames(&sizes);
            let segments = msg.encode_segments(&sizes, fingerprint(&frames));
            Some(Encoded::Split(SplitPath { frames, segments }))
        }
    }
}

fn build_and_encode(
    builder: &mut Builder<'_>,
    path: &CriticalPath,
    options: &EncodeOptions,
    form: Form,
) -> Encoded {
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
            if builder.build(depth, total, max, limits)
                && let Some(encoded) = encode_msg(&mut builder.msg, form, max)
            {
                return encoded;
            }
        }
    }
    let mut msg = fallback(path, total);
    encode_msg(&mut msg, form, usize::MAX).expect("no size limit on the fallback; this is a bug")
}

/// A frame whose strings are not in the table yet.
const UNSEEN: u32 = u32::MAX;

/// Builds the wire message of a path at one depth after another, reusing
/// its tables and columns between attempts.
struct Builder<'a> {
    path: &'a CriticalPath,
    strings: StringTable<'a>,
    /// Frame id -> string indices of its service, name and file (+ 1, or 0
    /// without location), or [`UNSEEN`]: each frame's strings are looked up
    /// once, not once per tree entry.
    frame_strings: Vec<[u32; 3]>,
    /// (parent ref, frame) -> entry index; parent ref 0 is "no parent".
    entries: HashMap<(u32, FrameId), u32>,
    /// Entries of the previous segment's (cut) stack.
    prev: Vec<u32>,
    msg: PathOut<'a>,
}

impl<'a> Builder<'a> {
    /// A builder for `path`, on the buffers of `scratch` (emptied here).
    fn new(path: &'a CriticalPath, scratch: Scratch) -> Self {
        let Scratch {
            mut frame_strings,
            mut entries,
            mut prev,
            columns,
            mut durations,
        } = scratch;
        frame_strings.clear();
        entries.clear();
        prev.clear();
        durations.clear();
        let frames = path.frames().len();
        let segments = path.segments().len();
        // Frames appear under a parent or two: room for twice as many tree
        // entries as frames saves most regrowing.
        let entries_hint = 2 * frames + 8;
        entries.reserve(entries_hint);
        let [
            tree_parent,
            tree_service,
            tree_name,
            tree_file,
            tree_line,
            segment_entry_kind,
        ] = columns;
        let mut msg = PathOut {
            tree_parent,
            tree_service,
            tree_name,
            tree_file,
            tree_line,
            segment_entry_kind,
            segment_duration_nanos: durations,
            ..PathOut::default()
        };
        msg.clear();
        msg.segment_entry_kind.reserve(segments);
        msg.segment_duration_nanos.reserve(segments);
        for column in [
            &mut msg.tree_parent,
            &mut msg.tree_service,
            &mut msg.tree_name,
            &mut msg.tree_file,
            &mut msg.tree_line,
        ] {
            column.reserve(entries_hint);
        }
        frame_strings.reserve(frames);
        prev.reserve(path.depth());
        Builder {
            path,
            // A service, a name and a file per frame at most.
            strings: StringTable::with_capacity(3 * frames),
            frame_strings,
            entries,
            prev,
            msg,
        }
    }

    /// The buffers, for the next path.
    fn into_scratch(self) -> Scratch {
        let PathOut {
            tree_parent,
            tree_service,
            tree_name,
            tree_file,
            tree_line,
            segment_entry_kind,
            segment_duration_nanos,
            ..
        } = self.msg;
        Scratch {
            frame_strings: self.frame_strings,
            entries: self.entries,
            prev: self.prev,
            columns: [
                tree_parent,
                tree_service,
                tree_name,
                tree_file,
                tree_line,
                segment_entry_kind,
            ],
            durations: segment_duration_nanos,
        }
    }

    /// Make [`Builder::msg`] the wire message for the path coarsened to
    /// `depth`; false when it is over a count of `limits`, or clearly over
    /// `max` before it is finished.
    fn build(&mut self, depth: usize, total: u64, max: usize, limits: &DecodeLimits) -> bool {
        let path = self.path;
        self.strings.clear();
        self.frame_strings.clear();
        self.frame_strings.resize(path.frames().len(), [UNSEEN; 3]);
        self.entries.clear();
        self.prev.clear();
        let msg = &mut self.msg;
        msg.clear();
        let mut any_location = false;
        // Consecutive segments share most of their prefix: the entries of
        // the previous segment's stack skip most lookups.
        let mut prev_stack: &[FrameId] = &[];
        let mut folded: u128 = 0;
        let mut cut_waits: u128 = 0;
        let mut last_wait = false;
        let mut stack_frames: usize = 0;

        for seg in path.segments() {
            let Ok(nanos) = u64::try_from(seg.duration.as_nanos()) else {
                return false;
            };
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
            self.prev.truncate(common);
            for &frame_id in &stack[common..] {
                let parent_ref = self.prev.last().map_or(0, |p| p + 1);
                let entry = match self.entries.entry((parent_ref, frame_id)) {
                    Entry::Occupied(e) => *e.get(),
                    Entry::Vacant(e) => {
                        let i = msg.tree_parent.len();
                        if i >= MAX_ENCODE_ENTRIES {
                            return false;
                        }
                        let i = i as u32;
                        let frame = path.frame(frame_id);
                        let known = &mut self.frame_strings[frame_id.0 as usize];
                        if known[0] == UNSEEN {
                            *known = [
                                self.strings.intern(&frame.service),
                                self.strings.intern(&frame.name),
                                frame
                                    .location
                                    .as_ref()
                                    .map_or(0, |loc| self.strings.intern(&loc.file) + 1),
                            ];
                        }
                        let [service, name, file] = *known;
                        msg.tree_parent.push(self.prev.last().map_or(0, |p| i - p));
                        msg.tree_service.push(service);
                        msg.tree_name.push(name);
                        msg.tree_file.push(file);
                        msg.tree_line
                            .push(frame.location.as_ref().map_or(0, |loc| loc.line));
                        any_location |= file != 0;
                        *e.insert(i)
                    }
                };
                self.prev.push(entry);
            }
            prev_stack = stack;
            // Cheap early exit: every tree entry costs at least 3 bytes
            // (parent, service, name) and every segment at least 2 (code,
            // duration).
            if msg.segment_entry_kind.len() * 2 + msg.tree_parent.len() * 3 > max
                || msg.tree_parent.len() > limits.max_tree_entries
            {
                return false;
            }

            // A named wait is unattributed on the wire (what a decoder that
            // predates named waits reads), listed in `segment_wait`; cut
            // above its wait frame it is an unattributed wait.
            let (wire_kind, wait) = match seg.kind {
                SegmentKind::Wait if stack.len() == seg.stack.len() => {
                    (SegmentKind::Unattributed, true)
                }
                SegmentKind::Wait => {
                    cut_waits += u128::from(nanos);
                    (SegmentKind::Unattributed, false)
                }
                k => (k, false),
            };
            let entry_ref = self.prev.last().map_or(0, |e| e + 1);
            let code = (entry_ref << kind::BITS) | kind::to_wire(wire_kind);
            if msg.segment_entry_kind.last() == Some(&code) && last_wait == wait {
                let last = msg
                    .segment_duration_nanos
                    .last_mut()
                    .expect("the duration column is as long as the entry column");
                // Both are parts of `total`, which fits in u64.
                *last = last.saturating_add(nanos);
            } else {
                if wait {
                    msg.segment_wait.push(msg.segment_entry_kind.len() as u32);
                }
                last_wait = wait;
                msg.segment_entry_kind.push(code);
                msg.segment_duration_nanos.push(nanos);
                stack_frames += stack.len();
                if msg.segment_entry_kind.len() > limits.max_segments
                    || stack_frames > limits.max_stack_frames
                {
                    return false;
                }
            }
        }
        if !any_location {
            msg.tree_file.clear();
            msg.tree_line.clear();
        }
        if self.strings.len() > limits.max_strings {
            return false;
        }
        msg.strings.extend_from_slice(self.strings.as_slice());

        let mut accounting = accounting_to_wire(&path.accounting);
        if folded > 0 {
            let truncated = u128::from(*accounting.get_mut(Cause::Truncated)) + folded;
            *accounting.get_mut(Cause::Truncated) = truncated.min(u128::from(total)) as u64;
        }
        if cut_waits > 0 {
            let unattributed = u128::from(*accounting.get_mut(Cause::Unattributed)) + cut_waits;
            *accounting.get_mut(Cause::Unattributed) = unattributed.min(u128::from(total)) as u64;
        }
        msg.accounting = (accounting != AccountingProto::default()).then_some(accounting);
        true
    }
}

/// One busy segment with an empty stack carrying the whole total (clamped
/// to `u64::MAX` ns), all of it truncated.
fn fallback(path: &CriticalPath, total: u128) -> PathOut<'static> {
    let total = u64::try_from(total).unwrap_or(u64::MAX);
    let mut accounting = accounting_to_wire(&path.accounting);
    *accounting.get_mut(Cause::Truncated) = total;
    let (codes, durations) = if total == 0 {
        (Vec::new(), Vec::new())
    } else {
        (vec![kind::to_wire(crate::SegmentKind::Busy)], vec![total])
    };
    PathOut {
        segment_entry_kind: codes,
        segment_duration_nanos: durations,
        accounting: (accounting != AccountingProto::default()).then_some(accounting),
        ..PathOut::default()
    }
}

fn accounting_to_wire(a: &Accounting) -> AccountingProto {
    AccountingProto::from_accounting(a)
}
