//! Generates the ingest API's protobuf messages without `protoc`: `protox` (a
//! protobuf compiler written in Rust) parses
//! `proto/cpt/collector/v1/collector.proto` into a descriptor set and
//! `prost-build` turns that into Rust in `OUT_DIR` (`cpt_exporter::proto`).
//!
//! Only messages are generated: the client is a plain `tonic::client::Grpc`
//! and `cpt serve` routes `Collector/Export` itself, so no tonic service code
//! is needed and every feature combination builds from the same output.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(["cpt/collector/v1/collector.proto"], ["proto"])?;
    prost_build::Config::new()
        // Record.labels: sorted, as cpt_sdk::Record keeps them.
        .btree_map([".cpt.collector.v1.Record.labels"])
        .compile_fds(fds)?;
    // protox does not tell cargo which files it read.
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
