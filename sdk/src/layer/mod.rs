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
//! ([`request::finish`](crate::request::finish) or the root span's close)
//! it computes the path with [`compute`](crate::path::compute::compute) and
//! emits a [`Record`](crate::Record) to the sink.
//!
//! Spans outside a traced request cost one relaxed atomic load when no
//! request is traced, and one extensions read of the parent otherwise; they
//! never allocate and never take the request lock.

mod builder;
pub(crate) mod node;

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
use crate::record::RecordSink;
use crate::trigger::Sampler;

/// The tracing layer. Build it with [`CriticalPathLayer::builder`].
#[derive(Clone)]
pub struct CriticalPathLayer {
    pub(crate) shared: Arc<Shared>,
    ext: Option<ExtFns>,
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
        let ext = self.ext?;
        let mut out = None;
        (ext.read)(d, id, &mut |e| out = e.get::<NodeState>().cloned());
        out
    }

    /// Make a span a node (replacing what it was).
    pub(crate) fn set_node(&self, d: &Dispatch, id: &Id, state: NodeState) -> bool {
        let Some(ext) = self.ext else { return false };
        let mut state = Some(state);
        (ext.write)(d, id, &mut |e| {
            if let Some(s) = state.take() {
                e.replace(s);
            }
        })
    }

    /// Finish a request now; emit its record when asked.
    pub(crate) fn finish(&self, request: &Request) -> Option<node::Outcome> {
        let now = self.shared.clock.now();
        let outcome = request.finish(now)?;
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        if request.emit_record
            && let Some(sink) = &self.shared.sink
        {
            sink.emit(request.record(&outcome));
            self.shared.emitted.fetch_add(1, Ordering::Relaxed);
        }
        Some(outcome)
    }

    #[inline]
    fn idle(&self) -> bool {
        self.shared.in_flight.load(Ordering::Relaxed) == 0
    }
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

impl<S> Layer<S> for CriticalPathLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_layer(&mut self, _subscriber: &mut S) {
        self.ext = Some(ExtFns {
            read: read_ext::<S>,
            write: write_ext::<S>,
        });
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if self.idle() {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let Some(parent) = span.parent() else { return };
        let Some(state) = parent.extensions().get::<NodeState>().cloned() else {
            return;
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
            span.extensions_mut().replace(NodeState {
                request: state.request,
                node,
            });
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if self.idle() {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let ext = span.extensions();
        if let Some(s) = ext.get::<NodeState>() {
            s.request.enter(s.node, self.shared.clock.now());
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        if self.idle() {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let ext = span.extensions();
        if let Some(s) = ext.get::<NodeState>() {
            s.request.exit(s.node, self.shared.clock.now());
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if self.idle() {
            return;
        }
        let Some(span) = ctx.span(&id) else { return };
        let ext = span.extensions();
        let Some(s) = ext.get::<NodeState>() else {
            return;
        };
        if s.node == Request::root() {
            // Not under our extensions lock: the sink may do anything.
            let request = s.request.clone();
            drop(ext);
            self.finish(&request);
        } else {
            s.request.close(s.node, || self.shared.clock.now());
        }
    }
}
