//! An [`Aggregate`] as a gzipped pprof `profile.proto`, and back.
//!
//! `go tool pprof` opens the result as it opens a CPU profile.
//!
//! # What the profile holds
//!
//! - Sample types, in this order:
//!   1. `critical_path` / `nanoseconds`: the stack's time per request, the
//!      mean over the selection. It is the `default_sample_type`, so pprof
//!      opens on it and the total is the mean latency. Means are rounded so
//!      that they add up exactly to the rounded mean latency.
//!   2. `requests` / `count`: on how many selected requests the stack was on
//!      the path (how *often*; `critical_path` mixes often and how long).
//!   3. `critical_path_sum` / `nanoseconds`: the stack's time summed over the
//!      selection, exact.
//! - The comment `cpt.requests=N`: the number of selected requests
//!   (`go tool pprof -comments`), followed by the selection and a note on
//!   merging.
//! - One function and one location per frame. The function's name is
//!   `"A1 (A)"` (node name and service), its `system_name` the bare node
//!   name `"A1"`, its `filename` and `start_line` the span's source location
//!   when known (the location's line too). Synthetic leaves for time the path
//!   could not explain are named `[network]`, `[blind spot]`,
//!   `[unattributed]` and `[queueing]`.
//! - `time_nanos`: the first selected request's start, when records carry
//!   start times; the comment `cpt.start_range_unix_nanos=FIRST..LAST` gives
//!   the span. `duration_nanos` stays 0: pprof would show the mean latency as
//!   a percentage of it, as if it were CPU utilisation.
//! - The string table is built in a fixed order (`""` first, then sample
//!   types, functions in canonical frame order, comments), so equal
//!   aggregates encode to equal bytes (golden-file tests).
//!
//! # Merging profiles
//!
//! Do **not** merge cpt profiles by adding their `critical_path` values
//! (`go tool pprof -proto a b` does that): two means add to nonsense. Merge
//! sums and counts instead, which is what `cpt merge` and
//! [`crate::profile::aggregate::Aggregate::merge`] do: for each stack,
//! `critical_path_sum` and `requests` add, `cpt.requests` adds, and the new
//! `critical_path` is `Σ critical_path_sum / Σ cpt.requests`. A profile
//! without `critical_path_sum` (e.g. from another tool) is read as
//! `critical_path × cpt.requests` (one request when the comment is missing).

mod proto;

pub use proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

use std::collections::HashMap;
use std::io::{Read, Write};

use cpt_sdk::path::Frame;
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use prost::Message;

use std::path::Path;

use flate2::read::MultiGzDecoder;

use crate::profile::aggregate::{Aggregate, StackStats, frame_label};
use crate::records::input::{GZIP_MAGIC, InputError, SQLITE_MAGIC};

/// Sample type of the mean time per request (the default).
pub const CRITICAL_PATH: &str = "critical_path";
/// Sample type of the number of requests a stack is on the path of.
pub const REQUESTS: &str = "requests";
/// Sample type of the exact summed time.
pub const CRITICAL_PATH_SUM: &str = "critical_path_sum";
/// Prefix of the comment carrying the number of selected requests.
pub const REQUESTS_COMMENT: &str = "cpt.requests=";
/// Prefix of the comment carrying the first and last request start.
pub const START_RANGE_COMMENT: &str = "cpt.start_range_unix_nanos=";

const MERGE_NOTE: &str = "cpt: critical_path = critical_path_sum / cpt.requests (mean per request); \
     merge profiles with `cpt merge` (adds sums and request counts), not by adding means";

/// Strings interned in first-use order, `""` at index 0.
#[derive(Debug)]
struct StringTable {
    strings: Vec<String>,
    index: HashMap<String, i64>,
}

impl StringTable {
    fn new() -> Self {
        let mut t = StringTable {
            strings: Vec::new(),
            index: HashMap::new(),
        };
        t.intern("");
        t
    }

    fn intern(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Build the profile message for an aggregate. See the [module docs](self).
pub fn to_profile(agg: &Aggregate) -> Profile {
    let mut st = StringTable::new();
    let ns = st.intern("nanoseconds");
    let cp = st.intern(CRITICAL_PATH);
    let sample_type = vec![
        ValueType {
            r#type: cp,
            unit: ns,
        },
        ValueType {
            r#type: st.intern(REQUESTS),
            unit: st.intern("count"),
        },
        ValueType {
            r#type: st.intern(CRITICAL_PATH_SUM),
            unit: ns,
        },
    ];
    let mut function = Vec::with_capacity(agg.frames().len());
    let mut location = Vec::with_capacity(agg.frames().len());
    for (i, f) in agg.frames().iter().enumerate() {
        let id = i as u64 + 1;
        let line = f.location.as_ref().map_or(0, |l| i64::from(l.line));
        function.push(Function {
            id,
            name: st.intern(&frame_label(f)),
            system_name: st.intern(&f.name),
            filename: f.location.as_ref().map_or(0, |l| st.intern(&l.file)),
            start_line: line,
        });
        location.push(Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![Line {
                function_id: id,
                line,
                column: 0,
            }],
            is_folded: false,
        });
    }
    let sample = agg
        .stacks()
        .iter()
        .zip(agg.mean_nanos())
        .map(|(s, mean)| Sample {
            location_id: s.stack.iter().rev().map(|&f| u64::from(f) + 1).collect(),
            value: vec![to_i64(mean), to_i64(s.requests), to_i64(s.sum_nanos)],
            label: Vec::new(),
        })
        .collect();
    let mut comment = vec![st.intern(&format!("{REQUESTS_COMMENT}{}", agg.requests()))];
    for c in agg.comments() {
        comment.push(st.intern(c));
    }
    if let Some((a, b)) = agg.start_range() {
        comment.push(st.intern(&format!("{START_RANGE_COMMENT}{a}..{b}")));
    }
    comment.push(st.intern(MERGE_NOTE));
    let time_nanos = agg.start_range().map_or(0, |(a, _)| to_i64(a));
    Profile {
        sample_type,
        sample,
        mapping: Vec::new(),
        location,
        function,
        string_table: st.strings,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos,
        duration_nanos: 0,
        period_type: Some(ValueType {
            r#type: cp,
            unit: ns,
        }),
        period: 1,
        comment,
        default_sample_type: cp,
        doc_url: 0,
    }
}

/// The profile as gzipped protobuf bytes (what `go tool pprof` reads).
pub fn encode_gzip(agg: &Aggregate) -> Vec<u8> {
    gzip(&to_profile(agg).encode_to_vec())
}

/// Gzip bytes (deterministic: no file name, zero mtime).
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(
        Vec::with_capacity(bytes.len() / 3 + 64),
        Compression::default(),
    );
    enc.write_all(bytes)
        .expect("writing into a Vec cannot fail; this is a bug");
    enc.finish()
        .expect("writing into a Vec cannot fail; this is a bug")
}

/// Why bytes are not a readable profile.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// Gzip stream is corrupt.
    #[error("not a valid gzip stream: {0}")]
    Gzip(#[source] std::io::Error),
    /// Protobuf does not decode as `perftools.profiles.Profile`.
    #[error("not a pprof profile.proto: {0}")]
    Decode(#[from] prost::DecodeError),
    /// The profile's internal references are inconsistent.
    #[error("malformed profile: {0}")]
    Malformed(String),
}

/// Decode a profile, gunzipping first when the bytes start with the gzip magic.
///
/// # Errors
///
/// If the gzip stream or the protobuf is corrupt.
pub fn decode(bytes: &[u8]) -> Result<Profile, ProfileError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        GzDecoder::new(bytes)
            .read_to_end(&mut raw)
            .map_err(ProfileError::Gzip)?;
        Ok(Profile::decode(raw.as_slice())?)
    } else {
        Ok(Profile::decode(bytes)?)
    }
}

/// Read a (cpt or other) profile back into an [`Aggregate`], for merging.
///
/// Uses `critical_path_sum` and `cpt.requests` when present; otherwise see
/// the [module docs](self) ("Merging profiles"). Per-request spread (sum of
/// squares, histograms) is not in a profile, so the result has no detail.
///
/// # Errors
///
/// If the bytes do not decode or indices point outside their tables.
pub fn read_aggregate(bytes: &[u8]) -> Result<Aggregate, ProfileError> {
    from_profile(&decode(bytes)?)
}

/// Convert a decoded profile to an [`Aggregate`]. See [`read_aggregate`].
///
/// # Errors
///
/// If indices point outside their tables.
pub fn from_profile(p: &Profile) -> Result<Aggregate, ProfileError> {
    let bad = |m: String| ProfileError::Malformed(m);
    let s = |i: i64| -> Result<&str, ProfileError> {
        usize::try_from(i)
            .ok()
            .and_then(|i| p.string_table.get(i))
            .map(String::as_str)
            .ok_or_else(|| bad(format!("string index {i} out of range")))
    };
    if p.string_table.first().is_some_and(|s| !s.is_empty()) {
        return Err(bad("string_table[0] must be \"\"".into()));
    }
    let find = |name: &str| -> Result<Option<usize>, ProfileError> {
        for (i, t) in p.sample_type.iter().enumerate() {
            if s(t.r#type)? == name {
                return Ok(Some(i));
            }
        }
        Ok(None)
    };
    let sum_ix = find(CRITICAL_PATH_SUM)?;
    let req_ix = find(REQUESTS)?;
    let mean_ix = match find(CRITICAL_PATH)? {
        Some(i) => Some(i),
        None if p.default_sample_type != 0 => {
            let want = s(p.default_sample_type)?;
            let mut found = None;
            for (i, t) in p.sample_type.iter().enumerate() {
                if s(t.r#type)? == want {
                    found = Some(i);
                }
            }
            found
        }
        None => (!p.sample_type.is_empty()).then_some(0),
    };
    let mut requests: Option<u64> = None;
    let mut start_range: Option<(u64, u64)> = None;
    let mut comments = Vec::new();
    for &c in &p.comment {
        let c = s(c)?;
        if let Some(n) = c.strip_prefix(REQUESTS_COMMENT) {
            requests = Some(
                n.trim()
                    .parse()
                    .map_err(|_| bad(format!("comment {c:?}: request count is not a number")))?,
            );
        } else if let Some(r) = c.strip_prefix(START_RANGE_COMMENT) {
            start_range = r
                .split_once("..")
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
            if start_range.is_none() {
                return Err(bad(format!(
                    "comment {c:?}: expected FIRST..LAST Unix nanoseconds"
                )));
            }
        } else if c != MERGE_NOTE {
            comments.push(c.to_owned());
        }
    }
    let n = requests.unwrap_or(1);

    let mut frames: Vec<Frame> = Vec::new();
    let mut fn_by_id: HashMap<u64, &Function> = HashMap::new();
    for f in &p.function {
        fn_by_id.insert(f.id, f);
    }
    let mut frame_ix: HashMap<Frame, u32> = HashMap::new();
    let mut intern = |f: Frame, frames: &mut Vec<Frame>| -> u32 {
        *frame_ix.entry(f.clone()).or_insert_with(|| {
            frames.push(f);
            (frames.len() - 1) as u32
        })
    };
    // Each location expands to its lines, caller-most first.
    let mut loc_frames: HashMap<u64, Vec<u32>> = HashMap::new();
    for loc in &p.location {
        let mut ids = Vec::with_capacity(loc.line.len());
        for line in loc.line.iter().rev() {
            let f = fn_by_id.get(&line.function_id).ok_or_else(|| {
                bad(format!(
                    "location {} names function {} which is not in the profile",
                    loc.id, line.function_id
                ))
            })?;
            let frame = frame_from_function(f, line.line, &s)?;
            ids.push(intern(frame, &mut frames));
        }
        loc_frames.insert(loc.id, ids);
    }
    let mut stacks = Vec::with_capacity(p.sample.len());
    for (si, smp) in p.sample.iter().enumerate() {
        let mut stack = Vec::new();
        for id in smp.location_id.iter().rev() {
            let fs = loc_frames.get(id).ok_or_else(|| {
                bad(format!(
                    "sample {si} names location {id} which is not in the profile"
                ))
            })?;
            stack.extend_from_slice(fs);
        }
        let val = |ix: Option<usize>| -> u64 {
            ix.and_then(|i| smp.value.get(i))
                .map_or(0, |&v| u64::try_from(v).unwrap_or(0))
        };
        let sum_nanos = match sum_ix {
            Some(_) => val(sum_ix),
            None => val(mean_ix).saturating_mul(n),
        };
        stacks.push(StackStats {
            stack: stack.into(),
            sum_nanos,
            requests: val(req_ix),
            detail: None,
        });
    }
    let mut agg = Aggregate::from_parts(frames, stacks, n, comments);
    if let Some((a, b)) = start_range {
        agg.set_start_range(a, b);
    } else if p.time_nanos > 0 {
        let t = p.time_nanos as u64;
        agg.set_start_range(t, t.saturating_add(p.duration_nanos.max(0) as u64));
    }
    Ok(agg)
}

fn frame_from_function<'a>(
    f: &Function,
    line: i64,
    s: &impl Fn(i64) -> Result<&'a str, ProfileError>,
) -> Result<Frame, ProfileError> {
    let name = s(f.name)?;
    let sys = s(f.system_name)?;
    let file = s(f.filename)?;
    // "A1 (A)" with system name "A1" → service A; otherwise no service.
    let (service, node) = match name
        .strip_prefix(sys)
        .and_then(|rest| rest.strip_prefix(" ("))
        .and_then(|rest| rest.strip_suffix(')'))
    {
        Some(svc) if !sys.is_empty() => (svc, sys),
        _ => ("", name),
    };
    let mut frame = Frame::new(service, node);
    if !file.is_empty() {
        let l = if line > 0 { line } else { f.start_line };
        frame = frame.with_location(file, u32::try_from(l).unwrap_or(0));
    }
    Ok(frame)
}

/// Read a profile `cpt profile` (or `cpt merge`, `cpt diff -o`) wrote.
///
/// # Errors
///
/// [`InputError::Open`], or [`InputError::NotAProfile`] saying what the file
/// is instead (JSON Lines records, a store) and what to do.
pub fn read_file(path: &Path) -> Result<Aggregate, InputError> {
    let bytes = std::fs::read(path).map_err(|error| InputError::Open {
        path: path.to_path_buf(),
        error,
    })?;
    match read_aggregate(&bytes) {
        Ok(a) => Ok(a),
        Err(e) => {
            let text: Vec<u8> = if bytes.starts_with(&GZIP_MAGIC) {
                let mut out = Vec::new();
                let _ = MultiGzDecoder::new(&bytes[..])
                    .take(256)
                    .read_to_end(&mut out);
                out
            } else {
                bytes.iter().take(256).copied().collect()
            };
            let found = if bytes.starts_with(SQLITE_MAGIC) {
                format!(
                    "it is a cpt store: make a profile with `cpt profile --store {} -o OUT.pb.gz`",
                    path.display()
                )
            } else if text.trim_ascii_start().starts_with(b"{") {
                format!(
                    "it holds JSON Lines records: make a profile with `cpt profile -o OUT.pb.gz {}`",
                    path.display()
                )
            } else {
                format!("{e}; expected the .pb.gz file cpt profile writes")
            };
            Err(InputError::NotAProfile {
                path: path.to_path_buf(),
                found,
            })
        }
    }
}

#[cfg(test)]
mod tests;
