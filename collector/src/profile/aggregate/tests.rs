use super::*;
use cpt_sdk::path::CriticalPath;
use cpt_sdk::trigger::Trigger;

use cpt_sdk::testing::fixtures::table1;
use cpt_sdk::testing::ms;

use super::scan::Wanted;
use crate::ingest::LineError;

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
        let name = if k.is_multiple_of(3) {
            format!("a_rather_long_handler_name_{d}_{k}")
        } else {
            format!("n{d}{k}")
        };
        let f = Frame::new(["A", "B", "svc-c"][(k % 3) as usize], name);
        if k.is_multiple_of(2) {
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
            p.push_frames([a1.clone(), b1], ms(1), SegmentKind::Queueing);
            // Named waits (`"wait":true`), a third of them at another site.
            let site = Some(cpt_sdk::path::Location {
                file: "a/src/main.rs".into(),
                line: 80 + (i % 3) as u32,
            });
            p.push_frames(
                [a1, Frame::wait("A", "sleep", site)],
                ms(i % 3),
                SegmentKind::Wait,
            );
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

/// Fold `text` as JSON Lines in blocks of about `block_bytes`, chunks of
/// about `chunk_bytes`, into each of `aggs` at once; the bad lines' numbers
/// and messages.
fn fold_json(
    aggs: &mut [&mut Aggregator],
    text: &[u8],
    block_bytes: usize,
    chunk_bytes: usize,
) -> Vec<(u64, String)> {
    let mut bad = Vec::new();
    let (mut at, mut line) = (0, 1);
    while at < text.len() {
        let end = text[at..]
            .iter()
            .enumerate()
            .skip(block_bytes.min(text.len() - at - 1))
            .find(|(_, b)| **b == b'\n')
            .map_or(text.len(), |(i, _)| at + i + 1);
        let block = json_block(&text[at..end], line);
        let r = push_json_block(aggs, &block, chunk_bytes, None);
        bad.extend(r.bad.into_iter().map(|(l, e)| (l, e.to_string())));
        line += text[at..end].iter().filter(|&&b| b == b'\n').count() as u64;
        at = end;
    }
    bad
}

/// Lines in the forms the record format allows beyond what `cpt` writes,
/// each of which the scanner reads itself (no fallback).
const SCANNED_FORMS: &[&str] = &[
    // Escapes in frame names: quote, backslash, slash, control escapes.
    r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":["A\"1",{"name":"B\\1\/x\n\t","service":"B","file":"b.rs","line":2}],"ns":3}],"labels":{"arm":"b"}}"#,
    // Unicode escapes (a surrogate pair among them) and raw UTF-8 naming
    // the same frames.
    r#"{"service":"\u0041","trigger":"sampled","latency_ns":5,"path":[{"stack":["caf\u00e9",{"name":"\ud83d\ude00","service":"B"}],"ns":2},{"stack":["café",{"name":"😀","service":"B"}],"ns":3}],"labels":{"arm":"b"}}"#,
    // Fields in any order, path before the service its bare names inherit.
    r#"{"path":[{"ns":2,"kind":"network","stack":["A1",{"line":4,"file":"b.rs","service":"B","name":"B1"},"B2"]}],"labels":{"arm":"b"},"latency_ns":2,"trigger":"sampled","service":"A"}"#,
    // Unknown fields at every level, with any JSON in them (numbers in
    // exponent form, negative, fractional; literals; nesting; escapes, a
    // lone surrogate, which an ignored value may hold).
    r#"{"w":"\ud800","x":{"y":[1,-2.5e-3,1E+9,0,-0,true,false,null,"s\n\u00e9",{},[]]},"service":"A","trigger":"sampled","latency_ns":5,"path":[{"stack":[{"name":"A1","extra":[{"z":0.5}]}],"ns":5,"note":"n"}],"accounting":{"network_ns":1,"future_ns":{"a":1e3}},"labels":{"arm":"b"}}"#,
    // Whitespace between every token.
    "{ \"service\" : \"A\" ,\t\"trigger\":\"sampled\" ,\r\"latency_ns\" : 4 , \"path\" : [ { \"stack\" : [ \"A1\" , { \"name\" : \"B1\" , \"service\" : \"B\" } ] , \"ns\" : 4 } ] , \"labels\" : { \"arm\" : \"b\" } }",
    // Every optional field null.
    r#"{"service":"A","endpoint":null,"trigger":"sampled","latency_ns":4,"start_unix_nanos":null,"request_id":null,"trace_id":null,"labels":null,"accounting":null,"path":[{"stack":[{"name":"A1","service":null,"file":null,"line":null}],"ns":4,"kind":null}]}"#,
    // Escaped keys, a repeated label (the last counts), every id.
    r#"{"serv\u0069ce":"A","endpoint":"/a","trigger":"forced","latency_ns":7,"start_unix_nanos":1700000000000000000,"request_id":"r-1","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","labels":{"arm":"a","arm":"b"},"path":[{"stack":["A1"],"ns":7}]}"#,
    // Locations: a frame without `file` is the last one of its service and
    // name; `"file": ""` says none; zero-length segments.
    r#"{"service":"A","trigger":"sampled","latency_ns":9,"labels":{"arm":"b"},"path":[{"stack":[{"name":"A1","file":"a.rs","line":3}],"ns":2},{"stack":["A1",{"name":"B1","service":"B","file":"b.rs","line":1}],"ns":3,"kind":"queueing"},{"stack":["A1",{"name":"B1","service":"B"}],"ns":0},{"stack":[{"name":"A1","file":""},{"name":"B1","service":"B"}],"ns":4,"kind":"blind_spot"}],"accounting":{"queueing_ns":3,"blind_spot_ns":4}}"#,
    // Entries written out in full, found again by their bytes in the next
    // record (one with a `}` in its name), before bare names that inherit
    // their service and an entry that takes the last location.
    r#"{"service":"A","trigger":"sampled","latency_ns":6,"labels":{"arm":"b"},"path":[{"stack":[{"name":"b}1","service":"B","file":"b.rs","line":1},"B2"],"ns":3},{"stack":[{"name":"A1","service":"A","file":"a.rs","line":1},{"name":"B1","service":"B","file":"b.rs","line":5},"B1",{"name":"B1"}],"ns":3}]}"#,
    r#"{"service":"A","trigger":"sampled","latency_ns":6,"labels":{"arm":"b"},"path":[{"stack":[{"name":"b}1","service":"B","file":"b.rs","line":1},"B2"],"ns":3},{"stack":[{"name":"A1","service":"A","file":"a.rs","line":1},{"name":"B1","service":"B","file":"b.rs","line":5},"B1",{"name":"B1"}],"ns":3}]}"#,
];

/// Lines the record parser accepts but the scanner leaves to it.
const FALLBACK_FORMS: &[&str] = &[
    // A repeated key in a frame: the last one counts.
    r#"{"service":"A","trigger":"sampled","latency_ns":3,"labels":{"arm":"b"},"path":[{"stack":[{"name":"x","name":"A9"}],"ns":3}]}"#,
    // Nesting deeper than the scanner follows.
    concat!(
        r#"{"deep":"#,
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
        "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
        r#","service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":["A8"],"ns":3}]}"#
    ),
];

#[test]
fn json_lines_scanner_reads_escapes_any_field_order_unknown_fields_and_nulls() {
    for (i, line) in SCANNED_FORMS.iter().enumerate() {
        let want = Wanted {
            endpoint: true,
            ids: true,
            labels: true,
        };
        let scanned = super::scan::scan_line(
            line,
            want,
            &mut super::scan::Frames::default(),
            &mut super::scan::Head::default(),
            &mut super::intern::Flat::default(),
        );
        assert!(
            scanned.is_some(),
            "form {i} left to the record parser: {line}"
        );
    }
    for (i, line) in FALLBACK_FORMS.iter().enumerate() {
        assert!(Record::from_json(line).is_ok(), "fallback form {i}");
    }
    let lines: Vec<&str> = SCANNED_FORMS
        .iter()
        .chain(FALLBACK_FORMS)
        .copied()
        .collect();
    let recs: Vec<Record> = lines
        .iter()
        .map(|l| Record::from_json(l).unwrap())
        .collect();
    let text = lines.join("\n") + "\n";
    for q in [
        "trigger=all",
        "label=arm%3Db",
        "endpoint=/a&trigger=forced",
        "request_id=r-1&trigger=all",
        "trigger=all&percentile=p50-p100",
    ] {
        let sel = Selection::from_query(q).unwrap();
        let want = Aggregate::from_records(&sel, &recs);
        assert!(want.requests() > 0, "{q} selects something");
        for chunk_bytes in [1, 1 << 20] {
            let mut agg = Aggregator::new(sel.clone());
            assert_eq!(
                fold_json(&mut [&mut agg], text.as_bytes(), 1 << 20, chunk_bytes),
                vec![]
            );
            assert_eq!(
                crate::profile::encode_gzip(&agg.finish()),
                crate::profile::encode_gzip(&want),
                "{q}, chunks of {chunk_bytes}"
            );
        }
    }
}

#[test]
fn json_lines_bad_line_is_named_by_number_with_the_record_parsers_message() {
    let good =
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":["A1"],"ns":3}]}"#;
    let bad: &[&str] = &[
        // Numbers that are not u64: exponent, fraction, negative, too big,
        // a leading zero.
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":["A1"],"ns":3e0}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":["A1"],"ns":3.0}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":-3,"path":[{"stack":["A1"],"ns":3}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":18446744073709551616,"path":[{"stack":["A1"],"ns":3}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":03,"path":[{"stack":["A1"],"ns":3}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":[{"name":"A1","file":"a.rs","line":4294967296}],"ns":3}]}"#,
        // Strings: a raw control character, a lone surrogate, a bad escape.
        "{\"service\":\"A\",\"trigger\":\"sampled\",\"latency_ns\":3,\"path\":[{\"stack\":[\"A\t1\"],\"ns\":3}]}",
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":["A\ud800"],"ns":3}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":["A\q"],"ns":3}]}"#,
        // Structure: a repeated field, trailing text, a trailing comma, cut
        // short, missing fields, wrong types.
        r#"{"service":"A","service":"B","trigger":"sampled","latency_ns":3,"path":[{"stack":["A1"],"ns":3}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":["A1"],"ns":3}]} x"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":["A1"],"ns":3},]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":["A1"],"#,
        r#"{"service":"A","trigger":"sampled","path":[{"stack":["A1"],"ns":3}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":["A1"]}]}"#,
        r#"{"service":"A","endpoint":3,"trigger":"sampled","latency_ns":3,"path":[{"stack":["A1"],"ns":3}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"labels":{"arm":1},"path":[{"stack":["A1"],"ns":3}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":[3],"ns":3}]}"#,
        r#"["A",null,"sampled",3]"#,
        // The record's own checks.
        r#"{"service":"A","trigger":"maybe","latency_ns":3,"path":[{"stack":["A1"],"ns":3}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":4,"path":[{"stack":["A1"],"ns":3}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":[],"ns":3}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"path":[{"stack":["A1"],"ns":3,"kind":"idle"}]}"#,
        r#"{"service":"A","trigger":"sampled","latency_ns":3,"accounting":{"network_ns":1,"network_ns":1},"path":[{"stack":["A1"],"ns":3}]}"#,
    ];
    // Good lines, blank lines and bad lines interleaved.
    let mut text = String::new();
    let mut want_bad = Vec::new();
    let mut line = 0;
    for b in bad {
        for l in [good, "", b] {
            text.push_str(l);
            text.push('\n');
            line += 1;
        }
        let e = Record::from_json(b).expect_err(b);
        want_bad.push((line, LineError::Record(e).to_string()));
    }
    let sel = Selection::new();
    for chunk_bytes in [1, 300, 1 << 20] {
        let mut agg = Aggregator::new(sel.clone());
        let got = fold_json(&mut [&mut agg], text.as_bytes(), 1 << 20, chunk_bytes);
        assert_eq!(got, want_bad, "chunks of {chunk_bytes}");
        assert_eq!(agg.offered(), bad.len() as u64);
        assert_eq!(agg.finish().requests(), bad.len() as u64);
    }
}

#[test]
fn json_lines_folded_into_several_aggregators_at_once_equal_each_folded_alone() {
    let recs = json_corpus(400);
    let mut text = Vec::new();
    for (i, r) in recs.iter().enumerate() {
        if i == 7 {
            text.extend_from_slice(b"{\"service\":\n");
        }
        text.extend_from_slice(r.to_json().as_bytes());
        text.push(b'\n');
    }
    let arms = [
        "label=arm%3Da",
        "label=arm%3Db&percentile=p50-p100",
        "service=B&trigger=all",
    ];
    let sels: Vec<Selection> = arms
        .iter()
        .map(|q| Selection::from_query(q).unwrap())
        .collect();
    for (block_bytes, chunk_bytes) in [(1 << 30, 1 << 20), (4096, 700), (1, 1)] {
        let mut together: Vec<Aggregator> = sels.iter().cloned().map(Aggregator::new).collect();
        let mut refs: Vec<&mut Aggregator> = together.iter_mut().collect();
        let bad = fold_json(&mut refs, &text, block_bytes, chunk_bytes);
        assert_eq!(bad.iter().map(|b| b.0).collect::<Vec<_>>(), vec![8]);
        for (sel, agg) in sels.iter().zip(together) {
            let mut alone = Aggregator::new(sel.clone());
            fold_json(&mut [&mut alone], &text, block_bytes, chunk_bytes);
            assert_eq!(agg.offered(), 400);
            let (agg, alone) = (agg.finish(), alone.finish());
            assert!(agg.requests() > 0, "{sel}");
            assert_eq!(
                crate::profile::encode_gzip(&agg),
                crate::profile::encode_gzip(&alone),
                "{sel}, blocks of {block_bytes}, chunks of {chunk_bytes}"
            );
            assert_eq!(
                crate::profile::encode_gzip(&agg),
                crate::profile::encode_gzip(&Aggregate::from_records(sel, &recs)),
                "{sel}"
            );
        }
    }
}

#[cfg(feature = "parquet")]
#[test]
fn parquet_folded_into_several_aggregators_at_once_equals_each_folded_alone() {
    use crate::records::parquet::ScanPlan;
    let recs = json_corpus(3000);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain.parquet");
    plain_parquet(&file, &recs);
    let sels: Vec<Selection> = [
        "label=arm%3Da&until=1500",
        "label=arm%3Db&percentile=p50-p100",
        "service=B&since=1000",
    ]
    .iter()
    .map(|q| Selection::from_query(q).unwrap())
    .collect();
    for unit_rows in [3000, 700] {
        let plan = ScanPlan::open(&file, None, None, unit_rows).unwrap();
        let mut together: Vec<Aggregator> = sels.iter().cloned().map(Aggregator::new).collect();
        let mut refs: Vec<&mut Aggregator> = together.iter_mut().collect();
        assert_eq!(push_parquet(&mut refs, &plan, None, &|_| {}).unwrap(), 3000);
        for (sel, agg) in sels.iter().zip(together) {
            let mut alone = Aggregator::new(sel.clone());
            alone.push_parquet(&plan, None, &|_| {}).unwrap();
            let (agg, alone) = (agg.finish(), alone.finish());
            assert!(agg.requests() > 0, "{sel}");
            assert_eq!(
                crate::profile::encode_gzip(&agg),
                crate::profile::encode_gzip(&alone),
                "{sel} in units of {unit_rows}"
            );
            assert_eq!(
                crate::profile::encode_gzip(&agg),
                crate::profile::encode_gzip(&Aggregate::from_records(sel, &recs)),
                "{sel}"
            );
        }
    }
}

/// Named waits: each site is its own leaf (and its own pprof function);
/// `Waits::Kind` groups them by kind, their times adding up.
#[test]
fn named_waits_are_leaves_by_site_or_by_kind() {
    use cpt_sdk::path::Location;
    let at = |line| {
        Some(Location {
            file: "/home/u/shop/src/main.rs".into(),
            line,
        })
    };
    let mut p = CriticalPath::new();
    p.push_frames([a("A1")], ms(1), SegmentKind::Busy);
    p.push_frames(
        [a("A1"), Frame::wait("A", "sleep", at(88))],
        ms(10),
        SegmentKind::Wait,
    );
    p.push_frames(
        [a("A1"), Frame::wait("A", "sleep", at(90))],
        ms(5),
        SegmentKind::Wait,
    );
    p.push_frames(
        [a("A1"), Frame::wait("A", "io", None)],
        ms(3),
        SegmentKind::Wait,
    );
    let r = Record::new("A", Trigger::Sampled, p);
    let mut agg = Aggregate::from_records(&Selection::new(), [r]);
    assert_eq!(
        means_by_label(&agg),
        vec![
            ("A1 (A)".to_string(), 1_000_000),
            ("A1 (A)/[io] (A)".to_string(), 3_000_000),
            (
                "A1 (A)/[sleep shop/src/main.rs:88] (A)".to_string(),
                10_000_000
            ),
            (
                "A1 (A)/[sleep shop/src/main.rs:90] (A)".to_string(),
                5_000_000
            ),
        ]
    );
    let prof = crate::profile::pprof::to_profile(&agg);
    let names: Vec<&str> = prof
        .function
        .iter()
        .map(|f| prof.string_table[f.name as usize].as_str())
        .collect();
    assert_eq!(names.len(), 4, "one function per frame: {names:?}");
    assert!(
        names.contains(&"[sleep shop/src/main.rs:88] (A)"),
        "{names:?}"
    );
    assert!(
        names.contains(&"[sleep shop/src/main.rs:90] (A)"),
        "{names:?}"
    );
    agg.group_waits(Waits::Site);
    assert_eq!(agg.stacks().len(), 4, "site keeps them apart");
    agg.group_waits(Waits::Kind);
    assert_eq!(
        means_by_label(&agg),
        vec![
            ("A1 (A)".to_string(), 1_000_000),
            ("A1 (A)/[io] (A)".to_string(), 3_000_000),
            ("A1 (A)/[sleep] (A)".to_string(), 15_000_000),
        ]
    );
    assert_eq!(agg.mean_latency(), ms(19));
    // Synthetic leaves are not wait frames.
    assert!(!is_wait_frame(&Frame::new("", "[unattributed]")));
}
