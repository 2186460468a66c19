//! The spool's tests: replay across restarts, segments, the bound, torn
//! tails, damaged entries, foreign files and a damaged cursor.

use super::*;

fn body(i: u32) -> Vec<u8> {
    format!("batch {i}").into_bytes()
}

fn drain(spool: &mut Spool) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(e) = spool.front().unwrap() {
        out.push(e.batch_id);
        spool.pop_front().unwrap();
    }
    out
}

#[test]
fn replay_progress_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    for i in 0..5 {
        spool.append(&format!("b{i}"), i + 1, &body(i)).unwrap();
    }
    let first = spool.front().unwrap().unwrap();
    assert_eq!((first.batch_id.as_str(), first.records), ("b0", 1));
    assert_eq!(first.body, body(0));
    spool.pop_front().unwrap();
    spool.pop_front().unwrap();
    drop(spool);
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(spool.recovery().pending_batches, 3);
    assert_eq!(spool.recovery().pending_records, 3 + 4 + 5);
    assert!(spool.recovery().torn.is_empty());
    assert_eq!(drain(&mut spool), ["b2", "b3", "b4"]);
    drop(spool);
    // Drained: nothing left on reopen, and no segment on disk.
    let spool = Spool::open(dir.path(), 1 << 20).unwrap();
    assert!(spool.is_empty());
    let segs = fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("seg".as_ref()))
        .count();
    assert_eq!(segs, 0);
}

#[test]
fn segments_roll_and_replayed_ones_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    // 64 KiB segments; 10 KiB entries: several segments.
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    let big = vec![7u8; 10 << 10];
    for i in 0..20 {
        spool.append(&format!("b{i}"), 1, &big).unwrap();
    }
    let count_segs = || {
        fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("seg".as_ref()))
            .count()
    };
    let before = count_segs();
    assert!(before >= 3, "{before} segments");
    for _ in 0..12 {
        spool.pop_front().unwrap();
    }
    assert!(count_segs() < before);
    drop(spool);
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    let want: Vec<String> = (12..20).map(|i| format!("b{i}")).collect();
    assert_eq!(drain(&mut spool), want);
}

#[test]
fn a_full_spool_refuses_the_new_batch_and_keeps_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), 100).unwrap();
    // Each entry: 8 + 1 + 2 + 4 + 7 = 22 bytes: four fit in 100.
    let mut refused = 0;
    for i in 0..6 {
        match spool.append(&format!("b{i}"), 1, &body(i)) {
            Ok(()) => {}
            Err(AppendError::Full { .. }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(refused, 2);
    assert_eq!(drain(&mut spool), ["b0", "b1", "b2", "b3"]);
}

#[test]
fn a_torn_tail_is_cut_off_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    for i in 0..3 {
        spool.append(&format!("b{i}"), 1, &body(i)).unwrap();
    }
    drop(spool);
    // A crash in the middle of the fourth append: its header and half
    // of its payload reached the file.
    let seg = dir.path().join(seg_name(1));
    let good_len = fs::metadata(&seg).unwrap().len();
    let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&40u32.to_le_bytes()).unwrap();
    f.write_all(&[1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
    drop(f);
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    let torn = &spool.recovery().torn;
    assert_eq!(torn.len(), 1, "{torn:?}");
    assert_eq!(torn[0].offset, good_len);
    assert_eq!(torn[0].discarded_bytes, 13);
    assert!(torn[0].reason.contains("runs past the end"), "{}", torn[0]);
    assert_eq!(fs::metadata(&seg).unwrap().len(), good_len);
    // Appending after the repair follows the good entries.
    spool.append("b3", 1, &body(3)).unwrap();
    assert_eq!(drain(&mut spool), ["b0", "b1", "b2", "b3"]);
}

#[test]
fn a_flipped_byte_in_the_last_entry_ends_the_segment_there() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    for i in 0..3 {
        spool.append(&format!("b{i}"), 1, &body(i)).unwrap();
    }
    drop(spool);
    let seg = dir.path().join(seg_name(1));
    let mut bytes = fs::read(&seg).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&seg, &bytes).unwrap();
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(spool.recovery().torn[0].reason, "checksum mismatch");
    assert!(spool.recovery().damaged.is_empty());
    assert_eq!(drain(&mut spool), ["b0", "b1"]);
}

/// Offsets of each entry in segment 1 of a spool of `n` entries.
fn entry_offsets(dir: &Path) -> Vec<u64> {
    let bytes = fs::read(dir.join(seg_name(1))).unwrap();
    let mut out = Vec::new();
    let mut pos = HEADER_LEN as usize;
    while pos < bytes.len() {
        out.push(pos as u64);
        let n = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        pos += ENTRY_HEADER as usize + n;
    }
    out
}

#[test]
fn a_corrupt_entry_in_the_middle_is_skipped_alone_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    for i in 0..61 {
        spool.append(&format!("b{i}"), 3, &body(i)).unwrap();
    }
    drop(spool);
    let offsets = entry_offsets(dir.path());
    let seg = dir.path().join(seg_name(1));
    let mut bytes = fs::read(&seg).unwrap();
    // One flipped byte in the body of entry 17.
    let at = (offsets[17] + offsets[18]) as usize / 2 + 4;
    bytes[at] ^= 0x55;
    fs::write(&seg, &bytes).unwrap();

    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    let r = spool.recovery().clone();
    assert!(r.torn.is_empty(), "{:?}", r.torn);
    assert_eq!(r.damaged.len(), 1, "{:?}", r.damaged);
    let d = &r.damaged[0];
    assert_eq!(d.offset, offsets[17]);
    assert_eq!(d.skipped_bytes, offsets[18] - offsets[17]);
    assert_eq!(d.records_lost, Some(3));
    assert!(d.to_string().contains("3 records lost"), "{d}");
    assert_eq!(r.pending_batches, 60);
    let want: Vec<String> = (0..61)
        .filter(|i| *i != 17)
        .map(|i| format!("b{i}"))
        .collect();
    assert_eq!(drain(&mut spool), want);
}

#[test]
fn a_corrupt_length_is_skipped_up_to_the_next_whole_entry() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    for i in 0..5 {
        spool.append(&format!("b{i}"), 2, &body(i)).unwrap();
    }
    drop(spool);
    let offsets = entry_offsets(dir.path());
    let seg = dir.path().join(seg_name(1));
    let mut bytes = fs::read(&seg).unwrap();
    // Entry 2's length says it runs past the end of the file.
    bytes[offsets[2] as usize + 3] = 0x7f;
    fs::write(&seg, &bytes).unwrap();
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    let d = &spool.recovery().damaged;
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].records_lost, None, "the length itself was hit");
    assert!(d[0].to_string().contains("unknown number"), "{}", d[0]);
    assert_eq!(drain(&mut spool), ["b0", "b1", "b3", "b4"]);
}

#[test]
fn replay_past_a_skipped_entry_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    for i in 0..4 {
        spool.append(&format!("b{i}"), 1, &body(i)).unwrap();
    }
    drop(spool);
    let offsets = entry_offsets(dir.path());
    let seg = dir.path().join(seg_name(1));
    let mut bytes = fs::read(&seg).unwrap();
    bytes[offsets[2] as usize - 2] ^= 0xff; // the end of entry 1
    fs::write(&seg, &bytes).unwrap();
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(spool.front().unwrap().unwrap().batch_id, "b0");
    spool.pop_front().unwrap();
    drop(spool);
    // The cursor stands at b2: the damage is not met (nor reported) again.
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    assert!(spool.recovery().damaged.is_empty());
    assert_eq!(drain(&mut spool), ["b2", "b3"]);
}

#[test]
fn a_foreign_file_named_like_a_segment_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join(seg_name(3)), b"not a spool segment at all").unwrap();
    let err = Spool::open(dir.path(), 1 << 20).unwrap_err().to_string();
    assert!(err.contains("not a cpt spool segment"), "{err}");
    // Left alone.
    assert!(dir.path().join(seg_name(3)).exists());
}

#[test]
fn a_damaged_cursor_replays_from_the_oldest_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    for i in 0..3 {
        spool.append(&format!("b{i}"), 1, &body(i)).unwrap();
    }
    spool.pop_front().unwrap();
    drop(spool);
    fs::write(dir.path().join(CURSOR), b"garbage").unwrap();
    let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
    assert!(spool.recovery().cursor_reset.is_some());
    // b0 again: sent twice, stored once (the collector knows its id).
    assert_eq!(drain(&mut spool), ["b0", "b1", "b2"]);
}
