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
//! `compute/fig1_*`: requests shaped like the CPT Figure 1 system's (what
//! each service's layer computes on its response path): `fig1_c2` a 2-node
//! request of C, `fig1_c5` a 5-node one, `fig1_b` B's request splicing both
//! C paths under its two RPC nodes, `fig1_a` A's splicing B's and C's.
//!
//! `clock/*`: one reading of `SystemClock`, by the time-stamp counter and by
//! `Instant`.
//!
//! The ratios it reports: (3) / (4), and ((3) − (2)) / ((4) − (2)), what cpt
//! adds over the bare registry against what tracing-opentelemetry adds.
//! `CPT_LAYER_COUNT=<case>:<spans>` runs one `span/*` case for a fixed
//! number of spans without criterion, for instruction counts (see `count`).
//!
//! ```text
//! cargo bench -p cpt-benches --bench layer -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use cpt_sdk::Trigger;
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::path::compute::compute;
use cpt_sdk::path::graph::{Busy, CalleeOutcome, Graph, Node, NodeId};
use cpt_sdk::path::{CriticalPath, Frame as PathFrame};
use cpt_sdk::request::{self, RequestOptions};
use criterion::{BenchmarkId, Criterion, criterion_group};
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
    let root_frame = g.frame(PathFrame::new("A", "root"));
    let mut root = Node::new(root_frame, Duration::ZERO);
    root.first_poll = Some(Duration::ZERO);
    root.busy.push(Busy {
        start: Duration::ZERO,
        end: us(2 * k),
        nested: false,
    });
    let root = g.push(root);
    for i in 0..k {
        let frame = g.frame(PathFrame::new("A", format!("child{}", i % 17)));
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

/// One node of a Figure 1-like request, times in µs: `busy` as
/// `(start, end, nested)`; the first poll is the first busy start.
struct Spec<'a> {
    parent: Option<NodeId>,
    name: &'a str,
    line: u32,
    created: u64,
    end: Option<u64>,
    busy: &'a [(u64, u64, bool)],
    callee: Option<CriticalPath>,
}

fn add(g: &mut Graph, service: &str, spec: Spec<'_>) -> NodeId {
    let us = Duration::from_micros;
    // Frames as the layer makes them: service, span name, source location.
    let frame = g.frame(
        PathFrame::new(service, spec.name)
            .with_location(format!("{service}/src/handler.rs"), spec.line),
    );
    let mut node = Node::new(frame, us(spec.created));
    node.parent = spec.parent;
    node.first_poll = spec.busy.iter().map(|b| us(b.0)).min();
    node.end = spec.end.map(us);
    node.busy = spec
        .busy
        .iter()
        .map(|&(s, e, nested)| Busy {
            start: us(s),
            end: us(e),
            nested,
        })
        .collect();
    node.callee = spec.callee.map(CalleeOutcome::Path);
    g.push(node)
}

fn spec<'a>(
    parent: Option<NodeId>,
    name: &'a str,
    created: u64,
    end: Option<u64>,
    busy: &'a [(u64, u64, bool)],
) -> Spec<'a> {
    Spec {
        parent,
        name,
        line: 10 + name.len() as u32,
        created,
        end,
        busy,
        callee: None,
    }
}

/// A 2-node request of service C: the server span polls the handler once
/// inside its own polls, which wait on uninstrumented I/O in between.
fn fig1_c2() -> (Graph, NodeId, Duration) {
    let mut g = Graph::with_capacity(2);
    let root = add(
        &mut g,
        "C",
        spec(
            None,
            "grpc.server",
            0,
            None,
            &[(0, 4, false), (10, 16, false), (30, 34, false)],
        ),
    );
    add(
        &mut g,
        "C",
        spec(Some(root), "handle", 2, Some(13), &[(12, 13, true)]),
    );
    (g, root, Duration::from_micros(40))
}

/// A 5-node request of service C: server span, handler, two sequential
/// queries and a spawned task the handler waits for.
fn fig1_c5() -> (Graph, NodeId, Duration) {
    let mut g = Graph::with_capacity(5);
    let root = add(
        &mut g,
        "C",
        spec(
            None,
            "grpc.server",
            0,
            None,
            &[
                (0, 3, false),
                (20, 23, false),
                (60, 63, false),
                (80, 84, false),
            ],
        ),
    );
    let h = add(
        &mut g,
        "C",
        spec(
            Some(root),
            "handle",
            1,
            Some(83),
            &[(1, 2, true), (21, 22, true), (61, 62, true), (81, 83, true)],
        ),
    );
    add(
        &mut g,
        "C",
        spec(
            Some(h),
            "query",
            1,
            Some(21),
            &[(1, 2, true), (21, 21, true)],
        ),
    );
    add(
        &mut g,
        "C",
        spec(
            Some(h),
            "query2",
            21,
            Some(61),
            &[(22, 22, true), (61, 62, true)],
        ),
    );
    add(
        &mut g,
        "C",
        spec(
            Some(h),
            "spawned",
            62,
            Some(78),
            &[
                (64, 66, false),
                (67, 68, false),
                (69, 70, false),
                (71, 72, false),
                (74, 78, false),
            ],
        ),
    );
    (g, root, Duration::from_micros(90))
}

/// A request of service B: server span, handler, two RPCs to C whose
/// callee paths (`c1`, `c2`) come back, and a local task; each node is
/// polled about six times.
fn fig1_b(c1: CriticalPath, c2: CriticalPath) -> (Graph, NodeId, Duration) {
    let mut g = Graph::with_capacity(5);
    let root = add(
        &mut g,
        "B",
        spec(
            None,
            "grpc.server",
            0,
            None,
            &[
                (0, 5, false),
                (100, 105, false),
                (150, 155, false),
                (300, 305, false),
                (400, 405, false),
                (500, 510, false),
            ],
        ),
    );
    let h = add(
        &mut g,
        "B",
        spec(
            Some(root),
            "handle",
            0,
            Some(508),
            &[
                (1, 4, true),
                (101, 104, true),
                (151, 154, true),
                (301, 304, true),
                (401, 404, true),
                (501, 508, true),
            ],
        ),
    );
    let mut rpc1 = spec(
        Some(h),
        "C/Get",
        2,
        Some(102),
        &[(2, 3, true), (101, 102, true)],
    );
    rpc1.callee = Some(c1);
    add(&mut g, "B", rpc1);
    let mut rpc2 = spec(
        Some(h),
        "C/List",
        152,
        Some(302),
        &[(152, 153, true), (301, 302, true)],
    );
    rpc2.callee = Some(c2);
    add(&mut g, "B", rpc2);
    add(
        &mut g,
        "B",
        spec(
            Some(h),
            "merge",
            303,
            Some(490),
            &[
                (320, 330, false),
                (340, 350, false),
                (360, 370, false),
                (380, 390, false),
                (420, 440, false),
                (460, 490, false),
            ],
        ),
    );
    (g, root, Duration::from_micros(510))
}

/// A request of service A: server span, handler, an RPC to B (callee path
/// `b`) and one to C (`c`) in sequence, and a local task.
fn fig1_a(b: CriticalPath, c: CriticalPath) -> (Graph, NodeId, Duration) {
    let mut g = Graph::with_capacity(5);
    let busy: Vec<(u64, u64, bool)> = (0..8).map(|i| (i * 140, i * 140 + 6, false)).collect();
    let root = add(&mut g, "A", spec(None, "http.server", 0, None, &busy));
    let busy: Vec<(u64, u64, bool)> = (0..8).map(|i| (i * 140 + 1, i * 140 + 5, true)).collect();
    let h = add(&mut g, "A", spec(Some(root), "handle", 0, Some(985), &busy));
    let mut rpc_b = spec(
        Some(h),
        "B/Search",
        2,
        Some(562),
        &[
            (2, 3, true),
            (141, 142, true),
            (281, 282, true),
            (561, 562, true),
        ],
    );
    rpc_b.callee = Some(b);
    add(&mut g, "A", rpc_b);
    let mut rpc_c = spec(
        Some(h),
        "C/Get",
        562,
        Some(702),
        &[(562, 563, true), (701, 702, true)],
    );
    rpc_c.callee = Some(c);
    add(&mut g, "A", rpc_c);
    add(
        &mut g,
        "A",
        spec(
            Some(h),
            "render",
            703,
            Some(975),
            &[
                (710, 730, false),
                (740, 760, false),
                (780, 800, false),
                (850, 900, false),
                (910, 950, false),
                (960, 975, false),
            ],
        ),
    );
    (g, root, Duration::from_micros(990))
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
    let (c2, root, end) = fig1_c2();
    let path_c2 = compute(&c2, root, end);
    let (c5, root5, end5) = fig1_c5();
    let path_c5 = compute(&c5, root5, end5);
    let (b, root_b, end_b) = fig1_b(path_c2.clone(), path_c5.clone());
    let path_b = compute(&b, root_b, end_b);
    let (a, root_a, end_a) = fig1_a(path_b.clone(), path_c2.clone());
    let path_a = compute(&a, root_a, end_a);
    // The shapes the cases stand for (CPT Figure 1 as measured in the
    // layer: C ~9 and ~29 segments, B 57, A ~70).
    let lens = [&path_c2, &path_c5, &path_b, &path_a].map(|p| p.segments().len());
    assert_eq!(lens, [8, 22, 57, 88]);
    for (name, g, root, end) in [
        ("fig1_c2", &c2, root, end),
        ("fig1_c5", &c5, root5, end5),
        ("fig1_b", &b, root_b, end_b),
        ("fig1_a", &a, root_a, end_a),
    ] {
        group.bench_function(name, |bch| {
            bch.iter(|| black_box(compute(black_box(g), root, end)))
        });
    }
    group.finish();
}

/// `clock/*`: one reading of the default clock, by the time-stamp counter
/// (where the kernel keeps time with it) and by `Instant`: the layer reads
/// it three times per traced span.
fn clocks(c: &mut Criterion) {
    use cpt_sdk::clock::{Clock as _, SystemClock};
    let tsc = SystemClock::new();
    if tsc.uses_tsc() {
        c.bench_function("clock/system_tsc", |b| b.iter(|| black_box(&tsc).now()));
    }
    let std = SystemClock::std();
    c.bench_function("clock/system_instant", |b| b.iter(|| black_box(&std).now()));
}

criterion_group!(benches, spans, clocks, paths);

/// `CPT_LAYER_COUNT=<case>:<spans>`: run one `span/*` case for a fixed
/// number of spans, without criterion, and exit — for instruction counts,
/// which unlike times repeat on a shared machine:
///
/// ```text
/// perf stat -e instructions:u target/release/deps/layer-* --bench   # with CPT_LAYER_COUNT set
/// ```
///
/// (the count at `<spans>` minus the count at 0, divided by `<spans>`, is the
/// case's instructions per span).
fn count(spec: &str) {
    let (case, n) = spec
        .split_once(':')
        .and_then(|(c, n)| Some((c, n.parse::<u64>().ok()?)))
        .unwrap_or_else(|| {
            panic!(
                "CPT_LAYER_COUNT must be <case>:<spans>, e.g. 3_cpt_traced:1000000; got {spec:?}"
            )
        });
    let plain = |dispatch: Dispatch| {
        tracing::dispatcher::with_default(&dispatch, || {
            let parent = tracing::info_span!("parent");
            let _p = parent.enter();
            for _ in 0..n {
                one_span();
            }
        });
    };
    let traced = |end: fn(&tracing::Span)| {
        let (layer, _h) = CriticalPathLayer::builder().with_service("bench").build();
        let traced = Dispatch::new(tracing_subscriber::registry().with(layer));
        tracing::dispatcher::with_default(&traced, || {
            let mut done = 0;
            while done < n {
                let root = tracing::info_span!("root");
                request::begin(&root, RequestOptions::new(Some(Trigger::Sampled)));
                root.in_scope(|| {
                    let k = SPANS_PER_REQUEST.min(n - done);
                    for _ in 0..k {
                        one_span();
                    }
                    done += k;
                });
                end(&root);
            }
        });
    };
    match case {
        "1_registry" => plain(Dispatch::new(tracing_subscriber::registry())),
        "1b_registry_timing_floor" => plain(Dispatch::new(
            tracing_subscriber::registry().with(TimingFloor),
        )),
        "2_cpt_untraced" => {
            let (layer, _h) = CriticalPathLayer::builder().with_service("bench").build();
            plain(Dispatch::new(tracing_subscriber::registry().with(layer)));
        }
        "3_cpt_traced" => traced(|root| {
            black_box(request::finish(root));
        }),
        "3b_cpt_traced_recording_only" => traced(|root| {
            black_box(request::finish_detached(root));
        }),
        "4_otel" => {
            let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
            let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("bench"));
            plain(Dispatch::new(tracing_subscriber::registry().with(otel)));
        }
        other => panic!(
            "CPT_LAYER_COUNT: unknown case {other:?}; one of 1_registry, 1b_registry_timing_floor, \
             2_cpt_untraced, 3_cpt_traced, 3b_cpt_traced_recording_only, 4_otel"
        ),
    }
}

fn main() {
    if let Ok(spec) = std::env::var("CPT_LAYER_COUNT") {
        count(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
