//! Reading the wire form from untrusted bytes.
//!
//! # How decoding stays bounded
//!
//! 1. The input length is checked against [`DecodeLimits::max_bytes`] before
//!    anything else. prost checks every declared length against the bytes
//!    that remain before reading it, so what it allocates is a small multiple
//!    of the input length.
//! 2. The message is validated as a whole (counts, column lengths, indices,
//!    parents, depths, kinds, durations) before any part of the path is
//!    built; in particular the sum of the stack depths of all segments, the
//!    size of the decoded path, is checked against
//!    [`DecodeLimits::max_stack_frames`].
//! 3. Building the path then cannot fail and allocates only what step 2
//!    allowed.
//!
//! # How decoding stays fast
//!
//! A decoded path is small (tens of segments over a dozen frames), so the
//! cost is in allocations and hashing, not in the bytes. The message is read
//! into [`PathIn`](super::proto::PathIn): one `Arc<str>` per string of the
//! table (every frame using it shares it) and columns sized before they are
//! filled. Each tree entry gets its frame id once, the first time a segment
//! reaches it. A segment's stack is then written leaf to root straight
//! into its inline [`Stack`], no intermediate list. What remains is mostly
//! [`CriticalPath::intern`] and [`CriticalPath::push`] themselves (on the
//! Figure 1 path, building the same path from ready frames and stacks
//! costs two thirds of decoding it).

use std::cell::Cell;
use std::fmt;
use std::time::Duration;

use super::proto::{AccountingProto, PathIn};
use super::{DecodeLimits, SINGLE_VERSION, kind};
use crate::path::{
    Accounting, CriticalPath, Frame, FrameId, Location, STACK_INLINE, SegmentKind, Stack,
};

/// Why bytes could not be read as a critical path.
///
/// The message names what was wrong (`"tree entry 7: parent 9 entries back,
/// before the first entry"`). A caller that gets this from a callee's
/// response treats the call as a blind spot.
#[derive(Debug)]
pub struct DecodeError {
    kind: Kind,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum Kind {
    #[error("{len} bytes, over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("not a critical path message: {0}")]
    Protobuf(#[source] prost::DecodeError),
    #[error("wire format version {found}, this decoder reads version {reads}")]
    Version { found: u32, reads: u32 },
    #[error("the {part} carries {what}, which belong in the {other}: not a matching split path")]
    Misplaced {
        part: &'static str,
        what: &'static str,
        other: &'static str,
    },
    #[error(
        "the segments carry no frame dictionary fingerprint: not a split path (version 1 paths come in one message)"
    )]
    NoFingerprint,
    #[error(
        "the segments were written for frame dictionary {expected:016x}, not the one given ({found:016x}): the two headers are from different responses"
    )]
    FramesMismatch { expected: u64, found: u64 },
    #[error("{count} {what}, over the limit of {max}")]
    TooMany {
        what: &'static str,
        count: usize,
        max: usize,
    },
    #[error("column {what} has {found} values, expected {expected}")]
    ColumnLength {
        what: &'static str,
        found: usize,
        expected: usize,
    },
    #[error("tree entry {entry}: {what} string {index} is out of range ({len} strings)")]
    StringIndex {
        entry: usize,
        what: &'static str,
        index: u32,
        len: usize,
    },
    #[error("tree entry {entry}: line {line} without a file")]
    LineWithoutFile { entry: usize, line: u32 },
    #[error("tree entry {entry}: parent {back} entries back, before the first entry")]
    Parent { entry: usize, back: u32 },
    #[error("tree entry {entry}: stack depth {depth}, over the limit of {max}")]
    TooDeep {
        entry: usize,
        depth: usize,
        max: usize,
    },
    #[error("segment {segment}: tree entry {entry_ref} is out of range ({entries} entries)")]
    SegmentEntry {
        segment: usize,
        entry_ref: u32,
        entries: usize,
    },
    #[error("segment {segment}: unknown kind code {code}")]
    SegmentCode { segment: usize, code: u32 },
    #[error(
        "segment_wait entry {index}: names segment {segment}, which is not an unattributed segment \
         with a stack after the previous entry"
    )]
    WaitSegment { index: usize, segment: u32 },
    #[error("segment {segment}: zero duration")]
    ZeroDuration { segment: usize },
    #[error("segment durations sum past u64::MAX nanoseconds")]
    DurationOverflow,
    #[error("{frames} frames over all stacks, over the limit of {max}")]
    TooManyStackFrames { frames: usize, max: usize },
}

// === impl DecodeError ===

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid critical path: {}", self.kind)
    }
}

impl std::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Protobuf(e) => Some(e),
            _ => None,
        }
    }
}

impl From<Kind> for DecodeError {
    fn from(kind: Kind) -> Self {
        DecodeError { kind }
    }
}

impl DecodeError {
    /// True when the bytes were a well-formed message of another wire format
    /// version (a newer or older peer rather than garbage).
    pub fn is_version_mismatch(&self) -> bool {
        matches!(self.kind, Kind::Version { .. })
    }

    /// The variant's name, for tests that check which check fired.
    #[cfg(test)]
    pub(super) fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::TooLarge { .. } => "TooLarge",
            Kind::Protobuf(_) => "Protobuf",
            Kind::Version { .. } => "Version",
            Kind::TooMany { .. } => "TooMany",
            Kind::ColumnLength { .. } => "ColumnLength",
            Kind::StringIndex { .. } => "StringIndex",
            Kind::LineWithoutFile { .. } => "LineWithoutFile",
            Kind::Parent { .. } => "Parent",
            Kind::TooDeep { .. } => "TooDeep",
            Kind::SegmentEntry { .. } => "SegmentEntry",
            Kind::SegmentCode { .. } => "SegmentCode",
            Kind::WaitSegment { .. } => "WaitSegment",
            Kind::ZeroDuration { .. } => "ZeroDuration",
            Kind::DurationOverflow => "DurationOverflow",
            Kind::Misplaced { .. } => "Misplaced",
            Kind::NoFingerprint => "NoFingerprint",
            Kind::FramesMismatch { .. } => "FramesMismatch",
            Kind::TooManyStackFrames { .. } => "TooManyStackFrames",
        }
    }
}

/// Decode a critical path from untrusted bytes.
///
/// The result's frame table is in first-use order, so for any path `p`,
/// `decode(&encode(&p, ..))` equals `p` after [`CriticalPath::compact`]
/// (when no coarsening was needed).
///
/// # Errors
///
/// A [`DecodeError`] naming what was wrong when the input is longer than
/// `limits.max_bytes`, is not a valid message, has another version than [`SINGLE_VERSION`](super::SINGLE_VERSION),
/// exceeds a count in `limits`, refers to a string, tree entry or parent out
/// of range, nests deeper than `limits.max_depth`, has a zero-length
/// segment or an unknown kind, or its durations sum past `u64::MAX`
/// nanoseconds. Never panics.
pub fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<CriticalPath, DecodeError> {
    if bytes.len() > limits.max_bytes {
        return Err(Kind::TooLarge {
            len: bytes.len(),
            max: limits.max_bytes,
        }
        .into());
    }
    // Every hop decodes its callee's path on the response path: the
    // message's columns are taken from this thread's last decode and given
    // back (emptied), instead of allocated and freed each time.
    let msg = read_message(bytes)?;
    let depths = validate(&msg, limits)?;
    let path = build(&msg, &msg, &depths);
    give_back(msg);
    Ok(path)
}

/// Read `bytes` into this thread's scratch columns (see [`give_back`]).
pub(super) fn read_message(bytes: &[u8]) -> Result<PathIn, Kind> {
    let scratch = SCRATCH.try_with(Cell::take).unwrap_or_default();
    PathIn::decode_into(bytes, scratch).map_err(Kind::Protobuf)
}

/// Keep `msg`'s columns for this thread's next decode, unless large.
pub(super) fn give_back(mut msg: PathIn) {
    msg.clear();
    if msg.capacity() <= MAX_KEPT {
        // Fails only while the thread is exiting: the columns are dropped.
        let _ = SCRATCH.try_with(|s| s.set(msg));
    }
}

thread_local! {
    /// The columns of this thread's last [`decode`] (empty while one runs).
    static SCRATCH: Cell<PathIn> = Cell::new(PathIn::default());
}

/// Columns from a message this long or longer are not kept: one unusual
/// path must not pin its memory in every thread that decoded one.
const MAX_KEPT: usize = 4096;

pub(super) fn too_many(what: &'static str, count: usize, max: usize) -> Result<(), Kind> {
    if count > max {
        Err(Kind::TooMany { what, count, max })
    } else {
        Ok(())
    }
}

pub(super) fn same_len(what: &'static str, found: usize, expected: usize) -> Result<(), Kind> {
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
fn validate(msg: &PathIn, limits: &DecodeLimits) -> Result<Vec<usize>, Kind> {
    if msg.version != SINGLE_VERSION {
        return Err(Kind::Version {
            found: msg.version,
            reads: SINGLE_VERSION,
        });
    }
    too_many("strings", msg.strings.len(), limits.max_strings)?;
    too_many(
        "tree entries",
        msg.tree_parent.len(),
        limits.max_tree_entries,
    )?;
    too_many(
        "segments",
        msg.segment_entry_kind.len(),
        limits.max_segments,
    )?;
    check_tree_columns(msg)?;
    check_segment_columns(msg)?;
    let depths = tree_depths(msg, limits)?;
    check_segments(msg, &depths, limits)?;
    Ok(depths)
}

/// The tree columns are as long as `tree_parent` (the locations' may both
/// be empty).
pub(super) fn check_tree_columns(msg: &PathIn) -> Result<(), Kind> {
    let entries = msg.tree_parent.len();
    same_len("tree_service", msg.tree_service.len(), entries)?;
    same_len("tree_name", msg.tree_name.len(), entries)?;
    let has_locations = !(msg.tree_file.is_empty() && msg.tree_line.is_empty());
    if has_locations {
        same_len("tree_file", msg.tree_file.len(), entries)?;
        same_len("tree_line", msg.tree_line.len(), entries)?;
    }
    Ok(())
}

/// The durations column is as long as the entry column.
pub(super) fn check_segment_columns(msg: &PathIn) -> Result<(), Kind> {
    same_len(
        "segment_duration_nanos",
        msg.segment_duration_nanos.len(),
        msg.segment_entry_kind.len(),
    )
}

/// Check the frame tree (string indices, parents, depths); return each
/// entry's depth. The columns are checked already.
pub(super) fn tree_depths(msg: &PathIn, limits: &DecodeLimits) -> Result<Vec<usize>, Kind> {
    let strings = msg.strings.len();
    let entries = msg.tree_parent.len();
    let has_locations = !(msg.tree_file.is_empty() && msg.tree_line.is_empty());
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
    Ok(depths)
}

/// Check the segments against a tree of `depths.len()` entries of these
/// depths. The columns are checked already.
pub(super) fn check_segments(
    msg: &PathIn,
    depths: &[usize],
    limits: &DecodeLimits,
) -> Result<(), Kind> {
    let entries = depths.len();
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
    let mut next = 0;
    for (index, &segment) in msg.segment_wait.iter().enumerate() {
        let code = msg.segment_entry_kind.get(segment as usize).copied();
        let ok = segment as usize >= next
            && code.is_some_and(|c| {
                c >> kind::BITS != 0
                    && kind::from_wire(c & kind::MASK) == Some(SegmentKind::Unattributed)
            });
        if !ok {
            return Err(Kind::WaitSegment { index, segment });
        }
        next = segment as usize + 1;
    }
    if stack_frames > limits.max_stack_frames {
        return Err(Kind::TooManyStackFrames {
            frames: stack_frames,
            max: limits.max_stack_frames,
        });
    }
    Ok(())
}

/// A frame tree the segments refer to: a whole version 1 message, or a
/// decoded frame dictionary.
pub(super) trait Tree {
    /// Entry `e`'s distance back to its parent (0 for a root).
    fn parent(&self, e: usize) -> u32;
    /// Entry `e`'s frame.
    fn frame(&self, e: usize) -> Frame;
}

impl Tree for PathIn {
    fn parent(&self, e: usize) -> u32 {
        self.tree_parent[e]
    }

    fn frame(&self, e: usize) -> Frame {
        let (file, line) = if self.tree_file.is_empty() {
            (0, 0)
        } else {
            (self.tree_file[e], self.tree_line[e])
        };
        let string = |i: u32| self.strings[i as usize].clone();
        Frame {
            service: string(self.tree_service[e]),
            name: string(self.tree_name[e]),
            location: (file != 0).then(|| Location {
                file: string(file - 1),
                line,
            }),
        }
    }
}

/// A tree entry whose frame id is not known yet.
const UNSEEN: u32 = u32::MAX;

/// Build the path from validated segments (`msg`) over a validated tree
/// of `depths.len()` entries.
pub(super) fn build<T: Tree>(tree: &T, msg: &PathIn, depths: &[usize]) -> CriticalPath {
    let mut frames = Frames {
        tree,
        // A path has at most one frame per tree entry (both bounded by the
        // decode limits): sized once, its frame table never regrows.
        path: CriticalPath::with_capacity(depths.len(), msg.segment_entry_kind.len()),
        frame_of: vec![UNSEEN; depths.len()],
        chain: Vec::new(),
    };
    let mut waits = msg.segment_wait.iter().peekable();
    for (s, (&code, &nanos)) in msg
        .segment_entry_kind
        .iter()
        .zip(&msg.segment_duration_nanos)
        .enumerate()
    {
        let entry_ref = (code >> kind::BITS) as usize;
        let mut kind =
            kind::from_wire(code & kind::MASK).expect("kind checked in `validate`; this is a bug");
        if waits.next_if(|&&w| w as usize == s).is_some() {
            kind = SegmentKind::Wait;
        }
        let stack = match entry_ref.checked_sub(1) {
            None => Stack::new(),
            Some(leaf) => frames.stack(leaf, depths[leaf]),
        };
        frames.path.push(stack, Duration::from_nanos(nanos), kind);
    }
    let mut path = frames.path;
    path.accounting = accounting_from_wire(msg.accounting.unwrap_or_default());
    path
}

/// The path being built and the frame id of each tree entry.
struct Frames<'m, T> {
    tree: &'m T,
    path: CriticalPath,
    /// Tree entry -> frame id, or [`UNSEEN`]. An entry is given its id only
    /// after its parent, so a seen entry's ancestors are all seen.
    frame_of: Vec<u32>,
    /// Scratch: the unseen entries from a leaf up.
    chain: Vec<usize>,
}

impl<T: Tree> Frames<'_, T> {
    /// The stack of tree entry `leaf`, `depth` frames deep.
    fn stack(&mut self, leaf: usize, depth: usize) -> Stack {
        if self.frame_of[leaf] == UNSEEN {
            self.see(leaf);
        }
        // `validate` computed `depth` by this same walk: it ends at a root.
        let fill = |slots: &mut [FrameId]| {
            let mut e = leaf;
            for slot in slots.iter_mut().rev() {
                *slot = FrameId(self.frame_of[e]);
                e -= self.tree.parent(e) as usize;
            }
        };
        if depth <= STACK_INLINE {
            let mut inline = [FrameId(0); STACK_INLINE];
            fill(&mut inline[..depth]);
            Stack::from_buf_and_len(inline, depth)
        } else {
            let mut stack = Stack::from_elem(FrameId(0), depth);
            fill(&mut stack);
            stack
        }
    }

    /// Give ids to `leaf` and its unseen ancestors, root first, so that the
    /// frame table is in first-use order (what `CriticalPath::compact`
    /// produces).
    fn see(&mut self, leaf: usize) {
        let tree = self.tree;
        let mut chain = std::mem::take(&mut self.chain);
        chain.clear();
        let mut e = leaf;
        while self.frame_of[e] == UNSEEN {
            chain.push(e);
            match tree.parent(e) {
                0 => break,
                back => e -= back as usize,
            }
        }
        for &e in chain.iter().rev() {
            let id = self.path.intern(tree.frame(e));
            self.frame_of[e] = id.0;
        }
        self.chain = chain;
    }
}

fn accounting_from_wire(a: AccountingProto) -> Accounting {
    a.to_accounting()
}
