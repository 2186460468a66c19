//! One request's critical path as a tree (what `cpt show` prints and the
//! collector's request page draws): each frame's time on the path, its own
//! busy time, and the accounting kinds as marked leaves. The leaves' times
//! sum to the latency exactly. [`Baseline`] is the same tree averaged over
//! many requests of an endpoint, to set one request beside.

use std::collections::BTreeMap;

use cpt_sdk::path::SegmentKind;
use cpt_sdk::record::Record;

use crate::profile::aggregate::{Aggregate, KINDS, kind_frame};

/// One line of the tree: a frame (`kind` `None`) or the time a frame's path
/// spent in one accounting kind (a marked leaf).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The frame's service.
    pub service: String,
    /// The frame's name, or the accounting kind's name for a marked leaf.
    pub name: String,
    /// `Some` for an accounting leaf (never `Busy`).
    pub kind: Option<SegmentKind>,
    /// Time on the path through this node, nanoseconds.
    pub total_ns: u64,
    /// Of it, busy in this frame itself (not in a child), nanoseconds.
    pub self_ns: u64,
    /// Children in path order of first appearance.
    pub children: Vec<Node>,
}

impl Node {
    fn child(&mut self, service: &str, name: &str, kind: Option<SegmentKind>) -> &mut Node {
        let at = self
            .children
            .iter()
            .position(|c| c.service == service && c.name == name && c.kind == kind);
        let at = at.unwrap_or_else(|| {
            self.children.push(Node {
                service: service.to_owned(),
                name: name.to_owned(),
                kind,
                total_ns: 0,
                self_ns: 0,
                children: Vec::new(),
            });
            self.children.len() - 1
        });
        &mut self.children[at]
    }

    /// The leaves' own times: busy self time of every frame plus every
    /// accounting leaf. They sum to the root's total.
    pub fn leaf_sum(&self) -> u64 {
        self.self_ns + self.children.iter().map(Node::leaf_sum).sum::<u64>()
    }

    /// Every service named in the tree.
    pub fn services(&self, out: &mut std::collections::BTreeSet<String>) {
        if self.kind.is_none() && !self.service.is_empty() {
            out.insert(self.service.clone());
        }
        for c in &self.children {
            c.services(out);
        }
    }
}

/// A record's path as a tree; the (nameless) root's children are the path's
/// root frames and its total is the latency.
pub fn tree(r: &Record) -> Node {
    let mut root = Node {
        service: String::new(),
        name: String::new(),
        kind: None,
        total_ns: 0,
        self_ns: 0,
        children: Vec::new(),
    };
    for seg in r.path.segments() {
        let ns = u64::try_from(seg.duration.as_nanos()).unwrap_or(u64::MAX);
        root.total_ns += ns;
        let mut node = &mut root;
        for f in r.path.stack_frames(seg) {
            node = node.child(&f.service, &f.name, None);
            node.total_ns += ns;
        }
        // A named wait's leaf is its wait frame, its time that frame's own.
        if seg.kind == SegmentKind::Busy || seg.kind == SegmentKind::Wait {
            node.self_ns += ns;
        } else {
            let service = node.service.clone();
            let leaf = node.child(&service, seg.kind.as_str(), Some(seg.kind));
            leaf.total_ns += ns;
            leaf.self_ns += ns;
        }
    }
    root
}

/// Key of a node among the tree's lines: the frames from the root.
pub type PathKey = Vec<(String, String, Option<SegmentKind>)>;

fn totals(node: &Node, key: &mut PathKey, out: &mut BTreeMap<PathKey, u64>) {
    for c in &node.children {
        key.push((c.service.clone(), c.name.clone(), c.kind));
        *out.entry(key.clone()).or_default() += c.total_ns;
        totals(c, key, out);
        key.pop();
    }
}

/// The mean time per request on each tree line over `records` (0 where a
/// record's path does not pass).
fn mean_totals(records: &[Record]) -> BTreeMap<PathKey, u64> {
    let mut sum: BTreeMap<PathKey, u64> = BTreeMap::new();
    for r in records {
        totals(&tree(r), &mut Vec::new(), &mut sum);
    }
    let n = records.len().max(1) as u64;
    sum.values_mut().for_each(|v| *v /= n);
    sum
}

/// The comparison baseline: the endpoint's sampled records and their mean per line.
#[derive(Debug, PartialEq, Eq)]
pub struct Baseline {
    /// Requests averaged.
    pub requests: u64,
    /// Their mean latency, nanoseconds.
    pub mean_latency_ns: u64,
    means: BTreeMap<PathKey, u64>,
}

impl Baseline {
    /// Average `records` (all of the same endpoint, as a rule).
    pub fn of(records: &[Record]) -> Baseline {
        let n = records.len() as u64;
        let lat: u128 = records.iter().map(|r| r.latency.as_nanos()).sum();
        Baseline {
            requests: n,
            mean_latency_ns: u64::try_from(lat / u128::from(n.max(1))).unwrap_or(u64::MAX),
            means: mean_totals(records),
        }
    }

    /// The same averages from a profile's fold of the records (what
    /// [`Baseline::of`] gives for them, without holding them): each tree
    /// line's total is the sum over the stacks that pass through it. The
    /// mean latency is the aggregate's when it has one, else (an aggregate
    /// read back from a profile) the mean path total, which equals it since
    /// a path sums to its latency.
    pub fn of_aggregate(agg: &Aggregate) -> Baseline {
        let n = agg.requests();
        let mut sum: BTreeMap<PathKey, u64> = BTreeMap::new();
        let mut path_total: u128 = 0;
        let kinds: Vec<(cpt_sdk::path::Frame, SegmentKind)> = KINDS
            .into_iter()
            .filter_map(|k| kind_frame(k).map(|f| (f, k)))
            .collect();
        let mut key: PathKey = Vec::new();
        for s in agg.stacks() {
            path_total += u128::from(s.sum_nanos);
            key.clear();
            let mut parent_service = String::new();
            for f in agg.stack_frames(s) {
                let kind = kinds.iter().find(|(kf, _)| kf == f).map(|&(_, k)| k);
                match kind {
                    Some(k) => key.push((parent_service.clone(), k.as_str().to_owned(), Some(k))),
                    None => {
                        parent_service = f.service.to_string();
                        key.push((f.service.to_string(), f.name.to_string(), None));
                    }
                }
                let total = sum.entry(key.clone()).or_default();
                *total = total.saturating_add(s.sum_nanos);
            }
        }
        let latency = match agg.latency_sum().as_nanos() {
            0 => path_total,
            l => l,
        };
        let d = u64::max(n, 1);
        sum.values_mut().for_each(|v| *v /= d);
        Baseline {
            requests: n,
            mean_latency_ns: u64::try_from(latency / u128::from(d)).unwrap_or(u64::MAX),
            means: sum,
        }
    }
}

/// Leaves in render order: a frame's own busy time gets the frame's id, an
/// accounting leaf its own.
pub fn collect_leaves(root: &Node, out: &mut Vec<(u64, usize)>) {
    fn walk(n: &Node, id: &mut usize, out: &mut Vec<(u64, usize)>) {
        let me = *id;
        *id += 1;
        if n.self_ns > 0 {
            out.push((n.self_ns, me));
        }
        for c in &n.children {
            walk(c, id, out);
        }
    }
    let mut id = 0;
    for c in &root.children {
        walk(c, &mut id, out);
    }
}

impl Baseline {
    /// The mean time per request on the tree line `key` (0 when no
    /// averaged request's path passes there).
    pub fn mean_at(&self, key: &[(String, String, Option<SegmentKind>)]) -> u64 {
        self.means.get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::selection::{Selection, TriggerFilter};
    use cpt_sdk::path::{CriticalPath, Frame};
    use cpt_sdk::trigger::Trigger;
    use std::time::Duration;

    /// Requests of one endpoint whose paths share some lines and not
    /// others: frames under different parents, the same frame name in two
    /// places, the same name at two source lines (one tree line), every
    /// accounting kind, and a segment with no frame at all.
    fn requests() -> Vec<Record> {
        let root = Frame::new("A", "A1").with_location("a.rs", 10);
        let b = Frame::new("B", "B1");
        let b_again = Frame::new("B", "B1").with_location("b.rs", 7);
        let c = Frame::new("C", "C1");
        (0..12u64)
            .map(|i| {
                let mut p = CriticalPath::new();
                let ms = |x: u64| Duration::from_micros(100 + 37 * x + 11 * i);
                p.push_frames([root.clone()], ms(1), SegmentKind::Busy);
                p.push_frames([root.clone(), b.clone()], ms(2), SegmentKind::Busy);
                if i % 3 == 0 {
                    p.push_frames([root.clone(), b_again.clone()], ms(3), SegmentKind::Busy);
                }
                if i % 2 == 0 {
                    p.push_frames([root.clone(), c.clone()], ms(4), SegmentKind::Network);
                    p.push_frames(
                        [root.clone(), b.clone(), c.clone()],
                        ms(5),
                        SegmentKind::Busy,
                    );
                }
                p.push_frames([root.clone()], ms(6), SegmentKind::Queueing);
                if i % 4 == 1 {
                    p.push_frames([root.clone(), b.clone()], ms(7), SegmentKind::BlindSpot);
                    p.push_frames(Vec::<Frame>::new(), ms(8), SegmentKind::Unattributed);
                }
                Record::new("A", Trigger::Sampled, p)
            })
            .collect()
    }

    #[test]
    fn a_baseline_from_the_endpoints_profile_equals_the_one_from_its_records() {
        let records = requests();
        let sel = Selection::new().with_triggers(TriggerFilter::All);
        let agg = Aggregate::from_records(&sel, &records);
        let from_records = Baseline::of(&records);
        assert_eq!(Baseline::of_aggregate(&agg), from_records);
        assert!(from_records.means.len() >= 8, "{:?}", from_records.means);
        // Read back from its pprof profile (what the collector serves): the
        // latency comes from the paths, which sum to it.
        let back = crate::profile::pprof::read_aggregate(&crate::profile::pprof::encode_gzip(&agg))
            .unwrap();
        assert_eq!(Baseline::of_aggregate(&back), from_records);
    }
}
