//! Server connections: a few per server (per worker thread), each carrying
//! the requests of many clients pipelined, replies matched to requests in
//! order (FIFO). Protocol-free: a request names the [`Framing`] of its
//! reply, and a connection's set-up commands come as a [`Setup`].
//!
//! - [`Server`] (here): a server's request queues, health and counters;
//!   [`Server::submit`] queues a request, [`Server::finish`] waits for its
//!   reply.
//! - `connection`: the task behind each connection slot (connect, set-up,
//!   write batches, read replies, stream large ones, reconnect), which
//!   answers every request by its deadline whatever the connection does.
//! - `request` (requests, requesters, errors), `health` (failures and the
//!   down state), `framing` (the seam the protocol folders implement).

mod connection;
pub(crate) mod framing;
mod health;
#[cfg(test)]
pub(crate) mod memory;
mod moving;
mod open;
mod queue;
mod request;

use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use std::sync::Mutex;

use bytes::Bytes;
use chash::ServerLine;

pub(crate) use framing::{Chunk, Large, Reply, ReplyStream, Scan, Setup};
pub use framing::{Frame, Framing, Measured};
pub(crate) use health::{FailureHook, Health};
pub(crate) use moving::{Moving, Target};
pub(crate) use open::{BoxRead, BoxWrite};
pub use request::Address;
pub(crate) use request::{BackendError, BackendSettings, ReplyAccount, Requester};
pub(crate) use request::{Delivered, Job, Pending};

use crate::stats::{described, Desc, Histogram, HistogramValues, PerWorker, ServerCounters, ServerEvents};
use crate::workers::Workers;

/// A client's place among those blocked on a server
/// ([`Server::try_block`]), given back when dropped.
#[derive(Debug)]
pub struct Blocked(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Blocked {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// A server and its connections.
pub struct Server {
    line: ServerLine,
    address: Address,
    /// Request queues by dialect and worker: `queues[dialect][worker][connection]`.
    queues: Vec<Vec<Vec<queue::JobSender>>>,
    health: Arc<Health>,
    timeout: Option<Duration>,
    counters: Arc<PerWorker<ServerCounters>>,
    latency: Arc<PerWorker<Histogram>>,
    /// What its connections are made with (for pinned ones).
    settings: BackendSettings,
    /// Clients blocked on it now, each on a pinned connection.
    blocked: Arc<std::sync::atomic::AtomicUsize>,
    /// Idle pinned connections, clean (nothing watched), by dialect.
    idle: Mutex<Vec<Vec<queue::JobSender>>>,
    /// Counters of events that are not per request.
    pub events: ServerEvents,
}

/// Idle pinned connections a server keeps per dialect for the next client
/// that needs one; more are closed when released.
const IDLE_PINNED: usize = 16;

/// What [`Server::submit_now`] did with a request.
pub(crate) enum Submitted {
    /// Queued: its reply comes to this.
    Queued(Pending),
    /// Not queued, the connection's queue being full: for
    /// [`Server::submit_waiting`]; its reply comes to the `Pending`.
    Full(Box<Job>, Pending),
}

/// A server connection of one client's own (Redis `WATCH` ... `EXEC`):
/// nothing of another client's goes on it, and it never reconnects behind
/// its client's back: once the connection ends (or cannot be made) every
/// request on it fails, so state the server keeps per connection (watched
/// keys) is never silently lost. Dropping it closes the connection.
pub struct Pinned {
    tx: queue::JobSender,
    dialect: usize,
}

/// What a pool's servers speak, as its protocol describes it: the
/// protocol's name, each dialect's set-up (at least one), the probe a
/// failed-over server must pass before it is taken back, and what it gets
/// then.
#[derive(Clone)]
pub(crate) struct Speech {
    /// `memcached`, `redis`.
    pub protocol: &'static str,
    /// What each dialect's connections run first (a request names its
    /// dialect by index).
    pub dialects: Vec<Option<Setup>>,
    /// What a failed-over server is probed with (`None`: its connections'
    /// state decides).
    pub probe: Option<Setup>,
    /// What it gets before it is taken back.
    pub before_return: Option<Setup>,
    /// Where servers are, when the protocol finds them (Redis Sentinel
    /// groups) instead of their lines naming addresses.
    pub locator: Option<Arc<dyn Locator>>,
}

/// Finds the servers of a pool whose lines name something to look up
/// (Redis Sentinel master groups).
pub(crate) trait Locator: Send + Sync {
    /// Where a server line's server is reached (inside a runtime: it may
    /// start the tasks that follow it, and servers of its own on
    /// `workers` with `settings`: a group's replicas).
    fn locate(&self, line: &ServerLine, workers: &Arc<Workers>, settings: &BackendSettings) -> Address;

    /// Each located server's state, by id.
    fn views(&self) -> std::collections::BTreeMap<String, crate::stats::GroupView>;

    /// The replicas of the located server `id` that may serve reads now.
    fn standbys(&self, id: &str) -> Arc<Vec<Standby>>;
}

/// A replica that may serve reads (of a Sentinel group).
#[derive(Clone, Debug)]
pub(crate) struct Standby {
    /// Its server (connections of its own).
    pub server: Arc<Server>,
    /// Whether it is in the proxy's zone.
    pub near: bool,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server").field("id", &self.line.id).field("address", &self.address).finish()
    }
}

impl Server {
    /// Starts the connection tasks of a server: `settings.connections` on
    /// each worker, so requests queued from a worker's client connections
    /// stay on that worker's thread. `on_failure` is called with the
    /// server's id when its consecutive failures reach the failure limit.
    pub fn start(
        workers: &Workers,
        line: ServerLine,
        address: Address,
        settings: &BackendSettings,
        on_failure: Option<FailureHook>,
    ) -> Arc<Server> {
        let health = Arc::new(Health::new(line.id.clone(), settings.failure_limit, on_failure));
        let counters = Arc::new(PerWorker::new(workers.count()));
        let latency = Arc::new(PerWorker::new(workers.count()));
        let mut queues = Vec::new();
        let idle = Mutex::new(vec![Vec::new(); settings.dialects.len()]);
        for (dialect, setup) in settings.dialects.iter().enumerate() {
            let mut by_worker = Vec::new();
            for worker in 0..workers.count() {
                let mut txs = Vec::new();
                for _ in 0..settings.connections.max(1) {
                    let (tx, rx) = queue::channel(connection::QUEUE);
                    txs.push(tx);
                    let slot = connection::Slot {
                        address: address.clone(),
                        name: line.name.clone(),
                        settings: settings.clone(),
                        setup: setup.clone(),
                        // Only the first dialect's connections are made at
                        // start; the others when a client speaks them.
                        preconnect: settings.preconnect && dialect == 0,
                        once: false,
                        health: health.clone(),
                        counters: counters.clone(),
                        latency: latency.clone(),
                    };
                    workers.spawn_on(worker, connection::run_slot(slot, rx));
                }
                by_worker.push(txs);
            }
            queues.push(by_worker);
        }
        Arc::new(Server {
            line,
            address,
            queues,
            health,
            timeout: settings.timeout,
            counters,
            latency,
            settings: settings.clone(),
            blocked: Arc::default(),
            idle,
            events: ServerEvents::default(),
        })
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

    /// Its health.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Whether the last connection attempt failed.
    pub fn is_down(&self) -> bool {
        self.health.is_down()
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
    /// The pool's `timeout` starts now: the connection answers the request
    /// by then whatever it is doing (connecting, failing its set-up,
    /// waiting behind other requests or a streamed reply).
    pub fn submit<'a>(
        &'a self,
        data: Bytes,
        framing: &'static dyn Framing,
        requester: &'a Requester,
    ) -> impl std::future::Future<Output = Pending> + Send + 'a {
        self.submit_frames(data, framing, 1, requester)
    }

    /// As [`Server::submit`], for `data` holding several requests that go
    /// out together on one connection, nothing between them: their
    /// `frames` replies come back as one reply, in order (a transaction).
    pub fn submit_frames<'a>(
        &'a self,
        data: Bytes,
        framing: &'static dyn Framing,
        frames: usize,
        requester: &'a Requester,
    ) -> impl std::future::Future<Output = Pending> + Send + 'a {
        self.enqueue(self.queue_of(requester), data, framing, frames, requester)
    }

    /// As [`Server::submit`] without a future: queued now when the
    /// connection's queue has room (almost always); else the request back,
    /// for [`Server::submit_waiting`], which waits for room.
    pub(crate) fn submit_now(&self, data: Bytes, framing: &'static dyn Framing, requester: &Requester) -> Submitted {
        let (job, pending) = self.job(data, framing, 1, requester, self.deadline());
        match self.queue_of(requester).try_send(job) {
            None => Submitted::Queued(pending),
            Some(job) => Submitted::Full(Box::new(job), pending),
        }
    }

    /// Queues a request [`Server::submit_now`] gave back, waiting for room;
    /// its `pending` is answered either way.
    pub(crate) async fn submit_waiting(&self, job: Box<Job>, requester: &Requester) {
        self.send_waiting(self.queue_of(requester), *job).await;
    }

    /// Queues `job` on `queue`, waiting for room; answered `Gone` if the
    /// connection's task has ended.
    async fn send_waiting(&self, queue: &queue::JobSender, job: Job) {
        if let Err(job) = queue.send(job).await {
            connection::fail(self.counters(), job, &BackendError::Gone);
        }
    }

    /// A request's deadline, submitted now: the pool's timeout from now.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.timeout.map(|t| tokio::time::Instant::now() + t)
    }

    /// The connection queue of `requester`'s requests on this worker.
    fn queue_of(&self, requester: &Requester) -> &queue::JobSender {
        let by_worker = &self.queues[requester.dialect.min(self.queues.len() - 1)];
        // Without a division where there is nothing to choose (one
        // worker's queues, one connection): this runs for every request.
        let queues = match by_worker.len() {
            1 => &by_worker[0],
            n => &by_worker[crate::workers::current_index() % n],
        };
        match queues.len() {
            1 => &queues[0],
            n => &queues[requester.affinity % n],
        }
    }

    /// A request's job and the reply it will get, counted as submitted.
    fn job(
        &self,
        data: Bytes,
        framing: &'static dyn Framing,
        frames: usize,
        requester: &Requester,
        deadline: Option<tokio::time::Instant>,
    ) -> (Job, Pending) {
        let (tx, pending) = requester.account.reserve();
        let c = self.counters();
        let len = data.len() as u64;
        c.requests.fetch_add(1, Relaxed);
        c.request_bytes.fetch_add(len, Relaxed);
        c.in_queue.fetch_add(1, Relaxed);
        c.in_queue_bytes.fetch_add(len, Relaxed);
        (Job { data, framing, frames: frames.max(1), reply: tx, deadline }, pending)
    }

    /// Queues a request on one connection's queue, to be answered by the
    /// pool's timeout.
    fn enqueue<'a>(
        &'a self,
        queue: &'a queue::JobSender,
        data: Bytes,
        framing: &'static dyn Framing,
        frames: usize,
        requester: &Requester,
    ) -> impl std::future::Future<Output = Pending> + Send + 'a {
        self.enqueue_until(queue, data, framing, frames, requester, self.deadline())
    }

    /// Queues a request, to be answered by `deadline` (`None`: whenever
    /// the server answers). Queued at once when there is room (almost
    /// always): the future returned only waits for room when the
    /// connection's queue is full.
    fn enqueue_until<'a>(
        &'a self,
        queue: &'a queue::JobSender,
        data: Bytes,
        framing: &'static dyn Framing,
        frames: usize,
        requester: &Requester,
        deadline: Option<tokio::time::Instant>,
    ) -> impl std::future::Future<Output = Pending> + Send + 'a {
        let (job, pending) = self.job(data, framing, frames, requester, deadline);
        let waiting = queue.try_send(job);
        async move {
            if let Some(job) = waiting {
                self.send_waiting(queue, job).await;
            }
            pending
        }
    }

    /// `data` on every connection of the server (every dialect, every
    /// worker): once each is answered, every request queued on the server
    /// before this call has been answered (each connection is FIFO).
    pub async fn submit_everywhere(
        &self,
        data: Bytes,
        framing: &'static dyn Framing,
        requester: &Requester,
    ) -> Vec<Pending> {
        let mut out = Vec::new();
        for queue in self.queues.iter().flatten().flatten() {
            out.push(self.enqueue(queue, data.clone(), framing, 1, requester).await);
        }
        out
    }

    /// A connection of the requester's own, in its dialect: an idle one
    /// released by another client, or a new one (connecting now).
    pub fn pin(&self, requester: &Requester) -> Pinned {
        let dialect = requester.dialect.min(self.settings.dialects.len() - 1);
        if let Ok(mut idle) = self.idle.lock() {
            while let Some(tx) = idle[dialect].pop() {
                if !tx.is_closed() {
                    return Pinned { tx, dialect };
                }
            }
        }
        let (tx, rx) = queue::channel(connection::QUEUE);
        let slot = connection::Slot {
            address: self.address.clone(),
            name: self.line.name.clone(),
            settings: self.settings.clone(),
            setup: self.settings.dialects[dialect].clone(),
            preconnect: true,
            once: true,
            health: self.health.clone(),
            counters: self.counters.clone(),
            latency: self.latency.clone(),
        };
        tokio::spawn(connection::run_slot(slot, rx));
        Pinned { tx, dialect }
    }

    /// Gives back a pinned connection whose server-side state is clean
    /// (after `EXEC`): kept for the next client, or closed.
    pub fn release(&self, pinned: Pinned) {
        if pinned.tx.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            let list = &mut idle[pinned.dialect];
            if list.len() < IDLE_PINNED {
                list.push(pinned.tx);
            }
        }
    }

    /// As [`Server::submit_frames`], on a pinned connection.
    pub async fn submit_pinned(
        &self,
        pinned: &Pinned,
        data: Bytes,
        framing: &'static dyn Framing,
        frames: usize,
        requester: &Requester,
    ) -> Pending {
        self.enqueue(&pinned.tx, data, framing, frames, requester).await
    }

    /// A blocking command (`BLPOP`, `XREAD ... BLOCK`, ...) on a pinned
    /// connection: answered when the server answers, or by `wait` (the
    /// command's own timeout) plus the pool's timeout; `wait` `None` (a
    /// timeout of 0): whenever the server answers.
    pub async fn submit_blocking(
        &self,
        pinned: &Pinned,
        data: Bytes,
        framing: &'static dyn Framing,
        requester: &Requester,
        wait: Option<Duration>,
    ) -> Pending {
        let grace = self.timeout.unwrap_or(Duration::from_secs(1));
        let deadline = wait.map(|w| tokio::time::Instant::now() + w + grace);
        self.enqueue_until(&pinned.tx, data, framing, 1, requester, deadline).await
    }

    /// A connection of its own, outside the request queues, set up in
    /// `dialect` (authenticated, its database selected): for a
    /// subscription, whose messages come unasked.
    pub(crate) async fn connect_raw(&self, dialect: usize) -> Result<(BoxRead, BoxWrite), String> {
        let tls = self.settings.tls.as_ref().and_then(|t| t.connector_for(self.health.id(), self.line.name.as_deref()));
        let setup = self.settings.dialects.get(dialect).cloned().flatten();
        let opened = open::open(&self.address, self.timeout, setup.as_ref(), tls.as_deref()).await;
        opened.map(|o| (o.read, o.write)).map_err(|e| e.to_string())
    }

    /// A place among the clients blocked on this server, if fewer than
    /// `cap` are; given back when dropped.
    pub fn try_block(&self, cap: usize) -> Option<Blocked> {
        let n = self.blocked.fetch_add(1, Relaxed);
        if n >= cap {
            self.blocked.fetch_sub(1, Relaxed);
            return None;
        }
        Some(Blocked(self.blocked.clone()))
    }

    /// Clients blocked on this server now.
    pub fn blocked(&self) -> usize {
        self.blocked.load(Relaxed)
    }

    /// Waits for a submitted request's reply and records the outcome.
    pub async fn finish(&self, mut pending: Pending) -> Result<Reply, BackendError> {
        std::future::poll_fn(|cx| self.poll_finish(&mut pending, cx)).await
    }

    /// [`Server::finish`], polled.
    pub fn poll_finish(
        &self,
        pending: &mut Pending,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Reply, BackendError>> {
        let result = std::task::ready!(pending.poll_reply(cx));
        self.heard(result.as_ref().err());
        std::task::Poll::Ready(result)
    }

    /// [`Server::poll_finish`] for a client's writer that waits on this
    /// reply alone: with `offer`, the server connection may write the
    /// reply to the client's socket itself ([`Pending::poll_offering`]);
    /// its success is heard there then.
    pub(crate) fn poll_forward(
        &self,
        pending: &mut Pending,
        cx: &mut std::task::Context<'_>,
        offer: bool,
    ) -> std::task::Poll<Result<Delivered, BackendError>> {
        let result = std::task::ready!(pending.poll_offering(cx, offer));
        match &result {
            Ok(Delivered::Sent(_)) => {}
            Ok(Delivered::Reply(_)) => self.heard(None),
            Err(e) => self.heard(Some(e)),
        }
        std::task::Poll::Ready(result)
    }

    /// A request's outcome, for the server's health and error counts.
    fn heard(&self, error: Option<&BackendError>) {
        match error {
            None => self.health.succeeded(),
            Some(e) => {
                let c = self.counters();
                c.errors.fetch_add(1, Relaxed);
                if *e == BackendError::Timeout {
                    c.timeouts.fetch_add(1, Relaxed);
                }
            }
        }
    }

    /// Forgets past failures and ends any connect back-off (when an
    /// ejected server is restored by hand).
    pub fn reset_failures(&self) {
        self.health.reset();
    }

    /// Gives an auto-ejected server another chance on probation: its next
    /// failure ejects it again at once.
    pub fn probation(&self) {
        self.health.probation();
    }
}
