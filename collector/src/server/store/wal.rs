//! Keeping a store's WAL short: passive checkpoints on a background thread,
//! truncation once they catch up (see the parent module's "The WAL").

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// How often the background checkpointer runs.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// The size a WAL file is cut back to when it is reset (`journal_size_limit`).
pub(super) const JOURNAL_SIZE_LIMIT: i64 = 64 << 20;

/// The background checkpointer of one store; stops when dropped.
#[derive(Debug)]
pub(super) struct Checkpointer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Checkpointer {
    /// Checkpoint the store at `path` every `every` until dropped. When the
    /// thread cannot open its connection it ends, and the WAL is then only
    /// checkpointed when the last connection closes.
    pub(super) fn start(path: &Path, every: Duration) -> Checkpointer {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let path = path.to_path_buf();
        let thread = thread::Builder::new()
            .name("cpt-store-checkpoint".into())
            .spawn(move || {
                let Ok(conn) = Connection::open_with_flags(
                    &path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                ) else {
                    return;
                };
                // Never wait for a lock: a checkpoint that cannot run now
                // runs next time.
                let _ = conn.busy_timeout(Duration::ZERO);
                let (lock, cv) = &*flag;
                let mut stopped = lock.lock().unwrap_or_else(PoisonError::into_inner);
                loop {
                    let (s, _) = cv
                        .wait_timeout(stopped, every)
                        .unwrap_or_else(PoisonError::into_inner);
                    stopped = s;
                    if *stopped {
                        return;
                    }
                    drop(stopped);
                    checkpoint(&conn);
                    stopped = lock.lock().unwrap_or_else(PoisonError::into_inner);
                }
            })
            .ok();
        Checkpointer { stop, thread }
    }
}

/// One passive checkpoint; a truncation when it copied the whole WAL.
pub(super) fn checkpoint(conn: &Connection) {
    let passive = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    });
    if let Ok((0, log, done)) = passive
        && log > 0
        && log == done
    {
        // Caught up: cut the file back (fails at once, harmlessly, while a
        // writer or reader is in a transaction).
        let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(PoisonError::into_inner) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
