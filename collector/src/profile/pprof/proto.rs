//! pprof's `profile.proto` (package `perftools.profiles`), generated at build
//! time by `build.rs` with `protox` and `prost-build` (no `protoc`) from
//! `collector/proto/perftools/profiles/profile.proto`, vendored unchanged from
//! `github.com/google/pprof` (Apache-2.0; the commit is in the README next to
//! it).
//!
//! Why not the `pprof` crate's `protos` module: it is generated for prost
//! 0.12, while the rest of the workspace (tonic 0.14) uses prost 0.14, so
//! depending on it would build two prost versions. All fields are generated,
//! so profiles from other tools decode losslessly.

#![allow(missing_docs)] // the docs are Google's comments; not every item has one

include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
