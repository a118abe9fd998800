//! Client connections, whatever the protocol: a read loop that hands the
//! bytes to the protocol's [`Session`] and queues each request's reply, in
//! request order, to a writer that awaits them one by one (a reply can only
//! ever go to the connection whose request produced it). A server's reply
//! that the writer waits on alone may be written to the client by the
//! server connection it came on instead (see [`alone`]). Here too: the idle
//! timeout, the grace period at shutdown, back-pressure on clients that do
//! not read their replies, and the open-connection count.
//!
//! Back-pressure: a connection has at most a window of requests whose
//! replies it has not been written yet, sized so that the window's replies
//! (at the connection's average reply size) fit its reply budget
//! ([`crate::ProxyOptions::client_buffer`]); it also stops reading while
//! that many reply bytes wait for it. A client that holds many times its
//! budget in unread replies anyway (requests for small values, then large
//! ones) is disconnected.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::AcqRel, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch, Notify};

use crate::backend::{Delivered, Reply, ReplyAccount, ReplyStream, Requester};
use crate::stats::{PerWorker, PoolCounters};

/// A reply in the making: `None` means nothing is written (noreply).
///
/// The common cases are held as they are, with nothing allocated: a reply
/// known now, and a server's reply passed on as it comes
/// ([`PendingReply::server`]); anything else is a boxed future.
pub(crate) enum PendingReply {
    /// Known now (taken by the first poll).
    Now(Option<Out>),
    /// A server's reply, passed on whole or streamed.
    Server(Forwarded),
    /// Anything else.
    Later(Pin<Box<dyn Future<Output = Option<Out>> + Send>>),
}

/// A request sent to a server whose reply goes to the client unchanged.
pub(crate) struct Forwarded {
    server: Arc<crate::backend::Server>,
    pending: crate::backend::Pending,
    pool: Arc<crate::pool::Pool>,
    /// What the client gets when there is no reply (the protocol's error,
    /// naming the server).
    error: fn(&crate::pool::Pool, &str, &crate::backend::BackendError) -> Bytes,
}

impl PendingReply {
    /// `pending`'s reply from `server`, or `error`'s framing of why there
    /// is none; streamed replies are counted on `pool`.
    pub(crate) fn server(
        server: Arc<crate::backend::Server>,
        pending: crate::backend::Pending,
        pool: Arc<crate::pool::Pool>,
        error: fn(&crate::pool::Pool, &str, &crate::backend::BackendError) -> Bytes,
    ) -> PendingReply {
        PendingReply::Server(Forwarded { server, pending, pool, error })
    }
}

impl PendingReply {
    /// The reply, once it is ready; `offer`: the client's writer waits on
    /// this reply alone (everything before it written, nothing queued
    /// behind it), so a server's reply may be written to the client by its
    /// server connection ([`Out::Sent`]).
    fn poll_offering(&mut self, cx: &mut Context<'_>, offer: bool) -> Poll<Option<Out>> {
        match self {
            PendingReply::Now(out) => Poll::Ready(out.take()),
            PendingReply::Later(f) => f.as_mut().poll(cx),
            PendingReply::Server(f) => {
                let result = std::task::ready!(f.server.poll_forward(&mut f.pending, cx, offer));
                Poll::Ready(Some(match result {
                    Ok(Delivered::Reply(Reply::Whole(frame))) => Out::Bytes(frame),
                    Ok(Delivered::Reply(Reply::Stream(stream))) => {
                        f.pool.counters().streamed_replies.fetch_add(1, Relaxed);
                        Out::Stream(stream)
                    }
                    Ok(Delivered::Sent(n)) => Out::Sent(n),
                    Err(e) => Out::Bytes((f.error)(&f.pool, f.server.id(), &e)),
                }))
            }
        }
    }
}

impl Future for PendingReply {
    type Output = Option<Out>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Out>> {
        self.get_mut().poll_offering(cx, false)
    }
}

/// A reply made by `f`.
pub(crate) fn later(f: impl Future<Output = Option<Out>> + Send + 'static) -> PendingReply {
    PendingReply::Later(Box::pin(f))
}

/// A reply ready to be written.
pub(crate) enum Out {
    /// All of it.
    Bytes(Bytes),
    /// A large reply arriving from its server a chunk at a time.
    Stream(ReplyStream),
    /// Already written to the client, this many bytes, by the server
    /// connection the reply came on (its slot was offered: see
    /// [`PendingReply::poll_offering`]).
    Sent(usize),
}

/// A reply whose bytes come whole.
pub(crate) fn bytes_reply(f: impl Future<Output = Option<Bytes>> + Send + 'static) -> PendingReply {
    later(async move { f.await.map(Out::Bytes) })
}

/// A reply known now.
pub(crate) fn ready(bytes: &'static [u8]) -> PendingReply {
    ready_owned(Bytes::from_static(bytes))
}

/// A reply known now.
pub(crate) fn ready_owned(bytes: Bytes) -> PendingReply {
    PendingReply::Now(Some(Out::Bytes(bytes)))
}

/// No reply at all.
pub(crate) fn nothing() -> PendingReply {
    PendingReply::Now(None)
}

/// What a session made of the bytes at the front of the buffer.
pub(crate) enum Step {
    /// A request was taken; this is its reply.
    Reply(PendingReply),
    /// A request was taken; its reply goes another way (a subscribed
    /// client's: on the stream of its subscription).
    Taken,
    /// More bytes are needed.
    More,
    /// The connection ends after this reply (if any); `error`: because the
    /// client sent something that cannot be parsed.
    Close {
        /// The last reply.
        reply: Option<PendingReply>,
        /// Whether the client caused it by an error.
        error: bool,
    },
}

/// A protocol's side of a client connection: requests from bytes, each
/// dispatched to its servers at once.
pub(crate) trait Session: Send {
    /// What [`Session::next_now`] leaves to [`Session::next_later`].
    type Later: Send;

    /// Takes the next request from the front of `buf` and sends it on its
    /// way when that needs no waiting (the common requests): the step;
    /// else what is left to do, for [`Session::next_later`]. No future is
    /// made for the common requests. Never called with `buf` empty: the
    /// connection reads more bytes then (a session says `Step::More` of an
    /// empty buffer, whatever it was in the middle of).
    fn next_now(&mut self, buf: &mut BytesMut) -> Result<Step, Self::Later>;

    /// Finishes what [`Session::next_now`] left (waiting only when a
    /// server's queue is full, or on what the request needs first).
    fn next_later(&mut self, later: Self::Later, buf: &mut BytesMut) -> impl Future<Output = Step> + Send;
}

/// Requests a client may have outstanding before the proxy stops reading.
pub(crate) const MAX_PIPELINE: usize = 1024;

/// The fewest requests a client may have outstanding, whatever its replies
/// weigh.
const MIN_WINDOW: usize = 2;

/// A new connection's window, before its replies have been weighed.
const FIRST_WINDOW: usize = 8;

/// A client holding this many times its budget in unread replies is
/// disconnected.
pub(crate) const OVERFLOW_FACTOR: usize = 16;

/// How long a connection keeps reading once shutdown begins: requests its
/// client sent just before are still taken (and answered); then it stops
/// reading and answers what is in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(100);

static NEXT_CLIENT: AtomicUsize = AtomicUsize::new(0);

/// How a client connection ended, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Close {
    /// The client closed it or quit.
    Eof,
    /// A read error or a request that cannot be parsed.
    Error,
    /// It held too many unread replies.
    Overflow,
    /// The proxy closed it (idle timeout, shutdown).
    Proxy,
}

/// Counts a client connection as open for as long as it lives (a task
/// cancelled mid-request still gives it back), and how it closed.
pub(crate) struct ConnGuard {
    counters: Arc<PerWorker<PoolCounters>>,
    close: Option<Close>,
    /// Held while the connection is open, so a shutdown can wait for the
    /// last one (the receiver sees the channel close).
    _open: Option<mpsc::Sender<()>>,
}

impl ConnGuard {
    /// Counts a new connection of the pool with these counters.
    pub(crate) fn open(counters: Arc<PerWorker<PoolCounters>>) -> ConnGuard {
        let c = counters.local();
        c.curr_connections.fetch_add(1, Relaxed);
        c.total_connections.fetch_add(1, Relaxed);
        ConnGuard { counters, close: None, _open: None }
    }

    /// The connection also holds `open` (a clone of the proxy's), dropped
    /// when it closes.
    pub(crate) fn held_open(mut self, open: mpsc::Sender<()>) -> ConnGuard {
        self._open = Some(open);
        self
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let c = self.counters.local();
        c.curr_connections.fetch_sub(1, Relaxed);
        match self.close {
            Some(Close::Eof) => c.client_eof.fetch_add(1, Relaxed),
            Some(Close::Error) => c.client_err.fetch_add(1, Relaxed),
            Some(Close::Overflow) => c.client_overflows.fetch_add(1, Relaxed),
            Some(Close::Proxy) | None => 0,
        };
    }
}

/// Settings of one client connection.
pub(crate) struct ConnSettings {
    /// Close it when idle this long.
    pub idle: Option<Duration>,
    /// Its budget of unread reply bytes.
    pub budget: usize,
}

/// A new client connection's requester: its number and reply account.
pub(crate) fn requester(budget: usize) -> Requester {
    Requester {
        affinity: NEXT_CLIENT.fetch_add(1, Relaxed),
        account: ReplyAccount::new(budget.saturating_mul(OVERFLOW_FACTOR)),
        dialect: 0,
    }
}

/// The flow of one connection's requests: how many await their reply's
/// writing, and the window that bounds them.
struct Flow {
    /// Changed by the connection's reader and writer only, which run in
    /// one task (never at once): a load and a store, no atomic
    /// read-modify-write.
    outstanding: AtomicUsize,
    /// The writer has ended (the client is gone): no reply will leave the
    /// window any more, so the reader must not wait for room.
    closed: AtomicBool,
    /// A moving average of the reply size.
    avg: AtomicUsize,
    /// The window the average makes ([`Flow::window_for`]), made again
    /// only when the average changes (a division, not one per request).
    window: AtomicUsize,
    budget: usize,
    room: Notify,
    /// The reader waits for room (or is about to): only then does a reply
    /// written notify it.
    waiting: AtomicBool,
}

impl Flow {
    fn new(budget: usize) -> Flow {
        let budget = budget.max(1);
        Flow {
            outstanding: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            avg: AtomicUsize::new(budget / FIRST_WINDOW),
            window: AtomicUsize::new(Flow::window_for(budget, budget / FIRST_WINDOW)),
            budget,
            room: Notify::new(),
            waiting: AtomicBool::new(false),
        }
    }

    /// The requests a connection may have outstanding whose replies
    /// average `avg` bytes.
    fn window_for(budget: usize, avg: usize) -> usize {
        (budget / avg.max(1)).clamp(MIN_WINDOW, MAX_PIPELINE)
    }

    fn window(&self) -> usize {
        self.window.load(Relaxed)
    }

    fn has_room(&self, account: &ReplyAccount) -> bool {
        self.outstanding.load(Relaxed) < self.window() && account.held() < self.budget
    }

    /// Whether another request may be taken now (else
    /// [`Flow::wait_room`] waits, or says the client is to be closed).
    fn room_now(&self, account: &ReplyAccount) -> bool {
        self.has_room(account) && !account.is_overflowed() && !self.closed.load(Relaxed)
    }

    /// Waits until another request may be taken (there was no room when
    /// [`Flow::room_now`] looked); false if the client overflowed or its
    /// replies can no longer be written meanwhile.
    async fn wait_room(&self, account: &ReplyAccount) -> bool {
        // Said before room is looked at again: a reply written after that
        // look notifies (the writer runs in this task, between its polls).
        self.waiting.store(true, Relaxed);
        let room = loop {
            if account.is_overflowed() || self.closed.load(Relaxed) {
                break false;
            }
            let notified = self.room.notified();
            if self.closed.load(Relaxed) {
                break false;
            }
            if self.has_room(account) {
                break true;
            }
            tokio::select! {
                _ = notified => {}
                _ = account.overflowed() => break false,
            }
        };
        self.waiting.store(false, Relaxed);
        room
    }

    /// A request was taken: its reply is in the window.
    fn taken(&self) {
        self.outstanding.store(self.outstanding.load(Relaxed) + 1, Relaxed);
    }

    /// A reply of `bytes` (None: nothing) is out of the window.
    fn done(&self, bytes: Option<usize>) {
        if let Some(b) = bytes {
            let avg = self.avg.load(Relaxed);
            // avg += (b - avg) / 8
            let next = if b >= avg { avg + (b - avg) / 8 } else { avg - (avg - b) / 8 };
            if next != avg {
                self.avg.store(next, Relaxed);
                self.window.store(Flow::window_for(self.budget, next), Relaxed);
            }
        }
        self.outstanding.store(self.outstanding.load(Relaxed).saturating_sub(1), Relaxed);
        if self.waiting.load(Relaxed) {
            self.room.notify_one();
        }
    }
}

/// A client connection's byte stream, taken apart into a read half and a
/// write half that are used without a lock (the connection's reader and
/// writer run in one task; a plaintext socket's write half is also
/// written by server connections, at times the writer leaves them: see
/// [`ClientWrite::Plain`]).
pub(crate) trait Halves: Send + 'static {
    /// The read half.
    type Read: AsyncRead + Unpin + Send;
    /// The write half.
    type Write: AsyncWrite + Unpin + Send;
    /// The two halves.
    fn halves(self) -> (Self::Read, Self::Write);
    /// The socket under the write half, when replies can be written to it
    /// by the server connections they come on (plaintext TCP).
    fn socket(_w: &Self::Write) -> Option<Arc<tokio::net::tcp::OwnedWriteHalf>> {
        None
    }
}

/// The replies of a connection's requests, in request order, from its
/// reader to its writer (one task: a lock that is never contended).
struct Replies {
    queue: parking_lot::Mutex<std::collections::VecDeque<PendingReply>>,
    /// How many the queue holds: changed under its lock, looked at without
    /// it (the writer asks at every offer whether anything waits behind
    /// its reply; the reader and writer run in one task, never at once).
    queued: AtomicUsize,
    /// The reader has ended: the writer ends once the queue is empty.
    done: AtomicBool,
}

impl Replies {
    fn new() -> Replies {
        Replies {
            queue: parking_lot::Mutex::new(std::collections::VecDeque::new()),
            queued: AtomicUsize::new(0),
            done: AtomicBool::new(false),
        }
    }

    fn is_empty(&self) -> bool {
        self.queued.load(Relaxed) == 0
    }

    fn push(&self, reply: PendingReply) {
        let mut queue = self.queue.lock();
        queue.push_back(reply);
        self.queued.store(queue.len(), Relaxed);
    }

    fn pop(&self) -> Option<PendingReply> {
        if self.is_empty() {
            return None;
        }
        let mut queue = self.queue.lock();
        let reply = queue.pop_front();
        self.queued.store(queue.len(), Relaxed);
        reply
    }
}

/// Serves one client connection until it closes, quits, idles out, or the
/// proxy shuts down (requests in flight are answered first).
pub(crate) async fn serve<T, S>(
    stream: T,
    mut session: S,
    requester: Requester,
    settings: ConnSettings,
    mut shutdown: watch::Receiver<bool>,
    mut guard: ConnGuard,
) where
    T: Halves,
    S: Session,
{
    let (r, w) = stream.halves();
    let flow = Flow::new(settings.budget);
    let account = requester.account.clone();
    if let Some(socket) = T::socket(&w) {
        account.attach(socket);
    }
    let replies = Replies::new();
    let writer = async {
        if let Err(e) = write_replies(w, &replies, &flow, &account).await {
            tracing::debug!("client connection closed: {e}");
        }
        // The socket is closed once its last holder lets it go.
        drop(account.detach());
        // A reader waiting for room (a full window of requests whose
        // replies will never be written) would wait forever, holding the
        // connection: it stops now.
        flow.closed.store(true, Relaxed);
        flow.room.notify_waiters();
    };
    let reader = async {
        // Made once and kept: waits registered for the life of the
        // connection, not once per read. Each is polled once, to register
        // this task (a send or an overflow wakes it whether or not it is
        // polled again: the account's other wake-up, the client gone, is
        // this reader's own, after it ends); then a cheap look at the
        // shutdown's version and the account's flag tells.
        let probe = shutdown.clone();
        let stop = shutdown.changed();
        tokio::pin!(stop);
        let overflow = account.overflowed();
        tokio::pin!(overflow);
        let _ = std::future::poll_fn(|cx| {
            let _ = stop.as_mut().poll(cx);
            let _ = overflow.as_mut().poll(cx);
            Poll::Ready(())
        })
        .await;
        // A request's reply, queued for the writer: false if it can no
        // longer be written (the writer has ended).
        let queue_reply = |reply: PendingReply| {
            if flow.closed.load(Relaxed) {
                return false;
            }
            flow.taken();
            replies.push(reply);
            true
        };
        let mut input = Input { r, idle: settings.idle, closing: None, stop: probe };
        let mut buf = BytesMut::with_capacity(16 * 1024);
        let close = 'conn: loop {
            // A client that holds too many unread replies (or pushed
            // messages) is closed even while it sends nothing.
            match input.read(&mut buf, &account).await {
                Read::Data => {}
                Read::End(close) => break close,
            }
            loop {
                if !flow.room_now(&account) && !flow.wait_room(&account).await {
                    break 'conn if account.is_overflowed() { Close::Overflow } else { Close::Error };
                }
                // Every request of the read taken: more bytes are needed
                // (what a session says of an empty buffer), without asking.
                if buf.is_empty() {
                    break;
                }
                // The common step (a reply to queue) taken where it is
                // matched: the reply is moved once, into the queue.
                let step = match session.next_now(&mut buf) {
                    Ok(Step::Reply(reply)) => {
                        if !queue_reply(reply) {
                            break 'conn Close::Error;
                        }
                        continue;
                    }
                    Ok(Step::More) => break,
                    Ok(step) => step,
                    Err(later) => session.next_later(later, &mut buf).await,
                };
                match step {
                    Step::More => break,
                    Step::Taken => {}
                    Step::Reply(reply) => {
                        if !queue_reply(reply) {
                            break 'conn Close::Error;
                        }
                    }
                    Step::Close { reply, error } => {
                        if reply.is_some_and(|reply| !queue_reply(reply)) {
                            break 'conn Close::Error;
                        }
                        break 'conn if error { Close::Error } else { Close::Eof };
                    }
                }
            }
        };
        replies.done.store(true, Relaxed);
        // Replies that wait on the server for ever (a blocked BLPOP) are
        // given up, and their server connections closed, as Redis drops a
        // blocked client that closes.
        account.mark_gone();
        close
    };
    // The reader, then the writer, in one task. The reader is polled at
    // every poll of the task, with the task's own waker (what wakes the
    // task is mostly its socket: a reply written through by its server
    // connection wakes nothing). The writer is polled only when something
    // it waits on woke it, and right after every poll of the reader: a
    // reply the reader queued is picked up in the same poll.
    let close = {
        tokio::pin!(reader);
        tokio::pin!(writer);
        let writer_wake = HalfWake::new();
        let (mut close, mut written) = (None, false);
        // The task's waker as last recorded: the shared one is locked and
        // replaced only when it changes (a task's waker does not, in
        // practice), not at every poll.
        let mut recorded: Option<std::task::Waker> = None;
        std::future::poll_fn(|cx| {
            if !recorded.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                writer_wake.task(cx.waker());
                recorded = Some(cx.waker().clone());
            }
            let mut read = false;
            if close.is_none() {
                read = true;
                if let Poll::Ready(c) = reader.as_mut().poll(cx) {
                    close = Some(c);
                }
            }
            if !written
                && (writer_wake.flag.woken.swap(false, AcqRel) || read)
                && writer.as_mut().poll(&mut Context::from_waker(&writer_wake.waker)).is_ready()
            {
                written = true;
            }
            match (close, written) {
                (Some(c), true) => Poll::Ready(c),
                _ => Poll::Pending,
            }
        })
        .await
    };
    let close = if account.is_overflowed() { Close::Overflow } else { close };
    tracing::debug!(client = requester.affinity, "client connection closed ({close:?})");
    guard.close = Some(close);
}

/// The writer's waker: it marks the writer as woken, then wakes the
/// connection's task, which polls the writer only when it is marked (or
/// right after its reader).
struct HalfWake {
    flag: Arc<HalfFlag>,
    waker: std::task::Waker,
}

struct HalfFlag {
    /// Woken since the writer was last polled (set at first: it is
    /// polled in the task's first poll).
    woken: AtomicBool,
    /// The connection's task, as its last poll gave it.
    task: parking_lot::Mutex<Option<std::task::Waker>>,
}

impl std::task::Wake for HalfFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Already marked: the task was woken by the mark, and has not
        // polled the writer since.
        if !self.woken.swap(true, AcqRel) {
            if let Some(task) = &*self.task.lock() {
                task.wake_by_ref();
            }
        }
    }
}

impl HalfWake {
    fn new() -> HalfWake {
        let flag = Arc::new(HalfFlag { woken: AtomicBool::new(true), task: parking_lot::Mutex::new(None) });
        HalfWake { waker: std::task::Waker::from(flag.clone()), flag }
    }

    /// Records the task's waker (it can change between polls).
    fn task(&self, waker: &std::task::Waker) {
        let mut task = self.flag.task.lock();
        if !task.as_ref().is_some_and(|t| t.will_wake(waker)) {
            *task = Some(waker.clone());
        }
    }
}

/// What a read gave.
enum Read {
    /// More bytes.
    Data,
    /// The end of reading.
    End(Close),
}

/// A connection's read side: more bytes until the client closes, idles out
/// or the proxy shuts down, after which it still reads for
/// [`SHUTDOWN_GRACE`].
struct Input<R> {
    r: R,
    idle: Option<Duration>,
    closing: Option<tokio::time::Instant>,
    /// Changes when the proxy shuts down (or its sender goes). The task is
    /// woken then by a wait registered once (`serve`).
    stop: watch::Receiver<bool>,
}

impl<R: AsyncRead + Unpin> Input<R> {
    /// More bytes into `buf`; the end when `account` has overflowed (the
    /// client holds too many unread replies) and there are none.
    ///
    /// One poll function, not a `select!` of futures made anew at every
    /// read: bytes first, and the overflow, the shutdown, the grace period
    /// and the idle timer are only looked at (their wakers registered, a
    /// timer made) when there are none.
    async fn read(&mut self, buf: &mut BytesMut, account: &ReplyAccount) -> Read {
        let Input { r, idle, closing, stop } = self;
        // Made when first needed: the idle timer runs from this read's
        // first wait for bytes (each read starts it again).
        let mut idle_timer = std::pin::pin!(None::<tokio::time::Sleep>);
        let mut grace = std::pin::pin!(None::<tokio::time::Sleep>);
        std::future::poll_fn(|cx| {
            match std::pin::pin!(r.read_buf(buf)).poll(cx) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Read::End(Close::Eof)),
                Poll::Ready(Ok(_)) => return Poll::Ready(Read::Data),
                Poll::Ready(Err(_)) => return Poll::Ready(Read::End(Close::Error)),
                Poll::Pending => {}
            }
            // The task is woken by the overflow through the wait `serve`
            // registered.
            if account.is_overflowed() {
                return Poll::Ready(Read::End(Close::Overflow));
            }
            if closing.is_none() && stop.has_changed().unwrap_or(true) {
                *closing = Some(tokio::time::Instant::now() + SHUTDOWN_GRACE);
            }
            if closing.is_some_and(|at| expired(grace.as_mut(), || at, cx))
                || idle.is_some_and(|d| expired(idle_timer.as_mut(), || tokio::time::Instant::now() + d, cx))
            {
                return Poll::Ready(Read::End(Close::Proxy));
            }
            Poll::Pending
        })
        .await
    }
}

/// Whether `timer` has gone off: made, to go off at `at()`, when first
/// looked at; its waker registered until then.
#[inline]
fn expired(
    mut timer: Pin<&mut Option<tokio::time::Sleep>>,
    at: impl FnOnce() -> tokio::time::Instant,
    cx: &mut Context<'_>,
) -> bool {
    if timer.is_none() {
        timer.set(Some(tokio::time::sleep_until(at())));
    }
    timer.as_pin_mut().is_some_and(|t| t.poll(cx).is_ready())
}

/// Writes all of `buf`, unless the client overflows its reply account
/// meanwhile (a client that does not read blocks the write forever). A
/// write the socket takes at once is made without waiting on anything.
async fn write_all<W: AsyncWrite + Unpin>(w: &mut W, buf: &[u8], account: &ReplyAccount) -> std::io::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    let mut written = 0;
    // One try first: the socket has room almost always.
    let first = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *w).poll_write(cx, buf))).await;
    match first {
        Poll::Ready(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
        Poll::Ready(Ok(n)) => written = n,
        Poll::Ready(Err(e)) => return Err(e),
        Poll::Pending => {}
    }
    if written == buf.len() {
        return Ok(());
    }
    tokio::select! {
        biased;
        r = w.write_all(&buf[written..]) => r,
        _ = account.overflowed() => Err(std::io::Error::other("client holds too many unread replies")),
    }
}

/// Writes replies in order until the reader has ended and every reply is
/// written, then shuts the write side. Runs in the connection's task,
/// polled right after its reader: a reply becoming ready wakes that task
/// directly, with no hand-off (or, written through by its server
/// connection, wakes nothing: see [`alone`]). Replies ready together go
/// out in one write.
async fn write_replies<W: AsyncWrite + Unpin>(
    mut w: W,
    replies: &Replies,
    flow: &Flow,
    account: &ReplyAccount,
) -> std::io::Result<()> {
    let mut out = BytesMut::with_capacity(16 * 1024);
    loop {
        let mut next = match replies.pop() {
            Some(p) => p,
            None => {
                if !out.is_empty() {
                    write_all(&mut w, &out, account).await?;
                    out.clear();
                }
                // Nothing queued: wait for the reader (polled before this
                // in every poll of the task) to queue more, or to end.
                let next = std::future::poll_fn(|_| match replies.pop() {
                    Some(p) => Poll::Ready(Some(p)),
                    None if replies.done.load(Relaxed) => Poll::Ready(None),
                    None => Poll::Pending,
                })
                .await;
                match next {
                    Some(p) => p,
                    None => break,
                }
            }
        };
        // With something gathered, polled once (with the task's waker: a
        // reply that is not ready wakes the writer when it is): a ready
        // reply joins the write being gathered; one not ready waits, after
        // what is gathered is written. With nothing gathered, awaited
        // alone, and offered.
        let now = if out.is_empty() {
            Some(std::future::poll_fn(|cx| alone(&mut next, replies, flow, cx)).await)
        } else {
            std::future::poll_fn(|cx| match Pin::new(&mut next).poll(cx) {
                Poll::Ready(b) => Poll::Ready(Some(b)),
                Poll::Pending => Poll::Ready(None),
            })
            .await
        };
        let reply = match now {
            Some(b) => b,
            None => {
                write_all(&mut w, &out, account).await?;
                out.clear();
                std::future::poll_fn(|cx| alone(&mut next, replies, flow, cx)).await
            }
        };
        match reply {
            Some(Out::Bytes(b)) => {
                flow.done(Some(b.len()));
                out.extend_from_slice(&b);
            }
            Some(Out::Stream(ReplyStream(mut chunks))) => {
                flow.done(Some(crate::conn::STREAMED_SIZE));
                if !out.is_empty() {
                    write_all(&mut w, &out, account).await?;
                    out.clear();
                }
                loop {
                    match chunks.recv().await {
                        Some(chunk) => {
                            write_all(&mut w, &chunk.data, account).await?;
                            if chunk.last {
                                break;
                            }
                        }
                        // Part of a reply went out and the rest never will:
                        // the connection cannot go on.
                        None => return Err(std::io::Error::other("server reply cut short")),
                    }
                }
            }
            Some(Out::Sent(n)) => flow.done(Some(n)),
            None => flow.done(None),
        }
        if out.len() >= 64 * 1024 {
            write_all(&mut w, &out, account).await?;
            out.clear();
        }
    }
    if !out.is_empty() {
        write_all(&mut w, &out, account).await?;
    }
    // Every reply is out: the socket is the writer's alone again, to shut.
    drop(account.detach());
    w.flush().await?;
    w.shutdown().await
}

/// Polls `next` for a writer with nothing unwritten before it. While
/// nothing is queued behind it, the reader has not ended and does not
/// wait for room in the window, the reply's slot is offered: its server
/// connection may write it to the client itself. Each of those is seen by
/// the writer's next poll (the reader is polled first, in the same task),
/// which withdraws the offer; a reply written through before that is taken
/// as sent then. While the offer holds, the task is not woken for the
/// reply: nothing needs the writer until the reader has more for it.
#[inline]
fn alone(next: &mut PendingReply, replies: &Replies, flow: &Flow, cx: &mut Context<'_>) -> Poll<Option<Out>> {
    let offer = matches!(next, PendingReply::Server(_))
        && !flow.waiting.load(Relaxed)
        && !replies.done.load(Relaxed)
        && replies.is_empty();
    next.poll_offering(cx, offer)
}

/// The size a streamed reply counts for in the average: large.
const STREAMED_SIZE: usize = 1 << 20;

impl Halves for ClientStream {
    type Read = ClientRead;
    type Write = ClientWrite;

    fn halves(self) -> (ClientRead, ClientWrite) {
        match self {
            // Owned halves of a socket: no lock between them (the write
            // half shared with the reply account, for replies written
            // through).
            ClientStream::Plain(s) => {
                let (r, w) = s.into_split();
                (ClientRead::Plain(r), ClientWrite::Plain(Arc::new(w)))
            }
            ClientStream::Tls(s) => {
                let (r, w) = tokio::io::split(*s);
                (ClientRead::Tls(r), ClientWrite::Tls(w))
            }
        }
    }

    fn socket(w: &ClientWrite) -> Option<Arc<tokio::net::tcp::OwnedWriteHalf>> {
        match w {
            ClientWrite::Plain(s) => Some(s.clone()),
            ClientWrite::Tls(_) => None,
        }
    }
}

/// In-process streams (the tests' clients).
impl Halves for tokio::io::DuplexStream {
    type Read = tokio::io::ReadHalf<tokio::io::DuplexStream>;
    type Write = tokio::io::WriteHalf<tokio::io::DuplexStream>;

    fn halves(self) -> (Self::Read, Self::Write) {
        tokio::io::split(self)
    }
}

type TlsServerStream = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// A client connection's read half.
pub(crate) enum ClientRead {
    Plain(tokio::net::tcp::OwnedReadHalf),
    Tls(tokio::io::ReadHalf<TlsServerStream>),
}

/// A client connection's write half.
pub(crate) enum ClientWrite {
    /// Shared with the client's reply account: a server connection may
    /// write a reply to it when the writer offers it
    /// ([`ReplyAccount::attach`]). Written by both with `try_write`, which
    /// takes a shared reference, never at once: a server connection writes
    /// only under the account's lock while the slot is offered, and the
    /// writer writes only after it has seen, under that lock, that it no
    /// longer is.
    Plain(Arc<tokio::net::tcp::OwnedWriteHalf>),
    Tls(tokio::io::WriteHalf<TlsServerStream>),
}

impl AsyncRead for ClientRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientRead::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientRead::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientWrite {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ClientWrite::Plain(s) => loop {
                let socket: &tokio::net::TcpStream = (**s).as_ref();
                std::task::ready!(socket.poll_write_ready(cx))?;
                match socket.try_write(buf) {
                    // Not ready after all: the readiness is cleared, and
                    // the next poll waits for it.
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    r => return Poll::Ready(r),
                }
            },
            ClientWrite::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientWrite::Plain(_) => Poll::Ready(Ok(())),
            ClientWrite::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            // Shut by the last holder dropping it otherwise (the writer
            // detaches the account's first).
            ClientWrite::Plain(s) => match Arc::get_mut(s) {
                Some(s) => Pin::new(s).poll_shutdown(cx),
                None => Poll::Ready(Ok(())),
            },
            ClientWrite::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A client connection's byte stream: plaintext TCP, or TLS over it.
pub(crate) enum ClientStream {
    /// Plaintext.
    Plain(tokio::net::TcpStream),
    /// TLS, its handshake done.
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ClientStream::Plain(s) => s.is_write_vectored(),
            ClientStream::Tls(s) => s.is_write_vectored(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input_of(
        r: tokio::io::DuplexStream,
        idle: Option<Duration>,
    ) -> (Input<tokio::io::DuplexStream>, watch::Sender<bool>) {
        let (stop, probe) = watch::channel(false);
        (Input { r, idle, closing: None, stop: probe }, stop)
    }

    /// Bytes are read as they come; a client that sends nothing for the
    /// idle timeout is closed then, and not before (paused time).
    #[tokio::test(start_paused = true)]
    async fn a_read_gives_bytes_then_ends_when_the_client_idles_out() {
        let (mut client, server) = tokio::io::duplex(64);
        let (mut input, _stop) = input_of(server, Some(Duration::from_secs(5)));
        let mut buf = BytesMut::new();
        let account = ReplyAccount::new(1 << 20);
        client.write_all(b"get a\r\n").await.unwrap();
        assert!(matches!(input.read(&mut buf, &account).await, Read::Data));
        assert_eq!(&buf[..], b"get a\r\n");
        let start = tokio::time::Instant::now();
        assert!(matches!(input.read(&mut buf, &account).await, Read::End(Close::Proxy)));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        // Each read starts the idle timer again.
        let sent = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            client.write_all(b"x").await.unwrap();
            client
        });
        let start = tokio::time::Instant::now();
        assert!(matches!(input.read(&mut buf, &account).await, Read::Data));
        assert_eq!(start.elapsed(), Duration::from_secs(4));
        let start = tokio::time::Instant::now();
        assert!(matches!(input.read(&mut buf, &account).await, Read::End(Close::Proxy)));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        drop(sent.await.unwrap());
        assert!(matches!(input.read(&mut buf, &account).await, Read::End(Close::Eof)));
    }

    /// Once the proxy shuts down, bytes are still read for the grace
    /// period, then the read ends; an overflow ends it at once.
    #[tokio::test(start_paused = true)]
    async fn a_read_ends_after_the_shutdown_grace_or_at_an_overflow() {
        let (mut client, server) = tokio::io::duplex(64);
        let (mut input, stop) = input_of(server, None);
        let mut buf = BytesMut::new();
        let account = ReplyAccount::new(1 << 20);
        stop.send(true).unwrap();
        let start = tokio::time::Instant::now();
        let late = tokio::spawn(async move {
            tokio::time::sleep(SHUTDOWN_GRACE / 2).await;
            client.write_all(b"y").await.unwrap();
            client
        });
        assert!(matches!(input.read(&mut buf, &account).await, Read::Data));
        assert_eq!(start.elapsed(), SHUTDOWN_GRACE / 2);
        assert!(matches!(input.read(&mut buf, &account).await, Read::End(Close::Proxy)));
        assert_eq!(start.elapsed(), SHUTDOWN_GRACE, "the grace runs from the shutdown, not from each read");
        let _client = late.await.unwrap();

        let (_client, server) = tokio::io::duplex(64);
        let (mut input, _stop) = input_of(server, None);
        account.overflow();
        assert!(matches!(input.read(&mut buf, &account).await, Read::End(Close::Overflow)));
    }
}
