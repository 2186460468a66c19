//! Decoding record batches as they arrive: JSON Lines and protobuf bodies,
//! and the gRPC `cpt.collector.v1.Collector/Export` method.
//!
//! A batch is checked whole before anything is stored: one bad record
//! rejects the batch, and the error names every bad line (JSON Lines) or the
//! record and field (protobuf), up to [`MAX_PROBLEMS`] of them. The wire
//! messages are in [`proto`]; `collector/proto/cpt/collector/v1/collector.proto`
//! is their schema.

use std::fmt;
use std::io::BufRead;

use std::sync::atomic::{AtomicBool, Ordering};

use cpt_sdk::Record;

pub mod limits;
pub mod proto;

pub use limits::IngestLimits;

#[cfg(feature = "server")]
pub(crate) mod codec;

/// Content type of a JSON Lines body.
pub const CONTENT_TYPE_JSON_LINES: &str = "application/x-ndjson";
// The routes, the protobuf content type and the batch id header are the
// exporter's wire contract, defined once for both sides.
pub use cpt_exporter::proto::{
    BATCH_ID_HEADER, CONTENT_TYPE_PROTOBUF, GRPC_EXPORT_PATH, GRPC_SERVICE, HTTP_RECORDS_PATH,
};
/// At most this many problems are listed in a [`BatchError`]; the rest are
/// counted.
pub const MAX_PROBLEMS: usize = 20;

/// The encodings of a batch body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFormat {
    /// One JSON record per line (`application/x-ndjson`, also accepted as
    /// `application/jsonl`, `application/json-lines` and `application/json`).
    JsonLines,
    /// A [`proto::RecordBatch`] (`application/x-protobuf`, also accepted as
    /// `application/protobuf` and `application/vnd.google.protobuf`).
    Protobuf,
}

impl BodyFormat {
    /// The format a `Content-Type` value names (parameters such as
    /// `; charset=utf-8` are ignored), or `None`.
    pub fn from_content_type(value: &str) -> Option<BodyFormat> {
        let mime = value.split(';').next().unwrap_or("").trim();
        match mime.to_ascii_lowercase().as_str() {
            "application/x-ndjson"
            | "application/ndjson"
            | "application/jsonl"
            | "application/json-lines"
            | "application/x-jsonlines"
            | "application/json" => Some(BodyFormat::JsonLines),
            "application/x-protobuf"
            | "application/protobuf"
            | "application/vnd.google.protobuf" => Some(BodyFormat::Protobuf),
            _ => None,
        }
    }

    /// Decode a whole batch body in this format.
    ///
    /// # Errors
    ///
    /// A [`BatchError`] listing what is wrong; then no record of the batch
    /// may be stored.
    pub fn decode(self, body: &[u8]) -> Result<Vec<Record>, BatchError> {
        self.decode_with(body, &IngestLimits::default(), &AtomicBool::new(false))
    }

    /// [`BodyFormat::decode`] under `limits`; gives up (with a
    /// [`BatchError`] saying so) as soon as `cancelled` is set.
    ///
    /// # Errors
    ///
    /// As [`BodyFormat::decode`], and when a record or the batch is over a
    /// limit.
    pub fn decode_with(
        self,
        body: &[u8],
        limits: &IngestLimits,
        cancelled: &AtomicBool,
    ) -> Result<Vec<Record>, BatchError> {
        match self {
            BodyFormat::JsonLines => decode_json_lines_with(body, limits, cancelled),
            BodyFormat::Protobuf => decode_protobuf_with(body, limits, cancelled),
        }
    }
}

fn cancelled_error() -> BatchError {
    BatchError::new("body", "the client went away; decoding abandoned")
}

/// One thing wrong with a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where: `line 3` (JSON Lines), `records[2].segments[0].stack`
    /// (protobuf), or `body`.
    pub at: String,
    /// What is wrong there.
    pub reason: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.reason)
    }
}

/// A rejected batch: nothing of it is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchError {
    problems: Vec<Problem>,
    total: usize,
    clock_ahead: usize,
}

impl BatchError {
    /// A batch error with one problem.
    pub fn new(at: impl Into<String>, reason: impl Into<String>) -> BatchError {
        let mut e = BatchError::empty();
        e.push(at, reason);
        e
    }

    fn empty() -> BatchError {
        BatchError {
            problems: Vec::new(),
            total: 0,
            clock_ahead: 0,
        }
    }

    fn push(&mut self, at: impl Into<String>, reason: impl Into<String>) {
        self.total += 1;
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(Problem {
                at: at.into(),
                reason: reason.into(),
            });
        }
    }

    /// Count a record refused for `field`'s `reason` when it starts too far
    /// ahead of this machine's clock ([`BatchError::clock_ahead`]).
    fn note_clock(&mut self, field: &str, reason: &str) {
        if limits::is_clock_ahead(field, reason) {
            self.clock_ahead += 1;
        }
    }

    /// Records refused only because they start further ahead of this
    /// machine's clock than [`IngestLimits::max_future_skew`] (a sender
    /// whose clock runs ahead).
    pub fn clock_ahead(&self) -> usize {
        self.clock_ahead
    }

    /// The first [`MAX_PROBLEMS`] problems, in order.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// How many problems were found in all.
    pub fn total(&self) -> usize {
        self.total
    }
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batch rejected, nothing stored: ")?;
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        let more = self.total - self.problems.len();
        if more > 0 {
            write!(f, "; and {more} more")?;
        }
        Ok(())
    }
}

impl std::error::Error for BatchError {}

/// Decode a JSON Lines body (blank lines are ignored).
///
/// # Errors
///
/// Every bad line, as `line N: reason` (1-based), when any line is bad, or
/// when the body holds no record at all.
pub fn decode_json_lines(body: &[u8]) -> Result<Vec<Record>, BatchError> {
    decode_json_lines_with(body, &IngestLimits::default(), &AtomicBool::new(false))
}

fn decode_json_lines_with(
    body: &[u8],
    limits: &IngestLimits,
    cancelled: &AtomicBool,
) -> Result<Vec<Record>, BatchError> {
    let mut records = Vec::new();
    let mut err = BatchError::empty();
    let mut stored = 0usize;
    for (line, result) in JsonLines::new(body) {
        if cancelled.load(Ordering::Relaxed) {
            return Err(cancelled_error());
        }
        let at = format!("line {line}");
        match result {
            Ok(r) => match limits.check(&r) {
                Ok(bytes) => {
                    stored += bytes;
                    if let Err(o) = limits.batch_bytes(stored) {
                        err.push(at, o.reason);
                        return Err(err);
                    }
                    if err.total == 0 {
                        records.push(r);
                    }
                }
                Err(o) => {
                    err.note_clock(&o.field, &o.reason);
                    err.push(at, format!("{}: {}", o.field, o.reason));
                }
            },
            Err(e) => err.push(at, e.to_string()),
        }
    }
    if err.total > 0 {
        return Err(err);
    }
    if records.is_empty() {
        return Err(BatchError::new("body", "no records (empty batch)"));
    }
    Ok(records)
}

/// Decode a protobuf [`proto::RecordBatch`] body.
///
/// # Errors
///
/// When the bytes are not a `RecordBatch` (prost's message names the field),
/// when a record is invalid (`records[i].field: reason`), or when the batch
/// is empty.
pub fn decode_protobuf(body: &[u8]) -> Result<Vec<Record>, BatchError> {
    decode_protobuf_with(body, &IngestLimits::default(), &AtomicBool::new(false))
}

fn decode_protobuf_with(
    body: &[u8],
    limits: &IngestLimits,
    cancelled: &AtomicBool,
) -> Result<Vec<Record>, BatchError> {
    let batch = <proto::RecordBatch as prost::Message>::decode(body)
        .map_err(|e| BatchError::new("body", format!("not a cpt.collector.v1.RecordBatch: {e}")))?;
    from_proto_with(batch, limits, cancelled)
}

/// Check a decoded protobuf batch and turn it into records.
///
/// # Errors
///
/// As [`decode_protobuf`], for each invalid record.
pub fn from_proto(batch: proto::RecordBatch) -> Result<Vec<Record>, BatchError> {
    from_proto_with(batch, &IngestLimits::default(), &AtomicBool::new(false))
}

/// [`from_proto`] under `limits`, giving up as soon as `cancelled` is set.
/// Each record is checked against the limits before it is built, and the
/// batch's stored size is summed as it goes, so the work and memory are
/// bounded by the batch's encoded size and the limits, whatever the frame
/// indices say.
///
/// # Errors
///
/// As [`from_proto`], and when a record or the batch is over a limit.
pub fn from_proto_with(
    batch: proto::RecordBatch,
    limits: &IngestLimits,
    cancelled: &AtomicBool,
) -> Result<Vec<Record>, BatchError> {
    if batch.records.is_empty() {
        return Err(BatchError::new("records", "no records (empty batch)"));
    }
    let mut records = Vec::with_capacity(batch.records.len());
    let mut err = BatchError::empty();
    let mut stored = 0usize;
    for (i, r) in batch.records.into_iter().enumerate() {
        if cancelled.load(Ordering::Relaxed) {
            return Err(cancelled_error());
        }
        match proto::IntoRecord::into_record_with(r, limits) {
            Ok((r, bytes)) => {
                stored += bytes;
                if let Err(o) = limits.batch_bytes(stored) {
                    err.push(format!("records[{i}]"), o.reason);
                    return Err(err);
                }
                if err.total == 0 {
                    records.push(r);
                }
            }
            Err(e) => {
                err.note_clock(&e.field, &e.reason);
                err.push(format!("records[{i}].{}", e.field), e.reason);
            }
        }
    }
    if err.total > 0 {
        return Err(err);
    }
    Ok(records)
}

/// Why a line of a JSON Lines stream is not a record.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// The line is not a valid record.
    #[error(transparent)]
    Record(#[from] cpt_sdk::RecordError),
    /// The line is not UTF-8.
    #[error("not UTF-8: {0}")]
    Utf8(#[from] std::str::Utf8Error),
    /// Reading failed (the stream ends after this item).
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
}

/// The records of a JSON Lines stream with their 1-based line numbers; blank
/// lines are skipped. Reads one line at a time, so memory stays bounded by
/// the longest line.
#[derive(Debug)]
pub struct JsonLines<R> {
    reader: R,
    line: usize,
    buf: Vec<u8>,
    failed: bool,
}

impl<R: BufRead> JsonLines<R> {
    /// Iterate over `reader`'s lines.
    pub fn new(reader: R) -> JsonLines<R> {
        JsonLines {
            reader,
            line: 0,
            buf: Vec::new(),
            failed: false,
        }
    }
}

impl<R: BufRead> Iterator for JsonLines<R> {
    type Item = (usize, Result<Record, LineError>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.failed {
                return None;
            }
            self.buf.clear();
            self.line += 1;
            match self.reader.read_until(b'\n', &mut self.buf) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => {
                    self.failed = true;
                    return Some((self.line, Err(e.into())));
                }
            }
            let text = match std::str::from_utf8(&self.buf) {
                Ok(t) => t.trim(),
                Err(e) => return Some((self.line, Err(e.into()))),
            };
            if text.is_empty() {
                continue;
            }
            return Some((self.line, Record::from_json(text).map_err(Into::into)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str =
        r#"{"service":"S","trigger":"sampled","latency_ns":3,"path":[{"stack":["x"],"ns":3}]}"#;

    #[test]
    fn json_lines_batch_skips_blank_lines() {
        let body = format!("{GOOD}\n\n  \n{GOOD}\r\n");
        assert_eq!(decode_json_lines(body.as_bytes()).unwrap().len(), 2);
    }

    #[test]
    fn json_lines_batch_names_every_bad_line() {
        let body = format!(
            "{GOOD}\nnot json\n{GOOD}\n{}\n",
            GOOD.replace("sampled", "maybe")
        );
        let err = decode_json_lines(body.as_bytes()).unwrap_err();
        assert_eq!(err.total(), 2);
        assert_eq!(err.problems()[0].at, "line 2");
        assert!(
            err.problems()[0].reason.contains("not a cpt record"),
            "{err}"
        );
        assert_eq!(err.problems()[1].at, "line 4");
        assert!(
            err.problems()[1].reason.contains("unknown trigger"),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with("batch rejected, nothing stored: line 2: ")
        );
    }

    #[test]
    fn json_lines_batch_caps_the_list_but_counts_all() {
        let body = "x\n".repeat(MAX_PROBLEMS + 5);
        let err = decode_json_lines(body.as_bytes()).unwrap_err();
        assert_eq!(err.problems().len(), MAX_PROBLEMS);
        assert_eq!(err.total(), MAX_PROBLEMS + 5);
        assert!(err.to_string().ends_with("; and 5 more"), "{err}");
    }

    #[test]
    fn json_lines_non_utf8_line_is_named() {
        let mut body = format!("{GOOD}\n").into_bytes();
        body.extend(b"\xff\xfe\n");
        let err = decode_json_lines(&body).unwrap_err();
        assert_eq!(err.problems()[0].at, "line 2");
        assert!(err.problems()[0].reason.contains("not UTF-8"), "{err}");
    }

    #[test]
    fn empty_batches_are_rejected() {
        assert!(
            decode_json_lines(b"\n\n")
                .unwrap_err()
                .to_string()
                .contains("empty batch")
        );
        assert!(
            decode_protobuf(b"")
                .unwrap_err()
                .to_string()
                .contains("empty batch")
        );
    }

    #[test]
    fn protobuf_garbage_is_rejected_with_prost_reason() {
        let err = decode_protobuf(b"\x0a\xff\xff").unwrap_err();
        assert_eq!(err.problems()[0].at, "body");
        assert!(
            err.to_string()
                .contains("not a cpt.collector.v1.RecordBatch"),
            "{err}"
        );
    }

    #[test]
    fn protobuf_bad_record_names_index_and_field() {
        let good = Record::from_json(GOOD).unwrap();
        let mut batch = proto::RecordBatch::from_records([&good, &good]);
        batch.records[1].trigger = 0;
        let err = from_proto(batch).unwrap_err();
        assert_eq!(
            err.problems()[0].to_string(),
            "records[1].trigger: unspecified (expected SAMPLED or FORCED)"
        );
    }

    #[test]
    fn decoding_stops_when_the_client_has_gone_away() {
        let good = Record::from_json(GOOD).unwrap();
        let batch = proto::RecordBatch::from_records([&good, &good]);
        let gone = AtomicBool::new(true);
        let err = from_proto_with(batch, &IngestLimits::default(), &gone).unwrap_err();
        assert!(err.to_string().contains("the client went away"), "{err}");
        let body = format!("{GOOD}\n{GOOD}\n");
        let err = BodyFormat::JsonLines
            .decode_with(body.as_bytes(), &IngestLimits::default(), &gone)
            .unwrap_err();
        assert!(err.to_string().contains("the client went away"), "{err}");
    }

    #[test]
    fn a_batch_over_its_stored_size_is_refused() {
        let good = Record::from_json(GOOD).unwrap();
        let batch = proto::RecordBatch::from_records(vec![&good; 10]);
        let limits = IngestLimits::new().with_max_batch_stored_bytes(3000);
        let err = from_proto_with(batch, &limits, &AtomicBool::new(false)).unwrap_err();
        assert_eq!(err.total(), 1);
        assert!(
            err.problems()[0]
                .reason
                .contains("max_batch_stored_bytes = 3000"),
            "{err}"
        );
    }

    #[rustfmt::skip]
    const CONTENT_TYPES: &[(&str, Option<BodyFormat>)] = &[
        ("application/x-ndjson", Some(BodyFormat::JsonLines)),
        ("application/x-ndjson; charset=utf-8", Some(BodyFormat::JsonLines)),
        ("Application/JSONL", Some(BodyFormat::JsonLines)),
        ("application/x-protobuf", Some(BodyFormat::Protobuf)),
        ("application/protobuf", Some(BodyFormat::Protobuf)),
        ("text/plain", None),
        ("", None),
    ];

    #[test]
    fn content_types() {
        for (ct, want) in CONTENT_TYPES {
            assert_eq!(BodyFormat::from_content_type(ct), *want, "{ct}");
        }
    }
}
