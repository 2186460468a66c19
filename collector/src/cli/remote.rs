//! The CLI's client of a running collector's HTTP read API
//! (`cpt show --collector`, `cpt profile --collector`): one `GET` at a time
//! over HTTP/1.1, or HTTPS (rustls) for an `https://` URL, with the read
//! token when the collector wants one.
//!
//! The read token comes from `--read-token-file FILE` or, failing that, the
//! `CPT_READ_TOKEN` environment variable. An answer that is gRPC (the URL
//! names the collector's gRPC port) is reported as such, naming the HTTP
//! port to use instead.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};

/// The environment variable the read token is taken from when no
/// `--read-token-file` is given.
pub const READ_TOKEN_ENV: &str = "CPT_READ_TOKEN";

/// The header an open collector sets on read answers when it left forced
/// records out (`withheld`).
const FORCED_HEADER: &str = "x-cpt-forced-records";
/// The collector's `x-cpt-profile-source` answer header.
const SOURCE_HEADER: &str = "x-cpt-profile-source";

/// How to reach a collector's read API.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RemoteArgs {
    /// The file holding the collector's read token (`cpt serve --read-token-file`); without it
    /// the token is taken from the CPT_READ_TOKEN environment variable, if set.
    #[arg(long, value_name = "PATH")]
    pub read_token_file: Option<PathBuf>,
    /// For an https:// collector: trust the certificate authorities of this PEM file (a private
    /// CA, or the collector's self-signed certificate) instead of the system's.
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
}

/// A connection to the collector, plain or TLS.
trait Conn: Read + Write {}
impl<T: Read + Write> Conn for T {}

/// The rustls client configuration for `--ca-file` (or the system's roots).
fn tls_config(ca_file: Option<&Path>) -> anyhow::Result<std::sync::Arc<rustls::ClientConfig>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .with_context(|| format!("--ca-file {}: cannot read it", path.display()))?
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("--ca-file {}: not PEM certificates", path.display()))?;
            anyhow::ensure!(
                !certs.is_empty(),
                "--ca-file {}: no CERTIFICATE block in it",
                path.display()
            );
            for cert in certs {
                roots.add(cert).with_context(|| {
                    format!("--ca-file {}: not a usable CA certificate", path.display())
                })?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS setup")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(std::sync::Arc::new(config))
}

/// Where the read token came from, for error messages.
#[derive(Debug, Clone)]
enum TokenSource {
    File(PathBuf),
    Env,
}

/// A collector's HTTP address and the read token to show it.
#[derive(Debug)]
pub struct Remote {
    url: String,
    authority: String,
    token: Option<(String, TokenSource)>,
    /// For an `https://` URL.
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// The last answer left forced records out.
    withheld: std::cell::Cell<bool>,
}

/// A collector's answer: its headers (names lowercase) and body.
#[derive(Debug)]
pub struct Answer {
    headers: Vec<(String, String)>,
    /// The body (dechunked).
    pub body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the collector has no read token and so left forced records
    /// out of this answer.
    pub fn forced_withheld(&self) -> bool {
        self.header(FORCED_HEADER) == Some("withheld")
    }

    /// Where a `GET /profile` answer came from when not (only) raw records:
    /// `roll-ups`, or `roll-ups and raw records`.
    pub fn profile_source(&self) -> Option<&'static str> {
        match self.header(SOURCE_HEADER)? {
            "rollups" => Some("roll-ups"),
            "rollups+raw" => Some("roll-ups and raw records"),
            _ => None,
        }
    }
}

fn read_token_file(path: &Path) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("--read-token-file {}: cannot read it", path.display()))?;
    let token = token.trim();
    anyhow::ensure!(
        !token.is_empty(),
        "--read-token-file {}: the file is empty; put the collector's read token in it",
        path.display()
    );
    Ok(token.to_owned())
}

impl Remote {
    /// Check `url` (`http://HOST:PORT`) and find the read token.
    ///
    /// # Errors
    ///
    /// A URL of another form, an unreadable or empty token file.
    pub fn new(url: &str, args: &RemoteArgs) -> anyhow::Result<Remote> {
        let (rest, tls) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (rest, None),
            (_, Some(rest)) => (rest, Some(tls_config(args.ca_file.as_deref())?)),
            _ => bail!(
                "--collector {url:?}: expected http://HOST:PORT or https://HOST:PORT (the collector's \
                 HTTP address, `cpt serve --http`)"
            ),
        };
        let authority = rest.trim_end_matches('/');
        anyhow::ensure!(
            !authority.is_empty() && !authority.contains('/'),
            "--collector {url:?}: expected http://HOST:PORT without a path"
        );
        let token = match &args.read_token_file {
            Some(path) => Some((read_token_file(path)?, TokenSource::File(path.clone()))),
            None => std::env::var(READ_TOKEN_ENV)
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .map(|t| (t, TokenSource::Env)),
        };
        if let Some((t, from)) = &token {
            anyhow::ensure!(
                t.bytes().all(|b| b.is_ascii_graphic()),
                "the read token from {} must be visible ASCII without spaces",
                describe(from)
            );
        }
        Ok(Remote {
            url: url.to_owned(),
            authority: authority.to_owned(),
            token,
            tls,
            withheld: std::cell::Cell::new(false),
        })
    }

    /// The collector's URL as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn connect(&self) -> anyhow::Result<Box<dyn Conn>> {
        let tcp = self.connect_tcp()?;
        let Some(config) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        let host = self
            .authority
            .rsplit_once(':')
            .map_or(self.authority.as_str(), |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = rustls::pki_types::ServerName::try_from(host.to_owned()).with_context(|| {
            format!(
                "--collector {:?}: {host:?} is not a TLS server name",
                self.url
            )
        })?;
        let conn = rustls::ClientConnection::new(config.clone(), name)
            .with_context(|| format!("TLS to {}", self.url))?;
        Ok(Box::new(rustls::StreamOwned::new(conn, tcp)))
    }

    fn connect_tcp(&self) -> anyhow::Result<TcpStream> {
        let url = &self.url;
        let addrs: Vec<_> = self
            .authority
            .to_socket_addrs()
            .with_context(|| format!("--collector {url:?}: cannot resolve {}", self.authority))?
            .collect();
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
                Ok(s) => {
                    s.set_read_timeout(Some(Duration::from_secs(30)))?;
                    return Ok(s);
                }
                Err(e) => last = Some(e),
            }
        }
        bail!(
            "cannot reach the collector at {url}: {}; is `cpt serve --http` running there?",
            last.map_or_else(|| "no address".to_owned(), |e| e.to_string())
        )
    }

    /// `GET path_and_query`; the answer on 200, an error saying what to do
    /// otherwise.
    ///
    /// # Errors
    ///
    /// The collector cannot be reached, is not HTTP, is the gRPC port,
    /// wants the read token (or another one), or answers another status.
    pub fn get(&self, path_and_query: &str) -> anyhow::Result<Answer> {
        let url = &self.url;
        let mut stream = self.connect()?;
        let mut request = format!(
            "GET {path_and_query} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.authority
        );
        if let Some((t, _)) = &self.token {
            request.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        request.push_str("\r\n");
        let tls_hint = if self.tls.is_some() {
            " (a TLS failure: is --ca-file the collector's CA, and the URL its name?)"
        } else {
            ""
        };
        stream
            .write_all(request.as_bytes())
            .and_then(|()| stream.flush())
            .with_context(|| format!("sending the query to the collector at {url}{tls_hint}"))?;
        let mut raw = Vec::new();
        match stream.read_to_end(&mut raw) {
            Ok(_) => {}
            // A TLS server that closes without close_notify after a
            // `Connection: close` answer: the answer is whole when its
            // framing says so (checked by `parse`).
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "reading the collector's answer from {url}{tls_hint}"
                )));
            }
        }
        let answer = self.parse(&raw)?;
        self.withheld.set(answer.forced_withheld());
        Ok(answer)
    }

    /// Whether the last answer left forced records out (the collector has
    /// no read token).
    pub fn forced_withheld(&self) -> bool {
        self.withheld.get()
    }

    fn parse(&self, raw: &[u8]) -> anyhow::Result<Answer> {
        let url = &self.url;
        let not_http = || {
            anyhow::anyhow!(
                "{url} did not answer with HTTP/1.1; --collector takes the collector's HTTP address \
                 (`cpt serve --http`, by default 127.0.0.1:7071)"
            )
        };
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(not_http)?;
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(not_http)?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let mut answer = Answer {
            headers,
            body: raw[split + 4..].to_vec(),
        };
        let grpc = answer.header("grpc-status").is_some()
            || answer
                .header("content-type")
                .is_some_and(|c| c.starts_with("application/grpc"));
        if grpc {
            bail!(
                "{url} is the collector's gRPC port (it answered with gRPC), which only takes \
                 records; --collector takes its HTTP address: the port of `cpt serve --http` \
                 (by default 127.0.0.1:7071)"
            );
        }
        if answer
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            answer.body = dechunk(&answer.body).ok_or_else(|| {
                anyhow::anyhow!("{url}: the answer broke off (bad or incomplete chunked body)")
            })?;
        }
        let error_text = || {
            let body = String::from_utf8_lossy(&answer.body);
            serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or_else(|| body.trim().to_owned())
        };
        match status {
            200 => Ok(answer),
            401 => match &self.token {
                None => bail!(
                    "the collector at {url} needs its read token: give --read-token-file FILE or set \
                     {READ_TOKEN_ENV} (the token of `cpt serve --read-token-file`)"
                ),
                Some((_, from)) => bail!(
                    "the collector at {url} refused the read token from {}: is it the collector's \
                     read token (`cpt serve --read-token-file`), not the ingest token?",
                    describe(from)
                ),
            },
            404 => bail!(
                "the collector at {url} has no such read API (HTTP 404): it is older than this cpt; upgrade it"
            ),
            _ => bail!(
                "the collector at {url} answered HTTP {status}: {}",
                error_text()
            ),
        }
    }
}

/// A selection as a `GET` query (values percent-encoded).
pub fn selection_query(sel: &crate::records::selection::Selection) -> String {
    sel.to_string()
        .split(' ')
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            format!("{k}={}", percent_encode(v))
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn percent_encode(s: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn describe(from: &TokenSource) -> String {
    match from {
        TokenSource::File(p) => format!("--read-token-file {}", p.display()),
        TokenSource::Env => READ_TOKEN_ENV.to_owned(),
    }
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&b[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        b = &b[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

/// Check a trace id given on the command line: 32 hex digits, not all zero
/// (W3C Trace Context).
///
/// # Errors
///
/// Any other form, saying what is expected.
pub fn check_trace_id(id: &str) -> Result<(), String> {
    if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        if id.bytes().all(|b| b == b'0') {
            return Err(format!(
                "trace id {id:?}: the all-zero id is invalid (W3C Trace Context)"
            ));
        }
        return Ok(());
    }
    Err(format!(
        "trace id {id:?}: expected 32 hex digits (the trace-id field of a traceparent, e.g. \
         4bf92f3577b34da6a3ce929d0e0e4736), got {} characters{}",
        id.chars().count(),
        if id.bytes().all(|b| b.is_ascii_hexdigit()) {
            ""
        } else {
            " with non-hex ones"
        }
    ))
}

/// Check a request id given on the command line: what a collector stores
/// (at most [`crate::ingest::limits::DEFAULT_MAX_STRING_BYTES`] bytes) and an
/// `x-request-id` header can carry (visible ASCII and spaces, not empty).
///
/// # Errors
///
/// An empty, too long or unsendable id, saying what is expected.
pub fn check_request_id(id: &str) -> Result<(), String> {
    const MAX: usize = crate::ingest::limits::DEFAULT_MAX_STRING_BYTES;
    if id.trim().is_empty() {
        return Err("request id is empty: give the x-request-id the request carried".into());
    }
    if id.len() > MAX {
        return Err(format!(
            "request id of {} bytes: a collector keeps ids of at most {MAX} bytes",
            id.len()
        ));
    }
    if let Some(c) = id.chars().find(|c| !(c.is_ascii_graphic() || *c == ' ')) {
        return Err(format!(
            "request id {id:?}: {c:?} cannot travel in an x-request-id header (visible ASCII only)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote() -> Remote {
        Remote {
            url: "http://127.0.0.1:1".into(),
            authority: "127.0.0.1:1".into(),
            token: None,
            tls: None,
            withheld: std::cell::Cell::new(false),
        }
    }

    #[test]
    fn a_grpc_answer_names_the_http_port_instead() {
        let raw = b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ngrpc-status: 12\r\n\r\n";
        let err = remote().parse(raw).unwrap_err().to_string();
        assert!(err.contains("gRPC port"), "{err}");
        assert!(err.contains("cpt serve --http"), "{err}");
    }

    #[test]
    fn unauthorized_says_where_the_read_token_goes() {
        let raw = b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\n\r\n{}";
        let err = remote().parse(raw).unwrap_err().to_string();
        assert!(err.contains("--read-token-file"), "{err}");
        assert!(err.contains(READ_TOKEN_ENV), "{err}");
        let mut with = remote();
        with.token = Some(("x".into(), TokenSource::Env));
        let err = with.parse(raw).unwrap_err().to_string();
        assert!(
            err.contains("refused the read token from CPT_READ_TOKEN"),
            "{err}"
        );
    }

    #[test]
    fn a_broken_chunked_answer_is_an_error_not_a_short_answer() {
        let raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab";
        let err = remote().parse(raw).unwrap_err().to_string();
        assert!(err.contains("broke off"), "{err}");
        let ok = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nx-cpt-forced-records: withheld\r\n\r\n2\r\nab\r\n0\r\n\r\n";
        let a = remote().parse(ok).unwrap();
        assert_eq!(a.body, b"ab");
        assert!(a.forced_withheld());
    }

    #[test]
    fn trace_ids_are_32_hex_digits() {
        assert!(check_trace_id("4bf92f3577b34da6a3ce929d0e0e4736").is_ok());
        assert!(check_trace_id("4BF92F3577B34DA6A3CE929D0E0E4736").is_ok());
        for bad in [
            "",
            "4bf92f3577b34da6a3ce929d0e0e473",
            "4bf92f3577b34da6a3ce929d0e0e47366",
            "4bf92f3577b34da6a3ce929d0e0e473g",
            "00000000000000000000000000000000",
        ] {
            let err = check_trace_id(bad).unwrap_err();
            assert!(err.contains("trace id"), "{bad}: {err}");
        }
    }

    #[test]
    fn request_ids_are_what_a_collector_keeps() {
        assert!(check_request_id("req-42").is_ok());
        assert!(check_request_id("").is_err());
        assert!(check_request_id("a\nb").is_err());
        assert!(check_request_id(&"x".repeat(513)).is_err());
        assert!(check_request_id(&"x".repeat(512)).is_ok());
    }
}
