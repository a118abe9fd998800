//! A pool's TLS as it runs (and the admin endpoint's): swapped without a
//! restart when its files change or its config's TLS keys do.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use chash::PoolTls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::build::{acceptor, connector, Connector, TlsError};

/// Each overridden server's connector (`None`: plaintext to it), by ID.
type PerServer = HashMap<String, Option<Arc<Connector>>>;

/// A pool's TLS as it runs: the acceptor its clients' handshakes use and
/// the connectors of its server connections (the pool's, and those of
/// servers with overrides), rebuilt from the files without a restart
/// ([`LiveTls::reload`], [`LiveTls::reconfigure`]): new handshakes use the
/// new certificate and CA, established connections go on, and a new file
/// that cannot be used is refused with the old one kept.
pub(crate) struct LiveTls {
    settings: Mutex<PoolTls>,
    acceptor: arc_swap::ArcSwapOption<tokio_rustls::TlsAcceptor>,
    connector: arc_swap::ArcSwapOption<Connector>,
    servers: arc_swap::ArcSwap<PerServer>,
    /// The files' content when last loaded (the watcher reloads on a change).
    loaded: AtomicU64,
    /// `notAfter` of the served and the client certificate, Unix seconds
    /// (`i64::MIN`: none).
    expires: (AtomicI64, AtomicI64),
}

impl fmt::Debug for LiveTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveTls").field("settings", &*self.settings()).finish()
    }
}

/// Everything a set of settings loads to.
struct Loaded {
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    connector: Option<Arc<Connector>>,
    servers: PerServer,
}

/// Reads and checks every file a pool's TLS settings name (`chash proxy
/// -t`, and a pool's start).
///
/// # Errors
/// The first file that cannot be used.
pub fn check(tls: &PoolTls) -> Result<(), TlsError> {
    load(tls).map(|_| ())
}

fn load(settings: &PoolTls) -> Result<Loaded, TlsError> {
    let mut servers = HashMap::new();
    for id in settings.servers.keys() {
        let Some(one) = settings.for_server(id) else { continue };
        let c = connector(&one).map_err(|e| TlsError { what: format!("server {id}: {}", e.what), why: e.why })?;
        servers.insert(id.clone(), c);
    }
    Ok(Loaded { acceptor: acceptor(settings)?, connector: connector(settings)?, servers })
}

impl LiveTls {
    /// Loads a pool's TLS files.
    ///
    /// # Errors
    /// As [`check`].
    pub(crate) fn new(settings: &PoolTls) -> Result<Arc<LiveTls>, TlsError> {
        let live = LiveTls {
            settings: Mutex::new(settings.clone()),
            acceptor: arc_swap::ArcSwapOption::empty(),
            connector: arc_swap::ArcSwapOption::empty(),
            servers: arc_swap::ArcSwap::default(),
            loaded: AtomicU64::new(0),
            expires: (AtomicI64::new(i64::MIN), AtomicI64::new(i64::MIN)),
        };
        live.reload()?;
        Ok(Arc::new(live))
    }

    fn settings(&self) -> std::sync::MutexGuard<'_, PoolTls> {
        self.settings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What clients' handshakes use now (`None`: the pool serves no TLS).
    pub(crate) fn acceptor(&self) -> Option<Arc<tokio_rustls::TlsAcceptor>> {
        self.acceptor.load_full()
    }

    /// What connections to server `id` (named `name`) use now (`None`:
    /// plaintext): its override's (by ID, else by name), else the pool's.
    pub(crate) fn connector_for(&self, id: &str, name: Option<&str>) -> Option<Arc<Connector>> {
        let servers = self.servers.load();
        match servers.get(id).or_else(|| name.and_then(|n| servers.get(n))) {
            Some(one) => one.clone(),
            None => self.connector.load_full(),
        }
    }

    /// Whether the pool speaks TLS on either side.
    pub(crate) fn in_use(&self) -> bool {
        let s = self.settings();
        s.serves_tls() || s.any_server_tls()
    }

    /// Reads the files again and swaps the new acceptor and connectors in;
    /// on an error the old ones stay.
    ///
    /// # Errors
    /// As [`check`].
    pub(crate) fn reload(&self) -> Result<(), TlsError> {
        let settings = self.settings().clone();
        let hash = files_hash(&settings);
        // A refused set is not tried again until a file changes (or a
        // reload asks): the watcher would only repeat the error.
        self.loaded.store(hash, Relaxed);
        let loaded = load(&settings)?;
        self.store(loaded);
        self.note_expiry(&settings);
        Ok(())
    }

    /// Takes a reloaded config's TLS settings: the new files are read and
    /// used for new connections (servers' settings, a client CA, another
    /// certificate file). Whether clients are served TLS at all, and on
    /// which address, is decided when the listeners are bound: a change
    /// of that is kept for a restart (and logged).
    ///
    /// # Errors
    /// As [`check`]; the old settings then stay.
    pub(crate) fn reconfigure(&self, pool: &str, new: &PoolTls) -> Result<(), TlsError> {
        let mut next = new.clone();
        {
            let old = self.settings();
            if *old == next {
                return Ok(());
            }
            if old.serves_tls() != next.serves_tls() || old.listen != next.listen {
                tracing::warn!(
                    %pool,
                    "tls_cert, tls_key or tls_listen turned on, off or moved: takes effect after a restart (the \
                     listeners stay as they are)"
                );
                (next.cert, next.key, next.client_ca, next.listen) =
                    (old.cert.clone(), old.key.clone(), old.client_ca.clone(), old.listen.clone());
            }
        }
        let loaded = load(&next)?;
        warn_unverified(pool, &next);
        self.loaded.store(files_hash(&next), Relaxed);
        *self.settings() = next.clone();
        self.store(loaded);
        self.note_expiry(&next);
        tracing::info!(%pool, "TLS settings changed: new connections use them");
        Ok(())
    }

    fn store(&self, loaded: Loaded) {
        self.acceptor.store(loaded.acceptor.map(Arc::new));
        self.connector.store(loaded.connector);
        self.servers.store(Arc::new(loaded.servers));
    }

    /// Whether a file changed since it was last loaded.
    pub(crate) fn changed(&self) -> bool {
        self.in_use() && files_hash(&self.settings()) != self.loaded.load(Relaxed)
    }
}

/// Logs, loudly, the servers that are not verified.
pub(crate) fn warn_unverified(pool: &str, settings: &PoolTls) {
    if settings.server && !settings.server_verify {
        tracing::warn!(
            %pool,
            "server_tls_verify: false: server certificates are NOT verified (the connections are encrypted, but \
             anyone between the proxy and its servers can pose as them)"
        );
    }
    for id in settings.servers.keys() {
        if settings.for_server(id).is_some_and(|t| t.server && !t.server_verify) {
            tracing::warn!(%pool, server = %id, "server_tls_verify: false for this server: its certificate is NOT verified");
        }
    }
}

/// A hash of every file's content (0 for a file that cannot be read).
fn files_hash(s: &PoolTls) -> u64 {
    let mut files = vec![&s.cert, &s.key, &s.client_ca, &s.server_ca, &s.server_cert, &s.server_key];
    for o in s.servers.values() {
        files.extend([&o.server_tls_ca, &o.server_tls_cert, &o.server_tls_key]);
    }
    files.iter().flat_map(|f| f.iter()).fold(0xcbf2_9ce4_8422_2325, |h: u64, path| {
        let text = std::fs::read(path).unwrap_or_default();
        (h ^ chash::KeyHasher::Xxh3.hash(&text)).wrapping_mul(0x100_0000_01b3)
    })
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
        let left = |at: &AtomicI64| {
            let t = at.load(Relaxed);
            (t != i64::MIN).then(|| t - now)
        };
        (left(&self.expires.0), left(&self.expires.1))
    }

    /// Records the certificates' `notAfter`, warning about one that ends
    /// soon.
    fn note_expiry(&self, settings: &PoolTls) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        for (setting, path, slot) in
            [("tls_cert", &settings.cert, &self.expires.0), ("server_tls_cert", &settings.server_cert, &self.expires.1)]
        {
            let at = path.as_deref().and_then(file_not_after);
            slot.store(at.unwrap_or(i64::MIN), Relaxed);
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
