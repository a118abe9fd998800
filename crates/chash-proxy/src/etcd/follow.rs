//! The proxy's tenant (`chash proxy --membership`): the stored config
//! watched and every new revision validated and applied, the watch resumed
//! after an outage, the last good config written to a cache file, and the
//! proxy's report kept under its lease.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{EventType, PutOptions, WatchOptions};
use tokio::sync::watch;

use super::{config_hash, connect, describe, read_config, Client, EtcdError, EtcdTarget, PoolReport, ProxyReport};
use super::{LEASE_TTL, MAX_BACKOFF, REQUEST_TIMEOUT};
use crate::registry::{MembershipStatus, Registry};

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
        report: report_tx.clone(),
    };
    let tasks = vec![
        tokio::spawn(watcher.run(stop_rx.clone())),
        tokio::spawn(report_migrations(registry.clone(), follow.clone(), report_tx, stop_rx.clone())),
        tokio::spawn(register(registry, follow, report_rx, stop_rx)),
    ];
    Follower { stop, tasks }
}

/// A pool that completes a migration changes its version (the migration's
/// record is no longer part of it): reported at once, for `chash migrate
/// finish --etcd`, which waits for every proxy to have completed.
async fn report_migrations(
    registry: Arc<Registry>,
    follow: Follow,
    reports: watch::Sender<ProxyReport>,
    mut stop: watch::Receiver<bool>,
) {
    let mut completed = registry.migrations_completed();
    // Sentinel groups' primaries change without a config change: looked
    // at every second, reported when they did.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            changed = completed.changed() => {
                if changed.is_err() {
                    return;
                }
                let _ = reports.send(report(&registry, &follow));
            }
            _ = tick.tick() => {
                let now = report(&registry, &follow);
                reports.send_if_modified(|old| {
                    let moved = old.pools.iter().zip(now.pools.iter()).any(|(a, b)| a.1.primaries != b.1.primaries);
                    if moved {
                        *old = now;
                    }
                    moved
                });
            }
            _ = stop.changed() => return,
        }
    }
}

/// The proxy's report as of now.
fn report(registry: &Registry, follow: &Follow) -> ProxyReport {
    let status = registry.membership().unwrap_or_default();
    let pools = registry
        .pools()
        .iter()
        .map(|p| {
            let s = p.stats();
            let primaries = s
                .servers
                .iter()
                .filter_map(|srv| Some((srv.id.clone(), srv.group.as_ref()?.primary.clone().unwrap_or_default())))
                .collect();
            (p.name().to_owned(), PoolReport { version: s.version, fingerprint: s.fingerprint, primaries })
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
        crate::registry::ReloadError::Invalid { source, .. } => source.to_string(),
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
