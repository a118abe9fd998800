//! The task behind one connection slot of a server: it owns the slot's
//! request queue for the life of the server, connects (at once with
//! `preconnect`, else on the first request), runs the set-up commands,
//! writes queued requests in batches and hands each request to a reader
//! task in write order. When the connection fails every request on it is
//! answered with an error; while the server is unreachable each request
//! makes a new attempt (one at a time) and gets its outcome, and the slot
//! also tries again on its own after a back-off.
//!
//! Every request is answered by its deadline (the pool's `timeout` from
//! when it was submitted), whatever the connection is doing: requests that
//! wait for a connection attempt are timed out by the slot, requests
//! written to the server by the reader (and a reply that times out closes
//! the connection, as twemproxy does), and requests queued behind a
//! streamed reply are answered when their time is up while the stream
//! goes on (their replies are read and dropped when they come).

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::queue::JobReceiver;
use tokio::time::Instant;

use super::framing::{Chunk, Frame, Framing, Large, Measured, Reply, ReplyStream, Scan, Setup};
use super::health::Health;
use super::moving::switched;
use super::open::{open, BoxRead, Opened};
use super::request::{Address, BackendError, BackendSettings, Job, ReplyTx};
use crate::stats::{Histogram, PerWorker, Sample, ServerCounters};

/// Requests a connection slot's queue holds before submitters wait.
pub(super) const QUEUE: usize = 4096;

/// While a server is unreachable, its connections try again this often
/// on their own (a request tries at once).
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// What a connection slot's task needs of its server.
pub(super) struct Slot {
    pub address: Address,
    /// The server's name, when its line gives one (TLS overrides may
    /// name it).
    pub name: Option<String>,
    pub settings: BackendSettings,
    /// The set-up of this slot's dialect.
    pub setup: Option<Setup>,
    /// Whether it connects at start.
    pub preconnect: bool,
    /// One connection only (pinned): once it ends, or cannot be made,
    /// every request fails and the task ends when its queue closes.
    pub once: bool,
    pub health: Arc<Health>,
    pub counters: Arc<PerWorker<ServerCounters>>,
    pub latency: Arc<PerWorker<Histogram>>,
}

/// A request leaves the queue without being written.
fn unqueue(c: &ServerCounters, job: &Job) {
    c.in_queue.fetch_sub(1, Relaxed);
    c.in_queue_bytes.fetch_sub(job.data.len() as u64, Relaxed);
}

/// Answers a queued request with an error.
pub(super) fn fail(c: &ServerCounters, job: Job, err: &BackendError) {
    unqueue(c, &job);
    job.reply.send(Err(err.clone()));
}

/// Whether `deadline` has passed by `now`.
fn due(deadline: Option<Instant>, now: Instant) -> bool {
    deadline.is_some_and(|d| d <= now)
}

/// Opens a connection while requests wait for it: they are received into
/// `waiting` (up to a queue's worth) and answered `Timeout` when their
/// deadline passes first.
async fn open_while_waiting(
    slot: &Slot,
    rx: &mut JobReceiver,
    waiting: &mut VecDeque<Job>,
) -> Option<Result<Opened, BackendError>> {
    // The connector as it is now (certificates reload without a restart).
    let tls = slot.settings.tls.as_ref().and_then(|t| t.connector_for(slot.health.id(), slot.name.as_deref()));
    let opening = open(&slot.address, slot.settings.timeout, slot.setup.as_ref(), tls.as_deref());
    tokio::pin!(opening);
    loop {
        let front = waiting.front().and_then(|j| j.deadline);
        tokio::select! {
            biased;
            opened = &mut opening => return Some(opened),
            job = rx.recv(), if waiting.len() < QUEUE => match job {
                Some(job) => waiting.push_back(job),
                None => return None,
            },
            _ = sleep_until_opt(front) => {
                let now = Instant::now();
                let c = slot.counters.local();
                while waiting.front().is_some_and(|j| due(j.deadline, now)) {
                    if let Some(job) = waiting.pop_front() {
                        fail(c, job, &BackendError::Timeout);
                    }
                }
            }
        }
    }
}

/// How a connection ended.
enum Ended {
    /// The server closed it.
    Eof,
    /// A reply timed out.
    TimedOut,
    /// The server's address moved (a Sentinel group's primary switched):
    /// not a failure of the server.
    Moved(String),
    /// Anything else.
    Error(String),
}

impl Ended {
    fn why(&self) -> String {
        match self {
            Ended::Eof => "server closed the connection".into(),
            Ended::TimedOut => "reply timed out".into(),
            Ended::Moved(e) | Ended::Error(e) => e.clone(),
        }
    }

    fn count(&self, c: &ServerCounters) {
        let counter = match self {
            Ended::Eof => &c.server_eof,
            Ended::TimedOut => &c.server_timedout,
            Ended::Moved(_) | Ended::Error(_) => &c.server_err,
        };
        counter.fetch_add(1, Relaxed);
    }
}

/// Runs a connection slot until its server is dropped (its queue closes).
pub(super) async fn run_slot(slot: Slot, mut rx: JobReceiver) {
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut eager = slot.preconnect;
    loop {
        if !eager && waiting.is_empty() {
            match rx.recv().await {
                Some(job) => waiting.push_back(job),
                None => return,
            }
        }
        eager = false;
        let Some(opened) = open_while_waiting(&slot, &mut rx, &mut waiting).await else { return };
        let c = slot.counters.local();
        match opened {
            Ok(opened) => {
                c.server_connections.fetch_add(1, Relaxed);
                c.connections_made.fetch_add(1, Relaxed);
                slot.health.connected();
                let ended = run_connection(opened, std::mem::take(&mut waiting), &mut rx, &slot).await;
                let c = slot.counters.local();
                c.server_connections.fetch_sub(1, Relaxed);
                let Some(ended) = ended else { return }; // the server was dropped: queue closed
                ended.count(c);
                tracing::debug!(address = %slot.address, "server connection closed: {}", ended.why());
                if !matches!(ended, Ended::Moved(_)) {
                    slot.health.failed(&ended.why());
                }
                if slot.once {
                    return refuse_all(&slot, rx, BackendError::Closed(ended.why())).await;
                }
            }
            Err(err) => {
                c.server_err.fetch_add(1, Relaxed);
                if let BackendError::Retry(why) = &err {
                    // Between primaries: not the server failing.
                    tracing::info!(server = %slot.health.id(), "{why}");
                } else {
                    if slot.health.unreachable() {
                        tracing::warn!(server = %slot.health.id(), "server unreachable: {err}");
                    } else {
                        tracing::debug!(server = %slot.health.id(), "server still unreachable: {err}");
                    }
                    slot.health.failed(&err.to_string());
                }
                // The requests that waited for the attempt, and those that
                // queued meanwhile, get its outcome.
                for job in waiting.drain(..) {
                    fail(c, job, &err);
                }
                if slot.once {
                    return refuse_all(&slot, rx, err).await;
                }
                while let Ok(job) = rx.try_recv() {
                    fail(c, job, &err);
                }
                // The next request tries again at once (one attempt at a
                // time: this task's); without requests, try again after the
                // back-off, or when the pool gives the server another chance.
                tokio::select! {
                    job = rx.recv() => match job {
                        Some(job) => waiting.push_back(job),
                        None => return,
                    },
                    _ = tokio::time::sleep(RETRY_BACKOFF) => eager = true,
                    _ = slot.health.retried() => eager = true,
                }
            }
        }
    }
}

/// A pinned slot whose connection is gone: every request gets `err` until
/// the queue closes.
async fn refuse_all(slot: &Slot, mut rx: JobReceiver, err: BackendError) {
    rx.close();
    while let Some(job) = rx.recv().await {
        fail(slot.counters.local(), job, &err);
    }
}

/// A request written and waiting for its reply.
struct InFlight {
    framing: &'static dyn Framing,
    /// Replies still to come for it (more than one for a transaction), and
    /// those that came.
    frames_left: usize,
    got: Option<Box<BytesMut>>,
    /// `None` once answered early (timed out behind a stream): its reply is
    /// still read, and dropped.
    reply: Option<ReplyTx>,
    deadline: Option<Instant>,
    /// When it was written: the server's part of its latency starts here.
    sent: Instant,
    /// Its size, for the out-queue gauge.
    bytes: u64,
}

impl InFlight {
    /// Its reply (or error) arrived: off the out-queue gauge, and answered
    /// unless it was already.
    fn settle(mut self, c: &ServerCounters, result: Result<Reply, BackendError>) {
        self.leave_out_queue(c);
        self.answer(result);
    }

    /// Answers it with its server's reply, which `health` hears of if the
    /// reply is written through to its client ([`super::ReplyTx::send_reply`]);
    /// heard and off the out-queue in `tally`.
    fn settle_reply(mut self, tally: &mut Tally<'_>, reply: Reply, health: &Health) {
        tally.heard(self.sent, reply.whole_len(), self.bytes);
        if let Some(tx) = self.reply.take() {
            tx.send_reply(reply, health);
        }
    }

    /// Answers it with its server's reply, the first `len` bytes of
    /// `buf` (taken from it; written to the client from `buf` if it can
    /// be: [`super::ReplyTx::send_front`]); heard and off the out-queue in
    /// `tally`.
    fn settle_front(mut self, tally: &mut Tally<'_>, buf: &mut BytesMut, len: usize, health: &Health) {
        tally.heard(self.sent, len, self.bytes);
        match self.reply.take() {
            Some(tx) => tx.send_front(buf, len, health),
            None => buf.advance(len),
        }
    }

    /// Off the out-queue gauges.
    fn leave_out_queue(&self, c: &ServerCounters) {
        c.out_queue.fetch_sub(1, Relaxed);
        c.out_queue_bytes.fetch_sub(self.bytes, Relaxed);
    }

    /// Answers it now (if not yet); it stays in line for its reply.
    fn answer(&mut self, result: Result<Reply, BackendError>) {
        let Some(tx) = self.reply.take() else { return };
        tx.send(result);
    }
}

/// What one read's replies did to a server's counters and latency
/// histogram, counted once when they have all been taken ([`Tally::count`]):
/// those are shared with the stats, and an atomic add per reply for each
/// cost more than the rest of the reply's counting. Replies read together
/// mostly answer requests written together (one batch, one `sent`), so
/// the clock is read and the latency placed once for them.
struct Tally<'a> {
    c: &'a ServerCounters,
    latency: &'a Histogram,
    /// When the replies were read (read once, when first needed).
    now: Option<Instant>,
    /// The latency of the requests last heard that were written at one
    /// time, and how many of them are not yet recorded.
    last: Option<(Instant, Sample, u64)>,
    responses: u64,
    response_bytes: u64,
    /// Requests off the out-queue, and their bytes.
    left: u64,
    left_bytes: u64,
}

impl<'a> Tally<'a> {
    fn new(c: &'a ServerCounters, latency: &'a Histogram) -> Tally<'a> {
        Tally { c, latency, now: None, last: None, responses: 0, response_bytes: 0, left: 0, left_bytes: 0 }
    }

    /// A reply of `len` bytes was read for a request of `bytes` written
    /// at `sent`.
    #[inline(always)]
    fn heard(&mut self, sent: Instant, len: usize, bytes: u64) {
        self.responses += 1;
        self.response_bytes += len as u64;
        self.left += 1;
        self.left_bytes += bytes;
        match &mut self.last {
            Some((at, _, n)) if *at == sent => *n += 1,
            _ => {
                self.record_latency();
                let now = *self.now.get_or_insert_with(Instant::now);
                self.last = Some((sent, Sample::of(now.saturating_duration_since(sent)), 1));
            }
        }
    }

    fn record_latency(&mut self) {
        if let Some((_, sample, n)) = self.last.take() {
            self.latency.record_n(sample, n);
        }
    }

    /// Counts what was heard since last counted; replies read after this
    /// are timed anew (what came in between took time: a stream).
    fn count(&mut self) {
        self.record_latency();
        self.now = None;
        if self.responses > 0 {
            self.c.responses.fetch_add(self.responses, Relaxed);
            self.c.response_bytes.fetch_add(self.response_bytes, Relaxed);
            self.responses = 0;
            self.response_bytes = 0;
        }
        if self.left > 0 {
            self.c.out_queue.fetch_sub(self.left, Relaxed);
            self.c.out_queue_bytes.fetch_sub(self.left_bytes, Relaxed);
            self.left = 0;
            self.left_bytes = 0;
        }
    }
}

/// Runs one connection until it fails (`Some`) or the queue closes (`None`);
/// `first` are requests that waited for it.
async fn run_connection(opened: Opened, mut first: VecDeque<Job>, rx: &mut JobReceiver, slot: &Slot) -> Option<Ended> {
    let Opened { read: r, write: mut w, primary } = opened;
    // A moving server's connection ends when its primary switches.
    let mut target = match &slot.address {
        super::request::Address::Moving(m) => Some(m.target.clone()),
        _ => None,
    };
    let primary = primary.unwrap_or_default();
    let timeout = slot.settings.timeout;
    let (inflight_tx, inflight_rx) = super::queue::channel::<InFlight>(usize::MAX);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<String>();
    let mut reader = tokio::spawn(read_replies(
        r,
        inflight_rx,
        stop_rx,
        timeout,
        slot.health.clone(),
        slot.counters.clone(),
        slot.latency.clone(),
    ));
    let mut batch = BytesMut::with_capacity(16 * 1024);
    let ended_by_reader = |done: Result<Option<Ended>, tokio::task::JoinError>| match done {
        Ok(Some(ended)) => ended,
        Ok(None) => Ended::Error("reader finished".into()),
        Err(e) => Ended::Error(format!("reader task: {e}")),
    };
    // The batch's requests; the vector is kept from batch to batch.
    let mut jobs: Vec<Job> = Vec::with_capacity(64);
    let mut written: VecDeque<InFlight> = VecDeque::with_capacity(64);
    loop {
        jobs.extend(first.drain(..));
        if jobs.is_empty() {
            let job = tokio::select! {
                biased;
                () = switched(target.as_mut(), &primary), if target.is_some() => {
                    // Requests written to the old primary are answered
                    // with an error now, not with what it says: a write it
                    // takes after its group started failing over may be
                    // lost when it rejoins as a replica.
                    let why = format!(
                        "{primary} is no longer the primary of group {} (failing over); the request may or may not have been applied",
                        slot.health.id()
                    );
                    let _ = stop_tx.send(why.clone());
                    let _ = reader.await;
                    let _ = w.shutdown().await;
                    return Some(Ended::Moved(why));
                }
                job = rx.recv() => job,
                done = &mut reader => return Some(ended_by_reader(done)),
            };
            let Some(job) = job else {
                // Queue closed: let outstanding replies arrive, then stop.
                drop(inflight_tx);
                let _ = w.shutdown().await;
                let _ = reader.await;
                return None;
            };
            jobs.push(job);
            // Let the other ready tasks (client connections) run first, as
            // an event loop would: requests they queue for this server
            // meanwhile go out in the same write, which saves a system call
            // per request under load and costs nothing when idle.
            tokio::task::yield_now().await;
        }
        // Coalesce what is already queued into one write.
        let mut bytes: usize = jobs.iter().map(|j| j.data.len()).sum();
        if bytes < 64 * 1024 {
            bytes += rx.take_up_to(&mut jobs, 64 * 1024 - bytes, |j| j.data.len());
        }
        batch.clear();
        let c = slot.counters.local();
        let sent = Instant::now();
        let (count, bytes) = (jobs.len() as u64, bytes as u64);
        // Whether a request has a deadline of its own although the pool
        // has no timeout (a blocking command's): the reader times it.
        let mut urgent = false;
        for job in jobs.drain(..) {
            batch.extend_from_slice(&job.data);
            let Job { framing, frames, reply, deadline, data } = job;
            urgent |= deadline.is_some();
            let bytes = data.len() as u64;
            written.push_back(InFlight {
                framing,
                frames_left: frames,
                got: None,
                reply: Some(reply),
                deadline,
                sent,
                bytes,
            });
        }
        // Off the in-queue gauges, onto the out-queue ones, once a batch.
        c.in_queue.fetch_sub(count, Relaxed);
        c.in_queue_bytes.fetch_sub(bytes, Relaxed);
        c.out_queue.fetch_add(count, Relaxed);
        c.out_queue_bytes.fetch_add(bytes, Relaxed);
        // Handed to the reader under one lock.
        if inflight_tx.push_all(&mut written, urgent && timeout.is_none()).is_err() {
            // The reader has ended: the batch gets the connection's loss.
            let lost = BackendError::Closed("connection lost".into());
            for f in written.drain(..) {
                f.settle(c, Err(lost.clone()));
            }
            return Some(ended_by_reader(reader.await));
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
const STREAM_PATIENCE: Duration = Duration::from_secs(5);

/// Why a stream ended early.
enum StreamError {
    /// No bytes from the server within the timeout.
    Timeout,
    /// The connection broke or the bytes were not a reply.
    Broken(String),
}

/// The requests a connection's reader holds, in write order.
struct Line {
    waiting: VecDeque<InFlight>,
    inflight: super::queue::Receiver<InFlight>,
}

impl Line {
    /// Takes in what the writer has sent since.
    fn take_new(&mut self) {
        self.inflight.take_all(&mut self.waiting);
    }

    /// Answers every request with `err`, those not yet taken in too.
    fn fail_all(&mut self, c: &ServerCounters, err: &BackendError) {
        for f in self.waiting.drain(..) {
            f.settle(c, Err(err.clone()));
        }
        self.inflight.close();
        while let Ok(f) = self.inflight.try_recv() {
            f.settle(c, Err(err.clone()));
        }
    }

    /// The earliest deadline of a request not yet answered.
    fn next_deadline(&self) -> Option<Instant> {
        self.waiting.iter().filter(|f| f.reply.is_some()).find_map(|f| f.deadline)
    }

    /// Answers `Timeout` to the requests whose deadline has passed; they
    /// keep their place for their replies.
    fn time_out_due(&mut self) {
        let now = Instant::now();
        for f in self.waiting.iter_mut().filter(|f| due(f.deadline, now)) {
            f.answer(Err(BackendError::Timeout));
        }
    }
}

/// Reads replies and answers in-flight requests in order. Returns how the
/// connection ended, or `None` when the writer closed the channel.
async fn read_replies(
    mut r: BoxRead,
    inflight: super::queue::Receiver<InFlight>,
    mut stop: tokio::sync::oneshot::Receiver<String>,
    timeout: Option<Duration>,
    health: Arc<Health>,
    counters: Arc<PerWorker<ServerCounters>>,
    latency: Arc<PerWorker<Histogram>>,
) -> Option<Ended> {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut line = Line { waiting: VecDeque::new(), inflight };
    let c = counters.local();
    let mut tally = Tally::new(c, latency.local());
    loop {
        // Read once per pass: every reply of one read arrived together.
        loop {
            // Only the front is needed: what the writer sent since is
            // taken in when the line runs out (its queue swapped in whole,
            // nothing copied).
            if line.waiting.is_empty() {
                line.take_new();
            }
            let Some(front) = line.waiting.front() else { break };
            let framing = front.framing;
            let frame = match framing.measure(&buf) {
                // A reply of one frame, whole: passed on from the read
                // buffer (written to its client from there if it can be).
                Measured::Len(len) if front.frames_left == 1 && front.got.is_none() => {
                    if let Some(f) = line.waiting.pop_front() {
                        f.settle_front(&mut tally, &mut buf, len, &health);
                    }
                    continue;
                }
                Measured::Len(len) => Frame::Done(buf.split_to(len).freeze()),
                Measured::Incomplete => Frame::Incomplete,
                Measured::Invalid(e) => Frame::Invalid(e),
                Measured::Unknown => framing.parse(&mut buf),
            };
            match frame {
                Frame::Done(reply) if front.frames_left > 1 => {
                    // One of several replies to one request: kept until the last.
                    if let Some(f) = line.waiting.front_mut() {
                        f.frames_left -= 1;
                        f.got.get_or_insert_with(Box::default).extend_from_slice(&reply);
                    }
                }
                Frame::Done(reply) => {
                    if let Some(mut f) = line.waiting.pop_front() {
                        let reply = match f.got.take() {
                            Some(mut got) => {
                                got.extend_from_slice(&reply);
                                got.split().freeze()
                            }
                            None => reply,
                        };
                        f.settle_reply(&mut tally, Reply::Whole(reply), &health);
                    }
                }
                Frame::Incomplete => {
                    // A reply of several frames is never streamed (it is
                    // taken apart by the proxy); too large, all its frames
                    // are read past.
                    let several = front.frames_left > 1 || front.got.is_some();
                    let streamed = match framing.large() {
                        Large::Stream { after } if buf.len() >= after && !several => true,
                        Large::Stream { after } if buf.len() >= after => false,
                        Large::Refuse { limit } if buf.len() >= limit => false,
                        _ => break,
                    };
                    let frames = front.frames_left;
                    // A large reply: passed on to the client as it arrives,
                    // or (too large to hold whole) read past.
                    let Some(scanner) = framing.scanner() else { break };
                    let Some(f) = line.waiting.pop_front() else { break };
                    tally.count();
                    latency.local().observe(f.sent.elapsed());
                    c.responses.fetch_add(1, Relaxed);
                    let tx = if streamed {
                        let (tx, rx) = mpsc::channel(STREAM_CHUNKS);
                        f.settle(c, Ok(Reply::Stream(ReplyStream(rx))));
                        Some(tx)
                    } else {
                        let limit = match framing.large() {
                            Large::Refuse { limit } | Large::Stream { after: limit } => limit,
                            Large::Hold => 0,
                        };
                        f.settle(c, Err(BackendError::TooLarge(limit)));
                        None
                    };
                    let mut outcome = stream_reply(&mut r, &mut buf, scanner, tx, timeout, c, &mut line).await;
                    for _ in 1..frames {
                        if outcome.is_err() {
                            break;
                        }
                        let Some(scanner) = framing.scanner() else { break };
                        outcome = stream_reply(&mut r, &mut buf, scanner, None, timeout, c, &mut line).await;
                    }
                    match outcome {
                        Ok(()) => {
                            // Requests queued behind it waited for the stream,
                            // not for their server: for the connection's
                            // health their time starts now.
                            line.take_new();
                            if let Some(t) = timeout {
                                let from = Instant::now() + t;
                                for f in &mut line.waiting {
                                    f.deadline = f.deadline.map(|d| d.max(from));
                                }
                            }
                        }
                        Err(StreamError::Timeout) => {
                            line.fail_all(c, &BackendError::Timeout);
                            return Some(Ended::TimedOut);
                        }
                        Err(StreamError::Broken(e)) => {
                            line.fail_all(c, &BackendError::Closed(e.clone()));
                            return Some(Ended::Error(e));
                        }
                    }
                }
                Frame::Invalid(e) => {
                    tally.count();
                    line.fail_all(c, &BackendError::Protocol(e.clone()));
                    return Some(Ended::Error(format!("bad reply: {e}")));
                }
            }
        }
        tally.count();
        let deadline = line.waiting.front().and_then(|f| f.deadline);
        tokio::select! {
            biased;
            // First: once told to stop, no reply read after is passed on.
            why = &mut stop => {
                let why = why.unwrap_or_else(|_| "connection closed".into());
                line.fail_all(c, &BackendError::Closed(why.clone()));
                return Some(Ended::Error(why));
            }
            // With a timeout, the line's front is timed from when it is
            // written: the reader is woken for it. Without, it is woken
            // only by the replies (a poll saved per batch written), by the
            // writer's end, or by a batch with a deadline of its own (a
            // blocking command's: sent urgent, taken in as with a timeout).
            f = line.inflight.recv_or_end(timeout.is_some()), if line.waiting.is_empty() => match f {
                Some(f) => line.waiting.push_back(f),
                None => {
                    line.take_new();
                    if line.waiting.is_empty() {
                        return None;
                    }
                }
            },
            n = r.read_buf(&mut buf) => match n {
                Ok(0) => {
                    line.fail_all(c, &BackendError::Closed("server closed the connection".into()));
                    return Some(Ended::Eof);
                }
                Ok(_) => {}
                Err(e) => {
                    line.fail_all(c, &BackendError::Closed(e.to_string()));
                    return Some(Ended::Error(e.to_string()));
                }
            },
            _ = sleep_until_opt(deadline) => {
                line.fail_all(c, &BackendError::Timeout);
                return Some(Ended::TimedOut);
            }
        }
    }
}

/// Passes one reply from the front of `buf` and the connection on to `tx`
/// as it arrives, holding at most a read's worth plus the channel's chunks;
/// with no `tx` (or once the client is gone, or has not taken a chunk for
/// [`STREAM_PATIENCE`]) the rest is read and dropped, so the connection
/// stays in step. Each read waits at most the pool's timeout. Meanwhile the
/// requests behind it are answered `Timeout` when their time is up.
async fn stream_reply(
    r: &mut BoxRead,
    buf: &mut BytesMut,
    mut scanner: Box<dyn Scan>,
    mut tx: Option<mpsc::Sender<Chunk>>,
    timeout: Option<Duration>,
    c: &ServerCounters,
    line: &mut Line,
) -> Result<(), StreamError> {
    loop {
        let (used, last) = scanner.scan(buf).map_err(StreamError::Broken)?;
        if used > 0 {
            let data = buf.split_to(used).freeze();
            c.response_bytes.fetch_add(data.len() as u64, Relaxed);
            if let Some(t) = tx.take() {
                let patience = Instant::now() + STREAM_PATIENCE;
                let mut chunk = Some(Chunk { data, last });
                let mut keep = false;
                loop {
                    line.take_new();
                    let deadline = line.next_deadline();
                    tokio::select! {
                        biased;
                        sent = t.reserve() => {
                            // An error: the client is gone.
                            if let Ok(permit) = sent {
                                permit.send(chunk.take().expect("one chunk"));
                                keep = true;
                            }
                            break;
                        }
                        // Stuck: it gets a cut-short reply and its connection
                        // closes.
                        _ = tokio::time::sleep_until(patience) => break,
                        _ = sleep_until_opt(deadline) => line.time_out_due(),
                        Some(f) = line.inflight.recv() => line.waiting.push_back(f),
                    }
                }
                if keep {
                    tx = Some(t);
                }
            }
        }
        if last {
            return Ok(());
        }
        buf.reserve(64 * 1024);
        let read_limit = timeout.map(|t| Instant::now() + t);
        let n = loop {
            line.take_new();
            let deadline = line.next_deadline();
            tokio::select! {
                biased;
                n = r.read_buf(buf) => break n,
                _ = sleep_until_opt(read_limit) => return Err(StreamError::Timeout),
                _ = sleep_until_opt(deadline) => line.time_out_due(),
                Some(f) = line.inflight.recv() => line.waiting.push_back(f),
            }
        };
        match n {
            Ok(0) => return Err(StreamError::Broken("server closed the connection".into())),
            Ok(_) => {}
            Err(e) => return Err(StreamError::Broken(e.to_string())),
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read's replies are counted once, when counted, exactly as one
    /// count each would: responses and their bytes, the out-queue, and
    /// each request's latency in its bucket (requests written together
    /// share one, those written apart get their own).
    #[tokio::test(start_paused = true)]
    async fn a_tally_counts_what_each_reply_would_have() {
        let c = ServerCounters::default();
        let latency = Histogram::default();
        c.out_queue.store(5, Relaxed);
        c.out_queue_bytes.store(500, Relaxed);
        let early = Instant::now();
        tokio::time::advance(Duration::from_millis(3)).await;
        let late = Instant::now();
        tokio::time::advance(Duration::from_micros(200)).await;
        let mut tally = Tally::new(&c, &latency);
        tally.heard(early, 10, 100);
        tally.heard(early, 20, 100);
        tally.heard(late, 30, 100);
        tally.heard(early, 40, 100);
        // The counters show nothing before the count (latencies show as
        // each run of one batch's replies ends).
        assert_eq!(c.responses.load(Relaxed), 0);
        assert_eq!(c.out_queue.load(Relaxed), 5);
        tally.count();
        assert_eq!(c.responses.load(Relaxed), 4);
        assert_eq!(c.response_bytes.load(Relaxed), 100);
        assert_eq!(c.out_queue.load(Relaxed), 1);
        assert_eq!(c.out_queue_bytes.load(Relaxed), 100);
        let v = latency.values();
        assert_eq!(v.count, 4);
        assert_eq!(v.sum_us, 3 * 3200 + 200);
        assert_eq!(v.max_us, 3200);
        let bucket = |us: u64| crate::stats::LATENCY_BUCKETS_US.iter().position(|&b| us <= b).unwrap();
        assert_eq!(v.buckets[bucket(3200)], 3);
        assert_eq!(v.buckets[bucket(200)], 1);
        // Counted again with nothing new: nothing changes; what comes
        // after is timed anew.
        tally.count();
        assert_eq!(c.responses.load(Relaxed), 4);
        tokio::time::advance(Duration::from_millis(1)).await;
        tally.heard(late, 1, 100);
        tally.count();
        let v = latency.values();
        assert_eq!((v.count, v.sum_us), (5, 3 * 3200 + 200 + 1200));
        assert_eq!(c.out_queue.load(Relaxed), 0);
    }
}
