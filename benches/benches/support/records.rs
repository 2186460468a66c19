//! Figure-1-shaped records that the aggregate, parquet and spark benches
//! generate: ~200 distinct frame stacks over services A–F, and paths of
//! 25–35 segments (mean 30) drawn from them.

use std::time::Duration;

use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
use cpt_sdk::testing::SplitMix64 as Rng;

/// ~200 distinct frame stacks over services A–F, depth 2–7; a frame's
/// location is a function of its name (one frame, one location).
pub(crate) fn stack_pool(rng: &mut Rng) -> Vec<Vec<Frame>> {
    let services = ["A", "B", "C", "D", "E", "F"];
    let root = Frame::new("A", "A1").with_location("a/src/main.rs", 40);
    (0..200u64)
        .map(|i| {
            let depth = 2 + rng.below(6) as usize;
            let mut stack = vec![root.clone()];
            for d in 1..depth {
                let svc = services[rng.below(services.len() as u64) as usize];
                let mut f = Frame::new(svc, format!("{svc}{}_{}", d, (i + d as u64) % 13));
                if ((i + d as u64) % 13).is_multiple_of(2) {
                    f = f.with_location(
                        format!("{}/src/handler.rs", svc.to_lowercase()),
                        d as u32 * 10,
                    );
                }
                stack.push(f);
            }
            stack
        })
        .collect()
}

/// A path of 25–35 segments from `stacks`: mostly busy, a few network,
/// unattributed, blind-spot and queueing ones, 10 µs–2 ms each. `frame`
/// copies a pool frame into the path (`Clone::clone` shares its strings;
/// a fresh copy owns them, as records decoded from the wire do).
pub(crate) fn figure1_path(
    rng: &mut Rng,
    stacks: &[Vec<Frame>],
    frame: impl Fn(&Frame) -> Frame,
) -> CriticalPath {
    random_path(rng, stacks, (25, 11), true, frame)
}

/// A path of 4–15 segments from `stacks` (the soak and store benches'
/// records): mostly busy, a few network, unattributed and queueing ones,
/// 10 µs–2 ms each.
pub(crate) fn short_path(rng: &mut Rng, stacks: &[Vec<Frame>]) -> CriticalPath {
    random_path(rng, stacks, (4, 12), false, Frame::clone)
}

/// `segments.0 + below(segments.1)` segments of random stacks, kinds (a
/// blind spot on every seventh at most, when `blind_spots`) and lengths.
fn random_path(
    rng: &mut Rng,
    stacks: &[Vec<Frame>],
    segments: (u64, u64),
    blind_spots: bool,
    frame: impl Fn(&Frame) -> Frame,
) -> CriticalPath {
    let mut p = CriticalPath::new();
    for s in 0..segments.0 + rng.below(segments.1) {
        let stack = &stacks[rng.below(stacks.len() as u64) as usize];
        let kind = match rng.below(20) {
            0 => SegmentKind::Network,
            1 => SegmentKind::Unattributed,
            2 if blind_spots && s % 7 == 0 => SegmentKind::BlindSpot,
            3 => SegmentKind::Queueing,
            _ => SegmentKind::Busy,
        };
        let us = 10 + rng.below(2_000);
        p.push_frames(stack.iter().map(&frame), Duration::from_micros(us), kind);
    }
    p
}
