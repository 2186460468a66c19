//! The cpt collector: stores records and aggregates them into pprof profiles
//! (CPT "Aggregation and Visualization").
#![forbid(unsafe_code)]
pub mod traces;
