//! A record's critical path packed as ids into a frames table: what the store
//! keeps beside each record's JSON so that a profile reads a few dozen bytes
//! a record and never parses JSON.
//!
//! The bytes are LEB128 varints: the number of segments, then per segment
//! its kind (one byte, [`SegmentKind`] in the order below), its nanoseconds,
//! its depth and its frames' ids, root first; then the seven accounting
//! durations in [`Accounting`]'s field order. The ids are whatever the
//! writer's frames table assigns: [`pack`] writes a path's own frame
//! indexes, [`remap`] rewrites them through the table.

use std::time::Duration;

use cpt_sdk::path::{Accounting, CriticalPath, SegmentKind};

/// By their byte; a new kind is appended, so that packed bytes written
/// before it still read.
const KINDS: [SegmentKind; 6] = [
    SegmentKind::Busy,
    SegmentKind::Queueing,
    SegmentKind::Unattributed,
    SegmentKind::Network,
    SegmentKind::BlindSpot,
    SegmentKind::Wait,
];

/// Why packed bytes do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("packed path: {0}")]
pub struct PackedError(&'static str);

#[inline]
pub(crate) fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
pub(crate) fn get(b: &[u8], at: &mut usize) -> Result<u64, PackedError> {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let byte = *b.get(*at).ok_or(PackedError("cut short"))?;
        *at += 1;
        if shift >= 64 {
            return Err(PackedError("varint too long"));
        }
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(v);
        }
        shift += 7;
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn kind_byte(k: SegmentKind) -> u64 {
    KINDS.iter().position(|x| *x == k).unwrap_or(0) as u64
}

/// Pack `path` with its own frame indexes (`path.frames()`) as ids.
pub fn pack(path: &CriticalPath, out: &mut Vec<u8>) {
    put(out, path.segments().len() as u64);
    for s in path.segments() {
        put(out, kind_byte(s.kind));
        put(out, ns(s.duration));
        put(out, s.stack.len() as u64);
        for id in s.stack.iter() {
            put(out, u64::from(id.0));
        }
    }
    let a = &path.accounting;
    for d in [
        a.network,
        a.overcount,
        a.blind_spot,
        a.unattributed,
        a.queueing,
        a.truncated,
        a.clock_skew,
    ] {
        put(out, ns(d));
    }
}

/// Rewrite packed bytes with every frame id `i` replaced by `map[i]`.
///
/// # Errors
///
/// When the bytes do not decode or name an id beyond `map`.
pub fn remap(packed: &[u8], map: &[u64], out: &mut Vec<u8>) -> Result<(), PackedError> {
    let mut at = 0;
    let n = get(packed, &mut at)?;
    put(out, n);
    for _ in 0..n {
        put(out, get(packed, &mut at)?);
        put(out, get(packed, &mut at)?);
        let depth = get(packed, &mut at)?;
        put(out, depth);
        for _ in 0..depth {
            let id = get(packed, &mut at)?;
            let to = usize::try_from(id)
                .ok()
                .and_then(|i| map.get(i))
                .ok_or(PackedError("frame id beyond the frame table"))?;
            put(out, *to);
        }
    }
    for _ in 0..7 {
        put(out, get(packed, &mut at)?);
    }
    Ok(())
}

/// Decode packed bytes: `segment(kind, ns, ids)` for each segment, in order;
/// returns the accounting.
///
/// # Errors
///
/// When the bytes do not decode (cut short, an unknown kind, trailing bytes).
pub fn unpack(
    packed: &[u8],
    ids: &mut Vec<u64>,
    mut segment: impl FnMut(SegmentKind, u64, &[u64]),
) -> Result<Accounting, PackedError> {
    let mut at = 0;
    let n = get(packed, &mut at)?;
    for _ in 0..n {
        let kind = usize::try_from(get(packed, &mut at)?)
            .ok()
            .and_then(|k| KINDS.get(k))
            .copied()
            .ok_or(PackedError("unknown segment kind"))?;
        let d = get(packed, &mut at)?;
        let depth = get(packed, &mut at)?;
        ids.clear();
        for _ in 0..depth {
            ids.push(get(packed, &mut at)?);
        }
        segment(kind, d, ids);
    }
    let mut acc = [0u64; 7];
    for a in &mut acc {
        *a = get(packed, &mut at)?;
    }
    if at != packed.len() {
        return Err(PackedError("trailing bytes"));
    }
    let d = Duration::from_nanos;
    Ok(Accounting {
        network: d(acc[0]),
        overcount: d(acc[1]),
        blind_spot: d(acc[2]),
        unattributed: d(acc[3]),
        queueing: d(acc[4]),
        truncated: d(acc[5]),
        clock_skew: d(acc[6]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpt_sdk::path::Frame;

    #[test]
    fn a_path_survives_packing_remapping_and_unpacking() {
        let mut p = CriticalPath::new();
        let a = p.intern(Frame::new("A", "A1"));
        let b = p.intern(Frame::new("B", "B1").with_location("b.rs", 3));
        p.push(vec![a], Duration::from_nanos(300), SegmentKind::Busy);
        p.push(
            vec![a, b],
            Duration::from_nanos(1 << 40),
            SegmentKind::Network,
        );
        p.push(vec![a], Duration::from_nanos(1), SegmentKind::BlindSpot);
        p.push(vec![a, b], Duration::from_nanos(2), SegmentKind::Wait);
        p.accounting.queueing = Duration::from_nanos(7);
        p.accounting.clock_skew = Duration::from_nanos(9);
        let mut packed = Vec::new();
        pack(&p, &mut packed);
        let mut global = Vec::new();
        remap(&packed, &[1000, 5], &mut global).unwrap();
        let mut segs = Vec::new();
        let acc = unpack(&global, &mut Vec::new(), |k, ns, ids| {
            segs.push((k, ns, ids.to_vec()));
        })
        .unwrap();
        assert_eq!(
            segs,
            vec![
                (SegmentKind::Busy, 300, vec![1000]),
                (SegmentKind::Network, 1 << 40, vec![1000, 5]),
                (SegmentKind::BlindSpot, 1, vec![1000]),
                (SegmentKind::Wait, 2, vec![1000, 5]),
            ]
        );
        assert_eq!(acc, p.accounting);
        assert!(unpack(&global[..global.len() - 1], &mut Vec::new(), |_, _, _| {}).is_err());
        assert!(remap(&packed, &[1], &mut Vec::new()).is_err());
    }
}
