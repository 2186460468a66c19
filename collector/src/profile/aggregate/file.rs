//! The aggregate file `cpt.aggregate.v1`: an [`Aggregate`] computed
//! elsewhere (the Spark job `collector/spark/cpt_aggregate.py`), read back
//! by `cpt profile --from-aggregate` and friends.
//!
//! An aggregate is a monoid (CPT Table 1: per-stack summed time, the number
//! of requests the stack was on, the number of selected requests), so any
//! engine that can group and sum can compute it; this file is the small
//! result it hands back. It holds everything `cpt profile`, `cpt diff` and
//! `cpt histogram` use: per stack the summed nanoseconds, the on-path
//! request count, the sum of squares of the per-request time (for the
//! diff's confidence intervals) and optionally its [`Histogram`]; overall
//! the request count, the latency sum, sum of squares and histogram, the
//! accounting sums, the start-time range and the selection.
//!
//! # Format
//!
//! JSON Lines (UTF-8, one object per line, lines in any order; blank lines
//! ignored). A path may be one file or a directory of `part-*` files (what
//! Spark writes), read as one. Exactly one line is the header:
//!
//! ```json
//! {"kind":"header","format":"cpt.aggregate.v1",
//!  "selection":["service=A","label=arm=b","percentile=p95-p100","trigger=sampled"],
//!  "requests":950,"matched":1000,"latency_sum_ns":12000000,"latency_sum_sq":"160000000000000",
//!  "latency_hist":{"buckets":[{"b":200,"c":950}],"min":11000,"max":13000},
//!  "start_first":1700000000000000000,"start_last":1700000001000000000,
//!  "accounting":{"network_ns":0,"overcount_ns":0,"blind_spot_ns":0,"unattributed_ns":0,
//!                "queueing_ns":0,"truncated_ns":0,"clock_skew_ns":0},
//!  "stack_histograms":true}
//! ```
//!
//! and every other line is one sample stack (frames root first; a
//! segment kind other than busy is the synthetic leaf frame of
//! [`kind_frame`](super::kind_frame), service `""`):
//!
//! ```json
//! {"kind":"stack","frames":[{"service":"A","name":"A1","file":"a.rs","line":3},
//!                           {"service":"","name":"[network]"}],
//!  "sum_ns":5000000,"requests":950,"sum_sq":"26315789473","hist":{"buckets":[{"b":180,"c":950}],"min":5000,"max":6000}}
//! ```
//!
//! - `selection`: the selection as `key=value` pairs ([`Selection::set_pair`]);
//!   times (`since`, `until`) in Unix nanoseconds.
//! - `requests`: selected requests (after the percentile band); `matched`:
//!   records that passed every filter but the band.
//! - sums of squares are decimal strings (they exceed 64 bits).
//! - histogram buckets are [`Histogram::bucket_of`] indices with their
//!   counts (non-empty ones only); a stack's histogram counts its
//!   per-request time on every request it was on, so its total is the
//!   stack's `requests`. `hist` is absent when `stack_histograms` is false.
//! - `file` and `line` of a frame are absent (or null) when unknown.
//!
//! The reader checks what it can: the format name, one header, no stack
//! twice, stacks adding up to the header's latency sum (a file cut short
//! fails here), histogram totals equal to the request counts.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cpt_sdk::path::{Accounting, Frame, Location};
use serde::{Deserialize, Serialize};

use super::{Aggregate, Detail, StackStats};
use crate::profile::histogram::Histogram;
use crate::records::selection::Selection;

/// The format name in the header's `format` field.
pub const FORMAT: &str = "cpt.aggregate.v1";

/// An aggregate file that cannot be used; the message names the file, the
/// line when there is one, and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {msg}")]
pub struct AggregateFileError {
    path: PathBuf,
    msg: String,
}

impl AggregateFileError {
    fn new(path: &Path, msg: impl Into<String>) -> Self {
        AggregateFileError {
            path: path.to_owned(),
            msg: msg.into(),
        }
    }
}

/// What an aggregate file holds besides the [`Aggregate`].
#[derive(Clone, Debug, PartialEq)]
pub struct AggregateFile {
    /// The aggregate (comments: the selection, as `cpt profile` writes it).
    pub aggregate: Aggregate,
    /// The selection the job applied.
    pub selection: Selection,
    /// Records that passed every filter but the percentile band.
    pub matched: u64,
    /// Whether per-stack histograms were computed.
    pub stack_histograms: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Line {
    Header(Header),
    Stack(StackLine),
}

#[derive(Serialize, Deserialize)]
struct Header {
    format: String,
    selection: Vec<String>,
    requests: u64,
    matched: u64,
    latency_sum_ns: u64,
    latency_sum_sq: String,
    latency_hist: Hist,
    #[serde(default)]
    start_first: Option<u64>,
    #[serde(default)]
    start_last: Option<u64>,
    #[serde(default)]
    accounting: AccountingNs,
    stack_histograms: bool,
}

#[derive(Default, Serialize, Deserialize)]
#[serde(default)]
struct AccountingNs {
    network_ns: u64,
    overcount_ns: u64,
    blind_spot_ns: u64,
    unattributed_ns: u64,
    queueing_ns: u64,
    truncated_ns: u64,
    clock_skew_ns: u64,
}

#[derive(Serialize, Deserialize)]
struct Hist {
    buckets: Vec<Bucket>,
    min: u64,
    max: u64,
}

#[derive(Serialize, Deserialize)]
struct Bucket {
    b: usize,
    c: u64,
}

#[derive(Serialize, Deserialize)]
struct StackLine {
    frames: Vec<FrameJson>,
    sum_ns: u64,
    requests: u64,
    sum_sq: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hist: Option<Hist>,
}

#[derive(Serialize, Deserialize)]
struct FrameJson {
    service: String,
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn hist_json(h: &Histogram) -> Hist {
    Hist {
        buckets: h.bucket_counts().map(|(b, c)| Bucket { b, c }).collect(),
        min: h.min(),
        max: h.max(),
    }
}

/// The selection as the `key=value` pairs of the header (trigger always
/// explicit, times in Unix nanoseconds).
pub fn selection_pairs(sel: &Selection) -> Vec<String> {
    sel.pairs()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

/// Write an aggregate folded from records as an aggregate file (what the
/// Spark job writes for the same selection; used to test the reader and to
/// hand a single-machine aggregate to the same tools).
///
/// # Panics
///
/// If the aggregate was not folded from records (it has no spread detail).
pub fn to_jsonl(agg: &Aggregate, sel: &Selection, matched: u64) -> String {
    let lat = agg
        .latency_detail()
        .expect("an aggregate folded from records has latency detail");
    let stack_histograms = agg
        .stacks()
        .iter()
        .any(|s| s.detail.as_ref().is_some_and(|d| d.histogram.count() > 0));
    let acc = agg.accounting();
    let header = Header {
        format: FORMAT.to_owned(),
        selection: selection_pairs(sel),
        requests: agg.requests(),
        matched,
        latency_sum_ns: ns(agg.latency_sum()),
        latency_sum_sq: lat.sum_sq.to_string(),
        latency_hist: hist_json(&lat.histogram),
        start_first: agg.start_range().map(|r| r.0),
        start_last: agg.start_range().map(|r| r.1),
        accounting: AccountingNs {
            network_ns: ns(acc.network),
            overcount_ns: ns(acc.overcount),
            blind_spot_ns: ns(acc.blind_spot),
            unattributed_ns: ns(acc.unattributed),
            queueing_ns: ns(acc.queueing),
            truncated_ns: ns(acc.truncated),
            clock_skew_ns: ns(acc.clock_skew),
        },
        stack_histograms,
    };
    let mut out = serde_json::to_string(&Line::Header(header)).expect("serialisable");
    out.push('\n');
    for s in agg.stacks() {
        let d = s.detail.as_ref().expect("folded from records");
        let line = Line::Stack(StackLine {
            frames: agg
                .stack_frames(s)
                .map(|f| FrameJson {
                    service: f.service.to_string(),
                    name: f.name.to_string(),
                    file: f.location.as_ref().map(|l| l.file.to_string()),
                    line: f.location.as_ref().map(|l| l.line),
                })
                .collect(),
            sum_ns: s.sum_nanos,
            requests: s.requests,
            sum_sq: d.sum_sq.to_string(),
            hist: stack_histograms.then(|| hist_json(&d.histogram)),
        });
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string(&line).expect("serialisable")
        );
    }
    out
}

/// The files an aggregate path stands for: the file itself, or a
/// directory's `part-*` files (Spark's output), sorted.
fn part_files(path: &Path) -> Result<Vec<PathBuf>, AggregateFileError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| AggregateFileError::new(path, format!("cannot read: {e}")))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let rd = std::fs::read_dir(path)
        .map_err(|e| AggregateFileError::new(path, format!("cannot list the directory: {e}")))?;
    let mut files = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| {
            AggregateFileError::new(path, format!("cannot list the directory: {e}"))
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("part-") && entry.path().is_file() {
            files.push(entry.path());
        }
    }
    if files.is_empty() {
        return Err(AggregateFileError::new(
            path,
            "a directory without part-* files; give the file or the directory \
             `cpt_aggregate.py --output` wrote",
        ));
    }
    files.sort();
    Ok(files)
}

fn parse_sq(path: &Path, what: &str, s: &str) -> Result<u128, AggregateFileError> {
    s.trim().parse::<u128>().map_err(|_| {
        AggregateFileError::new(
            path,
            format!("{what}: {s:?} is not a sum of squares (a decimal integer string)"),
        )
    })
}

fn histogram(path: &Path, what: &str, h: &Hist) -> Result<Histogram, AggregateFileError> {
    Histogram::from_buckets(h.buckets.iter().map(|b| (b.b, b.c)), h.min, h.max)
        .map_err(|e| AggregateFileError::new(path, format!("{what}: bad histogram: {e}")))
}

/// Read an aggregate file (or a directory of `part-*` files). See the
/// [module docs](self).
///
/// # Errors
///
/// An unreadable file, a line that is not JSON of this format, another
/// format or version, no header or two, a stack given twice, stacks that do
/// not add up to the header (a file cut short), inconsistent histograms, a
/// selection that does not parse.
pub fn read_path(path: &Path) -> Result<AggregateFile, AggregateFileError> {
    let mut header: Option<Header> = None;
    let mut stack_lines = Vec::new();
    for file in part_files(path)? {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| AggregateFileError::new(&file, format!("cannot read: {e}")))?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let parsed: Line = serde_json::from_str(line).map_err(|e| {
                let looks = if line.trim_start().starts_with('{') && !line.contains("\"kind\"") {
                    " (no \"kind\": is this a cpt aggregate file? write it with \
                     collector/spark/cpt_aggregate.py)"
                } else {
                    ""
                };
                AggregateFileError::new(
                    &file,
                    format!("line {}: not a {FORMAT} line: {e}{looks}", i + 1),
                )
            })?;
            match parsed {
                Line::Header(h) => {
                    if h.format != FORMAT {
                        return Err(AggregateFileError::new(
                            &file,
                            format!(
                                "line {}: format {:?}, expected {FORMAT:?} (written by another \
                                 version of cpt_aggregate.py?)",
                                i + 1,
                                h.format
                            ),
                        ));
                    }
                    if header.is_some() {
                        return Err(AggregateFileError::new(
                            &file,
                            format!(
                                "line {}: a second header; an aggregate file holds one \
                                 aggregate (merge profiles with `cpt merge` instead)",
                                i + 1
                            ),
                        ));
                    }
                    header = Some(h);
                }
                Line::Stack(s) => stack_lines.push((file.clone(), i + 1, s)),
            }
        }
    }
    let Some(h) = header else {
        return Err(AggregateFileError::new(
            path,
            format!(
                "no header line (kind \"header\"): not a complete {FORMAT} file; \
                 re-run cpt_aggregate.py"
            ),
        ));
    };
    let mut selection = Selection::new();
    for pair in &h.selection {
        selection
            .set_pair(pair)
            .map_err(|e| AggregateFileError::new(path, format!("header selection: {e}")))?;
    }
    let latency = Detail {
        sum_sq: parse_sq(path, "header latency_sum_sq", &h.latency_sum_sq)?,
        histogram: histogram(path, "header latency_hist", &h.latency_hist)?,
    };
    if latency.histogram.count() != h.requests {
        return Err(AggregateFileError::new(
            path,
            format!(
                "header: the latency histogram counts {} requests but requests is {}",
                latency.histogram.count(),
                h.requests
            ),
        ));
    }
    let mut frames: Vec<Frame> = Vec::new();
    let mut frame_ix: std::collections::HashMap<Frame, u32> = std::collections::HashMap::new();
    let mut seen: HashSet<Box<[u32]>> = HashSet::new();
    let mut stacks = Vec::with_capacity(stack_lines.len());
    let mut total: u64 = 0;
    for (file, lineno, s) in stack_lines {
        let at = |msg: String| AggregateFileError::new(&file, format!("line {lineno}: {msg}"));
        if s.frames.is_empty() {
            return Err(at("a stack without frames".into()));
        }
        let ids: Box<[u32]> = s
            .frames
            .iter()
            .map(|f| {
                let frame = Frame {
                    service: Arc::from(f.service.as_str()),
                    name: Arc::from(f.name.as_str()),
                    location: f.file.as_ref().map(|file| Location {
                        file: Arc::from(file.as_str()),
                        line: f.line.unwrap_or(0),
                    }),
                };
                *frame_ix.entry(frame.clone()).or_insert_with(|| {
                    frames.push(frame);
                    (frames.len() - 1) as u32
                })
            })
            .collect();
        if !seen.insert(ids.clone()) {
            return Err(at("this stack was already given on another line".into()));
        }
        if s.requests == 0 || s.requests > h.requests {
            return Err(at(format!(
                "requests {} must be between 1 and the header's {}",
                s.requests, h.requests
            )));
        }
        let hist = match (&s.hist, h.stack_histograms) {
            (Some(hj), true) => {
                let hist = histogram(&file, &format!("line {lineno}"), hj)?;
                if hist.count() != s.requests {
                    return Err(at(format!(
                        "the histogram counts {} requests but the stack's requests is {}",
                        hist.count(),
                        s.requests
                    )));
                }
                hist
            }
            (None, false) => Histogram::new(),
            (None, true) => {
                return Err(at(
                    "no \"hist\" although the header says stack_histograms".into()
                ));
            }
            (Some(_), false) => {
                return Err(at(
                    "a \"hist\" although the header says no stack_histograms".into(),
                ));
            }
        };
        total = total.saturating_add(s.sum_ns);
        stacks.push(StackStats {
            stack: ids,
            sum_nanos: s.sum_ns,
            requests: s.requests,
            detail: Some(Detail {
                sum_sq: parse_sq(&file, &format!("line {lineno}: sum_sq"), &s.sum_sq)?,
                histogram: hist,
            }),
        });
    }
    if total != h.latency_sum_ns {
        return Err(AggregateFileError::new(
            path,
            format!(
                "the stacks add up to {total} ns but the header's latency_sum_ns is {}: the \
                 file is incomplete (cut short?) or was edited; re-run cpt_aggregate.py",
                h.latency_sum_ns
            ),
        ));
    }
    let start_range = match (h.start_first, h.start_last) {
        (Some(a), Some(b)) if a <= b => Some((a, b)),
        (None, None) => None,
        _ => {
            return Err(AggregateFileError::new(
                path,
                "header: start_first and start_last must both be given (first <= last) or \
                 both be absent",
            ));
        }
    };
    let d = std::time::Duration::from_nanos;
    let a = &h.accounting;
    let accounting = Accounting {
        network: d(a.network_ns),
        overcount: d(a.overcount_ns),
        blind_spot: d(a.blind_spot_ns),
        unattributed: d(a.unattributed_ns),
        queueing: d(a.queueing_ns),
        truncated: d(a.truncated_ns),
        clock_skew: d(a.clock_skew_ns),
    };
    let mut aggregate = Aggregate {
        frames,
        stacks,
        requests: h.requests,
        latency_sum_nanos: h.latency_sum_ns,
        latency: Some(latency),
        latencies: None,
        accounting,
        start_range,
        comments: vec![format!("cpt selection: {selection}")],
    };
    aggregate.canonicalize();
    Ok(AggregateFile {
        aggregate,
        selection,
        matched: h.matched,
        stack_histograms: h.stack_histograms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::aggregate::tests::record;
    use cpt_sdk::path::SegmentKind;
    use cpt_sdk::testing::fixtures::table1;

    fn records() -> Vec<cpt_sdk::record::Record> {
        let mut rs = table1();
        let mut r = record(&[
            (&[("A", "A1")], 3, SegmentKind::Queueing),
            (&[("A", "A1"), ("B", "B1")], 7, SegmentKind::Network),
            (&[], 2, SegmentKind::Busy),
            (&[("A", "A1")], 1, SegmentKind::Busy),
        ]);
        r.start_unix_nanos = Some(1_700_000_000_000_000_000);
        r.labels.insert("arm".into(), "b".into());
        rs.push(r);
        rs
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn aggregate_file_round_trips_the_aggregate_and_its_profile() {
        let sel = Selection::from_query("percentile=p0-p100&trigger=all").unwrap();
        let agg = Aggregate::from_records_with_histograms(&sel, records());
        let dir = tempfile::tempdir().unwrap();
        // As Spark writes it: a directory with one part file, lines in any order.
        let mut lines: Vec<&str> = Vec::new();
        let text = to_jsonl(&agg, &sel, 3);
        lines.extend(text.lines().rev());
        std::fs::create_dir(dir.path().join("out")).unwrap();
        write(
            &dir.path().join("out"),
            "part-00000.json",
            &lines.join("\n"),
        );
        write(&dir.path().join("out"), "_SUCCESS", "");
        let back = read_path(&dir.path().join("out")).unwrap();
        assert_eq!(back.aggregate, agg);
        assert_eq!(back.selection, sel);
        assert_eq!(back.matched, 3);
        assert!(back.stack_histograms);
        assert_eq!(
            crate::profile::encode_gzip(&back.aggregate),
            crate::profile::encode_gzip(&agg)
        );
    }

    #[test]
    fn aggregate_file_bad_input_says_what_is_wrong() {
        let sel = Selection::new();
        let agg = Aggregate::from_records_with_histograms(&sel, records());
        let good = to_jsonl(&agg, &sel, 3);
        let header = good.lines().next().unwrap().to_owned();
        let first_stack = good.lines().nth(1).unwrap().to_owned();
        let dir = tempfile::tempdir().unwrap();
        #[rustfmt::skip]
        let cases: Vec<(String, &str)> = vec![
            (good.lines().take(2).collect::<Vec<_>>().join("\n"), "the file is incomplete"),
            (good.lines().skip(1).collect::<Vec<_>>().join("\n"), "no header line"),
            (format!("{good}{header}\n"), "a second header"),
            (format!("{good}{first_stack}\n"), "already given on another line"),
            (good.replace(FORMAT, "cpt.aggregate.v9"), "format \"cpt.aggregate.v9\", expected \"cpt.aggregate.v1\""),
            (format!("{good}{{\"service\":\"A\"}}\n"), "is this a cpt aggregate file?"),
            (format!("{}\n{{\"kind\":\"stack\",", good.trim_end()), "not a cpt.aggregate.v1 line"),
            (good.replace("\"selection\":[", "\"selection\":[\"colour=red\","), "unknown selection key"),
        ];
        for (i, (text, want)) in cases.iter().enumerate() {
            let p = write(dir.path(), &format!("bad{i}.jsonl"), text);
            let err = read_path(&p).unwrap_err().to_string();
            assert!(err.contains(want), "case {i}: got {err:?}, want {want:?}");
            assert!(
                err.contains(&format!("bad{i}.jsonl")),
                "names the file: {err}"
            );
        }
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        let err = read_path(&dir.path().join("empty"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("without part-* files"), "{err}");
    }
}
