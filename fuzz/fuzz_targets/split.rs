//! Arbitrary bytes into the split form's decoders (`decode_frames`, then
//! `decode_split`): the first byte says where the dictionary ends and the
//! segments begin. They must never panic, and whatever they accept must
//! satisfy the limits and re-encode (split) to the same path.
#![no_main]

use cpt_sdk::codec::{DecodeLimits, EncodeOptions, decode_frames, decode_split, encode_split};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let at = usize::from(cut) * rest.len() / 256;
    let (frames, segments) = rest.split_at(at);
    let limits = DecodeLimits::default();
    let Ok(dictionary) = decode_frames(frames, &limits) else {
        return;
    };
    let Ok(path) = decode_split(&dictionary, segments, &limits) else {
        return;
    };
    assert!(path.depth() <= limits.max_depth);
    assert!(path.segments().len() <= limits.max_segments);
    assert!(path.segments().iter().all(|s| !s.duration.is_zero()));
    let unlimited = DecodeLimits::new()
        .with_max_bytes(usize::MAX)
        .with_max_strings(usize::MAX)
        .with_max_tree_entries(usize::MAX)
        .with_max_segments(usize::MAX)
        .with_max_depth(usize::MAX)
        .with_max_stack_frames(usize::MAX);
    let options = EncodeOptions::new()
        .with_max_bytes(usize::MAX)
        .with_decode_limits(unlimited);
    let again = encode_split(&path, &options);
    let dictionary = decode_frames(&again.frames, &unlimited).expect("own dictionary decodes");
    let back = decode_split(&dictionary, &again.segments, &unlimited)
        .expect("a decoded path re-encodes to something that decodes");
    assert_eq!(back, path);
});
