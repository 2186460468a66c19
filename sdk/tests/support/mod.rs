//! Shared setup for the SDK's integration tests.
#![allow(dead_code, unreachable_pub)]

use cpt_sdk::Trigger;
use cpt_sdk::layer::{CriticalPathLayer, Handle};
use cpt_sdk::request::{self, RequestOptions};
use cpt_sdk::testing::{ManualClock, RecordingSink};
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::prelude::*;

/// A thread-local subscriber with our layer, a recording sink and a manual
/// clock that also follows tokio's paused clock.
pub struct Traced {
    pub sink: RecordingSink,
    pub clock: ManualClock,
    pub handle: Handle,
    _guard: DefaultGuard,
}

impl Traced {
    pub fn new() -> Traced {
        Traced::with_clock(ManualClock::with_tokio())
    }

    /// Outside a runtime: only the manual clock moves.
    pub fn manual() -> Traced {
        Traced::with_clock(ManualClock::new())
    }

    fn with_clock(clock: ManualClock) -> Traced {
        let sink = RecordingSink::new();
        let (layer, handle) = CriticalPathLayer::builder()
            .with_service("A")
            .with_sink(sink.clone())
            .with_clock(clock.clone())
            .build();
        let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        Traced {
            sink,
            clock,
            handle,
            _guard: guard,
        }
    }

    /// A traced root span named `name`.
    pub fn root(&self, name: &'static str) -> tracing::Span {
        let span = tracing::info_span!("root", cpt.name = name);
        assert!(request::begin(
            &span,
            RequestOptions::new(Some(Trigger::Sampled)).with_name(name)
        ));
        span
    }

    /// Simulated CPU work: time passes while the current span is entered.
    pub fn work(&self, ms: u64) {
        self.clock.advance(std::time::Duration::from_millis(ms));
    }
}
