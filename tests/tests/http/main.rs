//! The HTTP layers: an axum server with `ServerLayer::http` and a hyper-util
//! client with `ClientLayer::http`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use base64::Engine as _;
use bytes::Bytes;
use cpt_examples::proto::service_a_client::ServiceAClient;
use cpt_examples::proto::{RunReply, RunRequest};
use cpt_middleware::{ClientLayer, ServerLayer, SharedSecret, header};
use cpt_sdk::CriticalPath;
use cpt_tests::{always, channel, has, io, render, run, serve_grpc, services, time_where};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tonic::{Request, Response, Status};
use tracing::Instrument;

const SECRET: &str = "http-secret";

async fn item(axum::extract::Path(id): axum::extract::Path<u64>) -> String {
    async { io("H1.io", Duration::from_millis(5)).await }
        .instrument(tracing::info_span!("H1"))
        .await;
    id.to_string()
}

async fn serve_h() -> SocketAddr {
    let app = axum::Router::new().route("/items/{id}", get(item)).layer(
        ServerLayer::http("H")
            .with_trust(SharedSecret::new(SECRET))
            .with_sampler(()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

fn decode(value: &http::HeaderValue) -> CriticalPath {
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(value.as_bytes())
        .unwrap();
    cpt_sdk::codec::decode(&bytes, &Default::default()).unwrap()
}

#[test]
fn http_server_returns_path_in_headers_named_after_route() {
    run(|recorder| async move {
        let addr = serve_h().await;
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let req = http::Request::get(format!("http://{addr}/items/42"))
            .header(header::TRIGGER, "sampled")
            .header(header::WANT_PATH, "1")
            .header(header::CALLER_AUTH, SECRET)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        let path = decode(resp.headers().get(header::PATH).expect("path in headers"));
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"42");
        let root = &path.frames()[path.segments()[0].stack[0].0 as usize];
        assert_eq!(
            (&*root.service, &*root.name),
            ("H", "GET /items/{id}"),
            "{path:?}"
        );
        assert!(path.frames().iter().any(|f| &*f.name == "H1"), "{path:?}");
        assert!(path.total() >= Duration::from_millis(5));

        // Without the secret: no path.
        let req = http::Request::get(format!("http://{addr}/items/42"))
            .header(header::TRIGGER, "sampled")
            .header(header::WANT_PATH, "1")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        assert!(resp.headers().get(header::PATH).is_none());
        assert!(recorder.settled().await.is_empty());
    });
}

#[test]
fn http_client_layer_merges_callee_path() {
    run(|recorder| async move {
        let h = serve_h().await;
        let layer = ClientLayer::http("H")
            .with_caller_secret(SECRET)
            .with_name_fn(|m, _| format!("{m} /items/{{id}}"));
        let client = tower::Layer::layer(
            &layer,
            Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>(),
        );
        let svc = services::a(move |_: Request<RunRequest>| {
            let client = client.clone();
            async move {
                let req = http::Request::get(format!("http://{h}/items/7"))
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let body = async {
                    let resp = tower::ServiceExt::oneshot(client, req)
                        .await
                        .map_err(|e| e.to_string())?;
                    let body = resp
                        .into_body()
                        .collect()
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>(body.to_bytes())
                }
                .instrument(tracing::info_span!("A1"))
                .await
                .map_err(Status::unavailable)?;
                Ok(Response::new(RunReply {
                    value: body.len() as u64,
                }))
            }
        });
        let a = serve_grpc(ServerLayer::grpc("A").with_sampler(always), svc).await;
        ServiceAClient::new(channel(a))
            .run(RunRequest::default())
            .await
            .unwrap();
        let records = recorder.wait_for(1).await;
        assert_eq!(records.len(), 1, "{records:#?}");
        let r = &records[0];
        let shown = render(r);
        assert_eq!(r.path.total(), r.latency, "{shown}");
        let h1 = time_where(r, |(s, _, _)| {
            has(s, "A:H GET /items/{id}") && has(s, "H:GET /items/{id}") && has(s, "H:H1")
        });
        assert!(
            h1 >= Duration::from_millis(5),
            "H's path under the HTTP RPC frame\n{shown}"
        );
        assert_eq!(layer.stats().callee_path_merged, 1);
    });
}

fn unbase64(value: &http::HeaderValue) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(value.as_bytes())
        .unwrap()
}

/// The distinct stacks of a path, by frame name, in first-use order: what
/// its frame dictionary encodes.
fn stacks(path: &CriticalPath) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = Vec::new();
    for s in path.segments() {
        let names = s
            .stack
            .iter()
            .map(|f| path.frames()[f.0 as usize].name.to_string())
            .collect();
        if !out.contains(&names) {
            out.push(names);
        }
    }
    out
}

#[test]
fn http_server_answers_a_version_2_caller_with_the_frame_dictionary() {
    run(|_recorder| async move {
        let addr = serve_h().await;
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let mut answers = Vec::new();
        for want in ["2", "2", "1"] {
            let req = http::Request::get(format!("http://{addr}/items/42"))
                .header(header::TRIGGER, "sampled")
                .header(header::WANT_PATH, want)
                .header(header::CALLER_AUTH, SECRET)
                .body(Full::new(Bytes::new()))
                .unwrap();
            let resp = client.request(req).await.unwrap();
            let h = resp.headers().clone();
            resp.into_body().collect().await.unwrap();
            let segments = h.get(header::PATH).expect("path in headers");
            let Some(frames) = h.get(header::FRAMES) else {
                assert_eq!(want, "1", "a version 2 caller gets the dictionary");
                decode(segments);
                continue;
            };
            assert_eq!(want, "2", "a version 1 caller gets one header");
            let limits = Default::default();
            let dictionary = cpt_sdk::codec::decode_frames(&unbase64(frames), &limits).unwrap();
            let path =
                cpt_sdk::codec::decode_split(&dictionary, &unbase64(segments), &limits).unwrap();
            assert!(path.frames().iter().any(|f| &*f.name == "H1"), "{path:?}");
            answers.push((frames.clone(), stacks(&path)));
        }
        // Over the same stacks (the usual case), the same dictionary bytes.
        assert_eq!(
            answers[0].0 == answers[1].0,
            answers[0].1 == answers[1].1,
            "{answers:?}"
        );
    });
}
