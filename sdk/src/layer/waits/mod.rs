//! Named waits: what a node waited on when nothing it created explains
//! the wait.
//!
//! Two sources name a wait:
//!
//! - **The waker** (always on, for nodes whose waker cpt wraps: the
//!   [task helpers](crate::task)). When a node is woken, the span current on
//!   the waking thread says who woke it: another node of the same request
//!   (a channel send, a lock release, a `Notify`) becomes the explicit
//!   blocker of the node's next resumption; no span at all means the
//!   runtime's drivers woke it, which, once tokio's resources are seen (below),
//!   is I/O: the wait is `[io]`.
//! - **tokio's resource instrumentation** (the `tokio-resources` feature,
//!   with `RUSTFLAGS="--cfg tokio_unstable"`): every timer, semaphore,
//!   mutex, `RwLock`, barrier and oneshot channel is a `runtime.resource`
//!   span with its type and the place it was created; each poll of it emits a
//!   `runtime::resource::poll_op` event with `is_ready`. The layer keeps the
//!   resource's name by its span id (its resource table; a timer or oneshot
//!   made while no traced node runs on the thread by its kind alone, see
//!   [`known_resource`]), notes which
//!   resources a node polled pending before it stopped running, and which of
//!   them was ready when it resumed: that one names the wait
//!   (`[sleep src/main.rs:88]`).
//!
//! The marks go into the node's [`WaitMark`](crate::path::graph::WaitMark)s;
//! the walk names a wait it leaves on the node with the latest mark.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::path::Location;

/// What a wait was on: a kind (`sleep`, `semaphore`, `io`, …) and where
/// the resource was created, when known.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct WaitSite {
    pub(crate) kind: Arc<str>,
    pub(crate) location: Option<Location>,
}

/// The site of waits the runtime's I/O driver ended.
pub(crate) fn io_site() -> Arc<WaitSite> {
    static IO: OnceLock<Arc<WaitSite>> = OnceLock::new();
    IO.get_or_init(|| {
        Arc::new(WaitSite {
            kind: Arc::from("io"),
            location: None,
        })
    })
    .clone()
}

/// Set once a `runtime.resource` span was seen: tokio's timers and
/// synchronisation primitives announce themselves, so a wake from outside
/// any span is the I/O driver's, not a timer's.
static RESOURCES_SEEN: AtomicBool = AtomicBool::new(false);

/// Whether a wake from outside any span names an `[io]` wait.
pub(crate) fn io_from_runtime_wakes() -> bool {
    RESOURCES_SEEN.load(Ordering::Relaxed)
}

#[cfg(feature = "tokio-resources")]
/// Distinct resource sites (kind, file, line) kept for the life of the
/// process; beyond this, a new site is made per resource and not kept.
const MAX_SITES: usize = 4096;

/// Resource sites not kept because [`MAX_SITES`] was reached.
static SITES_NOT_KEPT: AtomicU64 = AtomicU64::new(0);

/// How many resource sites were not kept in the site table because it was
/// full (each such resource still names its waits).
pub(crate) fn sites_not_kept() -> u64 {
    SITES_NOT_KEPT.load(Ordering::Relaxed)
}

#[cfg(feature = "tokio-resources")]
/// A site kept in the process-wide site table: its index there. Resources
/// carry this, not the site, so that naming one costs no reference count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SiteId(pub(crate) u32);

#[cfg(feature = "tokio-resources")]
/// The sites kept, by [`SiteId`]; filled in order, never emptied.
static KEPT: [OnceLock<Arc<WaitSite>>; MAX_SITES] = [const { OnceLock::new() }; MAX_SITES];

#[cfg(feature = "tokio-resources")]
impl SiteId {
    /// The site kept under this id.
    pub(crate) fn site(self) -> Option<&'static Arc<WaitSite>> {
        KEPT.get(self.0 as usize)?.get()
    }
}

#[cfg(feature = "tokio-resources")]
/// Whether `s` is the site of `(kind, file, line)`.
fn same(s: &WaitSite, kind: &str, file: Option<&str>, line: u32) -> bool {
    &*s.kind == kind
        && match (&s.location, file) {
            (Some(l), Some(f)) => l.line == line && &*l.file == f,
            (None, None) => true,
            _ => false,
        }
}

#[cfg(feature = "tokio-resources")]
/// The site of `(kind, file, line)` in the process-wide table, under its
/// lock: its id when the table keeps it (one id per site: resources made at
/// one place share it), else a site of its own, counted by
/// [`sites_not_kept`].
fn intern_shared(kind: &str, file: Option<&str>, line: u32) -> Result<SiteId, Arc<WaitSite>> {
    use std::hash::BuildHasher;
    use std::sync::Mutex;

    use rustc_hash::{FxBuildHasher, FxHashMap};
    use smallvec::SmallVec;
    /// Ids by the hash of their site, and how many there are.
    type Sites = (FxHashMap<u64, SmallVec<[u32; 1]>>, usize);
    static SITES: OnceLock<Mutex<Sites>> = OnceLock::new();

    let hash = FxBuildHasher.hash_one((kind, file, line));
    let mut sites = SITES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let (map, len) = &mut *sites;
    let found = map.get(&hash).and_then(|v| {
        v.iter()
            .copied()
            .map(SiteId)
            .find(|id| id.site().is_some_and(|s| same(s, kind, file, line)))
    });
    if let Some(id) = found {
        return Ok(id);
    }
    let made = Arc::new(WaitSite {
        kind: Arc::from(kind),
        location: file.map(|f| Location {
            file: Arc::from(f),
            line,
        }),
    });
    if *len >= MAX_SITES {
        SITES_NOT_KEPT.fetch_add(1, Ordering::Relaxed);
        return Err(made);
    }
    let id = SiteId(*len as u32);
    let _ = KEPT[*len].set(made);
    *len += 1;
    map.entry(hash).or_default().push(id.0);
    Ok(id)
}

#[cfg(feature = "tokio-resources")]
/// A hash of a site from its strings' lengths and last bytes: for finding
/// it among the few a thread names, where the content is compared anyway.
fn quick_hash(kind: &str, file: Option<&str>, line: u32) -> u64 {
    fn tail(s: &str) -> u64 {
        let b = s.as_bytes();
        let last = match b.len().checked_sub(8) {
            Some(from) => b[from..].try_into().map_or(0, u64::from_le_bytes),
            None => b.iter().fold(0, |h, &c| h << 8 | u64::from(c)),
        };
        last ^ ((b.len() as u64) << 56)
    }
    let f = file.map_or(0, tail);
    (f ^ tail(kind).rotate_left(29) ^ (u64::from(line) << 17)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[cfg(feature = "tokio-resources")]
/// Sites each thread finds without the table's lock, by hash.
const NEAR: usize = 32;

#[cfg(feature = "tokio-resources")]
/// The sites a thread named before, found with no lock, no allocation and
/// no hash of whole strings (a cheap one, and the site's content compared):
/// `(hash, id + 1)` of each (0: none), by hash.
struct NearSites([(u64, u32); NEAR]);

#[cfg(feature = "tokio-resources")]
impl NearSites {
    const EMPTY: NearSites = NearSites([(0, 0); NEAR]);

    /// [`intern_shared`], looked up first among this thread's sites.
    fn intern(
        &mut self,
        kind: &str,
        file: Option<&str>,
        line: u32,
    ) -> Result<SiteId, Arc<WaitSite>> {
        let quick = quick_hash(kind, file, line);
        let slot = &mut self.0[(quick >> 58) as usize % NEAR];
        if slot.0 == quick && slot.1 != 0 {
            let id = SiteId(slot.1 - 1);
            if id.site().is_some_and(|s| same(s, kind, file, line)) {
                return Ok(id);
            }
        }
        let id = intern_shared(kind, file, line)?;
        *slot = (quick, id.0 + 1);
        Ok(id)
    }
}

#[cfg(feature = "tokio-resources")]
/// The kind one of tokio's resource types names.
fn known_kind(concrete_type: &str) -> Option<&'static str> {
    Some(match concrete_type {
        "Sleep" => "sleep",
        "Interval" => "interval",
        "Semaphore" => "semaphore",
        "Mutex" => "mutex",
        "RwLock" => "rwlock",
        "Barrier" => "barrier",
        "Sender|Receiver" => "oneshot",
        _ => return None,
    })
}

#[cfg(feature = "tokio-resources")]
/// The kind a resource's `concrete_type` (and tokio's `kind`) names.
fn kind_of<'a>(concrete_type: &'a str, kind: &'a str) -> std::borrow::Cow<'a, str> {
    use std::borrow::Cow;
    if let Some(known) = known_kind(concrete_type) {
        return Cow::Borrowed(known);
    }
    Cow::Borrowed(match concrete_type {
        "" if !kind.is_empty() => return Cow::Owned(kind.to_ascii_lowercase()),
        "" => "resource",
        other => return Cow::Owned(other.to_ascii_lowercase()),
    })
}

#[cfg(feature = "tokio-resources")]
/// The extension of a `runtime.resource` span the layer's
/// [`ResourceTable`](super::resources::ResourceTable) has no room for (or
/// whose site the site table does not keep): what waiting on it is.
#[derive(Debug, Clone)]
pub(crate) struct Resource(pub(crate) Arc<WaitSite>);

#[cfg(feature = "tokio-resources")]
/// True for tokio's resource spans.
#[inline]
pub(crate) fn is_resource(meta: &tracing::Metadata<'_>) -> bool {
    meta.name() == "runtime.resource"
}

#[cfg(feature = "tokio-resources")]
/// True for tokio's resource poll events.
#[inline]
pub(crate) fn is_poll_op(meta: &tracing::Metadata<'_>) -> bool {
    meta.target() == "runtime::resource::poll_op"
}

#[cfg(feature = "tokio-resources")]
mod reader;
#[cfg(feature = "tokio-resources")]
pub(crate) use reader::{Known, known_resource, read_resource};

#[cfg(feature = "tokio-resources")]
/// Reads `is_ready` of a poll event.
#[derive(Default)]
pub(crate) struct ReadyVisitor(pub(crate) Option<bool>);

#[cfg(feature = "tokio-resources")]
impl tracing::field::Visit for ReadyVisitor {
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        if field.name() == "is_ready" {
            self.0 = Some(value);
        }
    }

    fn record_debug(&mut self, _field: &tracing::field::Field, _value: &dyn std::fmt::Debug) {}
}

/// Warn once, at start, that the `tokio-resources` feature cannot name
/// resources because tokio was built without `--cfg tokio_unstable`.
pub(crate) fn warn_if_unavailable() {
    #[cfg(all(feature = "tokio-resources", not(tokio_unstable)))]
    {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            eprintln!(
                "cpt-sdk: the `tokio-resources` feature is on, but this program was built \
                 without `--cfg tokio_unstable`, so tokio emits no resource spans: waits on \
                 timers, locks, semaphores and channels stay [unattributed]. Build with \
                 RUSTFLAGS=\"--cfg tokio_unstable\" (see the guide's \"Named waits\" page); \
                 everything else works as before."
            );
        });
    }
}

#[cfg(all(test, feature = "tokio-resources"))]
mod tests {
    use super::*;

    /// The one [`WaitSite`] of `(kind, file, line)` while the table has room.
    fn site(kind: &str, file: Option<&str>, line: u32) -> Arc<WaitSite> {
        let mut near = NearSites::EMPTY;
        match near.intern(kind, file, line) {
            Ok(id) => id.site().expect("an interned site is kept").clone(),
            Err(own) => own,
        }
    }

    /// Sites are shared while the table has room; past it a site is made
    /// afresh, still right, and counted.
    #[test]
    fn the_site_table_is_bounded_and_counts_what_it_does_not_keep() {
        let a = site("sleep", Some("t/src/a.rs"), 1);
        assert!(Arc::ptr_eq(&a, &site("sleep", Some("t/src/a.rs"), 1)));
        assert!(!Arc::ptr_eq(&a, &site("sleep", Some("t/src/a.rs"), 2)));
        let before = sites_not_kept();
        for line in 0..MAX_SITES as u32 + 10 {
            let s = site("mutex", Some("t/src/b.rs"), line);
            assert_eq!(s.location.as_ref().map(|l| l.line), Some(line));
            assert_eq!(&*s.kind, "mutex");
        }
        assert!(sites_not_kept() >= before + 10);
        // What was kept is still shared.
        assert!(Arc::ptr_eq(&a, &site("sleep", Some("t/src/a.rs"), 1)));
    }

    #[test]
    fn kinds_are_named_after_tokios_types() {
        assert_eq!(kind_of("Sleep", "timer"), "sleep");
        assert_eq!(kind_of("Sender|Receiver", "Sync"), "oneshot");
        assert_eq!(kind_of("", "Sync"), "sync");
        assert_eq!(kind_of("Notify", "Sync"), "notify");
    }
}
