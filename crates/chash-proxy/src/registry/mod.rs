//! The running pools by name; reloading them from the config file (on
//! request, and when the file changes: [`watch`]) and writing membership
//! changes back to it (`--persist`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use chash::config::Config;
use chash::{Edit, KeyHasher, PoolConfig};
use tokio::sync::watch as signal;

use crate::options::{Shared, WATCH_INTERVAL};
use crate::pool::{Change, Pool, PoolError};
use crate::stats::PoolSnapshot;

mod status;
pub(crate) use status::ConfigStatus;
pub use status::MembershipStatus;

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
    /// A config from elsewhere (etcd) is not valid: nothing was applied.
    Invalid {
        /// Where it came from (`etcd /chash/config revision 42`).
        origin: String,
        /// Why.
        source: Invalid,
    },
}

/// Why a whole config (from etcd) was refused before any pool changed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Invalid {
    /// The text is not a config, or a pool section is not valid.
    Config(chash::Error),
    /// A pool's servers cannot be placed.
    Placement {
        /// The pool.
        pool: String,
        /// Why.
        source: chash::Error,
    },
    /// A pool's server cannot be reached (no `HOST:PORT`).
    Server(PoolError),
    /// A running pool's protocol changed (that needs a restart).
    ProtocolChanged {
        /// The pool.
        pool: String,
        /// Its protocol now.
        was: &'static str,
        /// The config's.
        now: &'static str,
    },
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::Config(e) => write!(f, "{e}"),
            Invalid::Placement { pool, source } => write!(f, "pool {pool:?}: {source}"),
            Invalid::Server(e) => write!(f, "{e}"),
            Invalid::ProtocolChanged { pool, was, now } => {
                write!(f, "pool {pool:?}: its protocol changed ({was} to {now}): that needs a restart")
            }
        }
    }
}

/// Each message says why, its cause included; `source()` gives the cause
/// itself (the library's or the pool's error).
impl std::error::Error for Invalid {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Invalid::Config(e) | Invalid::Placement { source: e, .. } => Some(e),
            Invalid::Server(e) => Some(e),
            Invalid::ProtocolChanged { .. } => None,
        }
    }
}

impl fmt::Display for ReloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReloadError::NoConfigFile => f.write_str("no config file to reload"),
            ReloadError::Read { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            ReloadError::Config { path, source } => write!(f, "{}: {source}", path.display()),
            ReloadError::Invalid { origin, source } => write!(f, "{origin}: {source}"),
        }
    }
}

/// Each message says why, its cause included (a log line or an admin
/// reply shows it whole); `source()` gives the cause itself.
impl std::error::Error for ReloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReloadError::Read { source, .. } => Some(source),
            ReloadError::Config { source, .. } => Some(source),
            ReloadError::Invalid { source, .. } => Some(source),
            ReloadError::NoConfigFile => None,
        }
    }
}

/// The running proxy's pools.
#[derive(Debug)]
pub struct Registry {
    shared: Arc<Shared>,
    pools: RwLock<Vec<Arc<Pool>>>,
    file: FileState,
    /// Where the membership comes from when it is not the file (etcd).
    membership: Mutex<Option<MembershipStatus>>,
    /// The admin endpoint's TLS, reloaded with the pools'.
    admin_tls: Option<Arc<crate::tls::LiveTls>>,
    /// Counts the migrations completed, for those that report them (the
    /// etcd registration: a pool's version changes when one completes).
    migrated: tokio::sync::watch::Sender<u64>,
}

/// What the proxy knows of its config file.
#[derive(Debug, Default)]
struct FileState {
    /// Held while the file is read for a reload or written for a change.
    lock: Mutex<()>,
    /// The hash of the content last read or written (the watcher reloads
    /// when the file's differs).
    known: AtomicU64,
    /// Why the last reload was refused, if it was.
    last_error: Mutex<Option<String>>,
    /// Reloads refused (a file that does not parse, or that a pool refuses).
    failures: AtomicU64,
    /// Reloads applied.
    reloads: AtomicU64,
}

/// How validated pool configs are applied.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Apply {
    /// From the config file: each pool on its own, a renumbering of an
    /// order-dependent placement refused ([`Pool::reload`]).
    File,
    /// A stored config (etcd): every pool built fresh, unchanged ones left
    /// alone ([`Pool::reload_stored`]).
    Stored,
}

fn content_hash(text: &str) -> u64 {
    KeyHasher::Xxh3.hash(text.as_bytes())
}

impl Registry {
    pub(crate) fn new(shared: Arc<Shared>, pools: Vec<Arc<Pool>>) -> Registry {
        let registry = Registry {
            shared,
            pools: RwLock::new(pools),
            file: FileState::default(),
            membership: Mutex::new(None),
            admin_tls: None,
            migrated: tokio::sync::watch::Sender::new(0),
        };
        if let Some(text) = registry.shared.options.config_path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
            registry.file.known.store(content_hash(&text), Relaxed);
        }
        registry
    }

    /// The registry with the admin endpoint's TLS, which reloads reload too.
    pub(crate) fn with_admin_tls(mut self, tls: Option<Arc<crate::tls::LiveTls>>) -> Registry {
        self.admin_tls = tls;
        self
    }

    /// The admin endpoint's TLS, if it serves TLS.
    pub(crate) fn admin_tls(&self) -> Option<&Arc<crate::tls::LiveTls>> {
        self.admin_tls.as_ref()
    }

    /// Process-wide settings.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The config file's state: its path, whether the last reload was
    /// refused and why, and the reload counts.
    pub fn config_status(&self) -> ConfigStatus {
        let o = &self.shared.options;
        ConfigStatus {
            path: o.config_path.clone(),
            last_error: self.file.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            reload_failures: self.file.failures.load(Relaxed),
            reloads: self.file.reloads.load(Relaxed),
            persist: o.persist && o.config_path.is_some(),
            watch: o.watch_config && o.config_path.is_some(),
        }
    }

    /// The state of the membership source other than the file (etcd), if
    /// the proxy follows one.
    pub fn membership(&self) -> Option<MembershipStatus> {
        self.membership.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets the membership source's state (the proxy then follows it, not
    /// the file: membership changes through the admin endpoint are
    /// refused).
    pub fn set_membership(&self, status: MembershipStatus) {
        *self.membership.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
    }

    /// Changes the membership source's state in place (nothing when there
    /// is none).
    pub fn update_membership(&self, change: impl FnOnce(&mut MembershipStatus)) {
        if let Some(status) = self.membership.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            change(status);
        }
    }

    /// Applies a whole config from a source other than the file (etcd),
    /// all or nothing: every pool of `text` must parse, build its placement
    /// and have reachable server addresses before any pool changes. Each
    /// pool then becomes what a fresh build of `text` is (a pool whose
    /// config is unchanged is left alone); the renumbering check of file
    /// reloads does not apply, since every proxy applies the same stored
    /// config whatever revisions it missed. `origin` names the config in
    /// errors.
    ///
    /// # Errors
    /// [`ReloadError::Invalid`] when `text` is not a config every pool
    /// accepts; nothing changed then.
    pub fn apply_config(&self, origin: &str, text: &str) -> Result<Vec<PoolReload>, ReloadError> {
        let invalid = |source: Invalid| ReloadError::Invalid { origin: origin.to_owned(), source };
        let configs = self.pool_configs(text).map_err(invalid)?;
        for pool in &configs {
            self.validate(pool).map_err(invalid)?;
        }
        let _file = self.file.lock.lock().unwrap_or_else(|e| e.into_inner());
        Ok(self.apply(configs, Apply::Stored))
    }

    /// Every pool of config `text`, listen overrides applied: the first
    /// step of every config's way in (file, reload, watch, etcd).
    fn pool_configs(&self, text: &str) -> Result<Vec<PoolConfig>, Invalid> {
        let config = Config::from_yaml(text).map_err(Invalid::Config)?;
        let mut pools = Vec::new();
        for (name, _) in &config.pools {
            let mut pool = config.pool(Some(name)).map_err(Invalid::Config)?;
            if let Some(listen) = self.shared.options.listen_overrides.get(name) {
                pool.listen.clone_from(listen);
            }
            crate::protocols::of(&pool).prepare(&mut pool).map_err(Invalid::Server)?;
            pools.push(pool);
        }
        Ok(pools)
    }

    /// Checks a pool's config as a proxy start does (its placement builds,
    /// its servers have addresses, its protocol is the running pool's).
    fn validate(&self, pool: &PoolConfig) -> Result<(), Invalid> {
        let name = &pool.name;
        if pool.distribution != chash::Distribution::Random {
            pool.snapshot().map_err(|source| Invalid::Placement { pool: name.clone(), source })?;
        }
        crate::pool::check_servers(pool).map_err(Invalid::Server)?;
        if let Some(running) = self.pool(name) {
            let (was, now) = (running.protocol(), crate::protocols::of(pool).name());
            if was != now {
                return Err(Invalid::ProtocolChanged { pool: name.clone(), was, now });
            }
        }
        Ok(())
    }

    /// Applies validated pool configs (the file lock held): each running
    /// pool takes its new config (a file's renumbering checked, a stored
    /// config built fresh); a pool new to the config, or gone from it,
    /// needs a restart and is reported so.
    fn apply(&self, configs: Vec<PoolConfig>, how: Apply) -> Vec<PoolReload> {
        let mut results = Vec::new();
        for pool in self.pools() {
            if !configs.iter().any(|c| c.name == pool.name()) {
                let what = "gone from the config: still served until a restart";
                let gone = Err(PoolError::NeedsRestart { pool: pool.name().to_owned(), what });
                results.push((pool.name().to_owned(), gone));
            }
        }
        let mut changed = Vec::new();
        for new in configs {
            let name = new.name.clone();
            let result = match self.pool(&name) {
                Some(pool) if how == Apply::Stored && pool.config() == new => continue,
                Some(pool) => {
                    if new.listen != pool.spec().listen {
                        tracing::warn!(pool = %name, "listen address changed: takes effect after a restart");
                    }
                    match how {
                        Apply::File => pool.reload(new),
                        Apply::Stored => pool.reload_stored(new),
                    }
                }
                None => Err(PoolError::NeedsRestart { pool: name.clone(), what: "new: it is served after a restart" }),
            };
            changed.push((name, result));
        }
        // The config's pools first, in its order, then those it dropped.
        changed.extend(results);
        changed
    }

    /// Applies a membership edit to pool `pool`, written back to the config
    /// file first with `--persist`.
    ///
    /// # Errors
    /// No such pool, the edit's error, or the file write's.
    pub fn edit(&self, pool: &str, edit: &Edit) -> Result<Change, PoolError> {
        self.edit_draining(pool, edit, None)
    }

    /// As [`Registry::edit`], the old placement a warm-up source for
    /// `drain` instead of the pool's `warmup` ([`Pool::edit_draining`]).
    ///
    /// # Errors
    /// As [`Registry::edit`].
    pub fn edit_draining(&self, pool: &str, edit: &Edit, drain: Option<Duration>) -> Result<Change, PoolError> {
        self.edit_with(pool, edit, drain, None)
    }

    /// As [`Registry::edit`], `migrate` (or the pool's `migrate: true`)
    /// moving the moved keys' data ([`Pool::edit_migrating`]); this proxy
    /// alone decides, so the migration is `moving` at once. The migration
    /// is written to the config file with `--persist`, and removed from it
    /// when it completes.
    ///
    /// # Errors
    /// As [`Registry::edit`], and a pool that cannot migrate.
    pub fn edit_migrating(&self, pool: &str, edit: &Edit, migrate: Option<bool>) -> Result<Change, PoolError> {
        self.edit_with(pool, edit, None, migrate)
    }

    fn edit_with(
        &self,
        pool: &str,
        edit: &Edit,
        drain: Option<Duration>,
        migrate: Option<bool>,
    ) -> Result<Change, PoolError> {
        let p = self.pool(pool).ok_or_else(|| PoolError::UnknownPool(pool.to_owned()))?;
        let o = &self.shared.options;
        // `migrate: true` makes it the default for the changes that move keys.
        let migrate =
            migrate.unwrap_or(p.spec().migrate && matches!(edit, Edit::Add(_) | Edit::Remove(_) | Edit::Weight(..)));
        let write = |name: &str, edit: &Edit, before: &PoolConfig, after: &PoolConfig| match &o.config_path {
            Some(path) => self.write_edit(path, name, edit, before, after),
            None => Ok(()),
        };
        let persist: Option<&crate::pool::Persist<'_>> =
            if o.persist && o.config_path.is_some() { Some(&write) } else { None };
        if migrate {
            // The servers can move the keys, or nothing changes.
            let next = p.planned(edit, Some(chash::MigrationState::Moving))?;
            crate::protocols::check_migration(&p.config(), &next)
                .map_err(|why| PoolError::Placement { pool: pool.to_owned(), source: chash::Error::Change(why) })?;
            p.edit_migrating(edit, persist, chash::MigrationState::Moving)
        } else {
            p.edit_draining(edit, persist, drain)
        }
    }

    /// Writes a completed migration to the config file (`--persist`): the
    /// pool's `migrate_from` and `migrate_state` removed, when the file
    /// still records the migration that completed.
    fn write_migrated(&self, pool: &str, done: &PoolConfig) {
        let o = &self.shared.options;
        let (Some(path), true) = (&o.config_path, o.persist) else { return };
        let _file = self.file.lock.lock().unwrap_or_else(|e| e.into_inner());
        let result = (|| -> Result<(), String> {
            let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let there = chash::config::Config::from_yaml(&text)
                .and_then(|c| c.pool(Some(pool)))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if there.migration.is_none() || there.servers != done.servers {
                return Ok(());
            }
            let text = chash::config_edit::set_migration(&text, pool, None).map_err(|e| e.to_string())?;
            chash::config_edit::write_atomically(path, &text)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            self.file.known.store(content_hash(&text), Relaxed);
            Ok(())
        })();
        match result {
            Ok(()) => tracing::info!(%pool, "migration complete: written to {}", path.display()),
            Err(e) => tracing::error!(%pool, "migration complete, but it could not be written to the config file: {e}"),
        }
    }

    /// Each pool's completed migrations written to the config file
    /// (`--persist`).
    pub(crate) fn follow_migrations(self: &Arc<Self>) {
        for pool in self.pools() {
            let me = Arc::downgrade(self);
            let name = pool.name().to_owned();
            pool.on_migrated(Box::new(move |done: &PoolConfig| {
                if let Some(registry) = me.upgrade() {
                    registry.write_migrated(&name, done);
                    registry.migrated.send_modify(|n| *n += 1);
                }
            }));
        }
    }

    /// Changes each time a pool completes a migration.
    #[cfg(feature = "etcd")]
    pub(crate) fn migrations_completed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.migrated.subscribe()
    }

    /// Writes one pool's edit into the config file, keeping the rest of it.
    fn write_edit(
        &self,
        path: &Path,
        pool: &str,
        edit: &Edit,
        before: &PoolConfig,
        after: &PoolConfig,
    ) -> Result<(), String> {
        let _file = self.file.lock.lock().unwrap_or_else(|e| e.into_inner());
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut edited =
            chash::config_edit::edit_text(&text, Some(pool), edit).map_err(|e| format!("{}: {e}", path.display()))?;
        if after.migration.is_some() {
            // A migrating change records where keys were.
            edited.text = chash::config_edit::set_migration(&edited.text, pool, after.migration.as_ref())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            edited.after = chash::config::Config::from_yaml(&edited.text)
                .and_then(|c| c.pool(Some(pool)))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        if edited.before.version() != before.version() {
            return Err(format!(
                "{} was changed since the proxy read it (pool {pool} there has version {}, the proxy {}): reload \
                 it first (SIGHUP or POST /reload), then repeat the change",
                path.display(),
                edited.before.version(),
                before.version()
            ));
        }
        if edited.after.version() != after.version() {
            return Err(format!("{}: the edited file would not match the change (a bug)", path.display()));
        }
        chash::config_edit::write_atomically(path, &edited.text)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        self.file.known.store(content_hash(&edited.text), Relaxed);
        Ok(())
    }

    /// The pools, in config order.
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        self.pools.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<Arc<Pool>> {
        self.pools().into_iter().find(|p| p.name() == name)
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
        let _file = self.file.lock.lock().unwrap_or_else(|e| e.into_inner());
        let text = std::fs::read_to_string(path).map_err(|source| ReloadError::Read { path: path.clone(), source })?;
        self.reload_text(path, &text)
    }

    /// Applies a config file's content (the file lock held). A file that
    /// does not parse, or that a pool refuses, is recorded (the last error,
    /// a failure count) and the pools it concerns keep their config.
    fn reload_text(&self, path: &Path, text: &str) -> Result<Vec<PoolReload>, ReloadError> {
        self.file.known.store(content_hash(text), Relaxed);
        let result = self.apply_text(path, text);
        // A reload reads the pools' TLS files again too (a rotated
        // certificate, a fixed CA).
        let tls_problems = self.reload_tls(false);
        let problem = match &result {
            Err(e) => Some(e.to_string()),
            Ok(results) => {
                let refused: Vec<String> = results
                    .iter()
                    .filter_map(|(pool, r)| match r {
                        Err(e @ PoolError::NeedsRestart { .. }) => {
                            tracing::warn!(%pool, "{e}");
                            None
                        }
                        Ok(_) => None,
                        Err(e) => Some(e.to_string()),
                    })
                    .collect();
                let refused: Vec<String> = refused.into_iter().chain(tls_problems).collect();
                (!refused.is_empty()).then(|| refused.join("; "))
            }
        };
        let counter = if problem.is_some() { &self.file.failures } else { &self.file.reloads };
        counter.fetch_add(1, Relaxed);
        if let Some(p) = &problem {
            tracing::error!("config {} refused, the last good config stays: {p}", path.display());
        }
        *self.file.last_error.lock().unwrap_or_else(|e| e.into_inner()) = problem;
        result
    }

    fn apply_text(&self, path: &Path, text: &str) -> Result<Vec<PoolReload>, ReloadError> {
        let configs = self.pool_configs(text).map_err(|e| match e {
            Invalid::Config(source) => ReloadError::Config { path: path.to_path_buf(), source },
            other => ReloadError::Invalid { origin: path.display().to_string(), source: other },
        })?;
        Ok(self.apply(configs, Apply::File))
    }

    /// Reads every TLS file again (the pools' and the admin endpoint's): a
    /// SIGHUP of a proxy without a config file to reload (one following
    /// etcd). Returns what was refused (the old files stay for those).
    pub fn reload_tls_files(&self) -> Vec<String> {
        self.reload_tls(false)
    }

    /// Reads every pool's TLS files again (`only_changed`: the pools whose
    /// files changed since they were loaded); a pool whose new files cannot
    /// be used keeps its old certificate. Returns what was refused.
    fn reload_tls(&self, only_changed: bool) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(tls) = &self.admin_tls {
            if !only_changed || tls.changed() {
                match tls.reload() {
                    Ok(()) => tracing::info!("admin endpoint: TLS certificate (re)loaded"),
                    Err(e) => {
                        tracing::error!("admin endpoint: TLS files refused, the old ones stay: {e}");
                        problems.push(format!("admin endpoint: {e} (the old TLS files stay)"));
                    }
                }
            }
        }
        for pool in self.pools() {
            let tls = pool.tls();
            if !tls.in_use() || (only_changed && !tls.changed()) {
                continue;
            }
            match tls.reload() {
                Ok(()) => tracing::info!(pool = %pool.name(), "TLS certificates and CAs (re)loaded"),
                Err(e) => {
                    tracing::error!(pool = %pool.name(), "TLS files refused, the old ones stay: {e}");
                    problems.push(format!("pool {:?}: {e} (the old TLS files stay)", pool.name()));
                }
            }
        }
        problems
    }

    /// Reloads when the config file's content differs from what the proxy
    /// last read or wrote, once it has stayed the same for one more check
    /// (a writer may still be at it).
    fn check_file(&self, path: &Path, pending: &mut Option<u64>) {
        let Ok(text) = std::fs::read_to_string(path) else { return };
        let hash = content_hash(&text);
        if hash == self.file.known.load(Relaxed) {
            *pending = None;
            // The config is as it was; its TLS files may not be.
            let _ = self.reload_tls(true);
            return;
        }
        if *pending != Some(hash) {
            *pending = Some(hash);
            return;
        }
        *pending = None;
        let _file = self.file.lock.lock().unwrap_or_else(|e| e.into_inner());
        if hash == self.file.known.load(Relaxed) {
            return; // written by this proxy meanwhile
        }
        tracing::info!("config file {} changed: reloading", path.display());
        // Each pool logs its change; reload_text logs what was refused.
        let _ = self.reload_text(path, &text);
    }
}

/// Watches the config file until `stop`: reloads when it is replaced (a
/// rename, a ConfigMap's symlink swap) or rewritten, debounced.
pub(crate) async fn watch(registry: Arc<Registry>, path: PathBuf, mut stop: signal::Receiver<bool>) {
    let mut tick = tokio::time::interval(WATCH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pending = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let (registry2, path2) = (registry.clone(), path.clone());
        let p = pending;
        // File reads and reloads off the runtime's threads.
        pending = tokio::task::spawn_blocking(move || {
            let mut pending = p;
            registry2.check_file(&path2, &mut pending);
            pending
        })
        .await
        .unwrap_or(None);
    }
}
