//! CPT Figure 2, live: runs scenarios 2a, 2b and 2c with real time
//! (`tokio::time::sleep` for every step, so the demo is not at the mercy
//! of CPU contention) and prints one JSON record per scenario on stdout (the JSON Lines form of
//! `cpt_sdk::Record`). A summary and a check against the figure go to
//! stderr; the exit code is non-zero if a segment is off by more than 2 ms.
//!
//! ```text
//! cargo run --release --bin figure2
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::request::{self, RequestOptions};
use cpt_sdk::{Record, Trigger};
use tokio::time::sleep;
use tracing::{Instrument, info_span};
use tracing_subscriber::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A1's own computation, simulated with a sleep: it shows on the path as
/// A1's own time (an unattributed wait of A1, since no node it created was
/// running). A spin loop would show as busy time, but on a loaded machine
/// it measures the scheduler as much as the figure.
async fn compute(d: Duration) {
    sleep(d).await;
}

/// 2a: A1 5 ms, waits on B1 20 ms, A1 8 ms, waits on A2 2 ms.
async fn fig2a() {
    compute(ms(5)).await;
    sleep(ms(20)).instrument(info_span!("B1")).await;
    compute(ms(8)).await;
    sleep(ms(2)).instrument(info_span!("A2")).await;
}

/// 2b: A1 5 ms, then B1 (20 ms) and A2 (2 ms) in parallel, then A1 8 ms.
async fn fig2b() {
    compute(ms(5)).await;
    tokio::join!(
        sleep(ms(20)).instrument(info_span!("B1")),
        sleep(ms(2)).instrument(info_span!("A2")),
    );
    compute(ms(8)).await;
}

/// 2c: A1 3 ms, issues B1 (14 ms) without blocking and keeps computing,
/// waits for B1, then A1 10 ms.
async fn fig2c() {
    compute(ms(3)).await;
    let b1 = tokio::spawn(sleep(ms(14)).instrument(info_span!("B1")));
    compute(ms(6)).await;
    b1.await.expect("B1 panicked");
    compute(ms(10)).await;
}

/// `(stack, ms)` of the figure, for the check.
type Expected = &'static [(&'static [&'static str], u64)];

const FIG2A: Expected = &[
    (&["A1"], 5),
    (&["A1", "B1"], 20),
    (&["A1"], 8),
    (&["A1", "A2"], 2),
];
const FIG2B: Expected = &[(&["A1"], 5), (&["A1", "B1"], 20), (&["A1"], 8)];
const FIG2C: Expected = &[(&["A1"], 3), (&["A1", "B1"], 14), (&["A1"], 10)];

/// Segments with equal stacks merged, scheduler slivers under 0.5 ms dropped.
fn summary(r: &Record) -> Vec<(Vec<String>, Duration)> {
    let mut out: Vec<(Vec<String>, Duration)> = Vec::new();
    for seg in r.path.segments() {
        if seg.duration < Duration::from_micros(500) {
            continue;
        }
        let stack: Vec<String> = r
            .path
            .stack_frames(seg)
            .map(|f| f.name.to_string())
            .collect();
        match out.last_mut() {
            Some(last) if last.0 == stack => last.1 += seg.duration,
            _ => out.push((stack, seg.duration)),
        }
    }
    out
}

fn check(name: &str, r: &Record, expected: Expected) -> bool {
    let got = summary(r);
    let tolerance = ms(2);
    let ok = got.len() == expected.len()
        && got.iter().zip(expected).all(|((stack, d), (es, ems))| {
            stack.iter().map(String::as_str).eq(es.iter().copied())
                && d.abs_diff(ms(*ems)) <= tolerance
        });
    let shown: Vec<String> = got
        .iter()
        .map(|(s, d)| format!("{}={:.1}ms", s.join("/"), d.as_secs_f64() * 1e3))
        .collect();
    eprintln!(
        "{name}: {{{}}} total {:.1} ms — {}",
        shown.join(", "),
        r.latency.as_secs_f64() * 1e3,
        if ok {
            "matches the figure (±2 ms)"
        } else {
            "DOES NOT match the figure"
        }
    );
    ok
}

fn main() {
    let records = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let records = records.clone();
        move |r: Record| records.lock().expect("not poisoned").push(r)
    };
    let (layer, _handle) = CriticalPathLayer::builder()
        .with_service("A")
        .with_sink(sink)
        .build();
    tracing_subscriber::registry().with(layer).init();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("a tokio runtime");

    // Warm the runtime (worker threads, timer driver) with an untraced run:
    // the first sleeps after start-up wake late.
    rt.block_on(async {
        fig2a().await;
        fig2b().await;
    });

    let scenarios: [(&str, Expected); 3] = [("fig2a", FIG2A), ("fig2b", FIG2B), ("fig2c", FIG2C)];
    let mut all_ok = true;
    for (name, expected) in scenarios {
        rt.block_on(async {
            let root = info_span!("A1");
            request::begin(
                &root,
                RequestOptions::new(Some(Trigger::Forced))
                    .with_name("A1")
                    .with_endpoint(name)
                    .with_label("figure", name),
            );
            let work = async {
                match name {
                    "fig2a" => fig2a().await,
                    "fig2b" => fig2b().await,
                    _ => fig2c().await,
                }
            };
            work.instrument(root.clone()).await;
            request::finish(&root);
        });
        let record = records
            .lock()
            .expect("not poisoned")
            .pop()
            .expect("one record per scenario");
        println!("{}", record.to_json());
        all_ok &= check(name, &record, expected);
    }
    if !all_ok {
        std::process::exit(1);
    }
}
