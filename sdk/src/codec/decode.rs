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

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;

use super::proto::{AccountingProto, PathProto};
use super::{DecodeLimits, VERSION, kind};
use crate::path::{Accounting, CriticalPath, Frame, FrameId, Location, Stack};

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
enum Kind {
    #[error("{len} bytes, over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("not a critical path message: {0}")]
    Protobuf(#[source] prost::DecodeError),
    #[error("wire format version {found}, this decoder reads version {VERSION}")]
    Version { found: u32 },
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
            Kind::ZeroDuration { .. } => "ZeroDuration",
            Kind::DurationOverflow => "DurationOverflow",
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
/// `limits.max_bytes`, is not a valid message, has another [`VERSION`],
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
    let msg = PathProto::decode(bytes).map_err(Kind::Protobuf)?;
    let depths = validate(&msg, limits)?;
    Ok(build(&msg, &depths))
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
fn build(msg: &PathProto, depths: &[usize]) -> CriticalPath {
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
