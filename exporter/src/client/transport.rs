//! How a [`CollectorClient`](super::CollectorClient) reaches its collector:
//! the endpoint, over HTTP(S) (hyper with hyper-rustls) or gRPC (tonic,
//! with tonic's rustls support for `grpcs://`), and one attempt's outcome.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prost::Message;
use tonic::Code;

use crate::proto;

/// The certificate authorities a client trusts: a PEM file's
/// (`with_ca_file`), else the system's.
#[derive(Clone, Default)]
pub(super) struct Tls {
    pub(super) ca_pem: Option<Arc<[u8]>>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca_file", &self.ca_pem.is_some())
            .finish()
    }
}

/// Why a CA file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("CA file {path}: {reason}")]
pub struct CaFileError {
    path: String,
    reason: String,
}

impl Tls {
    /// Read the PEM certificates of `path`.
    pub(super) fn from_ca_file(path: &std::path::Path) -> Result<Tls, CaFileError> {
        let err = |reason: String| CaFileError {
            path: path.display().to_string(),
            reason,
        };
        let pem = std::fs::read(path).map_err(|e| err(format!("cannot read it: {e}")))?;
        let tls = Tls {
            ca_pem: Some(pem.into()),
        };
        if tls.roots().map_err(err)?.is_empty() {
            return Err(err("no CERTIFICATE block in it".into()));
        }
        Ok(tls)
    }

    fn roots(&self) -> Result<rustls::RootCertStore, String> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca_pem {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| format!("not PEM certificates: {e}"))?;
                    roots
                        .add(cert)
                        .map_err(|e| format!("not a usable CA certificate: {e}"))?;
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert);
                }
            }
        }
        Ok(roots)
    }

    /// The rustls client configuration (ring provider; hyper-rustls sets
    /// the ALPN protocols).
    fn client_config(&self) -> rustls::ClientConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions; this is a bug")
            .with_root_certificates(
                self.roots()
                    .unwrap_or_else(|_| rustls::RootCertStore::empty()),
            )
            .with_no_client_auth()
    }
}

/// Where the collector listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// gRPC, e.g. `http://127.0.0.1:7070` (plaintext HTTP/2), or
    /// `https://collector:7070` (TLS; parsed from `grpcs://`).
    Grpc(Uri),
    /// HTTP ingest URL, e.g. `http://127.0.0.1:7071/v1/records`, or
    /// `https://…` (TLS).
    Http(Uri),
}

/// An endpoint string that is not understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad collector endpoint {input:?}: {reason}")]
pub struct EndpointError {
    input: String,
    reason: String,
}

impl Endpoint {
    /// Parse `grpc://HOST:PORT` (gRPC), `grpcs://HOST:PORT` (gRPC over
    /// TLS), `http://HOST:PORT[/path]` or `https://HOST:PORT[/path]` (HTTP,
    /// HTTPS; the path defaults to `/v1/records`).
    ///
    /// # Errors
    ///
    /// Another scheme, or an invalid URI.
    pub fn parse(s: &str) -> Result<Endpoint, EndpointError> {
        let err = |reason: &str| EndpointError {
            input: s.to_owned(),
            reason: reason.to_owned(),
        };
        for (prefix, scheme) in [("grpc://", "http"), ("grpcs://", "https")] {
            if let Some(rest) = s.strip_prefix(prefix) {
                let uri: Uri = format!("{scheme}://{rest}")
                    .parse()
                    .map_err(|_| err("not a URI"))?;
                return Ok(Endpoint::Grpc(uri));
            }
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            let uri: Uri = s.parse().map_err(|_| err("not a URI"))?;
            let uri = if uri.path() == "/" && !s.ends_with('/') {
                format!("{s}{}", proto::HTTP_RECORDS_PATH)
                    .parse()
                    .map_err(|_| err("not a URI"))?
            } else {
                uri
            };
            return Ok(Endpoint::Http(uri));
        }
        Err(err(
            "expected grpc://HOST:PORT, grpcs://HOST:PORT (TLS), http://HOST:PORT[/path] or https://HOST:PORT[/path]",
        ))
    }

    /// Whether it is reached over TLS.
    pub fn is_tls(&self) -> bool {
        let (Endpoint::Grpc(u) | Endpoint::Http(u)) = self;
        u.scheme_str() == Some("https")
    }

    /// `HOST:PORT`, as `cpt serve --grpc` / `--http` take it.
    pub fn address(&self) -> &str {
        let (Endpoint::Grpc(u) | Endpoint::Http(u)) = self;
        u.authority().map_or("", |a| a.as_str())
    }

    /// `"gRPC"` or `"HTTP"`: which of `cpt serve`'s ports the endpoint must
    /// name.
    pub fn protocol(&self) -> &'static str {
        match self {
            Endpoint::Grpc(_) => "gRPC",
            Endpoint::Http(_) => "HTTP",
        }
    }
}

/// The hint for a gRPC endpoint that answered as a plain HTTP server: a
/// gRPC server always sends `grpc-status`, `cpt serve`'s HTTP port does
/// not (it answers the gRPC method's path with 404, which tonic reports as
/// a missing `grpc-status` when the answer has no body, and as a body it
/// cannot read "while receiving response with status: 404" when it has one).
fn http_port_hint(uri: &Uri, message: &str) -> Option<String> {
    if !(message.starts_with("grpc-status header missing")
        || message.contains("while receiving response with status:"))
    {
        return None;
    }
    let address = uri.authority().map_or("", |a| a.as_str());
    let https = if uri.scheme_str() == Some("https") {
        "s"
    } else {
        ""
    };
    Some(format!(
        "{address} answered as an HTTP server, not as a gRPC one ({message}): it looks like the \
         collector's HTTP port. `cpt serve` takes gRPC on its --grpc port (127.0.0.1:7070 by \
         default) and HTTP on its --http port (127.0.0.1:7071 by default): point grpc{https}:// \
         at the gRPC port, or send over HTTP with http{https}://{address}"
    ))
}

/// An error and its sources, `a: b: c` (tonic's and hyper's errors say
/// "transport error" and keep the cause, "Connection refused", in a source).
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Grpc(u) => write!(f, "grpc {u}"),
            Endpoint::Http(u) => write!(f, "http {u}"),
        }
    }
}

/// The ingest credential; never printed.
#[derive(Clone)]
pub(super) struct Token(pub(super) http::HeaderValue);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(…)")
    }
}

/// How one attempt failed.
pub(super) enum Attempt {
    Retry {
        reason: String,
        after: Option<Duration>,
    },
    Refused {
        reason: String,
    },
}

pub(super) struct Transport {
    token: Option<Token>,
    kind: TransportKind,
}

enum TransportKind {
    Http {
        client: Box<HttpClient<HttpsConnector<HttpConnector>, Full<Bytes>>>,
        uri: Uri,
    },
    Grpc {
        grpc: tonic::client::Grpc<tonic::transport::Channel>,
        uri: Uri,
    },
}

impl Transport {
    pub(super) fn new(endpoint: &Endpoint, token: Option<Token>, tls: &Tls) -> Transport {
        Transport {
            token,
            kind: TransportKind::new(endpoint, tls),
        }
    }

    pub(super) async fn send(
        &mut self,
        batch: &proto::RecordBatch,
        batch_id: &http::HeaderValue,
    ) -> Result<(), Attempt> {
        self.kind.send(batch, batch_id, self.token.as_ref()).await
    }
}

impl TransportKind {
    fn new(endpoint: &Endpoint, tls: &Tls) -> TransportKind {
        match endpoint {
            Endpoint::Http(uri) => {
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                connector.set_connect_timeout(Some(Duration::from_secs(5)));
                connector.enforce_http(false);
                let connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(tls.client_config())
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(connector);
                TransportKind::Http {
                    client: Box::new(HttpClient::builder(TokioExecutor::new()).build(connector)),
                    uri: uri.clone(),
                }
            }
            Endpoint::Grpc(uri) => {
                let mut endpoint = tonic::transport::Endpoint::from(uri.clone())
                    .connect_timeout(Duration::from_secs(5))
                    .tcp_nodelay(true);
                if endpoint.uri().scheme_str() == Some("https") {
                    let mut config = tonic::transport::ClientTlsConfig::new();
                    config = match &tls.ca_pem {
                        Some(pem) => {
                            config.ca_certificate(tonic::transport::Certificate::from_pem(pem))
                        }
                        None => config.with_native_roots(),
                    };
                    // A configuration tonic refuses leaves the https
                    // endpoint without TLS: every connection then fails
                    // (and is retried, reported in the stats), never
                    // plaintext.
                    if let Ok(with_tls) = endpoint.clone().tls_config(config) {
                        endpoint = with_tls;
                    }
                }
                let channel = endpoint.connect_lazy();
                TransportKind::Grpc {
                    grpc: tonic::client::Grpc::new(channel),
                    uri: uri.clone(),
                }
            }
        }
    }

    async fn send(
        &mut self,
        batch: &proto::RecordBatch,
        batch_id: &http::HeaderValue,
        token: Option<&Token>,
    ) -> Result<(), Attempt> {
        match self {
            TransportKind::Http { client, uri } => {
                let mut req = http::Request::post(uri.clone())
                    .header(header::CONTENT_TYPE, proto::CONTENT_TYPE_PROTOBUF)
                    .header(proto::BATCH_ID_HEADER, batch_id.clone())
                    .body(Full::new(Bytes::from(batch.encode_to_vec())))
                    .expect("a POST with a valid URI always builds; this is a bug");
                if let Some(t) = token {
                    req.headers_mut().insert(header::AUTHORIZATION, t.0.clone());
                }
                let resp = client.request(req).await.map_err(|e| Attempt::Retry {
                    reason: format!("cannot reach the collector: {}", with_sources(&e)),
                    after: None,
                })?;
                let status = resp.status();
                let after = resp
                    .headers()
                    .get(header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                // Read the body so the connection can be reused.
                let text = resp
                    .into_body()
                    .collect()
                    .await
                    .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                    .unwrap_or_default();
                if status.is_success() {
                    return Ok(());
                }
                let reason = format!("HTTP {status}: {}", text.trim());
                if status == StatusCode::TOO_MANY_REQUESTS
                    || status == StatusCode::REQUEST_TIMEOUT
                    || status.is_server_error()
                {
                    Err(Attempt::Retry { reason, after })
                } else {
                    Err(Attempt::Refused { reason })
                }
            }
            TransportKind::Grpc { grpc, uri } => {
                grpc.ready().await.map_err(|e| Attempt::Retry {
                    reason: format!("cannot reach the collector: {}", with_sources(&e)),
                    after: None,
                })?;
                let path = http::uri::PathAndQuery::from_static(proto::GRPC_EXPORT_PATH);
                let codec =
                    tonic_prost::ProstCodec::<proto::RecordBatch, proto::ExportResponse>::default();
                let mut req = tonic::Request::new(batch.clone());
                req.metadata_mut().insert(
                    proto::BATCH_ID_HEADER,
                    tonic::metadata::MetadataValue::try_from(batch_id.as_bytes())
                        .expect("a batch id is valid ASCII metadata; this is a bug"),
                );
                if let Some(t) = token {
                    let value = tonic::metadata::MetadataValue::try_from(t.0.as_bytes())
                        .expect("a valid header value is valid ASCII metadata; this is a bug");
                    req.metadata_mut().insert("authorization", value);
                }
                match grpc.unary(req, path, codec).await {
                    Ok(_) => Ok(()),
                    Err(status) => {
                        if let Some(reason) = http_port_hint(uri, status.message()) {
                            return Err(Attempt::Refused { reason });
                        }
                        let reason = format!("gRPC {:?}: {}", status.code(), with_sources(&status));
                        match status.code() {
                            Code::ResourceExhausted
                            | Code::Unavailable
                            | Code::DeadlineExceeded
                            | Code::Aborted
                            | Code::Cancelled
                            | Code::Unknown => Err(Attempt::Retry {
                                reason,
                                after: None,
                            }),
                            _ => Err(Attempt::Refused { reason }),
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const ENDPOINTS: &[(&str, Option<&str>)] = &[
        ("grpc://127.0.0.1:7070", Some("grpc http://127.0.0.1:7070/")),
        ("http://127.0.0.1:7071", Some("http http://127.0.0.1:7071/v1/records")),
        ("http://127.0.0.1:7071/ingest", Some("http http://127.0.0.1:7071/ingest")),
        ("https://collector:443", Some("http https://collector:443/v1/records")),
        ("grpcs://collector:7070", Some("grpc https://collector:7070/")),
        ("127.0.0.1:7070", None),
    ];

    #[test]
    fn tls_endpoints_are_told_apart() {
        assert!(Endpoint::parse("grpcs://c:1").unwrap().is_tls());
        assert!(Endpoint::parse("https://c:1").unwrap().is_tls());
        assert!(!Endpoint::parse("grpc://c:1").unwrap().is_tls());
        assert!(!Endpoint::parse("http://c:1").unwrap().is_tls());
    }

    #[test]
    fn endpoints_parse() {
        for (input, want) in ENDPOINTS {
            let got = Endpoint::parse(input).map(|e| e.to_string()).ok();
            assert_eq!(got.as_deref(), *want, "{input}");
        }
    }
}
