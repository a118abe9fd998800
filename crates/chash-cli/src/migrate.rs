//! `chash migrate`: a Redis pool's migration (a membership change made with
//! `--migrate`) watched, started and finished.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use chash::config::Config;
use chash::config_edit::{pick_pool, set_migration, write_atomically};
use chash::MigrationState;
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::fleet::fetch_stats;

#[derive(Args, Debug)]
#[command(after_help = "\
A Redis pool with `migrate: true` (or a change made with --migrate) moves the
data of the keys a membership change moves: a command on a moved key first
moves it (MIGRATE from its server before the change to its server now), and
each proxy's mover moves the rest in the background. The config records the
change with the servers before it (`migrate_from`) and its state
(`migrate_state`):

  armed    every proxy has the change; moved keys wait (up to the pool's
           timeout, then -TRYAGAIN) and nothing moves. A proxy still on the
           old config writes moved keys to their old servers, so nothing may
           move before every proxy is armed.
  moving   keys move. A proxy still armed holds moved keys: it writes them
           nowhere, so moving proxies and armed ones never disagree.
  (none)   every proxy found no moved key left on the servers keys moved
           from; moved keys go straight to their servers.

With a config file shared by several proxies:
  chash config add -c pool.yml --migrate '10.0.0.4:6379:1 d' -i    # armed
  chash migrate start -c pool.yml -i --check http://10.0.0.1:22223 --check http://10.0.0.2:22223
  chash migrate status http://10.0.0.1:22223 http://10.0.0.2:22223 -c pool.yml --watch
  chash migrate finish -c pool.yml -i --check http://10.0.0.1:22223 --check http://10.0.0.2:22223

With a fleet on etcd (every registered proxy is the barrier):
  chash config add --etcd etcd://10.0.0.9:2379/chash/web --migrate '10.0.0.4:6379:1 d' --wait 30
      # armed; moving once every registered proxy runs it, taken back if one
      # does not within --wait (a dead proxy counts until its lease expires)
  chash migrate status --etcd etcd://10.0.0.9:2379/chash/web --watch
  chash migrate finish --etcd etcd://10.0.0.9:2379/chash/web --wait 600

One proxy alone (moving at once; add --migrate unless the pool has migrate: true):
  chash config add -c pool.yml --now '10.0.0.4:6379:1 d' -i
  chash migrate status http://10.0.0.1:22223 -c pool.yml --watch   # waits for the reload too
  chash migrate finish -c pool.yml -i --check http://10.0.0.1:22223
or its admin endpoint: POST /pools/POOL/servers?migrate=true (with --persist
the record is written to the file and removed when the migration completes).")]
pub struct MigrateArgs {
    #[command(subcommand)]
    command: MigrateCommand,
}

#[derive(Subcommand, Debug)]
enum MigrateCommand {
    /// Each proxy's migrations: state, keys moved and left, rate, ETA.
    Status {
        /// The proxies' admin endpoints (http://HOST:PORT).
        #[arg(value_name = "ADMIN_URL", required_unless_present = "etcd")]
        urls: Vec<String>,
        /// Every proxy registered in this etcd fleet (etcd://HOST:PORT/PREFIX)
        /// instead, by the admin endpoint it registered.
        #[arg(long, value_name = "URL/PREFIX", conflicts_with = "urls")]
        etcd: Option<String>,
        #[command(flatten)]
        tls: crate::etcd_tls::EtcdTlsArgs,
        /// Ask again every --interval seconds until no proxy is migrating
        /// (a progress bar on a terminal).
        #[arg(long)]
        watch: bool,
        /// Seconds between two looks with --watch.
        #[arg(long, value_name = "SECS", default_value_t = 1.0)]
        interval: f64,
        /// The config file the proxies read: each proxy is also checked
        /// to run the file's change, and --watch waits for any that has
        /// not loaded it yet (a look right after `chash config ... --now`
        /// comes before the proxies reload the file).
        #[arg(short = 'c', long = "config", value_name = "FILE", conflicts_with = "etcd")]
        config: Option<PathBuf>,
        /// The pool in FILE (may be left out when the file has one).
        #[arg(long, value_name = "NAME", requires = "config")]
        pool: Option<String>,
    },
    /// An armed migration to `moving`, once every proxy runs the armed change.
    Start {
        #[command(flatten)]
        file: FileTarget,
    },
    /// A completed migration's record removed from the file, once every
    /// proxy completed it.
    Finish {
        #[command(flatten)]
        file: FileTarget,
    },
}

#[derive(Args, Debug)]
struct FileTarget {
    /// The config file.
    #[arg(short = 'c', long = "config", value_name = "FILE", required_unless_present = "etcd")]
    config: Option<PathBuf>,
    /// The config stored in etcd instead (etcd://HOST:PORT/PREFIX): every
    /// registered proxy is checked, through its report.
    #[arg(long, value_name = "URL/PREFIX", conflicts_with_all = ["config", "output", "in_place", "check"])]
    etcd: Option<String>,
    #[command(flatten)]
    tls: crate::etcd_tls::EtcdTlsArgs,
    /// With --etcd: wait up to SECS for every proxy to be ready (armed
    /// for start, default 30; completed for finish, default 0).
    #[arg(long, value_name = "SECS", requires = "etcd")]
    wait: Option<f64>,
    /// The pool (may be left out when the file has one).
    #[arg(long, value_name = "NAME")]
    pool: Option<String>,
    /// Write the new file here instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "OUT", conflicts_with = "in_place")]
    output: Option<PathBuf>,
    /// Write the new file back to FILE (atomically).
    #[arg(short = 'i', long = "in-place")]
    in_place: bool,
    /// A proxy reading the file (its admin endpoint; repeat for each): each
    /// must run the armed change (start) or have completed it (finish).
    #[arg(long = "check", value_name = "ADMIN_URL", required_unless_present_any = ["force", "etcd"])]
    check: Vec<String>,
    /// Skip the check (you know every proxy is where it must be).
    #[arg(long)]
    force: bool,
}

pub fn run(args: MigrateArgs) -> Result<bool> {
    match args.command {
        MigrateCommand::Status { urls, etcd, tls, watch, interval, config, pool } => {
            let urls = match etcd {
                Some(url) => etcd_admin_urls(&url, &tls)?,
                None => urls,
            };
            let expected = config.map(|path| Expected::read(&path, pool.as_deref())).transpose()?;
            status(&urls, watch, interval, expected.as_ref())
        }
        MigrateCommand::Start { file } if file.etcd.is_some() => on_etcd(&file, true),
        MigrateCommand::Finish { file } if file.etcd.is_some() => on_etcd(&file, false),
        MigrateCommand::Start { file } => start(&file),
        MigrateCommand::Finish { file } => finish(&file),
    }
}

#[cfg(feature = "etcd")]
fn etcd_admin_urls(url: &str, tls: &crate::etcd_tls::EtcdTlsArgs) -> Result<Vec<String>> {
    crate::etcd_migrate::admin_urls(&tls.target(url)?)
}

#[cfg(feature = "etcd")]
fn on_etcd(file: &FileTarget, start: bool) -> Result<bool> {
    let url = file.etcd.as_deref().unwrap_or_default();
    let target = file.tls.target(url)?;
    if start {
        crate::etcd_migrate::start(&target, file.pool.as_deref(), file.wait, file.force)
    } else {
        crate::etcd_migrate::finish(&target, file.pool.as_deref(), file.wait, file.force)
    }
}

#[cfg(not(feature = "etcd"))]
fn etcd_admin_urls(_url: &str, _tls: &crate::etcd_tls::EtcdTlsArgs) -> Result<Vec<String>> {
    bail!("--etcd needs etcd support, which this chash was built without (cargo feature `etcd`)")
}

#[cfg(not(feature = "etcd"))]
fn on_etcd(_file: &FileTarget, _start: bool) -> Result<bool> {
    bail!("--etcd needs etcd support, which this chash was built without (cargo feature `etcd`)")
}

/// A pool's migration as one proxy reports it.
struct Seen {
    source: String,
    pool: String,
    migration: Option<Value>,
    numbers: Value,
}

impl Seen {
    /// The pool version the proxy runs.
    fn version(&self) -> &str {
        self.numbers["membership_version"].as_str().unwrap_or("?")
    }
}

fn look(urls: &[String]) -> Result<Vec<Seen>> {
    let mut out = Vec::new();
    for url in urls {
        let stats = fetch_stats(url).with_context(|| format!("{url}: cannot ask it"))?;
        for p in stats["pools"].as_array().cloned().unwrap_or_default() {
            out.push(Seen {
                source: url.clone(),
                pool: p["name"].as_str().unwrap_or("?").to_owned(),
                migration: p.get("migration").cloned(),
                numbers: p,
            });
        }
    }
    Ok(out)
}

/// The change a config file holds for one pool, as `chash migrate status
/// -c FILE` checks the proxies against it.
struct Expected {
    file: String,
    pool: String,
    /// The pool's version as the file has it (armed or moving, or no
    /// migration).
    now: String,
    /// Its version once a proxy completed the migration.
    done: String,
}

impl Expected {
    fn read(path: &std::path::Path, pool: Option<&str>) -> Result<Expected> {
        let (_, name, pool) = read_pool(path, pool)?;
        Ok(Expected::of(path, name, &pool))
    }

    fn of(path: &std::path::Path, name: String, pool: &chash::PoolConfig) -> Expected {
        Expected {
            file: path.display().to_string(),
            pool: name,
            now: pool.version(),
            done: pool.with_migration_state(None).version(),
        }
    }

    /// The version `s` runs, when it is this file's pool at neither of the
    /// change's versions: it has not loaded the file yet.
    fn lagging<'a>(&self, s: &'a Seen) -> Option<&'a str> {
        let version = s.version();
        (s.pool == self.pool && version != self.now && version != self.done).then_some(version)
    }
}

fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

fn status(urls: &[String], watch: bool, interval: f64, expected: Option<&Expected>) -> Result<bool> {
    let bar = (watch && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(0);
        if let Ok(style) = indicatif::ProgressStyle::with_template("migrating [{bar:30}] {pos}/{len} keys moved  {msg}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    });
    loop {
        let seen = look(urls)?;
        let migrating: Vec<&Seen> = seen.iter().filter(|s| s.migration.is_some()).collect();
        // Per proxy, the version it runs when it has not loaded the file's change.
        let behind: Vec<Option<&str>> = seen.iter().map(|s| expected.and_then(|e| e.lagging(s))).collect();
        let lagging = behind.iter().flatten().count();
        let mut out = std::io::stdout().lock();
        if !watch || bar.is_none() {
            for (s, behind) in seen.iter().zip(&behind) {
                if let (Some(e), Some(version)) = (expected, behind) {
                    writeln!(
                        out,
                        "{}  {}: has not loaded {}'s change yet (runs version {version}, the file's is {})",
                        s.source, s.pool, e.file, e.now
                    )?;
                    continue;
                }
                let Some(m) = &s.migration else {
                    let done = n(&s.numbers, "migrations_completed");
                    writeln!(
                        out,
                        "{}  {}: not migrating ({done} migration{} completed)",
                        s.source,
                        s.pool,
                        if done == 1 { "" } else { "s" }
                    )?;
                    continue;
                };
                if m["state"] == "armed" {
                    // Nothing moves or is counted yet.
                    writeln!(
                        out,
                        "{}  {}: armed: the keys the change moves are held until it moves (chash migrate start)",
                        s.source, s.pool
                    )?;
                    continue;
                }
                let v = &s.numbers;
                writeln!(
                    out,
                    "{}  {}: {} ({}), moved {} + {} on access, scanned {} of {}, ~{} left, {} keys/s, ETA {} s, {} large, {} conflicts, {} errors{}",
                    s.source,
                    s.pool,
                    m["state"].as_str().unwrap_or("?"),
                    m["phase"].as_str().unwrap_or("?"),
                    n(v, "migration_keys_moved"),
                    n(v, "migration_keys_moved_on_access"),
                    n(v, "migration_keys_scanned"),
                    n(v, "migration_keys_total"),
                    n(v, "migration_keys_remaining"),
                    n(v, "migration_keys_per_second"),
                    n(v, "migration_eta_seconds"),
                    n(v, "migration_large_keys"),
                    n(v, "migration_conflicts"),
                    n(v, "migration_errors"),
                    m["last_error"].as_str().map(|e| format!("; last error: {e}")).unwrap_or_default(),
                )?;
            }
        }
        if let Some(bar) = &bar {
            let moved: u64 = migrating
                .iter()
                .map(|s| n(&s.numbers, "migration_keys_moved") + n(&s.numbers, "migration_keys_moved_on_access"))
                .sum();
            let left: u64 = migrating.iter().map(|s| n(&s.numbers, "migration_keys_remaining")).sum();
            bar.set_length(moved + left);
            bar.set_position(moved);
            let rate: u64 = migrating.iter().map(|s| n(&s.numbers, "migration_keys_per_second")).sum();
            let waiting = match lagging {
                0 => String::new(),
                n => format!(", {n} not reloaded yet"),
            };
            bar.set_message(format!("{rate} keys/s, {} proxies migrating{waiting}", migrating.len()));
        }
        if !watch || (migrating.is_empty() && lagging == 0) {
            if let Some(bar) = &bar {
                bar.finish_and_clear();
            }
            if watch {
                writeln!(out, "no proxy is migrating")?;
            }
            return Ok(true);
        }
        drop(out);
        std::thread::sleep(Duration::from_secs_f64(interval.max(0.05)));
    }
}

/// The file, its pool's name and config.
fn read(file: &FileTarget) -> Result<(String, String, chash::PoolConfig)> {
    read_pool(path(file)?, file.pool.as_deref())
}

/// The file's text, the pool's name (`pool`, or the file's one pool) and
/// its config.
fn read_pool(path: &std::path::Path, pool: Option<&str>) -> Result<(String, String, chash::PoolConfig)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let config = Config::from_yaml(&text).with_context(|| path.display().to_string())?;
    let name = pick_pool(&config, pool)?;
    let pool = config.pool(Some(&name))?;
    Ok((text, name, pool))
}

fn path(file: &FileTarget) -> Result<&PathBuf> {
    file.config.as_ref().ok_or_else(|| anyhow::anyhow!("name the config: -c FILE or --etcd URL/PREFIX"))
}

fn write(file: &FileTarget, text: &str) -> Result<()> {
    match (file.in_place, &file.output) {
        (true, _) => {
            let path = path(file)?;
            write_atomically(path, text).with_context(|| format!("cannot write {}", path.display()))
        }
        (false, Some(out)) => write_atomically(out, text).with_context(|| format!("cannot write {}", out.display())),
        (false, None) => {
            std::io::stdout().write_all(text.as_bytes())?;
            Ok(())
        }
    }
}

fn start(file: &FileTarget) -> Result<bool> {
    let (text, name, pool) = read(file)?;
    let Some(m) = &pool.migration else {
        bail!(
            "nothing to start: pool {name} of {} has no armed change (chash config add|remove|weight writes one, in a \
             pool with migrate: true or with --migrate)",
            path(file)?.display()
        )
    };
    if m.state != MigrationState::Armed {
        bail!("pool {name}'s migration is {} already", m.state.name());
    }
    let armed = pool.version();
    if !file.force {
        for s in look(&file.check)?.iter().filter(|s| s.pool == name) {
            let version = s.version();
            if version != armed {
                bail!(
                    "{} runs pool {name} at version {version}, not the armed change's {armed}: it may still write moved \
                     keys to their old servers; let it reload the file, then start again",
                    s.source
                );
            }
        }
    }
    let moving = pool.with_migration_state(Some(MigrationState::Moving));
    let text = set_migration(&text, &name, moving.migration.as_ref())?;
    write(file, &text)?;
    eprintln!(
        "chash migrate: pool {name}: moving (version {}); chash migrate status ... --watch follows it",
        moving.version()
    );
    Ok(true)
}

fn finish(file: &FileTarget) -> Result<bool> {
    let (text, name, pool) = read(file)?;
    if pool.migration.is_none() {
        bail!("pool {name} of {} is not migrating", path(file)?.display());
    }
    let change = Expected::of(path(file)?, name.clone(), &pool);
    if !file.force {
        for s in look(&file.check)?.iter().filter(|s| s.pool == name) {
            if let Some(m) = &s.migration {
                bail!(
                    "{} is still migrating pool {name} ({}, ~{} keys left): keys not moved yet would be lost to its \
                     clients; wait for it (chash migrate status --watch)",
                    s.source,
                    m["phase"].as_str().unwrap_or("?"),
                    n(&s.numbers, "migration_keys_remaining")
                );
            }
            // Completed this change's migration: the change's version with
            // no migration. A proxy that has not loaded the file yet (it
            // may have completed an earlier one) must not have the record
            // taken away before it has moved the keys.
            let version = s.version();
            if version != change.done {
                let Expected { file: shown, now, done, .. } = &change;
                bail!(
                    "{} has not completed the migration of pool {name}: it runs version {version}; the change is \
                     version {now} in {shown} while it moves, {done} once migrated. Let the proxy reload {shown} and \
                     complete (chash migrate status {} -c {shown} --watch), then finish again",
                    s.source,
                    s.source,
                );
            }
        }
    }
    let text = set_migration(&text, &name, None)?;
    write(file, &text)?;
    eprintln!("chash migrate: pool {name}: migration record removed (version {})", change.done);
    Ok(true)
}
