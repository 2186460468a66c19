//! Helpers shared by the trace-import tests.

use std::path::PathBuf;

use cpt_collector::traces::{Format, Import, ImportOptions, import_files};
use cpt_sdk::Record;

/// A file or folder of the repository's `testdata/` (third-party traces; each
/// source's README and licence are beside its files).
///
/// # Panics
///
/// When it is missing, with a message naming it and how to get it back: a
/// test whose data is gone must say so, not fail on an empty list later.
pub(crate) fn testdata(rel: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata")
        .join(rel);
    assert!(
        path.exists(),
        "test data `testdata/{rel}` is missing ({}): it is checked into the repository; \
         restore it with `git checkout -- testdata` (see testdata/README.md)",
        path.display()
    );
    path
}

/// Import files with options.
pub(crate) fn import(paths: &[PathBuf], format: Format, opts: &ImportOptions) -> Import {
    import_files(paths, format, opts, &|_| {})
}

/// `service:op;service:op` of a segment stack.
pub(crate) fn stack_key(r: &Record, stack: &[cpt_sdk::FrameId]) -> String {
    stack
        .iter()
        .map(|id| {
            let f = r.path.frame(*id);
            format!("{}:{}", f.service, f.name)
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// The path as `stack µs|stack µs|…` (frames shortened to their operation
/// when `short`), times in µs.
pub(crate) fn path_string(r: &Record) -> String {
    r.path
        .segments()
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                stack_key(r, &s.stack),
                s.duration.as_nanos() as f64 / 1000.0
            )
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// Exclusive µs per call path, sorted by call path.
pub(crate) fn exclusive(r: &Record) -> Vec<(String, u64)> {
    let mut m: std::collections::BTreeMap<String, u64> = Default::default();
    for s in r.path.segments() {
        *m.entry(stack_key(r, &s.stack)).or_default() += (s.duration.as_nanos() / 1000) as u64;
    }
    m.into_iter().collect()
}
