//! The split form (version 2): a frame dictionary that repeats from one
//! response to the next, and the segments that refer to it.

use std::fmt;
use std::sync::Arc;

use super::decode::{
    Kind, Tree, build, check_segment_columns, check_segments, check_tree_columns, give_back,
    read_message, too_many, tree_depths,
};
use super::proto::PathIn;
use super::{DecodeError, DecodeLimits, VERSION};
use crate::path::{CriticalPath, Frame};

/// A path in the split form, as [`encode_split`](super::encode_split)
/// writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitPath {
    /// The frame dictionary: string table and frame tree. The same for
    /// every path over the same frames.
    pub frames: Vec<u8>,
    /// The segments and accounting, and the dictionary's fingerprint.
    pub segments: Vec<u8>,
}

/// A decoded frame dictionary ([`decode_frames`]), for
/// [`decode_split`]. Cheap to clone (one reference count), so a transport
/// can keep the dictionaries it sees often and decode each only once.
#[derive(Clone)]
pub struct FrameDictionary(Arc<Dictionary>);

struct Dictionary {
    /// Per tree entry: distance back to its parent (0 for a root).
    parent: Vec<u32>,
    /// Per tree entry: its frame (strings shared with the other entries').
    frames: Vec<Frame>,
    /// Per tree entry: its stack depth.
    depths: Vec<usize>,
    /// The deepest entry and its depth (0, 0 when empty).
    deepest: (usize, usize),
    strings: usize,
    /// Length of the encoded dictionary.
    len: usize,
    fingerprint: u64,
}

impl fmt::Debug for FrameDictionary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameDictionary")
            .field("entries", &self.0.parent.len())
            .field("strings", &self.0.strings)
            .field("len", &self.0.len)
            .field("fingerprint", &format_args!("{:016x}", self.0.fingerprint))
            .finish()
    }
}

impl FrameDictionary {
    /// Length in bytes of the encoded dictionary it was decoded from.
    pub fn encoded_len(&self) -> usize {
        self.0.len
    }

    /// Number of frame tree entries.
    pub fn entries(&self) -> usize {
        self.0.parent.len()
    }
}

impl Tree for Dictionary {
    fn parent(&self, e: usize) -> u32 {
        self.parent[e]
    }

    fn frame(&self, e: usize) -> Frame {
        self.frames[e].clone()
    }
}

/// The fingerprint of an encoded frame dictionary the segments message
/// carries, so that segments are never read against another dictionary.
/// Stable across builds and platforms (the wire form depends on it); a
/// check against mix-ups, not against an adversary (who could send any
/// segments anyway).
pub(super) fn fingerprint(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = (bytes.len() as u64).wrapping_mul(K);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let w = u64::from_le_bytes(chunk.try_into().expect("chunks of 8"));
        h = (h ^ w).wrapping_mul(K).rotate_left(31);
    }
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    h ^ (h >> 29)
}

/// Decode a frame dictionary from untrusted bytes.
///
/// # Errors
///
/// A [`DecodeError`] when the input is longer than `limits.max_bytes`, is
/// not a valid message, has another version than [`VERSION`], carries
/// segments, accounting or a fingerprint (those belong in the segments),
/// exceeds `limits.max_strings` or `limits.max_tree_entries`, or has a tree
/// that [`decode`](super::decode) would reject (string index or parent out
/// of range, a stack deeper than `limits.max_depth`). Never panics.
pub fn decode_frames(bytes: &[u8], limits: &DecodeLimits) -> Result<FrameDictionary, DecodeError> {
    if bytes.len() > limits.max_bytes {
        return Err(Kind::TooLarge {
            len: bytes.len(),
            max: limits.max_bytes,
        }
        .into());
    }
    // Not the thread's scratch columns: the dictionary keeps its own.
    let mut msg = PathIn::decode_into(bytes, PathIn::default()).map_err(Kind::Protobuf)?;
    check_version(&msg)?;
    let misplaced = |what| Kind::Misplaced {
        part: "frame dictionary",
        what,
        other: "segments",
    };
    if !msg.segment_entry_kind.is_empty() || !msg.segment_duration_nanos.is_empty() {
        return Err(misplaced("segments").into());
    }
    if msg.accounting.is_some() {
        return Err(misplaced("accounting").into());
    }
    if msg.frames_fingerprint.is_some() {
        return Err(misplaced("a dictionary fingerprint").into());
    }
    too_many("strings", msg.strings.len(), limits.max_strings)?;
    too_many(
        "tree entries",
        msg.tree_parent.len(),
        limits.max_tree_entries,
    )?;
    check_tree_columns(&msg)?;
    let depths = tree_depths(&msg, limits)?;
    let deepest = depths
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|(_, d)| *d)
        .unwrap_or((0, 0));
    let frames = (0..depths.len()).map(|e| msg.frame(e)).collect();
    Ok(FrameDictionary(Arc::new(Dictionary {
        parent: std::mem::take(&mut msg.tree_parent),
        frames,
        depths,
        deepest,
        strings: msg.strings.len(),
        len: bytes.len(),
        fingerprint: fingerprint(bytes),
    })))
}

fn check_version(msg: &PathIn) -> Result<(), Kind> {
    if msg.version != VERSION {
        return Err(Kind::Version {
            found: msg.version,
            reads: VERSION,
        });
    }
    Ok(())
}

/// Decode the segments of a split path from untrusted bytes, over a frame
/// dictionary decoded by [`decode_frames`].
///
/// The limits apply to the whole path: `limits.max_bytes` to the two parts
/// together, and the dictionary is checked against `limits` again (it may
/// have been decoded, and kept, under other limits). The result is what
/// [`decode`](super::decode) returns for the same path in the single form.
///
/// # Errors
///
/// A [`DecodeError`] when the two parts together are longer than
/// `limits.max_bytes`, the dictionary is over a limit, the segments are not
/// a valid message, have another version than [`VERSION`], carry strings
/// or tree entries (those belong in the dictionary), carry no fingerprint
/// or the fingerprint of another dictionary, or have segments
/// [`decode`](super::decode) would reject (an entry out of the dictionary's
/// range, an unknown kind, a zero duration, a sum past `u64::MAX`
/// nanoseconds, or more than `limits.max_segments` /
/// `limits.max_stack_frames`). Never panics.
pub fn decode_split(
    frames: &FrameDictionary,
    segments: &[u8],
    limits: &DecodeLimits,
) -> Result<CriticalPath, DecodeError> {
    let dict = &*frames.0;
    let len = dict.len.saturating_add(segments.len());
    if len > limits.max_bytes {
        return Err(Kind::TooLarge {
            len,
            max: limits.max_bytes,
        }
        .into());
    }
    too_many("strings", dict.strings, limits.max_strings)?;
    too_many("tree entries", dict.parent.len(), limits.max_tree_entries)?;
    let (entry, depth) = dict.deepest;
    if depth > limits.max_depth {
        return Err(Kind::TooDeep {
            entry,
            depth,
            max: limits.max_depth,
        }
        .into());
    }
    let msg = read_message(segments)?;
    let result =
        check_segments_message(dict, &msg, limits).map(|()| build(dict, &msg, &dict.depths));
    give_back(msg);
    Ok(result?)
}

fn check_segments_message(
    dict: &Dictionary,
    msg: &PathIn,
    limits: &DecodeLimits,
) -> Result<(), Kind> {
    check_version(msg)?;
    let misplaced = |what| Kind::Misplaced {
        part: "segments",
        what,
        other: "frame dictionary",
    };
    if !msg.strings.is_empty() {
        return Err(misplaced("strings"));
    }
    if !(msg.tree_parent.is_empty()
        && msg.tree_service.is_empty()
        && msg.tree_name.is_empty()
        && msg.tree_file.is_empty()
        && msg.tree_line.is_empty())
    {
        return Err(misplaced("frame tree entries"));
    }
    match msg.frames_fingerprint {
        None => return Err(Kind::NoFingerprint),
        Some(expected) if expected != dict.fingerprint => {
            return Err(Kind::FramesMismatch {
                expected,
                found: dict.fingerprint,
            });
        }
        Some(_) => {}
    }
    too_many(
        "segments",
        msg.segment_entry_kind.len(),
        limits.max_segments,
    )?;
    check_segment_columns(msg)?;
    check_segments(msg, &dict.depths, limits)
}
