//! Membership from etcd (v3 API): a fleet's config stored at
//! `PREFIX/config`, written with compare-and-swap on the key's revision,
//! watched by every proxy, and each proxy's report under
//! `PREFIX/proxies/<id>` (kept by a lease, so it goes when the proxy
//! dies). Two tenants, apart:
//!
//! - here, what both share: [`EtcdTarget`]
//!   (`etcd://HOST:PORT[,HOST:PORT...]/PREFIX`, parsed; `https://` for
//!   TLS, with [`EtcdTls`]'s CA and client certificate), [`connect`],
//!   [`read_config`], the report a proxy keeps ([`ProxyReport`]) and the
//!   errors;
//! - [`follow`] (the proxy's runtime, `chash proxy --membership`): every
//!   new revision of the config validated and applied
//!   ([`Registry::apply_config`](crate::registry::Registry::apply_config)),
//!   the watch resumed from the last revision seen after an outage (the
//!   key re-read when that revision was compacted), the last good config
//!   written to a cache file, and the proxy's report kept under its lease;
//! - [`store`] (the CLI's: `chash config --etcd`, `chash fleet status`):
//!   the compare-and-swap writer and the reader of every proxy's report.
//!   Nothing in the proxy's runtime writes the config (`tests/layout.rs`
//!   keeps it so).

pub mod follow;
pub mod store;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use chash::KeyHasher;
pub use etcd_client::Client;
use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use serde::{Deserialize, Serialize};

/// How long connecting to etcd may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one etcd request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest wait between two attempts to reach etcd again (the wait
/// starts at 100 ms and doubles).
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The time to live of a proxy's registration lease: a proxy that dies
/// without saying so leaves `PREFIX/proxies/` after this long.
pub const LEASE_TTL: Duration = Duration::from_secs(10);

/// Where a fleet's membership lives: etcd's endpoints and a key prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTarget {
    /// `http://HOST:PORT` (`https://` with TLS), one per endpoint.
    pub endpoints: Vec<String>,
    /// The key prefix, with a leading `/` and no trailing one
    /// (`/chash/web`).
    pub prefix: String,
    /// TLS to etcd (`https://` or `etcds://` URLs); `None`: plaintext.
    pub tls: Option<EtcdTls>,
}

/// How the TLS link to etcd is checked and who the client is: etcdctl's
/// `--cacert`, `--cert` and `--key` (the CLI's `--etcd-ca`, `--etcd-cert`,
/// `--etcd-key`). Files are read at each connection, so a rotated
/// certificate is used from the next reconnection on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA etcd's certificate must chain to (default: the system's
    /// roots).
    pub ca: Option<PathBuf>,
    /// A client certificate (PEM) for an etcd started with
    /// `--client-cert-auth`.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
}

impl EtcdTls {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// Reads and checks the files (a CA that parses, a key that matches
    /// its certificate) into the client's TLS options.
    fn options(&self) -> Result<TlsOptions, EtcdError> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        crate::tls::check_client_files(
            ("--etcd-ca", path(&self.ca).as_deref()),
            ("--etcd-cert", path(&self.cert).as_deref()),
            ("--etcd-key", path(&self.key).as_deref()),
        )
        .map_err(|e| EtcdError::Tls { why: e.to_string() })?;
        let read = |what: &str, p: &PathBuf| {
            std::fs::read(p).map_err(|e| EtcdError::Tls { why: format!("{what} {}: {e}", p.display()) })
        };
        let mut options = TlsOptions::new();
        options = match &self.ca {
            Some(ca) => options.ca_certificate(Certificate::from_pem(read("--etcd-ca", ca)?)),
            None => options.with_native_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            options = options.identity(Identity::from_pem(read("--etcd-cert", cert)?, read("--etcd-key", key)?));
        }
        Ok(options)
    }
}

impl EtcdTarget {
    /// The key of the stored config: `PREFIX/config`.
    pub fn config_key(&self) -> String {
        format!("{}/config", self.prefix)
    }

    /// The prefix of the proxies' reports: `PREFIX/proxies/`.
    pub fn proxies_prefix(&self) -> String {
        format!("{}/proxies/", self.prefix)
    }

    /// The endpoints, comma-separated.
    pub fn endpoint_list(&self) -> String {
        self.endpoints.join(",")
    }

    /// The target with TLS files (`--etcd-ca`, `--etcd-cert`,
    /// `--etcd-key`); none given leaves it as it is.
    ///
    /// # Errors
    /// Files named for a plaintext URL (`etcd://`, `http://`), or a
    /// certificate without its key (or a key without its certificate).
    pub fn with_tls_files(mut self, files: EtcdTls) -> Result<EtcdTarget, EtcdError> {
        if files.is_empty() {
            return Ok(self);
        }
        let bad = |why: &str| EtcdError::Tls { why: why.to_owned() };
        if files.cert.is_some() != files.key.is_some() {
            return Err(bad("--etcd-cert and --etcd-key go together: give both (or neither)"));
        }
        match &mut self.tls {
            None => Err(bad(&format!(
                "--etcd-ca, --etcd-cert and --etcd-key are for TLS, and {self} is plaintext: write https://{}{}",
                self.hosts().join(","),
                self.prefix
            ))),
            Some(tls) => {
                *tls = files;
                Ok(self)
            }
        }
    }

    /// `HOST:PORT` of each endpoint.
    fn hosts(&self) -> Vec<&str> {
        self.endpoints.iter().map(|e| e.trim_start_matches("http://").trim_start_matches("https://")).collect()
    }
}

impl fmt::Display for EtcdTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls.is_some() { "https" } else { "etcd" };
        write!(f, "{scheme}://{}{}", self.hosts().join(","), self.prefix)
    }
}

impl FromStr for EtcdTarget {
    type Err = EtcdError;

    /// Parses `etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (the scheme may be
    /// left out; `http://` is the same) or, for TLS, `https://...` (or
    /// `etcds://...`), verified against the system's roots until
    /// [`EtcdTarget::with_tls_files`] names a CA.
    fn from_str(url: &str) -> Result<EtcdTarget, EtcdError> {
        let bad = |why: &str| EtcdError::Url { url: url.to_owned(), why: why.to_owned() };
        let (rest, tls) = match url.split_once("://") {
            Some(("etcd" | "http", rest)) => (rest, false),
            Some(("https" | "etcds", rest)) => (rest, true),
            Some((scheme, _)) => {
                return Err(bad(&format!(
                    "the scheme is {scheme}://; write etcd://HOST:PORT/PREFIX, or https://HOST:PORT/PREFIX for TLS"
                )))
            }
            None => (url, false),
        };
        let (hosts, path) = rest.split_once('/').ok_or_else(|| bad("it names no key prefix: add /PREFIX"))?;
        let path = path.trim_end_matches('/');
        if path.is_empty() {
            return Err(bad("the key prefix is empty: add /PREFIX, e.g. /chash/web"));
        }
        if path.contains("//") || path.chars().any(char::is_whitespace) {
            return Err(bad("the key prefix has an empty part or a space"));
        }
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let (name, port) = host.rsplit_once(':').ok_or_else(|| bad(&format!("{host:?} is not HOST:PORT")))?;
            if name.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad(&format!("{host:?} is not HOST:PORT")));
            }
            endpoints.push(format!("{}://{host}", if tls { "https" } else { "http" }));
        }
        Ok(EtcdTarget { endpoints, prefix: format!("/{path}"), tls: tls.then(EtcdTls::default) })
    }
}

/// What went wrong talking to etcd.
#[derive(Debug)]
#[non_exhaustive]
pub enum EtcdError {
    /// An etcd URL that does not parse.
    Url {
        /// The URL.
        url: String,
        /// Why.
        why: String,
    },
    /// etcd did not answer (or answered with an error).
    Etcd {
        /// The endpoints.
        endpoints: String,
        /// What was asked.
        what: String,
        /// Why, with its causes.
        why: String,
    },
    /// The TLS settings for etcd cannot be used (a file that cannot be
    /// read or parsed, a key that does not match its certificate, files
    /// for a plaintext URL).
    Tls {
        /// Why, naming the flag and file.
        why: String,
    },
    /// There is no config at the key.
    NoConfig {
        /// The key.
        key: String,
    },
    /// The stored value is not text.
    NotText {
        /// The key.
        key: String,
        /// Its revision.
        revision: i64,
    },
    /// The key changed since it was read: another writer got there first.
    Conflict {
        /// The key.
        key: String,
        /// The revision the writer read.
        read: i64,
        /// The key's revision now (0: deleted).
        now: i64,
    },
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtcdError::Url { url, why } => {
                write!(f, "etcd URL {url:?}: {why} (etcd://HOST:PORT[,HOST:PORT...]/PREFIX)")
            }
            EtcdError::Tls { why } => write!(f, "etcd TLS: {why}"),
            EtcdError::Etcd { endpoints, what, why } => write!(f, "etcd at {endpoints}: {what}: {why}"),
            EtcdError::NoConfig { key } => {
                write!(f, "etcd has no config at {key}: upload one with `chash config put --etcd URL/PREFIX FILE`")
            }
            EtcdError::NotText { key, revision } => write!(f, "{key} (revision {revision}) is not UTF-8 text"),
            EtcdError::Conflict { key, read, now } => {
                let what = match (*read, *now) {
                    (0, now) => format!("was created at revision {now} since this writer found it absent"),
                    (read, 0) => format!("was deleted since it was read at revision {read}"),
                    (read, now) => format!("changed at revision {now} since it was read at revision {read}"),
                };
                write!(
                    f,
                    "conflict: {key} {what} (another writer); nothing was written: re-run the command, or pass \
                     --retry N"
                )
            }
        }
    }
}

impl std::error::Error for EtcdError {}

/// An etcd client error with its causes, on one line (tonic's errors say
/// little at the top: "transport error").
fn describe(e: &etcd_client::Error) -> String {
    let mut text = match e {
        etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
        other => other.to_string(),
    };
    let mut source = match e {
        etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
        other => std::error::Error::source(other),
    };
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

impl EtcdTarget {
    fn error(&self, what: &str, e: &etcd_client::Error) -> EtcdError {
        EtcdError::Etcd { endpoints: self.endpoint_list(), what: what.to_owned(), why: describe(e) }
    }
}

/// Connects to the first of the target's endpoints that answers (in the
/// order given; timeouts: [`CONNECT_TIMEOUT`], [`REQUEST_TIMEOUT`];
/// keep-alive pings find a dead connection). One endpoint is used at a
/// time: a client balanced over all of them sends requests to dead ones
/// too, so failing over is done here, by connecting again.
///
/// # Errors
/// [`EtcdError::Etcd`] when no endpoint answers, with each one's error.
pub async fn connect(target: &EtcdTarget) -> Result<Client, EtcdError> {
    let tls = target.tls.as_ref().map(EtcdTls::options).transpose()?;
    let mut errors = Vec::new();
    for endpoint in &target.endpoints {
        match connect_one(endpoint, tls.clone()).await {
            Ok(client) => return Ok(client),
            Err(why) if target.endpoints.len() == 1 => errors.push(why),
            Err(why) => errors.push(format!("{endpoint}: {why}")),
        }
    }
    let mut why = errors.join("; ");
    why.push_str(tls_hint(target, &why));
    Err(EtcdError::Etcd { endpoints: target.endpoint_list(), what: "unreachable".into(), why })
}

/// What a TLS failure most likely means, for the operator (tonic's errors
/// name the alert, not the fix).
fn tls_hint(target: &EtcdTarget, why: &str) -> &'static str {
    let tls = target.tls.is_some();
    let no_cert = target.tls.as_ref().is_some_and(|t| t.cert.is_none());
    // TLS 1.3: a client certificate is checked after the client's side of
    // the handshake is done, so its refusal may arrive as an alert or as
    // the connection closed.
    let refused = why.contains("BadCertificate") || why.contains("CertificateRequired");
    let dropped = ["connection closed", "broken pipe", "connection reset"].iter().any(|w| why.contains(w));
    if tls && (refused || (no_cert && dropped)) {
        " (etcd refused this client's certificate, or its absence: give --etcd-cert and --etcd-key, signed by a CA \
         etcd trusts)"
    } else if tls && why.contains("UnknownIssuer") {
        " (etcd's certificate does not chain to --etcd-ca, or to the system's roots without it)"
    } else if tls && why.contains("NotValidForName") {
        " (etcd's certificate does not name the host of the URL)"
    } else if !tls && dropped {
        " (does etcd serve TLS there? then write https://HOST:PORT/PREFIX)"
    } else {
        ""
    }
}

/// A client of one endpoint, once the endpoint has answered a request (a
/// connection alone does not say that etcd serves).
async fn connect_one(endpoint: &str, tls: Option<TlsOptions>) -> Result<Client, String> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        .with_keep_alive_while_idle(true);
    if let Some(tls) = tls {
        options = options.with_tls(tls);
    }
    let connect = Client::connect([endpoint], Some(options));
    let mut client = match tokio::time::timeout(CONNECT_TIMEOUT + REQUEST_TIMEOUT, connect).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => return Err(describe(&e)),
        Err(_) => return Err("timed out connecting".into()),
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, client.status()).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => Err(describe(&e)),
        Err(_) => Err("timed out".into()),
    }
}

/// The config stored at `PREFIX/config`.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The config's text.
    pub text: String,
    /// The key's revision (`mod_revision`): the membership version.
    pub revision: i64,
    /// The store's revision when it was read (watch from the next one).
    pub read_at: i64,
}

/// A hash of a config's text: 16 hex digits.
pub fn config_hash(text: &str) -> String {
    format!("{:016x}", KeyHasher::Xxh3.hash(text.as_bytes()))
}

/// Reads `PREFIX/config`.
///
/// # Errors
/// [`EtcdError::NoConfig`] when the key does not exist, etcd's errors.
pub async fn read_config(client: &mut Client, target: &EtcdTarget) -> Result<Stored, EtcdError> {
    let key = target.config_key();
    let response = client.get(key.as_str(), None).await.map_err(|e| target.error(&format!("cannot read {key}"), &e))?;
    let read_at = response.header().map_or(0, |h| h.revision());
    let kv = response.kvs().first().ok_or_else(|| EtcdError::NoConfig { key: key.clone() })?;
    let text = kv.value_str().map_err(|_| EtcdError::NotText { key: key.clone(), revision: kv.mod_revision() })?;
    Ok(Stored { text: text.to_owned(), revision: kv.mod_revision(), read_at })
}

/// One pool as a proxy runs it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PoolReport {
    /// The pool's membership version.
    pub version: String,
    /// The pool's placement fingerprint.
    pub fingerprint: String,
    /// Sentinel pools: each group's primary as this proxy uses it (empty
    /// while unknown).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub primaries: BTreeMap<String, String>,
}

impl PoolReport {
    /// Whether it places keys as `other` does (same membership version
    /// and fingerprint; primaries aside).
    pub fn places_as(&self, other: &PoolReport) -> bool {
        self.version == other.version && self.fingerprint == other.fingerprint
    }
}

/// What a proxy reports under `PREFIX/proxies/<id>`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProxyReport {
    /// The proxy's id.
    pub id: String,
    /// Its admin endpoint (`http://HOST:PORT`), if it serves one.
    pub admin: Option<String>,
    /// The revision of the config it applied.
    pub revision: i64,
    /// The hash of that config's text.
    pub config_hash: String,
    /// Each pool's membership version and placement fingerprint.
    pub pools: BTreeMap<String, PoolReport>,
    /// When it applied that revision (Unix time, milliseconds).
    pub applied_at_ms: u64,
    /// Whether it started from its cache file (etcd was unreachable).
    pub cache_used: bool,
    /// Why the last revision was refused, if it was.
    pub last_error: Option<String>,
    /// Its process id.
    pub pid: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_say_why() {
        let t: EtcdTarget = "etcd://127.0.0.1:2379,10.0.0.2:2379/chash/web/".parse().unwrap();
        assert_eq!(t.endpoints, ["http://127.0.0.1:2379", "http://10.0.0.2:2379"]);
        assert_eq!(t.config_key(), "/chash/web/config");
        assert_eq!(t.proxies_prefix(), "/chash/web/proxies/");
        assert_eq!(t.to_string(), "etcd://127.0.0.1:2379,10.0.0.2:2379/chash/web");
        assert_eq!("localhost:2379/x".parse::<EtcdTarget>().unwrap().prefix, "/x");
        assert_eq!(t.tls, None);
        let s: EtcdTarget = "https://127.0.0.1:2379,h:2380/p".parse().unwrap();
        assert_eq!(s.endpoints, ["https://127.0.0.1:2379", "https://h:2380"]);
        assert_eq!(s.tls, Some(EtcdTls::default()));
        assert_eq!(s.to_string(), "https://127.0.0.1:2379,h:2380/p");
        assert_eq!("etcds://h:1/p".parse::<EtcdTarget>().unwrap(), "https://h:1/p".parse().unwrap());
        assert_eq!("http://h:1/p".parse::<EtcdTarget>().unwrap(), "etcd://h:1/p".parse().unwrap());
        for (bad, says) in [
            ("etcd://127.0.0.1:2379", "no key prefix"),
            ("etcd://127.0.0.1:2379/", "prefix is empty"),
            ("ftp://h:2379/p", "scheme"),
            ("etcd://h/p", "not HOST:PORT"),
            ("etcd://h:0/p", "not HOST:PORT"),
            ("etcd://h:1,/p", "not HOST:PORT"),
        ] {
            let e = bad.parse::<EtcdTarget>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn tls_files_need_a_tls_url_and_come_in_pairs() {
        let ca = EtcdTls { ca: Some("ca.pem".into()), ..EtcdTls::default() };
        let plain: EtcdTarget = "etcd://h:1/p".parse().unwrap();
        assert_eq!(plain.clone().with_tls_files(EtcdTls::default()).unwrap(), plain);
        let e = plain.with_tls_files(ca.clone()).unwrap_err().to_string();
        assert!(e.contains("is plaintext: write https://h:1/p"), "{e}");
        let tls: EtcdTarget = "https://h:1/p".parse().unwrap();
        assert_eq!(tls.clone().with_tls_files(ca.clone()).unwrap().tls, Some(ca));
        let half = EtcdTls { cert: Some("c.pem".into()), ..EtcdTls::default() };
        let e = tls.with_tls_files(half).unwrap_err().to_string();
        assert!(e.contains("--etcd-cert and --etcd-key go together"), "{e}");
    }

    #[test]
    fn conflicts_say_what_happened() {
        let says = |read, now| EtcdError::Conflict { key: "/p/config".into(), read, now }.to_string();
        assert!(says(3, 5).contains("changed at revision 5 since it was read at revision 3"), "{}", says(3, 5));
        assert!(says(0, 5).contains("created at revision 5"), "{}", says(0, 5));
        assert!(says(3, 0).contains("deleted"), "{}", says(3, 0));
        assert!(says(3, 5).starts_with("conflict: /p/config") && says(3, 5).contains("--retry N"));
    }
}
