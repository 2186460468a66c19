//! The Mystery Machine on the whole DeathStarBench media set
//! (6 500 Jaeger traces, 175 500 spans): reading and cutting into requests,
//! model inference (hypothesis refinement), critical path and slack of every
//! span through the model, and the top-5 % outlier split — separately and as
//! one pass. Peak memory is measured on the release `cpt` binary with
//! `/usr/bin/time -v` (see the README section).

mod support;

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use cpt_collector::traces::analysis::mystery::{self, Models, Request, RequestSlack};
use cpt_collector::traces::import::read_traces;
use cpt_collector::traces::{BuildOptions, Format, RepairOptions, RootSelector};
use criterion::{Criterion, criterion_group, criterion_main};

fn requests(files: &[PathBuf]) -> Vec<Request> {
    let set = read_traces(files, Format::Jaeger, BuildOptions::default());
    let mut paths = mystery::CallPaths::default();
    set.traces
        .iter()
        .flat_map(|t| {
            mystery::requests_with(
                t,
                &RootSelector::AllRoots,
                &RepairOptions::default(),
                &mut paths,
            )
        })
        .collect()
}

fn learn(reqs: &[Request]) -> Models {
    let mut ms = Models::default();
    for r in reqs {
        ms.observe(r);
    }
    ms.finish();
    ms
}

fn slack(ms: &Models, reqs: &[Request]) -> Vec<RequestSlack> {
    reqs.iter()
        .map(|r| mystery::analyse(&ms.by_endpoint[&r.endpoint], r))
        .collect()
}

/// Model, slack and outliers over requests already read.
fn pass(reqs: &[Request]) -> usize {
    let ms = learn(reqs);
    let rs = slack(&ms, reqs);
    let pairs: Vec<(&Request, &RequestSlack)> = reqs.iter().zip(&rs).collect();
    let o = mystery::outliers(&pairs, 0.05);
    ms.hypotheses() + o.outliers
}

fn bench(c: &mut Criterion) {
    let files = support::media_all();
    let reqs = requests(&files);
    assert_eq!(reqs.len(), 6500);
    let ms = learn(&reqs);
    let mut g = c.benchmark_group("mystery_media");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.bench_function("read_and_cut", |b| {
        b.iter(|| black_box(requests(&files).len()))
    });
    g.bench_function("model", |b| b.iter(|| black_box(learn(&reqs).hypotheses())));
    g.bench_function("slack", |b| b.iter(|| black_box(slack(&ms, &reqs).len())));
    g.bench_function("model_slack_outliers", |b| {
        b.iter(|| black_box(pass(&reqs)))
    });
    g.bench_function("whole_pass_from_files", |b| {
        b.iter(|| black_box(pass(&requests(&files))))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
