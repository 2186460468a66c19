//! A tonic service calling actix-web with a tower HTTP client
//! (`ClientLayer::http` over hyper-util).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use cpt_examples::proto::service_a_client::ServiceAClient;
use cpt_examples::proto::{RunReply, RunRequest};
use cpt_middleware::{ClientLayer, Route, ServerLayer};
use cpt_tests::{always, channel, serve_grpc, services};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tonic::{Request, Response, Status};

use crate::support::*;

const TIMEOUT: Duration = Duration::from_millis(100);
const PATIENT: Duration = Duration::from_secs(10);

/// Entry service `entry` (tonic, samples everything) whose `Run` GETs
/// `path` from `target` through `ClientLayer::http(callee)` with `secret`,
/// giving up after `deadline`; its record.
async fn call_through_tonic(
    entry: &'static str,
    callee: &'static str,
    secret: &'static str,
    target: SocketAddr,
    path: &'static str,
    deadline: Duration,
) -> (cpt_sdk::Record, ClientLayer) {
    let layer = ClientLayer::http(callee).with_caller_secret(secret);
    let client = tower::Layer::layer(
        &layer,
        Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>(),
    );
    let svc = services::a(move |_: Request<RunRequest>| {
        let client = client.clone();
        async move {
            let mut req = http::Request::get(format!("http://{target}{path}"))
                .body(Full::new(Bytes::new()))
                .unwrap();
            if path.starts_with("/items/") {
                req.extensions_mut().insert(Route::new("/items/{id}"));
            }
            let call = async {
                let resp = tower::ServiceExt::oneshot(client, req)
                    .await
                    .map_err(|e| e.to_string())?;
                let body = resp
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(body.to_bytes().len() as u64)
            };
            let value = tokio::time::timeout(deadline, call)
                .await
                .map_err(|_| "timed out".to_owned())
                .and_then(|r| r)
                .unwrap_or(0);
            Ok::<_, Status>(Response::new(RunReply { value }))
        }
    });
    let a = serve_grpc(ServerLayer::grpc(entry).with_sampler(always), svc).await;
    ServiceAClient::new(channel(a))
        .run(RunRequest::default())
        .await
        .unwrap();
    let records = records_of(entry, 1).await;
    assert_eq!(records.len(), 1, "one record of {entry}");
    (records.into_iter().next().unwrap(), layer)
}

#[test]
fn tonic_caller_to_actix_merges_the_callees_path_with_exact_sums() {
    rt().block_on(async {
        let addr = serve_actix("ta-callee", Cpt::Internal);
        let (r, layer) =
            call_through_tonic("ta-merge", "ta-callee", SECRET, addr, "/items/7", PATIENT).await;
        assert_sums(&r.path, r.latency);
        assert_merged(
            &r.path,
            "ta-callee GET /items/{id}",
            "ta-callee",
            "GET /items/{id}",
        );
        assert_eq!(layer.stats().callee_path_merged, 1);
    });
}

#[test]
fn tonic_caller_to_actix_untrusted_caller_is_a_blind_spot() {
    rt().block_on(async {
        let addr = serve_actix("ta-callee-u", Cpt::Internal);
        let (r, layer) = call_through_tonic(
            "ta-untrusted",
            "ta-callee-u",
            "wrong",
            addr,
            "/items/7",
            PATIENT,
        )
        .await;
        assert_sums(&r.path, r.latency);
        assert_blind_spot(&r.path, "ta-callee-u GET /items/{id}", WORK);
        assert_eq!(layer.stats().callee_path_missing, 1);
    });
}

#[test]
fn tonic_caller_to_actix_callee_without_a_path_is_a_blind_spot() {
    rt().block_on(async {
        let addr = serve_actix("ta-callee-n", Cpt::None);
        let (r, _) = call_through_tonic(
            "ta-nopath",
            "ta-callee-n",
            SECRET,
            addr,
            "/items/7",
            PATIENT,
        )
        .await;
        assert_sums(&r.path, r.latency);
        assert_blind_spot(&r.path, "ta-callee-n GET /items/{id}", WORK);
    });
}

#[test]
fn tonic_caller_to_actix_refused_and_timed_out_calls_end_their_node() {
    rt().block_on(async {
        let (r, _) = call_through_tonic(
            "ta-refused",
            "ta-callee-r",
            SECRET,
            closed_port(),
            "/items/7",
            PATIENT,
        )
        .await;
        assert_sums(&r.path, r.latency);
        assert_blind_spot(&r.path, "ta-callee-r GET /items/{id}", Duration::ZERO);

        let addr = serve_actix("ta-callee-t", Cpt::Internal);
        let (r, _) =
            call_through_tonic("ta-timeout", "ta-callee-t", SECRET, addr, "/slow", TIMEOUT).await;
        assert_sums(&r.path, r.latency);
        assert_blind_spot(&r.path, "ta-callee-t GET /slow", TIMEOUT);
    });
}
