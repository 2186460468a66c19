//! The layer finds a span's node without registry extensions (a per-layer
//! table keyed by span id): nodes that do not fit the table still record.

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
