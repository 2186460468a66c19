//! Named waits from tokio's resource instrumentation, driven by hand: the
//! spans and events tokio emits under `--cfg tokio_unstable`
//! (`runtime.resource`, `runtime::resource::poll_op`), made here directly,
//! so that faults are exact and need no cfg. Run with
//! `cargo test -p cpt-sdk --features tokio-resources --test waits`.
#![cfg(feature = "tokio-resources")]

#[path = "../support/mod.rs"]
mod support;

use cpt_sdk::SegmentKind::{Busy, Unattributed, Wait};
use cpt_sdk::request;
use cpt_sdk::testing::ms;
use cpt_sdk::{CriticalPath, SegmentKind};
use support::Traced;
use tracing::Span;

/// A resource span as tokio makes it (`parent: None`, its type and the
/// place it was created).
fn resource(concrete_type: &str, line: u32) -> Span {
    tracing::trace_span!(
        target: "tokio::sync",
        parent: None,
        "runtime.resource",
        concrete_type = concrete_type,
        kind = "Sync",
        loc.file = "app/src/main.rs",
        loc.line = line,
        loc.col = 5u32,
    )
}

/// One poll of a resource, as tokio's `trace_poll_op!` reports it: inside
/// the resource's span, from the node that polls.
fn poll(res: &Span, ready: bool) {
    let _in = res.enter();
    tracing::trace!(target: "runtime::resource::poll_op", op_name = "poll_acquire", is_ready = ready);
}

/// `(frame names joined by '/', ms, kind)` per segment.
fn segs(p: &CriticalPath) -> Vec<(String, u64, SegmentKind)> {
    p.segments()
        .iter()
        .map(|s| {
            let names: Vec<&str> = p.stack_frames(s).map(|f| &*f.name).collect();
            (names.join("/"), s.duration.as_millis() as u64, s.kind)
        })
        .collect()
}

fn own(s: &str, ms: u64, kind: SegmentKind) -> (String, u64, SegmentKind) {
    (s.to_string(), ms, kind)
}

/// A pool's semaphore made before any request is traced still names the
/// wait of the request that waited on it.
#[test]
fn a_resource_made_outside_traced_requests_names_the_wait() {
    let t = Traced::manual();
    let pool = resource("Semaphore", 40);
    let root = t.root("R");
    root.in_scope(|| {
        t.work(2);
        poll(&pool, false);
    });
    t.work(10);
    root.in_scope(|| {
        poll(&pool, true);
        t.work(1);
    });
    let done = request::finish(&root).expect("traced");
    assert_eq!(
        segs(&done.path),
        [
            own("R", 2, Busy),
            own("R/[semaphore app/src/main.rs:40]", 10, Wait),
            own("R", 1, Busy),
        ]
    );
    assert_eq!(done.path.accounting.unattributed, ms(0));
}

/// A node waiting on two resources (a `timeout` around a lock) is named by
/// the one that was ready when it resumed, even after the other is dropped
/// while it waited; a resource polled ready without having been waited on
/// names nothing.
#[test]
fn the_resource_ready_at_the_resumption_names_the_wait() {
    let t = Traced::manual();
    let root = t.root("R");
    let lock = resource("Mutex", 7);
    let timer = resource("Sleep", 9);
    // The lock is polled last, so it would name the wait if the ready
    // resource did not.
    root.in_scope(|| {
        poll(&timer, false);
        poll(&lock, false);
    });
    drop(lock);
    t.work(5);
    root.in_scope(|| {
        poll(&timer, true);
        // Free right away: no wait, no name.
        poll(&resource("Semaphore", 11), true);
    });
    t.work(3);
    root.in_scope(|| {});
    let done = request::finish(&root).expect("traced");
    assert_eq!(
        segs(&done.path),
        [
            own("R/[sleep app/src/main.rs:9]", 5, Wait),
            own("R", 3, Unattributed),
        ]
    );
}

/// One semaphore shared by two traced requests: each request's wait is
/// named by its own polls, and what one request's node does to the
/// resource is never charged to the other.
#[test]
fn a_resource_shared_by_two_requests_names_each_ones_own_wait() {
    let t = Traced::manual();
    let pool = resource("Semaphore", 40);
    let a = t.root("A");
    let b = t.root("B");
    a.in_scope(|| poll(&pool, true));
    b.in_scope(|| poll(&pool, false));
    t.work(4);
    // A polls it again (ready) while B still waits: B's wait is unchanged.
    a.in_scope(|| poll(&pool, true));
    t.work(6);
    b.in_scope(|| poll(&pool, true));
    let (a, b) = (
        request::finish(&a).expect("A"),
        request::finish(&b).expect("B"),
    );
    assert_eq!(
        segs(&b.path),
        [own("B/[semaphore app/src/main.rs:40]", 10, Wait)]
    );
    assert!(
        a.path.segments().iter().all(|s| s.kind != Wait),
        "A never waited on it: {:?}",
        segs(&a.path)
    );
}

/// A resource span that is entered outside any node (a task's own poll
/// outside traced requests) touches no request.
#[test]
fn polls_outside_nodes_touch_no_request() {
    let t = Traced::manual();
    let pool = resource("Semaphore", 40);
    let root = t.root("R");
    root.in_scope(|| t.work(1));
    poll(&pool, false);
    t.work(2);
    poll(&pool, true);
    root.in_scope(|| t.work(1));
    let done = request::finish(&root).expect("traced");
    assert_eq!(
        segs(&done.path),
        [
            own("R", 1, Busy),
            own("R", 2, Unattributed),
            own("R", 1, Busy)
        ]
    );
}

/// More resources open at once than the layer's resource table holds
/// (16 384, four per span-id hash): those it has no room for keep their
/// names on their spans, and still name the waits on them.
#[test]
fn resources_beyond_the_table_still_name_their_waits() {
    let line = |i: usize| 1000 + (i % 64) as u32;
    let t = Traced::manual();
    let open: Vec<Span> = (0..20_000)
        .map(|i| resource("Semaphore", line(i)))
        .collect();
    let root = t.root("R");
    let waited: Vec<usize> = (0..open.len()).step_by(97).collect();
    for &i in &waited {
        root.in_scope(|| poll(&open[i], false));
        t.work(1);
        root.in_scope(|| poll(&open[i], true));
    }
    let done = request::finish(&root).expect("traced");
    let names: Vec<String> = segs(&done.path)
        .into_iter()
        .filter(|s| s.2 == Wait)
        .map(|s| s.0)
        .collect();
    let want: Vec<String> = waited
        .iter()
        .map(|&i| format!("R/[semaphore app/src/main.rs:{}]", line(i)))
        .collect();
    assert_eq!(names, want);
}

/// A sleep as tokio makes it inside a traced request: the resource span,
/// its `async_op` span and the `async_op.poll` span inside that, the three
/// entered on each poll. Only the resource names the wait; the spans inside
/// it are no nodes.
#[test]
fn the_spans_tokio_makes_inside_a_resource_are_no_nodes() {
    let t = Traced::manual();
    let root = t.root("R");
    let (res, op, op_poll) = root.in_scope(|| {
        let res = resource("Sleep", 21);
        let op = tracing::trace_span!(
            target: "tokio::time::sleep",
            parent: &res,
            "runtime.resource.async_op",
            source = "Sleep::new_timeout",
        );
        let op_poll = tracing::trace_span!(
            target: "tokio::time::sleep",
            parent: &op,
            "runtime.resource.async_op.poll",
        );
        (res, op, op_poll)
    });
    let poll_sleep = |ready: bool| {
        let _res = res.clone().entered();
        let _op = op.clone().entered();
        let _poll = op_poll.clone().entered();
        tracing::trace!(target: "runtime::resource::poll_op", op_name = "poll_elapsed", is_ready = ready);
    };
    root.in_scope(|| {
        t.work(1);
        poll_sleep(false);
    });
    t.work(4);
    root.in_scope(|| {
        poll_sleep(true);
        t.work(2);
    });
    let done = request::finish(&root).expect("traced");
    assert_eq!(
        segs(&done.path),
        [
            own("R", 1, Busy),
            own("R/[sleep app/src/main.rs:21]", 4, Wait),
            own("R", 2, Busy),
        ]
    );
}
