//! `cpt import` and reading a store back: bad lines are reported as
//! FILE:LINE and not stored, good lines are kept, `--strict` stores nothing,
//! and `cpt profile --store` gives the same profile as the JSON Lines file.
//! The store page and the soak bench state the size a record their run
//! measured.
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

#[test]
fn the_store_page_and_the_soak_bench_state_the_size_a_record_their_run_measured() {
    let read = |rel: &str| {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel))
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let page = read("docs/src/operations/store.md");
    let soak = read("benches/benches/soak.rs").replace("//! ", "");
    // The first run of the page's table: records stored and store size.
    let cell = |row: &str| -> String {
        let after = page.split_once(row).expect("the soak table row").1;
        after.split('|').next().unwrap().trim().to_owned()
    };
    let records: f64 = cell("| records acknowledged = stored (`/v1/stats` the same) |")
        .replace(' ', "")
        .parse()
        .unwrap();
    let gib: f64 = cell("| store at the end |")
        .trim_end_matches(" GiB")
        .parse()
        .unwrap();
    let kb = format!(
        "{:.1} kB a record",
        gib * f64::from(1u32 << 30) / records / 1000.0
    );
    assert!(
        page.contains(&format!("grows by about {kb}")),
        "operations/store.md must say the store grows by about {kb}"
    );
    assert!(
        soak.contains(&format!("grows by about {kb}")),
        "benches/benches/soak.rs must say the store grows by about {kb}"
    );
}
