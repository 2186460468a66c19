//! Write the synthetic trace sets of `traces::analysis::flows::synth` as
//! Jaeger JSON, for `cpt traces predict` and the other commands:
//!
//! ```text
//! cargo run -p cpt-collector --example flows_synth -- OUT_DIR
//! ```
//!
//! writes `page-clients.json` and `page-servers.json` (the same 2 000
//! requests of the page program with and without client spans) and
//! `rare-sequential.json` (6 000 batch requests, 50 and 20 of them
//! sequential and noisy).

use cpt_collector::traces::analysis::flows::synth::{self, Shape};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(dir) = std::env::args_os().nth(1) else {
        return Err("usage: flows_synth OUT_DIR".into());
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir)?;
    for (name, traces) in [
        (
            "page-clients.json",
            synth::page(2_000, 7, Shape::WithClients),
        ),
        (
            "page-servers.json",
            synth::page(2_000, 7, Shape::ServerOnly),
        ),
        (
            "rare-sequential.json",
            synth::rare_sequential(6_000, 11, (50, 20)),
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, synth::jaeger_json(&traces))?;
        println!("{}: {} traces", path.display(), traces.len());
    }
    Ok(())
}
