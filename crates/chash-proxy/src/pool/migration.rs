//! A membership change whose moved keys' data moves (Redis pools,
//! `migrate`): the placement before the change, where the migration is,
//! and its progress. Protocol-free: the protocol's mover (`Speech::mover`)
//! moves the keys and tells the pool when it is done.
//!
//! Where a proxy is (each step only forward):
//! - `Hold`: commands on moved keys wait (up to the pool's timeout) and
//!   nothing moves. The config's `migrate_state: armed`, and the first
//!   moments of `moving` while requests routed before the change finish.
//! - `Moving`: a command on a moved key first moves the key (from its
//!   server before the change to its server now), then runs on the new
//!   one; the mover moves the rest in the background.
//! - `Done`: no moved key is left on a server it was moved from; moved
//!   keys go straight to their servers.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chash::{MigrationState, PoolConfig};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::routing::Routing;
use super::Pool;
use crate::backend::Server;

/// A mover's task.
pub(crate) type MoveFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A protocol's mover of a migration's keys (Redis): it settles (requests
/// routed before the change finish), moves the pool to [`Phase::Moving`],
/// moves every moved key, then calls [`Pool::migration_done`]. It stops
/// when the migration is no longer the pool's.
#[derive(Clone, Copy)]
pub(crate) struct Mover {
    /// The task.
    pub run: fn(Arc<Pool>, Arc<Migration>, MoveSettings) -> MoveFuture,
    /// How fast it goes.
    pub settings: MoveSettings,
}

/// How fast a mover goes (`chash proxy --migrate-*`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoveSettings {
    /// Keys moved per second, at most (0: no limit).
    pub keys_per_second: u64,
    /// Bytes moved per second, at most (0: no limit).
    pub bytes_per_second: u64,
    /// Keys larger than this (`MEMORY USAGE`) are moved last, one at a time.
    pub large_key_bytes: u64,
    /// Keys per `SCAN` and per `MIGRATE`, at most.
    pub batch: usize,
    /// Bytes per `MIGRATE` (`MEMORY USAGE`), at most: a `MIGRATE` blocks
    /// its source server while it copies, so a batch is kept short.
    pub batch_bytes: u64,
}

impl Default for MoveSettings {
    fn default() -> MoveSettings {
        MoveSettings {
            keys_per_second: 100_000,
            bytes_per_second: 64 << 20,
            large_key_bytes: 8 << 20,
            batch: 500,
            batch_bytes: 256 << 10,
        }
    }
}

/// Where a proxy is in a migration (see the module's doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Moved keys wait; nothing moves.
    Hold,
    /// Moved keys move on access and in the background.
    Moving,
    /// Nothing is left to move.
    Done,
}

/// A migration in progress in a pool's state.
pub struct Migration {
    /// Where keys were before the change.
    routing: Arc<Routing>,
    /// The servers behind `routing`'s members (a removed server's too: it
    /// stays connected until the migration is done).
    servers: Vec<Arc<Server>>,
    /// The ids of the servers that lose keys, when the placements' diff
    /// says exactly (`None`: any server before the change may).
    losing: Option<Vec<String>>,
    /// The config's `migrate_state`.
    pub state: MigrationState,
    /// The server lines before the change (`migrate_from`).
    pub from: Vec<chash::ServerLine>,
    phase: AtomicU8,
    moving: Notify,
    /// What the mover did so far (kept across reloads of the same migration).
    pub progress: Arc<Progress>,
    /// Keys this proxy knows are not on their old server any more.
    moved: std::sync::Mutex<Moved>,
}

/// Keys known to be off their old server (moved, or found absent there),
/// up to [`Moved::LIMIT`] bytes of keys: commands on them go straight to
/// their new server. Exact (whole keys, no hashes): a key taken for moved
/// wrongly would be written on its new server beside its old copy. A key
/// off its old server never comes back there while the migration lasts
/// (no proxy writes a moved key to its old server once any moves), so an
/// entry never goes stale; the set goes with the migration.
#[derive(Debug, Default)]
struct Moved {
    keys: std::collections::HashSet<bytes::Bytes>,
    bytes: usize,
}

impl Moved {
    /// Keys (and their overhead, counted as 48 bytes each) held at most.
    const LIMIT: usize = 32 << 20;
}

impl std::fmt::Debug for Migration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Migration").field("state", &self.state).field("phase", &self.phase()).finish()
    }
}

/// What the mover did: keys scanned and moved, by the mover and on access.
#[derive(Debug, Default)]
pub struct Progress {
    /// Keys the mover's scans read on the servers keys move from.
    pub scanned: AtomicU64,
    /// Keys moved by the mover.
    pub moved: AtomicU64,
    /// Bytes of those (the servers' `MEMORY USAGE`).
    pub moved_bytes: AtomicU64,
    /// Keys moved because a command used them first.
    pub moved_on_access: AtomicU64,
    /// Reads of keys not moved yet answered by their old server (nothing
    /// moved for them).
    pub reads_from_old: AtomicU64,
    /// Keys larger than the large-key threshold, moved last, one at a time.
    pub large_keys: AtomicU64,
    /// Keys found on both servers (a write to the old server that raced the
    /// move): the new server's copy kept, the old one deleted.
    pub conflicts: AtomicU64,
    /// Moves that failed and were retried.
    pub errors: AtomicU64,
    /// Keys on the servers keys move from, counted when the mover started
    /// (`DBSIZE`).
    pub total_keys: AtomicU64,
    /// Of the keys scanned, the ones that move (to estimate what is left).
    pub scanned_moving: AtomicU64,
    /// Full passes over every source server.
    pub passes: AtomicU64,
    /// When the mover started moving; when it finished (µs since it started).
    started: Mutex<Option<Instant>>,
    pub finished_after_us: AtomicU64,
    /// The last error, for `/stats`.
    pub last_error: Mutex<Option<String>>,
    /// Large keys found (up to 100), with their sizes, for `/stats`.
    pub large: Mutex<Vec<(String, u64)>>,
}

impl Progress {
    /// The mover starts (the clock of its rate and ETA).
    pub fn start(&self) {
        if let Ok(mut s) = self.started.lock() {
            s.get_or_insert_with(Instant::now);
        }
    }

    /// Seconds since the mover started.
    pub fn elapsed(&self) -> Option<Duration> {
        self.started.lock().ok().and_then(|s| s.map(|t| t.elapsed()))
    }

    /// Keys moved per second so far (mover and on access).
    pub fn rate(&self) -> f64 {
        let moved = (self.moved.load(Relaxed) + self.moved_on_access.load(Relaxed)) as f64;
        match self.elapsed() {
            Some(e) if e.as_secs_f64() > 0.0 => moved / e.as_secs_f64(),
            _ => 0.0,
        }
    }

    /// Keys estimated to be left to move: the share of keys that move
    /// among those scanned, times the keys not scanned yet (first pass).
    pub fn remaining(&self) -> u64 {
        let (total, scanned) = (self.total_keys.load(Relaxed), self.scanned.load(Relaxed));
        if self.passes.load(Relaxed) > 0 || scanned == 0 {
            return 0;
        }
        let share = self.scanned_moving.load(Relaxed) as f64 / scanned as f64;
        (total.saturating_sub(scanned) as f64 * share).round() as u64
    }
}

impl Migration {
    /// A migration with the placement before the change (`routing` over
    /// `servers`), for a config in `state`.
    pub(super) fn new(
        routing: Arc<Routing>,
        servers: Vec<Arc<Server>>,
        losing: Option<Vec<String>>,
        config: &PoolConfig,
        progress: Arc<Progress>,
    ) -> Option<Migration> {
        let m = config.migration.as_ref()?;
        Some(Migration {
            routing,
            servers,
            losing,
            state: m.state,
            from: m.from.clone(),
            phase: AtomicU8::new(0),
            moving: Notify::new(),
            progress,
            moved: std::sync::Mutex::default(),
        })
    }

    /// Whether `key` is known to be off its old server (see [`Moved`]).
    pub fn known_moved(&self, key: &[u8]) -> bool {
        self.moved.lock().is_ok_and(|m| m.keys.contains(key))
    }

    /// `keys` are off their old server now (moved, or found absent).
    pub fn note_moved<K: AsRef<[u8]>>(&self, keys: impl IntoIterator<Item = K>) {
        let Ok(mut m) = self.moved.lock() else { return };
        for k in keys {
            let k = k.as_ref();
            let cost = k.len() + 48;
            if m.bytes + cost > Moved::LIMIT {
                return;
            }
            // A key copied out of a larger buffer: the set must not keep
            // the buffer alive.
            if m.keys.insert(bytes::Bytes::copy_from_slice(k)) {
                m.bytes += cost;
            }
        }
    }

    /// Where this proxy is.
    pub fn phase(&self) -> Phase {
        match self.phase.load(SeqCst) {
            0 => Phase::Hold,
            1 => Phase::Moving,
            _ => Phase::Done,
        }
    }

    /// Moves to `phase` (only forward); waiters for moving wake.
    pub fn advance(&self, phase: Phase) {
        let n = match phase {
            Phase::Hold => 0,
            Phase::Moving => 1,
            Phase::Done => 2,
        };
        self.phase.fetch_max(n, SeqCst);
        self.moving.notify_waiters();
    }

    /// Waits until moved keys may move (or nothing is left to move), at
    /// most `limit`; `false` when it is still holding.
    pub async fn wait_moving(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let notified = self.moving.notified();
            if self.phase() != Phase::Hold {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.phase() != Phase::Hold;
            }
        }
    }

    /// The server `key` was on before the change.
    pub fn source_for(&self, key: &[u8]) -> Option<&Arc<Server>> {
        self.servers.get(self.routing.member_for(key)?)
    }

    /// Every server keys may move from (each once).
    pub fn sources(&self) -> Vec<Arc<Server>> {
        let mut out: Vec<Arc<Server>> = Vec::new();
        for s in &self.servers {
            let loses = self.losing.as_ref().is_none_or(|ids| ids.iter().any(|id| id == s.id()));
            if loses && !out.iter().any(|o| Arc::ptr_eq(o, s)) {
                out.push(s.clone());
            }
        }
        out
    }

    /// Whether this is the same migration (same servers before, same state).
    pub(super) fn same_as(&self, config: &PoolConfig) -> bool {
        config.migration.as_ref().is_some_and(|m| m.from == self.from && m.state == self.state)
    }
}

/// A migration's numbers for `/stats` and `/metrics` (`migration_*`).
pub(super) fn numbers(m: &Migration) -> Vec<(crate::stats::Desc, u64)> {
    use crate::stats::{Desc, Kind};
    let p = &m.progress;
    let g = |name, help| Desc { name, kind: Kind::Gauge, help };
    let rate = p.rate();
    let remaining = p.remaining();
    let eta = if rate > 0.0 { (remaining as f64 / rate).ceil() as u64 } else { 0 };
    vec![
        (
            g("migration_phase", "A migration in progress: 0 holding moved keys, 1 moving them, 2 done."),
            match m.phase() {
                Phase::Hold => 0,
                Phase::Moving => 1,
                Phase::Done => 2,
            },
        ),
        (
            g(
                "migration_keys_total",
                "Keys on the servers keys move from when the mover started, or scanned if more (SCAN may return a key \
                 twice, and a pass that failed is started again).",
            ),
            p.total_keys.load(Relaxed).max(p.scanned.load(Relaxed)),
        ),
        (
            g("migration_keys_scanned", "Keys the mover has scanned on the servers keys move from."),
            p.scanned.load(Relaxed),
        ),
        (g("migration_keys_moved", "Keys the mover moved."), p.moved.load(Relaxed)),
        (
            g("migration_keys_moved_on_access", "Keys moved because a command used them first."),
            p.moved_on_access.load(Relaxed),
        ),
        (
            g(
                "migration_reads_from_old",
                "Reads of keys not moved yet answered by their old server (one round trip, nothing moved).",
            ),
            p.reads_from_old.load(Relaxed),
        ),
        (
            g("migration_keys_remaining", "Keys estimated left to move (from the share of scanned keys that moved)."),
            remaining,
        ),
        (g("migration_bytes_moved", "Bytes the mover moved (MEMORY USAGE)."), p.moved_bytes.load(Relaxed)),
        (g("migration_keys_per_second", "Keys moved per second since the mover started."), rate.round() as u64),
        (
            g("migration_eta_seconds", "Seconds estimated until every moved key has moved (0: unknown or none left)."),
            eta,
        ),
        (g("migration_large_keys", "Keys over the large-key threshold, moved last."), p.large_keys.load(Relaxed)),
        (
            g("migration_conflicts", "Keys found on both servers; the copy on the new one kept."),
            p.conflicts.load(Relaxed),
        ),
        (g("migration_errors", "Moves or scans that failed (and were tried again)."), p.errors.load(Relaxed)),
        (g("migration_passes", "Full passes of the mover over every server keys move from."), p.passes.load(Relaxed)),
    ]
}

/// A migration as `/stats` shows it.
pub(super) fn view(m: &Migration) -> crate::stats::MigrationView {
    crate::stats::MigrationView {
        state: m.state.name(),
        phase: match m.phase() {
            Phase::Hold => "hold",
            Phase::Moving => "moving",
            Phase::Done => "done",
        },
        from: m.from.iter().map(ToString::to_string).collect(),
        last_error: m.progress.last_error.lock().ok().and_then(|e| e.clone()),
        large_keys: m.progress.large.lock().map(|l| l.clone()).unwrap_or_default(),
    }
}
