//! A multi-threaded runtime in real time under concurrent load: every record
//! sums exactly to its latency, and nodes of different requests never mix.

use std::time::Duration;

use cpt_sdk::Trigger;
use cpt_sdk::clock::SystemClock;
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::request::{self, RequestOptions};
use cpt_sdk::task;
use cpt_sdk::testing::RecordingSink;
use tokio::time::sleep;
use tracing::{Instrument, info_span};
use tracing_subscriber::prelude::*;

const REQUESTS: usize = 256;

async fn serve(i: usize) {
    let root = info_span!("req");
    assert!(request::begin(
        &root,
        RequestOptions::new(Some(Trigger::Sampled))
            .with_name(format!("r{i}"))
            .with_request_id(i.to_string())
    ));
    async move {
        sleep(Duration::from_millis(2))
            .instrument(info_span!("pre", cpt.name = format!("r{i}-pre")))
            .await;
        task::join(
            (&format!("r{i}-slow"), sleep(Duration::from_millis(15))),
            (&format!("r{i}-fast"), sleep(Duration::from_millis(1))),
        )
        .await;
        task::spawn(&format!("r{i}-task"), async move {
            sleep(Duration::from_millis(3))
                .instrument(info_span!("leaf", cpt.name = format!("r{i}-leaf")))
                .await;
        })
        .await
        .unwrap();
        // Fire and forget: never on the path, may outlive the request.
        task::spawn(&format!("r{i}-forget"), sleep(Duration::from_millis(40)));
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).expect("traced");
    assert_eq!(done.path.total(), done.latency);
}

#[test]
fn concurrent_requests_never_mix_and_always_sum() {
    let sink = RecordingSink::new();
    let (layer, handle) = CriticalPathLayer::builder()
        .with_service("A")
        .with_sink(sink.clone())
        .with_clock(SystemClock::new())
        .build();
    tracing_subscriber::registry().with(layer).init();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tasks: Vec<_> = (0..REQUESTS).map(|i| tokio::spawn(serve(i))).collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    drop(rt);

    let records = sink.take();
    assert_eq!(records.len(), REQUESTS);
    assert_eq!(handle.requests_in_flight(), 0);
    let mut seen = vec![false; REQUESTS];
    for r in &records {
        let i: usize = r.request_id.as_deref().unwrap().parse().unwrap();
        assert!(
            !std::mem::replace(&mut seen[i], true),
            "two records for request {i}"
        );
        assert_eq!(
            r.path.total(),
            r.latency,
            "request {i}: segments must sum to latency"
        );
        assert!(
            r.latency >= Duration::from_millis(20),
            "request {i}: {:?}",
            r.latency
        );
        let own = format!("r{i}");
        for seg in r.path.segments() {
            for f in r.path.stack_frames(seg) {
                let ok = f.name.as_ref() == own || f.name.starts_with(&format!("{own}-"));
                assert!(ok, "request {i} has a frame of another request: {}", f.name);
            }
        }
        // The slow branch and the awaited task's leaf are on the path; the
        // forgotten task is not. (Durations are not checked: on a loaded
        // machine a worker thread preempted inside a poll is, correctly,
        // busy time of the span it was in.)
        let on_path = |name: &str| {
            r.path
                .segments()
                .iter()
                .filter(|s| r.path.frame(*s.stack.last().unwrap()).name.as_ref() == name)
                .map(|s| s.duration)
                .sum::<Duration>()
        };
        let json = r.to_json();
        assert!(on_path(&format!("r{i}-slow")) > Duration::ZERO, "{json}");
        assert!(on_path(&format!("r{i}-leaf")) > Duration::ZERO, "{json}");
        assert_eq!(on_path(&format!("r{i}-forget")), Duration::ZERO, "{json}");
        // Round trip through the JSON Lines form (checks the sum again).
        assert_eq!(&cpt_sdk::Record::from_json(&r.to_json()).unwrap(), r);
    }
}
