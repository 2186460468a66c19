//! The paper cases every crate's tests are built on, defined once.
//!
//! - CPT Figure 2 (a sequential, b parallel, c overlap): the critical paths
//!   of the reference cases in `docs/src/reference/semantics.md`, as [`CriticalPath`]s.
//! - CPT Table 1: the two requests whose aggregate is A1 5, A1/A2 5,
//!   A1/B1 2, total 12 ms, as [`Record`]s.
//!
//! Tests that need a variant (labels, locations, a forced request) start
//! from these and change what they need.

use crate::path::{CriticalPath, Frame, SegmentKind};
use crate::record::Record;
use crate::trigger::Trigger;

use super::ms;

/// Frame `name` of service `service`.
fn f(service: &str, name: &str) -> Frame {
    Frame::new(service, name)
}

/// CPT Figure 2a, sequential: A1 5 ms, waits on B1 (20 ms), A1 8 ms, waits
/// on A2 (2 ms): {A1 5, A1/B1 20, A1 8, A1/A2 2} = 35 ms.
pub fn fig2a() -> CriticalPath {
    let mut p = CriticalPath::new();
    p.push_frames([f("A", "A1")], ms(5), SegmentKind::Busy);
    p.push_frames([f("A", "A1"), f("B", "B1")], ms(20), SegmentKind::Busy);
    p.push_frames([f("A", "A1")], ms(8), SegmentKind::Busy);
    p.push_frames([f("A", "A1"), f("A", "A2")], ms(2), SegmentKind::Busy);
    p
}

/// CPT Figure 2b, parallel: B1 and A2 issued together, B1 slower:
/// {A1 5, A1/B1 20, A1 8} = 33 ms; A2 is off the path.
pub fn fig2b() -> CriticalPath {
    let mut p = CriticalPath::new();
    p.push_frames([f("A", "A1")], ms(5), SegmentKind::Busy);
    p.push_frames([f("A", "A1"), f("B", "B1")], ms(20), SegmentKind::Busy);
    p.push_frames([f("A", "A1")], ms(8), SegmentKind::Busy);
    p
}

/// CPT Figure 2c, overlap: A1 issues B1 without blocking and keeps
/// computing; B1 ends last: {A1 3, A1/B1 14, A1 10} = 27 ms.
pub fn fig2c() -> CriticalPath {
    let mut p = CriticalPath::new();
    p.push_frames([f("A", "A1")], ms(3), SegmentKind::Busy);
    p.push_frames([f("A", "A1"), f("B", "B1")], ms(14), SegmentKind::Busy);
    p.push_frames([f("A", "A1")], ms(10), SegmentKind::Busy);
    p
}

/// CPT Figure 2a as a record carrying everything a record can: B1 with a
/// source location, the wait on A2 unattributed (and accounted), an
/// endpoint, a start time, a label `arm=b` and a trace id. For tests of
/// the record's forms (JSON, the collector's protobuf).
pub fn fig2a_record() -> Record {
    let mut p = CriticalPath::new();
    let a1 = f("A", "A1");
    let b1 = f("B", "B1").with_location("b/src/lib.rs", 12);
    p.push_frames([a1.clone()], ms(5), SegmentKind::Busy);
    p.push_frames([a1.clone(), b1], ms(20), SegmentKind::Busy);
    p.push_frames([a1.clone()], ms(8), SegmentKind::Busy);
    p.push_frames([a1, f("A", "A2")], ms(2), SegmentKind::Unattributed);
    p.accounting.unattributed = ms(2);
    let mut r = Record::new("A", Trigger::Sampled, p);
    r.endpoint = Some("/a.A/Run".into());
    r.start_unix_nanos = Some(1_700_000_000_000_000_000);
    r.labels.insert("arm".into(), "b".into());
    r.trace_id = Some("4bf92f3577b34da6a3ce929d0e0e4736".into());
    r
}

/// CPT Table 1's two requests of service A, sampled, one second apart from
/// 2023-11-14T22:13:20Z: request 1 (16 ms) A1 3, A1/A2 10, A1 3; request 2
/// (8 ms) A1 2, A1/B1 4, A1 2. Their average critical path is A1 5, A1/A2
/// 5, A1/B1 2: 12 ms, the mean latency.
pub fn table1() -> Vec<Record> {
    let (a1, a2, b1) = (f("A", "A1"), f("A", "A2"), f("B", "B1"));
    let mut r1 = CriticalPath::new();
    r1.push_frames([a1.clone()], ms(3), SegmentKind::Busy);
    r1.push_frames([a1.clone(), a2], ms(10), SegmentKind::Busy);
    r1.push_frames([a1.clone()], ms(3), SegmentKind::Busy);
    let mut r2 = CriticalPath::new();
    r2.push_frames([a1.clone()], ms(2), SegmentKind::Busy);
    r2.push_frames([a1.clone(), b1], ms(4), SegmentKind::Busy);
    r2.push_frames([a1], ms(2), SegmentKind::Busy);
    [r1, r2]
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = Record::new("A", Trigger::Sampled, p);
            r.start_unix_nanos = Some(1_700_000_000_000_000_000 + i as u64 * 1_000_000_000);
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpt_figure2_totals() {
        assert_eq!(fig2a().total(), ms(35));
        assert_eq!(fig2b().total(), ms(33));
        assert_eq!(fig2c().total(), ms(27));
    }

    #[test]
    fn cpt_table1_requests_are_16_and_8_ms() {
        let t = table1();
        assert_eq!(
            t.iter().map(|r| r.latency).collect::<Vec<_>>(),
            [ms(16), ms(8)]
        );
    }
}
