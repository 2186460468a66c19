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
