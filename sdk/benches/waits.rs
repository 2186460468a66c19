//! What named waits cost, side by side in one run (a bench binary: the
//! cases run in interleaved rounds, so that a change of load on the machine
//! falls on all of them alike; each case's median round is reported, and a
//! difference of two cases is the median of the rounds' differences).
//!
//! tokio's resource spans and poll events are made here as tokio makes
//! them for a `tokio::time::sleep` under `--cfg tokio_unstable`: a
//! `runtime.resource` span with its type and creation site, its
//! `runtime.resource.async_op` and `runtime.resource.async_op.poll` spans,
//! and on each poll the three entered (by clones, as tokio does) around a
//! `runtime::resource::poll_op` event with `is_ready`. So the bench needs no
//! cfg. Every subscriber is behind the filter the guide gives cpt's layer
//! (`NamedWaits` over INFO), so the two `async_op` spans, which cpt does not
//! read, are not made, as in a program set up that way.
//!
//! - `resource/*`: create and close a sleep's `runtime.resource` span, with
//!   a layer that does nothing (`registry`) and with cpt's layer (no request
//!   traced): cpt's share of a timer's resource span outside traced requests
//!   is the difference (cpt names such a timer by its kind alone, reading
//!   none of its fields);
//! - `semaphore/*`: the same for a semaphore's, which cpt reads wherever it
//!   is made (a pool's is made at start);
//! - `resource/read_only`: the sleep's with a layer that does nothing but read
//!   the span's fields with a visitor that keeps none of them: what reading
//!   tokio's type and place costs any layer (tracing's visitor: one dynamic
//!   call per field);
//! - `resource/read_and_keep`: the same layer also keeping a word per span
//!   in a table shared by the threads (one compare-and-swap at creation, a
//!   store at close): the least a layer that names resources by span pays;
//! - `poll/*`: one poll of a sleep (its spans entered, the event, exited),
//!   likewise;
//! - `request/*`: a traced request whose handler node waits four times
//!   (begin, the handler's five polls, finish with the path computed):
//!   `off` with no resources (what tokio emits without the cfg: the same
//!   request with the opt-in off), `on` with a sleep made per wait, polled
//!   pending before and ready after it;
//! - `registry/*`: the same two requests with the layer that does nothing:
//!   the difference is what tokio's own instrumentation costs, which is the
//!   user's choice and not cpt's.
//!
//! cpt's share of the opt-in is `request/on − request/off − (registry/on −
//! registry/off)`; the report gives it as a ratio to `request/off` too.
//!
//! With the feature off only `request/off` and `registry/off` run, with no
//! filter and on the bare registry: compared with an older tree, they are
//! what nothing but the code paths cost.
//!
//! ```text
//! cargo bench -p cpt-sdk --features tokio-resources --bench waits
//! ```
//!
//! `CPT_WAITS_COUNT=<case>:<iterations>` runs one case that many times and
//! nothing else, for instruction counts (which repeat on a shared machine,
//! unlike times), counted inside `run` alone and divided by N:
//!
//! ```text
//! CPT_WAITS_COUNT=request/off:5000 valgrind --tool=callgrind --toggle-collect=waits::run \
//!   target/release/deps/waits-<hash>
//! ```

use std::hint::black_box;
use std::time::Instant;

use cpt_sdk::Trigger;
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::request::{self, RequestOptions};
use tracing::Dispatch;
use tracing_subscriber::prelude::*;

/// Rounds per case; the median round is reported.
const ROUNDS: usize = 31;

/// A semaphore's resource span, as `Semaphore::new` makes it.
#[cfg(feature = "tokio-resources")]
fn semaphore(line: u32) -> tracing::Span {
    tracing::trace_span!(
        target: "tokio::sync::semaphore",
        parent: None,
        "runtime.resource",
        concrete_type = "Semaphore",
        kind = "Sync",
        loc.file = "app/src/pool.rs",
        loc.line = line,
        loc.col = 9u32,
        inherits_child_attrs = true,
    )
}

/// tokio's spans of one `tokio::time::sleep`, as `Sleep::new_timeout` makes
/// them.
#[cfg(feature = "tokio-resources")]
struct Sleep {
    resource: tracing::Span,
    async_op: tracing::Span,
    async_op_poll: tracing::Span,
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
fn sleep(line: u32) -> Sleep {
    let resource = resource(line);
    let async_op = tracing::trace_span!(
        target: "tokio::time::sleep",
        parent: &resource,
        "runtime.resource.async_op",
        source = "Sleep::new_timeout",
    );
    let async_op_poll = tracing::trace_span!(
        target: "tokio::time::sleep",
        parent: &async_op,
        "runtime.resource.async_op.poll",
    );
    Sleep {
        resource,
        async_op,
        async_op_poll,
    }
}

/// One poll of a sleep, as `Sleep::poll` makes it.
#[cfg(feature = "tokio-resources")]
fn poll(s: &Sleep, ready: bool) {
    let _res = s.resource.clone().entered();
    let _op = s.async_op.clone().entered();
    let _poll = s.async_op_poll.clone().entered();
    tracing::trace!(target: "runtime::resource::poll_op", op_name = "poll_elapsed", is_ready = ready);
}

/// One traced request: a handler node polled five times, waiting between
/// its polls, each wait on a new sleep when `named`.
fn request(named: bool) {
    let root = tracing::info_span!("request");
    request::begin(&root, RequestOptions::new(Some(Trigger::Sampled)));
    let handler = root.in_scope(|| tracing::info_span!("handle"));
    #[cfg(feature = "tokio-resources")]
    let mut waiting: Option<Sleep> = None;
    for i in 0..5u32 {
        let _in = handler.enter();
        #[cfg(feature = "tokio-resources")]
        if named {
            if let Some(s) = waiting.take() {
                poll(&s, true);
            }
            if i < 4 {
                let s = sleep(80 + i);
                poll(&s, false);
                waiting = Some(s);
            }
        }
        let _ = (named, i);
        black_box(&handler);
    }
    drop(handler);
    black_box(request::finish(&root));
}

/// A layer that reads each `runtime.resource` span's fields and keeps
/// nothing (`keep: false`): the floor of reading them; or that also keeps
/// a word per resource span in a table shared by the threads, taken with
/// one compare-and-swap at creation and given back at close (`keep:
/// true`): the floor of any layer that names resources by span.
#[cfg(feature = "tokio-resources")]
struct Floor {
    keep: bool,
    table: Box<[std::sync::atomic::AtomicU64]>,
}

#[cfg(feature = "tokio-resources")]
impl Floor {
    fn new(keep: bool) -> Floor {
        let table = (0..1 << 14).map(|_| Default::default()).collect();
        Floor { keep, table }
    }

    fn slot(&self, id: &tracing::span::Id) -> &std::sync::atomic::AtomicU64 {
        let h = (id.into_u64() & ((1 << 50) - 1)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.table[(h >> 50) as usize]
    }
}

#[cfg(feature = "tokio-resources")]
impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Floor {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        use std::sync::atomic::Ordering;
        struct Nothing;
        impl tracing::field::Visit for Nothing {
            fn record_str(&mut self, _: &tracing::field::Field, _: &str) {}
            fn record_u64(&mut self, _: &tracing::field::Field, _: u64) {}
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        if attrs.metadata().name() == "runtime.resource" {
            if self.keep {
                let _ = self.slot(id).compare_exchange(
                    0,
                    id.into_u64(),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
            attrs.record(&mut Nothing);
        }
    }

    fn on_close(&self, id: tracing::span::Id, _ctx: tracing_subscriber::layer::Context<'_, S>) {
        use std::sync::atomic::Ordering;
        if self.keep {
            let slot = self.slot(&id);
            if slot.load(Ordering::Relaxed) == id.into_u64() {
                slot.store(0, Ordering::Release);
            }
        }
    }
}

/// A case: its name, the subscriber it runs under, iterations per round,
/// and one iteration.
struct Case {
    name: &'static str,
    dispatch: Dispatch,
    iters: u64,
    run: Box<dyn FnMut()>,
}

/// `layer` on a registry, behind the filter the guide gives cpt's layer
/// when the feature is on (`NamedWaits` over INFO: so tokio's spans that
/// cpt does not read are not made at all, for any case).
fn filtered<L>(layer: L) -> Dispatch
where
    L: tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
{
    #[cfg(feature = "tokio-resources")]
    let layer = {
        use cpt_sdk::layer::filter::NamedWaits;
        use tracing_subscriber::filter::LevelFilter;
        layer.with_filter(NamedWaits::new(LevelFilter::INFO))
    };
    Dispatch::new(tracing_subscriber::registry().with(layer))
}

fn cases() -> Vec<Case> {
    let cpt = || {
        let (layer, _h) = CriticalPathLayer::builder().with_service("bench").build();
        filtered(layer)
    };
    // The baseline: the same spans made, no cpt (with the feature, behind
    // the same filter, on a layer that does nothing).
    #[cfg(feature = "tokio-resources")]
    let registry = || filtered(tracing_subscriber::layer::Identity::new());
    #[cfg(not(feature = "tokio-resources"))]
    let registry = || Dispatch::new(tracing_subscriber::registry());
    let case = |name, dispatch, iters, run: Box<dyn FnMut()>| Case {
        name,
        dispatch,
        iters,
        run,
    };
    #[cfg_attr(not(feature = "tokio-resources"), expect(unused_mut))]
    let mut cases = vec![
        case("request/off", cpt(), 5_000, Box::new(|| request(false))),
        case(
            "registry/off",
            registry(),
            5_000,
            Box::new(|| request(false)),
        ),
    ];
    #[cfg(feature = "tokio-resources")]
    {
        cases.push(case("request/on", cpt(), 5_000, Box::new(|| request(true))));
        cases.push(case(
            "registry/on",
            registry(),
            5_000,
            Box::new(|| request(true)),
        ));
        let new = || Box::new(|| drop(black_box(resource(7)))) as Box<dyn FnMut()>;
        let sem = || Box::new(|| drop(black_box(semaphore(40)))) as Box<dyn FnMut()>;
        // The sleep is made under the case's subscriber, at its first run.
        let polled = || {
            let mut s: Option<Sleep> = None;
            Box::new(move || poll(s.get_or_insert_with(|| sleep(7)), false)) as Box<dyn FnMut()>
        };
        cases.splice(
            0..0,
            [
                case("resource/registry", registry(), 100_000, new()),
                case("resource/cpt_untraced", cpt(), 100_000, new()),
                case("semaphore/registry", registry(), 100_000, sem()),
                case("semaphore/cpt_untraced", cpt(), 100_000, sem()),
                case(
                    "resource/read_only",
                    filtered(Floor::new(false)),
                    100_000,
                    new(),
                ),
                case(
                    "resource/read_and_keep",
                    filtered(Floor::new(true)),
                    100_000,
                    new(),
                ),
                case("poll/registry", registry(), 100_000, polled()),
                case("poll/cpt_untraced", cpt(), 100_000, polled()),
            ],
        );
    }
    cases
}

/// `CPT_WAITS_COUNT=<case>:<iterations>`: run one case that many times.
fn count(spec: &str) {
    let (name, n) = spec
        .split_once(':')
        .and_then(|(c, n)| Some((c, n.parse::<u64>().ok()?)))
        .unwrap_or_else(|| {
            panic!(
                "CPT_WAITS_COUNT must be <case>:<iterations>, e.g. request/off:20000; got {spec:?}"
            )
        });
    let mut cases = cases();
    let Some(c) = cases.iter_mut().find(|c| c.name == name) else {
        let names: Vec<_> = cases.iter().map(|c| c.name).collect();
        panic!("CPT_WAITS_COUNT: no case {name:?}; the cases are {names:?}");
    };
    let f = &mut c.run;
    tracing::dispatcher::with_default(&c.dispatch, || run(f, n));
}

/// `n` iterations of `c`: the function to count instructions in, so that
/// what runs once per process (quanta's calibration, the cases' set-up) is
/// left out (`valgrind --tool=callgrind --toggle-collect=waits::run`).
#[inline(never)]
fn run(f: &mut dyn FnMut(), n: u64) {
    for _ in 0..n {
        f();
    }
}

fn main() {
    if let Ok(spec) = std::env::var("CPT_WAITS_COUNT") {
        count(&spec);
        return;
    }
    let mut cases = cases();
    // Warm-up: a quarter round of each.
    for c in &mut cases {
        tracing::dispatcher::with_default(&c.dispatch, || {
            for _ in 0..c.iters / 4 {
                (c.run)();
            }
        });
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(ROUNDS); cases.len()];
    for _ in 0..ROUNDS {
        for (c, t) in cases.iter_mut().zip(&mut times) {
            tracing::dispatcher::with_default(&c.dispatch, || {
                let start = Instant::now();
                for _ in 0..c.iters {
                    (c.run)();
                }
                t.push(start.elapsed().as_nanos() as f64 / c.iters as f64);
            });
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (c, t) in cases.iter().zip(&times) {
        println!("{:<24} {:>10.1} ns", c.name, median(t.clone()));
    }
    let at = |n: &str| cases.iter().position(|c| c.name == n);
    // A difference of two cases is the median of its rounds' differences:
    // the two ran one after the other in each round, under the same load.
    let diff = |a: &str, b: &str| {
        let (a, b) = (at(a)?, at(b)?);
        Some(median(
            times[a].iter().zip(&times[b]).map(|(x, y)| x - y).collect(),
        ))
    };
    if let Some(d) = diff("resource/cpt_untraced", "resource/registry") {
        println!("cpt's share of a sleep's resource span outside traced requests: {d:.1} ns");
    }
    if let Some(d) = diff("semaphore/cpt_untraced", "semaphore/registry") {
        println!("cpt's share of a semaphore's resource span outside traced requests: {d:.1} ns");
    }
    let floors = [
        (
            "resource/read_only",
            "reading its fields, what any layer pays",
        ),
        (
            "resource/read_and_keep",
            "reading them and keeping a word by span id, the least a layer naming resources pays",
        ),
    ];
    for (case, what) in floors {
        if let Some(d) = diff(case, "resource/registry") {
            println!("  {what}: {d:.1} ns");
        }
    }
    if let Some(d) = diff("poll/cpt_untraced", "poll/registry") {
        println!(
            "cpt's share of a poll (3 spans entered, the event, exited) outside traced requests: {d:.1} ns"
        );
    }
    if let (Some(off), Some(on), Some(tokio)) = (
        at("request/off").map(|i| median(times[i].clone())),
        at("request/on").map(|i| median(times[i].clone())),
        diff("registry/on", "registry/off"),
    ) {
        let cpt = on - off - tokio;
        println!("a traced request, named waits on / off: {:.2}x", on / off);
        println!("  tokio's own spans: {tokio:.0} ns; cpt's share: {cpt:.0} ns");
        println!(
            "  the request with cpt's share alone / off: {:.2}x",
            (off + cpt) / off
        );
    }
}
