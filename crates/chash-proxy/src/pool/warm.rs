//! What warm-up shares between protocols: the placements a membership
//! change replaced, kept as sources for a window ([`Previous`], built
//! here), and [`KeyWrites`], which keeps a warm-up copy from leaving a
//! value older than a write of its key. The protocol's half (what a miss
//! reads from a source, and how a copy is written) lives in its folder
//! (`memcache/warmup.rs`).

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Member, PoolState, Previous};
use crate::backend::Server;

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
pub(super) fn unexpired(previous: &[Arc<Previous>]) -> Vec<Arc<Previous>> {
    let at = Instant::now();
    previous.iter().filter(|p| p.until > at).cloned().collect()
}

/// The warm-up sources after a membership change from `old` to `members`:
/// the old placement for `window` (none when zero), then the old sources
/// still in theirs. A server this change removes is a source for this
/// change's window at most, in every source: when it ends, the sources let
/// go of it and its connections close.
pub(super) fn warm_sources(old: &PoolState, members: &[Member], window: Duration) -> Vec<Arc<Previous>> {
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
