//! Arbitrary paths through encode (with an arbitrary size limit), decode and
//! splice: the limit holds, totals are kept exactly, nothing panics.
#![no_main]

use std::time::Duration;

use cpt_sdk::codec::{DecodeLimits, EncodeOptions, MIN_MAX_BYTES, decode, encode};
use cpt_sdk::path::merge::{Callee, splice};
use cpt_sdk::{CriticalPath, Frame, SegmentKind};
use libfuzzer_sys::fuzz_target;

const KINDS: [SegmentKind; 5] = [
    SegmentKind::Busy,
    SegmentKind::Queueing,
    SegmentKind::Unattributed,
    SegmentKind::Network,
    SegmentKind::BlindSpot,
];

/// Reads the input as: max_bytes (u16), observed ns (u64), then segments of
/// [depth|kind byte, one byte per frame, duration (u32, scaled by a shift)].
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }

    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Reader(data);
    let (Some(max), Some(observed)) = (r.bytes::<2>(), r.bytes::<8>()) else {
        return;
    };
    let max = usize::from(u16::from_le_bytes(max));
    let observed = Duration::from_nanos(u64::from_le_bytes(observed));
    let mut path = CriticalPath::new();
    while let Some(head) = r.byte() {
        let depth = usize::from(head >> 4);
        let kind = KINDS[usize::from(head & 7) % KINDS.len()];
        let mut stack = Vec::new();
        for _ in 0..depth {
            let Some(f) = r.byte() else { break };
            let frame = Frame::new(format!("s{}", f >> 6), format!("n{}", f & 15));
            stack.push(if f & 32 != 0 {
                frame.with_location(format!("f{}.rs", f & 3), u32::from(f))
            } else {
                frame
            });
        }
        let Some(d) = r.bytes::<4>() else { break };
        let d = u64::from(u32::from_le_bytes(d)) << (d[0] & 31);
        path.push_frames(stack, Duration::from_nanos(d), kind);
    }

    let bytes = encode(&path, &EncodeOptions::new().with_max_bytes(max));
    assert!(bytes.len() <= max.max(MIN_MAX_BYTES));
    let back = decode(&bytes, &DecodeLimits::default())
        .expect("an encoding with the default options decodes under the default limits");
    // Totals past u64::MAX ns (584 years) are clamped to it.
    let clamped = path.total().min(Duration::from_nanos(u64::MAX));
    assert_eq!(back.total(), clamped);
    if back.accounting.truncated.is_zero() {
        let mut want = path.clone();
        want.compact();
        assert_eq!(back, want);
    }

    let mut caller = CriticalPath::new();
    let root = caller.intern(Frame::new("A", "A1"));
    let rpc = caller.intern(Frame::new("A", "call"));
    splice(&mut caller, &[root, rpc], observed, Callee::Path(&back));
    assert_eq!(caller.total(), observed);
});
