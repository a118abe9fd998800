//! TLS with rustls (the ring provider): the acceptor a pool serves its
//! clients with and the connector its server connections use, built from
//! the PEM files its config names ([`chash::PoolTls`]) and checked when
//! they are (certificate chains and keys that parse and match, CAs that
//! parse). Protocol-free: bytes in, bytes out.

use std::fmt;
use std::sync::Arc;

use chash::PoolTls;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use tokio::net::TcpStream;

/// How long a client's TLS handshake may take before its connection is
/// closed (a client that opens a connection and sends nothing holds no
/// more than its socket, and not for longer).
pub(crate) const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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

/// Reads and checks every file a pool's TLS settings name (`chash proxy
/// -t`, and a pool's start).
///
/// # Errors
/// The first file that cannot be used.
pub fn check(tls: &PoolTls) -> Result<(), TlsError> {
    acceptor(tls)?;
    connector(tls)?;
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

/// A pool's TLS as it runs: the acceptor its clients' handshakes use and
/// the connector of its server connections, rebuilt from the same files
/// without a restart ([`LiveTls::reload`]): new handshakes use the new
/// certificate and CA, established connections go on, and a new file that
/// cannot be used is refused with the old one kept.
pub(crate) struct LiveTls {
    settings: PoolTls,
    acceptor: arc_swap::ArcSwapOption<tokio_rustls::TlsAcceptor>,
    connector: arc_swap::ArcSwapOption<Connector>,
    /// The files' content when last loaded (the watcher reloads on a change).
    loaded: std::sync::atomic::AtomicU64,
    /// `notAfter` of the served and the client certificate, Unix seconds
    /// (`i64::MIN`: none).
    expires: (std::sync::atomic::AtomicI64, std::sync::atomic::AtomicI64),
}

impl fmt::Debug for LiveTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveTls").field("settings", &self.settings).finish()
    }
}

impl LiveTls {
    /// Loads a pool's TLS files.
    ///
    /// # Errors
    /// As [`check`].
    pub(crate) fn new(settings: &PoolTls) -> Result<Arc<LiveTls>, TlsError> {
        let live = LiveTls {
            settings: settings.clone(),
            acceptor: arc_swap::ArcSwapOption::empty(),
            connector: arc_swap::ArcSwapOption::empty(),
            loaded: std::sync::atomic::AtomicU64::new(0),
            expires: (std::sync::atomic::AtomicI64::new(i64::MIN), std::sync::atomic::AtomicI64::new(i64::MIN)),
        };
        live.reload()?;
        Ok(Arc::new(live))
    }

    /// What clients' handshakes use now (`None`: the pool serves no TLS).
    pub(crate) fn acceptor(&self) -> Option<Arc<tokio_rustls::TlsAcceptor>> {
        self.acceptor.load_full()
    }

    /// What server connections use now (`None`: plaintext servers).
    pub(crate) fn connector(&self) -> Option<Arc<Connector>> {
        self.connector.load_full()
    }

    /// Whether the pool speaks TLS on either side.
    pub(crate) fn in_use(&self) -> bool {
        self.settings.serves_tls() || self.settings.server
    }

    /// Reads the files again and swaps the new acceptor and connector in;
    /// on an error the old ones stay.
    ///
    /// # Errors
    /// As [`check`].
    pub(crate) fn reload(&self) -> Result<(), TlsError> {
        let hash = self.files_hash();
        // A refused set is not tried again until a file changes (or a
        // reload asks): the watcher would only repeat the error.
        let loaded = |h| self.loaded.store(h, std::sync::atomic::Ordering::Relaxed);
        let (acceptor, connector) = match (acceptor(&self.settings), connector(&self.settings)) {
            (Ok(a), Ok(c)) => (a, c),
            (Err(e), _) | (_, Err(e)) => {
                loaded(hash);
                return Err(e);
            }
        };
        self.acceptor.store(acceptor.map(Arc::new));
        self.connector.store(connector);
        loaded(hash);
        self.note_expiry();
        Ok(())
    }

    /// Whether a file changed since it was last loaded.
    pub(crate) fn changed(&self) -> bool {
        self.in_use() && self.files_hash() != self.loaded.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A hash of every file's content (0 for a file that cannot be read).
    fn files_hash(&self) -> u64 {
        let s = &self.settings;
        let files = [&s.cert, &s.key, &s.client_ca, &s.server_ca, &s.server_cert, &s.server_key];
        files.iter().flat_map(|f| f.iter()).fold(0xcbf2_9ce4_8422_2325, |h: u64, path| {
            let text = std::fs::read(path).unwrap_or_default();
            (h ^ chash::KeyHasher::Xxh3.hash(&text)).wrapping_mul(0x100_0000_01b3)
        })
    }
}

/// When a DER certificate stops being valid (its `notAfter`), in Unix
/// seconds; `None` when the bytes are not a certificate this reads.
fn not_after(der: &[u8]) -> Option<i64> {
    /// One DER element at the front of `b`: (tag, contents, the rest).
    fn element(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = b.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (first as usize, rest)
        } else {
            let n = (first & 0x7f) as usize;
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            (rest[..n].iter().fold(0usize, |l, &b| (l << 8) | b as usize), &rest[n..])
        };
        (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
    }
    let (_, cert, _) = element(der)?; // Certificate
    let (_, tbs, _) = element(cert)?; // TBSCertificate
    let mut rest = tbs;
    let (tag, _, after) = element(rest)?;
    if tag == 0xa0 {
        rest = after; // [0] version
    }
    for _ in 0..3 {
        rest = element(rest)?.2; // serialNumber, signature, issuer
    }
    let (_, validity, _) = element(rest)?;
    let (_, _, after_before) = element(validity)?; // notBefore
    let (tag, time, _) = element(after_before)?; // notAfter
    let text = std::str::from_utf8(time).ok()?;
    let digits = |s: &str| s.parse::<i64>().ok();
    let (year, rest) = match tag {
        0x17 => {
            let yy = digits(text.get(0..2)?)?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, text.get(2..)?)
        }
        0x18 => (digits(text.get(0..4)?)?, text.get(4..)?),
        _ => return None,
    };
    let field = |i: usize| digits(rest.get(i..i + 2)?);
    let (month, day, hour, minute, second) = (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    // Days from the civil date (proleptic Gregorian), Howard Hinnant's method.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
}

/// A certificate file's first (leaf) certificate's `notAfter`.
fn file_not_after(path: &str) -> Option<i64> {
    let first = CertificateDer::pem_file_iter(path).ok()?.next()?.ok()?;
    not_after(first.as_ref())
}

/// Certificates with less than this left are warned about when loaded.
const EXPIRY_WARNING: i64 = 14 * 86_400;

impl LiveTls {
    /// Seconds left on the certificate served to clients (`tls_cert`) and
    /// on the one presented to servers (`server_tls_cert`), as loaded
    /// (negative once expired).
    pub(crate) fn expiry(&self) -> (Option<i64>, Option<i64>) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        let left = |at: &std::sync::atomic::AtomicI64| {
            let t = at.load(std::sync::atomic::Ordering::Relaxed);
            (t != i64::MIN).then(|| t - now)
        };
        (left(&self.expires.0), left(&self.expires.1))
    }

    /// Records the certificates' `notAfter`, warning about one that ends
    /// soon.
    fn note_expiry(&self) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        for (setting, path, slot) in [
            ("tls_cert", &self.settings.cert, &self.expires.0),
            ("server_tls_cert", &self.settings.server_cert, &self.expires.1),
        ] {
            let at = path.as_deref().and_then(file_not_after);
            slot.store(at.unwrap_or(i64::MIN), std::sync::atomic::Ordering::Relaxed);
            if let (Some(at), Some(path)) = (at, path) {
                if at - now < EXPIRY_WARNING {
                    tracing::warn!(
                        "{setting} {path}: the certificate expires in {} days ({} s): replace it (a reload takes the new one)",
                        (at - now) / 86_400,
                        at - now
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::not_after;

    /// `notAfter` of a certificate as `openssl x509 -enddate` gives it.
    #[test]
    fn not_after_is_read_from_the_certificate() {
        // A minimal DER: SEQUENCE { SEQUENCE { [0] { INTEGER 2 }, INTEGER 1,
        // SEQUENCE {}, SEQUENCE {}, SEQUENCE { UTCTime, UTCTime } } }.
        let utc = |s: &str| [&[0x17, s.len() as u8][..], s.as_bytes()].concat();
        let validity = [utc("250101000000Z"), utc("270315123456Z")].concat();
        let validity = [&[0x30, validity.len() as u8][..], &validity].concat();
        let tbs = [&[0xa0, 3, 2, 1, 2, 2, 1, 1, 0x30, 0, 0x30, 0][..], &validity].concat();
        let tbs = [&[0x30, tbs.len() as u8][..], &tbs].concat();
        let cert = [&[0x30, tbs.len() as u8][..], &tbs].concat();
        // 2027-03-15 12:34:56 UTC.
        assert_eq!(not_after(&cert), Some(1_805_114_096));
        assert_eq!(not_after(&cert[..10]), None);
        assert_eq!(not_after(b""), None);
    }
}
