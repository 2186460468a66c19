//! The order of a reqwest-middleware chain and the callees it reaches, as
//! `ReqwestMiddleware` sees them: reqwest-tracing outside it, a retry inside
//! it, and one middleware calling two hosts each warn once (naming the order
//! to use, or one chain per callee); the documented chain says nothing. And
//! a trusted caller of an actix-web stream is told why the path is missing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;

use cpt_middleware::{ActixServer, ClientLayer, ReqwestMiddleware, ServerLayer, SharedSecret};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_tracing::TracingMiddleware;

use crate::support::*;

/// cpt's middleware for `callee`, trusted by the test callees.
fn cpt(callee: &'static str) -> ReqwestMiddleware {
    ReqwestMiddleware::from(ClientLayer::http(callee).with_caller_secret(SECRET))
}

/// Retries on 503, 30 ms apart, at most twice.
fn retry() -> RetryTransientMiddleware<ExponentialBackoff> {
    let wait = Duration::from_millis(30);
    let policy = ExponentialBackoff::builder()
        .retry_bounds(wait, wait)
        .jitter(reqwest_retry::Jitter::None)
        .build_with_max_retries(2);
    RetryTransientMiddleware::new_with_policy(policy)
}

/// An axum callee running cpt whose first answer is 503, then 200.
async fn flaky(service: &'static str) -> SocketAddr {
    let calls = Arc::new(AtomicU32::new(0));
    let app = axum::Router::new()
        .route(
            "/items/{id}",
            axum::routing::get(move || {
                let calls = calls.clone();
                async move {
                    work().await;
                    if calls.fetch_add(1, Relaxed) == 0 {
                        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "busy")
                    } else {
                        (axum::http::StatusCode::OK, "7")
                    }
                }
            }),
        )
        .layer(
            ServerLayer::http(service)
                .internal()
                .with_trust(SharedSecret::new(SECRET)),
        );
    serve_router(app).await
}

/// The body of `GET url` through `client`, which must succeed.
async fn text_of(client: &ClientWithMiddleware, url: String) -> String {
    let resp = client.get(url).send().await.unwrap();
    resp.text().await.unwrap()
}

/// Two traced calls of `GET /items/7` through `client`; both succeed.
async fn call_twice(client: &ClientWithMiddleware, addr: SocketAddr) {
    for _ in 0..2 {
        let call = async { text_of(client, format!("http://{addr}/items/7")).await };
        let (body, done) = traced("order-caller", call).await;
        assert_eq!(body, "7");
        assert_sums(&done.path, done.latency);
    }
}

/// `lines` is one warning, which says the order to use and each of `says`.
fn the_order_warning(lines: &[String], says: &[&str]) {
    assert_eq!(lines.len(), 1, "one warning per client: {lines:#?}");
    let line = &lines[0];
    assert!(
        line.contains(".with(RetryTransientMiddleware::…).with(ReqwestMiddleware::…).with(TracingMiddleware::default())"),
        "names the order to use: {line}"
    );
    for s in says {
        assert!(line.contains(s), "says {s:?}: {line}");
    }
}

/// Two traced calls to `callee` (its first answer a 503 when `flaky`)
/// through cpt's middleware for it, with the rest of the chain `around`
/// adds; then the warnings that name `callee`.
fn warnings_of_chain(
    callee: &'static str,
    flaky_callee: bool,
    around: impl FnOnce(ReqwestMiddleware) -> ClientWithMiddleware,
) -> Vec<String> {
    rt().block_on(async {
        let addr = if flaky_callee {
            flaky(callee).await
        } else {
            serve_axum(callee, Cpt::Internal).await
        };
        call_twice(&around(cpt(callee)), addr).await;
    });
    warnings_naming(callee)
}

fn client() -> ClientBuilder {
    ClientBuilder::new(reqwest::Client::new())
}

#[test]
fn reqwest_tracing_outside_cpt_is_warned_once_with_the_order_to_use() {
    let lines = warnings_of_chain("ord-tracing", false, |cpt| {
        client()
            .with(TracingMiddleware::default())
            .with(cpt)
            .build()
    });
    the_order_warning(
        &lines,
        &["TracingMiddleware runs before (outside)", "[unattributed]"],
    );
}

#[test]
fn a_retry_inside_cpt_is_warned_once_with_the_order_to_use() {
    let lines = warnings_of_chain("ord-retry", true, |cpt| {
        client().with(cpt).with(retry()).build()
    });
    the_order_warning(
        &lines,
        &["was sent 2 times inside one cpt RPC node", "[network]"],
    );
}

#[test]
fn the_documented_order_says_nothing() {
    let lines = warnings_of_chain("ord-right", true, |cpt| {
        client()
            .with(retry())
            .with(cpt)
            .with(TracingMiddleware::default())
            .build()
    });
    assert_eq!(lines, Vec::<String>::new());
}

/// One chain per callee: each names its own, and neither warns. One chain
/// reaching two services warns once, naming both addresses.
#[test]
fn a_client_of_two_callees_needs_one_chain_each_and_one_chain_for_two_is_warned() {
    rt().block_on(async {
        let inventory = serve_axum("fan-inventory", Cpt::Internal).await;
        let pricing = serve_axum("fan-pricing", Cpt::Internal).await;
        let to_inventory = ClientBuilder::new(reqwest::Client::new())
            .with(cpt("fan-inventory"))
            .build();
        let to_pricing = ClientBuilder::new(reqwest::Client::new())
            .with(cpt("fan-pricing"))
            .build();
        let both = async {
            let a = text_of(&to_inventory, format!("http://{inventory}/items/1")).await;
            let b = text_of(&to_pricing, format!("http://{pricing}/items/2")).await;
            (a, b)
        };
        let ((a, b), done) = traced("fan-caller", both).await;
        assert_eq!((a.as_str(), b.as_str()), ("1", "2"));
        assert_merged(
            &done.path,
            "fan-inventory GET /items/*",
            "fan-inventory",
            "GET /items/{id}",
        );
        assert_merged(
            &done.path,
            "fan-pricing GET /items/*",
            "fan-pricing",
            "GET /items/{id}",
        );

        let one = ClientBuilder::new(reqwest::Client::new())
            .with(cpt("fan-one"))
            .build();
        let (_, _) = traced("fan-caller", async {
            for addr in [inventory, pricing, pricing] {
                text_of(&one, format!("http://{addr}/items/3")).await;
            }
        })
        .await;
        assert_eq!(warnings_naming("fan-inventory"), Vec::<String>::new());
        assert_eq!(warnings_naming("fan-pricing"), Vec::<String>::new());
        let lines = warnings_naming("fan-one");
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(
            lines[0].contains(&format!("calls {inventory} and {pricing}")),
            "{}",
            lines[0]
        );
        assert!(
            lines[0].contains("one ReqwestMiddleware) per callee"),
            "{}",
            lines[0]
        );
    });
}

/// actix-web sends no trailers: a trusted caller of a streamed response gets
/// no path. The callee counts it unsent, not returned, and says why in
/// `x-cpt-no-path`; the caller's warning names that cause, not a missing
/// layer or trust.
#[test]
fn an_actix_stream_counts_its_path_unsent_and_the_caller_is_told_why() {
    let server = ActixServer::from(
        ServerLayer::http("ac-unsent")
            .internal()
            .with_trust(SharedSecret::new(SECRET)),
    );
    let middleware = server.clone();
    let addr = spawn_actix(move || {
        actix_web::App::new()
            .wrap(middleware.clone())
            .configure(actix_routes)
    });
    let client_cpt = cpt("ac-unsent");
    rt().block_on(async {
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(client_cpt.clone())
            .build();
        for _ in 0..3 {
            let read = async { text_of(&client, format!("http://{addr}/stream")).await };
            let (text, done) = traced("unsent-caller", read).await;
            assert_eq!(text.lines().count(), 3);
            assert_blind_spot(&done.path, "ac-unsent GET /stream", CHUNK_GAP);
        }
    });
    let server = server.stats();
    assert_eq!(
        (server.paths_returned, server.path_unsent),
        (0, 3),
        "no path went out: none is counted returned"
    );
    assert_eq!(client_cpt.stats().callee_path_missing, 3);
    let lines = warnings_naming("ac-unsent");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("sends no trailers"), "{}", lines[0]);
    assert!(
        !lines[0].contains("Check that"),
        "the cause is known, not a missing layer or trust: {}",
        lines[0]
    );
}
