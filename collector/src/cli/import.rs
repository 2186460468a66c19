//! `cpt import`: load JSON Lines record files into a store.

use std::path::{Path, PathBuf};

use crate::format::plural;
use crate::ingest::IngestLimits;
use crate::records::{ReadOptions, RecordReader, Warning, WarningKind};
use crate::server::store::{Durability, EncodedBatch, Store};

/// Bad lines shown before the rest are only counted.
const SHOWN_BAD_LINES: u64 = 10;

/// Load JSON Lines record files into a store (plain or gzipped). Bad lines are reported as
/// FILE:LINE and skipped (nothing of them is stored); good lines are kept; a gzip file that
/// breaks off keeps the records before the break, with a warning. With --strict, any bad line
/// or broken gzip stream fails the import before anything is stored.
#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// The SQLite store (created if missing).
    #[arg(long, value_name = "PATH")]
    pub store: PathBuf,
    /// JSON Lines record files (`-` = stdin; gzip is recognised by its content). Without files,
    /// only creates the store or upgrades one an older cpt wrote (e.g. adds the request id index).
    pub files: Vec<PathBuf>,
    /// Fail on the first bad line (exit code 1, naming FILE:LINE) and store nothing.
    #[arg(long)]
    pub strict: bool,
    /// Records per transaction.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub batch: usize,
    /// Skip records that start more than this ahead of this machine's clock (as `cpt serve`
    /// refuses them): they would sit past every time range and retention cutoff.
    #[arg(long, value_name = "DURATION", value_parser = crate::server::parse_duration, default_value = "1h")]
    pub max_future_skew: std::time::Duration,
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
        let opts = ReadOptions {
            strict: true,
            ..ReadOptions::default()
        };
        for file in &args.files {
            let mut reader = RecordReader::open(file, opts)?;
            while reader
                .next_batch(&mut |_| {})
                .map_err(|e| anyhow::anyhow!("{e}; nothing imported"))?
                .is_some()
            {}
        }
    }
    // Each chunk of --batch records is one transaction, durable once it commits.
    let mut store = Store::open_with(&args.store, Durability::Full)?;
    if args.files.is_empty() {
        println!(
            "store {}: schema version {}, {} (upgraded if it was older)",
            args.store.display(),
            store.schema_version(),
            plural(store.len()?, "record")
        );
        return Ok(());
    }
    let (mut stored, mut bad, mut truncated, mut ahead) = (0u64, 0u64, 0u64, 0u64);
    let limits = IngestLimits::default().with_max_future_skew(args.max_future_skew);
    let now = crate::server::store::unix_nanos(std::time::SystemTime::now());
    let opts = ReadOptions {
        strict: false,
        batch_lines: args.batch.min(100_000),
    };
    for file in &args.files {
        let mut reader = RecordReader::open(file, opts)?;
        let mut warn = |w: Warning| {
            if let WarningKind::BadLine(_) = w.kind {
                bad += 1;
                if bad > SHOWN_BAD_LINES {
                    return;
                }
            } else {
                truncated += 1;
            }
            eprintln!("warning: {w}");
        };
        let mut chunk: Vec<cpt_sdk::Record> = Vec::with_capacity(args.batch.min(100_000));
        while let Some(batch) = reader.next_batch(&mut warn)? {
            // The one check `cpt serve` makes of a record's start.
            chunk.extend(batch.into_iter().filter(|r| {
                let Err(o) = limits.start(r.start_unix_nanos, now) else {
                    return true;
                };
                ahead += 1;
                if ahead <= SHOWN_BAD_LINES {
                    eprintln!(
                        "warning: {}: a record of {} skipped: {}: {}",
                        file.display(),
                        r.service,
                        o.field,
                        o.reason
                    );
                }
                false
            }));
            while chunk.len() >= args.batch {
                let rest = chunk.split_off(args.batch);
                stored += store.insert_encoded(&EncodedBatch::new(&chunk))?;
                chunk = rest;
            }
        }
        if !chunk.is_empty() {
            stored += store.insert_encoded(&EncodedBatch::new(&chunk))?;
        }
    }
    if bad > SHOWN_BAD_LINES {
        eprintln!("… and {} more", plural(bad - SHOWN_BAD_LINES, "bad line"));
    }
    let mut skipped = Vec::new();
    if bad > 0 {
        skipped.push(format!("skipped {}", plural(bad, "bad line")));
    }
    if truncated > 0 {
        skipped.push(format!(
            "lost the tail of {}",
            plural(truncated, "truncated gzip file")
        ));
    }
    if ahead > 0 {
        skipped.push(format!(
            "skipped {} starting over --max-future-skew ahead of this machine's clock",
            plural(ahead, "record")
        ));
    }
    eprintln!(
        "imported {} into {}{}",
        plural(stored, "record"),
        args.store.display(),
        if skipped.is_empty() {
            String::new()
        } else {
            format!("; {}", skipped.join(", "))
        }
    );
    Ok(())
}
