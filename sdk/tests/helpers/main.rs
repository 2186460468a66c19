//! The task hooks and the hand API (`request::*`), with exact paths.

#[path = "../support/mod.rs"]
mod support;

use cpt_sdk::SegmentKind::{BlindSpot, Busy, Network, Unattributed};
use cpt_sdk::request::{self, RequestOptions};
use cpt_sdk::task;
use cpt_sdk::testing::{expect, ms};
use cpt_sdk::{CalleeOutcome, CriticalPath, Frame, Record, Trigger};
use support::Traced;
use tokio::time::sleep;
use tracing::{Instrument, info_span};

#[tokio::test(start_paused = true)]
async fn task_join_names_its_branches_and_the_slow_one_blocks() {
    let t = Traced::new();
    let root = t.root("A1");
    async {
        t.work(5);
        task::join(("B1", sleep(ms(20))), ("A2", sleep(ms(2)))).await;
        t.work(8);
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment(["A1"], ms(5))
        .segment(["A1", "B1"], ms(20))
        .segment(["A1"], ms(8))
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn task_join_all_keeps_order_and_blocks_on_the_slowest() {
    let t = Traced::new();
    let root = t.root("R");
    let out = async {
        task::join_all([3u64, 9, 4].map(|n| {
            (format!("w{n}"), async move {
                sleep(ms(n)).await;
                n
            })
        }))
        .await
    }
    .instrument(root.clone())
    .await;
    assert_eq!(out, vec![3, 9, 4]);
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment(["R", "w9"], ms(9))
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn task_try_join_error_cancels_the_other_branch() {
    let t = Traced::new();
    let root = t.root("R");
    let r: Result<((), ()), &str> = async {
        task::try_join(
            ("slow_ok", async {
                sleep(ms(10)).await;
                Ok(())
            }),
            ("fast_err", async {
                sleep(ms(3)).await;
                Err("boom")
            }),
        )
        .await
    }
    .instrument(root.clone())
    .await;
    assert_eq!(r, Err("boom"));
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment(["R", "fast_err"], ms(3))
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn task_spawn_and_spawn_blocking_are_linked_to_the_parent() {
    let t = Traced::new();
    let root = t.root("R");
    let clock = t.clock.clone();
    async move {
        task::spawn("spawned", sleep(ms(5))).await.unwrap();
        // The blocking thread works only once the root's poll has returned
        // (the runtime runs the sender after it): otherwise the root is, in
        // fact, busy while the clock moves, and the path says so.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        tokio::spawn(async move { tx.send(()).unwrap() });
        task::spawn_blocking("blocking", move || {
            rx.recv().unwrap();
            clock.advance(ms(7))
        })
        .await
        .unwrap();
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment_kind(["R", "spawned"], ms(5), Unattributed)
        .segment_kind(["R", "blocking"], ms(7), Busy)
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn task_graph_records_the_input_that_completed_last() {
    let t = Traced::new();
    let root = t.root("A1");
    let clock = t.clock.clone();
    let v = async move {
        let mut g = task::TaskGraph::new();
        let b1 = g.node("B1", &[], |_| async {
            sleep(ms(20)).await;
            20u64
        });
        let a2 = g.node("A2", &[], |_| async {
            sleep(ms(2)).await;
            2
        });
        let b2 = g.node("B2", &[b1], |v: Vec<u64>| async move {
            sleep(ms(3)).await;
            v[0] + 3
        });
        let out = g.node("A1out", &[b2, a2], move |v: Vec<u64>| async move {
            clock.advance(ms(4));
            v.iter().sum()
        });
        g.run(out).await
    }
    .instrument(root.clone())
    .await;
    assert_eq!(v, 25);
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment(["A1", "B1"], ms(20))
        .segment(["A1", "B2"], ms(3))
        .segment_kind(["A1", "A1out"], ms(4), Busy)
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn record_carries_options_labels_and_round_trips() {
    let t = Traced::new();
    let root = info_span!("server");
    assert!(request::begin(
        &root,
        RequestOptions::new(Some(Trigger::Forced))
            .with_service("B")
            .with_name("/b.B/Run")
            .with_endpoint("/b.B/Run")
            .with_trace_id("4bf92f3577b34da6a3ce929d0e0e4736")
            .with_request_id("r-1")
            .with_label("arm", "a"),
    ));
    async {
        assert_eq!(request::current_trigger(), Some(Trigger::Forced));
        assert!(request::label("region", "eu"));
        sleep(ms(4))
            .instrument(info_span!("step", cpt.name = "B2"))
            .await;
    }
    .instrument(root.clone())
    .await;
    drop(root); // closing the root without finish() finishes it
    let r = t.sink.single();
    assert_eq!(r.service, "B");
    assert_eq!(r.trigger, Trigger::Forced);
    assert_eq!(r.endpoint.as_deref(), Some("/b.B/Run"));
    assert_eq!(r.request_id.as_deref(), Some("r-1"));
    assert_eq!(
        r.trace_id.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(r.labels.get("arm").map(String::as_str), Some("a"));
    assert_eq!(r.labels.get("region").map(String::as_str), Some("eu"));
    assert_eq!(r.latency, ms(4));
    expect::path()
        .segment(["/b.B/Run", "B2"], ms(4))
        .assert(&r.path);
    assert!(r.path.frames().iter().all(|f| &*f.service == "B"));
    assert_eq!(Record::from_json(&r.to_json()).unwrap(), r);
}

#[tokio::test(start_paused = true)]
async fn untraced_requests_do_nothing() {
    let t = Traced::new();
    let span = info_span!("untraced");
    assert!(!request::begin(&span, RequestOptions::new(None)));
    async {
        assert_eq!(request::current_trigger(), None);
        assert!(!request::label("k", "v"));
        sleep(ms(1)).instrument(info_span!("child")).await;
    }
    .instrument(span.clone())
    .await;
    assert!(request::finish(&span).is_none());
    drop(span);
    assert!(t.sink.is_empty());
    assert_eq!(t.handle.requests_in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn finish_is_once_and_emit_record_can_be_off() {
    let t = Traced::new();
    let root = info_span!("root");
    assert!(request::begin(
        &root,
        RequestOptions::new(Some(Trigger::Sampled)).with_emit_record(false)
    ));
    async { sleep(ms(2)).await }.instrument(root.clone()).await;
    let done = request::finish(&root).unwrap();
    assert_eq!(done.latency, ms(2));
    assert_eq!(done.trigger, Trigger::Sampled);
    assert!(request::finish(&root).is_none());
    assert!(t.sink.is_empty());
    assert_eq!(t.handle.requests_in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn callee_path_and_blind_spot_are_spliced() {
    let t = Traced::new();
    let root = t.root("A1");
    async {
        t.work(5);
        let rpc = info_span!("rpc", cpt.name = "B/Run");
        let mut callee = CriticalPath::new();
        callee.push_frames([Frame::new("B", "B1")], ms(4), Busy);
        callee.push_frames([Frame::new("B", "B1"), Frame::new("B", "B2")], ms(12), Busy);
        assert!(request::set_callee(&rpc, CalleeOutcome::Path(callee)));
        sleep(ms(20)).instrument(rpc).await;
        t.work(8);
        let rpc2 = info_span!("rpc", cpt.name = "C/Run");
        assert!(request::set_callee(
            &rpc2,
            CalleeOutcome::BlindSpot { callee: "C".into() }
        ));
        sleep(ms(2)).instrument(rpc2).await;
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment_kind(["A1"], ms(5), Busy)
        .segment_kind(["A1", "B/Run"], ms(4), Network)
        .segment_kind(["A1", "B/Run", "B1"], ms(4), Busy)
        .segment_kind(["A1", "B/Run", "B1", "B2"], ms(12), Busy)
        .segment_kind(["A1"], ms(8), Busy)
        .segment_kind(["A1", "C/Run", "C"], ms(2), BlindSpot)
        .assert(&done.path);
    assert_eq!(done.path.accounting.network, ms(4));
    assert_eq!(done.path.accounting.blind_spot, ms(2));
    assert_eq!(done.latency, ms(35));
}

/// An entry point's path is computed off the request path: `finish_detached`
/// ends the request at once (later work is not on its path), and the record
/// reaches the sink from the background thread, exact as with `finish`.
#[tokio::test(start_paused = true)]
async fn finish_detached_emits_the_same_record_from_the_background() {
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::prelude::*;

    type Emitted = Vec<(Option<String>, Record)>;
    let got: Arc<Mutex<Emitted>> = Arc::default();
    let sink = got.clone();
    let clock = cpt_sdk::testing::ManualClock::with_tokio();
    let (layer, handle) = cpt_sdk::layer::CriticalPathLayer::builder()
        .with_service("A")
        .with_clock(clock.clone())
        .with_sink(move |r: Record| {
            let thread = std::thread::current().name().map(str::to_owned);
            sink.lock().unwrap().push((thread, r));
        })
        .build();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    let root = info_span!("root", cpt.name = "A1");
    assert!(request::begin(
        &root,
        RequestOptions::new(Some(Trigger::Sampled)).with_name("A1")
    ));
    async {
        clock.advance(ms(5));
        sleep(ms(20)).instrument(info_span!("B1")).await;
        clock.advance(ms(3));
    }
    .instrument(root.clone())
    .await;
    assert!(request::finish_detached(&root));
    // Ended: neither finish ends it again, and time after is not on it.
    assert!(!request::finish_detached(&root));
    assert!(request::finish(&root).is_none());
    clock.advance(ms(7));
    assert_eq!(handle.requests_in_flight(), 0);
    assert!(handle.flush(std::time::Duration::from_secs(5)));
    let got = got.lock().unwrap();
    assert_eq!(got.len(), 1);
    let (thread, r) = &got[0];
    assert_eq!(thread.as_deref(), Some("cpt-finish"));
    assert_eq!(r.latency, ms(28));
    expect::path()
        .segment(["A1"], ms(5))
        .segment(["A1", "B1"], ms(20))
        .segment(["A1"], ms(3))
        .assert(&r.path);
    assert_eq!(handle.records_emitted(), 1);
    assert_eq!(handle.records_dropped(), 0);
}
