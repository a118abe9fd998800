//! The task behind one connection slot of a server: it owns the slot's
//! request queue for the life of the server, connects (at once with
//! `preconnect`, else on the first request), runs the set-up commands,
//! writes queued requests in batches and hands each request to a reader
//! task in write order. When the connection fails every request on it is
//! answered with an error; while the server is unreachable each request
//! makes a new attempt (one at a time) and gets its outcome, and the slot
//! also tries again on its own after a back-off.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::framing::{Chunk, Frame, Framing, Large, Reply, ReplyStream, Setup};
use super::{accounted, Address, BackendError, Job, ReplyAccount, ReplyTx, Slot};
use crate::stats::{Histogram, PerWorker, ServerCounters};

type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// While a server is unreachable, its connections try again this often
/// on their own (a request tries at once).
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// How long a connection attempt may take without a pool timeout.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

/// A request leaves the queue without being written.
pub(super) fn unqueue(c: &ServerCounters, job: &Job) {
    c.in_queue.fetch_sub(1, Relaxed);
    c.in_queue_bytes.fetch_sub(job.data.len() as u64, Relaxed);
}

/// Answers a queued request with an error.
fn fail(c: &ServerCounters, job: Job, err: &BackendError) {
    unqueue(c, &job);
    let _ = job.reply.send(Err(err.clone()));
}

async fn connect(address: &Address, timeout: Option<Duration>) -> std::io::Result<(BoxRead, BoxWrite)> {
    let limit = timeout.unwrap_or(CONNECT_LIMIT).max(Duration::from_millis(100));
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

/// Connects and runs the set-up commands; either failing is a failed
/// connection attempt.
async fn open(
    address: &Address,
    timeout: Option<Duration>,
    setup: Option<&Setup>,
) -> Result<(BoxRead, BoxWrite), String> {
    let (mut r, mut w) = connect(address, timeout).await.map_err(|e| e.to_string())?;
    if let Some(setup) = setup {
        let exchange = run_setup(&mut r, &mut w, setup);
        match tokio::time::timeout(timeout.unwrap_or(CONNECT_LIMIT), exchange).await {
            Ok(result) => result?,
            Err(_) => return Err("connection set-up timed out".into()),
        }
    }
    Ok((r, w))
}

/// Sends the set-up commands and checks each reply.
async fn run_setup(r: &mut BoxRead, w: &mut BoxWrite, setup: &Setup) -> Result<(), String> {
    for cmd in &setup.requests {
        w.write_all(cmd).await.map_err(|e| e.to_string())?;
    }
    let mut buf = BytesMut::new();
    let mut answered = 0;
    while answered < setup.requests.len() {
        match setup.framing.parse(&mut buf) {
            Frame::Done(reply) => {
                (setup.check)(&reply)?;
                answered += 1;
            }
            Frame::Invalid(e) => return Err(e),
            Frame::Incomplete => {
                if r.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
                    return Err("server closed the connection during set-up".into());
                }
            }
        }
    }
    Ok(())
}

/// How a connection ended.
enum Ended {
    /// The server closed it.
    Eof,
    /// A reply timed out.
    TimedOut,
    /// Anything else.
    Error(String),
}

impl Ended {
    fn why(&self) -> String {
        match self {
            Ended::Eof => "server closed the connection".into(),
            Ended::TimedOut => "reply timed out".into(),
            Ended::Error(e) => e.clone(),
        }
    }

    fn count(&self, c: &ServerCounters) {
        let counter = match self {
            Ended::Eof => &c.server_eof,
            Ended::TimedOut => &c.server_timedout,
            Ended::Error(_) => &c.server_err,
        };
        counter.fetch_add(1, Relaxed);
    }
}

/// Runs a connection slot until its server is dropped.
pub(super) async fn run_slot(slot: Slot, mut rx: mpsc::Receiver<Job>) {
    let mut first: Option<Job> = None;
    let mut eager = slot.settings.preconnect;
    loop {
        if !eager && first.is_none() {
            match rx.recv().await {
                Some(job) => first = Some(job),
                None => return,
            }
        }
        eager = false;
        let c = slot.counters.local();
        match open(&slot.address, slot.settings.timeout, slot.settings.setup.as_ref()).await {
            Ok((r, w)) => {
                c.server_connections.fetch_add(1, Relaxed);
                c.connections_made.fetch_add(1, Relaxed);
                if let Some(s) = slot.server.upgrade() {
                    s.record_connected();
                }
                let ended = run_connection(r, w, first.take(), &mut rx, &slot).await;
                let c = slot.counters.local();
                c.server_connections.fetch_sub(1, Relaxed);
                let Some(ended) = ended else { return }; // the server was dropped: queue closed
                ended.count(c);
                tracing::debug!(address = %slot.address, "server connection closed: {}", ended.why());
                if let Some(s) = slot.server.upgrade() {
                    s.record_failure(&ended.why());
                }
            }
            Err(why) => {
                c.server_err.fetch_add(1, Relaxed);
                let Some(s) = slot.server.upgrade() else { return };
                if s.record_down() {
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
                    fail(c, job, &err);
                }
                while let Ok(job) = rx.try_recv() {
                    fail(c, job, &err);
                }
                // The next request tries again at once (one attempt at a
                // time: this task's); without requests, try again after the
                // back-off, or when the pool gives the server another chance.
                tokio::select! {
                    job = rx.recv() => match job {
                        Some(job) => first = Some(job),
                        None => return,
                    },
                    _ = tokio::time::sleep(RETRY_BACKOFF) => eager = true,
                    _ = slot.retry.notified() => eager = true,
                }
            }
        }
    }
}

/// A request written and waiting for its reply.
struct InFlight {
    framing: &'static dyn Framing,
    reply: ReplyTx,
    account: Arc<ReplyAccount>,
    deadline: Option<tokio::time::Instant>,
    /// When it was written: the server's part of its latency starts here.
    sent: tokio::time::Instant,
    /// Its size, for the out-queue gauge.
    bytes: u64,
}

impl InFlight {
    /// Takes it off the out-queue gauge and answers it.
    fn answer(self, c: &ServerCounters, result: Result<Reply, BackendError>) {
        c.out_queue.fetch_sub(1, Relaxed);
        c.out_queue_bytes.fetch_sub(self.bytes, Relaxed);
        let result = match result {
            Ok(reply) if !self.account.deliver(accounted(&reply)) => Err(BackendError::Overflow),
            r => r,
        };
        let _ = self.reply.send(result);
    }
}

/// Runs one connection until it fails (`Some`) or the queue closes (`None`).
async fn run_connection(
    r: BoxRead,
    mut w: BoxWrite,
    first: Option<Job>,
    rx: &mut mpsc::Receiver<Job>,
    slot: &Slot,
) -> Option<Ended> {
    let timeout = slot.settings.timeout;
    let (inflight_tx, inflight_rx) = mpsc::unbounded_channel::<InFlight>();
    let (stop_tx, stop_rx) = oneshot::channel::<String>();
    let mut reader =
        tokio::spawn(read_replies(r, inflight_rx, stop_rx, timeout, slot.counters.clone(), slot.latency.clone()));
    let mut batch = BytesMut::with_capacity(16 * 1024);
    let mut pending = first;
    let ended_by_reader = |done: Result<Option<Ended>, tokio::task::JoinError>| match done {
        Ok(Some(ended)) => ended,
        Ok(None) => Ended::Error("reader finished".into()),
        Err(e) => Ended::Error(format!("reader task: {e}")),
    };
    loop {
        let job = match pending.take() {
            Some(job) => Some(job),
            None => tokio::select! {
                job = rx.recv() => job,
                done = &mut reader => return Some(ended_by_reader(done)),
            },
        };
        let Some(job) = job else {
            // Queue closed: let outstanding replies arrive, then stop.
            drop(inflight_tx);
            let _ = w.shutdown().await;
            let _ = reader.await;
            return None;
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
        let c = slot.counters.local();
        let sent = tokio::time::Instant::now();
        for job in jobs {
            batch.extend_from_slice(&job.data);
            unqueue(c, &job);
            let bytes = job.data.len() as u64;
            c.out_queue.fetch_add(1, Relaxed);
            c.out_queue_bytes.fetch_add(bytes, Relaxed);
            let Job { framing, reply, account, deadline, .. } = job;
            let inflight = InFlight { framing, reply, account, deadline, sent, bytes };
            if let Err(mpsc::error::SendError(f)) = inflight_tx.send(inflight) {
                f.answer(c, Err(BackendError::Closed("connection lost".into())));
                return Some(ended_by_reader(reader.await));
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
            // The reader answers everything it holds, then ends.
            let why = format!("write: {e}");
            let _ = stop_tx.send(why.clone());
            let _ = reader.await;
            return Some(Ended::Error(why));
        }
    }
}

/// Chunks (up to a read's worth each, about 64 KiB) of a streamed reply
/// buffered between a server and its client.
const STREAM_CHUNKS: usize = 16;

/// How long a streamed reply waits for its client to take the next chunk
/// before it stops sending to it (the client's connection then closes).
/// Meanwhile the server connection waits too, so this bounds how long one
/// slow client can hold up the others sharing the connection.
pub const STREAM_PATIENCE: Duration = Duration::from_secs(5);

/// Why a stream ended early.
enum StreamError {
    /// No bytes from the server within the timeout.
    Timeout,
    /// The connection broke or the bytes were not a reply.
    Broken(String),
}

/// Reads replies and answers in-flight requests in order. Returns how the
/// connection ended, or `None` when the writer closed the channel.
async fn read_replies(
    mut r: BoxRead,
    mut inflight: mpsc::UnboundedReceiver<InFlight>,
    mut stop: oneshot::Receiver<String>,
    timeout: Option<Duration>,
    counters: Arc<PerWorker<ServerCounters>>,
    latency: Arc<PerWorker<Histogram>>,
) -> Option<Ended> {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut waiting: VecDeque<InFlight> = VecDeque::new();
    let c = counters.local();
    let fail_all =
        |waiting: &mut VecDeque<InFlight>, inflight: &mut mpsc::UnboundedReceiver<InFlight>, err: BackendError| {
            for f in waiting.drain(..) {
                f.answer(c, Err(err.clone()));
            }
            inflight.close();
            while let Ok(f) = inflight.try_recv() {
                f.answer(c, Err(err.clone()));
            }
        };
    loop {
        while let Ok(f) = inflight.try_recv() {
            waiting.push_back(f);
        }
        while let Some(front) = waiting.front() {
            let framing = front.framing;
            match framing.parse(&mut buf) {
                Frame::Done(reply) => {
                    if let Some(f) = waiting.pop_front() {
                        latency.local().observe(f.sent.elapsed());
                        c.responses.fetch_add(1, Relaxed);
                        c.response_bytes.fetch_add(reply.len() as u64, Relaxed);
                        f.answer(c, Ok(Reply::Whole(reply)));
                    }
                }
                Frame::Incomplete => {
                    let streamed = match framing.large() {
                        Large::Stream { after } if buf.len() >= after => true,
                        Large::Refuse { limit } if buf.len() >= limit => false,
                        _ => break,
                    };
                    // A large reply: passed on to the client as it arrives,
                    // or (too large to hold whole) read past.
                    let Some(scanner) = framing.scanner() else { break };
                    let Some(f) = waiting.pop_front() else { break };
                    latency.local().observe(f.sent.elapsed());
                    c.responses.fetch_add(1, Relaxed);
                    let tx = if streamed {
                        let (tx, rx) = mpsc::channel(STREAM_CHUNKS);
                        f.answer(c, Ok(Reply::Stream(ReplyStream(rx))));
                        Some(tx)
                    } else {
                        let limit = match framing.large() {
                            Large::Refuse { limit } => limit,
                            _ => 0,
                        };
                        f.answer(c, Err(BackendError::TooLarge(limit)));
                        None
                    };
                    match stream_reply(&mut r, &mut buf, scanner, tx, timeout, c).await {
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
                            return Some(Ended::TimedOut);
                        }
                        Err(StreamError::Broken(e)) => {
                            fail_all(&mut waiting, &mut inflight, BackendError::Closed(e.clone()));
                            return Some(Ended::Error(e));
                        }
                    }
                }
                Frame::Invalid(e) => {
                    fail_all(&mut waiting, &mut inflight, BackendError::Protocol(e.clone()));
                    return Some(Ended::Error(format!("bad reply: {e}")));
                }
            }
        }
        let deadline = waiting.front().and_then(|f| f.deadline);
        tokio::select! {
            f = inflight.recv(), if waiting.is_empty() => match f {
                Some(f) => waiting.push_back(f),
                None => return None,
            },
            n = r.read_buf(&mut buf) => match n {
                Ok(0) => {
                    fail_all(&mut waiting, &mut inflight, BackendError::Closed("server closed the connection".into()));
                    return Some(Ended::Eof);
                }
                Ok(_) => {}
                Err(e) => {
                    fail_all(&mut waiting, &mut inflight, BackendError::Closed(e.to_string()));
                    return Some(Ended::Error(e.to_string()));
                }
            },
            why = &mut stop => {
                let why = why.unwrap_or_else(|_| "connection closed".into());
                fail_all(&mut waiting, &mut inflight, BackendError::Closed(why.clone()));
                return Some(Ended::Error(why));
            }
            _ = sleep_until_opt(deadline) => {
                fail_all(&mut waiting, &mut inflight, BackendError::Timeout);
                return Some(Ended::TimedOut);
            }
        }
    }
}

/// Passes one reply from the front of `buf` and the connection on to `tx`
/// as it arrives, holding at most a read's worth plus the channel's chunks;
/// with no `tx` (or once the client is gone, or has not taken a chunk for
/// [`STREAM_PATIENCE`]) the rest is read and dropped, so the connection
/// stays in step. Each read waits at most the pool's timeout.
async fn stream_reply(
    r: &mut BoxRead,
    buf: &mut BytesMut,
    mut scanner: Box<dyn super::Scan>,
    mut tx: Option<mpsc::Sender<Chunk>>,
    timeout: Option<Duration>,
    c: &ServerCounters,
) -> Result<(), StreamError> {
    loop {
        let (used, last) = scanner.scan(buf).map_err(StreamError::Broken)?;
        if used > 0 {
            let data = buf.split_to(used).freeze();
            c.response_bytes.fetch_add(data.len() as u64, Relaxed);
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
