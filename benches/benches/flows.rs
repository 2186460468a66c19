//! Mann et al.'s execution flows: on the DeathStarBench media set (6 500
//! Jaeger traces), train all six estimators on the three lower load levels
//! and score the three upper ones (`cpt traces predict`'s work), against
//! reading the same files into validated traces (`read_traces`, the first
//! step of `predict` itself) as the baseline: the ratio says what finding
//! the invocations and training and scoring the models add to reading.
//! `cpt traces convert`'s whole CRISP import (skew repair, critical paths,
//! records) is a third case, for scale.
//!
//! Peak memory is measured on the release `cpt` binary with
//! `/usr/bin/time -v` (the book's performance page, execution flows).

mod support;

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use cpt_collector::traces::analysis::flows::{self, KeyInterner};
use cpt_collector::traces::import::read_traces;
use cpt_collector::traces::model::BuildOptions;
use cpt_collector::traces::{Format, ImportOptions, import_files};
use criterion::{Criterion, criterion_group, criterion_main};

fn predict(train: &[PathBuf], test: &[PathBuf]) -> usize {
    let mut keys = KeyInterner::default();
    let opts = BuildOptions::default();
    let inv = |files: &[PathBuf], keys: &mut KeyInterner| {
        read_traces(files, Format::Jaeger, opts)
            .traces
            .iter()
            .flat_map(|t| flows::invocations(t, keys))
            .collect::<Vec<_>>()
    };
    let tr = inv(train, &mut keys);
    let te = inv(test, &mut keys);
    flows::evaluate(&tr, &te, 1).test_invocations
}

fn bench(c: &mut Criterion) {
    let train = support::media(&[25, 50, 75]);
    let test = support::media(&[100, 125, 150]);
    let all: Vec<PathBuf> = train.iter().chain(&test).cloned().collect();
    let mut g = c.benchmark_group("flows_media");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("baseline_read_traces", |b| {
        b.iter(|| {
            let n: usize = [&train, &test]
                .iter()
                .map(|f| {
                    read_traces(f, Format::Jaeger, BuildOptions::default())
                        .traces
                        .len()
                })
                .sum();
            black_box(n)
        })
    });
    g.bench_function("crisp_import", |b| {
        b.iter(|| {
            let imp = import_files(&all, Format::Jaeger, &ImportOptions::default(), &|_| {});
            black_box(imp.stats.traces)
        })
    });
    g.bench_function("predict_six_methods", |b| {
        b.iter(|| black_box(predict(&train, &test)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
