//! Bottom-up analysis (CRISP §6.2): over all endpoints, which operations
//! hold the critical paths up, and how many endpoints each affects.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

use cpt_sdk::Record;

use super::{Operation, exclusive_by_operation};
use crate::format::fmt_ns;

/// One operation's weight over all analysed records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationRank {
    /// Service.
    pub service: Arc<str>,
    /// Operation.
    pub operation: Arc<str>,
    /// Exclusive (own) time on critical paths, summed over records, ns.
    pub exclusive_ns: u64,
    /// Inclusive time on critical paths (the operation anywhere in the
    /// segment's stack, counted once per segment), summed, ns.
    pub inclusive_ns: u64,
    /// Records whose critical path has the operation.
    pub records: u64,
    /// Distinct endpoints (record service + endpoint) whose critical paths
    /// have the operation.
    pub endpoints: u64,
}

/// Rank operations: by exclusive time (descending), then by endpoints
/// affected, then by name.
pub fn rank<'a>(records: impl IntoIterator<Item = &'a Record>) -> Vec<OperationRank> {
    #[derive(Default)]
    struct Acc {
        exclusive: u64,
        inclusive: u64,
        records: u64,
        endpoints: HashSet<(String, Option<String>)>,
    }
    let mut acc: HashMap<Operation, Acc> = HashMap::new();
    let mut seen: HashSet<Operation> = HashSet::new();
    for r in records {
        seen.clear();
        for (op, ns) in exclusive_by_operation(r) {
            acc.entry(op).or_default().exclusive += ns;
        }
        for seg in r.path.segments() {
            let ns = u64::try_from(seg.duration.as_nanos()).unwrap_or(u64::MAX);
            let mut in_seg: Vec<Operation> = Vec::with_capacity(seg.stack.len());
            for &id in &seg.stack {
                let f = r.path.frame(id);
                let op = (f.service.clone(), f.name.clone());
                if !in_seg.contains(&op) {
                    in_seg.push(op);
                }
            }
            for op in in_seg {
                acc.entry(op.clone()).or_default().inclusive += ns;
                seen.insert(op);
            }
        }
        for op in &seen {
            let a = acc.entry(op.clone()).or_default();
            a.records += 1;
            a.endpoints.insert((r.service.clone(), r.endpoint.clone()));
        }
    }
    let mut out: Vec<OperationRank> = acc
        .into_iter()
        .map(|((service, operation), a)| OperationRank {
            service,
            operation,
            exclusive_ns: a.exclusive,
            inclusive_ns: a.inclusive,
            records: a.records,
            endpoints: a.endpoints.len() as u64,
        })
        .collect();
    out.sort_by(|a, b| {
        b.exclusive_ns
            .cmp(&a.exclusive_ns)
            .then(b.endpoints.cmp(&a.endpoints))
            .then_with(|| (&a.service, &a.operation).cmp(&(&b.service, &b.operation)))
    });
    out
}

/// The same ranks ordered by endpoints affected first (the "APIs improving
/// which will improve many endpoints" list), then exclusive time.
pub fn by_endpoints(mut ranks: Vec<OperationRank>) -> Vec<OperationRank> {
    ranks.sort_by(|a, b| {
        b.endpoints
            .cmp(&a.endpoints)
            .then(b.exclusive_ns.cmp(&a.exclusive_ns))
            .then_with(|| (&a.service, &a.operation).cmp(&(&b.service, &b.operation)))
    });
    ranks
}

/// A text table of the first `top` ranks; `total_records` gives the
/// per-record means.
pub fn to_text(ranks: &[OperationRank], top: usize, total_records: u64) -> String {
    let mut s = String::new();
    let n = total_records.max(1);
    let _ = writeln!(
        s,
        "{:>4}  {:>10}  {:>10}  {:>10}  {:>8}  {:>9}  operation (service)",
        "rank", "excl/req", "incl/req", "excl total", "records", "endpoints"
    );
    for (i, r) in ranks.iter().take(top).enumerate() {
        let _ = writeln!(
            s,
            "{:>4}  {:>10}  {:>10}  {:>10}  {:>8}  {:>9}  {} ({})",
            i + 1,
            fmt_ns(r.exclusive_ns / n),
            fmt_ns(r.inclusive_ns / n),
            fmt_ns(r.exclusive_ns),
            r.records,
            r.endpoints,
            r.operation,
            r.service
        );
    }
    s
}

/// CSV with a header row; values in ns.
pub fn to_csv(ranks: &[OperationRank]) -> String {
    let mut s = String::from("service,operation,exclusive_ns,inclusive_ns,records,endpoints\n");
    for r in ranks {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{}",
            csv(&r.service),
            csv(&r.operation),
            r.exclusive_ns,
            r.inclusive_ns,
            r.records,
            r.endpoints
        );
    }
    s
}

pub(crate) fn csv(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cpt_sdk::{CriticalPath, Frame, SegmentKind, Trigger};

    use super::*;

    fn rec(endpoint: &str, segs: &[(&[(&str, &str)], u64)]) -> Record {
        let mut p = CriticalPath::new();
        for (stack, ns) in segs {
            p.push_frames(
                stack.iter().map(|(s, n)| Frame::new(*s, *n)),
                Duration::from_nanos(*ns),
                SegmentKind::Busy,
            );
        }
        let mut r = Record::new("A", Trigger::Sampled, p);
        r.endpoint = Some(endpoint.into());
        r
    }

    /// A named wait is an operation of its own (its wait frame), taken out
    /// of the waiting node's exclusive time and inside its inclusive time.
    #[test]
    fn a_named_wait_ranks_as_its_own_operation() {
        let mut r = rec("/x", &[(&[("A", "x")], 5)]);
        r.path.push_frames(
            [Frame::new("A", "x"), Frame::wait("A", "semaphore", None)],
            Duration::from_nanos(40),
            SegmentKind::Wait,
        );
        r.latency = r.path.total();
        let ranks = rank([&r]);
        let op = |name: &str| ranks.iter().find(|x| &*x.operation == name).unwrap();
        assert_eq!(ranks[0].operation.as_ref(), "[semaphore]");
        assert_eq!(
            (
                op("[semaphore]").exclusive_ns,
                op("[semaphore]").inclusive_ns
            ),
            (40, 40)
        );
        assert_eq!((op("x").exclusive_ns, op("x").inclusive_ns), (5, 45));
    }

    #[test]
    fn ranks_by_exclusive_time_and_counts_endpoints() {
        let a = rec(
            "/x",
            &[
                (&[("A", "x")], 5),
                (&[("A", "x"), ("DB", "q")], 20),
                (&[("A", "x")], 1),
            ],
        );
        let b = rec(
            "/y",
            &[(&[("A", "y"), ("DB", "q")], 7), (&[("A", "y")], 30)],
        );
        let r = rank([&a, &b]);
        assert_eq!((&*r[0].operation, r[0].exclusive_ns), ("y", 30));
        let q = r.iter().find(|x| &*x.operation == "q").unwrap();
        assert_eq!(
            (q.exclusive_ns, q.inclusive_ns, q.records, q.endpoints),
            (27, 27, 2, 2)
        );
        let x = r.iter().find(|x| &*x.operation == "x").unwrap();
        assert_eq!((x.exclusive_ns, x.inclusive_ns, x.endpoints), (6, 26, 1));
        assert_eq!(&*by_endpoints(r)[0].operation, "q");
    }
}
