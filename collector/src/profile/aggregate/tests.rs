use super::*;
use cpt_sdk::path::CriticalPath;
use cpt_sdk::trigger::Trigger;

use cpt_sdk::testing::fixtures::table1;
use cpt_sdk::testing::ms;

fn a(name: &str) -> Frame {
    Frame::new("A", name)
}

/// One segment: stack of (service, name), milliseconds, kind.
pub(crate) type Seg<'a> = (&'a [(&'a str, &'a str)], u64, SegmentKind);

/// Build a record from segments.
pub(crate) fn record(segs: &[Seg<'_>]) -> Record {
    let mut p = CriticalPath::new();
    for (stack, d, kind) in segs {
        p.push_frames(stack.iter().map(|(s, n)| Frame::new(*s, *n)), ms(*d), *kind);
    }
    Record::new("A", Trigger::Sampled, p)
}

fn means_by_label(agg: &Aggregate) -> Vec<(String, u64)> {
    agg.stacks()
        .iter()
        .zip(agg.mean_nanos())
        .map(|(s, m)| (stack_label(agg, s, "/"), m))
        .collect()
}

#[test]
fn cpt_table1_aggregation() {
    let agg = Aggregate::from_records(&Selection::new(), table1());
    assert_eq!(agg.requests(), 2);
    assert_eq!(
        means_by_label(&agg),
        vec![
            ("A1 (A)".to_string(), 5_000_000),
            ("A1 (A)/A2 (A)".to_string(), 5_000_000),
            ("A1 (A)/B1 (B)".to_string(), 2_000_000),
        ]
    );
    assert_eq!(agg.mean_latency(), ms(12));
    assert_eq!(agg.mean_nanos().iter().sum::<u64>(), 12_000_000);
    // A1 is on both paths, A2 and B1 on one each.
    let on_path: Vec<u64> = agg.stacks().iter().map(|s| s.requests).collect();
    assert_eq!(on_path, vec![2, 1, 1]);
    // Per-request values: A1 6 and 4 ms → sum of squares 52 ms².
    assert_eq!(
        agg.stacks()[0].detail.as_ref().unwrap().sum_sq,
        52 * 10u128.pow(12)
    );
}

#[test]
fn aggregate_kinds_become_synthetic_leaves() {
    let r = record(&[
        (&[("A", "A1")], 1, SegmentKind::Queueing),
        (&[("A", "A1"), ("B", "rpc")], 2, SegmentKind::Network),
        (&[("A", "A1"), ("C", "rpc")], 3, SegmentKind::BlindSpot),
        (&[("A", "A1")], 4, SegmentKind::Unattributed),
        (&[("A", "A1")], 5, SegmentKind::Busy),
    ]);
    let agg = Aggregate::from_records(&Selection::new(), [r]);
    let got: Vec<String> = means_by_label(&agg).into_iter().map(|(l, _)| l).collect();
    assert_eq!(
        got,
        vec![
            "A1 (A)",
            "A1 (A)/[queueing]",
            "A1 (A)/[unattributed]",
            "A1 (A)/rpc (B)/[network]",
            "A1 (A)/rpc (C)/[blind spot]",
        ]
    );
    assert_eq!(agg.mean_latency(), ms(15));
}

/// A path coarsened to depth 0 (the codec's last resort over its size
/// limit) keeps its time in segments without frames: busy time goes to
/// `[no frames]`, other kinds to their leaf alone. Folding such a record
/// used to index past the trie.
#[test]
fn aggregate_path_coarsened_to_depth_zero_keeps_its_time() {
    let mut r = record(&[
        (&[("A", "A1")], 4, SegmentKind::Queueing),
        (&[("A", "A1"), ("B", "B1")], 5, SegmentKind::Busy),
        (&[("A", "A1")], 1, SegmentKind::Busy),
    ]);
    r.path.coarsen(0);
    assert!(r.path.segments().iter().all(|s| s.stack.is_empty()));
    let with_frames = record(&[(&[("A", "A1")], 2, SegmentKind::Busy)]);
    let agg = Aggregate::from_records(&Selection::new(), [r, with_frames]);
    assert_eq!(
        means_by_label(&agg),
        vec![
            (NO_FRAMES.to_string(), 3_000_000),
            ("[queueing]".to_string(), 2_000_000),
            ("A1 (A)".to_string(), 1_000_000),
        ]
    );
    assert_eq!(agg.mean_latency(), ms(6));
}

#[test]
fn aggregate_merge_keeps_the_average() {
    // One collector saw request 1 only, another request 2 only.
    let t = table1();
    let mut x = Aggregate::from_records(&Selection::new(), [&t[0]]);
    let y = Aggregate::from_records(&Selection::new(), [&t[1]]);
    assert_eq!(x.mean_latency(), ms(16));
    x.merge(&y);
    let whole = Aggregate::from_records(&Selection::new(), &t);
    assert_eq!(means_by_label(&x), means_by_label(&whole));
    assert_eq!(x.stacks(), whole.stacks());
    assert_eq!(x.mean_latency(), ms(12));
}

#[test]
fn aggregate_is_deterministic_across_batching() {
    // Many records, pushed sequentially vs in parallel batches: same result.
    let mut recs = Vec::new();
    for i in 0..3000u64 {
        let leaf = format!("n{}", i % 37);
        let svc = if i % 3 == 0 { "B" } else { "C" };
        let mut p = CriticalPath::new();
        p.push_frames([a("root")], ms(1 + i % 5), SegmentKind::Busy);
        p.push_frames(
            [a("root"), Frame::new(svc, leaf.as_str())],
            ms(i % 7 + 1),
            SegmentKind::Busy,
        );
        recs.push(Record::new("A", Trigger::Sampled, p));
    }
    let par = Aggregate::from_records(&Selection::new(), &recs);
    let mut seq = Aggregator::new(Selection::new());
    for r in &recs {
        seq.push(r);
    }
    let seq = seq.finish();
    assert_eq!(par, seq);
    assert_eq!(par.requests(), 3000);
}

#[test]
fn aggregate_percentile_band_uses_otherwise_selected_records() {
    // 10 sampled requests of 1..=10 ms plus one forced 100 ms request.
    let mut recs: Vec<Record> = (1..=10)
        .map(|n| record(&[(&[("A", "A1")], n, SegmentKind::Busy)]))
        .collect();
    let mut forced = record(&[(&[("A", "A1")], 100, SegmentKind::Busy)]);
    forced.trigger = Trigger::Forced;
    recs.push(forced);
    let band = crate::records::selection::PercentileBand::parse("p80-p100").unwrap();
    let agg = Aggregate::from_records(&Selection::new().with_percentile(band), &recs);
    // The forced record is not in the band's population: slowest 2 of 10.
    assert_eq!(agg.requests(), 2);
    assert_eq!(agg.mean_latency(), Duration::from_micros(9500));
    let low = crate::records::selection::PercentileBand::parse("p0-p80").unwrap();
    let agg = Aggregate::from_records(&Selection::new().with_percentile(low), &recs);
    assert_eq!(agg.requests(), 8);
    assert_eq!(agg.mean_latency(), Duration::from_micros(4500));
}

#[test]
fn aggregate_matches_a_naive_fold() {
    // Records with their own copies of every string (as decoded from
    // the wire), many stacks sharing prefixes, every kind, frames with
    // and without locations, names long and short: the fold's sums and
    // counts equal a straightforward map from frame stacks.
    let mut x = 7u64;
    let mut rnd = |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let kinds = [
        SegmentKind::Busy,
        SegmentKind::Queueing,
        SegmentKind::Unattributed,
        SegmentKind::Network,
        SegmentKind::BlindSpot,
    ];
    let frame = |d: u64, k: u64| {
        let name = if k % 3 == 0 {
            format!("a_rather_long_handler_name_{d}_{k}")
        } else {
            format!("n{d}{k}")
        };
        let f = Frame::new(["A", "B", "svc-c"][(k % 3) as usize], name);
        if k % 2 == 0 {
            f.with_location(format!("src/m{}.rs", k % 4), d as u32)
        } else {
            f
        }
    };
    let mut recs = Vec::new();
    let mut naive: HashMap<(Vec<Frame>, SegmentKind), (u64, u64)> = HashMap::new();
    for _ in 0..500 {
        let mut p = CriticalPath::new();
        let mut mine: HashMap<(Vec<Frame>, SegmentKind), u64> = HashMap::new();
        for _ in 0..1 + rnd(12) {
            let depth = 1 + rnd(6);
            let stack: Vec<Frame> = (0..depth).map(|d| frame(d, rnd(5))).collect();
            let kind = kinds[rnd(5) as usize];
            let d = 1 + rnd(1000);
            p.push_frames(stack.iter().cloned(), Duration::from_nanos(d), kind);
            *mine.entry((stack, kind)).or_default() += d;
        }
        for (k, v) in mine {
            let e = naive.entry(k).or_default();
            e.0 += v;
            e.1 += 1;
        }
        recs.push(Record::new("A", Trigger::Sampled, p));
    }
    let agg = Aggregate::from_records(&Selection::new(), &recs);
    let got: HashMap<Vec<Frame>, (u64, u64)> = agg
        .stacks()
        .iter()
        .map(|s| {
            (
                agg.stack_frames(s).cloned().collect(),
                (s.sum_nanos, s.requests),
            )
        })
        .collect();
    let want: HashMap<Vec<Frame>, (u64, u64)> = naive
        .into_iter()
        .map(|((mut stack, kind), v)| {
            stack.extend(kind_frame(kind));
            (stack, v)
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(agg.requests(), 500);
}

#[test]
fn aggregate_frames_differing_only_by_file_stay_apart() {
    // Same name, service and line hash alike; the file tells them apart.
    let mk = |file: &str| {
        let mut p = CriticalPath::new();
        let f = Frame::new("A", "handler").with_location(file, 12);
        p.push_frames([f], ms(1), SegmentKind::Busy);
        Record::new("A", Trigger::Sampled, p)
    };
    let agg = Aggregate::from_records(&Selection::new(), [mk("a.rs"), mk("b.rs"), mk("a.rs")]);
    let files: Vec<&str> = agg
        .frames()
        .iter()
        .map(|f| &*f.location.as_ref().unwrap().file)
        .collect();
    assert_eq!(files, ["a.rs", "b.rs"]);
    let sums: Vec<u64> = agg.stacks().iter().map(|s| s.sum_nanos).collect();
    assert_eq!(sums, [2_000_000, 1_000_000]);
}

#[test]
fn mean_nanos_add_up_to_rounded_mean() {
    // Three stacks of 1 ns each over 2 requests: means 0.5 each → 2 of 3
    // rounded up so the total is round(1.5) = 2.
    #[rustfmt::skip]
    let cases: &[(&[u64], u64, &[u64])] = &[
        (&[1, 1, 1], 2, &[1, 1, 0]),
        (&[10, 6, 8], 2, &[5, 3, 4]),
        (&[5, 5], 3, &[2, 1]),
        (&[], 0, &[]),
    ];
    for (sums, n, want) in cases {
        let total = sums.iter().sum();
        assert_eq!(
            apportion(sums.iter().copied(), *n, total),
            *want,
            "{sums:?}/{n}"
        );
    }
}

/// Records whose JSON uses every abbreviation (bare names inheriting the
/// service, locations implied by an earlier frame, `"file": ""`), with
/// latency ties, two services and labels.
fn json_corpus(n: u64) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let mut p = CriticalPath::new();
            let a1 = Frame::new("A", "A1").with_location("a.rs", 3);
            let b1 = Frame::new("B", "B1").with_location(format!("b{}.rs", i % 3).as_str(), 7);
            let b1_bare = Frame::new("B", "B1");
            p.push_frames([a1.clone()], ms(1 + i % 4), SegmentKind::Busy);
            p.push_frames([a1.clone(), b1.clone()], ms(2), SegmentKind::Network);
            p.push_frames([a1.clone(), b1_bare], ms(i % 2), SegmentKind::Busy);
            p.push_frames([a1, b1], ms(1), SegmentKind::Queueing);
            p.accounting.network = Duration::from_nanos(i);
            let mut r = Record::new(if i % 5 == 0 { "B" } else { "A" }, Trigger::Sampled, p);
            r.labels
                .insert("arm".into(), if i % 2 == 0 { "a" } else { "b" }.into());
            r.start_unix_nanos = Some(i);
            r
        })
        .collect()
}

fn json_block(text: &[u8], first_line: u64) -> crate::records::blocks::Block {
    crate::records::blocks::Block {
        bytes: text.to_vec(),
        first_line,
    }
}

#[test]
fn json_lines_fold_without_records_equals_the_records_fold_on_any_chunking() {
    let recs = json_corpus(400);
    let mut text = Vec::new();
    for (i, r) in recs.iter().enumerate() {
        if i == 10 {
            text.extend_from_slice(b"{\"service\":\n\n");
        }
        if i == 300 {
            text.extend_from_slice(b"\xff\xfe\n");
        }
        text.extend_from_slice(r.to_json().as_bytes());
        text.push(b'\n');
    }
    for q in [
        "",
        "percentile=p50-p100",
        "label=arm%3Db&percentile=p0-p30",
        "service=B",
    ] {
        let sel = Selection::from_query(q).unwrap();
        let want = Aggregate::from_records(&sel, &recs);
        // One block in big chunks; many blocks of small chunks; one line
        // per chunk.
        for (block_bytes, chunk_bytes) in [(1 << 30, 1 << 20), (4096, 700), (1, 1)] {
            let mut agg = Aggregator::new(sel.clone());
            let mut bad = Vec::new();
            let mut records = 0;
            let (mut at, mut line) = (0, 1);
            while at < text.len() {
                let end = text[at..]
                    .iter()
                    .enumerate()
                    .skip(block_bytes.min(text.len() - at - 1))
                    .find(|(_, b)| **b == b'\n')
                    .map_or(text.len(), |(i, _)| at + i + 1);
                let block = json_block(&text[at..end], line);
                let r = agg.push_json_block(&block, chunk_bytes, None);
                records += r.records;
                bad.extend(r.bad.into_iter().map(|(l, _)| l));
                line += text[at..end].iter().filter(|&&b| b == b'\n').count() as u64;
                at = end;
            }
            assert_eq!(records, 400);
            assert_eq!(bad, vec![11, 303], "{q} {block_bytes}");
            let got = agg.finish();
            assert_eq!(
                crate::profile::encode_gzip(&got),
                crate::profile::encode_gzip(&want),
                "{q}, blocks of {block_bytes}, chunks of {chunk_bytes}"
            );
        }
    }
}

/// A Parquet file of `recs` without dictionary encoding (as a writer falls
/// back to when a column's dictionary grows too big): every batch read
/// back then carries a dictionary of its own.
#[cfg(feature = "parquet")]
fn plain_parquet(path: &std::path::Path, recs: &[Record]) {
    use crate::records::parquet::{SCHEMA_KEY, SCHEMA_VERSION, schema, to_batch};
    let props = parquet::file::properties::WriterProperties::builder()
        .set_dictionary_enabled(false)
        .set_key_value_metadata(Some(vec![parquet::file::metadata::KeyValue::new(
            SCHEMA_KEY.to_owned(),
            SCHEMA_VERSION.to_owned(),
        )]))
        .build();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(path).unwrap(),
        schema(),
        Some(props),
    )
    .unwrap();
    w.write(&to_batch(recs).unwrap()).unwrap();
    w.close().unwrap();
}

#[cfg(feature = "parquet")]
#[test]
fn parquet_fold_maps_each_batchs_own_dictionary_afresh() {
    use crate::records::parquet::ScanPlan;
    // Frames change from one 4096-row batch to the next, so a dictionary
    // index means another frame in every batch.
    let recs: Vec<Record> = (0..10_000u64)
        .map(|i| {
            let mut p = CriticalPath::new();
            let part = i / 1000;
            p.push_frames(
                [
                    Frame::new("A", format!("root{part}").as_str()),
                    Frame::new("B", format!("b{}", (i + part) % 7).as_str()),
                ],
                ms(1 + i % 3),
                SegmentKind::Busy,
            );
            Record::new("A", Trigger::Sampled, p)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain.parquet");
    plain_parquet(&file, &recs);
    for sel in ["", "percentile=p90-p100"] {
        let sel = Selection::from_query(sel).unwrap();
        for unit_rows in [10_000, 3000] {
            let plan = ScanPlan::open(&file, None, None, unit_rows).unwrap();
            let mut agg = Aggregator::new(sel.clone());
            assert_eq!(agg.push_parquet(&plan, None, &|_| {}).unwrap(), 10_000);
            assert_eq!(
                crate::profile::encode_gzip(&agg.finish()),
                crate::profile::encode_gzip(&Aggregate::from_records(&sel, &recs)),
                "{sel} in units of {unit_rows}"
            );
        }
    }
}
