//! A migrating change of a fleet on etcd: the barrier that makes it safe.
//!
//! `chash config add|remove|weight --etcd URL --migrate` writes the change
//! `armed`, waits until every registered proxy runs the armed pool (its
//! reported version is the armed one), then writes it `moving`; when a
//! proxy lags past the wait, the armed change is taken back (nothing has
//! moved yet, so nothing is lost) and the laggards are named. `chash
//! migrate start|finish --etcd URL` do the second and last steps alone:
//! moving once every proxy is armed, the record removed once every proxy
//! completed.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use chash::config::Config;
use chash::config_edit::{pick_pool, set_migration};
use chash::{MigrationState, PoolConfig};
use chash_proxy::etcd::{self, Client, EtcdError, EtcdTarget, ProxyReport};

use crate::etcd::block_on;

/// How often the barrier asks etcd for the proxies' reports.
const POLL: Duration = Duration::from_millis(20);

/// The wait for every proxy to arm when `--wait` is not given.
pub const DEFAULT_BARRIER_SECS: f64 = 30.0;

/// The stored config, its pool `name` (or its only pool) and that pool.
async fn read_pool(
    client: &mut Client,
    target: &EtcdTarget,
    name: Option<&str>,
) -> Result<(etcd::Stored, String, PoolConfig)> {
    let stored = etcd::read_config(client, target).await?;
    let key = target.config_key();
    let config = Config::from_yaml(&stored.text).with_context(|| format!("{key} (revision {})", stored.revision))?;
    let name = pick_pool(&config, name)?;
    let pool = config.pool(Some(&name))?;
    Ok((stored, name, pool))
}

/// Waits up to `secs` until every registered proxy runs pool `name` at
/// `version`. `Ok(proxies)` when all do (how many), `Err(laggards)` when
/// some still do not at the end.
async fn barrier(
    client: &mut Client,
    target: &EtcdTarget,
    name: &str,
    version: &str,
    secs: f64,
) -> Result<std::result::Result<usize, Vec<ProxyReport>>> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs.max(0.0));
    loop {
        let proxies = etcd::store::read_proxies(client, target).await?;
        let lagging: Vec<ProxyReport> =
            proxies.iter().filter(|p| p.pools.get(name).is_none_or(|r| r.version != version)).cloned().collect();
        if lagging.is_empty() {
            return Ok(Ok(proxies.len()));
        }
        if Instant::now() >= deadline {
            return Ok(Err(lagging));
        }
        tokio::time::sleep(POLL).await;
    }
}

fn describe(p: &ProxyReport, name: &str) -> String {
    let version = p.pools.get(name).map_or("no such pool", |r| r.version.as_str());
    let mut s = format!("{} at revision {}, pool {name} version {version}", p.id, p.revision);
    if let Some(admin) = &p.admin {
        s.push_str(&format!(" ({admin})"));
    }
    if let Some(e) = &p.last_error {
        s.push_str(&format!(": {e}"));
    }
    s
}

/// `header`, then each proxy that lags, a line each.
fn print_lagging(header: &str, lagging: &[ProxyReport], name: &str) {
    println!("{header}");
    for p in lagging {
        println!("  {}", describe(p, name));
    }
}

/// The stored text with pool `name`'s migration in `state`, written over
/// revision `read`.
async fn write_state(
    client: &mut Client,
    target: &EtcdTarget,
    text: &str,
    read: i64,
    name: &str,
    pool: &PoolConfig,
    state: Option<MigrationState>,
) -> Result<i64> {
    let next = pool.with_migration_state(state);
    let text = set_migration(text, name, next.migration.as_ref())?;
    Ok(etcd::store::write_config(client, target, &text, Some(read)).await?)
}

/// From armed to moving, once every registered proxy runs the armed pool
/// (waiting up to `secs`); `Ok(false)` when some do not (nothing written).
async fn arm_then_move(
    client: &mut Client,
    target: &EtcdTarget,
    stored: &etcd::Stored,
    name: &str,
    pool: &PoolConfig,
    secs: f64,
) -> Result<std::result::Result<i64, Vec<ProxyReport>>> {
    let key = target.config_key();
    let armed = pool.version();
    let started = Instant::now();
    match barrier(client, target, name, &armed, secs).await? {
        Ok(0) => println!("no proxy is registered under {}: none to wait for", target.proxies_prefix()),
        Ok(n) => println!("armed: {n} of {n} proxies run pool {name} version {armed} ({:.3} s)", elapsed(started)),
        Err(lagging) => return Ok(Err(lagging)),
    }
    let revision =
        write_state(client, target, &stored.text, stored.revision, name, pool, Some(MigrationState::Moving)).await?;
    println!("{key}: pool {name} moving: revision {} -> {revision}", stored.revision);
    println!("  follow it: chash migrate status --etcd {target} --watch");
    println!("  end it:    chash migrate finish --etcd {target} --wait SECS (once every proxy completed)");
    Ok(Ok(revision))
}

fn elapsed(since: Instant) -> f64 {
    since.elapsed().as_secs_f64()
}

/// `chash config add|remove|weight --etcd URL --migrate`, once the change
/// is written armed: moving once every proxy runs it, within `wait`
/// seconds; else taken back (`false`).
pub fn arm(target: &EtcdTarget, written: &crate::etcd::Written, wait: Option<f64>) -> Result<bool> {
    let secs = wait.unwrap_or(DEFAULT_BARRIER_SECS);
    let name = written.edited.after.name.clone();
    block_on(async {
        let mut client = etcd::connect(target).await?;
        let key = target.config_key();
        let stored = etcd::Stored { text: written.edited.text.clone(), revision: written.revision, read_at: 0 };
        let lagging = match arm_then_move(&mut client, target, &stored, &name, &written.edited.after, secs).await? {
            Ok(_) => return Ok(true),
            Err(lagging) => lagging,
        };
        let header =
            format!("not every proxy armed pool {name} within {secs} s (--wait); lagging ({} of them):", lagging.len());
        print_lagging(&header, &lagging, &name);
        // Nothing moves while armed: the change is taken back whole.
        match etcd::store::write_config(&mut client, target, &written.before_text, Some(written.revision)).await {
            Ok(revision) => println!(
                "{key}: the armed change taken back (revision {} -> {revision}): nothing moved, nothing changed; \
                 bring the proxies up to date (or let dead ones' leases expire) and run the change again",
                written.revision
            ),
            Err(e @ EtcdError::Conflict { .. }) => bail!(
                "{e}: the armed change could not be taken back; it stays armed (nothing moves while armed): `chash \
                 migrate start --etcd URL` once every proxy runs it"
            ),
            Err(e) => return Err(e.into()),
        }
        Ok(false)
    })
}

/// `chash migrate start --etcd URL`: an armed migration to moving once
/// every registered proxy runs it (waiting up to `wait` seconds).
pub fn start(target: &EtcdTarget, pool: Option<&str>, wait: Option<f64>, force: bool) -> Result<bool> {
    block_on(async {
        let mut client = etcd::connect(target).await?;
        let (stored, name, pool) = read_pool(&mut client, target, pool).await?;
        let Some(m) = &pool.migration else { bail!("pool {name} of {} is not migrating", target.config_key()) };
        if m.state != MigrationState::Armed {
            bail!("pool {name}'s migration is {} already", m.state.name());
        }
        if force {
            let revision = write_state(
                &mut client,
                target,
                &stored.text,
                stored.revision,
                &name,
                &pool,
                Some(MigrationState::Moving),
            )
            .await?;
            println!(
                "{}: pool {name} moving (--force): revision {} -> {revision}",
                target.config_key(),
                stored.revision
            );
            return Ok(true);
        }
        let secs = wait.unwrap_or(DEFAULT_BARRIER_SECS);
        match arm_then_move(&mut client, target, &stored, &name, &pool, secs).await? {
            Ok(_) => Ok(true),
            Err(lagging) => {
                print_lagging(
                    &format!("not every proxy runs the armed pool {name} after {secs} s; lagging:"),
                    &lagging,
                    &name,
                );
                println!("nothing written: the migration stays armed (nothing moves)");
                Ok(false)
            }
        }
    })
}

/// `chash migrate finish --etcd URL`: the record of a migration every
/// registered proxy completed removed (waiting up to `wait` seconds for
/// them to complete).
pub fn finish(target: &EtcdTarget, pool: Option<&str>, wait: Option<f64>, force: bool) -> Result<bool> {
    block_on(async {
        let mut client = etcd::connect(target).await?;
        let (stored, name, pool) = read_pool(&mut client, target, pool).await?;
        let Some(m) = &pool.migration else { bail!("pool {name} of {} is not migrating", target.config_key()) };
        if m.state != MigrationState::Moving && !force {
            bail!("pool {name}'s migration is {}: nothing has moved (chash migrate start first)", m.state.name());
        }
        let done = pool.with_migration_state(None).version();
        let started = Instant::now();
        if !force {
            let proxies = etcd::store::read_proxies(&mut client, target).await?;
            if proxies.is_empty() {
                bail!(
                    "no proxy is registered under {}: none has moved the keys, and removing the record would lose \
                     them; start a proxy (it migrates), or pass --force",
                    target.proxies_prefix()
                );
            }
            match barrier(&mut client, target, &name, &done, wait.unwrap_or(0.0)).await? {
                Ok(n) => println!("completed by {n} of {n} proxies ({:.3} s)", elapsed(started)),
                Err(lagging) => {
                    let header = format!("not every proxy has completed pool {name}'s migration; still migrating:");
                    print_lagging(&header, &lagging, &name);
                    println!(
                        "nothing written: wait for them (chash migrate status --etcd URL --watch, or --wait SECS)"
                    );
                    return Ok(false);
                }
            }
        }
        let revision = write_state(&mut client, target, &stored.text, stored.revision, &name, &pool, None).await?;
        println!(
            "{}: pool {name}: migration record removed (revision {} -> {revision}, version {done})",
            target.config_key(),
            stored.revision
        );
        Ok(true)
    })
}

/// The admin endpoints of the registered proxies (`chash migrate status
/// --etcd URL`).
pub fn admin_urls(target: &EtcdTarget) -> Result<Vec<String>> {
    block_on(async {
        let mut client = etcd::connect(target).await?;
        let proxies = etcd::store::read_proxies(&mut client, target).await?;
        let urls: Vec<String> = proxies.iter().filter_map(|p| p.admin.clone()).collect();
        if urls.is_empty() {
            bail!("no registered proxy under {} serves an admin endpoint", target.proxies_prefix());
        }
        Ok(urls)
    })
}
