//! What travels between a client session and a server connection: a
//! request ([`Job`]) with its reply channel and deadline, who it is for
//! ([`Requester`], with its [`ReplyAccount`]), and why it got no reply
//! ([`BackendError`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use parking_lot::{Mutex, MutexGuard};

use super::framing::{Framing, Reply, Setup};

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
    /// The server is between addresses (a Sentinel group failing over)
    /// and the request was not sent: it may be tried again.
    Retry(String),
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
            BackendError::Retry(e) => f.write_str(e),
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
    /// Wherever its discoverer says now, over TCP (a Sentinel group's
    /// primary).
    Moving(Arc<super::moving::Moving>),
    /// An in-process endpoint of the tests' memory network.
    #[cfg(test)]
    Memory(String),
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
            Address::Moving(m) => match &m.target.borrow().primary {
                Some(p) => write!(f, "{}@{p}", m.name),
                None => write!(f, "{}@?", m.name),
            },
            #[cfg(test)]
            Address::Memory(a) => write!(f, "memory:{a}"),
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
    /// The dialects a server's connections speak (Redis: RESP2, then
    /// RESP3), each with the commands its connections run first; a request
    /// names its dialect ([`Requester::dialect`]). At least one.
    pub dialects: Vec<Option<Setup>>,
    /// TLS to the servers (`server_tls`), over TCP.
    pub(crate) tls: Option<Arc<crate::tls::LiveTls>>,
}

/// A client connection's account of reply bytes that have arrived from
/// servers and that it has not taken yet. Past its limit, further replies
/// for it are dropped and it is told to close (a client that never reads
/// cannot make the proxy hold more).
///
/// It is also where those replies wait: each request sent has a slot in
/// its client's inbox, which its server connection fills
/// ([`ReplyTx::send`]) and its client empties ([`Pending`]), or which the
/// server connection completes itself by writing the reply to the client
/// when the client's writer offered it; slots are
/// used again, so a request in the steady state allocates nothing for its
/// reply's way back.
#[derive(Debug)]
pub struct ReplyAccount {
    inbox: Mutex<Inbox>,
    held: AtomicUsize,
    limit: usize,
    overflowed: AtomicBool,
    /// The client stopped reading (closed its side, or its connection
    /// failed): replies it waits for that may never come (a blocked
    /// command's) are given up.
    gone: AtomicBool,
    notify: tokio::sync::Notify,
}

impl ReplyAccount {
    /// An account that overflows once it holds `limit` bytes.
    pub fn new(limit: usize) -> Arc<ReplyAccount> {
        Arc::new(ReplyAccount {
            inbox: Mutex::new(Inbox::default()),
            held: AtomicUsize::new(0),
            limit: limit.max(1),
            overflowed: AtomicBool::new(false),
            gone: AtomicBool::new(false),
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

    /// Marks the client as holding too much (its connection's writer
    /// gives up, and the connection closes): a subscriber that does not
    /// read.
    pub fn overflow(&self) {
        if !self.overflowed.swap(true, Relaxed) {
            self.notify.notify_waiters();
        }
    }

    /// The client is gone: wakes what waits in [`ReplyAccount::gone`].
    pub fn mark_gone(&self) {
        if !self.gone.swap(true, Relaxed) {
            self.notify.notify_waiters();
        }
    }

    /// Resolves once the client is gone.
    pub async fn gone(&self) {
        loop {
            let notified = self.notify.notified();
            if self.gone.load(Relaxed) {
                return;
            }
            notified.await;
        }
    }

    /// Lets a server connection write a reply straight to the client's
    /// socket, when the client's writer offers the reply's slot
    /// ([`Pending::poll_offering`]): the client's own task then has
    /// nothing to do for it. Until [`ReplyAccount::detach`].
    pub fn attach(&self, socket: Arc<tokio::net::tcp::OwnedWriteHalf>) {
        self.lock().socket = Some(socket);
    }

    /// No more replies are written to the client's socket but by its
    /// writer (which is ending); the socket is given back.
    pub fn detach(&self) -> Option<Arc<tokio::net::tcp::OwnedWriteHalf>> {
        self.lock().socket.take()
    }

    /// A slot for one request's reply: the server's end and the client's.
    pub(super) fn reserve(self: &Arc<Self>) -> (ReplyTx, Pending) {
        let slot = {
            let mut inbox = self.lock();
            match inbox.free.pop() {
                Some(i) => {
                    inbox.slots[i as usize].set(Slot::WAITING);
                    i
                }
                None => {
                    inbox.slots.push(Slot::WAITING);
                    (inbox.slots.len() - 1) as u32
                }
            }
        };
        (ReplyTx { account: Some(self.clone()), slot }, Pending { account: Some(self.clone()), slot })
    }

    fn lock(&self) -> MutexGuard<'_, Inbox> {
        // parking_lot's: not poisoned by a panic. Nothing under it
        // panics on input (slot indices are the inbox's own).
        self.inbox.lock()
    }

    /// A reply arrives for slot `slot`: counted until the client takes it
    /// (or an overflow error instead, and the account overflows, when it
    /// already holds its limit).
    fn deliver(&self, slot: u32, result: Result<Reply, BackendError>, health: Option<&super::health::Health>) {
        let result = match result {
            Ok(_) if self.held.load(Relaxed) >= self.limit => {
                if !self.overflowed.swap(true, Relaxed) {
                    self.notify.notify_waiters();
                }
                Err(BackendError::Overflow)
            }
            r => r,
        };
        let waker = {
            let mut inbox = self.lock();
            // Looked at in place: the slot is replaced once, by what it
            // becomes.
            match &mut inbox.slots[slot as usize] {
                Slot::Waiting { waker, offered: true } => match result {
                    Ok(Reply::Whole(frame)) => {
                        // Its success heard now: the client's writer may
                        // not look at the slot until its client sends more.
                        if let Some(health) = health {
                            health.succeeded();
                        }
                        let waker = waker.take();
                        match inbox.write_through(slot, &frame) {
                            None => None,
                            Some(written) => {
                                inbox.fill(slot, Ok(Reply::Whole(frame.slice(written..))), waker, &self.held)
                            }
                        }
                    }
                    result => {
                        let waker = waker.take();
                        inbox.fill(slot, result, waker, &self.held)
                    }
                },
                Slot::Waiting { waker, offered: false } => {
                    let waker = waker.take();
                    inbox.fill(slot, result, waker, &self.held)
                }
                // The client stopped waiting: the reply is dropped.
                _ => {
                    inbox.slots[slot as usize] = Slot::Free;
                    inbox.free.push(slot);
                    None
                }
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl ReplyAccount {
    /// A server's reply for slot `slot`: the first `len` bytes of `buf`,
    /// taken from it. Written to the client from `buf` itself when the
    /// slot is offered (nothing copied or counted); else taken as
    /// [`ReplyAccount::deliver`] takes a reply. `health` hears of its
    /// success if it is written through.
    fn deliver_front(&self, slot: u32, buf: &mut BytesMut, len: usize, health: &super::health::Health) {
        if self.held.load(Relaxed) >= self.limit {
            // The overflow is `deliver`'s to say.
            return self.deliver(slot, Ok(Reply::Whole(buf.split_to(len).freeze())), Some(health));
        }
        let waker = {
            let mut inbox = self.lock();
            match &mut inbox.slots[slot as usize] {
                Slot::Waiting { waker, offered: true } => {
                    health.succeeded();
                    let waker = waker.take();
                    match inbox.write_through(slot, &buf[..len]) {
                        None => {
                            buf.advance(len);
                            None
                        }
                        Some(written) => {
                            let rest = buf.split_to(len).freeze().slice(written..);
                            inbox.fill(slot, Ok(Reply::Whole(rest)), waker, &self.held)
                        }
                    }
                }
                Slot::Waiting { waker, offered: false } => {
                    let waker = waker.take();
                    inbox.fill(slot, Ok(Reply::Whole(buf.split_to(len).freeze())), waker, &self.held)
                }
                // The client stopped waiting: the reply is dropped.
                _ => {
                    buf.advance(len);
                    inbox.slots[slot as usize] = Slot::Free;
                    inbox.free.push(slot);
                    None
                }
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// Where a client's replies wait for it, by slot.
#[derive(Debug, Default)]
struct Inbox {
    slots: Vec<Slot>,
    /// Slots free for the next requests.
    free: Vec<u32>,
    /// The client's socket, for replies written straight to it (a
    /// plaintext TCP client's; see [`ReplyAccount::attach`]).
    socket: Option<Arc<tokio::net::tcp::OwnedWriteHalf>>,
}

impl Inbox {
    /// The reply in slot `i`, if it has come: taken out, and the slot free
    /// again.
    #[inline]
    fn release(&mut self, i: u32) -> Option<(Result<Delivered, BackendError>, usize)> {
        let slot = &mut self.slots[i as usize];
        if !matches!(slot, Slot::Done(..) | Slot::Sent(_)) {
            return None;
        }
        let taken = match std::mem::replace(slot, Slot::Free) {
            Slot::Sent(n) => (Ok(Delivered::Sent(n)), 0),
            Slot::Done(result, counted) => (result.map(Delivered::Reply), counted),
            // Not reached: looked at just above.
            _ => return None,
        };
        self.free.push(i);
        Some(taken)
    }

    /// Slot `slot`'s reply has come, for its client to take: counted on
    /// `held` until then. The client's waker, to be woken.
    #[inline]
    fn fill(
        &mut self,
        slot: u32,
        result: Result<Reply, BackendError>,
        waker: Option<std::task::Waker>,
        held: &AtomicUsize,
    ) -> Option<std::task::Waker> {
        // What it holds on the account while it waits for its client.
        let counted = result.as_ref().map_or(0, Reply::whole_len);
        held.fetch_add(counted, Relaxed);
        self.slots[slot as usize] = Slot::Done(result, counted);
        waker
    }

    /// Slot `slot`'s reply, offered by the client's writer (everything
    /// before it written, nothing queued behind it): written to the
    /// client's socket now, under the lock, so nothing of the client's can
    /// be written in between. Written whole (`None`), the slot says so and
    /// the client's task is not woken (its writer takes the slot as sent
    /// when next polled); else how much was written: the caller leaves the
    /// rest in the slot for the writer, and wakes it.
    #[inline]
    fn write_through(&mut self, slot: u32, frame: &[u8]) -> Option<usize> {
        // An error (the client gone) is the writer's to meet: it writes
        // the reply itself.
        let written = match &self.socket {
            Some(socket) => socket.try_write(frame).unwrap_or(0),
            None => 0,
        };
        if written == frame.len() {
            self.slots[slot as usize].set(Slot::Sent(written));
            return None;
        }
        Some(written)
    }
}

/// A reply as the client's writer takes it from its slot.
#[derive(Debug)]
pub(crate) enum Delivered {
    /// The reply, to be written.
    Reply(Reply),
    /// The server connection wrote the reply, of this many bytes, to the
    /// client itself (the slot was offered).
    Sent(usize),
}

#[derive(Debug)]
enum Slot {
    Free,
    /// No reply yet; the client's waker once it has looked. `offered`:
    /// the client's writer waits on nothing else, so the reply may be
    /// written to the client's socket as it comes (an offer always has a
    /// waker).
    Waiting {
        waker: Option<std::task::Waker>,
        offered: bool,
    },
    /// The reply was written to the client's socket (this many bytes).
    Sent(usize),
    /// The reply, and the bytes it holds on the account.
    Done(Result<Reply, BackendError>, usize),
    /// The client stopped waiting before the reply came.
    Abandoned,
}

impl Slot {
    /// A slot just reserved.
    const WAITING: Slot = Slot::Waiting { waker: None, offered: false };

    /// Becomes `to`. What it was is dropped only when it holds something
    /// to drop (a waker, a reply): the common changes (free to waiting,
    /// waiting to sent, sent to free) make no call to drop it.
    #[inline]
    fn set(&mut self, to: Slot) {
        let was = std::mem::replace(self, to);
        match was {
            Slot::Free | Slot::Sent(_) | Slot::Abandoned | Slot::Waiting { waker: None, .. } => std::mem::forget(was),
            was => drop(was),
        }
    }
}

/// The server's end of a request's reply slot. Dropped unsent (the
/// request was dropped unanswered), its client hears the connection was
/// reset.
#[derive(Debug)]
pub(super) struct ReplyTx {
    account: Option<Arc<ReplyAccount>>,
    slot: u32,
}

impl ReplyTx {
    /// Sends the reply (or why there is none) to its client.
    pub(super) fn send(mut self, result: Result<Reply, BackendError>) {
        if let Some(account) = self.account.take() {
            account.deliver(self.slot, result, None);
        }
    }

    /// Sends its server's reply, the first `len` bytes of `buf` (taken
    /// from it): written to the client from `buf` when its slot is
    /// offered. `health`, the server's, hears of its success then.
    pub(super) fn send_front(mut self, buf: &mut BytesMut, len: usize, health: &super::health::Health) {
        match self.account.take() {
            Some(account) => account.deliver_front(self.slot, buf, len, health),
            None => buf.advance(len),
        }
    }

    /// Sends its server's reply; `health`, the server's, hears of its
    /// success if the reply is written through to the client (its client
    /// may not look at it until it sends more).
    pub(super) fn send_reply(mut self, reply: Reply, health: &super::health::Health) {
        if let Some(account) = self.account.take() {
            account.deliver(self.slot, Ok(reply), Some(health));
        }
    }
}

impl Drop for ReplyTx {
    fn drop(&mut self) {
        if let Some(account) = self.account.take() {
            account.deliver(self.slot, Err(BackendError::Closed("connection reset".into())), None);
        }
    }
}

/// A submitted request's reply, as its client waits for it. Dropped before
/// the reply came, the reply is dropped when it comes (and its bytes are
/// off the account at once if it came).
#[derive(Debug)]
pub struct Pending {
    account: Option<Arc<ReplyAccount>>,
    slot: u32,
}

impl Pending {
    /// The reply, once it has come.
    pub(super) fn poll_reply(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<Reply, BackendError>> {
        self.poll_offering(cx, false).map(|r| {
            r.map(|d| match d {
                Delivered::Reply(reply) => reply,
                // Only a slot offered is written through; an offer is
                // made by a writer, which polls with `offer` only.
                Delivered::Sent(_) => Reply::Whole(Bytes::new()),
            })
        })
    }

    /// The reply, once it has come; `offer`: the client's writer waits on
    /// this reply and nothing else (everything of the client's before it
    /// is written, nothing is queued behind it), so its server connection
    /// may write it to the client's socket itself. An offer holds until
    /// the next poll, which makes it again or withdraws it.
    pub(super) fn poll_offering(
        &mut self,
        cx: &mut std::task::Context<'_>,
        offer: bool,
    ) -> Poll<Result<Delivered, BackendError>> {
        let Some(account) = &self.account else {
            return Poll::Ready(Err(taken_twice()));
        };
        let i = self.slot;
        let mut inbox = account.lock();
        let offer = offer && inbox.socket.is_some();
        // The two common cases first, in place: still waiting (the waker
        // kept when it is the same), or written through.
        match &mut inbox.slots[i as usize] {
            Slot::Waiting { waker, offered } => {
                match waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                *offered = offer;
                return Poll::Pending;
            }
            Slot::Sent(n) => {
                let n = *n;
                inbox.slots[i as usize].set(Slot::Free);
                inbox.free.push(i);
                drop(inbox);
                self.account = None;
                return Poll::Ready(Ok(Delivered::Sent(n)));
            }
            _ => {}
        }
        drop(inbox);
        Poll::Ready(self.take_done())
    }

    /// The reply that has come into its slot (not written through): taken
    /// out, and off the account. Out of [`Pending::poll_offering`]'s way:
    /// the common cases there need none of this.
    #[cold]
    #[inline(never)]
    fn take_done(&mut self) -> Result<Delivered, BackendError> {
        let Some(account) = self.account.take() else { return Err(taken_twice()) };
        let taken = account.lock().release(self.slot);
        match taken {
            Some((result, counted)) => {
                account.held.fetch_sub(counted, Relaxed);
                result
            }
            None => Err(BackendError::Closed("reply slot lost".into())),
        }
    }
}

/// A reply asked for again after it was taken.
#[cold]
fn taken_twice() -> BackendError {
    BackendError::Closed("reply already taken".into())
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(account) = self.account.take() else { return };
        let mut inbox = account.lock();
        if let Some((_, counted)) = inbox.release(self.slot) {
            drop(inbox);
            account.held.fetch_sub(counted, Relaxed);
        } else if let slot @ Slot::Waiting { .. } = &mut inbox.slots[self.slot as usize] {
            // Its reply is dropped when it comes ([`ReplyAccount::deliver`]).
            *slot = Slot::Abandoned;
        }
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
    /// The dialect its requests are in (an index into
    /// [`BackendSettings::dialects`]; 0 but for a Redis client that said
    /// `HELLO 3`).
    pub dialect: usize,
}

/// One request on its way to a server.
pub(crate) struct Job {
    pub(super) data: Bytes,
    pub(super) framing: &'static dyn Framing,
    /// How many of the framing's replies make up this request's reply (a
    /// transaction's commands, sent and answered together).
    pub(super) frames: usize,
    pub(super) reply: ReplyTx,
    /// When it must have been answered (the pool's `timeout` from when it
    /// was submitted).
    pub(super) deadline: Option<tokio::time::Instant>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    async fn reply_of(p: &mut Pending) -> Result<Reply, BackendError> {
        poll_fn(|cx| p.poll_reply(cx)).await
    }

    fn whole(r: Result<Reply, BackendError>) -> Bytes {
        match r {
            Ok(Reply::Whole(b)) => b,
            Ok(Reply::Stream(_)) => panic!("a stream"),
            Err(e) => panic!("an error: {e}"),
        }
    }

    #[tokio::test]
    async fn replies_reach_their_own_slot_and_slots_are_used_again() {
        let account = ReplyAccount::new(1 << 20);
        let (tx1, mut p1) = account.reserve();
        let (tx2, mut p2) = account.reserve();
        // Answered out of order, each reaches its own request.
        tx2.send(Ok(Reply::Whole(Bytes::from_static(b"two"))));
        assert_eq!(account.held(), 3, "an arrived reply is on the account until taken");
        tx1.send(Ok(Reply::Whole(Bytes::from_static(b"one"))));
        assert_eq!(whole(reply_of(&mut p1).await), "one");
        assert_eq!(whole(reply_of(&mut p2).await), "two");
        assert_eq!(account.held(), 0);
        // A thousand requests one after another use the same two slots.
        for i in 0..1000u32 {
            let (tx, mut p) = account.reserve();
            tx.send(Ok(Reply::Whole(Bytes::from(i.to_string()))));
            assert_eq!(whole(reply_of(&mut p).await), i.to_string());
        }
        assert_eq!(account.lock().slots.len(), 2, "slots are reused, not grown");
    }

    #[tokio::test]
    async fn a_waiting_client_is_woken_by_its_reply() {
        let account = ReplyAccount::new(1 << 20);
        let (tx, mut p) = account.reserve();
        let waiter = tokio::spawn(async move { whole(reply_of(&mut p).await) });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "no reply yet");
        tx.send(Ok(Reply::Whole(Bytes::from_static(b"+OK\r\n"))));
        assert_eq!(waiter.await.unwrap(), "+OK\r\n");
    }

    #[tokio::test]
    async fn an_unanswered_request_is_heard_of_and_an_abandoned_reply_leaves_the_account() {
        let account = ReplyAccount::new(1 << 20);
        // The server's end dropped unanswered (its queue went away).
        let (tx, mut p) = account.reserve();
        drop(tx);
        assert!(matches!(reply_of(&mut p).await, Err(BackendError::Closed(_))));
        // The client stopped waiting, then the reply came: dropped, off
        // the account, and the slot free again.
        let (tx, p) = account.reserve();
        drop(p);
        tx.send(Ok(Reply::Whole(Bytes::from_static(b"late"))));
        assert_eq!(account.held(), 0);
        // The reply came, then the client stopped waiting: off the account.
        let (tx, p) = account.reserve();
        tx.send(Ok(Reply::Whole(Bytes::from_static(b"unread"))));
        assert_eq!(account.held(), 6);
        drop(p);
        assert_eq!(account.held(), 0);
        let inbox = account.lock();
        assert_eq!(inbox.free.len(), inbox.slots.len(), "every slot free again");
    }

    #[tokio::test]
    async fn a_reply_past_the_limit_is_an_overflow() {
        let account = ReplyAccount::new(4);
        let (tx1, mut p1) = account.reserve();
        let (tx2, mut p2) = account.reserve();
        tx1.send(Ok(Reply::Whole(Bytes::from_static(b"12345"))));
        tx2.send(Ok(Reply::Whole(Bytes::from_static(b"6"))));
        assert!(account.is_overflowed());
        assert_eq!(whole(reply_of(&mut p1).await), "12345");
        assert_eq!(reply_of(&mut p2).await.err(), Some(BackendError::Overflow));
    }

    /// Counts its wake-ups.
    struct Wakes(AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    /// Both ends of a loopback TCP connection: the client's, and the
    /// proxy's write half (shared, as a client connection's is).
    async fn socket_pair(
    ) -> (tokio::net::TcpStream, Arc<tokio::net::tcp::OwnedWriteHalf>, tokio::net::tcp::OwnedReadHalf) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (proxy, _) = listener.accept().await.unwrap();
        let (r, w) = proxy.into_split();
        w.writable().await.unwrap();
        (client, Arc::new(w), r)
    }

    fn poll_offered(p: &mut Pending, wakes: &Arc<Wakes>, offer: bool) -> Poll<Result<Delivered, BackendError>> {
        let waker = std::task::Waker::from(wakes.clone());
        p.poll_offering(&mut std::task::Context::from_waker(&waker), offer)
    }

    /// A reply whose slot is offered goes to the client's socket as it
    /// comes, without waking the client's task; its slot then says how
    /// much was sent. Offered and withdrawn, or never offered, or with no
    /// socket attached, it waits in its slot as any reply does.
    #[tokio::test]
    async fn an_offered_reply_is_written_to_the_client_and_only_an_offered_one() {
        use tokio::io::AsyncReadExt;
        let (mut client, socket, _r) = socket_pair().await;
        let account = ReplyAccount::new(1 << 20);
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));

        // No socket attached: an offer is not one.
        let (tx, mut p) = account.reserve();
        assert!(poll_offered(&mut p, &wakes, true).is_pending());
        tx.send(Ok(Reply::Whole(Bytes::from_static(b"+not through\r\n"))));
        assert_eq!(wakes.0.load(Relaxed), 1);
        assert!(matches!(poll_offered(&mut p, &wakes, true), Poll::Ready(Ok(Delivered::Reply(_)))));

        account.attach(socket.clone());
        let (tx, mut p) = account.reserve();
        assert!(poll_offered(&mut p, &wakes, true).is_pending());
        tx.send(Ok(Reply::Whole(Bytes::from_static(b"$5\r\nhello\r\n"))));
        assert_eq!(wakes.0.load(Relaxed), 1, "a reply written through wakes no one");
        assert_eq!(account.held(), 0);
        let mut got = [0u8; 11];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"$5\r\nhello\r\n");
        assert!(matches!(poll_offered(&mut p, &wakes, true), Poll::Ready(Ok(Delivered::Sent(11)))));

        // Offered, then withdrawn by the next poll: held for the writer.
        let (tx, mut p) = account.reserve();
        assert!(poll_offered(&mut p, &wakes, true).is_pending());
        assert!(poll_offered(&mut p, &wakes, false).is_pending());
        tx.send(Ok(Reply::Whole(Bytes::from_static(b"+held\r\n"))));
        assert_eq!(wakes.0.load(Relaxed), 2);
        assert_eq!(account.held(), 7);
        let Poll::Ready(Ok(Delivered::Reply(r))) = poll_offered(&mut p, &wakes, false) else { panic!("no reply") };
        assert_eq!(whole(Ok(r)), "+held\r\n");

        // An error is the writer's to frame, offered or not; so is an
        // overflow.
        let (tx, mut p) = account.reserve();
        assert!(poll_offered(&mut p, &wakes, true).is_pending());
        tx.send(Err(BackendError::Timeout));
        assert_eq!(wakes.0.load(Relaxed), 3);
        assert!(matches!(poll_offered(&mut p, &wakes, true), Poll::Ready(Err(BackendError::Timeout))));

        // Detached, the socket is the writer's alone again.
        assert!(account.detach().is_some());
        assert_eq!(Arc::strong_count(&socket), 1);
        let (tx, mut p) = account.reserve();
        assert!(poll_offered(&mut p, &wakes, true).is_pending());
        tx.send(Ok(Reply::Whole(Bytes::from_static(b"+late\r\n"))));
        assert!(matches!(poll_offered(&mut p, &wakes, true), Poll::Ready(Ok(Delivered::Reply(_)))));
    }

    /// A reply the client's socket cannot take whole: what it took is
    /// sent, the rest is left in the slot for the writer, which is woken;
    /// the bytes the client reads are the reply's, in order, none lost or
    /// doubled.
    #[tokio::test]
    async fn what_a_full_socket_does_not_take_is_left_for_the_writer() {
        partly_written(false).await;
    }

    /// The same, for a reply sent from the server connection's read
    /// buffer ([`ReplyTx::send_front`]).
    #[tokio::test]
    async fn what_a_full_socket_does_not_take_of_a_read_buffer_is_left_for_the_writer() {
        partly_written(true).await;
    }

    /// A reply of 16 MiB written through to a full socket; `front`: sent
    /// from a read buffer, which holds the next reply's bytes after it.
    async fn partly_written(front: bool) {
        use tokio::io::AsyncReadExt;
        let (mut client, socket, _r) = socket_pair().await;
        // The client reads nothing: the socket's buffers fill.
        let mut filler = 0usize;
        let chunk = vec![b'f'; 64 << 10];
        loop {
            match socket.try_write(&chunk) {
                Ok(n) => filler += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        let account = ReplyAccount::new(64 << 20);
        account.attach(socket.clone());
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        // Larger than the socket's buffers can ever hold.
        let frame: Bytes = (0..(16u32 << 20)).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
        // Room for some of it: half the filler read, and the socket
        // writable again (a write through makes no system call while
        // tokio holds it unwritable).
        let mut drained = vec![0u8; filler / 2];
        client.read_exact(&mut drained).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), socket.writable())
            .await
            .expect("the socket writable again")
            .unwrap();
        let (tx, mut p) = account.reserve();
        assert!(poll_offered(&mut p, &wakes, true).is_pending());
        if front {
            let mut buf = BytesMut::from(&frame[..]);
            buf.extend_from_slice(b"+NEXT\r\n");
            tx.send_front(&mut buf, frame.len(), &super::super::health::Health::new("s1".into(), 10, None));
            assert_eq!(&buf[..], b"+NEXT\r\n", "the reply's bytes taken, the next reply's left");
        } else {
            tx.send(Ok(Reply::Whole(frame.clone())));
        }
        assert_eq!(wakes.0.load(Relaxed), 1, "the writer is woken for the rest");
        let Poll::Ready(Ok(Delivered::Reply(Reply::Whole(rest)))) = poll_offered(&mut p, &wakes, true) else {
            panic!("the rest is not in the slot")
        };
        assert!(!rest.is_empty() && frame.ends_with(&rest));
        let sent = frame.len() - rest.len();
        assert!(sent > 0, "part of the reply was written through");
        // The writer writes the rest; the client reads the filler, then
        // the reply, whole.
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            drop(account.detach());
            let mut w = crate::conn::ClientWrite::Plain(socket);
            w.write_all(&rest).await.unwrap();
        });
        let mut all = vec![0u8; filler - drained.len() + frame.len()];
        client.read_exact(&mut all).await.unwrap();
        writer.await.unwrap();
        assert!(all[..filler - drained.len()].iter().all(|&b| b == b'f'));
        assert_eq!(&all[filler - drained.len()..], &frame[..], "{sent} bytes written through, the rest after");
    }

    /// A reply sent from a server connection's read buffer takes its own
    /// bytes from it, whatever becomes of it: written through (offered),
    /// held for the writer (not offered), dropped (abandoned), or an
    /// overflow (the account full).
    #[tokio::test]
    async fn a_reply_sent_from_a_read_buffer_takes_its_own_bytes_only() {
        use tokio::io::AsyncReadExt;
        let (mut client, socket, _r) = socket_pair().await;
        let account = ReplyAccount::new(16);
        account.attach(socket);
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let health = super::super::health::Health::new("s1".into(), 10, None);
        let mut buf = BytesMut::from(&b"$5\r\nhello\r\n+held\r\n+gone\r\n:1\r\n:2\r\n"[..]);

        let (tx, mut p) = account.reserve();
        assert!(poll_offered(&mut p, &wakes, true).is_pending());
        tx.send_front(&mut buf, 11, &health);
        assert_eq!(wakes.0.load(Relaxed), 0, "written through: no one woken");
        assert!(matches!(poll_offered(&mut p, &wakes, true), Poll::Ready(Ok(Delivered::Sent(11)))));
        let mut got = [0u8; 11];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"$5\r\nhello\r\n");

        let (tx, mut p) = account.reserve();
        assert!(poll_offered(&mut p, &wakes, false).is_pending());
        tx.send_front(&mut buf, 7, &health);
        assert_eq!(wakes.0.load(Relaxed), 1);
        assert_eq!(account.held(), 7, "held for the writer, on the account");
        let Poll::Ready(Ok(Delivered::Reply(r))) = poll_offered(&mut p, &wakes, false) else { panic!("no reply") };
        assert_eq!(whole(Ok(r)), "+held\r\n");

        let (tx, p) = account.reserve();
        drop(p);
        tx.send_front(&mut buf, 7, &health);
        assert_eq!(account.held(), 0, "abandoned: dropped");

        // Full (16 bytes held): an overflow, and the bytes still taken.
        let (big, mut held) = account.reserve();
        big.send(Ok(Reply::Whole(Bytes::from(vec![b'x'; 16]))));
        let (tx, mut p) = account.reserve();
        assert!(poll_offered(&mut p, &wakes, true).is_pending());
        tx.send_front(&mut buf, 4, &health);
        assert!(matches!(poll_offered(&mut p, &wakes, true), Poll::Ready(Err(BackendError::Overflow))));
        assert!(account.is_overflowed());
        assert_eq!(&buf[..], b":2\r\n", "each reply took its own bytes, no more");
        assert!(matches!(poll_offered(&mut held, &wakes, false), Poll::Ready(Ok(_))));
    }

    /// A reply written through is heard by its server's health at once
    /// (the client's writer may not look at it until its client sends
    /// more); one that waits in its slot is heard by the writer that takes
    /// it, as before.
    #[tokio::test]
    async fn a_reply_written_through_is_heard_by_its_servers_health_at_once() {
        use tokio::io::AsyncReadExt;
        let (mut client, socket, _r) = socket_pair().await;
        let account = ReplyAccount::new(1 << 20);
        account.attach(socket);
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let health = super::super::health::Health::new("s1".into(), 10, None);
        health.failed("earlier");
        health.failed("earlier");

        let (tx, mut p) = account.reserve();
        assert!(poll_offered(&mut p, &wakes, false).is_pending());
        tx.send_reply(Reply::Whole(Bytes::from_static(b"+held\r\n")), &health);
        assert_eq!(health.failures(), 2, "not heard where it waits for its writer");
        assert!(matches!(poll_offered(&mut p, &wakes, false), Poll::Ready(Ok(Delivered::Reply(_)))));

        let (tx, mut p) = account.reserve();
        assert!(poll_offered(&mut p, &wakes, true).is_pending());
        tx.send_reply(Reply::Whole(Bytes::from_static(b"+OK\r\n")), &health);
        assert_eq!(health.failures(), 0, "heard where it was written through");
        assert!(matches!(poll_offered(&mut p, &wakes, true), Poll::Ready(Ok(Delivered::Sent(5)))));
        let mut got = [0u8; 5];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"+OK\r\n");
    }
}
