//! Everything the middleware asks of the SDK, in one place.
//!
//! TEMPORARY: stubs until the SDK's request API lands.

use std::sync::Arc;

use cpt_sdk::{CriticalPath, Labels, Trigger};
use http::HeaderValue;

/// Default size limit of a path in wire bytes.
pub(crate) const DEFAULT_MAX_PATH_BYTES: usize = 16 * 1024;

/// A sampler shared by the services a layer makes.
#[derive(Clone)]
pub struct SharedSampler(Arc<dyn Fn() -> Option<Trigger> + Send + Sync>);

impl std::fmt::Debug for SharedSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedSampler")
    }
}

pub(crate) fn default_sampler() -> SharedSampler {
    SharedSampler(Arc::new(|| None))
}

pub(crate) fn sample(s: &SharedSampler) -> Option<Trigger> {
    (s.0)()
}

pub(crate) struct RootOptions {
    pub(crate) service: Arc<str>,
    pub(crate) endpoint: String,
    pub(crate) trigger: Trigger,
    pub(crate) request_id: String,
    pub(crate) trace_id: Option<String>,
    pub(crate) labels: Labels,
    pub(crate) emit_record: bool,
}

pub(crate) fn begin_root(_opts: RootOptions) -> tracing::Span {
    tracing::Span::none()
}

pub(crate) fn finish_root(_root: &tracing::Span) -> Option<CriticalPath> {
    None
}

pub(crate) fn current_trigger() -> Option<Trigger> {
    None
}

pub(crate) fn begin_rpc(_callee: &str, _method: &str) -> tracing::Span {
    tracing::Span::none()
}

pub(crate) enum CalleeOutcome {
    Path(CriticalPath),
    BlindSpot,
}

pub(crate) fn set_callee(_rpc: &tracing::Span, _callee: &str, _outcome: CalleeOutcome) {}

pub(crate) fn codec_version_header() -> HeaderValue {
    HeaderValue::from_static("1")
}

pub(crate) fn encode_header(_path: &CriticalPath, _max: usize) -> Option<HeaderValue> {
    None
}

#[derive(Debug)]
pub(crate) struct PathError;
impl PathError {
    pub(crate) fn is_oversize(&self) -> bool {
        false
    }
}
impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("bad path")
    }
}

pub(crate) fn decode_header(_v: &HeaderValue, _max: usize) -> Result<CriticalPath, PathError> {
    Err(PathError)
}

pub(crate) fn new_request_id() -> String {
    String::new()
}
