//! Parquet input as units of work for readers that fold without building
//! records.
//!
//! [`ScanPlan::open`] lists an input's files (as [`ParquetRecords`] does,
//! checking every file's footer and schema first), drops what a time range
//! rules out without reading it, and cuts the rest into [`ScanUnit`]s: a run
//! of rows of one row group, in input order, each readable on its own
//! thread.
//!
//! - A file under `date=YYYY-MM-DD/hour=HH` (the layout [`PartitionedWriter`]
//!   writes) holds records that started in that UTC hour, or records without
//!   a start time; a selection with `since`/`until` keeps neither kind
//!   outside its range, so such a file is skipped unopened beyond its footer.
//! - A row group whose `start_unix_nanos` statistics (min, max, null count)
//!   lie outside the range is skipped.
//! - [`ScanUnit::read`] decodes only the columns a selection needs
//!   ([`ScanColumns`]), with the frame, service, trigger and kind strings as
//!   Arrow dictionaries: each distinct string is decoded once per dictionary
//!   page, and rows carry its key.
//!
//! [`ParquetRecords`]: super::ParquetRecords
//! [`PartitionedWriter`]: super::PartitionedWriter

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use parquet::file::metadata::{PageIndexPolicy, RowGroupMetaData};
use parquet::file::statistics::Statistics;

use super::files::{checked_metadata, input_files};
use super::{ACCOUNTING, schema};
use crate::records::error::InputError;

/// Rows per [`ScanUnit`] unless a caller asks otherwise: a row group
/// (at most 128 Ki rows as cpt writes them) is cut into units this size, so
/// two workers share even a one-row-group file.
pub const UNIT_ROWS: usize = 32 * 1024;

/// The optional columns a scan decodes. The service, trigger, latency,
/// start time, path and accounting columns are always read (a profile
/// needs them); the others only when the selection filters on them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanColumns {
    /// `endpoint`.
    pub endpoint: bool,
    /// `labels`.
    pub labels: bool,
    /// `request_id` and `trace_id`.
    pub ids: bool,
}

/// Rows of one row group of one file.
#[derive(Debug, Clone)]
pub struct ScanUnit {
    file: Arc<ScanFile>,
    row_group: usize,
    rows: Range<usize>,
    first_row: u64,
}

#[derive(Debug)]
struct ScanFile {
    path: PathBuf,
    meta: ArrowReaderMetadata,
}

/// An input's row groups that may hold records in a time range, as units.
#[derive(Debug, Clone, Default)]
pub struct ScanPlan {
    units: Vec<ScanUnit>,
    rows: u64,
    files: usize,
    skipped_files: usize,
    skipped_row_groups: usize,
}

impl ScanPlan {
    /// Plan the scan of a Parquet file or directory for records that started
    /// in `[since, until)` (either bound may be absent), in units of at most
    /// `unit_rows` rows.
    ///
    /// # Errors
    ///
    /// As [`ParquetRecords::open`](super::ParquetRecords::open): every file's
    /// magic, footer and schema are checked first, the skipped ones too.
    pub fn open(
        path: &Path,
        since: Option<u64>,
        until: Option<u64>,
        unit_rows: usize,
    ) -> Result<ScanPlan, InputError> {
        let unit_rows = unit_rows.max(1);
        let timed = since.is_some() || until.is_some();
        let (lo, hi) = (since.unwrap_or(0), until.unwrap_or(u64::MAX));
        let mut plan = ScanPlan::default();
        for path in input_files(path)? {
            let options =
                ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
            let (_, meta) = checked_metadata(&path, options)?;
            plan.files += 1;
            if timed && partition_hours(&path).is_some_and(|(a, b)| b <= lo || a >= hi) {
                plan.skipped_files += 1;
                continue;
            }
            let start_col = meta
                .parquet_schema()
                .columns()
                .iter()
                .position(|c| c.path().string() == "start_unix_nanos");
            let file = Arc::new(ScanFile { path, meta });
            for (rg, rgm) in file.meta.metadata().row_groups().iter().enumerate() {
                let n = usize::try_from(rgm.num_rows()).unwrap_or(0);
                if timed && start_col.is_some_and(|c| outside(rgm, c, lo, hi)) {
                    plan.skipped_row_groups += 1;
                    continue;
                }
                let mut at = 0;
                while at < n {
                    let end = (at + unit_rows).min(n);
                    plan.units.push(ScanUnit {
                        file: file.clone(),
                        row_group: rg,
                        rows: at..end,
                        first_row: plan.rows,
                    });
                    plan.rows += (end - at) as u64;
                    at = end;
                }
            }
        }
        Ok(plan)
    }

    /// The units, in input order.
    pub fn units(&self) -> &[ScanUnit] {
        &self.units
    }

    /// Rows in the units (the records the scan reads).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Files in the input.
    pub fn files(&self) -> usize {
        self.files
    }

    /// Files skipped by their `date=/hour=` partition.
    pub fn skipped_files(&self) -> usize {
        self.skipped_files
    }

    /// Row groups skipped by their `start_unix_nanos` statistics.
    pub fn skipped_row_groups(&self) -> usize {
        self.skipped_row_groups
    }
}

/// Whether a row group's start times all lie outside `[lo, hi)` (or are all
/// absent). Without statistics a row group is read.
fn outside(rg: &RowGroupMetaData, col: usize, lo: u64, hi: u64) -> bool {
    let c = rg.column(col);
    let Some(Statistics::Int64(s)) = c.statistics() else {
        return false;
    };
    if s.null_count_opt() == Some(u64::try_from(rg.num_rows()).unwrap_or(0)) {
        return true;
    }
    match (s.min_opt(), s.max_opt()) {
        (Some(&min), Some(&max)) => {
            let (min, max) = (
                u64::try_from(min).unwrap_or(0),
                u64::try_from(max).unwrap_or(0),
            );
            max < lo || min >= hi
        }
        _ => false,
    }
}

/// The UTC hour `[start, end)` in ns of a file under `date=YYYY-MM-DD/hour=HH`
/// (its two parent directories), if it is in one.
pub(crate) fn partition_hours(file: &Path) -> Option<(u64, u64)> {
    let hour_dir = file.parent()?;
    let date_dir = hour_dir.parent()?;
    let hour: u64 = hour_dir
        .file_name()?
        .to_str()?
        .strip_prefix("hour=")?
        .parse()
        .ok()
        .filter(|h| *h < 24)?;
    let date = date_dir.file_name()?.to_str()?.strip_prefix("date=")?;
    let mut parts = date.splitn(3, '-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts
        .next()?
        .parse()
        .ok()
        .filter(|m| (1..=12).contains(m))?;
    let d: i64 = parts
        .next()?
        .parse()
        .ok()
        .filter(|d| (1..=31).contains(d))?;
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let start = (days * 86_400 + hour * 3600).checked_mul(1_000_000_000)?;
    Some((start, start.checked_add(3_600_000_000_000)?))
}

/// `Utf8` as a dictionary of `Utf8` with `Int32` keys.
fn dict() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

/// [`schema`] with the repeated strings read as dictionaries.
fn dictionary_schema() -> SchemaRef {
    let base = schema();
    let redo = |f: &Field, names: &[&str]| -> Field {
        if names.contains(&f.name().as_str()) && *f.data_type() == DataType::Utf8 {
            f.clone().with_data_type(dict())
        } else {
            f.clone()
        }
    };
    let frame = |item: &Field| -> Field {
        let DataType::Struct(fs) = item.data_type() else {
            return item.clone();
        };
        let fs: Fields = fs
            .iter()
            .map(|f| redo(f, &["service", "name", "file"]))
            .collect();
        item.clone().with_data_type(DataType::Struct(fs))
    };
    let segment = |item: &Field| -> Field {
        let DataType::Struct(fs) = item.data_type() else {
            return item.clone();
        };
        let fs: Fields = fs
            .iter()
            .map(|f| match f.data_type() {
                DataType::List(inner) if f.name() == "stack" => f
                    .as_ref()
                    .clone()
                    .with_data_type(DataType::List(Arc::new(frame(inner)))),
                _ => redo(f, &["kind"]),
            })
            .collect();
        item.clone().with_data_type(DataType::Struct(fs))
    };
    let fields: Vec<Field> = base
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::List(inner) if f.name() == "path" => f
                .as_ref()
                .clone()
                .with_data_type(DataType::List(Arc::new(segment(inner)))),
            _ => redo(f, &["service", "endpoint", "trigger"]),
        })
        .collect();
    Arc::new(Schema::new(fields))
}

impl ScanUnit {
    /// The file.
    pub fn path(&self) -> &Path {
        &self.file.path
    }

    /// The unit's first row's position among the plan's rows.
    pub fn first_row(&self) -> u64 {
        self.first_row
    }

    /// The unit's first row's position in its file (for messages).
    pub fn file_row(&self) -> u64 {
        let before: i64 = self.file.meta.metadata().row_groups()[..self.row_group]
            .iter()
            .map(RowGroupMetaData::num_rows)
            .sum();
        u64::try_from(before).unwrap_or(0) + self.rows.start as u64
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when the unit has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The unit's rows in batches of at most `batch_rows`, with the columns
    /// `cols` asks for besides the ones always read, and the dictionary
    /// columns (see the module docs) as `Dictionary(Int32, Utf8)`.
    ///
    /// # Errors
    ///
    /// [`InputError::Open`] or [`InputError::BadParquet`], naming the file.
    pub fn read(
        &self,
        cols: ScanColumns,
        batch_rows: usize,
    ) -> Result<ParquetRecordBatchReader, InputError> {
        let path = &self.file.path;
        let bad = |e: parquet::errors::ParquetError| InputError::BadParquet {
            path: path.clone(),
            error: e.to_string(),
        };
        let f = File::open(path).map_err(|error| InputError::Open {
            path: path.clone(),
            error,
        })?;
        let meta = ArrowReaderMetadata::try_new(
            self.file.meta.metadata().clone(),
            ArrowReaderOptions::new().with_schema(dictionary_schema()),
        )
        .map_err(bad)?;
        let mut wanted: Vec<&str> = vec![
            "service",
            "trigger",
            "latency_ns",
            "start_unix_nanos",
            "path",
        ];
        wanted.extend(ACCOUNTING);
        if cols.endpoint {
            wanted.push("endpoint");
        }
        if cols.labels {
            wanted.push("labels");
        }
        if cols.ids {
            wanted.extend(["request_id", "trace_id"]);
        }
        let roots: Vec<usize> = meta
            .parquet_schema()
            .root_schema()
            .get_fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| wanted.contains(&f.name()))
            .map(|(i, _)| i)
            .collect();
        let mask = ProjectionMask::roots(meta.parquet_schema(), roots);
        let mut selectors = Vec::with_capacity(2);
        if self.rows.start > 0 {
            selectors.push(RowSelector::skip(self.rows.start));
        }
        selectors.push(RowSelector::select(self.rows.len()));
        ParquetRecordBatchReaderBuilder::new_with_metadata(f, meta)
            .with_row_groups(vec![self.row_group])
            .with_row_selection(RowSelection::from(selectors))
            .with_projection(mask)
            .with_batch_size(batch_rows.max(1))
            .build()
            .map_err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::parquet::{PartitionedWriter, SCHEMA_KEY, SCHEMA_VERSION, to_batch};
    use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
    use cpt_sdk::record::Record;
    use cpt_sdk::trigger::Trigger;
    use std::time::Duration;

    const HOUR: u64 = 3_600_000_000_000;
    const T0: u64 = 1_699_999_200_000_000_000; // 2023-11-14T22:00:00Z

    fn at(start: u64) -> Record {
        let mut p = CriticalPath::new();
        p.push_frames(
            [Frame::new("A", "a")],
            Duration::from_nanos(5),
            SegmentKind::Busy,
        );
        let mut r = Record::new("A", Trigger::Sampled, p);
        r.start_unix_nanos = Some(start);
        r
    }

    #[test]
    fn a_time_range_skips_partitions_and_row_groups_outside_it() {
        let dir = tempfile::tempdir().unwrap();
        // Three hour partitions of 30 records each.
        let mut w = PartitionedWriter::new(dir.path().join("pq")).unwrap();
        let recs: Vec<Record> = (0..90).map(|i| at(T0 + (i / 30) * HOUR + i)).collect();
        w.write(&recs).unwrap();
        w.finish().unwrap();
        let pq = dir.path().join("pq");
        let all = ScanPlan::open(&pq, None, None, 7).unwrap();
        assert_eq!((all.files(), all.skipped_files(), all.rows()), (3, 0, 90));
        assert_eq!(
            all.units().len(),
            15,
            "30-row row groups cut into units of 7"
        );
        let second = ScanPlan::open(&pq, Some(T0 + HOUR), Some(T0 + 2 * HOUR), 7).unwrap();
        assert_eq!((second.skipped_files(), second.rows()), (2, 30));

        // One file, outside any partition, in row groups of 10 rows.
        let props = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(10))
            .set_key_value_metadata(Some(vec![parquet::file::metadata::KeyValue::new(
                SCHEMA_KEY.to_owned(),
                SCHEMA_VERSION.to_owned(),
            )]))
            .build();
        let file = dir.path().join("one.parquet");
        let mut writer = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(&file).unwrap(),
            super::schema(),
            Some(props),
        )
        .unwrap();
        let ordered: Vec<Record> = (0..50).map(|i| at(T0 + i * 1000)).collect();
        writer.write(&to_batch(&ordered).unwrap()).unwrap();
        writer.close().unwrap();
        let plan = ScanPlan::open(&file, Some(T0 + 20_000), Some(T0 + 30_000), 100).unwrap();
        assert_eq!((plan.skipped_row_groups(), plan.rows()), (4, 10));
        assert_eq!(plan.units()[0].file_row(), 20);
    }

    #[test]
    fn partition_directories_name_their_utc_hour() {
        let p = Path::new("/d/date=2023-11-14/hour=22/part-x.parquet");
        let start = 1_699_999_200_000_000_000; // 2023-11-14T22:00:00Z
        assert_eq!(partition_hours(p), Some((start, start + 3_600_000_000_000)));
        let leap = Path::new("date=2024-02-29/hour=23/f.parquet");
        assert_eq!(
            partition_hours(leap).map(|h| h.0),
            Some(1_709_247_600_000_000_000)
        );
        assert_eq!(partition_hours(Path::new("/d/hour=22/f.parquet")), None);
        assert_eq!(
            partition_hours(Path::new("/d/date=2023-11-14/hour=24/f.parquet")),
            None
        );
    }
}
