//! The wire form of a [`CriticalPath`]: what a callee returns to its caller
//! in response metadata (`x-cpt-frames-bin` + `x-cpt-path-bin`, or
//! `x-cpt-path-bin` alone for a version 1 caller; base64 by the transport).
//!
//! # Format
//!
//! A protobuf message (hand-written prost structs, see the `.proto` in
//! `codec/proto.rs`), laid out as columns:
//!
//! - a **string table**: every service, frame name and file once;
//! - a **frame tree**: one entry per distinct stack prefix, parents before
//!   children, each entry = distance back to its parent (0 for a root) +
//!   string indices of service, name and (optional) file + line;
//! - the **segments** in critical-path order: the tree entry of the stack's
//!   leaf with the [`SegmentKind`](crate::SegmentKind) packed into its low 3
//!   bits, and the duration in nanoseconds;
//! - the **accounting** in nanoseconds.
//!
//! A segment therefore costs about 5 bytes whatever its depth, and a frame
//! about 3 bytes plus its strings once. CPT ("Operational costs") notes that
//! a list of stacks costs O(N·M) for N segments of M frames; this graph form
//! is O(N + M) (the `codec` bench measures the ratio).
//!
//! # Two forms: single (version 1) and split (version 2)
//!
//! [`encode`] / [`decode`] write and read the whole message at once,
//! version [`SINGLE_VERSION`]. [`encode_split`] writes the same fields as
//! two messages, version [`VERSION`]:
//!
//! - the **frame dictionary**: the version, the string table and the frame
//!   tree (fields 1–7). It depends only on which stacks the path has, in a
//!   deterministic order, so requests of the same shape send byte-identical
//!   dictionaries: a transport can cache them (HTTP/2's HPACK indexes an
//!   unchanging header after its first use on a connection, and sends
//!   one or two bytes after that), and a reader decodes each distinct
//!   dictionary once ([`decode_frames`], then keep the
//!   [`FrameDictionary`]);
//! - the **segments**: the version, the segment columns, the accounting,
//!   and the dictionary's 64-bit fingerprint (fields 1, 8–11), read with
//!   [`decode_split`] over the decoded dictionary. Segments never read
//!   against another dictionary than the one they were written with.
//!
//! A reader announces the highest version it reads; a writer answers in
//! the highest version both know (the middleware's `x-cpt-want-path`).
//!
//! # Size limit and coarsening
//!
//! [`encode`] never returns more than [`EncodeOptions::max_bytes`], and what
//! it returns always decodes under [`EncodeOptions::decode_limits`] (the
//! default [`DecodeLimits`] unless set). A path over a limit is coarsened ([`CriticalPath::coarsen`]): the deepest
//! frames are folded into their parents, one level at a time, until it fits.
//! The total is kept exactly and the folded time is added to
//! [`Accounting::truncated`](crate::Accounting::truncated). If even empty
//! stacks do not fit (thousands of alternating kinds, or names longer than
//! the limit), the path becomes a single busy segment with an empty stack
//! (under the caller's RPC frame once spliced) carrying the exact total, all
//! of it counted as truncated. That form is at most 101 bytes, and
//! `max_bytes` is never taken below [`MIN_MAX_BYTES`], so encoding cannot
//! fail.
//!
//! # Decoding untrusted bytes
//!
//! [`decode`] (and [`decode_frames`] + [`decode_split`], the same checks
//! split between them, with the byte limit on both parts together, plus a
//! wrong or missing dictionary fingerprint and fields in the wrong part)
//! returns a [`DecodeError`] for anything it cannot read: input
//! longer than [`DecodeLimits::max_bytes`] (checked first, so every later
//! allocation is bounded by it), malformed protobuf, another version, counts
//! above the limits, a string or tree index out of range, a parent that is
//! not an earlier entry (which rules out cycles), a stack deeper than
//! [`DecodeLimits::max_depth`], a zero or unknown-kind segment, or durations
//! whose sum overflows 64-bit nanoseconds. It never panics.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use cpt_sdk::{CriticalPath, Frame, SegmentKind};
//! use cpt_sdk::codec::{decode, encode, DecodeLimits, EncodeOptions};
//!
//! let mut p = CriticalPath::new();
//! p.push_frames([Frame::new("B", "B1")], Duration::from_millis(4), SegmentKind::Busy);
//! p.push_frames([Frame::new("B", "B1"), Frame::new("B", "B2")], Duration::from_millis(12), SegmentKind::Busy);
//!
//! let bytes = encode(&p, &EncodeOptions::default());
//! let back = decode(&bytes, &DecodeLimits::default())?;
//! assert_eq!(back, p);
//! # Ok::<(), cpt_sdk::codec::DecodeError>(())
//! ```

mod decode;
mod encode;
mod proto;
mod split;
mod strings;

pub use decode::{DecodeError, decode};
pub use encode::{encode, encode_split};
pub use split::{FrameDictionary, SplitPath, decode_frames, decode_split};

#[cfg(doc)]
use crate::CriticalPath;

/// The highest wire format version this crate writes and reads: the split
/// form ([`encode_split`], [`decode_frames`], [`decode_split`]).
///
/// A decoder rejects any other version than its own with a
/// [`DecodeError`]; the caller then treats the call as a blind spot.
pub const VERSION: u32 = 2;

/// The version of the single-message form ([`encode`], [`decode`]), which
/// every reader since the first reads.
pub const SINGLE_VERSION: u32 = 1;

/// The smallest [`EncodeOptions::max_bytes`] honoured: the single-segment
/// fallback always fits in it.
pub const MIN_MAX_BYTES: usize = 128;

/// How [`encode`] writes a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// The largest encoding to produce, in bytes (before any base64). Paths
    /// over it are coarsened. Values below [`MIN_MAX_BYTES`] count as
    /// [`MIN_MAX_BYTES`]. Default 4096: with base64 that is about 5.5 KiB of
    /// metadata, under gRPC's common 8 KiB metadata limit.
    pub max_bytes: usize,
    /// The limits of the decoder that will read the path. The encoding is
    /// coarsened until it is within every one of them too (depth, counts,
    /// stack frames, and bytes: the effective byte limit is the smaller of
    /// `max_bytes` and `decode_limits.max_bytes`), so [`decode`] with these
    /// limits always accepts it. Default [`DecodeLimits::default()`].
    pub decode_limits: DecodeLimits,
}

impl EncodeOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set [`EncodeOptions::max_bytes`].
    #[must_use]
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Set [`EncodeOptions::decode_limits`].
    #[must_use]
    pub fn with_decode_limits(mut self, limits: DecodeLimits) -> Self {
        self.decode_limits = limits;
        self
    }
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            max_bytes: 4096,
            decode_limits: DecodeLimits::default(),
        }
    }
}

/// What [`decode`] accepts. Anything beyond is a [`DecodeError`].
///
/// With the defaults, decoding allocates at most a few MiB whatever the
/// input: `max_bytes` bounds what the protobuf layer allocates and
/// `max_stack_frames` bounds the decoded path's stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Longest input, in bytes. Default 64 KiB.
    pub max_bytes: usize,
    /// Most strings in the string table. Default 8192.
    pub max_strings: usize,
    /// Most frame tree entries. Default 8192.
    pub max_tree_entries: usize,
    /// Most segments. Default 16384.
    pub max_segments: usize,
    /// Deepest stack. Default 128.
    pub max_depth: usize,
    /// Most frames over all segments' stacks (the sum of their depths): the
    /// size of the decoded path. Default 262144 (1 MiB of frame ids).
    pub max_stack_frames: usize,
}

impl DecodeLimits {
    /// The default limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set [`DecodeLimits::max_bytes`].
    #[must_use]
    pub fn with_max_bytes(mut self, n: usize) -> Self {
        self.max_bytes = n;
        self
    }

    /// Set [`DecodeLimits::max_strings`].
    #[must_use]
    pub fn with_max_strings(mut self, n: usize) -> Self {
        self.max_strings = n;
        self
    }

    /// Set [`DecodeLimits::max_tree_entries`].
    #[must_use]
    pub fn with_max_tree_entries(mut self, n: usize) -> Self {
        self.max_tree_entries = n;
        self
    }

    /// Set [`DecodeLimits::max_segments`].
    #[must_use]
    pub fn with_max_segments(mut self, n: usize) -> Self {
        self.max_segments = n;
        self
    }

    /// Set [`DecodeLimits::max_depth`].
    #[must_use]
    pub fn with_max_depth(mut self, n: usize) -> Self {
        self.max_depth = n;
        self
    }

    /// Set [`DecodeLimits::max_stack_frames`].
    #[must_use]
    pub fn with_max_stack_frames(mut self, n: usize) -> Self {
        self.max_stack_frames = n;
        self
    }
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_bytes: 64 * 1024,
            max_strings: 8192,
            max_tree_entries: 8192,
            max_segments: 16384,
            max_depth: 128,
            max_stack_frames: 1 << 18,
        }
    }
}

/// Segment kind codes on the wire (low 3 bits of `segment_entry_kind`).
mod kind {
    use crate::SegmentKind;

    pub(super) const BITS: u32 = 3;
    pub(super) const MASK: u32 = (1 << BITS) - 1;

    pub(super) fn to_wire(kind: SegmentKind) -> u32 {
        match kind {
            SegmentKind::Busy => 0,
            SegmentKind::Queueing => 1,
            // A named wait is written as unattributed, and listed in
            // `segment_wait` (see `proto`).
            SegmentKind::Unattributed | SegmentKind::Wait => 2,
            SegmentKind::Network => 3,
            SegmentKind::BlindSpot => 4,
        }
    }

    pub(super) fn from_wire(code: u32) -> Option<SegmentKind> {
        Some(match code {
            0 => SegmentKind::Busy,
            1 => SegmentKind::Queueing,
            2 => SegmentKind::Unattributed,
            3 => SegmentKind::Network,
            4 => SegmentKind::BlindSpot,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests;
