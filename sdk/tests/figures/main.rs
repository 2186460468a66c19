//! CPT Figure 2: the three reference scenarios, with exact milliseconds
//! (tokio's paused clock for waits, a manual clock for CPU work).

#[path = "../support/mod.rs"]
mod support;

use cpt_sdk::SegmentKind;
use cpt_sdk::request;
use cpt_sdk::testing::{expect, ms};
use support::Traced;
use tokio::time::sleep;
use tracing::{Instrument, info_span};

#[tokio::test(start_paused = true)]
async fn cpt_fig2a_sequential() {
    let t = Traced::new();
    let root = t.root("A1");
    async {
        t.work(5);
        sleep(ms(20)).instrument(info_span!("B1")).await;
        t.work(8);
        sleep(ms(2)).instrument(info_span!("A2")).await;
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).expect("traced");
    expect::path()
        .segment_kind(["A1"], ms(5), SegmentKind::Busy)
        .segment_kind(["A1", "B1"], ms(20), SegmentKind::Unattributed)
        .segment_kind(["A1"], ms(8), SegmentKind::Busy)
        .segment_kind(["A1", "A2"], ms(2), SegmentKind::Unattributed)
        .assert(&done.path);
    assert_eq!(done.latency, ms(35));
    let record = t.sink.single();
    assert_eq!(record.latency, ms(35));
    assert_eq!(record.path, done.path);
}

#[tokio::test(start_paused = true)]
async fn cpt_fig2b_parallel() {
    let t = Traced::new();
    let root = t.root("A1");
    async {
        t.work(5);
        tokio::join!(
            sleep(ms(20)).instrument(info_span!("B1")),
            sleep(ms(2)).instrument(info_span!("A2")),
        );
        t.work(8);
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).expect("traced");
    expect::path()
        .segment(["A1"], ms(5))
        .segment(["A1", "B1"], ms(20))
        .segment(["A1"], ms(8))
        .assert(&done.path);
    assert_eq!(done.latency, ms(33));
}

#[tokio::test(start_paused = true)]
async fn cpt_fig2c_overlap() {
    let t = Traced::new();
    let root = t.root("A1");
    async {
        t.work(3);
        // A1 issues B1 without blocking on it and keeps computing.
        let b1 = tokio::spawn(sleep(ms(14)).instrument(info_span!("B1")));
        sleep(ms(6)).await; // A1's own work in parallel (an uninstrumented wait here)
        b1.await.unwrap();
        t.work(10);
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).expect("traced");
    expect::path()
        .segment(["A1"], ms(3))
        .segment(["A1", "B1"], ms(14))
        .segment(["A1"], ms(10))
        .assert(&done.path);
    assert_eq!(done.latency, ms(27));
}
