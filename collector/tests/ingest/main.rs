//! `cpt serve` ingest: round trips, durability, overload push-back,
//! malformed batches, and the client exporter.
#![cfg(feature = "server")]

mod support;

mod connections;
mod durability;
mod fairness;
mod hostile;
mod limits;
mod malformed;
mod metrics;
mod otlp;
mod otlp_clients;
mod overload;
mod parquet;
mod read_access;
mod replays;
mod retention;
mod roundtrip;
mod tls;

mod client;
mod client_log;
mod shutdown;
mod spool;
