//! What named waits cost, side by side in one run (a bench binary: each
//! case is timed over many rounds and the median round reported).
//!
//! tokio's resource spans and poll events are made here as tokio makes
//! them under `--cfg tokio_unstable` (`runtime.resource` with its type and
//! creation site, `runtime::resource::poll_op` with `is_ready`), so the
//! bench needs no cfg:
//!
//! - `resource/*`: create and close one resource span, with the bare
//!   registry and with cpt's layer (no request traced): cpt's share of a
//!   resource span outside traced requests is the difference;
//! - `poll/*`: one poll of a resource (enter its span, the event, exit),
//!   likewise;
//! - `request/*`: a traced request whose handler node waits four times
//!   (begin, the handler's five polls, finish with the path computed):
//!   `plain` with no resources (what tokio emits without the cfg), `named`
//!   with a resource made per wait, polled pending before and ready after
//!   it, as a sleep is. Their ratio is what the opt-in costs a traced
//!   request, tokio's own spans included.
//!
//! With the feature off only `request/plain` runs: compared with the same
//! case built from a tree without named waits, it is what nothing but the
//! new code paths cost.
//!
//! ```text
//! cargo bench -p cpt-sdk --features tokio-resources --bench waits
//! ```

use std::hint::black_box;
use std::time::Instant;

use cpt_sdk::Trigger;
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::request::{self, RequestOptions};
use tracing::Dispatch;
use tracing_subscriber::prelude::*;

/// Rounds per case; the median round is reported.
const ROUNDS: usize = 15;

/// The median over [`ROUNDS`] of the time per iteration of `f`, in ns.
fn time(iters: u64, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters / 4 {
        f();
    }
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iters {
                f();
            }
            start.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

#[cfg(feature = "tokio-resources")]
fn resource(line: u32) -> tracing::Span {
    tracing::trace_span!(
        target: "tokio::time::sleep",
        parent: None,
        "runtime.resource",
        concrete_type = "Sleep",
        kind = "timer",
        loc.file = "app/src/main.rs",
        loc.line = line,
        loc.col = 9u32,
    )
}

#[cfg(feature = "tokio-resources")]
fn poll(res: &tracing::Span, ready: bool) {
    let _in = res.enter();
    tracing::trace!(target: "runtime::resource::poll_op", op_name = "poll_elapsed", is_ready = ready);
}

/// One traced request: a handler node polled five times, waiting between
/// its polls, each wait on a fresh resource when `named`.
fn request(named: bool) {
    let root = tracing::info_span!("request");
    request::begin(&root, RequestOptions::new(Some(Trigger::Sampled)));
    let handler = root.in_scope(|| tracing::info_span!("handle"));
    #[cfg(feature = "tokio-resources")]
    let mut res: Option<tracing::Span> = None;
    for i in 0..5u32 {
        let _in = handler.enter();
        #[cfg(feature = "tokio-resources")]
        if named {
            if let Some(r) = res.take() {
                poll(&r, true);
            }
            if i < 4 {
                let r = resource(80 + i);
                poll(&r, false);
                res = Some(r);
            }
        }
        let _ = (named, i);
        black_box(&handler);
    }
    drop(handler);
    black_box(request::finish(&root));
}

fn main() {
    let (layer, _h) = CriticalPathLayer::builder().with_service("bench").build();
    let cpt = Dispatch::new(tracing_subscriber::registry().with(layer));
    #[cfg(feature = "tokio-resources")]
    let registry = Dispatch::new(tracing_subscriber::registry());

    let mut rows: Vec<(&str, f64)> = Vec::new();
    #[cfg(feature = "tokio-resources")]
    {
        let new = || drop(black_box(resource(7)));
        let r = tracing::dispatcher::with_default(&registry, || time(200_000, new));
        rows.push(("resource/registry", r));
        let c = tracing::dispatcher::with_default(&cpt, || time(200_000, new));
        rows.push(("resource/cpt_untraced", c));
        let polled = |d: &Dispatch| {
            tracing::dispatcher::with_default(d, || {
                let res = resource(7);
                time(500_000, || poll(&res, false))
            })
        };
        rows.push(("poll/registry", polled(&registry)));
        rows.push(("poll/cpt_untraced", polled(&cpt)));
    }
    let plain = tracing::dispatcher::with_default(&cpt, || time(20_000, || request(false)));
    rows.push(("request/plain", plain));
    #[cfg(feature = "tokio-resources")]
    {
        let named = tracing::dispatcher::with_default(&cpt, || time(20_000, || request(true)));
        rows.push(("request/named", named));
    }

    for (name, ns) in &rows {
        println!("{name:<24} {ns:>10.1} ns");
    }
    let get = |n: &str| rows.iter().find(|r| r.0 == n).map(|r| r.1);
    if let (Some(r), Some(c)) = (get("resource/registry"), get("resource/cpt_untraced")) {
        println!(
            "cpt's share of a resource span outside traced requests: {:.1} ns",
            c - r
        );
    }
    if let (Some(r), Some(c)) = (get("poll/registry"), get("poll/cpt_untraced")) {
        println!(
            "cpt's share of a poll (span enter, event, exit) outside traced requests: {:.1} ns",
            c - r
        );
    }
    if let (Some(p), Some(n)) = (get("request/plain"), get("request/named")) {
        println!("a traced request, named waits on / off: {:.2}x", n / p);
    }
}
