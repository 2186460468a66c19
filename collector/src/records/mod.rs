//! Where records come from and which of them a question is about.
//!
//! - [`selection`]: the [`Selection`](selection::Selection) every profile,
//!   diff and store query applies (service, endpoint, time range, labels,
//!   trigger, percentile band).
//!
//! Records are read from JSON Lines files (plain or gzipped), from a store
//! ([`crate::server::store`], with the `server` feature) and, for imported traces,
//! from [`crate::traces`].

pub mod selection;
