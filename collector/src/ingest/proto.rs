//! The ingest API's protobuf messages (`cpt.collector.v1`), written by hand.
//!
//! `collector/proto/cpt/collector/v1/collector.proto` is the schema; these
//! `prost` derives keep its field numbers, so cpt builds without `protoc`.
//! The unit tests below pin every field number by decoding hand-assembled
//! bytes, so a renumbering here cannot go unnoticed.
//!
//! A record's path travels as a frame table plus segments that index into it
//! (the shape of [`CriticalPath`] itself): each distinct frame is sent once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cpt_sdk::path::{Accounting as SdkAccounting, CriticalPath, Frame as SdkFrame, Location};
use cpt_sdk::{Record as SdkRecord, SegmentKind as SdkKind, Trigger as SdkTrigger};

/// A batch of records: the request of `Collector/Export` and of
/// `POST /v1/records` with a protobuf body.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RecordBatch {
    /// The records; the batch is stored whole or not at all.
    #[prost(message, repeated, tag = "1")]
    pub records: Vec<Record>,
}

/// The reply to an accepted batch: every record is durable.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct ExportResponse {
    /// How many records were stored.
    #[prost(uint64, tag = "1")]
    pub accepted_records: u64,
}

/// Why a request was traced (`TRIGGER_UNSPECIFIED` is rejected).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Trigger {
    /// Not set: an invalid record.
    Unspecified = 0,
    /// See [`cpt_sdk::Trigger::Sampled`].
    Sampled = 1,
    /// See [`cpt_sdk::Trigger::Forced`].
    Forced = 2,
}

/// Why a segment is on the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum SegmentKind {
    /// See [`cpt_sdk::SegmentKind::Busy`].
    Busy = 0,
    /// See [`cpt_sdk::SegmentKind::Queueing`].
    Queueing = 1,
    /// See [`cpt_sdk::SegmentKind::Unattributed`].
    Unattributed = 2,
    /// See [`cpt_sdk::SegmentKind::Network`].
    Network = 3,
    /// See [`cpt_sdk::SegmentKind::BlindSpot`].
    BlindSpot = 4,
}

/// One record (see [`cpt_sdk::Record`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Record {
    /// The service that received the request.
    #[prost(string, tag = "1")]
    pub service: String,
    /// The endpoint, when known.
    #[prost(string, optional, tag = "2")]
    pub endpoint: Option<String>,
    /// A [`Trigger`].
    #[prost(enumeration = "Trigger", tag = "3")]
    pub trigger: i32,
    /// End-to-end latency; must equal the sum of the segments.
    #[prost(uint64, tag = "4")]
    pub latency_nanos: u64,
    /// Wall-clock start, when known.
    #[prost(uint64, optional, tag = "5")]
    pub start_unix_nanos: Option<u64>,
    /// The service's own request id.
    #[prost(string, optional, tag = "6")]
    pub request_id: Option<String>,
    /// The W3C trace id.
    #[prost(string, optional, tag = "7")]
    pub trace_id: Option<String>,
    /// User labels.
    #[prost(btree_map = "string, string", tag = "8")]
    pub labels: BTreeMap<String, String>,
    /// The path's frame table.
    #[prost(message, repeated, tag = "9")]
    pub frames: Vec<Frame>,
    /// The path's segments, in order.
    #[prost(message, repeated, tag = "10")]
    pub segments: Vec<Segment>,
    /// The path's accounting.
    #[prost(message, optional, tag = "11")]
    pub accounting: Option<Accounting>,
}

/// A frame of the table.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Frame {
    /// Node name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The service the node ran in.
    #[prost(string, tag = "2")]
    pub service: String,
    /// Source file, when known.
    #[prost(string, optional, tag = "3")]
    pub file: Option<String>,
    /// Source line (with `file`).
    #[prost(uint32, tag = "4")]
    pub line: u32,
}

/// A segment: indexes into the frame table, root first.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Segment {
    /// Frame indexes, root first; never empty.
    #[prost(uint32, repeated, tag = "1")]
    pub stack: Vec<u32>,
    /// How long the stack was on the path.
    #[prost(uint64, tag = "2")]
    pub duration_nanos: u64,
    /// A [`SegmentKind`].
    #[prost(enumeration = "SegmentKind", tag = "3")]
    pub kind: i32,
}

/// See [`cpt_sdk::Accounting`].
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Accounting {
    /// Network / undercount.
    #[prost(uint64, tag = "1")]
    pub network_nanos: u64,
    /// Overcount, clamped away.
    #[prost(uint64, tag = "2")]
    pub overcount_nanos: u64,
    /// Blind spots.
    #[prost(uint64, tag = "3")]
    pub blind_spot_nanos: u64,
    /// Unattributed waits.
    #[prost(uint64, tag = "4")]
    pub unattributed_nanos: u64,
    /// Queueing.
    #[prost(uint64, tag = "5")]
    pub queueing_nanos: u64,
    /// Truncated (coarsened) time.
    #[prost(uint64, tag = "6")]
    pub truncated_nanos: u64,
    /// Time cut by clock-skew repair (imported traces).
    #[prost(uint64, tag = "7")]
    pub clock_skew_nanos: u64,
}

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
                })
                .collect(),
            accounting: (!a.is_zero()).then(|| Accounting {
                network_nanos: nanos(a.network),
                overcount_nanos: nanos(a.overcount),
                blind_spot_nanos: nanos(a.blind_spot),
                unattributed_nanos: nanos(a.unattributed),
                queueing_nanos: nanos(a.queueing),
                truncated_nanos: nanos(a.truncated),
                clock_skew_nanos: nanos(a.clock_skew),
            }),
        }
    }
}

impl From<SdkKind> for SegmentKind {
    fn from(k: SdkKind) -> SegmentKind {
        match k {
            SdkKind::Busy => SegmentKind::Busy,
            SdkKind::Queueing => SegmentKind::Queueing,
            SdkKind::Unattributed => SegmentKind::Unattributed,
            SdkKind::Network => SegmentKind::Network,
            SdkKind::BlindSpot => SegmentKind::BlindSpot,
        }
    }
}

impl Record {
    /// Check the record and turn it into the model.
    ///
    /// # Errors
    ///
    /// Names the field when the trigger or a segment kind is unknown or
    /// unspecified, a frame has an empty name or service, a segment's stack
    /// is empty or names a frame the table lacks, or the segments do not sum
    /// to `latency_nanos`.
    pub fn into_record(self) -> Result<SdkRecord, FieldError> {
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
            let kind = match SegmentKind::try_from(s.kind) {
                Ok(SegmentKind::Busy) => SdkKind::Busy,
                Ok(SegmentKind::Queueing) => SdkKind::Queueing,
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
            path.accounting = SdkAccounting {
                network: Duration::from_nanos(a.network_nanos),
                overcount: Duration::from_nanos(a.overcount_nanos),
                blind_spot: Duration::from_nanos(a.blind_spot_nanos),
                unattributed: Duration::from_nanos(a.unattributed_nanos),
                queueing: Duration::from_nanos(a.queueing_nanos),
                truncated: Duration::from_nanos(a.truncated_nanos),
                clock_skew: Duration::from_nanos(a.clock_skew_nanos),
            };
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

// === impl RecordBatch ===

impl RecordBatch {
    /// The wire form of `records`.
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a SdkRecord>) -> RecordBatch {
        RecordBatch {
            records: records.into_iter().map(Record::from).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn fig2a() -> SdkRecord {
        let ms = Duration::from_millis;
        let mut p = CriticalPath::new();
        let a1 = SdkFrame::new("A", "A1");
        let b1 = SdkFrame::new("B", "B1").with_location("b/src/lib.rs", 12);
        p.push_frames([a1.clone()], ms(5), SdkKind::Busy);
        p.push_frames([a1.clone(), b1], ms(20), SdkKind::Busy);
        p.push_frames([a1.clone()], ms(8), SdkKind::Busy);
        p.push_frames([a1, SdkFrame::new("A", "A2")], ms(2), SdkKind::Unattributed);
        p.accounting.unattributed = ms(2);
        let mut r = SdkRecord::new("A", SdkTrigger::Forced, p);
        r.endpoint = Some("/a.A/Run".into());
        r.start_unix_nanos = Some(1_700_000_000_000_000_000);
        r.labels.insert("arm".into(), "b".into());
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
