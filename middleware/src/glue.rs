//! What the middleware adapts from the SDK: root and RPC nodes
//! (`cpt_sdk::request` with the options the layers need), sampling, and the
//! path's wire form in headers (`cpt_sdk::codec` + base64, as tonic encodes
//! `-bin` metadata). Where an SDK call needs no adapting, the layers call
//! `cpt_sdk::request` directly.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use base64::Engine as _;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use bytes::Bytes;
use cpt_sdk::codec::{self, DecodeLimits, EncodeOptions, FrameDictionary};
use cpt_sdk::request::{self, RequestOptions};
use cpt_sdk::trigger::{Sampler, SamplingContext};
use cpt_sdk::{CalleeOutcome, CriticalPath, Labels, Trigger};
use http::{HeaderMap, HeaderValue};

use crate::header;

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

pub(crate) struct RootOptions<'a> {
    pub(crate) service: Arc<str>,
    pub(crate) endpoint: &'a str,
    pub(crate) trigger: Trigger,
    /// `None` when no record will carry it (see `Server::call`).
    pub(crate) request_id: Option<String>,
    pub(crate) trace_id: Option<String>,
    pub(crate) labels: Labels,
    pub(crate) emit_record: bool,
}

/// Make the request's root node. Its span has target `cpt`, so its frame
/// carries no source location (it would point here, not at the service).
///
/// The endpoint is copied only for a request that emits a record (no one
/// reads it otherwise), and the name is a shared `Arc<str>` ([`root_name`]).
pub(crate) fn begin_root(opts: RootOptions<'_>) -> tracing::Span {
    let span = tracing::info_span!(target: "cpt", "cpt.server");
    let mut ro = RequestOptions::new(Some(opts.trigger))
        .with_service(opts.service)
        .with_name(root_name(opts.endpoint))
        .with_emit_record(opts.emit_record);
    if opts.emit_record {
        ro = ro.with_endpoint(opts.endpoint);
    }
    if let Some(request_id) = opts.request_id {
        ro = ro.with_request_id(request_id);
    }
    if let Some(trace_id) = opts.trace_id {
        ro = ro.with_trace_id(trace_id);
    }
    // Moved in whole: no second map built entry by entry.
    ro.labels = opts.labels;
    request::begin(&span, ro);
    span
}

/// Make an RPC node, a child of the current node.
///
/// The name is recorded as a `str` (the layer copies it once into its
/// `Arc<str>`), not as `Display` (which would format it a second time). It
/// is assembled in a per-thread buffer, so no `String` is allocated per call.
pub(crate) fn begin_rpc(callee: &str, method: &str) -> tracing::Span {
    thread_local! {
        static NAME: RefCell<String> = const { RefCell::new(String::new()) };
    }
    let make = |name: &str| tracing::info_span!(target: "cpt", "cpt.client", cpt.name = name);
    // The buffer is borrowed only while the span is created (which reads
    // the name and cannot re-enter this function); a thread being torn
    // down, or a re-entrant borrow, gets a fresh string instead.
    NAME.try_with(|buf| {
        let mut buf = buf.try_borrow_mut().ok()?;
        buf.clear();
        buf.push_str(callee);
        buf.push(' ');
        buf.push_str(method);
        Some(make(&buf))
    })
    .ok()
    .flatten()
    .unwrap_or_else(|| make(&format!("{callee} {method}")))
}

/// The root node's name for `endpoint` as an `Arc<str>`: the one made for
/// the same endpoint recently on this thread (a reference count), else a
/// new one (kept for next time). Endpoints are bounded (methods, routes),
/// and the list is short, so this is a few length checks and one `memcmp`.
pub(crate) fn root_name(endpoint: &str) -> Arc<str> {
    thread_local! {
        static NAMES: RefCell<Recent<NameKey, Arc<str>>> = const { RefCell::new(Recent::new()) };
    }
    let kept = NAMES.try_with(|names| {
        let mut names = names.try_borrow_mut().ok()?;
        if let Some(name) = names.get(endpoint.as_bytes()) {
            return Some(name);
        }
        let name: Arc<str> = Arc::from(endpoint);
        names.insert(NameKey(name.clone()), name.clone());
        Some(name)
    });
    kept.ok().flatten().unwrap_or_else(|| Arc::from(endpoint))
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

/// `x-cpt-want-path`'s value: the highest codec version this side reads, as
/// a static value (no allocation per call).
pub(crate) fn codec_version_header() -> HeaderValue {
    HeaderValue::from_static(VERSION_TEXT)
}

/// [`codec::VERSION`] in decimal (`want_path_value_is_the_codec_version`
/// checks the two agree).
const VERSION_TEXT: &str = "2";
const _: () = assert!(
    codec::VERSION == 2,
    "update VERSION_TEXT with codec::VERSION"
);

/// The codec version to answer a caller's `x-cpt-want-path` in: the highest
/// both sides read. A value that is not a number (an older or foreign
/// caller) gets the single form, which every reader reads.
pub(crate) fn answer_version(want: Option<&HeaderValue>) -> u32 {
    match want
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u32>().ok())
    {
        Some(v) if v >= codec::VERSION => codec::VERSION,
        _ => codec::SINGLE_VERSION,
    }
}

/// A path's response headers: [`header::PATH`] alone (version 1), or with
/// its frame dictionary in [`header::FRAMES`] (version 2).
#[derive(Debug)]
pub(crate) struct PathHeaders {
    pub(crate) frames: Option<HeaderValue>,
    pub(crate) path: HeaderValue,
}

impl PathHeaders {
    /// Add them to a response's headers or trailers.
    pub(crate) fn insert_into(self, headers: &mut HeaderMap) {
        if let Some(frames) = self.frames {
            headers.insert(header::FRAMES, frames);
        }
        headers.insert(header::PATH, self.path);
    }

    /// Take them out of a response's headers or trailers (the application
    /// does not see them); `None` without [`header::PATH`].
    pub(crate) fn take_from(headers: &mut HeaderMap) -> Option<Self> {
        let frames = headers.remove(header::FRAMES);
        let path = headers.remove(header::PATH)?;
        Some(PathHeaders { frames, path })
    }
}

/// Base64 of `bytes` in a header value, written once into the buffer the
/// value then owns (no intermediate `String`, no copy).
fn base64_value(bytes: &[u8]) -> Option<HeaderValue> {
    let mut text = vec![0; base64::encoded_len(bytes.len(), false)?];
    let written = BASE64.encode_slice(bytes, &mut text).ok()?;
    text.truncate(written);
    HeaderValue::from_maybe_shared(Bytes::from(text)).ok()
}

/// How many recent dictionaries each thread keeps, on either side.
const DICTIONARY_CACHE: usize = 8;

/// Dictionaries longer than this (in wire bytes) are not kept: HPACK does
/// not index a header over 3/4 of its 4 KiB table anyway, and one unusual
/// path must not pin its memory in every thread.
const MAX_CACHED_DICTIONARY: usize = 2048;

/// A small most-recently-used list: a hit moves to the front, a new entry
/// pushes out the last. Linear search over a few entries (a length check
/// and a `memcmp` each) is cheaper than hashing a dictionary.
#[derive(Debug)]
pub(crate) struct Recent<K, V> {
    entries: Vec<(K, V)>,
}

impl<K: AsRef<[u8]>, V: Clone> Recent<K, V> {
    const fn new() -> Self {
        Recent {
            entries: Vec::new(),
        }
    }

    fn get(&mut self, key: &[u8]) -> Option<V> {
        let i = self.entries.iter().position(|(k, _)| k.as_ref() == key)?;
        self.entries[..=i].rotate_right(1);
        Some(self.entries[0].1.clone())
    }

    fn insert(&mut self, key: K, value: V) {
        if key.as_ref().len() > MAX_CACHED_DICTIONARY {
            return;
        }
        if self.entries.len() == DICTIONARY_CACHE {
            self.entries.pop();
        }
        self.entries.insert(0, (key, value));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// A name's bytes, as a cache key.
#[derive(Debug)]
struct NameKey(Arc<str>);

impl AsRef<[u8]> for NameKey {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// A header value's bytes, as a cache key.
#[derive(Debug)]
struct ValueKey(HeaderValue);

impl AsRef<[u8]> for ValueKey {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

thread_local! {
    /// Callee side: encoded dictionaries and the header values (base64)
    /// last sent for them. The same value again is the same HPACK entry.
    static SENT: RefCell<Recent<Vec<u8>, HeaderValue>> = const { RefCell::new(Recent::new()) };
    /// Caller side: dictionary header values (base64, as received) and what
    /// they decoded to.
    static RECEIVED: RefCell<Recent<ValueKey, FrameDictionary>> = const { RefCell::new(Recent::new()) };
}

/// The header value of an encoded frame dictionary: the one sent last
/// time for the same bytes, else a new one (kept for next time).
///
/// A dictionary seen again is not sensitive: it comes back response after
/// response, and HPACK's dynamic table is what makes it cheap. The first
/// time a thread sends one it is marked sensitive, so that dictionaries of
/// one-off shapes never take room in the table (each would evict other
/// headers' entries); from the second time on HPACK indexes it.
fn frames_value(frames: Vec<u8>) -> Option<HeaderValue> {
    let cached = SENT
        .try_with(|c| c.borrow_mut().get(&frames))
        .ok()
        .flatten();
    if cached.is_some() {
        return cached;
    }
    let value = base64_value(&frames)?;
    let mut first = value.clone();
    first.set_sensitive(true);
    let _ = SENT.try_with(|c| c.borrow_mut().insert(frames, value));
    Some(first)
}

/// Encode a path for the response headers, in `version` (see
/// [`answer_version`]).
pub(crate) fn encode_header(
    path: &CriticalPath,
    max_bytes: usize,
    version: u32,
) -> Option<PathHeaders> {
    let options = EncodeOptions::new().with_max_bytes(max_bytes);
    let (frames, path_bytes) = if version >= codec::VERSION {
        let split = codec::encode_split(path, &options);
        (Some(frames_value(split.frames)?), split.segments)
    } else {
        (None, codec::encode(path, &options))
    };
    let mut value = base64_value(&path_bytes)?;
    // The segments are different every time: HPACK must not put them in its
    // dynamic table (they would evict every other header's entry).
    value.set_sensitive(true);
    Some(PathHeaders {
        frames,
        path: value,
    })
}

/// Why a callee's path headers were not used.
#[derive(Debug)]
pub(crate) enum PathError {
    Oversize { len: usize, max: usize },
    Base64(&'static str, base64::DecodeError),
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
                    "x-cpt-path-bin (with x-cpt-frames-bin) of about {len} bytes, over the limit of {max}"
                )
            }
            PathError::Base64(name, e) => write!(f, "{name} is not base64: {e}"),
            PathError::Codec(e) => write!(f, "{e}"),
        }
    }
}

/// Decode a callee's path headers, rejecting oversize values before
/// decoding them. A dictionary seen recently on this thread is not decoded
/// again.
pub(crate) fn decode_header(
    headers: &PathHeaders,
    max_bytes: usize,
) -> Result<CriticalPath, PathError> {
    // base64 of n bytes is at least 4n/3 characters.
    let frames_text = headers
        .frames
        .as_ref()
        .map_or(&[][..], HeaderValue::as_bytes);
    let len = frames_text.len() / 4 * 3 + headers.path.as_bytes().len() / 4 * 3;
    if len > max_bytes {
        return Err(PathError::Oversize {
            len,
            max: max_bytes,
        });
    }
    let limits = DecodeLimits::new().with_max_bytes(max_bytes);
    let oversize = |len: usize, e: codec::DecodeError| {
        if len > max_bytes {
            PathError::Oversize {
                len,
                max: max_bytes,
            }
        } else {
            PathError::Codec(e)
        }
    };
    let path_text = headers.path.as_bytes();
    let Some(frames_value) = &headers.frames else {
        return with_decoded("x-cpt-path-bin", path_text, |bytes| {
            codec::decode(bytes, &limits).map_err(|e| oversize(bytes.len(), e))
        });
    };
    let dictionary = received_dictionary(frames_value, &limits, &oversize)?;
    with_decoded("x-cpt-path-bin", path_text, |bytes| {
        codec::decode_split(&dictionary, bytes, &limits)
            .map_err(|e| oversize(dictionary.encoded_len() + bytes.len(), e))
    })
}

/// Decoded buffers up to this capacity are kept for the thread's next
/// decode; a larger one (a path over the default limit) is freed.
const MAX_KEPT_DECODE_BUFFER: usize = DEFAULT_DECODE_MAX_BYTES;

thread_local! {
    /// The buffer [`with_decoded`] decodes into.
    static DECODE_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` on the base64 decoding of header `name`'s `text`, decoded into a
/// per-thread buffer reused from call to call (no allocation per path once
/// the buffer has grown to the paths' size).
fn with_decoded<R>(
    name: &'static str,
    text: &[u8],
    f: impl FnOnce(&[u8]) -> Result<R, PathError>,
) -> Result<R, PathError> {
    let decode = |buf: &mut Vec<u8>| {
        buf.clear();
        BASE64
            .decode_vec(text, buf)
            .map_err(|e| PathError::Base64(name, e))
    };
    let mut f = Some(f);
    let pooled = DECODE_BUFFER.try_with(|cell| {
        let mut buf = cell.try_borrow_mut().ok()?;
        let f = f.take()?;
        let result = decode(&mut buf).and_then(|()| f(&buf));
        if buf.capacity() > MAX_KEPT_DECODE_BUFFER {
            *buf = Vec::new();
        }
        Some(result)
    });
    match (pooled, f) {
        (Ok(Some(result)), _) => result,
        // The thread is being torn down, or the buffer is in use further up
        // the stack: a buffer of its own.
        (_, Some(f)) => {
            let mut buf = Vec::new();
            decode(&mut buf)?;
            f(&buf)
        }
        (_, None) => unreachable!("f runs only when the pooled result is returned"),
    }
}

/// The decoded dictionary of a received `x-cpt-frames-bin` value.
fn received_dictionary(
    value: &HeaderValue,
    limits: &DecodeLimits,
    oversize: &dyn Fn(usize, codec::DecodeError) -> PathError,
) -> Result<FrameDictionary, PathError> {
    if let Some(hit) = RECEIVED
        .try_with(|c| c.borrow_mut().get(value.as_bytes()))
        .ok()
        .flatten()
    {
        return Ok(hit);
    }
    let dictionary = with_decoded("x-cpt-frames-bin", value.as_bytes(), |bytes| {
        codec::decode_frames(bytes, limits).map_err(|e| oversize(bytes.len(), e))
    })?;
    let _ = RECEIVED.try_with(|c| {
        c.borrow_mut()
            .insert(ValueKey(value.clone()), dictionary.clone())
    });
    Ok(dictionary)
}

/// A process-unique request id: a random per-process prefix and a counter.
pub(crate) fn new_request_id() -> String {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = *PREFIX.get_or_init(|| RandomState::new().hash_one(std::process::id()));
    // Written into a string of the final size: one allocation.
    let mut id = String::with_capacity(32);
    let _ = write!(id, "{prefix:016x}{:016x}", NEXT.fetch_add(1, Relaxed));
    id
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cpt_sdk::{Frame, SegmentKind};

    use super::*;

    fn path(name: &str, nanos: u64) -> CriticalPath {
        let mut p = CriticalPath::new();
        p.push_frames(
            [Frame::new("S", "/pkg.S/M"), Frame::new("S", name)],
            Duration::from_nanos(nanos),
            SegmentKind::Busy,
        );
        p
    }

    fn sent_len() -> usize {
        SENT.with(|c| c.borrow().len())
    }

    fn received_len() -> usize {
        RECEIVED.with(|c| c.borrow().len())
    }

    #[test]
    fn dictionary_caches_are_bounded_on_both_sides() {
        // A hostile or just varied peer: every path over other frames.
        for i in 0..3 * DICTIONARY_CACHE {
            let p = path(&format!("step_{i}"), 10 + i as u64);
            let headers = encode_header(&p, 4096, codec::VERSION).unwrap();
            assert!(headers.frames.is_some());
            assert_eq!(decode_header(&headers, 4096).unwrap(), p);
            assert!(sent_len() <= DICTIONARY_CACHE);
            assert!(received_len() <= DICTIONARY_CACHE);
        }
        assert_eq!(sent_len(), DICTIONARY_CACHE);
        assert_eq!(received_len(), DICTIONARY_CACHE);
        // A dictionary over MAX_CACHED_DICTIONARY is used, not kept.
        SENT.with(|c| c.borrow_mut().entries.clear());
        RECEIVED.with(|c| c.borrow_mut().entries.clear());
        let long = path(&"x".repeat(MAX_CACHED_DICTIONARY + 1), 5);
        let headers = encode_header(&long, 1 << 20, codec::VERSION).unwrap();
        assert_eq!(decode_header(&headers, 1 << 20).unwrap(), long);
        assert_eq!((sent_len(), received_len()), (0, 0));
    }

    #[test]
    fn a_repeated_dictionary_is_one_header_value_and_one_decode() {
        let a = encode_header(&path("work", 1), 4096, codec::VERSION).unwrap();
        let b = encode_header(&path("work", 2), 4096, codec::VERSION).unwrap();
        let (fa, fb) = (a.frames.as_ref().unwrap(), b.frames.as_ref().unwrap());
        assert_eq!(
            fa.as_bytes().as_ptr(),
            fb.as_bytes().as_ptr(),
            "base64 written once"
        );
        assert_ne!(a.path, b.path);
        assert_eq!(decode_header(&a, 4096).unwrap(), path("work", 1));
        let cached = received_len();
        assert_eq!(decode_header(&b, 4096).unwrap(), path("work", 2));
        assert_eq!(received_len(), cached, "the second use is a cache hit");
        // A cached dictionary still answers to the limits of each use.
        let err = decode_header(&b, 16).unwrap_err();
        assert!(err.is_oversize(), "{err}");
    }

    #[test]
    fn want_path_value_is_the_codec_version() {
        assert_eq!(codec_version_header(), HeaderValue::from(codec::VERSION));
        assert_eq!(VERSION_TEXT, codec::VERSION.to_string());
    }

    #[test]
    fn root_names_are_shared_per_endpoint_and_always_right() {
        let a = root_name("/a.A/Run");
        let b = root_name("/a.A/Run");
        assert_eq!(&*a, "/a.A/Run");
        assert!(
            Arc::ptr_eq(&a, &b),
            "the second use shares the first's name"
        );
        // Many endpoints (more than are kept) still get their own names.
        for i in 0..3 * DICTIONARY_CACHE {
            let endpoint = format!("/s.S/M{i}");
            assert_eq!(&*root_name(&endpoint), endpoint);
        }
        // One too long to keep is named right, every time.
        let long = "/x".repeat(MAX_CACHED_DICTIONARY);
        assert_eq!(&*root_name(&long), long);
        assert_eq!(&*root_name(&long), long);
        assert_eq!(&*root_name("/a.A/Run"), "/a.A/Run");
    }

    #[test]
    fn decode_buffer_is_reused_and_a_large_one_released() {
        let small = encode_header(&path("work", 1), 4096, codec::VERSION).unwrap();
        assert_eq!(decode_header(&small, 4096).unwrap(), path("work", 1));
        let kept = DECODE_BUFFER.with(|b| b.borrow().as_ptr());
        assert_eq!(decode_header(&small, 4096).unwrap(), path("work", 1));
        assert_eq!(DECODE_BUFFER.with(|b| b.borrow().as_ptr()), kept, "reused");
        // A path over the kept size decodes right and does not stay.
        let big = path(&"y".repeat(2 * MAX_KEPT_DECODE_BUFFER), 3);
        let one = encode_header(&big, 1 << 20, codec::SINGLE_VERSION).unwrap();
        assert_eq!(decode_header(&one, 1 << 20).unwrap(), big);
        assert!(DECODE_BUFFER.with(|b| b.borrow().capacity()) <= MAX_KEPT_DECODE_BUFFER);
        // Bad base64 is still an error naming the header.
        let bad = PathHeaders {
            frames: None,
            path: HeaderValue::from_static("!!!!"),
        };
        let err = decode_header(&bad, 4096).unwrap_err();
        assert!(
            err.to_string().contains("x-cpt-path-bin is not base64"),
            "{err}"
        );
    }

    #[test]
    fn version_answered_is_the_highest_both_read() {
        let v = |s: &'static str| answer_version(Some(&HeaderValue::from_static(s)));
        assert_eq!(v("1"), 1);
        assert_eq!(v("2"), 2);
        assert_eq!(v("17"), codec::VERSION);
        assert_eq!(v("yes"), codec::SINGLE_VERSION);
        assert_eq!(v("0"), codec::SINGLE_VERSION);
        assert_eq!(answer_version(None), codec::SINGLE_VERSION);
        let one = encode_header(&path("work", 1), 4096, 1).unwrap();
        assert!(one.frames.is_none());
        assert_eq!(decode_header(&one, 4096).unwrap(), path("work", 1));
    }
}
