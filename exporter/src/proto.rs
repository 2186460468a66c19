//! The wire contract between a service's exporter and `cpt serve`: the
//! ingest API's protobuf messages (`cpt.collector.v1`), generated at build
//! time from `exporter/proto/cpt/collector/v1/collector.proto` by `build.rs`
//! with `protox` and `prost-build` (no `protoc`), the conversion of a
//! [`cpt_sdk::Record`] into them, and the routes and headers a batch travels
//! with.
//!
//! This module is the one source of the contract: the collector links it
//! (without the client) and checks received records against its limits
//! (`cpt_collector::ingest::proto`), whose tests pin every field number.
//!
//! A record's path travels as a frame table plus segments that index into it
//! (the shape of [`CriticalPath`](cpt_sdk::CriticalPath) itself): each
//! distinct frame is sent once.

use std::time::Duration;

use cpt_sdk::path::{Accounting as SdkAccounting, Cause};
use cpt_sdk::{Record as SdkRecord, SegmentKind as SdkKind, Trigger as SdkTrigger};

/// The gRPC service name.
pub const GRPC_SERVICE: &str = "cpt.collector.v1.Collector";
/// The gRPC method path of `Export`.
pub const GRPC_EXPORT_PATH: &str = "/cpt.collector.v1.Collector/Export";
/// The HTTP ingest route.
pub const HTTP_RECORDS_PATH: &str = "/v1/records";
/// Content type of a protobuf [`RecordBatch`] body.
pub const CONTENT_TYPE_PROTOBUF: &str = "application/x-protobuf";
/// The HTTP header and gRPC metadata key that carries a batch's id: 1 to
/// 64 characters of `[0-9A-Za-z_-]`, the same on every resend of the batch.
/// `cpt serve` stores the first batch with a given id and acknowledges
/// later ones without storing them again. Optional: a batch without it is
/// stored every time it arrives.
pub const BATCH_ID_HEADER: &str = "cpt-batch-id";

include!(concat!(env!("OUT_DIR"), "/cpt.collector.v1.rs"));

// === impl Accounting ===

impl Accounting {
    /// The field of `cause`. The one place that names the generated fields:
    /// prost generates a plain struct (no per-field accessor by number), so
    /// this exhaustive match maps [`Cause`] to it; every conversion loops over
    /// [`Cause::ALL`]. A new cause is a compile error here until it has its
    /// field in collector.proto and its arm below.
    pub fn nanos_mut(&mut self, cause: Cause) -> &mut u64 {
        match cause {
            Cause::Network => &mut self.network_nanos,
            Cause::Overcount => &mut self.overcount_nanos,
            Cause::BlindSpot => &mut self.blind_spot_nanos,
            Cause::Unattributed => &mut self.unattributed_nanos,
            Cause::Queueing => &mut self.queueing_nanos,
            Cause::Truncated => &mut self.truncated_nanos,
            Cause::ClockSkew => &mut self.clock_skew_nanos,
        }
    }

    /// The field of `cause`.
    pub fn nanos(mut self, cause: Cause) -> u64 {
        *self.nanos_mut(cause)
    }
}

impl From<&SdkAccounting> for Accounting {
    fn from(a: &SdkAccounting) -> Accounting {
        let mut pb = Accounting::default();
        for (cause, d) in a.iter() {
            *pb.nanos_mut(cause) = nanos(d);
        }
        pb
    }
}

impl From<Accounting> for SdkAccounting {
    fn from(pb: Accounting) -> SdkAccounting {
        SdkAccounting::from_causes(
            Cause::ALL.map(|cause| (cause, Duration::from_nanos(pb.nanos(cause)))),
        )
    }
}

/// A duration in whole nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// === impl Record ===

impl From<&SdkRecord> for Record {
    fn from(r: &SdkRecord) -> Record {
        let path = &r.path;
        let a = &path.accounting;
        Record {
            service: r.service.clone(),
            endpoint: r.endpoint.clone(),
            trigger: match r.trigger {
                SdkTrigger::Sampled => Trigger::Sampled,
                SdkTrigger::Forced => Trigger::Forced,
            } as i32,
            latency_nanos: nanos(r.latency),
            start_unix_nanos: r.start_unix_nanos,
            request_id: r.request_id.clone(),
            trace_id: r.trace_id.clone(),
            labels: r.labels.clone(),
            frames: path
                .frames()
                .iter()
                .map(|f| Frame {
                    name: f.name.to_string(),
                    service: f.service.to_string(),
                    file: f.location.as_ref().map(|l| l.file.to_string()),
                    line: f.location.as_ref().map_or(0, |l| l.line),
                })
                .collect(),
            segments: path
                .segments()
                .iter()
                .map(|s| Segment {
                    stack: s.stack.iter().map(|id| id.0).collect(),
                    duration_nanos: nanos(s.duration),
                    kind: SegmentKind::from(s.kind) as i32,
                    wait: s.kind == SdkKind::Wait,
                })
                .collect(),
            accounting: (!a.is_zero()).then(|| Accounting::from(a)),
        }
    }
}

impl From<SdkKind> for SegmentKind {
    fn from(k: SdkKind) -> SegmentKind {
        match k {
            SdkKind::Busy => SegmentKind::Busy,
            SdkKind::Queueing => SegmentKind::Queueing,
            // A named wait is unattributed with `wait` set (see the .proto).
            SdkKind::Unattributed | SdkKind::Wait => SegmentKind::Unattributed,
            SdkKind::Network => SegmentKind::Network,
            SdkKind::BlindSpot => SegmentKind::BlindSpot,
        }
    }
}

// === impl RecordBatch ===

impl RecordBatch {
    /// The wire form of `records`.
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a SdkRecord>) -> RecordBatch {
        RecordBatch {
            records: records.into_iter().map(Record::from).collect(),
        }
    }
}
