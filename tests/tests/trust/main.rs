//! CPT "Triggering" across services: who may propagate a trigger, who gets a
//! path back, forced traces and their credentials, and untraced requests.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cpt_examples::proto::service_a_client::ServiceAClient;
use cpt_examples::proto::service_c_client::ServiceCClient;
use cpt_examples::proto::service_c_server::{ServiceC, ServiceCServer};
use cpt_examples::proto::{C1Reply, C1Request, RunReply, RunRequest, method};
use cpt_middleware::{ClientLayer, ForceAuth, ServerLayer, SharedSecret, header};
use cpt_sdk::{SegmentKind, Trigger};
use cpt_tests::{always, channel, has, io, render, run, segments, serve_grpc, services};
use tonic::metadata::{AsciiMetadataKey, MetadataMap, MetadataValue};
use tonic::{Request, Response};
use tracing::Instrument;

const SECRET: &str = "trust-secret";

fn c_service() -> ServiceCServer<impl ServiceC> {
    services::c(
        |req: Request<C1Request>| async move {
            async { io("C1.io", Duration::from_millis(2)).await }
                .instrument(tracing::info_span!("C1"))
                .await;
            Ok(Response::new(C1Reply {
                value: req.get_ref().key,
            }))
        },
        services::no_scan,
    )
}

fn set(md: &mut MetadataMap, name: &http::HeaderName, value: &str) {
    md.insert(
        AsciiMetadataKey::from_bytes(name.as_str().as_bytes()).unwrap(),
        MetadataValue::try_from(value).unwrap(),
    );
}

/// Call C.C1 directly with these request headers; the response metadata
/// (headers and trailers).
async fn raw_c1(addr: SocketAddr, headers: &[(&http::HeaderName, &str)]) -> MetadataMap {
    let mut req = Request::new(C1Request { key: 1 });
    for (name, value) in headers {
        set(req.metadata_mut(), name, value);
    }
    let mut grpc = tonic::client::Grpc::new(channel(addr));
    grpc.ready().await.unwrap();
    let resp = grpc
        .unary::<C1Request, C1Reply, _>(
            req,
            http::uri::PathAndQuery::from_static(method::C_C1),
            tonic_prost_codec(),
        )
        .await
        .unwrap();
    resp.metadata().clone()
}

fn tonic_prost_codec() -> cpt_tests::Codec<C1Request, C1Reply> {
    cpt_tests::Codec::default()
}

fn has_path(md: &MetadataMap) -> bool {
    md.get_bin(header::PATH.as_str()).is_some()
}

#[test]
fn untrusted_caller_gets_no_path() {
    run(|recorder| async move {
        let untrusting = ServerLayer::grpc("C").with_sampler(());
        let addr = serve_grpc(untrusting.clone(), c_service()).await;
        let asks = [
            (&header::TRIGGER, "sampled"),
            (&header::WANT_PATH, "1"),
            (&header::CALLER_AUTH, SECRET),
        ];
        let md = raw_c1(addr, &asks).await;
        assert!(!has_path(&md), "no path for an untrusted caller: {md:?}");
        let stats = untrusting.stats();
        assert_eq!((stats.trigger_untrusted, stats.path_withheld), (1, 1));
        assert!(
            recorder.settled().await.is_empty(),
            "untrusted trigger not honoured"
        );

        // The same request to a service that trusts the secret gets the path.
        let trusting = ServerLayer::grpc("C")
            .with_trust(SharedSecret::new(SECRET))
            .with_sampler(());
        let addr = serve_grpc(trusting.clone(), c_service()).await;
        let md = raw_c1(addr, &asks).await;
        let value = md
            .get_bin(header::PATH.as_str())
            .expect("a trusted caller gets the path");
        let bytes = value.to_bytes().unwrap();
        let path = cpt_sdk::codec::decode(&bytes, &Default::default()).unwrap();
        assert!(
            path.frames()
                .iter()
                .any(|f| &*f.name == "C1" && &*f.service == "C"),
            "{path:?}"
        );
        assert_eq!(trusting.stats().paths_returned, 1);
        assert!(
            recorder.settled().await.is_empty(),
            "the caller, not C, records it"
        );
    });
}

#[test]
fn forced_header_without_valid_credential_is_not_honoured() {
    run(|recorder| async move {
        let layer = ServerLayer::grpc("C")
            .with_sampler(())
            .with_force_auth(ForceAuth::none().hmac_key("ops-key").token("ops-token"));
        let addr = serve_grpc(layer.clone(), c_service()).await;
        let signed_other = ForceAuth::sign("ops-key", "r-other", "C", 300);
        let signed_wrong_key = ForceAuth::sign("not-the-key", "r1", "C", 300);
        // A bare 64-digit MAC: the format before version 1.
        let old_format = "0".repeat(64);
        for (id, cred) in [
            ("r1", "deadbeef"),
            ("r1", signed_other.as_str()),
            ("r1", signed_wrong_key.as_str()),
            ("r1", "ops-toke"),
            // A configured token sent verbatim forces nothing, for no id.
            ("r1", "ops-token"),
            ("r1", old_format.as_str()),
        ] {
            let md = raw_c1(addr, &[(&header::REQUEST_ID, id), (&header::FORCE, cred)]).await;
            assert!(!has_path(&md));
        }
        assert!(
            recorder.settled().await.is_empty(),
            "no forced trace without a valid credential"
        );
        let stats = layer.stats();
        assert_eq!(stats.force_rejected, 6);
        assert_eq!(stats.force_bad_mac, 2);
        assert_eq!(stats.force_old_format, 4);

        let good = ForceAuth::sign("ops-key", "r2", "C", 300);
        let by_token = ForceAuth::sign("ops-token", "r3", "C", 300);
        raw_c1(
            addr,
            &[(&header::REQUEST_ID, "r2"), (&header::FORCE, &good)],
        )
        .await;
        raw_c1(
            addr,
            &[(&header::REQUEST_ID, "r3"), (&header::FORCE, &by_token)],
        )
        .await;
        let records = recorder.wait_for(2).await;
        assert_eq!(records.len(), 2, "{records:#?}");
        assert!(
            records
                .iter()
                .all(|r| r.trigger == Trigger::Forced && r.service == "C")
        );
        assert_eq!(records[0].request_id.as_deref(), Some("r2"));
        assert_eq!(layer.stats().force_rejected, 6);
    });
}

#[test]
fn a_credential_replayed_expired_or_for_another_service_is_refused_and_counted_by_reason() {
    run(|recorder| async move {
        let layer = ServerLayer::grpc("C")
            .with_sampler(())
            .with_force_auth(ForceAuth::none().hmac_key("ops-key"));
        let addr = serve_grpc(layer.clone(), c_service()).await;
        let now = cpt_sdk::force::now_unix_secs();
        let good = ForceAuth::sign("ops-key", "r-good", "C", 300);
        // Minted 7 minutes ago with the default 5-minute lifetime.
        let expired = cpt_sdk::force::mint("ops-key", "r-old", "C", 300, now - 420);
        // Minted for the entry service A, sent straight to C.
        let for_a = ForceAuth::sign("ops-key", "r-a", "A", 300);
        let any = ForceAuth::sign("ops-key", "r-any", "*", 300);
        for (id, cred) in [
            ("r-good", good.as_str()),
            ("r-good", good.as_str()),
            ("r-good", good.as_str()),
            ("r-old", expired.as_str()),
            ("r-a", for_a.as_str()),
            ("r-any", any.as_str()),
        ] {
            raw_c1(addr, &[(&header::REQUEST_ID, id), (&header::FORCE, cred)]).await;
        }
        let records = recorder.wait_for(2).await;
        let ids: Vec<_> = records
            .iter()
            .map(|r| r.request_id.clone().unwrap_or_default())
            .collect();
        assert_eq!(ids, ["r-good", "r-any"], "forced once each, nothing else");
        let stats = layer.stats();
        assert_eq!(stats.force_replayed, 2, "{stats:?}");
        assert_eq!(stats.force_expired, 1, "{stats:?}");
        assert_eq!(stats.force_foreign_service, 1, "{stats:?}");
        assert_eq!(stats.force_rejected, 4, "{stats:?}");
    });
}

/// A (sampling per `a_sampler`) calls C through a client layer. Returns A's address.
async fn a_calling(c_addr: SocketAddr, a_layer: ServerLayer) -> SocketAddr {
    let c = ServiceCClient::new(tower::Layer::layer(
        &ClientLayer::grpc("C").with_caller_secret(SECRET),
        channel(c_addr),
    ));
    let svc = services::a(move |_: Request<RunRequest>| {
        let mut c = c.clone();
        async move {
            let r = c
                .c1(C1Request { key: 5 })
                .instrument(tracing::info_span!("A1"))
                .await?
                .into_inner();
            Ok(Response::new(RunReply { value: r.value }))
        }
    });
    serve_grpc(a_layer, svc).await
}

#[test]
fn sampling_decision_propagates_downstream() {
    run(|recorder| async move {
        let c_layer = ServerLayer::grpc("C")
            .with_trust(SharedSecret::new(SECRET))
            .with_sampler(());
        let c = serve_grpc(c_layer.clone(), c_service()).await;
        let a = a_calling(c, ServerLayer::grpc("A").with_sampler(always)).await;
        ServiceAClient::new(channel(a))
            .run(RunRequest::default())
            .await
            .unwrap();
        let records = recorder.wait_for(1).await;
        assert_eq!(records.len(), 1, "{records:#?}");
        let r = &records[0];
        assert_eq!(r.service, "A");
        assert!(
            segments(r).iter().any(|(s, _, _)| has(s, "C:C1")),
            "C traced because A did, though C never samples\n{}",
            render(r)
        );
        assert_eq!(c_layer.stats().paths_returned, 1);
    });
}

#[test]
fn untrusted_downstream_samples_for_itself() {
    run(|recorder| async move {
        // C does not trust A but samples everything itself: it is then the
        // entry point of its own record, and A sees a blind spot.
        let c = serve_grpc(ServerLayer::grpc("C").with_sampler(always), c_service()).await;
        let a = a_calling(c, ServerLayer::grpc("A").with_sampler(always)).await;
        ServiceAClient::new(channel(a))
            .run(RunRequest::default())
            .await
            .unwrap();
        let records = recorder.wait_for(2).await;
        assert_eq!(records.len(), 2, "{records:#?}");
        let a_rec = records.iter().find(|r| r.service == "A").unwrap();
        let c_rec = records.iter().find(|r| r.service == "C").unwrap();
        assert!(
            segments(a_rec)
                .iter()
                .any(|(_, _, k)| *k == SegmentKind::BlindSpot),
            "{}",
            render(a_rec)
        );
        assert!(
            segments(c_rec).iter().any(|(s, _, _)| has(s, "C:C1")),
            "{}",
            render(c_rec)
        );
    });
}

#[test]
fn untraced_request_produces_no_record_and_no_metadata() {
    run(|recorder| async move {
        // Remember every request header name C receives.
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen2 = seen.clone();
        let inspect = tower::ServiceBuilder::new()
            .map_request(move |req: http::Request<tonic::body::Body>| {
                seen2
                    .lock()
                    .unwrap()
                    .extend(req.headers().keys().map(|k| k.as_str().to_owned()));
                req
            })
            .layer(
                ServerLayer::grpc("C")
                    .with_trust(SharedSecret::new(SECRET))
                    .with_sampler(()),
            );
        let c = serve_grpc(inspect, c_service()).await;
        let a = a_calling(c, ServerLayer::grpc("A").with_sampler(())).await;
        let mut req = Request::new(RunRequest::default());
        set(req.metadata_mut(), &header::REQUEST_ID, "untraced-1");
        let mut grpc = tonic::client::Grpc::new(channel(a));
        grpc.ready().await.unwrap();
        let resp = grpc
            .unary::<RunRequest, RunReply, _>(
                req,
                http::uri::PathAndQuery::from_static(method::A_RUN),
                cpt_tests::Codec::<RunRequest, RunReply>::default(),
            )
            .await
            .unwrap();
        assert!(recorder.settled().await.is_empty(), "no record anywhere");
        let seen = seen.lock().unwrap().clone();
        assert!(!seen.is_empty(), "the inspector saw the call");
        assert!(
            !seen.iter().any(|h| h.starts_with("x-cpt-")),
            "no cpt metadata sent: {seen:?}"
        );
        let back: Vec<_> = resp
            .metadata()
            .keys()
            .map(|k| format!("{k:?}"))
            .filter(|k| k.contains("x-cpt-"))
            .collect();
        assert!(back.is_empty(), "no cpt metadata returned: {back:?}");
    });
}

#[test]
fn entry_record_carries_w3c_trace_id_and_request_id() {
    run(|recorder| async move {
        let c = serve_grpc(ServerLayer::grpc("C").with_sampler(always), c_service()).await;
        raw_c1(
            c,
            &[
                (
                    &header::TRACEPARENT,
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                ),
                (&header::REQUEST_ID, "req-77"),
            ],
        )
        .await;
        raw_c1(c, &[(&header::TRACEPARENT, "00-not-a-trace-id-01")]).await;
        let records = recorder.wait_for(2).await;
        assert_eq!(records.len(), 2, "{records:#?}");
        assert_eq!(
            records[0].trace_id.as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(records[0].request_id.as_deref(), Some("req-77"));
        assert_eq!(records[0].endpoint.as_deref(), Some(method::C_C1));
        assert_eq!(
            records[1].trace_id, None,
            "a malformed traceparent is ignored"
        );
        assert!(
            records[1]
                .request_id
                .as_deref()
                .is_some_and(|id| id.len() == 32),
            "generated id"
        );
    });
}
