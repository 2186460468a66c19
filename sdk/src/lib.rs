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
//! - **node**: a named piece of work inside a request (a span, a task of the
//!   task graph, an outbound RPC).
//! - **blocker**: when a node resumes after waiting, the dependency whose end
//!   came last before the resumption.
//! - **segment**: a frame stack (root → leaf) and a duration.
//! - **critical path**: the ordered segments whose durations sum exactly to
//!   the request's latency.
//! - **trigger**: why a request is traced (`sampled` or `forced`).
//! - **record**: what the entry service emits for a traced request.
//! - **accounting**: time the path could not explain in detail.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `layer` | yes | the `tracing-subscriber` layer and task-graph hooks |
//! | `testing` | no | in-memory sink, manual clock, path expectations |
#![deny(unsafe_code)]

pub mod codec;
pub mod clock;
pub mod export;
#[cfg(feature = "layer")]
pub mod layer;
pub mod path;
pub mod record;
#[cfg(feature = "layer")]
pub mod request;
pub mod sink;
#[cfg(feature = "layer")]
pub mod task;
pub mod trigger;
#[cfg(feature = "testing")]
pub mod testing;

pub use path::{Accounting, CriticalPath, Frame, FrameId, Location, Segment, SegmentKind};
pub use record::{Labels, Record, RecordError, RecordSink};
pub use trigger::Trigger;

#[cfg(feature = "layer")]
pub use layer::CriticalPathLayer;
pub use path::compute::CalleeOutcome;
