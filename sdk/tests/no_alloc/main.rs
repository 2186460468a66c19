//! Spans outside a traced request must not allocate in our layer (checked
//! with a counting global allocator, after warming up the registry's pools).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use cpt_sdk::Trigger;
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::request::{self, RequestOptions};
use tracing_subscriber::prelude::*;

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// Per thread: tests run on threads of their own, side by side.
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; the only
// addition is a counter bump, which does not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn untraced_spans(n: usize) {
    for i in 0..n {
        let outer = tracing::info_span!("outer", i);
        let _g = outer.enter();
        let inner = tracing::info_span!("inner");
        inner.in_scope(|| std::hint::black_box(i));
    }
}

/// Allocations during `f`, the least of three runs: a per-span allocation
/// shows in every run; a one-off in the harness or a lazy static does not.
fn least(f: impl Fn()) -> usize {
    (0..3).map(|_| count(&f)).min().unwrap()
}

fn count(f: impl FnOnce()) -> usize {
    ALLOCS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCS.with(Cell::get)
}

#[test]
fn untraced_spans_allocate_nothing_in_the_layer() {
    let (layer, _handle) = CriticalPathLayer::builder().with_service("A").build();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));

    // Warm up the registry's slab pages and thread-local span stack.
    untraced_spans(64);
    assert_eq!(
        least(|| untraced_spans(1000)),
        0,
        "no traced request in flight"
    );

    // With a traced request in flight elsewhere, untraced spans take the
    // second check (the parent's extensions) and still allocate nothing.
    let traced = tracing::info_span!("traced");
    assert!(request::begin(
        &traced,
        RequestOptions::new(Some(Trigger::Sampled))
    ));
    untraced_spans(64);
    assert_eq!(
        least(|| untraced_spans(1000)),
        0,
        "a traced request in flight"
    );
    assert!(request::finish(&traced).is_some());
}

#[test]
fn the_counter_sees_allocations() {
    // The allocator really counts (so a zero above means something).
    assert!(count(|| drop(std::hint::black_box(vec![1u8; 64]))) >= 1);
}

/// tokio's resource spans and poll events (`tokio-resources`), made as
/// tokio makes them for a sleep, outside any traced request: the layer names
/// each resource (a thread's site seen before) and forgets it at its close
/// without allocating.
#[cfg(feature = "tokio-resources")]
fn untraced_sleeps(n: usize) {
    for i in 0..n {
        let resource = tracing::trace_span!(
            target: "tokio::time::sleep",
            parent: None,
            "runtime.resource",
            concrete_type = "Sleep",
            kind = "timer",
            loc.file = "app/src/main.rs",
            loc.line = 40 + (i % 4) as u32,
            loc.col = 9u32,
        );
        let _in = resource.enter();
        tracing::trace!(target: "runtime::resource::poll_op", op_name = "poll_elapsed", is_ready = false);
    }
}

#[cfg(feature = "tokio-resources")]
#[test]
fn resource_spans_outside_traced_requests_allocate_nothing_in_the_layer() {
    let (layer, _handle) = CriticalPathLayer::builder().with_service("A").build();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    // Warm up the registry's pools, the layer's resource table and the
    // thread's sites.
    untraced_sleeps(64);
    assert_eq!(least(|| untraced_sleeps(1000)), 0);
}
