//! Invariants on the DeathStarBench sets (TraceWeaver media and hotel).

use std::collections::HashMap;

use cpt_collector::traces::model::Trace;
use cpt_collector::traces::{
    Format, ImportOptions, adjustments_of, crisp, jaeger, read_text, skew,
};

use crate::support::{import, testdata};

fn media(load: u32) -> std::path::PathBuf {
    testdata(&format!(
        "traces/traceweaver-media/media_load{load}.jaeger.json.gz"
    ))
}

fn hotel(load: u32) -> std::path::PathBuf {
    testdata(&format!(
        "traces/traceweaver-hotel/hotel_load{load}.jaeger.json.gz"
    ))
}

/// Root span durations per trace id, read with plain serde_json (not our
/// reader), in ns.
fn root_durations(path: &std::path::Path) -> HashMap<String, u64> {
    let text = read_text(path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = HashMap::new();
    for t in v["data"].as_array().unwrap() {
        for s in t["spans"].as_array().unwrap() {
            if s["references"].as_array().unwrap().is_empty() {
                let id = format!("{:0>32}", t["traceID"].as_str().unwrap());
                out.insert(id, s["duration"].as_u64().unwrap() * 1000);
            }
        }
    }
    out
}

#[test]
fn dsb_media_and_hotel_paths_sum_to_the_root_latency() {
    for (path, traces) in [(media(25), 1000), (hotel(25), 1000)] {
        let imp = import(
            std::slice::from_ref(&path),
            Format::Jaeger,
            &ImportOptions::default(),
        );
        assert!(
            imp.errors.is_empty(),
            "{:?}",
            &imp.errors[..imp.errors.len().min(3)]
        );
        assert_eq!(imp.analyzed.len(), traces);
        let roots = root_durations(&path);
        for a in &imp.analyzed {
            let r = &a.record;
            let want = roots[r.trace_id.as_deref().unwrap()];
            assert_eq!(r.latency.as_nanos() as u64, want, "{:?}", r.trace_id);
            assert_eq!(r.path.total(), r.latency);
            assert!(r.path.segments().iter().all(|s| !s.duration.is_zero()));
        }
    }
}

/// Every nanosecond the repair moved or cut is in the record's labels, and
/// the time it cut is the record's `accounting.clock_skew`:
/// Σ (raw − repaired duration) over kept spans = `skew.truncated_ns` +
/// `overhang.ns` (the latter for the time children ran past their parent's
/// end on its clock: no skew, and not in `clock_skew`), Σ durations of
/// dropped subtree roots = `skew.dropped_ns`, and every kept span lies
/// inside its parent after repair.
#[test]
fn dsb_every_adjusted_nanosecond_is_accounted() {
    let opts = ImportOptions::default();
    let mut total_cut = 0u64;
    let mut total_child_time = 0u64;
    for path in [media(75), hotel(75)] {
        let text = read_text(&path).unwrap();
        let (raws, err) = jaeger::split(&text);
        assert!(err.is_none());
        let mut names = Default::default();
        let mut scratch = crisp::Scratch::default();
        let mut pieces = Vec::new();
        for raw in raws {
            let t: Trace = jaeger::parse_trace(raw, &mut names, opts.build).unwrap();
            let roots: Vec<u32> = t.roots().collect();
            let rep = skew::repair(&t, &opts.repair, &roots);
            let (mut cut, mut dropped, mut dropped_spans) = (0u64, 0u64, 0u64);
            let mut overhang = 0u64;
            for (i, s) in t.spans.iter().enumerate() {
                let Some(p) = s.parent else { continue };
                total_child_time += s.duration_ns as u64;
                if !rep.kept[i] {
                    dropped_spans += 1;
                    if rep.kept[p as usize] {
                        dropped += s.duration_ns as u64;
                    }
                    continue;
                }
                let p = p as usize;
                assert!(
                    rep.start[p] <= rep.start[i] && rep.end[i] <= rep.end[p],
                    "{}: span {}",
                    t.trace_id,
                    s.span_id
                );
                let d = (s.duration_ns - (rep.end[i] - rep.start[i])) as u64;
                let over = rep.overhang[i] as u64;
                if over > 0 {
                    // Only on the parent's own clock here, past its end.
                    assert_eq!(s.clock, t.spans[p].clock, "{}", s.span_id);
                    assert!(
                        s.end_ns() + rep.shift[i] - over as i64
                            >= t.spans[p].end_ns() + rep.shift[p],
                        "{}",
                        s.span_id
                    );
                }
                overhang += over;
                cut += d - over;
            }
            total_cut += cut + overhang + dropped;
            let a = cpt_collector::traces::analyze(&t, &opts, &mut scratch, &mut pieces);
            let adj = adjustments_of(&a[0].record);
            assert_eq!(
                (
                    adj.truncated_ns,
                    adj.overhang_ns,
                    adj.dropped_ns,
                    adj.dropped_spans
                ),
                (cut, overhang, dropped, dropped_spans),
                "{}",
                t.trace_id
            );
            assert_eq!(
                a[0].record.accounting().clock_skew.as_nanos() as u64,
                adj.truncated_ns + adj.dropped_ns + adj.overlap_ns,
                "{}: accounting.clock_skew is the time the repair cut",
                t.trace_id
            );
            assert_eq!(
                a[0].record.path.total().as_nanos() as i64,
                rep.end[roots[0] as usize] - rep.start[roots[0] as usize]
            );
        }
    }
    // CRISP §5.2: "The total time truncation ... was under 5%".
    let share = total_cut as f64 / total_child_time as f64;
    assert!(
        share < 0.05,
        "repair cut {:.2}% of child time",
        share * 100.0
    );
}

#[test]
fn dsb_media_concurrency_and_hotel_sequence() {
    let imp = import(&[media(100)], Format::Jaeger, &ImportOptions::default());
    // README: every media trace has overlapping children, at most 4 at once.
    assert!(
        imp.analyzed
            .iter()
            .all(|a| (2..=4).contains(&a.shape.concurrency))
    );
    assert!(imp.analyzed.iter().all(|a| a.shape.spans == 27));
    // The critical path leaves some concurrent branches off.
    assert!(imp.analyzed.iter().all(|a| a.shape.path_spans < 27));
    let imp = import(&[hotel(100)], Format::Jaeger, &ImportOptions::default());
    // Hotel: strictly sequential calls, client + server spans: after the
    // symmetric-delay shift, every one of the 11 spans is on the path in
    // nearly every trace.
    let all = imp
        .analyzed
        .iter()
        .filter(|a| a.shape.path_spans == 11)
        .count();
    assert!(
        all * 100 >= imp.analyzed.len() * 95,
        "{all} of {}",
        imp.analyzed.len()
    );
    assert!(
        imp.analyzed
            .iter()
            .all(|a| a.shape.concurrency == 1 && a.shape.depth == 5)
    );
    let net: u128 = imp
        .analyzed
        .iter()
        .map(|a| a.record.path.accounting.network.as_nanos())
        .sum();
    assert!(net > 0, "client spans' own time is network time");
}

#[test]
fn dsb_streaming_reader_gives_the_same_records() {
    let whole = import(&[media(50)], Format::Jaeger, &ImportOptions::default());
    let opts = ImportOptions {
        stream_above_bytes: 0,
        ..Default::default()
    };
    let streamed = import(&[media(50)], Format::Jaeger, &opts);
    assert_eq!(whole.stats, streamed.stats);
    let a: Vec<String> = whole.records().map(|r| r.to_json()).collect();
    let b: Vec<String> = streamed.records().map(|r| r.to_json()).collect();
    assert_eq!(a.len(), 1000);
    assert!(a == b, "streamed records differ");
}

/// Nezha's Online Boutique span CSV (one fault-free minute): README: 502
/// traces, no orphans, no multi-root traces, endpoint `frontend
/// hipstershop.Frontend/Recv.`.
#[test]
fn nezha_onlineboutique_csv_imports_with_exact_totals() {
    let path = testdata("traces/nezha-onlineboutique/normal/2022-08-23_17_00_trace.csv.gz");
    let imp = import(&[path], Format::Nezha, &ImportOptions::default());
    assert!(
        imp.errors.is_empty(),
        "{:?}",
        &imp.errors[..imp.errors.len().min(3)]
    );
    assert_eq!((imp.stats.traces, imp.stats.records), (502, 502));
    for a in &imp.analyzed {
        let r = &a.record;
        assert_eq!(
            (r.service.as_str(), r.endpoint.as_deref()),
            ("frontend", Some("hipstershop.Frontend/Recv."))
        );
        assert_eq!(r.path.total(), r.latency);
        assert!(
            a.shape.concurrency <= 2,
            "README: at most 2 concurrent children"
        );
    }
}
