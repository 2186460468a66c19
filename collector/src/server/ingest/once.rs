//! One record per request of a service instrumented with cpt's layer and
//! OpenTelemetry both.
//!
//! Such a service sends a cpt record for each request, carrying the
//! request's OpenTelemetry trace id, and spans that the OTLP receiver
//! turns into a record of the same request. Whichever of the two is stored
//! first stands; the other is not stored, and is counted. The OTLP side
//! mostly finds out before it makes its record (the assembler skips roots
//! whose service and trace a cpt record was admitted with,
//! [`CptTraces`](super::otlp::seen::CptTraces)); this is where a record that
//! arrives after the other was stored is caught: in the store's single
//! writer, before its group is committed, so that no two groups can both
//! find the other missing. Nothing stored is ever changed, so the
//! roll-ups and Parquet files stay exact.
//!
//! Only the most recent (service, trace) pairs of each source are
//! remembered ([`OneSource::CAPACITY`], kept as 128-bit hashes), and only
//! in memory: a record that arrives longer after the other than that, or
//! after a restart, is stored.

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::admission::{Job, Source};

/// Recently stored (service, trace) pairs of one source, oldest forgotten
/// first.
#[derive(Debug, Default)]
struct Recent {
    set: HashSet<u128>,
    order: VecDeque<u128>,
}

impl Recent {
    fn note(&mut self, key: u128) {
        if self.set.insert(key) {
            self.order.push_back(key);
            if self.order.len() > OneSource::CAPACITY
                && let Some(old) = self.order.pop_front()
            {
                self.set.remove(&old);
            }
        }
    }
}

/// The (service, trace) pair of a record, as a 128-bit hash: two
/// independent 64-bit hashes, so that a false match among a few hundred
/// thousand pairs has a chance of about 10⁻²⁸.
fn key(service: &str, trace: &str) -> u128 {
    let half = |seed: u8| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        seed.hash(&mut h);
        service.hash(&mut h);
        trace.hash(&mut h);
        h.finish()
    };
    (u128::from(half(1)) << 64) | u128::from(half(2))
}

/// What one batch of a group adds once it is committed: its pairs, and
/// how many of its records were taken out.
#[derive(Debug)]
pub(in crate::server) struct Noted {
    source: Source,
    keys: Vec<u128>,
    skipped: u64,
}

/// The writer's rule of one record per request and source (module docs).
#[derive(Debug)]
pub(in crate::server) struct OneSource {
    cpt: Recent,
    otlp: Recent,
    counters: Arc<super::otlp::counters::Counters>,
}

impl OneSource {
    /// How many (service, trace) pairs of each source are remembered.
    pub(in crate::server) const CAPACITY: usize = 200_000;

    pub(in crate::server) fn new(counters: Arc<super::otlp::counters::Counters>) -> OneSource {
        OneSource {
            cpt: Recent::default(),
            otlp: Recent::default(),
            counters,
        }
    }

    /// Take out of `group` the records whose request the other source
    /// stored already, here or earlier in the group. What the rest adds is
    /// [`committed`](Self::committed) once the group is.
    pub(in crate::server) fn filter(&self, group: &mut [Job]) -> Vec<Noted> {
        let mut out = Vec::with_capacity(group.len());
        // Pairs of earlier batches of this group, not yet committed.
        let mut group_cpt: HashSet<u128> = HashSet::new();
        let mut group_otlp: HashSet<u128> = HashSet::new();
        for job in group {
            let mut noted = Noted {
                source: job.source,
                keys: Vec::new(),
                skipped: 0,
            };
            let (other, other_group, own_group) = match job.source {
                Source::Cpt => (&self.otlp, &group_otlp, &mut group_cpt),
                Source::Otlp => (&self.cpt, &group_cpt, &mut group_otlp),
            };
            let keep: Vec<bool> = job
                .batch
                .requests()
                .map(|r| {
                    let Some((service, trace)) = r else {
                        return true;
                    };
                    let k = key(service, trace);
                    if other.set.contains(&k) || other_group.contains(&k) {
                        noted.skipped += 1;
                        return false;
                    }
                    noted.keys.push(k);
                    own_group.insert(k);
                    true
                })
                .collect();
            let skipped = noted.skipped;
            out.push(noted);
            if skipped == 0 {
                continue;
            }
            job.batch.keep_rows(&keep);
            if let Some(records) = &mut job.records {
                let mut keep = keep.iter();
                records.retain(|_| keep.next().copied().unwrap_or(true));
            }
        }
        out
    }

    /// The group that [`filter`](Self::filter) saw was committed, with
    /// these results per batch: the pairs of the batches stored are
    /// remembered, and the records taken out of them counted.
    pub(in crate::server) fn committed<E>(
        &mut self,
        noted: Vec<Noted>,
        results: &[Result<u64, E>],
    ) {
        for (n, r) in noted.into_iter().zip(results) {
            if r.is_err() {
                continue;
            }
            let (recent, skipped) = match n.source {
                Source::Cpt => (&mut self.cpt, &self.counters.layer_records_skipped),
                Source::Otlp => (&mut self.otlp, &self.counters.skipped_cpt),
            };
            for k in n.keys {
                recent.note(k);
            }
            skipped.fetch_add(n.skipped, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cpt_sdk::{CriticalPath, Frame, Record, SegmentKind, Trigger};
    use tokio::sync::oneshot;

    use super::*;
    use crate::server::store::EncodedBatch;

    fn record(service: &str, trace: Option<&str>) -> Record {
        let mut p = CriticalPath::new();
        p.push_frames(
            [Frame::new(service, "op")],
            Duration::from_millis(3),
            SegmentKind::Busy,
        );
        let mut r = Record::new(service, Trigger::Sampled, p);
        r.trace_id = trace.map(Into::into);
        r
    }

    fn job(source: Source, records: &[Record]) -> Job {
        Job {
            batch: EncodedBatch::new(records),
            records: Some(records.to_vec()),
            later_uses: Vec::new(),
            ack: oneshot::channel().0,
            source,
            _permit: None,
        }
    }

    fn services_and_traces(job: &Job) -> Vec<(String, Option<String>)> {
        let kept: Vec<_> = job
            .records
            .iter()
            .flatten()
            .map(|r| (r.service.clone(), r.trace_id.clone()))
            .collect();
        let batch: Vec<_> = job
            .batch
            .requests()
            .zip(job.records.iter().flatten())
            .map(|(b, r)| (r.service.clone(), b.map(|(_, t)| t.to_string())))
            .collect();
        assert_eq!(
            job.batch.len(),
            kept.len(),
            "the batch and its records agree"
        );
        assert_eq!(
            batch.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>(),
            kept.iter()
                .map(|(_, t)| t.as_deref().map(str::to_ascii_lowercase))
                .collect::<Vec<_>>()
        );
        kept
    }

    /// Commit a group whose batches all succeed; the records each keeps.
    fn commit(once: &mut OneSource, mut group: Vec<Job>) -> Vec<Vec<(String, Option<String>)>> {
        let noted = once.filter(&mut group);
        let ok: Vec<Result<u64, ()>> = group.iter().map(|j| Ok(j.batch.len() as u64)).collect();
        once.committed(noted, &ok);
        group.iter().map(services_and_traces).collect()
    }

    fn kept(service: &str, trace: Option<&str>) -> (String, Option<String>) {
        (service.to_string(), trace.map(Into::into))
    }

    /// A service with cpt's layer and OpenTelemetry both: whichever
    /// record of a request is stored first stands, and the other source's
    /// is taken out and counted, also when both come in one group. Other
    /// services, other traces, records of the same source and records
    /// without a trace id are all kept.
    #[test]
    fn the_first_record_of_a_request_stands_and_the_other_sources_is_counted() {
        let counters = Arc::new(crate::server::ingest::otlp::counters::Counters::default());
        let mut once = OneSource::new(counters.clone());
        let t = "0af7651916cd43dd8448eb211c80319c";
        let got = commit(
            &mut once,
            vec![job(Source::Otlp, &[record("front", Some(t))])],
        );
        assert_eq!(got, [vec![kept("front", Some(t))]]);
        let upper = t.to_ascii_uppercase();
        let late = [
            record("front", Some(&upper)),
            record("front", Some("1")),
            record("back", Some(t)),
            record("front", None),
        ];
        let got = commit(
            &mut once,
            vec![job(Source::Cpt, &late), job(Source::Cpt, &late[..1])],
        );
        assert_eq!(
            got,
            [
                vec![
                    kept("front", Some("1")),
                    kept("back", Some(t)),
                    kept("front", None)
                ],
                vec![],
            ]
        );
        assert_eq!(counters.layer_records_skipped.load(Ordering::Relaxed), 2);
        // One group: the cpt record is first, the OTLP one goes.
        let got = commit(
            &mut once,
            vec![
                job(Source::Cpt, &[record("front", Some("2"))]),
                job(Source::Cpt, &[record("front", Some("2"))]),
                job(
                    Source::Otlp,
                    &[record("front", Some("2")), record("front", Some("3"))],
                ),
            ],
        );
        assert_eq!(
            got,
            [
                vec![kept("front", Some("2"))],
                vec![kept("front", Some("2"))],
                vec![kept("front", Some("3"))],
            ]
        );
        assert_eq!(counters.skipped_cpt.load(Ordering::Relaxed), 1);
    }

    /// A batch the store did not commit is not remembered: the other
    /// source's record of its request is still stored.
    #[test]
    fn a_batch_that_was_not_committed_leaves_the_request_to_the_other_source() {
        let counters = Arc::new(crate::server::ingest::otlp::counters::Counters::default());
        let mut once = OneSource::new(counters.clone());
        let mut group = vec![job(Source::Cpt, &[record("front", Some("4"))])];
        let noted = once.filter(&mut group);
        once.committed(noted, &[Err(())]);
        let got = commit(
            &mut once,
            vec![job(Source::Otlp, &[record("front", Some("4"))])],
        );
        assert_eq!(got, [vec![kept("front", Some("4"))]]);
        assert_eq!(counters.skipped_cpt.load(Ordering::Relaxed), 0);
    }

    /// Only the latest pairs are remembered.
    #[test]
    fn remembered_pairs_are_bounded() {
        let mut r = Recent::default();
        for i in 0..OneSource::CAPACITY as u128 + 5 {
            r.note(i);
        }
        assert_eq!(r.set.len(), OneSource::CAPACITY);
        assert!(!r.set.contains(&0) && r.set.contains(&5));
    }
}
