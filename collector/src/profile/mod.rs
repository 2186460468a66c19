//! From records to profiles: everything `cpt profile`, `cpt diff` and
//! `cpt merge` compute.
//!
//! - [`aggregate`]: the "average critical path" (CPT Table 1): a fold of
//!   selected records into per-stack sums and counts ([`aggregate::Aggregate`],
//!   the model; `fold` and `intern` inside it are how it is made fast).
//! - [`pprof`]: an aggregate as a gzipped pprof `profile.proto`, and back
//!   (its items are also re-exported here, e.g. [`encode_gzip`]).
//! - [`histogram`]: the log-linear latency histogram, and [`report`]: the
//!   per-stack table of how often and how long built from them.
//! - [`diff`]: two aggregates compared, with a noise bound.
//! - [`flame`]: an aggregate as a flame graph (SVG).
//! - [`tree`]: one request's path as a tree, and an endpoint's mean of it.
//!
//! The modules depend on each other in one direction only: `histogram` on
//! nothing here, `aggregate` on `histogram`, the rest on `aggregate`; all of
//! them write numbers through [`crate::format`].

pub mod aggregate;
pub mod diff;
pub mod flame;
pub mod histogram;
pub mod pprof;
pub mod report;
pub mod tree;

pub use pprof::*;
