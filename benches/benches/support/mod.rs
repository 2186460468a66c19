//! What several benches share: the repository's DeathStarBench media set.

use std::path::PathBuf;

/// The media set's load levels, in order.
pub(crate) const MEDIA_LEVELS: [u32; 6] = [25, 50, 75, 100, 125, 150];

/// The media set's files for `levels` (each of [`MEDIA_LEVELS`]); panics
/// naming a missing file and how to restore it.
pub(crate) fn media(levels: &[u32]) -> Vec<PathBuf> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/traces/traceweaver-media");
    levels
        .iter()
        .map(|l| {
            let p = dir.join(format!("media_load{l}.jaeger.json.gz"));
            assert!(
                p.exists(),
                "{}: missing; the media set is checked into the repository's testdata/, \
                 restore it with `git checkout -- testdata`",
                p.display()
            );
            p
        })
        .collect()
}

/// All six media files.
#[allow(dead_code)] // not every bench reads the whole set
pub(crate) fn media_all() -> Vec<PathBuf> {
    media(&MEDIA_LEVELS)
}
