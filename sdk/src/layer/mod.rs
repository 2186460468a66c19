//! [`CriticalPathLayer`]: the `tracing-subscriber` layer that turns the spans
//! of traced requests into critical-path nodes.
//!
//! ```
//! use cpt_sdk::layer::CriticalPathLayer;
//! use tracing_subscriber::prelude::*;
//!
//! let (layer, handle) = CriticalPathLayer::builder()
//!     .with_service("checkout")
//!     .with_sink(|record: cpt_sdk::Record| println!("{}", record.to_json()))
//!     .build();
//! let subscriber = tracing_subscriber::registry().with(layer);
//! # let _ = (subscriber, handle);
//! ```
//!
//! What the layer records, per node (a span inside a traced request):
//! creation, first poll (first enter), busy intervals (outermost enter to
//! exit, marked *nested* when the parent was entered on the same thread),
//! explicit blockers from the [task helpers](crate::task), and the end (the
//! last exit, once the span closes). When the request's root ends
//! ([`request::finish`] or the root span's close)
//! it computes the path with [`compute`](crate::path::compute::compute) and
//! emits a [`Record`](crate::Record) to the sink.
//!
//! Spans outside a traced request cost one relaxed atomic load when no
//! request is traced, and one extensions read of the parent otherwise; they
//! never allocate and never take the request lock.

mod builder;
pub mod filter;
mod finisher;
pub(crate) mod node;
pub mod request;
#[cfg(feature = "tokio-resources")]
mod resources;
mod table;
pub(crate) mod waits;

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::span::{Attributes, Id};
use tracing::{Dispatch, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::{Extensions, ExtensionsMut, LookupSpan};

pub use builder::{Builder, Handle};
use node::{NodeState, Request};

use crate::clock::Clock;
use crate::export::RecordSink;
use crate::trigger::Sampler;

/// The tracing layer. Build it with [`CriticalPathLayer::builder`].
#[derive(Clone)]
pub struct CriticalPathLayer {
    pub(crate) shared: Arc<Shared>,
    ext: Option<ExtFns>,
    /// Span id → node, for the subscriber this copy is installed in (a new
    /// table per `on_layer`: span ids are per subscriber).
    table: Arc<table::NodeTable>,
    /// Span id → tokio resource site, likewise per subscriber.
    #[cfg(feature = "tokio-resources")]
    resources: Arc<resources::ResourceTable>,
}

impl std::fmt::Debug for CriticalPathLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriticalPathLayer")
            .field("service", &self.shared.service)
            .finish_non_exhaustive()
    }
}

/// Configuration and counters shared by the layer and its [`Handle`].
pub(crate) struct Shared {
    pub(crate) service: Arc<str>,
    pub(crate) sink: Option<Arc<dyn RecordSink>>,
    pub(crate) sampler: Arc<dyn Sampler>,
    pub(crate) clock: Arc<dyn Clock>,
    /// Traced requests begun and not finished. Zero means every span is
    /// outside a traced request: callbacks return after this one load.
    pub(crate) in_flight: AtomicU64,
    pub(crate) emitted: AtomicU64,
    /// Computes the paths of detached requests off the request path.
    pub(crate) finisher: finisher::Finisher,
}

impl Shared {
    /// Compute an ended request's path, emit its record, and return the
    /// outcome too (the path is cloned only when both are wanted).
    fn emit(&self, request: &Request, ended: node::Ended) -> node::Outcome {
        let outcome = ended.outcome(request);
        if request.emit_record
            && let Some(sink) = &self.sink
        {
            self.send(sink, request.record(outcome.clone()));
        }
        outcome
    }

    /// Compute an ended request's path and emit its record, which takes the
    /// path (for requests nobody waits for).
    fn emit_only(&self, request: &Request, ended: node::Ended) {
        if request.emit_record
            && let Some(sink) = &self.sink
        {
            let record = request.record(ended.outcome(request));
            self.send(sink, record);
        }
    }

    fn send(&self, sink: &Arc<dyn RecordSink>, record: crate::record::Record) {
        sink.emit(record);
        self.emitted.fetch_add(1, Ordering::Relaxed);
    }
}

/// Registry access for a subscriber type fixed at `on_layer` time, so the
/// layer itself stays non-generic (tracing-error's `WithContext` trick).
#[derive(Clone, Copy)]
struct ExtFns {
    read: ReadExt,
    write: WriteExt,
}

type ReadExt = fn(&Dispatch, &Id, &mut dyn FnMut(&Extensions<'_>)) -> bool;
type WriteExt = fn(&Dispatch, &Id, &mut dyn FnMut(&mut ExtensionsMut<'_>)) -> bool;

fn read_ext<S>(d: &Dispatch, id: &Id, f: &mut dyn FnMut(&Extensions<'_>)) -> bool
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let Some(s) = d.downcast_ref::<S>() else {
        return false;
    };
    let Some(span) = s.span(id) else {
        return false;
    };
    f(&span.extensions());
    true
}

fn write_ext<S>(d: &Dispatch, id: &Id, f: &mut dyn FnMut(&mut ExtensionsMut<'_>)) -> bool
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let Some(s) = d.downcast_ref::<S>() else {
        return false;
    };
    let Some(span) = s.span(id) else {
        return false;
    };
    f(&mut span.extensions_mut());
    true
}

// === impl CriticalPathLayer ===

impl CriticalPathLayer {
    /// A builder with the defaults: service `"unknown"`, no sink,
    /// [`DefaultSampler`](crate::trigger::DefaultSampler), [`SystemClock`](crate::clock::SystemClock).
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The node state of a span, if it is a node of a traced request.
    pub(crate) fn node(&self, d: &Dispatch, id: &Id) -> Option<NodeState> {
        if let Some(state) = self.table.get(id) {
            return Some(state);
        }
        if self.table.spilled.load(Ordering::Acquire) == 0 {
            return None;
        }
        let ext = self.ext?;
        let mut out = None;
        (ext.read)(d, id, &mut |e| out = e.get::<NodeState>().cloned());
        out
    }

    /// Make a span a node (replacing what it was).
    pub(crate) fn set_node(&self, d: &Dispatch, id: &Id, state: NodeState) -> bool {
        let Some(ext) = self.ext else { return false };
        self.table.allocate();
        let Err(state) = self.table.insert(id, state) else {
            return true;
        };
        let mut state = Some(state);
        (ext.write)(d, id, &mut |e| {
            if let Some(s) = state.take()
                && e.replace(s).is_none()
            {
                self.table.spilled.fetch_add(1, Ordering::AcqRel);
            }
        })
    }

    /// The node state of a span, from a layer callback.
    #[inline]
    fn lookup<S>(&self, id: &Id, ctx: &Context<'_, S>) -> Option<NodeState>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        if let Some(state) = self.table.get(id) {
            return Some(state);
        }
        if self.table.spilled.load(Ordering::Acquire) == 0 {
            return None;
        }
        ctx.span(id)?.extensions().get::<NodeState>().cloned()
    }

    /// Finish a request now; emit its record when asked.
    pub(crate) fn finish(&self, request: &Request) -> Option<node::Outcome> {
        let ended = request.end(self.shared.clock.now())?;
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        Some(self.shared.emit(request, ended))
    }

    /// End a request now; compute its path and emit its record in the
    /// background (see [`finisher`]). True if the request was traced and
    /// not finished before.
    pub(crate) fn finish_detached(&self, request: &Arc<Request>) -> bool {
        let Some(ended) = request.end(self.shared.clock.now()) else {
            return false;
        };
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        if !request.emit_record || self.shared.sink.is_none() {
            return true;
        }
        if let Err((request, ended)) = self
            .shared
            .finisher
            .submit(&self.shared, (request.clone(), ended))
        {
            self.shared.emit_only(&request, ended);
        }
        true
    }

    #[inline]
    fn idle(&self) -> bool {
        self.shared.in_flight.load(Ordering::Relaxed) == 0
    }

    fn key(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// Whether a node of a traced request is entered on this thread (true
    /// when the thread cannot tell).
    #[cfg(feature = "tokio-resources")]
    fn in_traced_node(&self) -> bool {
        if self.idle() {
            return false;
        }
        let key = self.key();
        ENTERED
            .try_with(|stack| {
                stack
                    .try_borrow()
                    .map_or(true, |s| s.iter().any(|e| e.0 == key && e.2.is_some()))
            })
            .unwrap_or(true)
    }

    /// The parent of a new span as this thread's entered stack knows it:
    /// `Some(Some(state))` a node, `Some(None)` a span that is not a node,
    /// `None` unknown (ask the registry).
    ///
    /// A contextual parent is the registry's current span, which is the top
    /// of the stack whenever the stack is complete: every span this layer
    /// sees entered while a request is traced is on it, nodes or not. Spans a
    /// per-layer filter hides are not, matching the registry, whose parent
    /// skips them too. An empty stack means spans may have been entered
    /// before tracing began: unknown.
    fn cached_parent(&self, attrs: &Attributes<'_>) -> Option<Option<NodeState>> {
        let key = self.key();
        ENTERED.with_borrow(|stack| {
            let mut mine = stack.iter().rev().filter(|e| e.0 == key);
            if attrs.is_contextual() {
                mine.next().map(|e| e.2.clone())
            } else {
                let parent = attrs.parent()?;
                mine.find(|e| e.1 == *parent).map(|e| e.2.clone())
            }
        })
    }

    fn push_entered(&self, id: &Id, state: Option<NodeState>) {
        let key = self.key();
        ENTERED.with_borrow_mut(|stack| {
            // A guard leaked with `mem::forget` never exits: bound the stack
            // and let the registry answer for what does not fit.
            if stack.len() < MAX_ENTERED {
                stack.push((key, id.clone(), state));
            }
        });
    }

    /// Remove `id`'s innermost entry (normally the top: exits nest); its
    /// state as [`cached_parent`](Self::cached_parent) gives it.
    fn pop_entered(&self, id: &Id) -> Option<Option<NodeState>> {
        let key = self.key();
        ENTERED.with_borrow_mut(|stack| {
            if let Some(top) = stack.last()
                && top.0 == key
                && top.1 == *id
            {
                return stack.pop().map(|e| e.2);
            }
            let i = stack.iter().rposition(|e| e.0 == key && e.1 == *id)?;
            Some(stack.remove(i).2)
        })
    }
}

#[cfg(feature = "tokio-resources")]
impl CriticalPathLayer {
    /// Keep the site of a new `runtime.resource` span in the resource
    /// table (one of tokio's internal resources, a `Mutex`'s semaphore,
    /// takes the site of the resource it is made in).
    fn new_resource<S>(&self, attrs: &Attributes<'_>, id: &Id, ctx: &Context<'_, S>)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        // The slot is taken after the lookup: a compare-and-swap holds back
        // the loads that follow it, and the lookup is nearly all loads.
        let known = waits::known_resource(attrs, || self.in_traced_node());
        let mut slot = self.resources.claim(id);
        let read = match known {
            waits::Known::Site(site) => {
                if let Some(slot) = slot.take() {
                    return slot.set(site.0);
                }
                Some(Ok(site))
            }
            waits::Known::Internal => None,
            waits::Known::Unread => waits::read_resource(attrs),
        };
        let site = match read {
            Some(site) => site,
            None => match ctx
                .lookup_current()
                .and_then(|outer| self.resource_site(&outer.id(), ctx))
            {
                Some(outer) => outer,
                None => {
                    if let Some(slot) = slot {
                        slot.release();
                    }
                    return;
                }
            },
        };
        let own = match (site, slot) {
            (Ok(site), Some(slot)) => return slot.set(site.0),
            (Ok(site), None) => site.site().cloned(),
            (Err(own), slot) => {
                if let Some(slot) = slot {
                    slot.release();
                }
                Some(own)
            }
        };
        if let Some(own) = own
            && let Some(span) = ctx.span(id)
            && span
                .extensions_mut()
                .replace(waits::Resource(own))
                .is_none()
        {
            self.resources.spilled.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The site of the resource span `id`, if it is one.
    fn resource_site<S>(
        &self,
        id: &Id,
        ctx: &Context<'_, S>,
    ) -> Option<Result<waits::SiteId, Arc<waits::WaitSite>>>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        if let Some(site) = self.resources.get(id) {
            return Some(Ok(site));
        }
        if self.resources.spilled.load(Ordering::Acquire) == 0 {
            return None;
        }
        let span = ctx.span(id)?;
        let ext = span.extensions();
        ext.get::<waits::Resource>().map(|r| Err(r.0.clone()))
    }

    /// A tokio resource was polled: tell the innermost node entered on this
    /// thread, naming the outermost resource entered inside it (an
    /// `Interval` rather than the `Sleep` it polls).
    fn poll_op<S>(&self, event: &tracing::Event<'_>, ctx: &Context<'_, S>)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let mut ready = waits::ReadyVisitor::default();
        event.record(&mut ready);
        let Some(ready) = ready.0 else { return };
        let key = self.key();
        ENTERED.with_borrow(|stack| {
            let mut resource = None;
            for e in stack.iter().rev().filter(|e| e.0 == key) {
                if let Some(state) = &e.2 {
                    let Some((resource, site)) = resource else {
                        return;
                    };
                    let site = match site {
                        Ok(id) => match waits::SiteId::site(id) {
                            Some(site) => site,
                            None => return,
                        },
                        Err(ref own) => own,
                    };
                    state
                        .request
                        .poll_op(state.node, Id::into_u64(&resource), site, ready);
                    return;
                }
                if let Some(site) = self.resource_site(&e.1, ctx) {
                    resource = Some((e.1.clone(), site));
                }
            }
        });
    }
}

/// Entries beyond this on one thread's entered stack are not cached.
const MAX_ENTERED: usize = 64;

thread_local! {
    /// Spans entered on this thread while a request was traced, innermost
    /// last, with the layer that saw them and their node state (`None`: not
    /// a node). Exit, and creating a child of the current span, take the
    /// state from here instead of a registry lookup. A span cannot close
    /// while it is entered, so an entry never outlives its span.
    static ENTERED: RefCell<Vec<(usize, Id, Option<NodeState>)>> = const { RefCell::new(Vec::new()) };
}

/// Reads the `cpt.name` field, which names a node dynamically.
struct NameVisitor(Option<Arc<str>>);

impl tracing::field::Visit for NameVisitor {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "cpt.name" {
            self.0 = Some(Arc::from(value));
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "cpt.name" {
            self.0 = Some(Arc::from(format!("{value:?}")));
        }
    }
}

impl CriticalPathLayer {
    /// A span closed that is not in the resource table: release what the
    /// layer keeps of it, and close it if it is a node.
    // Out of line with named waits, so that a resource's close (the
    // table's release alone) saves no registers for this path's sake.
    #[cfg_attr(feature = "tokio-resources", inline(never))]
    fn close<S>(&self, id: Id, ctx: Context<'_, S>)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        #[cfg(feature = "tokio-resources")]
        if self.resources.spilled.load(Ordering::Acquire) > 0
            && let Some(span) = ctx.span(&id)
            && span.extensions_mut().remove::<waits::Resource>().is_some()
        {
            self.resources.spilled.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let mut state = self.table.remove(&id);
        if self.table.spilled.load(Ordering::Acquire) > 0
            && let Some(span) = ctx.span(&id)
            && let Some(s) = span.extensions_mut().remove::<NodeState>()
        {
            self.table.spilled.fetch_sub(1, Ordering::AcqRel);
            state = state.or(Some(s));
        }
        if self.idle() {
            return;
        }
        let Some(s) = state else { return };
        if s.node == Request::root() {
            self.finish(&s.request);
        } else {
            s.request.close(s.node, || self.shared.clock.now());
        }
    }
}

impl<S> Layer<S> for CriticalPathLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_layer(&mut self, _subscriber: &mut S) {
        self.ext = Some(ExtFns {
            read: read_ext::<S>,
            write: write_ext::<S>,
        });
        self.table = Arc::default();
        #[cfg(feature = "tokio-resources")]
        {
            self.resources = Arc::default();
        }
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        // Resources are named whether or not a request is traced: a pool's
        // semaphore is made at start.
        #[cfg(feature = "tokio-resources")]
        if waits::is_resource(attrs.metadata()) {
            self.new_resource(attrs, id, &ctx);
            return;
        }
        // A span made with `parent: None` is a node only by `begin`.
        if self.idle() || attrs.is_root() {
            return;
        }
        // Spans inside a resource (tokio's `async_op` spans, and the
        // `async_op.poll` spans inside those) are no nodes: kept as such, so
        // that their own children are known without a registry lookup.
        #[cfg(feature = "tokio-resources")]
        if let Some(parent) = attrs.parent() {
            if self.resources.find(parent).is_some() {
                self.resources.insert_inside(id);
                return;
            }
            if self.resource_site(parent, &ctx).is_some() {
                return;
            }
        }
        // The parent is usually the span this thread is in: take its state
        // from the entered stack rather than from the registry (and when
        // that span is not a node, this one is not either: no lookup at all).
        let cached = self.cached_parent(attrs);
        if matches!(cached, Some(None)) {
            return;
        }
        let state = match cached {
            Some(Some(state)) => state,
            _ => {
                let Some(span) = ctx.span(id) else { return };
                let Some(parent) = span.parent() else { return };
                let Some(state) = self.lookup(&parent.id(), &ctx) else {
                    return;
                };
                state
            }
        };
        let meta = attrs.metadata();
        let name = if meta.fields().field("cpt.name").is_some() {
            let mut v = NameVisitor(None);
            attrs.record(&mut v);
            v.0
        } else {
            None
        };
        let now = self.shared.clock.now();
        if let Some(node) = state.request.add_child(state.node, meta, name, now) {
            let state = NodeState {
                request: state.request,
                node,
            };
            if let Err(state) = self.table.insert(id, state)
                && let Some(span) = ctx.span(id)
                && span.extensions_mut().replace(state).is_none()
            {
                self.table.spilled.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    #[cfg(feature = "tokio-resources")]
    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        if self.idle() || !waits::is_poll_op(event.metadata()) {
            return;
        }
        self.poll_op(event, &ctx);
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if self.idle() {
            return;
        }
        let state = self.lookup(id, &ctx);
        if let Some(s) = &state {
            s.request.enter(s.node, self.shared.clock.now());
        }
        self.push_entered(id, state);
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        // Popped even when idle, so that the stack never keeps a node whose
        // request finished while it was entered.
        let cached = self.pop_entered(id);
        if self.idle() {
            return;
        }
        let state = match cached {
            Some(state) => state,
            None => self.lookup(id, &ctx),
        };
        if let Some(s) = state {
            s.request.exit(s.node, self.shared.clock.now());
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        // The slots are released even when idle: the registry may reuse the
        // id as soon as this returns.
        // A resource is no node.
        #[cfg(feature = "tokio-resources")]
        if self.resources.remove(&id) {
            return;
        }
        self.close(id, ctx);
    }
}
