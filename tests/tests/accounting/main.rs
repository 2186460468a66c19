//! The accounting of CPT "Propagation and merging": blind spots, undercount
//! (network), overcount, and callee paths that cannot be used. None of them
//! fails the call; the merged total always equals the caller's latency.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use cpt_examples::proto::service_a_client::ServiceAClient;
use cpt_examples::proto::service_c_client::ServiceCClient;
use cpt_examples::proto::service_c_server::{ServiceC, ServiceCServer};
use cpt_examples::proto::{C1Reply, C1Request, RunReply, RunRequest};
use cpt_middleware::{ClientLayer, ServerLayer, SharedSecret, header};
use cpt_sdk::{CriticalPath, Frame, Record, SegmentKind};
use cpt_tests::{
    always, channel, has, io, render, run, segments, serve_grpc, services, time_where,
};
use tonic::{Request, Response};
use tower::layer::util::Identity;
use tower::{Service, ServiceBuilder};
use tracing::Instrument;

const SECRET: &str = "accounting-secret";

fn c_service() -> ServiceCServer<impl ServiceC> {
    services::c(
        |req: Request<C1Request>| async move {
            async { io("C1.io", Duration::from_millis(10)).await }
                .instrument(tracing::info_span!("C1"))
                .await;
            Ok(Response::new(C1Reply {
                value: req.get_ref().key,
            }))
        },
        services::no_scan,
    )
}

/// Service A (always sampling) whose A1 calls C.C1 through `layer`; sends
/// one request and returns A's record.
async fn call_through_a(
    recorder: &cpt_tests::Recorder,
    c_addr: SocketAddr,
    layer: ClientLayer,
) -> Record {
    let c = ServiceCClient::new(tower::Layer::layer(&layer, channel(c_addr)));
    let a_svc = services::a(move |_: Request<RunRequest>| {
        let mut c = c.clone();
        async move {
            let reply = c
                .c1(C1Request { key: 3 })
                .instrument(tracing::info_span!("A1"))
                .await?
                .into_inner();
            Ok(Response::new(RunReply { value: reply.value }))
        }
    });
    let a_addr = serve_grpc(ServerLayer::grpc("A").with_sampler(always), a_svc).await;
    let reply = ServiceAClient::new(channel(a_addr))
        .run(RunRequest::default())
        .await
        .expect("a bad or missing callee path never fails the call")
        .into_inner();
    assert_eq!(reply.value, 3);
    let records = recorder.wait_for(1).await;
    assert_eq!(records.len(), 1, "{records:#?}");
    let r = records.into_iter().next().unwrap();
    assert_eq!(
        r.path.total(),
        r.latency,
        "merged total is exact\n{}",
        render(&r)
    );
    r
}

fn client_layer() -> ClientLayer {
    ClientLayer::grpc("C").with_caller_secret(SECRET)
}

fn c_layer() -> ServerLayer {
    ServerLayer::grpc("C")
        .with_trust(SharedSecret::new(SECRET))
        .with_sampler(())
}

/// The blind-spot time, checking that its leaf names the callee `C`.
fn blind_spot_naming_c(r: &Record) -> Duration {
    let shown = render(r);
    let blind: Vec<_> = segments(r)
        .into_iter()
        .filter(|(_, _, k)| *k == SegmentKind::BlindSpot)
        .collect();
    assert!(!blind.is_empty(), "a blind spot\n{shown}");
    for (stack, _, _) in &blind {
        assert!(
            has(stack, "A:C /cpt.example.ServiceC/C1"),
            "under the RPC frame\n{shown}"
        );
        let leaf = stack.last().unwrap();
        assert!(
            leaf.contains('C'),
            "blind spot names the callee C: {leaf}\n{shown}"
        );
    }
    assert!(
        !segments(r).iter().any(|(s, _, _)| has(s, "C:C1")),
        "no detail from C\n{shown}"
    );
    assert_eq!(
        r.path.accounting.blind_spot,
        time_where(r, |(_, _, k)| *k == SegmentKind::BlindSpot)
    );
    r.path.accounting.blind_spot
}

#[test]
fn blind_spot_callee_without_middleware() {
    run(|recorder| async move {
        let c_addr = serve_grpc(Identity::new(), c_service()).await;
        let layer = client_layer();
        let r = call_through_a(&recorder, c_addr, layer.clone()).await;
        let blind = blind_spot_naming_c(&r);
        assert!(
            blind >= Duration::from_millis(10),
            "the whole call\n{}",
            render(&r)
        );
        assert_eq!(layer.stats().callee_path_missing, 1);
    });
}

#[test]
fn callee_path_is_merged_exactly() {
    run(|recorder| async move {
        let c_addr = serve_grpc(c_layer(), c_service()).await;
        let layer = client_layer();
        let r = call_through_a(&recorder, c_addr, layer.clone()).await;
        let shown = render(&r);
        let c_time = time_where(&r, |(s, _, _)| has(s, "C:C1"));
        assert!(
            c_time >= Duration::from_millis(10),
            "C's C1 under the RPC frame\n{shown}"
        );
        assert_eq!(r.path.accounting.blind_spot, Duration::ZERO, "{shown}");
        assert_eq!(r.path.accounting.overcount, Duration::ZERO, "{shown}");
        assert_eq!(layer.stats().callee_path_merged, 1);
    });
}

/// Delays each request by `0.1` before passing it on: time outside the
/// callee's handler (and outside its root node).
#[derive(Clone)]
struct Delay<S>(S, Duration);

impl<S, R> Service<R> for Delay<S>
where
    S: Service<R> + Clone + Send + 'static,
    S::Future: Send,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: R) -> Self::Future {
        let mut inner = self.0.clone();
        let delay = self.1;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            tower::ServiceExt::ready(&mut inner).await?;
            inner.call(req).await
        })
    }
}

#[test]
fn undercount_delay_outside_callee_handler_is_network() {
    run(|recorder| async move {
        let delay = Duration::from_millis(40);
        let layers = ServiceBuilder::new()
            .layer_fn(move |s| Delay(s, delay))
            .layer(c_layer());
        let c_addr = serve_grpc(layers, c_service()).await;
        let r = call_through_a(&recorder, c_addr, client_layer()).await;
        let shown = render(&r);
        let network = time_where(&r, |(s, _, k)| {
            *k == SegmentKind::Network
                && s.last()
                    .is_some_and(|f| f == "A:C /cpt.example.ServiceC/C1")
        });
        assert!(
            network >= delay,
            "network segment of at least the delay\n{shown}"
        );
        assert!(
            network < delay + Duration::from_millis(50),
            "about the delay\n{shown}"
        );
        assert_eq!(
            r.path.accounting.network,
            time_where(&r, |(_, _, k)| *k == SegmentKind::Network)
        );
        assert!(
            time_where(&r, |(s, _, _)| has(s, "C:C1")) >= Duration::from_millis(10),
            "{shown}"
        );
    });
}

/// Serve C without middleware, adding `value` as the path header to every
/// response: a callee that claims something.
async fn serve_claiming_c(value: http::HeaderValue) -> SocketAddr {
    let layer =
        tower::util::MapResponseLayer::new(move |mut resp: http::Response<tonic::body::Body>| {
            resp.headers_mut().insert(header::PATH, value.clone());
            resp
        });
    serve_grpc(layer, c_service()).await
}

fn encoded(path: &CriticalPath) -> http::HeaderValue {
    let bytes = cpt_sdk::codec::encode(
        path,
        &cpt_sdk::codec::EncodeOptions::new().with_max_bytes(1 << 20),
    );
    let text = base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes);
    http::HeaderValue::from_str(&text).unwrap()
}

#[test]
fn overcount_is_clamped_and_counted() {
    run(|recorder| async move {
        let mut claim = CriticalPath::new();
        let claimed = Duration::from_secs(10);
        claim.push_frames(
            [
                Frame::new("C", "/cpt.example.ServiceC/C1"),
                Frame::new("C", "C1"),
            ],
            claimed,
            SegmentKind::Busy,
        );
        let c_addr = serve_claiming_c(encoded(&claim)).await;
        let r = call_through_a(&recorder, c_addr, client_layer()).await;
        let shown = render(&r);
        assert!(r.latency < Duration::from_secs(1), "{shown}");
        let c_time = time_where(&r, |(s, _, _)| has(s, "C:C1"));
        assert!(
            c_time > Duration::ZERO && c_time < r.latency,
            "scaled into the call\n{shown}"
        );
        let over = r.path.accounting.overcount;
        assert!(
            over > claimed - Duration::from_secs(1) && over < claimed,
            "excess counted: {over:?}\n{shown}"
        );
    });
}

#[test]
fn malformed_path_metadata_becomes_blind_spot() {
    for (name, value) in [
        (
            "not base64",
            http::HeaderValue::from_static("!!not*base64!!"),
        ),
        (
            "not a path",
            http::HeaderValue::from_static("AAECAwQFBgcICQoLDA0ODw"),
        ),
    ] {
        run(|recorder| async move {
            let c_addr = serve_claiming_c(value).await;
            let layer = client_layer();
            let r = call_through_a(&recorder, c_addr, layer.clone()).await;
            blind_spot_naming_c(&r);
            assert_eq!(layer.stats().callee_path_invalid, 1, "case {name}");
        });
    }
}

#[test]
fn oversize_path_metadata_becomes_blind_spot() {
    run(|recorder| async move {
        let mut big = CriticalPath::new();
        for i in 0..300 {
            big.push_frames(
                [
                    Frame::new("C", "/cpt.example.ServiceC/C1"),
                    Frame::new("C", format!("step-{i}")),
                ],
                Duration::from_micros(10),
                SegmentKind::Busy,
            );
        }
        let value = encoded(&big);
        assert!(value.len() > 2048);
        let c_addr = serve_claiming_c(value).await;
        let layer = client_layer().with_max_path_bytes(1024);
        let r = call_through_a(&recorder, c_addr, layer.clone()).await;
        blind_spot_naming_c(&r);
        assert_eq!(layer.stats().callee_path_oversize, 1);
    });
}

#[allow(dead_code)]
fn _assert_infallible(_: Infallible) {}
