//! The hand API: start a traced request on a span, finish it, read its
//! trigger, label it, attach a callee's path to an RPC node.
//!
//! Server middleware calls [`begin`] on the span of an incoming request and
//! [`finish`] when the response is ready; services without middleware do
//! the same by hand. Every function here is a no-op (returning `None` or
//! `false`) when the span is not part of a traced request or no
//! [`CriticalPathLayer`] is installed in the span's dispatcher, so callers
//! never need to check first.
//!
//! # Examples
//!
//! ```
//! use cpt_sdk::request::{self, RequestOptions};
//! use cpt_sdk::{layer::CriticalPathLayer, Trigger};
//! use tracing_subscriber::prelude::*;
//!
//! let (layer, _handle) = CriticalPathLayer::builder().with_service("A").build();
//! let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
//!
//! let root = tracing::info_span!("handle");
//! assert!(request::begin(&root, RequestOptions::new(Some(Trigger::Sampled)).with_endpoint("/run")));
//! root.in_scope(|| {
//!     assert_eq!(request::current_trigger(), Some(Trigger::Sampled));
//!     request::label("arm", "b");
//!     tracing::info_span!("work").in_scope(|| { /* … */ });
//! });
//! let done = request::finish(&root).expect("traced");
//! assert_eq!(done.path.total(), done.latency);
//! ```

use std::sync::Arc;
use std::time::Duration;

use tracing::span::Id;
use tracing::{Dispatch, Span};

use super::CriticalPathLayer;
pub(crate) use super::node::NodeState;
use super::node::{Request, RequestInit, WakeSource};
use crate::path::CriticalPath;
use crate::path::graph::CalleeOutcome;
use crate::record::Labels;
use crate::trigger::{SamplingContext, Trigger};

/// How to start a traced request: see [`begin`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RequestOptions {
    /// Why it is traced; `None` leaves the request untraced ([`begin`] does
    /// nothing).
    pub trigger: Option<Trigger>,
    /// The service on this request's frames and record (default: the
    /// layer's [`with_service`](crate::layer::Builder::with_service)). For
    /// several services in one process.
    pub service: Option<Arc<str>>,
    /// The root node's frame name (default: the span's name). Child spans
    /// name themselves with a `cpt.name` field.
    pub name: Option<Arc<str>>,
    /// The endpoint, for the record.
    pub endpoint: Option<String>,
    /// Labels for the record (more with [`label`]).
    pub labels: Labels,
    /// The OpenTelemetry / W3C trace id (32 lowercase hex), for the record.
    pub trace_id: Option<String>,
    /// This service's own request id, for the record.
    pub request_id: Option<String>,
    /// Whether [`finish`] emits a record to the sink (default `true`; a
    /// server returning its path to a trusted caller sets `false`, the
    /// caller merges the path into its own record).
    pub emit_record: bool,
}

impl Default for RequestOptions {
    fn default() -> Self {
        RequestOptions::new(None)
    }
}

impl RequestOptions {
    /// Options with a trigger (`None`: untraced) that emit a record.
    pub fn new(trigger: Option<Trigger>) -> Self {
        RequestOptions {
            trigger,
            service: None,
            name: None,
            endpoint: None,
            labels: Labels::new(),
            trace_id: None,
            request_id: None,
            emit_record: true,
        }
    }

    /// Set [`RequestOptions::service`].
    #[must_use]
    pub fn with_service(mut self, service: impl Into<Arc<str>>) -> Self {
        self.service = Some(service.into());
        self
    }

    /// Set [`RequestOptions::name`].
    #[must_use]
    pub fn with_name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Set [`RequestOptions::endpoint`].
    #[must_use]
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Add a label.
    #[must_use]
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Set [`RequestOptions::trace_id`].
    #[must_use]
    pub fn with_trace_id(mut self, trace_id: impl Into<String>) -> Self {
        self.trace_id = Some(trace_id.into());
        self
    }

    /// Set [`RequestOptions::request_id`].
    #[must_use]
    pub fn with_request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }

    /// Set [`RequestOptions::emit_record`].
    #[must_use]
    pub fn with_emit_record(mut self, emit: bool) -> Self {
        self.emit_record = emit;
        self
    }
}

/// What [`finish`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finished {
    /// The request's critical path; sums to `latency`.
    pub path: CriticalPath,
    /// Why it was traced.
    pub trigger: Trigger,
    /// From [`begin`] to [`finish`].
    pub latency: Duration,
}

fn with_layer<R>(
    span: &Span,
    f: impl FnOnce(&CriticalPathLayer, &Dispatch, &Id) -> Option<R>,
) -> Option<R> {
    span.with_subscriber(|(id, d)| {
        let layer = d.downcast_ref::<CriticalPathLayer>()?;
        f(layer, d, id)
    })
    .flatten()
}

fn with_current<R>(f: impl FnOnce(NodeState) -> Option<R>) -> Option<R> {
    let mut f = Some(f);
    tracing::dispatcher::get_default(|d| {
        let layer = d.downcast_ref::<CriticalPathLayer>()?;
        if layer
            .shared
            .in_flight
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
        {
            return None;
        }
        let cur = d.current_span();
        let id = cur.id()?;
        let state = layer.node(d, id)?;
        (f.take()?)(state)
    })
}

/// Make `span` the root node of a traced request, created now.
///
/// With the `opentelemetry` feature, when `opts.trace_id` is `None` and a
/// `tracing-opentelemetry` layer is installed, the span's OpenTelemetry
/// trace id goes into the record.
///
/// Returns `true` when the request is traced: `opts.trigger` is `Some`, the
/// span is enabled and a [`CriticalPathLayer`] sees it. Spans created inside
/// it from now on become its nodes. If the span is already the root of a
/// traced request, nothing changes (and `true` is returned).
pub fn begin(span: &Span, opts: RequestOptions) -> bool {
    let Some(trigger) = opts.trigger else {
        return false;
    };
    let Some(meta) = span.metadata() else {
        return false;
    };
    with_layer(span, |layer, d, id| {
        if layer
            .node(d, id)
            .is_some_and(|s| s.node == Request::root() && !s.request.is_finished())
        {
            return Some(());
        }
        // Before any extensions lock of ours (tracing-opentelemetry takes its own).
        #[cfg(feature = "opentelemetry")]
        let trace_id = opts.trace_id.or_else(|| otel_trace_id(d, id));
        #[cfg(not(feature = "opentelemetry"))]
        let trace_id = opts.trace_id;
        let now = layer.shared.clock.now();
        let entered = d.current_span().id() == Some(id);
        let init = RequestInit {
            trigger,
            service: opts.service.unwrap_or_else(|| layer.shared.service.clone()),
            name: opts.name,
            endpoint: opts.endpoint,
            trace_id,
            request_id: opts.request_id,
            emit_record: opts.emit_record,
            labels: opts.labels,
            start_unix_nanos: layer.shared.clock.unix_nanos(),
        };
        let request = Request::new(init, meta, now, entered);
        layer
            .shared
            .in_flight
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let state = NodeState {
            request: request.clone(),
            node: Request::root(),
        };
        if layer.set_node(d, id, state) {
            Some(())
        } else {
            request.abandon();
            layer
                .shared
                .in_flight
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            None
        }
    })
    .is_some()
}

/// End the traced request rooted at `span` now: compute its critical path,
/// emit its record (when [`RequestOptions::emit_record`]), and return the
/// path.
///
/// Returns `None` if `span` is not the root of a traced request or the
/// request already finished. Closing the root span without calling this
/// finishes the request too.
pub fn finish(span: &Span) -> Option<Finished> {
    with_layer(span, |layer, d, id| {
        let state = layer.node(d, id)?;
        if state.node != Request::root() {
            return None;
        }
        let outcome = layer.finish(&state.request)?;
        Some(Finished {
            path: outcome.path,
            trigger: state.request.trigger,
            latency: outcome.latency,
        })
    })
}

/// End the traced request rooted at `span` now, like [`finish`], but
/// compute its path and emit its record in the background: for a request
/// nobody waits on the path of (an entry point), so that its response does
/// not wait for the computation. Paths that cannot be queued are dropped and
/// counted ([`Handle::records_dropped`](crate::layer::Handle::records_dropped));
/// [`Handle::flush`](crate::layer::Handle::flush) waits for the queue.
///
/// Returns false if `span` is not the root of a traced request or the
/// request already finished.
pub fn finish_detached(span: &Span) -> bool {
    with_layer(span, |layer, d, id| {
        let state = layer.node(d, id)?;
        if state.node != Request::root() {
            return None;
        }
        layer.finish_detached(&state.request).then_some(())
    })
    .is_some()
}

/// The trigger of the traced request the current span belongs to; `None`
/// when untraced. This is what a client middleware propagates.
///
/// Costs one atomic load when no request is traced anywhere, else one
/// extensions read of the current span. Never allocates.
pub fn current_trigger() -> Option<Trigger> {
    with_current(|s| Some(s.request.trigger))
}

/// The trigger of the traced request `span` belongs to.
pub fn trigger(span: &Span) -> Option<Trigger> {
    with_layer(span, |layer, d, id| {
        Some(layer.node(d, id)?.request.trigger)
    })
}

/// Attach what came back from a callee to the RPC node `span`: its path,
/// or a blind spot naming the callee. When the RPC node is on the critical
/// path, the root's computation splices it in (CPT "Propagation and
/// merging"). Callable until the request finishes.
pub fn set_callee(span: &Span, outcome: CalleeOutcome) -> bool {
    with_layer(span, |layer, d, id| {
        let s = layer.node(d, id)?;
        s.request.set_callee(s.node, outcome).then_some(())
    })
    .is_some()
}

/// Add a label to the current request's record (A/B arm, region, …).
/// Returns `false` when the current span is untraced.
pub fn label(key: impl Into<String>, value: impl Into<String>) -> bool {
    let (key, value) = (key.into(), value.into());
    with_current(|s| {
        s.request.labels().insert(key, value);
        Some(())
    })
    .is_some()
}

/// Ask the sampler of the layer installed in the current dispatcher.
/// `None` when it says no or no layer is installed.
pub fn sample(cx: &SamplingContext<'_>) -> Option<Trigger> {
    tracing::dispatcher::get_default(|d| {
        d.downcast_ref::<CriticalPathLayer>()?
            .shared
            .sampler
            .sample(cx)
    })
}

/// Record that the next time the node `span` resumes (or first runs) it was
/// blocked on the node `blocker` — for frameworks that know the dependency
/// (the [task graph](crate::task::Graph) uses it). Both must be nodes of the
/// same traced request.
pub fn note_blocker(span: &Span, blocker: &Span) -> bool {
    let Some(b) = with_layer(blocker, |layer, d, id| layer.node(d, id)) else {
        return false;
    };
    with_layer(span, |layer, d, id| {
        let s = layer.node(d, id)?;
        if !Arc::ptr_eq(&s.request, &b.request) {
            return None;
        }
        s.request.note_blocker(s.node, b.node);
        Some(())
    })
    .is_some()
}

/// The current node stops being busy: it is waiting (for threads it
/// joins). Pairs with [`wait_end`].
pub(crate) fn wait_begin() {
    with_current_layer(|layer, s| s.request.exit(s.node, layer.shared.clock.now()));
}

/// The current node is busy again after [`wait_begin`].
pub(crate) fn wait_end() {
    with_current_layer(|layer, s| s.request.enter(s.node, layer.shared.clock.now()));
}

fn with_current_layer(f: impl FnOnce(&CriticalPathLayer, NodeState)) {
    let mut f = Some(f);
    tracing::dispatcher::get_default(|d| {
        let Some(layer) = d.downcast_ref::<CriticalPathLayer>() else {
            return;
        };
        let cur = d.current_span();
        let Some(id) = cur.id() else { return };
        if let (Some(state), Some(f)) = (layer.node(d, id), f.take()) {
            f(layer, state);
        }
    });
}

/// The future of the node `span` was dropped before it completed.
pub(crate) fn cancelled(span: &Span) {
    with_layer(span, |layer, d, id| {
        let s = layer.node(d, id)?;
        s.request.cancel(s.node);
        Some(())
    });
}

/// The OpenTelemetry trace id of `id`, when a tracing-opentelemetry layer
/// gives the span a valid context.
#[cfg(feature = "opentelemetry")]
fn otel_trace_id(d: &Dispatch, id: &Id) -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    let cx = tracing_opentelemetry::get_otel_context(id, d)?;
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// What a `task::Tracked` future needs to report its node's wakes.
pub(crate) fn wake_target(span: &Span) -> Option<(NodeState, Arc<dyn crate::clock::Clock>)> {
    with_layer(span, |layer, d, id| {
        Some((layer.node(d, id)?, layer.shared.clock.clone()))
    })
}

/// What is current on this thread, for a waker firing here: the node (of
/// any request) whose span is current, another span, or none.
pub(crate) fn wake_source() -> WakeSource {
    tracing::dispatcher::get_default(|d| {
        let cur = d.current_span();
        let Some(id) = cur.id() else {
            return WakeSource::Runtime;
        };
        match d
            .downcast_ref::<CriticalPathLayer>()
            .and_then(|layer| layer.node(d, id))
        {
            Some(state) => WakeSource::Node(state),
            None => WakeSource::Span,
        }
    })
}
