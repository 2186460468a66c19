//! Reading tokio's `runtime.resource` spans: which site a new resource
//! names, found per thread with as little of the span read as can be.
//!
//! A thread keeps, per resource callsite, its fields' roles by index (so no
//! field name is compared) and, for one of tokio's, the kind its resources
//! are. tokio gives a resource's type as a literal and its file as a
//! `Location`'s `'static` string, so a place the thread named before is
//! found by the address of its file and its line ([`known_resource`]); only
//! a place not seen before is read as text ([`read_resource`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{NearSites, RESOURCES_SEEN, SiteId, WaitSite, kind_of, known_kind};

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

impl Role {
    /// The role of the field `name` (cold: a callsite's roles are kept by
    /// index).
    #[cold]
    #[inline(never)]
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

/// Fields a callsite's roles are kept for; a field past them is read by
/// its name.
const ROLES: usize = 8;

/// What a thread knows of one resource callsite: its fields' roles, by
/// field index, so that reading a span of it compares no field names; and,
/// for one of tokio's, the kind its resources are.
#[derive(Clone, Copy)]
struct Roles {
    /// The callsite's metadata address (0: none).
    callsite: usize,
    roles: [Role; ROLES],
    /// One of tokio's callsites (its target is under `tokio::`). tokio
    /// gives a resource's type as a literal and its file as a
    /// `std::panic::Location`'s, which is `'static`: at such a callsite the
    /// type never changes, and a file at an address it was seen at before is
    /// the same text.
    tokio: bool,
    /// The kind of every resource of this callsite, once one was read:
    /// set only for tokio's callsites, and for a type [`known_kind`] names.
    kind: Option<&'static str>,
    /// For a callsite of tokio's of a [`PER_USE`] kind, once one was read:
    /// the site of its kind alone, which names a resource made while no
    /// traced node runs (see [`known_resource`]).
    unplaced: Option<SiteId>,
}

impl Roles {
    const NONE: Roles = Roles {
        callsite: 0,
        roles: [Role::Other; ROLES],
        tokio: false,
        kind: None,
        unplaced: None,
    };

    fn of(meta: &'static tracing::Metadata<'static>) -> Roles {
        let mut roles = [Role::Other; ROLES];
        for (f, r) in meta.fields().iter().zip(&mut roles) {
            *r = Role::of(f.name());
        }
        Roles {
            callsite: meta as *const _ as usize,
            roles,
            tokio: meta.target().starts_with("tokio::"),
            kind: None,
            unplaced: None,
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

/// Resource callsites whose roles each thread keeps, in sets of
/// [`CALLSITE_WAYS`] (tokio has about a dozen: sets, not one slot per
/// callsite, so that two it uses in turn do not push each other out; a
/// thread making resources of more re-reads the names).
const CALLSITES: usize = 32;
const CALLSITE_WAYS: usize = 4;

/// A resource of one of tokio's callsites, known by the addresses of its
/// strings rather than their text (see [`Roles::tokio`]).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Placed {
    /// The callsite's kind (a [`known_kind`] string, by address).
    kind: usize,
    /// The file's address and length (0, 0: none).
    file: (usize, usize),
    line: u32,
}

/// Sets of [`PlacedSites`], and the places each holds: a thread finds the
/// last 64 places it named (more, when they spread evenly over the sets).
const PLACED_SETS: usize = 16;
const PLACED_WAYS: usize = 4;

/// The sites a thread named for tokio's resources, by where their strings
/// are: found with no string compared, copied or hashed. Set-associative,
/// the latest first in its set: `(place, id + 1)` (0: none).
struct PlacedSites([[(Placed, u32); PLACED_WAYS]; PLACED_SETS]);

impl PlacedSites {
    const EMPTY: PlacedSites = PlacedSites(
        [[(
            Placed {
                kind: 0,
                file: (0, 0),
                line: 0,
            },
            0,
        ); PLACED_WAYS]; PLACED_SETS],
    );

    #[inline]
    fn set(&mut self, p: &Placed) -> &mut [(Placed, u32); PLACED_WAYS] {
        let h = (p.file.0 ^ p.kind.rotate_left(17)) as u64 ^ u64::from(p.line) << 40;
        let i = h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - PLACED_SETS.trailing_zeros());
        &mut self.0[i as usize]
    }

    #[inline]
    fn get(&mut self, p: &Placed) -> Option<SiteId> {
        let (_, id) = self.set(p).iter().find(|(at, id)| *id != 0 && at == p)?;
        Some(SiteId(id - 1))
    }

    /// Keep `p`'s site first in its set (the set's last is forgotten).
    fn put(&mut self, p: Placed, id: SiteId) {
        let set = self.set(&p);
        set.copy_within(..PLACED_WAYS - 1, 1);
        set[0] = (p, id.0 + 1);
    }
}

/// What a thread keeps to read resource spans: the roles of the callsites
/// it read and the sites it named. Nothing in it needs dropping, so that
/// the thread-local holding it is reached with no check of its state.
struct Reader {
    callsites: [Roles; CALLSITES],
    placed: PlacedSites,
    near: NearSites,
}

impl Reader {
    /// The slot of `meta`'s roles, kept from the first span of it (a new
    /// callsite goes first in its set, and the set's last is forgotten).
    #[inline(always)]
    fn roles(&mut self, meta: &'static tracing::Metadata<'static>) -> usize {
        let at = meta as *const _ as usize;
        let sets = CALLSITES / CALLSITE_WAYS;
        let set = ((at as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - sets.trailing_zeros()))
            as usize
            * CALLSITE_WAYS;
        let ways = &mut self.callsites[set..set + CALLSITE_WAYS];
        if let Some(way) = ways.iter().position(|r| r.callsite == at) {
            return set + way;
        }
        ways.copy_within(..CALLSITE_WAYS - 1, 1);
        ways[0] = Roles::of(meta);
        set
    }

    /// Read a resource span of the callsite in `slot` field by field: its
    /// type, kind and file as text. What it names is then found by
    /// [`known_resource`] too, for one of tokio's callsites.
    fn read(
        &mut self,
        attrs: &tracing::span::Attributes<'_>,
        slot: usize,
    ) -> Option<Result<SiteId, Arc<WaitSite>>> {
        FIELDS
            .try_with(|f| self.read_into(attrs, slot, &mut f.borrow_mut()))
            .unwrap_or_else(|_| {
                let mut own = ResourceFields::EMPTY;
                self.read_into(attrs, slot, &mut own)
            })
    }

    /// [`read`](Self::read), with `f` to read the fields into.
    fn read_into(
        &mut self,
        attrs: &tracing::span::Attributes<'_>,
        slot: usize,
        f: &mut ResourceFields,
    ) -> Option<Result<SiteId, Arc<WaitSite>>> {
        let roles = &self.callsites[slot];
        f.known = None;
        f.concrete_type.clear();
        f.kind.clear();
        f.file.clear();
        f.file_at = (0, 0);
        f.has_file = false;
        f.line = 0;
        f.internal = false;
        attrs.record(&mut FieldsVisitor { roles, f });
        let tokio = roles.tokio;
        if tokio && self.callsites[slot].kind != f.known {
            let per_use = f.known.filter(|k| PER_USE.contains(k));
            self.callsites[slot].kind = f.known;
            self.callsites[slot].unplaced =
                per_use.and_then(|kind| self.near.intern(kind, None, 0).ok());
        }
        if f.internal {
            return None;
        }
        let file = f.has_file.then_some(f.file.as_str());
        let Some(kind) = f.known else {
            let kind = kind_of(&f.concrete_type, &f.kind);
            return Some(self.near.intern(&kind, file, f.line));
        };
        let site = self.near.intern(kind, file, f.line);
        if let (true, Ok(id)) = (tokio, &site) {
            let placed = Placed {
                kind: kind.as_ptr() as usize,
                file: f.file_at,
                line: f.line,
            };
            self.placed.put(placed, *id);
        }
        Some(site)
    }
}

/// The fields of a `runtime.resource` span.
struct ResourceFields {
    /// The kind a known `concrete_type` names (no copy of it).
    known: Option<&'static str>,
    concrete_type: String,
    kind: String,
    file: String,
    /// The file's address and length.
    file_at: (usize, usize),
    has_file: bool,
    line: u32,
    internal: bool,
}

impl ResourceFields {
    const EMPTY: ResourceFields = ResourceFields {
        known: None,
        concrete_type: String::new(),
        kind: String::new(),
        file: String::new(),
        file_at: (0, 0),
        has_file: false,
        line: 0,
        internal: false,
    };
}

thread_local! {
    static READER: std::cell::RefCell<Reader> = const {
        std::cell::RefCell::new(Reader {
            callsites: [Roles::NONE; CALLSITES],
            placed: PlacedSites::EMPTY,
            near: NearSites::EMPTY,
        })
    };
    /// Buffers to read a resource's fields into as text (no allocation
    /// once they have grown).
    static FIELDS: std::cell::RefCell<ResourceFields> =
        const { std::cell::RefCell::new(ResourceFields::EMPTY) };
}

/// What a thread already knows of a new resource span, with nothing read
/// as text: small enough to come back in a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Known {
    /// It names this site.
    Site(SiteId),
    /// One of tokio's internal resources (see [`read_resource`]).
    Internal,
    /// Not known: [`read_resource`] reads it.
    Unread,
}

/// Kinds of resources made for a use (a sleep, a timeout, an interval's
/// ticks, a reply's channel), most often where they are awaited.
const PER_USE: [&str; 3] = ["sleep", "interval", "oneshot"];

/// What this thread knows of a new resource span of one of tokio's
/// callsites without reading its strings: its file is found by its address
/// (see [`Roles::tokio`]) among the sites the thread named before.
///
/// A timer or oneshot channel ([`PER_USE`]) made while `traced_here()` is
/// false (no node of a traced request runs on this thread: a background
/// task's sleep, an unsampled request's) is named by its kind alone, with
/// none of its fields read: such a resource is rarely waited on by a traced
/// node, and reading where it was made would cost every sleep of the
/// program. A lock, semaphore or barrier is read wherever it is made: a
/// pool's semaphore is made at start.
#[inline]
pub(crate) fn known_resource(
    attrs: &tracing::span::Attributes<'_>,
    traced_here: impl FnOnce() -> bool,
) -> Known {
    READER
        .try_with(|r| {
            let r = &mut *r.borrow_mut();
            let slot = r.roles(attrs.metadata());
            let Some(kind) = r.callsites[slot].kind else {
                return Known::Unread;
            };
            if let Some(site) = r.callsites[slot].unplaced
                && !traced_here()
            {
                return Known::Site(site);
            }
            let mut at = PlacedVisitor {
                roles: &r.callsites[slot],
                file: (0, 0),
                line: 0,
                internal: false,
            };
            attrs.record(&mut at);
            if at.internal {
                return Known::Internal;
            }
            let placed = Placed {
                kind: kind.as_ptr() as usize,
                file: at.file,
                line: at.line,
            };
            r.placed.get(&placed).map_or(Known::Unread, Known::Site)
        })
        .unwrap_or(Known::Unread)
}

/// What a new resource span names, read field by field: `Some(site)`, or
/// `None` for one of tokio's internal resources (a semaphore inside a
/// `Mutex`), which takes its site from the resource it is made inside.
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
            r.read(attrs, slot)
        })
        .ok()
        .flatten()
}

/// Reads a resource span of one of tokio's callsites by where its file
/// is, not what it says.
struct PlacedVisitor<'a> {
    roles: &'a Roles,
    file: (usize, usize),
    line: u32,
    internal: bool,
}

impl PlacedVisitor<'_> {
    /// A field past those whose roles are kept.
    #[cold]
    #[inline(never)]
    fn wide(&mut self, field: &tracing::field::Field, value: Field<'_>) {
        match (Role::of(field.name()), value) {
            (Role::File, Field::Str(file)) => self.file = (file.as_ptr() as usize, file.len()),
            (Role::Line, Field::U64(line)) => self.line = u32::try_from(line).unwrap_or(u32::MAX),
            (Role::Line, Field::I64(line)) => self.line = u32::try_from(line).unwrap_or(0),
            (Role::Internal, Field::Bool(internal)) => self.internal = internal,
            _ => {}
        }
    }
}

/// A field's value, for [`PlacedVisitor::wide`].
enum Field<'a> {
    Str(&'a str),
    U64(u64),
    I64(i64),
    Bool(bool),
}

impl tracing::field::Visit for PlacedVisitor<'_> {
    // Called for each field of each resource: no call but a tail call, so
    // that nothing is saved on the stack.
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match self.roles.roles.get(field.index()) {
            Some(Role::File) => self.file = (value.as_ptr() as usize, value.len()),
            Some(_) => {}
            None => self.wide(field, Field::Str(value)),
        }
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        match self.roles.roles.get(field.index()) {
            Some(Role::Line) => self.line = u32::try_from(value).unwrap_or(u32::MAX),
            Some(_) => {}
            None => self.wide(field, Field::U64(value)),
        }
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        match self.roles.roles.get(field.index()) {
            Some(Role::Line) => self.line = u32::try_from(value).unwrap_or(0),
            Some(_) => {}
            None => self.wide(field, Field::I64(value)),
        }
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        match self.roles.roles.get(field.index()) {
            Some(Role::Internal) => self.internal = value,
            Some(_) => {}
            None => self.wide(field, Field::Bool(value)),
        }
    }

    fn record_debug(&mut self, _field: &tracing::field::Field, _value: &dyn std::fmt::Debug) {}
}

struct FieldsVisitor<'a> {
    roles: &'a Roles,
    f: &'a mut ResourceFields,
}

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
                self.f.file_at = (value.as_ptr() as usize, value.len());
                self.f.file.push_str(value);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A resource span as one of tokio's callsites makes it; each use of
    /// the macro is a callsite of its own.
    macro_rules! tokio_resource {
        ($target:literal, $type:literal, $kind:literal, $file:expr, $line:expr) => {
            drop(tracing::trace_span!(
                target: $target,
                parent: None,
                "runtime.resource",
                concrete_type = $type,
                kind = $kind,
                loc.file = $file,
                loc.line = $line,
                loc.col = 1u32,
            ))
        };
    }

    /// What each resource span is named, as `kind file:line`, as the layer
    /// names it inside a traced node: by [`known_resource`] first (then
    /// marked `(known)`), else by [`read_resource`]; `internal` for one of
    /// tokio's internal ones.
    fn named(make: impl FnOnce()) -> Vec<String> {
        named_where(true, make)
    }

    /// [`named`], inside a traced node or not.
    fn named_where(traced: bool, make: impl FnOnce()) -> Vec<String> {
        use std::sync::Mutex;
        use tracing_subscriber::prelude::*;

        struct Names(Arc<Mutex<Vec<String>>>, bool);
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Names {
            fn on_new_span(
                &self,
                attrs: &tracing::span::Attributes<'_>,
                _: &tracing::span::Id,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                let (read, known) = match known_resource(attrs, || self.1) {
                    Known::Site(id) => (Some(Ok(id)), " (known)"),
                    Known::Internal => (None, " (known)"),
                    Known::Unread => (read_resource(attrs), ""),
                };
                let show = |s: &WaitSite| {
                    let at = s
                        .location
                        .as_ref()
                        .map_or("-".into(), |l| format!("{}:{}", l.file, l.line));
                    format!("{} {at}", s.kind)
                };
                let name = match read {
                    Some(Ok(id)) => show(id.site().expect("kept")),
                    Some(Err(own)) => show(&own),
                    None => "internal".into(),
                };
                self.0.lock().unwrap().push(format!("{name}{known}"));
            }
        }
        let names = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Names(names.clone(), traced));
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

    /// tokio's callsites give a resource's type as a literal and its file
    /// as a `Location`'s: a place seen before is known by the addresses of
    /// its strings, with nothing read as text; the same text at another
    /// address is read, and is the same site.
    #[test]
    fn a_tokio_callsite_knows_a_place_it_named_before_by_its_address() {
        fn make(file: &'static str, line: u32) {
            tokio_resource!("tokio::time::sleep", "Sleep", "timer", file, line);
        }
        fn internal() {
            let _ = tracing::trace_span!(
                target: "tokio::sync::batch_semaphore",
                parent: None,
                "runtime.resource",
                concrete_type = "Semaphore",
                kind = "Sync",
                is_internal = true,
            );
        }
        let copy: &'static str = Box::leak(String::from("k/src/a.rs").into_boxed_str());
        let names = named(|| {
            make("k/src/a.rs", 1);
            make("k/src/a.rs", 1);
            make("k/src/a.rs", 2);
            make("k/src/b.rs", 1);
            make(copy, 1);
            make("k/src/a.rs", 1);
            make(copy, 1);
            make("k/src/a.rs", 2);
            internal();
            internal();
        });
        assert_eq!(
            names,
            [
                // The callsite's first: its kind is not known yet.
                "sleep k/src/a.rs:1",
                "sleep k/src/a.rs:1 (known)",
                "sleep k/src/a.rs:2",
                "sleep k/src/b.rs:1",
                "sleep k/src/a.rs:1",
                "sleep k/src/a.rs:1 (known)",
                "sleep k/src/a.rs:1 (known)",
                "sleep k/src/a.rs:2 (known)",
                "internal",
                "internal (known)",
            ]
        );
        // More places of one file than the thread keeps: each is still
        // named by its own line, whether known or read.
        let names = named(|| {
            for line in (1..=200).chain(1..=200) {
                make("k/src/c.rs", line);
            }
        });
        let lines: Vec<String> = (1..=200)
            .chain(1..=200)
            .map(|line| format!("sleep k/src/c.rs:{line}"))
            .collect();
        let read: Vec<&str> = names
            .iter()
            .map(|n| n.trim_end_matches(" (known)"))
            .collect();
        assert_eq!(read, lines);
    }

    /// Where no traced node runs, tokio's timers and oneshot channels are
    /// named by their kind alone, with nothing read (the callsite's first
    /// is read, to learn its kind); its locks and semaphores are read as
    /// anywhere.
    #[test]
    fn a_timer_or_oneshot_made_outside_traced_nodes_is_named_by_its_kind() {
        fn sleep(line: u32) {
            tokio_resource!("tokio::time::sleep", "Sleep", "timer", "u/src/a.rs", line);
        }
        fn semaphore(line: u32) {
            tokio_resource!(
                "tokio::sync::semaphore",
                "Semaphore",
                "Sync",
                "u/src/a.rs",
                line
            );
        }
        fn oneshot(line: u32) {
            tokio_resource!(
                "tokio::sync::oneshot",
                "Sender|Receiver",
                "Sync",
                "u/src/a.rs",
                line
            );
        }
        let outside = named_where(false, || {
            sleep(1);
            sleep(2);
            oneshot(5);
            oneshot(6);
            semaphore(3);
            semaphore(4);
            semaphore(4);
        });
        assert_eq!(
            outside,
            [
                "sleep u/src/a.rs:1",
                "sleep - (known)",
                "oneshot u/src/a.rs:5",
                "oneshot - (known)",
                "semaphore u/src/a.rs:3",
                "semaphore u/src/a.rs:4",
                "semaphore u/src/a.rs:4 (known)",
            ]
        );
        let inside = named_where(true, || {
            sleep(1);
            sleep(2);
            sleep(2);
        });
        // In a traced node each is read, or known by where it was read.
        assert_eq!(
            inside,
            [
                "sleep u/src/a.rs:1 (known)",
                "sleep u/src/a.rs:2",
                "sleep u/src/a.rs:2 (known)",
            ]
        );
    }

    /// Four of tokio's callsites used in turn stay known: they may share a
    /// set of the thread's callsite table, and do not push one another out.
    #[test]
    fn callsites_used_in_turn_stay_known() {
        let names = named(|| {
            for _ in 0..2 {
                tokio_resource!("tokio::time::sleep", "Sleep", "timer", "c/src/a.rs", 1u32);
                tokio_resource!("tokio::time::sleep", "Sleep", "timer", "c/src/a.rs", 2u32);
                tokio_resource!("tokio::time::sleep", "Sleep", "timer", "c/src/a.rs", 3u32);
                tokio_resource!("tokio::time::sleep", "Sleep", "timer", "c/src/a.rs", 4u32);
            }
        });
        assert_eq!(
            &names[4..],
            [
                "sleep c/src/a.rs:1 (known)",
                "sleep c/src/a.rs:2 (known)",
                "sleep c/src/a.rs:3 (known)",
                "sleep c/src/a.rs:4 (known)",
            ]
        );
    }
}
