//! Splicing a callee's critical path under the caller's RPC node (CPT
//! "Propagation and merging").
//!
//! When a caller's RPC node is on its critical path, the callee's own path
//! says what the callee did with that time. [`splice`] puts the callee's
//! segments under the caller's RPC frame so that **exactly** the time the
//! caller observed is added, whatever the callee claimed:
//!
//! | callee reported          | what is added under the RPC frame                              | outcome |
//! |--------------------------|----------------------------------------------------------------|---------|
//! | total = observed         | the callee's segments                                          | [`SpliceOutcome::Exact`] |
//! | total < observed         | one [`Network`](SegmentKind::Network) segment on the RPC frame for the difference, then the callee's segments | [`SpliceOutcome::Undercount`] |
//! | total > observed         | the callee's segments scaled down so they sum to `observed`; the excess goes to [`Accounting::overcount`] | [`SpliceOutcome::Overcount`] |
//! | no path / undecodable    | one [`BlindSpot`](SegmentKind::BlindSpot) leaf naming the callee | [`SpliceOutcome::BlindSpot`] |
//!
//! The scaling is exact integer arithmetic on nanoseconds: segment `i` gets
//! `floor(S_i · observed / total) - floor(S_{i-1} · observed / total)` where
//! `S_i` is the running sum of the callee's durations, so the scaled
//! durations are never negative and sum to `observed` to the nanosecond.
//! A callee segment that scales to zero is dropped.
//!
//! The callee's [`Accounting`] is added into the caller's. Its fields that
//! describe time on the callee's path (network, blind spot, unattributed,
//! queueing, truncated) are scaled like the segments when the callee
//! overcounted; its own overcount is added as it is.

use std::time::Duration;

use super::{Accounting, Cause, CriticalPath, Frame, FrameId, SegmentKind, Stack};

/// What came back from a callee for one RPC.
#[derive(Clone, Copy, Debug)]
pub enum Callee<'a> {
    /// The callee's decoded critical path.
    Path(&'a CriticalPath),
    /// The callee returned no path, or one that did not decode: the whole
    /// call becomes one leaf naming the callee (a service name or address).
    BlindSpot {
        /// Who was called.
        callee: &'a str,
    },
}

/// What [`splice`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpliceOutcome {
    /// The callee's total equalled the observed time.
    Exact,
    /// The caller observed more than the callee reported; the difference is
    /// a network segment on the RPC frame.
    Undercount {
        /// Observed minus callee total.
        network: Duration,
    },
    /// The callee reported more than the caller observed; its segments were
    /// scaled down to the observed time.
    Overcount {
        /// Callee total minus observed.
        excess: Duration,
    },
    /// No path came back: one blind-spot leaf covers the call.
    BlindSpot {
        /// The time of the blind-spot leaf (the observed time).
        duration: Duration,
    },
}

/// Splice a callee's path under `prefix` so that exactly `observed` time is
/// added to `into`.
///
/// `prefix` is the caller's stack from its root to the RPC node's frame
/// (ids in `into`'s frame table). Depending on the callee's total (see the
/// [module docs](self)): the callee's segments are appended with `prefix` in
/// front of their stacks, plus a [`Network`](SegmentKind::Network) segment on
/// `prefix` for an undercount; or they are scaled down proportionally for an
/// overcount; or one [`BlindSpot`](SegmentKind::BlindSpot) segment on
/// `prefix` + a leaf frame `Frame::new(callee, callee)` is added. The
/// callee's accounting is added (scaled when it overcounted), and so are the
/// network, overcount or blind-spot times of this splice.
///
/// An empty callee path (total zero) is an undercount: all of `observed` is
/// network time. With `observed` zero nothing is added to the segments.
///
/// # Examples
///
/// CPT Fig. 2b with B1's own path {B1 4 ms, B2 12 ms} spliced under A's
/// 20 ms RPC node:
///
/// ```
/// use std::time::Duration;
/// use cpt_sdk::{CriticalPath, Frame, SegmentKind};
/// use cpt_sdk::path::merge::{splice, Callee, SpliceOutcome};
///
/// let ms = Duration::from_millis;
/// let mut b = CriticalPath::new();
/// b.push_frames([Frame::new("B", "B1")], ms(4), SegmentKind::Busy);
/// b.push_frames([Frame::new("B", "B1"), Frame::new("B", "B2")], ms(12), SegmentKind::Busy);
///
/// let mut a = CriticalPath::new();
/// let a1 = a.intern(Frame::new("A", "A1"));
/// let rpc = a.intern(Frame::new("A", "B1"));
/// a.push(vec![a1], ms(5), SegmentKind::Busy);
/// let out = splice(&mut a, &[a1, rpc], ms(20), Callee::Path(&b));
/// a.push(vec![a1], ms(8), SegmentKind::Busy);
///
/// assert_eq!(out, SpliceOutcome::Undercount { network: ms(4) });
/// assert_eq!(a.total(), ms(33));
/// assert_eq!(a.accounting.network, ms(4));
/// ```
///
/// # Panics
///
/// If an id in `prefix` did not come from `into` (a caller bug, never caused
/// by what the callee sent).
pub fn splice(
    into: &mut CriticalPath,
    prefix: &[FrameId],
    observed: Duration,
    callee: Callee<'_>,
) -> SpliceOutcome {
    splice_with(into, prefix, observed, callee, &mut Vec::new())
}

/// [`splice`] with the callee-to-caller frame map in a buffer the caller
/// keeps (its contents on entry do not matter).
pub(crate) fn splice_with(
    into: &mut CriticalPath,
    prefix: &[FrameId],
    observed: Duration,
    callee: Callee<'_>,
    map: &mut Vec<FrameId>,
) -> SpliceOutcome {
    let path = match callee {
        Callee::Path(path) => path,
        Callee::BlindSpot { callee } => {
            let leaf = into.intern(Frame::new(callee, callee));
            let mut stack = Stack::from_slice(prefix);
            stack.push(leaf);
            into.push(stack, observed, SegmentKind::BlindSpot);
            into.accounting.blind_spot = into.accounting.blind_spot.saturating_add(observed);
            return SpliceOutcome::BlindSpot { duration: observed };
        }
    };

    let observed_ns = observed.as_nanos();
    let total_ns = path
        .segments()
        .iter()
        .fold(0u128, |acc, s| acc.saturating_add(s.duration.as_nanos()));

    into.reserve(path.segments().len() + 1);
    // Callee frame id -> id in `into`: each frame interned once, in
    // first-use order (the order a frame-per-segment intern would give).
    map.clear();
    map.resize(path.frames().len(), UNMAPPED);
    for seg in path.segments() {
        for id in &seg.stack {
            let mapped = &mut map[id.0 as usize];
            if *mapped == UNMAPPED {
                *mapped = into.intern_from(path, *id);
            }
        }
    }
    let map = &map[..];
    into.check_ids(prefix);
    let push = |into: &mut CriticalPath, seg: &super::Segment, duration: Duration| {
        into.push_prefixed(prefix, &seg.stack, map, duration, seg.kind);
    };

    if total_ns <= observed_ns {
        let network = observed - nanos_to_duration(total_ns);
        into.push_slice(prefix, network, SegmentKind::Network);
        for seg in path.segments() {
            push(into, seg, seg.duration);
        }
        into.accounting.add(&path.accounting);
        into.accounting.network = into.accounting.network.saturating_add(network);
        if network.is_zero() {
            SpliceOutcome::Exact
        } else {
            SpliceOutcome::Undercount { network }
        }
    } else {
        let scale = Scale::new(observed_ns, total_ns);
        let mut running = 0u128;
        let mut done = 0u128;
        for seg in path.segments() {
            running = running.saturating_add(seg.duration.as_nanos());
            let upto = scale.apply(running);
            push(into, seg, nanos_to_duration(upto - done));
            done = upto;
        }
        debug_assert_eq!(
            done, observed_ns,
            "scaled callee segments must sum to observed"
        );
        let excess = nanos_to_duration(total_ns - observed_ns);
        // Every cause scales with the callee's segments, except overcount,
        // which keeps the callee's own and adds what was scaled away.
        let scaled = Accounting::from_causes(path.accounting.iter().map(|(c, d)| {
            let d = match c {
                Cause::Overcount => d.saturating_add(excess),
                _ => scale.apply_duration(d),
            };
            (c, d)
        }));
        into.accounting.add(&scaled);
        SpliceOutcome::Overcount { excess }
    }
}

/// Not a frame of any path (tables stop below `u32::MAX` frames).
const UNMAPPED: FrameId = FrameId(u32::MAX);

/// Exact `x · observed / total`, rounded down, for `x <= total` and
/// `observed < total`, without overflow for any `Duration`s.
///
/// Durations reach 2^95 ns, so `x · observed` can overflow `u128`. Both `x`
/// and `total` are shifted right by the same `k` bits until `total` fits in
/// 64 bits (k = 0 for every total below 584 years); `observed` is split into
/// `q · t + r` with `t = total >> k`, so `x' · observed / t = x' · q +
/// x' · r / t`, each product below 2^128. Because `total >> k` is exactly
/// `t`, `apply(total) == observed`: the sum stays exact.
#[derive(Clone, Copy, Debug)]
struct Scale {
    shift: u32,
    t: u128,
    q: u128,
    r: u128,
}

impl Scale {
    fn new(observed: u128, total: u128) -> Self {
        debug_assert!(observed < total);
        let bits = 128 - total.leading_zeros();
        let shift = bits.saturating_sub(64);
        let t = total >> shift;
        Scale {
            shift,
            t,
            q: observed / t,
            r: observed % t,
        }
    }

    fn apply(&self, x: u128) -> u128 {
        let x = x >> self.shift;
        // x <= t < 2^64, r < t and q < 2^(shift+1): both products fit for
        // any total below 2^127 ns (more than 2^32 segments of Duration::MAX).
        // Saturating only so that no input can make this panic.
        x.saturating_mul(self.q)
            .saturating_add(x.saturating_mul(self.r) / self.t)
    }

    fn apply_duration(&self, d: Duration) -> Duration {
        // Accounting fields are not bounded by the callee's total (they are
        // the callee's own claims); clamp before scaling.
        let x = d.as_nanos().min(self.t << self.shift);
        nanos_to_duration(self.apply(x))
    }
}

/// `Duration` from a nanosecond count, saturating at `Duration::MAX`.
pub(crate) fn nanos_to_duration(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    match u64::try_from(nanos / NANOS_PER_SEC) {
        Ok(secs) => Duration::new(secs, (nanos % NANOS_PER_SEC) as u32),
        Err(_) => Duration::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use SegmentKind::{BlindSpot, Busy, Network, Unattributed};

    use crate::testing::ms;

    fn ns(n: u64) -> Duration {
        Duration::from_nanos(n)
    }

    /// (service:name frames root→leaf, duration, kind) of every segment.
    fn segs(p: &CriticalPath) -> Vec<(Vec<String>, Duration, SegmentKind)> {
        p.segments()
            .iter()
            .map(|s| {
                let stack = p
                    .stack_frames(s)
                    .map(|f| format!("{}:{}", f.service, f.name))
                    .collect();
                (stack, s.duration, s.kind)
            })
            .collect()
    }

    fn stack(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// CPT Fig. 2b's B1 subtree: {B1 4 ms, B2 12 ms}.
    fn callee_b(b1: Duration, b2: Duration) -> CriticalPath {
        let mut b = CriticalPath::new();
        b.push_frames([Frame::new("B", "B1")], b1, Busy);
        b.push_frames([Frame::new("B", "B1"), Frame::new("B", "B2")], b2, Busy);
        b
    }

    /// A caller path with root A1 and an RPC frame "B1" (service A).
    fn caller() -> (CriticalPath, Vec<FrameId>) {
        let mut a = CriticalPath::new();
        let a1 = a.intern(Frame::new("A", "A1"));
        let rpc = a.intern(Frame::new("A", "B1"));
        (a, vec![a1, rpc])
    }

    #[test]
    fn cpt_fig2b_exact_splice() {
        let (mut a, prefix) = caller();
        let out = splice(
            &mut a,
            &prefix,
            ms(16),
            Callee::Path(&callee_b(ms(4), ms(12))),
        );
        assert_eq!(out, SpliceOutcome::Exact);
        assert_eq!(
            segs(&a),
            vec![
                (stack(&["A:A1", "A:B1", "B:B1"]), ms(4), Busy),
                (stack(&["A:A1", "A:B1", "B:B1", "B:B2"]), ms(12), Busy),
            ]
        );
        assert!(a.accounting.is_zero());
    }

    #[test]
    fn cpt_fig2b_undercount_is_network() {
        let (mut a, prefix) = caller();
        let out = splice(
            &mut a,
            &prefix,
            ms(20),
            Callee::Path(&callee_b(ms(4), ms(12))),
        );
        assert_eq!(out, SpliceOutcome::Undercount { network: ms(4) });
        assert_eq!(
            segs(&a),
            vec![
                (stack(&["A:A1", "A:B1"]), ms(4), Network),
                (stack(&["A:A1", "A:B1", "B:B1"]), ms(4), Busy),
                (stack(&["A:A1", "A:B1", "B:B1", "B:B2"]), ms(12), Busy),
            ]
        );
        assert_eq!(a.total(), ms(20));
        assert_eq!(a.accounting.network, ms(4));
    }

    #[test]
    fn cpt_fig2b_overcount_is_scaled() {
        // Callee claims 32 ms, caller saw 16 ms: everything halves.
        let (mut a, prefix) = caller();
        let out = splice(
            &mut a,
            &prefix,
            ms(16),
            Callee::Path(&callee_b(ms(8), ms(24))),
        );
        assert_eq!(out, SpliceOutcome::Overcount { excess: ms(16) });
        assert_eq!(
            segs(&a),
            vec![
                (stack(&["A:A1", "A:B1", "B:B1"]), ms(4), Busy),
                (stack(&["A:A1", "A:B1", "B:B1", "B:B2"]), ms(12), Busy),
            ]
        );
        assert_eq!(a.accounting.overcount, ms(16));
    }

    #[test]
    fn overcount_rounding_keeps_sum_exact() {
        // 3 segments of 1 ns each scaled to 2 ns: 1/3 rounding everywhere.
        let mut b = CriticalPath::new();
        for name in ["x", "y", "z"] {
            b.push_frames([Frame::new("B", name)], ns(1), Busy);
        }
        let (mut a, prefix) = caller();
        splice(&mut a, &prefix, ns(2), Callee::Path(&b));
        assert_eq!(a.total(), ns(2));
        let durations: Vec<_> = a.segments().iter().map(|s| s.duration).collect();
        // floor(1·2/3)=0, floor(2·2/3)=1, floor(3·2/3)=2 → x dropped, y 1, z 1.
        assert_eq!(durations, vec![ns(1), ns(1)]);
    }

    #[test]
    fn blind_spot_leaf_names_the_callee() {
        let (mut a, prefix) = caller();
        let out = splice(&mut a, &prefix, ms(20), Callee::BlindSpot { callee: "B" });
        assert_eq!(out, SpliceOutcome::BlindSpot { duration: ms(20) });
        assert_eq!(
            segs(&a),
            vec![(stack(&["A:A1", "A:B1", "B:B"]), ms(20), BlindSpot)]
        );
        assert_eq!(a.accounting.blind_spot, ms(20));
    }

    #[test]
    fn callee_accounting_is_added_and_scaled() {
        let mut b = callee_b(ms(4), ms(12));
        b.push_frames([Frame::new("B", "B1")], ms(4), Unattributed);
        b.accounting = Accounting {
            network: ms(2),
            overcount: ms(1),
            blind_spot: ms(6),
            unattributed: ms(4),
            queueing: ms(2),
            truncated: ms(8),
            clock_skew: ms(6),
        };
        // Exact: added as is.
        let (mut a, prefix) = caller();
        splice(&mut a, &prefix, ms(20), Callee::Path(&b));
        assert_eq!(a.accounting, b.accounting);
        // Halved: on-path fields halve; overcount adds the 10 ms excess.
        let (mut a, prefix) = caller();
        splice(&mut a, &prefix, ms(10), Callee::Path(&b));
        assert_eq!(
            a.accounting,
            Accounting {
                network: ms(1),
                overcount: ms(11),
                blind_spot: ms(3),
                unattributed: ms(2),
                queueing: ms(1),
                truncated: ms(4),
                clock_skew: ms(3),
            }
        );
    }

    #[test]
    #[rustfmt::skip]
    fn hostile_durations() {
        struct Case { name: &'static str, callee: Vec<Duration>, observed: Duration, outcome: SpliceOutcome }
        let huge = Duration::MAX;
        let cases = [
            Case { name: "empty_path_is_all_network", callee: vec![], observed: ms(5), outcome: SpliceOutcome::Undercount { network: ms(5) } },
            Case { name: "empty_path_zero_observed", callee: vec![], observed: Duration::ZERO, outcome: SpliceOutcome::Exact },
            Case { name: "zero_observed_drops_callee", callee: vec![ms(3), ms(4)], observed: Duration::ZERO, outcome: SpliceOutcome::Overcount { excess: ms(7) } },
            Case { name: "huge_callee_tiny_observed", callee: vec![huge], observed: ns(1), outcome: SpliceOutcome::Overcount { excess: huge - ns(1) } },
            Case { name: "huge_observed_tiny_callee", callee: vec![ns(1)], observed: huge, outcome: SpliceOutcome::Undercount { network: huge - ns(1) } },
            Case { name: "callee_sum_overflows_duration", callee: vec![huge, huge, huge], observed: huge, outcome: SpliceOutcome::Overcount { excess: huge } },
            Case { name: "beyond_u64_nanos_exact", callee: vec![Duration::from_secs(1 << 40), Duration::from_secs(1 << 40)], observed: Duration::from_secs(1 << 40), outcome: SpliceOutcome::Overcount { excess: Duration::from_secs(1 << 40) } },
        ];
        for case in cases {
            let mut b = CriticalPath::new();
            for (i, d) in case.callee.iter().enumerate() {
                b.push_frames([Frame::new("B", format!("b{i}"))], *d, Busy);
            }
            let (mut a, prefix) = caller();
            let before = a.total();
            let out = splice(&mut a, &prefix, case.observed, Callee::Path(&b));
            assert_eq!(out, case.outcome, "{}", case.name);
            assert_eq!(a.total() - before, case.observed, "{}: must add exactly observed", case.name);
        }
    }

    #[test]
    fn scaled_proportions_beyond_u64_nanos() {
        // Totals above 2^64 ns use the shifted scale; proportions hold.
        let big = Duration::from_secs(1 << 40);
        let mut b = CriticalPath::new();
        b.push_frames([Frame::new("B", "x")], big, Busy);
        b.push_frames([Frame::new("B", "y")], big * 3, Busy);
        let (mut a, prefix) = caller();
        splice(&mut a, &prefix, big, Callee::Path(&b));
        let d: Vec<_> = a
            .segments()
            .iter()
            .map(|s| s.duration.as_secs_f64())
            .collect();
        let quarter = big.as_secs_f64() / 4.0;
        assert!((d[0] - quarter).abs() / quarter < 1e-9, "{d:?}");
        assert_eq!(a.total(), big);
    }

    #[test]
    fn absurd_depth_callee_is_spliced_whole() {
        let mut b = CriticalPath::new();
        let stack: Vec<Frame> = (0..5_000)
            .map(|i| Frame::new("B", format!("f{i}")))
            .collect();
        b.push_frames(stack, ms(3), Busy);
        let (mut a, prefix) = caller();
        splice(&mut a, &prefix, ms(3), Callee::Path(&b));
        assert_eq!(a.depth(), 5_002);
        assert_eq!(a.total(), ms(3));
    }

    #[test]
    fn recursive_callee_a_b_a_b_is_spliced_as_a_chain() {
        // A "cycle" on the wire cannot exist (parents come first), but a
        // recursive callee repeats frames: the stack keeps every level.
        let (a, b) = (Frame::new("B", "A"), Frame::new("B", "B"));
        let stack: Vec<Frame> = (0..64)
            .map(|i| if i % 2 == 0 { a.clone() } else { b.clone() })
            .collect();
        let mut callee = CriticalPath::new();
        callee.push_frames(stack, ms(2), Busy);
        let (mut into, prefix) = caller();
        assert_eq!(
            splice(&mut into, &prefix, ms(3), Callee::Path(&callee)),
            SpliceOutcome::Undercount { network: ms(1) }
        );
        assert_eq!(into.depth(), 66);
        assert_eq!(into.frames().len(), 4);
        assert_eq!(into.total(), ms(3));
    }

    #[test]
    fn blind_spot_with_extreme_observed() {
        let (mut into, prefix) = caller();
        into.accounting.blind_spot = Duration::MAX;
        let out = splice(
            &mut into,
            &prefix,
            Duration::MAX,
            Callee::BlindSpot { callee: "" },
        );
        assert_eq!(
            out,
            SpliceOutcome::BlindSpot {
                duration: Duration::MAX
            }
        );
        assert_eq!(into.accounting.blind_spot, Duration::MAX, "saturates");
        let out = splice(
            &mut into,
            &prefix,
            Duration::ZERO,
            Callee::BlindSpot { callee: "B" },
        );
        assert_eq!(
            out,
            SpliceOutcome::BlindSpot {
                duration: Duration::ZERO
            }
        );
        assert_eq!(
            into.segments().len(),
            1,
            "a zero-length blind spot adds no segment"
        );
    }

    #[test]
    fn repeated_callee_frames_are_interned_once() {
        // C1 called from two places in B, and the caller itself is in C's
        // table already: the same Frame maps to one id.
        let mut b = CriticalPath::new();
        b.push_frames([Frame::new("B", "B1"), Frame::new("C", "C1")], ms(1), Busy);
        b.push_frames([Frame::new("B", "B2"), Frame::new("C", "C1")], ms(1), Busy);
        let (mut a, prefix) = caller();
        a.intern(Frame::new("C", "C1"));
        splice(&mut a, &prefix, ms(2), Callee::Path(&b));
        assert_eq!(a.frames().len(), 5);
        assert_eq!(a.segments()[0].stack[3], a.segments()[1].stack[3]);
    }

    #[test]
    fn nanos_to_duration_saturates() {
        assert_eq!(
            nanos_to_duration(1_500_000_000),
            Duration::new(1, 500_000_000)
        );
        assert_eq!(nanos_to_duration(Duration::MAX.as_nanos()), Duration::MAX);
        assert_eq!(nanos_to_duration(u128::MAX), Duration::MAX);
    }

    proptest! {
        #[test]
        fn splice_adds_exactly_observed(
            durations in proptest::collection::vec(0u64..=u64::MAX, 0..20),
            observed in 0u64..=u64::MAX,
            kinds in proptest::collection::vec(0u8..3, 20),
        ) {
            let mut b = CriticalPath::new();
            for (i, d) in durations.iter().enumerate() {
                let kind = [Busy, Network, Unattributed][kinds[i] as usize];
                b.push_frames([Frame::new("B", "B1"), Frame::new("B", format!("b{}", i % 3))], ns(*d), kind);
            }
            let (mut a, prefix) = caller();
            a.push(prefix[..1].to_vec(), ms(1), Busy);
            let out = splice(&mut a, &prefix, ns(observed), Callee::Path(&b));
            prop_assert_eq!(a.total(), ms(1) + ns(observed));
            let total: u128 = durations.iter().map(|d| u128::from(*d)).sum();
            match out {
                SpliceOutcome::Exact => prop_assert_eq!(total, u128::from(observed)),
                SpliceOutcome::Undercount { network } => prop_assert_eq!(network.as_nanos(), u128::from(observed) - total),
                SpliceOutcome::Overcount { excess } => prop_assert_eq!(excess.as_nanos(), total - u128::from(observed)),
                SpliceOutcome::BlindSpot { .. } => prop_assert!(false, "not a blind spot"),
            }
            // Scaled segments never exceed what they were.
            let spliced: Vec<_> = a.segments().iter().filter(|s| s.stack.len() > 2).collect();
            prop_assert!(spliced.len() <= b.segments().len());
        }
    }
}
