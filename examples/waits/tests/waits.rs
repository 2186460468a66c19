//! The handler's path, with and without tokio's resource instrumentation.
//!
//! Time is tokio's paused clock (cpt reads it through `TokioClock`), so
//! every wait lasts exactly what the handler asked for.

use std::time::Duration;

use cpt_example_waits::{Backend, cpt_filter, handle, ms};
use cpt_sdk::clock::TokioClock;
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::request::{self, RequestOptions};
use cpt_sdk::testing::RecordingSink;
use cpt_sdk::{Record, SegmentKind, Trigger};
use tracing::Instrument;
use tracing_subscriber::Layer as _;
use tracing_subscriber::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The line of the first line of `src/lib.rs` containing `needle`.
#[cfg(all(tokio_unstable, feature = "named-waits"))]
fn line_of(needle: &str) -> u32 {
    let src = include_str!("../src/lib.rs");
    let i = src
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} is in src/lib.rs"));
    i as u32 + 1
}

/// One traced request running the handler while another (also traced)
/// holds the pool; the handler's record.
async fn run() -> Record {
    let sink = RecordingSink::new();
    let (layer, _handle) = CriticalPathLayer::builder()
        .with_service("waits")
        .with_sink(sink.clone())
        .with_clock(TokioClock::new())
        .build();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::registry().with(layer.with_filter(cpt_filter())),
    );
    let backend = Backend::start().await.expect("backend");
    let mut conn = backend.connect().await.expect("connect");

    let other = tracing::info_span!("other");
    request::begin(&other, RequestOptions::new(Some(Trigger::Sampled)));
    let holder = tokio::spawn({
        let backend = backend.clone();
        async move { backend.hold_the_pool().await }.instrument(other.clone())
    });
    tokio::task::yield_now().await;

    let root = tracing::info_span!("request");
    assert!(request::begin(
        &root,
        RequestOptions::new(Some(Trigger::Sampled))
    ));
    let answer = handle(&backend, &mut conn)
        .instrument(root.clone())
        .await
        .expect("handled");
    assert_eq!(answer, 7);
    let done = request::finish(&root).expect("traced");
    holder.await.expect("held");
    request::finish(&other);
    sink.records()
        .into_iter()
        .find(|r| r.latency == done.latency && r.path == done.path)
        .expect("the handler's record")
}

/// `(frame names root → leaf joined by " / ", kind, duration)` of each segment.
fn pieces(r: &Record) -> Vec<(String, SegmentKind, Duration)> {
    r.path
        .segments()
        .iter()
        .map(|s| {
            let names: Vec<&str> = r.path.stack_frames(s).map(|f| &*f.name).collect();
            (names.join(" / "), s.kind, s.duration)
        })
        .collect()
}

/// The time of the segments whose stack (joined) starts with `prefix`.
fn time_under(p: &[(String, SegmentKind, Duration)], prefix: &str) -> Duration {
    p.iter()
        .filter(|(s, _, _)| s.starts_with(prefix))
        .map(|(_, _, d)| *d)
        .sum()
}

fn assert_near(what: &str, got: Duration, want: Duration, p: &[(String, SegmentKind, Duration)]) {
    let diff = got.abs_diff(want);
    assert!(
        diff <= ms(1),
        "{what}: {got:?}, expected {want:?} within 1 ms; path: {p:#?}"
    );
}

/// With tokio's resources (and without): the spawned task that answered
/// the oneshot is on the path as a node, for its time up to the answer,
/// because its wake names it (no `tokio_unstable` needed): it ends after
/// the handler resumed, so no child ending inside the wait explains it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_task_that_answered_the_oneshot_is_on_the_path() {
    let r = run().await;
    let p = pieces(&r);
    assert_near(
        "the task",
        time_under(&p, "request / handle / price"),
        ms(ms::TASK),
        &p,
    );
    assert_eq!(r.path.total(), r.latency);
    assert_near(
        "the latency",
        r.latency,
        ms(ms::SLEEP + ms::SEMAPHORE + ms::TASK + ms::SERVER),
        &p,
    );
}

/// With `--cfg tokio_unstable` and the `named-waits` feature: four pieces,
/// each named, summing with the handler's own time to the latency.
#[cfg(all(tokio_unstable, feature = "named-waits"))]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_wait_is_named() {
    let r = run().await;
    let p = pieces(&r);
    let named = |kind: &str, line: u32| -> Duration {
        let leaf = format!("request / handle / [{kind} waits/src/lib.rs:{line}]");
        p.iter()
            .filter(|(s, k, _)| *k == SegmentKind::Wait && *s == leaf)
            .map(|(_, _, d)| *d)
            .sum()
    };
    assert_near(
        "[sleep]",
        named(
            "sleep",
            line_of("tokio::time::sleep(Duration::from_millis(ms::SLEEP))"),
        ),
        ms(ms::SLEEP),
        &p,
    );
    assert_near(
        "[semaphore]",
        named("semaphore", line_of("Semaphore::new(1)")),
        ms(ms::SEMAPHORE),
        &p,
    );
    assert_near(
        "the task",
        time_under(&p, "request / handle / price"),
        ms(ms::TASK),
        &p,
    );
    let io: Duration = p
        .iter()
        .filter(|(s, k, _)| *k == SegmentKind::Wait && s == "request / handle / [io]")
        .map(|(_, _, d)| *d)
        .sum();
    assert_near("[io]", io, ms(ms::SERVER), &p);
    // Nothing is left unexplained, and the pieces and the handler's own
    // time are the latency, exactly.
    assert!(
        !p.iter().any(|(_, k, _)| *k == SegmentKind::Unattributed),
        "no unattributed time: {p:#?}"
    );
    assert_eq!(r.path.total(), r.latency);

    // `cpt profile` of the record (as JSON Lines): four differently named
    // pieces, which with the handler's own time are the latency, exactly.
    use cpt_collector::profile::aggregate::Aggregate;
    use cpt_collector::records::selection::Selection;
    let line = r.to_json();
    let back = Record::from_json(&line).expect("the record reads back");
    let agg = Aggregate::from_records(&Selection::new(), [back]);
    let prof = cpt_collector::profile::pprof::to_profile(&agg);
    let name =
        |f: &cpt_collector::profile::pprof::Function| prof.string_table[f.name as usize].clone();
    let names: Vec<String> = prof.function.iter().map(name).collect();
    let sleep = format!(
        "[sleep waits/src/lib.rs:{}] (waits)",
        line_of("tokio::time::sleep(Duration::from_millis(ms::SLEEP))")
    );
    let semaphore = format!(
        "[semaphore waits/src/lib.rs:{}] (waits)",
        line_of("Semaphore::new(1)")
    );
    for want in [&sleep, &semaphore, "price (waits)", "[io] (waits)"] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:#?}");
    }
    let total: i64 = prof.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(
        total as u128,
        r.latency.as_nanos(),
        "the profile sums to the latency"
    );
}
