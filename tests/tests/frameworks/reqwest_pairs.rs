//! reqwest → axum and reqwest → actix-web through `ReqwestMiddleware`.

use std::net::SocketAddr;
use std::time::Duration;

use cpt_middleware::{ClientLayer, ReqwestMiddleware, Route};
use futures_util::StreamExt as _;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

use crate::support::*;

#[derive(Clone, Copy, Debug)]
enum Server {
    Axum,
    Actix,
}

async fn start(server: Server, service: &'static str, cpt: Cpt) -> SocketAddr {
    match server {
        Server::Axum => serve_axum(service, cpt).await,
        Server::Actix => serve_actix(service, cpt),
    }
}

/// How long a call may take before the client gives up, in the timeout
/// cases; the others wait this long, as generous as a loaded machine needs.
const TIMEOUT: Duration = Duration::from_millis(100);
const PATIENT: Duration = Duration::from_secs(10);

/// A reqwest client to `callee` with cpt's middleware (sending `secret`),
/// and that middleware (for its stats).
fn client(callee: &'static str, secret: &str) -> (ClientWithMiddleware, ReqwestMiddleware) {
    client_with_timeout(callee, secret, PATIENT)
}

fn client_with_timeout(
    callee: &'static str,
    secret: &str,
    timeout: Duration,
) -> (ClientWithMiddleware, ReqwestMiddleware) {
    let cpt = ReqwestMiddleware::from(ClientLayer::http(callee).with_caller_secret(secret));
    let http = reqwest::Client::builder().timeout(timeout).build().unwrap();
    (ClientBuilder::new(http).with(cpt.clone()).build(), cpt)
}

async fn get_text(client: &ClientWithMiddleware, url: String) -> Result<String, String> {
    let resp = client
        .get(url)
        .with_extension(Route::new("/items/{id}"))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    resp.text().await.map_err(|e| e.to_string())
}

/// A traced call of `GET /items/7` on a `server` callee running `cpt`,
/// sending `secret`: the body, the caller's finished path, the middleware.
async fn call_items(
    server: Server,
    callee: &'static str,
    cpt: Cpt,
    secret: &str,
) -> (
    Result<String, String>,
    cpt_sdk::request::Finished,
    ReqwestMiddleware,
) {
    let addr = start(server, callee, cpt).await;
    let (client, middleware) = client(callee, secret);
    let url = format!("http://{addr}/items/7");
    let (body, done) = traced("caller", get_text(&client, url)).await;
    assert_sums(&done.path, done.latency);
    (body, done, middleware)
}

/// Trusted: the callee's path under `callee GET /items/{id}`, exact sums.
fn merges(server: Server, callee: &'static str) {
    rt().block_on(async {
        let (body, done, cpt) = call_items(server, callee, Cpt::Internal, SECRET).await;
        assert_eq!(body.unwrap(), "7");
        let rpc = format!("{callee} GET /items/{{id}}");
        assert_merged(&done.path, &rpc, callee, "GET /items/{id}");
        assert_eq!(cpt.stats().callee_path_merged, 1);
    });
}

/// A wrong secret: the callee ignores the trigger and returns nothing.
fn untrusted(server: Server, callee: &'static str) {
    rt().block_on(async {
        let (body, done, cpt) = call_items(server, callee, Cpt::Internal, "not-the-secret").await;
        assert_eq!(body.unwrap(), "7", "the call itself succeeds");
        assert_blind_spot(&done.path, &format!("{callee} GET /items/{{id}}"), WORK);
        assert_eq!(cpt.stats().callee_path_missing, 1);
    });
}

/// A callee without cpt: a blind-spot leaf naming it.
fn no_path(server: Server, callee: &'static str) {
    rt().block_on(async {
        let (body, done, cpt) = call_items(server, callee, Cpt::None, SECRET).await;
        assert_eq!(body.unwrap(), "7");
        assert_blind_spot(&done.path, &format!("{callee} GET /items/{{id}}"), WORK);
        let leaf = format!("{callee}:{callee}");
        assert!(
            view(&done.path)
                .iter()
                .any(|s| s.2 == cpt_sdk::SegmentKind::BlindSpot && s.0.last() == Some(&leaf)),
            "the blind spot names {callee}\n{}",
            show(&done.path)
        );
        assert_eq!(cpt.stats().callee_path_missing, 1);
    });
}

/// Connection refused and a timeout: the call fails, its node ends, its
/// time is on the path.
fn errors(server: Server, callee: &'static str) {
    rt().block_on(async {
        let (client, cpt) = client_with_timeout(callee, SECRET, TIMEOUT);
        let refused = format!("http://{}/items/7", closed_port());
        let (body, done) = traced("caller", get_text(&client, refused)).await;
        assert!(body.is_err());
        assert_sums(&done.path, done.latency);
        assert_blind_spot(
            &done.path,
            &format!("{callee} GET /items/{{id}}"),
            Duration::ZERO,
        );

        let addr = start(server, callee, Cpt::Internal).await;
        let slow = async {
            client
                .get(format!("http://{addr}/slow"))
                .send()
                .await
                .map(drop)
        };
        let (result, done) = traced("caller", slow).await;
        let err = result.unwrap_err();
        assert!(
            matches!(&err, reqwest_middleware::Error::Reqwest(e) if e.is_timeout()),
            "{err:?}"
        );
        assert_sums(&done.path, done.latency);
        assert_blind_spot(&done.path, &format!("{callee} GET /slow"), TIMEOUT);
        assert_eq!(cpt.stats().callee_path_missing, 2);
    });
}

/// `bytes_stream`: the RPC node ends with the body's last chunk.
fn stream_ends_with_the_body(server: Server, callee: &'static str) {
    rt().block_on(async {
        let addr = start(server, callee, Cpt::Internal).await;
        let (client, _) = client(callee, SECRET);
        let read = async {
            let resp = client
                .get(format!("http://{addr}/stream"))
                .send()
                .await
                .unwrap();
            let mut stream = resp.bytes_stream();
            let mut n = 0;
            while let Some(chunk) = stream.next().await {
                n += chunk.unwrap().len();
            }
            n
        };
        let (n, done) = traced("caller", read).await;
        assert_eq!(n, "chunk 0\n".len() * 3);
        assert_sums(&done.path, done.latency);
        let rpc = time_where(&done.path, |(s, _, _)| {
            s.iter().any(|f| f.ends_with("GET /stream"))
        });
        assert!(
            rpc >= CHUNK_GAP * 3,
            "the node covers the whole stream\n{}",
            show(&done.path)
        );
    });
}

#[test]
fn reqwest_to_axum_merges_the_callees_path_with_exact_sums() {
    merges(Server::Axum, "ax-merge");
}

#[test]
fn reqwest_to_axum_untrusted_caller_is_a_blind_spot() {
    untrusted(Server::Axum, "ax-untrusted");
}

#[test]
fn reqwest_to_axum_callee_without_a_path_is_a_blind_spot() {
    no_path(Server::Axum, "ax-nopath");
}

#[test]
fn reqwest_to_axum_refused_and_timed_out_calls_end_their_node() {
    errors(Server::Axum, "ax-errors");
}

#[test]
fn reqwest_to_axum_streamed_body_keeps_the_node_open_to_its_end() {
    stream_ends_with_the_body(Server::Axum, "ax-stream");
}

#[test]
fn reqwest_to_actix_merges_the_callees_path_with_exact_sums() {
    merges(Server::Actix, "ac-merge");
}

#[test]
fn reqwest_to_actix_untrusted_caller_is_a_blind_spot() {
    untrusted(Server::Actix, "ac-untrusted");
}

#[test]
fn reqwest_to_actix_callee_without_a_path_is_a_blind_spot() {
    no_path(Server::Actix, "ac-nopath");
}

#[test]
fn reqwest_to_actix_refused_and_timed_out_calls_end_their_node() {
    errors(Server::Actix, "ac-errors");
}

#[test]
fn reqwest_to_actix_streamed_body_keeps_the_node_open_to_its_end() {
    stream_ends_with_the_body(Server::Actix, "ac-stream");
}

/// A malformed or oversized path header is dropped and counted; the call
/// succeeds.
#[test]
fn reqwest_drops_a_malformed_or_oversized_path_and_counts_it() {
    rt().block_on(async {
        let bad = axum::Router::new().route(
            "/items/{id}",
            axum::routing::get(|| async {
                ([(cpt_middleware::header::PATH, "!!not base64!!")], "7")
            }),
        );
        let bad_addr = serve_router(bad).await;
        let (client, cpt) = client("ax-bad", SECRET);
        let (body, done) = traced(
            "caller",
            get_text(&client, format!("http://{bad_addr}/items/7")),
        )
        .await;
        assert_eq!(body.unwrap(), "7");
        assert_sums(&done.path, done.latency);
        assert_eq!(cpt.stats().callee_path_invalid, 1);

        let addr = serve_axum("ax-big", Cpt::Internal).await;
        let small = ReqwestMiddleware::from(
            ClientLayer::http("ax-big")
                .with_caller_secret(SECRET)
                .with_max_path_bytes(8),
        );
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(small.clone())
            .build();
        let (body, done) = traced(
            "caller",
            get_text(&client, format!("http://{addr}/items/7")),
        )
        .await;
        assert_eq!(body.unwrap(), "7");
        assert_sums(&done.path, done.latency);
        assert_blind_spot(&done.path, "ax-big GET /items/{id}", WORK);
        assert_eq!(small.stats().callee_path_oversize, 1);
    });
}

/// With reqwest-retry before it, each attempt is a node of its own and the
/// wait between attempts is on the caller's path; reqwest-tracing after it
/// makes its span inside each attempt's node.
#[test]
fn reqwest_with_retry_and_tracing_makes_each_attempt_a_node() {
    use reqwest_retry::RetryTransientMiddleware;
    use reqwest_retry::policies::ExponentialBackoff;
    rt().block_on(async {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let seen = calls.clone();
        let flaky = axum::Router::new()
            .route(
                "/items/{id}",
                axum::routing::get(move || {
                    let seen = seen.clone();
                    async move {
                        work().await;
                        if seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                            (axum::http::StatusCode::SERVICE_UNAVAILABLE, "busy")
                        } else {
                            (axum::http::StatusCode::OK, "7")
                        }
                    }
                }),
            )
            .layer(
                cpt_middleware::ServerLayer::http("ax-retry")
                    .internal()
                    .with_trust(cpt_middleware::SharedSecret::new(SECRET)),
            );
        let addr = serve_router(flaky).await;
        let wait = Duration::from_millis(30);
        let policy = ExponentialBackoff::builder()
            .retry_bounds(wait, wait)
            .jitter(reqwest_retry::Jitter::None)
            .build_with_max_retries(2);
        let cpt = ReqwestMiddleware::from(ClientLayer::http("ax-retry").with_caller_secret(SECRET));
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(RetryTransientMiddleware::new_with_policy(policy))
            .with(cpt.clone())
            .with(reqwest_tracing::TracingMiddleware::default())
            .build();
        let started = std::time::Instant::now();
        let (body, done) = traced(
            "caller",
            get_text(&client, format!("http://{addr}/items/7")),
        )
        .await;
        let wall = started.elapsed();
        assert_eq!(body.unwrap(), "7");
        assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert_eq!(
            cpt.stats().callee_path_merged,
            2,
            "each attempt merged its own path"
        );
        assert_sums(&done.path, done.latency);
        assert_merged(
            &done.path,
            "ax-retry GET /items/{id}",
            "ax-retry",
            "GET /items/{id}",
        );
        let outside = time_where(&done.path, |(s, _, _)| {
            !s.iter().any(|f| f.ends_with("ax-retry GET /items/{id}"))
        });
        assert!(
            outside >= wait,
            "the retry wait is on the caller's path (latency {:?}, wall {:?})\n{}",
            done.latency,
            wall,
            show(&done.path)
        );
    });
}
