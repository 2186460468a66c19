//! The CLI's client of a running collector's HTTP read API
//! (`cpt show --collector`, `cpt profile --collector`): one `GET` at a time
//! through hyper's client (HTTP/1.1, or HTTPS with rustls for an `https://`
//! URL), with the read token when the collector wants one. Queries are
//! built by the one encoder ([`Selection::to_query`]), so any service or
//! endpoint name reaches the collector as it is.
//!
//! The read token comes from `--read-token-file FILE` or, failing that, the
//! `CPT_READ_TOKEN` environment variable. An answer that is gRPC (the URL
//! names the collector's gRPC port) is reported as such, naming the HTTP
//! port to use instead.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::records::selection::Selection;

/// The environment variable the read token is taken from when no
/// `--read-token-file` is given.
pub const READ_TOKEN_ENV: &str = "CPT_READ_TOKEN";

/// The header an open collector sets on read answers when it left forced
/// records out (`withheld`).
const FORCED_HEADER: &str = "x-cpt-forced-records";
/// The collector's `x-cpt-profile-source` answer header.
const SOURCE_HEADER: &str = "x-cpt-profile-source";

/// How long to wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the collector may stay silent: before its answer's head, and
/// between two pieces of its body.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

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

/// The rustls client configuration for `--ca-file`, or the system's roots
/// (none at all for a plain `http://` collector: no TLS is made).
fn tls_config(ca_file: Option<&Path>, https: bool) -> anyhow::Result<rustls::ClientConfig> {
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
        None if https => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
        None => {}
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    // ALPN (http/1.1) is the connector's to set.
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS setup")?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Where the read token came from, for error messages.
#[derive(Debug, Clone)]
enum TokenSource {
    File(PathBuf),
    Env,
}

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// A collector's HTTP address and the read token to show it.
pub struct Remote {
    url: String,
    /// `scheme://authority` of the collector.
    base: Uri,
    token: Option<(HeaderValue, TokenSource)>,
    client: Client<Connector, Empty<Bytes>>,
    runtime: tokio::runtime::Runtime,
    /// The last answer left forced records out.
    withheld: std::cell::Cell<bool>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|(_, from)| from))
            .finish_non_exhaustive()
    }
}

/// A collector's answer: its headers and body.
#[derive(Debug)]
pub struct Answer {
    headers: HeaderMap,
    /// The body.
    pub body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
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
    /// Check `url` (`http://HOST:PORT` or `https://HOST:PORT`) and find the
    /// read token.
    ///
    /// # Errors
    ///
    /// A URL of another form, an unreadable or empty token file, a bad
    /// `--ca-file`.
    pub fn new(url: &str, args: &RemoteArgs) -> anyhow::Result<Remote> {
        let bad = || {
            anyhow::anyhow!(
                "--collector {url:?}: expected http://HOST:PORT or https://HOST:PORT (the collector's \
                 HTTP address, `cpt serve --http`)"
            )
        };
        let parsed: Uri = url.parse().map_err(|_| bad())?;
        let https = match parsed.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(bad()),
        };
        let authority = parsed.authority().ok_or_else(bad)?.clone();
        anyhow::ensure!(
            matches!(parsed.path(), "" | "/") && parsed.query().is_none(),
            "--collector {url:?}: expected http://HOST:PORT without a path"
        );
        let base = Uri::builder()
            .scheme(parsed.scheme_str().unwrap_or("http"))
            .authority(authority)
            .path_and_query("/")
            .build()
            .map_err(|_| bad())?;
        let token = match &args.read_token_file {
            Some(path) => Some((read_token_file(path)?, TokenSource::File(path.clone()))),
            None => std::env::var(READ_TOKEN_ENV)
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .map(|t| (t, TokenSource::Env)),
        };
        let token = match token {
            Some((t, from)) => {
                anyhow::ensure!(
                    t.bytes().all(|b| b.is_ascii_graphic()),
                    "the read token from {} must be visible ASCII without spaces",
                    describe(&from)
                );
                let mut value = HeaderValue::from_str(&format!("Bearer {t}"))
                    .context("the read token cannot travel in a header")?;
                value.set_sensitive(true);
                Some((value, from))
            }
            None => None,
        };
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(args.ca_file.as_deref(), https)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the HTTP client")?;
        Ok(Remote {
            url: url.to_owned(),
            base,
            token,
            client: Client::builder(TokioExecutor::new()).build(connector),
            runtime,
            withheld: std::cell::Cell::new(false),
        })
    }

    /// The collector's URL as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `GET path?query` (the query from [`Selection::to_query`] or
    /// [`crate::records::query::encode`]); the answer on 200, an error
    /// saying what to do otherwise.
    ///
    /// # Errors
    ///
    /// The collector cannot be reached, is not HTTP, is the gRPC port,
    /// wants the read token (or another one), or answers another status.
    pub fn get(&self, path: &str, query: &str) -> anyhow::Result<Answer> {
        let target = if query.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{query}")
        };
        let uri = Uri::builder()
            .scheme(self.base.scheme_str().unwrap_or("http"))
            .authority(self.base.authority().map_or("", |a| a.as_str()))
            .path_and_query(target.as_str())
            .build()
            .with_context(|| format!("{target:?} is not a request target"))?;
        let mut request = http::Request::get(uri);
        if let Some((t, _)) = &self.token {
            request = request.header(header::AUTHORIZATION, t.clone());
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .context("building the request")?;
        let (status, headers, body) = self
            .runtime
            .block_on(self.exchange(request))
            .map_err(|e| self.failure(e))?;
        let answer = self.check(status, headers, body)?;
        self.withheld.set(answer.forced_withheld());
        Ok(answer)
    }

    /// Send `request` and read the whole answer, [`READ_TIMEOUT`] at most
    /// between two of its pieces.
    async fn exchange(
        &self,
        request: http::Request<Empty<Bytes>>,
    ) -> Result<(StatusCode, HeaderMap, Vec<u8>), Failure> {
        let response = tokio::time::timeout(READ_TIMEOUT, self.client.request(request))
            .await
            .map_err(|_| Failure::Timeout)?
            .map_err(Failure::Client)?;
        let (parts, mut body) = response.into_parts();
        let mut out = Vec::new();
        loop {
            match tokio::time::timeout(READ_TIMEOUT, body.frame()).await {
                Err(_) => return Err(Failure::Timeout),
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(Failure::Body(e)),
                Ok(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        out.extend_from_slice(data);
                    }
                }
            }
        }
        Ok((parts.status, parts.headers, out))
    }

    /// What a failed exchange means for the operator.
    fn failure(&self, e: Failure) -> anyhow::Error {
        let url = &self.url;
        let tls_hint = if self.base.scheme_str() == Some("https") {
            " (a TLS failure: is --ca-file the collector's CA, and the URL its name?)"
        } else {
            ""
        };
        match e {
            Failure::Client(e) if e.is_connect() => anyhow::anyhow!(
                "cannot reach the collector at {url}: {}{tls_hint}; is `cpt serve --http` running there?",
                error_chain(&e)
            ),
            Failure::Client(e) => anyhow::anyhow!(
                "{url} did not answer with HTTP/1.1 ({}){tls_hint}; --collector takes the collector's \
                 HTTP address (`cpt serve --http`, by default 127.0.0.1:7071)",
                error_chain(&e)
            ),
            Failure::Body(e) => {
                anyhow::anyhow!("{url}: the answer broke off ({}); retry", error_chain(&e))
            }
            Failure::Timeout => anyhow::anyhow!(
                "the collector at {url} sent nothing for {} s; is it overloaded?",
                READ_TIMEOUT.as_secs()
            ),
        }
    }

    /// Whether the last answer left forced records out (the collector has
    /// no read token).
    pub fn forced_withheld(&self) -> bool {
        self.withheld.get()
    }

    fn check(
        &self,
        status: StatusCode,
        headers: HeaderMap,
        body: Vec<u8>,
    ) -> anyhow::Result<Answer> {
        let url = &self.url;
        let answer = Answer { headers, body };
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
        let error_text = || {
            let body = String::from_utf8_lossy(&answer.body);
            serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or_else(|| body.trim().to_owned())
        };
        match status {
            StatusCode::OK => Ok(answer),
            StatusCode::UNAUTHORIZED => match &self.token {
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
            StatusCode::NOT_FOUND => bail!(
                "the collector at {url} has no such read API (HTTP 404): it is older than this cpt; upgrade it"
            ),
            _ => bail!(
                "the collector at {url} answered HTTP {}: {}",
                status.as_u16(),
                error_text()
            ),
        }
    }
}

/// Why an exchange with the collector failed.
enum Failure {
    Client(hyper_util::client::legacy::Error),
    Body(hyper::Error),
    Timeout,
}

/// An error and its sources, `: `-joined (hyper's own message is terse).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// A selection as a `GET` query: [`Selection::to_query`], the one encoder.
pub fn selection_query(sel: &Selection) -> String {
    sel.to_query()
}

fn describe(from: &TokenSource) -> String {
    match from {
        TokenSource::File(p) => format!("--read-token-file {}", p.display()),
        TokenSource::Env => READ_TOKEN_ENV.to_owned(),
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
        Remote::new("http://127.0.0.1:1", &RemoteArgs::default()).unwrap()
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_static(k),
                    HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    #[test]
    fn a_grpc_answer_names_the_http_port_instead() {
        let h = headers(&[("content-type", "application/grpc"), ("grpc-status", "12")]);
        let err = remote()
            .check(StatusCode::OK, h, Vec::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("gRPC port"), "{err}");
        assert!(err.contains("cpt serve --http"), "{err}");
    }

    #[test]
    fn unauthorized_says_where_the_read_token_goes() {
        let err = remote()
            .check(StatusCode::UNAUTHORIZED, HeaderMap::new(), b"{}".to_vec())
            .unwrap_err()
            .to_string();
        assert!(err.contains("--read-token-file"), "{err}");
        assert!(err.contains(READ_TOKEN_ENV), "{err}");
        let mut with = remote();
        with.token = Some((HeaderValue::from_static("Bearer x"), TokenSource::Env));
        let err = with
            .check(StatusCode::UNAUTHORIZED, HeaderMap::new(), b"{}".to_vec())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("refused the read token from CPT_READ_TOKEN"),
            "{err}"
        );
    }

    #[test]
    fn an_error_answer_shows_the_collectors_message() {
        let a = remote()
            .check(
                StatusCode::BAD_REQUEST,
                HeaderMap::new(),
                br#"{"error":"bad profile query"}"#.to_vec(),
            )
            .unwrap_err()
            .to_string();
        assert!(a.ends_with("answered HTTP 400: bad profile query"), "{a}");
        let ok = remote()
            .check(
                StatusCode::OK,
                headers(&[("x-cpt-forced-records", "withheld")]),
                b"ab".to_vec(),
            )
            .unwrap();
        assert_eq!(ok.body, b"ab");
        assert!(ok.forced_withheld());
    }

    #[test]
    fn the_collector_url_is_scheme_host_and_port_only() {
        for bad in [
            "127.0.0.1:7071",
            "grpc://h:1",
            "http://h:1/x",
            "http://h:1/?a=1",
            "http://",
        ] {
            let err = Remote::new(bad, &RemoteArgs::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains("expected http://HOST:PORT"), "{bad}: {err}");
        }
        assert!(Remote::new("http://h:1/", &RemoteArgs::default()).is_ok());
    }

    #[test]
    fn the_query_of_any_name_reaches_the_collector_whole() {
        let sel = Selection::new()
            .with_service("shop & co")
            .with_endpoint("GET /quote/{item}")
            .with_label("team", "a+b #1 100% ü");
        let q = selection_query(&sel);
        assert_eq!(
            Selection::from_query(&q).unwrap(),
            sel.clone().with_triggers(sel.triggers())
        );
        assert!(
            !q.contains(' ') && !q.contains('{') && !q.contains('#'),
            "{q}"
        );
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
