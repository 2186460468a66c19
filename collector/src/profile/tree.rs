//! One request's critical path as a tree (what `cpt show` prints and the
//! collector's request page draws): each frame's time on the path, its own
//! busy time, and the accounting kinds as marked leaves. The leaves' times
//! sum to the latency exactly. [`Baseline`] is the same tree averaged over
//! many requests of an endpoint, to set one request beside.

use std::collections::BTreeMap;

use cpt_sdk::path::SegmentKind;
use cpt_sdk::record::Record;

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
        if seg.kind == SegmentKind::Busy {
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
#[derive(Debug)]
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
