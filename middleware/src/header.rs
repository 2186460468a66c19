//! Every header (gRPC metadata key) the middleware reads or writes.
//!
//! | header | direction | value |
//! |---|---|---|
//! | [`TRIGGER`] `x-cpt-trigger` | request, caller → callee | `sampled` or `forced`: the caller's request is traced; honoured only from trusted callers |
//! | [`WANT_PATH`] `x-cpt-want-path` | request, caller → callee | the codec version the caller reads; asks for the callee's path |
//! | [`CALLER_AUTH`] `x-cpt-caller-auth` | request, caller → callee | shared secret proving the caller is trusted ([`SharedSecret`](crate::SharedSecret)) |
//! | [`FORCE`] `x-cpt-force` | request, operator → entry service | credential forcing a trace: hex HMAC-SHA256 of the request id, or a configured token |
//! | [`REQUEST_ID`] `x-request-id` | request | the request's id (the MAC input of [`FORCE`]); generated when absent |
//! | [`PATH`] `x-cpt-path-bin` | response headers (unary, trailers-only) or trailers (streaming) | the callee's critical path in the codec's wire form, base64 (gRPC binary metadata): the whole path (version 1), or its segments (version 2); marked sensitive (never HPACK-indexed) |
//! | [`FRAMES`] `x-cpt-frames-bin` | next to [`PATH`], version 2 only | the path's frame dictionary (codec split form), base64; the same bytes for every path over the same frames, so HTTP/2's HPACK indexes it (from its second sighting on a thread: the first is marked sensitive) |
//! | [`NO_PATH`] `x-cpt-no-path` | response headers, callee → caller | why a callee that was asked for its path and trusts the caller cannot return it: [`NO_PATH_NO_TRAILERS`] (a streamed response of a server that sends no trailers, actix-web) |
//! | [`TRACEPARENT`] `traceparent` | request | W3C trace context; its trace id goes into the record |
//!
//! Binary gRPC metadata keys must end in `-bin`; tonic base64-encodes their
//! values (standard alphabet, padding optional), and the HTTP layers use the
//! same form so one key serves both.

use http::HeaderName;

/// `x-cpt-trigger`: the caller's trigger (`sampled` / `forced`).
pub const TRIGGER: HeaderName = HeaderName::from_static("x-cpt-trigger");

/// `x-cpt-want-path`: the caller asks for the callee's critical path; the value
/// is the highest codec version it reads.
pub const WANT_PATH: HeaderName = HeaderName::from_static("x-cpt-want-path");

/// `x-cpt-caller-auth`: a shared secret a [`SharedSecret`](crate::SharedSecret)
/// trust policy checks.
pub const CALLER_AUTH: HeaderName = HeaderName::from_static("x-cpt-caller-auth");

/// `x-cpt-force`: an operator's credential forcing a trace on this request.
pub const FORCE: HeaderName = HeaderName::from_static("x-cpt-force");

/// `x-request-id`: the request's id; the input of the [`FORCE`] MAC.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `x-cpt-path-bin`: the callee's critical path (codec wire form, base64).
pub const PATH: HeaderName = HeaderName::from_static(PATH_NAME);

/// [`PATH`]'s name, for header maps of other `http` versions.
pub(crate) const PATH_NAME: &str = "x-cpt-path-bin";

/// `x-cpt-frames-bin`: the frame dictionary of the path in [`PATH`] (codec
/// version 2, base64), when the caller reads version 2.
pub const FRAMES: HeaderName = HeaderName::from_static(FRAMES_NAME);

/// [`FRAMES`]'s name, for header maps of other `http` versions.
pub(crate) const FRAMES_NAME: &str = "x-cpt-frames-bin";

/// `x-cpt-no-path`: the callee cannot return the path its trusted caller
/// asked for, and says why (see [`NO_PATH_NO_TRAILERS`]). The caller's
/// blind-spot warning names that cause instead of a missing layer or trust.
pub const NO_PATH: HeaderName = HeaderName::from_static(NO_PATH_NAME);

/// [`NO_PATH`]'s name, for header maps of other `http` versions.
pub(crate) const NO_PATH_NAME: &str = "x-cpt-no-path";

/// [`NO_PATH`]'s value when the response streams and its server sends no
/// trailers (actix-web), so the path has nowhere to go.
pub const NO_PATH_NO_TRAILERS: &str = "no-trailers";

/// `traceparent`: W3C trace context.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// `te`: a caller asking for a streamed HTTP/1.1 path must accept trailers.
pub const TE: HeaderName = http::header::TE;

/// `grpc-status`: present in the headers of a trailers-only gRPC response.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// The W3C trace id in a `traceparent` value (`00-<32 hex>-<16 hex>-<2 hex>`),
/// or `None` when the value is malformed or the id is all zeros.
pub fn trace_id_from_traceparent(value: &str) -> Option<&str> {
    let mut parts = value.trim().split('-');
    let version = parts.next()?;
    let trace_id = parts.next()?;
    let span_id = parts.next()?;
    let flags = parts.next()?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(version, 2) || version == "ff" || !hex(span_id, 16) || !hex(flags, 2) {
        return None;
    }
    if !hex(trace_id, 32) || trace_id.bytes().all(|b| b == b'0') {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    Some(trace_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const CASES: &[(&str, &str, Option<&str>)] = &[
        ("valid",        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Some("4bf92f3577b34da6a3ce929d0e0e4736")),
        ("zero id",      "00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
        ("short id",     "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",   None),
        ("bad version",  "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
        ("extra field",  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", None),
        ("future ver",   "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", Some("4bf92f3577b34da6a3ce929d0e0e4736")),
        ("not hex",      "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", None),
        ("empty",        "", None),
    ];

    #[test]
    fn traceparent_trace_id() {
        for (name, input, want) in CASES {
            assert_eq!(trace_id_from_traceparent(input), *want, "case {name}");
        }
    }
}
