//! With the `opentelemetry` feature, a request's record carries the trace id
//! that tracing-opentelemetry gave its root span.
#![cfg(feature = "opentelemetry")]

use cpt_sdk::Trigger;
use cpt_sdk::layer::CriticalPathLayer;
use cpt_sdk::request::{self, RequestOptions};
use cpt_sdk::testing::RecordingSink;
use opentelemetry::trace::TracerProvider as _;
use tracing_subscriber::prelude::*;

#[test]
fn record_carries_the_otel_trace_id() {
    let sink = RecordingSink::new();
    let (layer, _h) = CriticalPathLayer::builder().with_sink(sink.clone()).build();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
    let _g =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(otel).with(layer));

    let root = tracing::info_span!("root");
    assert!(request::begin(
        &root,
        RequestOptions::new(Some(Trigger::Sampled))
    ));
    root.in_scope(|| tracing::info_span!("child").in_scope(|| ()));
    request::finish(&root).unwrap();
    let id = sink.single().trace_id.expect("a trace id");
    assert_eq!(id.len(), 32);
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()) && id != "0".repeat(32));

    // An explicit trace id wins.
    let root = tracing::info_span!("root");
    request::begin(
        &root,
        RequestOptions::new(Some(Trigger::Sampled))
            .with_trace_id("4bf92f3577b34da6a3ce929d0e0e4736"),
    );
    request::finish(&root).unwrap();
    assert_eq!(
        sink.take()[1].trace_id.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
}
