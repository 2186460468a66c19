//! How held spans are kept in a store row (`otlp_spans.spans`): the spans
//! of one trace from one request, as a protobuf message of their own.
//!
//! The spans of a row share a few strings (their service, clock domain,
//! operations, label keys), so a row has one table of strings that spans
//! refer to by index; ids, which the receiver has checked to be 16
//! lowercase hex digits, are kept as the 8 bytes they spell. A row is
//! about a third of the same spans as JSON, and is written and read
//! without parsing text.
//!
//! Rows written as a JSON array of spans (the first encoding) are still
//! read: a protobuf row never starts with `[`.

use std::sync::Arc;

use super::spans::HeldSpan;

/// One row: the strings its spans share, and the spans.
#[derive(Clone, PartialEq, prost::Message)]
struct Row {
    #[prost(string, repeated, tag = "1")]
    strings: Vec<String>,
    #[prost(message, repeated, tag = "2")]
    spans: Vec<RowSpan>,
}

/// A [`HeldSpan`] with its strings as indices into [`Row::strings`].
#[derive(Clone, PartialEq, prost::Message)]
struct RowSpan {
    /// The span id's 8 bytes (big-endian: its hex digits in order).
    #[prost(fixed64, tag = "1")]
    id: u64,
    #[prost(fixed64, optional, tag = "2")]
    parent: Option<u64>,
    #[prost(uint32, tag = "3")]
    service: u32,
    #[prost(uint32, tag = "4")]
    operation: u32,
    #[prost(int64, tag = "5")]
    start_ns: i64,
    #[prost(int64, tag = "6")]
    duration_ns: i64,
    #[prost(uint32, tag = "7")]
    kind: u32,
    #[prost(uint32, tag = "8")]
    clock: u32,
    #[prost(bool, tag = "9")]
    error: bool,
    /// Label keys and values, alternately.
    #[prost(uint32, repeated, tag = "10")]
    labels: Vec<u32>,
}

/// 16 lowercase hex digits as the 8 bytes they spell.
fn id_bits(id: &str) -> Option<u64> {
    if id.len() != 16 || !id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(id, 16).ok()
}

fn id_text(bits: u64) -> String {
    format!("{bits:016x}")
}

/// The strings of a row being written.
#[derive(Default)]
struct Strings<'a> {
    all: Vec<&'a str>,
    index: rustc_hash::FxHashMap<&'a str, u32>,
}

impl<'a> Strings<'a> {
    fn of(&mut self, s: &'a str) -> u32 {
        *self.index.entry(s).or_insert_with(|| {
            self.all.push(s);
            u32::try_from(self.all.len() - 1).expect("fewer strings than spans in a row")
        })
    }
}

/// The row of `spans`. `None` when a span's ids are not what the receiver
/// lets through (16 lowercase hex digits): such spans are never held.
pub(crate) fn encode(spans: &[HeldSpan]) -> Option<Vec<u8>> {
    let mut strings = Strings::default();
    let mut out = Vec::with_capacity(spans.len());
    for s in spans {
        out.push(RowSpan {
            id: id_bits(&s.id)?,
            parent: match &s.parent {
                Some(p) => Some(id_bits(p)?),
                None => None,
            },
            service: strings.of(&s.service),
            operation: strings.of(&s.operation),
            start_ns: s.start_ns,
            duration_ns: s.duration_ns,
            kind: u32::from(s.kind),
            clock: strings.of(&s.clock),
            error: s.error,
            labels: s
                .labels
                .iter()
                .flat_map(|(k, v)| [strings.of(k), strings.of(v)])
                .collect(),
        });
    }
    let row = Row {
        strings: strings.all.into_iter().map(str::to_owned).collect(),
        spans: out,
    };
    Some(prost::Message::encode_to_vec(&row))
}

/// The rows the store holds a request's spans in: one per trace.
pub(crate) fn rows(traces: &[(String, Vec<HeldSpan>)]) -> Vec<(String, Vec<u8>)> {
    traces
        .iter()
        .map(|(t, s)| {
            let row = encode(s).unwrap_or_else(|| {
                // Ids the protobuf row cannot keep (the receiver lets none
                // through): the JSON row reads back as well.
                serde_json::to_vec(s).expect("held spans always serialize; this is a bug")
            });
            (t.clone(), row)
        })
        .collect()
}

/// Read a stored row back: protobuf, or the JSON array of the first
/// encoding.
pub(crate) fn decode(row: &[u8]) -> Result<Vec<HeldSpan>, String> {
    if row.first() == Some(&b'[') {
        return serde_json::from_slice(row).map_err(|e| format!("a JSON row: {e}"));
    }
    let row: Row = prost::Message::decode(row).map_err(|e| e.to_string())?;
    let names: Vec<Arc<str>> = row.strings.iter().map(|s| Arc::from(s.as_str())).collect();
    let name = |i: u32| -> Result<Arc<str>, String> {
        names
            .get(i as usize)
            .cloned()
            .ok_or_else(|| format!("string {i} of {} in the row", names.len()))
    };
    let string = |i: u32| name(i).map(|s| s.to_string());
    row.spans
        .iter()
        .map(|s| {
            let labels = s
                .labels
                .chunks(2)
                .map(|kv| match kv {
                    [k, v] => Ok((string(*k)?, string(*v)?)),
                    _ => Err("a label key without its value".to_owned()),
                })
                .collect::<Result<_, String>>()?;
            Ok(HeldSpan {
                id: id_text(s.id),
                parent: s.parent.map(id_text),
                service: name(s.service)?,
                operation: name(s.operation)?,
                start_ns: s.start_ns,
                duration_ns: s.duration_ns,
                kind: u8::try_from(s.kind).map_err(|_| format!("span kind {}", s.kind))?,
                clock: name(s.clock)?,
                error: s.error,
                labels,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(id: &str, parent: Option<&str>, labels: &[(&str, &str)]) -> HeldSpan {
        HeldSpan {
            id: id.into(),
            parent: parent.map(Into::into),
            service: "front".into(),
            operation: "GET /ä".into(),
            start_ns: 1_700_000_000_000_000_000,
            duration_ns: 5_000,
            kind: 3,
            clock: "host:h".into(),
            error: true,
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        }
    }

    #[test]
    fn a_row_reads_back_as_the_spans_written_and_is_smaller_than_json() {
        let spans = vec![
            span("00f067aa0ba902b7", None, &[("service.version", "1.4")]),
            span("ffffffffffffffff", Some("00f067aa0ba902b7"), &[]),
            span(
                "0000000000000001",
                Some("ffffffffffffffff"),
                &[("k", "front")],
            ),
        ];
        let row = encode(&spans).unwrap();
        assert_eq!(decode(&row).unwrap(), spans);
        let json = serde_json::to_vec(&spans).unwrap();
        assert!(
            row.len() * 2 < json.len(),
            "{} vs {}",
            row.len(),
            json.len()
        );
        // Rows of the first encoding still read.
        assert_eq!(decode(&json).unwrap(), spans);
    }

    /// What the receiver holds of a request (JSON ids in capitals
    /// included) makes protobuf rows that read back as it.
    #[test]
    fn received_spans_survive_their_rows() {
        use super::super::spans::{Encoding, receive};
        let now = 1_700_000_000_000_000_000u64;
        let body = format!(
            r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"svc"}}}},{{"key":"service.version","value":{{"stringValue":"2"}}}}]}},"scopeSpans":[{{"spans":[{{"traceId":"0AF7651916CD43DD8448EB211C80319C","spanId":"00F067AA0BA902B7","name":"root","kind":2,"startTimeUnixNano":"{now}","endTimeUnixNano":"{}"}},{{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"00f067aa0ba902b8","parentSpanId":"00F067AA0BA902B7","name":"child","startTimeUnixNano":"{now}","endTimeUnixNano":"{}"}}]}}]}}]}}"#,
            now + 1000,
            now + 500
        );
        let got = receive(
            body.as_bytes(),
            Encoding::Json,
            &["service.version".into()],
            &crate::ingest::IngestLimits::default(),
            now,
        )
        .unwrap();
        assert_eq!(got.spans, 2);
        let rows = rows(&got.traces);
        assert_eq!(rows.len(), 1);
        assert_ne!(rows[0].1.first(), Some(&b'['), "a protobuf row");
        assert_eq!(decode(&rows[0].1).unwrap(), got.traces[0].1);
    }

    #[test]
    fn ids_that_are_not_sixteen_lowercase_hex_digits_make_no_row() {
        for bad in ["00F067AA0BA902B7", "00f067aa0ba902b", "x0f067aa0ba902b7"] {
            assert_eq!(encode(&[span(bad, None, &[])]), None, "{bad}");
            assert_eq!(
                encode(&[span("00f067aa0ba902b7", Some(bad), &[])]),
                None,
                "{bad}"
            );
        }
    }

    #[test]
    fn broken_rows_are_errors_not_panics() {
        let good = encode(&[span("00f067aa0ba902b7", None, &[("a", "b")])]).unwrap();
        for cut in 1..good.len() {
            let _ = decode(&good[..cut]);
        }
        // A span that refers to a string the row does not have.
        let row = Row {
            strings: vec!["s".into()],
            spans: vec![RowSpan {
                service: 7,
                ..RowSpan::default()
            }],
        };
        let e = decode(&prost::Message::encode_to_vec(&row)).unwrap_err();
        assert!(e.contains("string 7 of 1"), "{e}");
        let odd = Row {
            strings: vec!["s".into()],
            spans: vec![RowSpan {
                labels: vec![0],
                ..RowSpan::default()
            }],
        };
        let e = decode(&prost::Message::encode_to_vec(&odd)).unwrap_err();
        assert!(e.contains("without its value"), "{e}");
        assert!(decode(b"[{").unwrap_err().contains("JSON row"));
    }
}
