//! `chash config`: edit a config file the way the proxy changes its pools,
//! keeping everything else in the file as written.

use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use chash::config_edit::{edit_text, write_atomically};
use chash::{Edit, ServerLine};
use clap::{Args, Subcommand};

use crate::etcd_tls::EtcdTlsArgs;
use crate::plan::{report, PlanArgs};

#[derive(Args, Debug)]
#[command(after_help = "\
Each command changes one pool's servers: list the way `chash proxy` changes
them live (admin endpoint, --persist), so a proxy started from the new file
places every key where the running ones do. Everything else in the file
(other pools, key order, comments, quoting) stays as written, so the file can
live in git. The new file goes to standard output, or to -o OUT, or back to
FILE with -i (written to a temporary file and renamed: never half-written).

What the file says per distribution:
  ring, ketama, modula, ...  a removed server's line goes; an ejected one
                             stays in its place, marked `ejected`.
  anchor (memento)           a server's line is its bucket: a removed
                             server's line stays, marked `removed N` (the N-th
                             bucket freed), so the others keep theirs; a new
                             server takes the bucket freed last.
  jump                       servers are numbered by their place: only the
                             last one can leave; other changes are refused.

Examples:
  chash config add     -c nutcracker.yml '10.0.0.9:11211:1 cache-9' -i
  chash config remove  -c nutcracker.yml --pool sessions 10.0.0.3:6379 --plan -o new.yml
  chash config weight  -c nutcracker.yml 10.0.0.2:11211 3 -i
  chash config eject   -c nutcracker.yml 10.0.0.4:11211 -i
  chash config restore -c nutcracker.yml 10.0.0.4:11211 -i

--plan prints what the change moves, as `chash plan` does (to standard
output with -o or -i, else to standard error). Any error: exit 2, one line.

A fleet on etcd (chash proxy --membership etcd://HOST:PORT/PREFIX): with
--etcd URL/PREFIX instead of -c, the same change is made to the config stored
at PREFIX/config and written with a compare-and-swap on the key's revision
(https://HOST:PORT/PREFIX: TLS, with --etcd-ca, --etcd-cert, --etcd-key).
When another writer changed it since it was read, nothing is written and the
command fails with `conflict: ...` (exit 2); --retry N reads it again and
re-applies the change, up to N times. --wait SECS then waits until every
proxy registered under PREFIX/proxies/ reports the new revision, and exits 1
naming those that lag.
  chash config add    --etcd etcd://10.0.0.1:2379/chash/web '10.0.0.9:11211:1 cache-9' --retry 3 --wait 10
  chash config remove --etcd etcd://10.0.0.1:2379,10.0.0.2:2379/chash/web 10.0.0.3:11211
  chash config put    --etcd etcd://10.0.0.1:2379/chash/web nutcracker.yml   # whole file, validated first
  chash config get    --etcd etcd://10.0.0.1:2379/chash/web > nutcracker.yml")]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Add a server: `ID:WEIGHT [NAME]`.
    Add {
        #[command(flatten)]
        file: FileArgs,
        /// The server line, e.g. `10.0.0.9:11211:1 cache-9`.
        #[arg(value_name = "SERVERLINE")]
        line: String,
    },
    /// Remove a server by id (HOST:PORT).
    Remove {
        #[command(flatten)]
        file: FileArgs,
        /// The server's id.
        #[arg(value_name = "ID")]
        id: String,
        /// Proxies that reload the file keep the server as a warm-up source
        /// for SECS (memcached pools): its keys are read from it, and copied
        /// to their new servers, until then. Written as the pool's `drain:`
        /// key (the time it ends).
        #[arg(long, value_name = "SECS")]
        drain: Option<u64>,
    },
    /// Change a server's weight.
    Weight {
        #[command(flatten)]
        file: FileArgs,
        /// The server's id.
        #[arg(value_name = "ID")]
        id: String,
        /// Its new weight (1 or more).
        #[arg(value_name = "WEIGHT")]
        weight: u32,
    },
    /// Take a server out (it stays listed, marked `ejected`).
    Eject {
        #[command(flatten)]
        file: FileArgs,
        /// The server's id.
        #[arg(value_name = "ID")]
        id: String,
    },
    /// Bring an ejected server back.
    Restore {
        #[command(flatten)]
        file: FileArgs,
        /// The server's id.
        #[arg(value_name = "ID")]
        id: String,
    },
    /// Upload a whole config file to etcd (validated first; compare-and-swap).
    Put {
        #[command(flatten)]
        store: StoreArgs,
        /// The config file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Upload it even when it renumbers an anchor or jump pool of the
        /// stored config (every key after the changed line moves).
        #[arg(long)]
        force: bool,
    },
    /// Print the config stored in etcd (its revision on standard error).
    Get {
        /// Where the config is stored: etcd://HOST:PORT[,HOST:PORT...]/PREFIX.
        #[arg(long, value_name = "URL/PREFIX")]
        etcd: String,
        #[command(flatten)]
        tls: EtcdTlsArgs,
    },
}

#[derive(Args, Debug)]
struct StoreArgs {
    /// Where the config is stored: etcd://HOST:PORT[,HOST:PORT...]/PREFIX.
    #[arg(long, value_name = "URL/PREFIX")]
    etcd: String,

    #[command(flatten)]
    tls: EtcdTlsArgs,

    /// When another writer changed the stored config since it was read,
    /// read it again and re-apply, up to N times.
    #[arg(long, value_name = "N", default_value_t = 0)]
    retry: u32,

    /// Wait up to SECS until every registered proxy applied the new
    /// revision; exit 1 naming those that lag.
    #[arg(long, value_name = "SECS")]
    wait: Option<f64>,
}

#[derive(Args, Debug)]
struct FileArgs {
    /// The config file to edit.
    #[arg(short = 'c', long = "config", value_name = "FILE", required_unless_present = "etcd")]
    config: Option<PathBuf>,

    /// Edit the config stored in etcd instead of a file
    /// (etcd://HOST:PORT[,HOST:PORT...]/PREFIX; the key PREFIX/config),
    /// written with a compare-and-swap on its revision.
    #[arg(long, value_name = "URL/PREFIX", conflicts_with_all = ["config", "output", "in_place"])]
    etcd: Option<String>,

    #[command(flatten)]
    tls: EtcdTlsArgs,

    /// With --etcd: when another writer changed the stored config since it
    /// was read, read it again and re-apply the change, up to N times.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "etcd")]
    retry: u32,

    /// With --etcd: wait up to SECS until every registered proxy applied
    /// the new revision; exit 1 naming those that lag. A migrating change
    /// waits (default 30 s) for every proxy to arm before anything moves,
    /// and is taken back when some do not.
    #[arg(long, value_name = "SECS", requires = "etcd")]
    wait: Option<f64>,

    /// The pool to change (may be left out when the file has one).
    #[arg(long, value_name = "NAME")]
    pool: Option<String>,

    /// Write the new file here instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "OUT", conflicts_with = "in_place")]
    output: Option<PathBuf>,

    /// Write the new file back to FILE (atomically).
    #[arg(short = 'i', long = "in-place")]
    in_place: bool,

    /// Also print what the change moves (as `chash plan`).
    #[arg(long)]
    plan: bool,

    /// Redis pools: move the data of the keys the change moves (the
    /// default of a pool with `migrate: true`). Written `armed`; in a file,
    /// start it with `chash migrate start` once every proxy has the file;
    /// with --etcd, the command waits for every registered proxy to arm,
    /// then writes it `moving`.
    #[arg(long, conflicts_with = "no_migrate")]
    migrate: bool,

    /// Do not migrate, even in a pool with `migrate: true` (the keys that
    /// move are lost to their clients).
    #[arg(long)]
    no_migrate: bool,

    /// With --migrate (or in a pool with `migrate: true`): written `moving`
    /// at once, for a file only one proxy reads (a fleet must arm first).
    #[arg(long, conflicts_with = "no_migrate")]
    now: bool,
}

/// Runs a `chash config` command: `false` when `--wait` saw proxies lag.
pub fn run(args: ConfigArgs) -> Result<bool> {
    let mut drain = None;
    let (file, edit) = match args.command {
        ConfigCommand::Add { file, line } => {
            let line: ServerLine = line.parse()?;
            (file, Edit::Add(line))
        }
        ConfigCommand::Remove { file, id, drain: secs } => {
            drain = secs.map(|s| (id.clone(), s));
            (file, Edit::Remove(id))
        }
        ConfigCommand::Weight { file, id, weight } => (file, Edit::Weight(id, weight)),
        ConfigCommand::Eject { file, id } => (file, Edit::Eject(id)),
        ConfigCommand::Restore { file, id } => (file, Edit::Restore(id)),
        ConfigCommand::Put { store, file, force } => return put(&store, &file, force),
        ConfigCommand::Get { etcd, tls } => return get(&etcd, &tls).map(|()| true),
    };
    let change = |text: &str| -> Result<chash::config_edit::Edited> {
        let mut edited = edit_text(text, file.pool.as_deref(), &edit)?;
        if let Some((id, secs)) = &drain {
            if edited.after.redis {
                anyhow::bail!(
                    "--drain keeps a memcached server as a warm-up source; pool {} is a Redis pool",
                    edited.after.name
                );
            }
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            edited.text = chash::config_edit::set_drain(&edited.text, &edited.after.name, id, now + secs)?;
        }
        let moves = matches!(edit, Edit::Add(_) | Edit::Remove(_) | Edit::Weight(..));
        if moves && (file.migrate || (edited.before.migrate && !file.no_migrate)) {
            let state = if file.now { chash::MigrationState::Moving } else { chash::MigrationState::Armed };
            let after = edited.after.migrating_from(&edited.before, state)?;
            // The servers can move the keys (a probe key each way), or
            // nothing is written.
            let (mut before, mut probe) = (edited.before.clone(), after.clone());
            chash_proxy::resolve_secrets(&mut before)?;
            chash_proxy::resolve_secrets(&mut probe)?;
            chash_proxy::check_migration(&before, &probe).map_err(anyhow::Error::msg)?;
            edited.text =
                chash::config_edit::set_migration(&edited.text, &edited.after.name, after.migration.as_ref())?;
            edited.after = after;
        } else if !moves && (file.migrate || file.now) {
            let flag = if file.migrate { "--migrate" } else { "--now" };
            anyhow::bail!("{flag} goes with add, remove and weight (the changes that move keys)");
        } else if file.now {
            // A change that moves keys, in a pool that does not migrate
            // (with --migrate it would have, above).
            let why = if edited.after.redis {
                "does not migrate (add --migrate, or set migrate: true in it)"
            } else {
                "is a memcached pool, which warms up instead of migrating (warmup)"
            };
            anyhow::bail!("--now starts a migration: pool {} {why}", edited.after.name);
        }
        if matches!(edit, Edit::Add(_)) {
            // A server the proxy could not connect to would make the file
            // one it refuses: say so now.
            chash_proxy::check_servers(&edited.after)?;
        }
        Ok(edited)
    };
    if let Some(url) = &file.etcd {
        if file.now {
            anyhow::bail!(
                "--now is for a file one proxy reads; a fleet on etcd arms every proxy first (--migrate does, \
                 waiting up to --wait SECS)"
            );
        }
        return edit_stored(url, &file, change, &edit);
    }
    let Some(config) = &file.config else { anyhow::bail!("name the config: -c FILE or --etcd URL/PREFIX") };
    let text = std::fs::read_to_string(config).with_context(|| format!("cannot read {}", config.display()))?;
    let edited = change(&text).with_context(|| config.display().to_string())?;
    let target = if file.in_place { Some(config.clone()) } else { file.output.clone() };
    match &target {
        Some(path) => {
            write_atomically(path, &edited.text).with_context(|| format!("cannot write {}", path.display()))?;
            say_written(path, &edit, &edited);
        }
        None => {
            let mut out = io::stdout().lock();
            out.write_all(edited.text.as_bytes())?;
            out.flush()?;
        }
    }
    if file.plan {
        let to = target.clone().unwrap_or_else(|| PathBuf::from("(standard output)"));
        let plan = PlanArgs::labelled(config.clone(), to);
        if target.is_some() {
            report(&plan, edited.before, edited.after, &mut io::stdout().lock())?;
        } else {
            report(&plan, edited.before, edited.after, &mut io::stderr().lock())?;
        }
    }
    Ok(true)
}

/// What a change written to a file did, on standard error (the file is
/// the output); for a migration the change starts, what to run next.
fn say_written(path: &std::path::Path, edit: &Edit, edited: &chash::config_edit::Edited) {
    // A change is refused while a migration is under way
    // (`PoolConfig::apply`): one in `after` is this change's.
    let (shown, name) = (path.display(), &edited.after.name);
    match edited.after.migration.as_ref().map(|m| m.state) {
        Some(chash::MigrationState::Armed) => eprintln!(
            "{shown}: {edit} (pool {name}), written armed: each proxy that reads the file holds the keys it moves\n  \
             move them, once every proxy runs it: chash migrate start -c {shown} -i --check URL (each proxy's admin \
             endpoint)"
        ),
        Some(chash::MigrationState::Moving) => eprintln!(
            "{shown}: {edit} (pool {name}), written moving (--now)\n  follow it: chash migrate status URL -c {shown} --watch \
             (the proxy's admin endpoint)\n  end it:    chash migrate finish -c {shown} -i --check URL (once the proxy \
             completed it)"
        ),
        _ => eprintln!("{shown}: {edit} (pool {name})"),
    }
}

/// The change made to the config stored in etcd (compare-and-swap).
#[cfg(feature = "etcd")]
fn edit_stored(
    url: &str,
    file: &FileArgs,
    change: impl Fn(&str) -> Result<chash::config_edit::Edited>,
    edit: &Edit,
) -> Result<bool> {
    let target = file.tls.target(url)?;
    // A migrating change (--migrate, or a pool with `migrate: true`) is
    // written armed, and moves only once every proxy runs it.
    let written = crate::etcd::edit(&target, file.retry, change, &edit.to_string())?;
    let ok = if written.edited.after.migration.is_some() {
        crate::etcd_migrate::arm(&target, &written, file.wait)?
    } else {
        match file.wait {
            Some(secs) => crate::etcd::wait(&target, written.revision, secs)?,
            None => true,
        }
    };
    if file.plan {
        let key = target.config_key();
        let plan = PlanArgs::labelled(
            PathBuf::from(format!("{key}@{}", written.read)),
            PathBuf::from(format!("{key}@{}", written.revision)),
        );
        report(&plan, written.edited.before, written.edited.after, &mut io::stdout().lock())?;
    }
    Ok(ok)
}

#[cfg(feature = "etcd")]
fn put(store: &StoreArgs, file: &std::path::Path, force: bool) -> Result<bool> {
    crate::etcd::put(&store.tls.target(&store.etcd)?, file, force, store.retry, store.wait)
}

#[cfg(feature = "etcd")]
fn get(url: &str, tls: &EtcdTlsArgs) -> Result<()> {
    crate::etcd::get(&tls.target(url)?)
}

#[cfg(not(feature = "etcd"))]
fn no_etcd() -> anyhow::Error {
    anyhow::anyhow!("--etcd needs etcd support, which this chash was built without (cargo feature `etcd`)")
}

#[cfg(not(feature = "etcd"))]
fn edit_stored(
    _url: &str,
    _file: &FileArgs,
    _change: impl Fn(&str) -> Result<chash::config_edit::Edited>,
    _edit: &Edit,
) -> Result<bool> {
    Err(no_etcd())
}

#[cfg(not(feature = "etcd"))]
fn put(_store: &StoreArgs, _file: &std::path::Path, _force: bool) -> Result<bool> {
    Err(no_etcd())
}

#[cfg(not(feature = "etcd"))]
fn get(_url: &str, _tls: &EtcdTlsArgs) -> Result<()> {
    Err(no_etcd())
}
