//! The protocols the proxy speaks, and the one place that picks a pool's
//! from its config (every other file outside the protocol folders asks the
//! descriptor this returns; `tests/layout.rs` keeps it so).

use chash::PoolConfig;

use crate::protocol::Protocol;

/// The protocol a pool's config asks for.
pub(crate) fn of(config: &PoolConfig) -> &'static dyn Protocol {
    if config.redis {
        &crate::redis::protocol::REDIS
    } else {
        &crate::memcache::protocol::MEMCACHED
    }
}

/// Reads what `config` names by file for its protocol (a Redis pool's
/// passwords: `server_password_file`, each user's `password_file`) into
/// it, as a proxy start and every reload do; `chash proxy -t` checks them
/// this way.
///
/// # Errors
/// A file that cannot be read, or is empty.
pub fn prepare(config: &mut PoolConfig) -> Result<(), crate::pool::PoolError> {
    of(config).prepare(config)
}

/// Before a migrating change of a pool from `before` to `after`: whether
/// its servers can move the moved keys between them (a probe key moved
/// from each server keys leave to each they go to; blocking, a few
/// milliseconds a pair). `chash config --migrate` and the admin endpoint
/// ask this before anything changes.
///
/// # Errors
/// Why they cannot, and what to do.
pub fn check_migration(before: &PoolConfig, after: &PoolConfig) -> Result<(), String> {
    of(after).check_migration(before, after)
}
