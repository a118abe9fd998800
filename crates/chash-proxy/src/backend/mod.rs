//! Server connections: a few per server (per worker thread), each carrying
//! the requests of many clients pipelined, replies matched to requests in
//! order (FIFO). Protocol-free: a request names the [`Framing`] of its
//! reply, and a connection's set-up commands come as a [`Setup`].
//!
//! - [`Server`]: a server's request queues, health (failures, down) and
//!   counters; [`Server::submit`] queues a request, [`Server::finish`]
//!   waits for its reply, never past the pool's timeout.
//! - `connection`: the task behind each connection slot (connect, set-up,
//!   write batches, read replies, stream large ones, reconnect).
//! - [`framing`]: the seam the protocol folders implement.

mod connection;
pub mod framing;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chash::ServerLine;
use tokio::sync::{mpsc, oneshot};

pub(crate) use connection::sleep_until_opt;
pub use framing::{Frame, Framing, Large, Reply, ReplyStream, Scan, Setup};

use crate::stats::{described, Desc, Histogram, HistogramValues, PerWorker, ServerCounters, ServerEvents};
use crate::workers::Workers;

/// Why a request got no reply from its server.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendError {
    /// The server could not be reached, or refused the connection's set-up.
    Connect(String),
    /// No reply within the pool's `timeout`.
    Timeout,
    /// The connection closed or broke with the request outstanding.
    Closed(String),
    /// The server sent something that is not a reply.
    Protocol(String),
    /// The proxy is shutting down or the server was removed.
    Gone,
    /// A reply that had to be held whole was over this many bytes (it was
    /// read past).
    TooLarge(usize),
    /// The reply was dropped: its client holds too many unread replies
    /// (its connection is closing).
    Overflow,
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Connect(e) => write!(f, "cannot connect: {e}"),
            BackendError::Timeout => f.write_str("timed out"),
            BackendError::Closed(e) => write!(f, "connection lost: {e}"),
            BackendError::Protocol(e) => write!(f, "bad reply: {e}"),
            BackendError::Gone => f.write_str("server removed"),
            BackendError::TooLarge(limit) => write!(f, "reply over {limit} bytes"),
            BackendError::Overflow => f.write_str("reply dropped: the client holds too many unread replies"),
        }
    }
}

impl std::error::Error for BackendError {}

/// Where a server is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// `host:port` over TCP.
    Tcp(String),
    /// A unix socket path.
    Unix(String),
}

impl Address {
    /// The address a server line's id names: `/path` is a unix socket
    /// (twemproxy's form), anything else `host:port`.
    pub fn of_id(id: &str) -> Address {
        if id.starts_with('/') {
            Address::Unix(id.to_owned())
        } else {
            Address::Tcp(id.to_owned())
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp(a) | Address::Unix(a) => f.write_str(a),
        }
    }
}

/// Connection settings of a pool's servers.
#[derive(Clone, Debug)]
pub struct BackendSettings {
    /// Connections per server per worker (twemproxy's `server_connections`).
    pub connections: usize,
    /// Reply timeout from when a request is queued (twemproxy's `timeout`;
    /// none: wait).
    pub timeout: Option<Duration>,
    /// Connect at start instead of on the first request.
    pub preconnect: bool,
    /// Consecutive failures that make a server a candidate for ejection.
    pub failure_limit: u32,
    /// Commands every new connection runs first.
    pub setup: Option<Setup>,
}

/// A client connection's account of reply bytes that have arrived from
/// servers and that it has not taken yet. Past its limit, further replies
/// for it are dropped and it is told to close (a client that never reads
/// cannot make the proxy hold more).
#[derive(Debug)]
pub struct ReplyAccount {
    held: AtomicUsize,
    limit: usize,
    overflowed: AtomicBool,
    notify: tokio::sync::Notify,
}

impl ReplyAccount {
    /// An account that overflows once it holds `limit` bytes.
    pub fn new(limit: usize) -> Arc<ReplyAccount> {
        Arc::new(ReplyAccount {
            held: AtomicUsize::new(0),
            limit: limit.max(1),
            overflowed: AtomicBool::new(false),
            notify: tokio::sync::Notify::new(),
        })
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Relaxed)
    }

    /// Whether it has overflowed.
    pub fn is_overflowed(&self) -> bool {
        self.overflowed.load(Relaxed)
    }

    /// Resolves once the account has overflowed.
    pub async fn overflowed(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_overflowed() {
                return;
            }
            notified.await;
        }
    }

    /// A reply of `n` bytes arrives: `false` (and the account overflows)
    /// when it already holds its limit.
    fn deliver(&self, n: usize) -> bool {
        if self.held.load(Relaxed) >= self.limit {
            if !self.overflowed.swap(true, Relaxed) {
                self.notify.notify_waiters();
            }
            return false;
        }
        self.held.fetch_add(n, Relaxed);
        true
    }

    fn taken(&self, n: usize) {
        self.held.fetch_sub(n, Relaxed);
    }
}

/// Bytes a reply accounts for while it waits for its client (a stream's
/// chunks are bounded by its channel instead).
fn accounted(reply: &Reply) -> usize {
    match reply {
        Reply::Whole(b) => b.len(),
        Reply::Stream(_) => 0,
    }
}

/// Who a request is for.
#[derive(Clone, Debug)]
pub struct Requester {
    /// The client connection's number: its requests to a server share one
    /// server connection, so they run in the order it sent them.
    pub affinity: usize,
    /// Its account of reply bytes.
    pub account: Arc<ReplyAccount>,
}

type ReplyTx = oneshot::Sender<Result<Reply, BackendError>>;

/// One request on its way to a server.
struct Job {
    data: Bytes,
    framing: &'static dyn Framing,
    reply: ReplyTx,
    account: Arc<ReplyAccount>,
    /// When it must have been answered (the pool's `timeout` from when it
    /// was submitted).
    deadline: Option<tokio::time::Instant>,
}

/// A submitted request's reply, due by its deadline.
pub struct Pending {
    rx: oneshot::Receiver<Result<Reply, BackendError>>,
    deadline: Option<tokio::time::Instant>,
    account: Arc<ReplyAccount>,
}

/// A server and its connections.
pub struct Server {
    line: ServerLine,
    address: Address,
    /// Request queues by worker: `queues[worker][connection]`.
    queues: Vec<Vec<mpsc::Sender<Job>>>,
    failures: AtomicU32,
    /// Set while the server is unreachable (the last attempt failed).
    down: AtomicBool,
    failure_limit: u32,
    timeout: Option<Duration>,
    on_failure: Option<mpsc::UnboundedSender<String>>,
    /// Wakes connection slots waiting out a back-off.
    retry: Arc<tokio::sync::Notify>,
    counters: Arc<PerWorker<ServerCounters>>,
    latency: Arc<PerWorker<Histogram>>,
    /// Counters of events that are not per request.
    pub events: ServerEvents,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server").field("id", &self.line.id).field("address", &self.address).finish()
    }
}

/// What a connection slot task needs of its server.
struct Slot {
    address: Address,
    settings: BackendSettings,
    server: std::sync::Weak<Server>,
    retry: Arc<tokio::sync::Notify>,
    counters: Arc<PerWorker<ServerCounters>>,
    latency: Arc<PerWorker<Histogram>>,
}

impl Server {
    /// Starts the connection tasks of a server: `settings.connections` on
    /// each worker, so requests queued from a worker's client connections
    /// stay on that worker's thread. `on_failure` receives the server's id
    /// when its consecutive failures reach the failure limit.
    pub fn start(
        workers: &Workers,
        line: ServerLine,
        address: Address,
        settings: &BackendSettings,
        on_failure: Option<mpsc::UnboundedSender<String>>,
    ) -> Arc<Server> {
        let mut queues = Vec::new();
        let mut receivers = Vec::new();
        for worker in 0..workers.count() {
            let mut txs = Vec::new();
            for _ in 0..settings.connections.max(1) {
                let (tx, rx) = mpsc::channel(4096);
                txs.push(tx);
                receivers.push((worker, rx));
            }
            queues.push(txs);
        }
        let server = Arc::new(Server {
            line,
            address,
            queues,
            failures: AtomicU32::new(0),
            down: AtomicBool::new(false),
            failure_limit: settings.failure_limit.max(1),
            timeout: settings.timeout,
            on_failure,
            retry: Arc::new(tokio::sync::Notify::new()),
            counters: Arc::new(PerWorker::new(workers.count())),
            latency: Arc::new(PerWorker::new(workers.count())),
            events: ServerEvents::default(),
        });
        for (worker, rx) in receivers {
            let slot = Slot {
                address: server.address.clone(),
                settings: settings.clone(),
                server: Arc::downgrade(&server),
                retry: server.retry.clone(),
                counters: server.counters.clone(),
                latency: server.latency.clone(),
            };
            workers.spawn_on(worker, connection::run_slot(slot, rx));
        }
        server
    }

    /// The server line (id, weight, name) it was started with.
    pub fn line(&self) -> &ServerLine {
        &self.line
    }

    /// The server id.
    pub fn id(&self) -> &str {
        &self.line.id
    }

    /// Where it is reached.
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// Whether the last connection attempt failed.
    pub fn is_down(&self) -> bool {
        self.down.load(Relaxed)
    }

    /// The calling worker's counters.
    pub fn counters(&self) -> &ServerCounters {
        self.counters.local()
    }

    /// Every counter, summed over workers.
    pub fn counter_values(&self) -> Vec<(Desc, u64)> {
        let per_worker = crate::stats::sum(self.counters.all().map(ServerCounters::values));
        described(ServerCounters::DESCS, per_worker)
            .chain(described(ServerEvents::DESCS, self.events.values()))
            .collect()
    }

    /// The latency histogram, summed over workers.
    pub fn latency(&self) -> HistogramValues {
        let mut total = HistogramValues::default();
        for h in self.latency.all() {
            total.merge(&h.values());
        }
        total
    }

    /// Queues a request and returns its pending reply. Waits only when the
    /// connection's queue is full (backpressure).
    ///
    /// The request goes on a connection of the calling thread's worker:
    /// the one for its requester's affinity, so one client's requests to a
    /// server run in the order it sent them (a `set` then a `get` of the
    /// same key never overtake each other).
    ///
    /// The pool's `timeout` starts now: [`Server::finish`] answers by then
    /// whatever the connection is doing (connecting, failing its set-up,
    /// waiting behind other requests).
    pub async fn submit(&self, data: Bytes, framing: &'static dyn Framing, requester: &Requester) -> Pending {
        let (tx, rx) = oneshot::channel();
        let c = self.counters();
        let len = data.len() as u64;
        c.requests.fetch_add(1, Relaxed);
        c.request_bytes.fetch_add(len, Relaxed);
        c.in_queue.fetch_add(1, Relaxed);
        c.in_queue_bytes.fetch_add(len, Relaxed);
        let deadline = self.timeout.map(|t| tokio::time::Instant::now() + t);
        let queues = &self.queues[crate::workers::current_index() % self.queues.len()];
        let account = requester.account.clone();
        let job = Job { data, framing, reply: tx, account: account.clone(), deadline };
        if let Err(mpsc::error::SendError(job)) = queues[requester.affinity % queues.len()].send(job).await {
            connection::unqueue(c, &job);
            let _ = job.reply.send(Err(BackendError::Gone));
        }
        Pending { rx, deadline, account }
    }

    /// Waits for a submitted request's reply, at most until its deadline,
    /// and records the outcome.
    pub async fn finish(&self, pending: Pending) -> Result<Reply, BackendError> {
        let Pending { rx, deadline, account } = pending;
        let result = match deadline {
            Some(d) => tokio::time::timeout_at(d, rx).await.unwrap_or(Ok(Err(BackendError::Timeout))),
            None => rx.await,
        };
        let result = result.unwrap_or_else(|_| Err(BackendError::Closed("connection reset".into())));
        match &result {
            Ok(reply) => {
                account.taken(accounted(reply));
                self.failures.store(0, Relaxed);
            }
            Err(e) => {
                let c = self.counters();
                c.errors.fetch_add(1, Relaxed);
                if *e == BackendError::Timeout {
                    c.timeouts.fetch_add(1, Relaxed);
                }
            }
        }
        result
    }

    /// Forgets past failures and ends any connect back-off (when an
    /// ejected server is restored by hand).
    pub fn reset_failures(&self) {
        self.failures.store(0, Relaxed);
        self.retry.notify_waiters();
    }

    /// Gives an auto-ejected server another chance on probation: its next
    /// failure ejects it again at once (a reply resets its failures), and
    /// its connections try again now.
    pub fn probation(&self) {
        self.failures.store(self.failure_limit - 1, Relaxed);
        self.retry.notify_waiters();
    }

    fn record_failure(&self, why: &str) {
        let n = self.failures.fetch_add(1, Relaxed) + 1;
        if n == self.failure_limit {
            tracing::warn!(server = %self.line.id, failures = n, "server failing: {why}");
            if let Some(tx) = &self.on_failure {
                let _ = tx.send(self.line.id.clone());
            }
        }
    }

    fn record_connected(&self) {
        if self.down.swap(false, Relaxed) {
            tracing::info!(server = %self.line.id, "server reachable again");
        }
    }

    /// Marks the server unreachable; true if it was not already.
    fn record_down(&self) -> bool {
        !self.down.swap(true, Relaxed)
    }
}
