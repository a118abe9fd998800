//! Backend servers: a few connections per server, each carrying requests
//! from many clients pipelined, replies matched to requests in order (FIFO).
//!
//! Each connection slot is one task that owns its request queue for the life
//! of the server: it connects (at once with `preconnect`, else on the first
//! request), writes queued requests in batches, and hands each request's
//! reply channel to a reader task in write order. When the connection fails
//! every request on it is answered with an error, requests that arrive
//! while the server is unreachable fail at once (fail fast), and the slot
//! reconnects after a short back-off.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chash::ServerLine;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::memcache::reply::{Chunk, ReplyStream};
use crate::memcache::{parse_reply, Reply, ReplyKind, ReplyParse};
use crate::stats::ServerStats;
use crate::workers::Workers;

/// Why a request got no reply from its backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendError {
    /// The server could not be reached.
    Connect(String),
    /// No reply within the pool's `timeout`.
    Timeout,
    /// The connection closed or broke with the request outstanding.
    Closed(String),
    /// The server sent something that is not a memcached reply.
    Protocol(String),
    /// The proxy is shutting down or the server was removed.
    Gone,
    /// A reply that had to be held whole was over this many bytes (it was
    /// read past).
    TooLarge(usize),
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
        }
    }
}

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

/// Connection settings of a pool's servers.
#[derive(Clone, Debug)]
pub struct BackendSettings {
    /// Connections per server (twemproxy's `server_connections`, default 1).
    pub connections: usize,
    /// Reply timeout (twemproxy's `timeout`; none: wait).
    pub timeout: Option<Duration>,
    /// Connect at start instead of on the first request.
    pub preconnect: bool,
    /// Consecutive failures that make a server a candidate for ejection.
    pub failure_limit: u32,
    /// RESP commands sent first on every new connection (Redis `AUTH` and
    /// `SELECT`); each must be answered `+OK`.
    pub init: Vec<Bytes>,
}

type ReplyTx = oneshot::Sender<Result<Reply, BackendError>>;

/// One request on its way to a backend.
struct Job {
    data: Bytes,
    kind: ReplyKind,
    reply: ReplyTx,
    /// When the request must have been answered (the pool's `timeout` from
    /// when it was submitted).
    deadline: Option<tokio::time::Instant>,
}

/// A submitted request's reply, due by its deadline.
pub struct Pending {
    rx: oneshot::Receiver<Result<Reply, BackendError>>,
    deadline: Option<tokio::time::Instant>,
}

/// A backend server and its connections.
pub struct Server {
    line: ServerLine,
    address: Address,
    /// Request queues, one per connection, by worker: `queues[worker][connection]`.
    queues: Vec<Vec<mpsc::Sender<Job>>>,
    failures: AtomicU32,
    /// Set while the server is unreachable (the last attempt failed).
    down: AtomicBool,
    failure_limit: u32,
    timeout: Option<Duration>,
    on_failure: Option<mpsc::UnboundedSender<String>>,
    /// Wakes connection slots waiting out a back-off (a restored server is
    /// tried again at once).
    retry: Arc<tokio::sync::Notify>,
    /// Counters.
    pub stats: Arc<ServerStats>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server").field("id", &self.line.id).field("address", &self.address).finish()
    }
}

impl Server {
    /// Starts the connection tasks of a server on the calling runtime.
    /// `on_failure` receives the server's id when its consecutive failures
    /// reach the failure limit. Must be called inside a tokio runtime.
    pub fn start(
        line: ServerLine,
        address: Address,
        settings: &BackendSettings,
        on_failure: Option<mpsc::UnboundedSender<String>>,
    ) -> Arc<Server> {
        Server::start_on(&Workers::current(), line, address, settings, on_failure)
    }

    /// Starts the connection tasks of a server: `settings.connections` on
    /// each worker, so requests queued from a worker's client connections
    /// stay on that worker's thread.
    pub fn start_on(
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
            stats: Arc::new(ServerStats::default()),
        });
        for (worker, rx) in receivers {
            let weak = Arc::downgrade(&server);
            let address = server.address.clone();
            let settings = settings.clone();
            let retry = server.retry.clone();
            workers.spawn_on(worker, async move { connection_slot(rx, address, settings, weak, retry).await });
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

    /// Whether the last connection attempt failed.
    pub fn is_down(&self) -> bool {
        self.down.load(Relaxed)
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures.load(Relaxed)
    }

    /// Queues a request and returns its pending reply. Waits only when the
    /// connection's queue is full (backpressure).
    ///
    /// The request goes on a connection of the calling thread's worker.
    /// Requests with the same `affinity` (a client connection's number) from
    /// the same worker use the same backend connection, so one client's
    /// requests to a server are executed in the order it sent them (a `set`
    /// then a `get` of the same key never overtake each other).
    ///
    /// The pool's `timeout` starts now: [`Server::finish`] answers by then
    /// whatever the connection is doing (connecting, failing its set-up,
    /// waiting behind other requests).
    pub async fn submit(&self, data: Bytes, kind: ReplyKind, affinity: usize) -> Pending {
        let (tx, rx) = oneshot::channel();
        self.stats.requests.fetch_add(1, Relaxed);
        let deadline = self.timeout.map(|t| tokio::time::Instant::now() + t);
        let queues = &self.queues[crate::workers::current_index() % self.queues.len()];
        let job = Job { data, kind, reply: tx, deadline };
        if let Err(mpsc::error::SendError(job)) = queues[affinity % queues.len()].send(job).await {
            let _ = job.reply.send(Err(BackendError::Gone));
        }
        Pending { rx, deadline }
    }

    /// Waits for a submitted request's reply, at most until its deadline,
    /// and records the outcome.
    pub async fn finish(&self, pending: Pending) -> Result<Reply, BackendError> {
        let Pending { rx, deadline } = pending;
        let result = match deadline {
            Some(d) => tokio::time::timeout_at(d, rx).await.unwrap_or(Ok(Err(BackendError::Timeout))),
            None => rx.await,
        };
        let result = result.unwrap_or_else(|_| Err(BackendError::Closed("connection reset".into())));
        match &result {
            Ok(_) => self.failures.store(0, Relaxed),
            Err(e) => {
                self.stats.errors.fetch_add(1, Relaxed);
                if *e == BackendError::Timeout {
                    self.stats.timeouts.fetch_add(1, Relaxed);
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
        self.stats.connections.fetch_add(1, Relaxed);
        if self.down.swap(false, Relaxed) {
            tracing::info!(server = %self.line.id, "server reachable again");
        }
    }
}

type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

async fn connect(address: &Address, timeout: Option<Duration>) -> std::io::Result<(BoxRead, BoxWrite)> {
    let limit = timeout.unwrap_or(Duration::from_secs(10)).max(Duration::from_millis(100));
    let connecting = async {
        match address {
            Address::Tcp(a) => {
                let s = tokio::net::TcpStream::connect(a.as_str()).await?;
                s.set_nodelay(true)?;
                let (r, w) = s.into_split();
                Ok::<(BoxRead, BoxWrite), std::io::Error>((Box::new(r), Box::new(w)))
            }
            Address::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p).await?;
                let (r, w) = s.into_split();
                Ok((Box::new(r) as BoxRead, Box::new(w) as BoxWrite))
            }
        }
    };
    match tokio::time::timeout(limit, connecting).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")),
    }
}

/// While a server is unreachable, its connections try again this often
/// on their own (a request tries at once).
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// Answers a request with an error.
fn fail(job: Job, err: &BackendError) {
    let _ = job.reply.send(Err(err.clone()));
}

async fn connection_slot(
    mut rx: mpsc::Receiver<Job>,
    address: Address,
    settings: BackendSettings,
    server: std::sync::Weak<Server>,
    retry: Arc<tokio::sync::Notify>,
) {
    let stats = match server.upgrade() {
        Some(s) => s.stats.clone(),
        None => return,
    };
    let mut first: Option<Job> = None;
    let mut eager = settings.preconnect;
    loop {
        if !eager && first.is_none() {
            match rx.recv().await {
                Some(job) => first = Some(job),
                None => return,
            }
        }
        eager = false;
        match open(&address, &settings).await {
            Ok((r, w)) => {
                if let Some(s) = server.upgrade() {
                    s.record_connected();
                }
                match run_connection(r, w, first.take(), &mut rx, settings.timeout, &stats).await {
                    Ok(()) => return, // the server was dropped: queue closed
                    Err(why) => {
                        tracing::debug!(?address, "backend connection closed: {why}");
                        if let Some(s) = server.upgrade() {
                            s.record_failure(&why);
                        }
                    }
                }
            }
            Err(why) => {
                let Some(s) = server.upgrade() else { return };
                if !s.down.swap(true, Relaxed) {
                    tracing::warn!(server = %s.id(), "server unreachable: {why}");
                } else {
                    tracing::debug!(server = %s.id(), "server still unreachable: {why}");
                }
                s.record_failure(&why);
                drop(s);
                // The request that asked for the attempt, and those that
                // queued meanwhile, get its outcome.
                let err = BackendError::Connect(why);
                if let Some(job) = first.take() {
                    fail(job, &err);
                }
                while let Ok(job) = rx.try_recv() {
                    fail(job, &err);
                }
                // The next request tries again at once (one attempt at a
                // time: this task's); without requests, try again after
                // the back-off, or when the pool gives the server another
                // chance.
                tokio::select! {
                    job = rx.recv() => match job {
                        Some(job) => first = Some(job),
                        None => return,
                    },
                    _ = tokio::time::sleep(RETRY_BACKOFF) => eager = true,
                    _ = retry.notified() => eager = true,
                }
            }
        }
    }
}

/// Connects and runs the connection's set-up commands (Redis `AUTH`,
/// `SELECT`); either failing is a failed connection attempt.
async fn open(address: &Address, settings: &BackendSettings) -> Result<(BoxRead, BoxWrite), String> {
    let (mut r, mut w) = connect(address, settings.timeout).await.map_err(|e| e.to_string())?;
    handshake(&mut r, &mut w, settings).await?;
    Ok((r, w))
}

/// Sends the connection's init commands and checks each is answered `+OK`.
async fn handshake(r: &mut BoxRead, w: &mut BoxWrite, settings: &BackendSettings) -> Result<(), String> {
    if settings.init.is_empty() {
        return Ok(());
    }
    let exchange = async {
        for cmd in &settings.init {
            w.write_all(cmd).await.map_err(|e| e.to_string())?;
        }
        let mut buf = BytesMut::new();
        let mut answered = 0;
        while answered < settings.init.len() {
            match crate::redis::resp::parse_reply(&mut buf) {
                crate::redis::resp::Frame::Done(f) if f.starts_with(b"+") => answered += 1,
                crate::redis::resp::Frame::Done(f) => {
                    return Err(format!(
                        "server refused the connection setup: {}",
                        String::from_utf8_lossy(&f).trim_end()
                    ))
                }
                crate::redis::resp::Frame::Invalid(e) => return Err(e),
                crate::redis::resp::Frame::Incomplete => {
                    if r.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
                        return Err("server closed the connection during setup".into());
                    }
                }
            }
        }
        Ok(())
    };
    match tokio::time::timeout(settings.timeout.unwrap_or(Duration::from_secs(10)), exchange).await {
        Ok(r) => r,
        Err(_) => Err("connection setup timed out".into()),
    }
}

/// A request written and waiting for its reply.
struct InFlight {
    kind: ReplyKind,
    reply: ReplyTx,
    deadline: Option<tokio::time::Instant>,
    /// When it was written: the server's part of its latency starts here.
    sent: tokio::time::Instant,
}

/// Runs one connection until it fails (`Err`) or the queue closes (`Ok`).
async fn run_connection(
    r: BoxRead,
    mut w: BoxWrite,
    first: Option<Job>,
    rx: &mut mpsc::Receiver<Job>,
    timeout: Option<Duration>,
    stats: &Arc<ServerStats>,
) -> Result<(), String> {
    let (inflight_tx, inflight_rx) = mpsc::unbounded_channel::<InFlight>();
    let mut reader = tokio::spawn(read_replies(r, inflight_rx, timeout, stats.clone()));
    let mut batch = BytesMut::with_capacity(16 * 1024);
    let mut pending = first;
    loop {
        let job = match pending.take() {
            Some(job) => Some(job),
            None => tokio::select! {
                job = rx.recv() => job,
                done = &mut reader => {
                    return Err(match done {
                        Ok(Ok(())) => "reader finished".into(),
                        Ok(Err(why)) => why,
                        Err(e) => format!("reader task: {e}"),
                    });
                }
            },
        };
        let Some(job) = job else {
            // Queue closed: let outstanding replies arrive, then stop.
            drop(inflight_tx);
            let _ = w.shutdown().await;
            let _ = reader.await;
            return Ok(());
        };
        batch.clear();
        let mut jobs = vec![job];
        // Let the other ready tasks (client connections) run first, as an
        // event loop would: requests they queue for this server meanwhile
        // go out in the same write, which saves a system call per request
        // under load and costs nothing when idle.
        tokio::task::yield_now().await;
        // Coalesce what is already queued into one write.
        let mut bytes = jobs[0].data.len();
        while bytes < 64 * 1024 {
            match rx.try_recv() {
                Ok(j) => {
                    bytes += j.data.len();
                    jobs.push(j);
                }
                Err(_) => break,
            }
        }
        let sent = tokio::time::Instant::now();
        for job in jobs {
            batch.extend_from_slice(&job.data);
            let inflight = InFlight { kind: job.kind, reply: job.reply, deadline: job.deadline, sent };
            if inflight_tx.send(inflight).is_err() {
                return Err("reader stopped".into());
            }
        }
        let write = w.write_all(&batch);
        let result = match timeout {
            Some(t) => {
                tokio::time::timeout(t, write).await.unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
            }
            None => write.await,
        };
        if let Err(e) = result {
            // The reader answers what it holds when its channel closes.
            drop(inflight_tx);
            reader.abort();
            return Err(format!("write: {e}"));
        }
    }
}

/// A RESP reply still incomplete with this many bytes buffered is passed on
/// as it arrives instead of being held whole.
pub const STREAM_AFTER: usize = 256 * 1024;

/// Chunks (up to a read's worth each, about 64 KiB) of a streamed reply
/// buffered between a backend and its client.
const STREAM_CHUNKS: usize = 16;

/// How long a streamed reply waits for its client to take the next chunk
/// before it stops sending to it (the client's connection then closes).
/// Meanwhile the backend connection waits too, so this bounds how long one
/// slow client can hold up the others sharing the connection.
pub const STREAM_PATIENCE: Duration = Duration::from_secs(5);

/// The largest reply held whole for a request that needs all of it
/// ([`ReplyKind::RespWhole`]: parts of split commands); a larger one is read
/// past and the request gets [`BackendError::TooLarge`].
pub const WHOLE_REPLY_LIMIT: usize = 64 << 20;

/// Why a stream ended early.
enum StreamError {
    /// No bytes from the server within the timeout.
    Timeout,
    /// The connection broke or the bytes were not RESP.
    Broken(String),
}

/// Reads replies and answers in-flight requests in order. Returns why it stopped.
async fn read_replies(
    mut r: BoxRead,
    mut inflight: mpsc::UnboundedReceiver<InFlight>,
    timeout: Option<Duration>,
    stats: Arc<ServerStats>,
) -> Result<(), String> {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut waiting: VecDeque<InFlight> = VecDeque::new();
    let fail_all =
        |waiting: &mut VecDeque<InFlight>, inflight: &mut mpsc::UnboundedReceiver<InFlight>, err: BackendError| {
            for f in waiting.drain(..) {
                let _ = f.reply.send(Err(err.clone()));
            }
            inflight.close();
            while let Ok(f) = inflight.try_recv() {
                let _ = f.reply.send(Err(err.clone()));
            }
        };
    loop {
        while let Ok(f) = inflight.try_recv() {
            waiting.push_back(f);
        }
        while let Some(front) = waiting.front() {
            let kind = front.kind;
            match parse_reply(&mut buf, kind) {
                ReplyParse::Done(reply) => {
                    if let Some(f) = waiting.pop_front() {
                        stats.latency.observe(f.sent.elapsed());
                        let _ = f.reply.send(Ok(reply));
                    }
                }
                ReplyParse::Incomplete
                    if (kind == ReplyKind::Resp && buf.len() >= STREAM_AFTER)
                        || (kind == ReplyKind::RespWhole && buf.len() >= WHOLE_REPLY_LIMIT) =>
                {
                    // A large reply: passed on to the client as it arrives,
                    // or (too large to hold whole) read past.
                    let Some(f) = waiting.pop_front() else { break };
                    stats.latency.observe(f.sent.elapsed());
                    let tx = if kind == ReplyKind::Resp {
                        let (tx, rx) = mpsc::channel(STREAM_CHUNKS);
                        let _ = f.reply.send(Ok(Reply::Stream(ReplyStream(rx))));
                        Some(tx)
                    } else {
                        let _ = f.reply.send(Err(BackendError::TooLarge(WHOLE_REPLY_LIMIT)));
                        None
                    };
                    match stream_reply(&mut r, &mut buf, tx, timeout).await {
                        Ok(()) => {
                            // Requests queued behind it waited for the stream,
                            // not for their server: their time starts now.
                            while let Ok(f) = inflight.try_recv() {
                                waiting.push_back(f);
                            }
                            if let Some(t) = timeout {
                                let from = tokio::time::Instant::now() + t;
                                for f in &mut waiting {
                                    f.deadline = f.deadline.map(|d| d.max(from));
                                }
                            }
                        }
                        Err(StreamError::Timeout) => {
                            fail_all(&mut waiting, &mut inflight, BackendError::Timeout);
                            return Err("reply timed out".into());
                        }
                        Err(StreamError::Broken(e)) => {
                            fail_all(&mut waiting, &mut inflight, BackendError::Closed(e.clone()));
                            return Err(e);
                        }
                    }
                }
                ReplyParse::Incomplete => break,
                ReplyParse::Invalid(e) => {
                    fail_all(&mut waiting, &mut inflight, BackendError::Protocol(e.clone()));
                    return Err(e);
                }
            }
        }
        let deadline = waiting.front().and_then(|f| f.deadline);
        tokio::select! {
            f = inflight.recv(), if waiting.is_empty() => match f {
                Some(f) => waiting.push_back(f),
                None => return Ok(()),
            },
            n = r.read_buf(&mut buf) => match n {
                Ok(0) => {
                    fail_all(&mut waiting, &mut inflight, BackendError::Closed("server closed the connection".into()));
                    return Err("server closed the connection".into());
                }
                Ok(_) => {}
                Err(e) => {
                    fail_all(&mut waiting, &mut inflight, BackendError::Closed(e.to_string()));
                    return Err(e.to_string());
                }
            },
            _ = sleep_until_opt(deadline) => {
                fail_all(&mut waiting, &mut inflight, BackendError::Timeout);
                return Err("reply timed out".into());
            }
        }
    }
}

/// Passes one RESP reply from the front of `buf` and the connection on to
/// `tx` as it arrives, holding at most a read's worth plus the channel's
/// chunks; with no `tx` (or once the client is gone, or has not taken a
/// chunk for [`STREAM_PATIENCE`]) the rest is read and dropped, so the
/// connection stays in step. Each read waits at most the pool's timeout.
async fn stream_reply(
    r: &mut BoxRead,
    buf: &mut BytesMut,
    mut tx: Option<mpsc::Sender<Chunk>>,
    timeout: Option<Duration>,
) -> Result<(), StreamError> {
    let mut scanner = crate::redis::resp::FrameScanner::default();
    loop {
        let (used, last) = scanner.scan(buf).map_err(StreamError::Broken)?;
        if used > 0 {
            let data = buf.split_to(used).freeze();
            if let Some(t) = &tx {
                match tokio::time::timeout(STREAM_PATIENCE, t.send(Chunk { data, last })).await {
                    Ok(Ok(())) => {}
                    // Gone or stuck: it gets a cut-short reply and its
                    // connection closes.
                    _ => tx = None,
                }
            }
        }
        if last {
            return Ok(());
        }
        buf.reserve(64 * 1024);
        let n = match timeout {
            Some(t) => tokio::time::timeout(t, r.read_buf(buf)).await.map_err(|_| StreamError::Timeout)?,
            None => r.read_buf(buf).await,
        };
        match n {
            Ok(0) => return Err(StreamError::Broken("server closed the connection".into())),
            Ok(_) => {}
            Err(e) => return Err(StreamError::Broken(e.to_string())),
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
pub(crate) async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
