//! Trace import: the whole DeathStarBench media set (6,500 Jaeger
//! traces, 175,500 spans, 6 gzipped files) read → clock-skew repair →
//! critical path → profile, against a baseline that only gunzips and parses
//! the same JSON into `serde_json::Value` (what any JSON-reading tool pays).
//! `convert_jsonl` is `cpt traces convert` without the file: the same read
//! → repair → critical path, then every record written as the JSON line
//! the command writes. Also a synthetic single trace of 80,000 spans and a
//! 10,000-deep chain.
//!
//! Besides criterion's timings, the bench prints one summary block per run:
//! traces/s, spans/s and the ratio to the baseline, measured back to back.
//! Peak memory is measured on the release `cpt` binary with
//! `/usr/bin/time -v` (see the README section).

mod support;

use std::hint::black_box;
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cpt_collector::aggregate::Aggregate;
use cpt_collector::selection::Selection;
use cpt_collector::traces::{Format, Import, ImportOptions, import_files, import_text};
use criterion::{Criterion, criterion_group, criterion_main};

/// Read → repair → critical path → one profile of all records.
fn full(files: &[PathBuf]) -> (Import, Aggregate) {
    let imp = import_files(files, Format::Jaeger, &ImportOptions::default(), &|_| {});
    let agg = Aggregate::from_records(&Selection::new(), imp.records());
    (imp, agg)
}

/// `cpt traces convert`'s work: read → repair → critical path, every
/// record as its JSON line, into memory instead of a file.
fn convert_jsonl(files: &[PathBuf]) -> Vec<u8> {
    let imp = import_files(files, Format::Jaeger, &ImportOptions::default(), &|_| {});
    let mut out = Vec::with_capacity(32 << 20);
    for r in imp.records() {
        out.extend_from_slice(r.to_json().as_bytes());
        out.push(b'\n');
    }
    out
}

/// Baseline: gunzip and parse into a generic JSON tree, in parallel per file.
fn baseline(files: &[PathBuf]) -> usize {
    use rayon::prelude::*;
    files
        .par_iter()
        .map(|p| {
            let gz = std::fs::read(p).expect("read");
            let mut text = String::new();
            flate2::read::MultiGzDecoder::new(&gz[..])
                .read_to_string(&mut text)
                .expect("gunzip");
            let v: serde_json::Value = serde_json::from_str(&text).expect("json");
            v["data"].as_array().map_or(0, Vec::len)
        })
        .sum()
}

fn jaeger_doc(spans: &[(String, Option<String>, i64, i64)]) -> String {
    let body: Vec<String> = spans
        .iter()
        .map(|(id, parent, start, dur)| {
            let refs = parent
                .as_ref()
                .map(|p| format!(r#"[{{"refType":"CHILD_OF","spanID":"{p}"}}]"#))
                .unwrap_or_else(|| "[]".into());
            format!(
                r#"{{"spanID":"{id}","operationName":"op{}","references":{refs},"startTime":{start},"duration":{dur},"processID":"p1"}}"#,
                id.len() % 7
            )
        })
        .collect();
    format!(
        r#"{{"data":[{{"traceID":"t","processes":{{"p1":{{"serviceName":"s"}}}},"spans":[{}]}}]}}"#,
        body.join(",")
    )
}

/// A root with 400 sequential children, each fanning out to 199 concurrent
/// grandchildren: 80,001 spans.
fn wide_trace() -> String {
    let mut spans = vec![("r".to_string(), None, 0, 400_000)];
    for c in 0..400i64 {
        let id = format!("c{c}");
        spans.push((id.clone(), Some("r".to_string()), c * 1000, 1000));
        for g in 0..199i64 {
            spans.push((
                format!("g{c}_{g}"),
                Some(id.clone()),
                c * 1000 + 1,
                1 + (g * 7919) % 997,
            ));
        }
    }
    jaeger_doc(&spans)
}

/// A 10,000-deep chain.
fn deep_chain() -> String {
    const DEPTH: i64 = 10_000;
    let spans: Vec<_> = (0..DEPTH)
        .map(|i| {
            (
                format!("n{i}"),
                (i > 0).then(|| format!("n{}", i - 1)),
                i,
                2 * (DEPTH - i) + 1,
            )
        })
        .collect();
    jaeger_doc(&spans)
}

fn time<T>(runs: u32, f: impl Fn() -> T) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..runs {
        let t = Instant::now();
        black_box(f());
        best = best.min(t.elapsed());
    }
    best
}

fn summary(files: &[PathBuf]) {
    let (imp, agg) = full(files);
    let (traces, spans) = (imp.stats.traces as f64, imp.stats.spans as f64);
    assert_eq!(imp.stats.rejected, 0);
    assert_eq!(agg.requests(), 6500);
    let t_full = time(5, || full(files));
    let t_base = time(5, || baseline(files));
    let wide = wide_trace();
    let deep = deep_chain();
    let run = |text: &str| {
        import_text(
            text,
            Format::Jaeger,
            &ImportOptions::default(),
            true,
            &|_| {},
        )
    };
    let t_wide = time(3, || run(&wide));
    let t_deep = time(3, || run(&deep));
    println!(
        "\ntraces summary (best of 5, {} rayon threads)\n  media set read→CP→profile: {:.3} s wall, {:.0} traces/s, {:.0} spans/s\n  \
         baseline gunzip+serde_json::Value: {:.3} s  → full/baseline = {:.2}\n  \
         80,001-span trace: {:.3} s   10,000-deep chain: {:.3} s\n",
        rayon::current_num_threads(),
        t_full.as_secs_f64(),
        traces / t_full.as_secs_f64(),
        spans / t_full.as_secs_f64(),
        t_base.as_secs_f64(),
        t_full.as_secs_f64() / t_base.as_secs_f64(),
        t_wide.as_secs_f64(),
        t_deep.as_secs_f64(),
    );
}

fn bench(c: &mut Criterion) {
    let files = support::media_all();
    summary(&files);
    let mut g = c.benchmark_group("traces_media_set");
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    g.bench_function("read_cp_profile", |b| b.iter(|| full(&files)));
    g.bench_function("convert_jsonl", |b| b.iter(|| convert_jsonl(&files)));
    g.bench_function("baseline_gunzip_json_value", |b| {
        b.iter(|| baseline(&files))
    });
    g.finish();
    let wide = wide_trace();
    let deep = deep_chain();
    let mut g = c.benchmark_group("traces_synthetic");
    g.sample_size(10);
    g.bench_function("wide_80k_spans", |b| {
        b.iter(|| {
            import_text(
                &wide,
                Format::Jaeger,
                &ImportOptions::default(),
                true,
                &|_| {},
            )
        })
    });
    g.bench_function("deep_chain_10k", |b| {
        b.iter(|| {
            import_text(
                &deep,
                Format::Jaeger,
                &ImportOptions::default(),
                true,
                &|_| {},
            )
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
