//! [`JsonLines`]: records in their JSON Lines form (one record per line, see
//! [`record`](crate::record)) to any `Write`. It is an [`Export`], so it runs
//! on an exporter's worker thread and never blocks a request;
//! [`json_lines_file`] wires both up.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::Path;

use super::{Export, ExportError, ExportHandle, Exporter};
use crate::record::Record;

/// Writes records as JSON Lines.
#[derive(Debug)]
pub struct JsonLines<W: Write> {
    out: W,
}

impl<W: Write + Send + 'static> JsonLines<W> {
    /// Write to `out` (wrap files in a `BufWriter`).
    pub fn new(out: W) -> Self {
        JsonLines { out }
    }

    /// The writer back.
    pub fn into_inner(self) -> W {
        self.out
    }
}

impl JsonLines<BufWriter<File>> {
    /// Append to the file at `path`, creating it.
    ///
    /// # Errors
    ///
    /// When the file cannot be opened for appending.
    pub fn append(path: impl AsRef<Path>) -> io::Result<Self> {
        let f = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(JsonLines::new(BufWriter::new(f)))
    }
}

impl<W: Write + Send + 'static> Export for JsonLines<W> {
    fn export(&mut self, batch: &[Record]) -> Result<(), ExportError> {
        for r in batch {
            self.out.write_all(r.to_json().as_bytes())?;
            self.out.write_all(b"\n")?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ExportError> {
        self.out.flush()?;
        Ok(())
    }
}

/// An exporter appending JSON Lines to the file at `path`: give the
/// [`Exporter`] to the layer, keep the handle to flush or shut down.
///
/// # Errors
///
/// When the file cannot be opened for appending.
pub fn json_lines_file(path: impl AsRef<Path>) -> io::Result<(Exporter, ExportHandle)> {
    Ok(Exporter::builder().build(JsonLines::append(path)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::RecordSink;
    use crate::path::{CriticalPath, Frame, SegmentKind};
    use crate::trigger::Trigger;
    use std::time::Duration;

    #[test]
    fn json_lines_file_round_trips() {
        let dir = std::env::temp_dir().join(format!("cpt-sink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("records.jsonl");
        let _ = std::fs::remove_file(&file);
        let (sink, handle) = json_lines_file(&file).unwrap();
        let mut p = CriticalPath::new();
        p.push_frames(
            [Frame::new("A", "A1")],
            Duration::from_millis(5),
            SegmentKind::Busy,
        );
        let r = Record::new("A", Trigger::Forced, p);
        sink.emit(r.clone());
        sink.emit(r.clone());
        handle.shutdown();
        let text = std::fs::read_to_string(&file).unwrap();
        let back: Vec<Record> = text
            .lines()
            .map(|l| Record::from_json(l).unwrap())
            .collect();
        assert_eq!(back, vec![r.clone(), r]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
