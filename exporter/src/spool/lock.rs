//! One process per spool directory: the `lock` file.
//!
//! [`Spool::open`](super::Spool::open) takes an exclusive lock on
//! `DIR/lock` (the operating system's advisory file lock, `flock` on Unix,
//! `LockFileEx` on Windows) and writes its process id there; the lock is
//! held as long as the spool is open and released by the operating system
//! when the process ends, however it ends, so a crash leaves no stale lock.
//! A second process that opens the same directory is refused with
//! [`SpoolError::Locked`], naming the directory and the pid the holder wrote.
//! Two processes appending to and replaying one spool would each replay
//! (and delete) what the other wrote, and their cursors would disagree.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::Path;

use super::{SpoolError, io_err};

/// The lock file's name in the spool directory.
pub(crate) const LOCK_FILE: &str = "lock";

/// The held lock: released when dropped (the file is closed).
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: File,
}

impl DirLock {
    /// Lock `dir` for this process, or say which process holds it.
    pub(crate) fn acquire(dir: &Path) -> Result<DirLock, SpoolError> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err(&path, "open the lock file"))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(SpoolError::Locked {
                    dir: dir.to_path_buf(),
                    pid: text.trim().parse().ok(),
                });
            }
            Err(TryLockError::Error(e)) => return Err(io_err(&path, "lock the lock file")(e)),
        }
        let mut write = || {
            file.set_len(0)?;
            file.seek(SeekFrom::Start(0))?;
            writeln!(file, "{}", std::process::id())?;
            file.sync_data()
        };
        write().map_err(io_err(&path, "write this process's id in the lock file"))?;
        Ok(DirLock { _file: file })
    }
}
