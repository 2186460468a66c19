//! The CPT Figure 1 example system (services A, B, C) and the Figure 2 demo.
//!
//! - [`system`]: the three services, each a tonic server with the cpt server
//!   layer and cpt client layers on its channels, plus one HTTP hop (B → C,
//!   axum and a hyper-util client) and one server-streaming RPC (`C.Scan`).
//! - [`otel`]: the same system traced with `tracing-opentelemetry` and W3C
//!   `traceparent` propagation instead (the `fig1` bench's peer).
//! - [`proto`]: their messages, servers and clients, generated from
//!   `proto/cpt/example/example.proto` by `build.rs` (protox, no `protoc`).
//! - [`demo`]: the Figure 1 demo (the `demo` binary): starts all three on
//!   loopback, drives load, writes records as JSON Lines and ships them to a
//!   collector, writes the profile.

pub mod demo;
pub mod otel;
pub mod proto;
pub mod system;
