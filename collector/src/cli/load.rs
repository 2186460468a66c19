//! Reading whole traces for the analyses that need them (`cpt traces
//! predict`, `whatif` and the Mystery Machine's commands), with the same
//! reporting of unreadable files and rejected traces everywhere.

use std::path::PathBuf;

use anyhow::bail;

use crate::format::plural;
use crate::traces::{BuildOptions, Format};

/// Read whole traces for the analyses that need them (`predict`, `whatif`,
/// the Mystery Machine's commands): print file errors, broken-tail
/// warnings and the rejected count (prefixed by `what`, e.g. "training"),
/// and fail when no trace could be read.
pub(crate) fn load_traces(
    what: &str,
    files: &[PathBuf],
    format: Format,
    orphans_as_roots: bool,
) -> anyhow::Result<crate::traces::import::TraceSet> {
    let set = crate::traces::import::read_traces(files, format, BuildOptions { orphans_as_roots });
    for e in &set.file_errors {
        eprintln!("error: {e}");
    }
    for w in &set.warnings {
        eprintln!("warning: {w}");
    }
    let what = if what.is_empty() {
        String::new()
    } else {
        format!("{what} ")
    };
    if let Some(first) = set.rejected.first() {
        eprintln!(
            "{what}{} rejected (first: {first})",
            plural(set.rejected.len() as u64, "trace")
        );
    }
    if set.traces.is_empty() {
        bail!(
            "no {what}trace could be read from {} (see the errors above); are they {format} traces?",
            plural(files.len() as u64, "file"),
        );
    }
    Ok(set)
}
