//! Aggregating 10⁶ records of about 30 segments into a pprof profile,
//! side by side with a
//! straightforward baseline: a sequential `HashMap<Vec<String>, u64>` fold
//! keyed by frame-label stacks.
//!
//! The input is 10⁶ record references cycling over 10⁴ distinct generated
//! records (Figure 1–like services, ~200 distinct stacks of depth 2–7, some
//! network / unattributed / blind-spot segments). In `cpt_profile` each
//! record has its own copies of its frame strings (no `Arc` shared across
//! records): the worst case, as a reader that did not share strings would
//! give. `cpt_profile_decoded_json` aggregates the same records after a
//! round trip through their JSON Lines form on one thread, as `cpt profile`
//! holds them after reading a file or a store: `Record::from_json` interns
//! frame strings per thread, so equal strings are one shared copy. Cycling
//! keeps memory near 100 MB instead of ~5 GB; every reference is aggregated
//! as a separate request. JSON parsing is not timed (every case starts from
//! `Record`s).
//!
//! `CPT_BENCH_RECORDS=N` changes the record count, `CPT_BENCH_DISTINCT=N`
//! the number of distinct records cycled over (fewer: the input stays in
//! cache). Run:
//! `cargo bench -p cpt-benches --bench aggregate`.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use cpt_collector::aggregate::{Aggregate, stack_label};
use cpt_collector::profile::encode_gzip;
use cpt_collector::selection::{PercentileBand, Selection};
#[path = "support/records.rs"]
#[allow(dead_code)] // short_path is for the soak and store benches
mod records;
use cpt_sdk::path::{Frame, SegmentKind};
use cpt_sdk::record::Record;
use cpt_sdk::testing::SplitMix64 as Rng;
use cpt_sdk::trigger::Trigger;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use records::{figure1_path, stack_pool};

fn fresh(f: &Frame) -> Frame {
    let mut g = Frame::new(&*f.service, &*f.name);
    if let Some(l) = &f.location {
        g = g.with_location(&*l.file, l.line);
    }
    g
}

fn records(distinct: usize) -> Vec<Record> {
    let mut rng = Rng::new(42);
    let stacks = stack_pool(&mut rng);
    (0..distinct)
        .map(|i| {
            // Fresh strings per record, as records decoded from the wire
            // or from JSON have: no Arc sharing across records.
            let p = figure1_path(&mut rng, &stacks, fresh);
            let mut r = Record::new("A", Trigger::Sampled, p);
            r.start_unix_nanos = Some(1_700_000_000_000_000_000 + i as u64 * 1_000_000);
            r
        })
        .collect()
}

/// The straightforward fold: one `Vec<String>` key per segment.
fn baseline(recs: &[&Record]) -> HashMap<Vec<String>, u64> {
    let mut m: HashMap<Vec<String>, u64> = HashMap::new();
    let mut n = 0u64;
    for r in recs {
        if r.trigger != Trigger::Sampled {
            continue;
        }
        n += 1;
        for seg in r.path.segments() {
            let mut key: Vec<String> = r
                .path
                .stack_frames(seg)
                .map(|f| format!("{} ({})", f.name, f.service))
                .collect();
            if seg.kind != SegmentKind::Busy {
                key.push(format!("[{}]", seg.kind));
            }
            *m.entry(key).or_default() += seg.duration.as_nanos() as u64;
        }
    }
    for v in m.values_mut() {
        *v /= n.max(1);
    }
    m
}

fn cpt(recs: &[&Record], sel: &Selection) -> Vec<u8> {
    encode_gzip(&Aggregate::from_records(sel, recs.iter().copied()))
}

/// Both folds agree (means within 1 ns of rounding) before anything is timed.
fn check_same(recs: &[&Record]) {
    let agg = Aggregate::from_records(&Selection::new(), recs.iter().copied());
    let base = baseline(recs);
    assert_eq!(agg.stacks().len(), base.len(), "stack counts differ");
    let kinds = |l: &str| l.replace("[blind spot]", "[blind_spot]");
    for (s, mean) in agg.stacks().iter().zip(agg.mean_nanos()) {
        let key: Vec<String> = kinds(&stack_label(&agg, s, "\u{1}"))
            .split('\u{1}')
            .map(str::to_owned)
            .collect();
        let want = base
            .get(&key)
            .unwrap_or_else(|| panic!("baseline lacks {key:?}"));
        assert!(mean.abs_diff(*want) <= 1, "{key:?}: {mean} vs {want}");
    }
}

fn bench(c: &mut Criterion) {
    let n: usize = std::env::var("CPT_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let distinct: usize = std::env::var("CPT_BENCH_DISTINCT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let pool = records(distinct.clamp(1, n.max(1)));
    let refs: Vec<&Record> = (0..n).map(|i| &pool[i % pool.len()]).collect();
    let segments: usize = refs.iter().map(|r| r.path.segments().len()).sum();
    let frames: usize = refs.iter().map(|r| r.path.frames().len()).sum();
    check_same(&refs[..pool.len()]);
    eprintln!(
        "aggregate bench: {n} records, {segments} segments ({:.1} per record, {:.1} distinct frames per record), {} rayon threads",
        segments as f64 / n as f64,
        frames as f64 / n as f64,
        rayon_threads()
    );

    if let Ok(runs) = std::env::var("CPT_BENCH_QUICK") {
        quick(&refs, runs.parse().unwrap_or(5));
        return;
    }

    // One timed run of each, for the ratio line (criterion below gives the
    // distributions).
    let t = Instant::now();
    black_box(cpt(&refs, &Selection::new()));
    let ours = t.elapsed();
    let t = Instant::now();
    black_box(baseline(&refs));
    let theirs = t.elapsed();
    eprintln!(
        "aggregate bench: cpt {:.3} s, baseline {:.3} s, baseline/cpt = {:.1}x",
        ours.as_secs_f64(),
        theirs.as_secs_f64(),
        theirs.as_secs_f64() / ours.as_secs_f64()
    );

    let mut g = c.benchmark_group(format!("aggregate_{n}_records"));
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10))
        .throughput(Throughput::Elements(n as u64));
    g.bench_function("cpt_profile", |b| b.iter(|| cpt(&refs, &Selection::new())));
    // The same records as `cpt profile` holds them after reading JSON Lines
    // (or a store) on one thread: decoded, so equal frame strings are one
    // shared copy (`Record::from_json` interns them per thread).
    let decoded: Vec<Record> = pool
        .iter()
        .map(|r| Record::from_json(&r.to_json()).expect("a record reads back"))
        .collect();
    let decoded_refs: Vec<&Record> = (0..n).map(|i| &decoded[i % decoded.len()]).collect();
    g.bench_function("cpt_profile_decoded_json", |b| {
        b.iter(|| cpt(&decoded_refs, &Selection::new()))
    });
    let p95 = Selection::new().with_percentile(PercentileBand::parse("p95-p100").unwrap());
    g.bench_function("cpt_profile_p95_band", |b| b.iter(|| cpt(&refs, &p95)));
    g.bench_function("baseline_hashmap_vec_string", |b| {
        b.iter(|| baseline(&refs))
    });
    g.finish();
}

/// `CPT_BENCH_QUICK=N`: time only the cpt fold, N runs (5 if N is not a
/// number), wall and
/// process CPU time (CPU time moves less than wall time when other builds
/// share the machine). For iterating on the fold; the criterion run is the
/// measurement.
fn quick(recs: &[&Record], runs: usize) {
    for _ in 0..runs {
        let (t, cpu) = (Instant::now(), cpu_seconds());
        black_box(cpt(recs, &Selection::new()));
        eprintln!(
            "aggregate bench (quick): cpt {:.3} s wall, {:.2} s cpu",
            t.elapsed().as_secs_f64(),
            cpu_seconds() - cpu
        );
    }
}

/// User + system time of this process so far (Linux `/proc/self/stat`,
/// 100 Hz ticks; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime, stime are 14, 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

criterion_group!(benches, bench);
criterion_main!(benches);
