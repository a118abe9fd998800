//! The running pools by name, and reloading them from the config file.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use chash::config::Config;

use crate::options::Shared;
use crate::pool::{Change, Pool, PoolError};
use crate::stats::PoolSnapshot;

/// What a reload did to one pool: its name and the change (or why not).
pub type PoolReload = (String, Result<Change, PoolError>);

/// Why a reload changed nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReloadError {
    /// The proxy was not started from a config file.
    NoConfigFile,
    /// The file cannot be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid config.
    Config {
        /// The file.
        path: PathBuf,
        /// Why.
        source: chash::Error,
    },
}

impl fmt::Display for ReloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReloadError::NoConfigFile => f.write_str("no config file to reload"),
            ReloadError::Read { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            ReloadError::Config { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for ReloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReloadError::NoConfigFile => None,
            ReloadError::Read { source, .. } => Some(source),
            ReloadError::Config { source, .. } => Some(source),
        }
    }
}

/// The running proxy's pools.
#[derive(Debug)]
pub struct Registry {
    /// Process-wide settings.
    pub shared: Arc<Shared>,
    pools: RwLock<Vec<Arc<Pool>>>,
}

impl Registry {
    pub(crate) fn new(shared: Arc<Shared>, pools: Vec<Arc<Pool>>) -> Registry {
        Registry { shared, pools: RwLock::new(pools) }
    }

    /// The pools, in config order.
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        self.pools.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<Arc<Pool>> {
        self.pools().into_iter().find(|p| p.name == name)
    }

    /// Every pool's counters now.
    pub fn stats(&self) -> Vec<PoolSnapshot> {
        self.pools().iter().map(|p| p.stats()).collect()
    }

    /// Re-reads the config file and applies each pool's servers and
    /// placement; pools added or removed, or a changed listen address, need a
    /// restart and are reported as such.
    ///
    /// # Errors
    /// No config file, or one that does not parse; nothing is changed then.
    pub fn reload(&self) -> Result<Vec<PoolReload>, ReloadError> {
        let path = self.shared.options.config_path.as_ref().ok_or(ReloadError::NoConfigFile)?;
        let text = std::fs::read_to_string(path).map_err(|source| ReloadError::Read { path: path.clone(), source })?;
        let config = Config::from_yaml(&text).map_err(|source| ReloadError::Config { path: path.clone(), source })?;
        let mut results = Vec::new();
        for (name, _) in &config.pools {
            let pool_config =
                config.pool(Some(name)).map_err(|source| ReloadError::Config { path: path.clone(), source })?;
            let result = match self.pool(name) {
                Some(pool) => {
                    if pool_config.listen != pool.settings.listen {
                        tracing::warn!(pool = %name, "listen address changed: takes effect after a restart");
                    }
                    pool.reload(pool_config)
                }
                None => Err(PoolError::NeedsRestart { pool: name.clone(), what: "new: it is served after a restart" }),
            };
            results.push((name.clone(), result));
        }
        for pool in self.pools() {
            if !config.pools.iter().any(|(n, _)| *n == pool.name) {
                let what = "gone from the config: still served until a restart";
                results.push((pool.name.clone(), Err(PoolError::NeedsRestart { pool: pool.name.clone(), what })));
            }
        }
        Ok(results)
    }
}
