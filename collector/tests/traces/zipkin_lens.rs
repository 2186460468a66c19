//! Zipkin v2 edge cases from the Zipkin UI's test data.

use cpt_collector::traces::{BuildOptions, Format, ImportOptions, RepairOptions};
use cpt_sdk::SegmentKind;

use crate::support::{import, path_string, testdata};

fn lens(file: &str) -> std::path::PathBuf {
    testdata(&format!("traces/zipkin-lens/{file}"))
}

/// skew.json: servicea `get` [71068, 170479] calls `post` (client half
/// [74202, 168741]); serviceb's server half of the shared id is recorded at
/// [8761, 102338] on a clock 65.9 ms behind, with an `async` child
/// [8762, 73762]. Round trip 94539 − 93577 = 962 µs, so the server starts
/// 481 µs after the client: offset 74202 + 481 − 8761 = 65922 µs, which moves
/// every serviceb span. Path: get 3134 | post (client, network) 481 |
/// post (server) 1 | async 65000 | post (server) 28576 | post (client,
/// network) 481 | get 1738 = 99411 µs.
#[test]
fn zipkin_skew_json_is_shifted_by_the_symmetric_round_trip() {
    let imp = import(
        &[lens("skew.json")],
        Format::Zipkin,
        &ImportOptions::default(),
    );
    assert!(imp.errors.is_empty(), "{:?}", imp.errors);
    let r = &imp.analyzed[0].record;
    assert_eq!(
        path_string(r),
        "servicea:get 3134|servicea:get;servicea:post 481|servicea:get;servicea:post;serviceb:post 1|\
         servicea:get;servicea:post;serviceb:post;serviceb:async 65000|servicea:get;servicea:post;serviceb:post 28576|\
         servicea:get;servicea:post 481|servicea:get 1738"
    );
    let kinds: Vec<SegmentKind> = r.path.segments().iter().map(|s| s.kind).collect();
    assert_eq!(kinds[1], SegmentKind::Network);
    assert_eq!(r.path.accounting.network.as_micros(), 962);
    assert_eq!(
        r.labels.get("skew.shifted_spans").map(String::as_str),
        Some("2")
    );
    assert_eq!(
        r.labels.get("skew.max_shift_ns").map(String::as_str),
        Some("65922000")
    );
    assert!(!r.labels.contains_key("skew.truncated_ns"));
}

#[test]
fn zipkin_skew_json_without_shift_falls_back_to_crisp_truncation() {
    let opts = ImportOptions {
        repair: RepairOptions { shift_rpc: false },
        ..Default::default()
    };
    let imp = import(&[lens("skew.json")], Format::Zipkin, &opts);
    let r = &imp.analyzed[0].record;
    // The server half [8761, 102338] is truncated to start with its client
    // at 74202 (65441 µs cut); its `async` child [8762, 73762] now ends
    // before the truncated server starts: dropped (65000 µs).
    assert_eq!(
        r.labels.get("skew.truncated_ns").map(String::as_str),
        Some("65441000")
    );
    assert_eq!(
        r.labels.get("skew.dropped_spans").map(String::as_str),
        Some("1")
    );
    assert_eq!(
        r.labels.get("skew.dropped_ns").map(String::as_str),
        Some("65000000")
    );
    assert_eq!(r.path.total().as_micros(), 99411);
}

#[test]
fn zipkin_messaging2_missing_parents_reject_or_become_roots() {
    let imp = import(
        &[lens("messaging2.json")],
        Format::Zipkin,
        &ImportOptions::default(),
    );
    assert_eq!((imp.stats.traces, imp.stats.rejected), (1, 1));
    assert!(
        imp.errors[0]
            .to_string()
            .contains("references missing parent"),
        "{}",
        imp.errors[0]
    );
    let opts = ImportOptions {
        build: BuildOptions {
            orphans_as_roots: true,
        },
        ..Default::default()
    };
    let imp = import(&[lens("messaging2.json")], Format::Zipkin, &opts);
    assert!(imp.errors.is_empty());
    assert!(
        imp.stats.records >= 2,
        "orphans are roots: {}",
        imp.stats.records
    );
    assert!(imp.stats.orphans >= 1);
}

#[test]
fn zipkin_lens_files_import_with_exact_totals() {
    let files = [
        "ascend.json",
        "envoy.json",
        "messaging-kafka.json",
        "messaging.json",
        "simple-db-p6.json",
        "skew.json",
        "smartthings-mobile-web-install.json.gz",
        "smartthings-oauth-authorization.json",
        "yelp.json",
    ];
    let opts = ImportOptions {
        build: BuildOptions {
            orphans_as_roots: true,
        },
        ..Default::default()
    };
    for f in files {
        let imp = import(&[lens(f)], Format::Zipkin, &opts);
        assert!(imp.errors.is_empty(), "{f}: {:?}", imp.errors);
        assert!(!imp.analyzed.is_empty(), "{f}");
        for a in &imp.analyzed {
            assert_eq!(a.record.path.total(), a.record.latency, "{f}");
        }
    }
    // smartthings-oauth: one CLIENT and five duration-less shared SERVER
    // records share id 9d2d35b746db84f3, three on pusher 10.0.0.187 and two
    // on pusher 10.0.0.79. Zipkin's merge folds the pieces of one endpoint:
    // two server halves remain, 3 of the 175 records are folded away.
    let imp = import(
        &[lens("smartthings-oauth-authorization.json")],
        Format::Zipkin,
        &opts,
    );
    assert_eq!(imp.stats.spans, 172);
}
