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

/// Spans made at `$name`'s callsite, twice in a row, each working 1 ms.
macro_rules! twice_each {
    ($t:expr, $($name:literal),*) => {
        $(
            for _ in 0..2 {
                let s = info_span!($name);
                s.in_scope(|| $t.work(1));
            }
        )*
    };
}

/// Frames are found per callsite: by a scan for a request's first few
/// callsites and by a map beyond them. Every span keeps its own frame
/// either way.
#[test]
fn a_request_with_many_callsites_names_each_span_by_its_own() {
    let t = Traced::manual();
    let root = t.root("R");
    root.in_scope(|| {
        twice_each!(
            t, "c00", "c01", "c02", "c03", "c04", "c05", "c06", "c07", "c08", "c09", "c10", "c11",
            "c12", "c13", "c14", "c15", "c16", "c17", "c18", "c19", "c20", "c21", "c22", "c23"
        );
    });
    let done = request::finish(&root).unwrap();
    let got: Vec<(String, Duration)> = done
        .path
        .segments()
        .iter()
        .map(|s| {
            let names: Vec<&str> = done.path.stack_frames(s).map(|f| &*f.name).collect();
            (names.join("/"), s.duration)
        })
        .collect();
    let want: Vec<(String, Duration)> = (0..24)
        .map(|i| (format!("R/c{i:02}"), Duration::from_millis(2)))
        .collect();
    assert_eq!(got, want);
}
