//! Ships cpt records from a service to a cpt collector (`cpt serve`), as
//! `opentelemetry-otlp` ships spans: the exporter lives apart from the
//! collector, so a service links what it runs and nothing of the server,
//! the store, the profiles or the command line.
//!
//! [`CollectorClient`] implements the SDK's
//! [`Export`](cpt_sdk::export::Export): put it behind the SDK's
//! asynchronous [`Exporter`](cpt_sdk::export::Exporter), which owns the
//! bounded queue and calls it on its worker thread, never on a request path.
//! The client sends each batch over gRPC (`grpc://`, `grpcs://`) or HTTP
//! (`http://`, `https://`), retries with backoff, keeps what the collector
//! cannot take in a bounded on-disk [`Spool`](spool::Spool) when asked to,
//! and says in the service's own log, at its first failure, which endpoint
//! it cannot reach and what to check.
//!
//! ```no_run
//! use cpt_exporter::{CollectorClient, Endpoint};
//! use cpt_sdk::export::Exporter;
//!
//! let client = CollectorClient::builder(Endpoint::parse("grpc://127.0.0.1:7070")?)
//!     .try_with_default_env()? // CPT_SPOOL_DIR: keep batches on disk while the collector is down
//!     .try_build()?;
//! let (sink, export) = Exporter::builder().build(client); // the CriticalPathLayer's sink
//! # drop((sink, export));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! | module | what is in it |
//! |---|---|
//! | [`client`] (feature `client`, default) | [`CollectorClient`]: endpoints, retries, TLS, the failure log |
//! | [`spool`] (feature `client`) | the client's bounded on-disk queue of batches the collector could not take |
//! | [`proto`] | the wire contract: the `cpt.collector.v1` messages, routes and headers, which the collector links too |
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `client` | yes | the client and its spool (tonic, hyper, rustls with ring); without it only [`proto`] |
//!
//! The minimum supported Rust version is the workspace's (1.89).
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "client")]
pub mod client;
pub mod proto;
#[cfg(feature = "client")]
pub mod spool;

#[cfg(feature = "client")]
pub use client::{
    CaFileError, ClientStats, CollectorClient, CollectorClientBuilder, DEFAULT_SPOOL_MAX_BYTES,
    Endpoint, EndpointError, SendError, TokenError,
};
