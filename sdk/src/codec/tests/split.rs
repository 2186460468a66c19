//! The split form (version 2): a frame dictionary and the segments over it.

use super::*;

/// Encode in the split form and decode both parts.
fn split_roundtrip(
    p: &CriticalPath,
    options: &EncodeOptions,
    limits: &DecodeLimits,
) -> CriticalPath {
    let split = encode_split(p, options);
    let frames = decode_frames(&split.frames, limits).expect("own dictionary decodes");
    decode_split(&frames, &split.segments, limits).expect("own segments decode")
}

/// Figure 1's shape: the same stacks, other durations.
fn same_frames(scale: u64) -> CriticalPath {
    let mut p = fig2a_merged();
    let mut q = CriticalPath::new();
    for s in p.segments() {
        let frames: Vec<Frame> = s.stack.iter().map(|f| p.frame(*f).clone()).collect();
        q.push_frames(
            frames,
            s.duration * scale as u32 + Duration::from_nanos(scale),
            s.kind,
        );
    }
    p.accounting.network += Duration::from_nanos(scale);
    q.accounting = p.accounting;
    q
}

#[test]
fn split_roundtrip_equals_single_form() {
    for p in [
        fig2a_merged(),
        big_path(50),
        CriticalPath::new(),
        same_frames(3),
    ] {
        let single = decode(&encode(&p, &unlimited_options()), &unlimited()).unwrap();
        assert_eq!(
            split_roundtrip(&p, &unlimited_options(), &unlimited()),
            single
        );
        assert_eq!(single, compacted(&p));
    }
}

#[test]
fn split_dictionary_is_identical_for_paths_over_the_same_frames() {
    let (a, b) = (same_frames(1), same_frames(7));
    assert_ne!(a.total(), b.total());
    let (ea, eb) = (
        encode_split(&a, &EncodeOptions::default()),
        encode_split(&b, &EncodeOptions::default()),
    );
    assert_eq!(ea.frames, eb.frames, "same frames, same dictionary bytes");
    assert_ne!(ea.segments, eb.segments);
    // One decoded dictionary serves both.
    let frames = decode_frames(&ea.frames, &DecodeLimits::default()).unwrap();
    let limits = DecodeLimits::default();
    assert_eq!(
        decode_split(&frames, &ea.segments, &limits).unwrap(),
        compacted(&a)
    );
    assert_eq!(
        decode_split(&frames, &eb.segments, &limits).unwrap(),
        compacted(&b)
    );
    // Other frames: another dictionary.
    let other = encode_split(&big_path(5), &EncodeOptions::default());
    assert_ne!(other.frames, ea.frames);
}

#[test]
fn split_segments_over_another_dictionary_are_rejected() {
    let a = encode_split(&fig2a_merged(), &EncodeOptions::default());
    let b = encode_split(&big_path(50), &EncodeOptions::default());
    let limits = DecodeLimits::default();
    let frames_b = decode_frames(&b.frames, &limits).unwrap();
    let err = decode_split(&frames_b, &a.segments, &limits).unwrap_err();
    assert_eq!(err.kind_name(), "FramesMismatch", "{err}");
    assert!(err.to_string().contains("different responses"), "{err}");
}

#[test]
fn split_parts_in_the_wrong_place_are_rejected() {
    let limits = DecodeLimits::default();
    let p = encode_split(&fig2a_merged(), &EncodeOptions::default());
    let single = encode(&fig2a_merged(), &EncodeOptions::default());
    // The single form read by the split decoders: another version.
    let err = decode_frames(&single, &limits).unwrap_err();
    assert!(err.is_version_mismatch(), "{err}");
    assert_eq!(
        err.to_string(),
        "invalid critical path: wire format version 1, this decoder reads version 2"
    );
    let frames = decode_frames(&p.frames, &limits).unwrap();
    assert!(
        decode_split(&frames, &single, &limits)
            .unwrap_err()
            .is_version_mismatch()
    );
    // Either part read by the single decoder: another version.
    assert!(
        decode(&p.frames, &limits)
            .unwrap_err()
            .is_version_mismatch()
    );
    assert!(
        decode(&p.segments, &limits)
            .unwrap_err()
            .is_version_mismatch()
    );
    // The segments as a dictionary, the dictionary as segments.
    let err = decode_frames(&p.segments, &limits).unwrap_err();
    assert_eq!(err.kind_name(), "Misplaced", "{err}");
    let err = decode_split(&frames, &p.frames, &limits).unwrap_err();
    assert_eq!(err.kind_name(), "Misplaced", "{err}");
    // A version 2 message with both parts in one: rejected by both readers.
    let mut m = valid();
    m.version = VERSION;
    let err = decode_frames(&m.encode_to_vec(), &limits).unwrap_err();
    assert_eq!(err.kind_name(), "Misplaced", "{err}");
    // Segments without a fingerprint.
    let m = PathProto {
        version: VERSION,
        segment_entry_kind: vec![0],
        segment_duration_nanos: vec![5],
        ..PathProto::default()
    };
    let err = decode_split(&frames, &m.encode_to_vec(), &limits).unwrap_err();
    assert_eq!(err.kind_name(), "NoFingerprint", "{err}");
}

#[test]
fn split_decode_applies_the_limits_to_both_parts() {
    let p = big_path(50);
    let split = encode_split(&p, &unlimited_options());
    let both = split.frames.len() + split.segments.len();
    // Each part fits, the two together do not.
    let tight = DecodeLimits::new().with_max_bytes(both - 1);
    let frames = decode_frames(&split.frames, &tight).unwrap();
    let err = decode_split(&frames, &split.segments, &tight).unwrap_err();
    assert_eq!(err.kind_name(), "TooLarge", "{err}");
    assert!(
        decode_split(
            &frames,
            &split.segments,
            &DecodeLimits::new().with_max_bytes(both)
        )
        .is_ok()
    );
    // A dictionary decoded (and kept) under loose limits is checked again
    // under the limits of each use.
    let frames = decode_frames(&split.frames, &unlimited()).unwrap();
    for (limits, want) in [
        (unlimited().with_max_strings(2), "TooMany"),
        (unlimited().with_max_tree_entries(2), "TooMany"),
        (unlimited().with_max_depth(2), "TooDeep"),
        (unlimited().with_max_segments(2), "TooMany"),
        (unlimited().with_max_stack_frames(2), "TooManyStackFrames"),
    ] {
        let err = decode_split(&frames, &split.segments, &limits).unwrap_err();
        assert_eq!(err.kind_name(), want, "{limits:?}: {err}");
    }
}

#[test]
fn split_hostile_dictionaries_are_rejected_like_single_messages() {
    // Every tree error of the single form, in a dictionary.
    type Edit = fn(&mut PathProto);
    let cases: &[(&str, Edit, &str)] = &[
        (
            "service_index_out",
            |m| m.tree_service[1] = 5,
            "StringIndex",
        ),
        ("parent_before_first", |m| m.tree_parent[1] = 2, "Parent"),
        (
            "line_without_file",
            |m| m.tree_line[0] = 3,
            "LineWithoutFile",
        ),
        ("name_column_long", |m| m.tree_name.push(0), "ColumnLength"),
        ("version_future", |m| m.version = VERSION + 1, "Version"),
    ];
    for (name, edit, want) in cases {
        let mut m = valid();
        m.version = VERSION;
        m.segment_entry_kind.clear();
        m.segment_duration_nanos.clear();
        m.accounting = None;
        assert!(decode_frames(&m.encode_to_vec(), &DecodeLimits::default()).is_ok());
        edit(&mut m);
        let err = decode_frames(&m.encode_to_vec(), &DecodeLimits::default()).expect_err(name);
        assert_eq!(err.kind_name(), *want, "{name}: {err}");
    }
    // Segments referring past the dictionary's entries.
    let limits = DecodeLimits::default();
    let p = encode_split(&fig2a_merged(), &EncodeOptions::default());
    let frames = decode_frames(&p.frames, &limits).unwrap();
    let m = PathProto {
        version: VERSION,
        segment_entry_kind: vec![((frames.entries() + 1) as u32) << 3],
        segment_duration_nanos: vec![5],
        frames_fingerprint: Some(super::super::split::fingerprint(&p.frames)),
        ..PathProto::default()
    };
    let err = decode_split(&frames, &m.encode_to_vec(), &limits).unwrap_err();
    assert_eq!(err.kind_name(), "SegmentEntry", "{err}");
}

#[test]
fn split_fuzz_never_panics_and_accepts_only_valid_paths() {
    let limits = DecodeLimits::default();
    let parts: Vec<SplitPath> = [
        fig2a_merged(),
        big_path(50),
        same_frames(2),
        CriticalPath::new(),
    ]
    .iter()
    .map(|p| encode_split(p, &EncodeOptions::default()))
    .collect();
    let dictionaries: Vec<Vec<u8>> = parts.iter().map(|s| s.frames.clone()).collect();
    let segments: Vec<Vec<u8>> = parts.iter().map(|s| s.segments.clone()).collect();
    let mut rng = Rng(0x5eed_0002);
    for _ in 0..20_000 {
        let d = mutate(&mut rng, &dictionaries);
        let s = mutate(&mut rng, &segments);
        // Half the time, a valid dictionary, so the segments get exercised.
        let d = if rng.below(2) == 0 {
            dictionaries[rng.below(dictionaries.len())].clone()
        } else {
            d
        };
        let Ok(frames) = decode_frames(&d, &limits) else {
            continue;
        };
        if let Ok(p) = decode_split(&frames, &s, &limits) {
            check_decoded(&p, &limits);
        }
    }
}

#[test]
fn split_encoding_is_coarsened_to_fit_both_parts() {
    for max in [128, 300, 600, 1000] {
        let p = big_path(400);
        let split = encode_split(&p, &EncodeOptions::new().with_max_bytes(max));
        assert!(split.frames.len() + split.segments.len() <= max, "{max}");
        let back = split_roundtrip(
            &p,
            &EncodeOptions::new().with_max_bytes(max),
            &DecodeLimits::default(),
        );
        assert_eq!(back.total(), p.total());
        assert!(back.accounting.truncated > Duration::ZERO);
    }
}

proptest! {
    #[test]
    fn split_roundtrip_equals_compacted_input(p in arb_path()) {
        prop_assert_eq!(split_roundtrip(&p, &unlimited_options(), &unlimited()), compacted(&p));
    }

    #[test]
    fn split_encoding_always_decodes_under_its_decode_limits(
        p in arb_path(),
        max_bytes in 128usize..4096,
        depth in 0usize..6,
        counts in (0usize..40, 0usize..40, 1usize..40, 0usize..200),
    ) {
        let limits = limits_of(max_bytes, depth, counts);
        let options = EncodeOptions::new().with_max_bytes(usize::MAX).with_decode_limits(limits);
        let split = encode_split(&p, &options);
        let frames = decode_frames(&split.frames, &limits);
        prop_assert!(frames.is_ok(), "{:?}", frames);
        let back = decode_split(&frames.unwrap(), &split.segments, &limits);
        prop_assert!(back.is_ok(), "{:?}", back);
        prop_assert_eq!(back.unwrap().total(), p.total());
    }
}
