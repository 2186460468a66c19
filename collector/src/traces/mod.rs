//! Import distributed traces of services that do not use the SDK (Jaeger,
//! Zipkin v2, OTLP JSON) and compute their critical paths after the fact
//! (CRISP, Zhang et al., USENIX ATC 2022).
//!
//! The output is the same [`Record`] the SDK emits, one per selected root
//! span, so every profile, histogram and diff of the collector works on
//! imported traces unchanged. Frames name both the service and the
//! operation (`Frame { service, name: operation }`).
//!
//! # Pipeline
//!
//! 1. **Read** ([`jaeger`], [`zipkin`], [`otlp`], [`nezha`] CSV): gzipped or
//!    plain files (Jaeger, Zipkin and OTLP files above [`ImportOptions::stream_above_bytes`]
//!    are streamed);
//!    each trace is validated into the neutral [`model::Trace`]. A trace
//!    that is malformed (truncated JSON, missing parents, cycles, duplicate
//!    span ids, negative durations) is rejected with a [`TraceError`]
//!    naming the trace and the reason, counted, and skipped.
//! 2. **Repair** clock skew ([`skew`]): shift server spans by the Mystery
//!    Machine's symmetric-delay estimate where a client/server pair shows
//!    the skew, truncate children that stick out of their parent, drop
//!    children wholly outside it.
//! 3. **Walk** the critical path ([`crisp`], CRISP Listing 1 with the §5.2
//!    overlap threshold), iteratively.
//! 4. **Record**: segments in ns that sum exactly to the root's duration.
//!
//! # Accounting of repairs
//!
//! The time the repair cut (truncated + dropped + clipped overlaps) is the
//! record's [`Accounting::clock_skew`](cpt_sdk::Accounting::clock_skew); the
//! detail of every repair goes into the record's labels, only when non-zero
//! (values are decimal integers):
//!
//! | label | meaning |
//! |---|---|
//! | `skew.shifted_spans` | spans moved by a clock-domain offset |
//! | `skew.max_shift_ns` | largest absolute offset applied |
//! | `skew.truncated_spans` / `skew.truncated_ns` | spans cut to fit their parent, and the time cut |
//! | `skew.dropped_spans` / `skew.dropped_ns` | spans dropped (wholly outside their parent), and the dropped subtree roots' time |
//! | `skew.overlaps` / `skew.overlap_ns` | sibling overlaps read as sequential (§5.2), and the time clipped |
//! | `overhang.spans` / `overhang.ns` | children that ended after their parent on a clock that agrees with it, cut at the parent's end, and the time they ran after it (no skew: not in `clock_skew`) |
//! | `import.duplicate_span_ids` | span records of the trace that shared an id with a differing record (kept as `ID~dupK`) |
//!
//! Client spans' own time around their server span is
//! [`SegmentKind::Network`](cpt_sdk::SegmentKind) and is summed in
//! `Accounting::network`.
//!
//! Traces are processed in parallel (rayon): files across threads when
//! there are several, traces across threads within a single file.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use cpt_sdk::Record;
use rayon::prelude::*;

pub mod analysis;
pub mod import;
pub mod model;

// The format readers and the skew repair live in `import`, the CRISP walk
// in `analysis`; these keep the paths they had before the move.
pub use analysis::crisp;
pub use analysis::crisp_reference::Accounting;
pub use import::{jaeger, nezha, otlp, skew, zipkin};

pub use crisp::{OverlapThreshold, Piece};
pub use model::{BuildOptions, Reason, Span, SpanKind, Trace, TraceError};
pub use skew::{Adjustments, RepairOptions};

/// The trace file formats `cpt traces` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// Jaeger query-API JSON.
    Jaeger,
    /// Zipkin v2 JSON.
    Zipkin,
    /// OTLP JSON (collector file exporter; one document or one per line).
    Otlp,
    /// The span CSV of the Nezha data sets (one row per span).
    Nezha,
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "jaeger" => Ok(Format::Jaeger),
            "zipkin" => Ok(Format::Zipkin),
            "otlp" | "otel" | "opentelemetry" => Ok(Format::Otlp),
            "nezha" | "csv" => Ok(Format::Nezha),
            _ => Err(format!(
                "unknown trace format {s:?} (expected jaeger, zipkin, otlp or nezha)"
            )),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Jaeger => "jaeger",
            Format::Zipkin => "zipkin",
            Format::Otlp => "otlp",
            Format::Nezha => "nezha",
        })
    }
}

/// An endpoint to analyse: a span with this service and (when given) this
/// operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Service name.
    pub service: String,
    /// Operation name; `None` matches any operation of the service.
    pub operation: Option<String>,
}

impl FromStr for Endpoint {
    type Err = String;

    /// `SERVICE` or `SERVICE:OPERATION` (split at the first `:`, so
    /// operations may contain colons).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (service, operation) = match s.split_once(':') {
            Some((svc, op)) => (svc, Some(op.to_string())),
            None => (s, None),
        };
        if service.is_empty() {
            return Err(format!(
                "endpoint {s:?}: empty service (expected SERVICE[:OPERATION])"
            ));
        }
        Ok(Endpoint {
            service: service.to_string(),
            operation,
        })
    }
}

/// Which spans a record is made for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RootSelector {
    /// Every root span of every trace.
    #[default]
    AllRoots,
    /// Every span matching one of the endpoints that has no matching
    /// ancestor (the outermost call of the endpoint), anywhere in the trace.
    Endpoints(Vec<Endpoint>),
}

/// How to import.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Validation choices.
    pub build: BuildOptions,
    /// Clock-skew repair choices.
    pub repair: RepairOptions,
    /// Happens-before overlap allowance (in [`Accounting::Crisp`], only its
    /// fraction: CRISP's reference has no absolute cap).
    pub overlap: OverlapThreshold,
    /// How the path's time is shared between spans: cpt's walk or CRISP's
    /// reference ([`Accounting`]).
    pub accounting: Accounting,
    /// Which spans get records.
    pub roots: RootSelector,
    /// Jaeger, Zipkin and OTLP files whose (decompressed) size exceeds this
    /// are streamed instead of read whole (default 256 MiB), at some cost in
    /// speed. Jaeger: memory stays bounded by a batch of traces, and a JSON
    /// error ends the file instead of only its trace. Zipkin and OTLP (a
    /// trace's spans may be anywhere in the file): only the spans are held,
    /// not the file's text (OTLP: when it is one document per line; a single
    /// document is read whole).
    pub stream_above_bytes: u64,
    /// OTLP: attributes whose values a root span's record carries as
    /// labels (the span's own attribute, else its resource's), as `cpt
    /// serve --otlp-label` takes them. Other formats ignore it.
    pub otlp_labels: Vec<String>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            build: BuildOptions::default(),
            repair: RepairOptions::default(),
            overlap: OverlapThreshold::default(),
            accounting: Accounting::default(),
            roots: RootSelector::default(),
            stream_above_bytes: 256 << 20,
            otlp_labels: Vec::new(),
        }
    }
}

/// Structural facts about one analysed trace (CRISP §6.2 histograms),
/// measured under the selected root after repair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// Spans under the root (itself included), as read.
    pub spans: u32,
    /// Depth of the deepest span (the root is 1).
    pub depth: u32,
    /// The largest number of children of one parent active at once.
    pub concurrency: u32,
    /// Distinct spans with time on the critical path.
    pub path_spans: u32,
}

/// One analysed root: its record and shape.
#[derive(Clone, Debug)]
pub struct Analyzed {
    /// The record (critical path, accounting, labels).
    pub record: Record,
    /// Structure of the trace under the root.
    pub shape: Shape,
    /// What the clock-skew repair and the walk adjusted under the root (also
    /// in the record's `skew.*` labels).
    pub adjustments: Adjustments,
    /// With [`Accounting::Crisp`]: per call path (CRISP's
    /// `[service] operation;…` spelling), the exclusive ns (negatives
    /// zeroed) and the number of spans, for CRISP's conformance CCT
    /// ([`analysis::crisp_reference::conformance_cct`]). Empty otherwise.
    pub call_paths: Vec<(String, i64, u64)>,
}

/// Counters of one import.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportStats {
    /// Files given (read or not).
    pub files: u64,
    /// Files that could not be read at all (missing, a store, not UTF-8);
    /// their reasons are in [`Import::file_errors`]. Not counted as traces.
    pub failed_files: u64,
    /// Traces read (accepted + rejected).
    pub traces: u64,
    /// Traces rejected.
    pub rejected: u64,
    /// Spans in accepted traces.
    pub spans: u64,
    /// Records made.
    pub records: u64,
    /// Exact duplicate span records dropped.
    pub duplicates_dropped: u64,
    /// Differing span records sharing an id, kept as `ID~dupK`.
    pub duplicates_renamed: u64,
    /// Orphan spans kept as roots.
    pub orphans: u64,
    /// Sum of all repairs.
    pub adjustments: Adjustments,
}

/// The result of an import.
#[derive(Debug, Default)]
pub struct Import {
    /// One entry per selected root, in file and trace order.
    pub analyzed: Vec<Analyzed>,
    /// Rejected traces, with reasons.
    pub errors: Vec<TraceError>,
    /// Files that could not be read, one message each naming the file.
    pub file_errors: Vec<String>,
    /// Files read only in part (a gzip stream that breaks off: the traces
    /// before the break are kept), one message each.
    pub warnings: Vec<String>,
    /// Counters.
    pub stats: ImportStats,
}

impl Import {
    /// Count a trace that could not be read at all, and say why.
    fn reject(&mut self, e: TraceError) {
        self.stats.traces += 1;
        self.stats.rejected += 1;
        self.errors.push(e);
    }

    fn merge(&mut self, mut other: Import) {
        self.analyzed.append(&mut other.analyzed);
        self.errors.append(&mut other.errors);
        self.file_errors.append(&mut other.file_errors);
        self.warnings.append(&mut other.warnings);
        let (s, o) = (&mut self.stats, &other.stats);
        s.files += o.files;
        s.failed_files += o.failed_files;
        s.traces += o.traces;
        s.rejected += o.rejected;
        s.spans += o.spans;
        s.records += o.records;
        s.duplicates_dropped += o.duplicates_dropped;
        s.duplicates_renamed += o.duplicates_renamed;
        s.orphans += o.orphans;
        s.adjustments.add(&o.adjustments);
    }

    /// The records, in order.
    pub fn records(&self) -> impl Iterator<Item = &Record> {
        self.analyzed.iter().map(|a| &a.record)
    }
}

/// Called with the number of traces finished so far (for progress bars).
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Read, repair and walk every trace of the files.
///
/// Files are opened as [`crate::records::open`] does: decompressed when they
/// start with the gzip magic, a SQLite store refused. A file that cannot be
/// read is counted in [`ImportStats::failed_files`] and reported in
/// [`Import::file_errors`] (not as a rejected trace), and the run goes on; a
/// gzip file that breaks off keeps what was decoded before the break (its
/// complete traces) and is reported in [`Import::warnings`].
pub fn import_files(
    paths: &[PathBuf],
    format: Format,
    opts: &ImportOptions,
    progress: Progress<'_>,
) -> Import {
    let done = AtomicU64::new(0);
    let tick = |n: u64| progress(done.fetch_add(n, Ordering::Relaxed) + n);
    // Per-thread buffers, reused across files: the pages of a decompressed
    // file are faulted in once per thread, not once per file.
    thread_local! {
        static BUFS: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }
    let one = |p: &PathBuf, inner_parallel: bool| {
        if matches!(format, Format::Jaeger | Format::Zipkin | Format::Otlp)
            && size_hint(p) > opts.stream_above_bytes
        {
            let mut imp = import_stream(p, format, opts, &tick);
            imp.stats.files = 1;
            return imp;
        }
        BUFS.with(|b| {
            let (raw, text) = &mut *b.borrow_mut();
            let imp = match read_input(p, raw) {
                Ok((t, warning)) => {
                    let mut imp = import_text(t, format, opts, inner_parallel, &tick);
                    imp.stats.files = 1;
                    imp.warnings.extend(warning);
                    imp
                }
                Err(e) => Import {
                    file_errors: vec![e],
                    stats: ImportStats {
                        files: 1,
                        failed_files: 1,
                        ..Default::default()
                    },
                    ..Default::default()
                },
            };
            // Do not keep more than 64 MiB per thread between files.
            for v in [raw, text] {
                v.clear();
                v.shrink_to(64 << 20);
            }
            imp
        })
    };
    // Several files: one file per thread (bounded memory); one file: its
    // traces across threads.
    let parts: Vec<Import> = if paths.len() >= rayon::current_num_threads() {
        // Largest files first (longest-processing-time-first scheduling),
        // results back in the order given.
        let mut order: Vec<(usize, u64)> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| (i, std::fs::metadata(p).map_or(0, |m| m.len())))
            .collect();
        order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut done: Vec<(usize, Import)> = order
            .par_iter()
            .with_max_len(1)
            .map(|&(i, _)| (i, one(&paths[i], false)))
            .collect();
        done.sort_by_key(|(i, _)| *i);
        done.into_iter().map(|(_, imp)| imp).collect()
    } else {
        paths.iter().map(|p| one(p, true)).collect()
    };
    let mut all = Import::default();
    for p in parts {
        all.merge(p);
    }
    all
}

/// The file's size, or for a gzip file its uncompressed size (mod 4 GiB,
/// from the gzip trailer; at least the compressed size).
fn size_hint(path: &Path) -> u64 {
    use std::io::{Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return 0;
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let mut magic = [0u8; 2];
    if len < 18 || f.read_exact(&mut magic).is_err() || magic != [0x1f, 0x8b] {
        return len;
    }
    let mut isize = [0u8; 4];
    match f
        .seek(SeekFrom::End(-4))
        .and_then(|_| f.read_exact(&mut isize))
    {
        Ok(()) => u64::from(u32::from_le_bytes(isize)).max(len),
        Err(_) => len,
    }
}

/// Stream a large Jaeger, Zipkin or OTLP file: parse on this thread,
/// analyse batches of traces in parallel (OTLP: once read, since a trace's
/// spans may be on any line).
fn import_stream(
    path: &Path,
    format: Format,
    opts: &ImportOptions,
    progress: Progress<'_>,
) -> Import {
    const BATCH: usize = 4096;
    let reader = match crate::records::open(path) {
        Ok(o) => o.reader,
        Err(e) => {
            return Import {
                file_errors: vec![e.to_string()],
                stats: ImportStats {
                    failed_files: 1,
                    ..Default::default()
                },
                ..Default::default()
            };
        }
    };
    let mut imp = Import::default();
    let mut batch: Vec<Result<Trace, TraceError>> = Vec::with_capacity(BATCH);
    let mut names = model::Interner::default();
    let mut each = |t| {
        batch.push(t);
        if batch.len() == BATCH {
            imp.merge(analyze_all(
                std::mem::take(&mut batch),
                opts,
                true,
                progress,
            ));
        }
    };
    if matches!(format, Format::Zipkin | Format::Otlp) {
        let errs = if format == Format::Zipkin {
            zipkin::read_reader(reader, opts.build, &mut each)
        } else {
            otlp::read_reader(reader, opts.build, &opts.otlp_labels, &mut each)
        };
        imp.merge(analyze_all(batch, opts, true, progress));
        for e in errs {
            imp.reject(e);
        }
        return imp;
    }
    let res = jaeger::for_each_reader(reader, &mut names, opts.build, &mut each);
    imp.merge(analyze_all(batch, opts, true, progress));
    if let Err((n, e)) = res {
        if e.is_io() {
            // The input broke off (a gzip stream cut short): the traces
            // before are good, the rest of the file is lost.
            imp.warnings.push(format!(
                "{}: the input breaks off after {n} traces ({e}); kept them, the rest of the \
                 file is lost (truncated download or copy?)",
                path.display()
            ));
            return imp;
        }
        imp.reject(TraceError::new(
            format!("file:{} (after {n} traces)", path.display()),
            Reason::Json(e.to_string()),
        ));
    }
    imp
}

/// Analyse read traces (and count the rejected ones).
fn analyze_all(
    items: Vec<Result<Trace, TraceError>>,
    opts: &ImportOptions,
    parallel: bool,
    progress: Progress<'_>,
) -> Import {
    fold_chunks(&items, parallel, progress, |w, item, imp| {
        process_ref(item.as_ref(), opts, &mut w.scratch, &mut w.pieces, imp);
    })
}

/// A file's text, read into `buf` as [`crate::records::open`] reads it, with
/// a warning when its gzip stream breaks off (the text then ends at the last
/// complete character before the break).
fn read_input<'b>(path: &Path, buf: &'b mut Vec<u8>) -> Result<(&'b str, Option<String>), String> {
    buf.clear();
    let hint = size_hint(path);
    buf.reserve(usize::try_from(hint).unwrap_or(0).min(1 << 30));
    let broken = crate::records::read_to_end(path, buf).map_err(|e| e.to_string())?;
    let warning = broken.map(|e| {
        format!(
            "{}: the gzip stream breaks off after {} bytes ({e}); kept the traces before it, \
             the rest of the file is lost (truncated download or copy?)",
            path.display(),
            buf.len()
        )
    });
    let text = match std::str::from_utf8(buf) {
        Ok(t) => t,
        // Cut in the middle of a character: keep the complete ones.
        Err(e) if warning.is_some() && e.error_len().is_none() => {
            std::str::from_utf8(&buf[..e.valid_up_to()]).expect("valid up to here")
        }
        Err(e) => return Err(format!("{}: not UTF-8: {e}", path.display())),
    };
    Ok((text, warning))
}

/// [`read_text`] into caller-owned buffers (`raw` for the file's bytes,
/// `text` for the decompressed ones), returning the text.
///
/// # Errors
///
/// As [`read_text`].
pub fn read_text_into<'b>(
    path: &Path,
    raw: &'b mut Vec<u8>,
    text: &'b mut Vec<u8>,
) -> Result<&'b str, String> {
    raw.clear();
    text.clear();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(raw))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let bytes: &[u8] = if raw.starts_with(&[0x1f, 0x8b]) {
        let hint = raw
            .len()
            .checked_sub(4)
            .map(|i| u32::from_le_bytes(raw[i..].try_into().expect("4 bytes")) as usize)
            .unwrap_or(0);
        text.reserve(hint.min(1 << 30));
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(text)
            .map_err(|e| format!("{}: gzip: {e}", path.display()))?;
        text
    } else {
        raw
    };
    std::str::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8: {e}", path.display()))
}

/// Read a file as UTF-8 text, gunzipping when it starts with the gzip magic.
///
/// # Errors
///
/// I/O errors, a corrupt gzip stream, or text that is not UTF-8, as a
/// message naming the file.
pub fn read_text(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        // ISIZE (last 4 bytes) is the uncompressed size mod 2^32: a good hint.
        let hint = bytes
            .len()
            .checked_sub(4)
            .map(|i| u32::from_le_bytes(bytes[i..].try_into().expect("4 bytes")) as usize)
            .unwrap_or(0);
        let mut out = Vec::with_capacity(hint.min(1 << 30));
        flate2::read::MultiGzDecoder::new(&bytes[..])
            .read_to_end(&mut out)
            .map_err(|e| format!("{}: gzip: {e}", path.display()))?;
        out
    } else {
        bytes
    };
    String::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8: {e}", path.display()))
}

/// Import one document's text (see [`import_files`]).
pub fn import_text(
    text: &str,
    format: Format,
    opts: &ImportOptions,
    parallel: bool,
    progress: Progress<'_>,
) -> Import {
    match format {
        Format::Jaeger if !parallel => {
            // One pass; on a JSON error, the robust path takes over at the
            // trace that failed.
            let mut w = Worker::default();
            let mut imp = Import::default();
            let Worker {
                names,
                scratch,
                pieces,
            } = &mut w;
            let mut since_tick = 0u64;
            let res = jaeger::for_each(text, names, opts.build, &mut |res| {
                process_one(res, opts, scratch, pieces, &mut imp);
                since_tick += 1;
                if since_tick == CHUNK as u64 {
                    progress(since_tick);
                    since_tick = 0;
                }
            });
            progress(since_tick);
            if let Err((done, _)) = res {
                let (raws, err) = jaeger::split(text);
                let rest = raws.get(done..).unwrap_or(&[]);
                imp.merge(run(
                    rest,
                    |raw, names| jaeger::parse_trace(raw, names, opts.build),
                    opts,
                    false,
                    progress,
                ));
                if let Some(e) = err {
                    imp.reject(e);
                }
            }
            imp
        }
        Format::Jaeger => {
            let (raws, err) = jaeger::split(text);
            let mut imp = run(
                &raws,
                |raw, names| jaeger::parse_trace(raw, names, opts.build),
                opts,
                parallel,
                progress,
            );
            if let Some(e) = err {
                imp.reject(e);
            }
            imp
        }
        Format::Zipkin => {
            let (traces, errs) = zipkin::read(text, opts.build);
            finish_prebuilt(traces, errs, opts, parallel, progress)
        }
        Format::Otlp => {
            let (traces, errs) = otlp::read(text, opts.build, &opts.otlp_labels);
            finish_prebuilt(traces, errs, opts, parallel, progress)
        }
        Format::Nezha => {
            let (traces, errs) = nezha::read(text, opts.build);
            finish_prebuilt(traces, errs, opts, parallel, progress)
        }
    }
}

fn finish_prebuilt(
    traces: Vec<Result<Trace, TraceError>>,
    errs: Vec<TraceError>,
    opts: &ImportOptions,
    parallel: bool,
    progress: Progress<'_>,
) -> Import {
    let mut imp = analyze_all(traces, opts, parallel, progress);
    imp.stats.rejected += errs.len() as u64;
    imp.stats.traces += errs.len() as u64;
    imp.errors.extend(errs);
    imp
}

/// Traces per progress report and per parallel task.
const CHUNK: usize = 256;

/// Analyse one read trace (or count its rejection) into `imp`.
fn process_one(
    res: Result<Trace, TraceError>,
    opts: &ImportOptions,
    scratch: &mut crisp::Scratch,
    pieces: &mut Vec<Piece>,
    imp: &mut Import,
) {
    match res {
        Ok(t) => process_ref(Ok(&t), opts, scratch, pieces, imp),
        Err(e) => imp.reject(e),
    }
}

fn process_ref(
    res: Result<&Trace, &TraceError>,
    opts: &ImportOptions,
    scratch: &mut crisp::Scratch,
    pieces: &mut Vec<Piece>,
    imp: &mut Import,
) {
    imp.stats.traces += 1;
    match res {
        Ok(trace) => {
            imp.stats.spans += trace.spans.len() as u64;
            imp.stats.duplicates_dropped += trace.duplicates_dropped as u64;
            imp.stats.duplicates_renamed += trace.duplicates_renamed as u64;
            imp.stats.orphans += trace.orphans as u64;
            for a in trace_records(trace, opts, scratch, pieces) {
                imp.stats.records += 1;
                imp.stats.adjustments.add(&a.adjustments);
                imp.analyzed.push(a);
            }
        }
        Err(e) => {
            imp.stats.rejected += 1;
            imp.errors.push(e.clone());
        }
    }
}

/// The records of one validated trace, as every import makes them: one
/// per selected root ([`analyze`]), each labelled
/// `import.duplicate_span_ids` when the trace's span ids were ambiguous.
/// `cpt serve`'s OTLP receiver makes its records with this too.
pub fn trace_records(
    trace: &Trace,
    opts: &ImportOptions,
    scratch: &mut crisp::Scratch,
    pieces: &mut Vec<Piece>,
) -> Vec<Analyzed> {
    let mut out = analyze(trace, opts, scratch, pieces);
    if !trace.root_labels.is_empty() {
        // The root's labels (OTLP's `--otlp-label`); a record's request id
        // is its root span's id. Labels the analysis set win.
        for a in &mut out {
            let root = a.record.request_id.as_deref();
            if let Some((_, labels)) = trace.root_labels.iter().find(|(id, _)| Some(&**id) == root)
            {
                for (key, v) in labels {
                    a.record
                        .labels
                        .entry(key.clone())
                        .or_insert_with(|| v.clone());
                }
            }
        }
    }
    if trace.duplicates_renamed > 0 {
        // The trace's span ids were ambiguous: say so on every record
        // made from it.
        for a in &mut out {
            a.record.labels.insert(
                "import.duplicate_span_ids".into(),
                trace.duplicates_renamed.to_string(),
            );
        }
    }
    out
}

/// Thread-local state of the trace workers.
#[derive(Debug, Default)]
struct Worker {
    names: model::Interner,
    scratch: crisp::Scratch,
    pieces: Vec<Piece>,
}

fn run<T: Sync>(
    items: &[T],
    parse: impl Fn(&T, &mut model::Interner) -> Result<Trace, TraceError> + Sync,
    opts: &ImportOptions,
    parallel: bool,
    progress: Progress<'_>,
) -> Import {
    fold_chunks(items, parallel, progress, |w, item, imp| {
        let res = parse(item, &mut w.names);
        process_one(res, opts, &mut w.scratch, &mut w.pieces, imp);
    })
}

/// Run `each` over `items` in chunks (on the rayon pool when `parallel`),
/// one [`Worker`] per thread, reporting progress per chunk, and merge the
/// per-chunk imports.
fn fold_chunks<T: Sync>(
    items: &[T],
    parallel: bool,
    progress: Progress<'_>,
    each: impl Fn(&mut Worker, &T, &mut Import) + Sync,
) -> Import {
    let work = |w: &mut Worker, chunk: &[T]| {
        let mut imp = Import::default();
        for item in chunk {
            each(w, item, &mut imp);
        }
        progress(chunk.len() as u64);
        imp
    };
    let parts: Vec<Import> = if parallel {
        items
            .par_chunks(CHUNK)
            .map_init(Worker::default, work)
            .collect()
    } else {
        let mut w = Worker::default();
        items.chunks(CHUNK).map(|c| work(&mut w, c)).collect()
    };
    let mut all = Import::default();
    for p in parts {
        all.merge(p);
    }
    all
}

/// Read the `skew.*` and `overhang.*` labels of a record back into
/// [`Adjustments`].
pub fn adjustments_of(r: &Record) -> Adjustments {
    let get = |k: &str| {
        r.labels
            .get(k)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Adjustments {
        shifted_spans: get("skew.shifted_spans"),
        max_shift_ns: get("skew.max_shift_ns"),
        truncated_spans: get("skew.truncated_spans"),
        truncated_ns: get("skew.truncated_ns"),
        dropped_spans: get("skew.dropped_spans"),
        dropped_ns: get("skew.dropped_ns"),
        overlap_ns: get("skew.overlap_ns"),
        overlaps: get("skew.overlaps"),
        overhang_spans: get("overhang.spans"),
        overhang_ns: get("overhang.ns"),
    }
}

/// The spans of a trace that get a record under `sel`.
pub fn select_roots(trace: &Trace, sel: &RootSelector) -> Vec<u32> {
    match sel {
        RootSelector::AllRoots => trace.roots().collect(),
        RootSelector::Endpoints(eps) => {
            let matches = |i: usize| {
                let s = &trace.spans[i];
                eps.iter().any(|e| {
                    *e.service == *s.service
                        && e.operation.as_deref().is_none_or(|o| o == &*s.operation)
                })
            };
            // `under[i]`: some ancestor (or i itself) matched.
            let mut under = vec![false; trace.spans.len()];
            let mut out = Vec::new();
            for i in 0..trace.spans.len() {
                let parent_under = trace.spans[i].parent.is_some_and(|p| under[p as usize]);
                if !parent_under && matches(i) {
                    out.push(i as u32);
                }
                under[i] = parent_under || matches(i);
            }
            out
        }
    }
}

/// Repair a trace and walk the critical path of every selected root.
///
/// The repair is done relative to each selected root: spans outside the
/// root's subtree are not looked at, and the root keeps its own times.
pub fn analyze(
    trace: &Trace,
    opts: &ImportOptions,
    scratch: &mut crisp::Scratch,
    pieces: &mut Vec<Piece>,
) -> Vec<Analyzed> {
    let roots = select_roots(trace, &opts.roots);
    if roots.is_empty() {
        return Vec::new();
    }
    let rep = skew::repair(trace, &opts.repair, &roots);
    // One pass over the spans for every root's shape and adjustments
    // (`owner[i]`: position in `roots` of the root whose subtree holds i).
    let n = trace.spans.len();
    const NONE: u32 = u32::MAX;
    let mut owner = vec![NONE; n];
    let mut depth = vec![0u32; n];
    for (k, &r) in roots.iter().enumerate() {
        owner[r as usize] = k as u32;
        depth[r as usize] = 1;
    }
    let mut shapes = vec![
        Shape {
            spans: 1,
            depth: 1,
            ..Default::default()
        };
        roots.len()
    ];
    let mut adjs = vec![skew::Adjustments::default(); roots.len()];
    let mut ev: Vec<(i64, i32)> = Vec::new();
    for i in 0..n {
        if owner[i] == NONE {
            if let Some(p) = trace.spans[i].parent
                && owner[p as usize] != NONE
            {
                owner[i] = owner[p as usize];
                depth[i] = depth[p as usize] + 1;
            } else {
                continue;
            }
            let k = owner[i] as usize;
            let p = trace.spans[i].parent.expect("owned non-roots have parents") as usize;
            let (shape, adj) = (&mut shapes[k], &mut adjs[k]);
            shape.spans += 1;
            shape.depth = shape.depth.max(depth[i]);
            if rep.shift[i] != 0 {
                adj.shifted_spans += 1;
                adj.max_shift_ns = adj.max_shift_ns.max(rep.shift[i].unsigned_abs());
            }
            if !rep.kept[i] {
                adj.dropped_spans += 1;
                if rep.kept[p] {
                    // Root of the dropped subtree: its whole (shifted) duration.
                    adj.dropped_ns += trace.spans[i].duration_ns as u64;
                }
                continue;
            }
            let cut = trace.spans[i].duration_ns - (rep.end[i] - rep.start[i]);
            let over = rep.overhang[i];
            if over > 0 {
                adj.overhang_spans += 1;
                adj.overhang_ns += over as u64;
            }
            if cut > over {
                adj.truncated_spans += 1;
                adj.truncated_ns += (cut - over) as u64;
            }
        }
        // Concurrency among this (kept, owned) span's children.
        if rep.kept[i] {
            let c = concurrency(trace, &rep, i as u32, &mut ev);
            let k = owner[i] as usize;
            shapes[k].concurrency = shapes[k].concurrency.max(c);
        }
    }
    let mut out = Vec::with_capacity(roots.len());
    for (k, &root) in roots.iter().enumerate() {
        pieces.clear();
        let mut call_paths = Vec::new();
        let walk = match opts.accounting {
            Accounting::Cpt => crisp::walk(trace, &rep, root, &opts.overlap, scratch, pieces),
            Accounting::Crisp => {
                use analysis::crisp_reference as reference;
                let path = reference::critical_path(trace, &rep, root, opts.overlap.fraction);
                reference::pieces(trace, root, &path, pieces);
                call_paths = reference::by_call_path(trace, root, &path)
                    .into_iter()
                    .map(|(k, _, ns, n)| (k, ns, n))
                    .collect();
                crisp::WalkStats::default()
            }
        };
        let mut adj = adjs[k];
        adj.overlaps = walk.overlaps;
        adj.overlap_ns = walk.overlap_ns;
        let mut shape = shapes[k];
        let mut on_path: Vec<u32> = pieces.iter().map(|p| p.span).collect();
        on_path.sort_unstable();
        on_path.dedup();
        shape.path_spans = on_path.len() as u32;
        let record = crisp::to_record(trace, &rep, root, pieces, &adj);
        out.push(Analyzed {
            record,
            shape,
            adjustments: adj,
            call_paths,
        });
    }
    out
}

/// The largest number of children of span `i` active at once (children
/// touching end-to-start are not concurrent).
fn concurrency(trace: &Trace, rep: &skew::Repaired, i: u32, ev: &mut Vec<(i64, i32)>) -> u32 {
    ev.clear();
    for &c in trace.children(i) {
        let c = c as usize;
        if rep.kept[c] && rep.end[c] > rep.start[c] {
            ev.push((rep.start[c], 1));
            ev.push((rep.end[c], -1));
        }
    }
    // Ends sort before starts at equal times.
    ev.sort_unstable();
    let (mut cur, mut best) = (0i32, 0i32);
    for &(_, d) in ev.iter() {
        cur += d;
        best = best.max(cur);
    }
    best as u32
}
