//! Redis Sentinel: pools whose server lines name master groups
//! (`sentinels:`). Placement is over the group names; each group is a
//! server whose address moves ([`Moving`]): the watcher here finds its
//! primary through the Sentinels (`SENTINEL MASTER`, the answer of the
//! highest config epoch), checks it says `ROLE` master before any request
//! goes to it, switches as soon as a Sentinel publishes a failover
//! (`+try-failover`, `+odown`, ... hold the group's requests; `+switch-master`
//! ends the hold), and polls every `sentinel_poll` besides.
//!
//! - here: [`Sentinels`] (a pool's groups and their state), the `ROLE`
//!   check every connection to a primary runs;
//! - `watch`: the task that asks the Sentinels and listens to their
//!   events;
//! - `client`: the small RESP connection it asks them with.

mod client;
pub(crate) mod reads;
mod watch;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use chash::{PoolConfig, SentinelSettings, ServerLine};
use tokio::sync::Notify;

use super::resp::WHOLE;
use crate::backend::{Address, BackendSettings, Moving, Server, Setup, Standby, Target};
use crate::stats::{GroupView, ReplicaView};
use crate::workers::Workers;

/// A pool's Sentinel groups.
pub(crate) struct Sentinels {
    pool: String,
    settings: SentinelSettings,
    /// The proxy's login to the servers (for `ROLE` and `INFO`).
    login: Option<(String, String)>,
    /// Whether the servers speak TLS (the watcher's own checks are then
    /// left to the connections').
    server_tls: bool,
    groups: Mutex<BTreeMap<String, Arc<Group>>>,
    /// Wakes the watcher (an event, a new group).
    wake: Arc<Notify>,
    started: OnceLock<()>,
    /// What replicas' servers are started on (the pool's).
    backend: OnceLock<(Arc<Workers>, BackendSettings)>,
    /// The proxy's zone (`CHASH_ZONE`): reads prefer replicas in it.
    zone: Option<String>,
}

/// One master group.
pub(crate) struct Group {
    name: String,
    target: tokio::sync::watch::Sender<Target>,
    moving: Arc<Moving>,
    /// Switches of primary seen.
    failovers: AtomicU64,
    /// The config epoch of the primary in use.
    epoch: AtomicU64,
    /// Its replicas by address, as last found.
    replicas: Mutex<BTreeMap<String, Replica>>,
    /// Those that may serve reads now.
    standbys: arc_swap::ArcSwap<Vec<Standby>>,
    /// Switched to a promoted replica before the Sentinels name it: the
    /// config epoch they were at (`u64::MAX`: in step with them).
    ahead: AtomicU64,
}

/// A replica of a group, as the watcher last found it.
struct Replica {
    /// Its server, when reads may go to replicas.
    server: Option<Arc<Server>>,
    view: ReplicaView,
}

impl Group {
    fn new(name: &str, settings: &SentinelSettings) -> Group {
        let (target, rx) = tokio::sync::watch::channel(Target::default());
        let moving = Arc::new(Moving {
            name: name.to_owned(),
            target: rx,
            hold: settings.failover_hold,
            verify: Some(role_check()),
        });
        Group {
            name: name.to_owned(),
            target,
            moving,
            failovers: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            replicas: Mutex::new(BTreeMap::new()),
            standbys: arc_swap::ArcSwap::default(),
            ahead: AtomicU64::new(u64::MAX),
        }
    }

    /// Where it is now.
    fn now(&self) -> Target {
        self.target.borrow().clone()
    }

    /// Its primary is a promoted replica the Sentinels, at config epoch
    /// `epoch`, do not name yet.
    fn ahead_since(&self, epoch: u64) {
        self.ahead.store(epoch, Relaxed);
    }

    /// The epoch it went ahead of the Sentinels at, if it is ahead.
    fn ahead(&self) -> Option<u64> {
        Some(self.ahead.load(Relaxed)).filter(|&e| e != u64::MAX)
    }

    /// The Sentinels name its primary again.
    fn in_step(&self) {
        self.ahead.store(u64::MAX, Relaxed);
    }

    /// Holds its requests (a failover has started).
    fn hold(&self, why: &str) {
        let changed = self.target.send_if_modified(|t| !std::mem::replace(&mut t.switching, true));
        if changed {
            tracing::warn!(group = %self.name, "failover under way ({why}): requests for the group wait for its new primary");
        }
    }

    /// Its primary is `primary` (checked), `switching` or not.
    fn settle(&self, primary: &str, epoch: u64, switching: bool) {
        let before = self.now();
        if before.primary.as_deref() == Some(primary) && before.switching == switching {
            // The Sentinels' epoch catches up after a switch at the promotion.
            self.epoch.store(epoch, Relaxed);
            return;
        }
        let moved = before.primary.as_deref().is_some_and(|p| p != primary);
        if moved {
            self.failovers.fetch_add(1, Relaxed);
            tracing::warn!(group = %self.name, "primary switched from {} to {primary} (config epoch {epoch})", before.primary.as_deref().unwrap_or("?"));
        } else if before.primary.is_none() {
            tracing::info!(group = %self.name, "primary is {primary} (config epoch {epoch})");
        } else if !switching {
            tracing::info!(group = %self.name, "failover over: requests go to {primary} again");
        }
        self.epoch.store(epoch, Relaxed);
        self.target.send_replace(Target { primary: Some(primary.to_owned()), switching });
    }

    /// For `/stats`.
    fn view(&self) -> GroupView {
        let t = self.now();
        GroupView {
            primary: t.primary,
            switching: t.switching,
            failovers: self.failovers.load(Relaxed),
            epoch: self.epoch.load(Relaxed),
            replicas: self
                .lock_replicas()
                .values()
                .map(|r| {
                    let mut v = r.view.clone();
                    v.reads = r.server.as_ref().map_or(0, |s| requests(s));
                    v
                })
                .collect(),
        }
    }

    fn lock_replicas(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Replica>> {
        self.replicas.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the replicas found now: servers started for new ones (when
    /// `backend` is given: reads may go to replicas), dropped for those
    /// gone; the usable ones published for reads.
    fn found(&self, found: Vec<ReplicaView>, backend: Option<&(Arc<Workers>, BackendSettings)>, zone: Option<&str>) {
        let mut replicas = self.lock_replicas();
        replicas.retain(|addr, _| found.iter().any(|f| f.address == *addr));
        for view in found {
            let server = replicas.remove(&view.address).and_then(|r| r.server).or_else(|| {
                let (workers, settings) = backend?;
                let line = ServerLine::new(&view.address, 1, None);
                Some(Server::start(workers, line, Address::Tcp(view.address.clone()), settings, None))
            });
            replicas.insert(view.address.clone(), Replica { server, view });
        }
        let standbys: Vec<Standby> = replicas
            .values()
            .filter(|r| r.view.usable)
            .filter_map(|r| {
                let near = zone.is_some() && r.view.zone.as_deref() == zone;
                Some(Standby { server: r.server.clone()?, near })
            })
            .collect();
        self.standbys.store(Arc::new(standbys));
    }
}

/// Requests a server has been sent.
fn requests(server: &Server) -> u64 {
    server.counter_values().iter().find(|(d, _)| d.name == "requests").map_or(0, |(_, v)| *v)
}

/// What every connection to a group's primary runs after its set-up:
/// `ROLE`, which must say `master` (a demoted primary gets nothing).
fn role_check() -> Setup {
    Setup { requests: vec![Bytes::from_static(b"*1\r\n$4\r\nROLE\r\n")], framing: WHOLE, check: is_master }
}

fn is_master(reply: &[u8]) -> Result<(), String> {
    if reply.starts_with(b"*3\r\n$6\r\nmaster\r\n") {
        Ok(())
    } else {
        let role = reply.split(|&b| b == b'\n').nth(2).map(|r| String::from_utf8_lossy(r).trim_end().to_owned());
        Err(format!("ROLE says {}, not master: not the group's primary (any more)", role.unwrap_or_default()))
    }
}

impl crate::backend::Locator for Arc<Sentinels> {
    fn locate(&self, line: &ServerLine, workers: &Arc<Workers>, settings: &BackendSettings) -> Address {
        Sentinels::locate(self, line, workers, settings)
    }

    fn views(&self) -> BTreeMap<String, GroupView> {
        Sentinels::views(self)
    }

    fn standbys(&self, id: &str) -> Arc<Vec<Standby>> {
        let groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.get(id).map(|g| g.standbys.load_full()).unwrap_or_default()
    }
}

impl Sentinels {
    /// The Sentinels of a pool that has them.
    pub(crate) fn of(config: &PoolConfig) -> Option<Arc<Sentinels>> {
        let settings = config.sentinel.clone()?;
        let login = super::access::server_login(config).map(|(u, p)| (u.to_owned(), p.to_owned()));
        Some(Arc::new(Sentinels {
            pool: config.name.clone(),
            settings,
            login,
            server_tls: config.tls.server,
            groups: Mutex::new(BTreeMap::new()),
            wake: Arc::new(Notify::new()),
            started: OnceLock::new(),
            backend: OnceLock::new(),
            zone: std::env::var("CHASH_ZONE").ok().filter(|z| !z.is_empty()),
        }))
    }

    /// Where a server line's group is reached (its [`Moving`] address),
    /// made on first use; starts the watcher (inside a runtime).
    pub(crate) fn locate(
        self: &Arc<Self>,
        line: &ServerLine,
        workers: &Arc<Workers>,
        settings: &BackendSettings,
    ) -> Address {
        let _ = self.backend.set((workers.clone(), settings.clone()));
        let group = {
            let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            groups.entry(line.id.clone()).or_insert_with(|| Arc::new(Group::new(&line.id, &self.settings))).clone()
        };
        self.started.get_or_init(|| watch::start(self));
        self.wake.notify_one();
        Address::Moving(group.moving.clone())
    }

    /// Every group's state, by name.
    pub(crate) fn views(&self) -> BTreeMap<String, GroupView> {
        self.groups().iter().map(|g| (g.name.clone(), g.view())).collect()
    }

    fn groups(&self) -> Vec<Arc<Group>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    fn login(&self) -> Option<(&str, &str)> {
        self.login.as_ref().map(|(u, p)| (u.as_str(), p.as_str()))
    }

    fn sentinel_login(&self) -> Option<(&str, &str)> {
        self.settings.password.as_deref().map(|p| ("default", p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_master_passes_the_role_check() {
        assert!(is_master(b"*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n").is_ok());
        let replica =
            is_master(b"*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:7001\r\n$9\r\nconnected\r\n:42\r\n").unwrap_err();
        assert!(replica.contains("slave"), "{replica}");
    }
}
