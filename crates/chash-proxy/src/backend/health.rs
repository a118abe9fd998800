//! A server's health as its connections see it: consecutive failures
//! against the failure limit (reported once, when reached), whether the
//! last connection attempt failed, and the signal that ends a back-off.
//! Separate from membership: the pool decides what a failing server means.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};

use std::fmt;
use std::sync::Arc;

use tokio::sync::Notify;

/// Called with a server's id when its failures reach the limit, on the
/// thread of the connection that failed, before the failed requests are
/// answered (so a pool that ejects it does so before their clients retry).
pub(crate) type FailureHook = Arc<dyn Fn(&str) + Send + Sync>;

/// One server's health.
pub struct Health {
    id: String,
    failures: AtomicU32,
    down: AtomicBool,
    failed_over: AtomicBool,
    limit: u32,
    on_failure: Option<FailureHook>,
    retry: Notify,
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Health").field("id", &self.id).field("failures", &self.failures()).finish()
    }
}

impl Health {
    /// Health of server `id`: `on_failure` is called when `limit`
    /// consecutive failures are reached.
    pub fn new(id: String, limit: u32, on_failure: Option<FailureHook>) -> Health {
        Health {
            id,
            failures: AtomicU32::new(0),
            down: AtomicBool::new(false),
            failed_over: AtomicBool::new(false),
            limit: limit.max(1),
            on_failure,
            retry: Notify::new(),
        }
    }

    /// The server's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether the last connection attempt failed.
    pub fn is_down(&self) -> bool {
        self.down.load(Relaxed)
    }

    /// Whether the pool sends this server's keys to their next candidates
    /// (`failover: next`) until probes show it up for long enough.
    pub fn is_failed_over(&self) -> bool {
        self.failed_over.load(Relaxed)
    }

    /// Marks the server failed over; true if it was not yet.
    pub fn fail_over(&self) -> bool {
        !self.failed_over.swap(true, Relaxed)
    }

    /// Takes the server back after failover.
    pub fn recover(&self) {
        self.failures.store(0, Relaxed);
        self.failed_over.store(false, Relaxed);
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures.load(Relaxed)
    }

    /// A reply came: the failures end.
    pub fn succeeded(&self) {
        if self.failures.load(Relaxed) != 0 {
            self.failures.store(0, Relaxed);
        }
    }

    /// A failure; the limit reached is reported (once per run of failures).
    pub fn failed(&self, why: &str) {
        let n = self.failures.fetch_add(1, Relaxed) + 1;
        if n == self.limit {
            tracing::warn!(server = %self.id, failures = n, "server failing: {why}");
            if let Some(hook) = &self.on_failure {
                hook(&self.id);
            }
        }
    }

    /// A connection was made.
    pub fn connected(&self) {
        if self.down.swap(false, Relaxed) {
            tracing::info!(server = %self.id, "server reachable again");
        }
    }

    /// A connection attempt failed; true if the server was not down yet.
    pub fn unreachable(&self) -> bool {
        !self.down.swap(true, Relaxed)
    }

    /// Forgets past failures and ends any back-off (a server restored by
    /// hand).
    pub fn reset(&self) {
        self.failures.store(0, Relaxed);
        self.retry.notify_waiters();
    }

    /// Another chance on probation: the next failure reaches the limit at
    /// once (a reply resets the failures); connections try again now.
    pub fn probation(&self) {
        self.failures.store(self.limit - 1, Relaxed);
        self.retry.notify_waiters();
    }

    /// Resolves when the pool gives the server another chance.
    pub async fn retried(&self) {
        self.retry.notified().await;
    }
}
