//! The running proxy: a listener per pool, the admin endpoint, signals.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use chash::config::{Config, Pool as PoolConfig};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

use crate::backend::Address;
use crate::pool::{Change, Pool, PoolError};
use crate::workers::Workers;
use crate::{client, Shared};

/// Process-level options (command-line flags rather than pool settings).
#[derive(Clone, Debug)]
pub struct ProxyOptions {
    /// Admin/stats HTTP address (`None`: no admin endpoint).
    pub admin_addr: Option<SocketAddr>,
    /// Largest value accepted from clients; larger ones are refused without
    /// being buffered. Defaults to 1 MiB.
    pub max_value_size: usize,
    /// Close client connections idle this long (`None`: never).
    pub client_idle_timeout: Option<Duration>,
    /// The config file, for reloads (SIGHUP, `POST /reload`).
    pub config_path: Option<PathBuf>,
    /// How long a graceful shutdown waits for in-flight requests.
    pub drain: Duration,
    /// Accept keys with control bytes, as memcached and twemproxy do
    /// (protocol.txt forbids them; refused by default).
    pub lenient_keys: bool,
    /// Worker threads, each a single-threaded runtime with its own client
    /// and backend connections (see [`crate::workers`]). `None`: no worker
    /// threads; connections run on the runtime that calls [`start`].
    pub threads: Option<usize>,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions {
            admin_addr: None,
            max_value_size: crate::DEFAULT_MAX_VALUE,
            client_idle_timeout: None,
            config_path: None,
            drain: crate::DEFAULT_DRAIN,
            lenient_keys: false,
            threads: None,
        }
    }
}

/// A pool to serve, with where its servers are reached when that is not
/// their id.
#[derive(Clone, Debug)]
pub struct PoolSpec {
    /// The pool's config.
    pub config: PoolConfig,
    /// Server id to address overrides.
    pub addresses: HashMap<String, Address>,
}

/// What a reload did to one pool: its name and the change (or why not).
pub type PoolReload = (String, Result<Change, PoolError>);

/// The running proxy's shared state (pools by name).
#[derive(Debug)]
pub struct Proxy {
    /// Process-wide settings.
    pub shared: Arc<Shared>,
    pools: RwLock<Vec<Arc<Pool>>>,
}

impl Proxy {
    /// The pools, in config order.
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        self.pools.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<Arc<Pool>> {
        self.pools().into_iter().find(|p| p.name == name)
    }

    /// Re-reads the config file and applies each pool's servers and
    /// placement; pools added or removed, or a changed listen address, need a
    /// restart and are reported as such.
    ///
    /// # Errors
    /// No config file, or one that does not parse; nothing is changed then.
    pub fn reload(&self) -> Result<Vec<PoolReload>, PoolError> {
        let path =
            self.shared.options.config_path.as_ref().ok_or_else(|| PoolError("no config file to reload".into()))?;
        let text =
            std::fs::read_to_string(path).map_err(|e| PoolError(format!("cannot read {}: {e}", path.display())))?;
        let config = Config::from_yaml(&text).map_err(|e| PoolError(format!("{}: {e}", path.display())))?;
        let mut results = Vec::new();
        for (name, _) in &config.pools {
            let pool_config = config.pool(Some(name)).map_err(|e| PoolError(e.to_string()))?;
            let result = match self.pool(name) {
                Some(pool) => {
                    if pool_config.file.listen.as_deref().unwrap_or("127.0.0.1:22121") != pool.settings.listen {
                        tracing::warn!(pool = %name, "listen address changed: takes effect after a restart");
                    }
                    pool.reload(pool_config)
                }
                None => Err(PoolError(format!("pool {name:?} is new: it is served after a restart"))),
            };
            results.push((name.clone(), result));
        }
        for pool in self.pools() {
            if !config.pools.iter().any(|(n, _)| *n == pool.name) {
                results.push((
                    pool.name.clone(),
                    Err(PoolError("pool is gone from the config: still served until a restart".into())),
                ));
            }
        }
        Ok(results)
    }
}

/// A started proxy.
#[derive(Debug)]
pub struct Running {
    /// The shared state.
    pub proxy: Arc<Proxy>,
    /// Each pool's name and bound listen address.
    pub listeners: Vec<(String, SocketAddr)>,
    /// The admin endpoint's bound address.
    pub admin: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    workers: Arc<Workers>,
}

impl Running {
    /// Stops accepting, lets open connections finish their in-flight
    /// requests (up to the drain time), and returns.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        let drain = self.proxy.shared.options.drain;
        let deadline = Instant::now() + drain;
        for t in std::mem::take(&mut self.tasks) {
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = tokio::time::timeout(left, t).await;
        }
        // Wait for client connections to finish.
        while Instant::now() < deadline {
            let open: u64 = self.proxy.pools().iter().map(|p| p.stats.curr_connections.load(Relaxed)).sum();
            if open == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.workers.stop();
    }

    /// A receiver that turns true when shutdown begins.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }
}

impl Drop for Running {
    /// Dropped without [`Running::shutdown`]: stops accepting and ends the
    /// worker threads at once (connections on them close).
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.workers.stop();
    }
}

fn bind(listen: &str, backlog: u32) -> std::io::Result<TcpListener> {
    let addr: SocketAddr = listen.parse().map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("listen address {listen:?} is not IP:PORT"))
    })?;
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog.max(1))
}

/// Starts serving `pools` (each on its `listen` address) and, when asked,
/// the admin endpoint. Must be called inside a tokio runtime.
///
/// # Errors
/// A listen address that cannot be bound, or a pool that cannot place keys.
pub async fn start(pools: Vec<PoolSpec>, options: ProxyOptions) -> Result<Running, String> {
    let shared = Arc::new(Shared { options: options.clone(), started: Instant::now() });
    let (shutdown, _) = watch::channel(false);
    let mut started = Vec::new();
    let mut listeners = Vec::new();
    let mut bound = Vec::new();
    let workers = match options.threads {
        Some(n) => Workers::start(n).map_err(|e| format!("cannot start {n} worker threads: {e}"))?,
        None => Workers::current(),
    };
    for spec in pools {
        let pool = Pool::start_on(spec.config, spec.addresses, workers.clone()).map_err(|e| e.to_string())?;
        let listener = bind(&pool.settings.listen, pool.settings.backlog)
            .map_err(|e| format!("pool {:?}: cannot listen on {}: {e}", pool.name, pool.settings.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        listeners.push((pool.name.clone(), addr));
        bound.push((pool.clone(), listener));
        started.push(pool);
    }
    let proxy = Arc::new(Proxy { shared: shared.clone(), pools: RwLock::new(started) });
    let mut tasks = Vec::new();
    for (pool, listener) in bound {
        let shared = shared.clone();
        let stop = shutdown.subscribe();
        tasks.push(tokio::spawn(accept_loop(listener, pool, shared, stop)));
    }
    let admin = match options.admin_addr {
        Some(addr) => {
            let listener =
                TcpListener::bind(addr).await.map_err(|e| format!("cannot listen on admin address {addr}: {e}"))?;
            let local = listener.local_addr().map_err(|e| e.to_string())?;
            tasks.push(tokio::spawn(crate::admin::serve(listener, proxy.clone(), shutdown.subscribe())));
            Some(local)
        }
        None => None,
    };
    Ok(Running { proxy, listeners, admin, shutdown, tasks, workers })
}

async fn accept_loop(listener: TcpListener, pool: Arc<Pool>, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(5);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let (stream, _) = match accepted {
            Ok(a) => {
                backoff = Duration::from_millis(5);
                a
            }
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(pool = %pool.name, "accept failed: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let limit = pool.settings.client_connections;
        if limit > 0 && pool.stats.curr_connections.load(Relaxed) >= limit {
            pool.stats.rejected_connections.fetch_add(1, Relaxed);
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        pool.stats.curr_connections.fetch_add(1, Relaxed);
        pool.stats.total_connections.fetch_add(1, Relaxed);
        let pool = pool.clone();
        let shared = shared.clone();
        let stop = stop.clone();
        let workers = pool.workers().clone();
        workers.serve_tcp(stream, move |stream| async move {
            match stream {
                Ok(stream) if pool.settings.redis => crate::redis::serve(stream, pool.clone(), shared, stop).await,
                Ok(stream) => client::serve(stream, pool.clone(), shared, stop).await,
                Err(e) => tracing::warn!(pool = %pool.name, "cannot hand a connection to a worker: {e}"),
            }
            pool.stats.curr_connections.fetch_sub(1, Relaxed);
        });
    }
}
