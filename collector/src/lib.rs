//! The cpt collector: stores records and aggregates them into pprof profiles
//! (CPT "Aggregation and Visualization"), and imports traces of services
//! that do not use the SDK.
//!
//! | module | what is in it |
//! |---|---|
//! | `records` (feature `profile`) | where records come from; `records::selection`, what a question selects |
//! | `profile` (feature `profile`) | records folded into profiles: aggregate, pprof, histograms, diff, flame graphs |
//! | `server` (feature `server`) | `cpt serve`: admission, HTTP and gRPC ingest, the writer, the SQLite store |
//! | [`format`](mod@format) | how numbers, counts and CSV fields are written for people (every report uses it) |
//! | [`ingest`] | decoding and checking received batches; the wire messages come from `cpt_exporter::proto` |
//! | `client`, `spool` (feature `client`, deprecated) | re-exports of the exporter, now the `cpt-exporter` crate |
//! | `traces` (feature `traces`) | Jaeger / Zipkin / OTLP / Nezha import (`traces::import`) and the analyses over them (`traces::analysis`) |
//! | `cli` (feature `cli`) | the `cpt` command |
//!
//! Records folded into the average critical path and written as a pprof
//! profile (CPT Table 1: requests of 16 ms and 8 ms average to 12 ms, A1
//! 5 ms of it):
//!
//! ```
//! # #[cfg(feature = "profile")] {
//! use std::time::Duration;
//! use cpt_collector::profile::aggregate::Aggregate;
//! use cpt_collector::profile::pprof;
//! use cpt_collector::records::selection::Selection;
//! use cpt_sdk::{CriticalPath, Frame, Record, SegmentKind, Trigger};
//!
//! let ms = Duration::from_millis;
//! let request = |parts: &[(&[&str], u64)]| {
//!     let mut path = CriticalPath::new();
//!     for (stack, n) in parts {
//!         path.push_frames(stack.iter().map(|f| Frame::new("A", *f)), ms(*n), SegmentKind::Busy);
//!     }
//!     Record::new("A", Trigger::Sampled, path)
//! };
//! let records = [
//!     request(&[(&["A1"], 6), (&["A1", "A2"], 10)]),
//!     request(&[(&["A1"], 4), (&["A1", "B1"], 4)]),
//! ];
//! let agg = Aggregate::from_records(&Selection::new(), &records);
//! assert_eq!(agg.requests(), 2);
//! assert_eq!(agg.mean_latency(), ms(12));
//! let profile: Vec<u8> = pprof::encode_gzip(&agg); // what `go tool pprof` opens
//! assert!(!profile.is_empty());
//! # }
//! ```
#![forbid(unsafe_code)]

pub mod format;
pub mod ingest;
#[cfg(feature = "profile")]
pub mod profile;
#[cfg(feature = "profile")]
pub mod records;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "traces")]
pub mod traces;
#[cfg(feature = "profile")]
mod visible;

#[cfg(feature = "cli")]
pub mod cli;

/// The exporter, moved to its own crate so that a service links no
/// collector: use [`cpt_exporter::client`] (`cpt-exporter = "0.1"`).
#[cfg(feature = "client")]
#[deprecated(
    note = "the exporter is its own crate: depend on `cpt-exporter` and use `cpt_exporter::client`"
)]
pub mod client {
    pub use cpt_exporter::client::*;
}

/// The exporter's spool, moved with it: use [`cpt_exporter::spool`].
#[cfg(feature = "client")]
#[deprecated(
    note = "the exporter is its own crate: depend on `cpt-exporter` and use `cpt_exporter::spool`"
)]
pub mod spool {
    pub use cpt_exporter::spool::*;
}

// The paths these modules had before the collector was laid out in rooms
// (README, Changelog). Kept so code written against them still builds.
#[cfg(feature = "profile")]
#[doc(hidden)]
pub use profile::{aggregate, diff, flame, histogram};
#[cfg(feature = "profile")]
#[doc(hidden)]
pub use records::selection;
#[cfg(feature = "server")]
#[doc(hidden)]
pub use server as serve;
#[cfg(feature = "server")]
#[doc(hidden)]
pub use server::store;
