//! Interning for the fold: frames and whole sample stacks found with one
//! cheap hash and one probe (see the parent module's "How the fold is made
//! fast").

use super::*;

/// The bytes of a short string folded into one word: two overlapping
/// loads, as `rustc_hash` hashes strings, without its final mixing (the
/// caller mixes once per frame). Longer strings go through `rustc_hash`.
#[inline]
pub(super) fn str_word(b: &[u8]) -> u64 {
    let n = b.len();
    let (x, y) = if n > 16 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = FxBuildHasher.build_hasher();
        h.write(b);
        return h.finish();
    } else if n >= 8 {
        (w8(b, 0), w8(b, n - 8))
    } else if n >= 4 {
        (u64::from(w4(b, 0)), u64::from(w4(b, n - 4)))
    } else if n > 0 {
        (
            u64::from(b[0]),
            u64::from(b[n - 1]) << 8 | u64::from(b[n / 2]),
        )
    } else {
        (0, 0)
    };
    x ^ y.rotate_left(29) ^ ((n as u64) << 58)
}

#[inline]
pub(super) fn w8(s: &[u8], i: usize) -> u64 {
    u64::from_ne_bytes(s[i..i + 8].try_into().expect("8 bytes"))
}

#[inline]
pub(super) fn w4(s: &[u8], i: usize) -> u32 {
    u32::from_ne_bytes(s[i..i + 4].try_into().expect("4 bytes"))
}

/// Hash of name, service and line; the file is left to the comparison
/// (one node name rarely lives in two files), which saves hashing the
/// longest string of the frame.
#[inline]
pub(super) fn frame_hash(f: &Frame) -> u64 {
    frame_hash_parts(
        f.name.as_bytes(),
        f.service.as_bytes(),
        f.location.as_ref().map(|l| l.line),
    )
}

/// [`frame_hash`] of a frame given by its parts.
#[inline]
pub(super) fn frame_hash_parts(name: &[u8], service: &[u8], line: Option<u32>) -> u64 {
    const K1: u64 = 0xf135_7aea_2e62_a9c5;
    const K2: u64 = 0x9e37_79b9_7f4a_7c15;
    let line = line.unwrap_or(u32::MAX);
    let h = str_word(name).wrapping_mul(K1) ^ str_word(service);
    let h = (h ^ u64::from(line)).wrapping_mul(K2);
    h ^ (h >> 29)
}

/// Byte equality without a `memcmp` call: the strings compared here are a
/// few bytes long, and the call and its length dispatch cost more than the
/// comparison. Short inputs are compared as two overlapping words (the
/// trick `rustc_hash` uses to hash them), longer ones word by word.
#[inline]
pub(super) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n >= 8 {
        let mut i = 0;
        while i + 8 < n {
            if w8(a, i) != w8(b, i) {
                return false;
            }
            i += 8;
        }
        w8(a, n - 8) == w8(b, n - 8)
    } else if n >= 4 {
        w4(a, 0) == w4(b, 0) && w4(a, n - 4) == w4(b, n - 4)
    } else if n > 0 {
        a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1]
    } else {
        true
    }
}

#[inline]
pub(super) fn same_str(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || same_bytes(a.as_bytes(), b.as_bytes())
}

pub(super) fn same_frame(a: &Frame, b: &Frame) -> bool {
    same_str(&a.name, &b.name)
        && same_str(&a.service, &b.service)
        && match (&a.location, &b.location) {
            (None, None) => true,
            (Some(x), Some(y)) => x.line == y.line && same_str(&x.file, &y.file),
            _ => false,
        }
}

/// Hash of a sample stack's frame ids (FxHash's multiply-rotate, one step
/// per frame).
#[inline]
pub(super) fn stack_hash(ids: &[u32]) -> u64 {
    const K: u64 = 0xf135_7aea_2e62_a9c5;
    let mut h = ids.len() as u64;
    for &f in ids {
        h = (h.rotate_left(26) ^ u64::from(f)).wrapping_mul(K);
    }
    h.rotate_left(26)
}

/// A partial's sample stacks (trie nodes some segment ended at) by their
/// frame ids, so a segment finds its node with one hash of its ids, one
/// probe and one comparison instead of a hash lookup per level of the trie.
/// Open addressing with linear probing, at most half full; each entry's ids
/// are kept in one arena.
#[derive(Debug, Default)]
pub(super) struct StackIndex {
    /// `(hash, node + 1, start of the ids in the arena, their count)`;
    /// node + 1 of 0 marks an empty slot. Length a power of two.
    slots: Vec<(u64, u32, u32, u32)>,
    len: usize,
    arena: Vec<u32>,
}

impl StackIndex {
    /// The node of the stack `ids` (whose [`stack_hash`] is `h`), if present.
    #[inline]
    pub(super) fn find(&self, h: u64, ids: &[u32]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            let (sh, node1, at, n) = self.slots[i];
            if node1 == 0 {
                return None;
            }
            if sh == h && n as usize == ids.len() {
                let stored = &self.arena[at as usize..][..ids.len()];
                // Elementwise, not `==`: a `memcmp` call costs more than
                // these few ids.
                if stored.iter().zip(ids).all(|(a, b)| a == b) {
                    return Some(node1 - 1);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Add stack `ids` (hash `h`, known absent) ending at `node`.
    pub(super) fn insert(&mut self, h: u64, ids: &[u32], node: u32) {
        if (self.len + 1) * 2 > self.slots.len() {
            let size = (self.slots.len() * 2).max(256);
            let old = std::mem::replace(&mut self.slots, vec![(0, 0, 0, 0); size]);
            for e in old {
                if e.1 != 0 {
                    self.place(e);
                }
            }
        }
        let at = u32::try_from(self.arena.len())
            .expect("stack arena over 4 Gi frame ids; this is a bug");
        self.arena.extend_from_slice(ids);
        self.place((h, node + 1, at, ids.len() as u32));
        self.len += 1;
    }

    pub(super) fn place(&mut self, e: (u64, u32, u32, u32)) {
        let mask = self.slots.len() - 1;
        let mut i = e.0 as usize & mask;
        while self.slots[i].1 != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = e;
    }
}
