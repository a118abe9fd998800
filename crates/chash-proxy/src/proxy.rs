//! Starting and stopping the proxy: a listener per pool (each accepted
//! connection handed to a worker and to its protocol's session), the admin
//! endpoint, twemproxy's stats port, and a graceful shutdown.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chash::PoolConfig;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{mpsc, watch};

use crate::backend::Address;
use crate::conn::{ConnGuard, ConnSettings};
use crate::options::{ProxyOptions, Shared};
use crate::pool::{Pool, PoolError};
use crate::registry::Registry;
use crate::workers::Workers;

/// A pool to serve, with where its servers are reached when that is not
/// their id.
#[derive(Clone, Debug)]
pub struct PoolSpec {
    /// The pool's config.
    pub config: PoolConfig,
    /// Server id to address overrides.
    pub addresses: HashMap<String, Address>,
}

/// Why the proxy did not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The worker threads could not be started.
    Workers(std::io::Error),
    /// A pool cannot place its keys.
    Pool(PoolError),
    /// The admin endpoint, which can re-point traffic, was asked for on a
    /// non-loopback address without a token.
    Insecure {
        /// The address.
        addr: String,
    },
    /// The admin endpoint's TLS files cannot be used.
    AdminTls(crate::tls::TlsError),
    /// An address cannot be listened on.
    Listen {
        /// What it is for (`pool "alpha"`, `admin`, `stats`).
        what: String,
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Workers(e) => write!(f, "cannot start the worker threads: {e}"),
            StartError::Pool(e) => write!(f, "{e}"),
            StartError::AdminTls(e) => write!(f, "admin endpoint: {e}"),
            StartError::Listen { what, addr, source } => write!(f, "{what}: cannot listen on {addr}: {source}"),
            StartError::Insecure { addr } => write!(
                f,
                "the admin endpoint can change where keys go; on {addr} (not loopback) it needs a token \
                 (--admin-token-file FILE), or --admin-insecure to serve it open"
            ),
        }
    }
}

/// Each message says why, its cause included (a log line shows it whole);
/// `source()` gives the cause itself.
impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::Workers(e) | StartError::Listen { source: e, .. } => Some(e),
            StartError::Pool(e) => Some(e),
            StartError::AdminTls(e) => Some(e),
            StartError::Insecure { .. } => None,
        }
    }
}

/// A started proxy.
#[derive(Debug)]
pub struct Running {
    registry: Arc<Registry>,
    listeners: Vec<(String, SocketAddr)>,
    tls_listeners: Vec<(String, SocketAddr)>,
    admin: Option<SocketAddr>,
    stats: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Ends (`None`) once every client connection is closed: each holds a
    /// sender, and so do the accept loops until they stop.
    connections: mpsc::Receiver<()>,
    workers: Arc<Workers>,
}

impl Running {
    /// The pools.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Each pool's name and bound listen address (a `listen` on port 0
    /// gets its port here).
    pub fn listeners(&self) -> &[(String, SocketAddr)] {
        &self.listeners
    }

    /// The pools that serve TLS and the bound address they serve it on
    /// (`tls_listen`, or `listen` itself when there is no `tls_listen`).
    pub fn tls_listeners(&self) -> &[(String, SocketAddr)] {
        &self.tls_listeners
    }

    /// The admin endpoint's bound address.
    pub fn admin(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// The stats port's bound address.
    pub fn stats(&self) -> Option<SocketAddr> {
        self.stats
    }

    /// Stops accepting, lets open connections finish their in-flight
    /// requests (up to the drain time), and returns.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        let drain = self.registry.shared().options.drain;
        let deadline = tokio::time::Instant::now() + drain;
        for t in std::mem::take(&mut self.tasks) {
            let _ = tokio::time::timeout_at(deadline, t).await;
        }
        // The accept loops have stopped (their senders are gone): this
        // ends when the last client connection closes.
        let _ = tokio::time::timeout_at(deadline, self.connections.recv()).await;
        self.workers.stop();
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

async fn bind_tcp(what: &str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr).await.map_err(|source| StartError::Listen {
        what: what.to_owned(),
        addr: addr.to_string(),
        source,
    })
}

/// Starts serving `pools` (each on its `listen` address) and, when asked,
/// the admin endpoint and the stats port. Must be called inside a tokio
/// runtime.
///
/// # Errors
/// An address that cannot be bound, or a pool that cannot place keys.
pub async fn start(pools: Vec<PoolSpec>, options: ProxyOptions) -> Result<Running, StartError> {
    let shared = Arc::new(Shared { options: options.clone(), started: Instant::now() });
    let (shutdown, _) = watch::channel(false);
    let mut started = Vec::new();
    let mut listeners = Vec::new();
    let mut bound = Vec::new();
    let mut tls_listeners = Vec::new();
    let workers = match options.threads {
        Some(n) => Workers::start(n).map_err(StartError::Workers)?,
        None => Workers::current(),
    };
    for mut spec in pools {
        // Secrets named by file, read now (idempotent: a caller may have).
        let protocol = crate::protocols::of(&spec.config);
        protocol.prepare(&mut spec.config).map_err(StartError::Pool)?;
        let speech = protocol.speech(&spec.config);
        let pool = Pool::start(spec.config, spec.addresses, workers.clone(), speech).map_err(StartError::Pool)?;
        if let Some(mover) = protocol.mover(options.migrate) {
            pool.set_mover(mover);
        }
        let listen = |addr: &str| -> Result<(TcpListener, SocketAddr), StartError> {
            let failed =
                |source| StartError::Listen { what: format!("pool {:?}", pool.name()), addr: addr.to_owned(), source };
            let listener = bind(addr, pool.spec().backlog).map_err(failed)?;
            let local = listener.local_addr().map_err(failed)?;
            Ok((listener, local))
        };
        // `listen` is plaintext, and TLS is on `tls_listen`; without
        // `tls_listen` a pool with a certificate serves TLS on `listen`.
        let (listener, addr) = listen(&pool.spec().listen)?;
        let tls_listen = pool.spec().tls.listen.clone();
        let serves_tls = pool.spec().tls.serves_tls();
        let listen_is_tls = serves_tls && tls_listen.is_none();
        listeners.push((pool.name().to_owned(), addr));
        if listen_is_tls {
            tls_listeners.push((pool.name().to_owned(), addr));
        }
        bound.push((pool.clone(), listener, listen_is_tls));
        if let (true, Some(at)) = (serves_tls, tls_listen) {
            let (listener, addr) = listen(&at)?;
            tls_listeners.push((pool.name().to_owned(), addr));
            bound.push((pool.clone(), listener, true));
        }
        started.push(pool);
    }
    let admin_tls = match &options.admin_tls {
        Some(tls) if options.admin_addr.is_some() => Some(crate::tls::LiveTls::new(tls).map_err(StartError::AdminTls)?),
        _ => None,
    };
    let registry = Arc::new(Registry::new(shared.clone(), started).with_admin_tls(admin_tls.clone()));
    registry.follow_migrations();
    let mut tasks = Vec::new();
    let pool_count = bound.len();
    let (open, connections) = mpsc::channel(1);
    for (pool, listener, tls) in bound {
        let shared = shared.clone();
        let stop = shutdown.subscribe();
        tasks.push(tokio::spawn(accept_loop(listener, pool, tls, shared, stop, open.clone())));
    }
    drop(open);
    if let (Some(path), true) = (&options.config_path, options.watch_config) {
        tasks.push(tokio::spawn(crate::registry::watch(registry.clone(), path.clone(), shutdown.subscribe())));
    }
    let admin = match options.admin_addr {
        Some(addr) if !addr.ip().is_loopback() && options.admin_token.is_none() && !options.admin_insecure => {
            return Err(StartError::Insecure { addr: addr.to_string() });
        }
        Some(addr) => {
            let listener = match bind_tcp("admin endpoint", addr).await {
                Err(StartError::Listen { source, .. })
                    if options.admin_fallback && source.kind() == std::io::ErrorKind::AddrInUse =>
                {
                    let free = SocketAddr::new(addr.ip(), 0);
                    let listener = bind_tcp("admin endpoint", free).await?;
                    if let Ok(local) = listener.local_addr() {
                        tracing::warn!(
                            "admin endpoint: {addr} is taken (another proxy on this host?): serving on http://{local} \
                             instead (--admin ADDR chooses)"
                        );
                    }
                    listener
                }
                other => other?,
            };
            let local = listener.local_addr().ok();
            if !addr.ip().is_loopback() && options.admin_token.is_some() && admin_tls.is_none() {
                tracing::warn!(
                    "admin endpoint on {addr} (not loopback) is plain HTTP: its token crosses the network in clear \
                     (serve it over TLS with --admin-tls-cert and --admin-tls-key)"
                );
            }
            let acceptor = admin_tls.clone();
            tasks.push(tokio::spawn(crate::admin::serve(listener, registry.clone(), acceptor, shutdown.subscribe())));
            local
        }
        None => None,
    };
    let stats = match options.stats_addr {
        Some(addr) => {
            let listener = bind_tcp("stats port", addr).await?;
            let local = listener.local_addr().ok();
            let serve = crate::twemproxy_stats::serve(
                listener,
                registry.clone(),
                options.stats_interval,
                pool_count,
                shutdown.subscribe(),
            );
            tasks.push(tokio::spawn(serve));
            local
        }
        None => None,
    };
    Ok(Running { registry, listeners, tls_listeners, admin, stats, shutdown, tasks, connections, workers })
}

async fn accept_loop(
    listener: TcpListener,
    pool: Arc<Pool>,
    tls: bool,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    open: mpsc::Sender<()>,
) {
    let mut backoff = Duration::from_millis(5);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(a) => {
                backoff = Duration::from_millis(5);
                a
            }
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(pool = %pool.name(), "accept failed: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let limit = u64::from(pool.spec().client_connections);
        if limit > 0 && pool.open_connections() >= limit {
            pool.counters().rejected_connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        tracing::debug!(pool = %pool.name(), %peer, "client connected");
        let guard = ConnGuard::open(pool.all_counters().clone()).held_open(open.clone());
        let pool = pool.clone();
        let shared = shared.clone();
        let stop = stop.clone();
        let workers = pool.workers().clone();
        // The acceptor as it is now (certificates reload without a restart).
        let tls = if tls { pool.tls().acceptor() } else { None };
        workers.serve_tcp(stream, move |stream| async move {
            let stream = match stream {
                Ok(s) => s,
                Err(e) => return tracing::warn!(pool = %pool.name(), "cannot hand a connection to a worker: {e}"),
            };
            let stream = match tls {
                None => crate::conn::ClientStream::Plain(stream),
                // The handshake on the worker, bounded: a client that
                // never finishes it holds its socket for the timeout only.
                Some(tls) => {
                    let limit = shared.options.tls_handshake_timeout;
                    let c = pool.counters();
                    match tokio::time::timeout(limit, tls.accept(stream)).await {
                        Ok(Ok(s)) => {
                            c.tls_handshakes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            crate::conn::ClientStream::Tls(Box::new(s))
                        }
                        Ok(Err(e)) => {
                            c.tls_handshake_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            return tracing::debug!(pool = %pool.name(), %peer, "TLS handshake failed: {e}");
                        }
                        Err(_) => {
                            c.tls_handshake_timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            return tracing::debug!(pool = %pool.name(), %peer, "TLS handshake not done in {limit:?}: closed");
                        }
                    }
                }
            };
            let o = &shared.options;
            let settings = ConnSettings { idle: o.client_idle_timeout, budget: o.client_buffer };
            let requester = crate::conn::requester(o.client_buffer);
            let client = crate::protocol::Client { pool, shared, requester, settings, stop, guard };
            // A task of the connection's own, on this worker: the polls of
            // every read and reply go to it directly, not through this
            // set-up's future and the hand-off's around it.
            tokio::spawn(crate::protocols::of(client.pool.spec()).serve(stream, client));
        });
    }
}
