//! Keeping the store within its time and size bounds (`cpt serve
//! --retain-for`, `--max-store-bytes`), rolling records up before they go,
//! and the gauges `/metrics` reports.
//!
//! All of it runs on the writer thread, between group commits, one small
//! transaction at a time ([`Upkeep::step`]): ingest waits for at most one
//! such step, never for a whole pass. In order of urgency:
//! 1. under `max_store_bytes` (the database file plus the WAL): once the
//!    pages in use pass 90 % of the file's share ([`SizeShares`]), delete
//!    the records that started first, once rolled up, until they are back
//!    at 80 %: every step what arrived since the last and, for up to
//!    40 ms, what is owed besides, in transactions sized to the WAL's
//!    share; and while the file is over its share, give free pages back
//!    to the disk, a few a step;
//! 2. roll up what was committed since the last roll-up, at least every
//!    second (and at once when 20 000 records wait);
//! 3. every `interval` (and at start), a pass: delete raw records older
//!    than `retain_for`, merge hourly roll-ups into daily ones and drop
//!    roll-ups past theirs (under a size bound, in transactions sized as
//!    the deletions are), forget old batch ids, remove Parquet partitions
//!    past theirs.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::server::operations::errlog;
use crate::server::store::{Retention, Store, StoreError, unix_nanos};

/// How long something is kept: `forever`, or a duration (`7d`, `36h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Never deleted.
    Forever,
    /// Deleted once older than this.
    For(Duration),
}

impl Keep {
    /// Parse `forever` or a duration such as `7d`, `36h`, `90m`.
    ///
    /// # Errors
    ///
    /// Anything else, or a zero duration.
    pub fn parse(s: &str) -> Result<Keep, String> {
        if s.trim() == "forever" {
            return Ok(Keep::Forever);
        }
        let d = parse_duration(s)?;
        Ok(Keep::For(d))
    }

    /// The duration, `None` for [`Keep::Forever`].
    pub fn duration(self) -> Option<Duration> {
        match self {
            Keep::Forever => None,
            Keep::For(d) => Some(d),
        }
    }
}

/// A duration as its flags are written: `7d`, `36h`, `90m`, `45s`.
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Parse a positive duration such as `1s`, `90m`, `7d`.
///
/// # Errors
///
/// Not a duration, or zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration ({e}); write e.g. 90s, 30m, 36h, 7d"))?;
    if d.is_zero() {
        return Err(format!("{s:?}: must be more than zero"));
    }
    Ok(d)
}

/// Parse a size: a number with `B`, `KiB`, `MiB`, `GiB` or `TiB` (also
/// `KB`, `MB`, `GB`, `TB` as powers of 1 000).
///
/// # Errors
///
/// No number, an unknown unit, zero, or an overflow.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size; write e.g. 500MiB, 4GiB"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        u => {
            return Err(format!(
                "{s:?}: unknown unit {u:?}; use B, KiB, MiB, GiB or TiB"
            ));
        }
    };
    let bytes = n * mult as f64;
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{s:?}: must be at least one byte and fit 64 bits"));
    }
    Ok(bytes as u64)
}

/// What the collector keeps, and for how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Raw records whose start is older than this are deleted (after
    /// being rolled up); records arriving that old are rolled up and not
    /// kept raw (`too_old`).
    pub retain_for: Keep,
    /// The most the store takes on disk, the database file plus the WAL:
    /// the records that started first are deleted, once rolled up, to keep
    /// it there (three quarters of it for the file, the rest for the WAL:
    /// see the module docs).
    pub max_store_bytes: Option<u64>,
    /// How often the retention pass runs (it also runs at start).
    pub interval: Duration,
    /// Hourly roll-ups are merged into daily ones after this.
    pub hourly_rollups_for: Duration,
    /// Roll-ups are dropped after this.
    pub rollups_retain_for: Keep,
    /// Parquet partitions (`--parquet-dir`) are removed after this (`None`:
    /// as raw records, [`RetentionConfig::retain_for`]).
    pub parquet_retain_for: Option<Keep>,
}

/// `cpt serve --retain-for`'s default: 7 days.
pub const DEFAULT_RETAIN_FOR: Duration = Duration::from_secs(7 * 86_400);
/// `--retention-interval`'s default.
pub const DEFAULT_RETENTION_INTERVAL: Duration = Duration::from_secs(60);
/// `--hourly-rollups-for`'s default: 14 days.
pub const DEFAULT_HOURLY_ROLLUPS_FOR: Duration = Duration::from_secs(14 * 86_400);
/// `--rollups-retain-for`'s default: 400 days.
pub const DEFAULT_ROLLUPS_RETAIN_FOR: Duration = Duration::from_secs(400 * 86_400);

impl Default for RetentionConfig {
    /// `cpt serve`'s defaults: raw records 7 days, no size bound, a pass a
    /// minute, hourly roll-ups 14 days, roll-ups 400 days.
    fn default() -> Self {
        RetentionConfig {
            retain_for: Keep::For(DEFAULT_RETAIN_FOR),
            max_store_bytes: None,
            interval: DEFAULT_RETENTION_INTERVAL,
            hourly_rollups_for: DEFAULT_HOURLY_ROLLUPS_FOR,
            rollups_retain_for: Keep::For(DEFAULT_ROLLUPS_RETAIN_FOR),
            parquet_retain_for: None,
        }
    }
}

impl RetentionConfig {
    /// Keep every raw record, and so every roll-up.
    pub fn keep_everything() -> Self {
        RetentionConfig {
            retain_for: Keep::Forever,
            rollups_retain_for: Keep::Forever,
            ..RetentionConfig::default()
        }
    }

    /// `--rollups-retain-for`'s default with raw records kept `retain_for`:
    /// [`DEFAULT_ROLLUPS_RETAIN_FOR`], or `retain_for` when that is longer.
    pub fn rollups_outliving(retain_for: Keep) -> Keep {
        match retain_for {
            Keep::Forever => Keep::Forever,
            Keep::For(d) => Keep::For(d.max(DEFAULT_ROLLUPS_RETAIN_FOR)),
        }
    }

    /// Refuse a configuration whose roll-ups would go before the raw
    /// records they stand for: a profile counts rolled-up records from their
    /// roll-ups, so a period's roll-ups must be kept at least as long as
    /// its raw records.
    ///
    /// # Errors
    ///
    /// `--rollups-retain-for` shorter than `--retain-for` (or finite while
    /// raw records are kept forever), naming both flags.
    pub fn check(&self) -> Result<(), String> {
        let shorter = match (self.retain_for, self.rollups_retain_for) {
            (_, Keep::Forever) => false,
            (Keep::Forever, Keep::For(_)) => true,
            (Keep::For(raw), Keep::For(rolled)) => rolled < raw,
        };
        if shorter {
            let show = |k: Keep| match k {
                Keep::Forever => "forever".to_owned(),
                Keep::For(d) => format_duration(d),
            };
            return Err(format!(
                "--rollups-retain-for {} is shorter than --retain-for {}: profiles count \
                 rolled-up requests from their roll-ups, so roll-ups must be kept at least as \
                 long as raw records; raise --rollups-retain-for (e.g. to {}) or lower \
                 --retain-for",
                show(self.rollups_retain_for),
                show(self.retain_for),
                show(self.retain_for),
            ));
        }
        Ok(())
    }

    /// The smallest `max_store_bytes` the collector accepts with batches of
    /// at most `max_batch_bytes`: room for the WAL and a few groups of
    /// them, so that a bound is never met by one batch alone.
    pub fn min_store_bytes(max_batch_bytes: usize) -> u64 {
        (16 * max_batch_bytes as u64).max(32 << 20)
    }
}

/// What the store holds, as `/metrics` shows it: refreshed by the writer
/// after its upkeep, read without touching the store.
#[derive(Debug, Default)]
pub(crate) struct StoreGauges {
    pub(crate) file_bytes: AtomicU64,
    pub(crate) used_bytes: AtomicU64,
    pub(crate) wal_bytes: AtomicU64,
    /// The oldest raw record's start, ns since the Unix epoch (0: none).
    pub(crate) oldest_start_unix_nanos: AtomicU64,
    pub(crate) deleted_by_retention: AtomicU64,
    pub(crate) too_old: AtomicU64,
    /// Of those two, the forced records.
    pub(crate) deleted_forced: AtomicU64,
    pub(crate) too_old_forced: AtomicU64,
    pub(crate) rollups_deleted_for_size: AtomicU64,
    pub(crate) hourly_rollups: AtomicU64,
    pub(crate) daily_rollups: AtomicU64,
    /// Records committed but not rolled up yet.
    pub(crate) rollup_backlog: AtomicU64,
    pub(crate) retention_failures: AtomicU64,
}

/// Rows per upkeep transaction.
const CHUNK: usize = 5_000;
/// The most records per transaction while over the size bound (fewer when
/// the WAL is short: see [`next_size_chunk`]).
const SIZE_CHUNK: u64 = 4_000;
/// The fewest records per transaction while over the size bound.
const MIN_SIZE_CHUNK: u64 = 16;
/// The records of the first transaction over the size bound, before the
/// WAL it appends is known.
const FIRST_SIZE_CHUNK: u64 = 64;
/// How long a step goes on deleting, past what arrived since the last,
/// while over the size bound.
const SIZE_STEP: Duration = Duration::from_millis(40);
/// The most free pages one step gives back to the disk while the file is
/// over its share (4 MiB of 32 KiB pages; 2 MiB of a new store's).
const SHRINK_PAGES: u64 = 128;
/// Records waiting that make the writer roll up at once.
const ROLL_UP_AT: i64 = 20_000;
/// Roll up at least this often while records wait.
const ROLL_UP_EVERY: Duration = Duration::from_secs(1);
/// Refresh the gauges at least this often.
const GAUGES_EVERY: Duration = Duration::from_secs(1);

/// The records per transaction while over the size bound, after one of
/// `chunk` that deleted `deleted` records and appended `wal_bytes` to the
/// WAL: the WAL then stays within its share of the bound (see
/// [`crate::server::store::Store::wal_cut_bytes`]) with transactions of about a
/// half of `wal_cut_bytes`. A transaction's WAL does not grow in
/// proportion to its records: the index pages it rewrites are shared by
/// the neighbouring rows it deletes, so that the more it deletes, the less
/// each record costs. The chunk therefore doubles while a transaction
/// appends under half of that, and shrinks in proportion past it.
fn next_size_chunk(chunk: u64, deleted: u64, wal_bytes: Option<u64>, wal_cut_bytes: u64) -> u64 {
    let target = (wal_cut_bytes / 2).max(1);
    let next = match wal_bytes {
        Some(_) if deleted == 0 => return chunk,
        Some(bytes) if bytes > target => {
            u64::try_from(u128::from(deleted) * u128::from(target) / u128::from(bytes)).unwrap_or(0)
        }
        Some(bytes) if bytes <= target / 2 && deleted >= chunk => 2 * chunk,
        Some(_) => chunk,
        None => MIN_SIZE_CHUNK,
    };
    next.clamp(MIN_SIZE_CHUNK, SIZE_CHUNK)
}

/// How `--max-store-bytes` is shared between the database file and the
/// WAL, and where deleting starts and stops.
///
/// The WAL is cut back at a sixteenth of the bound
/// ([`crate::server::store::Store::open_bounded`]) and holds that plus the
/// transaction being written (a group commit, an eighth of that; a
/// deletion, a quarter), and more while a cut waits for a reader or a
/// checkpoint: a quarter of the bound is kept for it. The file gets the
/// other three quarters, its `pages` share. The file grows only when no
/// page is free, so the pages in use are kept below that share: past the
/// `high` mark (90 % of it) the writer deletes the records that started
/// first until they are back at the `low` mark (80 %); the room between
/// `high` and the share takes what arrives while the freed pages catch up
/// with the deletions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SizeShares {
    /// The most the database file takes.
    pub(crate) pages: u64,
    /// Pages in use past this start deletions.
    pub(crate) high: u64,
    /// Deletions go on until the pages in use are back under this.
    pub(crate) low: u64,
}

impl SizeShares {
    /// Pages in use past this are deleted back to `low` in one step,
    /// whatever it costs ingest: half the room between `high` and the
    /// share is left.
    pub(crate) fn urgent(&self) -> u64 {
        self.high + (self.pages - self.high) / 2
    }

    pub(crate) fn of(bound: u64) -> SizeShares {
        let pages = bound - bound / 4;
        SizeShares {
            pages,
            high: pages / 10 * 9,
            low: pages / 10 * 8,
        }
    }
}

/// Stages of the periodic pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    DeleteOld,
    Compact,
    Batches,
    Parquet,
}

/// The writer's upkeep (see the module docs).
#[derive(Debug)]
pub(in crate::server) struct Upkeep {
    config: RetentionConfig,
    parquet_root: Option<PathBuf>,
    pass: Option<Stage>,
    next_pass: Instant,
    last_roll_up: Instant,
    last_gauges: Instant,
    /// Deleting for the size bound, until the pages in use are back at
    /// the low mark.
    over_size: bool,
    /// Records still to delete for the size bound.
    owed: u64,
    /// The last step rolled up (and did nothing else).
    rolled_up_last: bool,
    /// How long a step may delete past the arrivals ([`SIZE_STEP`]).
    size_step: Duration,
    /// Whether the store's file can shrink (read once).
    can_shrink: Option<bool>,
    /// Records per transaction while over the size bound.
    size_chunk: u64,
    /// Roll-ups per compaction transaction under a size bound.
    compact_chunk: u64,
    /// The highest record id at the last step.
    seen_id: i64,
    pending: i64,
    gauges: Arc<StoreGauges>,
}

impl Upkeep {
    pub(in crate::server) fn new(
        config: RetentionConfig,
        parquet_root: Option<PathBuf>,
        gauges: Arc<StoreGauges>,
    ) -> Upkeep {
        let now = Instant::now();
        Upkeep {
            config,
            parquet_root,
            pass: None,
            next_pass: now,
            last_roll_up: now,
            last_gauges: now - GAUGES_EVERY,
            over_size: false,
            owed: 0,
            rolled_up_last: false,
            size_step: SIZE_STEP,
            can_shrink: None,
            size_chunk: FIRST_SIZE_CHUNK,
            compact_chunk: FIRST_SIZE_CHUNK,
            seen_id: i64::MAX,
            pending: i64::MAX,
            gauges,
        }
    }

    /// What the store itself needs to know: the raw window, roll-up periods.
    pub(in crate::server) fn retention(&self) -> Retention {
        Retention {
            retain_for: self.config.retain_for.duration(),
            hourly_for: self.config.hourly_rollups_for,
        }
    }

    /// How long the writer may wait for a batch before upkeep is due.
    pub(in crate::server) fn idle_for(&self) -> Duration {
        if self.pass.is_some() || self.over_size {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let mut due = self.next_pass.min(self.last_gauges + GAUGES_EVERY);
        if self.pending > 0 {
            due = due.min(self.last_roll_up + ROLL_UP_EVERY);
        }
        due.saturating_duration_since(now)
    }

    /// Do one bounded piece of what is due. Failures are logged (and
    /// retried at the next step): upkeep never stops ingest.
    pub(in crate::server) fn step(&mut self, store: &mut Store) {
        if let Err(e) = self.try_step(store) {
            self.gauges
                .retention_failures
                .fetch_add(1, Ordering::Relaxed);
            errlog::error("store upkeep (retention, roll-ups) failed", || {
                format!("{e} (retried at the next step)")
            });
            // Back off: do not spin on a failing store.
            self.pass = None;
            self.over_size = false;
            self.owed = 0;
            self.next_pass = Instant::now() + self.config.interval.min(Duration::from_secs(10));
        }
    }

    fn try_step(&mut self, store: &mut Store) -> Result<(), StoreError> {
        let now = Instant::now();
        let sys = SystemTime::now();
        let hourly = self.config.hourly_rollups_for;
        let state = store.state()?;
        self.pending = state.last_id - state.rolled_up_through;
        // Records committed since the last step: while over the size bound,
        // a step deletes at least as many, so that deleting keeps pace with
        // ingest. Counted a step at a time, never since the last deletion:
        // after a while under the bound, that would make one step delete
        // all that brings the store back to 90 % of it while ingest waits
        // (over a second at 4 GiB).
        let arrived = u64::try_from(state.last_id - self.seen_id).unwrap_or(0);
        self.seen_id = state.last_id;
        // Roll-ups first, at their pace, also while over the size bound:
        // they answer profiles in place of the records above the roll-up
        // mark, and only rolled-up records can be deleted.
        //
        // Under a size bound, a step that rolled up is followed by one that
        // sees to the bound: on a starved machine a roll-up step can take
        // longer than [`ROLL_UP_EVERY`], and every step would roll up while
        // the pages in use grew past the file's share.
        let bound_waits = self.config.max_store_bytes.is_some() && self.rolled_up_last;
        self.rolled_up_last = false;
        if self.pending > 0
            && !bound_waits
            && (self.pending >= ROLL_UP_AT
                || now >= self.last_roll_up + ROLL_UP_EVERY
                || self.pass == Some(Stage::DeleteOld))
        {
            let step = store.roll_up(ROLL_UP_AT as usize, sys, hourly)?;
            self.last_roll_up = now;
            self.rolled_up_last = true;
            self.pending -= step.records as i64;
            return self.refresh_due(store, now);
        }
        // Under a size bound: keep the file within its share (see
        // [`SizeShares`]), deleting what brings the pages in use back to
        // the low mark, and give free pages back while the file is over.
        if let Some(bound) = self.config.max_store_bytes {
            let shares = SizeShares::of(bound);
            let size = store.size()?;
            if size.used_bytes <= shares.low {
                self.over_size = false;
                self.owed = 0;
            } else if self.owed == 0 && (self.over_size || size.used_bytes > shares.high) {
                // Deleting records frees whole pages only as they empty, so
                // the pages in use lag the deletions: delete what brings
                // them to the low mark at the average record size, then
                // measure again.
                let raw = u64::try_from(state.last_id)
                    .unwrap_or(0)
                    .saturating_sub(state.deleted_by_retention + state.too_old)
                    .max(1);
                let per_record = (size.used_bytes / raw).max(1);
                self.owed = (size.used_bytes - shares.low).div_ceil(per_record);
                self.over_size = true;
            }
            if self.over_size {
                // What arrived since the last step (roll-up steps
                // included) is owed on top, so that deleting keeps pace
                // with ingest and works the excess off besides.
                self.owed += arrived;
            }
            if size.file_bytes > shares.pages && size.free_bytes() > 0 && self.shrinks(store)? {
                let pages = (size.free_bytes() / size.page_bytes.max(1)).min(SHRINK_PAGES);
                store.shrink(pages)?;
            }
            if self.owed > 0 {
                // This step deletes the arrivals, and what is owed besides
                // for as long as [`SIZE_STEP`] allows: ingest waits for no
                // more than that. Past the middle of the room between the
                // `high` mark and the file's share, everything owed is
                // deleted now, however long it takes: on a starved machine
                // [`SIZE_STEP`] of wall time deletes little more than the
                // arrivals, and records that free less than they took
                // (roll-ups stay) would push the file past its share.
                let mut goal = self.owed;
                let mut must = if size.used_bytes > shares.urgent() {
                    goal
                } else {
                    arrived.min(goal)
                };
                while goal > 0 && (must > 0 || now.elapsed() < self.size_step) {
                    let deleted = store.delete_oldest(self.size_chunk.min(goal) as usize)?;
                    self.owed = self.owed.saturating_sub(deleted);
                    goal = goal.saturating_sub(deleted);
                    must = must.saturating_sub(deleted);
                    self.size_chunk = next_size_chunk(
                        self.size_chunk,
                        deleted,
                        store.last_commit_wal_bytes(),
                        store.wal_cut_bytes(),
                    );
                    if deleted == 0 {
                        // The earliest records are not rolled up yet: roll
                        // up (the next step deletes them).
                        let step = store.roll_up(ROLL_UP_AT as usize, sys, hourly)?;
                        self.last_roll_up = now;
                        if step.records == 0 {
                            // No raw record left to delete: the roll-ups
                            // hold the room (those of ever-new endpoints
                            // grow without end). The oldest go, a chunk a
                            // step, until the store is back at its low
                            // mark; when none can go, only the WAL holds
                            // the room.
                            self.delete_rollups(store, &shares, now)?;
                        }
                        break;
                    }
                }
                return self.refresh_due(store, now);
            }
        }
        if self.pass.is_none() && now >= self.next_pass {
            self.pass = Some(Stage::DeleteOld);
        }
        match self.pass {
            None => {}
            Some(Stage::DeleteOld) => {
                let more = match self.config.retain_for.duration() {
                    Some(keep) => {
                        let cutoff = sys.checked_sub(keep).map_or(0, unix_nanos);
                        // Under a size bound, as small as the WAL's share
                        // of it needs.
                        let chunk = match self.config.max_store_bytes {
                            Some(_) => self.size_chunk,
                            None => CHUNK as u64,
                        };
                        let deleted = store.delete_started_before(cutoff, chunk as usize)?;
                        if self.config.max_store_bytes.is_some() {
                            self.size_chunk = next_size_chunk(
                                chunk,
                                deleted,
                                store.last_commit_wal_bytes(),
                                store.wal_cut_bytes(),
                            );
                        }
                        deleted == chunk
                    }
                    None => false,
                };
                if !more {
                    self.pass = Some(Stage::Compact);
                }
            }
            Some(Stage::Compact) => {
                // Under a size bound, as small as the WAL's share of it
                // needs, sized as the deletions are.
                let chunk = match self.config.max_store_bytes {
                    Some(_) => self.compact_chunk,
                    None => CHUNK as u64,
                };
                let step = store.compact_rollups(
                    sys,
                    hourly,
                    self.config.rollups_retain_for.duration(),
                    chunk as usize,
                )?;
                if self.config.max_store_bytes.is_some() {
                    self.compact_chunk = next_size_chunk(
                        chunk,
                        step.merged + step.dropped,
                        store.last_commit_wal_bytes(),
                        store.wal_cut_bytes(),
                    )
                    .min(CHUNK as u64);
                }
                if !step.more {
                    self.pass = Some(Stage::Batches);
                }
            }
            Some(Stage::Batches) => {
                // A batch id is kept as long as its records, and at least a
                // day: a resend after that is stored again.
                let keep = self
                    .config
                    .retain_for
                    .duration()
                    .map(|d| d.max(Duration::from_secs(86_400)));
                let more = match keep.and_then(|k| sys.checked_sub(k)) {
                    Some(before) => {
                        let ms = before
                            .duration_since(SystemTime::UNIX_EPOCH)
                            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                        store.forget_batches_before(ms, CHUNK)? == CHUNK as u64
                    }
                    None => false,
                };
                if !more {
                    self.pass = Some(Stage::Parquet);
                }
            }
            Some(Stage::Parquet) => {
                let keep = self
                    .config
                    .parquet_retain_for
                    .unwrap_or(self.config.retain_for)
                    .duration();
                if let (Some(root), Some(keep)) = (&self.parquet_root, keep) {
                    let cutoff = sys.checked_sub(keep).map_or(0, unix_nanos);
                    if let Err(e) =
                        super::partitions::remove_partitions_before(root, cutoff, unix_nanos(sys))
                    {
                        errlog::error("removing Parquet partitions past retention failed", || {
                            format!("{}: {e}", root.display())
                        });
                    }
                }
                self.pass = None;
                self.next_pass = now + self.config.interval;
                return self.refresh(store, true);
            }
        }
        if self.pass.is_some() {
            return self.refresh(store, false);
        }
        self.refresh_due(store, now)
    }

    /// Whether the store's file can give free pages back (read once).
    fn shrinks(&mut self, store: &Store) -> Result<bool, StoreError> {
        if self.can_shrink.is_none() {
            self.can_shrink = Some(store.can_shrink()?);
        }
        Ok(self.can_shrink == Some(true))
    }
    /// Delete the oldest roll-ups, for a store over its size bound with
    /// no raw record left to delete: chunks sized to the WAL as for
    /// records, for as long as a step may take, and past the urgent mark
    /// until the pages in use are back under the high one. When none can
    /// go, only the WAL holds the room, and the bound waits for the next
    /// measure.
    fn delete_rollups(
        &mut self,
        store: &mut Store,
        shares: &SizeShares,
        now: Instant,
    ) -> Result<(), StoreError> {
        let urgent = store.size()?.used_bytes > shares.urgent();
        loop {
            let dropped = store.delete_oldest_rollups(self.size_chunk as usize)?;
            self.size_chunk = next_size_chunk(
                self.size_chunk,
                dropped,
                store.last_commit_wal_bytes(),
                store.wal_cut_bytes(),
            );
            if dropped == 0 {
                self.owed = 0;
                self.over_size = false;
                return Ok(());
            }
            let used = store.size()?.used_bytes;
            let done = if urgent {
                used <= shares.high
            } else {
                now.elapsed() >= self.size_step
            };
            if used <= shares.low || done {
                return Ok(());
            }
        }
    }

    /// Refresh the gauges when they are [`GAUGES_EVERY`] old: not on every
    /// step, which under load comes after every group commit.
    fn refresh_due(&mut self, store: &Store, now: Instant) -> Result<(), StoreError> {
        if now >= self.last_gauges + GAUGES_EVERY {
            self.refresh(store, false)?;
        }
        Ok(())
    }

    /// Refresh the gauges (the roll-up counts too with `rollups`).
    fn refresh(&mut self, store: &Store, rollups: bool) -> Result<(), StoreError> {
        let g = &self.gauges;
        let size = store.size()?;
        let state = store.state()?;
        g.file_bytes.store(size.file_bytes, Ordering::Relaxed);
        g.used_bytes.store(size.used_bytes, Ordering::Relaxed);
        g.wal_bytes.store(size.wal_bytes, Ordering::Relaxed);
        g.oldest_start_unix_nanos
            .store(store.oldest_start()?.unwrap_or(0), Ordering::Relaxed);
        g.deleted_by_retention
            .store(state.deleted_by_retention, Ordering::Relaxed);
        g.too_old.store(state.too_old, Ordering::Relaxed);
        g.deleted_forced
            .store(state.deleted_forced, Ordering::Relaxed);
        g.too_old_forced
            .store(state.too_old_forced, Ordering::Relaxed);
        g.rollups_deleted_for_size
            .store(state.rollups_deleted_for_size, Ordering::Relaxed);
        g.rollup_backlog.store(
            u64::try_from(state.last_id - state.rolled_up_through).unwrap_or(0),
            Ordering::Relaxed,
        );
        if rollups {
            let (hourly, daily) = store.rollup_counts()?;
            g.hourly_rollups.store(hourly, Ordering::Relaxed);
            g.daily_rollups.store(daily, Ordering::Relaxed);
        }
        self.last_gauges = Instant::now();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_transactions_append_about_half_the_wal_cut_and_grow_while_cheaper() {
        let cut = 4 << 20;
        // Under a quarter of the cut (half the target): twice as many.
        assert_eq!(next_size_chunk(64, 64, Some(1 << 20), cut), 128);
        assert_eq!(
            next_size_chunk(3_000, 3_000, Some(1 << 20), cut),
            SIZE_CHUNK
        );
        // Between a quarter and a half: as many.
        assert_eq!(next_size_chunk(300, 300, Some(3 << 19), cut), 300);
        // A transaction that deleted fewer than asked says nothing of more.
        assert_eq!(next_size_chunk(300, 100, Some(1 << 10), cut), 300);
        // Past half: fewer, in proportion, to no fewer than 16.
        assert_eq!(next_size_chunk(512, 512, Some(4 << 20), cut), 256);
        assert_eq!(
            next_size_chunk(512, 512, Some(512 << 20), cut),
            MIN_SIZE_CHUNK
        );
        // Nothing deleted says nothing; an unknown WAL, the fewest.
        assert_eq!(next_size_chunk(300, 0, Some(1 << 20), cut), 300);
        assert_eq!(next_size_chunk(300, 300, None, cut), MIN_SIZE_CHUNK);
    }

    /// Roll up every record committed.
    fn roll_up_all(store: &mut Store) {
        while store
            .roll_up(
                ROLL_UP_AT as usize,
                SystemTime::now(),
                DEFAULT_HOURLY_ROLLUPS_FOR,
            )
            .unwrap()
            .records
            > 0
        {}
    }

    /// Everything kept, but for a size bound.
    fn bounded_to(bound: u64) -> RetentionConfig {
        RetentionConfig {
            retain_for: Keep::Forever,
            max_store_bytes: Some(bound),
            ..RetentionConfig::keep_everything()
        }
    }

    /// A store whose pages in use are past the urgent mark is brought back
    /// to its low mark by one step, even when the step has no time to
    /// spare (a starved writer): the file never outgrows its share while
    /// records that free less than they took keep arriving.
    #[test]
    fn a_store_past_the_urgent_mark_is_brought_back_in_one_step_however_starved() {
        use cpt_sdk::{CriticalPath, Frame, Record, SegmentKind, Trigger};
        let dir = tempfile::tempdir().unwrap();
        let bound: u64 = 8 << 20;
        let shares = SizeShares::of(bound);
        let mut store =
            Store::open_bounded(dir.path().join("s.db"), Default::default(), bound).unwrap();
        let start = unix_nanos(SystemTime::now()) - 60_000_000_000;
        let mut n = 0u64;
        while store.size().unwrap().used_bytes <= shares.urgent() {
            let batch: Vec<Record> = (0..200)
                .map(|i| {
                    let mut p = CriticalPath::new();
                    p.push_frames(
                        [Frame::new("svc", format!("step{}", i % 17))],
                        Duration::from_micros(10 + i),
                        SegmentKind::Busy,
                    );
                    let mut r = Record::new("svc", Trigger::Sampled, p);
                    r.endpoint = Some("/x".into());
                    r.start_unix_nanos = Some(start + n);
                    r.labels.insert("user".into(), format!("{n:032x}"));
                    n += 1;
                    r
                })
                .collect();
            store.insert(&batch).unwrap();
        }
        // Everything is rolled up, so everything can be deleted.
        roll_up_all(&mut store);
        let mut upkeep = Upkeep::new(bounded_to(bound), None, Arc::default());
        upkeep.size_step = Duration::ZERO;
        upkeep.step(&mut store);
        let used = store.size().unwrap().used_bytes;
        assert!(
            used <= shares.high,
            "one step left {used} bytes of pages in use (high mark {}, urgent {}, low {})",
            shares.high,
            shares.urgent(),
            shares.low
        );
        assert!(store.state().unwrap().deleted_by_retention > 0);
    }

    /// Records whose endpoints are all new leave a roll-up each: once no
    /// raw record is left to delete, the roll-ups alone hold the store
    /// over its bound, and the oldest periods' roll-ups go until it is
    /// back, counted; the newest stay.
    #[test]
    fn rollups_of_ever_new_endpoints_are_deleted_oldest_first_to_hold_the_bound() {
        use cpt_sdk::{CriticalPath, Frame, Record, SegmentKind, Trigger};
        let dir = tempfile::tempdir().unwrap();
        let bound: u64 = 8 << 20;
        let shares = SizeShares::of(bound);
        let mut store =
            Store::open_bounded(dir.path().join("s.db"), Default::default(), bound).unwrap();
        let hour = 3_600_000_000_000u64;
        let first_hour = (unix_nanos(SystemTime::now()) / hour - 30) * hour;
        let mut n = 0u64;
        // Records over 24 hours, each of an endpoint of its own; rolled up
        // as they come, so that the roll-ups alone pass the high mark.
        while store.size().unwrap().used_bytes <= shares.high + (1 << 20) {
            let batch: Vec<Record> = (0..500)
                .map(|_| {
                    let mut p = CriticalPath::new();
                    p.push_frames(
                        [Frame::new("svc", format!("handler{}", n % 7))],
                        Duration::from_micros(10 + n % 100),
                        SegmentKind::Busy,
                    );
                    let mut r = Record::new("svc", Trigger::Sampled, p);
                    r.endpoint = Some(format!("/item/{n}"));
                    r.start_unix_nanos = Some(first_hour + (n % 24) * hour + n);
                    n += 1;
                    r
                })
                .collect();
            store.insert(&batch).unwrap();
            roll_up_all(&mut store);
            while store.delete_oldest(10_000).unwrap() > 0 {}
        }
        assert_eq!(store.len().unwrap(), 0, "no raw record left to delete");
        let path = dir.path().join("s.db");
        let rollups = || -> (i64, i64) {
            rusqlite::Connection::open(&path)
                .unwrap()
                .query_row("SELECT count(*), min(bucket) FROM rollups", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .unwrap()
        };
        let (before, oldest_before) = rollups();
        let mut upkeep = Upkeep::new(bounded_to(bound), None, Arc::default());
        for _ in 0..200 {
            upkeep.step(&mut store);
            if store.size().unwrap().used_bytes <= shares.low {
                break;
            }
        }
        let used = store.size().unwrap().used_bytes;
        assert!(
            used <= shares.high,
            "{used} bytes of pages in use, high mark {}",
            shares.high
        );
        let (after, oldest_after) = rollups();
        let deleted = store.state().unwrap().rollups_deleted_for_size;
        assert!(
            after > 0 && after < before,
            "{before} roll-ups, then {after}"
        );
        assert_eq!(deleted, u64::try_from(before - after).unwrap());
        assert!(oldest_after > oldest_before, "the oldest hours went first");
        let newest: i64 = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM rollups WHERE bucket = ?1",
                [i64::try_from((first_hour + 23 * hour) / 1_000_000_000).unwrap()],
                |r| r.get(0),
            )
            .unwrap();
        assert!(newest > 0, "the newest hour's roll-ups stay");
    }

    #[test]
    fn rollups_kept_shorter_than_raw_records_are_refused_naming_both_flags() {
        let days = |d: u64| Keep::For(Duration::from_secs(d * 86_400));
        let config = |raw, rolled| RetentionConfig {
            retain_for: raw,
            rollups_retain_for: rolled,
            ..RetentionConfig::default()
        };
        for (raw, rolled) in [(Keep::Forever, days(400)), (days(30), days(7))] {
            let e = config(raw, rolled).check().unwrap_err();
            assert!(
                e.contains("--rollups-retain-for") && e.contains("--retain-for"),
                "{e}"
            );
        }
        for (raw, rolled) in [
            (days(7), days(400)),
            (days(7), days(7)),
            (Keep::Forever, Keep::Forever),
        ] {
            assert_eq!(config(raw, rolled).check(), Ok(()));
        }
        // The defaults agree: the library's keep-everything and the flag's
        // default for any --retain-for.
        assert_eq!(RetentionConfig::keep_everything().check(), Ok(()));
        assert_eq!(RetentionConfig::default().check(), Ok(()));
        for raw in [Keep::Forever, days(7), days(1000)] {
            assert_eq!(
                config(raw, RetentionConfig::rollups_outliving(raw)).check(),
                Ok(())
            );
        }
    }

    #[test]
    fn sizes_and_durations_parse_as_the_flags_say_or_are_refused() {
        assert_eq!(parse_size("300MiB"), Ok(300 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("512"), Ok(512));
        for bad in ["", "MiB", "0", "-1GiB", "3 furlongs"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(Keep::parse("forever"), Ok(Keep::Forever));
        assert_eq!(
            Keep::parse("7d"),
            Ok(Keep::For(Duration::from_secs(7 * 86_400)))
        );
        assert!(Keep::parse("0s").is_err());
        assert!(Keep::parse("7x").is_err());
        assert_eq!(format_duration(Duration::from_secs(14 * 86_400)), "14d");
        assert_eq!(format_duration(Duration::from_secs(90 * 60)), "90m");
    }
}
