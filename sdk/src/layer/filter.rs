//! [`NamedWaits`]: the per-layer filter for cpt's layer when it names waits
//! from tokio's resource instrumentation.
//!
//! tokio built with `--cfg tokio_unstable` describes much more than cpt
//! reads: a `tokio::task::waker` event on every waker clone, wake and drop,
//! state updates of every resource, and two spans inside each resource
//! entered on every poll of it. A filter by target (`tokio` at `TRACE`) has
//! each of those made and dispatched for cpt's layer. `NamedWaits` passes
//! only what names a wait, and leaves every other span and event to the
//! filter it wraps:
//!
//! - `runtime.resource` spans: the type and creation site of each timer,
//!   semaphore, lock, barrier and oneshot channel;
//! - `runtime::resource::poll_op` events: whether a poll of one was ready;
//! - `runtime.spawn` spans (tokio's tasks and blocking tasks), so that the
//!   registry's current span is a task's while it runs, and a wake from
//!   inside an uninstrumented task is not taken for the I/O driver's.
//!
//! ```
//! use cpt_sdk::layer::{CriticalPathLayer, filter::NamedWaits};
//! use tracing_subscriber::filter::LevelFilter;
//! use tracing_subscriber::prelude::*;
//!
//! let (layer, _handle) = CriticalPathLayer::builder().with_service("checkout").build();
//! // Other layers (a log) keep filters of their own.
//! let subscriber = tracing_subscriber::registry()
//!     .with(layer.with_filter(NamedWaits::new(LevelFilter::INFO)));
//! # let _ = subscriber;
//! ```

use tracing::subscriber::Interest;
use tracing::{Event, Metadata};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Filter};

/// A per-layer filter that passes tokio's instrumentation that names waits
/// and defers to `F` for everything else (see the [module docs](self)).
#[derive(Debug, Clone, Default)]
pub struct NamedWaits<F> {
    rest: F,
}

impl<F> NamedWaits<F> {
    /// Pass what names waits, and what `rest` passes.
    pub fn new(rest: F) -> Self {
        NamedWaits { rest }
    }

    /// The filter for everything else.
    pub fn rest(&self) -> &F {
        &self.rest
    }
}

/// Whether `meta` is a span or event of tokio's that names waits.
fn names_waits(meta: &Metadata<'_>) -> bool {
    if meta.is_span() {
        match meta.name() {
            "runtime.resource" => true,
            "runtime.spawn" => meta.target().starts_with("tokio::task"),
            _ => false,
        }
    } else {
        meta.target() == "runtime::resource::poll_op"
    }
}

impl<S, F: Filter<S>> Filter<S> for NamedWaits<F> {
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        names_waits(meta) || self.rest.enabled(meta, cx)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if names_waits(meta) {
            Interest::always()
        } else {
            self.rest.callsite_enabled(meta)
        }
    }

    fn event_enabled(&self, event: &Event<'_>, cx: &Context<'_, S>) -> bool {
        names_waits(event.metadata()) || self.rest.event_enabled(event, cx)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        // tokio's spans and events are at TRACE.
        Some(LevelFilter::TRACE)
    }

    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        self.rest.on_new_span(attrs, id, ctx);
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        self.rest.on_record(id, values, ctx);
    }

    fn on_enter(&self, id: &tracing::span::Id, ctx: Context<'_, S>) {
        self.rest.on_enter(id, ctx);
    }

    fn on_exit(&self, id: &tracing::span::Id, ctx: Context<'_, S>) {
        self.rest.on_exit(id, ctx);
    }

    fn on_close(&self, id: tracing::span::Id, ctx: Context<'_, S>) {
        self.rest.on_close(id, ctx);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::prelude::*;

    use super::*;

    /// Records the names of the spans and the targets of the events a
    /// layer is shown.
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: Context<'_, S>,
        ) {
            let m = attrs.metadata();
            self.0
                .lock()
                .unwrap()
                .push(format!("span {} {}", m.target(), m.name()));
        }

        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            let m = event.metadata();
            self.0.lock().unwrap().push(format!("event {}", m.target()));
        }
    }

    /// What tokio makes for a sleep, a task and a waker under
    /// `--cfg tokio_unstable`, and the program's own spans: the layer sees
    /// the resource, its poll, the task and what the wrapped filter passes,
    /// and none of tokio's other spans and events.
    #[test]
    fn only_what_names_waits_passes_beside_the_wrapped_filter() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry()
            .with(Seen(seen.clone()).with_filter(NamedWaits::new(LevelFilter::INFO)));
        tracing::subscriber::with_default(subscriber, || {
            let task = tracing::trace_span!(target: "tokio::task", parent: None, "runtime.spawn");
            let _t = task.enter();
            let res = tracing::trace_span!(target: "tokio::time::sleep", parent: None, "runtime.resource", concrete_type = "Sleep");
            let op = tracing::trace_span!(target: "tokio::time::sleep", parent: &res, "runtime.resource.async_op");
            let _ = tracing::trace_span!(target: "tokio::time::sleep", parent: &op, "runtime.resource.async_op.poll");
            tracing::trace!(target: "runtime::resource::state_update", duration = 10u64);
            tracing::trace!(target: "runtime::resource::poll_op", op_name = "poll_elapsed", is_ready = false);
            tracing::trace!(target: "tokio::task::waker", op = "waker.clone");
            let _ = tracing::trace_span!(target: "tokio::task::blocking", "runtime.spawn");
            // The program's own: INFO passes, DEBUG does not, and a span
            // named like tokio's outside tokio is the program's too.
            let _ = tracing::info_span!("handler");
            let _ = tracing::debug_span!("detail");
            let _ = tracing::trace_span!(target: "app", "runtime.spawn");
            tracing::info!(target: "app", "served");
            tracing::trace!(target: "app", "noise");
        });
        let handler = format!("span {} handler", module_path!());
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "span tokio::task runtime.spawn",
                "span tokio::time::sleep runtime.resource",
                "event runtime::resource::poll_op",
                "span tokio::task::blocking runtime.spawn",
                &handler,
                "event app",
            ]
        );
    }
}
