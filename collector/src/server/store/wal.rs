//! Keeping a store's WAL short (see the parent module's "The WAL").
//!
//! Two parties share the work:
//!
//! - the **checkpointer**, a background thread with its own connection,
//!   runs passive checkpoints (which never block the writer or readers):
//!   every few milliseconds while writes go on, every [`CHECKPOINT_EVERY`]
//!   otherwise;
//! - the **writer** (the connection that inserts) cuts the WAL back, between
//!   two of its transactions, once a passive checkpoint has copied all but
//!   [`CUT_WITHIN_FRAMES`] of a WAL longer than [`JOURNAL_SIZE_LIMIT`].
//!
//! Under steady writes a passive checkpoint never quite finishes (the writer
//! appends while it copies) and SQLite starts the WAL over only when a write
//! begins with the whole WAL copied and no reader in it: the WAL would grow
//! for as long as the writes go on. A truncating checkpoint needs the write
//! lock, which a busy writer almost never leaves free for another
//! connection to take; the writer takes no lock to cut between its own
//! transactions, and the cut copies only the little the last passive
//! checkpoint left, so the writes wait for that copy only. Readers take
//! short snapshots, and the cut waits at most [`CUT_WAIT`] for the ones in
//! progress; when they are not done by then it leaves the WAL to the next
//! cut.
//!
//! When the passive checkpoints fall behind for good (writes faster than
//! the disk can take them twice), the WAL reaching [`WAL_HARD_LIMIT`] makes
//! the writer cut it whatever the backlog: writes then wait for the copy,
//! which slows the senders down instead of letting the WAL fill the disk.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

/// How often the background checkpointer runs while nothing is written.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);

/// The pause between two passive checkpoints while writes go on.
const BACKLOG_PAUSE: Duration = Duration::from_millis(10);

/// WAL frames (pages) a passive checkpoint may leave uncopied for the writer
/// to cut the WAL: what the cut then copies while the writes wait.
pub(super) const CUT_WITHIN_FRAMES: i64 = 4096;

/// The size a WAL file is cut back to when it is reset
/// (`journal_size_limit`); a WAL no longer than this is left alone.
pub(super) const JOURNAL_SIZE_LIMIT: i64 = 64 << 20;

/// A WAL this long is cut by the writer whatever the backlog.
pub(super) const WAL_HARD_LIMIT: u64 = 768 << 20;

/// How long a cut waits for the readers in the WAL to finish their snapshot.
pub(super) const CUT_WAIT: Duration = Duration::from_millis(100);

/// How long a cut of a WAL at [`Limits::hard_limit`] waits for the
/// checkpointer's passive checkpoint to let go of the checkpoint lock. The
/// checkpointer copies pages and syncs the file while it holds it, which
/// on a disk busy with other writes takes longer than [`CUT_WAIT`]; giving
/// up then would let the writer append past the limit, transaction after
/// transaction.
pub(super) const CHECKPOINTER_WAIT: Duration = Duration::from_secs(5);

/// The busy timeout of the writer's connection outside a cut.
pub(super) const WRITER_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// When the WAL is cut: the defaults are the constants above; tests set
/// small ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Limits {
    /// A WAL file no longer than this is left alone (`journal_size_limit`).
    pub(super) journal_size_limit: u64,
    /// The most frames a passive checkpoint may leave for the writer's cut.
    pub(super) cut_within_frames: i64,
    /// A WAL this long is cut whatever the backlog.
    pub(super) hard_limit: u64,
    /// How often the checkpointer runs while it has nothing left to copy.
    pub(super) checkpoint_every: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            journal_size_limit: JOURNAL_SIZE_LIMIT as u64,
            cut_within_frames: CUT_WITHIN_FRAMES,
            hard_limit: WAL_HARD_LIMIT,
            checkpoint_every: CHECKPOINT_EVERY,
        }
    }
}

/// What the checkpointer and the writer share.
#[derive(Debug, Default)]
struct Shared {
    /// Set by the checkpointer: the WAL is long and nearly all copied.
    cut_wanted: AtomicBool,
    /// Cuts done by the writer (for tests and statistics).
    cuts: AtomicU64,
    /// Frames in the WAL after the writer's last commit (0 after a cut).
    frames: AtomicU64,
    /// Frames the writer's last commit appended to the WAL.
    last_commit_frames: AtomicU64,
    stop: Mutex<bool>,
    wake: Condvar,
}

/// The WAL upkeep of one store opened for writing: the background
/// checkpointer (stopped when this is dropped) and the writer's side.
#[derive(Debug)]
pub(super) struct Wal {
    shared: Arc<Shared>,
    wal_path: PathBuf,
    limits: Limits,
    /// A WAL frame's length: the page size and the frame header.
    frame_bytes: u64,
    thread: Option<thread::JoinHandle<()>>,
}

/// The `-wal` file beside a database.
pub(super) fn wal_path(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push("-wal");
    PathBuf::from(s)
}

fn wal_len(wal: &Path) -> u64 {
    std::fs::metadata(wal).map_or(0, |m| m.len())
}

impl Wal {
    /// Start checkpointing the store at `path`. When the thread cannot open
    /// its connection it ends, and the WAL is then cut by the writer at
    /// [`WAL_HARD_LIMIT`] only.
    pub(super) fn start(path: &Path, writer: &mut Connection, limits: Limits) -> Wal {
        let shared = Arc::new(Shared::default());
        let wal_path = wal_path(path);
        // Count what each of the writer's commits appends: SQLite reports
        // the frames in the WAL after each commit. A count lower than the
        // last one means the WAL started over (after a checkpoint copied
        // all of it), and this commit wrote all of them.
        let counts = shared.clone();
        let watched = writer.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages| {
            let now = u64::try_from(pages).unwrap_or(0);
            let before = counts.frames.swap(now, Ordering::Relaxed);
            let appended = if now >= before { now - before } else { now };
            counts.last_commit_frames.store(appended, Ordering::Relaxed);
            Ok(())
        }));
        if watched.is_err() {
            // Unknown: deletions for size then go in the smallest
            // transactions.
            shared.last_commit_frames.store(u64::MAX, Ordering::Relaxed);
        }
        let page = writer
            .query_row("PRAGMA page_size", [], |r| r.get::<_, u32>(0))
            .map_or(64 << 10, u64::from);
        let thread = {
            let shared = shared.clone();
            let path = path.to_path_buf();
            let wal_path = wal_path.clone();
            thread::Builder::new()
                .name("cpt-store-checkpoint".into())
                .spawn(move || checkpoint_loop(&path, &wal_path, &shared, limits))
                .ok()
        };
        Wal {
            shared,
            wal_path,
            limits,
            frame_bytes: page + 24,
            thread,
        }
    }

    /// The bytes the writer's last commit appended to the WAL (`None` when
    /// SQLite does not report them).
    pub(super) fn last_commit_bytes(&self) -> Option<u64> {
        match self.shared.last_commit_frames.load(Ordering::Relaxed) {
            u64::MAX => None,
            frames => Some(frames * self.frame_bytes),
        }
    }

    /// The writer's side, called on the writer's connection between two
    /// transactions: cut the WAL back when the checkpointer found it nearly
    /// copied, or when it has reached [`WAL_HARD_LIMIT`] (a cut may still
    /// leave the WAL to the next one when readers hold it past
    /// [`CUT_WAIT`]).
    pub(super) fn maintain(&self, writer: &Connection) {
        let wanted = self.shared.cut_wanted.load(Ordering::Acquire);
        let at_limit = wal_len(&self.wal_path) >= self.limits.hard_limit;
        if !wanted && !at_limit {
            return;
        }
        let checkpointer_wait = if at_limit {
            CHECKPOINTER_WAIT
        } else {
            CUT_WAIT
        };
        self.shared.cut_wanted.store(false, Ordering::Release);
        // Wait briefly for the readers in the WAL and for a passive
        // checkpoint in progress; then give up until the next time. SQLite
        // answers at once, without its busy handler, while another
        // connection (the checkpointer) runs a checkpoint: that is retried
        // here, a millisecond apart.
        let _ = writer.busy_timeout(CUT_WAIT);
        let started = Instant::now();
        loop {
            let cut = writer.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
            });
            match cut {
                Ok((0, _)) => self.shared.frames.store(0, Ordering::Relaxed),
                // Another checkpoint holds the checkpoint lock.
                Ok((_, -1)) if started.elapsed() < checkpointer_wait => {
                    thread::sleep(Duration::from_millis(1));
                    continue;
                }
                _ => {}
            }
            break;
        }
        let _ = writer.busy_timeout(WRITER_BUSY_TIMEOUT);
        self.shared.cuts.fetch_add(1, Ordering::Relaxed);
    }

    /// The WAL length at which the writer cuts it whatever the backlog.
    pub(super) fn hard_limit(&self) -> u64 {
        self.limits.hard_limit
    }

    /// Cuts the writer has made.
    #[cfg(test)]
    pub(super) fn cuts(&self) -> u64 {
        self.shared.cuts.load(Ordering::Relaxed)
    }
}

/// The checkpointer's loop: a passive checkpoint, then a pause (short while
/// writes go on), until stopped. While a cut is wanted it leaves the
/// WAL to the writer; when the writer has not cut within a second (it is
/// idle), it cuts the WAL itself, which then costs no writer anything.
fn checkpoint_loop(path: &Path, wal: &Path, shared: &Shared, limits: Limits) {
    let every = limits.checkpoint_every;
    let Ok(conn) = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    ) else {
        return;
    };
    // Never wait for a lock: a checkpoint that cannot run now runs next time.
    let _ = conn.busy_timeout(Duration::ZERO);
    let mut pause = every;
    let mut wanted_since: Option<Instant> = None;
    let mut stopped = shared.stop.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        let (s, _) = shared
            .wake
            .wait_timeout(stopped, pause)
            .unwrap_or_else(PoisonError::into_inner);
        stopped = s;
        if *stopped {
            return;
        }
        drop(stopped);
        pause = every;
        if shared.cut_wanted.load(Ordering::Acquire) {
            // Back to passive checkpoints as soon as the writer has cut.
            pause = BACKLOG_PAUSE;
            let since = *wanted_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_secs(1) {
                // The writer is idle: nothing to wait for.
                if truncate(&conn) {
                    shared.cut_wanted.store(false, Ordering::Release);
                    wanted_since = None;
                }
            }
        } else {
            wanted_since = None;
            let copied = passive(&conn);
            let writing = matches!(copied, Some((log, _)) if log > 0);
            let nearly = matches!(copied, Some((log, done))
                if log > 0 && log - done <= limits.cut_within_frames);
            // Nearly or wholly copied: cut the WAL now when nobody is in it
            // (a cut that waits for nothing), else leave a long one to the
            // writer.
            if nearly && !truncate(&conn) && wal_len(wal) > limits.journal_size_limit {
                shared.cut_wanted.store(true, Ordering::Release);
            } else if writing {
                // Writes go on: keep up with them.
                pause = BACKLOG_PAUSE;
            }
        }
        stopped = shared.stop.lock().unwrap_or_else(PoisonError::into_inner);
    }
}

/// One passive checkpoint: `(frames in the WAL, frames copied)`, or `None`
/// when it could not run.
fn passive(conn: &Connection) -> Option<(i64, i64)> {
    let (busy, log, done) = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .ok()?;
    (busy == 0 && log >= 0).then_some((log, done))
}

/// A truncating checkpoint that waits for nothing: true when the WAL was
/// copied and cut.
fn truncate(conn: &Connection) -> bool {
    matches!(
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r
            .get::<_, i64>(0)),
        Ok(0)
    )
}

impl Drop for Wal {
    fn drop(&mut self) {
        *self
            .shared
            .stop
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/src/operations/store.md` states the cut in pages and in MiB at
    /// a new store's page size: both must be this module's.
    #[test]
    fn the_store_page_states_the_cut_the_writer_makes() {
        let page = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/src/operations/store.md"
        ))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
        let pages = CUT_WITHIN_FRAMES.to_string();
        let pages = format!(
            "{} {}",
            &pages[..pages.len() - 3],
            &pages[pages.len() - 3..]
        );
        let mib = |page_size: i64| (CUT_WITHIN_FRAMES * page_size) >> 20;
        let said = format!(
            "at most {pages} pages uncopied ({} MiB with the {} KiB pages of a new store; {} MiB \
             in a store created with 4 KiB pages) of a WAL longer than {} MiB",
            mib(super::super::PAGE_SIZE),
            super::super::PAGE_SIZE >> 10,
            mib(4096),
            JOURNAL_SIZE_LIMIT >> 20,
        );
        assert!(page.contains(&said), "operations/store.md must say: {said}");
    }
}
