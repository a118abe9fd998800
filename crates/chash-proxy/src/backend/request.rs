//! What travels between a client session and a server connection: a
//! request ([`Job`]) with its reply channel and deadline, who it is for
//! ([`Requester`], with its [`ReplyAccount`]), and why it got no reply
//! ([`BackendError`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;

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
#[derive(Debug)]
pub struct ReplyAccount {
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

    /// A reply arrives for this account's client: counted until the client
    /// takes it, or `None` (and the account overflows) when it already
    /// holds its limit.
    pub(super) fn deliver(self: &Arc<Self>, reply: Reply) -> Option<Delivered> {
        if self.held.load(Relaxed) >= self.limit {
            if !self.overflowed.swap(true, Relaxed) {
                self.notify.notify_waiters();
            }
            return None;
        }
        let counted = accounted(&reply);
        self.held.fetch_add(counted, Relaxed);
        Some(Delivered { reply, counted, account: self.clone() })
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

/// A reply sent towards its client, its bytes on the client's account
/// until the client takes it ([`Delivered::take`]) or until it is dropped
/// unread: a client that stopped waiting for it (the other parts of a
/// multi-server request failed first, its connection closed) must not keep
/// bytes on its account for ever, or its window would never open again.
pub(super) struct Delivered {
    reply: Reply,
    counted: usize,
    account: Arc<ReplyAccount>,
}

impl Delivered {
    /// The reply, off the account.
    pub(super) fn take(mut self) -> Reply {
        self.account.taken(std::mem::take(&mut self.counted));
        std::mem::replace(&mut self.reply, Reply::Whole(Bytes::new()))
    }
}

impl Drop for Delivered {
    fn drop(&mut self) {
        if self.counted > 0 {
            self.account.taken(self.counted);
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

/// Where a request's reply is sent.
pub(super) type ReplyTx = oneshot::Sender<Result<Delivered, BackendError>>;

/// One request on its way to a server.
pub(super) struct Job {
    pub data: Bytes,
    pub framing: &'static dyn Framing,
    /// How many of the framing's replies make up this request's reply (a
    /// transaction's commands, sent and answered together).
    pub frames: usize,
    pub reply: ReplyTx,
    pub account: Arc<ReplyAccount>,
    /// When it must have been answered (the pool's `timeout` from when it
    /// was submitted).
    pub deadline: Option<tokio::time::Instant>,
}
