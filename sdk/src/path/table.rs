//! An interning table of [`Frame`]s that stores each frame once.
//!
//! A `HashMap<Frame, Id>` beside the `Vec<Frame>` holds every frame twice:
//! each intern clones the frame's strings (atomic reference counts) once more
//! and each drop releases them twice, which showed in the profile of
//! [`compute`](super::compute::compute) next to the hashing. Here the map
//! holds only hashes: `heads` maps a frame's hash to the latest frame with
//! that hash, and each frame links to the previous one with the same hash, so
//! a lookup compares the frames of one (almost always one-long) chain.
//!
//! Tables of up to [`SMALL`] frames (most paths: a service's request has a
//! handful of frames) have no map at all and scan the hashes instead, which
//! saves allocating and freeing the map with each path.
//!
//! Each frame's hash is kept, so a table that copies frames out of another
//! ([`compute`](super::compute) out of its graph, [`splice`](super::merge::splice)
//! out of a callee's path) does not hash their strings again.

use std::hash::BuildHasher;

use rustc_hash::{FxBuildHasher, FxHashMap};

use super::Frame;

/// No previous frame with the same hash.
const NONE: u32 = u32::MAX;

/// Tables up to this many frames find frames by scanning their hashes;
/// larger ones build `heads`.
const SMALL: usize = 16;

/// Frames in first-intern order, ids `0..len`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FrameTable {
    frames: Vec<Frame>,
    /// Per frame: its hash, and the previous frame with that hash or [`NONE`].
    links: Vec<(u64, u32)>,
    /// Hash -> the latest frame with that hash; empty while the table has
    /// at most [`SMALL`] frames.
    heads: FxHashMap<u64, u32>,
}

impl FrameTable {
    /// An empty table with room for `n` frames.
    pub(crate) fn with_capacity(n: usize) -> Self {
        FrameTable {
            frames: Vec::with_capacity(n),
            links: Vec::with_capacity(n),
            heads: if n > SMALL {
                FxHashMap::with_capacity_and_hasher(n, FxBuildHasher)
            } else {
                FxHashMap::default()
            },
        }
    }

    /// The hash tables key frames by.
    pub(crate) fn hash(frame: &Frame) -> u64 {
        FxBuildHasher.hash_one(frame)
    }

    /// The frames, indexed by id.
    pub(crate) fn frames(&self) -> &[Frame] {
        &self.frames
    }

    /// Number of frames.
    pub(crate) fn len(&self) -> usize {
        self.frames.len()
    }

    /// The hash of frame `id` (as [`FrameTable::hash`] gives it).
    ///
    /// # Panics
    ///
    /// If `id` is not in the table.
    pub(crate) fn hash_of(&self, id: u32) -> u64 {
        self.links[id as usize].0
    }

    /// The id of `frame`, whose hash is `hash`, if it is in the table.
    fn find(&self, frame: &Frame, hash: u64) -> Option<u32> {
        if self.frames.len() <= SMALL {
            return (0..self.frames.len())
                .find(|&i| self.links[i].0 == hash && self.frames[i] == *frame)
                .map(|i| i as u32);
        }
        let mut id = *self.heads.get(&hash)?;
        while id != NONE {
            if self.frames[id as usize] == *frame {
                return Some(id);
            }
            id = self.links[id as usize].1;
        }
        None
    }

    fn insert_new(&mut self, frame: Frame, hash: u64) -> u32 {
        let id = u32::try_from(self.frames.len())
            .ok()
            .filter(|&id| id != NONE)
            .expect("more than u32::MAX - 1 frames; this is a bug");
        self.frames.push(frame);
        if self.frames.len() <= SMALL {
            self.links.push((hash, NONE));
        } else {
            if self.frames.len() == SMALL + 1 {
                // Outgrew the scan: link the frames so far.
                self.heads.reserve(2 * SMALL);
                for i in 0..SMALL {
                    let h = self.links[i].0;
                    self.links[i].1 = self.heads.insert(h, i as u32).unwrap_or(NONE);
                }
            }
            let prev = self.heads.insert(hash, id).unwrap_or(NONE);
            self.links.push((hash, prev));
        }
        id
    }

    /// Intern a frame: the id of an equal frame, or a new id.
    pub(crate) fn intern(&mut self, frame: Frame) -> u32 {
        let hash = Self::hash(&frame);
        match self.find(&frame, hash) {
            Some(id) => id,
            None => self.insert_new(frame, hash),
        }
    }

    /// Intern a borrowed frame whose hash is known (`hash` must be
    /// [`FrameTable::hash`] of it); clones it only when it is new.
    pub(crate) fn intern_hashed(&mut self, frame: &Frame, hash: u64) -> u32 {
        debug_assert_eq!(hash, Self::hash(frame));
        match self.find(frame, hash) {
            Some(id) => id,
            None => self.insert_new(frame.clone(), hash),
        }
    }

    /// Replace the frames by `frames` (distinct), in that order.
    pub(crate) fn rebuild(&mut self, frames: Vec<Frame>) {
        let mut table = FrameTable::with_capacity(frames.len());
        for frame in frames {
            let hash = Self::hash(&frame);
            table.insert_new(frame, hash);
        }
        *self = table;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_frames_share_an_id_and_colliding_hashes_chain() {
        let mut t = FrameTable::default();
        let a = t.intern(Frame::new("A", "a"));
        let b = t.intern(Frame::new("A", "b"));
        assert_ne!(a, b);
        assert_eq!(t.intern(Frame::new("A", "a")), a);
        // Force a collision: a different frame filed under a's hash.
        let c = Frame::new("C", "c");
        let c_id = t.insert_new(c.clone(), t.hash_of(a));
        assert_eq!(t.find(&Frame::new("A", "a"), t.hash_of(a)), Some(a));
        assert_eq!(t.find(&c, t.hash_of(a)), Some(c_id));
        assert_eq!(t.find(&Frame::new("D", "d"), t.hash_of(a)), None);
        assert_eq!(t.len(), 3);
        let h = FrameTable::hash(&Frame::new("A", "b"));
        assert_eq!(t.intern_hashed(&Frame::new("A", "b"), h), b);
    }

    #[test]
    fn large_tables_find_every_frame_and_chain_collisions() {
        let mut t = FrameTable::default();
        let frame = |i: usize| Frame::new("S", format!("f{i}"));
        // A collision among the frames linked when the table outgrows the scan.
        let a = t.intern(frame(0));
        let twin = t.insert_new(Frame::new("S", "twin"), t.hash_of(a));
        let ids: Vec<u32> = (1..3 * SMALL).map(|i| t.intern(frame(i))).collect();
        assert!(t.len() > SMALL);
        assert_eq!(t.intern(frame(0)), a);
        assert_eq!(t.find(&Frame::new("S", "twin"), t.hash_of(a)), Some(twin));
        for (i, id) in (1..3 * SMALL).zip(ids) {
            assert_eq!(t.intern(frame(i)), id);
        }
        assert_eq!(t.len(), 3 * SMALL + 1);
        let mut u = FrameTable::default();
        u.rebuild(t.frames().to_vec());
        assert_eq!(u.intern(frame(5)), t.intern(frame(5)));
    }
}
