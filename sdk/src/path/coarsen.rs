//! Coarsening: fold the deepest frames of a path into their ancestors.
//!
//! A critical path can be deeper than a reader needs, or larger than the
//! metadata it travels in allows (see [`crate::codec`]). Coarsening cuts every
//! stack after its first `max_depth` frames: the time of a deeper frame is
//! given to its ancestor at depth `max_depth`, so the total is unchanged.
//! Neighbouring segments that end up with the same stack and kind are merged.
//!
//! A segment keeps its [`SegmentKind`] when it is folded:
//! a network segment deep inside a callee is still network time, only shown
//! on a shallower frame, so [`Accounting`](super::Accounting) stays in
//! agreement with the segments. A named wait whose wait frame is cut
//! becomes an unattributed wait on the frame it is folded into (and is
//! counted there). The time whose stacks were cut is added to
//! [`Accounting::truncated`](super::Accounting::truncated).

use std::time::Duration;

use super::{CriticalPath, Segment, SegmentKind};

// === impl CriticalPath ===

impl CriticalPath {
    /// The length of the longest stack (0 for an empty path).
    pub fn depth(&self) -> usize {
        self.segments
            .iter()
            .map(|s| s.stack.len())
            .max()
            .unwrap_or(0)
    }

    /// Fold every frame deeper than `max_depth` into its ancestor at depth
    /// `max_depth`, merging neighbouring segments that become equal, and
    /// return the time whose stacks were cut.
    ///
    /// The total is unchanged. The returned time is added to
    /// [`Accounting::truncated`](super::Accounting::truncated), which is
    /// capped at the path's total (time folded twice is not counted twice
    /// beyond the whole path). Frames no segment refers to any more are
    /// dropped from the frame table ([`CriticalPath::compact`]).
    ///
    /// `max_depth == 0` leaves only empty stacks: one segment per run of
    /// equal kinds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cpt_sdk::{CriticalPath, Frame, SegmentKind};
    ///
    /// let ms = Duration::from_millis;
    /// let mut p = CriticalPath::new();
    /// p.push_frames([Frame::new("A", "A1")], ms(5), SegmentKind::Busy);
    /// p.push_frames([Frame::new("A", "A1"), Frame::new("B", "B1")], ms(20), SegmentKind::Busy);
    /// p.push_frames([Frame::new("A", "A1")], ms(8), SegmentKind::Busy);
    ///
    /// let folded = p.coarsen(1);
    /// assert_eq!(folded, ms(20));
    /// assert_eq!(p.segments().len(), 1);
    /// assert_eq!(p.total(), ms(33));
    /// assert_eq!(p.accounting.truncated, ms(20));
    /// ```
    pub fn coarsen(&mut self, max_depth: usize) -> Duration {
        let mut folded = Duration::ZERO;
        let mut out: Vec<Segment> = Vec::with_capacity(self.segments.len());
        for mut seg in self.segments.drain(..) {
            if seg.stack.len() > max_depth {
                seg.stack.truncate(max_depth);
                folded = folded.saturating_add(seg.duration);
                if seg.kind == SegmentKind::Wait {
                    // The leaf that named the wait is gone: what is left is
                    // a wait nothing names.
                    seg.kind = SegmentKind::Unattributed;
                    self.accounting.unattributed =
                        self.accounting.unattributed.saturating_add(seg.duration);
                }
            }
            match out.last_mut() {
                Some(last) if last.kind == seg.kind && last.stack == seg.stack => {
                    last.duration = last.duration.saturating_add(seg.duration);
                }
                _ => out.push(seg),
            }
        }
        self.segments = out;
        if !folded.is_zero() {
            let total = self.total();
            self.accounting.truncated = self.accounting.truncated.saturating_add(folded).min(total);
            self.compact();
        }
        folded
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use crate::path::{CriticalPath, Frame, FrameId, SegmentKind};

    use crate::testing::ms;

    /// Build a path from `(stack names, ms, kind)`; every frame in service "S".
    fn path(segs: &[(&[&str], u64, SegmentKind)]) -> CriticalPath {
        let mut p = CriticalPath::new();
        for (stack, d, kind) in segs {
            p.push_frames(stack.iter().map(|n| Frame::new("S", *n)), ms(*d), *kind);
        }
        p
    }

    fn names(p: &CriticalPath) -> Vec<(Vec<String>, u64, SegmentKind)> {
        p.segments()
            .iter()
            .map(|s| {
                let stack = p.stack_frames(s).map(|f| f.name.to_string()).collect();
                (stack, s.duration.as_millis() as u64, s.kind)
            })
            .collect()
    }

    use SegmentKind::{Busy, Network, Unattributed};

    #[test]
    #[rustfmt::skip]
    fn coarsen_table() {
        struct Case {
            name: &'static str,
            input: &'static [(&'static [&'static str], u64, SegmentKind)],
            depth: usize,
            want: &'static [(&'static [&'static str], u64, SegmentKind)],
            folded: u64,
        }
        let cases = [
            Case {
                name: "cpt_fig2a_sequential_fold_to_root",
                input: &[(&["A1"], 5, Busy), (&["A1", "B1"], 20, Busy), (&["A1"], 8, Busy), (&["A1", "A2"], 2, Busy)],
                depth: 1,
                want: &[(&["A1"], 35, Busy)],
                folded: 22,
            },
            Case {
                name: "depth_at_or_above_max_is_unchanged",
                input: &[(&["A1"], 5, Busy), (&["A1", "B1"], 20, Busy)],
                depth: 2,
                want: &[(&["A1"], 5, Busy), (&["A1", "B1"], 20, Busy)],
                folded: 0,
            },
            Case {
                name: "kinds_are_kept_and_not_merged_across",
                input: &[(&["A1"], 5, Busy), (&["A1", "B1"], 3, Network), (&["A1", "B1", "B2"], 7, Busy), (&["A1", "B1"], 1, Unattributed)],
                depth: 1,
                want: &[(&["A1"], 5, Busy), (&["A1"], 3, Network), (&["A1"], 7, Busy), (&["A1"], 1, Unattributed)],
                folded: 11,
            },
            Case {
                name: "deep_branch_folds_into_its_own_ancestor",
                input: &[(&["A1", "B1", "C1", "D1"], 4, Busy), (&["A1", "B1", "C1"], 1, Busy), (&["A1", "X1", "C1", "D1"], 2, Busy)],
                depth: 3,
                want: &[(&["A1", "B1", "C1"], 5, Busy), (&["A1", "X1", "C1"], 2, Busy)],
                folded: 6,
            },
            Case {
                name: "depth_zero_leaves_empty_stacks",
                input: &[(&["A1"], 5, Busy), (&["B1"], 5, Busy), (&["C1"], 1, Network)],
                depth: 0,
                want: &[(&[], 10, Busy), (&[], 1, Network)],
                folded: 11,
            },
            Case {
                name: "empty_path",
                input: &[],
                depth: 0,
                want: &[],
                folded: 0,
            },
        ];
        for case in cases {
            let mut p = path(case.input);
            let total = p.total();
            let folded = p.coarsen(case.depth);
            let want: Vec<_> = case.want.iter()
                .map(|(s, d, k)| (s.iter().map(|n| n.to_string()).collect::<Vec<_>>(), *d, *k))
                .collect();
            assert_eq!(names(&p), want, "{}", case.name);
            assert_eq!(folded, ms(case.folded), "{}", case.name);
            assert_eq!(p.accounting.truncated, ms(case.folded), "{}", case.name);
            assert_eq!(p.total(), total, "{}: total must be kept", case.name);
            assert!(p.depth() <= case.depth, "{}", case.name);
        }
    }

    #[test]
    fn coarsen_drops_frames_no_segment_uses() {
        let mut p = path(&[(&["A1", "B1", "B2"], 3, Busy), (&["A1"], 1, Busy)]);
        assert_eq!(p.frames().len(), 3);
        p.coarsen(1);
        assert_eq!(p.frames().len(), 1);
        assert_eq!(p.segments()[0].stack[..], [FrameId(0)]);
    }

    #[test]
    fn coarsen_truncated_never_exceeds_total() {
        let mut p = path(&[(&["A1", "B1"], 3, Busy)]);
        p.accounting.truncated = ms(3); // already truncated upstream
        p.coarsen(1);
        assert_eq!(p.accounting.truncated, ms(3));
    }

    #[test]
    fn coarsen_saturates_on_huge_durations() {
        let mut p = CriticalPath::new();
        let a = p.intern(Frame::new("S", "A1"));
        let b = p.intern(Frame::new("S", "B1"));
        let c = p.intern(Frame::new("S", "C1"));
        p.push(vec![a, b], Duration::MAX, Busy);
        p.push(vec![a, c], Duration::MAX, Busy);
        p.coarsen(1);
        assert_eq!(p.segments().len(), 1);
        assert_eq!(p.total(), Duration::MAX);
        assert_eq!(p.accounting.truncated, Duration::MAX);
    }

    #[test]
    fn coarsen_absurd_depth() {
        let mut p = CriticalPath::new();
        let stack: Vec<Frame> = (0..10_000)
            .map(|i| Frame::new("S", format!("f{i}")))
            .collect();
        p.push_frames(stack.clone(), ms(1), Busy);
        p.push_frames(stack[..5].to_vec(), ms(1), Busy);
        assert_eq!(p.depth(), 10_000);
        p.coarsen(5);
        assert_eq!(p.depth(), 5);
        assert_eq!(p.segments().len(), 1);
        assert_eq!(p.total(), ms(2));
        assert_eq!(p.frames().len(), 5);
    }

    proptest! {
        #[test]
        fn coarsen_keeps_total_and_bounds_depth(
            segs in proptest::collection::vec(
                (proptest::collection::vec(0u8..4, 0..8), 1u64..1_000_000, 0u8..3), 0..40),
            depth in 0usize..9,
        ) {
            let mut p = CriticalPath::new();
            for (stack, d, k) in &segs {
                let kind = [Busy, Network, Unattributed][*k as usize];
                p.push_frames(stack.iter().map(|i| Frame::new("S", format!("f{i}"))), Duration::from_nanos(*d), kind);
            }
            let before = p.clone();
            let folded = p.coarsen(depth);
            prop_assert_eq!(p.total(), before.total());
            prop_assert!(p.depth() <= depth);
            prop_assert!(p.accounting.truncated <= p.total());
            let deep: Duration = before.segments().iter()
                .filter(|s| s.stack.len() > depth).map(|s| s.duration).sum();
            prop_assert_eq!(folded, deep);
            // No two neighbours are equal after coarsening.
            for w in p.segments().windows(2) {
                prop_assert!(w[0].stack != w[1].stack || w[0].kind != w[1].kind);
            }
            // Folding again to the same depth changes nothing.
            let again = p.clone();
            prop_assert_eq!(p.coarsen(depth), Duration::ZERO);
            prop_assert_eq!(p, again);
        }
    }
}
