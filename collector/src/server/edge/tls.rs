//! TLS for both ports (`cpt serve --tls-cert/--tls-key`): rustls (with the
//! ring provider) through tokio-rustls, HTTP/2 and HTTP/1.1 offered by ALPN.
//! The handshake is under the header-read timeout, so a peer that connects
//! and never speaks TLS holds nothing for long.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The certificate chain and private key `cpt serve` presents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's own certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why the TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("TLS: {0}")]
pub struct TlsError(String);

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| {
            TlsError(format!(
                "--tls-cert {}: cannot read it: {e}",
                path.display()
            ))
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            TlsError(format!(
                "--tls-cert {}: not PEM certificates: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(TlsError(format!(
            "--tls-cert {}: no CERTIFICATE block in it; give the PEM certificate chain",
            path.display()
        )));
    }
    Ok(certs)
}

/// The rustls server configuration of `files`.
///
/// # Errors
///
/// Unreadable files, no certificate or key in them, or a key that does not
/// match the certificate.
pub(in crate::server) fn server_config(
    files: &TlsFiles,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
        TlsError(format!(
            "--tls-key {}: no usable PEM private key in it ({e})",
            files.key.display()
        ))
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            TlsError(format!(
                "--tls-cert {} / --tls-key {}: {e}",
                files.cert.display(),
                files.key.display()
            ))
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
