//! Parquet partitions past retention: what the writer's upkeep removes
//! from `--parquet-dir` once their records are older than
//! `--parquet-retain-for` (else `--retain-for`).

use std::path::Path;

use crate::server::store::unix_nanos;

/// Remove what `--parquet-dir` keeps past retention, `cutoff_unix_nanos`
/// being `now_unix_nanos` less the time it is kept:
///
/// - a `date=YYYY-MM-DD/hour=HH` partition whose hour ended at or before
///   the cutoff, as a whole;
/// - in a partition whose hour has not begun yet (records that claim to
///   start in the future) and in `date=mixed/hour=mixed` (records of many
///   hours, [`crate::records::parquet::MIXED_PARTITION`]), each file
///   written at or before the cutoff: such files are kept as long after
///   they were written as the others after their hour, however far ahead
///   their records' start times;
///
/// then the partitions and date directories left empty. Returns how many
/// partitions went.
pub(in crate::server) fn remove_partitions_before(
    root: &Path,
    cutoff_unix_nanos: u64,
    now_unix_nanos: u64,
) -> std::io::Result<u64> {
    let mut removed = 0;
    let dates = match std::fs::read_dir(root) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let (mixed_date, mixed_hour) = crate::records::parquet::MIXED_PARTITION;
    for date in dates {
        let date = date?.path();
        let name = date.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.starts_with("date=") || !date.is_dir() {
            continue;
        }
        let mixed = name == mixed_date;
        let Ok(hours) = std::fs::read_dir(&date) else {
            continue;
        };
        for hour in hours {
            let hour = hour?.path();
            let by_file = if mixed {
                hour.file_name().is_some_and(|n| n == mixed_hour)
            } else {
                let probe = hour.join("part.parquet");
                let Some((start, end)) = crate::records::parquet::partition_hours(&probe) else {
                    continue; // not a partition: left alone
                };
                if end <= cutoff_unix_nanos {
                    std::fs::remove_dir_all(&hour)?;
                    removed += 1;
                    continue;
                }
                start > now_unix_nanos
            };
            if by_file && remove_files_written_before(&hour, cutoff_unix_nanos)? {
                removed += 1;
            }
        }
        if std::fs::read_dir(&date)?.next().is_none() {
            std::fs::remove_dir(&date)?;
        }
    }
    Ok(removed)
}

/// Remove the files of `partition` last written at or before
/// `cutoff_unix_nanos`, and the partition when that leaves it empty
/// (`true` then).
fn remove_files_written_before(partition: &Path, cutoff_unix_nanos: u64) -> std::io::Result<bool> {
    for file in std::fs::read_dir(partition)? {
        let file = file?;
        let meta = file.metadata()?;
        let written = meta.modified().map_or(u64::MAX, unix_nanos);
        if meta.is_file() && written <= cutoff_unix_nanos {
            std::fs::remove_file(file.path())?;
        }
    }
    if std::fs::read_dir(partition)?.next().is_none() {
        std::fs::remove_dir(partition)?;
        return Ok(true);
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    #[test]
    fn parquet_partitions_past_retention_go_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // 2026-11-21T01:00:00Z: the hours that ended by then go.
        let cutoff = 1795222800_u64 * 1_000_000_000;
        let now = cutoff + 7 * 86_400 * 1_000_000_000;
        let at = |ns: u64| SystemTime::UNIX_EPOCH + Duration::from_nanos(ns);
        let hour = 3_600 * 1_000_000_000;
        #[rustfmt::skip]
        let files: [(&str, u64); 12] = [
            ("date=2026-11-20/hour=05/part-x.parquet", now),
            ("date=2026-11-20/hour=23/part-x.parquet", now),
            ("date=2026-11-21/hour=00/part-x.parquet", now),
            ("date=2026-11-21/hour=01/part-x.parquet", now),
            // Hours that have not begun: by when each file was written.
            ("date=2030-01-01/hour=00/part-old.parquet", cutoff - hour),
            ("date=2030-01-01/hour=00/part-new.parquet", cutoff + hour),
            ("date=2030-01-02/hour=07/part-old.parquet", cutoff),
            // Records of many hours: by when each file was written too.
            ("date=mixed/hour=mixed/part-old.parquet", cutoff - hour),
            ("date=mixed/hour=mixed/part-new.parquet", now),
            (".staging/part-x.parquet", cutoff - hour),
            ("notes/part-x.parquet", cutoff - hour),
            ("date=mixed/notes/part-x.parquet", cutoff - hour),
        ];
        for (f, written) in files {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"x").unwrap();
            let file = std::fs::File::options().write(true).open(&p).unwrap();
            file.set_modified(at(written)).unwrap();
        }
        // Three past hours, and the future hour all of whose files are old.
        assert_eq!(remove_partitions_before(root, cutoff, now).unwrap(), 4);
        let mut left: Vec<String> = walk(root);
        left.sort();
        assert_eq!(
            left,
            [
                ".staging/part-x.parquet",
                "date=2026-11-21/hour=01/part-x.parquet",
                "date=2030-01-01/hour=00/part-new.parquet",
                "date=mixed/hour=mixed/part-new.parquet",
                "date=mixed/notes/part-x.parquet",
                "notes/part-x.parquet",
            ]
        );
        assert_eq!(
            remove_partitions_before(&root.join("missing"), cutoff, now).unwrap(),
            0
        );
    }

    fn walk(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut dirs = vec![root.to_path_buf()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else {
                    out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
                }
            }
        }
        out
    }
}
