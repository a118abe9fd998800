//! Pub/sub through the proxy: one subscription per channel per server,
//! shared by every client of the pool that listens to it, its messages
//! fanned out to them.
//!
//! - A channel (and a shard channel) lives on the server its name is
//!   placed on, `hash_tag` included, so a `PUBLISH` through any proxy of a
//!   fleet reaches subscribers through any other. A pattern is subscribed
//!   on every server (a message is published on one, so it arrives once).
//! - Each server has a link: a connection of its own, outside the request
//!   queues, that holds the pool's subscriptions there; lost, it connects
//!   again and subscribes again.
//! - Each subscribed client has an [`Outbox`]: the frames waiting for it,
//!   bounded in bytes ([`OUTBOX_LIMIT`]); a client that lets more pile up
//!   is disconnected, as Redis's `client-output-buffer-limit pubsub` does.
//! - When the pool's servers change, a channel whose server changed is
//!   subscribed on its new server first and left on the old one only after
//!   [`MOVE_GRACE`], while proxies that have not applied the change yet
//!   may still publish there: no message is lost to a membership change.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, Notify};

use super::resp::{array_items, encode_array, parse_reply};
use crate::backend::{Chunk, Frame, ReplyStream, Server};
use crate::pool::Pool;

/// What a client subscribes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// `SUBSCRIBE`.
    Channel,
    /// `PSUBSCRIBE`.
    Pattern,
    /// `SSUBSCRIBE`.
    Shard,
}

impl Kind {
    fn command(self, on: bool) -> &'static [u8] {
        match (self, on) {
            (Kind::Channel, true) => b"SUBSCRIBE",
            (Kind::Pattern, true) => b"PSUBSCRIBE",
            (Kind::Shard, true) => b"SSUBSCRIBE",
            (Kind::Channel, false) => b"UNSUBSCRIBE",
            (Kind::Pattern, false) => b"PUNSUBSCRIBE",
            (Kind::Shard, false) => b"SUNSUBSCRIBE",
        }
    }

    /// The word of its confirmations (`subscribe`, `punsubscribe`, ...).
    pub(crate) fn word(self, on: bool) -> &'static [u8] {
        match (self, on) {
            (Kind::Channel, true) => b"subscribe",
            (Kind::Pattern, true) => b"psubscribe",
            (Kind::Shard, true) => b"ssubscribe",
            (Kind::Channel, false) => b"unsubscribe",
            (Kind::Pattern, false) => b"punsubscribe",
            (Kind::Shard, false) => b"sunsubscribe",
        }
    }
}

/// A kind and a name: what a subscription is to.
pub(crate) type Topic = (Kind, Bytes);

/// The most bytes of messages waiting for one client before it is
/// disconnected (Redis's default hard limit for pub/sub clients).
pub(crate) const OUTBOX_LIMIT: usize = 32 << 20;

/// How long a channel stays subscribed on its old server after the pool's
/// servers change (proxies of the fleet that have not applied the change
/// publish there meanwhile).
pub(crate) const MOVE_GRACE: Duration = Duration::from_secs(30);

/// How often the hub looks for a change of the pool's servers.
const WATCH_EVERY: Duration = Duration::from_millis(200);

const OPEN: u8 = 0;
const FINISHING: u8 = 1;
const KICKED: u8 = 2;

/// The frames waiting for one subscribed client, in order: confirmations,
/// messages, replies to its other commands. Written to the client as one
/// stream until it leaves the subscribed state.
pub(crate) struct Outbox {
    queue: Mutex<VecDeque<Bytes>>,
    bytes: AtomicUsize,
    notify: Notify,
    state: AtomicU8,
    /// The client speaks RESP3 (messages as push frames).
    resp3: std::sync::atomic::AtomicBool,
    pool: Arc<Pool>,
    account: Arc<crate::backend::ReplyAccount>,
}

impl Outbox {
    /// A client's outbox, and the stream its connection writes (cut when
    /// the client goes: `account`).
    pub(crate) fn start(
        pool: Arc<Pool>,
        resp3: bool,
        account: Arc<crate::backend::ReplyAccount>,
    ) -> (Arc<Outbox>, ReplyStream) {
        let outbox = Arc::new(Outbox {
            queue: Mutex::new(VecDeque::new()),
            bytes: AtomicUsize::new(0),
            notify: Notify::new(),
            state: AtomicU8::new(OPEN),
            resp3: std::sync::atomic::AtomicBool::new(resp3),
            pool,
            account: account.clone(),
        });
        let (tx, rx) = mpsc::channel(4);
        let forwarding = forward(outbox.clone(), tx);
        let finishing = outbox.clone();
        tokio::spawn(async move {
            tokio::pin!(forwarding);
            tokio::select! {
                () = &mut forwarding => {}
                // The client is gone: the stream is cut (the connection
                // ends, and with it its subscriptions), unless it is being
                // ended (QUIT's reply on its way).
                () = account.gone() => {
                    if finishing.state.load(Relaxed) == FINISHING {
                        let _ = tokio::time::timeout(Duration::from_secs(1), forwarding).await;
                    }
                }
            }
        });
        (outbox, ReplyStream(rx))
    }

    /// Queues a frame; `false` when the client is disconnected (now, for
    /// holding too much, or before).
    pub(crate) fn push(&self, frame: Bytes) -> bool {
        if self.state.load(Relaxed) == KICKED {
            return false;
        }
        let held = self.bytes.fetch_add(frame.len(), Relaxed) + frame.len();
        if held > OUTBOX_LIMIT {
            self.pool.counters().pubsub_slow_clients.fetch_add(1, Relaxed);
            tracing::warn!(
                pool = %self.pool.name(),
                "a pub/sub client holds {held} bytes of unread messages (limit {OUTBOX_LIMIT}): disconnected"
            );
            self.state.store(KICKED, Relaxed);
            self.notify.notify_one();
            // Its connection's writer, stuck on a client that does not
            // read, gives up too.
            self.account.overflow();
            self.queue.lock().unwrap_or_else(|e| e.into_inner()).clear();
            return false;
        }
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push_back(frame);
        self.notify.notify_one();
        true
    }

    /// Whether messages go to it as RESP3 push frames.
    pub(crate) fn resp3(&self) -> bool {
        self.resp3.load(Relaxed)
    }

    /// The client switched protocols (`HELLO`).
    pub(crate) fn set_resp3(&self, resp3: bool) {
        self.resp3.store(resp3, Relaxed);
    }

    /// Ends the stream once what is queued is written (the client left
    /// the subscribed state).
    pub(crate) fn finish(&self) {
        let _ = self.state.compare_exchange(OPEN, FINISHING, Relaxed, Relaxed);
        self.notify.notify_one();
    }
}

/// Moves an outbox's frames to its connection's stream, many small
/// messages in one chunk, until it finishes (the stream ends) or the
/// client is disconnected (the stream is cut, which closes the
/// connection).
async fn forward(outbox: Arc<Outbox>, tx: mpsc::Sender<Chunk>) {
    loop {
        let notified = outbox.notify.notified();
        if outbox.state.load(Relaxed) == KICKED {
            return;
        }
        let batch = {
            let mut queue = outbox.queue.lock().unwrap_or_else(|e| e.into_inner());
            let mut batch = BytesMut::new();
            while let Some(frame) = queue.pop_front() {
                batch.extend_from_slice(&frame);
                if batch.len() >= 64 * 1024 {
                    break;
                }
            }
            batch.freeze()
        };
        if batch.is_empty() {
            if outbox.state.load(Relaxed) == FINISHING {
                let _ = tx.send(Chunk { data: Bytes::new(), last: true }).await;
                return;
            }
            notified.await;
            continue;
        }
        let n = batch.len();
        if tx.send(Chunk { data: batch, last: false }).await.is_err() {
            return;
        }
        outbox.bytes.fetch_sub(n, Relaxed);
    }
}

/// What a link is asked to do.
enum LinkCmd {
    /// Subscribe (the ack once the server confirmed).
    On(Topic, Option<oneshot::Sender<()>>),
    Off(Topic),
}

/// A server's link: its task's queue and what it holds.
struct Link {
    tx: mpsc::UnboundedSender<LinkCmd>,
}

/// The pool's subscriptions and who listens to them.
pub(crate) struct Hub {
    pool: Weak<Pool>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    /// Who listens to each topic (a client's id and outbox).
    listeners: HashMap<Topic, Vec<(u64, Arc<Outbox>)>>,
    /// Clients about to listen (subscribed on the servers, not confirmed
    /// to the client yet): they keep the subscription.
    reserved: HashMap<Topic, usize>,
    /// The servers each topic is subscribed on (by id).
    placed: HashMap<Topic, Vec<String>>,
    /// Each server's link.
    links: HashMap<String, Link>,
    /// The membership the placement was made under.
    version: String,
}

impl Hub {
    /// The pool's hub (made, with its watcher, when first asked for).
    pub(crate) fn of(pool: &Arc<Pool>) -> Option<Arc<Hub>> {
        pool.extension(|pool| {
            let hub = Arc::new(Hub { pool: Arc::downgrade(pool), inner: Mutex::new(Inner::default()) });
            hub.inner().version = membership(pool);
            tokio::spawn(watch(Arc::downgrade(&hub)));
            hub
        })
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new client id.
    pub(crate) fn client_id(&self) -> u64 {
        let mut inner = self.inner();
        inner.next_id += 1;
        inner.next_id
    }

    /// Subscribes the pool to `topic` on its servers (if it is not yet)
    /// and holds it for a client about to listen; the receivers resolve
    /// once each server confirmed. `Err`: no live server.
    pub(crate) fn reserve(&self, topic: &Topic) -> Result<Vec<oneshot::Receiver<()>>, String> {
        let pool = self.pool.upgrade().ok_or("the pool is gone")?;
        let mut inner = self.inner();
        *inner.reserved.entry(topic.clone()).or_default() += 1;
        let servers = match inner.placed.get(topic) {
            Some(ids) => ids.iter().filter_map(|id| server_by_id(&pool, id)).collect(),
            None => servers_for(&pool, topic),
        };
        if servers.is_empty() {
            release_reserved(&mut inner, topic);
            return Err("no live server in pool".into());
        }
        inner.placed.insert(topic.clone(), servers.iter().map(|s| s.id().to_owned()).collect());
        let mut acks = Vec::new();
        for server in servers {
            let (ack, done) = oneshot::channel();
            link(&mut inner, &server, self).tx.send(LinkCmd::On(topic.clone(), Some(ack))).ok();
            acks.push(done);
        }
        Ok(acks)
    }

    /// The reserved client listens from now on; `confirm` (its
    /// confirmation) is queued first, so that no message for `topic` comes
    /// before it.
    pub(crate) fn join(&self, topic: &Topic, id: u64, outbox: &Arc<Outbox>, confirm: Bytes) {
        let mut inner = self.inner();
        release_reserved(&mut inner, topic);
        outbox.push(confirm);
        inner.listeners.entry(topic.clone()).or_default().push((id, outbox.clone()));
    }

    /// A reservation given up (the servers did not confirm).
    pub(crate) fn unreserve(&self, topic: &Topic) {
        let mut inner = self.inner();
        release_reserved(&mut inner, topic);
        self.drop_if_unused(&mut inner, topic);
    }

    /// Client `id` stops listening to `topics`.
    pub(crate) fn leave(&self, id: u64, topics: &[Topic]) {
        let mut inner = self.inner();
        for topic in topics {
            if let Some(list) = inner.listeners.get_mut(topic) {
                list.retain(|(i, _)| *i != id);
                if list.is_empty() {
                    inner.listeners.remove(topic);
                }
            }
            self.drop_if_unused(&mut inner, topic);
        }
    }

    /// Unsubscribes the servers from a topic nobody listens to.
    fn drop_if_unused(&self, inner: &mut Inner, topic: &Topic) {
        if inner.listeners.contains_key(topic) || inner.reserved.contains_key(topic) {
            return;
        }
        for id in inner.placed.remove(topic).unwrap_or_default() {
            if let Some(link) = inner.links.get(&id) {
                let _ = link.tx.send(LinkCmd::Off(topic.clone()));
            }
        }
    }

    /// A message from a server, to everyone listening to `topic`.
    fn deliver(&self, topic: &Topic, frame: &Bytes) {
        let mut inner = self.inner();
        let Some(list) = inner.listeners.get_mut(topic) else { return };
        let mut push = None;
        let mut gone = false;
        for (_, outbox) in list.iter() {
            let bytes = if outbox.resp3() {
                push.get_or_insert_with(|| {
                    let mut b = BytesMut::from(&frame[..]);
                    b[0] = b'>';
                    b.freeze()
                })
                .clone()
            } else {
                frame.clone()
            };
            gone |= !outbox.push(bytes);
        }
        if gone {
            list.retain(|(_, o)| o.state.load(Relaxed) != KICKED);
        }
    }

    /// Moves subscriptions to the servers the pool's new membership
    /// places them on, leaving the old ones after [`MOVE_GRACE`].
    fn rebalance(self: &Arc<Self>, pool: &Arc<Pool>) {
        let mut inner = self.inner();
        let version = membership(pool);
        if inner.version == version {
            return;
        }
        inner.version = version;
        let topics: Vec<Topic> = inner.placed.keys().cloned().collect();
        let mut leave_later: Vec<(String, Topic)> = Vec::new();
        for topic in topics {
            let now = servers_for(pool, &topic);
            if now.is_empty() {
                continue;
            }
            let was = inner.placed.get(&topic).cloned().unwrap_or_default();
            for server in &now {
                if !was.iter().any(|id| id == server.id()) {
                    link(&mut inner, server, self).tx.send(LinkCmd::On(topic.clone(), None)).ok();
                }
            }
            for id in &was {
                if !now.iter().any(|s| s.id() == id) {
                    leave_later.push((id.clone(), topic.clone()));
                }
            }
            inner.placed.insert(topic, now.iter().map(|s| s.id().to_owned()).collect());
        }
        if !leave_later.is_empty() {
            pool.counters().pubsub_moves.fetch_add(leave_later.len() as u64, Relaxed);
            tracing::info!(
                pool = %pool.name(),
                "pub/sub: {} subscriptions follow their channels to new servers (the old ones kept {} s)",
                leave_later.len(),
                MOVE_GRACE.as_secs()
            );
            let hub = Arc::downgrade(self);
            tokio::spawn(async move {
                tokio::time::sleep(MOVE_GRACE).await;
                let Some(hub) = hub.upgrade() else { return };
                let inner = hub.inner();
                for (id, topic) in leave_later {
                    // Unless the topic came back to that server meanwhile.
                    let back = inner.placed.get(&topic).is_some_and(|ids| ids.contains(&id));
                    if let (false, Some(link)) = (back, inner.links.get(&id)) {
                        let _ = link.tx.send(LinkCmd::Off(topic));
                    }
                }
            });
        }
    }
}

fn release_reserved(inner: &mut Inner, topic: &Topic) {
    if let Some(n) = inner.reserved.get_mut(topic) {
        *n -= 1;
        if *n == 0 {
            inner.reserved.remove(topic);
        }
    }
}

/// The pool's membership as far as subscriptions care: its version and
/// live servers.
fn membership(pool: &Pool) -> String {
    let state = pool.state();
    let mut text = state.version.clone();
    for m in state.live() {
        text.push(' ');
        text.push_str(&m.line.id);
    }
    text
}

/// Where `topic` is subscribed: a channel's server, or every live server
/// for a pattern.
fn servers_for(pool: &Pool, topic: &Topic) -> Vec<Arc<Server>> {
    let state = pool.state();
    match topic.0 {
        Kind::Pattern => state.live().map(|m| m.server.clone()).collect(),
        Kind::Channel | Kind::Shard => state.server_for(&topic.1).cloned().into_iter().collect(),
    }
}

fn server_by_id(pool: &Pool, id: &str) -> Option<Arc<Server>> {
    pool.state().members.iter().find(|m| m.server.id() == id).map(|m| m.server.clone())
}

/// The link to `server`, started if there is none.
fn link<'a>(inner: &'a mut Inner, server: &Arc<Server>, hub: &Hub) -> &'a Link {
    inner.links.entry(server.id().to_owned()).or_insert_with(|| {
        let (tx, rx) = mpsc::unbounded_channel();
        let pool = hub.pool.clone();
        tokio::spawn(run_link(server.clone(), pool, rx));
        Link { tx }
    })
}

/// Looks for membership changes while the hub lives.
async fn watch(hub: Weak<Hub>) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        let Some(hub) = hub.upgrade() else { return };
        let Some(pool) = hub.pool.upgrade() else { return };
        hub.rebalance(&pool);
    }
}

/// Holds a server's subscriptions on a connection of its own, passing its
/// messages to the hub, connecting again when it is lost.
async fn run_link(server: Arc<Server>, pool: Weak<Pool>, mut rx: mpsc::UnboundedReceiver<LinkCmd>) {
    let mut wanted: HashSet<Topic> = HashSet::new();
    let mut waiting: HashMap<Topic, Vec<oneshot::Sender<()>>> = HashMap::new();
    let mut backoff = Duration::from_millis(50);
    loop {
        let opened = tokio::select! {
            biased;
            cmd = rx.recv() => {
                match cmd {
                    None => return,
                    Some(cmd) => note(cmd, &mut wanted, &mut waiting, None),
                }
                continue;
            }
            opened = server.connect_raw(0) => opened,
        };
        let (mut r, mut w) = match opened {
            Ok(rw) => rw,
            Err(e) => {
                tracing::warn!(server = %server.id(), "pub/sub link: cannot connect: {e}; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        let mut out = BytesMut::new();
        for topic in &wanted {
            encode_array(&mut out, [topic.0.command(true), &topic.1[..]].into_iter());
        }
        if w.write_all(&out).await.is_err() {
            continue;
        }
        let mut active: HashSet<Topic> = HashSet::new();
        let mut buf = BytesMut::with_capacity(16 * 1024);
        'conn: loop {
            tokio::select! {
                cmd = rx.recv() => {
                    let Some(cmd) = cmd else { return };
                    let mut out = BytesMut::new();
                    note(cmd, &mut wanted, &mut waiting, Some((&mut active, &mut out)));
                    if !out.is_empty() && w.write_all(&out).await.is_err() {
                        break 'conn;
                    }
                }
                n = r.read_buf(&mut buf) => {
                    if !matches!(n, Ok(n) if n > 0) {
                        break 'conn;
                    }
                    loop {
                        match parse_reply(&mut buf) {
                            Frame::Done(frame) => {
                                let Some(pool) = pool.upgrade() else { return };
                                on_frame(&pool, &frame, &mut active, &mut waiting);
                            }
                            Frame::Incomplete => break,
                            Frame::Invalid(e) => {
                                tracing::warn!(server = %server.id(), "pub/sub link: bad frame: {e}");
                                break 'conn;
                            }
                        }
                    }
                    if buf.capacity() - buf.len() < 4096 {
                        buf.reserve(16 * 1024);
                    }
                }
            }
        }
        tracing::warn!(server = %server.id(), "pub/sub link lost: connecting again, subscriptions follow");
        if let Some(pool) = pool.upgrade() {
            pool.counters().pubsub_link_losses.fetch_add(1, Relaxed);
        }
    }
}

/// A command to a link: what it wants changes; with a connection, the
/// (un)subscription is written to `out` (`active`: what the server
/// confirmed).
fn note(
    cmd: LinkCmd,
    wanted: &mut HashSet<Topic>,
    waiting: &mut HashMap<Topic, Vec<oneshot::Sender<()>>>,
    conn: Option<(&mut HashSet<Topic>, &mut BytesMut)>,
) {
    match cmd {
        LinkCmd::On(topic, ack) => {
            let active = conn.as_ref().is_some_and(|(a, _)| a.contains(&topic));
            match ack {
                Some(ack) if active => {
                    let _ = ack.send(());
                }
                Some(ack) => waiting.entry(topic.clone()).or_default().push(ack),
                None => {}
            }
            if wanted.insert(topic.clone()) {
                if let Some((_, out)) = conn {
                    encode_array(out, [topic.0.command(true), &topic.1[..]].into_iter());
                }
            }
        }
        LinkCmd::Off(topic) => {
            if wanted.remove(&topic) {
                if let Some((active, out)) = conn {
                    active.remove(&topic);
                    encode_array(out, [topic.0.command(false), &topic.1[..]].into_iter());
                }
            }
        }
    }
}

/// The text of a bulk string frame.
fn text(frame: &[u8]) -> Option<Bytes> {
    let nl = frame.iter().position(|&b| b == b'\n')?;
    (frame.first() == Some(&b'$')).then(|| Bytes::copy_from_slice(frame.get(nl + 1..frame.len() - 2).unwrap_or(&[])))
}

/// A frame from a link's server: a confirmation (acks its waiters) or a
/// message (delivered).
fn on_frame(
    pool: &Arc<Pool>,
    frame: &Bytes,
    active: &mut HashSet<Topic>,
    waiting: &mut HashMap<Topic, Vec<oneshot::Sender<()>>>,
) {
    let Some(items) = array_items(frame) else { return };
    let Some(word) = items.first().and_then(|i| text(i)) else { return };
    let kind = |w: &[u8]| match w {
        b"subscribe" | b"message" => Some(Kind::Channel),
        b"psubscribe" | b"pmessage" => Some(Kind::Pattern),
        b"ssubscribe" | b"smessage" => Some(Kind::Shard),
        _ => None,
    };
    let Some(k) = kind(&word) else { return };
    let Some(name) = items.get(1).and_then(|i| text(i)) else { return };
    let topic = (k, name);
    if word.ends_with(b"subscribe") {
        active.insert(topic.clone());
        for ack in waiting.remove(&topic).unwrap_or_default() {
            let _ = ack.send(());
        }
        return;
    }
    pool.counters().pubsub_messages.fetch_add(1, Relaxed);
    if let Some(hub) = Hub::of(pool) {
        hub.deliver(&topic, frame);
    }
}

/// A subscribed client: its outbox and what it listens to.
pub(crate) struct Subscribed {
    pub(super) hub: Arc<Hub>,
    pub(super) outbox: Arc<Outbox>,
    pub(super) id: u64,
    /// In subscription order.
    pub(super) topics: Vec<Topic>,
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        self.hub.leave(self.id, &self.topics);
    }
}

impl Subscribed {
    /// Redis's count in confirmations: channels and patterns together,
    /// shard channels apart.
    pub(super) fn count(&self, kind: Kind) -> usize {
        let shard = kind == Kind::Shard;
        self.topics.iter().filter(|t| (t.0 == Kind::Shard) == shard).count()
    }
}

/// The (un)subscription commands and their kinds.
pub(crate) fn pubsub_kind(name: &str) -> Option<(Kind, bool)> {
    Some(match name {
        "SUBSCRIBE" => (Kind::Channel, true),
        "PSUBSCRIBE" => (Kind::Pattern, true),
        "SSUBSCRIBE" => (Kind::Shard, true),
        "UNSUBSCRIBE" => (Kind::Channel, false),
        "PUNSUBSCRIBE" => (Kind::Pattern, false),
        "SUNSUBSCRIBE" => (Kind::Shard, false),
        _ => return None,
    })
}
