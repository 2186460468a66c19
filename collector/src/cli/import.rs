//! `cpt import`: load JSON Lines record files into a store.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::ingest::JsonLines;
use crate::server::store::{Durability, EncodedBatch, Store};

/// Bad lines shown before the rest are only counted.
const SHOWN_BAD_LINES: usize = 10;

/// Load JSON Lines record files into a store. Bad lines are reported as FILE:LINE and skipped
/// (nothing of them is stored); good lines are kept. With --strict, any bad line fails the
/// import before anything is stored.
#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// The SQLite store (created if missing).
    #[arg(long, value_name = "PATH")]
    pub store: PathBuf,
    /// JSON Lines record files (`-` = stdin).
    #[arg(value_name = "FILE.jsonl", required = true)]
    pub files: Vec<PathBuf>,
    /// Fail on the first bad line (exit code 1, naming FILE:LINE) and store nothing.
    #[arg(long)]
    pub strict: bool,
    /// Records per transaction.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub batch: usize,
}

fn open(path: &Path) -> anyhow::Result<Box<dyn BufRead>> {
    if path == Path::new("-") {
        return Ok(Box::new(BufReader::new(io::stdin())));
    }
    let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(Box::new(BufReader::with_capacity(1 << 16, f)))
}

/// Run `cpt import`.
///
/// # Errors
///
/// A file or the store cannot be opened, the store fails, or (with `--strict`) a bad line.
pub fn run(args: ImportArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.batch > 0, "--batch must be at least 1");
    if args.strict {
        anyhow::ensure!(
            !args.files.iter().any(|f| f == Path::new("-")),
            "--strict reads each file twice (check, then store) and cannot read stdin"
        );
        for file in &args.files {
            for (line, result) in JsonLines::new(open(file)?) {
                if let Err(e) = result {
                    anyhow::bail!(
                        "{}:{line}: {e} (--strict: nothing imported)",
                        file.display()
                    );
                }
            }
        }
    }
    // Each chunk of --batch records is one transaction, durable once it commits.
    let mut store = Store::open_with(&args.store, Durability::Full)?;
    let (mut stored, mut bad) = (0u64, 0usize);
    for file in &args.files {
        let mut chunk = Vec::with_capacity(args.batch.min(100_000));
        let mut flush = |chunk: &mut Vec<cpt_sdk::Record>| -> anyhow::Result<()> {
            if !chunk.is_empty() {
                stored += store.insert_encoded(&EncodedBatch::new(chunk))?;
                chunk.clear();
            }
            Ok(())
        };
        for (line, result) in JsonLines::new(open(file)?) {
            match result {
                Ok(r) => {
                    chunk.push(r);
                    if chunk.len() >= args.batch {
                        flush(&mut chunk)?;
                    }
                }
                Err(crate::ingest::LineError::Io(e)) => {
                    return Err(e)
                        .with_context(|| format!("{}:{line}: read failed", file.display()));
                }
                Err(e) => {
                    bad += 1;
                    if bad <= SHOWN_BAD_LINES {
                        eprintln!("{}:{line}: {e}", file.display());
                    }
                }
            }
        }
        flush(&mut chunk)?;
    }
    if bad > SHOWN_BAD_LINES {
        eprintln!("… and {} more bad lines", bad - SHOWN_BAD_LINES);
    }
    eprintln!(
        "imported {stored} records into {}{}",
        args.store.display(),
        if bad > 0 {
            format!("; skipped {bad} bad lines")
        } else {
            String::new()
        }
    );
    Ok(())
}
