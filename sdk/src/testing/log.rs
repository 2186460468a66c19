//! [`LogBuffer`]: what a test's subscriber logged, to assert on.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

/// A clonable in-memory writer for a test's log: give
/// `move || buffer.clone()` to `tracing_subscriber::fmt().with_writer(..)`
/// (a closure returning a writer is a `MakeWriter`), then read
/// [`lines`](Self::lines).
///
/// ```
/// use std::io::Write as _;
/// use cpt_sdk::testing::log::LogBuffer;
/// let log = LogBuffer::default();
/// let mut writer = log.clone();
/// writeln!(writer, " WARN cpt: something").unwrap();
/// assert_eq!(log.lines_with("WARN"), vec![" WARN cpt: something".to_owned()]);
/// ```
#[derive(Clone, Debug, Default)]
pub struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    /// Everything written so far, as text.
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The lines written so far.
    pub fn lines(&self) -> Vec<String> {
        self.text().lines().map(str::to_owned).collect()
    }

    /// The lines that contain `needle` (e.g. a level: `"WARN"`).
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| l.contains(needle))
            .collect()
    }
}

impl io::Write for LogBuffer {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
