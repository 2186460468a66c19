//! Streaming RPCs: the callee's path travels in the trailers and its segment
//! ends at the stream's last message (CPT's definition), or at its first
//! with `StreamEnd::FirstMessage`; trailers-only errors carry it in headers.

use std::net::SocketAddr;
use std::time::Duration;

use cpt_examples::proto::service_a_client::ServiceAClient;
use cpt_examples::proto::service_c_client::ServiceCClient;
use cpt_examples::proto::service_c_server::{ServiceC, ServiceCServer};
use cpt_examples::proto::{
    C1Reply, C1Request, RunReply, RunRequest, ScanItem, ScanRequest, method,
};
use cpt_middleware::{ClientLayer, ServerLayer, SharedSecret, StreamEnd, header};
use cpt_sdk::CriticalPath;
use cpt_tests::{Codec, always, channel, has, io, render, run, serve_grpc, services, time_where};
use tonic::metadata::{AsciiMetadataKey, MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};
use tracing::Instrument;

const SECRET: &str = "streaming-secret";
const ITEM: Duration = Duration::from_millis(25);

/// C with a streaming `Scan` (each item: C2 doing `ITEM` of I/O) and a `C1`
/// that always fails.
fn c_service() -> ServiceCServer<impl ServiceC> {
    services::c(
        |_: Request<C1Request>| async {
            async { io("C1.io", Duration::from_millis(2)).await }
                .instrument(tracing::info_span!("C1"))
                .await;
            Err::<Response<C1Reply>, _>(Status::not_found("no such key"))
        },
        |req: Request<ScanRequest>| async move {
            let items = req.get_ref().items;
            let stream = futures_util::stream::unfold(0u32, move |i| async move {
                if i >= items {
                    return None;
                }
                async { io("C2.io", ITEM).await }
                    .instrument(tracing::info_span!("C2"))
                    .await;
                Some((
                    Ok::<_, Status>(ScanItem {
                        value: u64::from(i),
                    }),
                    i + 1,
                ))
            });
            Ok(Response::new(Box::pin(stream) as services::ScanStream))
        },
    )
}

fn c_layer() -> ServerLayer {
    ServerLayer::grpc("C")
        .with_trust(SharedSecret::new(SECRET))
        .with_sampler(())
}

fn asking(md: &mut MetadataMap) {
    asking_for(md, "1");
}

/// [`asking`], reading codec version `want`.
fn asking_for(md: &mut MetadataMap, want: &str) {
    for (name, value) in [
        (&header::TRIGGER, "sampled"),
        (&header::WANT_PATH, want),
        (&header::CALLER_AUTH, SECRET),
    ] {
        md.insert(
            AsciiMetadataKey::from_bytes(name.as_str().as_bytes()).unwrap(),
            MetadataValue::try_from(value).unwrap(),
        );
    }
}

fn decode(md: &MetadataMap) -> Option<CriticalPath> {
    let v = md.get_bin(header::PATH.as_str())?;
    Some(cpt_sdk::codec::decode(&v.to_bytes().unwrap(), &Default::default()).unwrap())
}

/// Scan `items` from C as a trusted, traced caller; (header metadata, trailers).
async fn raw_scan(addr: SocketAddr, items: u32) -> (MetadataMap, MetadataMap) {
    raw_scan_reading(addr, items, "1").await
}

/// [`raw_scan`] by a caller reading codec version `want`.
async fn raw_scan_reading(addr: SocketAddr, items: u32, want: &str) -> (MetadataMap, MetadataMap) {
    let mut req = Request::new(ScanRequest { key: 0, items });
    asking_for(req.metadata_mut(), want);
    let mut grpc = tonic::client::Grpc::new(channel(addr));
    grpc.ready().await.unwrap();
    let resp = grpc
        .server_streaming(
            req,
            http::uri::PathAndQuery::from_static(method::C_SCAN),
            Codec::<ScanRequest, ScanItem>::default(),
        )
        .await
        .unwrap();
    let headers = resp.metadata().clone();
    let mut stream = resp.into_inner();
    let mut n = 0;
    while stream.message().await.unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, items);
    let trailers = stream.trailers().await.unwrap().expect("gRPC trailers");
    (headers, trailers)
}

#[test]
fn streaming_path_arrives_in_trailers_and_ends_at_last_message() {
    run(|recorder| async move {
        let addr = serve_grpc(c_layer(), c_service()).await;
        let (headers, trailers) = raw_scan(addr, 3).await;
        assert!(decode(&headers).is_none(), "not in the headers of a stream");
        let path = decode(&trailers).expect("the path is in the trailers");
        assert!(
            path.total() >= 3 * ITEM,
            "the segment covers all three items: {path:?}"
        );
        assert!(path.frames().iter().any(|f| &*f.name == "C2"), "{path:?}");
        assert!(
            recorder.settled().await.is_empty(),
            "the caller records, not C"
        );
    });
}

#[test]
fn stream_end_first_message_option() {
    run(|_recorder| async move {
        let addr = serve_grpc(
            c_layer().with_stream_end(StreamEnd::FirstMessage),
            c_service(),
        )
        .await;
        let (headers, trailers) = raw_scan(addr, 3).await;
        assert!(decode(&headers).is_none());
        let path = decode(&trailers).expect("still in the trailers");
        assert!(path.total() >= ITEM, "covers the first item: {path:?}");
        assert!(
            path.total() < 2 * ITEM,
            "ends at the first message: {path:?}"
        );
    });
}

#[test]
fn trailers_only_error_carries_path_in_headers() {
    run(|_recorder| async move {
        let addr = serve_grpc(c_layer(), c_service()).await;
        let mut req = Request::new(C1Request { key: 1 });
        asking(req.metadata_mut());
        let mut grpc = tonic::client::Grpc::new(channel(addr));
        grpc.ready().await.unwrap();
        let status = grpc
            .unary(
                req,
                http::uri::PathAndQuery::from_static(method::C_C1),
                Codec::<C1Request, C1Reply>::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound);
        let path = decode(status.metadata()).expect("path with the trailers-only status");
        assert!(path.frames().iter().any(|f| &*f.name == "C1"), "{path:?}");
    });
}

#[test]
fn streaming_path_is_merged_into_the_caller() {
    run(|recorder| async move {
        let c_addr = serve_grpc(c_layer(), c_service()).await;
        let c = ServiceCClient::new(tower::Layer::layer(
            &ClientLayer::grpc("C").with_caller_secret(SECRET),
            channel(c_addr),
        ));
        let svc = services::a(move |_: Request<RunRequest>| {
            let mut c = c.clone();
            async move {
                let mut n = 0;
                async {
                    let mut items = c.scan(ScanRequest { key: 0, items: 3 }).await?.into_inner();
                    while items.message().await?.is_some() {
                        n += 1;
                    }
                    Ok::<_, Status>(())
                }
                .instrument(tracing::info_span!("A1"))
                .await?;
                Ok(Response::new(RunReply { value: n }))
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
        let c2 = time_where(r, |(s, _, _)| {
            has(s, "A:C /cpt.example.ServiceC/Scan") && has(s, "C:C2")
        });
        assert!(
            c2 >= 3 * ITEM,
            "all three items' C2 under the Scan RPC frame\n{shown}"
        );
    });
}

#[test]
fn streaming_path_of_a_version_2_caller_arrives_in_trailers_with_its_dictionary() {
    run(|_recorder| async move {
        let addr = serve_grpc(c_layer(), c_service()).await;
        let (headers, trailers) = raw_scan_reading(addr, 2, "2").await;
        assert!(headers.get_bin(header::FRAMES.as_str()).is_none());
        assert!(headers.get_bin(header::PATH.as_str()).is_none());
        let bin = |name: &http::HeaderName| {
            trailers
                .get_bin(name.as_str())
                .unwrap_or_else(|| panic!("{name} in the trailers"))
                .to_bytes()
                .unwrap()
        };
        let limits = Default::default();
        let dictionary = cpt_sdk::codec::decode_frames(&bin(&header::FRAMES), &limits).unwrap();
        let path = cpt_sdk::codec::decode_split(&dictionary, &bin(&header::PATH), &limits).unwrap();
        assert!(path.total() >= 2 * ITEM, "{path:?}");
        assert!(path.frames().iter().any(|f| &*f.name == "C2"), "{path:?}");
    });
}
