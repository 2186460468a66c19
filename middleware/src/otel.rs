//! OpenTelemetry interoperation (feature `opentelemetry`): the trigger as a
//! [`TextMapPropagator`], and `HeaderMap` carriers.
//!
//! [`TriggerPropagator`] composes with the W3C `TraceContextPropagator` in a
//! [`TextMapCompositePropagator`](opentelemetry::propagation::TextMapCompositePropagator),
//! so code that already propagates OpenTelemetry context through its own
//! carriers (message queues, custom transports) carries the cpt trigger with
//! it:
//!
//! ```
//! use cpt_middleware::otel::{HeaderExtractor, HeaderInjector, PropagatedTrigger, TriggerPropagator};
//! use opentelemetry::propagation::{TextMapCompositePropagator, TextMapPropagator};
//! use opentelemetry::Context;
//!
//! let propagator = TextMapCompositePropagator::new(vec![Box::new(TriggerPropagator::new())]);
//! let cx = Context::new().with_value(PropagatedTrigger(cpt_sdk::Trigger::Sampled));
//! let mut headers = http::HeaderMap::new();
//! propagator.inject_context(&cx, &mut HeaderInjector(&mut headers));
//! assert_eq!(headers["x-cpt-trigger"], "sampled");
//! let back = propagator.extract(&HeaderExtractor(&headers));
//! assert_eq!(back.get::<PropagatedTrigger>(), Some(&PropagatedTrigger(cpt_sdk::Trigger::Sampled)));
//! ```
//!
//! The server layers read the trigger from the headers themselves and decide
//! trust there (a propagator sees no peer); an extracted
//! [`PropagatedTrigger`] is what the caller *claims*.

use cpt_sdk::Trigger;
use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry::propagation::text_map_propagator::FieldIter;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};

use crate::header;

/// The trigger a caller propagated, as a value in an OpenTelemetry
/// [`Context`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PropagatedTrigger(pub Trigger);

/// The cpt trigger as an OpenTelemetry [`TextMapPropagator`] (header
/// [`header::TRIGGER`]).
///
/// `inject` writes the context's [`PropagatedTrigger`], or else the trigger of
/// the cpt request the current span belongs to; nothing when untraced.
/// `extract` reads it back into the context.
#[derive(Debug)]
pub struct TriggerPropagator {
    fields: [String; 1],
}

impl TriggerPropagator {
    /// A new propagator.
    pub fn new() -> Self {
        TriggerPropagator {
            fields: [header::TRIGGER.as_str().to_owned()],
        }
    }
}

impl Default for TriggerPropagator {
    fn default() -> Self {
        Self::new()
    }
}

impl TextMapPropagator for TriggerPropagator {
    fn inject_context(&self, cx: &Context, injector: &mut dyn Injector) {
        let trigger = cx
            .get::<PropagatedTrigger>()
            .map(|t| t.0)
            .or_else(cpt_sdk::request::current_trigger);
        if let Some(trigger) = trigger {
            injector.set(header::TRIGGER.as_str(), trigger.as_str().to_owned());
        }
    }

    fn extract_with_context(&self, cx: &Context, extractor: &dyn Extractor) -> Context {
        match extractor
            .get(header::TRIGGER.as_str())
            .and_then(|v| Trigger::parse(v.trim()))
        {
            Some(trigger) => cx.with_value(PropagatedTrigger(trigger)),
            None => cx.clone(),
        }
    }

    fn fields(&self) -> FieldIter<'_> {
        FieldIter::new(&self.fields)
    }
}

/// An [`Injector`] writing into an [`http::HeaderMap`] (gRPC metadata is one
/// too). Invalid names or values are skipped.
#[derive(Debug)]
pub struct HeaderInjector<'a>(pub &'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// An [`Extractor`] reading an [`http::HeaderMap`].
#[derive(Debug)]
pub struct HeaderExtractor<'a>(pub &'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::propagation::TextMapCompositePropagator;
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;

    #[test]
    fn composes_with_trace_context() {
        let propagator = TextMapCompositePropagator::new(vec![
            Box::new(TraceContextPropagator::new()),
            Box::new(TriggerPropagator::new()),
        ]);
        let mut headers = HeaderMap::new();
        headers.insert(
            "traceparent",
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        headers.insert(header::TRIGGER, HeaderValue::from_static("forced"));
        let cx = propagator.extract(&HeaderExtractor(&headers));
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(
            cx.get::<PropagatedTrigger>(),
            Some(&PropagatedTrigger(Trigger::Forced))
        );

        let mut out = HeaderMap::new();
        propagator.inject_context(&cx, &mut HeaderInjector(&mut out));
        assert_eq!(out[header::TRIGGER], "forced");
        assert!(
            out["traceparent"]
                .to_str()
                .unwrap()
                .contains("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        let fields: Vec<_> = propagator.fields().collect();
        assert!(fields.contains(&"x-cpt-trigger") && fields.contains(&"traceparent"));
    }

    #[test]
    fn untraced_injects_nothing() {
        let mut out = HeaderMap::new();
        TriggerPropagator::new().inject_context(&Context::new(), &mut HeaderInjector(&mut out));
        assert!(out.is_empty());
        let mut bad = HeaderMap::new();
        bad.insert(header::TRIGGER, HeaderValue::from_static("sometimes"));
        let cx =
            TriggerPropagator::new().extract_with_context(&Context::new(), &HeaderExtractor(&bad));
        assert!(cx.get::<PropagatedTrigger>().is_none());
    }
}
