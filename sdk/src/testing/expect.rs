//! Expected critical paths: `expect::path().segment(["A1"], ms(5))…`.

use std::fmt::Write as _;
use std::time::Duration;

use crate::path::{CriticalPath, SegmentKind};

/// Start an expectation.
pub fn path() -> ExpectedPath {
    ExpectedPath::default()
}

/// An expected path: segments in order, each a stack of frame names, a
/// duration and optionally a kind.
#[derive(Clone, Debug, Default)]
pub struct ExpectedPath {
    segments: Vec<(Vec<String>, Duration, Option<SegmentKind>)>,
    tolerance: Duration,
    noise: Duration,
    merge_kinds: bool,
}

impl ExpectedPath {
    /// A segment with this stack (root first, frame names) and duration, of
    /// any kind. Adjacent actual segments with the same stack are merged
    /// before comparing when only kind-less segments are expected.
    #[must_use]
    pub fn segment<S: AsRef<str>>(
        mut self,
        stack: impl IntoIterator<Item = S>,
        duration: Duration,
    ) -> Self {
        let stack = stack.into_iter().map(|s| s.as_ref().to_owned()).collect();
        self.segments.push((stack, duration, None));
        self
    }

    /// A segment of exactly this kind.
    #[must_use]
    pub fn segment_kind<S: AsRef<str>>(
        mut self,
        stack: impl IntoIterator<Item = S>,
        duration: Duration,
        kind: SegmentKind,
    ) -> Self {
        let stack = stack.into_iter().map(|s| s.as_ref().to_owned()).collect();
        self.segments.push((stack, duration, Some(kind)));
        self
    }

    /// Accept durations within `d` of the expected (real-time tests).
    #[must_use]
    pub fn within(mut self, d: Duration) -> Self {
        self.tolerance = d;
        self
    }

    /// Ignore actual segments shorter than `d` (scheduler slivers in
    /// real-time tests); the remaining ones are merged by stack.
    #[must_use]
    pub fn ignoring_shorter_than(mut self, d: Duration) -> Self {
        self.noise = d;
        self.merge_kinds = true;
        self
    }

    /// Compare, describing every difference.
    ///
    /// # Errors
    ///
    /// A readable report of expected vs actual segments.
    pub fn check(&self, path: &CriticalPath) -> Result<(), String> {
        let any_kind = self.merge_kinds || self.segments.iter().all(|s| s.2.is_none());
        let mut actual: Vec<(Vec<String>, Duration, SegmentKind)> = Vec::new();
        for seg in path.segments() {
            if seg.duration < self.noise {
                continue;
            }
            let names: Vec<String> = path.stack_frames(seg).map(|f| f.name.to_string()).collect();
            match actual.last_mut() {
                Some(last) if any_kind && last.0 == names => last.1 += seg.duration,
                _ => actual.push((names, seg.duration, seg.kind)),
            }
        }
        let mut ok = actual.len() == self.segments.len();
        for (a, e) in actual.iter().zip(&self.segments) {
            let diff = a.1.abs_diff(e.1);
            ok &= a.0 == e.0 && diff <= self.tolerance && e.2.is_none_or(|k| k == a.2);
        }
        if ok {
            return Ok(());
        }
        let mut msg = String::from("critical path mismatch\n  expected:\n");
        for (s, d, k) in &self.segments {
            let _ = writeln!(
                msg,
                "    {:<30} {:>12?} {}",
                s.join("/"),
                d,
                k.map_or("", |k| k.as_str())
            );
        }
        msg.push_str("  actual:\n");
        for (s, d, k) in &actual {
            let _ = writeln!(msg, "    {:<30} {:>12?} {}", s.join("/"), d, k.as_str());
        }
        Err(msg)
    }

    /// Compare and panic with the report on a mismatch.
    ///
    /// # Panics
    ///
    /// When the path does not match.
    #[track_caller]
    pub fn assert(&self, path: &CriticalPath) {
        if let Err(msg) = self.check(path) {
            panic!("{msg}");
        }
    }
}
