//! Generates the example system's messages, servers and clients from
//! `proto/cpt/example/example.proto` without `protoc`: `protox` (a protobuf
//! compiler written in Rust) parses the file into a descriptor set and
//! `tonic-prost-build` turns that into Rust in `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(["cpt/example/example.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    // protox does not tell cargo which files it read.
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
