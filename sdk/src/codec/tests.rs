//! Codec tests: round trips, coarsening to a limit, hostile bytes, and a
//! bounded in-process fuzz loop (the `cargo fuzz` target in `fuzz/` runs the
//! same checks for longer).

use std::time::Duration;

use proptest::prelude::*;
use prost::Message;

use super::proto::{AccountingProto, PathProto};
use super::*;
use crate::path::{Accounting, CriticalPath, Frame, SegmentKind};

use SegmentKind::{BlindSpot, Busy, Network, Queueing, Unattributed};

use crate::testing::ms;

fn compacted(p: &CriticalPath) -> CriticalPath {
    let mut p = p.clone();
    p.compact();
    p
}

/// Limits that never bind: for round trips that must not coarsen.
fn unlimited() -> DecodeLimits {
    DecodeLimits::new()
        .with_max_bytes(usize::MAX)
        .with_max_strings(usize::MAX)
        .with_max_tree_entries(usize::MAX)
        .with_max_segments(usize::MAX)
        .with_max_depth(usize::MAX)
        .with_max_stack_frames(usize::MAX)
}

fn unlimited_options() -> EncodeOptions {
    EncodeOptions::new()
        .with_max_bytes(usize::MAX)
        .with_decode_limits(unlimited())
}

fn roundtrip(p: &CriticalPath) -> CriticalPath {
    let bytes = encode(p, &unlimited_options());
    decode(&bytes, &unlimited()).expect("own encoding decodes")
}

/// CPT Fig. 2a with B1's own path spliced in, locations, every kind and
/// accounting.
fn fig2a_merged() -> CriticalPath {
    let a1 = Frame::new("A", "A1").with_location("a/src/main.rs", 10);
    let b1 = Frame::new("B", "B1").with_location("b/src/lib.rs", 12);
    let b2 = Frame::new("B", "B2");
    let a2 = Frame::new("A", "A2").with_location("a/src/main.rs", 40);
    let mut p = CriticalPath::new();
    p.push_frames([a1.clone()], ms(5), Busy);
    p.push_frames([a1.clone(), b1.clone()], ms(1), Network);
    p.push_frames([a1.clone(), b1.clone()], ms(4), Busy);
    p.push_frames([a1.clone(), b1.clone(), b2.clone()], ms(12), Busy);
    p.push_frames([a1.clone(), b1.clone()], ms(3), Queueing);
    p.push_frames([a1.clone()], ms(8), Busy);
    p.push_frames([a1.clone(), a2.clone()], ms(1), Unattributed);
    p.push_frames([a1, a2, Frame::new("C", "C")], ms(1), BlindSpot);
    p.accounting = Accounting {
        network: ms(1),
        overcount: ms(2),
        blind_spot: ms(1),
        unattributed: ms(1),
        queueing: ms(3),
        truncated: Duration::ZERO,
        clock_skew: Duration::ZERO,
    };
    p
}

#[test]
fn cpt_fig2a_roundtrip() {
    let p = fig2a_merged();
    let back = roundtrip(&p);
    assert_eq!(back, compacted(&p));
    assert_eq!(back.total(), ms(35));
    assert_eq!(back.frames()[1].location.as_ref().unwrap().line, 12);
}

#[test]
fn roundtrip_drops_unused_frames_and_is_deterministic() {
    let mut p = fig2a_merged();
    p.intern(Frame::new("Z", "unused"));
    let a = encode(&p, &EncodeOptions::default());
    let b = encode(&compacted(&p), &EncodeOptions::default());
    assert_eq!(a, b, "equal paths encode to equal bytes");
    assert_eq!(roundtrip(&p).frames().len(), p.frames().len() - 1);
}

#[test]
fn roundtrip_edge_shapes() {
    // Empty path.
    let empty = CriticalPath::new();
    assert_eq!(roundtrip(&empty), empty);
    // Empty stacks (a splice with an empty prefix produces them).
    let mut p = CriticalPath::new();
    p.push(vec![], ms(3), Network);
    p.push_frames([Frame::new("", "")], ms(1), Busy);
    p.push(vec![], ms(2), Busy);
    assert_eq!(roundtrip(&p), p);
    // Recursion: the same frame at several depths; the same frame under two
    // parents (CPT Fig. 1: A2, B2 and C2 all call C1).
    let c1 = Frame::new("C", "C1");
    let mut p = CriticalPath::new();
    p.push_frames([c1.clone(), c1.clone(), c1.clone()], ms(1), Busy);
    p.push_frames([Frame::new("A", "A2"), c1.clone()], ms(1), Busy);
    p.push_frames([Frame::new("B", "B2"), c1], ms(1), Busy);
    assert_eq!(roundtrip(&p), p);
    // Largest encodable durations.
    let mut p = CriticalPath::new();
    p.push_frames(
        [Frame::new("A", "x")],
        Duration::from_nanos(u64::MAX - 1),
        Busy,
    );
    p.push_frames([Frame::new("A", "y")], Duration::from_nanos(1), Busy);
    assert_eq!(roundtrip(&p), p);
}

#[test]
fn encoding_is_compact() {
    // 100 segments alternating between two 4-deep stacks: the tree has 5
    // entries, so each segment costs a few bytes.
    let stack = |leaf: &str| {
        ["A1", "A2", "B1", leaf].map(|n| Frame::new("svc", n).with_location("src/lib.rs", 1))
    };
    let mut p = CriticalPath::new();
    for i in 0..100 {
        let leaf = if i % 2 == 0 { "x" } else { "y" };
        p.push_frames(stack(leaf), Duration::from_micros(1500 + i), Busy);
    }
    let bytes = encode(&p, &EncodeOptions::default());
    assert!(bytes.len() < 100 * 5 + 100, "{} bytes", bytes.len());
}

/// A realistic big path: `n` segments over a tree of depth up to 8.
fn big_path(n: usize) -> CriticalPath {
    let mut p = CriticalPath::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let depth = 1 + (x % 8) as usize;
        let stack = (0..depth).map(|d| {
            Frame::new(
                format!("service-{}", d / 3),
                format!("component_{}_{}", d, (x >> (d * 3)) % 3),
            )
        });
        let kind = if i % 10 == 9 { Network } else { Busy };
        p.push_frames(
            stack,
            Duration::from_nanos(1 + (x >> 40) % 20_000_000),
            kind,
        );
    }
    p
}

#[test]
fn over_limit_coarsens_to_fit_and_keeps_total() {
    let p = big_path(1000);
    for max in [128, 300, 1024, 4096] {
        let bytes = encode(&p, &EncodeOptions::new().with_max_bytes(max));
        assert!(bytes.len() <= max, "{} > {max}", bytes.len());
        let back = decode(&bytes, &DecodeLimits::default()).unwrap();
        assert_eq!(back.total(), p.total(), "max {max}");
        assert!(back.accounting.truncated > Duration::ZERO, "max {max}");
        assert!(back.accounting.truncated <= back.total());
        let mut want = p.clone();
        want.coarsen(back.depth());
        want.compact();
        assert!(
            back == want || is_fallback(&back),
            "max {max}: not a coarsening of the input"
        );
    }
    // With room to spare nothing is folded.
    let bytes = encode(&p, &EncodeOptions::new().with_max_bytes(1 << 20));
    assert_eq!(
        decode(&bytes, &DecodeLimits::default()).unwrap(),
        compacted(&p)
    );
}

fn is_fallback(p: &CriticalPath) -> bool {
    p.segments().len() <= 1
        && p.segments()
            .iter()
            .all(|s| s.stack.is_empty() && s.kind == Busy)
        && p.accounting.truncated == p.total()
}

#[test]
fn root_that_cannot_fit_leaves_empty_stacks() {
    let mut p = CriticalPath::new();
    let long = "x".repeat(10_000);
    p.push_frames([Frame::new("A", long.as_str())], ms(3), Busy);
    p.push_frames([Frame::new("A", long.as_str())], ms(2), Network);
    p.accounting.network = ms(2);
    let bytes = encode(&p, &EncodeOptions::default());
    assert!(bytes.len() <= 4096);
    let back = decode(&bytes, &DecodeLimits::default()).unwrap();
    // Depth 0 (empty stacks, kinds kept) fits, so that is what is sent.
    assert_eq!(back.segments().len(), 2);
    assert_eq!(back.segments()[1].kind, Network);
    assert_eq!(back.total(), ms(5));
    assert_eq!(back.accounting.truncated, ms(5));
    assert_eq!(back.accounting.network, ms(2));
}

#[test]
fn alternating_kinds_that_cannot_fit_fall_back_to_one_segment() {
    let mut p = CriticalPath::new();
    for i in 0..1000u64 {
        let kind = if i % 2 == 0 { Busy } else { Unattributed };
        p.push_frames(
            [Frame::new("A", "A1")],
            Duration::from_nanos(1_000_000 + i),
            kind,
        );
    }
    let bytes = encode(&p, &EncodeOptions::new().with_max_bytes(0));
    assert!(bytes.len() <= MIN_MAX_BYTES, "{}", bytes.len());
    let back = decode(&bytes, &DecodeLimits::default()).unwrap();
    assert!(is_fallback(&back));
    assert_eq!(back.segments().len(), 1);
    assert_eq!(back.total(), p.total());
}

#[test]
fn fallback_with_every_field_at_maximum_fits_min_max_bytes() {
    let mut p = CriticalPath::new();
    for i in 0..100u64 {
        let kind = if i % 2 == 0 { Busy } else { Unattributed };
        p.push_frames(
            [Frame::new("A", "A1")],
            Duration::from_nanos(u64::MAX / 128),
            kind,
        );
    }
    p.accounting = Accounting {
        network: Duration::MAX,
        overcount: Duration::MAX,
        blind_spot: Duration::MAX,
        unattributed: Duration::MAX,
        queueing: Duration::MAX,
        truncated: Duration::MAX,
        clock_skew: Duration::MAX,
    };
    let bytes = encode(&p, &EncodeOptions::new().with_max_bytes(1));
    // The documented bound of the fallback form (codec module docs).
    assert!(bytes.len() <= 101, "{}", bytes.len());
    assert!(is_fallback(
        &decode(&bytes, &DecodeLimits::default()).unwrap()
    ));
}

#[test]
fn absurd_depth_path_is_folded_to_fit() {
    // 20 000 nested frames (runaway recursion): folded to what fits, total
    // kept, and the result decodes under the default depth limit.
    let mut p = CriticalPath::new();
    let stack: Vec<Frame> = (0..20_000)
        .map(|i| Frame::new("A", format!("f{i}")))
        .collect();
    p.push_frames(stack.clone(), ms(2), Busy);
    p.push_frames(stack[..3].to_vec(), ms(1), Busy);
    let bytes = encode(&p, &EncodeOptions::default());
    assert!(bytes.len() <= 4096);
    let back = decode(&bytes, &DecodeLimits::default()).unwrap();
    assert_eq!(back.total(), ms(3));
    assert!(back.depth() >= 3 && back.depth() <= DecodeLimits::default().max_depth);
    assert_eq!(back.accounting.truncated, ms(2));
}

#[test]
fn total_past_u64_nanos_is_clamped() {
    let mut p = CriticalPath::new();
    p.push_frames([Frame::new("A", "x")], Duration::from_nanos(u64::MAX), Busy);
    p.push_frames([Frame::new("A", "y")], Duration::from_nanos(u64::MAX), Busy);
    let back = decode(
        &encode(&p, &EncodeOptions::default()),
        &DecodeLimits::default(),
    )
    .unwrap();
    assert_eq!(back.total(), Duration::from_nanos(u64::MAX));
    assert!(is_fallback(&back));
}

// --- hostile bytes -------------------------------------------------------

/// A valid message: A1 → B1 (with a location), two segments, accounting.
fn valid() -> PathProto {
    PathProto {
        version: SINGLE_VERSION,
        strings: vec![
            "A".into(),
            "A1".into(),
            "B".into(),
            "B1".into(),
            "b.rs".into(),
        ],
        tree_parent: vec![0, 1],
        tree_service: vec![0, 2],
        tree_name: vec![1, 3],
        tree_file: vec![0, 5],
        tree_line: vec![0, 7],
        segment_entry_kind: vec![1 << 3, 2 << 3 | 3],
        segment_duration_nanos: vec![5, 20],
        accounting: Some(AccountingProto::from_accounting(&Accounting {
            network: Duration::from_nanos(20),
            ..Accounting::default()
        })),
        frames_fingerprint: None,
        segment_wait: Vec::new(),
    }
}

#[test]
fn valid_message_decodes() {
    let p = decode(&valid().encode_to_vec(), &DecodeLimits::default()).unwrap();
    assert_eq!(p.total(), Duration::from_nanos(25));
    assert_eq!(p.segments()[1].kind, Network);
    assert_eq!(&*p.frames()[1].location.as_ref().unwrap().file, "b.rs");
    assert_eq!(p.accounting.network, Duration::from_nanos(20));
}

#[test]
#[rustfmt::skip]
fn hostile_messages_are_rejected_with_the_right_error() {
    type Edit = fn(&mut PathProto);
    let small = DecodeLimits::new().with_max_strings(3).with_max_tree_entries(1).with_max_segments(1);
    let cases: &[(&str, Edit, DecodeLimits, &str)] = &[
        ("version_zero",           |m| m.version = 0,                               DecodeLimits::default(), "Version"),
        ("version_future",         |m| m.version = VERSION + 1,                     DecodeLimits::default(), "Version"),
        ("too_many_strings",       |_| {},                                          small, "TooMany"),
        ("too_many_entries",       |m| m.strings.truncate(3),                       small.with_max_strings(9), "TooMany"),
        ("too_many_segments",      |_| {},                                          small.with_max_strings(9).with_max_tree_entries(9), "TooMany"),
        ("service_column_short",   |m| { m.tree_service.pop(); },                   DecodeLimits::default(), "ColumnLength"),
        ("name_column_long",       |m| m.tree_name.push(0),                         DecodeLimits::default(), "ColumnLength"),
        ("file_column_partial",    |m| { m.tree_file.pop(); },                      DecodeLimits::default(), "ColumnLength"),
        ("line_column_missing",    |m| m.tree_line.clear(),                         DecodeLimits::default(), "ColumnLength"),
        ("durations_short",        |m| { m.segment_duration_nanos.pop(); },         DecodeLimits::default(), "ColumnLength"),
        ("service_index_out",      |m| m.tree_service[1] = 5,                       DecodeLimits::default(), "StringIndex"),
        ("name_index_huge",        |m| m.tree_name[0] = u32::MAX,                   DecodeLimits::default(), "StringIndex"),
        ("file_index_out",         |m| m.tree_file[1] = 6,                          DecodeLimits::default(), "StringIndex"),
        ("line_without_file",      |m| m.tree_line[0] = 3,                          DecodeLimits::default(), "LineWithoutFile"),
        ("parent_before_first",    |m| m.tree_parent[1] = 2,                        DecodeLimits::default(), "Parent"),
        ("parent_huge",            |m| m.tree_parent[0] = u32::MAX,                 DecodeLimits::default(), "Parent"),
        ("depth_over_limit",       |_| {},                                          DecodeLimits::new().with_max_depth(1), "TooDeep"),
        ("segment_entry_out",      |m| m.segment_entry_kind[0] = 3 << 3,            DecodeLimits::default(), "SegmentEntry"),
        ("segment_entry_huge",     |m| m.segment_entry_kind[0] = !7,                DecodeLimits::default(), "SegmentEntry"),
        ("segment_kind_5",         |m| m.segment_entry_kind[0] = 1 << 3 | 5,        DecodeLimits::default(), "SegmentCode"),
        ("segment_kind_7",         |m| m.segment_entry_kind[1] = 7,                 DecodeLimits::default(), "SegmentCode"),
        ("zero_duration",          |m| m.segment_duration_nanos[0] = 0,             DecodeLimits::default(), "ZeroDuration"),
        ("duration_sum_overflow",  |m| m.segment_duration_nanos = vec![u64::MAX, 1], DecodeLimits::default(), "DurationOverflow"),
        ("stack_frames_over",      |_| {},                                          DecodeLimits::new().with_max_stack_frames(2), "TooManyStackFrames"),
        ("too_large",              |_| {},                                          DecodeLimits::new().with_max_bytes(10), "TooLarge"),
    ];
    for (name, edit, limits, want) in cases {
        let mut m = valid();
        edit(&mut m);
        let err = decode(&m.encode_to_vec(), limits).expect_err(name);
        assert_eq!(err.kind_name(), *want, "{name}: {err}");
        assert!(err.to_string().starts_with("invalid critical path: "), "{name}: {err}");
    }
}

#[test]
fn error_messages_name_what_was_wrong() {
    let mut m = valid();
    m.tree_parent[1] = 9;
    let err = decode(&m.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid critical path: tree entry 1: parent 9 entries back, before the first entry"
    );
    let mut m = valid();
    m.version = 7;
    let err = decode(&m.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert!(err.is_version_mismatch());
    assert_eq!(
        err.to_string(),
        "invalid critical path: wire format version 7, this decoder reads version 1"
    );
}

#[test]
#[rustfmt::skip]
fn hostile_bytes_are_rejected() {
    let valid_bytes = valid().encode_to_vec();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("all_ff",                vec![0xff; 16]),
        ("truncated_message",     valid_bytes[..valid_bytes.len() - 3].to_vec()),
        ("varint_too_long",       vec![0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
        // strings field claiming 4 GiB with 3 bytes behind it.
        ("length_past_end",       vec![0x12, 0xff, 0xff, 0xff, 0xff, 0x0f, b'a', b'b', b'c']),
        // packed tree_parent claiming 2^63 bytes.
        ("packed_length_huge",    vec![0x1a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]),
        // version 1, then a string of two bytes that are not UTF-8.
        ("invalid_utf8",          vec![0x08, 0x01, 0x12, 0x02, 0xc3, 0x28]),
        ("wire_type_7",           vec![0x0f]),
        ("field_zero",            vec![0x00, 0x01]),
        ("empty_input",           vec![]),
    ];
    for (name, bytes) in cases {
        let err = decode(&bytes, &DecodeLimits::default()).expect_err(name);
        assert!(!err.to_string().is_empty(), "{name}");
    }
}

#[test]
fn unknown_fields_are_skipped() {
    // A newer writer may add fields; version 1 readers ignore them.
    let mut bytes = valid().encode_to_vec();
    bytes.extend_from_slice(&[0xf8, 0x06, 0x2a]); // field 111, varint 42
    bytes.extend_from_slice(&[0x82, 0x07, 0x02, b'h', b'i']); // field 112, "hi"
    let p = decode(&bytes, &DecodeLimits::default()).unwrap();
    assert_eq!(p.total(), Duration::from_nanos(25));
}

#[test]
fn absurd_depth_is_rejected_before_building() {
    let n = 100_000;
    let m = PathProto {
        version: SINGLE_VERSION,
        strings: vec!["s".into()],
        tree_parent: std::iter::once(0)
            .chain(std::iter::repeat_n(1, n - 1))
            .collect(),
        tree_service: vec![0; n],
        tree_name: vec![0; n],
        segment_entry_kind: vec![(n as u32) << 3],
        segment_duration_nanos: vec![1],
        ..PathProto::default()
    };
    let limits = DecodeLimits::new()
        .with_max_bytes(usize::MAX)
        .with_max_tree_entries(usize::MAX);
    let err = decode(&m.encode_to_vec(), &limits).unwrap_err();
    assert_eq!(err.kind_name(), "TooDeep", "{err}");
}

#[test]
fn amplification_is_bounded_by_max_stack_frames() {
    // 128-deep chain, 20k segments at the leaf alternating kinds: 2.5 M stack
    // frames from ~60 KiB.
    let depth = 128;
    let segs = 20_000;
    let m = PathProto {
        version: SINGLE_VERSION,
        strings: vec!["s".into()],
        tree_parent: std::iter::once(0)
            .chain(std::iter::repeat_n(1, depth - 1))
            .collect(),
        tree_service: vec![0; depth],
        tree_name: vec![0; depth],
        segment_entry_kind: (0..segs).map(|i| (depth as u32) << 3 | (i % 2)).collect(),
        segment_duration_nanos: vec![1; segs as usize],
        ..PathProto::default()
    };
    let bytes = m.encode_to_vec();
    assert!(bytes.len() <= DecodeLimits::default().max_bytes);
    let limits = DecodeLimits::new().with_max_segments(usize::MAX);
    let err = decode(&bytes, &limits).unwrap_err();
    assert_eq!(err.kind_name(), "TooManyStackFrames", "{err}");
}

// --- in-process fuzzing ----------------------------------------------------

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Corpus of valid encodings to mutate.
fn corpus() -> Vec<Vec<u8>> {
    let mut c = vec![
        valid().encode_to_vec(),
        encode(&fig2a_merged(), &EncodeOptions::default()),
        encode(&big_path(50), &EncodeOptions::default()),
        encode(&big_path(400), &EncodeOptions::new().with_max_bytes(600)),
        encode(&CriticalPath::new(), &EncodeOptions::default()),
    ];
    c.retain(|b| !b.is_empty());
    c
}

/// One mutated or random input.
fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    if rng.below(8) == 0 {
        let n = rng.below(64);
        return (0..n).map(|_| rng.next() as u8).collect();
    }
    let mut b = corpus[rng.below(corpus.len())].clone();
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(b.len() + 1);
                b.insert(i, rng.next() as u8);
            }
            3 if !b.is_empty() => {
                let i = rng.below(b.len());
                b.remove(i);
            }
            4 => b.truncate(rng.below(b.len() + 1)),
            5 if !b.is_empty() => {
                // Interesting bytes: varint extremes.
                let i = rng.below(b.len());
                b[i] = [0x00, 0x01, 0x7f, 0x80, 0xff][rng.below(5)];
            }
            _ => {
                // Splice a piece of another corpus entry.
                let other = &corpus[rng.below(corpus.len())];
                let from = rng.below(other.len());
                let len = rng.below(other.len() - from + 1);
                let at = rng.below(b.len() + 1);
                b.splice(at..at, other[from..from + len].iter().copied());
            }
        }
    }
    b
}

/// What must hold for every decoded input.
fn check_decoded(p: &CriticalPath, limits: &DecodeLimits) {
    assert!(p.depth() <= limits.max_depth);
    assert!(p.segments().len() <= limits.max_segments);
    assert!(p.segments().iter().all(|s| !s.duration.is_zero()));
    assert!(p.total().as_nanos() <= u128::from(u64::MAX));
    // What decodes re-encodes to something that decodes to the same path.
    let again = decode(&encode(p, &unlimited_options()), &unlimited())
        .expect("re-encoding a decoded path decodes");
    assert_eq!(again, compacted(p));
}

fn fuzz_decoder(inputs: u64, seed: u64) -> (u64, u64) {
    let corpus = corpus();
    let limits = DecodeLimits::default();
    let mut rng = Rng(seed | 1);
    let mut ok = 0;
    for _ in 0..inputs {
        let bytes = mutate(&mut rng, &corpus);
        if let Ok(p) = decode(&bytes, &limits) {
            ok += 1;
            check_decoded(&p, &limits);
        }
    }
    (inputs, ok)
}

#[test]
fn fuzz_decoder_200k_mutated_inputs() {
    let (n, ok) = fuzz_decoder(200_000, 0x5eed);
    // The mutator must reach the decoder's far side, not only the parser.
    assert!(ok > n / 100, "only {ok} of {n} inputs decoded");
}

/// Long run: `CPT_FUZZ_INPUTS=50000000 cargo test -p cpt-sdk --release
/// codec::tests::stress_fuzz_decoder -- --ignored --nocapture`.
#[test]
#[ignore = "stress test: run explicitly, see doc comment"]
fn stress_fuzz_decoder() {
    let n = std::env::var("CPT_FUZZ_INPUTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    let seed = std::env::var("CPT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xc0de);
    let start = std::time::Instant::now();
    let (n, ok) = fuzz_decoder(n, seed);
    println!("{n} inputs ({ok} decoded) in {:?}", start.elapsed());
}

// --- properties ------------------------------------------------------------

fn arb_kind() -> impl Strategy<Value = SegmentKind> {
    prop_oneof![
        4 => Just(Busy),
        1 => Just(Queueing),
        1 => Just(Unattributed),
        1 => Just(Network),
        1 => Just(BlindSpot),
    ]
}

fn arb_frame() -> impl Strategy<Value = Frame> {
    (0u8..3, 0u8..6, prop::option::of((0u8..2, 0u32..500))).prop_map(|(s, n, loc)| {
        let f = Frame::new(format!("svc{s}"), format!("span_{n}"));
        match loc {
            Some((file, line)) => f.with_location(format!("src/f{file}.rs"), line),
            None => f,
        }
    })
}

fn arb_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        8 => (1u64..50_000_000).prop_map(Duration::from_nanos),
        1 => (1u64..(1 << 50)).prop_map(Duration::from_nanos),
    ]
}

fn arb_accounting() -> impl Strategy<Value = Accounting> {
    prop::array::uniform7(prop_oneof![3 => Just(0u64), 1 => any::<u64>()]).prop_map(|a| {
        let d = Duration::from_nanos;
        Accounting {
            network: d(a[0]),
            overcount: d(a[1]),
            blind_spot: d(a[2]),
            unattributed: d(a[3]),
            queueing: d(a[4]),
            truncated: d(a[5]),
            clock_skew: d(a[6]),
        }
    })
}

prop_compose! {
    fn arb_path()(
        segs in prop::collection::vec(
            (prop::collection::vec(arb_frame(), 0..9), arb_duration(), arb_kind()), 0..60),
        accounting in arb_accounting(),
    ) -> CriticalPath {
        let mut p = CriticalPath::new();
        for (stack, d, kind) in segs {
            p.push_frames(stack, d, kind);
        }
        p.accounting = accounting;
        p
    }
}

proptest! {
    #[test]
    fn roundtrip_equals_compacted_input(p in arb_path()) {
        let bytes = encode(&p, &unlimited_options());
        let back = decode(&bytes, &unlimited()).unwrap();
        prop_assert_eq!(back, compacted(&p));
    }

    #[test]
    fn coarsened_encoding_respects_limit_and_keeps_total(p in arb_path(), max in 0usize..2048) {
        let bytes = encode(&p, &EncodeOptions::new().with_max_bytes(max));
        prop_assert!(bytes.len() <= max.max(MIN_MAX_BYTES));
        let back = decode(&bytes, &DecodeLimits::default()).unwrap();
        prop_assert_eq!(back.total(), p.total());
        let mut want = p.clone();
        want.coarsen(back.depth());
        want.compact();
        prop_assert!(back == want || is_fallback(&back), "not a coarsening: {:?}", back);
        // Everything but `truncated` travels unchanged.
        let mut a = back.accounting;
        a.truncated = p.accounting.truncated;
        prop_assert_eq!(a, p.accounting);
        prop_assert!(back.accounting.truncated >= p.accounting.truncated.min(p.total()));
    }

    #[test]
    fn encoding_always_decodes_under_its_decode_limits(
        p in arb_path(),
        max_bytes in 128usize..4096,
        depth in 0usize..6,
        counts in (0usize..40, 0usize..40, 1usize..40, 0usize..200),
    ) {
        let limits = limits_of(max_bytes, depth, counts);
        let bytes = encode(&p, &EncodeOptions::new().with_max_bytes(usize::MAX).with_decode_limits(limits));
        let back = decode(&bytes, &limits);
        prop_assert!(back.is_ok(), "{:?}", back);
        let back = back.unwrap();
        prop_assert_eq!(back.total(), p.total());
        let mut want = p.clone();
        want.coarsen(back.depth());
        want.compact();
        prop_assert!(back == want || is_fallback(&back), "not a coarsening: {:?}", back);
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let limits = DecodeLimits::default();
        if let Ok(p) = decode(&bytes, &limits) {
            check_decoded(&p, &limits);
        }
    }
}

mod golden;
/// Decode limits from a proptest's draws: bytes, depth, and the counts of
/// strings, tree entries, segments and stack frames.
fn limits_of(max_bytes: usize, depth: usize, counts: (usize, usize, usize, usize)) -> DecodeLimits {
    DecodeLimits::new()
        .with_max_bytes(max_bytes)
        .with_max_depth(depth)
        .with_max_strings(counts.0)
        .with_max_tree_entries(counts.1)
        .with_max_segments(counts.2)
        .with_max_stack_frames(counts.3)
}

mod split;

/// `encode` reuses its buffers from one path to the next on a thread: what
/// one path left in them (a larger, coarsened path's tree entries, columns
/// and frame strings) must not show in the next path's bytes.
#[test]
fn encoding_after_other_paths_leaves_no_trace_of_them() {
    let small = fig2a_merged();
    let first = encode(&small, &EncodeOptions::default());
    let big = big_path(400);
    let coarse = encode(&big, &EncodeOptions::new().with_max_bytes(600));
    assert!(coarse.len() <= 600);
    let full = encode(&big, &unlimited_options());
    assert_eq!(decode(&full, &unlimited()).unwrap(), compacted(&big));
    assert_eq!(encode(&small, &EncodeOptions::default()), first);
    assert_eq!(
        decode(&first, &DecodeLimits::default()).unwrap(),
        compacted(&small)
    );
    // A path encoded on a fresh thread (fresh buffers) has the same bytes.
    let fresh = std::thread::spawn(move || encode(&small, &EncodeOptions::default()))
        .join()
        .unwrap();
    assert_eq!(fresh, first);
}

/// `decode` reuses its message's columns from one path to the next on a
/// thread: a larger path before, or a rejected message, must leave nothing
/// in the next path.
#[test]
fn decoding_after_other_paths_leaves_no_trace_of_them() {
    let small = fig2a_merged();
    let bytes = encode(&small, &EncodeOptions::default());
    let first = decode(&bytes, &DecodeLimits::default()).unwrap();
    let big = big_path(400);
    let big_bytes = encode(&big, &unlimited_options());
    assert_eq!(decode(&big_bytes, &unlimited()).unwrap(), compacted(&big));
    // Over a count limit: rejected after the columns were read.
    assert!(decode(&big_bytes, &unlimited().with_max_segments(3)).is_err());
    assert_eq!(decode(&bytes, &DecodeLimits::default()).unwrap(), first);
    assert_eq!(first, compacted(&small));
}

// --- named waits ------------------------------------------------------------

/// A1 busy, A1 waiting on a sleep (named), A1/A2 waiting on nothing named.
fn with_named_waits() -> CriticalPath {
    let a1 = Frame::new("A", "A1").with_location("a/src/main.rs", 10);
    let sleep = Frame::wait(
        "A",
        "sleep",
        Some(crate::path::Location {
            file: "a/src/main.rs".into(),
            line: 88,
        }),
    );
    let mut p = CriticalPath::new();
    p.push_frames([a1.clone()], ms(5), Busy);
    p.push_frames([a1.clone(), sleep.clone()], ms(10), SegmentKind::Wait);
    p.push_frames([a1.clone(), Frame::new("A", "A2")], ms(1), Unattributed);
    p.push_frames([a1.clone(), sleep], ms(2), SegmentKind::Wait);
    p.accounting.unattributed = ms(1);
    p
}

#[test]
fn named_waits_round_trip() {
    let p = with_named_waits();
    assert_eq!(roundtrip(&p), compacted(&p));
}

/// A decoder that predates named waits skips field 12: it reads each named
/// wait as an unattributed wait whose leaf is the wait frame, and the rest
/// of the path as written.
#[test]
fn an_older_decoder_reads_named_waits_as_unattributed_leaves() {
    let p = with_named_waits();
    let bytes = encode(&p, &unlimited_options());
    let mut msg = PathProto::decode(&bytes[..]).expect("protobuf");
    assert_eq!(msg.segment_wait, vec![1, 3]);
    msg.segment_wait.clear();
    let old = decode(&msg.encode_to_vec(), &unlimited()).expect("decodes");
    let kinds: Vec<_> = old.segments().iter().map(|s| s.kind).collect();
    assert_eq!(kinds, [Busy, Unattributed, Unattributed, Unattributed]);
    let leaf = old.frame(*old.segments()[1].stack.last().unwrap());
    assert_eq!(&*leaf.name, "[sleep a/src/main.rs:88]");
    assert_eq!(old.total(), p.total());
}

/// Coarsened to fit, a named wait cut above its wait frame is an
/// unattributed wait of the frame it is folded into, and is counted so.
#[test]
fn a_named_wait_cut_by_coarsening_is_unattributed() {
    let p = with_named_waits();
    let limits = unlimited().with_max_depth(1);
    let options = EncodeOptions::new()
        .with_max_bytes(usize::MAX)
        .with_decode_limits(limits);
    let back = decode(&encode(&p, &options), &limits).expect("decodes");
    assert!(back.segments().iter().all(|s| s.kind != SegmentKind::Wait));
    assert_eq!(back.total(), p.total());
    assert_eq!(back.accounting.unattributed, ms(13));
    let mut coarse = p.clone();
    coarse.coarsen(1);
    assert_eq!(coarse.accounting.unattributed, ms(13));
    assert!(
        coarse
            .segments()
            .iter()
            .all(|s| s.kind != SegmentKind::Wait)
    );
}

/// `segment_wait` naming a segment that is not an unattributed one with a
/// stack, out of range, or out of order, is an error that says which.
#[test]
fn hostile_wait_lists_are_rejected() {
    let p = with_named_waits();
    let bytes = encode(&p, &unlimited_options());
    let good = PathProto::decode(&bytes[..]).expect("protobuf");
    for (list, what) in [
        (vec![0], "a busy segment"),
        (vec![9], "out of range"),
        (vec![3, 1], "out of order"),
        (vec![1, 1], "twice"),
    ] {
        let mut msg = good.clone();
        msg.segment_wait = list;
        let err = decode(&msg.encode_to_vec(), &unlimited()).expect_err(what);
        assert!(
            err.to_string().contains("segment_wait entry"),
            "{what}: {err}"
        );
    }
}
