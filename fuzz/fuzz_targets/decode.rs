//! Arbitrary bytes into `cpt_sdk::codec::decode`: it must never panic, its
//! allocations must stay within a fixed multiple of the input plus a
//! constant (a counting global allocator checks the peak for every input),
//! and whatever it accepts must satisfy the limits and re-encode to the
//! same path.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use cpt_sdk::codec::{DecodeLimits, EncodeOptions, decode, encode};
use libfuzzer_sys::fuzz_target;

/// Bytes currently allocated through Rust's allocator, and the peak since
/// the last reset.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// The largest peak seen so far, to report new maxima.
static WORST: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: forwards every call to `System` unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Allowed peak: a multiple of the input (what prost and the path's tables
/// hold per wire byte) plus the stack-frame budget of the limits.
fn allowed(len: usize, limits: &DecodeLimits) -> usize {
    256 * len + 4 * limits.max_stack_frames + (1 << 20)
}

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits::default();
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let result = decode(data, &limits);
    let peak = PEAK.load(Relaxed).saturating_sub(base);
    if peak > WORST.fetch_max(peak, Relaxed) {
        eprintln!(
            "new peak: {peak} bytes allocated for a {} byte input",
            data.len()
        );
    }
    assert!(
        peak <= allowed(data.len(), &limits),
        "decoding {} bytes allocated {peak} bytes",
        data.len()
    );
    if let Ok(path) = result {
        assert!(path.depth() <= limits.max_depth);
        assert!(path.segments().len() <= limits.max_segments);
        assert!(path.segments().iter().all(|s| !s.duration.is_zero()));
        // Without limits, so that nothing is coarsened.
        let unlimited = DecodeLimits::new()
            .with_max_bytes(usize::MAX)
            .with_max_strings(usize::MAX)
            .with_max_tree_entries(usize::MAX)
            .with_max_segments(usize::MAX)
            .with_max_depth(usize::MAX)
            .with_max_stack_frames(usize::MAX);
        let options = EncodeOptions::new()
            .with_max_bytes(usize::MAX)
            .with_decode_limits(unlimited);
        let back = decode(&encode(&path, &options), &unlimited)
            .expect("a decoded path re-encodes to something that decodes");
        assert_eq!(back, path);
    }
});
