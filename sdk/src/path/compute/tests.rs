//! Tests of the backwards walk: CPT Figure 2, the rules of the module docs,
//! hostile graphs.

use super::*;

use crate::testing::ms;

/// Build a node: `busy` as `(start_ms, end_ms, nested)`.
fn add(
    g: &mut Graph,
    parent: Option<NodeId>,
    name: &str,
    created: u64,
    end: Option<u64>,
    busy: &[(u64, u64, bool)],
) -> NodeId {
    let f = g.frame(Frame::new("A", name));
    let mut n = Node::new(f, ms(created));
    n.parent = parent;
    n.first_poll = busy.iter().map(|b| ms(b.0)).min();
    n.end = end.map(ms);
    n.busy = busy
        .iter()
        .map(|&(s, e, nested)| Busy {
            start: ms(s),
            end: ms(e),
            nested,
        })
        .collect();
    g.push(n)
}

/// `(stack joined by '/', ms, kind)` of each segment.
fn segs(p: &CriticalPath) -> Vec<(String, u64, SegmentKind)> {
    p.segments()
        .iter()
        .map(|s| {
            let names: Vec<&str> = p.stack_frames(s).map(|f| &*f.name).collect();
            (names.join("/"), s.duration.as_millis() as u64, s.kind)
        })
        .collect()
}

fn check(p: &CriticalPath, expected: &[(&str, u64, SegmentKind)]) {
    let got = segs(p);
    let want: Vec<_> = expected
        .iter()
        .map(|(s, d, k)| (s.to_string(), *d, *k))
        .collect();
    assert_eq!(got, want);
}

use SegmentKind::{Busy as B, Queueing as Q, Unattributed as U};

#[test]
fn cpt_fig2a_sequential() {
    let mut g = Graph::new();
    let a1 = add(
        &mut g,
        None,
        "A1",
        0,
        None,
        &[(0, 5, false), (25, 33, false), (35, 35, false)],
    );
    add(&mut g, Some(a1), "B1", 5, Some(25), &[(5, 25, false)]);
    add(&mut g, Some(a1), "A2", 33, Some(35), &[(33, 35, false)]);
    let p = compute(&g, a1, ms(35));
    check(
        &p,
        &[
            ("A1", 5, B),
            ("A1/B1", 20, B),
            ("A1", 8, B),
            ("A1/A2", 2, B),
        ],
    );
}

#[test]
fn cpt_fig2b_parallel() {
    let mut g = Graph::new();
    let a1 = add(
        &mut g,
        None,
        "A1",
        0,
        None,
        &[(0, 5, false), (25, 33, false)],
    );
    add(&mut g, Some(a1), "B1", 5, Some(25), &[(5, 25, false)]);
    add(&mut g, Some(a1), "A2", 5, Some(7), &[(5, 7, false)]);
    let p = compute(&g, a1, ms(33));
    check(&p, &[("A1", 5, B), ("A1/B1", 20, B), ("A1", 8, B)]);
}

#[test]
fn cpt_fig2c_overlap() {
    let mut g = Graph::new();
    // A1 computes 0..10 while B1 runs 3..17, waits, then computes 17..27.
    let a1 = add(
        &mut g,
        None,
        "A1",
        0,
        None,
        &[(0, 10, false), (17, 27, false)],
    );
    add(&mut g, Some(a1), "B1", 3, Some(17), &[(3, 17, false)]);
    let p = compute(&g, a1, ms(27));
    check(&p, &[("A1", 3, B), ("A1/B1", 14, B), ("A1", 10, B)]);
}

#[test]
fn nested_io_join_waits_are_the_slow_childs() {
    // P polls C1 and C2 inside its own polls; both sleep (unattributed).
    let mut g = Graph::new();
    let p = add(
        &mut g,
        None,
        "P",
        0,
        None,
        &[(0, 1, false), (20, 21, false), (30, 32, false)],
    );
    add(
        &mut g,
        Some(p),
        "C1",
        0,
        Some(20),
        &[(0, 1, true), (20, 21, true)],
    );
    add(
        &mut g,
        Some(p),
        "C2",
        0,
        Some(31),
        &[(0, 1, true), (20, 21, true), (30, 31, true)],
    );
    let path = compute(&g, p, ms(32));
    check(
        &path,
        &[
            ("P/C2", 1, B),
            ("P/C2", 19, U),
            ("P/C2", 1, B),
            ("P/C2", 9, U),
            ("P/C2", 1, B),
            ("P", 1, B),
        ],
    );
}

#[test]
fn cpu_bound_join_children_are_serialised_on_the_path() {
    let mut g = Graph::new();
    let p = add(&mut g, None, "P", 0, None, &[(0, 20, false)]);
    add(&mut g, Some(p), "C1", 0, Some(10), &[(0, 10, true)]);
    add(&mut g, Some(p), "C2", 0, Some(20), &[(10, 20, true)]);
    let path = compute(&g, p, ms(20));
    check(&path, &[("P/C1", 10, B), ("P/C2", 10, B)]);
}

#[test]
fn pending_nested_poll_is_the_childs_time() {
    // A select! loser polled for 2 ms inside P's poll, then dropped.
    let mut g = Graph::new();
    let p = add(
        &mut g,
        None,
        "P",
        0,
        None,
        &[(0, 4, false), (10, 11, false)],
    );
    add(&mut g, Some(p), "loser", 0, Some(3), &[(1, 3, true)]);
    let path = compute(&g, p, ms(11));
    check(
        &path,
        &[
            ("P", 1, B),
            ("P/loser", 2, B),
            ("P", 1, B),
            ("P", 6, U),
            ("P", 1, B),
        ],
    );
}

#[test]
fn created_early_polled_late_is_queueing() {
    let mut g = Graph::new();
    let p = add(
        &mut g,
        None,
        "P",
        0,
        None,
        &[(0, 0, false), (10, 10, false), (15, 15, false)],
    );
    add(
        &mut g,
        Some(p),
        "S",
        0,
        Some(15),
        &[(10, 10, true), (15, 15, true)],
    );
    let path = compute(&g, p, ms(15));
    check(&path, &[("P/S", 10, Q), ("P/S", 5, U)]);
    assert_eq!(path.accounting.queueing, ms(10));
    assert_eq!(path.accounting.unattributed, ms(5));
}

#[test]
fn runnable_time_belongs_to_what_the_parent_polled_instead() {
    // a and b yield to each other inside P's polls; b was ready from 5
    // (woken) to 8 while a ran, and a from 3 to 5 while b ran.
    let mut g = Graph::new();
    let p = add(&mut g, None, "P", 0, None, &[(0, 10, false)]);
    let a = add(
        &mut g,
        Some(p),
        "a",
        0,
        Some(8),
        &[(0, 3, true), (5, 8, true)],
    );
    let b = add(
        &mut g,
        Some(p),
        "b",
        0,
        Some(10),
        &[(3, 5, true), (8, 10, true)],
    );
    g.get_mut(a).unwrap().runnable.push((ms(3), ms(5)));
    g.get_mut(b).unwrap().runnable.push((ms(5), ms(8)));
    let path = compute(&g, p, ms(10));
    check(
        &path,
        &[("P/a", 3, B), ("P/b", 2, B), ("P/a", 3, B), ("P/b", 2, B)],
    );
    // Without wakes too: b is polled by P, and P's poll was running a.
    g.get_mut(b).unwrap().runnable.clear();
    let path = compute(&g, p, ms(10));
    check(
        &path,
        &[("P/a", 3, B), ("P/b", 2, B), ("P/a", 3, B), ("P/b", 2, B)],
    );
}

#[test]
fn runnable_with_nothing_else_running_is_queueing() {
    let mut g = Graph::new();
    let p = add(&mut g, None, "P", 0, None, &[(0, 1, false), (9, 10, false)]);
    let c = add(
        &mut g,
        Some(p),
        "c",
        1,
        Some(9),
        &[(1, 2, false), (8, 9, false)],
    );
    g.get_mut(c).unwrap().runnable.push((ms(5), ms(8)));
    let path = compute(&g, p, ms(10));
    check(
        &path,
        &[
            ("P", 1, B),
            ("P/c", 1, B),
            ("P/c", 3, U),
            ("P/c", 3, Q),
            ("P/c", 1, B),
            ("P", 1, B),
        ],
    );
}

#[test]
fn never_awaited_child_is_off_the_path() {
    let mut g = Graph::new();
    let p = add(
        &mut g,
        None,
        "P",
        0,
        None,
        &[(0, 2, false), (10, 12, false)],
    );
    add(&mut g, Some(p), "fire", 1, None, &[(2, 40, false)]);
    let path = compute(&g, p, ms(12));
    check(&path, &[("P", 2, B), ("P", 8, U), ("P", 2, B)]);
}

#[test]
fn explicit_blocker_names_the_last_input() {
    // Task graph: O waits for X (20 ms) and Y (2 ms); queued 1 ms after X.
    let mut g = Graph::new();
    let p = add(
        &mut g,
        None,
        "P",
        0,
        None,
        &[(0, 0, false), (25, 25, false)],
    );
    let x = add(&mut g, Some(p), "X", 0, Some(20), &[(0, 20, true)]);
    let y = add(&mut g, Some(p), "Y", 0, Some(22), &[(20, 22, true)]);
    let o = add(&mut g, Some(p), "O", 0, Some(25), &[(21, 25, true)]);
    g.get_mut(o).unwrap().resumptions.push(Resumption {
        at: ms(21),
        blocker: Some(x),
    });
    let _ = y;
    let path = compute(&g, p, ms(25));
    check(&path, &[("P/X", 20, B), ("P/O", 1, Q), ("P/O", 4, B)]);
}

#[test]
fn callee_path_is_spliced_under_the_rpc_node() {
    let mut g = Graph::new();
    let a1 = add(
        &mut g,
        None,
        "A1",
        0,
        None,
        &[(0, 5, false), (25, 33, false)],
    );
    let rpc = add(
        &mut g,
        Some(a1),
        "B1",
        5,
        Some(25),
        &[(5, 6, true), (24, 25, true)],
    );
    let mut callee = CriticalPath::new();
    callee.push_frames([Frame::new("B", "B1")], ms(4), B);
    callee.push_frames([Frame::new("B", "B1"), Frame::new("B", "B2")], ms(12), B);
    g.get_mut(rpc).unwrap().callee = Some(CalleeOutcome::Path(callee));
    let path = compute(&g, a1, ms(33));
    check(
        &path,
        &[
            ("A1", 5, B),
            ("A1/B1", 4, SegmentKind::Network),
            ("A1/B1/B1", 4, B),
            ("A1/B1/B1/B2", 12, B),
            ("A1", 8, B),
        ],
    );
    assert_eq!(path.accounting.network, ms(4));
}

#[test]
fn blind_spot_callee() {
    let mut g = Graph::new();
    let a1 = add(
        &mut g,
        None,
        "A1",
        0,
        None,
        &[(0, 5, false), (25, 33, false)],
    );
    let rpc = add(&mut g, Some(a1), "B1", 5, Some(25), &[(5, 25, false)]);
    g.get_mut(rpc).unwrap().callee = Some(CalleeOutcome::BlindSpot { callee: "B".into() });
    let path = compute(&g, a1, ms(33));
    assert_eq!(path.total(), ms(33));
    assert_eq!(path.accounting.blind_spot, ms(20));
}

#[test]
fn root_queueing_before_first_poll() {
    let mut g = Graph::new();
    let r = add(&mut g, None, "R", 0, None, &[(3, 10, false)]);
    let path = compute(&g, r, ms(10));
    check(&path, &[("R", 3, Q), ("R", 7, B)]);
}

#[test]
fn hostile_inputs_keep_the_sum_exact() {
    #[rustfmt::skip]
    let cases: Vec<(&str, Graph, NodeId, u64)> = vec![
        ("blocker ends after resumption", {
            let mut g = Graph::new();
            let r = add(&mut g, None, "R", 0, None, &[(0, 2, false), (5, 9, false)]);
            let c = add(&mut g, Some(r), "C", 1, Some(50), &[(1, 50, false)]);
            g.get_mut(r).unwrap().resumptions.push(Resumption { at: ms(5), blocker: Some(c) });
            g
        }, NodeId::from_index(0), 9),
        ("blocker starts before its parent", {
            let mut g = Graph::new();
            let r = add(&mut g, None, "R", 10, None, &[(10, 12, false), (20, 22, false)]);
            let m = add(&mut g, Some(r), "M", 12, Some(20), &[(12, 13, false)]);
            add(&mut g, Some(m), "early", 0, Some(19), &[(0, 19, false)]);
            g
        }, NodeId::from_index(0), 22),
        ("parent cycle", {
            let mut g = Graph::new();
            let r = add(&mut g, None, "R", 0, None, &[(0, 1, false), (9, 10, false)]);
            let a = add(&mut g, Some(r), "a", 1, Some(9), &[(1, 2, false), (8, 9, false)]);
            let b = add(&mut g, Some(a), "b", 2, Some(8), &[(2, 8, false)]);
            g.get_mut(a).unwrap().parent = Some(b);
            g
        }, NodeId::from_index(0), 10),
        ("blocker cycle", {
            let mut g = Graph::new();
            let r = add(&mut g, None, "R", 0, None, &[(0, 1, false), (9, 10, false)]);
            let a = add(&mut g, Some(r), "a", 1, Some(9), &[(1, 2, false), (8, 9, false)]);
            let b = add(&mut g, Some(r), "b", 1, Some(8), &[(2, 3, false)]);
            g.get_mut(a).unwrap().resumptions.push(Resumption { at: ms(8), blocker: Some(b) });
            g.get_mut(b).unwrap().resumptions.push(Resumption { at: ms(2), blocker: Some(a) });
            g.get_mut(r).unwrap().resumptions.push(Resumption { at: ms(9), blocker: Some(r) });
            g
        }, NodeId::from_index(0), 10),
        ("times past the end and inverted", {
            let mut g = Graph::new();
            let r = add(&mut g, None, "R", 5, None, &[(9, 3, false), (100, 200, false)]);
            add(&mut g, Some(r), "c", 50, Some(1), &[(60, 2, true)]);
            g
        }, NodeId::from_index(0), 20),
        ("end before root creation", {
            let mut g = Graph::new();
            add(&mut g, None, "R", 50, None, &[(50, 60, false)]);
            g
        }, NodeId::from_index(0), 20),
    ];
    for (name, g, root, end) in cases {
        let p = compute(&g, root, ms(end));
        let start = g.get(root).unwrap().created.min(ms(end));
        assert_eq!(p.total(), ms(end) - start, "{name}");
    }
}

#[test]
fn absurd_depth_is_iterative_and_capped() {
    // A chain 20 000 deep, each node blocked on its only child.
    let depth = 20_000u64;
    let mut g = Graph::new();
    let mut parent = None;
    for i in 0..depth {
        let end = 2 * depth - i;
        let id = add(
            &mut g,
            parent,
            "n",
            i,
            if i == 0 { None } else { Some(end) },
            &[(i, i + 1, false), (end - 1, end, false)],
        );
        parent = Some(id);
    }
    let p = compute(&g, NodeId::from_index(0), ms(2 * depth));
    assert_eq!(p.total(), ms(2 * depth));
    assert!(
        p.segments()
            .iter()
            .all(|s| s.stack.len() <= MAX_STACK_DEPTH)
    );
    assert!(p.accounting.truncated > Duration::ZERO);
}

#[test]
fn scratch_in_use_gives_fresh_buffers_and_the_same_path() {
    let mut g = Graph::new();
    let a1 = add(
        &mut g,
        None,
        "A1",
        0,
        None,
        &[(0, 5, false), (25, 33, false)],
    );
    add(&mut g, Some(a1), "B1", 5, Some(25), &[(5, 25, false)]);
    let alone = compute(&g, a1, ms(33));
    // A compute while this thread's scratch is taken (reentrancy).
    let nested = Scratch::with(|outer| {
        outer.walk.pieces.push(Piece::Seg {
            node: 0,
            dur: 1,
            kind: SegmentKind::Busy,
            wait: NO_WAIT,
        });
        compute(&g, a1, ms(33))
    });
    assert_eq!(nested, alone);
    assert_eq!(compute(&g, a1, ms(33)), alone);
}

#[test]
fn scratch_is_bounded_after_a_huge_request() {
    let (mut g, mut parent) = (Graph::new(), None);
    for i in 0..2 * SCRATCH_KEEP as u64 {
        parent = Some(add(&mut g, parent, "n", i, None, &[(i, i + 1, false)]));
    }
    let p = compute(&g, NodeId::from_index(0), ms(4 * SCRATCH_KEEP as u64));
    assert_eq!(p.total(), ms(4 * SCRATCH_KEEP as u64));
    let kept = SCRATCH.take().expect("compute puts its scratch back");
    assert!(kept.prep.nodes.capacity() <= SCRATCH_KEEP);
    assert!(kept.walk.visited.capacity() <= SCRATCH_KEEP);
    assert!(kept.stacks.memo.capacity() <= SCRATCH_KEEP);
}

#[test]
fn missing_root_is_empty() {
    let g = Graph::new();
    assert_eq!(
        compute(&g, NodeId::from_index(3), ms(1)).total(),
        Duration::ZERO
    );
}

#[test]
fn a_stack_is_shared_only_by_siblings_of_one_frame() {
    // Forward, the path resolves X (under R), then y (under R), then y
    // under X: the last one has the frame of the stack made just before it
    // but another parent, so it must not share that stack.
    let mut g = Graph::new();
    let r = add(
        &mut g,
        None,
        "R",
        0,
        None,
        &[(0, 1, false), (20, 21, false)],
    );
    let y2 = add(&mut g, Some(r), "y", 2, Some(10), &[(2, 10, false)]);
    let x = add(
        &mut g,
        Some(r),
        "X",
        1,
        Some(20),
        &[(1, 2, false), (19, 20, false)],
    );
    g.get_mut(x).unwrap().resumptions = vec![Resumption {
        at: ms(10),
        blocker: Some(y2),
    }];
    add(&mut g, Some(x), "y", 10, Some(19), &[(10, 19, false)]);
    check(
        &compute(&g, r, ms(21)),
        &[
            ("R", 1, B),
            ("R/X", 1, B),
            ("R/y", 8, B),
            ("R/X/y", 9, B),
            ("R/X", 1, B),
            ("R", 1, B),
        ],
    );
}

#[test]
fn back_to_back_requests_on_one_thread_match_fresh_computation() {
    // A larger request first leaves this thread's scratch full of its
    // intervals, stacks and pieces; the next request must not see them.
    let mut big = Graph::new();
    let root = add(&mut big, None, "root", 0, None, &[(0, 100, false)]);
    for i in 0..20 {
        let name = if i % 2 == 0 { "even" } else { "odd" };
        let c = add(
            &mut big,
            Some(root),
            name,
            5 * i,
            Some(5 * i + 4),
            &[(5 * i + 1, 5 * i + 4, true)],
        );
        add(
            &mut big,
            Some(c),
            "leaf",
            5 * i + 2,
            Some(5 * i + 3),
            &[(5 * i + 2, 5 * i + 3, true)],
        );
    }
    let mut small = Graph::new();
    let a1 = add(
        &mut small,
        None,
        "A1",
        0,
        None,
        &[(0, 5, false), (25, 33, false)],
    );
    let b1 = add(
        &mut small,
        Some(a1),
        "B1",
        5,
        Some(25),
        &[(5, 12, false), (20, 25, false)],
    );
    add(
        &mut small,
        Some(b1),
        "even",
        12,
        Some(20),
        &[(12, 20, true)],
    );
    // Fresh: computed while the thread's scratch is taken.
    let (fresh_big, fresh_small) =
        Scratch::with(|_| (compute(&big, root, ms(100)), compute(&small, a1, ms(33))));
    assert_eq!(compute(&big, root, ms(100)), fresh_big);
    assert_eq!(compute(&small, a1, ms(33)), fresh_small);
    assert_eq!(compute(&big, root, ms(100)), fresh_big);
    check(
        &fresh_small,
        &[
            ("A1", 5, B),
            ("A1/B1", 7, B),
            ("A1/B1/even", 8, B),
            ("A1/B1", 5, B),
            ("A1", 8, B),
        ],
    );
}

// --- named waits ------------------------------------------------------------

/// A node's waits named by its marks: a sleep, then a wait nothing names
/// (a later mark without a frame), then a semaphore; the time of each is
/// the wait's, and a child that ended inside a wait still explains it.
#[test]
fn wait_marks_name_the_waits_left_on_the_node() {
    let mut g = Graph::new();
    let sleep = Graph::frame(
        &mut g,
        Frame::wait(
            "A",
            "sleep",
            Some(crate::path::Location {
                file: "svc/src/main.rs".into(),
                line: 88,
            }),
        ),
    );
    let sem = Graph::frame(&mut g, Frame::wait("A", "semaphore", None));
    // A1 runs 0-2, waits 2-12 (sleep), runs 12-13, waits 13-15 (nothing
    // named), runs 15-16, waits 16-20 (semaphore) but B1 (20) explains
    // 16-20 ... B1 ends at 19: 19-20 stays the semaphore's, runs 20-21.
    let a1 = add(
        &mut g,
        None,
        "A1",
        0,
        None,
        &[
            (0, 2, false),
            (12, 13, false),
            (15, 16, false),
            (20, 21, false),
        ],
    );
    add(&mut g, Some(a1), "B1", 16, Some(19), &[(16, 19, false)]);
    let marks = [(2, Some(sleep)), (13, None), (16, Some(sem))];
    g.get_mut(a1).unwrap().waits = marks
        .iter()
        .map(|&(at, on)| WaitMark { at: ms(at), on })
        .collect();
    let p = compute(&g, a1, ms(21));
    use SegmentKind::Wait as W;
    check(
        &p,
        &[
            ("A1", 2, B),
            ("A1/[sleep svc/src/main.rs:88]", 10, W),
            ("A1", 1, B),
            ("A1", 2, U),
            ("A1", 1, B),
            ("A1/B1", 3, B),
            ("A1/[semaphore]", 1, W),
            ("A1", 1, B),
        ],
    );
    assert_eq!(p.total(), ms(21));
    assert_eq!(
        p.accounting.unattributed,
        ms(2),
        "named waits are not unattributed"
    );
    let leaf = p.frame(*p.segments()[1].stack.last().unwrap());
    assert_eq!(leaf.wait_kind(), Some("sleep"));
    assert_eq!(leaf.location.as_ref().map(|l| l.line), Some(88));
}

/// A node at the stack depth limit cannot take a wait frame under it: its
/// named wait is unattributed (and counted so), the total unchanged.
#[test]
fn a_named_wait_at_the_depth_limit_is_unattributed() {
    let mut g = Graph::new();
    let sleep = Graph::frame(&mut g, Frame::wait("A", "sleep", None));
    let mut parent = None;
    let mut ids = Vec::new();
    for i in 0..MAX_STACK_DEPTH {
        let end = (i > 0).then_some(10);
        let id = add(&mut g, parent, &format!("n{i}"), 0, end, &[(0, 1, false)]);
        ids.push(id);
        parent = Some(id);
    }
    let leaf = *ids.last().unwrap();
    g.get_mut(leaf).unwrap().waits = vec![WaitMark {
        at: ms(1),
        on: Some(sleep),
    }];
    // Every ancestor waits on the leaf, which waits 1-10 on the sleep.
    let p = compute(&g, ids[0], ms(10));
    assert_eq!(p.total(), ms(10));
    assert!(p.segments().iter().all(|s| s.kind != SegmentKind::Wait));
    assert_eq!(p.depth(), MAX_STACK_DEPTH);
}
