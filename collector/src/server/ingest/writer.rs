//! The single writer thread: group commit of whatever batches are waiting
//! (step 3 of the parent module's "How a batch flows").
//!
//! With `--parquet-dir`, the new batches of a group (not those whose batch
//! id was committed before) are written as Parquet inside the store's
//! transaction, before it commits: one file per hour partition per group
//! (split past the size bound), for at most [`PARQUET_HOURS_PER_GROUP`]
//! hours, those with the most records; the records of a group's other
//! hours go to one file in `date=mixed/hour=mixed`
//! ([`crate::records::parquet::MIXED_PARTITION`]). However far apart the
//! start times of a group's records, it writes a bounded number of files.
//! Each is finished (footer, fsync, rename, fsync
//! of the directory) in the hidden staging directory, and moved into its
//! partition only once the store committed (`staging.rs`), before any batch
//! of the group is acknowledged. A failed Parquet write rolls the group
//! back (the senders retry); a failed commit deletes the staged files: a
//! record is in Parquet iff it is in the store, also after `kill -9`.
//! Under load a group holds
//! up to `max_group_records` records, so files grow with the load; at low
//! load files are small (one per group): the price of acknowledging only
//! what is in a finished file. `cpt export DIR --parquet-dir NEW` compacts
//! them.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::records::parquet::PartitionedWriter;
use crate::server::ingest::admission::Job;
use crate::server::ingest::once::OneSource;
use crate::server::ingest::staging::{self, Staged};
use crate::server::operations::retention::Upkeep;
use crate::server::store::{EncodedBatch, Store, StoreError};

/// Hour partitions one group commit writes Parquet files for, at most (see
/// the module docs).
pub(in crate::server) const PARQUET_HOURS_PER_GROUP: usize = 16;

/// The Parquet side of the writer: files staged under `root/.staging`.
#[derive(Debug)]
pub(in crate::server) struct ParquetOut {
    pub(in crate::server) root: std::path::PathBuf,
    /// Writes into `root/.staging`.
    pub(in crate::server) writer: PartitionedWriter,
    /// Reads the store's highest committed record id.
    pub(in crate::server) reader: rusqlite::Connection,
}

/// The single writer: group commit of whatever batches are waiting, and
/// between groups the store's upkeep ([`Upkeep::step`]: retention and
/// roll-ups, one small transaction at a time).
pub(in crate::server) fn write_loop(
    mut store: Store,
    mut jobs: mpsc::Receiver<Job>,
    max_group_records: usize,
    mut parquet: Option<ParquetOut>,
    mut upkeep: Upkeep,
    mut once: Option<OneSource>,
) {
    // Waits for the next batch with a timeout, so that upkeep also runs
    // while no batch comes. Without a timer (the runtime cannot start),
    // upkeep runs only between batches.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .inspect_err(|e| {
            crate::server::operations::errlog::error(
                "the store writer cannot start its timer",
                || format!("{e}; upkeep (retention, roll-ups) runs only between batches"),
            );
        })
        .ok();
    loop {
        let wait = upkeep.idle_for();
        let next = match &rt {
            _ if wait.is_zero() => match jobs.try_recv() {
                Ok(job) => Some(job),
                Err(mpsc::error::TryRecvError::Empty) => None,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
            },
            Some(rt) => {
                match rt.block_on(async { tokio::time::timeout(wait, jobs.recv()).await }) {
                    Ok(Some(job)) => Some(job),
                    Ok(None) => break,
                    Err(_) => None,
                }
            }
            None => match jobs.blocking_recv() {
                Some(job) => Some(job),
                None => break,
            },
        };
        if let Some(first) = next {
            commit_group(
                &mut store,
                &mut jobs,
                first,
                max_group_records,
                &mut parquet,
                once.as_mut(),
            );
        }
        upkeep.step(&mut store);
    }
}

/// Commit `first` and whatever else waits (up to `max_group_records`) in
/// one transaction, and acknowledge each batch.
fn commit_group(
    store: &mut Store,
    jobs: &mut mpsc::Receiver<Job>,
    first: Job,
    max_group_records: usize,
    parquet: &mut Option<ParquetOut>,
    once: Option<&mut OneSource>,
) {
    {
        // A group is one transaction, and the WAL holds all of it until
        // the next cut: its bytes are kept to an eighth of the length at
        // which the WAL is cut, so that a size-bounded store's WAL stays
        // within its share of the bound (one batch is always taken).
        let max_group_bytes = usize::try_from(store.wal_cut_bytes() / 8).unwrap_or(usize::MAX);
        let mut records = first.batch.len();
        let mut bytes = first.batch.bytes();
        let mut group = vec![first];
        while records < max_group_records && bytes < max_group_bytes {
            match jobs.try_recv() {
                Ok(job) => {
                    records += job.batch.len();
                    bytes += job.batch.bytes();
                    group.push(job);
                }
                Err(_) => break,
            }
        }
        // Records whose request the other source stored already are taken
        // out before the group is written, here and to Parquet alike.
        let noted = once.as_ref().map(|o| o.filter(&mut group));
        let batches: Vec<&EncodedBatch> = group.iter().map(|j| &j.batch).collect();
        let mut staged: Option<Staged> = None;
        let inserted = store.insert_group_then(&batches, |results| match parquet {
            Some(out) => {
                staged = write_parquet(out, &group, results)?;
                Ok(())
            }
            None => Ok(()),
        });
        if let (Some(out), Some(staged)) = (&*parquet, &staged) {
            if inserted.is_ok() {
                // Committed: into place before the acknowledgement. A failed
                // move leaves the manifest; the next start moves them.
                if let Err(e) = staging::publish(&out.root, staged) {
                    crate::server::operations::errlog::error(
                        "moving committed Parquet files into place failed",
                        || format!("{e} (the next start of cpt serve moves them)"),
                    );
                }
            } else {
                staging::discard(&out.root, staged);
            }
        }
        match inserted {
            Ok(results) => {
                if let (Some(once), Some(noted)) = (once, noted) {
                    once.committed(noted, &results);
                }
                let later_uses: Vec<(&str, u64)> = group
                    .iter()
                    .flat_map(|j| &j.later_uses)
                    .map(|u| (u.nonce.as_str(), u.start_unix_nanos))
                    .collect();
                if !later_uses.is_empty()
                    && let Err(e) = store.mark_replayed(&later_uses)
                {
                    crate::server::operations::errlog::error(
                        "labelling replayed forced records failed",
                        || e.to_string(),
                    );
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

/// Write the records of the batches the store is about to commit as
/// Parquet, finished in the staging directory with a manifest, before the
/// store's transaction commits. A batch whose id was committed before
/// (`Ok(0)`: a resend after a lost acknowledgement) is in Parquet already
/// and is not written again. On failure the group's files are removed and
/// the error rolls the store's transaction back, batch ids included: the
/// senders retry, and their records are in neither place.
fn write_parquet(
    out: &mut ParquetOut,
    group: &[Job],
    results: &[Result<u64, StoreError>],
) -> Result<Option<Staged>, StoreError> {
    let stored: Vec<&cpt_sdk::Record> = group
        .iter()
        .zip(results)
        .filter(|(_, r)| matches!(r, Ok(n) if *n > 0))
        .flat_map(|(job, _)| job.records.iter().flatten())
        .collect();
    if stored.is_empty() {
        return Ok(None);
    }
    let failed = |message: String| StoreError::Parquet {
        dir: out.root.clone(),
        message,
    };
    // Nothing commits while this runs: the highest id committed now is the
    // one before this group's records.
    let before = staging::max_id(&out.reader).map_err(failed)?;
    let w = &mut out.writer;
    let files = match w.write_refs(&stored).and_then(|()| w.finish()) {
        Ok(files) => files,
        Err(e) => {
            w.discard();
            return Err(failed(e.to_string()));
        }
    };
    // A failure removes the staged files and their directories.
    staging::stage(w.dir(), &files, before, stored.len() as u64)
        .map(Some)
        .map_err(failed)
}

/// Remove the hidden `.part-*.parquet.tmp` files a killed collector left
/// under `dir` (files of groups that never committed: no acknowledged
/// record is only in one). Returns how many were removed.
pub(in crate::server) fn remove_stale_temp_files(dir: &Path) -> std::io::Result<usize> {
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
