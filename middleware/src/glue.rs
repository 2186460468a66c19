//! What the middleware adapts from the SDK: root and RPC nodes
//! (`cpt_sdk::request` with the options the layers need), sampling, and the
//! path's wire form in headers (`cpt_sdk::codec` + base64, as tonic encodes
//! `-bin` metadata). Where an SDK call needs no adapting, the layers call
//! `cpt_sdk::request` directly.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use base64::Engine as _;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use bytes::Bytes;
use cpt_sdk::codec::{self, DecodeLimits, EncodeOptions};
use cpt_sdk::request::{self, RequestOptions};
use cpt_sdk::trigger::{Sampler, SamplingContext};
use cpt_sdk::{CalleeOutcome, CriticalPath, Labels, Trigger};
use http::HeaderValue;

/// Default size limit of a returned path, in wire bytes (before base64): the
/// codec's default, about 5.5 KiB of metadata after base64.
pub(crate) const DEFAULT_ENCODE_MAX_BYTES: usize = 4096;

/// Default size limit of an accepted callee path, in wire bytes.
pub(crate) const DEFAULT_DECODE_MAX_BYTES: usize = 16 * 1024;

/// tonic's binary metadata form: standard alphabet, written without padding,
/// read with or without.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The sampler a [`ServerLayer`](crate::ServerLayer) uses for requests that
/// arrive without a trusted trigger.
pub(crate) type SharedSampler = Option<Arc<dyn Sampler + Send + Sync>>;

/// The server's own sampling decision: its configured sampler, else the
/// installed `CriticalPathLayer`'s.
pub(crate) fn sample(sampler: &SharedSampler, endpoint: &str) -> Option<Trigger> {
    let cx = SamplingContext::new(Some(endpoint));
    match sampler {
        Some(s) => s.sample(&cx),
        None => request::sample(&cx),
    }
}

pub(crate) struct RootOptions {
    pub(crate) service: Arc<str>,
    pub(crate) endpoint: String,
    pub(crate) trigger: Trigger,
    /// `None` when no record will carry it (see `Server::call`).
    pub(crate) request_id: Option<String>,
    pub(crate) trace_id: Option<String>,
    pub(crate) labels: Labels,
    pub(crate) emit_record: bool,
}

/// Make the request's root node. Its span has target `cpt`, so its frame
/// carries no source location (it would point here, not at the service).
pub(crate) fn begin_root(opts: RootOptions) -> tracing::Span {
    let span = tracing::info_span!(target: "cpt", "cpt.server");
    let mut ro = RequestOptions::new(Some(opts.trigger))
        .with_service(opts.service)
        .with_name(opts.endpoint.as_str())
        .with_endpoint(opts.endpoint)
        .with_emit_record(opts.emit_record);
    if let Some(request_id) = opts.request_id {
        ro = ro.with_request_id(request_id);
    }
    if let Some(trace_id) = opts.trace_id {
        ro = ro.with_trace_id(trace_id);
    }
    for (k, v) in opts.labels {
        ro = ro.with_label(k, v);
    }
    request::begin(&span, ro);
    span
}

/// Make an RPC node, a child of the current node.
///
/// The name is recorded as a `str` (the layer copies it once into its
/// `Arc<str>`), not as `Display` (which would format it a second time).
pub(crate) fn begin_rpc(callee: &str, method: &str) -> tracing::Span {
    let name = format!("{callee} {method}");
    tracing::info_span!(target: "cpt", "cpt.client", cpt.name = name.as_str())
}

/// Attach what the callee returned to the RPC node.
pub(crate) fn set_callee(rpc: &tracing::Span, callee: &str, outcome: Option<CriticalPath>) {
    let outcome = match outcome {
        Some(path) => CalleeOutcome::Path(path),
        None => CalleeOutcome::BlindSpot {
            callee: callee.to_owned(),
        },
    };
    request::set_callee(rpc, outcome);
}

/// `x-cpt-want-path`'s value: the codec version this side reads.
pub(crate) fn codec_version_header() -> HeaderValue {
    HeaderValue::from(codec::VERSION)
}

/// Encode a path for [`header::PATH`](crate::header::PATH).
///
/// The base64 is written once, into the buffer the header value then owns
/// (no intermediate `String`, no copy into the `HeaderValue`).
pub(crate) fn encode_header(path: &CriticalPath, max_bytes: usize) -> Option<HeaderValue> {
    let bytes = codec::encode(path, &EncodeOptions::new().with_max_bytes(max_bytes));
    let mut text = vec![0; base64::encoded_len(bytes.len(), false)?];
    let written = BASE64.encode_slice(&bytes, &mut text).ok()?;
    text.truncate(written);
    let mut value = HeaderValue::from_maybe_shared(Bytes::from(text)).ok()?;
    // A path is large and different every time: HPACK must not put it in its
    // dynamic table (it would evict every other header's entry).
    value.set_sensitive(true);
    Some(value)
}

/// Why a callee's path header was not used.
#[derive(Debug)]
pub(crate) enum PathError {
    Oversize { len: usize, max: usize },
    Base64(base64::DecodeError),
    Codec(codec::DecodeError),
}

impl PathError {
    pub(crate) fn is_oversize(&self) -> bool {
        matches!(self, PathError::Oversize { .. })
    }
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathError::Oversize { len, max } => {
                write!(
                    f,
                    "x-cpt-path-bin of about {len} bytes, over the limit of {max}"
                )
            }
            PathError::Base64(e) => write!(f, "x-cpt-path-bin is not base64: {e}"),
            PathError::Codec(e) => write!(f, "{e}"),
        }
    }
}

/// Decode [`header::PATH`](crate::header::PATH), rejecting oversize values
/// before decoding them.
pub(crate) fn decode_header(
    value: &HeaderValue,
    max_bytes: usize,
) -> Result<CriticalPath, PathError> {
    let text = value.as_bytes();
    // base64 of n bytes is at least 4n/3 characters.
    let len = text.len() / 4 * 3;
    if len > max_bytes {
        return Err(PathError::Oversize {
            len,
            max: max_bytes,
        });
    }
    let bytes = BASE64.decode(text).map_err(PathError::Base64)?;
    codec::decode(&bytes, &DecodeLimits::new().with_max_bytes(max_bytes)).map_err(|e| {
        if bytes.len() > max_bytes {
            PathError::Oversize {
                len: bytes.len(),
                max: max_bytes,
            }
        } else {
            PathError::Codec(e)
        }
    })
}

/// A process-unique request id: a random per-process prefix and a counter.
pub(crate) fn new_request_id() -> String {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = *PREFIX.get_or_init(|| RandomState::new().hash_one(std::process::id()));
    format!("{prefix:016x}{:016x}", NEXT.fetch_add(1, Relaxed))
}
