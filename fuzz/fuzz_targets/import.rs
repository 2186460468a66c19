//! Arbitrary text into the trace importers (`cpt traces`): Jaeger, Zipkin,
//! OTLP JSON and Nezha CSV, read whole and in parallel, then the critical
//! path walk over every trace that validates. It must never panic; with
//! cpt's accounting every record it makes must have a critical path that
//! sums to its latency (with CRISP's, at least its latency: it counts
//! overlapping children twice, by design); and the parallel read must give
//! what the sequential one gives.
//!
//! The first byte picks the format (bits 0–1), orphans kept as roots
//! (bit 2) and CRISP's reference accounting (bit 3); the text follows.
//! `fuzz/seeds.sh` writes seeds of that shape from `testdata/`.
#![no_main]

use cpt_collector::traces::{Accounting, Format, Import, ImportOptions, import_text};
use libfuzzer_sys::fuzz_target;

const FORMATS: [Format; 4] = [Format::Jaeger, Format::Zipkin, Format::Otlp, Format::Nezha];

fn summary(i: &Import) -> (Vec<String>, Vec<String>, String) {
    (
        i.records().map(|r| r.to_json()).collect(),
        i.errors.iter().map(|e| e.to_string()).collect(),
        format!("{:?}", i.stats),
    )
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, text)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let format = FORMATS[usize::from(pick & 3)];
    let mut opts = ImportOptions::default();
    opts.build.orphans_as_roots = pick & 4 != 0;
    if pick & 8 != 0 {
        opts.accounting = Accounting::Crisp;
    }
    let one = import_text(text, format, &opts, false, &|_| {});
    for a in &one.analyzed {
        let r = &a.record;
        match opts.accounting {
            Accounting::Cpt => assert_eq!(
                r.path.total(),
                r.latency,
                "the critical path sums to the latency ({format:?})"
            ),
            Accounting::Crisp => assert!(
                r.path.total() >= r.latency,
                "under CRISP's accounting the path is never shorter than the latency ({format:?})"
            ),
        }
    }
    assert_eq!(one.stats.records, one.analyzed.len() as u64);
    assert!(one.stats.rejected <= one.stats.traces);
    let many = import_text(text, format, &opts, true, &|_| {});
    assert_eq!(
        summary(&one),
        summary(&many),
        "parallel = sequential ({format:?})"
    );
});
