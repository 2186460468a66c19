//! A checkout service instrumented with `tracing` and exported to
//! OpenTelemetry with `tracing-opentelemetry` and `opentelemetry-otlp`
//! only: the way most Rust services that already use OpenTelemetry are
//! built. Pointed at `cpt serve --otlp-grpc`, its traces become
//! critical-path records without any cpt crate in the service.
//!
//! `checkout` (a server span) reserves stock and prices the cart at the
//! same time (`tokio::join!`: the longer of the two is on the critical
//! path), then charges the card. Every span is also written as OTLP JSON
//! (one export a line, hex ids) when a spans file is given, for comparing
//! with `cpt traces convert --from otlp`.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

use opentelemetry::trace::{SpanKind, Status, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

/// The known sleeps.
pub const RESERVE: Duration = Duration::from_millis(25);
/// Pricing runs beside reserving, shorter.
pub const PRICE: Duration = Duration::from_millis(10);
/// Charging the card, after both.
pub const CHARGE: Duration = Duration::from_millis(30);

/// Writes each export as one line of OTLP JSON.
#[derive(Debug)]
struct JsonLines {
    path: PathBuf,
    resource: Mutex<Vec<serde_json::Value>>,
}

fn any_value(v: &Value) -> serde_json::Value {
    match v {
        Value::Bool(b) => serde_json::json!({ "boolValue": b }),
        Value::I64(i) => serde_json::json!({ "intValue": i.to_string() }),
        Value::F64(f) => serde_json::json!({ "doubleValue": f }),
        other => serde_json::json!({ "stringValue": other.to_string() }),
    }
}

fn nanos(t: std::time::SystemTime) -> String {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
        .to_string()
}

fn kind(k: &SpanKind) -> i32 {
    match k {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

impl SpanExporter for JsonLines {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans: Vec<serde_json::Value> = batch
            .iter()
            .map(|s| {
                let parent = if s.parent_span_id == opentelemetry::trace::SpanId::INVALID {
                    String::new()
                } else {
                    s.parent_span_id.to_string()
                };
                serde_json::json!({
                    "traceId": s.span_context.trace_id().to_string(),
                    "spanId": s.span_context.span_id().to_string(),
                    "parentSpanId": parent,
                    "name": s.name,
                    "kind": kind(&s.span_kind),
                    "startTimeUnixNano": nanos(s.start_time),
                    "endTimeUnixNano": nanos(s.end_time),
                    "attributes": s.attributes.iter().map(|kv| serde_json::json!({
                        "key": kv.key.as_str(), "value": any_value(&kv.value),
                    })).collect::<Vec<_>>(),
                    "status": { "code": match s.status { Status::Error { .. } => 2, Status::Ok => 1, Status::Unset => 0 } },
                })
            })
            .collect();
        let resource = self.resource.lock().unwrap().clone();
        let line = serde_json::json!({ "resourceSpans": [{
            "resource": { "attributes": resource },
            "scopeSpans": [{ "spans": spans }],
        }]});
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| opentelemetry_sdk::error::OTelSdkError::InternalFailure(e.to_string()))?;
        writeln!(f, "{line}")
            .map_err(|e| opentelemetry_sdk::error::OTelSdkError::InternalFailure(e.to_string()))
    }

    fn set_resource(&mut self, resource: &Resource) {
        *self.resource.lock().unwrap() = resource
            .iter()
            .map(|(k, v)| serde_json::json!({ "key": k.as_str(), "value": any_value(v) }))
            .collect();
    }
}

#[tracing::instrument(fields(otel.kind = "client"))]
async fn reserve_stock() {
    tokio::time::sleep(RESERVE).await;
}

#[tracing::instrument]
async fn price_cart() {
    tokio::time::sleep(PRICE).await;
}

#[tracing::instrument(fields(otel.kind = "client"))]
async fn charge_card() {
    tokio::time::sleep(CHARGE).await;
}

async fn checkout() {
    let span = tracing::info_span!("POST /checkout", otel.kind = "server");
    async {
        tokio::join!(reserve_stock(), price_cart());
        charge_card().await;
    }
    .instrument(span)
    .await;
}

/// Serve `requests` checkouts, exporting their traces over OTLP/gRPC to
/// `endpoint` (e.g. `http://127.0.0.1:4317`), and also as OTLP JSON lines
/// to `spans_file` when given. Returns once every span is exported.
///
/// # Errors
///
/// When the exporter cannot be built or flushed.
pub async fn run(
    endpoint: &str,
    spans_file: Option<&Path>,
    requests: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()?;
    let mut builder = SdkTracerProvider::builder()
        .with_resource(
            Resource::builder()
                .with_service_name("shop")
                .with_attribute(KeyValue::new("host.name", "shop-1"))
                .build(),
        )
        .with_batch_exporter(exporter);
    if let Some(path) = spans_file {
        builder = builder.with_batch_exporter(JsonLines {
            path: path.to_path_buf(),
            resource: Mutex::default(),
        });
    }
    let provider = builder.build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("shop")));
    {
        let _guard = tracing::subscriber::set_default(subscriber);
        for _ in 0..requests {
            checkout().await;
        }
    }
    // Flushes both exporters; blocking, so off the async workers.
    tokio::task::spawn_blocking(move || provider.shutdown()).await??;
    Ok(())
}
