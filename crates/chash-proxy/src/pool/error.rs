//! Why a change to a pool was refused.

use std::fmt;

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
    /// The pool's TLS settings cannot be used.
    Tls {
        /// The pool.
        pool: String,
        /// Why.
        source: crate::tls::TlsError,
    },
    /// A secret the pool's config names by file cannot be read
    /// (`server_password_file`, a user's `password_file`).
    Secret {
        /// The pool.
        pool: String,
        /// Which and why.
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
            PoolError::Tls { pool, source } => write!(f, "pool {pool:?}: {source}"),
            PoolError::Secret { pool, why } => write!(f, "pool {pool:?}: {why}"),
            PoolError::UnknownPool(pool) => write!(f, "no pool {pool:?}"),
            PoolError::Persist { pool, why } => {
                write!(f, "pool {pool:?}: not changed, because the config file could not be updated: {why}")
            }
        }
    }
}

/// Each message says why, its cause included (a log line or an admin
/// reply shows it whole); `source()` gives the cause itself.
impl std::error::Error for PoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PoolError::Placement { source: e, .. } | PoolError::ServerLine(e) => Some(e),
            PoolError::Tls { source, .. } => Some(source),
            _ => None,
        }
    }
}
