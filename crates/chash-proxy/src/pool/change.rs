//! The change engine: membership edits (persisted first when asked),
//! reloads, and the health changes that eject and retry servers; each
//! builds a new [`PoolState`] under the change lock and swaps it in.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use chash::{Distribution, Edit, LineState, PoolConfig, ServerLine, Snapshot};
use tokio::time::Instant;

use super::routing::{moved_fraction, routing_of, Change, Measure, Persist};
use super::warm::{unexpired, warm_sources};
use super::{Ejection, Member, Migration, Mover, Pool, PoolError, PoolState, Previous};

impl Pool {
    /// Applies a membership edit: the pool's config changes by
    /// [`PoolConfig::apply`] (the same change the config file gets), the
    /// placement is built from the new config, and it is swapped in.
    /// `persist` writes the change to the config file first; when it fails
    /// nothing changes.
    ///
    /// # Errors
    /// An edit the pool refuses ([`PoolConfig::apply`]), a server that
    /// cannot be reached, or the file write's error.
    pub fn edit(&self, edit: &Edit, persist: Option<&Persist<'_>>) -> Result<Change, PoolError> {
        self.edit_draining(edit, persist, None)
    }

    /// As [`Pool::edit`], the old placement staying a warm-up source for
    /// `drain` (instead of the pool's `warmup`): a removed server stops
    /// owning keys at once, reads that miss on their new server are tried
    /// on it, and its connections close when the window ends.
    ///
    /// # Errors
    /// As [`Pool::edit`].
    pub fn edit_draining(
        &self,
        edit: &Edit,
        persist: Option<&Persist<'_>>,
        drain: Option<Duration>,
    ) -> Result<Change, PoolError> {
        self.edit_with(edit, persist, drain, None)
    }

    /// As [`Pool::edit`], the moved keys' data moved (`migrate`): the new
    /// config records the servers before the change, in `state` (this
    /// proxy alone: `moving`; a fleet's proxies first `armed`).
    ///
    /// # Errors
    /// As [`Pool::edit`], and a pool that cannot migrate (not Redis, no
    /// mover, random distribution).
    pub fn edit_migrating(
        &self,
        edit: &Edit,
        persist: Option<&Persist<'_>>,
        state: chash::MigrationState,
    ) -> Result<Change, PoolError> {
        self.edit_with(edit, persist, None, Some(state))
    }

    /// The config `edit` makes of this pool's, migrating when `migrate`
    /// says so (without applying it).
    ///
    /// # Errors
    /// As [`Pool::edit_migrating`].
    pub fn planned(&self, edit: &Edit, migrate: Option<chash::MigrationState>) -> Result<PoolConfig, PoolError> {
        self.plan(&self.lock(), edit, migrate)
    }

    fn plan(
        &self,
        config: &PoolConfig,
        edit: &Edit,
        migrate: Option<chash::MigrationState>,
    ) -> Result<PoolConfig, PoolError> {
        let err = |source| PoolError::Placement { pool: self.name.clone(), source };
        let (next, _) = config.apply(edit).map_err(err)?;
        match migrate {
            None => Ok(next),
            Some(state) => {
                if self.mover.get().is_none() {
                    return Err(PoolError::Placement {
                        pool: self.name.clone(),
                        source: chash::Error::Change("only Redis pools migrate".into()),
                    });
                }
                next.migrating_from(config, state).map_err(err)
            }
        }
    }

    fn edit_with(
        &self,
        edit: &Edit,
        persist: Option<&Persist<'_>>,
        drain: Option<Duration>,
        migrate: Option<chash::MigrationState>,
    ) -> Result<Change, PoolError> {
        let mut config = self.lock();
        let next = self.plan(&config, edit, migrate)?;
        let old = self.state.load_full();
        let members = self.members_for(&next, &old.members)?;
        let mut new = self.state_for(&next, members)?;
        new.migration = self.migration_for(&next, &new.members, Some(&old))?;
        let persisted = match persist {
            Some(write) => {
                write(&self.name, edit, &config, &next)
                    .map_err(|why| PoolError::Persist { pool: self.name.clone(), why })?;
                true
            }
            None => false,
        };
        *config = next;
        let window = drain.unwrap_or(config.warmup);
        let mut change = self.swap(edit.to_string(), Measure::Always, &old, new, config, Some(window));
        change.persisted = persisted;
        if !persisted {
            tracing::info!(pool = %self.name, "{}: not persisted (the config file still has the old membership)", change.change);
        }
        Ok(change)
    }

    /// Adds a server (in memory only; see [`Pool::edit`]).
    ///
    /// # Errors
    /// As [`Pool::edit`].
    pub fn add_server(&self, line: ServerLine) -> Result<Change, PoolError> {
        self.edit(&Edit::Add(line), None)
    }

    /// Removes a server; requests already sent to it complete.
    ///
    /// # Errors
    /// As [`Pool::edit`].
    pub fn remove_server(&self, id: &str) -> Result<Change, PoolError> {
        self.edit(&Edit::Remove(id.to_owned()), None)
    }

    /// Changes a server's weight.
    ///
    /// # Errors
    /// As [`Pool::edit`].
    pub fn set_weight(&self, id: &str, weight: u32) -> Result<Change, PoolError> {
        self.edit(&Edit::Weight(id.to_owned(), weight), None)
    }

    /// Ejects a server until [`restore`](Pool::restore) (its keys move to the others).
    ///
    /// # Errors
    /// As [`Pool::edit`].
    pub fn eject(&self, id: &str) -> Result<Change, PoolError> {
        self.edit(&Edit::Eject(id.to_owned()), None)
    }

    /// Brings an ejected server back.
    ///
    /// # Errors
    /// As [`Pool::edit`].
    pub fn restore(&self, id: &str) -> Result<Change, PoolError> {
        self.edit(&Edit::Restore(id.to_owned()), None)
    }

    /// Replaces the pool's placement settings and servers with a reloaded
    /// config (the listen address and connection settings stay until a
    /// restart). Servers with the same id keep their connections.
    ///
    /// # Errors
    /// A file that renumbers an order-dependent placement
    /// ([`PoolConfig::check_reload`]) or a placement that cannot be built;
    /// the pool is then unchanged.
    pub fn reload(&self, new: PoolConfig) -> Result<Change, PoolError> {
        self.reload_checked(new, true)
    }

    /// As [`Pool::reload`], without refusing a config that renumbers an
    /// order-dependent placement: for a config stored elsewhere (etcd),
    /// which every proxy applies as a fresh build, whatever revisions it
    /// missed.
    ///
    /// # Errors
    /// A placement that cannot be built; the pool is then unchanged.
    pub fn reload_stored(&self, new: PoolConfig) -> Result<Change, PoolError> {
        self.reload_checked(new, false)
    }

    fn reload_checked(&self, new: PoolConfig, check: bool) -> Result<Change, PoolError> {
        let mut config = self.lock();
        let old = self.state.load_full();
        let err = |source| PoolError::Placement { pool: self.name.clone(), source };
        if check {
            config.check_reload(&new).map_err(err)?;
        }
        let members = self.members_for(&new, &old.members)?;
        let mut state = self.state_for(&new, members)?;
        state.migration = self.migration_for(&new, &state.members, Some(&old))?;
        self.tls
            .reconfigure(&self.name, &new.tls)
            .map_err(|source| PoolError::Tls { pool: self.name.clone(), source })?;
        // Servers this reload removes that the file drains: their window.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let drain = new
            .drain
            .iter()
            .filter(|(id, _)| config.members().any(|l| l.id == *id) && !new.members().any(|l| l.id == *id))
            .map(|(_, until)| Duration::from_secs(*until).saturating_sub(now))
            .max()
            .unwrap_or_default();
        *config = new;
        let window = config.warmup.max(drain);
        Ok(self.swap("reloaded the config".into(), Measure::Always, &old, state, config, Some(window)))
    }

    /// The members of `config` (its active and ejected servers): the
    /// running servers of `old` kept by id, new ones started; health
    /// ejections of servers that still take keys carried over.
    fn members_for(&self, config: &PoolConfig, old: &[Member]) -> Result<Vec<Member>, PoolError> {
        let mut members = Vec::new();
        for line in config.members() {
            let before = old.iter().find(|m| m.line.id == line.id);
            let server = match before {
                Some(m) => m.server.clone(),
                None => self.start_server(line.clone())?,
            };
            let ejected = match (line.state, before.and_then(|m| m.ejected)) {
                (LineState::Active, Some(Ejection::Auto(t))) => Some(Ejection::Auto(t)),
                (LineState::Active, _) => None,
                _ => Some(Ejection::Admin),
            };
            members.push(Member { line: line.clone(), server, ejected });
        }
        Ok(members)
    }

    /// The state for `config` and `members`: the config's placement, then
    /// without the servers health has ejected.
    pub(super) fn state_for(&self, config: &PoolConfig, members: Vec<Member>) -> Result<PoolState, PoolError> {
        let err = |source| PoolError::Placement { pool: self.name.clone(), source };
        let model = match config.distribution {
            Distribution::Random => None,
            _ => Some(config.snapshot().map_err(err)?),
        };
        let routing = routing_of(config, model.as_ref(), &members)?;
        let fingerprint = model.as_ref().map_or_else(|| "random".to_owned(), Snapshot::fingerprint);
        let failover = self.fails_over();
        Ok(PoolState {
            members,
            routing,
            model,
            version: config.version(),
            fingerprint,
            previous: Vec::new(),
            failover,
            migration: None,
        })
    }

    /// Swaps `new` in (`config`, the change lock, held until then), counts
    /// and logs the change and what it moved.
    fn swap(
        &self,
        what: String,
        measure: Measure,
        old: &PoolState,
        mut new: PoolState,
        config: std::sync::MutexGuard<'_, PoolConfig>,
        window: Option<Duration>,
    ) -> Change {
        if let Some(window) = window {
            // A membership change: the old placement warms the new one up.
            new.previous = warm_sources(old, &new.members, window);
        }
        let warmup_seconds = window.unwrap_or_default().as_secs();
        let live_servers = new.live().count();
        let (version, fingerprint) = (new.version.clone(), new.fingerprint.clone());
        let new = Arc::new(new);
        self.store(new.clone());
        drop(config);
        if let Some(m) = &new.migration {
            if !old.migration.as_ref().is_some_and(|o| Arc::ptr_eq(o, m)) {
                self.start_mover(m.clone());
            }
        }
        self.events.membership_changes.fetch_add(1, Relaxed);
        let moved_fraction = moved_fraction(old, &new, measure);
        tracing::info!(pool = %self.name, moved = format!("{:.4}", moved_fraction), live_servers, version = %version, "{what}");
        if warmup_seconds > 0 {
            tracing::info!(pool = %self.name, "the placement before `{what}` serves reads that miss for {warmup_seconds} s");
        }
        Change { change: what, moved_fraction, live_servers, persisted: false, version, fingerprint, warmup_seconds }
    }

    /// A health change: the members' ejections as `mark` sets them, the
    /// routing the placement without the servers health ejected (the
    /// config, its version and fingerprint stay).
    pub(super) fn health_change(
        &self,
        what: String,
        mark: impl FnOnce(&mut Vec<Member>) -> Result<(), PoolError>,
    ) -> Result<Change, PoolError> {
        let config = self.lock();
        let old = self.state.load_full();
        let mut members = old.members.clone();
        mark(&mut members)?;
        let routing = routing_of(&config, old.model.as_ref(), &members)?;
        let new = PoolState {
            members,
            routing,
            model: old.model.clone(),
            version: old.version.clone(),
            fingerprint: old.fingerprint.clone(),
            previous: unexpired(&old.previous),
            failover: old.failover,
            migration: old.migration.clone(),
        };
        // On a connection's thread: only an exact (cheap) measure of what
        // moved, no sampling.
        Ok(self.swap(what, Measure::ExactOnly, &old, new, config, None))
    }

    /// Forgets warm-up sources whose window has passed (their servers'
    /// connections close when nothing else holds them).
    pub(super) fn prune_previous(&self) {
        let at = Instant::now();
        let due = |p: &Arc<Previous>| p.until <= at || p.servers.iter().flatten().any(|(_, until)| *until <= at);
        if !self.state.load().previous.iter().any(due) {
            return;
        }
        let _config = self.lock();
        let old = self.state.load_full();
        let new = PoolState {
            members: old.members.clone(),
            routing: old.routing.clone(),
            model: old.model.clone(),
            version: old.version.clone(),
            fingerprint: old.fingerprint.clone(),
            previous: unexpired(&old.previous).into_iter().map(|p| p.pruned(at).map_or(p, Arc::new)).collect(),
            failover: old.failover,
            migration: old.migration.clone(),
        };
        self.store(Arc::new(new));
    }

    /// The migration `config` records, for a state with `members`: the
    /// same one when `old` has it (a reload that changes nothing of it),
    /// else the placement before the change, over the servers kept, the
    /// old state's, or new ones.
    pub(super) fn migration_for(
        &self,
        config: &PoolConfig,
        members: &[Member],
        old: Option<&PoolState>,
    ) -> Result<Option<Arc<Migration>>, PoolError> {
        if config.migration.is_none() {
            return Ok(None);
        }
        let old_migration = old.and_then(|o| o.migration.as_ref());
        if let Some(m) = old_migration.filter(|m| m.same_as(config)) {
            return Ok(Some(m.clone()));
        }
        let err = |source| PoolError::Placement { pool: self.name.clone(), source };
        let Some(before) = config.migration_source().map_err(err)? else { return Ok(None) };
        if before.distribution == Distribution::Random {
            return Err(err(chash::Error::Change("a random pool has no key places to migrate".into())));
        }
        let known = |id: &str| -> Option<Arc<crate::backend::Server>> {
            let old_members = old.map(|o| o.members.as_slice()).unwrap_or_default();
            members
                .iter()
                .chain(old_members)
                .find(|m| m.line.id == id)
                .map(|m| m.server.clone())
                .or_else(|| old_migration.and_then(|m| m.sources().into_iter().find(|s| s.id() == id)))
        };
        let mut previous = Vec::new();
        for line in before.members() {
            let server = match known(&line.id) {
                Some(s) => s,
                None => self.start_server(line.clone())?,
            };
            let ejected = (line.state != LineState::Active).then_some(Ejection::Admin);
            previous.push(Member { line: line.clone(), server, ejected });
        }
        let snapshot = before.snapshot().map_err(err)?;
        let routing = routing_of(&before, Some(&snapshot), &previous)?
            .ok_or_else(|| err(chash::Error::Change("no server took keys before the change".into())))?;
        // The same migration in another state keeps its progress.
        let progress = old_migration
            .filter(|m| config.migration.as_ref().is_some_and(|c| c.from == m.from))
            .map(|m| m.progress.clone())
            .unwrap_or_default();
        // Which servers lose keys, exactly, where the placement is made of
        // points (a removal: only the removed server's keys move); else
        // every server before the change may.
        let losing = config
            .snapshot()
            .ok()
            .and_then(|after| snapshot.placement().diff(after.placement()))
            .and_then(Result::ok)
            .map(|d| d.pairs.into_iter().map(|p| p.from).collect());
        let servers = previous.into_iter().map(|m| m.server).collect();
        Ok(Migration::new(routing, servers, losing, config, progress).map(Arc::new))
    }

    /// Sets the protocol's mover; a migration the pool started with
    /// (a restart during one) starts moving now.
    pub(crate) fn set_mover(&self, mover: Mover) {
        if self.mover.set(mover).is_ok() {
            if let Some(m) = self.state().migration.clone() {
                self.start_mover(m);
            }
        }
    }

    /// What to do when a migration completes (the registry persists it).
    pub(crate) fn on_migrated(&self, f: super::OnMigrated) {
        let _ = self.on_migrated.set(f);
    }

    fn start_mover(&self, m: Arc<Migration>) {
        let (Some(mover), Some(me)) = (self.mover.get(), self.me.get().and_then(std::sync::Weak::upgrade)) else {
            return;
        };
        tracing::info!(pool = %self.name, state = m.state.name(), "migration: the mover of the change's keys starts");
        tokio::spawn((mover.run)(me, m, mover.settings));
    }

    /// The mover found no moved key left on any server keys moved from:
    /// the migration completes (moved keys go straight to their servers)
    /// and the config no longer records it. Nothing happens when `m` is
    /// no longer the pool's migration.
    pub fn migration_done(&self, m: &Arc<Migration>) {
        let mut config = self.lock();
        let old = self.state.load_full();
        if !old.migration.as_ref().is_some_and(|o| Arc::ptr_eq(o, m)) {
            return;
        }
        m.advance(super::Phase::Done);
        self.events.migrations_completed.fetch_add(1, Relaxed);
        *config = config.with_migration_state(None);
        let new = PoolState {
            members: old.members.clone(),
            routing: old.routing.clone(),
            model: old.model.clone(),
            version: config.version(),
            fingerprint: old.fingerprint.clone(),
            previous: unexpired(&old.previous),
            failover: old.failover,
            migration: None,
        };
        self.store(Arc::new(new));
        let done = config.clone();
        drop(config);
        tracing::info!(pool = %self.name, version = %done.version(), "migration complete: no moved key is left on the servers it moved from");
        if let Some(f) = self.on_migrated.get() {
            f(&done);
        }
    }
}
