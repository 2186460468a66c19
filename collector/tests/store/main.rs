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

/// `n` records over the `days` before now: CPT Figure 1's A and B as entry
/// services, a label `arm`, one in ten forced.
fn spread(n: usize, days: u64) -> Vec<Record> {
    use cpt_sdk::testing::SplitMix64;
    use cpt_sdk::{CriticalPath, Frame, SegmentKind, Trigger};
    let mut rng = SplitMix64::new(5);
    let now = now_nanos();
    (0..n)
        .map(|i| {
            let service = ["A", "B"][i % 2];
            let mut p = CriticalPath::new();
            let root = Frame::new(service, "root");
            let ms =
                |rng: &mut SplitMix64| std::time::Duration::from_micros(100 + rng.below(9_000));
            p.push_frames([root.clone()], ms(&mut rng), SegmentKind::Busy);
            p.push_frames(
                [root, Frame::new("C", "C1")],
                ms(&mut rng),
                SegmentKind::Busy,
            );
            let trigger = if i % 10 == 0 {
                Trigger::Forced
            } else {
                Trigger::Sampled
            };
            let mut r = Record::new(service, trigger, p);
            r.endpoint = Some("/Run".into());
            r.start_unix_nanos = Some(now - rng.below(days * 86_400 * NANOS));
            r.labels.insert("arm".into(), ["a", "b"][i % 3 % 2].into());
            r
        })
        .collect()
}

const NANOS: u64 = 1_000_000_000;

fn now_nanos() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap()
}

/// A store of `records`, rolled up, its raw records older than `keep_days`
/// deleted by retention.
fn store_after_retention(path: &Path, records: &[Record], keep_days: u64) {
    let mut store = Store::open(path).unwrap();
    for chunk in records.chunks(250) {
        store.insert(chunk).unwrap();
    }
    let now = std::time::SystemTime::now();
    let hourly = std::time::Duration::from_secs(14 * 86_400);
    while !store.roll_up(1_000, now, hourly).unwrap().caught_up {}
    let cutoff = now_nanos() - keep_days * 86_400 * NANOS;
    while store.delete_started_before(cutoff, 1_000).unwrap() > 0 {}
    assert!(store.state().unwrap().deleted_by_retention > 0);
}

fn stdout_of(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `cpt profile --store` answers as `GET /profile` does: from the roll-ups
/// where raw records were deleted (every request counted, byte for byte
/// the fold of the records as they came), with or without `--since`; a
/// selection that needs deleted raw records is refused naming only the
/// filters given.
#[test]
fn cpt_profile_of_a_store_after_retention_answers_from_rollups_like_the_collector() {
    let dir = tempfile::tempdir().unwrap();
    let records = spread(3_000, 10);
    let text: String = records.iter().map(|r| r.to_json() + "\n").collect();
    std::fs::write(dir.path().join("all.jsonl"), text).unwrap();
    store_after_retention(&dir.path().join("s.db"), &records, 3);
    let day = now_nanos() / (86_400 * NANOS) * 86_400 * NANOS;
    let since = (day - 6 * 86_400 * NANOS).to_string();
    for args in [
        vec![],
        vec!["--service", "A"],
        vec!["--since", since.as_str()],
    ] {
        let run = |source: &[&str]| {
            let mut a = vec!["folded"];
            a.extend_from_slice(source);
            a.extend_from_slice(&args);
            stdout_of(cpt(&a, dir.path()))
        };
        let (store, file) = (run(&["--store", "s.db"]), run(&["all.jsonl"]));
        assert!(!store.is_empty(), "{args:?}");
        assert_eq!(store, file, "{args:?}");
    }
    let diff = |source: &[&str]| {
        let mut a = vec!["diff", "--base", "service=A", "--test", "service=B"];
        a.extend_from_slice(source);
        stdout_of(cpt(&a, dir.path()))
    };
    assert_eq!(diff(&["--store", "s.db"]), diff(&["all.jsonl"]));
    let refused = cpt(
        &["folded", "--store", "s.db", "--label", "arm=a"],
        dir.path(),
    );
    assert!(!refused.status.success());
    let msg = String::from_utf8_lossy(&refused.stderr);
    assert!(msg.contains("the label filter arm=a"), "{msg}");
    for absent in ["percentile", "trigger filter", "request id"] {
        assert!(!msg.contains(absent), "names {absent}: {msg}");
    }
}

/// `cpt trend --store`: one row per hour of the endpoint's sampled
/// requests, each hour's count and mean as the records give them.
#[test]
fn cpt_trend_of_a_store_counts_each_hours_sampled_requests() {
    let dir = tempfile::tempdir().unwrap();
    let records = spread(1_200, 2);
    store_after_retention(&dir.path().join("s.db"), &records, 1);
    let csv = stdout_of(cpt(
        &[
            "trend",
            "--store",
            "s.db",
            "--service",
            "A",
            "--endpoint",
            "/Run",
            "--last",
            "3d",
            "--csv",
        ],
        dir.path(),
    ));
    let mut lines = csv.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("start,resolution_s,requests,mean_ns")
    );
    let mut total = 0;
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        let start = cpt_collector::records::selection::parse_time(f[0]).unwrap();
        let hour: Vec<&Record> = records
            .iter()
            .filter(|r| {
                r.service == "A"
                    && r.trigger == cpt_sdk::Trigger::Sampled
                    && r.start_unix_nanos
                        .is_some_and(|s| s >= start && s < start + 3_600 * NANOS)
            })
            .collect();
        let n: u64 = f[2].parse().unwrap();
        assert_eq!(n, hour.len() as u64, "{line}");
        let sum: u128 = hour.iter().map(|r| r.latency.as_nanos()).sum();
        assert_eq!(f[3].parse::<u128>().unwrap(), sum / u128::from(n), "{line}");
        total += n;
    }
    let sampled_a = records
        .iter()
        .filter(|r| r.service == "A" && r.trigger == cpt_sdk::Trigger::Sampled)
        .count() as u64;
    assert_eq!(total, sampled_a);
}
