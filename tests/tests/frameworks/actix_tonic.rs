//! An actix-web entry service calling tonic with `ClientLayer::grpc`; and
//! actix-web's own server behaviour: root names, forced requests, the path
//! in response headers.

use std::net::SocketAddr;
use std::time::Duration;

use cpt_examples::proto::service_b_client::ServiceBClient;
use cpt_examples::proto::{RunReply, RunRequest};
use cpt_middleware::{ActixServer, ClientLayer, ForceAuth, ServerLayer, SharedSecret, header};
use cpt_tests::{always, serve_grpc, services};
use tonic::{Request, Response, Status};

use crate::support::*;

type BClient = ServiceBClient<cpt_middleware::Client<tonic::transport::Channel>>;

/// tonic's `ServiceB` (`B1`: 5 ms of work) as internal service `service`,
/// trusting [`SECRET`], or without cpt.
async fn serve_b(service: &'static str, cpt: Cpt) -> SocketAddr {
    serve_b_taking(service, cpt, None).await
}

/// [`serve_b`] whose `B1` sleeps `slow` after its work.
async fn serve_b_taking(service: &'static str, cpt: Cpt, slow: Option<Duration>) -> SocketAddr {
    let svc = services::b(move |_: Request<RunRequest>| async move {
        work().await;
        if let Some(d) = slow {
            tokio::time::sleep(d).await;
        }
        Ok::<_, Status>(Response::new(RunReply { value: 1 }))
    });
    match cpt {
        Cpt::Internal => {
            serve_grpc(
                ServerLayer::grpc(service)
                    .internal()
                    .with_trust(SharedSecret::new(SECRET)),
                svc,
            )
            .await
        }
        Cpt::None => serve_grpc(tower::layer::util::Identity::new(), svc).await,
    }
}

/// Entry service `entry` on actix-web (samples everything): `GET /orders/{id}`
/// calls `B1` at `b` as `callee` with `secret`, giving up after `deadline`.
fn serve_entry(
    entry: &'static str,
    callee: &'static str,
    secret: &'static str,
    b: SocketAddr,
    deadline: Duration,
) -> SocketAddr {
    spawn_actix(move || {
        // Made on the worker's runtime: the channel's task runs there.
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{b}"))
            .unwrap()
            .connect_lazy();
        let channel = tower::ServiceBuilder::new()
            .layer(ClientLayer::grpc(callee).with_caller_secret(secret))
            .service(channel);
        actix_web::App::new()
            .app_data(actix_web::web::Data::new(BClient::new(channel)))
            .wrap(ActixServer::from(
                ServerLayer::http(entry)
                    .with_sampler(always)
                    .with_force_auth(ForceAuth::none().hmac_key("ops-key")),
            ))
            .route(
                "/orders/{id}",
                actix_web::web::get().to(move |b: actix_web::web::Data<BClient>| async move {
                    let mut b = b.get_ref().clone();
                    let call = b.b1(RunRequest::default());
                    match tokio::time::timeout(deadline, call).await {
                        Ok(Ok(reply)) => reply.into_inner().value.to_string(),
                        Ok(Err(status)) => format!("error {}", status.code()),
                        Err(_) => "timed out".to_owned(),
                    }
                }),
            )
    })
}

async fn order(entry: SocketAddr) -> String {
    reqwest::get(format!("http://{entry}/orders/42"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[test]
fn actix_entry_to_tonic_merges_the_callees_path_with_exact_sums() {
    rt().block_on(async {
        let b = serve_b("at-b", Cpt::Internal).await;
        let entry = serve_entry("at-merge", "at-b", SECRET, b, Duration::from_secs(5));
        assert_eq!(order(entry).await, "1");
        let r = records_of("at-merge", 1).await.remove(0);
        assert_eq!(
            r.endpoint.as_deref(),
            Some("GET /orders/{id}"),
            "named after the route pattern"
        );
        assert_eq!(
            r.labels.get(cpt_middleware::ROOT_LABEL).map(String::as_str),
            Some("entry")
        );
        assert_sums(&r.path, r.latency);
        assert_merged(
            &r.path,
            "at-b /cpt.example.ServiceB/B1",
            "at-b",
            "/cpt.example.ServiceB/B1",
        );
    });
}

#[test]
fn actix_entry_to_tonic_untrusted_caller_is_a_blind_spot() {
    rt().block_on(async {
        let b = serve_b("at-b-u", Cpt::Internal).await;
        let entry = serve_entry("at-untrusted", "at-b-u", "wrong", b, Duration::from_secs(5));
        assert_eq!(order(entry).await, "1");
        let r = records_of("at-untrusted", 1).await.remove(0);
        assert_sums(&r.path, r.latency);
        assert_blind_spot(&r.path, "at-b-u /cpt.example.ServiceB/B1", WORK);
    });
}

#[test]
fn actix_entry_to_tonic_callee_without_a_path_is_a_blind_spot() {
    rt().block_on(async {
        let b = serve_b("at-b-n", Cpt::None).await;
        let entry = serve_entry("at-nopath", "at-b-n", SECRET, b, Duration::from_secs(5));
        assert_eq!(order(entry).await, "1");
        let r = records_of("at-nopath", 1).await.remove(0);
        assert_sums(&r.path, r.latency);
        assert_blind_spot(&r.path, "at-b-n /cpt.example.ServiceB/B1", WORK);
    });
}

#[test]
fn actix_entry_to_tonic_refused_and_timed_out_calls_end_their_node() {
    rt().block_on(async {
        let entry = serve_entry(
            "at-refused",
            "at-b-r",
            SECRET,
            closed_port(),
            Duration::from_secs(5),
        );
        assert!(order(entry).await.starts_with("error"));
        let r = records_of("at-refused", 1).await.remove(0);
        assert_sums(&r.path, r.latency);
        assert_blind_spot(&r.path, "at-b-r /cpt.example.ServiceB/B1", Duration::ZERO);

        // A callee that takes longer than the caller waits: B1 takes 2 s,
        // the caller gives up after 100 ms (long enough for the lazy
        // channel to connect on a loaded machine, so that the call is on
        // the wire when it is given up).
        let b = serve_b_taking("at-b-t", Cpt::Internal, Some(Duration::from_secs(2))).await;
        let entry = serve_entry(
            "at-timeout",
            "at-b-t",
            SECRET,
            b,
            Duration::from_millis(100),
        );
        assert_eq!(order(entry).await, "timed out");
        let r = records_of("at-timeout", 1).await.remove(0);
        assert_sums(&r.path, r.latency);
        // The deadline's timer starts before tonic makes the call (after
        // its channel is ready): the node is shorter than the deadline.
        assert_blind_spot(&r.path, "at-b-t /cpt.example.ServiceB/B1", Duration::ZERO);
        assert!(r.latency >= Duration::from_millis(100));
    });
}

/// An internal actix-web service: untraced without a trusted trigger; a
/// trusted caller gets the path in the response headers, named after the
/// route pattern; an operator's valid force credential traces it.
#[test]
fn actix_internal_service_follows_trusted_triggers_and_forced_requests() {
    rt().block_on(async {
        let addr = spawn_actix(|| {
            actix_web::App::new()
                .wrap(ActixServer::from(
                    ServerLayer::http("ai-internal")
                        .internal()
                        .with_trust(SharedSecret::new(SECRET))
                        .with_force_auth(ForceAuth::none().hmac_key("ops-key")),
                ))
                .configure(actix_routes)
        });
        let client = reqwest::Client::new();
        let url = format!("http://{addr}/items/9");
        let plain = client.get(&url).send().await.unwrap();
        assert!(plain.headers().get(header::PATH.as_str()).is_none());
        assert_eq!(plain.text().await.unwrap(), "9");

        let asked = client
            .get(&url)
            .header(header::TRIGGER.as_str(), "sampled")
            .header(header::WANT_PATH.as_str(), "1")
            .header(header::CALLER_AUTH.as_str(), SECRET)
            .send()
            .await
            .unwrap();
        let value = asked
            .headers()
            .get(header::PATH.as_str())
            .expect("the path in the headers")
            .clone();
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(value.as_bytes())
            .unwrap();
        let path = cpt_sdk::codec::decode(&bytes, &Default::default()).unwrap();
        let root = &path.frames()[path.segments()[0].stack[0].0 as usize];
        assert_eq!(
            (&*root.service, &*root.name),
            ("ai-internal", "GET /items/{id}")
        );
        assert!(path.total() >= WORK, "{}", show(&path));

        let untrusted = client
            .get(&url)
            .header(header::TRIGGER.as_str(), "sampled")
            .header(header::WANT_PATH.as_str(), "1")
            .send()
            .await
            .unwrap();
        assert!(untrusted.headers().get(header::PATH.as_str()).is_none());

        let forced = client
            .get(&url)
            .header(
                header::FORCE.as_str(),
                ForceAuth::sign("ops-key", "forced-actix-1", "ai-internal", 60),
            )
            .header(header::REQUEST_ID.as_str(), "forced-actix-1")
            .send()
            .await
            .unwrap();
        assert_eq!(forced.text().await.unwrap(), "9");
        let r = records_of("ai-internal", 1).await;
        assert_eq!(r.len(), 1, "only the forced request is recorded");
        assert_eq!(r[0].trigger, cpt_sdk::Trigger::Forced);
        assert_eq!(r[0].request_id.as_deref(), Some("forced-actix-1"));
        assert_sums(&r[0].path, r[0].latency);
    });
}
