//! Health: a server at its failure limit is ejected (`auto_eject_hosts`)
//! or failed over (`failover: next`, replicas); ejected servers are retried
//! when their time is up, failed-over ones probed until they are back.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{find, Ejection, Pool, PoolError};
use crate::backend::{Server, Setup};

impl Pool {
    /// Starts the task that retries ejected servers and prunes warm-up
    /// sources; it ends with the pool.
    pub(super) fn start_retries(self: &Arc<Self>) {
        tokio::spawn(retry_task(Arc::downgrade(self)));
    }

    /// A server reached its failure limit.
    pub(super) fn server_failing(self: &Arc<Self>, id: &str) {
        if self.fails_over() {
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
        if !self.spec.auto_eject_hosts {
            return;
        }
        let until = Instant::now() + self.spec.server_retry_timeout;
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
        let ok = match &pool.probe {
            Some(probe) => ask(&server, probe, &requester).await,
            None => !server.is_down(),
        };
        if !ok {
            up_since = None;
            continue;
        }
        let since = *up_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= pool.spec.server_retry_timeout {
            if let Some(before) = &pool.before_return {
                if !ask(&server, before, &requester).await {
                    up_since = None;
                    continue;
                }
            }
            server.health().recover();
            tracing::info!(pool = %pool.name, server = %server.id(), "back after failover: answered probes for {:?}", pool.spec.server_retry_timeout);
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
