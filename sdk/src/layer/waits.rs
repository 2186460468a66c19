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
//!   resource's name by its span id (its resource table), notes which
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

#[cfg(all(test, feature = "tokio-resources"))]
/// The one [`WaitSite`] of `(kind, file, line)` while the table has room.
pub(crate) fn site(kind: &str, file: Option<&str>, line: u32) -> Arc<WaitSite> {
    let near = READER.try_with(|r| r.borrow_mut().near.intern(kind, file, line));
    match near.unwrap_or_else(|_| intern_shared(kind, file, line)) {
        Ok(id) => id.site().expect("an interned site is kept").clone(),
        Err(own) => own,
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
/// What a field of a `runtime.resource` span is to the layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Other,
    ConcreteType,
    Kind,
    File,
    Line,
    Internal,
}

#[cfg(feature = "tokio-resources")]
impl Role {
    fn of(name: &str) -> Role {
        match name {
            "concrete_type" => Role::ConcreteType,
            "kind" => Role::Kind,
            "loc.file" => Role::File,
            "loc.line" => Role::Line,
            "is_internal" => Role::Internal,
            _ => Role::Other,
        }
    }
}

#[cfg(feature = "tokio-resources")]
/// Fields a callsite's roles are kept for; a field past them is read by
/// its name.
const ROLES: usize = 8;

#[cfg(feature = "tokio-resources")]
/// The roles of one resource callsite's fields, by field index, so that
/// reading a span of it compares no field names.
#[derive(Clone, Copy)]
struct Roles {
    /// The callsite's metadata address (0: none).
    callsite: usize,
    roles: [Role; ROLES],
    /// The site the callsite's last resource on this thread named: a
    /// resource made at the same place again (a sleep in a loop) is found
    /// by comparing its file with that site's, with no copy and no lookup.
    last: Option<Last>,
}

#[cfg(feature = "tokio-resources")]
#[derive(Clone, Copy)]
struct Last {
    site: SiteId,
    /// A kind [`known_kind`] gave (compared by address).
    kind: &'static str,
    file: &'static str,
    line: u32,
}

#[cfg(feature = "tokio-resources")]
impl Roles {
    const NONE: Roles = Roles {
        callsite: 0,
        roles: [Role::Other; ROLES],
        last: None,
    };

    fn of(meta: &'static tracing::Metadata<'static>) -> Roles {
        let mut roles = [Role::Other; ROLES];
        for (f, r) in meta.fields().iter().zip(&mut roles) {
            *r = Role::of(f.name());
        }
        Roles {
            callsite: meta as *const _ as usize,
            roles,
            last: None,
        }
    }

    #[inline]
    fn role(&self, field: &tracing::field::Field) -> Role {
        match self.roles.get(field.index()) {
            Some(r) => *r,
            None => Role::of(field.name()),
        }
    }
}

#[cfg(feature = "tokio-resources")]
/// Resource callsites whose roles each thread keeps (tokio has about a
/// dozen; a thread making resources of more re-reads the names).
const CALLSITES: usize = 16;

#[cfg(feature = "tokio-resources")]
/// What a thread keeps to read resource spans: the roles of the callsites
/// it read, the sites it named, and buffers for the fields (no allocation
/// once they have grown).
struct Reader {
    callsites: [Roles; CALLSITES],
    near: NearSites,
    fields: ResourceFields,
}

#[cfg(feature = "tokio-resources")]
impl Reader {
    /// The slot of `meta`'s roles, kept from the first span of it.
    #[inline]
    fn roles(&mut self, meta: &'static tracing::Metadata<'static>) -> usize {
        let at = meta as *const _ as usize;
        let i = (at as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize
            >> (usize::BITS - CALLSITES.trailing_zeros());
        if self.callsites[i].callsite != at {
            self.callsites[i] = Roles::of(meta);
        }
        i
    }
}

#[cfg(feature = "tokio-resources")]
/// The fields of a `runtime.resource` span.
struct ResourceFields {
    /// The kind a known `concrete_type` names (no copy of it).
    known: Option<&'static str>,
    concrete_type: String,
    kind: String,
    file: String,
    has_file: bool,
    /// The file is the callsite's last site's (and was not copied).
    file_is_last: bool,
    line: u32,
    internal: bool,
}

#[cfg(feature = "tokio-resources")]
thread_local! {
    static READER: std::cell::RefCell<Reader> = const {
        std::cell::RefCell::new(Reader {
            callsites: [Roles::NONE; CALLSITES],
            near: NearSites::EMPTY,
            fields: ResourceFields {
                known: None,
                concrete_type: String::new(),
                kind: String::new(),
                file: String::new(),
                has_file: false,
                file_is_last: false,
                line: 0,
                internal: false,
            },
        })
    };
}

#[cfg(feature = "tokio-resources")]
/// What a new resource span names: `Some(site)`, or `None` for one of
/// tokio's internal resources (a semaphore inside a `Mutex`), which takes
/// its site from the resource it is made inside.
pub(crate) fn read_resource(
    attrs: &tracing::span::Attributes<'_>,
) -> Option<Result<SiteId, Arc<WaitSite>>> {
    if !RESOURCES_SEEN.load(Ordering::Relaxed) {
        RESOURCES_SEEN.store(true, Ordering::Relaxed);
    }
    READER
        .try_with(|r| {
            let r = &mut *r.borrow_mut();
            let slot = r.roles(attrs.metadata());
            let roles = &r.callsites[slot];
            let f = &mut r.fields;
            f.known = None;
            f.concrete_type.clear();
            f.kind.clear();
            f.file.clear();
            f.has_file = false;
            f.file_is_last = false;
            f.line = 0;
            f.internal = false;
            attrs.record(&mut FieldsVisitor { roles, f });
            if f.internal {
                return None;
            }
            let last = roles.last.filter(|_| f.file_is_last);
            if let (Some(l), Some(kind)) = (last, f.known)
                && l.line == f.line
                && std::ptr::eq(l.kind, kind)
            {
                return Some(Ok(l.site));
            }
            let file = match last {
                Some(l) => Some(l.file),
                None => f.has_file.then_some(f.file.as_str()),
            };
            let site = match f.known {
                Some(kind) => r.near.intern(kind, file, f.line),
                None => r
                    .near
                    .intern(&kind_of(&f.concrete_type, &f.kind), file, f.line),
            };
            if let (Ok(id), Some(kind)) = (&site, f.known)
                && let Some(file) = id.site().and_then(|s| s.location.as_ref())
            {
                r.callsites[slot].last = Some(Last {
                    site: *id,
                    kind,
                    file: &file.file,
                    line: file.line,
                });
            }
            Some(site)
        })
        .ok()
        .flatten()
}

#[cfg(feature = "tokio-resources")]
struct FieldsVisitor<'a> {
    roles: &'a Roles,
    f: &'a mut ResourceFields,
}

#[cfg(feature = "tokio-resources")]
impl tracing::field::Visit for FieldsVisitor<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match self.roles.role(field) {
            Role::ConcreteType => match known_kind(value) {
                Some(kind) => self.f.known = Some(kind),
                None => self.f.concrete_type.push_str(value),
            },
            // tokio's kind is read only for a type it does not name.
            Role::Kind if self.f.known.is_none() => self.f.kind.push_str(value),
            Role::File => {
                self.f.has_file = true;
                match self.roles.last {
                    Some(l) if l.file == value => self.f.file_is_last = true,
                    _ => self.f.file.push_str(value),
                }
            }
            _ => {}
        }
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        if self.roles.role(field) == Role::Line {
            self.f.line = u32::try_from(value).unwrap_or(u32::MAX);
        }
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        if self.roles.role(field) == Role::Line {
            self.f.line = u32::try_from(value).unwrap_or(0);
        }
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        if self.roles.role(field) == Role::Internal {
            self.f.internal = value;
        }
    }

    fn record_debug(&mut self, _field: &tracing::field::Field, _value: &dyn std::fmt::Debug) {}
}

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

    /// What `read_resource` names each resource span, as `kind file:line`.
    fn named(make: impl FnOnce()) -> Vec<String> {
        use std::sync::Mutex;
        use tracing_subscriber::prelude::*;

        struct Names(Arc<Mutex<Vec<String>>>);
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Names {
            fn on_new_span(
                &self,
                attrs: &tracing::span::Attributes<'_>,
                _: &tracing::span::Id,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                let site = match read_resource(attrs) {
                    Some(Ok(id)) => id.site().expect("kept").clone(),
                    Some(Err(own)) => own,
                    None => return,
                };
                let at = site
                    .location
                    .as_ref()
                    .map_or("-".into(), |l| format!("{}:{}", l.file, l.line));
                self.0.lock().unwrap().push(format!("{} {at}", site.kind));
            }
        }
        let names = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Names(names.clone()));
        tracing::subscriber::with_default(subscriber, make);
        Arc::try_unwrap(names).unwrap().into_inner().unwrap()
    }

    /// One callsite (as tokio's `Sleep::new` is for every sleep in a
    /// program) making resources of several types and places, in an order
    /// that defeats a cache of its last one: each is named by its own, and a
    /// file given again at the same address with other content is read
    /// again.
    #[test]
    fn one_callsite_names_each_resource_by_its_own_type_file_and_line() {
        fn make(concrete_type: &str, file: &str, line: u32) {
            let _ = tracing::trace_span!(
                parent: None,
                "runtime.resource",
                concrete_type = concrete_type,
                kind = "Sync",
                loc.file = file,
                loc.line = line,
                loc.col = 1u32,
            );
        }
        let mut reused = String::from("w/src/one.rs");
        let names = named(|| {
            make("Sleep", "w/src/a.rs", 1);
            make("Sleep", "w/src/a.rs", 1);
            make("Mutex", "w/src/a.rs", 1);
            make("Mutex", "w/src/b.rs", 1);
            make("Mutex", "w/src/b.rs", 2);
            make("Notify", "w/src/b.rs", 2);
            make("Sleep", &reused, 3);
            reused.replace_range(.., "w/src/two.rs");
            make("Sleep", &reused, 3);
        });
        assert_eq!(
            names,
            [
                "sleep w/src/a.rs:1",
                "sleep w/src/a.rs:1",
                "mutex w/src/a.rs:1",
                "mutex w/src/b.rs:1",
                "mutex w/src/b.rs:2",
                "notify w/src/b.rs:2",
                "sleep w/src/one.rs:3",
                "sleep w/src/two.rs:3",
            ]
        );
    }

    #[test]
    fn kinds_are_named_after_tokios_types() {
        assert_eq!(kind_of("Sleep", "timer"), "sleep");
        assert_eq!(kind_of("Sender|Receiver", "Sync"), "oneshot");
        assert_eq!(kind_of("", "Sync"), "sync");
        assert_eq!(kind_of("Notify", "Sync"), "notify");
    }
}
