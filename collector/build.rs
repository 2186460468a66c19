//! Generates the collector's protobuf messages without `protoc`: `protox` (a
//! protobuf compiler written in Rust) parses the `.proto` files into a
//! descriptor set and `prost-build` turns that into Rust in `OUT_DIR`.
//!
//! - `proto/cpt/collector/v1/collector.proto`: the ingest API
//!   (`cpt_collector::ingest::proto`);
//! - `proto/perftools/profiles/profile.proto`: pprof's profile format,
//!   vendored from github.com/google/pprof (`cpt_collector::profile`).
//!
//! Only messages are generated: `cpt serve` routes `Collector/Export` itself
//! (admission control, its own codec's error codes), and the client is a
//! plain `tonic::client::Grpc`, so no tonic service code is needed and every
//! feature combination builds from the same output.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(
        [
            "cpt/collector/v1/collector.proto",
            "perftools/profiles/profile.proto",
        ],
        ["proto"],
    )?;
    prost_build::Config::new()
        // Record.labels: sorted, as cpt_sdk::Record keeps them.
        .btree_map([".cpt.collector.v1.Record.labels"])
        .compile_fds(fds)?;
    // protox does not tell cargo which files it read.
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
