//! Spans outside a traced request must not allocate in our layer (checked
//! with a counting global allocator, after warming up the registry's pools).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use cpt_sdk::Trigger;
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::request::{self, RequestOptions};
use tracing_subscriber::prelude::*;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards every call to the system allocator unchanged; the only
// addition is a counter bump, which does not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
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
            ALLOCS.fetch_add(1, Ordering::Relaxed);
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
    ALLOCS.store(0, Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCS.load(Ordering::Relaxed)
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
