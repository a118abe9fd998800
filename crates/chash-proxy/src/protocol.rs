//! What the proxy asks of a pool's protocol: one descriptor per protocol
//! folder implements [`Protocol`], so that the dispatcher, the admin
//! endpoint and the registry ask it instead of knowing protocols
//! themselves (`protocols.rs` picks a pool's).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use chash::PoolConfig;
use tokio::sync::watch;

use crate::backend::{Requester, Speech};
use crate::conn::{ClientStream, ConnGuard, ConnSettings, Session};
use crate::options::Shared;
use crate::pool::Pool;

/// A client connection accepted for a pool, and what serving it needs.
pub(crate) struct Client {
    pub pool: Arc<Pool>,
    pub shared: Arc<Shared>,
    pub requester: Requester,
    pub settings: ConnSettings,
    /// Flips to `true` when the proxy shuts down.
    pub stop: watch::Receiver<bool>,
    /// Counts the connection while it is served.
    pub guard: ConnGuard,
}

impl Client {
    /// Serves the connection with its protocol's `session`.
    pub(crate) fn serve<S: Session + 'static>(
        self,
        stream: ClientStream,
        session: S,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(crate::conn::serve(stream, session, self.requester, self.settings, self.stop, self.guard))
    }
}

/// A protocol the proxy speaks to clients and servers.
pub(crate) trait Protocol: Send + Sync {
    /// Its name in stats, logs and errors: `memcached`, `redis`.
    fn name(&self) -> &'static str;

    /// What a pool's servers speak: each dialect's set-up, and the probes
    /// of a failed-over server.
    fn speech(&self, config: &PoolConfig) -> Speech;

    /// Reads what a pool's config names by file for this protocol (Redis:
    /// its passwords) into the config, at start and at every reload.
    ///
    /// # Errors
    /// A file that cannot be used.
    fn prepare(&self, config: &mut PoolConfig) -> Result<(), crate::pool::PoolError> {
        let _ = config;
        Ok(())
    }

    /// Whether a membership change may drain a removed server (its values
    /// read from it, for a window, when they miss on their new server).
    fn drains(&self) -> bool;

    /// Its mover of a migration's keys (`migrate`), going as fast as
    /// `settings` lets it; `None`: the protocol's pools do not migrate.
    fn mover(&self, settings: crate::pool::MoveSettings) -> Option<crate::pool::Mover> {
        let _ = settings;
        None
    }

    /// Before a migrating change from `before` to `after`: whether its
    /// servers can move keys between them (blocking; a probe).
    ///
    /// # Errors
    /// Why they cannot.
    fn check_migration(&self, before: &PoolConfig, after: &PoolConfig) -> Result<(), String> {
        let _ = (before, after);
        Err(format!("pool {}: only Redis pools migrate", after.name))
    }

    /// Serves one client connection until it ends.
    fn serve(&self, stream: ClientStream, client: Client) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}
