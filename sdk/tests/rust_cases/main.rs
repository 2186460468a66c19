//! The Rust-specific cases of docs/src/reference/semantics.md "The critical path", each with
//! exact expected segments (paused tokio clock for waits, manual clock for
//! CPU work).

#[path = "../support/mod.rs"]
mod support;

use cpt_sdk::SegmentKind::{Busy, Queueing, Unattributed};
use cpt_sdk::request;
use cpt_sdk::task;
use cpt_sdk::testing::{expect, ms};
use support::Traced;
use tokio::time::sleep;
use tracing::{Instrument, info_span};

#[tokio::test(start_paused = true)]
async fn sequential_awaits() {
    let t = Traced::new();
    let root = t.root("R");
    async {
        t.work(2);
        sleep(ms(3)).instrument(info_span!("first")).await;
        sleep(ms(4)).instrument(info_span!("second")).await;
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment_kind(["R"], ms(2), Busy)
        .segment_kind(["R", "first"], ms(3), Unattributed)
        .segment_kind(["R", "second"], ms(4), Unattributed)
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn join_of_io_bound_children_is_parallel() {
    let t = Traced::new();
    let root = t.root("R");
    async {
        t.work(1);
        tokio::join!(
            sleep(ms(10)).instrument(info_span!("slow")),
            sleep(ms(4)).instrument(info_span!("fast")),
        );
        t.work(2);
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment(["R"], ms(1))
        .segment(["R", "slow"], ms(10))
        .segment(["R"], ms(2))
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn join_of_cpu_bound_children_on_one_thread_is_serialised() {
    let t = Traced::new();
    let root = t.root("R");
    async {
        tokio::join!(
            async { t.work(6) }.instrument(info_span!("a")),
            async { t.work(4) }.instrument(info_span!("b")),
        );
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment_kind(["R", "a"], ms(6), Busy)
        .segment_kind(["R", "b"], ms(4), Busy)
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn join_of_cpu_bound_children_that_yield_is_serialised() {
    // Branches that yield (tokio's coop budget does this to CPU-heavy loops)
    // interleave on one thread: while one waits for its turn, its parent's
    // poll is running the sibling, so that time is the sibling's.
    let t = Traced::new();
    let root = t.root("R");
    async {
        task::join(
            ("a", async {
                t.work(3);
                tokio::task::yield_now().await;
                t.work(3);
            }),
            ("b", async {
                t.work(2);
                tokio::task::yield_now().await;
                t.work(2);
            }),
        )
        .await;
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    assert_eq!(done.latency, ms(10));
    // tokio::join! rotates which branch it polls first: a 0-3, b 3-5, then
    // b 5-7, a 7-10. Every millisecond is one branch's CPU, both on the path.
    expect::path()
        .segment_kind(["R", "a"], ms(3), Busy)
        .segment_kind(["R", "b"], ms(4), Busy)
        .segment_kind(["R", "a"], ms(3), Busy)
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn plain_join_of_cpu_bound_children_that_yield_is_serialised() {
    // The same with tokio::join! and plain spans (no wake tracking).
    let t = Traced::new();
    let root = t.root("R");
    async {
        tokio::join!(
            async {
                t.work(3);
                tokio::task::yield_now().await;
                t.work(3);
            }
            .instrument(info_span!("a")),
            async {
                t.work(2);
                tokio::task::yield_now().await;
                t.work(2);
            }
            .instrument(info_span!("b")),
        );
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment_kind(["R", "a"], ms(3), Busy)
        .segment_kind(["R", "b"], ms(4), Busy)
        .segment_kind(["R", "a"], ms(3), Busy)
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn tokio_spawn_with_awaited_handle() {
    let t = Traced::new();
    let root = t.root("R");
    async {
        t.work(1);
        let h = tokio::spawn(
            async {
                sleep(ms(7)).await;
            }
            .instrument(info_span!("task")),
        );
        h.await.unwrap();
        t.work(1);
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment(["R"], ms(1))
        .segment_kind(["R", "task"], ms(7), Unattributed)
        .segment(["R"], ms(1))
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn spawn_blocking_is_the_blocker() {
    let t = Traced::new();
    let root = t.root("R");
    async {
        let clock = t.clock.clone();
        let span = info_span!("blocking");
        tokio::task::spawn_blocking(move || span.in_scope(|| clock.advance(ms(9))))
            .await
            .unwrap();
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment_kind(["R", "blocking"], ms(9), Busy)
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn plain_thread_with_in_scope() {
    let t = Traced::new();
    let root = t.root("R");
    async {
        t.work(1);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let span = info_span!("thread");
        let clock = t.clock.clone();
        let rt = tokio::runtime::Handle::current();
        std::thread::spawn(move || {
            let _rt = rt.enter(); // the test clock follows the runtime's paused clock
            // Let the parent reach its await first (real time; the clocks are paused/manual).
            std::thread::sleep(std::time::Duration::from_millis(30));
            span.in_scope(|| clock.advance(ms(5)));
            drop(span);
            tx.send(()).unwrap();
        });
        rx.await.unwrap();
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment(["R"], ms(1))
        .segment_kind(["R", "thread"], ms(5), Busy)
        .assert(&done.path);
}

#[test]
fn std_thread_scope_joins_as_a_wait() {
    let t = Traced::manual();
    let root = t.root("R");
    root.in_scope(|| {
        t.work(1);
        task::scope(|s| {
            let clock = t.clock.clone();
            s.spawn("worker", move || {
                // Let the parent reach the join first (the clock is manual).
                std::thread::sleep(ms(30));
                clock.advance(ms(5));
            });
        });
        t.work(2);
    });
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment(["R"], ms(1))
        .segment_kind(["R", "worker"], ms(5), Busy)
        .segment(["R"], ms(2))
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn select_loser_is_off_the_path() {
    let t = Traced::new();
    let root = t.root("R");
    async {
        // `task::node` rather than `.instrument`: tracing's `Instrumented`
        // enters its span when dropped, so a loser dropped after the winner
        // would look like it ended last.
        tokio::select! {
            _ = task::node("winner", sleep(ms(3))) => {}
            _ = task::node("loser", sleep(ms(10))) => {}
        }
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment(["R", "winner"], ms(3))
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn spawned_task_never_awaited_is_off_the_path() {
    let t = Traced::new();
    let root = t.root("R");
    async {
        tokio::spawn(sleep(ms(50)).instrument(info_span!("fire_and_forget")));
        sleep(ms(5)).instrument(info_span!("awaited")).await;
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment(["R", "awaited"], ms(5))
        .assert(&done.path);
}

#[tokio::test(start_paused = true)]
async fn span_created_early_polled_late_is_queueing() {
    let t = Traced::new();
    let root = t.root("R");
    async {
        let late = info_span!("late");
        sleep(ms(10)).await;
        sleep(ms(5)).instrument(late).await;
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment_kind(["R", "late"], ms(10), Queueing)
        .segment_kind(["R", "late"], ms(5), Unattributed)
        .assert(&done.path);
    assert_eq!(done.path.accounting.queueing, ms(10));
}

#[tokio::test(start_paused = true)]
async fn await_on_uninstrumented_future_is_unattributed() {
    let t = Traced::new();
    let root = t.root("R");
    async {
        t.work(2);
        sleep(ms(6)).await;
        t.work(1);
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment_kind(["R"], ms(2), Busy)
        .segment_kind(["R"], ms(6), Unattributed)
        .segment_kind(["R"], ms(1), Busy)
        .assert(&done.path);
    assert_eq!(done.path.accounting.unattributed, ms(6));
}

#[tokio::test(start_paused = true)]
async fn nested_spans_three_deep_across_two_tasks() {
    let t = Traced::new();
    let root = t.root("R");
    let clock = t.clock.clone();
    async move {
        async move {
            clock.advance(ms(1));
            let c = clock.clone();
            tokio::spawn(
                async move {
                    c.advance(ms(2));
                    sleep(ms(4)).instrument(info_span!("L3")).await;
                    c.advance(ms(1));
                }
                .instrument(info_span!("L2")),
            )
            .await
            .unwrap();
        }
        .instrument(info_span!("L1"))
        .await;
    }
    .instrument(root.clone())
    .await;
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment(["R", "L1"], ms(1))
        .segment(["R", "L1", "L2"], ms(2))
        .segment(["R", "L1", "L2", "L3"], ms(4))
        .segment(["R", "L1", "L2"], ms(1))
        .assert(&done.path);
}

/// A span from outside the request entered inside one of its nodes: spans
/// created in it are not nodes (their parent is not), whether the layer
/// answers from its entered-span stack or from the registry; and leaving it
/// restores the node underneath as the parent of new spans.
#[tokio::test(start_paused = true)]
async fn span_from_outside_entered_inside_a_node_is_not_a_parent_node() {
    let t = Traced::new();
    let outside = info_span!("connection");
    let root = t.root("R");
    root.in_scope(|| {
        t.work(1);
        outside.in_scope(|| {
            let _g = info_span!("inner").entered();
            t.work(2);
        });
        let _g = info_span!("child").entered();
        t.work(3);
    });
    let done = request::finish(&root).unwrap();
    expect::path()
        .segment(["R"], ms(3))
        .segment(["R", "child"], ms(3))
        .assert(&done.path);
}
