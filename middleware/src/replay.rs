//! The replay cache of [`ForceAuth`](crate::ForceAuth): the MACs of the force
//! credentials a process accepted, until they expire, and optionally a
//! journal of them in a state directory so that a restart forgets none.
//!
//! # The journal
//!
//! With a state directory ([`ForceAuth::with_replay_state_dir`](crate::ForceAuth::with_replay_state_dir),
//! `CPT_STATE_DIR`), the cache is loaded from `DIR/`[`JOURNAL_FILE`] when it
//! is made (entries already expired are skipped), and every credential it
//! accepts is appended there, one line each (`<MAC in hex> <expiry>`),
//! before the request it forces goes on. The file is rewritten with only the
//! unexpired entries once it holds more than twice as many lines as the
//! cache has entries (and [`COMPACT_SLACK`] more): it stays about as small
//! as the cache. Appends are plain writes, not fsynced: they survive the
//! process being killed or restarted, not the machine losing power within
//! the credential's lifetime.
//!
//! A journal that cannot be read or written never fails or blocks a request:
//! the cache goes on in memory, the first failure is logged (`WARN`, target
//! `cpt_middleware`, naming the file and what to check), and later appends
//! are tried again silently.
//!
//! One process keeps one cache per state directory, shared by every
//! `ForceAuth` given it. Two processes must not share a directory: each reads
//! the file only when it starts, so neither would see what the other
//! accepted since, and their rewrites would overwrite each other. The first
//! holds a lock on `DIR/`[`LOCK_FILE`] (with its pid in it) for as long as
//! it runs; a second one is refused the directory with an error naming it
//! and that pid (`ERROR`, target `cpt_middleware`), and remembers the
//! credentials it accepts in memory only.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cpt_sdk::force::MAX_TTL_SECS;

/// MACs of accepted credentials a process remembers, at most (see the
/// `ForceAuth` docs). 32 bytes and an expiry each: about 4 MiB when full.
pub const REPLAY_CACHE_CAPACITY: usize = 65_536;

/// Why the cache refuses a credential.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Accepted once already.
    Replayed,
    /// Full of unexpired credentials.
    Full,
}

/// The journal's file name in the state directory.
pub(crate) const JOURNAL_FILE: &str = "force-replay";

/// The lock file's name in the state directory: held by the process that
/// journals there, its pid inside.
pub(crate) const LOCK_FILE: &str = "lock";

/// Lines beyond twice the live entries the journal may hold before it is
/// rewritten.
pub(crate) const COMPACT_SLACK: usize = 1024;

/// The MACs accepted and not yet expired (see the module docs).
#[derive(Debug)]
pub(crate) struct ReplayCache {
    seen: HashMap<[u8; 32], u64>,
    capacity: usize,
    journal: Option<Journal>,
}

impl ReplayCache {
    /// An in-memory cache of at most `capacity` entries.
    pub(crate) fn new(capacity: usize) -> ReplayCache {
        ReplayCache {
            seen: HashMap::new(),
            capacity: capacity.max(1),
            journal: None,
        }
    }

    /// A cache of at most `capacity` entries journaled under `dir`, loaded
    /// with the entries still valid at `now` (Unix seconds).
    pub(crate) fn journaled(dir: &Path, capacity: usize, now: u64) -> ReplayCache {
        let mut cache = ReplayCache::new(capacity);
        let lock = match lock_dir(dir) {
            Ok(lock) => lock,
            Err(message) => {
                tracing::error!(target: "cpt_middleware", "cpt: {message}");
                return cache;
            }
        };
        let mut journal = Journal {
            path: dir.join(JOURNAL_FILE),
            file: None,
            lines: 0,
            lines_at_purge: 0,
            warned: false,
            _lock: lock,
        };
        match journal.load(now) {
            Ok((lines, entries)) => {
                journal.lines = lines;
                journal.lines_at_purge = lines;
                for (tag, expires) in entries {
                    if cache.seen.len() < cache.capacity {
                        cache.seen.insert(tag, expires);
                    }
                }
            }
            Err(e) => journal.warn("reading", &e),
        }
        cache.journal = Some(journal);
        cache
    }

    /// Remember `tag` until `expires`; `Err` when it was seen or there is no
    /// room.
    pub(crate) fn insert(&mut self, tag: [u8; 32], expires: u64, now: u64) -> Result<(), Refused> {
        if self.seen.contains_key(&tag) {
            return Err(Refused::Replayed);
        }
        if self.seen.len() >= self.capacity {
            self.seen.retain(|_, e| *e >= now);
            if self.seen.len() >= self.capacity {
                return Err(Refused::Full);
            }
        }
        self.seen.insert(tag, expires);
        if let Some(journal) = &mut self.journal {
            journal.append(&tag, expires, now, &mut self.seen);
        }
        Ok(())
    }
}

/// A journal entry: a credential's MAC and its expiry (Unix seconds).
type Entry = ([u8; 32], u64);

/// The file behind a journaled cache.
#[derive(Debug)]
struct Journal {
    path: PathBuf,
    /// Open for appending once the first append needs it.
    file: Option<File>,
    /// Lines in the file.
    lines: usize,
    /// `lines` when expired entries were last dropped from the cache.
    lines_at_purge: usize,
    /// A failure was logged.
    warned: bool,
    /// The directory's lock, held while the journal is (`None`: the file
    /// system cannot lock).
    _lock: Option<File>,
}

/// Take the lock that keeps `dir` to this process, writing the pid into
/// it: `Ok(None)` where the file system cannot lock (the journal is kept
/// all the same), `Err` with what to tell the operator when another process
/// holds it.
fn lock_dir(dir: &Path) -> Result<Option<File>, String> {
    let path = dir.join(LOCK_FILE);
    let Ok(mut file) = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
    else {
        // Not even the lock file: the journal's own first use says why.
        return Ok(None);
    };
    match file.try_lock() {
        Ok(()) => {
            let _ = file
                .set_len(0)
                .and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()));
            Ok(Some(file))
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = std::io::Read::read_to_string(&mut file, &mut holder);
            let holder = match holder.trim() {
                "" => "another process".to_owned(),
                pid => format!("another process (pid {pid})"),
            };
            Err(format!(
                "the state directory {} (CPT_STATE_DIR) is in use by {holder}; two processes \
                 sharing it would each miss the force credentials the other accepted. Give each \
                 process a directory of its own. Credentials this process accepts are remembered \
                 in memory only, so a restart within their lifetime would accept them again",
                dir.display()
            ))
        }
        Err(std::fs::TryLockError::Error(_)) => Ok(None),
    }
}

impl Journal {
    /// The file's lines and its entries valid at `now` (a missing file is
    /// empty; malformed lines are skipped).
    fn load(&self, now: u64) -> std::io::Result<(usize, Vec<Entry>)> {
        let file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, Vec::new())),
            Err(e) => return Err(e),
        };
        let mut lines = 0;
        let mut entries = Vec::new();
        for line in BufReader::new(file).lines() {
            let line = line?;
            lines += 1;
            let Some((tag, expires)) = line.split_once(' ') else {
                continue;
            };
            let (Some(tag), Ok(expires)) = (
                cpt_sdk::force::decode_hex(tag),
                expires.trim().parse::<u64>(),
            ) else {
                continue;
            };
            // A credential expiring further ahead than any service accepts
            // is no credential this cache accepted.
            if expires >= now && expires <= now.saturating_add(MAX_TTL_SECS) {
                entries.push((tag, expires));
            }
        }
        Ok((lines, entries))
    }

    /// Append one entry, or rewrite the file with the unexpired entries of
    /// `seen` when it has grown long (expired ones are dropped from `seen`
    /// then too).
    fn append(
        &mut self,
        tag: &[u8; 32],
        expires: u64,
        now: u64,
        seen: &mut HashMap<[u8; 32], u64>,
    ) {
        // Every COMPACT_SLACK appends, forget what expired, so the file
        // shrinks with the credentials' lifetimes and not only when the
        // cache is full.
        let long = |lines: usize, live: usize| lines >= 2 * live + COMPACT_SLACK;
        if long(self.lines, seen.len()) || self.lines >= self.lines_at_purge + COMPACT_SLACK {
            seen.retain(|_, e| *e >= now);
            self.lines_at_purge = self.lines;
        }
        let result = if long(self.lines, seen.len()) {
            self.rewrite(seen)
        } else {
            self.write_line(tag, expires)
        };
        if let Err(e) = result {
            // The file no longer matches what was written: start over with
            // a rewrite at the next append.
            self.file = None;
            self.lines = usize::MAX / 4;
            self.warn("writing", &e);
        }
    }

    fn write_line(&mut self, tag: &[u8; 32], expires: u64) -> std::io::Result<()> {
        if self.file.is_none() {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            self.file = Some(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.path)?,
            );
        }
        let file = self.file.as_mut().expect("opened above");
        file.write_all(line(tag, expires).as_bytes())?;
        self.lines += 1;
        Ok(())
    }

    /// Write `seen` to a temporary file and rename it over the journal.
    fn rewrite(&mut self, seen: &HashMap<[u8; 32], u64>) -> std::io::Result<()> {
        self.file = None;
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension("tmp");
        let mut text = String::with_capacity(seen.len() * 76);
        for (tag, expires) in seen {
            text.push_str(&line(tag, *expires));
        }
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.path)?;
        self.lines = seen.len();
        self.lines_at_purge = self.lines;
        Ok(())
    }

    fn warn(&mut self, doing: &str, e: &std::io::Error) {
        if std::mem::replace(&mut self.warned, true) {
            return;
        }
        tracing::warn!(
            target: "cpt_middleware",
            "cpt: {doing} the force replay journal {} failed: {e}. Credentials accepted from \
             now on are remembered in memory only, so a restart within their lifetime would \
             accept them again; check that the state directory (CPT_STATE_DIR) is a writable \
             directory of this service's own",
            self.path.display()
        );
    }
}

/// One journal line.
fn line(tag: &[u8; 32], expires: u64) -> String {
    let mut s = String::with_capacity(64 + 22);
    for b in tag {
        s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        s.push(char::from(b"0123456789abcdef"[usize::from(b & 0xf)]));
    }
    s.push(' ');
    s.push_str(&expires.to_string());
    s.push('\n');
    s
}

/// The process-wide in-memory cache.
pub(crate) fn process_cache() -> Arc<Mutex<ReplayCache>> {
    static CACHE: OnceLock<Arc<Mutex<ReplayCache>>> = OnceLock::new();
    CACHE
        .get_or_init(|| Arc::new(Mutex::new(ReplayCache::new(REPLAY_CACHE_CAPACITY))))
        .clone()
}

/// The process's cache journaled under `dir` (one per directory).
pub(crate) fn journaled_cache(dir: &Path) -> Arc<Mutex<ReplayCache>> {
    type Registry = Mutex<HashMap<PathBuf, Arc<Mutex<ReplayCache>>>>;
    static CACHES: OnceLock<Registry> = OnceLock::new();
    // Made first, so that the directory has one name whether or not it
    // existed (a failure shows, and is logged, at the journal's first use).
    let _ = std::fs::create_dir_all(dir);
    let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut caches = CACHES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    caches
        .entry(key)
        .or_insert_with(|| {
            Arc::new(Mutex::new(ReplayCache::journaled(
                dir,
                REPLAY_CACHE_CAPACITY,
                cpt_sdk::force::now_unix_secs(),
            )))
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_directory_another_process_holds_is_refused_naming_it_and_the_process() {
        let dir = tempfile::tempdir().unwrap();
        // Another process's lock: a lock on an open file of its own.
        let mut other = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join(LOCK_FILE))
            .unwrap();
        other.try_lock().unwrap();
        other.write_all(b"4242\n").unwrap();
        let message = lock_dir(dir.path()).unwrap_err();
        assert!(
            message.contains(&dir.path().display().to_string()) && message.contains("pid 4242"),
            "{message}"
        );
        // Refused, it journals nothing (in memory only).
        let mut cache = ReplayCache::journaled(dir.path(), 8, 1_000);
        assert!(cache.journal.is_none());
        cache.insert(tag(1), 2_000, 1_000).unwrap();
        assert!(!dir.path().join(JOURNAL_FILE).exists());
        // Once it is gone, the directory is this process's, its pid inside.
        drop(other);
        let mut cache = ReplayCache::journaled(dir.path(), 8, 1_000);
        assert!(cache.journal.is_some());
        cache.insert(tag(2), 2_000, 1_000).unwrap();
        assert!(dir.path().join(JOURNAL_FILE).exists());
        assert_eq!(
            std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap(),
            format!("{}\n", std::process::id())
        );
    }

    const NOW: u64 = 1_800_000_000;

    fn tag(i: u8) -> [u8; 32] {
        [i; 32]
    }

    #[test]
    fn a_journaled_cache_remembers_across_a_restart_until_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let mut before = ReplayCache::journaled(dir.path(), 16, NOW);
        assert_eq!(before.insert(tag(1), NOW + 300, NOW), Ok(()));
        assert_eq!(before.insert(tag(2), NOW + 10, NOW), Ok(()));
        drop(before);
        // A restart: a new cache from the same directory.
        let mut after = ReplayCache::journaled(dir.path(), 16, NOW + 60);
        assert_eq!(
            after.insert(tag(1), NOW + 300, NOW + 60),
            Err(Refused::Replayed)
        );
        // tag(2) expired before the restart: forgotten, and refused anyway
        // by its expiry before it reaches the cache.
        assert_eq!(after.insert(tag(2), NOW + 10, NOW + 60), Ok(()));
        // Without the journal, the restart forgets.
        let mut memory = ReplayCache::new(16);
        assert_eq!(memory.insert(tag(1), NOW + 300, NOW + 60), Ok(()));
    }

    #[test]
    fn the_journal_keeps_about_the_live_entries_as_credentials_expire() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = ReplayCache::journaled(dir.path(), 1 << 16, NOW);
        let path = dir.path().join(JOURNAL_FILE);
        let mut longest = 0;
        // One credential every 10 s, each living 60 s: at most 7 alive.
        for i in 0..(5 * COMPACT_SLACK as u64) {
            let mut t = [0u8; 32];
            t[..8].copy_from_slice(&i.to_le_bytes());
            let now = NOW + 10 * i;
            assert_eq!(c.insert(t, now + 60, now), Ok(()));
            longest = longest.max(c.journal.as_ref().unwrap().lines);
        }
        assert!(
            longest <= 3 * COMPACT_SLACK,
            "the journal grew to {longest} lines"
        );
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        assert_eq!(lines, c.journal.as_ref().unwrap().lines);
        assert!(c.seen.len() <= COMPACT_SLACK + 7, "{}", c.seen.len());
        // The last one is still refused after a restart.
        let last = 5 * COMPACT_SLACK as u64 - 1;
        let mut t = [0u8; 32];
        t[..8].copy_from_slice(&last.to_le_bytes());
        let now = NOW + 10 * last;
        drop(c); // the process that held the directory ends
        let mut again = ReplayCache::journaled(dir.path(), 16, now);
        assert_eq!(again.insert(t, now + 60, now), Err(Refused::Replayed));
    }

    #[test]
    fn an_unwritable_journal_never_refuses_a_credential() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the directory should be: nothing can be created in it.
        let blocked = dir.path().join("not-a-dir");
        std::fs::write(&blocked, b"x").unwrap();
        let mut c = ReplayCache::journaled(&blocked, 16, NOW);
        assert_eq!(c.insert(tag(1), NOW + 60, NOW), Ok(()));
        assert_eq!(c.insert(tag(2), NOW + 60, NOW), Ok(()));
        // Still once, in memory.
        assert_eq!(c.insert(tag(1), NOW + 60, NOW), Err(Refused::Replayed));
    }

    #[test]
    fn malformed_and_far_future_journal_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let good = line(&tag(1), NOW + 60);
        let far = line(&tag(2), NOW + MAX_TTL_SECS + 60);
        std::fs::write(
            dir.path().join(JOURNAL_FILE),
            format!("garbage\n{good}zz 12\n{far}"),
        )
        .unwrap();
        let c = ReplayCache::journaled(dir.path(), 16, NOW);
        assert_eq!(c.seen.len(), 1);
        assert!(c.seen.contains_key(&tag(1)));
    }
}
