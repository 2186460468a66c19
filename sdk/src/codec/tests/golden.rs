//! Golden wire bytes: the codec's reference.
//!
//! `src/codec/testdata/*.bin` were written by the encoder as it stood when
//! the codec was made fast (the encoder before that wrote the same bytes and
//! its decoder gave the same results), and `decode_results.txt` holds what
//! the decoder made of 3 000 deterministic hostile inputs derived from them.
//! The encoder must keep writing these bytes and the decoder must keep
//! giving these paths and error messages: paths cross services of different
//! versions, so the wire form and its errors may only change on purpose.
//! (Error messages include prost's text for malformed protobuf: a prost
//! upgrade that rewords them shows up here, and is blessed after a look.)
//!
//! After an intended change of the wire form (a new `VERSION`), rewrite the
//! files with `CPT_BLESS=1 cargo test -p cpt-sdk --lib codec::tests::golden`
//! and say why in the commit.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::*;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/codec/testdata")
}

fn blessing() -> bool {
    std::env::var_os("CPT_BLESS").is_some()
}

fn read_golden(name: &str) -> Vec<u8> {
    let path = dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "golden file {}: {e}; it is checked in (restore it with git), or, only when the \
             wire form changed on purpose, rewrite it with \
             `CPT_BLESS=1 cargo test -p cpt-sdk --lib codec::tests::golden`",
            path.display()
        )
    })
}

/// Compare `actual` with the checked-in file, or write it when blessing.
fn check_golden(name: &str, actual: &[u8]) {
    if blessing() {
        std::fs::create_dir_all(dir()).unwrap();
        std::fs::write(dir().join(name), actual).unwrap();
        return;
    }
    let want = read_golden(name);
    if want != actual {
        let at = want.iter().zip(actual).position(|(a, b)| a != b);
        panic!(
            "{name}: differs from the checked-in golden file ({} bytes checked in, {} now; \
             first difference at {}): the codec's wire form or its errors changed",
            want.len(),
            actual.len(),
            at.map_or("the end of the shorter".to_string(), |i| format!(
                "byte {i}"
            )),
        );
    }
}

fn limited(decode_limits: DecodeLimits, max_bytes: usize) -> EncodeOptions {
    EncodeOptions::new()
        .with_max_bytes(max_bytes)
        .with_decode_limits(decode_limits)
}

/// A chain `depth` deep under one root, with a sibling leaf per level.
fn deep_path(depth: usize) -> CriticalPath {
    let frames: Vec<Frame> = (0..depth)
        .map(|d| Frame::new(format!("s{}", d % 4), format!("n{d}")))
        .collect();
    let mut p = CriticalPath::new();
    for d in 1..=depth {
        p.push_frames(frames[..d].iter().cloned(), ms(1 + d as u64 % 3), Busy);
    }
    p
}

/// The golden cases: a name, a path, and the options it is encoded with.
fn cases() -> Vec<(&'static str, CriticalPath, EncodeOptions)> {
    let mut empty_stacks = CriticalPath::new();
    empty_stacks.push(vec![], ms(3), Network);
    empty_stacks.push_frames([Frame::new("", "")], ms(1), Busy);
    empty_stacks.push(vec![], ms(2), Busy);

    let c1 = Frame::new("C", "C1");
    let mut recursion = CriticalPath::new();
    recursion.push_frames([c1.clone(), c1.clone(), c1.clone()], ms(1), Busy);
    recursion.push_frames([Frame::new("A", "A2"), c1.clone()], ms(1), Busy);
    recursion.push_frames([Frame::new("B", "B2"), c1], ms(1), Busy);

    let mut extremes = CriticalPath::new();
    extremes.push_frames(
        [Frame::new("A", "x")],
        Duration::from_nanos(u64::MAX - 1),
        Busy,
    );
    extremes.push_frames([Frame::new("A", "y")], Duration::from_nanos(1), Busy);

    let mut accounting = fig2a_merged();
    accounting.accounting.truncated = ms(7);
    accounting.accounting.clock_skew = Duration::from_nanos(u64::MAX);

    let tight = DecodeLimits::default()
        .with_max_depth(2)
        .with_max_stack_frames(6);
    vec![
        ("fig2a_merged", fig2a_merged(), EncodeOptions::default()),
        (
            "fig2a_merged_unlimited",
            fig2a_merged(),
            unlimited_options(),
        ),
        (
            "every_accounting_field",
            accounting,
            EncodeOptions::default(),
        ),
        ("empty", CriticalPath::new(), EncodeOptions::default()),
        ("empty_stacks", empty_stacks, EncodeOptions::default()),
        ("recursion", recursion, EncodeOptions::default()),
        ("extreme_durations", extremes, EncodeOptions::default()),
        ("big_50", big_path(50), EncodeOptions::default()),
        (
            "big_400_coarsened_to_600_bytes",
            big_path(400),
            limited(DecodeLimits::default(), 600),
        ),
        (
            "big_400_fallback",
            big_path(400),
            limited(DecodeLimits::default(), 0),
        ),
        ("big_2000", big_path(2000), EncodeOptions::default()),
        (
            "big_400_tight_decoder",
            big_path(400),
            limited(tight, usize::MAX),
        ),
        ("deep_200_folded", deep_path(200), EncodeOptions::default()),
        ("deep_200_unlimited", deep_path(200), unlimited_options()),
    ]
}

#[test]
fn golden_encodings_are_byte_identical() {
    for (name, p, options) in cases() {
        let bytes = encode(&p, &options);
        check_golden(&format!("{name}.bin"), &bytes);
        let back = decode(&read_golden(&format!("{name}.bin")), &options.decode_limits)
            .unwrap_or_else(|e| panic!("{name}: golden bytes no longer decode: {e}"));
        assert_eq!(back.total(), p.total(), "{name}: total changed");
    }
}

/// The hand-built message of the hostile-bytes tests, as a golden file too:
/// it is the one input not written by our encoder.
#[test]
fn golden_hand_built_message_is_unchanged() {
    check_golden("valid_message.bin", &valid().encode_to_vec());
}

/// A path in a canonical text form (frames by value, not by table order).
fn canonical(p: &CriticalPath) -> String {
    let mut out = String::new();
    for s in p.segments() {
        for id in &s.stack {
            let f = p.frame(*id);
            let _ = write!(out, "{}:{}", f.service, f.name);
            if let Some(l) = &f.location {
                let _ = write!(out, "@{}:{}", l.file, l.line);
            }
            out.push(';');
        }
        let _ = writeln!(out, " {:?} {}", s.kind, s.duration.as_nanos());
    }
    let _ = write!(out, "{:?}", p.accounting);
    out
}

/// FNV-1a: a stable 64-bit digest, the same on every platform and release.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A varint of `value` padded to `width` bytes (non-canonical when wider than
/// needed: up to the 10 bytes prost reads, or 11, which it rejects).
fn padded_varint(out: &mut Vec<u8>, mut value: u64, width: usize) {
    for i in 0..width {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        out.push(if i + 1 == width { byte } else { byte | 0x80 });
    }
}

/// Raw protobuf fields: any tag, any wire type, packed columns of varints of
/// every width, declared lengths a little off: what reaches the decoder's
/// column readers and its fallbacks rather than prost's first check.
fn raw_fields(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.below(10) {
        let tag = 1 + rng.below(12) as u64;
        let wire = rng.below(6);
        let values: Vec<(u64, usize)> = (0..rng.below(6))
            .map(|_| {
                let v = match rng.below(3) {
                    0 => rng.next() % 8,
                    1 => rng.next() % 300,
                    _ => rng.next(),
                };
                (v, 1 + rng.below(11))
            })
            .collect();
        let need = |v: u64| (64 - v.leading_zeros() as usize).div_ceil(7).max(1);
        match wire {
            0..=2 => {
                let mut payload = Vec::new();
                for &(v, width) in &values {
                    padded_varint(&mut payload, v, width.max(need(v)));
                }
                padded_varint(&mut out, tag << 3 | 2, 1);
                let off = if wire == 0 {
                    rng.below(5) as i64 - 2
                } else {
                    0
                };
                let len = (payload.len() as i64 + off).max(0) as u64;
                padded_varint(&mut out, len, 1 + usize::from(wire == 1));
                out.extend_from_slice(&payload);
            }
            3 | 4 => {
                for &(v, _) in &values {
                    padded_varint(&mut out, tag << 3, 1);
                    padded_varint(&mut out, v, need(v));
                }
            }
            _ => {
                padded_varint(&mut out, tag << 3 | (values.len() as u64 % 6), 1);
                out.extend(values.iter().map(|(v, _)| *v as u8));
            }
        }
    }
    out
}

/// What the decoder makes of 3 000 inputs derived deterministically from the
/// golden encodings (mutations, splices, random raw fields), under the
/// default limits and tight ones: one line per input and limits, `ok` with
/// the segment count and a digest of the path, or `err` with the index of
/// the error message in the table that ends the file.
fn decode_results(
    decode: impl Fn(&[u8], &DecodeLimits) -> Result<CriticalPath, DecodeError>,
) -> (String, usize, usize) {
    let mut corpus: Vec<Vec<u8>> = cases()
        .iter()
        .map(|(name, _, _)| read_golden(&format!("{name}.bin")))
        .collect();
    corpus.push(read_golden("valid_message.bin"));
    corpus.retain(|b| !b.is_empty());
    let limits = DecodeLimits::default();
    let tight = DecodeLimits::new()
        .with_max_depth(3)
        .with_max_stack_frames(6);
    let mut rng = Rng(0x0901_de4b_17e5_u64 | 1);
    let mut messages: Vec<String> = Vec::new();
    let mut out = String::new();
    let (mut ok, mut n) = (0, 0);
    for i in 0..3000 {
        let bytes = if i % 4 == 3 {
            raw_fields(&mut rng)
        } else {
            mutate(&mut rng, &corpus)
        };
        let _ = write!(out, "{i} {:016x}", fnv(&bytes));
        for limits in [&limits, &tight] {
            n += 1;
            match decode(&bytes, limits) {
                Ok(p) => {
                    ok += 1;
                    check_decoded(&p, limits);
                    let _ = write!(
                        out,
                        " | ok {} {:016x}",
                        p.segments().len(),
                        fnv(canonical(&p).as_bytes())
                    );
                }
                Err(e) => {
                    let e = e.to_string();
                    let k = messages.iter().position(|m| *m == e).unwrap_or_else(|| {
                        messages.push(e);
                        messages.len() - 1
                    });
                    let _ = write!(out, " | err {k}");
                }
            }
        }
        out.push('\n');
    }
    out.push_str("\nerror messages:\n");
    for (k, m) in messages.iter().enumerate() {
        let _ = writeln!(out, "{k} {m}");
    }
    (out, ok, n)
}

/// The decoder gives the same paths and the same error messages as when the
/// golden results were written.
#[test]
fn golden_decode_results_are_unchanged() {
    let (out, ok, n) = decode_results(decode);
    // The inputs must reach past prost's parser, or this checks little.
    assert!(ok > n / 50, "only {ok} of {n} inputs decoded");
    check_golden("decode_results.txt", out.as_bytes());
}
