//! Generates the collector's protobuf messages without `protoc`: `protox` (a
//! protobuf compiler written in Rust) parses the `.proto` files into a
//! descriptor set and `prost-build` turns that into Rust in `OUT_DIR`.
//!
//! - `proto/perftools/profiles/profile.proto`: pprof's profile format,
//!   vendored from github.com/google/pprof (`cpt_collector::profile`).
//!
//! The ingest API's messages are the exporter's (`cpt_exporter::proto`,
//! from `exporter/proto`): one schema for the sender and the receiver.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(["perftools/profiles/profile.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    // protox does not tell cargo which files it read.
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
