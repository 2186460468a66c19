//! Public trace files, mutated, into every importer and every analysis: no
//! input may panic; every input is analysed under both accountings, and
//! every record made has a critical path that sums to its latency under
//! cpt's and to at least its latency under CRISP's (which counts overlapping
//! children twice and zeroes negative exclusive times), with the same
//! records made either way; a parallel read gives the records, errors
//! and counts a sequential read gives, and the Mystery Machine's critical
//! path of every request sums to its latency too (MM §4.4.1). Mann et al.'s
//! execution flows are trained and evaluated on the same traces. A bounded,
//! deterministic run on stable Rust; the cargo-fuzz target
//! `fuzz/fuzz_targets/import.rs` runs the record checks open-ended.

use std::panic::AssertUnwindSafe;

use cpt_collector::traces::analysis::{flows, mystery};
use cpt_collector::traces::import::read_traces_text;
use cpt_collector::traces::{Accounting, Format, Import, ImportOptions, import_text, read_text};
use cpt_sdk::testing::SplitMix64;

use crate::support::testdata;

/// A number in `0..n` from the shared test generator (deterministic, so a
/// failure names a seed and an input).
fn below(rng: &mut SplitMix64, n: usize) -> usize {
    rng.below(n as u64) as usize
}

/// One small document of each format, from the repository's trace data.
fn seeds() -> Vec<(Format, String)> {
    let file = |rel: &str| read_text(&testdata(rel)).expect("test data reads");
    let nezha: String = file("traces/nezha-trainticket/fault/2023-01-29_10_20_trace.csv.gz")
        .lines()
        .take(30)
        .flat_map(|l| [l, "\n"])
        .collect();
    let otlp = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"front"}}]},"scopeSpans":[{"scope":{"name":"x"},"spans":[{"traceId":"aa","spanId":"01","name":"GET /","kind":2,"startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000000000009000"},{"traceId":"aa","spanId":"02","parentSpanId":"01","name":"call","kind":3,"startTimeUnixNano":"1700000000000001000","endTimeUnixNano":"1700000000000008000"}]}]},{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"back"}}]},"scopeSpans":[{"scope":{"name":"x"},"spans":[{"traceId":"aa","spanId":"03","parentSpanId":"02","name":"serve","kind":2,"startTimeUnixNano":"1700000000000002000","endTimeUnixNano":"1700000000000007000"}]}]}]}"#;
    vec![
        (Format::Jaeger, file("crisp/5.json")),
        (Format::Jaeger, file("crisp/err_pattern4/err1.json")),
        (Format::Zipkin, file("traces/zipkin-lens/messaging.json")),
        (Format::Zipkin, file("traces/zipkin-lens/skew.json")),
        (Format::Otlp, otlp.to_owned()),
        (Format::Nezha, nezha),
    ]
}

/// Values that sit at the edges of what the formats' fields hold.
const EDGES: [&str; 12] = [
    "0",
    "-1",
    "1.5",
    "1e308",
    "9223372036854775807",
    "18446744073709551616",
    "\"\"",
    "null",
    "[]",
    "{}",
    "\"0000000000000000\"",
    "true",
];

/// Bytes that change a JSON or CSV document's structure.
const PUNCTUATION: &[u8] = b"{}[],:\"\\\n0";

/// `text` with one or two mutations, each kept at a character boundary.
fn mutate(rng: &mut SplitMix64, text: &str, seeds: &[(Format, String)]) -> String {
    let mut b = text.as_bytes().to_vec();
    for _ in 0..1 + below(rng, 2) {
        let at = below(rng, b.len() + 1);
        match below(rng, 6) {
            0 => b.truncate(at),
            1 => {
                let end = (at + 1 + below(rng, 64)).min(b.len());
                b.drain(at.min(end)..end);
            }
            2 => {
                // Replace the next field's value (after a JSON `:` or a CSV
                // `,`) when it is a number, string or literal, so that the
                // document still parses and the edge reaches the analyses.
                let edge = EDGES[below(rng, EDGES.len())].as_bytes();
                let Some(colon) = b[at..].iter().position(|c| b":,".contains(c)) else {
                    continue;
                };
                let mut start = at + colon + 1;
                while b.get(start).is_some_and(u8::is_ascii_whitespace) {
                    start += 1;
                }
                if b.get(start).is_some_and(|c| b"{[".contains(c)) {
                    continue;
                }
                let end = b[start..]
                    .iter()
                    .skip(1)
                    .position(|c| b",}]\n".contains(c))
                    .map_or(b.len(), |n| start + 1 + n);
                let end = end.min(b.len());
                b.splice(start.min(end)..end, edge.iter().copied());
            }
            3 if at < b.len() => b[at] = PUNCTUATION[below(rng, PUNCTUATION.len())],
            4 => {
                // Repeat a piece of this document (a span twice, a field
                // twice) somewhere else in it.
                let from = below(rng, b.len());
                let piece = b[from..(from + below(rng, 400)).min(b.len())].to_vec();
                b.splice(at..at, piece);
            }
            _ => {
                let other = seeds[below(rng, seeds.len())].1.as_bytes();
                let from = below(rng, other.len());
                let len = below(rng, 200).min(other.len() - from);
                b.splice(at..at, other[from..from + len].iter().copied());
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

fn summary(i: &Import) -> (Vec<String>, Vec<String>, String) {
    (
        i.records().map(|r| r.to_json()).collect(),
        i.errors.iter().map(|e| e.to_string()).collect(),
        format!("{:?}", i.stats),
    )
}

/// Every record's critical path sums to its latency under cpt's accounting,
/// and to at least its latency under CRISP's.
fn check_sums(imp: &Import, accounting: Accounting, text: &str, what: &str) {
    for a in &imp.analyzed {
        let (total, latency) = (a.record.path.total(), a.record.latency);
        match accounting {
            Accounting::Cpt => assert_eq!(
                total, latency,
                "{what}: the critical path sums to the latency\n{text}"
            ),
            Accounting::Crisp => assert!(
                total >= latency,
                "{what}: under CRISP's accounting the path ({total:?}) is never shorter than \
                 the latency ({latency:?})\n{text}"
            ),
        }
    }
}

/// Import `text` sequentially and in parallel and check both; check the
/// other accounting's records too.
fn check(text: &str, format: Format, opts: &ImportOptions, what: &str) -> usize {
    let one = import_text(text, format, opts, false, &|_| {});
    check_sums(&one, opts.accounting, text, what);
    let mut other = opts.clone();
    other.accounting = match opts.accounting {
        Accounting::Cpt => Accounting::Crisp,
        Accounting::Crisp => Accounting::Cpt,
    };
    let two = import_text(text, format, &other, false, &|_| {});
    check_sums(&two, other.accounting, text, what);
    assert_eq!(
        one.analyzed.len(),
        two.analyzed.len(),
        "{what}: both accountings make the same records"
    );
    assert_eq!(one.stats.records, one.analyzed.len() as u64, "{what}");
    assert!(one.stats.rejected <= one.stats.traces, "{what}");
    let many = import_text(text, format, opts, true, &|_| {});
    assert_eq!(
        summary(&one),
        summary(&many),
        "{what}: parallel = sequential\n{text}"
    );
    check_whole_traces(text, format, opts, what);
    one.analyzed.len()
}

/// The analyses that read whole traces: the Mystery Machine's model and
/// slack, Mann et al.'s execution flows.
fn check_whole_traces(text: &str, format: Format, opts: &ImportOptions, what: &str) {
    let set = read_traces_text(text, format, opts.build);
    let mut paths = mystery::CallPaths::default();
    let reqs: Vec<mystery::Request> = set
        .traces
        .iter()
        .flat_map(|t| mystery::requests_with(t, &opts.roots, &opts.repair, &mut paths))
        .collect();
    let mut models = mystery::Models::default();
    for r in &reqs {
        models.observe(r);
    }
    models.finish();
    for r in &reqs {
        let slack = mystery::analyse(&models.by_endpoint[&r.endpoint], r);
        assert_eq!(slack.latency_ns, r.latency(), "{what}");
        assert_eq!(
            slack.critical_ns.iter().sum::<i64>(),
            slack.latency_ns,
            "{what}: the Mystery Machine's critical path sums to the latency\n{text}"
        );
    }
    let mut keys = flows::KeyInterner::default();
    let invocations: Vec<flows::Invocation> = set
        .traces
        .iter()
        .flat_map(|t| flows::invocations(t, &mut keys))
        .collect();
    let trained = flows::Models::train(&invocations, 1);
    flows::evaluate_models(&trained, &invocations, 1);
}

/// `inputs` mutations of each seed document from RNG seed `seed`, each
/// imported with random options and checked; returns, per seed document,
/// how many mutated inputs made records.
fn fuzz_importers(inputs: usize, seed: u64) -> Vec<(Format, usize)> {
    let seeds = seeds();
    let mut rng = SplitMix64::new(seed);
    let mut reached = Vec::new();
    for (k, (format, doc)) in seeds.iter().enumerate() {
        // The seed itself analyses: the mutations start from valid input.
        assert!(
            check(doc, *format, &ImportOptions::default(), "seed") > 0,
            "seed {k} ({format:?}) makes no record"
        );
        let mut with_records = 0;
        for n in 0..inputs {
            let text = mutate(&mut rng, doc, &seeds);
            let mut opts = ImportOptions::default();
            opts.build.orphans_as_roots = below(&mut rng, 2) == 0;
            if below(&mut rng, 2) == 0 {
                opts.accounting = Accounting::Crisp;
            }
            let what =
                format!("RNG seed {seed:#x}, document {k} ({format:?}), input {n}, {opts:?}");
            let made =
                std::panic::catch_unwind(AssertUnwindSafe(|| check(&text, *format, &opts, &what)))
                    .unwrap_or_else(|_| panic!("{what} panicked on:\n{text}"));
            with_records += usize::from(made > 0);
        }
        reached.push((*format, with_records));
    }
    reached
}

#[test]
fn mutated_public_traces_never_panic_and_keep_paths_summing_to_latency() {
    let inputs = 5_000;
    for (format, with_records) in fuzz_importers(inputs, 0x1a7e_5eed) {
        // The mutations must reach the analyses, not only the parsers.
        assert!(
            with_records * 20 > inputs,
            "{format:?}: only {with_records} of {inputs} mutated inputs made records"
        );
    }
}

/// Long run: `CPT_FUZZ_INPUTS=1000000 CPT_FUZZ_SEED=7 cargo test --release
/// -p cpt-collector --test traces mutated::stress -- --ignored --nocapture`
/// (inputs per seed document).
#[test]
#[ignore = "stress test: run explicitly, see doc comment"]
fn stress_fuzz_importers() {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let inputs = env("CPT_FUZZ_INPUTS", 200_000) as usize;
    let start = std::time::Instant::now();
    let reached = fuzz_importers(inputs, env("CPT_FUZZ_SEED", 0xc0de));
    println!(
        "{inputs} inputs per document in {:?}: {reached:?}",
        start.elapsed()
    );
}
