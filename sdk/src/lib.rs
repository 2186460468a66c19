//! Critical path tracing for Rust services (after Google's CPT, "Distributed
//! Latency Profiling through Critical Path Tracing").
//!
//! When a request is slow, which piece of work actually held it up? This
//! crate records, for every node of a traced request, what it was blocked on
//! when it resumed, and computes the request's critical path: the chain of
//! work whose durations sum exactly to its latency.
//!
//! # Vocabulary
//!
//! - **request**: one unit of work entering a service (an RPC, an HTTP
//!   request).
//! - **node**: a named piece of work inside a request: a `tracing` span, a
//!   task of the [task graph](task::TaskGraph), an outbound RPC. Between its
//!   start and end it is *busy* (entered / being polled) or *waiting*.
//! - **blocker**: when a node resumes after waiting, the dependency whose end
//!   came last before the resumption ([`path::graph::Resumption`]). A wait
//!   with no instrumented blocker is *unattributed* and stays on the node.
//! - **segment**: a frame stack (root → leaf) and a duration ([`Segment`]).
//! - **critical path**: the ordered segments whose durations sum exactly to
//!   the request's latency ([`CriticalPath`]).
//! - **trigger**: why a request is traced: [`Trigger::Sampled`] or
//!   [`Trigger::Forced`]; untraced is `Option<Trigger>::None`.
//! - **record**: what the entry service emits for a traced request
//!   ([`Record`], with a JSON Lines form).
//! - **accounting**: time the path could not explain in detail, still in the
//!   total ([`Accounting`]: network, overcount, blind spot, unattributed,
//!   queueing, truncated).
//!
//! # Quick start
//!
//! Add [`CriticalPathLayer`] to your registry, start a request on a span,
//! and every span created inside it becomes a node:
//!
//! ```
//! use cpt_sdk::request::{self, RequestOptions};
//! use cpt_sdk::{CriticalPathLayer, Record, Trigger};
//! use tracing_subscriber::prelude::*;
//!
//! let (layer, handle) = CriticalPathLayer::builder()
//!     .with_service("frontend")
//!     .with_sink(|r: Record| println!("{}", r.to_json())) // or sink::json_lines_file(…)
//!     .build();
//! let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
//!
//! let root = tracing::info_span!("checkout");
//! // Middleware does this for you; `handle.sample(…)` asks the sampler.
//! request::begin(&root, RequestOptions::new(Some(Trigger::Sampled)).with_endpoint("/checkout"));
//! root.in_scope(|| {
//!     tracing::info_span!("load_cart").in_scope(|| { /* … */ });
//!     tracing::info_span!("price").in_scope(|| { /* … */ });
//! });
//! let done = request::finish(&root).expect("the request is traced");
//! assert_eq!(done.path.total(), done.latency); // always, exactly
//! assert_eq!(handle.records_emitted(), 1);
//! ```
//!
//! Async code needs nothing more: `#[instrument]` functions and
//! `.instrument(span)` futures are nodes, and the layer sees which child a
//! node was waiting for. Where plain spans cannot tell (a `select!` arm, a
//! thread scope, a producer graph), the [`task`] helpers make blockers
//! exact. The reference cases (CPT Fig. 2a/2b/2c and the Rust cases of the
//! design notes) are the integration tests under `sdk/tests/`.
//!
//! # Modules
//!
//! | module | what |
//! |---|---|
//! | [`path`] | the model: [`CriticalPath`], frames, segments, accounting; [`path::graph`] (a request's nodes and timelines), [`path::compute`] (the backwards walk), `path::merge` (splicing a callee's path) |
//! | [`layer`] | [`CriticalPathLayer`], its builder and handle |
//! | [`request`] | the hand API: begin / finish / trigger / labels / callee |
//! | [`task`] | `join`, `try_join`, `join_all`, `spawn`, `spawn_blocking`, `scope`, `TaskGraph` |
//! | [`trigger`] | [`Trigger`], [`trigger::Sampler`], [`trigger::DefaultSampler`] |
//! | [`record`], [`sink`], [`export`] | records, sinks, the non-blocking exporter |
//! | [`clock`] | the [`clock::Clock`] seam |
//! | [`env`](mod@env) | the `CPT_*` environment variables ([`env::CptEnv`]) |
//! | `codec` | the compact wire form of paths |
//! | `testing` | test helpers (feature `testing`) |
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `layer` | yes | the `tracing-subscriber` layer, the request API and task hooks (`tracing`, `tracing-subscriber`, `tokio`, `pin-project-lite`) |
//! | `testing` | no | `RecordingSink`, `ManualClock`, `expect::path()` |
//!
//! With `default-features = false` the crate is the pure model, codec and
//! exporter, for the collector and offline tools.
//!
//! # Cost
//!
//! Spans outside any traced request cost one relaxed atomic load per
//! callback while no request is traced, and one read of the parent's
//! extensions otherwise: no allocation, no lock of ours (a test checks it
//! with a counting allocator). Records leave through a sink that must not
//! block; [`export::Exporter`] queues them for a worker thread.
//!
//! MSRV: 1.85 (edition 2024).
#![deny(unsafe_code)]

pub mod clock;
pub mod codec;
pub mod env;
pub mod export;
pub mod force;
#[cfg(feature = "layer")]
pub mod layer;
pub mod path;
pub mod record;
#[cfg(feature = "layer")]
pub use layer::request;
pub mod sink;
#[cfg(feature = "layer")]
pub mod task;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trigger;

pub use export::RecordSink;
pub use path::{Accounting, CriticalPath, Frame, FrameId, Location, Segment, SegmentKind};
pub use record::{Labels, Record, RecordError};
pub use trigger::Trigger;

#[cfg(feature = "layer")]
pub use layer::CriticalPathLayer;
pub use path::graph::CalleeOutcome;
