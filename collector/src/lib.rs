//! The cpt collector: stores records and aggregates them into pprof profiles
//! (CPT "Aggregation and Visualization").
#![forbid(unsafe_code)]
pub mod traces;

#[cfg(feature = "client")]
pub mod client;
pub mod ingest;
#[cfg(feature = "server")]
pub mod serve;
#[cfg(feature = "server")]
pub mod store;

pub mod aggregate;
#[cfg(feature = "cli")]
pub mod cli;
pub mod diff;
pub mod flame;
pub mod histogram;
pub mod profile;
pub mod records;
pub mod selection;
