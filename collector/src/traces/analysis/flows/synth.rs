//! Synthetic traces of programs whose execution flow is known, for testing
//! and benchmarking the estimators on shapes the repository's recorded
//! trace sets do not have.
//!
//! - [`page`]: a front end that checks a session, fans out to three
//!   services at once and renders when all three are back: five calls to
//!   five services, each its own process and host. Made in either
//!   [`Shape`]: with the caller's client spans (the server span of each
//!   call under a client span on the caller's host, network time between
//!   them), or server-only (each server span directly under its caller's
//!   server span, the common setup where only servers are instrumented).
//! - [`rare_sequential`]: a parent with two calls that run at once, except
//!   in a few invocations where they run one after the other with very
//!   variable latencies (the pattern that captures Mann's nearest-neighbour
//!   distance, see [`NnChoice`](super::NnChoice)).
//!
//! Everything is seeded (SplitMix64): one seed, one set of traces.

use std::sync::Arc;

use crate::traces::model::{BuildOptions, RawSpan, SpanKind, Trace, build};

/// Whether the caller's client spans are in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Each call is a client span on the caller's host with the callee's
    /// server span under it.
    WithClients,
    /// Each callee's server span is directly under its caller's span.
    ServerOnly,
}

/// SplitMix64 with a standard normal draw (Box–Muller).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `(0, 1]`.
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// A standard normal draw.
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// `median · e^(sigma·N(0,1))` µs, rounded to whole µs (at least 1).
    pub fn lognormal_us(&mut self, median_us: f64, sigma: f64) -> i64 {
        ((median_us * (sigma * self.normal()).exp()).round() as i64).max(1)
    }
}

/// The first trace's start, µs since the Unix epoch (2023-11-14).
const EPOCH_US: i64 = 1_700_000_000_000_000;
/// Traces start this far apart, µs.
const SPACING_US: i64 = 1_000_000;
/// One-way network time of a call in [`Shape::WithClients`], µs.
pub const NETWORK_US: i64 = 100;

/// Spans of one trace under construction, times in µs.
struct Builder {
    spans: Vec<RawSpan<'static>>,
}

impl Builder {
    #[allow(clippy::too_many_arguments)]
    fn span(
        &mut self,
        id: String,
        parent: Option<String>,
        service: &str,
        operation: &str,
        kind: SpanKind,
        start_us: i64,
        dur_us: i64,
    ) -> String {
        self.spans.push(RawSpan {
            id: id.clone().into(),
            parent_id: parent.map(Into::into),
            service: Arc::from(service),
            operation: Arc::from(operation),
            start_ns: Some(start_us * 1000),
            duration_ns: Some(dur_us * 1000),
            kind,
            clock: Arc::from(format!("{service}-host")),
            error: false,
            follows_from: false,
        });
        id
    }

    /// A call from `parent` (a span of `caller`) to `service`'s
    /// `operation`, whose server side runs `[start, start + dur)` µs:
    /// the server span, under a client span on the caller's host in
    /// [`Shape::WithClients`].
    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        shape: Shape,
        parent: &str,
        caller: &str,
        service: &str,
        operation: &str,
        start_us: i64,
        dur_us: i64,
    ) {
        let id = format!("{parent}.{service}");
        let under = match shape {
            Shape::ServerOnly => parent.to_owned(),
            Shape::WithClients => self.span(
                format!("{id}.c"),
                Some(parent.to_owned()),
                caller,
                &format!("call {service}"),
                SpanKind::Client,
                start_us - NETWORK_US,
                dur_us + 2 * NETWORK_US,
            ),
        };
        self.span(
            id,
            Some(under),
            service,
            operation,
            SpanKind::Server,
            start_us,
            dur_us,
        );
    }
}

/// `n` traces of the page program in `shape`, seeded by `seed`: the same
/// seed gives the same requests (latencies, timings) in both shapes.
///
/// `frontend:GET /home` works 300 µs, calls `auth:/check` (median 2 ms),
/// works 200 µs, calls `catalog:/list` (8 ms), `prices:/quote` (5 ms) and
/// `reviews:/top` (6 ms) at once, then `render:/page` (3 ms) when the last
/// of them is back, and returns 150 µs later. Latencies are lognormal
/// (σ 0.35); times as the caller sees them include [`NETWORK_US`] each way.
pub fn page(n: usize, seed: u64, shape: Shape) -> Vec<Trace> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|k| {
            let mut b = Builder { spans: Vec::new() };
            let t0 = EPOCH_US + k as i64 * SPACING_US;
            let root = format!("{k:x}");
            let net = NETWORK_US;
            let auth = rng.lognormal_us(2_000.0, 0.35);
            let fan = [
                ("catalog", "/list", rng.lognormal_us(8_000.0, 0.35)),
                ("prices", "/quote", rng.lognormal_us(5_000.0, 0.35)),
                ("reviews", "/top", rng.lognormal_us(6_000.0, 0.35)),
            ];
            let render = rng.lognormal_us(3_000.0, 0.35);
            // Caller-side times: a call to `s` occupies [s - net, s + d + net].
            let auth_start = t0 + 300 + net;
            let fan_start = auth_start + auth + net + 200 + net;
            let fan_end = fan
                .iter()
                .map(|f| fan_start + f.2 + net)
                .max()
                .unwrap_or(fan_start);
            let render_start = fan_end + net;
            let end = render_start + render + net + 150;
            b.span(
                root.clone(),
                None,
                "frontend",
                "GET /home",
                SpanKind::Server,
                t0,
                end - t0,
            );
            b.call(shape, &root, "frontend", "auth", "/check", auth_start, auth);
            for (svc, op, d) in fan {
                b.call(shape, &root, "frontend", svc, op, fan_start, d);
            }
            b.call(
                shape,
                &root,
                "frontend",
                "render",
                "/page",
                render_start,
                render,
            );
            build(&format!("page{k:x}"), b.spans, BuildOptions::default())
                .expect("a generated trace is valid")
        })
        .collect()
}

/// `n` traces of a batch endpoint whose two calls `a` and `b` normally run
/// at once, except in `rare.0` invocations (`a` then `b`) and `rare.1`
/// invocations (`b` then `a`) spread through the set, where they run one
/// after the other, with a pause between them, and very variable
/// latencies and pauses (lognormal σ 1.2 instead of 0.25). Around them: `prep` before, `store` and `audit` after (five
/// calls). Server-only shape. Seeded by `seed`.
pub fn rare_sequential(n: usize, seed: u64, rare: (usize, usize)) -> Vec<Trace> {
    let mut rng = Rng::new(seed);
    let every = |m: usize| n.checked_div(m).map_or(usize::MAX, |e| e.max(1));
    let (ea, eb) = (every(rare.0), every(rare.1));
    (0..n)
        .map(|k| {
            let mut b = Builder { spans: Vec::new() };
            let t0 = EPOCH_US + k as i64 * SPACING_US;
            let root = format!("{k:x}");
            let shape = Shape::ServerOnly;
            // Which flow: a rare one at regular spots (offset so the two
            // rare flows do not collide).
            let flow = if ea != usize::MAX && k % ea == ea / 2 {
                1
            } else if eb != usize::MAX && k % eb == eb / 3 {
                2
            } else {
                0
            };
            let sigma = if flow == 0 { 0.25 } else { 1.2 };
            let prep = rng.lognormal_us(1_000.0, 0.25);
            let a = rng.lognormal_us(4_000.0, sigma);
            let bb = rng.lognormal_us(3_000.0, sigma);
            let store = rng.lognormal_us(1_500.0, 0.25);
            let audit = rng.lognormal_us(500.0, 0.25);
            let gap = rng.lognormal_us(500.0, sigma);
            let prep_start = t0 + 100;
            let mid = prep_start + prep + 100;
            let (a_start, b_start, mid_end) = match flow {
                0 => (mid, mid, mid + a.max(bb)),
                1 => (mid, mid + a + gap, mid + a + gap + bb),
                _ => (mid + bb + gap, mid, mid + bb + gap + a),
            };
            let store_start = mid_end + 100;
            let audit_start = store_start + store + 50;
            let end = audit_start + audit + 100;
            b.span(
                root.clone(),
                None,
                "api",
                "POST /batch",
                SpanKind::Server,
                t0,
                end - t0,
            );
            for (svc, op, s, d) in [
                ("prep", "/load", prep_start, prep),
                ("a", "/work", a_start, a),
                ("b", "/work", b_start, bb),
                ("store", "/put", store_start, store),
                ("audit", "/log", audit_start, audit),
            ] {
                b.call(shape, &root, "api", svc, op, s, d);
            }
            build(&format!("batch{k:x}"), b.spans, BuildOptions::default())
                .expect("a generated trace is valid")
        })
        .collect()
}

/// `traces` as one Jaeger query-service JSON document (`{"data": [...]}`),
/// times in µs, one process per (service, clock domain) with a `hostname`
/// tag naming the domain, `span.kind` tags and `CHILD_OF` /
/// `FOLLOWS_FROM` references: what `cpt traces … --from jaeger` reads.
pub fn jaeger_json(traces: &[Trace]) -> String {
    use serde_json::json;
    let data: Vec<serde_json::Value> = traces
        .iter()
        .map(|t| {
            let mut procs: Vec<(Arc<str>, u32)> = Vec::new();
            let spans: Vec<serde_json::Value> = t
                .spans
                .iter()
                .map(|s| {
                    let key = (s.service.clone(), s.clock);
                    let p = match procs.iter().position(|k| *k == key) {
                        Some(p) => p,
                        None => {
                            procs.push(key);
                            procs.len() - 1
                        }
                    };
                    let refs: Vec<serde_json::Value> = s
                        .parent
                        .map(|p| {
                            json!({
                                "refType": if s.detached { "FOLLOWS_FROM" } else { "CHILD_OF" },
                                "traceID": &*t.trace_id,
                                "spanID": &*t.spans[p as usize].span_id,
                            })
                        })
                        .into_iter()
                        .collect();
                    let mut tags = Vec::new();
                    if !matches!(s.kind, SpanKind::Unspecified) {
                        tags.push(json!({"key": "span.kind", "type": "string", "value": s.kind.to_string()}));
                    }
                    json!({
                        "traceID": &*t.trace_id,
                        "spanID": &*s.span_id,
                        "operationName": &*s.operation,
                        "references": refs,
                        "startTime": s.start_ns / 1000,
                        "duration": s.duration_ns / 1000,
                        "tags": tags,
                        "logs": [],
                        "processID": format!("p{p}"),
                    })
                })
                .collect();
            let processes: serde_json::Map<String, serde_json::Value> = procs
                .iter()
                .enumerate()
                .map(|(i, (svc, clock))| {
                    (
                        format!("p{i}"),
                        json!({"serviceName": &**svc, "tags": [
                            {"key": "hostname", "type": "string", "value": format!("host{clock}")}
                        ]}),
                    )
                })
                .collect();
            json!({"traceID": &*t.trace_id, "spans": spans, "processes": processes})
        })
        .collect();
    serde_json::to_string(
        &json!({"data": data, "total": 0, "limit": 0, "offset": 0, "errors": null}),
    )
    .expect("JSON of plain values")
}
