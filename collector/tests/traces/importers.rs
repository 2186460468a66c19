//! Importers lose nothing silently (issue 18): every file's traces, Zipkin's
//! own merge of span pieces, times in the wrong unit refused.

use std::path::PathBuf;

use cpt_collector::traces::{Format, ImportOptions};

use crate::support::import;

/// Write `text` as `name` in `dir`.
fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).expect("write test file");
    p
}

/// One bare Jaeger trace object (what the Jaeger UI saves): a root and a
/// child, times in µs.
fn bare_jaeger(trace: &str, start_us: i64, dur_us: i64) -> String {
    format!(
        r#"{{"traceID":"{trace}","processes":{{"p1":{{"serviceName":"A"}}}},
          "spans":[
            {{"traceID":"{trace}","spanID":"r","operationName":"GET","references":[],
              "startTime":{start_us},"duration":{dur_us},"processID":"p1"}},
            {{"traceID":"{trace}","spanID":"c","operationName":"db","processID":"p1",
              "references":[{{"refType":"CHILD_OF","traceID":"{trace}","spanID":"r"}}],
              "startTime":{},"duration":{}}}
          ]}}"#,
        start_us + 10,
        dur_us / 2
    )
}

#[test]
fn several_bare_single_trace_jaeger_files_keep_every_trace() {
    let dir = tempfile::tempdir().unwrap();
    // As many files as threads (at least two): the import then reads one
    // file per thread, the path that dropped bare trace objects.
    let n = rayon::current_num_threads().max(2);
    let paths: Vec<PathBuf> = (0..n)
        .map(|i| {
            write(
                &dir,
                &format!("t{i}.json"),
                &bare_jaeger(&format!("t{i}"), 1_700_000_000_000_000 + i as i64, 100),
            )
        })
        .collect();
    for stream_above_bytes in [u64::MAX, 0] {
        let opts = ImportOptions {
            stream_above_bytes,
            ..Default::default()
        };
        let imp = import(&paths, Format::Jaeger, &opts);
        assert!(imp.errors.is_empty(), "{:?}", imp.errors);
        assert_eq!(
            (imp.stats.files, imp.stats.traces, imp.stats.records),
            (n as u64, n as u64, n as u64),
            "streamed above {stream_above_bytes} bytes"
        );
        let mut ids: Vec<String> = imp
            .records()
            .map(|r| r.trace_id.clone().unwrap_or_default())
            .collect();
        ids.sort();
        let mut want: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
        want.sort();
        assert_eq!(ids, want);
    }
}
