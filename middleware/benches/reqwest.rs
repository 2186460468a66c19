//! What `ReqwestMiddleware` costs a reqwest call, side by side with its
//! baselines in one run.
//!
//! The calls never leave the process: the last middleware of each chain
//! answers with a canned response (`Canned`), so that what is measured is
//! the middleware chain, the response and reading its body, not loopback
//! networking (whose ~50 µs would bury a 1 µs difference in noise).
//!
//! | case | chain | subscriber |
//! |---|---|---|
//! | `untraced/bare` | `Canned` | `CriticalPathLayer`, no traced request |
//! | `untraced/cpt` | `ReqwestMiddleware`, `Canned` | the same |
//! | `traced/root_only` | none: a root begun and ended per iteration | `CriticalPathLayer` |
//! | `traced/cpt` | a root per iteration around `ReqwestMiddleware`, `Canned` answering with a callee path | the same |
//! | `traced/cpt_no_path` | the same, `Canned` answering without a path (a blind spot: no decode, no splice) | the same |
//! | `traced/otel_root_only` | none: a parent span per iteration | `tracing-opentelemetry` 0.34, SDK tracer provider, no exporter |
//! | `traced/otel` | a parent span around `reqwest-tracing`'s `TracingMiddleware`, `Canned` | the same |
//!
//! The traced cost of a call is `traced/cpt − traced/root_only` against
//! the peer's `traced/otel − traced/otel_root_only`.
//!
//! ```sh
//! cargo bench -p cpt-middleware --features reqwest --bench reqwest
//! ```

use std::time::Duration;

use base64::Engine as _;
use cpt_middleware::{ClientLayer, ReqwestMiddleware, header};
use cpt_sdk::request::{self, RequestOptions};
use cpt_sdk::{CriticalPath, Frame, SegmentKind, Trigger};
use std::hint::black_box;

use criterion::{Criterion, criterion_group};
use opentelemetry::trace::TracerProvider as _;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use tracing::{Dispatch, Instrument as _};
use tracing_subscriber::prelude::*;

/// The end of every chain: a 200 with a short body and `headers`.
#[derive(Clone)]
struct Canned(http::HeaderMap);

#[async_trait::async_trait]
impl Middleware for Canned {
    async fn handle(
        &self,
        _req: reqwest::Request,
        _extensions: &mut http::Extensions,
        _next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let mut resp = http::Response::new(reqwest::Body::from("42"));
        *resp.headers_mut() = self.0.clone();
        Ok(reqwest::Response::from(resp))
    }
}

/// A callee's path in its response headers as a callee answers this
/// middleware's `x-cpt-want-path: 2`: the frame dictionary (the same bytes
/// call after call, decoded once per thread) and the segments. Two frames,
/// three segments.
fn callee_path() -> http::HeaderMap {
    let mut path = CriticalPath::new();
    for (names, micros) in [(&["B"][..], 20), (&["B", "B1"][..], 300), (&["B"][..], 10)] {
        path.push_frames(
            names.iter().map(|n| Frame::new("B", *n)),
            Duration::from_micros(micros),
            SegmentKind::Busy,
        );
    }
    let split = cpt_sdk::codec::encode_split(&path, &Default::default());
    let base64 = |bytes: &[u8]| {
        base64::engine::general_purpose::STANDARD_NO_PAD
            .encode(bytes)
            .parse::<http::HeaderValue>()
            .expect("base64 is a header value")
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(header::FRAMES, base64(&split.frames));
    headers.insert(header::PATH, base64(&split.segments));
    headers
}

fn client(with: Option<impl Middleware>, canned: Canned) -> ClientWithMiddleware {
    let mut builder = ClientBuilder::new(reqwest::Client::new());
    if let Some(m) = with {
        builder = builder.with(m);
    }
    builder.with(canned).build()
}

async fn call(client: &ClientWithMiddleware) -> String {
    let resp = client
        .get("http://b.invalid/items/42")
        .send()
        .await
        .expect("the canned answer");
    resp.text().await.expect("the canned body")
}

fn cpt_dispatch() -> Dispatch {
    let (layer, _handle) = cpt_sdk::layer::CriticalPathLayer::builder()
        .with_service("A")
        .with_sink(|_| {})
        .build();
    Dispatch::new(tracing_subscriber::registry().with(layer))
}

/// A traced request's root per iteration, ended in the background as an
/// entry service ends it.
async fn in_root<F: std::future::Future>(f: F) -> F::Output {
    let root = tracing::info_span!(target: "cpt", "cpt.server");
    request::begin(
        &root,
        RequestOptions::new(Some(Trigger::Sampled))
            .with_service("A")
            .with_name("GET /a"),
    );
    let out = f.instrument(root.clone()).await;
    request::finish_detached(&root);
    out
}

/// The cases, by name: the subscriber each runs under, and one call.
struct Case {
    name: &'static str,
    otel: bool,
    run: Box<dyn Fn(&tokio::runtime::Runtime)>,
}

fn cases() -> Vec<Case> {
    let cpt = || ReqwestMiddleware::from(ClientLayer::http("B").with_caller_secret("s"));
    let bare = client(None::<Canned>, Canned(http::HeaderMap::new()));
    let with_cpt = client(Some(cpt()), Canned(http::HeaderMap::new()));
    let traced = client(Some(cpt()), Canned(callee_path()));
    // The callee returns no path: the same call without the merge (a blind
    // spot; its warning is rate-limited to one a minute).
    let blind = client(Some(cpt()), Canned(http::HeaderMap::new()));
    let peer = client(
        Some(reqwest_tracing::TracingMiddleware::default()),
        Canned(http::HeaderMap::new()),
    );
    let parent = || tracing::info_span!("GET /a");
    let case = |name, otel, run: Box<dyn Fn(&tokio::runtime::Runtime)>| Case { name, otel, run };
    vec![
        case(
            "untraced/bare",
            false,
            Box::new(move |rt| {
                black_box(rt.block_on(call(&bare)));
            }),
        ),
        case(
            "untraced/cpt",
            false,
            Box::new(move |rt| {
                black_box(rt.block_on(call(&with_cpt)));
            }),
        ),
        case(
            "traced/root_only",
            false,
            Box::new(|rt| {
                rt.block_on(in_root(async {}));
            }),
        ),
        case(
            "traced/cpt",
            false,
            Box::new(move |rt| {
                black_box(rt.block_on(in_root(call(&traced))));
            }),
        ),
        case(
            "traced/cpt_no_path",
            false,
            Box::new(move |rt| {
                black_box(rt.block_on(in_root(call(&blind))));
            }),
        ),
        case(
            "traced/otel_root_only",
            true,
            Box::new(move |rt| {
                rt.block_on(async {}.instrument(parent()));
            }),
        ),
        case(
            "traced/otel",
            true,
            Box::new(move |rt| {
                black_box(rt.block_on(call(&peer).instrument(parent())));
            }),
        ),
    ]
}

fn otel_dispatch() -> Dispatch {
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("bench"));
    Dispatch::new(tracing_subscriber::registry().with(otel))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let (cpt, otel) = (cpt_dispatch(), otel_dispatch());
    let mut g = c.benchmark_group("reqwest");
    for case in cases() {
        let dispatch = if case.otel { &otel } else { &cpt };
        tracing::dispatcher::with_default(dispatch, || {
            g.bench_function(case.name, |b| b.iter(|| (case.run)(&rt)));
        });
    }
    g.finish();
}

/// `CPT_REQWEST_COUNT=<case>:<calls>`: run one case `<calls>` times without
/// criterion and exit, for instruction counts (which, unlike times, repeat
/// on a shared machine): the count at `<calls>` minus the count at 0,
/// divided by `<calls>`, is the case's instructions per call.
///
/// ```text
/// CPT_REQWEST_COUNT=traced/cpt:20000 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
///     target/release/deps/reqwest-<hash> --bench
/// ```
fn count(spec: &str) {
    let (name, n) = spec
        .split_once(':')
        .and_then(|(c, n)| Some((c, n.parse::<u64>().ok()?)))
        .unwrap_or_else(|| panic!("CPT_REQWEST_COUNT must be <case>:<calls>; got {spec:?}"));
    let rt = runtime();
    let case = cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name:?}"));
    let dispatch = if case.otel {
        otel_dispatch()
    } else {
        cpt_dispatch()
    };
    tracing::dispatcher::with_default(&dispatch, || {
        for _ in 0..n {
            (case.run)(&rt);
        }
    });
}

criterion_group!(benches, bench);

fn main() {
    if let Ok(spec) = std::env::var("CPT_REQWEST_COUNT") {
        count(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
