//! Round trips, partitions and the parallel decoder.

use std::fs;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{RecordBatch, StringArray};
use cpt_sdk::path::{CriticalPath, Frame, FrameId, SegmentKind};
use cpt_sdk::record::Record;
use cpt_sdk::trigger::Trigger;

use super::files::dir_files;
use super::*;

fn record(i: u64) -> Record {
    let mut p = CriticalPath::new();
    let a = p.intern(Frame::new("A", "A1").with_location("a.rs", 7));
    let b = p.intern(Frame::new("B", "B1"));
    p.push(vec![a], Duration::from_nanos(5 + i), SegmentKind::Busy);
    p.push(vec![a, b], Duration::from_nanos(20), SegmentKind::Busy);
    p.push(vec![a], Duration::from_nanos(3), SegmentKind::Queueing);
    p.accounting.queueing = Duration::from_nanos(3);
    let mut r = Record::new("A", Trigger::Sampled, p);
    if i.is_multiple_of(2) {
        r.endpoint = Some("/a.A/Run".into());
        r.labels.insert("arm".into(), format!("b{i}"));
        r.start_unix_nanos = Some(1_700_000_000_000_000_000 + i);
        r.request_id = Some(format!("r{i}"));
    } else {
        r.trigger = Trigger::Forced;
    }
    r
}

/// A record whose stacks share, change and reorder prefixes: the decoder
/// reuses the previous stack's frames by depth, so frames must come back
/// right when a frame moves depth or a prefix changes under a kept leaf.
fn shuffled_stacks(i: u64) -> Record {
    let mut p = CriticalPath::new();
    let a = p.intern(Frame::new("A", "A1").with_location("a.rs", 7));
    let b = p.intern(Frame::new("B", "B1"));
    let c = p.intern(Frame::new("C", "C1").with_location("a.rs", 9));
    let d = p.intern(Frame::new("C", "C1").with_location("c.rs", 9));
    let stacks: [&[FrameId]; 7] = [
        &[a],
        &[a, b],
        &[a, c, b],
        &[c],
        &[c, a, b],
        &[d, a],
        &[a, d],
    ];
    for k in 0..stacks.len() {
        let s = stacks[(k + i as usize) % stacks.len()];
        p.push(
            s.to_vec(),
            Duration::from_nanos(1 + i + k as u64),
            SegmentKind::Busy,
        );
    }
    Record::new("A", Trigger::Sampled, p)
}

#[test]
fn parallel_decoding_returns_every_row_in_order_with_its_frames() {
    let records: Vec<Record> = (0..3000)
        .map(|i| {
            if i % 3 == 0 {
                record(i)
            } else {
                shuffled_stacks(i)
            }
        })
        .collect();
    let batch = to_batch(&records).unwrap();
    // Frame ids are assigned in order of first appearance on reading:
    // compare the stacks as frames.
    type Resolved = (Vec<Vec<Frame>>, Vec<(Duration, SegmentKind)>);
    let resolved = |r: &Record| -> Resolved {
        let p = &r.path;
        let stacks = p.segments().iter();
        (
            stacks
                .clone()
                .map(|s| s.stack.iter().map(|&id| p.frame(id).clone()).collect())
                .collect(),
            stacks.map(|s| (s.duration, s.kind)).collect(),
        )
    };
    let want: Vec<Resolved> = records.iter().map(resolved).collect();
    for got in [
        from_batch_parallel_in(&batch, 700).unwrap(),
        from_batch_parallel(&batch).unwrap(),
        from_batch(&batch).unwrap(),
    ] {
        assert_eq!(got.len(), records.len());
        assert_eq!(got.iter().map(resolved).collect::<Vec<_>>(), want);
        for (g, r) in got.iter().zip(&records) {
            assert_eq!(
                (&g.request_id, g.trigger, g.latency),
                (&r.request_id, r.trigger, r.latency)
            );
        }
    }
}

#[test]
fn parallel_decoding_names_the_first_bad_row_across_runs() {
    let records: Vec<Record> = (0..3000).map(record).collect();
    let batch = to_batch(&records).unwrap();
    let at = batch.schema().index_of("trigger").unwrap();
    let triggers: Vec<&str> = (0..3000)
        .map(|i| match i {
            2500 | 2900 => "sometimes",
            _ => "sampled",
        })
        .collect();
    let mut columns = batch.columns().to_vec();
    columns[at] = Arc::new(StringArray::from(triggers));
    let bad = RecordBatch::try_new(batch.schema(), columns).unwrap();
    // Runs of 700 rows: 2100..2800 holds the first bad row, 2800..3500 the
    // second, so the two errors come from different runs on any machine.
    assert_eq!((2500 / 700, 2900 / 700), (3, 4));
    let e = from_batch_parallel_in(&bad, 700).unwrap_err();
    assert!(
        e.starts_with("row 2500: unknown trigger \"sometimes\""),
        "{e}"
    );
    // One run per row: the same answer.
    let e = from_batch_parallel_in(&bad, 1).unwrap_err();
    assert!(e.starts_with("row 2500: "), "{e}");
}

#[test]
fn records_survive_a_round_trip_through_arrow() {
    let recs: Vec<Record> = (0..5).map(record).collect();
    let batch = to_batch(&recs).unwrap();
    assert_eq!(batch.schema(), schema());
    assert_eq!(from_batch(&batch).unwrap(), recs);
}

#[test]
fn partitions_are_utc_dates_and_hours() {
    assert_eq!(partition_of(0), ("1970-01-01".into(), 0));
    // 2023-11-14T22:13:20Z
    assert_eq!(
        partition_of(1_700_000_000_000_000_000),
        ("2023-11-14".into(), 22)
    );
    // 2024-02-29T23:59:59Z (leap day)
    assert_eq!(
        partition_of(1_709_251_199_000_000_000),
        ("2024-02-29".into(), 23)
    );
}

#[test]
fn a_written_directory_reads_back_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<Record> = (0..40).map(record).collect();
    let mut w = PartitionedWriter::new(dir.path()).unwrap();
    w.write(&recs).unwrap();
    let files = w.finish().unwrap();
    // the even ones are in 2023-11-14 hour 22, the odd ones in "now"
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(
        files
            .iter()
            .any(|f| f.starts_with(dir.path().join("date=2023-11-14/hour=22")))
    );
    let mut r = ParquetRecords::open(dir.path(), 7).unwrap();
    let mut back = Vec::new();
    while let Some(b) = r.next_batch().unwrap() {
        back.extend(b);
    }
    let key = |r: &Record| r.to_json();
    let mut want: Vec<String> = recs.iter().map(key).collect();
    let mut got: Vec<String> = back.iter().map(key).collect();
    want.sort();
    got.sort();
    assert_eq!(got, want);
}

#[test]
fn an_unfinished_writer_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut w = PartitionedWriter::new(dir.path()).unwrap();
        w.write(&[record(0)]).unwrap();
    }
    let mut files = Vec::new();
    dir_files(dir.path(), &mut files).unwrap();
    assert!(files.is_empty(), "{files:?}");
    let mut all = Vec::new();
    for e in fs::read_dir(dir.path().join("date=2023-11-14/hour=22")).unwrap() {
        all.push(e.unwrap().file_name());
    }
    assert!(all.is_empty(), "{all:?}");
}

#[test]
fn files_roll_past_the_size_bound() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<Record> = (0..3000).map(|i| record(i * 2)).collect();
    let mut w = PartitionedWriter::new(dir.path())
        .unwrap()
        .with_max_file_bytes(1);
    for c in recs.chunks(1000) {
        w.write(c).unwrap();
    }
    assert_eq!(w.finish().unwrap().len(), 3);
}

const HOUR: u64 = 3_600_000_000_000;

/// Record `i` of `n` that started in hour `hours[i]` after 2023-11-14T22:00Z.
fn in_hour(i: u64, hour: u64) -> Record {
    let mut r = record(0);
    r.start_unix_nanos = Some(1_699_999_200_000_000_000 + hour * HOUR + i);
    r.request_id = Some(format!("r{i}"));
    r
}

/// Every entry under `dir`, directories too, relative to it.
fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p.clone());
            }
            out.push(p.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
        }
    }
    out.sort();
    out
}

#[test]
fn a_write_over_many_hours_goes_to_the_busiest_hours_and_one_mixed_partition() {
    let dir = tempfile::tempdir().unwrap();
    // 2 000 hours, one record each, and hours 7 and 1 500 with 3 more.
    let mut recs: Vec<Record> = (0..2000).map(|h| in_hour(h, h)).collect();
    recs.extend((2000..2003).map(|i| in_hour(i, 7)));
    recs.extend((2003..2006).map(|i| in_hour(i, 1500)));
    let mut w = PartitionedWriter::new(dir.path())
        .unwrap()
        .with_max_hour_partitions(3);
    w.write(&recs).unwrap();
    let files = w.finish().unwrap();
    let mut parts: Vec<String> = files
        .iter()
        .map(|f| {
            let p = f.parent().unwrap().strip_prefix(dir.path()).unwrap();
            p.to_string_lossy().into_owned()
        })
        .collect();
    parts.sort();
    // The two busiest hours, then the earliest of the one-record hours.
    assert_eq!(
        parts,
        [
            "date=2023-11-14/hour=22",
            "date=2023-11-15/hour=05",
            "date=2024-01-16/hour=10",
            "date=mixed/hour=mixed",
        ]
    );
    let mut r = ParquetRecords::open(dir.path(), 1000).unwrap();
    let mut back = Vec::new();
    while let Some(b) = r.next_batch().unwrap() {
        back.extend(b);
    }
    let mut ids: Vec<String> = back.into_iter().map(|r| r.request_id.unwrap()).collect();
    ids.sort();
    let mut want: Vec<String> = (0..2006).map(|i| format!("r{i}")).collect();
    want.sort();
    assert_eq!(ids, want, "every record once");
}

#[test]
fn open_files_stay_within_their_bound() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<Record> = (0..40).map(|h| in_hour(h, h)).collect();
    let mut w = PartitionedWriter::new(dir.path())
        .unwrap()
        .with_max_open_files(4);
    w.write(&recs).unwrap();
    let unfinished = entries(dir.path())
        .iter()
        .filter(|e| e.ends_with(".parquet.tmp"))
        .count();
    assert_eq!(unfinished, 4);
    assert_eq!(w.finish().unwrap().len(), 40);
}

#[test]
fn a_failed_write_discarded_leaves_the_directory_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    // The partition of the third hour cannot be created.
    fs::write(dir.path().join("date=2023-11-15"), b"in the way").unwrap();
    let recs: Vec<Record> = (0..40).map(|h| in_hour(h, h)).collect();
    let mut w = PartitionedWriter::new(dir.path())
        .unwrap()
        .with_max_file_bytes(1);
    let err = w.write(&recs).unwrap_err();
    assert!(err.to_string().contains("date=2023-11-15"), "{err}");
    assert!(w.discard() > 0, "files were finished before the failure");
    assert_eq!(entries(dir.path()), ["date=2023-11-15"]);
}
