//! Per-span cost of the critical-path layer, side by side with its
//! baselines in one run, and the cost of computing paths.
//!
//! `span/*`: create, enter, exit and close one span inside a parent span:
//! 1. `registry` — bare `tracing_subscriber::Registry`;
//! 2. `cpt_untraced` — Registry + `CriticalPathLayer`, no traced request
//!    anywhere (the common case: one atomic load per callback);
//!    `cpt_untraced_busy` — the same while another request is traced (the
//!    parent's extensions are read);
//! 3. `cpt_traced` — inside a traced request: requests of 100 spans each,
//!    including `begin` and `finish` (the path computation) amortised;
//!    `cpt_traced_recording_only` — the same ended with `finish_detached`
//!    and no sink, so no path is computed: the recording alone;
//! 4. `otel` — Registry + `tracing-opentelemetry` with an SDK tracer
//!    provider and no exporter.
//!
//! `span/1b_registry_timing_floor` is the least any layer that times spans
//! on the Registry does (an extension per span, a clock read at creation,
//! enter and exit): the floor under case 3 for a layer on the Registry.
//!
//! `compute/N`: the backwards walk over a request whose path has N segments.
//!
//! Targets: (2) ≤ 1.05 × (1), (3) ≤ 0.25 × (4).
//!
//! ```text
//! cargo bench -p cpt-benches --bench layer -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use cpt_sdk::Trigger;
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::path::Frame;
use cpt_sdk::path::compute::{Busy, Graph, Node, NodeId, compute};
use cpt_sdk::request::{self, RequestOptions};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use opentelemetry::trace::TracerProvider as _;
use tracing::Dispatch;
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;

const SPANS_PER_REQUEST: u64 = 100;

fn one_span() {
    let span = tracing::info_span!("child");
    let _g = span.enter();
    black_box(&span);
}

/// The least a span-timing layer does: one extension per span, written at
/// creation, enter and exit, each with a clock reading, and read at close.
struct TimingFloor;

struct Timing {
    entered: Instant,
    busy: Duration,
}

impl<S> tracing_subscriber::Layer<S> for TimingFloor
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(&self, _: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Timing {
                entered: Instant::now(),
                busy: Duration::ZERO,
            });
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(t) = span.extensions_mut().get_mut::<Timing>()
        {
            t.entered = Instant::now();
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(t) = span.extensions_mut().get_mut::<Timing>()
        {
            t.busy += t.entered.elapsed();
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            black_box(span.extensions().get::<Timing>().map(|t| t.busy));
        }
    }
}

fn bench_plain(c: &mut Criterion, name: &str, dispatch: Dispatch) {
    tracing::dispatcher::with_default(&dispatch, || {
        let parent = tracing::info_span!("parent");
        let _p = parent.enter();
        c.bench_function(name, |b| b.iter(one_span));
    });
}

/// Requests of [`SPANS_PER_REQUEST`] spans under a fresh layer, each ended
/// by `end`; the time per span.
fn bench_traced(c: &mut Criterion, name: &str, end: fn(&tracing::Span)) {
    let (layer, _h) = CriticalPathLayer::builder().with_service("bench").build();
    let traced = Dispatch::new(tracing_subscriber::registry().with(layer));
    tracing::dispatcher::with_default(&traced, || {
        c.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                let mut done = 0;
                while done < iters {
                    let root = tracing::info_span!("root");
                    request::begin(&root, RequestOptions::new(Some(Trigger::Sampled)));
                    root.in_scope(|| {
                        let n = SPANS_PER_REQUEST.min(iters - done);
                        for _ in 0..n {
                            one_span();
                        }
                        done += n;
                    });
                    end(&root);
                }
                start.elapsed()
            })
        });
    });
}

fn spans(c: &mut Criterion) {
    // Warm the allocator, the slab pages and the CPU before the first case,
    // which otherwise measures start-up noise.
    tracing::dispatcher::with_default(&Dispatch::new(tracing_subscriber::registry()), || {
        let parent = tracing::info_span!("parent");
        let _p = parent.enter();
        for _ in 0..2_000_000 {
            one_span();
        }
    });
    bench_plain(
        c,
        "span/1_registry",
        Dispatch::new(tracing_subscriber::registry()),
    );

    bench_plain(
        c,
        "span/1b_registry_timing_floor",
        Dispatch::new(tracing_subscriber::registry().with(TimingFloor)),
    );

    let (layer, _h) = CriticalPathLayer::builder().with_service("bench").build();
    bench_plain(
        c,
        "span/2_cpt_untraced",
        Dispatch::new(tracing_subscriber::registry().with(layer)),
    );

    let (layer, _h) = CriticalPathLayer::builder().with_service("bench").build();
    let busy = Dispatch::new(tracing_subscriber::registry().with(layer));
    tracing::dispatcher::with_default(&busy, || {
        let other = tracing::info_span!("other_request");
        request::begin(&other, RequestOptions::new(Some(Trigger::Sampled)));
        let parent = tracing::info_span!("parent");
        let _p = parent.enter();
        c.bench_function("span/2b_cpt_untraced_busy", |b| b.iter(one_span));
        request::finish(&other);
    });

    bench_traced(c, "span/3_cpt_traced", |root| {
        black_box(request::finish(root));
    });
    // The same requests ended with `finish_detached` and no sink: the
    // recording alone, which is what an entry point's request path pays
    // (its path is computed on the layer's background thread).
    bench_traced(c, "span/3b_cpt_traced_recording_only", |root| {
        black_box(request::finish_detached(root));
    });

    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("bench"));
    bench_plain(
        c,
        "span/4_otel",
        Dispatch::new(tracing_subscriber::registry().with(otel)),
    );
}

/// A root that alternates its own work with sequential children: `2k`
/// segments.
fn sequential_graph(k: u64) -> (Graph, NodeId, Duration) {
    let us = Duration::from_micros;
    let mut g = Graph::new();
    let root_frame = g.frame(Frame::new("A", "root"));
    let mut root = Node::new(root_frame, Duration::ZERO);
    root.first_poll = Some(Duration::ZERO);
    root.busy.push(Busy {
        start: Duration::ZERO,
        end: us(2 * k),
        nested: false,
    });
    let root = g.push(root);
    for i in 0..k {
        let frame = g.frame(Frame::new("A", format!("child{}", i % 17)));
        let mut child = Node::new(frame, us(2 * i + 1));
        child.parent = Some(root);
        child.first_poll = Some(us(2 * i + 1));
        child.end = Some(us(2 * i + 2));
        child.busy.push(Busy {
            start: us(2 * i + 1),
            end: us(2 * i + 2),
            nested: true,
        });
        g.push(child);
    }
    (g, root, us(2 * k))
}

fn paths(c: &mut Criterion) {
    let mut group = c.benchmark_group("compute");
    for segments in [10u64, 100, 1000] {
        let (g, root, end) = sequential_graph(segments / 2);
        assert_eq!(compute(&g, root, end).segments().len() as u64, segments);
        group.bench_with_input(BenchmarkId::from_parameter(segments), &g, |b, g| {
            b.iter(|| black_box(compute(g, root, end)))
        });
    }
    group.finish();
}

criterion_group!(benches, spans, paths);
criterion_main!(benches);
