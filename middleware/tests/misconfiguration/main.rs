//! Misconfiguration is loud, once: a layer that can only produce blind spots
//! says so when it wraps its service, and what goes wrong per request
//! (an untrusted caller's trigger, a callee that returns no path) is logged
//! at its first occurrence with the fix, then rate-limited.

use bytes::Bytes;
use cpt_middleware::{ClientLayer, ForceAuth, ServerLayer, SharedSecret, header};
use cpt_sdk::Trigger;
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::request::{self, RequestOptions};
use cpt_sdk::testing::log::LogBuffer;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};
use tower_test::mock;
use tracing_subscriber::prelude::*;

type Mock = mock::Mock<Request<Full<Bytes>>, Response<Full<Bytes>>>;
type MockHandle = mock::Handle<Request<Full<Bytes>>, Response<Full<Bytes>>>;

/// Runs `f` under a subscriber with cpt's layer and a log that is returned.
fn logged<F, Fut>(f: F) -> LogBuffer
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let log = LogBuffer::default();
    let writer = log.clone();
    let (layer, _handle) = CriticalPathLayer::builder()
        .with_service("test")
        .with_sink(|_| {})
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(layer)
        .with(tracing_subscriber::fmt::layer().with_writer(move || writer.clone()));
    let _guard = tracing::subscriber::set_default(subscriber);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f());
    log
}

#[test]
fn an_internal_service_that_trusts_no_caller_says_so_once_when_it_wraps_its_service() {
    let log = logged(|| async {
        let layer = ServerLayer::grpc("B").internal();
        let (a, _ha): (Mock, MockHandle) = mock::pair();
        let (b, _hb): (Mock, MockHandle) = mock::pair();
        let _ = layer.layer(a);
        let _ = layer.layer(b);
    });
    let w = log.lines_with("WARN");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("internal service B trusts no caller"),
        "{w:?}"
    );
    assert!(w[0].contains("CPT_TRUST_SECRET"), "{w:?}");
    assert!(w[0].contains("[blind spot]"), "{w:?}");
}

#[test]
fn a_service_with_a_trust_policy_or_an_entry_role_says_nothing() {
    let log = logged(|| async {
        let (a, _ha): (Mock, MockHandle) = mock::pair();
        let (b, _hb): (Mock, MockHandle) = mock::pair();
        let (c, _hc): (Mock, MockHandle) = mock::pair();
        let _ = ServerLayer::grpc("B")
            .internal()
            .with_trust(SharedSecret::new("s3cret"))
            .layer(a);
        let _ = ServerLayer::grpc("A").layer(b);
        let _ = ClientLayer::grpc("B").with_caller_secret("s3cret").layer(c);
    });
    assert_eq!(log.lines_with("WARN"), Vec::<String>::new());
}

#[test]
fn a_client_without_a_caller_secret_says_its_calls_may_be_blind_spots() {
    let log = logged(|| async {
        let (a, _ha): (Mock, MockHandle) = mock::pair();
        let _ = ClientLayer::grpc("B").layer(a);
    });
    let w = log.lines_with("WARN");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("calls to B send no caller secret"), "{w:?}");
    assert!(w[0].contains("[blind spot]"), "{w:?}");
}

fn untrusted_asking_request() -> Request<Full<Bytes>> {
    Request::post("http://b/pkg.B/Method")
        .header(header::TRIGGER, "sampled")
        .header(header::WANT_PATH, "2")
        .header(header::CALLER_AUTH, "not-the-secret")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[test]
fn an_untrusted_callers_trigger_is_logged_with_the_fix_then_rate_limited() {
    let layer = ServerLayer::grpc("B")
        .internal()
        .with_trust(SharedSecret::new("s3cret"));
    let log = logged(|| async {
        for _ in 0..3 {
            let (svc, mut handle): (Mock, MockHandle) = mock::pair();
            let svc = layer.layer(svc);
            let (resp, ()) = tokio::join!(svc.oneshot(untrusted_asking_request()), async {
                let (_req, send) = handle.next_request().await.unwrap();
                send.send_response(Response::new(Full::new(Bytes::new())));
            });
            let resp = resp.unwrap();
            assert!(resp.headers().get(header::PATH).is_none());
        }
    });
    assert_eq!(layer.stats().path_withheld, 3);
    let w = log.lines_with("WARN");
    assert_eq!(w.len(), 1, "three requests, one line: {w:?}");
    assert!(w[0].contains("B ignored the trace trigger of a caller it does not trust"));
    assert!(
        w[0].contains("[blind spot]") && w[0].contains("CPT_TRUST_SECRET"),
        "{w:?}"
    );
}

#[test]
fn a_callee_that_returns_no_path_is_logged_as_a_blind_spot_then_rate_limited() {
    let layer = ClientLayer::grpc("C").with_caller_secret("s3cret");
    let log = logged(|| async {
        for _ in 0..2 {
            let root = tracing::info_span!("root");
            request::begin(
                &root,
                RequestOptions::new(Some(Trigger::Sampled)).with_service("A"),
            );
            let (svc, mut handle): (Mock, MockHandle) = mock::pair();
            let svc = layer.layer(svc);
            let req = Request::post("http://c/pkg.C/Method")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let call = async {
                let resp = svc.oneshot(req).await.unwrap();
                resp.into_body().collect().await.unwrap()
            };
            let (_, ()) =
                tokio::join!(tracing::Instrument::instrument(call, root.clone()), async {
                    let (_req, send) = handle.next_request().await.unwrap();
                    send.send_response(Response::new(Full::new(Bytes::new())));
                });
            request::finish(&root).expect("the root was traced");
        }
    });
    assert_eq!(layer.stats().callee_path_missing, 2);
    let w = log.lines_with("WARN");
    assert_eq!(w.len(), 1, "two calls, one line: {w:?}");
    assert!(w[0].contains("C returned no critical path"), "{w:?}");
    assert!(
        w[0].contains("[blind spot]") && w[0].contains("ServerLayer"),
        "{w:?}"
    );
}

fn forcing_request(credential: &str) -> Request<Full<Bytes>> {
    Request::post("http://a/pkg.A/Method")
        .header(header::REQUEST_ID, "op-42")
        .header(header::FORCE, credential)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[test]
fn a_refused_force_credential_is_logged_with_its_reason_once_per_reason() {
    let layer = ServerLayer::grpc("A")
        .with_sampler(())
        .with_force_auth(ForceAuth::none().hmac_key(b"k3y"));
    let log = logged(|| async {
        // An old-format credential twice, then a cpt1 one that does not parse.
        for credential in [&"ab".repeat(32), &"ab".repeat(32), "cpt1.not-a-credential"] {
            let (svc, mut handle): (Mock, MockHandle) = mock::pair();
            let svc = layer.layer(svc);
            let (resp, ()) = tokio::join!(svc.oneshot(forcing_request(credential)), async {
                let (_req, send) = handle.next_request().await.unwrap();
                send.send_response(Response::new(Full::new(Bytes::new())));
            });
            resp.unwrap();
        }
    });
    let w = log.lines_with("WARN");
    assert_eq!(w.len(), 2, "one line per reason within the minute: {w:?}");
    assert!(
        w[0].contains("ignored x-cpt-force") && w[0].contains("old format"),
        "{w:?}"
    );
    assert!(
        w[0].contains("cpt force --service"),
        "says how to mint a new one: {w:?}"
    );
    assert!(w[1].contains("not a force credential"), "{w:?}");
}

#[cfg(feature = "reqwest")]
#[test]
fn a_reqwest_middleware_without_a_caller_secret_says_so_once() {
    let log = logged(|| async {
        let layer = ClientLayer::http("pricing");
        let _a = cpt_middleware::ReqwestMiddleware::from(layer.clone());
        let _b = cpt_middleware::ReqwestMiddleware::from(layer);
        let _signed = cpt_middleware::ReqwestMiddleware::from(
            ClientLayer::http("stock").with_caller_secret("s"),
        );
    });
    let w = log.lines_with("WARN");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("calls to pricing send no caller secret"),
        "{w:?}"
    );
    assert!(w[0].contains("[blind spot]"), "{w:?}");
}

#[cfg(feature = "actix-web")]
#[test]
fn an_actix_internal_service_that_trusts_no_caller_says_so_once() {
    let log = logged(|| async {
        let layer = ServerLayer::http("pricing").internal();
        let _a = cpt_middleware::ActixServer::from(layer.clone());
        let _b = cpt_middleware::ActixServer::from(layer);
        let _entry = cpt_middleware::ActixServer::from(ServerLayer::http("shop"));
    });
    let w = log.lines_with("WARN");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("internal service pricing trusts no caller"),
        "{w:?}"
    );
}
