//! `cpt export`: records already collected (JSON Lines files, Parquet files,
//! a SQLite store) as Parquet files of schema `cpt.records.v1` in the
//! Hive-partitioned layout `DIR/date=YYYY-MM-DD/hour=HH/part-*.parquet`
//! (docs/src/reference/parquet.md), for Apache Spark and other engines.
//!
//! Every input is opened (and a Parquet input's files checked) before the
//! first record is written, so a missing file or a Parquet file of another
//! schema fails the run with nothing written. Files are finished atomically
//! (hidden `.tmp`, fsync, rename), and an export that fails half-way (a bad
//! line under `--strict`, a full disk) removes the files it wrote: the
//! directory is as it was, files already there untouched.

use std::path::{Path, PathBuf};

use crate::format::plural;
use crate::records::parquet::PartitionedWriter;
use crate::records::{ReadOptions, RecordReader};
use anyhow::{Context as _, bail};

/// Records per batch handed to the writer.
const BATCH: usize = 8 * 1024;

/// `cpt export` arguments.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// Record inputs: JSON Lines files (`-` = stdin, gzip recognised by its content), Parquet
    /// files or directories of them (e.g. to compact many small files into few).
    #[arg(value_name = "INPUT")]
    pub inputs: Vec<PathBuf>,
    /// Export every record of this SQLite store (as `cpt serve` / `cpt import` write it).
    #[arg(long, value_name = "PATH")]
    pub store: Option<PathBuf>,
    /// Write Parquet (schema cpt.records.v1) into DIR/date=YYYY-MM-DD/hour=HH/part-*.parquet,
    /// partitioned by each record's start time in UTC. Files already in DIR are kept.
    #[arg(long, value_name = "DIR")]
    pub parquet_dir: PathBuf,
    /// Finish a file and start the next once it passes this many MiB.
    #[arg(long, value_name = "MIB", default_value_t = 128)]
    pub max_file_mib: u64,
    /// Fail on the first bad JSON Lines line (or a gzip file that breaks off) instead of
    /// skipping it with a warning; nothing is finished then.
    #[arg(long)]
    pub strict: bool,
}

/// Whether `inner` is `outer` or below it (both made absolute when they exist).
fn is_within(inner: &Path, outer: &Path) -> bool {
    match (inner.canonicalize(), outer.canonicalize()) {
        (Ok(i), Ok(o)) => i.starts_with(o),
        _ => false,
    }
}

/// Run `cpt export`.
///
/// # Errors
///
/// No input, an input that cannot be read (named), the store, or writing.
pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    if args.inputs.is_empty() && args.store.is_none() {
        bail!(
            "no input: give JSON Lines or Parquet record files (or `-` for stdin) or --store PATH"
        );
    }
    anyhow::ensure!(args.max_file_mib > 0, "--max-file-mib must be at least 1");
    for input in &args.inputs {
        if is_within(input, &args.parquet_dir) {
            bail!(
                "{} is inside --parquet-dir {}: export into another directory (then replace \
                 the old one) so no file is read and written at once",
                input.display(),
                args.parquet_dir.display()
            );
        }
    }
    let opts = ReadOptions {
        strict: args.strict,
        batch_lines: BATCH,
    };
    // Open everything first: a bad input fails before anything is written.
    let mut readers = args
        .inputs
        .iter()
        .map(|p| RecordReader::open(p, opts))
        .collect::<Result<Vec<_>, _>>()?;
    let store = match &args.store {
        Some(s) => Some(open_store(s)?),
        None => None,
    };
    let mut writer = PartitionedWriter::new(&args.parquet_dir)
        .with_context(|| "cannot create --parquet-dir")?
        .with_max_file_bytes(args.max_file_mib.saturating_mul(1 << 20));
    let mut records = 0u64;
    let mut files = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        for reader in &mut readers {
            while let Some(batch) = reader.next_batch(&mut |w| eprintln!("cpt: warning: {w}"))? {
                records += batch.len() as u64;
                writer.write(&batch)?;
            }
        }
        if let Some(store) = &store {
            records += export_store(store, &mut writer)?;
        }
        files.extend(writer.finish()?);
        Ok(())
    })();
    if let Err(e) = result {
        // Files the writer finished at the size bound, and the open ones, are deleted.
        let kept = writer.discard();
        if kept > 0 {
            eprintln!(
                "cpt: the export stopped; {} of the failed run removed again, files that were \
                 in {} before are untouched",
                plural(kept as u64, "new file"),
                args.parquet_dir.display()
            );
        }
        return Err(e);
    }
    let bad: u64 = readers.iter().map(|r| r.stats().bad_lines).sum();
    if bad > 0 {
        eprintln!(
            "cpt: warning: skipped {} (use --strict to fail instead)",
            plural(bad, "bad line")
        );
    }
    eprintln!(
        "cpt: wrote {} to {} in {}",
        plural(records, "record"),
        plural(files.len() as u64, "Parquet file"),
        args.parquet_dir.display()
    );
    Ok(())
}

#[cfg(feature = "server")]
type Store = crate::server::store::Store;
#[cfg(not(feature = "server"))]
type Store = std::convert::Infallible;

#[cfg(feature = "server")]
fn open_store(path: &Path) -> anyhow::Result<Store> {
    crate::records::check_store(path)?;
    Store::open_read_only(path).map_err(|e| anyhow::anyhow!("{e}"))
}

#[cfg(not(feature = "server"))]
fn open_store(path: &Path) -> anyhow::Result<Store> {
    bail!(
        "--store {}: this cpt was built without the `server` feature (no SQLite store)",
        path.display()
    )
}

#[cfg(feature = "server")]
fn export_store(store: &Store, writer: &mut PartitionedWriter) -> anyhow::Result<u64> {
    use crate::records::selection::{Selection, TriggerFilter};
    let every = Selection::new().with_triggers(TriggerFilter::All);
    let mut failed = None;
    let n = store
        .for_each_batch(&every, BATCH, |batch: &[cpt_sdk::record::Record]| {
            if failed.is_none()
                && let Err(e) = writer.write(batch)
            {
                failed = Some(e);
            }
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(n),
    }
}

#[cfg(not(feature = "server"))]
fn export_store(store: &Store, _: &mut PartitionedWriter) -> anyhow::Result<u64> {
    match *store {}
}
