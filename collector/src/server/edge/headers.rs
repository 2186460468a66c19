//! The security headers of every answer of the HTTP port (pages, assets,
//! API), added by the route guard (`routes.rs`):
//!
//! - `Content-Security-Policy` [`PAGE_CSP`]: only this origin's stylesheet
//!   and frames, no script, forms posting here only, and never framed
//!   (`frame-ancestors 'none'`);
//! - `X-Frame-Options: DENY`, for browsers older than `frame-ancestors`;
//! - `X-Content-Type-Options: nosniff`;
//! - `Referrer-Policy: no-referrer`: a selection in a page's URL (service
//!   names, labels) never leaves in a `Referer`.
//!
//! The flame graphs (`/ui/flame.svg`, `/ui/diff.svg`) are the one
//! exception, set by their handler through [`flame_graph`]: inferno's SVG
//! carries its own script (zoom, search) and stylesheet, allowed by their
//! SHA-256 hashes and nothing else, and the collector's own pages frame it
//! (`frame-ancestors 'self'`).
//!
//! A request hyper cannot parse (a request line over 64 KiB, headers over
//! its buffer, malformed HTTP/1) never reaches the guard: hyper answers it
//! itself (400, 414, 431, empty) and closes the connection. Every
//! connection's stream is wrapped in [`ParseErrorHeaders`], which adds the
//! same headers to such an answer as it is written.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use base64::Engine as _;
use http::{HeaderMap, HeaderValue, header};
use sha2::Digest as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The policy of every page and answer but the flame graphs.
pub(crate) const PAGE_CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
    frame-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// Add the security headers, keeping a policy the handler set.
pub(crate) fn secure(h: &mut HeaderMap) {
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(PAGE_CSP),
        );
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

/// `buf` with the security headers added, when it starts with the head of
/// one of hyper's own answers (an HTTP/1 4xx without a
/// `Content-Security-Policy`: every answer of the router has one).
fn secured_parse_error(buf: &[u8]) -> Option<Vec<u8>> {
    if !(buf.starts_with(b"HTTP/1.1 4") || buf.starts_with(b"HTTP/1.0 4")) {
        return None;
    }
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = buf[..head_end].to_ascii_lowercase();
    if head
        .windows(b"content-security-policy:".len())
        .any(|w| w == b"content-security-policy:")
    {
        return None;
    }
    let line_end = buf.windows(2).position(|w| w == b"\r\n")? + 2;
    let mut added = HeaderMap::new();
    secure(&mut added);
    let mut out = Vec::with_capacity(buf.len() + 512);
    out.extend_from_slice(&buf[..line_end]);
    for (name, value) in &added {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(&buf[line_end..]);
    Some(out)
}

/// A connection's stream that gives hyper's own answers to requests it
/// cannot parse the security headers (see the module docs); everything
/// else passes through unchanged.
pub(crate) struct ParseErrorHeaders<T> {
    inner: T,
    /// A rewritten answer not yet all written, and how much of it is.
    pending: Vec<u8>,
    written: usize,
}

impl<T> ParseErrorHeaders<T> {
    pub(crate) fn new(inner: T) -> Self {
        ParseErrorHeaders {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }
}

impl<T: AsyncWrite + Unpin> ParseErrorHeaders<T> {
    /// Write what is pending.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }

    /// Take `buf` as written when it is one of hyper's own answers
    /// (rewritten, and written as far as the stream takes it now).
    fn take_parse_error(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Option<io::Result<usize>> {
        let secured = secured_parse_error(buf)?;
        self.pending = secured;
        self.written = 0;
        match self.drain(cx) {
            Poll::Ready(Err(e)) => Some(Err(e)),
            // The rest goes out on the next write, flush or shutdown.
            Poll::Ready(Ok(())) | Poll::Pending => Some(Ok(buf.len())),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ParseErrorHeaders<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ParseErrorHeaders<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.drain(cx))?;
        if let Some(done) = this.take_parse_error(cx, buf) {
            return Poll::Ready(done);
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.drain(cx))?;
        if let Some(first) = bufs.iter().find(|b| !b.is_empty())
            && let Some(done) = this.take_parse_error(cx, first)
        {
            return Poll::Ready(done);
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// inferno's SVG made to run under a strict policy, and that policy.
///
/// The root's `onload="init(evt)"` (an inline handler no hash can allow in
/// every browser) becomes a `load` listener at the end of the script;
/// the script and the stylesheet are then allowed by their hashes. An SVG
/// whose script or style cannot be hashed (not the shape inferno writes)
/// gets `'none'` for it: a static picture, still complete.
pub(crate) fn flame_graph(svg: Vec<u8>) -> (Vec<u8>, HeaderValue) {
    let text = match String::from_utf8(svg) {
        Ok(text) => text,
        // Not inferno's output: served as it is, without its script.
        Err(e) => return (e.into_bytes(), HeaderValue::from_static(PAGE_CSP)),
    };
    let text = text.replacen(r#" onload="init(evt)""#, "", 1);
    let text = match text.find("</script>") {
        Some(at) => format!(
            "{}<![CDATA[\nwindow.addEventListener(\"load\", init);\n]]>{}",
            &text[..at],
            &text[at..]
        ),
        None => text,
    };
    let script = element_text(&text, "script").map_or_else(|| "'none'".to_owned(), |s| hash(&s));
    let style = element_text(&text, "style").map_or_else(|| "'none'".to_owned(), |s| hash(&s));
    let csp = format!(
        "default-src 'none'; script-src {script}; style-src {style}; img-src 'self'; \
         base-uri 'none'; frame-ancestors 'self'"
    );
    let csp = HeaderValue::from_str(&csp).unwrap_or(HeaderValue::from_static(PAGE_CSP));
    (text.into_bytes(), csp)
}

/// The policy of what only the collector's own pages frame and that runs
/// no script: a flame graph's "no graph, because…" picture.
const FRAMED_CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
    base-uri 'none'; frame-ancestors 'self'";

/// Mark an answer as framed by the collector's own pages only: its policy
/// (`csp`, or [`FRAMED_CSP`]) and `X-Frame-Options: SAMEORIGIN`.
pub(crate) fn framed_by_own_pages(h: &mut HeaderMap, csp: Option<HeaderValue>) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        csp.unwrap_or(HeaderValue::from_static(FRAMED_CSP)),
    );
    h.insert(
        header::X_FRAME_OPTIONS,
        HeaderValue::from_static("SAMEORIGIN"),
    );
}

/// The text content of the first `<name …>…</name>` (CDATA sections
/// unwrapped), or `None` when it holds markup or entities a hash of the
/// raw text would get wrong.
fn element_text(doc: &str, name: &str) -> Option<String> {
    let open = doc.find(&format!("<{name}"))?;
    let body_at = open + doc[open..].find('>')? + 1;
    let close = body_at + doc[body_at..].find(&format!("</{name}>"))?;
    let mut rest = &doc[body_at..close];
    let mut out = String::new();
    while !rest.is_empty() {
        match rest.find("<![CDATA[") {
            Some(0) => {
                let end = rest.find("]]>")?;
                out.push_str(&rest[9..end]);
                rest = &rest[end + 3..];
            }
            found => {
                let plain = &rest[..found.unwrap_or(rest.len())];
                if plain.contains(['<', '&']) {
                    return None;
                }
                out.push_str(plain);
                rest = &rest[plain.len()..];
            }
        }
    }
    Some(out)
}

/// A CSP hash source for `text`.
fn hash(text: &str) -> String {
    let digest = sha2::Sha256::digest(text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_own_answers_get_the_security_headers_and_the_routers_are_left_alone() {
        let bare = b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let secured = String::from_utf8(secured_parse_error(bare).unwrap()).unwrap();
        assert!(
            secured.starts_with("HTTP/1.1 414 URI Too Long\r\n"),
            "{secured}"
        );
        for h in [
            "content-security-policy: default-src 'none'",
            "x-frame-options: DENY\r\n",
            "x-content-type-options: nosniff\r\n",
            "referrer-policy: no-referrer\r\n",
        ] {
            assert!(secured.contains(h), "{h}: {secured}");
        }
        assert!(secured.ends_with("content-length: 0\r\ndate: x\r\n\r\n"));
        // An answer of the router (it has a policy), a 200, a body, half a head.
        for other in [
            &b"HTTP/1.1 404 Not Found\r\nContent-Security-Policy: x\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"{\"service\":\"HTTP/1.1 414\"}",
            b"HTTP/1.1 414 URI Too Long\r\ncontent-len",
        ] {
            assert_eq!(secured_parse_error(other), None);
        }
    }

    #[test]
    fn cdata_is_unwrapped_and_markup_refused() {
        let doc = "<svg><script type=\"x\"><![CDATA[a<b]]>\n<![CDATA[c]]></script><style>s{}</style></svg>";
        assert_eq!(element_text(doc, "script").as_deref(), Some("a<b\nc"));
        assert_eq!(element_text(doc, "style").as_deref(), Some("s{}"));
        assert_eq!(element_text("<style>a &amp; b</style>", "style"), None);
        assert_eq!(element_text("<svg/>", "script"), None);
    }

    #[test]
    fn the_flame_graph_policy_names_its_own_script_and_style_only() {
        let agg = crate::profile::aggregate::Aggregator::new(Default::default());
        let mut agg = agg;
        agg.push_batch(&cpt_sdk::testing::fixtures::table1());
        let svg = crate::profile::flame::flame_svg(
            &agg.finish(),
            &crate::profile::flame::FlameOptions::default(),
        )
        .unwrap();
        assert!(String::from_utf8_lossy(&svg).contains("onload=\"init(evt)\""));
        let (svg, csp) = flame_graph(svg);
        let svg = String::from_utf8(svg).unwrap();
        let csp = csp.to_str().unwrap();
        assert!(!svg.contains("onload="), "no inline handler is left");
        let script = element_text(&svg, "script").unwrap();
        assert!(script.ends_with("window.addEventListener(\"load\", init);\n"));
        assert!(
            csp.contains(&format!("script-src {};", hash(&script))),
            "{csp}"
        );
        let style = element_text(&svg, "style").unwrap();
        assert!(
            csp.contains(&format!("style-src {};", hash(&style))),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'self'") && !csp.contains("unsafe"));
    }
}
