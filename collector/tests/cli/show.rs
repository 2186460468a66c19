//! `cpt show`'s other ways in: by trace id, next to its endpoint's sampled
//! average (`--compare`), and with the slowest leaves flagged (`--top`).

use super::*;

/// A record of service A, endpoint `/a.A/Run`, whose path is one segment per
/// `(stack, ms)`.
fn shaped(trigger: Trigger, parts: &[(&[&str], u64)]) -> Record {
    let mut p = CriticalPath::new();
    for (stack, ms) in parts {
        p.push_frames(
            stack.iter().map(|n| Frame::new("A", *n)),
            Duration::from_millis(*ms),
            SegmentKind::Busy,
        );
    }
    let mut r = Record::new("A", trigger, p);
    r.endpoint = Some("/a.A/Run".into());
    r
}

fn slow_one(id: &str) -> Record {
    let mut r = shaped(
        Trigger::Forced,
        &[(&["run"], 1), (&["run", "load"], 9), (&["run", "save"], 2)],
    );
    r.request_id = Some(id.into());
    r.trace_id = Some("4bf92f3577b34da6a3ce929d0e0e4736".into());
    r
}

fn typical() -> Record {
    shaped(
        Trigger::Sampled,
        &[(&["run"], 1), (&["run", "load"], 3), (&["run", "save"], 2)],
    )
}

/// The tree line naming `frame`.
fn line<'a>(out: &'a str, frame: &str) -> &'a str {
    out.lines()
        .find(|l| l.contains(&format!("{frame} (A)")))
        .unwrap_or_else(|| panic!("no line for {frame}: {out}"))
}

#[test]
fn show_finds_a_request_by_its_trace_id() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "r.jsonl",
        &jsonl(&[typical(), slow_one("req-9"), typical()]),
    );
    let (out, _) = run(
        &[
            "show",
            s(&file),
            "--trace-id",
            "4bf92f3577b34da6a3ce929d0e0e4736",
        ],
        true,
    );
    assert!(out.contains("request req-9 · A /a.A/Run · forced"), "{out}");
    assert!(line(&out, "load").contains("9.00ms"), "{out}");
}

#[test]
fn show_compare_puts_the_endpoints_sampled_mean_beside_each_frame() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "r.jsonl",
        &jsonl(&[typical(), typical(), slow_one("req-9"), typical()]),
    );
    let (out, _) = run(
        &["show", s(&file), "--request-id", "req-9", "--compare"],
        true,
    );
    assert!(
        out.contains("compared with the mean of 3 sampled requests of the same endpoint"),
        "{out}"
    );
    // load: 9 ms here, 3 ms on average; save: 2 ms both.
    let load = line(&out, "load");
    assert!(
        load.contains("avg 3.00ms") && load.contains("(+6.00ms)"),
        "{load}"
    );
    let save = line(&out, "save");
    assert!(save.contains("avg 2.00ms"), "{save}");
    // Without --compare there is no average.
    let (plain, _) = run(&["show", s(&file), "--request-id", "req-9"], true);
    assert!(!plain.contains("avg "), "{plain}");
}

#[test]
fn show_compare_says_the_same_from_records_a_store_and_parquet() {
    let dir = tempfile::tempdir().unwrap();
    // More sampled requests of the endpoint than fit one read batch, with
    // varied times, so the average is the fold's over all of them.
    let mut records: Vec<Record> = (0..9000u64)
        .map(|i| {
            shaped(
                Trigger::Sampled,
                &[
                    (&["run"], 1),
                    (&["run", "load"], 2 + i % 5),
                    (&["run", "save"], 1 + i % 3),
                ],
            )
        })
        .collect();
    records.insert(4500, slow_one("req-9"));
    let file = write(dir.path(), "r.jsonl", &jsonl(&records));
    let store = dir.path().join("s.db");
    run(&["import", "--store", s(&store), s(&file)], true);
    let pq = dir.path().join("pq");
    run(&["export", s(&file), "--parquet-dir", s(&pq)], true);
    let show = |source: &[&str]| {
        let mut args = vec!["show", "--request-id", "req-9", "--compare"];
        args.extend_from_slice(source);
        run(&args, true).0
    };
    let from_file = show(&[s(&file)]);
    assert!(
        from_file.contains("compared with the mean of 9000 sampled requests of the same endpoint"),
        "{from_file}"
    );
    assert!(
        line(&from_file, "load").contains("avg 4.00ms"),
        "{from_file}"
    );
    assert_eq!(show(&["--store", s(&store)]), from_file);
    assert_eq!(show(&[s(&pq)]), from_file);
}

#[test]
fn show_top_flags_that_many_of_the_slowest_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = shaped(
        Trigger::Forced,
        &[
            (&["run", "a"], 4),
            (&["run", "b"], 3),
            (&["run", "c"], 2),
            (&["run", "d"], 1),
        ],
    );
    r.request_id = Some("req-top".into());
    let file = write(dir.path(), "r.jsonl", &jsonl(&[r]));
    let (out, _) = run(
        &["show", s(&file), "--request-id", "req-top", "--top", "2"],
        true,
    );
    assert!(line(&out, "a").contains("★ slowest #1"), "{out}");
    assert!(line(&out, "b").contains("★ slowest #2"), "{out}");
    assert!(!out.contains("slowest #3"), "{out}");
    let (default, _) = run(&["show", s(&file), "--request-id", "req-top"], true);
    assert!(line(&default, "c").contains("★ slowest #3"), "{default}");
    assert!(!default.contains("slowest #4"), "{default}");
}
