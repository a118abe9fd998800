//! Building rustls' acceptor and connector from PEM files, each checked
//! with its setting's name and file in the error.

use std::fmt;
use std::sync::Arc;

use chash::PoolTls;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use tokio::net::TcpStream;

/// Why a pool's TLS settings cannot be used: the file or setting, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError {
    /// The setting (`tls_cert`, `server_tls_ca`, ...) and its file.
    pub what: String,
    /// Why.
    pub why: String,
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.why)
    }
}

impl std::error::Error for TlsError {}

fn err(what: &str, path: &str, why: impl fmt::Display) -> TlsError {
    TlsError { what: format!("{what} {path}"), why: why.to_string() }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file (at least one).
fn certs(what: &str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let iter = CertificateDer::pem_file_iter(path).map_err(|e| err(what, path, e))?;
    let certs = iter.collect::<Result<Vec<_>, _>>().map_err(|e| err(what, path, e))?;
    if certs.is_empty() {
        return Err(err(what, path, "no certificate in it (a PEM file with -----BEGIN CERTIFICATE-----)"));
    }
    Ok(certs)
}

/// The private key of a PEM file.
fn key(what: &str, path: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| err(what, path, e))
}

/// The roots a CA file names, or the system's.
fn roots(what: &str, ca: Option<&str>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in certs(what, path)? {
                roots.add(cert).map_err(|e| err(what, path, e))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(TlsError {
                    what: "the system's CA certificates".into(),
                    why: "none found: name a CA file with server_tls_ca".into(),
                });
            }
        }
    }
    Ok(roots)
}

/// What serves a pool's clients TLS, when its config asks for it.
///
/// # Errors
/// A file that cannot be read or parsed, a key that does not match its
/// certificate.
pub(crate) fn acceptor(tls: &PoolTls) -> Result<Option<tokio_rustls::TlsAcceptor>, TlsError> {
    let (Some(cert), Some(key_path)) = (&tls.cert, &tls.key) else { return Ok(None) };
    let chain = certs("tls_cert", cert)?;
    let key = key("tls_key", key_path)?;
    let versions = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| err("tls_cert", cert, e))?;
    let builder = match &tls.client_ca {
        Some(ca) => {
            let roots = Arc::new(roots("tls_client_ca", Some(ca))?);
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| err("tls_client_ca", ca, e))?;
            versions.with_client_cert_verifier(verifier)
        }
        None => versions.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| err("tls_cert", cert, format!("with tls_key {key_path}: {e}")))?;
    Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
}

/// What a pool's server connections speak TLS with.
pub(crate) struct Connector {
    connector: tokio_rustls::TlsConnector,
    /// The name to verify (`server_tls_name`), else each server's host.
    name: Option<ServerName<'static>>,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector").field("name", &self.name).finish()
    }
}

impl Connector {
    /// Speaks TLS over `tcp` to the server at `host`.
    pub(crate) async fn connect(
        &self,
        host: &str,
        tcp: TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = match &self.name {
            Some(n) => n.clone(),
            None => {
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                ServerName::try_from(bare.to_owned()).map_err(|e| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("server name {bare:?}: {e}"))
                })?
            }
        };
        self.connector.connect(name, tcp).await
    }
}

/// What a pool's server connections speak TLS with, when its config asks
/// for it (`server_tls: true`).
///
/// # Errors
/// A file that cannot be read or parsed, a bad `server_tls_name`, no CA.
pub(crate) fn connector(tls: &PoolTls) -> Result<Option<Arc<Connector>>, TlsError> {
    if !tls.server {
        return Ok(None);
    }
    let what = tls.server_ca.as_deref().unwrap_or("(the system's roots)");
    let versions = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| err("server_tls_ca", what, e))?;
    let builder = if tls.server_verify {
        versions.with_root_certificates(roots("server_tls_ca", tls.server_ca.as_deref())?)
    } else {
        versions.dangerous().with_custom_certificate_verifier(Arc::new(NoVerification(provider())))
    };
    let config = match (&tls.server_cert, &tls.server_key) {
        (Some(cert), Some(key_path)) => builder
            .with_client_auth_cert(certs("server_tls_cert", cert)?, key("server_tls_key", key_path)?)
            .map_err(|e| err("server_tls_cert", cert, format!("with server_tls_key {key_path}: {e}")))?,
        _ => builder.with_no_client_auth(),
    };
    let name = match &tls.server_name {
        Some(n) => Some(ServerName::try_from(n.clone()).map_err(|e| err("server_tls_name", n, e))?),
        None => None,
    };
    Ok(Some(Arc::new(Connector { connector: tokio_rustls::TlsConnector::from(Arc::new(config)), name })))
}

/// Reads and checks the files of a TLS client that is not a pool's (the
/// link to etcd): a CA that parses, a certificate whose key matches it.
/// Each argument is the setting's name and its file, if given.
///
/// # Errors
/// The first file that cannot be used.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) fn check_client_files(
    ca: (&str, Option<&str>),
    cert: (&str, Option<&str>),
    key_file: (&str, Option<&str>),
) -> Result<(), TlsError> {
    let mut roots = RootCertStore::empty();
    if let (what, Some(path)) = ca {
        roots = self::roots(what, Some(path))?;
    }
    if let ((cert_what, Some(cert)), (key_what, Some(key_path))) = (cert, key_file) {
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| err(cert_what, cert, e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs(cert_what, cert)?, key(key_what, key_path)?)
            .map_err(|e| err(cert_what, cert, format!("with {key_what} {key_path}: {e}")))?;
    }
    Ok(())
}

/// `server_tls_verify: false`: any certificate is taken (the handshake's
/// signatures are still checked, so the session is encrypted, but not
/// authenticated). Asked for explicitly, and logged when a pool uses it.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
