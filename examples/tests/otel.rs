//! The Figure 1 system traced with OpenTelemetry (`Config::otel`, the `fig1`
//! bench's peer configuration): one request to A is one trace, and every
//! server span hangs under the client span of the call that reached it,
//! through gRPC (unary and streaming) and HTTP alike.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cpt_examples::proto::RunRequest;
use cpt_examples::proto::service_a_client::ServiceAClient;
use cpt_examples::system::{self, Config, Work};
use opentelemetry::trace::{SpanKind, TracerProvider as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing::Dispatch;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;

/// Keeps every exported span.
#[derive(Debug, Clone, Default)]
struct Collect(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collect {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

fn no_work() -> Work {
    Work {
        a1: Duration::ZERO,
        a2: Duration::ZERO,
        b1: Duration::ZERO,
        b2: Duration::ZERO,
        c1: Duration::ZERO,
        c2: Duration::ZERO,
    }
}

/// Run one request (parallel or not) through a system with `otel` set as
/// given; the spans exported.
fn one_request(otel: bool, parallel: bool) -> Vec<SpanData> {
    let spans = Collect::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(LevelFilter::INFO)
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test"))),
    );
    let d = dispatch.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || std::mem::forget(tracing::dispatcher::set_default(&d)))
        .build()
        .unwrap();
    let _guard = tracing::dispatcher::set_default(&dispatch);
    runtime.block_on(async {
        let addrs = system::start_all(Config {
            work: no_work(),
            middleware: false,
            otel,
            ..Config::default()
        })
        .await
        .unwrap();
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", addrs.a))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = ServiceAClient::new(channel);
        client
            .run(RunRequest {
                parallel,
                key: 3,
                items: 2,
            })
            .await
            .unwrap();
    });
    // Server spans end with their response bodies, after the client has its
    // reply: let them finish.
    runtime.shutdown_timeout(Duration::from_secs(5));
    provider.force_flush().unwrap();
    spans.0.lock().unwrap().clone()
}

#[test]
fn one_request_is_one_trace_with_every_hop_parented() {
    for parallel in [false, true] {
        let spans = one_request(true, parallel);
        let servers: Vec<_> = spans
            .iter()
            .filter(|s| s.span_kind == SpanKind::Server)
            .collect();
        let clients: Vec<_> = spans
            .iter()
            .filter(|s| s.span_kind == SpanKind::Client)
            .collect();
        // A.Run, B.B1, C.C1 (from A), C's HTTP /c1 and C.Scan (from B).
        assert_eq!(servers.len(), 5, "server spans: {servers:#?}");
        // A→B, A→C, B→C over HTTP, B→C streaming.
        assert_eq!(clients.len(), 4, "client spans: {clients:#?}");
        let trace = servers[0].span_context.trace_id();
        assert!(
            spans.iter().all(|s| s.span_context.trace_id() == trace),
            "one request, one trace: {spans:#?}"
        );
        // Every server span but A's (the test's client sends no
        // traceparent) continues a remote client span.
        let continued: Vec<_> = servers.iter().filter(|s| s.parent_span_is_remote).collect();
        assert_eq!(continued.len(), 4, "parallel {parallel}: {servers:#?}");
        for s in continued {
            assert!(
                clients
                    .iter()
                    .any(|c| c.span_context.span_id() == s.parent_span_id),
                "{:?} is parented to a client span",
                s.name
            );
        }
        // The subcomponents' spans are in the trace too.
        for name in ["A1", "A2", "B1", "B2", "C1", "C2"] {
            assert!(spans.iter().any(|s| s.name == name), "span {name} exported");
        }
    }
}

#[test]
fn without_otel_no_traceparent_travels() {
    // The same subscriber, but the services do not propagate: each server
    // handles its RPC without a client span before it, so no span continues
    // a remote parent and the request falls apart into several traces.
    let spans = one_request(false, false);
    assert!(spans.iter().all(|s| !s.parent_span_is_remote));
    assert!(spans.iter().all(|s| s.span_kind != SpanKind::Server));
}
