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

fn unbase64(v: &http::HeaderValue) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(v.as_bytes())
        .unwrap()
}

fn base64_value(b: &[u8]) -> http::HeaderValue {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD_NO_PAD
        .encode(b)
        .parse()
        .unwrap()
}

/// A request asking for the path in codec version `want`.
fn asking_request_for(want: &str) -> Request<Full<Bytes>> {
    let mut req = asking_request();
    req.headers_mut()
        .insert(header::WANT_PATH, want.parse().unwrap());
    req
}

#[test]
fn server_answers_each_caller_in_the_highest_version_both_read() {
    with_cpt(|_sink| async move {
        let layer = ServerLayer::grpc("S")
            .with_trust(SharedSecret::new("s3cret"))
            .with_sampler(());
        let mut frames_values = Vec::new();
        for (want, split) in [
            ("2", true),
            ("2", true),
            ("1", false),
            ("9", true),
            ("x", false),
        ] {
            let (svc, mut handle): (Mock<Full<Bytes>>, MockHandle<Full<Bytes>>) = mock::pair();
            let svc = layer.clone().layer(svc);
            let (resp, ()) = tokio::join!(svc.oneshot(asking_request_for(want)), async {
                let (_req, send) = handle.next_request().await.unwrap();
                send.send_response(Response::new(Full::new(Bytes::from_static(b"out"))));
            });
            let resp = resp.unwrap();
            let h = resp.headers();
            let path_value = h.get(header::PATH).expect("path in headers");
            assert!(
                path_value.is_sensitive(),
                "segments are never HPACK-indexed"
            );
            let path = match h.get(header::FRAMES) {
                Some(frames) => {
                    assert!(split, "want {want}: a version 1 caller gets one header");
                    // HPACK indexes a dictionary from its second sighting on.
                    assert_eq!(frames.is_sensitive(), frames_values.is_empty());
                    let limits = Default::default();
                    let dict = cpt_sdk::codec::decode_frames(&unbase64(frames), &limits).unwrap();
                    frames_values.push(frames.clone());
                    cpt_sdk::codec::decode_split(&dict, &unbase64(path_value), &limits).unwrap()
                }
                None => {
                    assert!(
                        !split,
                        "want {want}: a version 2 caller gets the dictionary"
                    );
                    decode(path_value)
                }
            };
            assert_eq!(&*path.frames()[0].name, "/pkg.S/Method");
        }
        // The same frames each time: the same dictionary bytes, and the same
        // header value (its base64 written once, from the callee's cache).
        assert_eq!(frames_values.len(), 3);
        for v in &frames_values[1..] {
            assert_eq!(v, &frames_values[0]);
            assert_eq!(v.as_bytes().as_ptr(), frames_values[0].as_bytes().as_ptr());
        }
        assert_eq!(layer.stats().paths_returned, 5);
    });
}

/// The callee path a mock returns: `name` under the RPC's root frame.
fn callee_path(name: &str, micros: u64) -> CriticalPath {
    let mut callee = CriticalPath::new();
    callee.push_frames(
        [Frame::new("S", "/pkg.S/Method"), Frame::new("S", name)],
        std::time::Duration::from_micros(micros),
        SegmentKind::Busy,
    );
    callee
}

#[test]
fn client_merges_split_paths_and_rejects_a_mismatched_dictionary() {
    with_cpt(|_sink| async move {
        let layer = ClientLayer::grpc("S").with_caller_secret("s3cret");
        let split = |p: &CriticalPath| cpt_sdk::codec::encode_split(p, &Default::default());
        let (a1, a2, b) = (
            split(&callee_path("work", 1)),
            split(&callee_path("work", 2)),
            split(&callee_path("other", 3)),
        );
        assert_eq!(a1.frames, a2.frames);
        // (dictionary, segments, merged): the same dictionary twice, then a
        // dictionary that is not the segments', then segments alone.
        let cases = [
            (Some(&a1.frames), &a1.segments, true),
            (Some(&a2.frames), &a2.segments, true),
            (Some(&b.frames), &a1.segments, false),
            (None, &a1.segments, false),
        ];
        for (i, (frames, segments, merged)) in cases.into_iter().enumerate() {
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
                let h = resp.headers();
                assert!(h.get(header::PATH).is_none() && h.get(header::FRAMES).is_none());
                resp.into_body().collect().await.unwrap()
            };
            let (_, ()) =
                tokio::join!(tracing::Instrument::instrument(call, root.clone()), async {
                    let (req, send) = handle.next_request().await.unwrap();
                    assert_eq!(req.headers()[header::WANT_PATH], "2");
                    let mut resp = Response::new(Full::new(Bytes::new()));
                    if let Some(frames) = frames {
                        resp.headers_mut()
                            .insert(header::FRAMES, base64_value(frames));
                    }
                    resp.headers_mut()
                        .insert(header::PATH, base64_value(segments));
                    send.send_response(resp);
                });
            let finished = request::finish(&root).expect("the root was traced");
            let has_work = finished.path.frames().iter().any(|f| &*f.name == "work");
            assert_eq!(has_work, merged, "case {i}: {:?}", finished.path);
        }
        let stats = layer.stats();
        assert_eq!(stats.callee_path_merged, 2);
        assert_eq!(stats.callee_path_invalid, 2);
    });
}
