//! A service traced with cpt, start to finish: a shop whose HTTP front end
//! (`shop`, axum) reserves stock from an internal gRPC service
//! (`inventory`, tonic). Every `CPT_*` variable configures it; records go to
//! the collector named by `CPT_COLLECTOR_ENDPOINT`, else to
//! `records.jsonl` in the working directory.
//!
//! ```sh
//! CPT_SAMPLE_RATE=1 CPT_TRUST_SECRET=dev-secret cargo run -p cpt-quickstart -- 20
//! ```
//!
//! Both services run in this one process so that the example is one
//! command; in production each is its own process with the same code.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use bytes::Bytes;
use cpt_exporter::{CollectorClient, Endpoint};
use cpt_middleware::{ClientLayer, ServerLayer};
use cpt_sdk::env::CptEnv;
use cpt_sdk::export::{ExportHandle, Exporter, JsonLines};
use cpt_sdk::layer::filter::NamedWaits;
use cpt_sdk::layer::{CriticalPathLayer, Handle};
use http_body_util::{BodyExt, Full};
use tokio::net::TcpListener;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;

/// The `Inventory` service, generated from `proto/shop/v1/inventory.proto`
/// by `build.rs`.
pub mod proto {
    tonic::include_proto!("shop.v1");
}

use proto::inventory_server::{Inventory, InventoryServer};
use proto::{ReserveReply, ReserveRequest};

// ANCHOR: install
/// Install cpt in this process: the layer that records traced requests, and
/// where their records go (a collector when `CPT_COLLECTOR_ENDPOINT` is set,
/// else `records.jsonl`). Returns the handles to flush at shutdown.
fn install_cpt(service: &str) -> anyhow::Result<(Handle, ExportHandle)> {
    // Every CPT_* variable, parsed and checked once: a malformed one is an
    // error naming the variable and what it expects.
    let env = CptEnv::from_env()?;
    let (sink, export) = match &env.collector_endpoint {
        Some(endpoint) => {
            let client = CollectorClient::builder(Endpoint::parse(endpoint)?)
                .with_env(&env) // CPT_SPOOL_DIR, CPT_SPOOL_MAX_BYTES
                .try_build()?;
            // The exporter's worker thread ships batches; a request only
            // hands its record to a bounded queue.
            Exporter::builder().build(client)
        }
        None => Exporter::builder().build(JsonLines::append("records.jsonl")?),
    };
    let (layer, handle) = CriticalPathLayer::builder()
        .with_service(service)
        .with_env(&env) // CPT_SAMPLE_RATE, CPT_SAMPLE_MAX_PER_SECOND, CPT_CLOCK
        .with_sink(sink)
        .build();
    // Filters per layer. cpt's keeps your INFO spans (h2, hyper and tower
    // make DEBUG/TRACE spans on every poll that nobody wants as nodes) and
    // sees the few of tokio's spans and events that name what each wait
    // waited on (cpt-sdk's `tokio-resources` feature, built with
    // RUSTFLAGS="--cfg tokio_unstable"; without them tokio makes none). The
    // log keeps INFO.
    let cpt_filter = NamedWaits::new(LevelFilter::INFO);
    tracing_subscriber::registry()
        .with(layer.with_filter(cpt_filter))
        .with(tracing_subscriber::fmt::layer().with_filter(LevelFilter::INFO))
        .init();
    Ok((handle, export))
}
// ANCHOR_END: install

// ANCHOR: grpc_server
/// The inventory: an ordinary tonic service.
#[derive(Debug, Default)]
struct Stock;

#[tonic::async_trait]
impl Inventory for Stock {
    async fn reserve(
        &self,
        req: tonic::Request<ReserveRequest>,
    ) -> Result<tonic::Response<ReserveReply>, tonic::Status> {
        let left = look_up_stock(req.get_ref().item).await;
        Ok(tonic::Response::new(ReserveReply { left }))
    }
}

/// Any `tracing` span inside a traced request is a node of its critical
/// path: `#[instrument]`, `.instrument(span)`, `info_span!`.
#[tracing::instrument]
async fn look_up_stock(item: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(2)).await; // a database, say
    1000 - item % 1000
}

async fn serve_inventory(listener: TcpListener) -> anyhow::Result<()> {
    tonic::transport::Server::builder()
        // An internal service: it traces what a trusted caller propagates
        // (the same CPT_TRUST_SECRET on both sides) and returns its critical
        // path to that caller, or what an operator forces (CPT_FORCE_KEY).
        .layer(ServerLayer::grpc("inventory").internal().with_default_env())
        .add_service(InventoryServer::new(Stock))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
        .await?;
    Ok(())
}
// ANCHOR_END: grpc_server

/// The inventory's client, with cpt's client layer.
type InventoryClient =
    proto::inventory_client::InventoryClient<cpt_middleware::Client<tonic::transport::Channel>>;

// ANCHOR: http_server
async fn serve_shop(listener: TcpListener, inventory: SocketAddr) -> anyhow::Result<()> {
    // ANCHOR: grpc_client
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{inventory}"))?.connect_lazy();
    // Calls made inside a traced request become nodes of its path, carry
    // the trigger (and CPT_TRUST_SECRET) to the callee, and get the callee's
    // path merged in.
    let channel = tower::ServiceBuilder::new()
        .layer(ClientLayer::grpc("inventory").with_default_env())
        .service(channel);
    let inventory = InventoryClient::new(channel);
    // ANCHOR_END: grpc_client
    let app = axum::Router::new()
        .route("/orders/{item}", axum::routing::post(order))
        .with_state(inventory)
        // The entry service: samples the requests its users send
        // (CPT_SAMPLE_RATE). `Router::layer` runs after routing, so root
        // nodes are named after the route: `POST /orders/{item}`.
        .layer(ServerLayer::http("shop").with_default_env());
    // With the peer's address, trust by address (`PeerAllowList`) works too.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

#[tracing::instrument(skip_all)]
async fn order(
    State(mut inventory): State<InventoryClient>,
    Path(item): Path<u64>,
) -> Result<String, StatusCode> {
    let cents = price(item).await;
    let left = inventory
        .reserve(ReserveRequest { item, quantity: 1 })
        .await
        .map_err(|_| StatusCode::BAD_GATEWAY)?
        .into_inner()
        .left;
    Ok(format!("item {item}: {cents} cents, {left} left\n"))
}

#[tracing::instrument]
async fn price(item: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(1)).await;
    100 + item % 50
}
// ANCHOR_END: http_server

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let requests: u64 = match std::env::args().nth(1) {
        Some(n) => n
            .parse()
            .with_context(|| format!("the number of requests, not {n:?}"))?,
        None => 20,
    };
    let (layer, export) = install_cpt("shop")?;

    let inventory = TcpListener::bind("127.0.0.1:0").await?;
    let inventory_addr = inventory.local_addr()?;
    let shop = TcpListener::bind("127.0.0.1:0").await?;
    let shop_addr = shop.local_addr()?;
    tokio::spawn(serve_inventory(inventory));
    tokio::spawn(serve_shop(shop, inventory_addr));

    // The shop's users: plain HTTP requests, nothing of cpt.
    let users = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    for item in 0..requests {
        let req = http_body_util::Full::new(Bytes::new());
        let req =
            axum::http::Request::post(format!("http://{shop_addr}/orders/{item}")).body(req)?;
        let resp = users.request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::ensure!(status.is_success(), "order {item}: {status} {body:?}");
    }

    // ANCHOR: shutdown
    // At shutdown: let the layer finish the paths it is computing, then ship
    // what is queued (bounded waits: a collector that is down never hangs
    // the exit).
    layer.flush(Duration::from_secs(5));
    export.flush(Duration::from_secs(10));
    // ANCHOR_END: shutdown
    println!(
        "{requests} requests; {} records emitted, {} exported, {} failed, {} dropped",
        layer.records_emitted(),
        export.exported(),
        export.failed(),
        export.dropped(),
    );
    export.shutdown_timeout(Duration::from_secs(5));
    Ok(())
}
