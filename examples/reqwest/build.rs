//! Generates the `Stock` gRPC service from `proto/` without `protoc`:
//! protox parses the `.proto` files, tonic-prost-build writes the Rust.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(["stock/v1/stock.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto"); // protox does not tell cargo what it read
    Ok(())
}
