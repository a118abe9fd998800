//! Membership from etcd (v3 API): a fleet's config stored at
//! `PREFIX/config`, written with compare-and-swap on the key's revision,
//! watched by every proxy, and each proxy's report under
//! `PREFIX/proxies/<id>` (kept by a lease, so it goes when the proxy
//! dies).
//!
//! - [`EtcdTarget`]: `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`, parsed.
//! - [`read_config`], [`write_config`] (compare-and-swap),
//!   [`read_proxies`]: what `chash config --etcd` and `chash fleet
//!   status` use.
//! - [`follow`]: what `chash proxy --membership` runs: every new revision
//!   of the config validated and applied ([`Registry::apply_config`]),
//!   the watch resumed from the last revision seen after an outage (the
//!   key re-read when that revision was compacted), the last good config
//!   written to a cache file, and the proxy's report kept under its lease.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chash::KeyHasher;
pub use etcd_client::Client;
use etcd_client::{
    Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::registry::{MembershipStatus, Registry};

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

/// Writes `text` to `PREFIX/config` if the key's revision is still `read`
/// (`None`: if the key does not exist yet): a compare-and-swap, so two
/// writers never overwrite each other's change unknowingly. Returns the
/// new revision.
///
/// # Errors
/// [`EtcdError::Conflict`] when the key changed since it was read (nothing
/// is written), etcd's errors.
pub async fn write_config(
    client: &mut Client,
    target: &EtcdTarget,
    text: &str,
    read: Option<i64>,
) -> Result<i64, EtcdError> {
    let key = target.config_key();
    let compare = match read {
        Some(revision) => Compare::mod_revision(key.as_str(), CompareOp::Equal, revision),
        None => Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
    };
    let txn = Txn::new()
        .when([compare])
        .and_then([TxnOp::put(key.as_str(), text, None)])
        .or_else([TxnOp::get(key.as_str(), None)]);
    let response = client.txn(txn).await.map_err(|e| target.error(&format!("cannot write {key}"), &e))?;
    if response.succeeded() {
        return Ok(response.header().map_or(0, |h| h.revision()));
    }
    let now = response
        .op_responses()
        .into_iter()
        .find_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.kvs().first().map_or(0, |kv| kv.mod_revision())),
            _ => None,
        })
        .unwrap_or(0);
    Err(EtcdError::Conflict { key, read: read.unwrap_or(0), now })
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

/// Every proxy registered under `PREFIX/proxies/`, by id; a value that
/// does not parse is reported with its key as id and no pools.
///
/// # Errors
/// etcd's.
pub async fn read_proxies(client: &mut Client, target: &EtcdTarget) -> Result<Vec<ProxyReport>, EtcdError> {
    let prefix = target.proxies_prefix();
    let response = client
        .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| target.error(&format!("cannot read {prefix}"), &e))?;
    let mut proxies: Vec<ProxyReport> = response
        .kvs()
        .iter()
        .map(|kv| {
            serde_json::from_slice(kv.value()).unwrap_or_else(|_| ProxyReport {
                id: String::from_utf8_lossy(kv.key()).into_owned(),
                revision: -1,
                ..ProxyReport::default()
            })
        })
        .collect();
    proxies.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(proxies)
}

/// Unix time in milliseconds.
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The first line of a membership cache file.
const CACHE_HEADER: &str = "# chash membership cache:";

/// Reads a membership cache file: the revision it holds and the config.
///
/// # Errors
/// A file that cannot be read or was not written by a proxy.
pub fn read_cache(path: &Path) -> Result<(i64, String), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let first = text.lines().next().unwrap_or_default();
    let revision = first
        .strip_prefix(CACHE_HEADER)
        .and_then(|rest| rest.split_whitespace().skip_while(|w| *w != "revision").nth(1))
        .and_then(|r| r.parse::<i64>().ok())
        .ok_or_else(|| {
            format!("{} is not a membership cache (its first line is not `{CACHE_HEADER} ...`)", path.display())
        })?;
    // The stored config is what follows the header line, byte for byte (so
    // its config hash is the stored one's).
    let body = text.split_once('\n').map_or("", |(_, rest)| rest).to_owned();
    Ok((revision, body))
}

/// Writes the config of `revision` to the cache file, atomically; the file
/// is itself a config file (`chash proxy -c` reads it).
fn write_cache(path: &Path, key: &str, revision: i64, text: &str) -> std::io::Result<()> {
    let content = format!(
        "{CACHE_HEADER} {key} revision {revision} (config hash {}); written by the proxy after applying it\n{text}",
        config_hash(text)
    );
    chash::config_edit::write_atomically(path, &content)
}

/// The config a proxy started from.
#[derive(Clone, Debug)]
pub struct Start {
    /// Its text.
    pub text: String,
    /// Its revision.
    pub revision: i64,
    /// The store's revision when it was read: the watch starts after it
    /// (the config's own revision when it came from the cache).
    pub read_at: i64,
    /// Whether it came from the cache file (etcd was unreachable).
    pub from_cache: bool,
}

/// How a proxy follows the stored membership.
#[derive(Clone, Debug)]
pub struct Follow {
    /// Where.
    pub target: EtcdTarget,
    /// The proxy's id under `PREFIX/proxies/`.
    pub proxy_id: String,
    /// Its admin endpoint, for the report.
    pub admin: Option<String>,
    /// The cache file, written after every applied revision.
    pub cache: Option<PathBuf>,
    /// The config the proxy started from.
    pub start: Start,
}

/// A running [`follow`]: stop it to withdraw the proxy's registration.
#[derive(Debug)]
pub struct Follower {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Follower {
    /// Stops following and withdraws the registration (its lease revoked,
    /// so the proxy leaves `PREFIX/proxies/` at once).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, t).await;
        }
    }
}

/// Starts following the stored config: the registry's status set, the
/// cache written with the start config when it came from etcd, the watch
/// and the registration running until [`Follower::stop`].
pub fn follow(registry: Arc<Registry>, follow: Follow) -> Follower {
    let key = follow.target.config_key();
    let mut status = MembershipStatus::new("etcd", follow.target.endpoints.clone(), key.clone());
    status.revision = follow.start.revision;
    status.config_hash = config_hash(&follow.start.text);
    status.cache_used = follow.start.from_cache;
    status.connected = !follow.start.from_cache;
    status.proxy_id.clone_from(&follow.proxy_id);
    if follow.start.from_cache {
        status.last_error =
            Some(format!("etcd at {} unreachable at start: serving the cached config", follow.target.endpoint_list()));
    }
    registry.set_membership(status);
    if let (Some(cache), false) = (&follow.cache, follow.start.from_cache) {
        if let Err(e) = write_cache(cache, &key, follow.start.revision, &follow.start.text) {
            tracing::warn!("cannot write the membership cache {}: {e}", cache.display());
        }
    }
    let (stop, stop_rx) = watch::channel(false);
    let (report_tx, report_rx) = watch::channel(report(&registry, &follow));
    let watcher = Watcher {
        registry: registry.clone(),
        follow: follow.clone(),
        applied: follow.start.revision,
        applied_hash: config_hash(&follow.start.text),
        seen: follow.start.read_at,
        report: report_tx,
    };
    let tasks =
        vec![tokio::spawn(watcher.run(stop_rx.clone())), tokio::spawn(register(registry, follow, report_rx, stop_rx))];
    Follower { stop, tasks }
}

/// The proxy's report as of now.
fn report(registry: &Registry, follow: &Follow) -> ProxyReport {
    let status = registry.membership().unwrap_or_default();
    let pools = registry
        .pools()
        .iter()
        .map(|p| {
            let s = p.stats();
            (p.name().to_owned(), PoolReport { version: s.version, fingerprint: s.fingerprint })
        })
        .collect();
    ProxyReport {
        id: follow.proxy_id.clone(),
        admin: follow.admin.clone(),
        revision: status.revision,
        config_hash: status.config_hash,
        pools,
        applied_at_ms: now_ms(),
        cache_used: status.cache_used,
        last_error: status.last_error,
        pid: std::process::id(),
    }
}

/// Waits `backoff` (or until stopped; then `true`), and doubles it up to
/// [`MAX_BACKOFF`].
async fn pause(backoff: &mut Duration, stop: &mut watch::Receiver<bool>) -> bool {
    let stopped = tokio::select! {
        _ = tokio::time::sleep(*backoff) => false,
        _ = stop.changed() => true,
    };
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    stopped || *stop.borrow()
}

const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Follows `PREFIX/config`.
struct Watcher {
    registry: Arc<Registry>,
    follow: Follow,
    /// The revision of the config applied.
    applied: i64,
    applied_hash: String,
    /// The last store revision whose changes to the key were seen.
    seen: i64,
    report: watch::Sender<ProxyReport>,
}

/// Why a watch session ended.
enum Ended {
    Stopped,
    Lost(String),
}

impl Watcher {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut backoff = FIRST_BACKOFF;
        let target = self.follow.target.clone();
        let mut was_connected = !self.follow.start.from_cache;
        loop {
            if *stop.borrow() {
                return;
            }
            let why = match connect(&target).await {
                Ok(mut client) => match self.session(&mut client, &mut stop, &mut backoff, &mut was_connected).await {
                    Ended::Stopped => return,
                    Ended::Lost(why) => why,
                },
                Err(e) => e.to_string(),
            };
            let first = self.registry.membership().is_some_and(|s| s.connected);
            self.registry.update_membership(|s| {
                s.connected = false;
                s.last_error = Some(format!("etcd unreachable, serving revision {}: {why}", self.applied));
            });
            if first {
                tracing::warn!(
                    "etcd at {} lost ({why}): serving the last good config (revision {}), reconnecting",
                    target.endpoint_list(),
                    self.applied
                );
            } else {
                tracing::debug!("etcd at {} still unreachable: {why}", target.endpoint_list());
            }
            if pause(&mut backoff, &mut stop).await {
                return;
            }
        }
    }

    /// One connection: the watch from the revision after the last seen,
    /// until it fails or the follower stops.
    async fn session(
        &mut self,
        client: &mut Client,
        stop: &mut watch::Receiver<bool>,
        backoff: &mut Duration,
        was_connected: &mut bool,
    ) -> Ended {
        let key = self.follow.target.config_key();
        loop {
            let options = WatchOptions::new().with_start_revision(self.seen + 1);
            let mut stream = match client.watch(key.as_str(), Some(options)).await {
                Ok(s) => s,
                Err(e) => return Ended::Lost(describe(&e)),
            };
            loop {
                let message = tokio::select! {
                    m = stream.message() => m,
                    _ = stop.changed() => return Ended::Stopped,
                };
                let response = match message {
                    Ok(Some(r)) => r,
                    Ok(None) => return Ended::Lost("the watch stream ended".into()),
                    Err(e) => return Ended::Lost(describe(&e)),
                };
                if response.created() {
                    *backoff = FIRST_BACKOFF;
                    self.connected(was_connected);
                }
                if response.compact_revision() > 0 {
                    tracing::warn!(
                        "etcd compacted its history up to revision {} (this proxy had seen {}): re-reading {key}",
                        response.compact_revision(),
                        self.seen
                    );
                    match read_config(client, &self.follow.target).await {
                        Ok(stored) => {
                            self.seen = stored.read_at;
                            if stored.revision != self.applied {
                                self.apply(stored.revision, stored.text).await;
                            }
                        }
                        Err(e @ EtcdError::NoConfig { .. }) => {
                            self.refuse(response.compact_revision(), &e.to_string());
                            self.seen = self.seen.max(response.compact_revision());
                        }
                        Err(e) => return Ended::Lost(e.to_string()),
                    }
                    break; // a new watch from the revision after
                }
                if response.canceled() {
                    return Ended::Lost(format!("the watch was cancelled: {}", response.cancel_reason()));
                }
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let revision = kv.mod_revision();
                    if revision <= self.seen {
                        continue;
                    }
                    self.seen = revision;
                    match event.event_type() {
                        EventType::Delete => self.refuse(
                            revision,
                            &format!("{key} was deleted; put a config back with `chash config put --etcd`"),
                        ),
                        EventType::Put => match kv.value_str() {
                            Ok(text) => {
                                let text = text.to_owned();
                                self.apply(revision, text).await;
                            }
                            Err(_) => self.refuse(revision, "the value is not UTF-8 text"),
                        },
                    }
                }
            }
        }
    }

    /// etcd answered: says so when it had not before.
    fn connected(&self, was_connected: &mut bool) {
        let had_error = self.registry.membership().is_some_and(|s| !s.connected);
        self.registry.update_membership(|s| {
            if !s.connected && *was_connected {
                s.reconnects += 1;
            }
            s.connected = true;
            if s.cache_used {
                s.cache_used = false;
            }
            if s.last_error.as_deref().is_some_and(|e| e.starts_with("etcd unreachable")) {
                s.last_error = None;
            }
        });
        if had_error {
            let from = if *was_connected { "reconnected" } else { "reached (the proxy started from its cache)" };
            tracing::info!(
                "etcd at {} {from}: watching {} from revision {}",
                self.follow.target.endpoint_list(),
                self.follow.target.config_key(),
                self.seen + 1
            );
            let _ = self.report.send(report(&self.registry, &self.follow));
        }
        *was_connected = true;
    }

    /// A revision that cannot be applied: the last good config stays.
    fn refuse(&self, revision: i64, why: &str) {
        let key = self.follow.target.config_key();
        tracing::error!(
            "etcd {key} revision {revision} refused, the last good config (revision {}) stays: {why}",
            self.applied
        );
        self.registry.update_membership(|s| {
            s.invalid_revisions += 1;
            s.last_error = Some(format!("revision {revision} refused: {why}"));
        });
        let _ = self.report.send(report(&self.registry, &self.follow));
    }

    /// Validates and applies the config of `revision`.
    async fn apply(&mut self, revision: i64, text: String) {
        let key = self.follow.target.config_key();
        let hash = config_hash(&text);
        if hash == self.applied_hash {
            // The same text written again: nothing to change but the
            // revision.
            self.applied = revision;
            self.registry.update_membership(|s| {
                s.revision = revision;
                s.last_error = None;
            });
        } else {
            let registry = self.registry.clone();
            let origin = format!("etcd {key} revision {revision}");
            let text2 = text.clone();
            let outcome = tokio::task::spawn_blocking(move || registry.apply_config(&origin, &text2)).await;
            let results = match outcome {
                Ok(Ok(results)) => results,
                Ok(Err(e)) => return self.refuse(revision, &reason_of(&e)),
                Err(e) => return self.refuse(revision, &format!("the reload failed: {e}")),
            };
            let problems: Vec<String> = results
                .iter()
                .filter_map(|(pool, r)| match r {
                    Err(e @ crate::pool::PoolError::NeedsRestart { .. }) => {
                        tracing::warn!(%pool, "{e}");
                        None
                    }
                    Err(e) => Some(format!("pool {pool}: {e}")),
                    Ok(_) => None,
                })
                .collect();
            self.applied = revision;
            self.applied_hash.clone_from(&hash);
            let problem = (!problems.is_empty()).then(|| problems.join("; "));
            self.registry.update_membership(|s| {
                s.revision = revision;
                s.config_hash.clone_from(&hash);
                s.applied_revisions += 1;
                s.last_error.clone_from(&problem);
            });
            match &problem {
                None => tracing::info!("applied etcd {key} revision {revision} (config hash {hash})"),
                Some(p) => tracing::error!("applied etcd {key} revision {revision} in part: {p}"),
            }
        }
        if let Some(cache) = self.follow.cache.clone() {
            let key = key.clone();
            let written = tokio::task::spawn_blocking(move || write_cache(&cache, &key, revision, &text)).await;
            if let Ok(Err(e)) = written {
                tracing::warn!("cannot write the membership cache: {e}");
            }
        }
        let _ = self.report.send(report(&self.registry, &self.follow));
    }
}

/// The reason part of a reload error (its origin is said elsewhere).
fn reason_of(e: &crate::registry::ReloadError) -> String {
    match e {
        crate::registry::ReloadError::Invalid { reason, .. } => reason.clone(),
        other => other.to_string(),
    }
}

/// Keeps the proxy's report at `PREFIX/proxies/<id>` under a lease,
/// rewritten whenever it changes; registers again when the lease is lost.
async fn register(
    registry: Arc<Registry>,
    follow: Follow,
    mut reports: watch::Receiver<ProxyReport>,
    mut stop: watch::Receiver<bool>,
) {
    let target = &follow.target;
    let key = format!("{}{}", target.proxies_prefix(), follow.proxy_id);
    let mut backoff = FIRST_BACKOFF;
    loop {
        if *stop.borrow() {
            return;
        }
        let outcome = registration(target, &key, &mut reports, &mut stop, &mut backoff, &registry).await;
        registry.update_membership(|s| s.registered = false);
        match outcome {
            Ok(()) => return,
            Err(why) => tracing::debug!("registration at {key} lost: {why}"),
        }
        if pause(&mut backoff, &mut stop).await {
            return;
        }
    }
}

/// One registration: a lease, the report put under it, kept alive and
/// rewritten until an error (`Err`) or the stop (`Ok`, the lease revoked).
async fn registration(
    target: &EtcdTarget,
    key: &str,
    reports: &mut watch::Receiver<ProxyReport>,
    stop: &mut watch::Receiver<bool>,
    backoff: &mut Duration,
    registry: &Registry,
) -> Result<(), String> {
    let mut client = connect(target).await.map_err(|e| e.to_string())?;
    let ttl = LEASE_TTL.as_secs() as i64;
    let lease = client.lease_grant(ttl, None).await.map_err(|e| describe(&e))?.id();
    let put = |client: &mut Client, report: &ProxyReport| {
        let value = serde_json::to_string(report).unwrap_or_default();
        let mut client = client.clone();
        let key = key.to_owned();
        async move { client.put(key, value, Some(PutOptions::new().with_lease(lease))).await.map_err(|e| describe(&e)) }
    };
    let report = reports.borrow_and_update().clone();
    put(&mut client, &report).await?;
    let (mut keeper, mut alive) = client.lease_keep_alive(lease).await.map_err(|e| describe(&e))?;
    registry.update_membership(|s| s.registered = true);
    *backoff = FIRST_BACKOFF;
    let mut tick = tokio::time::interval(LEASE_TTL / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                keeper.keep_alive().await.map_err(|e| describe(&e))?;
                let answer = tokio::time::timeout(REQUEST_TIMEOUT, alive.message()).await;
                match answer {
                    Ok(Ok(Some(r))) if r.ttl() > 0 => {}
                    Ok(Ok(Some(_))) => return Err("the lease expired".into()),
                    Ok(Ok(None)) => return Err("the keep-alive stream ended".into()),
                    Ok(Err(e)) => return Err(describe(&e)),
                    Err(_) => return Err("the keep-alive timed out".into()),
                }
            }
            // Stopped: the watcher (which sends the reports) ends with
            // the same signal, so either may be seen first.
            changed = reports.changed(), if !*stop.borrow() => {
                if changed.is_err() {
                    break;
                }
                let report = reports.borrow_and_update().clone();
                put(&mut client, &report).await?;
            }
            _ = stop.changed() => break,
        }
    }
    match tokio::time::timeout(REQUEST_TIMEOUT, client.lease_revoke(lease)).await {
        Ok(Ok(_)) => {}
        _ => {
            // The lease could not be revoked: the report goes now anyway,
            // or with the lease's time to live.
            let _ = tokio::time::timeout(Duration::from_secs(1), client.delete(key, None)).await;
        }
    }
    Ok(())
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

    #[test]
    fn cache_files_carry_their_revision() {
        let dir = std::env::temp_dir().join(format!("chash-etcd-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cache.yml");
        write_cache(&path, "/p/config", 42, "web:\n  servers:\n   - a:1\n").unwrap();
        let (revision, text) = read_cache(&path).unwrap();
        assert_eq!(revision, 42);
        // The stored text, without the header: the same config hash.
        assert_eq!(text, "web:\n  servers:\n   - a:1\n");
        assert!(std::fs::read_to_string(&path).unwrap().ends_with(&text));
        std::fs::write(&path, "web: {}\n").unwrap();
        assert!(read_cache(&path).unwrap_err().contains("not a membership cache"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
