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

use std::path::Path;
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

/// Remove the hidden `.part-*.parquet.tmp` files a killed collector left
/// under `dir` (files of groups that never committed: no acknowledged
/// record is only in one). Returns how many were removed.
pub(super) fn remove_stale_temp_files(dir: &Path) -> std::io::Result<usize> {
    let mut removed = 0;
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() && name.starts_with(".part-") && name.ends_with(".parquet.tmp")
            {
                std::fs::remove_file(entry.path())?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    #[test]
    fn stale_parquet_temp_files_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let hour = dir.path().join("date=2026-01-01/hour=03");
        std::fs::create_dir_all(&hour).unwrap();
        for name in [
            ".part-a.parquet.tmp",
            ".part-b.parquet.tmp",
            "part-c.parquet",
            "notes.tmp",
        ] {
            std::fs::write(hour.join(name), b"x").unwrap();
        }
        std::fs::write(dir.path().join(".part-top.parquet.tmp"), b"x").unwrap();
        assert_eq!(super::remove_stale_temp_files(dir.path()).unwrap(), 3);
        let mut left: Vec<_> = std::fs::read_dir(&hour)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["notes.tmp", "part-c.parquet"]);
        assert_eq!(
            super::remove_stale_temp_files(&dir.path().join("missing")).unwrap(),
            0
        );
    }
}
