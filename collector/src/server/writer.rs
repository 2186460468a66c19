//! The single writer thread: group commit of whatever batches are waiting
//! (step 3 of the parent module's "How a batch flows").

use std::sync::Arc;

use tokio::sync::mpsc;

use super::admission::Job;
use super::store::{EncodedBatch, Store};

/// The single writer: group commit of whatever batches are waiting.
pub(super) fn write_loop(
    mut store: Store,
    mut jobs: mpsc::Receiver<Job>,
    max_group_records: usize,
) {
    while let Some(first) = jobs.blocking_recv() {
        let mut records = first.batch.len();
        let mut group = vec![first];
        while records < max_group_records {
            match jobs.try_recv() {
                Ok(job) => {
                    records += job.batch.len();
                    group.push(job);
                }
                Err(_) => break,
            }
        }
        let batches: Vec<&EncodedBatch> = group.iter().map(|j| &j.batch).collect();
        match store.insert_group(&batches) {
            Ok(results) => {
                for (job, result) in group.into_iter().zip(results) {
                    let _ = job.ack.send(result.map_err(Arc::new));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                for job in group {
                    let _ = job.ack.send(Err(e.clone()));
                }
            }
        }
    }
}
