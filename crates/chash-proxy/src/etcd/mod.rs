//! Membership from etcd (v3 API): a fleet's config stored at
//! `PREFIX/config`, written with compare-and-swap on the key's revision,
//! watched by every proxy, and each proxy's report under
//! `PREFIX/proxies/<id>` (kept by a lease, so it goes when the proxy
//! dies). Two tenants, apart:
//!
//! - here, what both share: [`EtcdTarget`]
//!   (`etcd://HOST:PORT[,HOST:PORT...]/PREFIX`, parsed), [`connect`],
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
use std::str::FromStr;
use std::time::Duration;

use chash::KeyHasher;
pub use etcd_client::Client;
use etcd_client::ConnectOptions;
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
    /// `http://HOST:PORT`, one per endpoint.
    pub endpoints: Vec<String>,
    /// The key prefix, with a leading `/` and no trailing one
    /// (`/chash/web`).
    pub prefix: String,
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
}

impl fmt::Display for EtcdTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<&str> = self.endpoints.iter().map(|e| e.trim_start_matches("http://")).collect();
        write!(f, "etcd://{}{}", hosts.join(","), self.prefix)
    }
}

impl FromStr for EtcdTarget {
    type Err = EtcdError;

    /// Parses `etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (the scheme may be
    /// left out).
    fn from_str(url: &str) -> Result<EtcdTarget, EtcdError> {
        let bad = |why: &str| EtcdError::Url { url: url.to_owned(), why: why.to_owned() };
        let rest = match url.split_once("://") {
            Some(("etcd", rest)) => rest,
            Some((scheme, _)) => {
                return Err(bad(&format!(
                    "the scheme is {scheme}://; write etcd://HOST:PORT/PREFIX (TLS is not supported)"
                )))
            }
            None => url,
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
            endpoints.push(format!("http://{host}"));
        }
        Ok(EtcdTarget { endpoints, prefix: format!("/{path}") })
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
    let mut errors = Vec::new();
    for endpoint in &target.endpoints {
        match connect_one(endpoint).await {
            Ok(client) => return Ok(client),
            Err(why) if target.endpoints.len() == 1 => errors.push(why),
            Err(why) => errors.push(format!("{endpoint}: {why}")),
        }
    }
    Err(EtcdError::Etcd { endpoints: target.endpoint_list(), what: "unreachable".into(), why: errors.join("; ") })
}

/// A client of one endpoint, once the endpoint has answered a request (a
/// connection alone does not say that etcd serves).
async fn connect_one(endpoint: &str) -> Result<Client, String> {
    let options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        .with_keep_alive_while_idle(true);
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
        for (bad, says) in [
            ("etcd://127.0.0.1:2379", "no key prefix"),
            ("etcd://127.0.0.1:2379/", "prefix is empty"),
            ("https://h:2379/p", "scheme"),
            ("etcd://h/p", "not HOST:PORT"),
            ("etcd://h:0/p", "not HOST:PORT"),
            ("etcd://h:1,/p", "not HOST:PORT"),
        ] {
            let e = bad.parse::<EtcdTarget>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
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
