//! `cpt import` and reading a store back: bad lines are reported as
//! FILE:LINE and not stored, good lines are kept, `--strict` stores nothing,
//! and `cpt profile --store` gives the same profile as the JSON Lines file.
#![cfg(all(feature = "server", feature = "cli"))]

use std::path::Path;
use std::process::{Command, Output};

use cpt_collector::store::{Store, StoreQuery};
use cpt_sdk::Record;

fn cpt(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cpt"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run cpt")
}

/// CPT Table 1's two requests (16 ms and 8 ms), as `sdk::testing` defines them.
fn table1() -> Vec<Record> {
    cpt_sdk::testing::fixtures::table1()
}

fn stored(path: &Path) -> Vec<Record> {
    Store::open_read_only(path)
        .unwrap()
        .query(&StoreQuery::default())
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn import_keeps_good_lines_and_reports_bad_ones_as_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = table1();
    let text = format!(
        "{}\nnot json\n\n{}\n{}\n",
        good[0].to_json(),
        good[1].to_json(),
        good[1].to_json().replace("\"sampled\"", "\"maybe\"")
    );
    std::fs::write(dir.path().join("r.jsonl"), text).unwrap();
    let out = cpt(&["import", "--store", "s.db", "r.jsonl"], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("r.jsonl:2: skipped: not a cpt record"),
        "{stderr}"
    );
    assert!(
        stderr.contains("r.jsonl:5: skipped: unknown trigger \"maybe\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("imported 2 records into s.db; skipped 2 bad lines"),
        "{stderr}"
    );
    assert_eq!(stored(&dir.path().join("s.db")), good);

    // Importing again appends (a store is a log of records, not a set).
    let out = cpt(&["import", "--store", "s.db", "r.jsonl"], dir.path());
    assert!(out.status.success());
    assert_eq!(stored(&dir.path().join("s.db")).len(), 4);
}

#[test]
fn import_strict_stores_nothing_when_a_line_is_bad() {
    let dir = tempfile::tempdir().unwrap();
    let good = table1();
    std::fs::write(
        dir.path().join("ok.jsonl"),
        format!("{}\n", good[0].to_json()),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("bad.jsonl"),
        format!("{}\n{{\"service\":\"A\"}}\n", good[1].to_json()),
    )
    .unwrap();
    let out = cpt(
        &[
            "import",
            "--strict",
            "--store",
            "s.db",
            "ok.jsonl",
            "bad.jsonl",
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("bad.jsonl:2: not a cpt record: missing field"),
        "{stderr}"
    );
    assert!(stderr.contains("nothing imported"), "{stderr}");
    assert!(!dir.path().join("s.db").exists() || stored(&dir.path().join("s.db")).is_empty());
}

#[test]
fn profile_from_an_imported_store_equals_profile_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let text: String = table1().iter().map(|r| r.to_json() + "\n").collect();
    std::fs::write(dir.path().join("t1.jsonl"), text).unwrap();
    assert!(
        cpt(&["import", "--store", "s.db", "t1.jsonl"], dir.path())
            .status
            .success()
    );
    let from_store = cpt(&["folded", "--store", "s.db"], dir.path());
    let from_file = cpt(&["folded", "t1.jsonl"], dir.path());
    assert!(
        from_store.status.success(),
        "{}",
        String::from_utf8_lossy(&from_store.stderr)
    );
    assert!(
        from_file.status.success(),
        "{}",
        String::from_utf8_lossy(&from_file.stderr)
    );
    let folded = String::from_utf8(from_store.stdout).unwrap();
    assert_eq!(folded, String::from_utf8(from_file.stdout).unwrap());
    // CPT Table 1: A1 self 5 ms, A1/A2 5 ms, A1/B1 2 ms (mean per request).
    assert!(
        folded.contains("5000000") && folded.contains("2000000"),
        "{folded}"
    );
}
