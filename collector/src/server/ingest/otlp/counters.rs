//! The OTLP receivers' counters and gauges, and why traces are dropped
//! (`/metrics`).

use std::sync::atomic::{AtomicU64, Ordering};

use super::spans::Refusal;
use crate::traces::model::Reason;

/// Why a trace was dropped (the `reason` label of
/// `cpt_otlp_traces_dropped_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dropped {
    NoRoot,
    MissingParent,
    Cycle,
    Other,
}

impl Dropped {
    pub(crate) const ALL: [Dropped; 4] = [
        Dropped::NoRoot,
        Dropped::MissingParent,
        Dropped::Cycle,
        Dropped::Other,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Dropped::NoRoot => "no_root",
            Dropped::MissingParent => "missing_parent",
            Dropped::Cycle => "parent_cycle",
            Dropped::Other => "invalid",
        }
    }

    pub(crate) fn of(r: &Reason) -> Dropped {
        match r {
            Reason::MissingParent { .. } => Dropped::MissingParent,
            Reason::Cycle { .. } => Dropped::Cycle,
            _ => Dropped::Other,
        }
    }
}

/// The OTLP receivers' counters and gauges (`/metrics`).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) spans: AtomicU64,
    pub(crate) refused: [AtomicU64; Refusal::ALL.len()],
    pub(crate) truncated: AtomicU64,
    pub(crate) restored_spans: AtomicU64,
    pub(crate) unreadable_rows: AtomicU64,
    pub(crate) pending_spans: AtomicU64,
    pub(crate) pending_traces: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) completed_early: AtomicU64,
    pub(crate) completed_rootless: AtomicU64,
    pub(crate) late_spans: AtomicU64,
    pub(crate) dropped_traces: [AtomicU64; Dropped::ALL.len()],
    pub(crate) dropped_spans: [AtomicU64; Dropped::ALL.len()],
    pub(crate) skipped_cpt: AtomicU64,
    pub(crate) layer_records_skipped: AtomicU64,
    pub(crate) records_refused: AtomicU64,
    pub(crate) records_coarsened: AtomicU64,
    pub(crate) records: AtomicU64,
    pub(crate) store_errors: AtomicU64,
}

impl Counters {
    pub(crate) fn drop_trace(&self, why: Dropped, spans: usize) {
        self.dropped_traces[why as usize].fetch_add(1, Ordering::Relaxed);
        self.dropped_spans[why as usize].fetch_add(spans as u64, Ordering::Relaxed);
    }

    /// The series, in the Prometheus text format.
    pub(crate) fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut one = |name: &str, kind: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        };
        one(
            "cpt_otlp_requests_accepted_total",
            "counter",
            "OTLP trace export requests whose spans were held and acknowledged.",
            load(&self.requests),
        );
        one(
            "cpt_otlp_spans_accepted_total",
            "counter",
            "OTLP spans held and acknowledged.",
            load(&self.spans),
        );
        one(
            "cpt_otlp_names_truncated_total",
            "counter",
            "Span names, service names and label values cut to the ingest limits.",
            load(&self.truncated),
        );
        one(
            "cpt_otlp_spans_restored_total",
            "counter",
            "Held spans read back from the store at start.",
            load(&self.restored_spans),
        );
        one(
            "cpt_otlp_held_rows_unreadable_total",
            "counter",
            "Rows of held spans that could not be read back at start: deleted, their spans lost (the log names the trace).",
            load(&self.unreadable_rows),
        );
        one(
            "cpt_otlp_pending_spans",
            "gauge",
            "Spans held until their trace is complete.",
            load(&self.pending_spans),
        );
        one(
            "cpt_otlp_pending_traces",
            "gauge",
            "Traces held until complete.",
            load(&self.pending_traces),
        );
        one(
            "cpt_otlp_late_spans_total",
            "counter",
            "Spans of a trace already completed: dropped.",
            load(&self.late_spans),
        );
        one(
            "cpt_otlp_roots_skipped_total",
            "counter",
            "Roots that made no record because the service sent a cpt record for the same trace.",
            load(&self.skipped_cpt),
        );
        one(
            "cpt_otlp_layer_records_skipped_total",
            "counter",
            "cpt records not stored because a record of the same service and trace was made from its OTLP spans first.",
            load(&self.layer_records_skipped),
        );
        one(
            "cpt_otlp_records_refused_total",
            "counter",
            "Records of completed traces over the ingest limits (or starting too far ahead): not stored.",
            load(&self.records_refused),
        );
        one(
            "cpt_otlp_records_coarsened_total",
            "counter",
            "Records of completed traces whose path was over the ingest limits: coarsened to fit (deepest frames folded into their parents, counted as truncated time), then stored.",
            load(&self.records_coarsened),
        );
        one(
            "cpt_otlp_records_stored_total",
            "counter",
            "Records made from OTLP traces and stored.",
            load(&self.records),
        );
        one(
            "cpt_otlp_store_failed_total",
            "counter",
            "Groups of completed traces the store failed to commit (held again and retried).",
            load(&self.store_errors),
        );
        let _ = writeln!(
            out,
            "# HELP cpt_otlp_spans_refused_total OTLP spans refused on receipt (in the answer's partial success), by reason.\n\
             # TYPE cpt_otlp_spans_refused_total counter"
        );
        for r in Refusal::ALL {
            let _ = writeln!(
                out,
                "cpt_otlp_spans_refused_total{{reason=\"{}\"}} {}",
                r.as_str(),
                load(&self.refused[r as usize])
            );
        }
        let _ = writeln!(
            out,
            "# HELP cpt_otlp_traces_completed_total Traces that left the assembler, by how.\n\
             # TYPE cpt_otlp_traces_completed_total counter"
        );
        for (how, v) in [
            ("complete", &self.completed),
            ("early", &self.completed_early),
            ("rootless", &self.completed_rootless),
        ] {
            let _ = writeln!(
                out,
                "cpt_otlp_traces_completed_total{{how=\"{how}\"}} {}",
                load(v)
            );
        }
        for (name, help, series) in [
            (
                "cpt_otlp_traces_dropped_total",
                "Completed traces that made no record, by reason.",
                &self.dropped_traces,
            ),
            (
                "cpt_otlp_spans_dropped_total",
                "Spans of the traces in cpt_otlp_traces_dropped_total, by reason.",
                &self.dropped_spans,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for d in Dropped::ALL {
                let _ = writeln!(
                    out,
                    "{name}{{reason=\"{}\"}} {}",
                    d.as_str(),
                    load(&series[d as usize])
                );
            }
        }
    }
}
