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

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use arc_swap::ArcSwap;
use chash::{AnyPlacement, Distribution, PoolConfig, Snapshot};
use chash::{Edit, LineState, ServerLine};

use crate::backend::{Address, BackendSettings, FailureHook, Server, Setup};
use crate::stats::{described, PerWorker, PoolCounters, PoolEvents, PoolSnapshot, ServerSnapshot};
use crate::workers::Workers;

/// A pool's settings beyond placement, with twemproxy's defaults.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    /// Address to listen on (`listen`).
    pub listen: String,
    /// Server connection settings.
    pub backend: BackendSettings,
    /// Eject failing servers (`auto_eject_hosts`, default false).
    pub auto_eject: bool,
    /// How long an ejected server stays out (`server_retry_timeout`, default 30 s).
    pub retry_timeout: Duration,
    /// Maximum client connections, 0 for no limit (`client_connections`).
    pub client_connections: u64,
    /// Listen backlog (`backlog`, default 512).
    pub backlog: u32,
    /// Whether the pool speaks Redis (`redis`).
    pub redis: bool,
    /// Password clients must send with `AUTH` (`redis_auth`).
    pub redis_auth: Option<String>,
    /// The database clients may `SELECT` (`redis_db`, default 0).
    pub redis_db: u32,
    /// TTL of warm-up copies whose server did not tell one (`warmup_ttl`).
    pub warmup_ttl: u32,
    /// Copies of each key (`replicas`).
    pub replicas: usize,
    /// Reads go to any healthy replica (`read: random`).
    pub read_random: bool,
    /// Unreachable servers' keys go to their next candidates (`failover: next`).
    pub failover: bool,
}

impl PoolSettings {
    /// The settings a pool's config asks for; `dialects` are what its
    /// server connections speak, each with what they run first.
    pub fn of(pool: &PoolConfig, dialects: Vec<Option<Setup>>) -> PoolSettings {
        PoolSettings {
            listen: pool.listen.clone(),
            backend: BackendSettings {
                connections: pool.server_connections as usize,
                timeout: pool.timeout,
                preconnect: pool.preconnect,
                failure_limit: pool.server_failure_limit,
                dialects: if dialects.is_empty() { vec![None] } else { dialects },
            },
            auto_eject: pool.auto_eject_hosts,
            retry_timeout: pool.server_retry_timeout,
            client_connections: u64::from(pool.client_connections),
            backlog: pool.backlog,
            redis: pool.redis,
            redis_auth: pool.redis_auth.clone(),
            redis_db: pool.redis_db,
            warmup_ttl: pool.warmup_ttl,
            replicas: pool.replicas.max(1) as usize,
            read_random: pool.read_random,
            failover: pool.failover,
        }
    }
}

/// Why a server is not taking keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ejection {
    /// Ejected by health (`auto_eject_hosts`) until then.
    Auto(Instant),
    /// Ejected by the admin endpoint until restored.
    Admin,
}

/// One configured server of the pool.
#[derive(Clone, Debug)]
pub struct Member {
    /// The server line as configured now (weight included).
    pub line: ServerLine,
    /// The running server.
    pub server: Arc<Server>,
    /// Set while the server is ejected.
    pub ejected: Option<Ejection>,
}

impl Member {
    /// `up`, `down`, `ejected` or `auto-ejected`.
    pub fn state(&self) -> &'static str {
        match self.ejected {
            Some(Ejection::Admin) => "ejected",
            Some(Ejection::Auto(_)) => "auto-ejected",
            None if self.server.health().is_failed_over() => "failed-over",
            None if self.server.is_down() => "down",
            None => "up",
        }
    }
}

/// Where keys go: the placement over the live servers.
// Held in an `Arc`, so the variants' sizes cost nothing per request; boxing
// the snapshot would add a pointer chase to every lookup.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Routing {
    /// A placement; `to_member[i]` is the member behind node `i`.
    Placed {
        /// The placement.
        snapshot: Snapshot,
        /// Node index to member index.
        to_member: Vec<usize>,
    },
    /// twemproxy's `random`: any live member.
    Random(Vec<usize>),
}

/// An immutable view of the pool: members and routing.
#[derive(Debug)]
pub struct PoolState {
    /// Every member (active and ejected server), in config order.
    pub members: Vec<Member>,
    /// `None` when no server is live.
    pub routing: Option<Arc<Routing>>,
    /// The config's placement, before health ejections (`None` for random).
    pub model: Option<Snapshot>,
    /// [`PoolConfig::version`] of the config.
    pub version: String,
    /// The config placement's [fingerprint](Snapshot::fingerprint).
    pub fingerprint: String,
    /// Placements recent membership changes replaced, newest first, while
    /// they are warm-up sources (`warmup`, or a drain's window).
    pub previous: Vec<Arc<Previous>>,
    /// Keys of failed-over servers go to their next candidates
    /// (`failover: next`, replicas).
    pub failover: bool,
}

/// A placement a membership change replaced, kept as a warm-up source:
/// a read that misses on a key's server is tried on the key's server
/// here, and writes of the key delete it here, until `until`. Holds the
/// servers, so a removed server's connections stay open until then.
#[derive(Debug)]
pub struct Previous {
    routing: Arc<Routing>,
    /// By member index, each with the end of its window here: a server a
    /// later change removed with a shorter window of its own ends earlier
    /// (`None` once its window is over, so its connections close).
    servers: Vec<Option<(Arc<Server>, Instant)>>,
    /// When it stops being a source.
    pub until: Instant,
}

impl Previous {
    /// The key's server under this placement.
    pub fn server_for(&self, key: &[u8]) -> Option<&Arc<Server>> {
        match &self.servers[self.routing.member_for(key)?] {
            Some((server, until)) if *until > Instant::now() => Some(server),
            _ => None,
        }
    }

    /// This source without the servers whose window ended by `at`; `None`
    /// when nothing changes.
    fn pruned(&self, at: Instant) -> Option<Previous> {
        if !self.servers.iter().flatten().any(|(_, until)| *until <= at) {
            return None;
        }
        let servers = self.servers.iter().map(|slot| slot.clone().filter(|(_, until)| *until > at)).collect();
        Some(Previous { routing: self.routing.clone(), servers, until: self.until })
    }
}

impl Routing {
    /// The index of `key`'s member (any member, for random).
    #[inline]
    fn member_for(&self, key: &[u8]) -> Option<usize> {
        Some(match self {
            Routing::Placed { snapshot, to_member } => to_member[snapshot.route_index(key)?],
            Routing::Random(live) => live[(next_random() % live.len() as u64) as usize],
        })
    }
}

static RANDOM: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);

fn next_random() -> u64 {
    // splitmix64 over a shared counter: good enough to spread requests.
    let mut z = RANDOM.fetch_add(0x9e37_79b9_7f4a_7c15, Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl PoolState {
    /// The server for `key`, or `None` when no server is live.
    #[inline]
    pub fn server_for(&self, key: &[u8]) -> Option<&Arc<Server>> {
        let owner = &self.members[self.routing.as_ref()?.member_for(key)?].server;
        if self.failover && owner.health().is_failed_over() {
            return self.next_up(key).or(Some(owner));
        }
        Some(owner)
    }

    /// The first of `key`'s candidates that is not failed over.
    fn next_up(&self, key: &[u8]) -> Option<&Arc<Server>> {
        self.candidate_servers(key).find(|s| !s.health().is_failed_over())
    }

    /// `key`'s servers in its placement's candidate order (a server again
    /// where the placement repeats it; none for random).
    fn candidate_servers<'a>(&'a self, key: &[u8]) -> impl Iterator<Item = &'a Arc<Server>> + use<'a> {
        use chash::Placement as _;
        let placed = match self.routing.as_deref() {
            Some(Routing::Placed { snapshot, to_member }) => Some((snapshot, to_member, snapshot.key_hash(key))),
            _ => None,
        };
        placed.into_iter().flat_map(move |(snapshot, to_member, hash)| {
            snapshot.placement().candidates_hash(hash).map(move |node| &self.members[to_member[node]].server)
        })
    }

    /// The servers that held `key` under the placements still warming up
    /// (newest first, each once), other than `now` and servers that are
    /// down: where a read that missed on `now` may find it, and where a
    /// write of it must delete it. Empty (and free) outside a window.
    pub fn previous_servers(&self, key: &[u8], now: &Arc<Server>) -> Vec<Arc<Server>> {
        let mut out: Vec<Arc<Server>> = Vec::new();
        if self.previous.is_empty() {
            return out;
        }
        let at = Instant::now();
        for p in self.previous.iter().filter(|p| p.until > at) {
            if let Some(s) = p.server_for(key) {
                if !Arc::ptr_eq(s, now) && !s.is_down() && !out.iter().any(|o| Arc::ptr_eq(o, s)) {
                    out.push(s.clone());
                }
            }
        }
        out
    }

    /// Up to `n` distinct servers for `key` in its placement's candidate
    /// order, servers failed over left out (none left: the owner).
    pub fn candidates(&self, key: &[u8], n: usize) -> Vec<Arc<Server>> {
        let mut out: Vec<Arc<Server>> = Vec::new();
        for server in self.candidate_servers(key) {
            if !server.health().is_failed_over() && !out.iter().any(|s| Arc::ptr_eq(s, server)) {
                out.push(server.clone());
                if out.len() == n {
                    break;
                }
            }
        }
        if out.is_empty() {
            // Random, or every candidate failed over: the owner.
            let owner = self.routing.as_deref().and_then(|r| r.member_for(key));
            out.extend(owner.map(|m| self.members[m].server.clone()));
        }
        out
    }

    /// Members taking keys now.
    pub fn live(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|m| m.ejected.is_none())
    }

    /// The placement when it bounds loads (`distribution: bounded`).
    fn bounded(&self) -> Option<(&chash::algo::Bounded, &Snapshot, &[usize])> {
        match self.routing.as_deref() {
            Some(Routing::Placed { snapshot, to_member }) => match snapshot.placement() {
                AnyPlacement::Bounded(b) => Some((b, snapshot, to_member)),
                _ => None,
            },
            _ => None,
        }
    }
}

/// What a membership change did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Change {
    /// What was done.
    pub change: String,
    /// Share of the key space that now goes to another server.
    pub moved_fraction: f64,
    /// Servers taking keys after the change.
    pub live_servers: usize,
    /// Whether the change was written to the config file (`--persist`).
    pub persisted: bool,
    /// The membership version after the change.
    pub version: String,
    /// The placement fingerprint after the change.
    pub fingerprint: String,
    /// Seconds the placement before the change stays a warm-up source
    /// (`warmup`, or a drain); 0 when none.
    pub warmup_seconds: u64,
}

/// Writes a pool's membership edit to the config file (`--persist`):
/// `(pool, edit, config before, config after)`, or why it could not.
pub type Persist<'a> = dyn Fn(&str, &Edit, &PoolConfig, &PoolConfig) -> Result<(), String> + Send + Sync + 'a;

/// Why a change to a pool was refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum PoolError {
    /// The servers cannot be placed (duplicate ids, weights the
    /// distribution refuses, ...).
    Placement {
        /// The pool.
        pool: String,
        /// Why.
        source: chash::Error,
    },
    /// A server line that does not parse.
    ServerLine(chash::Error),
    /// The server is already in the pool.
    DuplicateServer {
        /// The pool.
        pool: String,
        /// The server id.
        id: String,
    },
    /// No server with that id.
    UnknownServer {
        /// The pool.
        pool: String,
        /// The server id.
        id: String,
    },
    /// Weight 0.
    ZeroWeight,
    /// Nothing to do (the server is already ejected).
    AlreadyEjected(String),
    /// A server whose id is not an address the proxy can reach.
    BadAddress {
        /// The pool.
        pool: String,
        /// The server line.
        line: String,
    },
    /// No pool by that name.
    UnknownPool(String),
    /// The change could not be written to the config file; nothing changed.
    Persist {
        /// The pool.
        pool: String,
        /// Why.
        why: String,
    },
    /// A change that takes effect only after a restart (a new pool, a
    /// pool gone from the config).
    NeedsRestart {
        /// The pool.
        pool: String,
        /// What changed.
        what: &'static str,
    },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::Placement { pool, source } => {
                // The library's message may name the pool already.
                let text = source.to_string();
                if text.contains(&format!("pool {pool}")) {
                    f.write_str(&text)
                } else {
                    write!(f, "pool {pool:?}: {text}")
                }
            }
            PoolError::ServerLine(e) => write!(f, "{e}"),
            PoolError::DuplicateServer { pool, id } => write!(f, "server {id:?} is already in pool {pool:?}"),
            PoolError::UnknownServer { pool, id } => write!(f, "no server {id:?} in pool {pool:?}"),
            PoolError::ZeroWeight => f.write_str("weight 0: weights start at 1"),
            PoolError::AlreadyEjected(id) => write!(f, "server {id:?} is already ejected"),
            PoolError::BadAddress { pool, line } => write!(
                f,
                "pool {pool:?}: server {line:?} names no HOST:PORT to connect to (a server line is \
                 HOST:PORT:WEIGHT [NAME] or /socket/path:WEIGHT [NAME], e.g. 127.0.0.1:11211:1)"
            ),
            PoolError::NeedsRestart { pool, what } => write!(f, "pool {pool:?}: {what}"),
            PoolError::UnknownPool(pool) => write!(f, "no pool {pool:?}"),
            PoolError::Persist { pool, why } => {
                write!(f, "pool {pool:?}: not changed, because the config file could not be updated: {why}")
            }
        }
    }
}

/// Each message already says why (its cause included), so no separate
/// `source()`: printed as a chain, the cause would appear twice.
impl std::error::Error for PoolError {}

/// A pool of servers.
pub struct Pool {
    /// The pool name.
    pub name: String,
    /// Its settings.
    pub settings: PoolSettings,
    config: Mutex<PoolConfig>,
    addresses: HashMap<String, Address>,
    state: ArcSwap<PoolState>,
    on_failure: FailureHook,
    workers: Arc<Workers>,
    counters: Arc<PerWorker<PoolCounters>>,
    /// Writes and warm-up copies in flight (used during warm-up windows).
    pub writes: KeyWrites,
    /// How failed-over servers are probed, and what they get before they
    /// are taken back.
    probe: std::sync::OnceLock<(Setup, Option<Setup>)>,
    /// Set while the state has warm-up sources.
    warming: std::sync::atomic::AtomicBool,
    /// Counters of events that are not per request.
    pub events: PoolEvents,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool").field("name", &self.name).finish()
    }
}

impl Pool {
    /// Starts a pool's servers (their connections on `workers`) and its
    /// health task. `addresses` maps server ids to where they are reached
    /// when that is not the id itself; `dialects` are what every server
    /// connection runs first. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// When the config cannot place keys (for example duplicate server ids).
    pub fn start(
        config: PoolConfig,
        addresses: HashMap<String, Address>,
        workers: Arc<Workers>,
        dialects: Vec<Option<Setup>>,
    ) -> Result<Arc<Pool>, PoolError> {
        let settings = PoolSettings::of(&config, dialects);
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
            let address = address_of(line, &addresses, &config.name)?;
            let server = Server::start(&workers, line.clone(), address, &settings.backend, Some(on_failure.clone()));
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
        };
        let pool = Arc::new(Pool {
            name: config.name.clone(),
            settings,
            config: Mutex::new(config.clone()),
            addresses,
            state: ArcSwap::from_pointee(placeholder),
            on_failure,
            counters: Arc::new(PerWorker::new(workers.count())),
            writes: KeyWrites::default(),
            probe: std::sync::OnceLock::new(),
            warming: std::sync::atomic::AtomicBool::new(false),
            workers,
            events: PoolEvents::default(),
        });
        pool.state.store(Arc::new(pool.state_for(&config, members)?));
        let _ = cell.set(Arc::downgrade(&pool));
        tokio::spawn(retry_task(Arc::downgrade(&pool)));
        Ok(pool)
    }

    fn start_server(&self, line: ServerLine) -> Result<Arc<Server>, PoolError> {
        let address = address_of(&line, &self.addresses, &self.name)?;
        Ok(Server::start(&self.workers, line, address, &self.settings.backend, Some(self.on_failure.clone())))
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

    /// Swaps a new state in.
    fn store(&self, state: Arc<PoolState>) {
        self.warming.store(!state.previous.is_empty(), Relaxed);
        self.state.store(state);
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
        let per_worker = crate::stats::sum(self.counters.all().map(PoolCounters::values));
        let counters =
            described(PoolCounters::DESCS, per_worker).chain(described(PoolEvents::DESCS, self.events.values()));
        PoolSnapshot {
            name: self.name.clone(),
            listen: self.settings.listen.clone(),
            distribution: self.distribution().name(),
            redis: self.settings.redis,
            live_servers: state.live().count(),
            counters: counters.collect(),
            version: state.version.clone(),
            fingerprint: state.fingerprint.clone(),
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
                })
                .collect(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolConfig> {
        self.config.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies a membership edit: the pool's config changes by
    /// [`PoolConfig::apply`] (the same change the config file gets), the
    /// placement is built from the new config, and it is swapped in.
    /// `persist` writes the change to the config file first; when it fails
    /// nothing changes.
    ///
    /// # Errors
    /// An edit the pool refuses ([`PoolConfig::apply`]), a server that
    /// cannot be reached, or the file write's error.
    pub fn edit(&self, edit: &Edit, persist: Option<&Persist<'_>>) -> Result<Change, PoolError> {
        self.edit_draining(edit, persist, None)
    }

    /// As [`Pool::edit`], the old placement staying a warm-up source for
    /// `drain` (instead of the pool's `warmup`): a removed server stops
    /// owning keys at once, reads that miss on their new server are tried
    /// on it, and its connections close when the window ends.
    ///
    /// # Errors
    /// As [`Pool::edit`].
    pub fn edit_draining(
        &self,
        edit: &Edit,
        persist: Option<&Persist<'_>>,
        drain: Option<Duration>,
    ) -> Result<Change, PoolError> {
        let mut config = self.lock();
        let old = self.state.load_full();
        let (next, _) =
            config.apply(edit).map_err(|source| PoolError::Placement { pool: self.name.clone(), source })?;
        let members = self.members_for(&next, &old.members)?;
        let new = self.state_for(&next, members)?;
        let persisted = match persist {
            Some(write) => {
                write(&self.name, edit, &config, &next)
                    .map_err(|why| PoolError::Persist { pool: self.name.clone(), why })?;
                true
            }
            None => false,
        };
        *config = next;
        let window = drain.unwrap_or(config.warmup);
        let mut change = self.swap(edit.to_string(), Measure::Always, &old, new, config, Some(window));
        change.persisted = persisted;
        if !persisted {
            tracing::info!(pool = %self.name, "{}: not persisted (the config file still has the old membership)", change.change);
        }
        Ok(change)
    }

    /// Adds a server (in memory only; see [`Pool::edit`]).
    ///
    /// # Errors
    /// As [`Pool::edit`].
    pub fn add_server(&self, line: ServerLine) -> Result<Change, PoolError> {
        self.edit(&Edit::Add(line), None)
    }

    /// Removes a server; requests already sent to it complete.
    ///
    /// # Errors
    /// As [`Pool::edit`].
    pub fn remove_server(&self, id: &str) -> Result<Change, PoolError> {
        self.edit(&Edit::Remove(id.to_owned()), None)
    }

    /// Changes a server's weight.
    ///
    /// # Errors
    /// As [`Pool::edit`].
    pub fn set_weight(&self, id: &str, weight: u32) -> Result<Change, PoolError> {
        self.edit(&Edit::Weight(id.to_owned(), weight), None)
    }

    /// Ejects a server until [`restore`](Pool::restore) (its keys move to the others).
    ///
    /// # Errors
    /// As [`Pool::edit`].
    pub fn eject(&self, id: &str) -> Result<Change, PoolError> {
        self.edit(&Edit::Eject(id.to_owned()), None)
    }

    /// Brings an ejected server back.
    ///
    /// # Errors
    /// As [`Pool::edit`].
    pub fn restore(&self, id: &str) -> Result<Change, PoolError> {
        self.edit(&Edit::Restore(id.to_owned()), None)
    }

    /// Replaces the pool's placement settings and servers with a reloaded
    /// config (the listen address and connection settings stay until a
    /// restart). Servers with the same id keep their connections.
    ///
    /// # Errors
    /// A file that renumbers an order-dependent placement
    /// ([`PoolConfig::check_reload`]) or a placement that cannot be built;
    /// the pool is then unchanged.
    pub fn reload(&self, new: PoolConfig) -> Result<Change, PoolError> {
        self.reload_checked(new, true)
    }

    /// As [`Pool::reload`], without refusing a config that renumbers an
    /// order-dependent placement: for a config stored elsewhere (etcd),
    /// which every proxy applies as a fresh build, whatever revisions it
    /// missed.
    ///
    /// # Errors
    /// A placement that cannot be built; the pool is then unchanged.
    pub fn reload_stored(&self, new: PoolConfig) -> Result<Change, PoolError> {
        self.reload_checked(new, false)
    }

    fn reload_checked(&self, new: PoolConfig, check: bool) -> Result<Change, PoolError> {
        let mut config = self.lock();
        let old = self.state.load_full();
        let err = |source| PoolError::Placement { pool: self.name.clone(), source };
        if check {
            config.check_reload(&new).map_err(err)?;
        }
        let members = self.members_for(&new, &old.members)?;
        let state = self.state_for(&new, members)?;
        // Servers this reload removes that the file drains: their window.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let drain = new
            .drain
            .iter()
            .filter(|(id, _)| config.members().any(|l| l.id == *id) && !new.members().any(|l| l.id == *id))
            .map(|(_, until)| Duration::from_secs(*until).saturating_sub(now))
            .max()
            .unwrap_or_default();
        *config = new;
        let window = config.warmup.max(drain);
        Ok(self.swap("reloaded the config".into(), Measure::Always, &old, state, config, Some(window)))
    }

    /// The members of `config` (its active and ejected servers): the
    /// running servers of `old` kept by id, new ones started; health
    /// ejections of servers that still take keys carried over.
    fn members_for(&self, config: &PoolConfig, old: &[Member]) -> Result<Vec<Member>, PoolError> {
        let mut members = Vec::new();
        for line in config.members() {
            let before = old.iter().find(|m| m.line.id == line.id);
            let server = match before {
                Some(m) => m.server.clone(),
                None => self.start_server(line.clone())?,
            };
            let ejected = match (line.state, before.and_then(|m| m.ejected)) {
                (LineState::Active, Some(Ejection::Auto(t))) => Some(Ejection::Auto(t)),
                (LineState::Active, _) => None,
                _ => Some(Ejection::Admin),
            };
            members.push(Member { line: line.clone(), server, ejected });
        }
        Ok(members)
    }

    /// The state for `config` and `members`: the config's placement, then
    /// without the servers health has ejected.
    fn state_for(&self, config: &PoolConfig, members: Vec<Member>) -> Result<PoolState, PoolError> {
        let err = |source| PoolError::Placement { pool: self.name.clone(), source };
        let model = match config.distribution {
            Distribution::Random => None,
            _ => Some(config.snapshot().map_err(err)?),
        };
        let routing = routing_of(config, model.as_ref(), &members)?;
        let fingerprint = model.as_ref().map_or_else(|| "random".to_owned(), Snapshot::fingerprint);
        let failover = self.settings.failover || self.settings.replicas > 1;
        Ok(PoolState {
            members,
            routing,
            model,
            version: config.version(),
            fingerprint,
            previous: Vec::new(),
            failover,
        })
    }

    /// Swaps `new` in (`config`, the change lock, held until then), counts
    /// and logs the change and what it moved.
    fn swap(
        &self,
        what: String,
        measure: Measure,
        old: &PoolState,
        mut new: PoolState,
        config: std::sync::MutexGuard<'_, PoolConfig>,
        window: Option<Duration>,
    ) -> Change {
        if let Some(window) = window {
            // A membership change: the old placement warms the new one up.
            new.previous = warm_sources(old, &new.members, window);
        }
        let warmup_seconds = window.unwrap_or_default().as_secs();
        let live_servers = new.live().count();
        let (version, fingerprint) = (new.version.clone(), new.fingerprint.clone());
        let new = Arc::new(new);
        self.store(new.clone());
        drop(config);
        self.events.membership_changes.fetch_add(1, Relaxed);
        let moved_fraction = moved_fraction(old, &new, measure);
        tracing::info!(pool = %self.name, moved = format!("{:.4}", moved_fraction), live_servers, version = %version, "{what}");
        if warmup_seconds > 0 {
            tracing::info!(pool = %self.name, "the placement before `{what}` serves reads that miss for {warmup_seconds} s");
        }
        Change { change: what, moved_fraction, live_servers, persisted: false, version, fingerprint, warmup_seconds }
    }

    /// A health change: the members' ejections as `mark` sets them, the
    /// routing the placement without the servers health ejected (the
    /// config, its version and fingerprint stay).
    fn health_change(
        &self,
        what: String,
        mark: impl FnOnce(&mut Vec<Member>) -> Result<(), PoolError>,
    ) -> Result<Change, PoolError> {
        let config = self.lock();
        let old = self.state.load_full();
        let mut members = old.members.clone();
        mark(&mut members)?;
        let routing = routing_of(&config, old.model.as_ref(), &members)?;
        let new = PoolState {
            members,
            routing,
            model: old.model.clone(),
            version: old.version.clone(),
            fingerprint: old.fingerprint.clone(),
            previous: unexpired(&old.previous),
            failover: old.failover,
        };
        // On a connection's thread: only an exact (cheap) measure of what
        // moved, no sampling.
        Ok(self.swap(what, Measure::ExactOnly, &old, new, config, None))
    }

    /// The server for `key`, holding one unit of load on it until the
    /// returned guard drops when the pool bounds loads (`distribution:
    /// bounded`); other placements take no load.
    pub fn acquire(self: &Arc<Self>, key: &[u8]) -> Option<(Arc<Server>, Option<LoadRelease>)> {
        let state = self.state.load();
        let Some((bounded, snapshot, to_member)) = state.bounded() else {
            let s = &self.settings;
            if s.replicas > 1 && s.read_random {
                let replicas = state.candidates(key, s.replicas);
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

    /// Forgets warm-up sources whose window has passed (their servers'
    /// connections close when nothing else holds them).
    fn prune_previous(&self) {
        let at = Instant::now();
        let due = |p: &Arc<Previous>| p.until <= at || p.servers.iter().flatten().any(|(_, until)| *until <= at);
        if !self.state.load().previous.iter().any(due) {
            return;
        }
        let _config = self.lock();
        let old = self.state.load_full();
        let new = PoolState {
            members: old.members.clone(),
            routing: old.routing.clone(),
            model: old.model.clone(),
            version: old.version.clone(),
            fingerprint: old.fingerprint.clone(),
            previous: unexpired(&old.previous).into_iter().map(|p| p.pruned(at).map_or(p, Arc::new)).collect(),
            failover: old.failover,
        };
        self.store(Arc::new(new));
    }

    /// The servers a write of `key` goes to: its first `replicas`
    /// candidates that are not failed over.
    pub fn replicas_for(&self, key: &[u8]) -> Vec<Arc<Server>> {
        self.state.load().candidates(key, self.settings.replicas)
    }

    /// With `failover: next` or replicas: the first of `key`'s candidates
    /// not tried yet (and not failed over), for a request its server could
    /// not take. `None` otherwise.
    pub fn next_candidate(&self, key: &[u8], tried: &[Arc<Server>]) -> Option<Arc<Server>> {
        if !self.settings.failover && self.settings.replicas < 2 {
            return None;
        }
        let state = self.state.load();
        let all = state.members.len();
        state.candidates(key, all).into_iter().find(|s| !tried.iter().any(|t| Arc::ptr_eq(s, t)))
    }

    /// The command a failed-over server is probed with (`version`,
    /// `PING`), and the one it gets before it is taken back (memcached:
    /// `flush_all`, since writes of its keys went to other servers while it
    /// was out): set once, by the protocol the pool speaks.
    pub fn set_probe(&self, probe: Setup, before_return: Option<Setup>) {
        let _ = self.probe.set((probe, before_return));
    }

    /// A server reached its failure limit.
    fn server_failing(self: &Arc<Self>, id: &str) {
        if self.settings.failover || self.settings.replicas > 1 {
            self.fail_over(id);
        } else {
            self.auto_eject(id);
        }
    }

    /// `failover: next` (or replicas): the server's keys go to their next
    /// candidates, the placement unchanged, until it has answered probes
    /// for `server_retry_timeout` in a row.
    fn fail_over(self: &Arc<Self>, id: &str) {
        let state = self.state.load();
        let Some(member) = state.members.iter().find(|m| m.line.id == id) else { return };
        if !member.server.health().fail_over() {
            return;
        }
        self.events.failovers.fetch_add(1, Relaxed);
        tracing::warn!(pool = %self.name, server = id, "failed over: its keys go to their next servers until it is back");
        tokio::spawn(probe_task(Arc::downgrade(self), member.server.clone()));
    }

    fn auto_eject(&self, id: &str) {
        if !self.settings.auto_eject {
            return;
        }
        let until = Instant::now() + self.settings.retry_timeout;
        let what = format!("auto-ejected failing server {id}");
        let result = self.health_change(what, |members| {
            let at = find(members, id, &self.name)?;
            if members[at].ejected.is_some() {
                return Err(PoolError::AlreadyEjected(id.to_owned()));
            }
            members[at].ejected = Some(Ejection::Auto(until));
            let events = &members[at].server.events;
            events.ejections.fetch_add(1, Relaxed);
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            events.ejected_at_us.store(now.as_micros() as u64, Relaxed);
            Ok(())
        });
        match result {
            Ok(_) => {
                self.events.server_ejects.fetch_add(1, Relaxed);
            }
            Err(e) => tracing::debug!(pool = %self.name, server = id, "no ejection: {e}"),
        }
    }

    fn retry_due(&self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .state
            .load()
            .members
            .iter()
            .filter(|m| matches!(m.ejected, Some(Ejection::Auto(t)) if t <= now))
            .map(|m| m.line.id.clone())
            .collect();
        for id in due {
            let what = format!("retrying ejected server {id}");
            let _ = self.health_change(what, |members| {
                let at = find(members, &id, &self.name)?;
                members[at].ejected = None;
                members[at].server.probation();
                Ok(())
            });
        }
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

/// How often a failed-over server is probed.
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// Probes a failed-over server until it has answered every probe for the
/// pool's `server_retry_timeout`, then takes it back (a flapping server
/// stays out); ends when the pool or the server is gone.
async fn probe_task(pool: std::sync::Weak<Pool>, server: Arc<Server>) {
    let requester =
        crate::backend::Requester { affinity: 0, account: crate::backend::ReplyAccount::new(1 << 20), dialect: 0 };
    let mut up_since: Option<Instant> = None;
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        let Some(pool) = pool.upgrade() else { return };
        if !pool.state.load().members.iter().any(|m| Arc::ptr_eq(&m.server, &server)) {
            server.health().recover();
            return;
        }
        let ok = match pool.probe.get() {
            Some((probe, _)) => ask(&server, probe, &requester).await,
            None => !server.is_down(),
        };
        if !ok {
            up_since = None;
            continue;
        }
        let since = *up_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= pool.settings.retry_timeout {
            if let Some((_, Some(before))) = pool.probe.get() {
                if !ask(&server, before, &requester).await {
                    up_since = None;
                    continue;
                }
            }
            server.health().recover();
            tracing::info!(pool = %pool.name, server = %server.id(), "back after failover: answered probes for {:?}", pool.settings.retry_timeout);
            return;
        }
    }
}

/// Sends a probe's (first) command to `server`; whether its reply passed.
async fn ask(server: &Server, probe: &Setup, requester: &crate::backend::Requester) -> bool {
    let request = probe.requests.first().cloned().unwrap_or_default();
    let pending = server.submit(request, probe.framing, requester).await;
    matches!(server.finish(pending).await, Ok(crate::backend::Reply::Whole(r)) if (probe.check)(&r).is_ok())
}

/// Gives auto-ejected servers another chance when their time is up.
async fn retry_task(pool: std::sync::Weak<Pool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        pool.retry_due();
        pool.prune_previous();
    }
}

/// Writes and warm-up copies of keys in flight, by stripe of the key
/// space, so that a copy racing a write of its key can never leave an older
/// value behind (in this proxy): a write marks its stripe while it runs and
/// waits for the copies of the stripe to finish before it is answered; a
/// copy does not start while a write of its stripe runs, and deletes what
/// it copied when a write of its stripe started meanwhile.
#[derive(Debug)]
pub struct KeyWrites {
    generation: Box<[AtomicU64]>,
    writing: Box<[AtomicU64]>,
    copying: Box<[AtomicU64]>,
}

const STRIPES: usize = 4096;

impl Default for KeyWrites {
    fn default() -> KeyWrites {
        let zeros = || (0..STRIPES).map(|_| AtomicU64::new(0)).collect();
        KeyWrites { generation: zeros(), writing: zeros(), copying: zeros() }
    }
}

impl KeyWrites {
    fn stripe(key: &[u8]) -> usize {
        // FNV-1a: any spread will do.
        let h = key.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        (h as usize ^ (h >> 32) as usize) % STRIPES
    }

    /// A write of `key` begins; call [`KeyWrites::end_write`] after its
    /// server (and previous servers) answered, before answering the client.
    pub fn begin_write(&self, key: &[u8]) -> usize {
        let i = Self::stripe(key);
        self.writing[i].fetch_add(1, SeqCst);
        self.generation[i].fetch_add(1, SeqCst);
        i
    }

    /// The write on stripe `i` is done: waits (at most `limit`) for the
    /// copies of its stripe in flight.
    pub async fn end_write(&self, i: usize, limit: Duration) {
        self.generation[i].fetch_add(1, SeqCst);
        self.writing[i].fetch_sub(1, SeqCst);
        let deadline = Instant::now() + limit;
        while self.copying[i].load(SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// A warm-up copy of `key` begins, unless a write of its stripe is
    /// running. Dropping the guard ends it.
    fn try_copy(&self, key: &[u8]) -> Option<CopyGuard<'_>> {
        let i = Self::stripe(key);
        self.copying[i].fetch_add(1, SeqCst);
        let guard = CopyGuard { writes: self, stripe: i, generation: self.generation[i].load(SeqCst) };
        (self.writing[i].load(SeqCst) == 0).then_some(guard)
    }

    /// A warm-up copy of `key` begins once no write of its stripe runs
    /// (waiting at most `limit`). Dropping the guard ends it.
    pub async fn begin_copy(&self, key: &[u8], limit: Duration) -> Option<CopyGuard<'_>> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(guard) = self.try_copy(key) {
                return Some(guard);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// A warm-up copy in flight (see [`KeyWrites`]).
#[derive(Debug)]
pub struct CopyGuard<'a> {
    writes: &'a KeyWrites,
    stripe: usize,
    generation: u64,
}

impl CopyGuard<'_> {
    /// Whether a write of the stripe began since the copy did: what the
    /// copy stored may be older than that write and must go.
    pub fn raced(&self) -> bool {
        self.writes.generation[self.stripe].load(SeqCst) != self.generation
    }
}

impl Drop for CopyGuard<'_> {
    fn drop(&mut self) {
        self.writes.copying[self.stripe].fetch_sub(1, SeqCst);
    }
}

/// Warm-up sources kept at most (older ones are dropped first).
const MAX_PREVIOUS: usize = 8;

/// The warm-up sources of `old` still in their window.
fn unexpired(previous: &[Arc<Previous>]) -> Vec<Arc<Previous>> {
    let at = Instant::now();
    previous.iter().filter(|p| p.until > at).cloned().collect()
}

/// The warm-up sources after a membership change from `old` to `members`:
/// the old placement for `window` (none when zero), then the old sources
/// still in theirs. A server this change removes is a source for this
/// change's window at most, in every source: when it ends, the sources let
/// go of it and its connections close.
fn warm_sources(old: &PoolState, members: &[Member], window: Duration) -> Vec<Arc<Previous>> {
    let now = Instant::now();
    let end = now + window;
    // The servers this change removes (not those earlier changes did).
    let gone: Vec<&Arc<Server>> =
        old.members.iter().map(|m| &m.server).filter(|s| !members.iter().any(|m| Arc::ptr_eq(&m.server, s))).collect();
    let removed = |s: &Arc<Server>| gone.iter().any(|g| Arc::ptr_eq(g, s));
    let mut out = Vec::new();
    if let (false, Some(routing)) = (window.is_zero(), &old.routing) {
        out.push(Arc::new(Previous {
            routing: routing.clone(),
            servers: old.members.iter().map(|m| Some((m.server.clone(), end))).collect(),
            until: end,
        }));
    }
    for p in unexpired(&old.previous) {
        if !p.servers.iter().flatten().any(|(s, until)| removed(s) && *until > end) {
            out.push(p);
            continue;
        }
        let servers = p
            .servers
            .iter()
            .map(|slot| match slot {
                Some((s, until)) if removed(s) => Some((s.clone(), (*until).min(end))).filter(|(_, u)| *u > now),
                other => other.clone(),
            })
            .collect();
        out.push(Arc::new(Previous { routing: p.routing.clone(), servers, until: p.until }));
    }
    out.truncate(MAX_PREVIOUS);
    out
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

/// Where keys go: the config's placement (`model`; admin ejections are
/// part of it), without the servers health has ejected (each removed by
/// the placement's own change, so a pool agrees with its peers on every
/// key of a server that is up). `None` when no server takes keys.
fn routing_of(
    config: &PoolConfig,
    model: Option<&Snapshot>,
    members: &[Member],
) -> Result<Option<Arc<Routing>>, PoolError> {
    let live: Vec<usize> = (0..members.len()).filter(|&i| members[i].ejected.is_none()).collect();
    if live.is_empty() {
        return Ok(None);
    }
    let Some(model) = model else { return Ok(Some(Arc::new(Routing::Random(live)))) };
    let mut snapshot = model.clone();
    for m in members.iter().filter(|m| matches!(m.ejected, Some(Ejection::Auto(_)))) {
        if snapshot.nodes().iter().all(|n| n.id() != m.line.id) {
            continue;
        }
        if snapshot.nodes().len() == 1 {
            return Ok(None);
        }
        match snapshot.without_node(&m.line.id) {
            Ok(s) => snapshot = s,
            // (jump cannot leave out a server in the middle: it keeps it.)
            Err(e) => tracing::warn!(pool = %config.name, server = %m.line.id, "cannot route around it: {e}"),
        }
    }
    placed(snapshot, config, members).map(|r| Some(Arc::new(r)))
}

/// A placed routing: each placement node mapped (by id) to its live member;
/// the placement may order nodes its own way (twemproxy sorts by name).
fn placed(snapshot: Snapshot, config: &PoolConfig, members: &[Member]) -> Result<Routing, PoolError> {
    let to_member = snapshot
        .nodes()
        .iter()
        .map(|n| members.iter().position(|m| m.line.id == n.id()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| PoolError::Placement {
            pool: config.name.clone(),
            source: chash::Error::Config("placement and servers disagree".into()),
        })?;
    Ok(Routing::Placed { snapshot, to_member })
}

/// How what a change moved is measured.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Measure {
    /// Exactly for placements made of points, else on 100,000 sampled keys.
    Always,
    /// Exactly, or not at all (NaN).
    ExactOnly,
}

/// Share of the key space whose server changes between two states:
/// exact for placements made of points, else measured on 100,000 keys.
fn moved_fraction(old: &PoolState, new: &PoolState, measure: Measure) -> f64 {
    let (old_r, new_r) = (old.routing.as_deref(), new.routing.as_deref());
    let (Some(Routing::Placed { snapshot: a, .. }), Some(Routing::Placed { snapshot: b, .. })) = (old_r, new_r) else {
        return if old_r.is_some() != new_r.is_some() { 1.0 } else { sampled(old, new, measure) };
    };
    match a.placement().diff(b.placement()) {
        Some(Ok(d)) => d.moved,
        _ => sampled(old, new, measure),
    }
}

fn sampled(old: &PoolState, new: &PoolState, measure: Measure) -> f64 {
    const KEYS: usize = 100_000;
    if measure == Measure::ExactOnly {
        return f64::NAN;
    }
    match (old.routing.as_deref(), new.routing.as_deref()) {
        // Node ids are member ids: where the placements differ by id, keys moved.
        (Some(Routing::Placed { snapshot: a, .. }), Some(Routing::Placed { snapshot: b, .. })) => {
            a.moved_share(b, KEYS)
        }
        // random: keys have no place to move from.
        _ => 0.0,
    }
}
