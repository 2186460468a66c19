//! The ingest API's protobuf messages (`cpt.collector.v1`), from the
//! exporter's wire contract ([`cpt_exporter::proto`], generated from
//! `exporter/proto/cpt/collector/v1/collector.proto`: one schema for the
//! sender and the receiver), and what the collector adds to them: a
//! received [`Record`] checked against [`IngestLimits`] and turned into the
//! [`cpt_sdk`] model ([`IntoRecord`]).
//!
//! The unit tests below pin every field number by decoding hand-assembled
//! bytes, so a renumbering in the .proto cannot go unnoticed.
//!
//! A record's path travels as a frame table plus segments that index into it
//! (the shape of [`CriticalPath`] itself): each distinct frame is sent once.

use std::sync::Arc;
use std::time::Duration;

use cpt_sdk::path::{CriticalPath, Frame as SdkFrame, Location};
use cpt_sdk::{Record as SdkRecord, SegmentKind as SdkKind, Trigger as SdkTrigger};

use super::limits::{At, Header, IngestLimits, Over};

pub use cpt_exporter::proto::*;

/// What is wrong with a protobuf record, naming the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    /// The field, relative to the record (`segments[2].stack[0]`).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

fn field_err(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A received record checked and turned into the model: the collector's
/// side of the wire contract (the exporter's is `From<&cpt_sdk::Record>`).
pub trait IntoRecord: Sized {
    /// Check the record and turn it into the model.
    ///
    /// # Errors
    ///
    /// Names the field when the trigger or a segment kind is unknown or
    /// unspecified, a frame has an empty name or service, a segment's stack
    /// is empty or names a frame the table lacks, or the segments do not sum
    /// to `latency_nanos`.
    fn into_record(self) -> Result<SdkRecord, FieldError>;

    /// [`into_record`](IntoRecord::into_record) under `limits`, which are
    /// all checked before anything is built (the expanded size from the
    /// frame table and the segments' indices); also returns the record's
    /// stored size bound.
    ///
    /// # Errors
    ///
    /// As `into_record`, and when the record is over a limit, has no
    /// segment, or has a zero-length segment.
    fn into_record_with(self, limits: &IngestLimits) -> Result<(SdkRecord, usize), FieldError>;
}

impl IntoRecord for Record {
    fn into_record(self) -> Result<SdkRecord, FieldError> {
        self.into_record_with(&IngestLimits::default())
            .map(|(r, _)| r)
    }

    fn into_record_with(self, limits: &IngestLimits) -> Result<(SdkRecord, usize), FieldError> {
        let bytes = self
            .check(limits)
            .map_err(|o| field_err(o.field, o.reason))?;
        self.build().map(|r| (r, bytes))
    }
}

/// The two steps of [`IntoRecord`].
trait Check: Sized {
    fn check(&self, limits: &IngestLimits) -> Result<usize, Over>;
    fn build(self) -> Result<SdkRecord, FieldError>;
}

impl Check for Record {
    /// Every limit, without building anything; returns the stored size.
    fn check(&self, limits: &IngestLimits) -> Result<usize, Over> {
        let mut bytes = limits.header(&Header {
            service: &self.service,
            endpoint: self.endpoint.as_deref(),
            request_id: self.request_id.as_deref(),
            trace_id: self.trace_id.as_deref(),
            labels: &self.labels,
            latency_ns: self.latency_nanos,
            segments: self.segments.len(),
            start_unix_nanos: self.start_unix_nanos,
        })?;
        limits.frames(self.frames.len())?;
        let mut cost = Vec::with_capacity(self.frames.len());
        for (i, f) in self.frames.iter().enumerate() {
            cost.push(limits.frame(
                At::item("frames", i),
                &f.name,
                &f.service,
                f.file.as_deref(),
            )?);
        }
        let mut stack_frames = 0usize;
        for (i, s) in self.segments.iter().enumerate() {
            let at = At::item("segments", i);
            limits.depth(at.field("stack"), s.stack.len())?;
            if s.duration_nanos == 0 {
                return Err(Over {
                    field: at.field("duration_nanos").to_string(),
                    reason: "zero (a segment lasts at least 1 ns)".into(),
                });
            }
            stack_frames += s.stack.len();
            limits.stack_frames(at, stack_frames)?;
            for (j, &f) in s.stack.iter().enumerate() {
                // Out of range is reported by `build` with its own message.
                let Some(c) = cost.get(f as usize) else {
                    return Err(Over {
                        field: format!("{at}.stack[{j}]"),
                        reason: format!("frame {f} out of range ({} frames)", cost.len()),
                    });
                };
                bytes += c;
            }
            limits.record_bytes(at, bytes)?;
        }
        Ok(bytes)
    }

    fn build(self) -> Result<SdkRecord, FieldError> {
        let trigger = match Trigger::try_from(self.trigger) {
            Ok(Trigger::Sampled) => SdkTrigger::Sampled,
            Ok(Trigger::Forced) => SdkTrigger::Forced,
            Ok(Trigger::Unspecified) => {
                return Err(field_err(
                    "trigger",
                    "unspecified (expected SAMPLED or FORCED)",
                ));
            }
            Err(_) => {
                return Err(field_err(
                    "trigger",
                    format!("unknown value {}", self.trigger),
                ));
            }
        };
        if self.service.is_empty() {
            return Err(field_err("service", "empty"));
        }
        let mut path = CriticalPath::new();
        let mut ids = Vec::with_capacity(self.frames.len());
        for (i, f) in self.frames.into_iter().enumerate() {
            if f.name.is_empty() {
                return Err(field_err(format!("frames[{i}].name"), "empty"));
            }
            if f.service.is_empty() {
                return Err(field_err(format!("frames[{i}].service"), "empty"));
            }
            let location = f.file.map(|file| Location {
                file: Arc::from(file),
                line: f.line,
            });
            ids.push(path.intern(SdkFrame {
                service: Arc::from(f.service),
                name: Arc::from(f.name),
                location,
            }));
        }
        let mut sum: u64 = 0;
        for (i, s) in self.segments.into_iter().enumerate() {
            if s.stack.is_empty() {
                return Err(field_err(format!("segments[{i}].stack"), "empty"));
            }
            let stack = s
                .stack
                .iter()
                .enumerate()
                .map(|(j, &f)| {
                    ids.get(f as usize).copied().ok_or_else(|| {
                        field_err(
                            format!("segments[{i}].stack[{j}]"),
                            format!("frame {f} out of range ({} frames)", ids.len()),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            if s.wait && s.kind != SegmentKind::Unattributed as i32 {
                return Err(field_err(
                    format!("segments[{i}].wait"),
                    "set on a segment whose kind is not SEGMENT_KIND_UNATTRIBUTED \
                     (only unattributed waits name a resource)",
                ));
            }
            let kind = match SegmentKind::try_from(s.kind) {
                Ok(SegmentKind::Busy) => SdkKind::Busy,
                Ok(SegmentKind::Queueing) => SdkKind::Queueing,
                Ok(SegmentKind::Unattributed) if s.wait => SdkKind::Wait,
                Ok(SegmentKind::Unattributed) => SdkKind::Unattributed,

                Ok(SegmentKind::Network) => SdkKind::Network,
                Ok(SegmentKind::BlindSpot) => SdkKind::BlindSpot,
                Err(_) => {
                    return Err(field_err(
                        format!("segments[{i}].kind"),
                        format!("unknown value {}", s.kind),
                    ));
                }
            };
            sum = sum.checked_add(s.duration_nanos).ok_or_else(|| {
                field_err(
                    format!("segments[{i}].duration_nanos"),
                    "durations overflow u64 nanoseconds",
                )
            })?;
            path.push(stack, Duration::from_nanos(s.duration_nanos), kind);
        }
        if sum != self.latency_nanos {
            return Err(field_err(
                "latency_nanos",
                format!("is {} but the segments sum to {sum} ns", self.latency_nanos),
            ));
        }
        if let Some(a) = self.accounting {
            path.accounting = a.into();
        }
        Ok(SdkRecord {
            service: self.service,
            endpoint: self.endpoint,
            trigger,
            latency: Duration::from_nanos(self.latency_nanos),
            start_unix_nanos: self.start_unix_nanos,
            request_id: self.request_id,
            trace_id: self.trace_id,
            labels: self.labels,
            path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpt_sdk::path::{Accounting as SdkAccounting, Cause};
    use prost::Message;

    /// CPT Figure 2a with everything a record carries, forced.
    fn fig2a() -> SdkRecord {
        let mut r = cpt_sdk::testing::fixtures::fig2a_record();
        r.trigger = SdkTrigger::Forced;
        r.trace_id = None;
        r
    }

    #[test]
    fn proto_round_trip_is_lossless() {
        let r = fig2a();
        let bytes = RecordBatch::from_records([&r]).encode_to_vec();
        let back = RecordBatch::decode(&*bytes).unwrap();
        assert_eq!(back.records.len(), 1);
        assert_eq!(back.records[0].clone().into_record().unwrap(), r);
    }

    /// A named wait crosses the ingest message as an unattributed segment
    /// with `wait` set; a reader that ignores `wait` sees an unattributed
    /// wait whose leaf names the resource.
    #[test]
    fn named_waits_cross_the_ingest_message() {
        use cpt_sdk::Frame;
        let mut r = fig2a();
        let a1 = r.path.frame(r.path.segments()[0].stack[0]).clone();
        r.path.push_frames(
            [a1, Frame::wait("A", "sleep", None)],
            Duration::from_millis(2),
            SdkKind::Wait,
        );
        r.latency = r.path.total();
        let mut batch = RecordBatch::from_records([&r]);
        let seg = batch.records[0].segments.last().unwrap();
        assert!(seg.wait);
        assert_eq!(seg.kind, SegmentKind::Unattributed as i32);
        let back = RecordBatch::decode(&*batch.encode_to_vec()).unwrap();
        assert_eq!(back.records[0].clone().into_record().unwrap(), r);
        batch.records[0].segments.last_mut().unwrap().wait = false;
        let old = batch.records.remove(0).into_record().unwrap();
        assert_eq!(
            old.path.segments().last().unwrap().kind,
            SdkKind::Unattributed
        );
    }

    /// Field numbers as in collector.proto, checked on hand-built bytes:
    /// tag = field << 3 | wire type.
    #[test]
    fn proto_field_numbers_match_collector_proto() {
        #[rustfmt::skip]
        let record: Vec<u8> = vec![
            0x0a, 1, b'S',                  // 1 service
            0x12, 1, b'e',                  // 2 endpoint
            0x18, 2,                        // 3 trigger = FORCED
            0x20, 7,                        // 4 latency_nanos
            0x28, 9,                        // 5 start_unix_nanos
            0x32, 1, b'r',                  // 6 request_id
            0x3a, 1, b't',                  // 7 trace_id
            0x42, 6, 0x0a, 1, b'k', 0x12, 1, b'v', // 8 labels {k: v}
            0x4a, 11, 0x0a, 1, b'x', 0x12, 1, b'S', 0x1a, 1, b'f', 0x20, 3, // 9 frame x @ f:3
            0x52, 7, 0x0a, 1, 0, 0x10, 7, 0x18, 4, // 10 segment [0] 7ns BLIND_SPOT
            0x5a, 14, 0x08, 1, 0x10, 2, 0x18, 3, 0x20, 4, 0x28, 5, 0x30, 6, 0x38, 8, // 11 accounting
        ];
        let mut batch = vec![0x0a, record.len() as u8];
        batch.extend(&record);
        let r = RecordBatch::decode(&*batch)
            .unwrap()
            .records
            .remove(0)
            .into_record()
            .unwrap();
        assert_eq!(
            r.to_json(),
            r#"{"service":"S","endpoint":"e","trigger":"forced","latency_ns":7,"start_unix_nanos":9,"request_id":"r","trace_id":"t","labels":{"k":"v"},"path":[{"stack":[{"name":"x","file":"f","line":3}],"ns":7,"kind":"blind_spot"}],"accounting":{"network_ns":1,"overcount_ns":2,"blind_spot_ns":3,"unattributed_ns":4,"queueing_ns":5,"truncated_ns":6,"clock_skew_ns":8}}"#
        );
        let resp = ExportResponse::decode(&[0x08, 5][..]).unwrap();
        assert_eq!(resp.accepted_records, 5);
    }

    /// `nanos_mut` maps each cause to the field numbered
    /// `Cause::field_number()`, and each cause survives the round trip
    /// through the sdk's accounting on its own.
    #[test]
    fn accounting_fields_are_numbered_by_cause() {
        for cause in Cause::ALL {
            let mut pb = Accounting::default();
            *pb.nanos_mut(cause) = 5;
            let tag = u8::try_from(cause.field_number() << 3).unwrap();
            assert_eq!(pb.encode_to_vec(), [tag, 5], "{cause:?}");
            let sdk = SdkAccounting::from(pb);
            assert_eq!(sdk.get(cause), Duration::from_nanos(5), "{cause:?}");
            assert_eq!(sdk.iter().filter(|(_, d)| !d.is_zero()).count(), 1);
            assert_eq!(Accounting::from(&sdk), pb, "{cause:?}");
        }
    }

    #[rustfmt::skip]
    fn bad_cases() -> Vec<(&'static str, Record, &'static str)> {
        let good = Record::from(&fig2a());
        let mut v = Vec::new();
        let mut r = good.clone(); r.trigger = 0;
        v.push(("unspecified trigger", r, "trigger: unspecified (expected SAMPLED or FORCED)"));
        let mut r = good.clone(); r.trigger = 9;
        v.push(("unknown trigger", r, "trigger: unknown value 9"));
        let mut r = good.clone(); r.segments[1].stack[1] = 40;
        v.push(("frame out of range", r, "segments[1].stack[1]: frame 40 out of range (3 frames)"));
        let mut r = good.clone(); r.segments[2].stack.clear();
        v.push(("empty stack", r, "segments[2].stack: empty"));
        let mut r = good.clone(); r.segments[0].kind = 77;
        v.push(("unknown kind", r, "segments[0].kind: unknown value 77"));
        let mut r = good.clone(); r.segments[0].wait = true;
        v.push(("wait on a busy segment", r, "segments[0].wait: set on a segment whose kind is not SEGMENT_KIND_UNATTRIBUTED (only unattributed waits name a resource)"));
        let mut r = good.clone(); r.latency_nanos += 1;
        v.push(("sum mismatch", r, "latency_nanos: is 35000001 but the segments sum to 35000000 ns"));
        let mut r = good.clone(); r.frames[0].name.clear();
        v.push(("empty frame name", r, "frames[0].name: empty"));
        let mut r = good; r.service.clear();
        v.push(("empty service", r, "service: empty"));
        v
    }

    #[test]
    fn proto_bad_records_name_the_field() {
        for (name, rec, want) in bad_cases() {
            let err = rec.into_record().unwrap_err().to_string();
            assert_eq!(err, want, "{name}");
        }
    }
}
