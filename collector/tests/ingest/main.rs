//! `cpt serve` ingest: round trips, durability, overload push-back,
//! malformed batches, and the client exporter.
#![cfg(feature = "server")]

mod support;

mod durability;
mod fairness;
mod hostile;
mod limits;
mod malformed;
mod metrics;
mod overload;
mod parquet;
mod read_access;
mod replays;
mod retention;
mod roundtrip;
mod tls;

#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
mod client_log;
#[cfg(feature = "client")]
mod shutdown;
#[cfg(feature = "client")]
mod spool;
