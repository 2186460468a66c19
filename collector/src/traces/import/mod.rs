//! Reading traces in, one module per format ([`jaeger`], [`zipkin`],
//! [`otlp`], [`nezha`] CSV), each producing the neutral
//! [`Trace`], and the clock-skew repair
//! ([`skew`]) every analysis starts from.
//!
//! What comes after the import (the CRISP walk, the reports) is in
//! [`analysis`](crate::traces::analysis); the model both share is
//! [`model`](crate::traces::model); the pipeline that ties them together
//! (files in, records out) is the parent module, [`crate::traces`].

pub mod jaeger;
pub mod nezha;
pub mod otlp;
pub mod skew;
pub(crate) mod tags;
pub mod zipkin;

use std::path::PathBuf;

use crate::traces::Format;
use crate::traces::model::{BuildOptions, Interner, Trace, TraceError};

/// The traces of some files, for analyses that work on whole traces rather
/// than on the records [`crate::traces::import_files`] makes (Mann et al.'s
/// execution flows, the Mystery Machine).
#[derive(Debug, Default)]
pub struct TraceSet {
    /// The traces read and validated, in file order.
    pub traces: Vec<Trace>,
    /// Traces rejected, with the reason.
    pub rejected: Vec<TraceError>,
    /// Files that could not be read at all (`cannot open …`).
    pub file_errors: Vec<String>,
    /// Files read only in part (a gzip stream that breaks off).
    pub warnings: Vec<String>,
}

/// Read and validate every trace of `paths` (gzipped or not, as
/// [`crate::records::open`] reads them).
pub fn read_traces(paths: &[PathBuf], format: Format, opts: BuildOptions) -> TraceSet {
    let mut set = TraceSet::default();
    let mut names = Interner::default();
    let mut buf = Vec::new();
    for path in paths {
        buf.clear();
        match crate::records::read_to_end(path, &mut buf) {
            Err(e) => {
                set.file_errors.push(e.to_string());
                continue;
            }
            Ok(Some(e)) => set.warnings.push(format!(
                "{}: the gzip stream breaks off ({e}); the traces before the break are kept",
                path.display()
            )),
            Ok(None) => {}
        }
        let text = match std::str::from_utf8(&buf) {
            Ok(t) => t,
            Err(e) => {
                set.file_errors
                    .push(format!("{}: not UTF-8 text: {e}", path.display()));
                continue;
            }
        };
        read_text(text, format, opts, &mut names, &mut set);
    }
    set
}

/// Read and validate every trace of one document's text, as
/// [`read_traces`] reads a file.
pub fn read_traces_text(text: &str, format: Format, opts: BuildOptions) -> TraceSet {
    let mut set = TraceSet::default();
    read_text(text, format, opts, &mut Interner::default(), &mut set);
    set
}

fn read_text(
    text: &str,
    format: Format,
    opts: BuildOptions,
    names: &mut Interner,
    set: &mut TraceSet,
) {
    let (results, errs) = match format {
        Format::Jaeger => {
            let (raws, err) = jaeger::split(text);
            let results = raws
                .iter()
                .map(|raw| jaeger::parse_trace(raw, names, opts))
                .collect();
            (results, err.into_iter().collect())
        }
        Format::Zipkin => zipkin::read(text, opts),
        Format::Otlp => otlp::read(text, opts, &[]),
        Format::Nezha => nezha::read(text, opts),
    };
    for r in results {
        match r {
            Ok(t) => set.traces.push(t),
            Err(e) => set.rejected.push(e),
        }
    }
    set.rejected.extend(errs);
}
