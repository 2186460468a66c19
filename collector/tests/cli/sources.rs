//! The same profile from every source: `cpt profile` over JSON Lines, a
//! Parquet directory, one Parquet file and a store writes the bytes the
//! record-by-record fold writes over the same records in the order the
//! source holds them, for selections of every kind (percentile bands,
//! labels, time ranges, triggers, services, endpoints, ids).

use super::*;

use cpt_collector::profile::aggregate::Aggregator;
use cpt_collector::profile::encode_gzip;
use cpt_collector::records::{ReadOptions, RecordReader};
use cpt_collector::selection::Selection;
use cpt_sdk::testing::SplitMix64;

/// The start of the first hour records fall in (2023-11-14T22:00:00Z).
const HOUR0: u64 = 1_699_999_200_000_000_000;
const HOUR: u64 = 3_600_000_000_000;

/// Records with 1–12 segments over a pool of frames (some with locations),
/// every segment kind, zero-length segments, latency ties, two entry
/// services, two endpoints, labels, forced records, starts over three hours
/// (some without a start), request ids and some trace ids.
fn generated(n: u64) -> Vec<Record> {
    let mut rng = SplitMix64::new(25);
    let services = ["api", "db", "cache", "auth"];
    let kinds = [
        SegmentKind::Busy,
        SegmentKind::Busy,
        SegmentKind::Busy,
        SegmentKind::Queueing,
        SegmentKind::Network,
        SegmentKind::Unattributed,
        SegmentKind::BlindSpot,
    ];
    let frame = |rng: &mut SplitMix64| {
        let s = services[rng.below(4) as usize];
        let name = format!("{s}::f{}", rng.below(9));
        let f = Frame::new(s, name.as_str());
        match rng.below(3) {
            0 => f,
            1 => f.with_location(format!("{s}/src/lib.rs").as_str(), 10),
            _ => f.with_location(format!("{s}/src/other.rs").as_str(), rng.below(3) as u32),
        }
    };
    (0..n)
        .map(|i| {
            let mut p = CriticalPath::new();
            let root = frame(&mut rng);
            for _ in 0..1 + rng.below(12) {
                let mut stack = vec![root.clone()];
                for _ in 0..rng.below(5) {
                    stack.push(frame(&mut rng));
                }
                let ns = if rng.below(10) == 0 {
                    0
                } else {
                    1000 * (1 + rng.below(40))
                };
                p.push_frames(
                    stack,
                    Duration::from_nanos(ns),
                    kinds[rng.below(kinds.len() as u64) as usize],
                );
            }
            p.accounting.queueing = Duration::from_nanos(rng.below(500));
            p.accounting.network = Duration::from_nanos(rng.below(500));
            let service = if rng.below(5) == 0 { "web" } else { "api" };
            let mut r = Record::new(service, Trigger::Sampled, p);
            if rng.below(10) == 0 {
                r.trigger = Trigger::Forced;
            }
            r.endpoint = match rng.below(3) {
                0 => None,
                1 => Some("/a".into()),
                _ => Some("/b".into()),
            };
            if rng.below(20) != 0 {
                r.start_unix_nanos = Some(HOUR0 + rng.below(3 * HOUR));
            }
            r.request_id = Some(format!("req-{i}"));
            if i % 7 == 0 {
                r.trace_id = Some(format!("{i:032x}"));
            }
            r.labels.insert(
                "arm".into(),
                if rng.below(2) == 0 { "a" } else { "b" }.into(),
            );
            if rng.below(2) == 0 {
                r.labels.insert("region".into(), "eu".into());
            }
            r
        })
        .collect()
}

/// The selections compared, as `cpt profile` flags.
fn selections() -> Vec<Vec<String>> {
    let t = |ns: u64| format!("{ns}ns");
    let mut v: Vec<Vec<&str>> = vec![
        vec![],
        vec!["--trigger", "all"],
        vec!["--trigger", "forced"],
        vec!["--label", "arm=b"],
        vec!["--label", "arm=a", "--label", "region=eu"],
        vec!["--percentile", "p90-p100"],
        vec!["--percentile", "p0-p50", "--trigger", "all"],
        vec!["--percentile", "p99-p100", "--label", "arm=a"],
        vec!["--service", "web"],
        vec!["--endpoint", "/b"],
        vec!["--request-id", "req-42"],
        vec!["--trace-id", "0000000000000000000000000000001C"],
    ];
    let mut out: Vec<Vec<String>> = v
        .drain(..)
        .map(|a| a.into_iter().map(str::to_owned).collect())
        .collect();
    // Within one hour, across an hour boundary, and open-ended.
    out.push(vec![
        "--since".into(),
        t(HOUR0 + HOUR + HOUR / 4),
        "--until".into(),
        t(HOUR0 + HOUR + HOUR / 2),
    ]);
    out.push(vec![
        "--since".into(),
        t(HOUR0 + HOUR / 2),
        "--until".into(),
        t(HOUR0 + 2 * HOUR),
        "--percentile".into(),
        "p50-p100".into(),
    ]);
    out.push(vec!["--since".into(), t(HOUR0 + 2 * HOUR)]);
    out.push(vec!["--until".into(), t(HOUR0 + HOUR)]);
    out
}

/// The selection `cpt profile` builds from these flags.
fn selection(flags: &[String]) -> Selection {
    let mut sel = Selection::new();
    for pair in flags.chunks(2) {
        let key = pair[0].trim_start_matches("--").replace('-', "_");
        let value = match key.as_str() {
            "since" | "until" => pair[1].trim_end_matches("ns").to_owned(),
            _ => pair[1].clone(),
        };
        sel.set(&key, &value).unwrap();
    }
    sel
}

/// The record-by-record fold's profile of `records`, in their order.
fn want(sel: &Selection, records: &[Record]) -> Vec<u8> {
    let mut agg = Aggregator::new(sel.clone());
    // Several batches, as a reader hands them over.
    for batch in records.chunks(700) {
        agg.push_batch(batch);
    }
    encode_gzip(&agg.finish())
}

fn read_records(path: &Path) -> Vec<Record> {
    RecordReader::open(path, ReadOptions::default())
        .unwrap()
        .read_all(&mut |w| panic!("{w}"))
        .unwrap()
}

#[test]
fn profiles_are_byte_identical_from_json_lines_parquet_and_store() {
    let dir = tempfile::tempdir().unwrap();
    let records = generated(3000);
    let src = write(dir.path(), "r.jsonl", &jsonl(&records));
    let pq = dir.path().join("pq");
    run(&["export", s(&src), "--parquet-dir", s(&pq)], true);
    let store = dir.path().join("cpt.db");
    run(&["import", "--store", s(&store), s(&src)], true);
    // The Parquet directory holds the records partitioned by hour: its
    // order is the order of its files.
    let pq_records = read_records(&pq);
    assert_eq!(pq_records.len(), records.len());
    let one_file = std::fs::read_dir(pq.join("date=2023-11-14/hour=23"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "parquet"))
        .unwrap();
    let one_records = read_records(&one_file);
    let out = dir.path().join("out.pb.gz");
    let sources: [(&str, Vec<&str>, &[Record]); 4] = [
        ("json lines", vec![s(&src)], &records),
        ("parquet dir", vec![s(&pq)], &pq_records),
        ("parquet file", vec![s(&one_file)], &one_records),
        ("store", vec!["--store", s(&store)], &records),
    ];
    let mut nonempty = 0;
    for flags in selections() {
        let sel = selection(&flags);
        for (name, input, recs) in &sources {
            let expected = want(&sel, recs);
            let mut args = vec!["profile", "-o", s(&out)];
            args.extend(input.iter().copied());
            args.extend(flags.iter().map(String::as_str));
            run(&args, true);
            let got = std::fs::read(&out).unwrap();
            assert!(
                got == expected,
                "{name}, {flags:?}: the profile differs from the record-by-record fold's \
                 ({} vs {} requests)",
                requests(&out),
                read_aggregate(&expected).unwrap().requests()
            );
            if read_aggregate(&expected).unwrap().requests() > 0 {
                nonempty += 1;
            }
        }
    }
    // The selections are not vacuous: nearly all select something.
    assert!(nonempty >= 4 * 13, "{nonempty}");
}

/// `cpt diff` folds both arms from one read of each input: its base and
/// test profiles are byte for byte `cpt profile` of each arm's selection
/// alone, from JSON Lines, Parquet and a store, with arms split by label,
/// by time (arms whose ranges differ, so one scan covers both) and by
/// percentile band.
#[test]
fn diff_arms_read_together_equal_each_arm_profiled_alone() {
    let dir = tempfile::tempdir().unwrap();
    let records = generated(2000);
    let src = write(dir.path(), "r.jsonl", &jsonl(&records));
    let pq = dir.path().join("pq");
    run(&["export", s(&src), "--parquet-dir", s(&pq)], true);
    let store = dir.path().join("cpt.db");
    run(&["import", "--store", s(&store), s(&src)], true);
    let t = |ns: u64| format!("{ns}ns");
    let split = t(HOUR0 + HOUR + HOUR / 2);
    let arms: [(Vec<String>, [Vec<String>; 2]); 3] = [
        (
            vec![],
            [vec!["label=arm=a".into()], vec!["label=arm=b".into()]],
        ),
        (
            vec!["--trigger".into(), "all".into()],
            [
                vec![format!("until={split}")],
                vec![format!("since={split}"), "percentile=p50-p100".into()],
            ],
        ),
        (
            vec!["--label".into(), "arm=a".into()],
            [
                vec!["percentile=p0-p50".into()],
                vec!["percentile=p50-p100".into()],
            ],
        ),
    ];
    let out = dir.path().join("out");
    let alone = dir.path().join("alone.pb.gz");
    let sources: [(&str, Vec<&str>); 3] = [
        ("json lines", vec![s(&src)]),
        ("parquet", vec![s(&pq)]),
        ("store", vec!["--store", s(&store)]),
    ];
    for (common, [base, test]) in &arms {
        for (name, input) in &sources {
            let mut args = vec!["diff", "-o", s(&out)];
            args.extend(input.iter().copied());
            args.extend(common.iter().map(String::as_str));
            for p in base {
                args.extend(["--base", p.as_str()]);
            }
            for p in test {
                args.extend(["--test", p.as_str()]);
            }
            run(&args, true);
            for (arm, pairs) in [("base", base), ("test", test)] {
                let mut args = vec!["profile", "-o", s(&alone)];
                args.extend(input.iter().copied());
                args.extend(common.iter().map(String::as_str));
                let flags: Vec<String> = pairs
                    .iter()
                    .flat_map(|p| {
                        let (k, v) = p.split_once('=').unwrap();
                        [format!("--{k}"), v.to_owned()]
                    })
                    .collect();
                args.extend(flags.iter().map(String::as_str));
                run(&args, true);
                let got = std::fs::read(out.join(format!("{arm}.pb.gz"))).unwrap();
                assert!(
                    got == std::fs::read(&alone).unwrap(),
                    "{name}, {common:?} {arm} {pairs:?}: the diff's arm differs from its profile"
                );
                assert!(
                    requests(&alone) > 0,
                    "{name} {arm} {pairs:?} selects something"
                );
            }
        }
    }
}
