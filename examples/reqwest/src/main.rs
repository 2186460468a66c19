//! Three frameworks on one critical path: a quote service's HTTP front end
//! (`front`, axum) asks an internal pricing service (`pricing`, actix-web)
//! through reqwest, and pricing asks an internal stock service (`stock`,
//! tonic) over gRPC. Every sampled quote's record holds one critical path
//! across the three services, summing exactly to the quote's latency; the
//! program checks that of every record it emitted and fails otherwise.
//!
//! ```sh
//! cargo run -p cpt-example-reqwest -- 20
//! ```
//!
//! Every request is sampled unless `CPT_SAMPLE_RATE` says otherwise; the
//! services trust each other with `CPT_TRUST_SECRET` (a fixed development
//! secret when it is unset). Records go to the collector named by
//! `CPT_COLLECTOR_ENDPOINT`, else to `records.jsonl` in the working
//! directory. The three services run in this one process so that the
//! example is one command; in production each is its own process with the
//! same code.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use cpt_exporter::{CollectorClient, Endpoint};
use cpt_middleware::{ActixServer, ClientLayer, ReqwestMiddleware, Route, ServerLayer};
use cpt_sdk::env::CptEnv;
use cpt_sdk::export::{ExportHandle, Exporter, JsonLines, RecordSink as _};
use cpt_sdk::layer::{CriticalPathLayer, Handle};
use cpt_sdk::trigger::DefaultSampler;
use cpt_sdk::{Record, SegmentKind};
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_tracing::TracingMiddleware;
use tracing::Instrument as _;
use tracing_subscriber::prelude::*;

/// The `Stock` service, generated from `proto/stock/v1/stock.proto` by
/// `build.rs`.
pub mod proto {
    tonic::include_proto!("stock.v1");
}

use proto::stock_server::{Stock, StockServer};
use proto::{LevelReply, LevelRequest};

/// The trust secret when `CPT_TRUST_SECRET` is unset: fine for one process
/// on a laptop, never for production.
const DEV_SECRET: &str = "reqwest-example-secret";

/// The records this process emitted, kept to check them at the end.
type Emitted = Arc<Mutex<Vec<Record>>>;

/// Install cpt: the layer, a sampler (every request unless
/// `CPT_SAMPLE_RATE` is set), and where records go.
fn install_cpt(env: &CptEnv, emitted: Emitted) -> anyhow::Result<(Handle, ExportHandle)> {
    let (sink, export) = match &env.collector_endpoint {
        Some(endpoint) => {
            let client = CollectorClient::builder(Endpoint::parse(endpoint)?)
                .with_env(env)
                .try_build()?;
            Exporter::builder().build(client)
        }
        None => Exporter::builder().build(JsonLines::append("records.jsonl")?),
    };
    let (layer, handle) = CriticalPathLayer::builder()
        .with_service("front")
        .with_sampler(DefaultSampler::new(1.0))
        .with_env(env) // CPT_SAMPLE_RATE, CPT_SAMPLE_MAX_PER_SECOND, CPT_CLOCK
        .with_sink(move |record: Record| {
            emitted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(record.clone());
            sink.emit(record);
        })
        .build();
    tracing_subscriber::registry()
        .with(layer)
        .with(tracing_subscriber::fmt::layer())
        // Keep your own INFO spans; h2, hyper, actix and tower make
        // DEBUG/TRACE spans nobody wants as nodes.
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .init();
    Ok((handle, export))
}

// === stock: tonic ===

#[derive(Debug, Default)]
struct Levels;

#[tonic::async_trait]
impl Stock for Levels {
    async fn level(
        &self,
        req: tonic::Request<LevelRequest>,
    ) -> Result<tonic::Response<LevelReply>, tonic::Status> {
        let units = count_units(req.get_ref().item).await;
        Ok(tonic::Response::new(LevelReply { units }))
    }
}

#[tracing::instrument]
async fn count_units(item: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(3)).await; // a database, say
    1000 - item % 1000
}

async fn serve_stock(listener: tokio::net::TcpListener, secret: String) -> anyhow::Result<()> {
    tonic::transport::Server::builder()
        .layer(
            ServerLayer::grpc("stock")
                .internal()
                .with_trust(cpt_middleware::SharedSecret::new(&secret)),
        )
        .add_service(StockServer::new(Levels))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
        .await?;
    Ok(())
}

// === pricing: actix-web ===

type StockClient =
    proto::stock_client::StockClient<cpt_middleware::Client<tonic::transport::Channel>>;

async fn price(
    item: actix_web::web::Path<u64>,
    stock: actix_web::web::Data<StockClient>,
) -> actix_web::HttpResponse {
    let item = item.into_inner();
    let mut stock = stock.get_ref().clone();
    let units = match stock.level(LevelRequest { item }).await {
        Ok(reply) => reply.into_inner().units,
        Err(status) => {
            return actix_web::HttpResponse::BadGateway().body(format!("stock: {status}"));
        }
    };
    let cents = async {
        tokio::time::sleep(Duration::from_millis(1)).await;
        100 + item % 50 + u64::from(units < 10) * 20
    }
    .instrument(tracing::info_span!("apply_discounts"))
    .await;
    actix_web::HttpResponse::Ok().body(format!("{cents}"))
}

/// Pricing on actix-web, on a system of its own (as `actix_web::main` runs
/// it), one worker.
fn serve_pricing(listener: std::net::TcpListener, stock: SocketAddr, secret: String) {
    std::thread::spawn(move || {
        let served = actix_web::rt::System::new().block_on(async move {
            actix_web::HttpServer::new(move || {
                // Each worker its own channel, made on the worker's runtime.
                let channel = tonic::transport::Endpoint::from_shared(format!("http://{stock}"))
                    .expect("a socket address is a URI")
                    .connect_lazy();
                let channel = tower::ServiceBuilder::new()
                    .layer(ClientLayer::grpc("stock").with_caller_secret(&secret))
                    .service(channel);
                // ANCHOR: actix_server
                actix_web::App::new()
                    .app_data(actix_web::web::Data::new(StockClient::new(channel)))
                    // Internal: follows front's trigger, returns its path.
                    .wrap(ActixServer::from(
                        ServerLayer::http("pricing")
                            .internal()
                            .with_trust(cpt_middleware::SharedSecret::new(&secret)),
                    ))
                    .route("/price/{item}", actix_web::web::get().to(price))
                // ANCHOR_END: actix_server
            })
            .workers(1)
            .listen(listener)?
            .run()
            .await
        });
        if let Err(e) = served {
            eprintln!("pricing stopped: {e}");
        }
    });
}

// === front: axum ===

async fn quote(
    axum::extract::State(pricing): axum::extract::State<(
        reqwest_middleware::ClientWithMiddleware,
        SocketAddr,
    )>,
    axum::extract::Path(item): axum::extract::Path<u64>,
) -> Result<String, (axum::http::StatusCode, String)> {
    let (client, addr) = pricing;
    async { tokio::time::sleep(Duration::from_millis(1)).await }
        .instrument(tracing::info_span!("validate"))
        .await;
    let bad_gateway = |e: String| (axum::http::StatusCode::BAD_GATEWAY, e);
    let resp = client
        .get(format!("http://{addr}/price/{item}"))
        // The RPC node is `pricing GET /price/{item}`, not one per id.
        .with_extension(Route::new("/price/{item}"))
        .send()
        .await
        .map_err(|e| bad_gateway(e.to_string()))?;
    let cents = resp.text().await.map_err(|e| bad_gateway(e.to_string()))?;
    Ok(format!("item {item}: {cents} cents\n"))
}

async fn serve_front(
    listener: tokio::net::TcpListener,
    pricing: SocketAddr,
    secret: String,
) -> anyhow::Result<()> {
    // ANCHOR: reqwest_client
    // One chain per callee, in this order (`with` adds from the outside in):
    // retries outermost, so each attempt is an RPC node and the backoff is
    // the caller's time; then cpt; then reqwest-tracing, whose span ends with
    // the response headers and so must be inside cpt's node (which ends with
    // the body). cpt warns once if it finds itself in another order.
    let retry = ExponentialBackoff::builder().build_with_max_retries(2);
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryTransientMiddleware::new_with_policy(retry))
        .with(ReqwestMiddleware::from(
            ClientLayer::http("pricing").with_caller_secret(&secret),
        ))
        .with(TracingMiddleware::default())
        .build();
    // ANCHOR_END: reqwest_client
    let app = axum::Router::new()
        .route("/quote/{item}", axum::routing::get(quote))
        .with_state((client, pricing))
        // The entry service: samples what its users send.
        .layer(ServerLayer::http("front"));
    axum::serve(listener, app).await?;
    Ok(())
}

// === the check ===

/// What is wrong with a record, if anything: it must be front's, cross all
/// three services, have no blind spot, and sum to its latency.
fn check(record: &Record) -> Result<(), String> {
    let path = &record.path;
    if path.total() != record.latency {
        return Err(format!(
            "path sums to {:?}, latency {:?}",
            path.total(),
            record.latency
        ));
    }
    if let Some(s) = path
        .segments()
        .iter()
        .find(|s| s.kind == SegmentKind::BlindSpot)
    {
        let leaf = path.stack_frames(s).last().map(|f| f.name.to_string());
        return Err(format!("a blind spot at {leaf:?}: a hop returned no path"));
    }
    for (service, name) in [
        ("front", "GET /quote/{item}"),
        ("front", "pricing GET /price/{item}"),
        ("pricing", "GET /price/{item}"),
        ("pricing", "stock /stock.v1.Stock/Level"),
        ("stock", "/stock.v1.Stock/Level"),
        ("stock", "count_units"),
    ] {
        let on_path = path.segments().iter().any(|s| {
            path.stack_frames(s)
                .any(|f| &*f.service == service && &*f.name == name)
        });
        if !on_path {
            return Err(format!("no `{service}: {name}` on the path"));
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let requests: u64 = match std::env::args().nth(1) {
        Some(n) => n
            .parse()
            .with_context(|| format!("the number of requests, not {n:?}"))?,
        None => 20,
    };
    let env = CptEnv::from_env()?;
    let secret = env
        .trust_secret
        .clone()
        .unwrap_or_else(|| DEV_SECRET.to_owned());
    let emitted = Emitted::default();
    let (layer, export) = install_cpt(&env, emitted.clone())?;

    let stock = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let stock_addr = stock.local_addr()?;
    let pricing = std::net::TcpListener::bind("127.0.0.1:0")?;
    let pricing_addr = pricing.local_addr()?;
    let front = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let front_addr = front.local_addr()?;
    tokio::spawn(serve_stock(stock, secret.clone()));
    serve_pricing(pricing, stock_addr, secret.clone());
    tokio::spawn(serve_front(front, pricing_addr, secret));

    // The front end's users: plain HTTP requests, nothing of cpt.
    let users = reqwest::Client::new();
    for item in 0..requests {
        let resp = users
            .get(format!("http://{front_addr}/quote/{item}"))
            .send()
            .await?;
        let status = resp.status();
        let body = resp.text().await?;
        anyhow::ensure!(status.is_success(), "quote {item}: {status} {body}");
    }

    layer.flush(Duration::from_secs(5));
    export.flush(Duration::from_secs(10));
    let records = std::mem::take(&mut *emitted.lock().unwrap_or_else(PoisonError::into_inner));
    let mut bad = 0;
    for r in &records {
        if let Err(why) = check(r) {
            bad += 1;
            eprintln!("record {:?}: {why}", r.request_id);
        }
    }
    println!(
        "{requests} requests; {} records, {} across front (axum), pricing (actix-web) and stock \
         (tonic) summing to their latency; {} exported",
        records.len(),
        records.len() - bad,
        export.exported(),
    );
    export.shutdown_timeout(Duration::from_secs(5));
    anyhow::ensure!(
        bad == 0,
        "{bad} records without one path across the three services"
    );
    anyhow::ensure!(
        env.sample_rate.is_some() || records.len() as u64 == requests,
        "every request is sampled: {requests} requests, {} records",
        records.len()
    );
    Ok(())
}
