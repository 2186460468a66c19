//! The pages' latency figures against a store whose latencies are known:
//! the services page and the profile page it links to show the same exact
//! p50 and p99 of one selection, and what is read from a histogram (a
//! stack's p50 / p99) says it is approximate and by how much.

use std::time::Duration;

use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
use cpt_sdk::record::Record;
use cpt_sdk::trigger::Trigger;

use super::http_tests::{get, serve};

/// 101 requests of `S /run`, 50.0 ms + i × 0.1 ms (i = 0..=100): exact
/// (nearest-rank) p50 55.00 ms, p99 59.90 ms. The latency histogram's
/// bucket for 55 ms is [54.53, 58.72) ms, whose midpoint is 56.62 ms.
fn known() -> Vec<Record> {
    (0..=100u64)
        .map(|i| {
            let mut p = CriticalPath::new();
            let latency = Duration::from_micros(50_000 + i * 100);
            p.push_frames([Frame::new("S", "handler")], latency, SegmentKind::Busy);
            let mut r = Record::new("S", Trigger::Sampled, p);
            r.endpoint = Some("/run".into());
            r.request_id = Some(format!("r{i}"));
            r.start_unix_nanos = Some(1_700_000_000_000_000_000 + i * 1_000_000);
            r
        })
        .collect()
}

/// The text between `start` and the next `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text
        .split_once(start)
        .unwrap_or_else(|| panic!("no {start:?} in\n{text}"))
        .1;
    from.split_once(end).map_or(from, |(x, _)| x)
}

#[test]
fn the_services_and_profile_pages_show_the_same_exact_p50_and_p99() {
    let s = serve(&known(), None);
    let index = get(&s, "/", &[]);
    assert_eq!(index.status, 200, "{}", index.body);
    let row = between(&index.body, r#"<tr data-service="S">"#, "</tr>");
    let cells: Vec<&str> = row
        .split(r#"<td class="num">"#)
        .skip(1)
        .map(|c| c.split("</td>").next().unwrap_or(""))
        .collect();
    // requests, mean, p50, p99
    assert_eq!((cells[2], cells[3]), ("55.00ms", "59.90ms"), "{row}");

    // The profile of that row's selection (its link).
    let link = between(row, r#"<a href=""#, r#"""#).replace("&amp;", "&");
    let profile = get(&s, &link, &[]);
    assert_eq!(profile.status, 200, "{link}: {}", profile.body);
    let p50 = between(&profile.body, "<span>p50</span><b>", "</b>");
    let p99 = between(&profile.body, "<span>p99</span><b>", "</b>");
    assert_eq!((p50, p99), ("55.00ms", "59.90ms"), "{link}");
}

#[test]
fn a_stacks_histogram_quantiles_are_marked_approximate_with_their_bound() {
    let s = serve(&known(), None);
    let profile = get(&s, "/ui/profile?service=S&endpoint=%2Frun", &[]);
    assert_eq!(profile.status, 200, "{}", profile.body);
    let row = between(&profile.body, r#"<table id="stacks">"#, "</table>");
    let row = between(row, "<b>handler (S)</b>", "</tr>");
    // The stack's p50 is the bucket's midpoint 56.62 ms, the exact 55.00 ms
    // within its bound: shown as such, never as a plain 56.62ms.
    assert!(row.contains("≈&nbsp;56.62ms&nbsp;±3.8&nbsp;%"), "{row}");
    assert!(row.contains("between 54.53ms and 58.72ms"), "{row}");
    assert!(!row.contains(r#"<td class="num">56.62ms</td>"#), "{row}");
}
