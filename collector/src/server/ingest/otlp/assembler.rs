//! Trace assembly: spans held by trace id until the trace is complete (its
//! root has arrived and no span of it for the wait), then its records made
//! with the importer's code ([`trace_records`]) and stored with the
//! trace's held spans released, in one savepoint of the group commit.
//!
//! [`Pending`] is the bounded map (no clocks of its own, no I/O);
//! [`complete`] turns completed traces into records; [`run`] is the task
//! that ties them to the receivers and the writer.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cpt_sdk::Record;
use tokio::sync::mpsc;

use super::spans::HeldSpan;
use super::{Counters, CptTraces, Dropped};
use crate::ingest::IngestLimits;
use crate::traces::model::{BuildOptions, build};
use crate::traces::{ImportOptions, crisp, trace_records};

/// Trace ids of completed traces remembered, to tell a late span from the
/// first span of a new trace.
pub(crate) const REMEMBERED_DONE: usize = 100_000;

/// How many waits a trace whose root never arrived is held after its last
/// span, before it is dropped (counted `no_root`).
pub(crate) const ROOTLESS_WAITS: u32 = 6;

/// The spans of one trace being held.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) spans: Vec<HeldSpan>,
    roots: usize,
    last: Instant,
    seq: u64,
}

/// Why a trace left [`Pending`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Why {
    /// Its root arrived and no span for the wait.
    Complete,
    /// The bound on held spans was reached: the oldest traces go first.
    Early,
    /// No root arrived, and no span for [`ROOTLESS_WAITS`] waits.
    NoRoot,
}

/// The held traces, bounded in spans.
#[derive(Debug)]
pub(crate) struct Pending {
    traces: HashMap<String, Held>,
    /// Trace ids by first arrival, for completing the oldest early.
    by_age: BTreeMap<u64, String>,
    seq: u64,
    spans: usize,
    max_spans: usize,
    wait: Duration,
    done: HashSet<String>,
    done_order: VecDeque<String>,
}

impl Pending {
    pub(crate) fn new(max_spans: usize, wait: Duration) -> Pending {
        Pending {
            traces: HashMap::new(),
            by_age: BTreeMap::new(),
            seq: 0,
            spans: 0,
            max_spans: max_spans.max(1),
            wait,
            done: HashSet::new(),
            done_order: VecDeque::new(),
        }
    }

    /// Spans held.
    pub(crate) fn spans(&self) -> usize {
        self.spans
    }

    /// Traces held.
    pub(crate) fn traces(&self) -> usize {
        self.traces.len()
    }

    /// Hold `spans` of `trace`. `Err(n)`: the trace was completed already;
    /// its `n` late spans are not held.
    pub(crate) fn add(
        &mut self,
        trace: String,
        spans: Vec<HeldSpan>,
        now: Instant,
    ) -> Result<(), usize> {
        if self.done.contains(&trace) {
            return Err(spans.len());
        }
        self.spans += spans.len();
        let roots = spans.iter().filter(|s| s.is_root()).count();
        match self.traces.get_mut(&trace) {
            Some(h) => {
                h.spans.extend(spans);
                h.roots += roots;
                h.last = now;
            }
            None => {
                self.seq += 1;
                self.by_age.insert(self.seq, trace.clone());
                self.traces.insert(
                    trace,
                    Held {
                        spans,
                        roots,
                        last: now,
                        seq: self.seq,
                    },
                );
            }
        }
        Ok(())
    }

    /// Hold again a trace whose records could not be stored (a retry).
    pub(crate) fn put_back(&mut self, trace: String, spans: Vec<HeldSpan>, now: Instant) {
        self.done.remove(&trace);
        let _ = self.add(trace, spans, now);
    }

    fn take(&mut self, trace: &str) -> Option<(String, Held)> {
        let (t, h) = self.traces.remove_entry(trace)?;
        self.by_age.remove(&h.seq);
        self.spans -= h.spans.len();
        if self.done_order.len() == REMEMBERED_DONE
            && let Some(old) = self.done_order.pop_front()
        {
            self.done.remove(&old);
        }
        self.done.insert(t.clone());
        self.done_order.push_back(t.clone());
        Some((t, h))
    }

    /// The traces that leave now: complete ones, rootless ones given up,
    /// and, while more than the bound are held, the oldest.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<(String, Held, Why)> {
        let rootless = self.wait * ROOTLESS_WAITS;
        let mut ids: Vec<(u64, String, Why)> = self
            .traces
            .iter()
            .filter_map(|(t, h)| {
                let quiet = now.saturating_duration_since(h.last);
                if h.roots > 0 && quiet >= self.wait {
                    Some((h.seq, t.clone(), Why::Complete))
                } else if h.roots == 0 && quiet >= rootless {
                    Some((h.seq, t.clone(), Why::NoRoot))
                } else {
                    None
                }
            })
            .collect();
        // In order of arrival: records of older traces are stored first.
        ids.sort_unstable_by_key(|(seq, _, _)| *seq);
        let mut out: Vec<(String, Held, Why)> = ids
            .into_iter()
            .filter_map(|(_, t, why)| self.take(&t).map(|(t, h)| (t, h, why)))
            .collect();
        while self.spans > self.max_spans {
            let Some((_, oldest)) = self.by_age.first_key_value() else {
                break;
            };
            let oldest = oldest.clone();
            if let Some((t, h)) = self.take(&oldest) {
                out.push((t, h, Why::Early));
            }
        }
        out
    }
}

/// What completing traces needs.
#[derive(Debug)]
pub(crate) struct Completion {
    pub(crate) import: ImportOptions,
    pub(crate) limits: IngestLimits,
    pub(crate) counters: Arc<Counters>,
    pub(crate) cpt_traces: Arc<CptTraces>,
}

/// Records of completed traces, and the traces whose held spans they
/// release.
#[derive(Debug, Default)]
pub(crate) struct Completed {
    pub(crate) records: Vec<Record>,
    pub(crate) released: Vec<String>,
    /// The traces, to hold again if the records cannot be stored.
    pub(crate) traces: Vec<(String, Vec<HeldSpan>)>,
}

/// Make the records of traces that left [`Pending`], as `cpt traces
/// convert --from otlp` makes them from the same spans; count what is
/// dropped and why.
pub(crate) fn complete(
    c: &Completion,
    due: Vec<(String, Held, Why)>,
    now_unix_nanos: u64,
) -> Completed {
    let mut out = Completed::default();
    let mut scratch = crisp::Scratch::default();
    let mut pieces = Vec::new();
    let k = &c.counters;
    for (trace, held, why) in due {
        out.released.push(trace.clone());
        match why {
            Why::Complete => k.completed.fetch_add(1, Ordering::Relaxed),
            Why::Early => k.completed_early.fetch_add(1, Ordering::Relaxed),
            Why::NoRoot => k.completed_rootless.fetch_add(1, Ordering::Relaxed),
        };
        if held.roots == 0 {
            k.drop_trace(Dropped::NoRoot, held.spans.len());
            continue;
        }
        let raws = held.spans.iter().map(HeldSpan::to_raw).collect();
        let built = build(&trace, raws, BuildOptions::default());
        let t = match built {
            Ok(mut t) => {
                // The roots' labels (`--otlp-label`), as the file reader
                // sets them.
                t.root_labels = held
                    .spans
                    .iter()
                    .filter(|s| s.is_root() && !s.labels.is_empty())
                    .map(|s| (s.id.as_str().into(), s.labels.clone()))
                    .collect();
                t
            }
            Err(e) => {
                k.drop_trace(Dropped::of(&e.reason), held.spans.len());
                continue;
            }
        };
        for a in trace_records(&t, &c.import, &mut scratch, &mut pieces) {
            let mut r = a.record;
            if c.cpt_traces.has(&r.service, r.trace_id.as_deref()) {
                k.skipped_cpt.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // A path over the ingest limits (a trace of 10⁵ spans) is
            // coarsened to fit, as the SDK's encoder coarsens a path to fit
            // a header.
            let fitted = c.limits.fit(&mut r);
            if fitted.is_err() || c.limits.start(r.start_unix_nanos, now_unix_nanos).is_err() {
                k.records_refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if fitted == Ok(true) {
                k.records_coarsened.fetch_add(1, Ordering::Relaxed);
            }
            out.records.push(r);
        }
        out.traces.push((trace, held.spans));
    }
    out
}

/// What the assembler task receives.
#[derive(Debug)]
pub(crate) enum Msg {
    /// Spans a request delivered, durable in the store.
    Spans(Vec<(String, Vec<HeldSpan>)>),
    /// Spans held in the store when the collector started.
    Restored(Vec<(String, Vec<HeldSpan>)>),
    /// Completed traces whose records could not be stored: hold them
    /// again.
    Retry(Vec<(String, Vec<HeldSpan>)>),
    /// Held rows that cannot be read back: delete them.
    Release(Vec<String>),
}

/// How often the held traces are looked at.
pub(crate) const TICK: Duration = Duration::from_millis(100);

/// The assembler task: holds spans as they arrive, and every [`TICK`]
/// completes what is due, one group of traces in flight at a time.
pub(crate) async fn run(
    mut pending: Pending,
    mut rx: mpsc::Receiver<Msg>,
    retry: mpsc::Sender<Msg>,
    ctx: Arc<Completion>,
    store: super::Commit,
) {
    let mut in_flight: Option<tokio::task::JoinHandle<()>> = None;
    let mut late: Vec<String> = Vec::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            m = rx.recv() => {
                let Some(m) = m else { break };
                let now = Instant::now();
                let (traces, retried) = match m {
                    Msg::Spans(t) | Msg::Restored(t) => (t, false),
                    Msg::Retry(t) => (t, true),
                    Msg::Release(t) => {
                        late.extend(t);
                        (Vec::new(), false)
                    }
                };
                for (trace, spans) in traces {
                    if retried {
                        pending.put_back(trace, spans, now);
                    } else if let Err(n) = pending.add(trace.clone(), spans, now) {
                        ctx.counters.late_spans.fetch_add(n as u64, Ordering::Relaxed);
                        late.push(trace);
                    }
                }
            }
            _ = tick.tick() => {}
        }
        let gauges = |p: &Pending| {
            let c = &ctx.counters;
            c.pending_spans.store(p.spans() as u64, Ordering::Relaxed);
            c.pending_traces.store(p.traces() as u64, Ordering::Relaxed);
        };
        gauges(&pending);
        if in_flight.as_ref().is_some_and(|h| !h.is_finished()) {
            continue;
        }
        let due = pending.due(Instant::now());
        gauges(&pending);
        if due.is_empty() && late.is_empty() {
            continue;
        }
        let late = std::mem::take(&mut late);
        let ctx = ctx.clone();
        let retry = retry.clone();
        let store = store.clone();
        in_flight = Some(tokio::spawn(async move {
            let work = ctx.clone();
            let done =
                tokio::task::spawn_blocking(move || complete(&work, due, super::unix_nanos_now()))
                    .await;
            let Ok(mut done) = done else { return };
            done.released.extend(late);
            let n = done.records.len() as u64;
            match store.commit(done.records, done.released).await {
                Ok(()) => {
                    ctx.counters.records.fetch_add(n, Ordering::Relaxed);
                }
                Err(()) => {
                    ctx.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                    // Held in the store still: hold them in memory again.
                    let _ = retry.send(Msg::Retry(done.traces)).await;
                }
            }
        }));
    }
    if let Some(h) = in_flight {
        let _ = h.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(id: &str, parent: Option<&str>) -> HeldSpan {
        HeldSpan {
            id: id.into(),
            parent: parent.map(Into::into),
            service: "svc".into(),
            operation: "op".into(),
            start_ns: 1_000,
            duration_ns: 100,
            kind: 3,
            clock: "host:a".into(),
            error: false,
            labels: Vec::new(),
        }
    }

    const WAIT: Duration = Duration::from_secs(10);

    #[test]
    fn a_trace_completes_once_its_root_arrived_and_the_wait_passed_since_its_last_span() {
        let t0 = Instant::now();
        let mut p = Pending::new(1000, WAIT);
        p.add("t".into(), vec![span("b", Some("a"))], t0).unwrap();
        assert!(p.due(t0 + WAIT * 2).is_empty(), "no root yet");
        p.add("t".into(), vec![span("a", None)], t0 + WAIT * 2)
            .unwrap();
        assert!(p.due(t0 + WAIT * 3 - Duration::from_millis(1)).is_empty());
        let due = p.due(t0 + WAIT * 3);
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].2, due[0].1.spans.len()), (Why::Complete, 2));
        assert_eq!((p.spans(), p.traces()), (0, 0));
        // A span of it now is late.
        assert_eq!(p.add("t".into(), vec![span("c", Some("a"))], t0), Err(1));
    }

    #[test]
    fn rootless_traces_are_given_up_after_their_waits() {
        let t0 = Instant::now();
        let mut p = Pending::new(1000, WAIT);
        p.add("t".into(), vec![span("b", Some("a"))], t0).unwrap();
        assert!(
            p.due(t0 + WAIT * ROOTLESS_WAITS - Duration::from_millis(1))
                .is_empty()
        );
        let due = p.due(t0 + WAIT * ROOTLESS_WAITS);
        assert_eq!(due[0].2, Why::NoRoot);
    }

    #[test]
    fn past_the_bound_the_oldest_traces_leave_first_and_memory_stays_bounded() {
        let t0 = Instant::now();
        let mut p = Pending::new(10, WAIT);
        // A sender whose roots never arrive.
        for i in 0..100 {
            let t = format!("t{i:03}");
            p.add(t, vec![span("b", Some("a")), span("c", Some("a"))], t0)
                .unwrap();
            let due = p.due(t0);
            assert!(p.spans() <= 10, "{} held", p.spans());
            if i >= 5 {
                assert_eq!(due.len(), 1);
                assert_eq!(due[0].0, format!("t{:03}", i - 5));
                assert_eq!(due[0].2, Why::Early);
            }
        }
    }

    #[test]
    fn a_retried_trace_is_held_again_not_late() {
        let t0 = Instant::now();
        let mut p = Pending::new(1000, WAIT);
        p.add("t".into(), vec![span("a", None)], t0).unwrap();
        let (t, h, _) = p.due(t0 + WAIT).pop().unwrap();
        p.put_back(t, h.spans, t0 + WAIT);
        assert_eq!(p.traces(), 1);
        assert!(
            p.add("t".into(), vec![span("b", Some("a"))], t0 + WAIT)
                .is_ok()
        );
    }

    #[test]
    fn remembered_completions_are_bounded() {
        let t0 = Instant::now();
        let mut p = Pending::new(usize::MAX, Duration::ZERO);
        for i in 0..REMEMBERED_DONE + 10 {
            p.add(format!("{i}"), vec![span("a", None)], t0).unwrap();
            p.due(t0);
        }
        assert_eq!(p.done.len(), REMEMBERED_DONE);
        // The oldest are forgotten: a span of them starts a new trace.
        assert!(p.add("0".into(), vec![span("a", None)], t0).is_ok());
    }
}
