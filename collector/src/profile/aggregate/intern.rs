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
/// Open addressing with linear probing, at most half full. A slot holds a
/// stack's first [`INLINE`] ids itself, so a short stack is found and
/// compared within one cache line; the ids past those are kept in one
/// arena.
#[derive(Debug, Default)]
pub(super) struct StackIndex {
    /// Length a power of two; `node1` of 0 marks an empty slot.
    slots: Vec<StackSlot>,
    len: usize,
    arena: Vec<u32>,
}

/// Ids a [`StackSlot`] holds itself.
const INLINE: usize = 4;

#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
pub(super) struct StackSlot {
    /// The high half of the stack's hash (the low bits chose the slot).
    tag: u32,
    /// The node + 1.
    node1: u32,
    /// How many ids the stack has.
    n: u32,
    /// Where its ids past the first [`INLINE`] start in the arena.
    at: u32,
    head: [u32; INLINE],
}

impl StackIndex {
    /// The node of the stack `ids` (whose [`stack_hash`] is `h`), if present.
    #[inline]
    pub(super) fn find(&self, h: u64, ids: &[u32]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let tag = (h >> 32) as u32;
        let mut i = h as usize & mask;
        loop {
            let s = &self.slots[i];
            if s.node1 == 0 {
                return None;
            }
            if s.tag == tag && s.n as usize == ids.len() {
                let k = ids.len().min(INLINE);
                // Elementwise, not `==`: a `memcmp` call costs more than
                // these few ids.
                let same = s.head[..k].iter().zip(&ids[..k]).all(|(a, b)| a == b)
                    && (ids.len() <= INLINE
                        || self.arena[s.at as usize..][..ids.len() - INLINE]
                            .iter()
                            .zip(&ids[INLINE..])
                            .all(|(a, b)| a == b));
                if same {
                    return Some(s.node1 - 1);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Add stack `ids` (hash `h`, known absent) ending at `node`.
    pub(super) fn insert(&mut self, h: u64, ids: &[u32], node: u32) {
        if (self.len + 1) * 2 > self.slots.len() {
            let size = (self.slots.len() * 2).max(256);
            let old = std::mem::replace(&mut self.slots, vec![StackSlot::default(); size]);
            // Slots keep only part of the hash: each stack is hashed again.
            let mut stack = Vec::new();
            for e in old {
                if e.node1 != 0 {
                    stack.clear();
                    let n = e.n as usize;
                    stack.extend_from_slice(&e.head[..n.min(INLINE)]);
                    if n > INLINE {
                        stack.extend_from_slice(&self.arena[e.at as usize..][..n - INLINE]);
                    }
                    self.place_new(e, stack_hash(&stack));
                }
            }
        }
        let at = u32::try_from(self.arena.len())
            .expect("stack arena over 4 Gi frame ids; this is a bug");
        let mut head = [0; INLINE];
        let k = ids.len().min(INLINE);
        head[..k].copy_from_slice(&ids[..k]);
        if ids.len() > INLINE {
            self.arena.extend_from_slice(&ids[INLINE..]);
        }
        let slot = StackSlot {
            tag: (h >> 32) as u32,
            node1: node + 1,
            n: ids.len() as u32,
            at,
            head,
        };
        self.place_new(slot, h);
        self.len += 1;
    }

    fn place_new(&mut self, e: StackSlot, h: u64) {
        let mask = self.slots.len() - 1;
        let mut i = h as usize & mask;
        while self.slots[i].node1 != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = e;
    }
}

/// One record's segments as stacks of a partial's frame ids, laid end to
/// end: `segs[i]` is (end of segment i's stack in `ids`, ns, kind).
#[derive(Debug, Default)]
pub(super) struct Flat {
    pub(super) ids: Vec<u32>,
    pub(super) segs: Vec<(u32, u64, SegmentKind)>,
}

impl Flat {
    pub(super) fn clear(&mut self) {
        self.ids.clear();
        self.segs.clear();
    }

    /// Close the segment whose frames were pushed onto `ids` since the last.
    #[inline]
    pub(super) fn end_segment(&mut self, ns: u64, kind: SegmentKind) {
        self.segs.push((self.ids.len() as u32, ns, kind));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stacks of 1 to 9 ids, many alike in their first [`INLINE`] ids and
    /// different only in the ids kept in the arena, are each found at
    /// their own node after the table has grown several times, and stacks
    /// never inserted are not found.
    #[test]
    fn stack_index_tells_apart_stacks_that_differ_only_past_the_inline_ids() {
        let stack = |i: u32| -> Vec<u32> {
            let len = 1 + i % 9;
            (0..len)
                .map(|d| if d < INLINE as u32 { d } else { i * 7 + d })
                .collect()
        };
        let mut ix = StackIndex::default();
        for i in 0..5000 {
            let s = stack(i);
            match ix.find(stack_hash(&s), &s) {
                None => ix.insert(stack_hash(&s), &s, i),
                Some(_) => assert!(s.len() <= INLINE, "{i}: a long stack found before inserted"),
            }
        }
        for i in 0..5000 {
            let s = stack(i);
            let want = if s.len() <= INLINE {
                // Short stacks repeat (they are all a prefix of 0, 1, 2, 3):
                // the first one inserted owns the node.
                (0..).find(|&j| stack(j) == s).unwrap()
            } else {
                i
            };
            assert_eq!(ix.find(stack_hash(&s), &s), Some(want), "{i}");
        }
        for i in 5000..6000 {
            let mut s = stack(i);
            if s.len() > INLINE {
                assert_eq!(ix.find(stack_hash(&s), &s), None, "{i}");
            }
            s.push(u32::MAX);
            assert_eq!(ix.find(stack_hash(&s), &s), None, "{i} extended");
        }
    }
}
