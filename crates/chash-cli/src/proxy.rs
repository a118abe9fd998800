//! `chash proxy` (also what runs when the binary is called `nutcracker`):
//! twemproxy's flags, signals, stats port, log file and pid file, in front
//! of the proxy library.

use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use chash::config::Config;
use chash::PoolConfig;
use chash::ServerLine;
use chash_proxy::{Address, PoolSpec, ProxyOptions, Running};
use clap::Args;
use tokio::signal::unix::{signal, SignalKind};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

#[derive(Args, Debug)]
#[command(
    version,
    after_help = "\
Without -c, serves an embedded default: one memcached pool on 127.0.0.1:22121
in front of three in-process cache shards, so it works with nothing installed.
Called as `nutcracker` (a symlink), it reads /etc/nutcracker/nutcracker.yml
and logs to /var/log/nutcracker/nutcracker.log unless told otherwise, as
Debian's nutcracker does.

Stats: twemproxy's JSON document on -a:-s (default 0.0.0.0:22222) to anyone
who connects (`nc 127.0.0.1 22222`), refreshed every -i ms. chash's own
HTTP admin endpoint (default http://127.0.0.1:22223, --admin): GET /stats,
GET /metrics, GET /pools, POST /pools/POOL/servers (body ID:WEIGHT [NAME]),
DELETE /pools/POOL/servers/ID[?drain=SECS] (the server stays a warm-up
source for SECS), PUT /pools/POOL/servers/ID/weight,
POST /pools/POOL/servers/ID/eject|restore, POST /reload. Changes made there
live in memory unless --persist writes them back to the config file; off
loopback the endpoint needs --admin-token-file (or --admin-insecure).

The config file is watched: replaced (renamed over, a ConfigMap's symlink
swap) or rewritten, it is reloaded within a second; a file that does not
parse, or that would renumber an anchor or jump pool, is refused and the
last good config stays (the error is in /stats and /metrics). --no-watch
turns this off.

A fleet on etcd: --membership etcd://HOST:PORT[,HOST:PORT...]/PREFIX reads
the config (the same YAML, every pool) from the key PREFIX/config instead of
a file and watches it: every new revision is validated and applied as a
reload (an invalid one is refused, the last good config stays, and the error
is in /stats and /metrics). An etcd outage changes nothing: the proxy keeps
serving and resumes the watch where it left off. The proxy registers under
PREFIX/proxies/ID with a lease (its admin URL, applied revision and
fingerprints: `chash fleet status --etcd`). With --membership-cache FILE it
keeps the last applied config there and starts from it when etcd is
unreachable; without one it then refuses to start. Change the membership
with `chash config ... --etcd`; the admin endpoint's changes are refused.
An https://HOST:PORT/PREFIX URL speaks TLS to etcd (--etcd-ca, --etcd-cert,
--etcd-key, or CHASH_ETCD_CA, CHASH_ETCD_CERT, CHASH_ETCD_KEY).

Signals: SIGHUP reopens the log file (-o) and re-reads the config file
(servers and placement change live; only the changed servers' keys move);
SIGTTIN raises and SIGTTOU lowers the log level by one; SIGUSR1 and SIGUSR2
are ignored; SIGINT and SIGTERM stop accepting, let in-flight requests
finish, remove the pid file and exit 0.

Examples:
  chash proxy                                   # embedded default
  chash proxy -c nutcracker.yml -s 22222 -o /var/log/chash.log -p /run/chash.pid -d
  chash proxy -c nutcracker.yml --test-conf
  chash proxy -c nutcracker.yml --persist --admin 0.0.0.0:22223 --admin-token-file /etc/chash/token
  chash proxy --membership etcd://10.0.0.1:2379,10.0.0.2:2379/chash/web --membership-cache /var/lib/chash/web.yml"
)]
pub struct ProxyArgs {
    /// twemproxy-style YAML config file (every pool in it is served).
    #[arg(short = 'c', long = "conf-file", value_name = "FILE")]
    config: Option<PathBuf>,

    /// twemproxy's stats port: its JSON stats document, to anyone who
    /// connects (0 picks a free port).
    #[arg(short = 's', long = "stats-port", value_name = "PORT", default_value_t = 22222)]
    stats_port: u16,

    /// The stats port's address (twemproxy's default: every interface).
    #[arg(short = 'a', long = "stats-addr", value_name = "ADDR", default_value = "0.0.0.0")]
    stats_addr: std::net::IpAddr,

    /// How often the stats document's counters are refreshed, in
    /// milliseconds (twemproxy's aggregation interval).
    #[arg(short = 'i', long = "stats-interval", value_name = "MSEC", default_value_t = 30_000)]
    stats_interval: u64,

    /// Do not serve the stats port.
    #[arg(long)]
    no_stats: bool,

    /// chash's HTTP admin endpoint: /stats, /metrics and live membership
    /// changes (loopback unless you say otherwise; 0 as port picks one).
    /// Default: 127.0.0.1:22223, or, when another process (a second proxy
    /// on this host) holds that port, a free port on 127.0.0.1, announced
    /// at start and in the log. A port given here must be free.
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,

    /// Do not serve the admin endpoint.
    #[arg(long)]
    no_admin: bool,

    /// A file holding the admin endpoint's token: requests that change
    /// anything then need `Authorization: Bearer <token>` (reading stays
    /// open). Needed to serve the admin endpoint off loopback.
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,

    /// Serve the admin endpoint over HTTPS with this certificate chain
    /// (PEM; with --admin-tls-key). Reloaded, as the pools' TLS files, on
    /// SIGHUP and when the config file reloads. Off loopback, the token
    /// otherwise crosses the network in clear.
    #[arg(long, value_name = "FILE", requires = "admin_tls_key")]
    admin_tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --admin-tls-cert.
    #[arg(long, value_name = "FILE", requires = "admin_tls_cert")]
    admin_tls_key: Option<PathBuf>,

    /// With --admin-tls-cert: admin clients must present a certificate
    /// that chains to this CA (mutual TLS).
    #[arg(long, value_name = "FILE", requires = "admin_tls_cert")]
    admin_tls_client_ca: Option<PathBuf>,

    /// Serve the admin endpoint on a non-loopback address without a token
    /// (anyone who can reach it can re-point traffic).
    #[arg(long)]
    admin_insecure: bool,

    /// Write every membership change made through the admin endpoint back
    /// to the config file (atomically), so that a restart places keys as
    /// the live proxy does. Without it changes live in memory only, and
    /// each admin response and log line says so.
    #[arg(long, requires = "config")]
    persist: bool,

    /// Do not watch the config file (by default it is reloaded when it is
    /// replaced or rewritten, e.g. a Kubernetes ConfigMap update).
    #[arg(long)]
    no_watch: bool,

    /// Log level, as twemproxy's -v (0-11): 0-3 errors, 4 warnings, 5-6
    /// info, 7-8 debug, 9-11 trace. SIGTTIN/SIGTTOU move it by one.
    #[arg(short = 'v', long = "verbose", value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u8).range(0..=11))]
    verbosity: u8,

    /// Log to this file instead of standard error; reopened on SIGHUP (for
    /// logrotate).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,

    /// Write the process id to this file; removed on exit.
    #[arg(short = 'p', long = "pid-file", value_name = "FILE")]
    pid_file: Option<PathBuf>,

    /// Run in the background (detached from the terminal, standard streams
    /// closed); returns once the proxy serves, or with its start-up error.
    #[arg(short = 'd', long = "daemonize")]
    daemonize: bool,

    /// Describe twemproxy's stats fields and exit.
    #[arg(short = 'D', long = "describe-stats")]
    describe_stats: bool,

    /// twemproxy's mbuf size (512 to 16777216): accepted for compatibility
    /// and ignored; chash sizes its buffers itself.
    #[arg(short = 'm', long = "mbuf-size", value_name = "BYTES", value_parser = clap::value_parser!(u32).range(512..=16_777_216))]
    mbuf_size: Option<u32>,

    /// Check the config file and exit.
    #[arg(short = 't', long = "test-conf")]
    test_conf: bool,

    /// Largest value accepted from clients, in bytes; larger ones get an
    /// error naming this limit, without being buffered. Default: 1 MiB for
    /// memcached pools (memcached's item size), 64 MiB for Redis pools.
    #[arg(long, value_name = "BYTES")]
    max_value_size: Option<usize>,

    /// Reply bytes a client may leave unread before the proxy stops reading
    /// its requests; a client leaving 16 times that unread is disconnected.
    #[arg(long, value_name = "BYTES", default_value_t = chash_proxy::DEFAULT_CLIENT_BUFFER)]
    client_buffer: usize,

    /// Accept keys with control bytes, as memcached and twemproxy do
    /// (protocol.txt forbids them, so they are refused by default; load
    /// generators such as memcaslap send them).
    #[arg(long)]
    lenient_keys: bool,

    /// Close client connections idle this many seconds (0: never).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    client_idle_timeout: u64,

    /// Worker threads, each serving its share of the client connections
    /// with its own server connections (a pool's server_connections are per
    /// worker). Default: the number of cores minus one, at least one; on a host of
    /// its own, use all cores.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,

    /// Follow a fleet's membership in etcd instead of a file: the config
    /// (the same YAML, every pool) is read from the key PREFIX/config and
    /// watched; every new revision is validated and applied as a reload.
    #[arg(
        long,
        value_name = "etcd://HOST:PORT[,HOST:PORT...]/PREFIX",
        conflicts_with_all = ["config", "persist", "test_conf"]
    )]
    membership: Option<String>,

    /// TLS to etcd (--membership https://...).
    #[command(flatten)]
    etcd_tls: crate::etcd_tls::EtcdTlsArgs,

    /// With --membership: the last good config this proxy applied, written
    /// (atomically) after every applied revision; when etcd is unreachable
    /// at start, the proxy starts from it (and says so).
    #[arg(long, value_name = "FILE", requires = "membership")]
    membership_cache: Option<PathBuf>,

    /// With --membership: this proxy's id under PREFIX/proxies/. Default:
    /// HOSTNAME-PORT of the admin endpoint (HOSTNAME-pidPID without one).
    #[arg(long, value_name = "ID", requires = "membership")]
    proxy_id: Option<String>,

    /// Redis pools migrating (`migrate`): keys the background mover moves
    /// per second, at most (0: no limit). Keys used by commands move at
    /// once whatever this says.
    #[arg(long, value_name = "N", default_value_t = chash_proxy::MoveSettings::default().keys_per_second)]
    migrate_keys_per_second: u64,

    /// Redis pools migrating: bytes the mover moves per second, at most (as
    /// the servers' MEMORY USAGE counts them; 0: no limit).
    #[arg(long, value_name = "BYTES", default_value_t = chash_proxy::MoveSettings::default().bytes_per_second)]
    migrate_bytes_per_second: u64,

    /// Redis pools migrating: keys larger than this (MEMORY USAGE) are
    /// reported and moved last, one at a time.
    #[arg(long, value_name = "BYTES", default_value_t = chash_proxy::MoveSettings::default().large_key_bytes)]
    migrate_large_key: u64,

    /// Redis pools migrating: keys per SCAN and per MIGRATE of the mover.
    /// Smaller batches block a server for less time at once.
    #[arg(long, value_name = "N", default_value_t = chash_proxy::MoveSettings::default().batch)]
    migrate_batch: usize,

    /// Redis pools migrating: bytes per MIGRATE of the mover, at most (as
    /// MEMORY USAGE counts them): a MIGRATE blocks its source server while
    /// it copies.
    #[arg(long, value_name = "BYTES", default_value_t = chash_proxy::MoveSettings::default().batch_bytes)]
    migrate_batch_bytes: u64,

    /// Serve pool POOL on ADDR instead of the config's `listen` (repeatable):
    /// several proxies from one stored config on one host. The config's
    /// `listen` stays the fleet-wide default.
    #[arg(long = "listen-override", value_name = "POOL=ADDR")]
    listen_override: Vec<String>,

    /// Memory bound of each embedded shard, in MiB (embedded default only).
    #[arg(long, value_name = "MIB", default_value_t = 64, conflicts_with = "config")]
    shard_memory: u64,

    /// Listen address of the embedded default pool (port 0 picks a free one).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:22121", conflicts_with = "config")]
    listen: String,
}

/// Debian's nutcracker defaults, used when the binary is called `nutcracker`.
const NUTCRACKER_CONF: &str = "/etc/nutcracker/nutcracker.yml";
const NUTCRACKER_LOG: &str = "/var/log/nutcracker/nutcracker.log";

/// The admin endpoint's address unless `--admin` says otherwise.
const DEFAULT_ADMIN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 22223);

/// Marks the background process of `-d`.
const DAEMON_ENV: &str = "CHASH_PROXY_DAEMON";

/// The line a daemon's background process prints when it serves.
const READY: &str = "chash-proxy ready";

impl ProxyArgs {
    /// Applies Debian's nutcracker defaults where a flag was not given.
    pub fn with_nutcracker_defaults(mut self) -> ProxyArgs {
        self.config.get_or_insert_with(|| NUTCRACKER_CONF.into());
        self.output.get_or_insert_with(|| NUTCRACKER_LOG.into());
        self
    }
}

/// The log: standard error or a file that SIGHUP reopens; its level moves
/// with SIGTTIN/SIGTTOU.
struct Log {
    file: Option<(PathBuf, Arc<Mutex<std::fs::File>>)>,
    verbosity: AtomicU8,
    level: tracing_subscriber::reload::Handle<LevelFilter, tracing_subscriber::Registry>,
}

fn level_of(verbosity: u8) -> LevelFilter {
    match verbosity {
        0..=3 => LevelFilter::ERROR,
        4 => LevelFilter::WARN,
        5..=6 => LevelFilter::INFO,
        7..=8 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

/// Writes log lines to the shared file.
struct FileWriter(Arc<Mutex<std::fs::File>>);

impl std::io::Write for FileWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }
}

impl Log {
    fn init(verbosity: u8, output: Option<&Path>) -> Result<Log> {
        let verbosity = verbosity.min(11);
        let (filter, level) = tracing_subscriber::reload::Layer::new(level_of(verbosity));
        let file = match output {
            Some(path) => {
                let f = open_log(path).with_context(|| format!("cannot open log file {}", path.display()))?;
                Some((path.to_owned(), Arc::new(Mutex::new(f))))
            }
            None => None,
        };
        let fmt = tracing_subscriber::fmt::layer().with_target(false);
        let registry = tracing_subscriber::registry().with(filter);
        let _ = match &file {
            Some((_, f)) => {
                let f = f.clone();
                registry.with(fmt.with_ansi(false).with_writer(move || FileWriter(f.clone()))).try_init()
            }
            None => {
                use std::io::IsTerminal as _;
                let colour = std::io::stderr().is_terminal();
                registry.with(fmt.with_ansi(colour).with_writer(std::io::stderr)).try_init()
            }
        };
        Ok(Log { file, verbosity: AtomicU8::new(verbosity), level })
    }

    /// Reopens the log file (after logrotate moved it).
    fn reopen(&self) {
        let Some((path, file)) = &self.file else { return };
        match open_log(path) {
            Ok(f) => *file.lock().unwrap_or_else(|e| e.into_inner()) = f,
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "chash proxy: reopening log file {} failed, ignored: {e}",
                    path.display()
                );
            }
        }
    }

    /// Moves the level by `by` (twemproxy's 0 to 11), as `signal` asked.
    fn shift(&self, by: i8, signal: &str) {
        let now = self.verbosity.load(Relaxed);
        let next = now.saturating_add_signed(by).min(11);
        self.verbosity.store(next, Relaxed);
        let _ = self.level.modify(|l| *l = level_of(next));
        let way = if by > 0 { "up" } else { "down" };
        // At warning level, so that lowering the level still says so.
        tracing::warn!("signal {signal} received: log level {way}, {now} -> {next} ({})", level_of(next));
    }
}

fn load(path: &Path) -> Result<Vec<PoolConfig>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    load_text(&text, &path.display().to_string())
}

/// Every pool of config `text` (from `origin`), checked as the proxy
/// starts them.
fn load_text(text: &str, origin: &str) -> Result<Vec<PoolConfig>> {
    let config = Config::from_yaml(text).with_context(|| origin.to_owned())?;
    let mut pools = Vec::new();
    for (name, _) in &config.pools {
        let mut pool = config.pool(Some(name))?;
        if pool.distribution != chash::Distribution::Random {
            pool.snapshot().with_context(|| format!("{origin}: pool {name:?}"))?;
        }
        chash_proxy::check_servers(&pool).with_context(|| origin.to_owned())?;
        chash_proxy::resolve_secrets(&mut pool).with_context(|| origin.to_owned())?;
        pools.push(pool);
    }
    Ok(pools)
}

/// The advice for an anchor pool whose capacity dwarfs its servers: every
/// lookup that starts on a free bucket re-draws about ln(capacity /
/// servers) times (BENCHMARKS.md, "Lookups on a stream of keys").
fn anchor_advice(pool: &PoolConfig) -> Option<String> {
    let servers = pool.servers.len().max(1);
    let capacity = pool.anchor_capacity as usize;
    (pool.distribution == chash::Distribution::Anchor && capacity >= 16 * servers).then(|| {
        format!(
            "pool {:?}: anchor_capacity {capacity} for {servers} servers: a lookup re-draws about {:.1} times \
             (ln {capacity}/{servers}), several times slower than with a capacity near the pool's size. For a new \
             pool, set anchor_capacity to about twice the most servers it will hold (e.g. {}); on a live pool, \
             changing it moves keys",
            pool.name,
            (capacity as f64 / servers as f64).ln(),
            (2 * servers).next_power_of_two().max(16)
        )
    })
}

/// `--listen-override POOL=ADDR` flags, by pool.
fn listen_overrides(flags: &[String]) -> Result<HashMap<String, String>> {
    let mut overrides = HashMap::new();
    for flag in flags {
        let (pool, addr) = flag
            .split_once('=')
            .filter(|(p, a)| !p.is_empty() && !a.is_empty())
            .with_context(|| format!("--listen-override {flag:?}: write POOL=ADDR, e.g. web=127.0.0.1:22121"))?;
        if overrides.insert(pool.to_owned(), addr.to_owned()).is_some() {
            bail!("--listen-override names pool {pool} twice");
        }
    }
    Ok(overrides)
}

/// Applies the listen overrides to the pools; an override for a pool the
/// config lacks is an error.
fn override_listen(pools: &mut [PoolConfig], overrides: &HashMap<String, String>) -> Result<()> {
    for (name, addr) in overrides {
        let Some(pool) = pools.iter_mut().find(|p| p.name == *name) else {
            let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
            bail!("--listen-override names pool {name}, which the config does not have (it has {})", names.join(", "));
        };
        pool.listen.clone_from(addr);
    }
    Ok(())
}

/// A proxy following etcd: the follower task, stopped before the proxy.
#[cfg(feature = "etcd")]
type Follower = chash_proxy::etcd::follow::Follower;

/// Without the etcd feature there is nothing to follow.
#[cfg(not(feature = "etcd"))]
struct Follower;

#[cfg(not(feature = "etcd"))]
impl Follower {
    async fn stop(self) {}
}

/// Where `--membership` says to start from: the stored config, or the
/// cache file when etcd is unreachable.
#[cfg(feature = "etcd")]
async fn membership_start(
    url: &str,
    tls: &crate::etcd_tls::EtcdTlsArgs,
    cache: Option<&Path>,
) -> Result<(chash_proxy::etcd::EtcdTarget, chash_proxy::etcd::follow::Start, Vec<PoolConfig>)> {
    use chash_proxy::etcd::{self, follow::Start, EtcdError};
    let target = tls.target(url)?;
    let key = target.config_key();
    let read = async {
        let mut client = etcd::connect(&target).await?;
        etcd::read_config(&mut client, &target).await
    };
    let unreachable = match read.await {
        Ok(stored) => {
            let origin = format!("etcd {key} revision {}", stored.revision);
            match load_text(&stored.text, &origin) {
                Ok(pools) => {
                    let start = Start {
                        text: stored.text,
                        revision: stored.revision,
                        read_at: stored.read_at,
                        from_cache: false,
                    };
                    return Ok((target, start, pools));
                }
                Err(e) if cache.is_none() => {
                    bail!("cannot start: the config at {origin} is invalid ({e:#}); fix it with `chash config put --etcd {target} FILE`")
                }
                Err(e) => format!("the config at {origin} is invalid ({e:#})"),
            }
        }
        Err(e @ EtcdError::Etcd { .. }) => e.to_string(),
        Err(e) => bail!("cannot start: {e}"),
    };
    let Some(cache) = cache else {
        bail!("cannot start: {unreachable}, and there is no --membership-cache FILE to start from");
    };
    let (revision, text) = etcd::follow::read_cache(cache)
        .map_err(|e| anyhow::anyhow!("cannot start: {unreachable}, and the membership cache cannot be used: {e}"))?;
    let pools = load_text(&text, &cache.display().to_string())
        .with_context(|| format!("cannot start: {unreachable}, and the membership cache is invalid"))?;
    tracing::warn!(
        "{unreachable}: starting from the membership cache {} (revision {revision}); following etcd once it answers",
        cache.display()
    );
    Ok((target, Start { text, revision, read_at: revision, from_cache: true }, pools))
}

/// The default proxy id: the host's name and the admin port (or pid).
#[cfg(feature = "etcd")]
fn default_proxy_id(admin: Option<SocketAddr>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    match admin {
        Some(a) => format!("{host}-{}", a.port()),
        None => format!("{host}-pid{}", std::process::id()),
    }
}

/// The name the command was called by: `nutcracker` or `chash`.
fn program() -> &'static str {
    let called = std::env::args_os().next().unwrap_or_default();
    if Path::new(&called).file_name().is_some_and(|n| n == "nutcracker") {
        "nutcracker"
    } else {
        "chash"
    }
}

/// The admin endpoint's TLS settings from the flags.
fn admin_tls(args: &ProxyArgs) -> Result<Option<chash::PoolTls>> {
    let (Some(cert), Some(key)) = (&args.admin_tls_cert, &args.admin_tls_key) else { return Ok(None) };
    if args.no_admin {
        bail!("--admin-tls-cert serves the admin endpoint over TLS, which --no-admin turns off");
    }
    let path = |p: &PathBuf| p.display().to_string();
    let mut tls = chash::PoolTls::default();
    tls.cert = Some(path(cert));
    tls.key = Some(path(key));
    tls.client_ca = args.admin_tls_client_ca.as_ref().map(path);
    Ok(Some(tls))
}

pub fn run(args: ProxyArgs) -> Result<()> {
    if args.describe_stats {
        print!("{}", chash_proxy::describe_stats());
        return Ok(());
    }
    if args.test_conf {
        let path = args.config.as_ref().context("--test-conf needs -c FILE")?;
        let pools = load(path)?;
        // TLS files readable, keys matching their certificates, CAs parsing
        // (a start reads them once, when its pools start).
        for pool in &pools {
            chash_proxy::check_tls(&pool.tls).with_context(|| format!("{}: pool {:?}", path.display(), pool.name))?;
        }
        if let Some(tls) = admin_tls(&args)? {
            chash_proxy::check_tls(&tls).context("the admin endpoint (--admin-tls-cert, --admin-tls-key)")?;
        }
        for advice in pools.iter().filter_map(anchor_advice) {
            eprintln!("{}: note: {advice}", program());
        }
        let plural = if pools.len() == 1 { "pool" } else { "pools" };
        let ok =
            format!("{}: configuration file '{}' syntax is ok ({} {plural})", program(), path.display(), pools.len());
        // Where each program says it: nutcracker on standard error.
        if program() == "nutcracker" {
            eprintln!("{ok}");
        } else {
            println!("{ok}");
        }
        return Ok(());
    }
    if args.daemonize && std::env::var_os(DAEMON_ENV).is_none() {
        return daemonize();
    }
    if std::env::var_os(DAEMON_ENV).is_some() {
        // The background process of -d: a session of its own, no terminal.
        let _ = nix::unistd::setsid();
    }
    die_on_sigsegv();
    let log = Log::init(args.verbosity, args.output.as_deref())?;
    // Client and server connections run on the worker threads (one
    // single-threaded runtime each); this one accepts connections and runs
    // the admin endpoint, signals and the embedded shards.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(serve(args, log))
}

/// The background process of `-d`, once it serves: standard output and
/// error go to /dev/null (the command that started it has stopped reading
/// them), as a daemon's do.
fn detach_streams() {
    use std::os::fd::AsRawFd as _;
    let _ = std::io::stdout().flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
        let _ = nix::unistd::dup2(null.as_raw_fd(), 2);
    }
}

/// Gives SIGSEGV its default action back: the process dies of it (and can
/// dump core), as twemproxy does after logging. Rust's runtime handles it to
/// report stack overflows, and a SIGSEGV sent with `kill` would otherwise
/// be swallowed once.
#[allow(unsafe_code)]
fn die_on_sigsegv() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: installs the default disposition, no handler code runs; done
    // before any other thread that could race on signal dispositions.
    let _ = unsafe { signal(Signal::SIGSEGV, SigHandler::SigDfl) };
}

/// `-d`: starts the same command again in the background and returns once
/// it serves (exit 0), or with its start-up error.
fn daemonize() -> Result<()> {
    use std::os::unix::process::CommandExt as _;
    let exe = std::env::current_exe().context("cannot find this program to run it in the background")?;
    // The name it was called by goes along: called as `nutcracker` (a
    // symlink, which current_exe resolves), the background process must
    // read twemproxy's flags as nutcracker does.
    let mut child = std::process::Command::new(exe)
        .arg0(std::env::args_os().next().unwrap_or_else(|| "chash".into()))
        .args(std::env::args_os().skip(1))
        .env(DAEMON_ENV, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cannot start the background process")?;
    let mut said = String::new();
    if let Some(out) = child.stdout.take() {
        use std::io::BufRead as _;
        let mut lines = std::io::BufReader::new(out).lines();
        if let Some(Ok(line)) = lines.next() {
            said = line;
        }
    }
    if said == READY {
        return Ok(());
    }
    let status = child.wait()?;
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read as _;
        let _ = e.read_to_string(&mut err);
    }
    // All it said: a usage error's cause is on the lines before its last.
    let said: Vec<&str> = err
        .lines()
        .map(|l| l.trim_end())
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
        .map(|l| l.trim_start_matches("chash: error: ").trim_start_matches("nutcracker: error: "))
        .map(|l| l.trim_start_matches("error: "))
        .collect();
    let said = if said.is_empty() { "it said nothing".to_owned() } else { said.join("; ") };
    bail!("the background proxy did not start ({status}): {said}")
}

async fn serve(args: ProxyArgs, log: Log) -> Result<()> {
    // Handled from the start: a signal sent as soon as the proxy says it
    // serves (or even before) is never met by its default action.
    let signals = Signals::register()?;
    let threads = match args.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(n) => n,
        // A core is left to the kernel's network work and to the
        // clients or servers that share the host: measured on 2 cores,
        // one worker makes 3-13% more unpipelined Redis requests per second
        // than two, with a lower p99 (BENCHMARKS.md).
        None => std::thread::available_parallelism().map_or(1, |n| usize::from(n).saturating_sub(1).max(1)),
    };
    let mut options = ProxyOptions::default();
    options.admin_addr = (!args.no_admin).then_some(args.admin.unwrap_or(DEFAULT_ADMIN));
    // Several proxies on one host, each with its own listen and -s (as
    // nutcracker is run once per core or per pool): the default admin port
    // goes to the first, the others take a free one and say which.
    options.admin_fallback = args.admin.is_none();
    options.stats_addr = (!args.no_stats).then(|| SocketAddr::new(args.stats_addr, args.stats_port));
    options.stats_interval = Duration::from_millis(args.stats_interval.max(1));
    options.max_value_size = args.max_value_size;
    options.client_buffer = args.client_buffer.max(1);
    options.client_idle_timeout = (args.client_idle_timeout > 0).then(|| Duration::from_secs(args.client_idle_timeout));
    options.config_path = args.config.clone();
    if args.persist && args.no_admin {
        bail!("--persist writes changes made through the admin endpoint, which --no-admin turns off");
    }
    options.persist = args.persist;
    options.watch_config = !args.no_watch;
    options.admin_insecure = args.admin_insecure;
    options.admin_tls = admin_tls(&args)?;
    if let Some(path) = &args.admin_token_file {
        let token = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let token = token.trim();
        if token.len() < 16 {
            bail!("the admin token in {} is {} characters: use at least 16", path.display(), token.len());
        }
        options.admin_token = Some(token.to_owned());
    }
    options.lenient_keys = args.lenient_keys;
    options.migrate = chash_proxy::MoveSettings {
        keys_per_second: args.migrate_keys_per_second,
        bytes_per_second: args.migrate_bytes_per_second,
        large_key_bytes: args.migrate_large_key,
        batch: args.migrate_batch.clamp(1, 10_000),
        batch_bytes: args.migrate_batch_bytes.max(1),
    };
    options.threads = Some(threads);
    options.listen_overrides = listen_overrides(&args.listen_override)?;
    if !options.listen_overrides.is_empty() && args.config.is_none() && args.membership.is_none() {
        bail!("--listen-override applies to the pools of a config (-c FILE or --membership); the embedded default takes --listen");
    }
    #[cfg(feature = "etcd")]
    let mut membership = None;
    #[cfg(not(feature = "etcd"))]
    if args.membership.is_some() {
        bail!("--membership needs etcd support, which this chash was built without (cargo feature `etcd`)");
    }
    let (specs, embedded) = match &args.config {
        Some(path) => {
            let mut pools = load(path)?;
            override_listen(&mut pools, &options.listen_overrides)?;
            (pools.into_iter().map(|config| PoolSpec { config, addresses: HashMap::new() }).collect(), None)
        }
        #[cfg(feature = "etcd")]
        None if args.membership.is_some() => {
            let url = args.membership.as_deref().unwrap_or_default();
            let (target, start, mut pools) =
                membership_start(url, &args.etcd_tls, args.membership_cache.as_deref()).await?;
            override_listen(&mut pools, &options.listen_overrides)?;
            membership = Some((target, start));
            (pools.into_iter().map(|config| PoolSpec { config, addresses: HashMap::new() }).collect(), None)
        }
        None => {
            let (spec, shutdown) = embedded_pool(args.shard_memory << 20, &args.listen).await?;
            (vec![spec], Some(shutdown))
        }
    };
    for advice in specs.iter().filter_map(|s| anchor_advice(&s.config)) {
        tracing::warn!("{advice}");
    }
    let running = chash_proxy::start(specs, options).await?;
    #[cfg(feature = "etcd")]
    let follower: Option<Follower> = membership.map(|(target, start)| {
        let proxy_id = args.proxy_id.clone().unwrap_or_else(|| default_proxy_id(running.admin()));
        eprintln!(
            "chash proxy: membership from {target} (key {}, revision {}{}), registered as {}{proxy_id}",
            target.config_key(),
            start.revision,
            if start.from_cache { ", from the cache: etcd is unreachable" } else { "" },
            target.proxies_prefix(),
        );
        let follow = chash_proxy::etcd::follow::Follow {
            target,
            proxy_id,
            admin: running.admin().map(|a| format!("http://{a}")),
            cache: args.membership_cache.clone(),
            start,
        };
        chash_proxy::etcd::follow::follow(running.registry().clone(), follow)
    });
    #[cfg(not(feature = "etcd"))]
    let follower: Option<Follower> = None;
    if let Some(path) = &args.pid_file {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write pid file {}", path.display()))?;
    }
    announce(&running, embedded.is_some(), log.file.is_some());
    if std::env::var_os(DAEMON_ENV).is_some() {
        println!("{READY}");
        detach_streams();
    }
    let outcome = signals.wait(&running, &log).await;
    tracing::info!("shutting down: finishing in-flight requests");
    if let Some(f) = follower {
        f.stop().await;
    }
    running.shutdown().await;
    if let Some(stop) = embedded {
        let _ = stop.send(true);
    }
    if let Some(path) = &args.pid_file {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!("stopped");
    outcome
}

/// The embedded default: three in-process shards behind one pool.
async fn embedded_pool(memory: u64, listen: &str) -> Result<(PoolSpec, tokio::sync::watch::Sender<bool>)> {
    let (stop, rx) = tokio::sync::watch::channel(false);
    let mut addresses = HashMap::new();
    let mut servers = Vec::new();
    for name in ["shard-a", "shard-b", "shard-c"] {
        let shard = chash_proxy::embedded::start_shard(memory, rx.clone()).await.context("cannot start a shard")?;
        addresses.insert(name.to_owned(), Address::Tcp(shard.addr.to_string()));
        servers.push(format!("{name}:1").parse::<ServerLine>()?);
    }
    let mut pool = PoolConfig::from_servers(servers)?;
    pool.name = "embedded".into();
    pool.listen = listen.to_owned();
    Ok((PoolSpec { config: pool, addresses }, stop))
}

/// Says where the proxy serves: on standard error, and in the log file
/// when there is one.
fn announce(running: &Running, embedded: bool, log_file: bool) {
    for (pool, (name, addr)) in running.registry().pools().iter().zip(running.listeners()) {
        let protocol = if pool.spec().redis { "Redis" } else { "memcached" };
        if log_file {
            tracing::info!("pool {name:?} serving {protocol} on {addr}");
        }
        eprintln!("chash proxy: pool {name:?} serving {protocol} on {addr}");
    }
    for (name, addr) in running.tls_listeners() {
        if log_file {
            tracing::info!("pool {name:?} serving TLS on {addr}");
        }
        eprintln!("chash proxy: pool {name:?} serving TLS on {addr}");
    }
    if embedded {
        eprintln!("chash proxy: no -c given: the pool is in front of three in-process cache shards (shard-a, shard-b, shard-c)");
        if let Some((_, addr)) = running.listeners().first() {
            eprintln!(
                "  try:  printf 'set greeting 0 0 5\\r\\nhello\\r\\nget greeting\\r\\n' | nc -q1 {} {}",
                addr.ip(),
                addr.port()
            );
        }
    }
    if let Some(stats) = running.stats() {
        // Every interface: any of them answers, loopback too.
        let ip = if stats.ip().is_unspecified() { "127.0.0.1".to_owned() } else { stats.ip().to_string() };
        if log_file {
            tracing::info!("stats (twemproxy's JSON) on {stats}");
        }
        eprintln!("chash proxy: stats (twemproxy's JSON) on {stats}  (curl --http0.9 -s {ip}:{})", stats.port());
    }
    if let Some(admin) = running.admin() {
        let (scheme, curl) = match &running.registry().shared().options.admin_tls {
            Some(tls) if tls.client_ca.is_some() => ("https", "curl --cacert CA --cert CERT --key KEY"),
            Some(_) => ("https", "curl --cacert CA"),
            None => ("http", "curl"),
        };
        if log_file {
            tracing::info!("admin on {scheme}://{admin}");
        }
        eprintln!("chash proxy: admin on {scheme}://{admin}  ({curl} {scheme}://{admin}/stats)");
    }
    if running.registry().membership().is_some() {
        eprintln!("chash proxy: SIGHUP reopens the log (the config follows etcd), Ctrl-C stops");
    } else {
        eprintln!("chash proxy: SIGHUP reloads the config and reopens the log, Ctrl-C stops");
    }
}

/// The signals the proxy handles, registered.
struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
    ttin: tokio::signal::unix::Signal,
    ttou: tokio::signal::unix::Signal,
}

impl Signals {
    fn register() -> Result<Signals> {
        let watch = |kind: SignalKind, name: &str| signal(kind).with_context(|| format!("cannot watch {name}"));
        Ok(Signals {
            hup: watch(SignalKind::hangup(), "SIGHUP")?,
            term: watch(SignalKind::terminate(), "SIGTERM")?,
            int: watch(SignalKind::interrupt(), "SIGINT")?,
            usr1: watch(SignalKind::user_defined1(), "SIGUSR1")?,
            usr2: watch(SignalKind::user_defined2(), "SIGUSR2")?,
            // SIGTTIN and SIGTTOU (21, 22): handled, so a proxy started from
            // a shell is never stopped by them.
            ttin: watch(SignalKind::from_raw(21), "SIGTTIN")?,
            ttou: watch(SignalKind::from_raw(22), "SIGTTOU")?,
        })
    }

    /// Handles signals until SIGINT or SIGTERM.
    async fn wait(mut self, running: &Running, log: &Log) -> Result<()> {
        loop {
            tokio::select! {
                _ = self.hup.recv() => {
                    // Logged at warning level, as every handled signal: an
                    // operator greps for it whatever the level.
                    // Said before the reopen: the line ends the old file.
                    let reload = running.registry().shared().options.config_path.is_some();
                    let also = if reload { " and reloading the config" } else { " (no config file to reload) and reloading the TLS files" };
                    tracing::warn!("signal 1 (SIGHUP) received: reopening the log file{also}");
                    log.reopen();
                    if !reload {
                        // The registry logs what it reloaded and refused.
                        let _ = running.registry().reload_tls_files();
                        continue;
                    }
                    // The registry logs what each pool did, or why not.
                    if let Err(e) = running.registry().reload() {
                        tracing::error!("reload failed, nothing changed: {e}");
                    }
                }
                _ = self.ttin.recv() => log.shift(1, "21 (SIGTTIN)"),
                _ = self.ttou.recv() => log.shift(-1, "22 (SIGTTOU)"),
                _ = self.usr1.recv() => tracing::warn!("signal 10 (SIGUSR1) received: ignored"),
                _ = self.usr2.recv() => tracing::warn!("signal 12 (SIGUSR2) received: ignored"),
                _ = self.term.recv() => {
                    tracing::warn!("signal 15 (SIGTERM) received: stopping");
                    return Ok(());
                }
                _ = self.int.recv() => {
                    tracing::warn!("signal 2 (SIGINT) received: stopping");
                    return Ok(());
                }
            }
        }
    }
}
