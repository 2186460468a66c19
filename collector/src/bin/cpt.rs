//! `cpt`: the critical path tracing command line. See `cpt --help`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    match cpt_collector::cli::run(cpt_collector::cli::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the context chain on one line, without a backtrace.
            eprintln!("cpt: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
