//! The cpt collector: stores records and aggregates them into pprof profiles
//! (CPT "Aggregation and Visualization").
#![forbid(unsafe_code)]
pub mod traces;
pub mod aggregate;
#[cfg(feature = "cli")]
pub mod cli;
pub mod diff;
pub mod flame;
pub mod histogram;
pub mod profile;
pub mod selection;
