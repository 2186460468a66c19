//! Keeping a store's WAL short: passive checkpoints on a background thread,
//! truncation once they catch up (see the parent module's "The WAL").

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// How often the background checkpointer runs.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);

/// WAL frames (pages) a passive checkpoint may leave uncopied for the
/// truncation to be tried: what the truncation then copies while it holds
/// the write lock.
const TRUNCATE_WITHIN_FRAMES: i64 = 4096;

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

/// One passive checkpoint; then, when it left at most
/// [`TRUNCATE_WITHIN_FRAMES`] uncopied, a truncation.
///
/// Under steady writes a passive checkpoint never quite catches up (the
/// writer appends while it copies), and SQLite only starts the WAL over when
/// a write begins with the whole WAL copied: the WAL would grow for as long
/// as the writes go on. The truncation takes the write lock between two
/// writes (never waiting for it), copies the little that is left and resets
/// the file; a writer that comes meanwhile waits for that copy only.
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
        && log - done <= TRUNCATE_WITHIN_FRAMES
    {
        // Nearly caught up: finish and cut the file back (fails at once,
        // harmlessly, while a writer or reader is in a transaction).
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
