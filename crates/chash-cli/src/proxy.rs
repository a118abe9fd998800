//! `chash proxy`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use chash::config::{Config, Pool};
use chash::ServerLine;
use chash_proxy::backend::Address;
use chash_proxy::proxy::PoolSpec;
use chash_proxy::{ProxyOptions, Running};
use clap::Args;
use tokio::signal::unix::{signal, SignalKind};

#[derive(Args, Debug)]
#[command(after_help = "\
Without -c, serves an embedded default: one memcached pool on 127.0.0.1:22121
in front of three in-process cache shards, so it works with nothing installed.

Signals: SIGHUP re-reads the config file (servers and placement change live;
only the changed servers' keys move); SIGINT and SIGTERM stop accepting, let
in-flight requests finish, and exit.

Admin endpoint (default http://127.0.0.1:22222): GET /stats, GET /metrics,
GET /pools, POST /pools/POOL/servers (body ID:WEIGHT [NAME]),
DELETE /pools/POOL/servers/ID, PUT /pools/POOL/servers/ID/weight,
POST /pools/POOL/servers/ID/eject|restore, POST /reload.

Examples:
  chash proxy                         # embedded default
  chash proxy -c nutcracker.yml -s 22222
  chash proxy -c nutcracker.yml --test-conf")]
pub struct ProxyArgs {
    /// twemproxy-style YAML config file (every pool in it is served).
    #[arg(short = 'c', long = "conf-file", value_name = "FILE")]
    config: Option<PathBuf>,

    /// Admin/stats port.
    #[arg(short = 's', long = "stats-port", value_name = "PORT", default_value_t = 22222)]
    stats_port: u16,

    /// Admin/stats address (loopback unless you say otherwise).
    #[arg(short = 'a', long = "stats-addr", value_name = "ADDR", default_value = "127.0.0.1")]
    stats_addr: std::net::IpAddr,

    /// Do not serve the admin/stats endpoint.
    #[arg(long)]
    no_admin: bool,

    /// Log verbosity, as twemproxy's -v: 0-4 warnings, 5-6 info, 7-8 debug, 9+ trace.
    #[arg(short = 'v', long = "verbose", value_name = "N", default_value_t = 5)]
    verbosity: u8,

    /// Check the config file and exit.
    #[arg(short = 't', long = "test-conf")]
    test_conf: bool,

    /// Largest value accepted from clients, in bytes; larger ones get
    /// SERVER_ERROR without being buffered.
    #[arg(long, value_name = "BYTES", default_value_t = chash_proxy::DEFAULT_MAX_VALUE)]
    max_value_size: usize,

    /// Accept keys with control bytes, as memcached and twemproxy do
    /// (protocol.txt forbids them, so they are refused by default; load
    /// generators such as memcaslap send them).
    #[arg(long)]
    lenient_keys: bool,

    /// Close client connections idle this many seconds (0: never).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    client_idle_timeout: u64,

    /// Worker threads, each serving its share of the client connections
    /// with its own backend connections (a pool's server_connections are per
    /// worker). Default: one per core but one, at least one; on a host of
    /// its own, use all cores.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,

    /// Memory bound of each embedded shard, in MiB (embedded default only).
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    shard_memory: u64,

    /// Listen address of the embedded default pool (port 0 picks a free one).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:22121", conflicts_with = "config")]
    listen: String,
}

fn init_logging(verbosity: u8) {
    let level = match verbosity {
        0..=4 => tracing::Level::WARN,
        5..=6 => tracing::Level::INFO,
        7..=8 => tracing::Level::DEBUG,
        _ => tracing::Level::TRACE,
    };
    let _ = tracing_subscriber::fmt().with_max_level(level).with_target(false).with_writer(std::io::stderr).try_init();
}

fn load(path: &PathBuf) -> Result<Vec<Pool>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let config = Config::from_yaml(&text).with_context(|| path.display().to_string())?;
    let mut pools = Vec::new();
    for (name, _) in &config.pools {
        let pool = config.pool(Some(name))?;
        if pool.distribution != chash::config::Distribution::Random {
            pool.snapshot().with_context(|| format!("{}: pool {name:?}", path.display()))?;
        }
        pools.push(pool);
    }
    Ok(pools)
}

pub fn run(args: ProxyArgs) -> Result<()> {
    if args.test_conf {
        let path = args.config.as_ref().context("--test-conf needs -c FILE")?;
        let pools = load(path)?;
        println!("chash: configuration file '{}' syntax is ok ({} pools)", path.display(), pools.len());
        return Ok(());
    }
    init_logging(args.verbosity);
    // Client and backend connections run on the worker threads (one
    // single-threaded runtime each); this one accepts connections and runs
    // the admin endpoint, signals and the embedded shards.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: ProxyArgs) -> Result<()> {
    let options = ProxyOptions {
        admin_addr: (!args.no_admin).then(|| SocketAddr::new(args.stats_addr, args.stats_port)),
        max_value_size: args.max_value_size,
        client_idle_timeout: (args.client_idle_timeout > 0).then(|| Duration::from_secs(args.client_idle_timeout)),
        config_path: args.config.clone(),
        drain: chash_proxy::DEFAULT_DRAIN,
        lenient_keys: args.lenient_keys,
        threads: Some(match args.threads {
            Some(0) => anyhow::bail!("--threads must be at least 1"),
            Some(n) => n,
            // A core is left to the kernel's network work and to the
            // clients or servers that share the host: measured on 2 cores,
            // one worker makes 3-13% more unpipelined Redis requests per second
            // than two, with a lower p99 (BENCHMARKS.md).
            None => std::thread::available_parallelism().map_or(1, |n| usize::from(n).saturating_sub(1).max(1)),
        }),
    };
    let (specs, embedded) = match &args.config {
        Some(path) => {
            (load(path)?.into_iter().map(|config| PoolSpec { config, addresses: HashMap::new() }).collect(), None)
        }
        None => {
            let (spec, shutdown) = embedded_pool(args.shard_memory << 20, &args.listen).await?;
            (vec![spec], Some(shutdown))
        }
    };
    let running = chash_proxy::start(specs, options).await.map_err(anyhow::Error::msg)?;
    announce(&running, embedded.is_some());
    let outcome = wait_for_signals(&running).await;
    tracing::info!("shutting down: finishing in-flight requests");
    running.shutdown().await;
    if let Some(stop) = embedded {
        let _ = stop.send(true);
    }
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
    let mut pool = Pool::from_servers(servers);
    pool.name = "embedded".into();
    pool.file.listen = Some(listen.to_owned());
    Ok((PoolSpec { config: pool, addresses }, stop))
}

fn announce(running: &Running, embedded: bool) {
    for (name, addr) in &running.listeners {
        eprintln!("chash proxy: pool {name:?} serving memcached on {addr}");
    }
    if embedded {
        eprintln!("chash proxy: no -c given: the pool is in front of three in-process cache shards (shard-a, shard-b, shard-c)");
        if let Some((_, addr)) = running.listeners.first() {
            eprintln!(
                "  try:  printf 'set greeting 0 0 5\\r\\nhello\\r\\nget greeting\\r\\n' | nc -q1 {} {}",
                addr.ip(),
                addr.port()
            );
        }
    }
    if let Some(admin) = running.admin {
        eprintln!("chash proxy: admin on http://{admin}  (curl http://{admin}/stats)");
    }
    eprintln!("chash proxy: SIGHUP reloads the config, Ctrl-C stops");
}

async fn wait_for_signals(running: &Running) -> Result<()> {
    let mut hup = signal(SignalKind::hangup()).context("cannot watch SIGHUP")?;
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    loop {
        tokio::select! {
            _ = hup.recv() => match running.proxy.reload() {
                Ok(results) => for (pool, r) in results {
                    match r {
                        Ok(c) => tracing::info!(%pool, moved = c.moved_fraction, "reload: {}", c.change),
                        Err(e) => tracing::warn!(%pool, "reload: {e}"),
                    }
                },
                Err(e) => tracing::error!("reload failed, nothing changed: {e}"),
            },
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        }
    }
}
