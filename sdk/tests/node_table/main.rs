//! The layer finds a span's node without registry extensions (a per-layer
//! table keyed by span id): nodes that do not fit the table still record,
//! and a span that reuses a closed node's id is not that node.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use cpt_sdk::request;
use support::Traced;
use tracing::info_span;

/// More nodes open at once than the table has slots (4096): those whose
/// slot is taken keep their state in the registry and are recorded the same.
#[test]
fn nodes_beyond_the_table_are_all_recorded() {
    const NODES: usize = 6000;
    let t = Traced::manual();
    let root = t.root("R");
    let children: Vec<_> = root.in_scope(|| {
        (0..NODES)
            .map(|_| {
                let child = info_span!("child");
                child.in_scope(|| t.work(1));
                child
            })
            .collect()
    });
    drop(children);
    let done = request::finish(&root).unwrap();
    assert_eq!(done.path.total(), done.latency);
    assert_eq!(done.latency, Duration::from_millis(NODES as u64));
    let in_children: Duration = done
        .path
        .segments()
        .iter()
        .filter(|s| done.path.frame(*s.stack.last().unwrap()).name.as_ref() == "child")
        .map(|s| s.duration)
        .sum();
    assert_eq!(
        in_children,
        Duration::from_millis(NODES as u64),
        "every child's millisecond is its own, none is the root's"
    );
}

/// A node closes and the registry hands its id to a span outside the
/// request: that span's time is not the node's, nor anyone's on the path.
#[test]
fn a_reused_span_id_is_not_the_closed_node() {
    let t = Traced::manual();
    let root = t.root("R");
    let child = root.in_scope(|| info_span!("child"));
    let reused = child.id();
    drop(child);
    let outside = info_span!(parent: None, "outside");
    assert_eq!(outside.id(), reused, "the registry reuses the closed id");
    root.in_scope(|| {
        outside.in_scope(|| t.work(5));
        info_span!("inner").in_scope(|| t.work(2));
    });
    let done = request::finish(&root).unwrap();
    for seg in done.path.segments() {
        for f in done.path.stack_frames(seg) {
            assert_ne!(f.name.as_ref(), "outside", "{:?}", done.path);
        }
    }
    let time_of = |name: &str| -> Duration {
        done.path
            .segments()
            .iter()
            .filter(|s| done.path.frame(*s.stack.last().unwrap()).name.as_ref() == name)
            .map(|s| s.duration)
            .sum()
    };
    assert_eq!(time_of("inner"), Duration::from_millis(2));
    assert_eq!(time_of("child"), Duration::ZERO, "{:?}", done.path);
    assert_eq!(time_of("R"), Duration::from_millis(5), "{:?}", done.path);
}
