//! [`Builder`] and [`Handle`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{CriticalPathLayer, Shared};
use crate::clock::{Clock, SystemClock};
use crate::env::{CptEnv, EnvError};
use crate::export::RecordSink;
use crate::trigger::{DefaultSampler, Sampler, SamplingContext, Trigger};

/// Configures a [`CriticalPathLayer`].
///
/// ```
/// use cpt_sdk::layer::CriticalPathLayer;
/// use cpt_sdk::trigger::DefaultSampler;
///
/// let (layer, handle) = CriticalPathLayer::builder()
///     .with_service("A")
///     .with_sampler(DefaultSampler::new(0.05).with_max_per_second(50))
///     .with_sink(|r: cpt_sdk::Record| eprintln!("{r}"))
///     .build();
/// assert_eq!(handle.records_emitted(), 0);
/// # drop(layer);
/// ```
pub struct Builder {
    service: Arc<str>,
    sink: Option<Arc<dyn RecordSink>>,
    sampler: Arc<dyn Sampler>,
    clock: Arc<dyn Clock>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            service: Arc::from("unknown"),
            sink: None,
            sampler: Arc::new(DefaultSampler::default()),
            clock: Arc::new(SystemClock::new()),
        }
    }
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("service", &self.service)
            .field("sink", &self.sink.is_some())
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// The service name on this process's frames and records (a request's
    /// [`RequestOptions::service`](crate::request::RequestOptions::service)
    /// overrides it).
    #[must_use]
    pub fn with_service(mut self, service: impl Into<Arc<str>>) -> Self {
        self.service = service.into();
        self
    }

    /// Where finished requests' records go. It is called on the thread that
    /// finished the request and must not block: use an
    /// [`Exporter`](crate::export::Exporter) for I/O.
    #[must_use]
    pub fn with_sink(mut self, sink: impl RecordSink) -> Self {
        self.sink = Some(Arc::new(sink));
        self
    }

    /// The sampler behind [`Handle::sample`] and
    /// [`request::sample`](crate::request::sample).
    #[must_use]
    pub fn with_sampler(mut self, sampler: impl Sampler) -> Self {
        self.sampler = Arc::new(sampler);
        self
    }

    /// The sampler from `CPT_SAMPLE_RATE` / `CPT_SAMPLE_MAX_PER_SECOND`
    /// when either is set ([`env`](mod@crate::env)); settings made after this
    /// call win.
    ///
    /// # Panics
    ///
    /// With [`EnvError`]'s message when a `CPT_*` variable is malformed
    /// (a misconfigured process should not start); use
    /// [`try_with_default_env`](Builder::try_with_default_env) to handle it.
    #[must_use]
    pub fn with_default_env(self) -> Self {
        self.try_with_default_env()
            .unwrap_or_else(|e| panic!("cpt configuration from the environment: {e}"))
    }

    /// [`with_default_env`](Builder::with_default_env), returning the error.
    ///
    /// # Errors
    ///
    /// A malformed `CPT_*` variable ([`CptEnv::from_env`]).
    pub fn try_with_default_env(self) -> Result<Self, EnvError> {
        Ok(self.with_env(&CptEnv::from_env()?))
    }

    /// Apply what `env` configures: its sampler, when set, and
    /// `CPT_CLOCK=std` ([`SystemClock::std`]).
    #[must_use]
    pub fn with_env(self, env: &CptEnv) -> Self {
        let this = match env.sampler() {
            Some(sampler) => self.with_sampler(sampler),
            None => self,
        };
        match env.clock {
            Some(crate::env::ClockChoice::Std) => this.with_clock(SystemClock::std()),
            _ => this,
        }
    }

    /// The clock for every timestamp (tests: `TokioClock` under a paused
    /// runtime, or `testing::ManualClock`).
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The layer and a handle to its counters and sampler.
    pub fn build(self) -> (CriticalPathLayer, Handle) {
        super::waits::warn_if_unavailable();
        let shared = Arc::new(Shared {
            service: self.service,
            sink: self.sink,
            sampler: self.sampler,
            clock: self.clock,
            in_flight: AtomicU64::new(0),
            emitted: AtomicU64::new(0),
            finisher: Default::default(),
        });
        (
            CriticalPathLayer {
                shared: shared.clone(),
                ext: None,
                table: Arc::default(),
                #[cfg(feature = "tokio-resources")]
                resources: Arc::default(),
            },
            Handle { shared },
        )
    }
}

/// Counters and the sampler of a built [`CriticalPathLayer`].
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("service", &self.shared.service)
            .field("records_emitted", &self.records_emitted())
            .field("records_dropped", &self.records_dropped())
            .field("requests_in_flight", &self.requests_in_flight())
            .finish()
    }
}

impl Handle {
    /// Records sent to the sink so far.
    pub fn records_emitted(&self) -> u64 {
        self.shared.emitted.load(Ordering::Relaxed)
    }

    /// Records of detached requests
    /// ([`request::finish_detached`](crate::request::finish_detached))
    /// dropped because the background queue was full.
    pub fn records_dropped(&self) -> u64 {
        self.shared.finisher.dropped.load(Ordering::Relaxed)
    }

    /// Places where tokio resources were created (`tokio-resources`) that
    /// the process-wide table of named-wait sites had no room for: each
    /// such resource still names its waits, at the cost of its own copy of
    /// the name.
    pub fn wait_sites_not_kept(&self) -> u64 {
        super::waits::sites_not_kept()
    }

    /// Wait until the records of every request detached so far reached the
    /// sink, or `timeout` passed; true when none is pending. For tests and
    /// orderly shutdown.
    pub fn flush(&self, timeout: std::time::Duration) -> bool {
        self.shared.finisher.flush(timeout)
    }

    /// Traced requests begun and not yet finished.
    pub fn requests_in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// Ask the layer's sampler about a new request.
    pub fn sample(&self, cx: &SamplingContext<'_>) -> Option<Trigger> {
        self.shared.sampler.sample(cx)
    }

    /// The layer's clock.
    pub fn clock(&self) -> &dyn Clock {
        &*self.shared.clock
    }
}
