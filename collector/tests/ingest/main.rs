//! `cpt serve` ingest: round trips, durability, overload push-back,
//! malformed batches, and the client exporter.
#![cfg(feature = "server")]

mod support;

mod durability;
mod hostile;
mod malformed;
mod overload;
mod parquet;
mod roundtrip;

#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
mod client_log;
#[cfg(feature = "client")]
mod shutdown;
#[cfg(feature = "client")]
mod spool;
