//! Record sinks, by their earlier name: everything here lives in
//! [`export`](crate::export) now (the one module for where records go) and is
//! re-exported so existing `cpt_sdk::sink::…` imports keep working.

pub use crate::export::{
    Export, ExportError, ExportHandle, Exporter, ExporterBuilder, JsonLines, RecordSink,
    json_lines_file,
};
#[cfg(feature = "testing")]
pub use crate::testing::RecordingSink;
