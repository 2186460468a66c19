//! The server and client layers over `tower-test` mocks: what they add to
//! requests and responses, traced and untraced.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use cpt_middleware::{ClientLayer, ServerLayer, SharedSecret, header};
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::request::{self, RequestOptions};
use cpt_sdk::testing::RecordingSink;
use cpt_sdk::{CriticalPath, Frame, SegmentKind, Trigger};
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame as BodyFrame};
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};
use tower_test::mock;
use tracing_subscriber::prelude::*;

type Mock<B> = mock::Mock<Request<Full<Bytes>>, Response<B>>;
type MockHandle<B> = mock::Handle<Request<Full<Bytes>>, Response<B>>;

fn with_cpt<F, Fut>(f: F) -> Fut::Output
where
    F: FnOnce(RecordingSink) -> Fut,
    Fut: std::future::Future,
{
    let sink = RecordingSink::new();
    let (layer, _handle) = CriticalPathLayer::builder()
        .with_service("test")
        .with_sink(sink.clone())
        .build();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(f(sink))
}

fn cpt_headers(h: &HeaderMap) -> Vec<String> {
    h.keys()
        .map(|k| k.as_str().to_owned())
        .filter(|k| k.starts_with("x-cpt-"))
        .collect()
}

fn asking_request() -> Request<Full<Bytes>> {
    Request::post("http://s/pkg.S/Method")
        .header(header::TRIGGER, "sampled")
        .header(header::WANT_PATH, "1")
        .header(header::CALLER_AUTH, "s3cret")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn decode(v: &http::HeaderValue) -> CriticalPath {
    use base64::Engine as _;
    let b = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(v.as_bytes())
        .unwrap();
    cpt_sdk::codec::decode(&b, &Default::default()).unwrap()
}

#[test]
fn server_untraced_request_passes_through_untouched() {
    with_cpt(|sink| async move {
        let layer = ServerLayer::grpc("S").with_sampler(());
        let (svc, mut handle): (Mock<Full<Bytes>>, MockHandle<Full<Bytes>>) = mock::pair();
        let svc = layer.layer(svc);
        {
            let req = Request::post("http://s/pkg.S/Method")
                .body(Full::new(Bytes::from_static(b"in")))
                .unwrap();
            let (resp, ()) = tokio::join!(svc.oneshot(req), async {
                let (req, send) = handle.next_request().await.unwrap();
                assert!(cpt_headers(req.headers()).is_empty());
                send.send_response(Response::new(Full::new(Bytes::from_static(b"out"))));
            });
            let resp = resp.unwrap();
            assert!(cpt_headers(resp.headers()).is_empty());
            let body = resp.into_body().collect().await.unwrap();
            assert!(body.trailers().is_none());
            assert_eq!(&body.to_bytes()[..], b"out");
        }
        assert!(sink.is_empty());
    });
}

#[test]
fn server_complete_response_returns_path_in_headers() {
    with_cpt(|sink| async move {
        let layer = ServerLayer::grpc("S")
            .with_trust(SharedSecret::new("s3cret"))
            .with_sampler(());
        let (svc, mut handle): (Mock<Full<Bytes>>, MockHandle<Full<Bytes>>) = mock::pair();
        let svc = layer.clone().layer(svc);
        {
            let (resp, ()) = tokio::join!(svc.oneshot(asking_request()), async {
                let (_req, send) = handle.next_request().await.unwrap();
                send.send_response(Response::new(Full::new(Bytes::from_static(b"out"))));
            });
            let resp = resp.unwrap();
            let path = decode(resp.headers().get(header::PATH).expect("path in headers"));
            assert_eq!(&*path.frames()[0].name, "/pkg.S/Method");
            assert_eq!(&*path.frames()[0].service, "S");
            let body = resp.into_body().collect().await.unwrap();
            assert!(body.trailers().is_none(), "complete: no trailers added");
        }
        assert!(sink.is_empty(), "the caller records, not S");
        assert_eq!(layer.stats().paths_returned, 1);
    });
}

/// A body that is not ready at first, then yields one data frame.
struct Later(u8);

impl Body for Later {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, Self::Error>>> {
        self.0 += 1;
        match self.0 {
            1 => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            2 => Poll::Ready(Some(Ok(BodyFrame::data(Bytes::from_static(b"item"))))),
            _ => Poll::Ready(None),
        }
    }
}

#[test]
fn server_streaming_response_returns_path_in_trailers() {
    with_cpt(|_sink| async move {
        let layer = ServerLayer::grpc("S")
            .with_trust(SharedSecret::new("s3cret"))
            .with_sampler(());
        let (svc, mut handle): (Mock<Later>, MockHandle<Later>) = mock::pair();
        let svc = layer.layer(svc);
        {
            let (resp, ()) = tokio::join!(svc.oneshot(asking_request()), async {
                let (_req, send) = handle.next_request().await.unwrap();
                send.send_response(Response::new(Later(0)));
            });
            let resp = resp.unwrap();
            assert!(resp.headers().get(header::PATH).is_none(), "not in headers");
            let body = resp.into_body().collect().await.unwrap();
            let trailers = body.trailers().expect("a trailers frame added").clone();
            assert_eq!(&body.to_bytes()[..], b"item");
            let path = decode(trailers.get(header::PATH).expect("path in trailers"));
            assert_eq!(&*path.frames()[0].name, "/pkg.S/Method");
        }
    });
}

#[test]
fn client_sends_metadata_only_when_traced_and_merges_path() {
    with_cpt(|sink| async move {
        let layer = ClientLayer::grpc("S").with_caller_secret("s3cret");
        {
            // Untraced: the request goes out untouched.
            let (svc, mut handle): (Mock<Full<Bytes>>, MockHandle<Full<Bytes>>) = mock::pair();
            let svc = layer.layer(svc);
            let req = Request::post("http://s/pkg.S/Method")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let (resp, ()) = tokio::join!(svc.oneshot(req), async {
                let (req, send) = handle.next_request().await.unwrap();
                assert!(
                    cpt_headers(req.headers()).is_empty(),
                    "untraced adds nothing"
                );
                send.send_response(Response::new(Full::new(Bytes::new())));
            });
            resp.unwrap().into_body().collect().await.unwrap();

            // Traced: trigger, want-path and the secret go out; the callee's
            // path comes back in the headers and is merged.
            let root = tracing::info_span!("root");
            request::begin(
                &root,
                RequestOptions::new(Some(Trigger::Sampled)).with_service("C"),
            );
            let (svc, mut handle): (Mock<Full<Bytes>>, MockHandle<Full<Bytes>>) = mock::pair();
            let svc = layer.layer(svc);
            let req = Request::post("http://s/pkg.S/Method")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let call = async {
                let resp = svc.oneshot(req).await.unwrap();
                resp.into_body().collect().await.unwrap()
            };
            let (_, ()) =
                tokio::join!(tracing::Instrument::instrument(call, root.clone()), async {
                    let (req, send) = handle.next_request().await.unwrap();
                    let h = req.headers();
                    assert_eq!(h[header::TRIGGER], "sampled");
                    assert_eq!(
                        h[header::WANT_PATH],
                        cpt_sdk::codec::VERSION.to_string().as_str()
                    );
                    assert_eq!(h[header::CALLER_AUTH], "s3cret");
                    let mut callee = CriticalPath::new();
                    callee.push_frames(
                        [Frame::new("S", "/pkg.S/Method"), Frame::new("S", "work")],
                        std::time::Duration::from_micros(1),
                        SegmentKind::Busy,
                    );
                    let bytes = cpt_sdk::codec::encode(&callee, &Default::default());
                    use base64::Engine as _;
                    let value = base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes);
                    let mut resp = Response::new(Full::new(Bytes::new()));
                    resp.headers_mut()
                        .insert(header::PATH, value.parse().unwrap());
                    send.send_response(resp);
                });
            let finished = request::finish(&root).expect("the root was traced");
            assert!(
                finished
                    .path
                    .frames()
                    .iter()
                    .any(|f| &*f.name == "work" && &*f.service == "S"),
                "{:?}",
                finished.path
            );
        }
        assert_eq!(layer.stats().callee_path_merged, 1);
        assert_eq!(sink.len(), 1);
    });
}
