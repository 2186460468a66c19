//! The operator's loop end to end: the Figure 1 system and a
//! collector, a credential minted with `cpt force`'s library function, one
//! request sent with it, and `cpt show --wait` finding the forced record and
//! printing a tree over A, B and C whose times sum to the latency. The same
//! request without a credential, or with a wrong one, is not forced.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser as _;
use cpt_collector::cli::{self, Cli, Command};
use cpt_collector::serve::{Collector, ServeConfig};
use cpt_collector::store::{Store, StoreQuery};
use cpt_examples::proto::RunRequest;
use cpt_examples::proto::service_a_client::ServiceAClient;
use cpt_examples::system::{self, Config};
use cpt_exporter::{CollectorClient, Endpoint};
use cpt_sdk::Trigger;
use cpt_sdk::export::Exporter;
use cpt_sdk::layer::CriticalPathLayer;
use tracing_subscriber::prelude::*;

fn parse(args: &[&str]) -> Command {
    Cli::try_parse_from(std::iter::once("cpt").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
        .command
}

fn show_args(args: &[&str]) -> cli::show::ShowArgs {
    match parse(&[&["show"], args].concat()) {
        Command::Show(a) => a,
        _ => unreachable!(),
    }
}

fn force_args(args: &[&str]) -> cli::force::ForceArgs {
    match parse(&[&["force"], args].concat()) {
        Command::Force(a) => a,
        _ => unreachable!(),
    }
}

async fn send(a: SocketAddr, request_id: &str, credential: Option<&str>) {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{a}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ServiceAClient::new(channel);
    // In sequence (CPT Fig. 2a), so that B and C are both on the path
    // whatever the machine's load: in parallel the path follows whichever
    // branch ends last.
    let mut req = tonic::Request::new(RunRequest {
        parallel: false,
        key: 1,
        items: 2,
    });
    req.metadata_mut()
        .insert("x-request-id", request_id.parse().unwrap());
    if let Some(c) = credential {
        req.metadata_mut().insert("x-cpt-force", c.parse().unwrap());
    }
    client.run(req).await.expect("A answers");
}

#[test]
fn forced_request_is_shown_as_a_tree_over_a_b_c_and_unforced_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let store_path = dir.path().join("store.db");
    let key_file = dir.path().join("force.key");
    let services = Config {
        sample_rate: 0.0, // only forced requests are traced
        ..Config::default()
    };
    std::fs::write(&key_file, format!("{}\n", services.force_key)).unwrap();
    // Forced records are served only to a reader with the read token.
    let read_token_file = dir.path().join("read.token");
    std::fs::write(&read_token_file, "op-read-token\n").unwrap();
    let read_token_file = read_token_file.to_str().unwrap();

    // The collector, on a runtime of its own, gRPC ingest + HTTP queries.
    let collector_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let collector = collector_rt
        .block_on(Collector::start(
            ServeConfig::new(&store_path)
                .with_grpc(loopback)
                .with_http(loopback)
                .with_read_token("op-read-token"),
        ))
        .unwrap();
    let grpc = collector.grpc_addr().unwrap();
    let http = format!("http://{}", collector.http_addr().unwrap());

    let client =
        CollectorClient::builder(Endpoint::parse(&format!("grpc://{grpc}")).unwrap()).build();
    let (sink, export) = Exporter::builder().build(client);
    let (layer, handle) = CriticalPathLayer::builder()
        .with_service("demo")
        .with_sink(sink)
        .build();
    let dispatch = tracing::Dispatch::new(
        tracing_subscriber::registry()
            .with(tracing_subscriber::filter::LevelFilter::INFO)
            .with(layer),
    );

    let good = cli::force::mint(&force_args(&[
        "--key-file",
        key_file.to_str().unwrap(),
        "--request-id",
        "op-good",
        "--service",
        "A",
    ]))
    .unwrap();
    let wrong_key = dir.path().join("wrong.key");
    std::fs::write(&wrong_key, "not-the-key").unwrap();
    let wrong = cli::force::mint(&force_args(&[
        "--key-file",
        wrong_key.to_str().unwrap(),
        "--request-id",
        "op-wrong",
        "--service",
        "A",
    ]))
    .unwrap();
    // A credential is valid for its request id only.
    let parsed = cpt_sdk::force::parse(&good.credential).unwrap();
    assert!(parsed.mac_matches(services.force_key.as_bytes(), "op-good"));
    assert!(!parsed.mac_matches(services.force_key.as_bytes(), "op-replayed"));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The services' runtime threads all see the layer (one test in this binary).
    tracing::dispatcher::set_global_default(dispatch).unwrap();
    runtime.block_on(async move {
        let addrs = system::start_all(services).await.unwrap();
        send(addrs.a, &good.request_id, Some(&good.credential)).await;
        send(addrs.a, "op-none", None).await;
        send(addrs.a, &wrong.request_id, Some(&wrong.credential)).await;
        // The good credential on another request id does not force it either.
        send(addrs.a, "op-replayed", Some(&good.credential)).await;
    });

    // `cpt show --wait` against the running collector finds the forced record.
    let text = cli::show::show(&show_args(&[
        "--collector",
        &http,
        "--read-token-file",
        read_token_file,
        "--request-id",
        "op-good",
        "--wait",
        "20s",
    ]))
    .unwrap();
    for frame in ["(A)", "(B)", "(C)", "forced", "latency"] {
        assert!(text.contains(frame), "{frame} missing from:\n{text}");
    }
    assert!(text.contains("★ slowest #1"), "{text}");

    // The record itself: services A, B and C on its path, leaves summing to the latency.
    handle.flush(Duration::from_secs(5));
    assert!(export.flush(Duration::from_secs(10)));
    let store = Store::open_read_only(&store_path).unwrap();
    let by_id = |id: &str| {
        store
            .query(&StoreQuery {
                request_id: Some(id.into()),
                ..StoreQuery::default()
            })
            .unwrap()
            .map(Result::unwrap)
            .collect::<Vec<_>>()
    };
    let found = by_id("op-good");
    assert_eq!(found.len(), 1);
    let record = &found[0];
    assert_eq!(record.trigger, Trigger::Forced);
    let tree = cli::show::tree(record);
    let mut services_seen = BTreeSet::new();
    tree.services(&mut services_seen);
    assert!(
        ["A", "B", "C"].iter().all(|s| services_seen.contains(*s)),
        "{services_seen:?}"
    );
    assert_eq!(u128::from(tree.leaf_sum()), record.latency.as_nanos());
    assert_eq!(u128::from(tree.total_ns), record.latency.as_nanos());

    // Not forced (and, at sample rate 0, not traced at all).
    for id in ["op-none", "op-wrong", "op-replayed"] {
        assert!(by_id(id).is_empty(), "{id} was traced");
        let err = cli::show::show(&show_args(&[
            "--collector",
            &http,
            "--read-token-file",
            read_token_file,
            "--request-id",
            id,
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains(&format!("no record with request id \"{id}\"")),
            "{err}"
        );
    }

    drop(store);
    assert!(export.shutdown_timeout(Duration::from_secs(5)));
    collector_rt.block_on(collector.shutdown()).unwrap();

    // The collector is down: a clear message, and no --flame file written.
    let flame = dir.path().join("op.svg");
    let err = cli::show::show(&show_args(&[
        "--collector",
        &http,
        "--request-id",
        "op-good",
        "--flame",
        flame.to_str().unwrap(),
    ]))
    .unwrap_err()
    .to_string();
    assert!(err.contains("cannot reach the collector"), "{err}");
    assert!(!flame.exists());

    // From the store, with a flame graph.
    let text = cli::show::show(&show_args(&[
        "--store",
        store_path.to_str().unwrap(),
        "--request-id",
        "op-good",
        "--flame",
        flame.to_str().unwrap(),
    ]))
    .unwrap();
    assert!(text.contains("(C)"), "{text}");
    assert!(std::fs::read_to_string(&flame).unwrap().contains("<svg"));
}
