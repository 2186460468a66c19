//! The path codec: encode/decode time for paths of 10, 100 and 1000
//! segments and for a Figure-1-shaped path (57 segments over 11 frames of
//! three services, stacks 1–10 deep, as A returns it), and wire bytes of our frame-tree encoding against a naive
//! list-of-stacks encoding of the same path (CPT "Operational costs": the
//! per-element list of stacks is O(N·M)).
//!
//! The baseline is the same path as protobuf too (prost), one message per
//! segment holding its whole stack of frames, so the ratio measures the
//! layout, not the serialisation library. It reports ours / naive.
//!
//! ```text
//! cargo bench -p cpt-benches --bench codec -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::time::Duration;

use cpt_sdk::codec::{
    DecodeLimits, EncodeOptions, decode, decode_frames, decode_split, encode, encode_split,
};
use cpt_sdk::{CriticalPath, Frame, SegmentKind};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use prost::Message;

/// The naive wire form: every segment carries its whole stack.
mod naive {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Path {
        #[prost(message, repeated, tag = "1")]
        pub(crate) segments: Vec<Segment>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Segment {
        #[prost(message, repeated, tag = "1")]
        pub(crate) stack: Vec<Frame>,
        #[prost(uint64, tag = "2")]
        pub(crate) duration_nanos: u64,
        #[prost(uint32, tag = "3")]
        pub(crate) kind: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Frame {
        #[prost(string, tag = "1")]
        pub(crate) service: String,
        #[prost(string, tag = "2")]
        pub(crate) name: String,
        #[prost(string, tag = "3")]
        pub(crate) file: String,
        #[prost(uint32, tag = "4")]
        pub(crate) line: u32,
    }
}

fn naive_encode(p: &CriticalPath) -> Vec<u8> {
    naive::Path {
        segments: p
            .segments()
            .iter()
            .map(|s| naive::Segment {
                stack: p
                    .stack_frames(s)
                    .map(|f| naive::Frame {
                        service: f.service.to_string(),
                        name: f.name.to_string(),
                        file: f
                            .location
                            .as_ref()
                            .map_or_else(String::new, |l| l.file.to_string()),
                        line: f.location.as_ref().map_or(0, |l| l.line),
                    })
                    .collect(),
                duration_nanos: s.duration.as_nanos() as u64,
                kind: s.kind as u32,
            })
            .collect(),
    }
    .encode_to_vec()
}

fn naive_decode(bytes: &[u8]) -> CriticalPath {
    let msg = naive::Path::decode(bytes).expect("own encoding");
    let mut p = CriticalPath::new();
    for s in msg.segments {
        let stack = s.stack.into_iter().map(|f| {
            let frame = Frame::new(f.service, f.name);
            if f.file.is_empty() {
                frame
            } else {
                frame.with_location(f.file, f.line)
            }
        });
        p.push_frames(
            stack,
            Duration::from_nanos(s.duration_nanos),
            SegmentKind::Busy,
        );
    }
    p
}

/// A realistic path of `n` segments: a walk over a fixed call tree (fan-out
/// 3, depth 3–8) so frames repeat and neighbours share prefixes, three
/// services by depth, source locations, durations from µs to ms, every
/// tenth segment a network or unattributed wait.
fn realistic(n: usize) -> CriticalPath {
    const SERVICES: [&str; 3] = ["frontend", "search-backend", "doc-storage"];
    const VERBS: [&str; 8] = [
        "handle", "lookup", "rank", "fetch", "decode", "merge", "score", "filter",
    ];
    const NOUNS: [&str; 6] = [
        "request",
        "query",
        "shard",
        "posting_list",
        "document",
        "snippet",
    ];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rng = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // A tree node is its path of child indices; its frame is derived from it.
    let frame = |node: &[u8]| {
        let depth = node.len();
        let id = node.iter().fold(7u64, |h, c| h * 31 + u64::from(*c));
        let service = SERVICES[(depth - 1) * 3 / 8];
        let name = format!(
            "{service}::{}_{}",
            VERBS[(id % 8) as usize],
            NOUNS[(id / 8 % 6) as usize]
        );
        Frame::new(service, name).with_location(
            format!(
                "services/{service}/src/handlers/{}.rs",
                NOUNS[(id % 6) as usize]
            ),
            (id % 900) as u32 + 10,
        )
    };
    let mut node: Vec<u8> = vec![0, 0, 0];
    let mut p = CriticalPath::new();
    while p.segments().len() < n {
        match rng() % 4 {
            0 | 1 if node.len() < 8 => node.push((rng() % 3) as u8),
            2 if node.len() > 3 => {
                node.pop();
            }
            _ => {
                let last = node.len() - 1;
                node[last] = (rng() % 3) as u8;
            }
        }
        let kind = match rng() % 10 {
            0 => SegmentKind::Network,
            1 => SegmentKind::Unattributed,
            _ => SegmentKind::Busy,
        };
        let stack = (1..=node.len()).map(|d| frame(&node[..d]));
        let nanos = 1_000 + rng() % 5_000_000;
        p.push_frames(stack, Duration::from_nanos(nanos), kind);
    }
    p
}

/// A path shaped like the ones of the Figure 1 system (A → B → C, see
/// `cpt-examples`): `segments` segments cycling over the stacks A's merged
/// path has (server root frames without location, spans with
/// `examples/src/system.rs` locations, RPC frames, B's and C's paths spliced
/// under them), with queueing and network segments between busy ones.
fn figure1(segments: usize) -> CriticalPath {
    const FILE: &str = "examples/src/system.rs";
    let a = Frame::new("A", "/cpt.examples.A/Run");
    let a1 = Frame::new("A", "A1").with_location(FILE, 419);
    let a2 = Frame::new("A", "A2").with_location(FILE, 434);
    let rpc_b = Frame::new("A", "B /cpt.examples.B/B1");
    let b = Frame::new("B", "/cpt.examples.B/B1");
    let b1 = Frame::new("B", "B1").with_location(FILE, 308);
    let b2 = Frame::new("B", "B2").with_location(FILE, 347);
    let rpc_c = Frame::new("B", "C /cpt.examples.C/Scan");
    let c = Frame::new("C", "/cpt.examples.C/Scan");
    let c2 = Frame::new("C", "C2").with_location(FILE, 191);
    let c1 = Frame::new("C", "C1").with_location(FILE, 143);
    let rpc_a2c = Frame::new("A", "C /cpt.examples.C/C1");
    let c_unary = Frame::new("C", "/cpt.examples.C/C1");
    let under_b2 = [&a, &a1, &rpc_b, &b, &b1, &b2];
    let under_c2 = [&a, &a1, &rpc_b, &b, &b1, &b2, &rpc_c, &c, &c2];
    let stacks: Vec<(Vec<&Frame>, SegmentKind)> = vec![
        (vec![&a], SegmentKind::Queueing),
        (vec![&a, &a1], SegmentKind::Busy),
        (vec![&a, &a1, &rpc_b], SegmentKind::Network),
        (vec![&a, &a1, &rpc_b, &b], SegmentKind::Queueing),
        (vec![&a, &a1, &rpc_b, &b, &b1], SegmentKind::Busy),
        (under_b2.to_vec(), SegmentKind::Busy),
        (
            under_b2.iter().copied().chain([&rpc_c]).collect(),
            SegmentKind::Network,
        ),
        (under_c2[..8].to_vec(), SegmentKind::Queueing),
        (under_c2.to_vec(), SegmentKind::Busy),
        (
            under_c2.iter().copied().chain([&c1]).collect(),
            SegmentKind::Busy,
        ),
        (under_c2.to_vec(), SegmentKind::Queueing),
        (
            under_c2.iter().copied().chain([&c1]).collect(),
            SegmentKind::Busy,
        ),
        (under_b2.to_vec(), SegmentKind::Busy),
        (vec![&a, &a1], SegmentKind::Busy),
        (vec![&a, &a1, &a2], SegmentKind::Busy),
        (vec![&a, &a1, &a2, &rpc_a2c], SegmentKind::Network),
        (
            vec![&a, &a1, &a2, &rpc_a2c, &c_unary, &c1],
            SegmentKind::Busy,
        ),
        (vec![&a, &a1], SegmentKind::Busy),
        (vec![&a], SegmentKind::Busy),
    ];
    let mut p = CriticalPath::new();
    let mut i = 0;
    while p.segments().len() < segments {
        let (stack, kind) = &stacks[i % stacks.len()];
        let nanos = 20_000 + (i as u64 * 7_919) % 400_000;
        p.push_frames(
            stack.iter().map(|f| (*f).clone()),
            Duration::from_nanos(nanos),
            *kind,
        );
        i += 1;
    }
    p
}

fn codec(c: &mut Criterion) {
    let unlimited = EncodeOptions::new().with_max_bytes(usize::MAX);
    let limits = DecodeLimits::new().with_max_bytes(usize::MAX);
    let mut sizes = Vec::new();

    let cases = [
        ("10_segments", realistic(10)),
        ("100_segments", realistic(100)),
        ("1000_segments", realistic(1000)),
        ("fig1_57_segments", figure1(57)),
    ];
    for (name, path) in cases {
        let n = path.segments().len();
        let ours = encode(&path, &unlimited);
        let naive = naive_encode(&path);
        let split = encode_split(&path, &unlimited);
        let dictionary = decode_frames(&split.frames, &limits).unwrap();
        assert_eq!(
            decode_split(&dictionary, &split.segments, &limits).unwrap(),
            decode(&ours, &limits).unwrap()
        );
        assert_eq!(decode(&ours, &limits).unwrap().total(), path.total());
        assert_eq!(naive_decode(&naive).total(), path.total());
        sizes.push((
            name,
            path.depth(),
            path.frames().len(),
            ours.len(),
            naive.len(),
            (split.frames.len(), split.segments.len()),
        ));

        let mut group = c.benchmark_group(format!("codec/{name}"));
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::new("encode", "ours"), |b| {
            b.iter(|| encode(black_box(&path), &unlimited))
        });
        group.bench_function(BenchmarkId::new("encode", "naive"), |b| {
            b.iter(|| naive_encode(black_box(&path)))
        });
        group.bench_function(BenchmarkId::new("decode", "ours"), |b| {
            b.iter(|| decode(black_box(&ours), &limits).unwrap())
        });
        group.bench_function(BenchmarkId::new("decode", "naive"), |b| {
            b.iter(|| naive_decode(black_box(&naive)))
        });
        // The split form (codec version 2): what a hop pays once the
        // dictionary is known (the middleware keeps the decoded one).
        group.bench_function(BenchmarkId::new("encode", "split"), |b| {
            b.iter(|| encode_split(black_box(&path), &unlimited))
        });
        group.bench_function(BenchmarkId::new("decode", "split_known_dictionary"), |b| {
            b.iter(|| decode_split(&dictionary, black_box(&split.segments), &limits).unwrap())
        });
        if n == 1000 {
            // The default 4 KiB limit: coarsening until it fits.
            let options = EncodeOptions::default();
            let fitted = encode(&path, &options);
            let back = decode(&fitted, &limits).unwrap();
            println!(
                "1000 segments under the default limit: {} bytes, depth {} -> {}, {} segments, {:?} truncated",
                fitted.len(),
                path.depth(),
                back.depth(),
                back.segments().len(),
                back.accounting.truncated,
            );
            group.bench_function(BenchmarkId::new("encode", "ours_coarsened_4KiB"), |b| {
                b.iter(|| encode(black_box(&path), &options))
            });
        }
        group.finish();
    }

    println!("\nwire bytes, ours vs naive list of stacks (target ratio <= 0.25):");
    println!(
        "(split: the version 2 form's dictionary + segments; only the segments change per request)"
    );
    println!("path                depth  frames   ours  naive  ratio  split");
    for (name, depth, frames, ours, naive, (dict, segs)) in sizes {
        let ratio = ours as f64 / naive as f64;
        println!(
            "{name:<18} {depth:>6} {frames:>7} {ours:>6} {naive:>6}  {ratio:.3}  {dict} + {segs}"
        );
        assert!(
            ratio <= 0.25,
            "{name}: ratio {ratio:.3} above the 0.25 target"
        );
    }
}

criterion_group!(benches, codec);
criterion_main!(benches);
