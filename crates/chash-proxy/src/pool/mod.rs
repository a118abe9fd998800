//! A server pool: its servers, their health, and the routing snapshot that
//! places keys on the servers that are live.
//!
//! Readers (client connections) load the current [`PoolState`] without a
//! lock. Every change (a server added, removed, re-weighted, ejected or
//! restored, or a config reload) builds a new state under the pool's change
//! lock and swaps it in: requests already sent keep their server (they hold
//! it), new requests see the new placement, and nothing in flight is
//! dropped. State that changes per request lives beside the placement, in
//! the [`Server`]s, which every state shares: health, counters, and the
//! load a `bounded` pool places by.
//!
//! - here: [`Pool`] (its servers, settings and counters; where a key goes
//!   now, bounded load included);
//! - `routing`: the state a change swaps in ([`PoolState`], [`Routing`],
//!   [`Member`], [`Previous`]) and what a change moved, pure;
//! - `change`: the change engine (edits, reloads, health changes);
//! - `health`: ejection, failover, probes and retries;
//! - `warm`: what warm-up shares between protocols (the placements a
//!   change replaced, and the write tracking that keeps copies from
//!   overtaking writes);
//! - `error`: [`PoolError`].

mod change;
mod error;
mod health;
mod migration;
mod routing;
#[cfg(test)]
mod tests;
mod warm;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use chash::{Distribution, LineState, PoolConfig, ServerLine};

use crate::backend::{Address, BackendSettings, FailureHook, Locator, Server, Setup, Speech};
use crate::stats::{described, PerWorker, PoolCounters, PoolEvents, PoolSnapshot, ServerSnapshot};
use crate::workers::Workers;

pub use error::PoolError;
pub use migration::MoveSettings;
pub(crate) use migration::{Migration, Phase};
pub(crate) use migration::{MoveFuture, Mover};
use routing::next_random;
pub use routing::Change;
#[cfg(test)]
pub(crate) use routing::Routing;
pub(crate) use routing::{routes_as_decided, same_placement, Changed, Ejection, Member, Persist, PoolState, Previous};
pub(crate) use warm::KeyWrites;

/// What a pool calls with its config when a migration completes.
pub(crate) type OnMigrated = Box<dyn Fn(&PoolConfig) + Send + Sync>;

/// A pool of servers.
pub struct Pool {
    name: String,
    /// The config it started with: the settings beyond membership (listen
    /// address, protocol, replicas, failover, ...), which a reload leaves
    /// for a restart to change.
    spec: PoolConfig,
    /// What its server connections are made with.
    backend: BackendSettings,
    config: Mutex<PoolConfig>,
    addresses: HashMap<String, Address>,
    state: ArcSwap<PoolState>,
    /// The state again, a copy for each worker thread, for the requests'
    /// fast path ([`Pool::acquire`]): a worker locks its own copy, which
    /// no other worker touches (cheaper than arc-swap's load; threads that
    /// are not workers share the first's copy). A change replaces every
    /// copy when it swaps the state in ([`Pool::store`]), so no worker
    /// keeps an old state (and its servers) past it.
    local: PerWorker<parking_lot::Mutex<Arc<PoolState>>>,
    on_failure: FailureHook,
    workers: Arc<Workers>,
    counters: Arc<PerWorker<PoolCounters>>,
    /// Writes and warm-up copies in flight (used during warm-up windows).
    writes: KeyWrites,
    /// The protocol its servers speak.
    protocol: &'static str,
    /// What a failed-over server is probed with, and what it gets before
    /// it is taken back.
    probe: Option<Setup>,
    before_return: Option<Setup>,
    /// Where its servers are when its protocol looks them up (Sentinel
    /// groups).
    locator: Option<Arc<dyn Locator>>,
    /// Set while the state has warm-up sources.
    warming: std::sync::atomic::AtomicBool,
    /// Set while the state has a migration.
    migrating: std::sync::atomic::AtomicBool,
    /// Counters of events that are not per request.
    events: PoolEvents,
    /// TLS to clients and servers, reloadable.
    tls: Arc<crate::tls::LiveTls>,
    /// State a protocol keeps for the whole pool (Redis: its pub/sub
    /// subscriptions), made when first asked for.
    extension: std::sync::OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
    /// The pool itself, for the tasks it starts (its migrations' movers).
    me: std::sync::OnceLock<std::sync::Weak<Pool>>,
    /// Its protocol's mover of migrations' keys (Redis).
    mover: std::sync::OnceLock<Mover>,
    /// Called with the config when a migration completes (`--persist`
    /// writes it to the file).
    on_migrated: std::sync::OnceLock<OnMigrated>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool").field("name", &self.name).finish()
    }
}

/// A key's server, with the unit of load taken on it (bounded loads).
pub(crate) type Acquired = (Arc<Server>, Option<LoadRelease>);

impl Pool {
    /// Starts a pool's servers (their connections on `workers`) and its
    /// health task. `addresses` maps server ids to where they are reached
    /// when that is not the id itself; `speech` is what its servers speak
    /// (its protocol's description). Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// When the config cannot place keys (for example duplicate server ids).
    pub(crate) fn start(
        config: PoolConfig,
        addresses: HashMap<String, Address>,
        workers: Arc<Workers>,
        speech: Speech,
    ) -> Result<Arc<Pool>, PoolError> {
        let backend = BackendSettings {
            connections: config.server_connections as usize,
            timeout: config.timeout,
            preconnect: config.preconnect,
            failure_limit: config.server_failure_limit,
            dialects: if speech.dialects.is_empty() { vec![None] } else { speech.dialects },
            tls: None,
        };
        let tls = crate::tls::LiveTls::new(&config.tls)
            .map_err(|source| PoolError::Tls { pool: config.name.clone(), source })?;
        // Always there: a reload may turn server TLS on (or off) for new
        // connections.
        let backend = BackendSettings { tls: Some(tls.clone()), ..backend };
        crate::tls::warn_unverified(&config.name, &config.tls);
        for key in config.tls.servers.keys() {
            if !config.members().any(|l| l.id == *key || l.name.as_deref() == Some(key.as_str())) {
                tracing::warn!(pool = %config.name, "server_tls_overrides names {key}, which is not a server of the pool: ignored");
            }
        }
        // Ejection happens on the failing connection's thread, before the
        // failed requests are answered: their clients' next requests go to
        // the placement without the server.
        let cell: Arc<std::sync::OnceLock<std::sync::Weak<Pool>>> = Arc::default();
        let on_failure: FailureHook = {
            let cell = cell.clone();
            Arc::new(move |id: &str| {
                if let Some(pool) = cell.get().and_then(std::sync::Weak::upgrade) {
                    pool.server_failing(id);
                }
            })
        };
        let mut members = Vec::new();
        for line in config.members() {
            let address = match &speech.locator {
                Some(locator) => locator.locate(line, &workers, &backend),
                None => address_of(line, &addresses, &config.name)?,
            };
            let server = Server::start(&workers, line.clone(), address, &backend, Some(on_failure.clone()));
            let ejected = (line.state != LineState::Active).then_some(Ejection::Admin);
            members.push(Member { line: line.clone(), server, ejected });
        }
        let placeholder = PoolState {
            members: Vec::new(),
            routing: None,
            model: None,
            version: String::new(),
            fingerprint: String::new(),
            previous: Vec::new(),
            failover: false,
            migration: None,
        };
        let placeholder = Arc::new(placeholder);
        let pool = Arc::new(Pool {
            name: config.name.clone(),
            spec: config.clone(),
            backend,
            config: Mutex::new(config.clone()),
            addresses,
            local: PerWorker::with(workers.count(), || parking_lot::Mutex::new(placeholder.clone())),
            state: ArcSwap::new(placeholder),
            on_failure,
            counters: Arc::new(PerWorker::new(workers.count())),
            writes: KeyWrites::default(),
            tls,
            extension: std::sync::OnceLock::new(),
            me: std::sync::OnceLock::new(),
            mover: std::sync::OnceLock::new(),
            on_migrated: std::sync::OnceLock::new(),
            protocol: speech.protocol,
            probe: speech.probe,
            before_return: speech.before_return,
            locator: speech.locator,
            warming: std::sync::atomic::AtomicBool::new(false),
            migrating: std::sync::atomic::AtomicBool::new(false),
            workers,
            events: PoolEvents::default(),
        });
        let mut state = pool.state_for(&config, members)?;
        state.migration = pool.migration_for(&config, &state.members, None)?;
        pool.store(Arc::new(state));
        let _ = cell.set(Arc::downgrade(&pool));
        let _ = pool.me.set(Arc::downgrade(&pool));
        pool.start_retries();
        Ok(pool)
    }

    fn start_server(&self, line: ServerLine) -> Result<Arc<Server>, PoolError> {
        let address = match &self.locator {
            Some(locator) => locator.locate(&line, &self.workers, &self.backend),
            None => address_of(&line, &self.addresses, &self.name)?,
        };
        Ok(Server::start(&self.workers, line, address, &self.backend, Some(self.on_failure.clone())))
    }

    /// The pool name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The config the pool started with: its settings beyond membership
    /// (which only a restart changes). Its membership may be out of date:
    /// see [`Pool::config`].
    pub fn spec(&self) -> &PoolConfig {
        &self.spec
    }

    /// What its server connections are made with.
    pub fn backend(&self) -> &BackendSettings {
        &self.backend
    }

    /// Copies of each key (`replicas`, at least 1).
    pub fn replicas(&self) -> usize {
        self.spec.replicas.max(1) as usize
    }

    /// Whether a key whose server failed goes to its next candidate
    /// (`failover: next`, or replicas).
    pub fn fails_over(&self) -> bool {
        self.spec.failover || self.replicas() > 1
    }

    /// Writes and warm-up copies in flight.
    pub fn writes(&self) -> &KeyWrites {
        &self.writes
    }

    /// Counters of events that are not per request.
    pub fn events(&self) -> &PoolEvents {
        &self.events
    }

    /// The workers the pool's connections run on.
    pub fn workers(&self) -> &Arc<Workers> {
        &self.workers
    }

    /// The calling worker's counters.
    pub fn counters(&self) -> &PoolCounters {
        self.counters.local()
    }

    /// Client connections open now.
    pub fn open_connections(&self) -> u64 {
        self.counters.all().fold(0u64, |n, c| n.wrapping_add(c.curr_connections.load(Relaxed)))
    }

    /// Every worker's counters (for a connection's drop guard).
    pub(crate) fn all_counters(&self) -> &Arc<PerWorker<PoolCounters>> {
        &self.counters
    }

    /// Swaps a new state in: every worker's copy, then the shared one.
    /// Called under the config lock only (every change holds it), so two
    /// states are never swapped in at once (which could leave copies
    /// apart).
    ///
    /// The `migrating` flag is set before any copy has a migration and
    /// cleared after none has, so that a request that finds it clear
    /// meets a migration only if one began after it looked (and
    /// [`Pool::acquire_under`] sends it back to decide again).
    fn store(&self, state: Arc<PoolState>) {
        self.warming.store(!state.previous.is_empty(), Relaxed);
        let migrating = state.migration.is_some();
        if migrating {
            self.migrating.store(true, Relaxed);
        }
        for local in self.local.all() {
            *local.lock() = state.clone();
        }
        self.state.store(state);
        if !migrating {
            self.migrating.store(false, Relaxed);
        }
    }

    /// Whether a migration is in progress (one relaxed load: the requests'
    /// fast path asks it first).
    pub fn migrating(&self) -> bool {
        self.migrating.load(Relaxed)
    }

    /// Whether a warm-up window is open (one relaxed load: the requests'
    /// fast path asks it first).
    pub fn warming(&self) -> bool {
        self.warming.load(Relaxed)
    }

    /// The current state (lock-free).
    pub(crate) fn state(&self) -> arc_swap::Guard<Arc<PoolState>> {
        self.state.load()
    }

    /// The pool's config as it is now (changes applied).
    pub fn config(&self) -> PoolConfig {
        self.lock().clone()
    }

    /// The placement settings (distribution, hash, ...).
    pub fn distribution(&self) -> Distribution {
        self.lock().distribution
    }

    /// Every counter of the pool and its servers, now.
    pub fn stats(&self) -> PoolSnapshot {
        let state = self.state();
        let groups = self.locator.as_ref().map(|l| l.views()).unwrap_or_default();
        let per_worker = crate::stats::sum(self.counters.all().map(PoolCounters::values));
        let (served, presented) = self.tls.expiry();
        let expiry = [
            (
                served,
                "tls_cert_expiry_seconds",
                "Seconds until the certificate served to clients (tls_cert) expires (0: expired).",
            ),
            (
                presented,
                "server_tls_cert_expiry_seconds",
                "Seconds until the client certificate presented to servers (server_tls_cert) expires (0: expired).",
            ),
        ];
        let expiry = expiry.into_iter().filter_map(|(left, name, help)| {
            left.map(|s| (crate::stats::Desc { name, kind: crate::stats::Kind::Gauge, help }, s.max(0) as u64))
        });
        let limit = crate::stats::Desc {
            name: "client_connections_limit",
            kind: crate::stats::Kind::Gauge,
            help: "The pool's client_connections: most client connections it accepts (0: no limit).",
        };
        let counters = described(PoolCounters::DESCS, per_worker)
            .chain(described(PoolEvents::DESCS, self.events.values()))
            .chain([(limit, u64::from(self.spec.client_connections))])
            .chain(expiry)
            .chain(state.migration.as_deref().map(migration::numbers).unwrap_or_default());
        PoolSnapshot {
            name: self.name.clone(),
            listen: self.spec.listen.clone(),
            distribution: self.distribution().name(),
            protocol: self.protocol,
            live_servers: state.live().count(),
            counters: counters.collect(),
            version: state.version.clone(),
            fingerprint: state.fingerprint.clone(),
            migration: state.migration.as_deref().map(migration::view),
            locally_ejected: state
                .members
                .iter()
                .filter(|m| matches!(m.ejected, Some(Ejection::Auto(_))) || m.server.health().is_failed_over())
                .map(|m| m.line.id.clone())
                .collect(),
            servers: state
                .members
                .iter()
                .map(|m| ServerSnapshot {
                    id: m.line.id.clone(),
                    weight: m.line.weight,
                    name: m.line.name.clone(),
                    address: m.server.address().to_string(),
                    state: m.state(),
                    counters: m.server.counter_values(),
                    latency: m.server.latency(),
                    group: groups.get(&m.line.id).cloned(),
                })
                .collect(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolConfig> {
        self.config.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state this worker routes requests by: the one
    /// [`Pool::acquire_under`] routes with, so that a request decides where
    /// its keys are (a migration's moves) by the same state.
    pub(crate) fn routing_state(&self) -> Arc<PoolState> {
        self.local.local().lock().clone()
    }

    /// [`Pool::routing_state`] without a reference of its own (no count
    /// shared with the other workers touched), for a request's routing:
    /// let go before the request waits for anything.
    pub(crate) fn routing_guard(&self) -> parking_lot::MutexGuard<'_, Arc<PoolState>> {
        self.local.local().lock()
    }

    /// The server for `key`, holding one unit of load on it until the
    /// returned guard drops when the pool bounds loads (`distribution:
    /// bounded`); other placements take no load.
    pub fn acquire(self: &Arc<Self>, key: &[u8]) -> Option<Acquired> {
        self.acquire_in(&self.local.local().lock(), key)
    }

    /// [`Pool::acquire`], for a request that decided where its key is
    /// by `decided` (the state it moved its keys by, or `None`: no
    /// migration): `Err` when this worker's state is not one it may be
    /// routed by ([`routes_as_decided`]; a change came since), and the
    /// request must decide again. Routing a key by another placement than
    /// its moves were decided by could send it where its data is not.
    pub(crate) fn acquire_under(
        self: &Arc<Self>,
        key: &[u8],
        decided: Option<&Arc<PoolState>>,
    ) -> Result<Option<Acquired>, Changed> {
        let state = self.local.local().lock();
        if !routes_as_decided(&state, decided) {
            return Err(Changed);
        }
        Ok(self.acquire_in(&state, key))
    }

    fn acquire_in(self: &Arc<Self>, state: &PoolState, key: &[u8]) -> Option<Acquired> {
        let Some((bounded, snapshot, to_member)) = state.bounded() else {
            if self.replicas() > 1 && self.spec.read_random {
                let replicas = state.candidates(key, self.replicas());
                return Some((replicas[(next_random() % replicas.len() as u64) as usize].clone(), None));
            }
            return state.server_for(key).map(|s| (s.clone(), None));
        };
        // Each server's load lives in its Server, which every placement of
        // the pool shares: a change made while requests hold load leaves
        // nothing behind.
        let load_of = |node: usize| &state.members[to_member[node]].server.events.load;
        let node = bounded.acquire_hash_in(snapshot.key_hash(key), load_of, &self.events.load)?;
        let server = state.members[to_member[node]].server.clone();
        Some((server.clone(), Some(LoadRelease { pool: self.clone(), server })))
    }

    /// The servers a write of `key` goes to: its first `replicas`
    /// candidates that are not failed over.
    pub fn replicas_for(&self, key: &[u8]) -> Vec<Arc<Server>> {
        self.state.load().candidates(key, self.replicas())
    }

    /// With `failover: next` or replicas: the first of `key`'s candidates
    /// not tried yet (and not failed over), for a request its server could
    /// not take. `None` otherwise.
    pub fn next_candidate(&self, key: &[u8], tried: &[Arc<Server>]) -> Option<Arc<Server>> {
        if !self.fails_over() {
            return None;
        }
        let state = self.state.load();
        let all = state.members.len();
        state.candidates(key, all).into_iter().find(|s| !tried.iter().any(|t| Arc::ptr_eq(s, t)))
    }

    /// Its TLS (reloadable without a restart).
    /// The pool-wide state of its protocol, made by `init` when first
    /// asked for; `None` if another type was made first.
    pub(crate) fn extension<T: std::any::Any + Send + Sync>(
        self: &Arc<Self>,
        init: impl FnOnce(&Arc<Pool>) -> Arc<T>,
    ) -> Option<Arc<T>> {
        let any = self.extension.get_or_init(|| init(self) as Arc<dyn std::any::Any + Send + Sync>);
        any.clone().downcast::<T>().ok()
    }

    pub(crate) fn tls(&self) -> &Arc<crate::tls::LiveTls> {
        &self.tls
    }

    /// What finds its servers, when its protocol looks them up.
    pub(crate) fn locator(&self) -> Option<&Arc<dyn Locator>> {
        self.locator.as_ref()
    }

    /// The protocol its servers speak (`memcached`, `redis`).
    pub fn protocol(&self) -> &'static str {
        self.protocol
    }
}

/// Load held on a server of a `bounded` pool; given back on drop.
pub struct LoadRelease {
    pool: Arc<Pool>,
    server: Arc<Server>,
}

impl Drop for LoadRelease {
    fn drop(&mut self) {
        let give_back = |c: &AtomicU64| {
            let _ = c.fetch_update(Relaxed, Relaxed, |v| v.checked_sub(1));
        };
        give_back(&self.server.events.load);
        give_back(&self.pool.events.load);
    }
}

/// Where a server is reached: its address override, else its id, which
/// must then be `HOST:PORT` or a socket path.
fn address_of(line: &ServerLine, addresses: &HashMap<String, Address>, pool: &str) -> Result<Address, PoolError> {
    if let Some(a) = addresses.get(&line.id) {
        return Ok(a.clone());
    }
    let address = Address::of_id(&line.id);
    let reachable = match &address {
        Address::Tcp(a) => {
            a.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
        }
        _ => true,
    };
    if reachable {
        Ok(address)
    } else {
        Err(PoolError::BadAddress { pool: pool.to_owned(), line: line.to_string() })
    }
}

/// Checks that every server of `config` names an address the proxy can
/// connect to (the `-t` check; pools also check when they start).
///
/// # Errors
/// [`PoolError::BadAddress`] for the first that does not.
pub fn check_servers(config: &PoolConfig) -> Result<(), PoolError> {
    if config.sentinel.is_some() {
        // Its lines name Sentinel groups, looked up when the pool starts.
        return Ok(());
    }
    for line in &config.servers {
        address_of(line, &HashMap::new(), &config.name)?;
    }
    Ok(())
}

fn find(members: &[Member], id: &str, pool: &str) -> Result<usize, PoolError> {
    members
        .iter()
        .position(|m| m.line.id == id)
        .ok_or_else(|| PoolError::UnknownServer { pool: pool.to_owned(), id: id.to_owned() })
}
