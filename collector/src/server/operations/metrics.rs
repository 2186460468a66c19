//! `GET /metrics`: the collector's counters and gauges in the Prometheus
//! text exposition format (version 0.0.4), for any monitoring stack to
//! scrape. Protected like every other read (the read token; the route
//! guard's `Access::Metrics`) unless `cpt serve --metrics-open`.
//!
//! The series read atomics the ingest path and the writer's upkeep already
//! keep ([`Counters`], [`StoreGauges`]); a scrape never touches the store.
//! The format is a few lines per series, written here rather than through
//! a metrics library whose registry would duplicate every counter.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{StatusCode, header};

use crate::server::edge::connections::Refused;
use crate::server::ingest::admission::{BOUNDS, Counters, Histogram, Ingest, Reject};
use crate::server::operations::retention::StoreGauges;

/// Write `h` as the Prometheus histogram `name`: cumulative buckets at
/// [`BOUNDS`], `+Inf`, the sum in seconds and the count.
fn write_histogram(h: &Histogram, out: &mut Exposition, name: &str, help: &str) {
    out.head(name, "histogram", help);
    let mut cumulative = 0;
    for (i, c) in h.counts.iter().enumerate() {
        cumulative += c.load(Ordering::Relaxed);
        let le = BOUNDS.get(i).map_or("+Inf".to_owned(), |b| b.to_string());
        let _ = writeln!(out.text, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
    }
    let sum = h.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
    let _ = writeln!(out.text, "{name}_sum {sum}");
    let _ = writeln!(out.text, "{name}_count {cumulative}");
}

/// The text being written.
struct Exposition {
    text: String,
}

impl Exposition {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.head(name, kind, help);
        let _ = writeln!(self.text, "{name} {value}");
    }
}

/// The exposition of a collector's state.
pub(in crate::server) fn render(ingest: &Ingest, now_unix_nanos: u64) -> String {
    let c: &Counters = &ingest.counters;
    let g: &StoreGauges = &ingest.gauges;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut out = Exposition {
        text: String::with_capacity(4096),
    };
    out.one(
        "cpt_batches_accepted_total",
        "counter",
        "Batches stored and acknowledged.",
        load(&c.accepted_batches),
    );
    out.one(
        "cpt_records_accepted_total",
        "counter",
        "Records acknowledged (stored raw, or, older than the raw window, rolled up when sampled and \
         counted in cpt_records_too_old_total either way).",
        load(&c.accepted_records),
    );
    out.head(
        "cpt_batches_rejected_total",
        "counter",
        "Batches refused for what they were (nothing stored), by reason.",
    );
    for r in Reject::ALL {
        let _ = writeln!(
            out.text,
            "cpt_batches_rejected_total{{reason=\"{}\"}} {}",
            r.as_str(),
            load(&c.rejected_by[r as usize])
        );
    }
    out.one(
        "cpt_batches_duplicate_total",
        "counter",
        "Batches acknowledged without storing: their batch id was committed before (a resend).",
        load(&c.duplicate_batches),
    );
    out.one(
        "cpt_batches_overloaded_total",
        "counter",
        "Requests refused because the collector was behind (429 / RESOURCE_EXHAUSTED).",
        load(&c.overloaded),
    );
    out.one(
        "cpt_batches_store_failed_total",
        "counter",
        "Batches the store failed to commit (503 / UNAVAILABLE; the sender retries).",
        load(&c.store_errors),
    );
    out.one(
        "cpt_records_too_old_total",
        "counter",
        "Records that arrived older than the raw window, not stored raw: sampled ones rolled up, \
         forced ones (never rolled up) not kept.",
        load(&g.too_old),
    );
    out.one(
        "cpt_forced_records_too_old_total",
        "counter",
        "Of cpt_records_too_old_total, the forced records: not kept (no roll-up stands for them).",
        load(&g.too_old_forced),
    );
    write_histogram(
        &c.ack_seconds,
        &mut out,
        "cpt_ingest_ack_seconds",
        "From admission to acknowledgement of each batch written (decode, queue, commit).",
    );
    out.one(
        "cpt_store_file_bytes",
        "gauge",
        "The store's database file, free pages included.",
        load(&g.file_bytes),
    );
    out.one(
        "cpt_store_used_bytes",
        "gauge",
        "The store's pages in use.",
        load(&g.used_bytes),
    );
    out.one(
        "cpt_store_wal_bytes",
        "gauge",
        "The store's write-ahead log.",
        load(&g.wal_bytes),
    );
    if let Some(max) = ingest.max_store_bytes {
        out.one(
            "cpt_store_max_bytes",
            "gauge",
            "--max-store-bytes: the database file plus the WAL are kept under it.",
            max,
        );
    }
    let oldest = load(&g.oldest_start_unix_nanos);
    let age = if oldest == 0 {
        0.0
    } else {
        now_unix_nanos.saturating_sub(oldest) as f64 / 1e9
    };
    out.one(
        "cpt_oldest_raw_record_age_seconds",
        "gauge",
        "Age of the oldest raw record's start (0 when the store holds none).",
        age,
    );
    out.one(
        "cpt_records_deleted_by_retention_total",
        "counter",
        "Raw records deleted by retention (by age or by size): sampled ones after being rolled \
         up, forced ones (never rolled up) once past the raw window or the size bound.",
        load(&g.deleted_by_retention),
    );
    out.one(
        "cpt_forced_records_deleted_by_retention_total",
        "counter",
        "Of cpt_records_deleted_by_retention_total, the forced records.",
        load(&g.deleted_forced),
    );
    out.one(
        "cpt_rollups_deleted_for_size_total",
        "counter",
        "Roll-ups deleted, the oldest periods first, because the store was over --max-store-bytes \
         with no raw record left to delete.",
        load(&g.rollups_deleted_for_size),
    );
    out.head(
        "cpt_rollups",
        "gauge",
        "Roll-ups kept, by resolution (one per period and service endpoint).",
    );
    let _ = writeln!(
        out.text,
        "cpt_rollups{{resolution=\"hour\"}} {}",
        load(&g.hourly_rollups)
    );
    let _ = writeln!(
        out.text,
        "cpt_rollups{{resolution=\"day\"}} {}",
        load(&g.daily_rollups)
    );
    out.one(
        "cpt_rollup_backlog_records",
        "gauge",
        "Records committed but not rolled up yet.",
        load(&g.rollup_backlog),
    );
    out.one(
        "cpt_upkeep_failures_total",
        "counter",
        "Retention or roll-up steps that failed (the log has why; they are retried).",
        load(&g.retention_failures),
    );
    out.one(
        "cpt_open_connections",
        "gauge",
        "Connections open on the gRPC and HTTP ports.",
        ingest.connections.open(),
    );
    out.one(
        "cpt_open_connections_max",
        "gauge",
        "--max-connections (as fitted to the open-file limit).",
        ingest.connections.max(),
    );
    out.one(
        "cpt_open_connections_per_peer_max",
        "gauge",
        "--max-connections-per-peer (as fitted to the open-file limit).",
        ingest.connections.max_per_peer(),
    );
    out.head(
        "cpt_connections_refused_total",
        "counter",
        "Connections closed as soon as accepted, by reason: peer (its address had its share \
         open) or total (both ports had --max-connections open).",
    );
    for r in Refused::ALL {
        let _ = writeln!(
            out.text,
            "cpt_connections_refused_total{{reason=\"{}\"}} {}",
            r.as_str(),
            ingest.connections.refused(r)
        );
    }
    out.one(
        "cpt_receiving_bodies",
        "gauge",
        "Request bodies being received.",
        ingest
            .max_receiving
            .saturating_sub(ingest.receiving.available_permits()),
    );
    out.one(
        "cpt_receiving_bodies_max",
        "gauge",
        "--max-receiving-bodies.",
        ingest.max_receiving,
    );
    out.one(
        "cpt_pending_batches",
        "gauge",
        "Batches admitted and not yet acknowledged.",
        ingest
            .max_pending
            .saturating_sub(ingest.admission.available_permits()),
    );
    out.one(
        "cpt_pending_batches_max",
        "gauge",
        "--max-pending-batches.",
        ingest.max_pending,
    );
    if ingest.otlp_on {
        ingest.otlp.render(&mut out.text);
    }
    out.text
}

pub(in crate::server) fn router(ingest: Arc<Ingest>) -> Router {
    Router::new()
        .route("/metrics", get(get_metrics))
        .with_state(ingest)
}

/// Behind the route guard (`routes.rs`, `Access::Metrics`): the read
/// policy, unless `--metrics-open`.
async fn get_metrics(State(ingest): State<Arc<Ingest>>) -> Response {
    let now = crate::server::store::unix_nanos(std::time::SystemTime::now());
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render(&ingest, now),
    )
        .into_response()
}
