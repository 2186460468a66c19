//! Records as Parquet through the command line: `cpt export --parquet-dir`,
//! Parquet files and directories as inputs, and bad Parquet input.

use super::*;

/// Records of two arms, one forced, spread over two start hours.
fn records() -> Vec<Record> {
    let mut out = Vec::new();
    for i in 0..20u64 {
        let mut r = entry(if i % 2 == 0 { "a" } else { "b" });
        r.start_unix_nanos = Some(1_700_000_000_000_000_000 + (i % 2) * 3_600_000_000_000);
        r.request_id = Some(format!("req-{i}"));
        if i == 7 {
            r.trigger = Trigger::Forced;
        }
        out.push(r);
    }
    out
}

/// Every regular file below `dir`, relative, sorted.
fn files_below(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn export_writes_hive_partitions_that_profile_reads_like_the_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let src = write(dir.path(), "r.jsonl", &jsonl(&records()));
    let out = dir.path().join("pq");
    let (_, err) = run(
        &[
            "export",
            src.to_str().unwrap(),
            "--parquet-dir",
            out.to_str().unwrap(),
        ],
        true,
    );
    assert!(err.contains("wrote 20 records to 2 Parquet files"), "{err}");
    let files = files_below(&out);
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(
        files[0].starts_with("date=2023-11-14/hour=22/part-"),
        "{files:?}"
    );
    assert!(
        files[1].starts_with("date=2023-11-14/hour=23/part-"),
        "{files:?}"
    );
    assert!(files.iter().all(|f| f.ends_with(".parquet")), "{files:?}");
    // the directory, and one file of it, fold like the JSON Lines they came from
    for args in [
        &["--trigger", "all"][..],
        &["--label", "arm=a"][..],
        &["--trigger", "forced"][..],
    ] {
        let from = |input: &str| {
            let mut a = vec!["folded", input];
            a.extend_from_slice(args);
            run(&a, true).0
        };
        let want = from(src.to_str().unwrap());
        assert!(!want.is_empty());
        assert_eq!(from(out.to_str().unwrap()), want, "{args:?}");
    }
    let one = out.join(&files[0]);
    let (folded_one, err) = run(&["folded", one.to_str().unwrap(), "--trigger", "all"], true);
    assert!(err.contains("10 records read"), "{err}");
    assert!(!folded_one.is_empty());
    // `cpt show` finds a request in the directory too
    let (shown, _) = run(
        &["show", "--request-id", "req-7", out.to_str().unwrap()],
        true,
    );
    assert!(shown.contains("a2"), "{shown}");
}

#[cfg(feature = "server")]
#[test]
fn export_from_a_store_keeps_every_record_forced_ones_too() {
    let dir = tempfile::tempdir().unwrap();
    let src = write(dir.path(), "r.jsonl", &jsonl(&records()));
    let store = dir.path().join("s.db");
    run(
        &[
            "import",
            "--store",
            store.to_str().unwrap(),
            src.to_str().unwrap(),
        ],
        true,
    );
    let out = dir.path().join("pq");
    let (_, err) = run(
        &[
            "export",
            "--store",
            store.to_str().unwrap(),
            "--parquet-dir",
            out.to_str().unwrap(),
        ],
        true,
    );
    assert!(err.contains("wrote 20 records"), "{err}");
    let fold = |input: &str| run(&["folded", input, "--trigger", "all"], true).0;
    assert_eq!(fold(out.to_str().unwrap()), fold(src.to_str().unwrap()));
}

/// Export `records()` into `dir/name`; the files written.
fn exported(dir: &Path, name: &str) -> (PathBuf, Vec<String>) {
    let src = write(dir, &format!("{name}.jsonl"), &jsonl(&records()));
    let out = dir.join(name);
    run(
        &[
            "export",
            src.to_str().unwrap(),
            "--parquet-dir",
            out.to_str().unwrap(),
        ],
        true,
    );
    let files = files_below(&out);
    (out, files)
}

/// A Parquet file with one int64 column `x` and the given key-value metadata.
fn foreign_parquet(path: &Path, meta: Option<(&str, &str)>) {
    use ::parquet::arrow::ArrowWriter;
    use ::parquet::file::metadata::KeyValue;
    use ::parquet::file::properties::WriterProperties;
    use arrow_array::{ArrayRef, Int64Array, RecordBatch};
    let batch = RecordBatch::try_from_iter([(
        "x",
        std::sync::Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef,
    )])
    .unwrap();
    let props = WriterProperties::builder()
        .set_key_value_metadata(meta.map(|(k, v)| vec![KeyValue::new(k.into(), v.to_owned())]))
        .build();
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(path).unwrap(),
        batch.schema(),
        Some(props),
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn a_parquet_file_of_another_schema_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.parquet");
    foreign_parquet(&plain, None);
    let (_, err) = run(&["folded", plain.to_str().unwrap()], false);
    assert!(
        err.contains("plain.parquet: not a cpt records file (no cpt.schema entry"),
        "{err}"
    );
    assert!(err.contains("cpt export --parquet-dir"), "{err}");
    let other = dir.path().join("v9.parquet");
    foreign_parquet(&other, Some(("cpt.schema", "cpt.records.v9")));
    let (_, err) = run(&["profile", other.to_str().unwrap(), "-o", "-"], false);
    assert!(
        err.contains("(schema cpt.records.v9, expected cpt.records.v1)"),
        "{err}"
    );
    // the right metadata but not the columns: the first missing column is named
    let liar = dir.path().join("liar.parquet");
    foreign_parquet(&liar, Some(("cpt.schema", "cpt.records.v1")));
    let (_, err) = run(&["folded", liar.to_str().unwrap()], false);
    assert!(err.contains("it has no column service"), "{err}");
    // in a directory with good files, nothing is read: the bad file is named
    let (out, _) = exported(dir.path(), "pq");
    std::fs::copy(&other, out.join("date=2023-11-14/zz.parquet")).unwrap();
    let (stdout, err) = run(&["folded", out.to_str().unwrap()], false);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(err.contains("zz.parquet: not a cpt records file"), "{err}");
}

#[test]
fn a_truncated_parquet_file_is_named_and_nothing_written_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (out, files) = exported(dir.path(), "pq");
    let victim = out.join(&files[1]);
    let bytes = std::fs::read(&victim).unwrap();
    std::fs::write(&victim, &bytes[..bytes.len() / 2]).unwrap();
    let (_, err) = run(&["folded", out.to_str().unwrap()], false);
    assert!(err.contains(&files[1]), "{err}");
    assert!(err.contains("the file is truncated"), "{err}");
    assert!(err.contains("Move it out of the directory"), "{err}");
    // exporting the broken directory writes nothing, and leaves the input as it was
    let copy = dir.path().join("copy");
    let (_, err) = run(
        &[
            "export",
            out.to_str().unwrap(),
            "--parquet-dir",
            copy.to_str().unwrap(),
        ],
        false,
    );
    assert!(err.contains("the file is truncated"), "{err}");
    assert!(!copy.exists() || files_below(&copy).is_empty());
    assert_eq!(files_below(&out), files);
    // the good file still reads; moving the bad one out is the way on
    std::fs::rename(&victim, dir.path().join("broken.parquet")).unwrap();
    let (_, err) = run(&["folded", out.to_str().unwrap(), "--trigger", "all"], true);
    assert!(err.contains("10 records read"), "{err}");
}

#[test]
fn an_empty_directory_says_which_directories_hold_records() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(empty.join("date=2026-01-01/hour=00")).unwrap();
    // a crashed writer's hidden file and Spark's marker are not records
    std::fs::write(
        empty.join("date=2026-01-01/hour=00/.part-x.parquet.tmp"),
        b"PAR1",
    )
    .unwrap();
    std::fs::write(empty.join("_SUCCESS"), b"").unwrap();
    let (_, err) = run(&["profile", empty.to_str().unwrap(), "-o", "-"], false);
    assert!(err.contains("is a directory without record files"), "{err}");
    assert!(err.contains("cpt export --parquet-dir"), "{err}");
}

#[test]
fn a_failed_export_removes_what_it_wrote_and_keeps_what_was_there() {
    let dir = tempfile::tempdir().unwrap();
    let (out, before) = exported(dir.path(), "pq");
    let good = write(dir.path(), "good.jsonl", &jsonl(&records()));
    let bad = write(dir.path(), "bad.jsonl", b"{\"service\":\n");
    let (_, err) = run(
        &[
            "export",
            good.to_str().unwrap(),
            bad.to_str().unwrap(),
            "--strict",
            "--parquet-dir",
            out.to_str().unwrap(),
        ],
        false,
    );
    assert!(err.contains("bad.jsonl:1"), "{err}");
    assert_eq!(files_below(&out), before);
}

#[test]
fn a_parquet_file_given_as_traces_says_which_commands_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let (out, files) = exported(dir.path(), "pq");
    let one = out.join(&files[0]);
    let (_, err) = run(
        &[
            "traces",
            "convert",
            "--from",
            "jaeger",
            "-o",
            "-",
            one.to_str().unwrap(),
        ],
        false,
    );
    assert!(
        err.contains("is a Parquet file, not a JSON Lines or trace file"),
        "{err}"
    );
}
