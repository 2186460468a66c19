//! The single writer thread: group commit of whatever batches are waiting
//! (step 3 of the parent module's "How a batch flows").
//!
//! With `--parquet-dir`, the new batches of a group (not those whose batch
//! id was committed before) are written as Parquet inside the store's
//! transaction, before it commits: one file per hour partition per group
//! (split past the size bound), each finished (footer, fsync, rename, fsync
//! of the directory) before the commit, so before any batch of the group is
//! acknowledged. A failed Parquet write rolls the group back (the senders
//! retry); a failed commit after finished files leaves records in Parquet
//! only, and the retry writes them again: Parquet can hold a duplicate, the
//! store never does. Under load a group holds
//! up to `max_group_records` records, so files grow with the load; at low
//! load files are small (one per group): the price of acknowledging only
//! what is in a finished file. `cpt export DIR --parquet-dir NEW` compacts
//! them.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::admission::Job;
use super::store::{EncodedBatch, Store, StoreError};
use crate::records::parquet::PartitionedWriter;

/// The single writer: group commit of whatever batches are waiting.
pub(super) fn write_loop(
    mut store: Store,
    mut jobs: mpsc::Receiver<Job>,
    max_group_records: usize,
    mut parquet: Option<PartitionedWriter>,
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
        let inserted = store.insert_group_then(&batches, |results| match &mut parquet {
            Some(w) => write_parquet(w, &group, results),
            None => Ok(()),
        });
        match inserted {
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

/// Write the records of the batches the store is about to commit as
/// Parquet and finish the files, before the store's transaction commits.
/// A batch whose id was committed before (`Ok(0)`: a resend after a lost
/// acknowledgement) is in a finished file already and is not written again.
/// On failure the files of this group are removed and the error rolls the
/// store's transaction back, batch ids included: the senders retry, and
/// their records are in neither the store nor a finished file.
fn write_parquet(
    w: &mut PartitionedWriter,
    group: &[Job],
    results: &[Result<u64, StoreError>],
) -> Result<(), StoreError> {
    let stored: Vec<&cpt_sdk::Record> = group
        .iter()
        .zip(results)
        .filter(|(_, r)| matches!(r, Ok(n) if *n > 0))
        .flat_map(|(job, _)| job.records.iter().flatten())
        .collect();
    if stored.is_empty() {
        return Ok(());
    }
    let outcome = w.write_refs(&stored).and_then(|()| w.finish());
    outcome.map(drop).map_err(|e| {
        w.discard();
        StoreError::Parquet {
            dir: w.dir().to_path_buf(),
            message: e.to_string(),
        }
    })
}
