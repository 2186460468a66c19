//! The ingest pipeline: from a request's body to a committed group, and
//! the acknowledgement (the steps are in [`crate::server`]'s docs).
//!
//! | file | what |
//! |---|---|
//! | `receiving.rs` | receiving slots shared fairly between peer addresses, the minimum body rate |
//! | `admission.rs` | the permit, decoding off the async workers, waiting for the acknowledgement, the counters |
//! | `grpc_api.rs` | `cpt.collector.v1.Collector/Export` |
//! | `replays.rs` | replayed force credentials: forced records sharing a nonce are labelled at ingest |
//! | `once.rs` | one record per request of a service that sends cpt records and OpenTelemetry spans both |
//! | `writer.rs` | the single writer thread's group commit, and the store's upkeep between groups |
//! | `staging.rs` | Parquet files staged until the store commits, settled at start |
//! | [`otlp`] | the OpenTelemetry receivers (`--otlp-grpc`, `--otlp-http`): spans held durably, assembled into traces, their records made by the importer's code |

pub(super) mod admission;
pub(super) mod grpc_api;
pub(super) mod once;
pub mod otlp;
pub(super) mod receiving;
pub(super) mod replays;
pub(super) mod staging;
pub(super) mod writer;
