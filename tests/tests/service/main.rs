//! Entry and internal services over real HTTP (axum + hyper-util): an
//! internal service never starts a trace of its own, even when the process
//! samples everything, and ids in paths never become frames.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::get;
use bytes::Bytes;
use cpt_middleware::{Client, ClientLayer, ROOT_LABEL, ServerLayer, SharedSecret};
use cpt_sdk::trigger::DefaultSampler;
use cpt_tests::{Recorder, has, io, render, segments};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tracing::Instrument;

const SECRET: &str = "service-secret";

type Http = Client<HttpClient<HttpConnector, Full<Bytes>>>;

/// Like `cpt_tests::run`, with a process sampler that traces every request
/// a service lets it decide.
fn run_sampling_all<F, Fut>(f: F) -> Fut::Output
where
    F: FnOnce(Recorder) -> Fut,
    Fut: std::future::Future,
{
    cpt_tests::run_with(|b| b.with_sampler(DefaultSampler::new(1.0)), f)
}

async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

async fn item(Path(id): Path<u64>) -> String {
    io("I1.io", Duration::from_millis(2)).await;
    id.to_string()
}

/// The internal service I: `GET /items/{id}`.
async fn serve_internal() -> SocketAddr {
    serve(
        axum::Router::new().route("/items/{id}", get(item)).layer(
            ServerLayer::http("I")
                .internal()
                .with_trust(SharedSecret::new(SECRET)),
        ),
    )
    .await
}

/// `GET /front/{id}` on the entry service E calls I's `/items/{id}`.
async fn front(State((client, i)): State<(Http, SocketAddr)>, Path(id): Path<u64>) -> String {
    let req = http::Request::get(format!("http://{i}/items/{id}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    async {
        let resp = tower::ServiceExt::oneshot(client, req).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&body).into_owned()
    }
    .instrument(tracing::info_span!("E1"))
    .await
}

async fn serve_entry(i: SocketAddr) -> SocketAddr {
    // No name function: the call to I is named after the bounded default.
    let client = tower::Layer::layer(
        &ClientLayer::http("I").with_caller_secret(SECRET),
        HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>(),
    );
    serve(
        axum::Router::new()
            .route("/front/{id}", get(front))
            .with_state((client, i))
            .layer(ServerLayer::http("E")),
    )
    .await
}

async fn get_text(addr: SocketAddr, path: &str) -> String {
    let client = HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = http::Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let body = client
        .request(req)
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap();
    String::from_utf8_lossy(&body.to_bytes()).into_owned()
}

#[test]
fn an_internal_service_called_untraced_emits_no_record() {
    run_sampling_all(|recorder| async move {
        let i = serve_internal().await;
        for id in 0..5 {
            assert_eq!(get_text(i, &format!("/items/{id}")).await, id.to_string());
        }
        let records = recorder.settled().await;
        assert!(records.is_empty(), "I started traces: {records:#?}");
    });
}

#[test]
fn only_the_entry_service_records_and_calls_by_id_share_one_frame() {
    run_sampling_all(|recorder| async move {
        let i = serve_internal().await;
        let e = serve_entry(i).await;
        for id in 0..3 {
            assert_eq!(get_text(e, &format!("/front/{id}")).await, id.to_string());
        }
        let records = recorder.wait_for(3).await;
        assert_eq!(records.len(), 3, "{records:#?}");
        for r in &records {
            let shown = render(r);
            assert_eq!(r.service, "E", "{shown}");
            assert_eq!(r.endpoint.as_deref(), Some("GET /front/{id}"), "{shown}");
            assert_eq!(r.labels.get(ROOT_LABEL).map(String::as_str), Some("entry"));
            assert!(
                segments(r)
                    .iter()
                    .any(|(s, _, _)| has(s, "E:I GET /items/*")
                        && has(s, "I:GET /items/{id}")
                        && has(s, "I:I1.io")),
                "I's path is merged under one bounded RPC frame\n{shown}"
            );
            assert!(
                !r.path.frames().iter().any(|f| f.name.contains("/items/0")
                    || f.name.contains("/items/1")
                    || f.name.contains("/items/2")),
                "{shown}"
            );
        }
    });
}
