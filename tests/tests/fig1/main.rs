//! CPT Figure 1 across real services: one record per traced request at the
//! entry service, whose path nests every service's own path (CPT
//! "Propagation and merging"), and CPT Figure 2a/2b across services.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cpt_examples::proto::service_a_client::ServiceAClient;
use cpt_examples::proto::service_b_client::ServiceBClient;
use cpt_examples::proto::{RunReply, RunRequest, method};
use cpt_examples::system::{self, Config};
use cpt_middleware::{ClientLayer, ServerLayer, SharedSecret};
use cpt_sdk::Trigger;
use cpt_tests::{
    channel, has, has_service, io, render, run, segments, serve_grpc, services, time_where,
};
use tonic::{Request, Response};
use tracing::Instrument;

const SECRET: &str = "fig1-secret";

#[test]
fn cpt_fig1_a_b_c_one_record_nests_all_services() {
    run(|recorder| async move {
        let addrs = system::start_all(Config {
            sample_rate: 1.0,
            ..Config::default()
        })
        .await
        .unwrap();
        let mut client = ServiceAClient::new(channel(addrs.a));
        let t = Instant::now();
        let req = RunRequest {
            parallel: false,
            key: 7,
            items: 2,
        };
        client.run(req).await.unwrap();
        let observed = t.elapsed();

        let records = recorder.wait_for(1).await;
        assert_eq!(
            records.len(),
            1,
            "only the entry service emits: {records:#?}"
        );
        let r = &records[0];
        let shown = render(r);
        assert_eq!(r.service, "A");
        assert_eq!(r.endpoint.as_deref(), Some(method::A_RUN));
        assert_eq!(r.trigger, Trigger::Sampled);
        assert_eq!(
            r.path.total(),
            r.latency,
            "the path sums to A's latency\n{shown}"
        );
        assert!(
            r.latency <= observed,
            "A's latency is within what the client saw\n{shown}"
        );

        let segs = segments(r);
        let rpc_b = "A:B /cpt.example.ServiceB/B1";
        let rpc_c_from_a = "A:C /cpt.example.ServiceC/C1";
        let rpc_c_http = "B:C GET /c1";
        let rpc_c_scan = "B:C /cpt.example.ServiceC/Scan";
        for (stack, _, _) in &segs {
            assert_eq!(
                stack[0],
                format!("A:{}", method::A_RUN),
                "root frame\n{shown}"
            );
            // B's frames sit under A's RPC node for B1.
            if let Some(i) = stack.iter().position(|f| f.starts_with("B:")) {
                assert_eq!(stack[i - 1], rpc_b, "B under A's B1 RPC frame\n{shown}");
            }
            // C's frames sit under one of the RPC nodes that call C.
            if let Some(i) = stack.iter().position(|f| f.starts_with("C:")) {
                assert!(
                    [rpc_c_from_a, rpc_c_http, rpc_c_scan].contains(&stack[i - 1].as_str()),
                    "C under an RPC frame calling C, got {:?}\n{shown}",
                    stack[i - 1]
                );
            }
        }
        // Each service's internal segments are there, under the right frames.
        let under =
            |frames: &[&str]| time_where(r, |(stack, _, _)| frames.iter().all(|f| has(stack, f)));
        assert!(under(&["A:A1"]) > Duration::ZERO, "{shown}");
        assert!(
            under(&[
                "A:A1",
                "A:A2",
                rpc_c_from_a,
                "C:/cpt.example.ServiceC/C1",
                "C:C1"
            ]) > Duration::ZERO,
            "A2 → C1\n{shown}"
        );
        assert!(
            under(&[rpc_b, "B:/cpt.example.ServiceB/B1", "B:B1"]) > Duration::ZERO,
            "B1\n{shown}"
        );
        assert!(
            under(&["B:B1", "B:B2", rpc_c_http, "C:GET /c1", "C:C1"]) > Duration::ZERO,
            "HTTP hop B2 → C1\n{shown}"
        );
        assert!(
            under(&[
                "B:B2",
                rpc_c_scan,
                "C:/cpt.example.ServiceC/Scan",
                "C:C2",
                "C:C1"
            ]) > Duration::ZERO,
            "stream B2 → C2 → C1\n{shown}"
        );
        for service in ["A", "B", "C"] {
            assert!(
                segs.iter().any(|(s, _, _)| has_service(s, service)),
                "{service}\n{shown}"
            );
        }
    });
}

/// A1 calls B1 and A2; B1 does `b1` of I/O, A2 `a2`. Returns A's record.
async fn fig2_system(recorder: &cpt_tests::Recorder, parallel: bool) -> cpt_sdk::Record {
    let b_svc = services::b(|_: Request<RunRequest>| async {
        io("B1", Duration::from_millis(40)).await;
        Ok(Response::new(RunReply { value: 1 }))
    });
    let b_addr = serve_grpc(
        ServerLayer::grpc("B")
            .with_trust(SharedSecret::new(SECRET))
            .with_sampler(()),
        b_svc,
    )
    .await;
    let b = ServiceBClient::new(tower::Layer::layer(
        &ClientLayer::grpc("B").with_caller_secret(SECRET),
        channel(b_addr),
    ));
    let b = Arc::new(b);
    let a_svc = services::a(move |req: Request<RunRequest>| {
        let b = b.clone();
        async move {
            let parallel = req.get_ref().parallel;
            async move {
                io("A1.pre", Duration::from_millis(5)).await;
                let call_b = async { (*b).clone().b1(RunRequest::default()).await };
                let a2 = io("A2", Duration::from_millis(10));
                if parallel {
                    let (r, ()) = tokio::join!(call_b, a2);
                    r?;
                } else {
                    call_b.await?;
                    a2.await;
                }
                io("A1.post", Duration::from_millis(5)).await;
                Ok(Response::new(RunReply { value: 0 }))
            }
            .instrument(tracing::info_span!("A1"))
            .await
        }
    });
    let a_addr = serve_grpc(
        ServerLayer::grpc("A").with_sampler(cpt_tests::always),
        a_svc,
    )
    .await;
    let mut client = ServiceAClient::new(channel(a_addr));
    client
        .run(RunRequest {
            parallel,
            ..Default::default()
        })
        .await
        .unwrap();
    let records = recorder.wait_for(1).await;
    assert_eq!(records.len(), 1, "{records:#?}");
    records.into_iter().next().unwrap()
}

#[test]
fn cpt_fig2a_sequential_across_services() {
    run(|recorder| async move {
        let r = fig2_system(&recorder, false).await;
        let shown = render(&r);
        assert_eq!(r.path.total(), r.latency, "{shown}");
        let b = time_where(&r, |(s, _, _)| has_service(s, "B"));
        let a2 = time_where(&r, |(s, _, _)| has(s, "A:A2"));
        assert!(b >= Duration::from_millis(35), "B1 on the path\n{shown}");
        assert!(
            a2 >= Duration::from_millis(8),
            "sequential A2 on the path\n{shown}"
        );
    });
}

#[test]
fn cpt_fig2b_parallel_across_services() {
    run(|recorder| async move {
        let r = fig2_system(&recorder, true).await;
        let shown = render(&r);
        assert_eq!(r.path.total(), r.latency, "{shown}");
        let b = time_where(&r, |(s, _, _)| has_service(s, "B"));
        assert!(
            b >= Duration::from_millis(35),
            "the slower B1 is on the path\n{shown}"
        );
        assert!(
            !segments(&r).iter().any(|(s, _, _)| has(s, "A:A2")),
            "parallel, faster A2 is off the path\n{shown}"
        );
    });
}
