//! The single writer thread: group commit of whatever batches are waiting
//! (step 3 of the parent module's "How a batch flows").
//!
//! With `--parquet-dir`, the batches the store committed are then written
//! as Parquet, one file per hour partition per group (split past the size
//! bound), each finished (footer, fsync, rename, fsync of the directory)
//! before any batch of the group is acknowledged. Under load a group holds
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
        match store.insert_group(&batches) {
            Ok(mut results) => {
                if let Some(w) = &mut parquet {
                    write_parquet(w, &group, &mut results);
                }
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

/// Write the records of the batches the store committed as Parquet and
/// finish the files; on failure those batches' results become the error
/// (the senders retry; their records are in the store already, and in no
/// finished Parquet file).
fn write_parquet(
    w: &mut PartitionedWriter,
    group: &[Job],
    results: &mut [Result<u64, StoreError>],
) {
    let stored: Vec<&cpt_sdk::Record> = group
        .iter()
        .zip(results.iter())
        .filter(|(_, r)| r.is_ok())
        .flat_map(|(job, _)| job.records.iter().flatten())
        .collect();
    if stored.is_empty() {
        return;
    }
    let outcome = w.write_refs(&stored).and_then(|()| w.finish());
    if let Err(e) = outcome {
        w.discard();
        for r in results.iter_mut().filter(|r| r.is_ok()) {
            *r = Err(StoreError::Parquet {
                dir: w.dir().to_path_buf(),
                message: e.to_string(),
            });
        }
    }
}
