//! `--parquet-dir` holds a record iff the store does: a group's Parquet
//! files are finished in a hidden staging directory before the store's
//! transaction commits, and moved into the partitions only after it did.
//!
//! # How
//!
//! 1. Before the group, the writer notes the store's highest committed
//!    record id (`before`).
//! 2. Inside the transaction, before it commits, the group's new records
//!    are written as finished files (footer, fsync, rename from `.tmp`)
//!    under `DIR/.staging/date=…/hour=…/`, and a manifest
//!    `DIR/.staging/group-<unique>.manifest` names them with `before` and
//!    the number of records (fsynced).
//! 3. The transaction commits; then each staged file is renamed to the same
//!    path under `DIR` (an atomic rename on one file system), the
//!    directories fsynced, and the manifest deleted. Only then is the group
//!    acknowledged.
//!
//! A failed commit deletes the staged files and the manifest: the senders
//! retry, and their records are in neither place.
//!
//! # After a crash
//!
//! At start, every manifest left in `.staging` is settled: if the store's
//! highest record id reaches `before + records`, the group committed and its
//! files are moved into place; otherwise it did not, and they are deleted.
//! (The store has one writer, and nothing is settled while it writes, so no
//! other group can have inserted those ids.) Files in `.staging` without a
//! manifest (a crash before the manifest was written: the group never
//! committed) are deleted, and so are the directories left empty. Readers
//! skip `.staging`: hidden names are not records.
//!
//! Whatever happens to a group, the staging directory ends up as it was
//! before: publishing and discarding remove the partition directories the
//! group's files were in once they are empty, and a write that fails before
//! its manifest removes what it wrote (`PartitionedWriter::discard`).

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The staging directory's name under `--parquet-dir`.
pub(in crate::server) const STAGING: &str = ".staging";
const MANIFEST_SUFFIX: &str = ".manifest";

/// A read-only connection to the store, for [`max_id`].
pub(in crate::server) fn open_reader(store: &Path) -> Result<rusqlite::Connection, String> {
    rusqlite::Connection::open_with_flags(
        store,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("open the store {} to read: {e}", store.display()))
}

/// The store's highest committed record id (0 when empty): the highest
/// id given out, which retention may have deleted since, or a record too
/// old to keep raw had.
pub(in crate::server) fn max_id(conn: &rusqlite::Connection) -> Result<i64, String> {
    conn.query_row(
        "SELECT max(coalesce((SELECT max(id) FROM records), 0), \
                coalesce((SELECT value FROM store_state WHERE name = 'last_id'), 0))",
        [],
        |r| r.get(0),
    )
    .map_err(|e| format!("read the store's highest record id: {e}"))
}

/// A group's staged files, waiting for the store's commit.
#[derive(Debug)]
pub(in crate::server) struct Staged {
    manifest: PathBuf,
    /// Paths relative to the staging directory.
    files: Vec<PathBuf>,
}

fn io(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", path.display())
}

fn sync_dir(dir: &Path) -> Result<(), String> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("fsync", dir, e))
}

/// Write the manifest of a group whose finished `files` (under `staging`)
/// hold `records` records, the store's highest id being `before`.
pub(in crate::server) fn stage(
    staging: &Path,
    files: &[PathBuf],
    before: i64,
    records: u64,
) -> Result<Staged, String> {
    let rel: Vec<PathBuf> = files
        .iter()
        .map(|f| f.strip_prefix(staging).unwrap_or(f).to_path_buf())
        .collect();
    let manifest = staging.join(format!(
        "group-{}-{}{MANIFEST_SUFFIX}",
        std::process::id(),
        cpt_sdk::force::new_request_id()
    ));
    let mut text = format!("cpt-staging 1\nbefore {before}\nrecords {records}\n");
    for f in &rel {
        text.push_str(&format!("file {}\n", f.display()));
    }
    let written = fs::File::create(&manifest)
        .map_err(|e| io("create", &manifest, e))
        .and_then(|mut file| {
            file.write_all(text.as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| io("write", &manifest, e))
        })
        .and_then(|()| sync_dir(staging));
    let staged = Staged {
        manifest,
        files: rel,
    };
    match written {
        Ok(()) => Ok(staged),
        Err(e) => {
            discard(staging.parent().unwrap_or(staging), &staged);
            Err(e)
        }
    }
}

/// Remove the directories under `staging` that held `files` (relative to
/// it) once they are empty, deepest first; a directory still holding
/// something stays.
fn remove_empty_dirs(staging: &Path, files: &[PathBuf]) {
    let mut dirs = std::collections::BTreeSet::new();
    for f in files {
        let mut d = f.parent();
        while let Some(dir) = d.filter(|d| !d.as_os_str().is_empty()) {
            dirs.insert(dir.to_path_buf());
            d = dir.parent();
        }
    }
    let mut dirs: Vec<PathBuf> = dirs.into_iter().collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        let _ = fs::remove_dir(staging.join(d));
    }
}

/// Move a committed group's files into place and drop its manifest.
pub(in crate::server) fn publish(root: &Path, staged: &Staged) -> Result<(), String> {
    let staging = root.join(STAGING);
    let mut dirs = std::collections::BTreeSet::new();
    for rel in &staged.files {
        let from = staging.join(rel);
        let to = root.join(rel);
        if let Some(parent) = to.parent() {
            if !parent.is_dir() {
                fs::create_dir_all(parent).map_err(|e| io("create", parent, e))?;
                if let Some(grand) = parent.parent() {
                    dirs.insert(grand.to_path_buf());
                }
                dirs.insert(root.to_path_buf());
            }
            dirs.insert(parent.to_path_buf());
        }
        match fs::rename(&from, &to) {
            Ok(()) => {}
            // Moved before a crash, the manifest not yet deleted.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.exists() => {}
            Err(e) => return Err(io("move", &from, e)),
        }
    }
    for d in &dirs {
        sync_dir(d)?;
    }
    fs::remove_file(&staged.manifest).map_err(|e| io("remove", &staged.manifest, e))?;
    remove_empty_dirs(&staging, &staged.files);
    Ok(())
}

/// Delete an uncommitted group's files and manifest.
pub(in crate::server) fn discard(root: &Path, staged: &Staged) {
    let staging = root.join(STAGING);
    for rel in &staged.files {
        let _ = fs::remove_file(staging.join(rel));
    }
    let _ = fs::remove_file(&staged.manifest);
    remove_empty_dirs(&staging, &staged.files);
}

fn read_manifest(path: &Path) -> Option<(i64, u64, Vec<PathBuf>)> {
    let text = fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    if lines.next()? != "cpt-staging 1" {
        return None;
    }
    let before = lines.next()?.strip_prefix("before ")?.parse().ok()?;
    let records = lines.next()?.strip_prefix("records ")?.parse().ok()?;
    let files = lines
        .map(|l| l.strip_prefix("file ").map(PathBuf::from))
        .collect::<Option<Vec<_>>>()?;
    Some((before, records, files))
}

/// What settling the staging directory did at start.
#[derive(Debug, Default, PartialEq, Eq)]
pub(in crate::server) struct Settled {
    /// Groups that had committed: their files moved into place.
    pub(in crate::server) published: usize,
    /// Groups that had not: their files deleted.
    pub(in crate::server) discarded: usize,
    /// Staged files without a manifest, deleted.
    pub(in crate::server) orphans: usize,
    /// Directories left empty, removed.
    pub(in crate::server) empty_dirs: usize,
}

/// Settle what a stopped collector left in `root/.staging` (see the module
/// docs), given the store's highest committed record id.
pub(in crate::server) fn settle(root: &Path, committed: i64) -> Result<Settled, String> {
    let staging = root.join(STAGING);
    let mut settled = Settled::default();
    if !staging.is_dir() {
        return Ok(settled);
    }
    let mut manifests = Vec::new();
    for entry in fs::read_dir(&staging).map_err(|e| io("list", &staging, e))? {
        let path = entry.map_err(|e| io("list", &staging, e))?.path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().ends_with(MANIFEST_SUFFIX))
        {
            manifests.push(path);
        }
    }
    for manifest in manifests {
        let Some((before, records, files)) = read_manifest(&manifest) else {
            // Torn while written: the group never reached its commit.
            let _ = fs::remove_file(&manifest);
            continue;
        };
        let staged = Staged { manifest, files };
        let records = i64::try_from(records).unwrap_or(i64::MAX);
        if committed >= before.saturating_add(records) {
            publish(root, &staged)?;
            settled.published += 1;
        } else {
            discard(root, &staged);
            settled.discarded += 1;
        }
    }
    // Whatever is left was never named by a manifest; then the directories.
    let mut dirs = vec![staging.clone()];
    let mut seen = Vec::new();
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).map_err(|e| io("list", &d, e))? {
            let entry = entry.map_err(|e| io("list", &d, e))?;
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(path.clone());
                seen.push(path);
            } else {
                fs::remove_file(&path).map_err(|e| io("remove", &path, e))?;
                settled.orphans += 1;
            }
        }
    }
    // Listed parents first: children go first in reverse.
    for d in seen.iter().rev() {
        fs::remove_dir(d).map_err(|e| io("remove", d, e))?;
        settled.empty_dirs += 1;
    }
    Ok(settled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged_file(root: &Path, rel: &str) -> PathBuf {
        let p = root.join(STAGING).join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, b"parquet").unwrap();
        p
    }

    #[test]
    fn a_committed_group_is_moved_into_place_and_an_uncommitted_one_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let staging = root.join(STAGING);
        let a = staged_file(root, "date=2026-01-01/hour=00/part-a.parquet");
        stage(&staging, &[a], 10, 5).unwrap();
        let b = staged_file(root, "date=2026-01-01/hour=01/part-b.parquet");
        stage(&staging, &[b], 15, 5).unwrap();
        staged_file(root, "date=2026-01-01/hour=02/.part-c.parquet.tmp");
        // The store holds ids up to 15: the first group (11..=15) committed,
        // the second (16..=20) did not.
        let settled = settle(root, 15).unwrap();
        assert_eq!(
            settled,
            Settled {
                published: 1,
                discarded: 1,
                orphans: 1,
                // date=2026-01-01 and its hour=02 (hour=00 and hour=01
                // went when their groups were settled).
                empty_dirs: 2,
            }
        );
        assert!(
            root.join("date=2026-01-01/hour=00/part-a.parquet")
                .is_file()
        );
        assert!(!root.join("date=2026-01-01/hour=01/part-b.parquet").exists());
        let left: Vec<_> = fs::read_dir(&staging).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn publishing_twice_after_a_crash_mid_publish_is_harmless() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let staging = root.join(STAGING);
        let a = staged_file(root, "date=2026-01-01/hour=00/part-a.parquet");
        let staged = stage(&staging, std::slice::from_ref(&a), 0, 1).unwrap();
        // The file moved, then a crash before the manifest went.
        fs::create_dir_all(root.join("date=2026-01-01/hour=00")).unwrap();
        fs::rename(&a, root.join("date=2026-01-01/hour=00/part-a.parquet")).unwrap();
        assert_eq!(settle(root, 1).unwrap().published, 1);
        assert!(!staged.manifest.exists());
        assert!(
            root.join("date=2026-01-01/hour=00/part-a.parquet")
                .is_file()
        );
    }

    /// The entries under `d`, directories too.
    fn entries(d: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(entries(&p));
            }
            out.push(p);
        }
        out
    }

    #[test]
    fn publishing_or_discarding_a_group_leaves_staging_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let staging = root.join(STAGING);
        let files = [
            staged_file(root, "date=2026-01-01/hour=00/part-a.parquet"),
            staged_file(root, "date=2026-01-02/hour=05/part-b.parquet"),
        ];
        let published = stage(&staging, &files, 0, 2).unwrap();
        publish(root, &published).unwrap();
        assert_eq!(entries(&staging), Vec::<PathBuf>::new());
        assert!(
            root.join("date=2026-01-02/hour=05/part-b.parquet")
                .is_file()
        );
        let files = [staged_file(root, "date=mixed/hour=mixed/part-c.parquet")];
        let discarded = stage(&staging, &files, 2, 1).unwrap();
        discard(root, &discarded);
        assert_eq!(entries(&staging), Vec::<PathBuf>::new());
    }
}
