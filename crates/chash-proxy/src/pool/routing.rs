//! The state a change swaps in and readers load without a lock: members,
//! the placement over the live ones, the warm-up sources; and what a change
//! moved. Pure: nothing here does I/O.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use chash::{AnyPlacement, Edit, PoolConfig, ServerLine, Snapshot};
use tokio::time::Instant;

use super::PoolError;
use crate::backend::Server;

/// Why a server is not taking keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ejection {
    /// Ejected by health (`auto_eject_hosts`) until then.
    Auto(Instant),
    /// Ejected by the admin endpoint until restored.
    Admin,
}

/// One configured server of the pool.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    /// The server line as configured now (weight included).
    pub line: ServerLine,
    /// The running server.
    pub server: Arc<Server>,
    /// Set while the server is ejected.
    pub ejected: Option<Ejection>,
}

impl Member {
    /// `up`, `down`, `ejected` or `auto-ejected`.
    pub(crate) fn state(&self) -> &'static str {
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
pub(crate) enum Routing {
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
pub(crate) struct PoolState {
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
    /// A migration in progress (Redis pools, `migrate`): where keys were
    /// before the change.
    pub migration: Option<Arc<super::Migration>>,
}

/// A placement a membership change replaced, kept as a warm-up source:
/// a read that misses on a key's server is tried on the key's server
/// here, and writes of the key delete it here, until `until`. Holds the
/// servers, so a removed server's connections stay open until then.
#[derive(Debug)]
pub(crate) struct Previous {
    pub(super) routing: Arc<Routing>,
    /// By member index, each with the end of its window here: a server a
    /// later change removed with a shorter window of its own ends earlier
    /// (`None` once its window is over, so its connections close).
    pub(super) servers: Vec<Option<(Arc<Server>, Instant)>>,
    /// When it stops being a source.
    pub until: Instant,
}

impl Previous {
    /// The key's server under this placement.
    pub(crate) fn server_for(&self, key: &[u8]) -> Option<&Arc<Server>> {
        match &self.servers[self.routing.member_for(key)?] {
            Some((server, until)) if *until > Instant::now() => Some(server),
            _ => None,
        }
    }

    /// This source without the servers whose window ended by `at`; `None`
    /// when nothing changes.
    pub(super) fn pruned(&self, at: Instant) -> Option<Previous> {
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
    pub(super) fn member_for(&self, key: &[u8]) -> Option<usize> {
        Some(match self {
            Routing::Placed { snapshot, to_member } => to_member[snapshot.route_index(key)?],
            Routing::Random(live) => live[(next_random() % live.len() as u64) as usize],
        })
    }
}

static RANDOM: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);

pub(super) fn next_random() -> u64 {
    // splitmix64 over a shared counter: good enough to spread requests.
    let mut z = RANDOM.fetch_add(0x9e37_79b9_7f4a_7c15, Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The state a request would be routed by is not the one it decided its
/// keys' moves by: it decides again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Changed;

/// Whether a request may be routed by `state` when its keys' moves were
/// decided by `decided` (a state with a migration; `None`: there was no
/// migration, nothing to move): by that very state, or, with no
/// migration, by any state without one. A key moved to its server under
/// one placement must not be sent by another (a change armed, completed
/// or replaced, or a server ejected, in between).
#[inline]
pub(crate) fn routes_as_decided(state: &Arc<PoolState>, decided: Option<&Arc<PoolState>>) -> bool {
    match decided {
        None => state.migration.is_none(),
        Some(d) => Arc::ptr_eq(state, d),
    }
}

/// Whether keys found where they are by `then` are still there by `now`
/// (a transaction queued or watched by `then`, run by `now`): with a
/// migration in either, only when they are the very same state; without
/// one, when the membership is the same (a health change keeps where keys
/// are kept).
pub(crate) fn same_placement(now: &Arc<PoolState>, then: &Arc<PoolState>) -> bool {
    if now.migration.is_some() || then.migration.is_some() {
        return Arc::ptr_eq(now, then);
    }
    now.version == then.version
}

impl PoolState {
    /// The server for `key`, or `None` when no server is live.
    #[inline]
    pub(crate) fn server_for(&self, key: &[u8]) -> Option<&Arc<Server>> {
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
    pub(crate) fn previous_servers(&self, key: &[u8], now: &Arc<Server>) -> Vec<Arc<Server>> {
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
    pub(crate) fn candidates(&self, key: &[u8], n: usize) -> Vec<Arc<Server>> {
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

    /// The servers keys are on: the live members', and during a migration
    /// those keys still move from (a removed server's until it is empty).
    pub(crate) fn key_servers(&self) -> Vec<Arc<Server>> {
        let mut out: Vec<Arc<Server>> = self.live().map(|m| m.server.clone()).collect();
        if let Some(m) = self.migration.as_ref().filter(|m| m.phase() != super::Phase::Done) {
            for s in m.sources() {
                if !out.iter().any(|o| Arc::ptr_eq(o, &s)) {
                    out.push(s);
                }
            }
        }
        out
    }

    /// Whether `key`, found on `server`, is listed from there: its server
    /// now, or (during a migration) its server before the change while it
    /// has not moved.
    pub(crate) fn lists_key_on(&self, key: &[u8], server: &Arc<Server>) -> bool {
        if self.server_for(key).is_some_and(|s| Arc::ptr_eq(s, server)) {
            return true;
        }
        self.migration
            .as_ref()
            .filter(|m| m.phase() != super::Phase::Done)
            .and_then(|m| m.source_for(key))
            .is_some_and(|s| Arc::ptr_eq(s, server))
    }

    /// Members taking keys now.
    pub(crate) fn live(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|m| m.ejected.is_none())
    }

    /// The placement when it bounds loads (`distribution: bounded`).
    pub(super) fn bounded(&self) -> Option<(&chash::algo::Bounded, &Snapshot, &[usize])> {
        match self.routing.as_deref() {
            Some(Routing::Placed { snapshot, to_member }) => match snapshot.placement() {
                AnyPlacement::Bounded(b) => Some((b, snapshot, to_member)),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Where keys go: the config's placement (`model`; admin ejections are
/// part of it), without the servers health has ejected (each removed by
/// the placement's own change, so a pool agrees with its peers on every
/// key of a server that is up). `None` when no server takes keys.
pub(super) fn routing_of(
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
pub(super) enum Measure {
    /// Exactly for placements made of points, else on 100,000 sampled keys.
    Always,
    /// Exactly, or not at all (NaN).
    ExactOnly,
}

/// Share of the key space whose server changes between two states:
/// exact for placements made of points, else measured on 100,000 keys.
pub(super) fn moved_fraction(old: &PoolState, new: &PoolState, measure: Measure) -> f64 {
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
pub(crate) type Persist<'a> = dyn Fn(&str, &Edit, &PoolConfig, &PoolConfig) -> Result<(), String> + Send + Sync + 'a;
