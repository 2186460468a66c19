//! The global layer, traced callers, and the callees every pair shares:
//! axum and actix-web services with a 5 ms `work` span, a slow route, a
//! streaming route, and the same services without cpt (no path).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cpt_middleware::{ActixServer, ServerLayer, SharedSecret};
use cpt_sdk::layer::{CriticalPathLayer, Handle};
use cpt_sdk::request::{Finished, RequestOptions};
use cpt_sdk::testing::RecordingSink;
use cpt_sdk::testing::log::LogBuffer;
use cpt_sdk::{CriticalPath, Record, SegmentKind, Trigger};
use tracing::Instrument;
use tracing_subscriber::prelude::*;

pub(crate) const SECRET: &str = "frameworks-secret";
pub(crate) const WORK: Duration = Duration::from_millis(5);
pub(crate) const SLOW: Duration = Duration::from_millis(400);
pub(crate) const CHUNK_GAP: Duration = Duration::from_millis(15);

/// The process's layer (installed once, globally) and what it recorded.
pub(crate) fn layer() -> &'static (RecordingSink, Handle) {
    static LAYER: OnceLock<(RecordingSink, Handle)> = OnceLock::new();
    LAYER.get_or_init(|| {
        let sink = RecordingSink::new();
        let (layer, handle) = CriticalPathLayer::builder()
            .with_service("frameworks")
            .with_sink(sink.clone())
            .build();
        let writer = log().clone();
        tracing_subscriber::registry()
            .with(layer)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(move || writer.clone())
                    .with_filter(tracing_subscriber::filter::LevelFilter::WARN),
            )
            .with(tracing_subscriber::filter::LevelFilter::INFO)
            .init();
        (sink, handle)
    })
}

/// What the process logged at `WARN` and above (every test's: read the
/// lines that name your own services).
pub(crate) fn log() -> &'static LogBuffer {
    static LOG: OnceLock<LogBuffer> = OnceLock::new();
    LOG.get_or_init(LogBuffer::default)
}

/// The middleware's warnings (`cpt:` lines) that name `name`.
pub(crate) fn warnings_naming(name: &str) -> Vec<String> {
    log()
        .lines_with("cpt: ")
        .into_iter()
        .filter(|l| l.contains(" WARN ") && l.contains(name))
        .collect()
}

/// A current-thread runtime under the global layer.
pub(crate) fn rt() -> tokio::runtime::Runtime {
    layer();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}

/// The records of `service` once there are `n` (up to 5 s).
pub(crate) async fn records_of(service: &str, n: usize) -> Vec<Record> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found: Vec<Record> = layer()
            .0
            .records()
            .into_iter()
            .filter(|r| r.service == service)
            .collect();
        if found.len() >= n || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Run `f` as a traced request of service `caller` (root `call`), as an
/// entry service's handler runs; its finished path.
pub(crate) async fn traced<F: Future>(caller: &str, f: F) -> (F::Output, Finished) {
    let root = tracing::info_span!(target: "cpt", "cpt.server");
    cpt_sdk::request::begin(
        &root,
        RequestOptions::new(Some(Trigger::Sampled))
            .with_service(caller.to_owned())
            .with_name("call")
            .with_emit_record(false),
    );
    let out = f.instrument(root.clone()).await;
    let finished = cpt_sdk::request::finish(&root).expect("the root of a traced request");
    (out, finished)
}

/// A segment as `(["service:name", …], duration, kind)`.
pub(crate) type View = (Vec<String>, Duration, SegmentKind);

pub(crate) fn view(path: &CriticalPath) -> Vec<View> {
    path.segments()
        .iter()
        .map(|s| {
            let stack = path
                .stack_frames(s)
                .map(|f| format!("{}:{}", f.service, f.name))
                .collect();
            (stack, s.duration, s.kind)
        })
        .collect()
}

pub(crate) fn time_where(path: &CriticalPath, pred: impl Fn(&View) -> bool) -> Duration {
    view(path).iter().filter(|s| pred(s)).map(|s| s.1).sum()
}

pub(crate) fn show(path: &CriticalPath) -> String {
    view(path)
        .iter()
        .map(|(s, d, k)| format!("  {d:>12?} {:<12} {}\n", k.as_str(), s.join(" > ")))
        .collect()
}

/// The path sums to the latency, to the nanosecond.
pub(crate) fn assert_sums(path: &CriticalPath, latency: Duration) {
    assert_eq!(
        path.total(),
        latency,
        "the path sums to the latency\n{}",
        show(path)
    );
}

/// The callee's path merged under the RPC frame `rpc`: its `work` span, at
/// least [`WORK`], and no blind spot.
pub(crate) fn assert_merged(path: &CriticalPath, rpc: &str, callee: &str, route: &str) {
    let work = time_where(path, |(s, _, _)| {
        s.iter().any(|f| f.ends_with(rpc))
            && s.contains(&format!("{callee}:{route}"))
            && s.contains(&format!("{callee}:work"))
    });
    assert!(work >= WORK, "{callee}'s work under {rpc}\n{}", show(path));
    assert!(
        view(path).iter().all(|s| s.2 != SegmentKind::BlindSpot),
        "{}",
        show(path)
    );
}

/// The call is one blind-spot leaf under the RPC frame, of at least `at_least`.
pub(crate) fn assert_blind_spot(path: &CriticalPath, rpc: &str, at_least: Duration) {
    let blind = time_where(path, |(s, _, k)| {
        *k == SegmentKind::BlindSpot && s.iter().any(|f| f.ends_with(rpc))
    });
    assert!(
        blind >= at_least && blind > Duration::ZERO,
        "a blind spot of at least {at_least:?} under {rpc}\n{}",
        show(path)
    );
}

/// The callee's handler: 5 ms in a `work` span.
pub(crate) async fn work() {
    tokio::time::sleep(WORK)
        .instrument(tracing::info_span!("work"))
        .await;
}

/// An address nothing listens on.
pub(crate) fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

/// Which cpt the callee runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cpt {
    /// An internal service trusting [`SECRET`].
    Internal,
    /// No cpt middleware: it never returns a path.
    None,
}

// === axum ===

/// An axum service `service`: `GET /items/{id}` (5 ms of work),
/// `GET /slow` ([`SLOW`]), `GET /stream` (three chunks [`CHUNK_GAP`] apart).
pub(crate) async fn serve_axum(service: &'static str, cpt: Cpt) -> SocketAddr {
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/items/{id}",
            get(
                |axum::extract::Path(id): axum::extract::Path<u64>| async move {
                    work().await;
                    id.to_string()
                },
            ),
        )
        .route("/slow", get(|| tokio::time::sleep(SLOW)))
        .route(
            "/stream",
            get(|| async {
                let chunks = futures_util::stream::unfold(0, |i| async move {
                    if i == 3 {
                        return None;
                    }
                    tokio::time::sleep(CHUNK_GAP).await;
                    Some((
                        Ok::<_, std::io::Error>(bytes::Bytes::from(format!("chunk {i}\n"))),
                        i + 1,
                    ))
                });
                axum::body::Body::from_stream(chunks)
            }),
        );
    let app = match cpt {
        Cpt::Internal => app.layer(
            ServerLayer::http(service)
                .internal()
                .with_trust(SharedSecret::new(SECRET)),
        ),
        Cpt::None => app,
    };
    serve_router(app).await
}

/// Serve an axum router on 127.0.0.1, on this runtime.
pub(crate) async fn serve_router(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

// === actix-web ===

/// An actix-web server of the apps `app` makes, on 127.0.0.1, one worker,
/// on a system (a thread) of its own.
pub(crate) fn spawn_actix<F, T, B>(app: F) -> SocketAddr
where
    F: Fn() -> actix_web::App<T> + Send + Clone + 'static,
    T: actix_web::dev::ServiceFactory<
            actix_web::dev::ServiceRequest,
            Config = (),
            Response = actix_web::dev::ServiceResponse<B>,
            Error = actix_web::Error,
            InitError = (),
        > + 'static,
    B: actix_web::body::MessageBody + 'static,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            actix_web::HttpServer::new(app)
                .workers(1)
                .listen(listener)
                .expect("listen")
                .run()
                .await
        })
    });
    addr
}

/// The same service on actix-web.
pub(crate) fn serve_actix(service: &'static str, cpt: Cpt) -> SocketAddr {
    spawn_actix(move || {
        let cpt_layer = ServerLayer::http(service)
            .internal()
            .with_trust(SharedSecret::new(SECRET));
        actix_web::App::new()
            .wrap(actix_web::middleware::Condition::new(
                cpt == Cpt::Internal,
                ActixServer::from(cpt_layer),
            ))
            .configure(actix_routes)
    })
}

/// `GET /items/{id}`, `GET /slow`, `GET /stream`, as [`serve_axum`].
pub(crate) fn actix_routes(cfg: &mut actix_web::web::ServiceConfig) {
    use actix_web::{HttpResponse, web};
    cfg.route(
        "/items/{id}",
        web::get().to(|id: web::Path<u64>| async move {
            work().await;
            id.to_string()
        }),
    )
    .route(
        "/slow",
        web::get().to(|| async {
            tokio::time::sleep(SLOW).await;
            HttpResponse::Ok().finish()
        }),
    )
    .route(
        "/stream",
        web::get().to(|| async {
            let chunks = futures_util::stream::unfold(0, |i| async move {
                if i == 3 {
                    return None;
                }
                tokio::time::sleep(CHUNK_GAP).await;
                Some((
                    Ok::<_, actix_web::Error>(bytes::Bytes::from(format!("chunk {i}\n"))),
                    i + 1,
                ))
            });
            HttpResponse::Ok().streaming(chunks)
        }),
    );
}
