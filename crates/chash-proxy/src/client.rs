//! Client connections: parse requests, send each to its server at once, and
//! write replies back in request order.
//!
//! The reader half parses requests and dispatches them immediately (so a
//! client's pipelined requests are all in flight together); each dispatch
//! yields a future of the reply bytes, queued in request order to the writer
//! half, which awaits them one by one. A reply can only ever go to the
//! connection whose request produced it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use crate::backend::{sleep_until_opt, BackendError, Server};
use crate::memcache::reply::ReplyStream;
use crate::memcache::request::skip_discarded;
use crate::memcache::{parse_request, values, Limits, Parsed, Reply, ReplyKind, Request, RetrievalCmd};
use crate::pool::Pool;
use crate::Shared;

/// A reply in the making: `None` means nothing is written (noreply).
pub(crate) type PendingReply = Pin<Box<dyn Future<Output = Option<Out>> + Send>>;

/// A reply ready to be written.
pub(crate) enum Out {
    /// All of it.
    Bytes(Bytes),
    /// A large reply arriving from its backend a chunk at a time.
    Stream(ReplyStream),
}

impl From<Bytes> for Out {
    fn from(b: Bytes) -> Out {
        Out::Bytes(b)
    }
}

/// A reply whose bytes come whole.
pub(crate) fn bytes_reply(f: impl Future<Output = Option<Bytes>> + Send + 'static) -> PendingReply {
    Box::pin(async move { f.await.map(Out::Bytes) })
}

pub(crate) fn ready(bytes: &'static [u8]) -> PendingReply {
    Box::pin(std::future::ready(Some(Out::Bytes(Bytes::from_static(bytes)))))
}

pub(crate) fn ready_owned(bytes: Bytes) -> PendingReply {
    Box::pin(std::future::ready(Some(Out::Bytes(bytes))))
}

/// A memcached backend's reply that does not fit the request.
const UNEXPECTED: &[u8] = b"SERVER_ERROR unexpected reply from the backend\r\n";

fn server_error(server: &Server, e: &BackendError) -> Bytes {
    Bytes::from(format!("SERVER_ERROR backend {} {e}\r\n", server.id()))
}

pub(crate) static NEXT_CLIENT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Requests a client may have outstanding before the proxy stops reading.
const MAX_PIPELINE: usize = 1024;

/// Serves one client connection until it closes, quits, idles out, or the
/// proxy shuts down (in-flight requests are answered first).
pub async fn serve<S>(stream: S, pool: Arc<Pool>, shared: Arc<Shared>, shutdown: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    // This connection's requests to a server all use one backend connection.
    let affinity = NEXT_CLIENT.fetch_add(1, Relaxed);
    let (r, w) = tokio::io::split(stream);
    let (tx, writer) = reply_writer(w);
    let reader = async move {
        let mut input = Input::new(r, shutdown, shared.options.client_idle_timeout);
        let mut buf = BytesMut::with_capacity(16 * 1024);
        let mut discard = 0usize;
        let limits = Limits { max_value: shared.options.max_value_size, lenient_keys: shared.options.lenient_keys };
        'conn: while input.read(&mut buf).await {
            loop {
                if !skip_discarded(&mut buf, &mut discard) {
                    continue 'conn;
                }
                match parse_request(&mut buf, limits) {
                    Parsed::Incomplete => break,
                    Parsed::Refused { reply, skip, close } => {
                        pool.stats.errors.fetch_add(1, Relaxed);
                        if tx.send(ready(reply)).await.is_err() {
                            break 'conn;
                        }
                        discard = skip;
                        if close {
                            break 'conn;
                        }
                    }
                    Parsed::Request(Request::Quit) => break 'conn,
                    Parsed::Request(req) => {
                        pool.stats.requests.fetch_add(1, Relaxed);
                        let reply = dispatch(&pool, &shared, req, affinity).await;
                        if tx.send(reply).await.is_err() {
                            break 'conn;
                        }
                    }
                }
            }
        }
        drop(tx);
    };
    tokio::join!(reader, writer);
}

/// How long a connection keeps reading once shutdown begins: requests its
/// client sent just before are still taken (and answered); then it stops
/// reading and answers what is in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(100);

/// A client connection's read side: more bytes until the client closes,
/// idles out ([`crate::ProxyOptions::client_idle_timeout`]) or the proxy
/// shuts down, after which it still reads for [`SHUTDOWN_GRACE`].
pub(crate) struct Input<R> {
    r: R,
    shutdown: watch::Receiver<bool>,
    idle: Option<Duration>,
    closing: Option<tokio::time::Instant>,
}

impl<R: AsyncRead + Unpin> Input<R> {
    pub(crate) fn new(r: R, shutdown: watch::Receiver<bool>, idle: Option<Duration>) -> Input<R> {
        Input { r, shutdown, idle, closing: None }
    }

    /// Reads more into `buf`; false when the connection is done reading.
    pub(crate) async fn read(&mut self, buf: &mut BytesMut) -> bool {
        loop {
            tokio::select! {
                n = self.r.read_buf(buf) => return matches!(n, Ok(k) if k > 0),
                _ = self.shutdown.changed(), if self.closing.is_none() => {
                    self.closing = Some(tokio::time::Instant::now() + SHUTDOWN_GRACE);
                }
                _ = sleep_until_opt(self.closing) => return false,
                _ = sleep_opt(self.idle) => return false,
            }
        }
    }
}

async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Polls a future once without a real waker: replies already available are
/// gathered into one write.
fn poll_now(f: &mut PendingReply) -> Poll<Option<Out>> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    f.as_mut().poll(&mut cx)
}

/// A connection's reply writer: replies queued on the sender are written in
/// order, and the future ends (shutting the write side) once the sender is
/// dropped. Run it joined with the connection's reader, in the same task: a
/// reply becoming ready then wakes that task directly, with no hand-off.
pub(crate) fn reply_writer<W: AsyncWrite + Unpin>(mut w: W) -> (mpsc::Sender<PendingReply>, impl Future<Output = ()>) {
    let (tx, rx) = mpsc::channel::<PendingReply>(MAX_PIPELINE);
    let writer = async move {
        let _ = write_replies(&mut w, rx).await;
        let _ = w.shutdown().await;
    };
    (tx, writer)
}

async fn write_replies<W: AsyncWrite + Unpin>(w: &mut W, mut rx: mpsc::Receiver<PendingReply>) -> std::io::Result<()> {
    let mut out = BytesMut::with_capacity(16 * 1024);
    loop {
        let mut next = match rx.try_recv() {
            Ok(p) => p,
            Err(mpsc::error::TryRecvError::Disconnected) => break,
            Err(mpsc::error::TryRecvError::Empty) => {
                if !out.is_empty() {
                    w.write_all(&out).await?;
                    out.clear();
                }
                match rx.recv().await {
                    Some(p) => p,
                    None => break,
                }
            }
        };
        let bytes = match poll_now(&mut next) {
            Poll::Ready(b) => b,
            Poll::Pending => {
                if !out.is_empty() {
                    w.write_all(&out).await?;
                    out.clear();
                }
                next.await
            }
        };
        match bytes {
            Some(Out::Bytes(b)) => out.extend_from_slice(&b),
            Some(Out::Stream(ReplyStream(mut chunks))) => {
                if !out.is_empty() {
                    w.write_all(&out).await?;
                    out.clear();
                }
                loop {
                    match chunks.recv().await {
                        Some(chunk) => {
                            w.write_all(&chunk.data).await?;
                            if chunk.last {
                                break;
                            }
                        }
                        // Part of a frame went out and the rest never will:
                        // the connection cannot go on.
                        None => return Err(std::io::Error::other("backend reply cut short")),
                    }
                }
            }
            None => {}
        }
        if out.len() >= 64 * 1024 {
            w.write_all(&out).await?;
            out.clear();
        }
    }
    if !out.is_empty() {
        w.write_all(&out).await?;
    }
    w.flush().await
}

/// Sends a request on its way and returns the future of its reply.
async fn dispatch(pool: &Arc<Pool>, shared: &Arc<Shared>, req: Request, affinity: usize) -> PendingReply {
    match req {
        Request::Retrieval { .. } => retrieval(pool, req, affinity).await,
        Request::Storage { .. } | Request::Delete { .. } | Request::Arith { .. } | Request::Touch { .. } => {
            if matches!(req, Request::Storage { .. }) {
                pool.stats.cmd_set.fetch_add(1, Relaxed);
            }
            single_key(pool, req, affinity).await
        }
        Request::FlushAll { noreply, .. } => flush_all(pool, &req, noreply, affinity).await,
        Request::Version => ready_owned(Bytes::from(format!("VERSION chash-proxy-{}\r\n", env!("CARGO_PKG_VERSION")))),
        Request::Verbosity { noreply: true } => Box::pin(std::future::ready(None)),
        Request::Verbosity { noreply: false } => ready(b"OK\r\n"),
        Request::Stats { group } => ready_owned(stats_reply(pool, shared, group.as_deref())),
        Request::Quit => Box::pin(std::future::ready(None)),
    }
}

async fn single_key(pool: &Arc<Pool>, req: Request, affinity: usize) -> PendingReply {
    let noreply = req.noreply();
    let Some(key) = req.single_key() else { return ready(b"ERROR\r\n") };
    let Some((server, load)) = pool.acquire(key) else {
        pool.stats.errors.fetch_add(1, Relaxed);
        return if noreply {
            Box::pin(std::future::ready(None))
        } else {
            ready(b"SERVER_ERROR no live server in pool\r\n")
        };
    };
    let mut data = BytesMut::new();
    req.encode(&mut data);
    let rx = server.submit(data.freeze(), ReplyKind::Line, affinity).await;
    let pool = pool.clone();
    Box::pin(async move {
        let result = server.finish(rx).await;
        drop(load);
        let bytes = match result {
            Ok(Reply::Line(line)) => line,
            Ok(Reply::Values(_) | Reply::Stream(_)) => {
                Bytes::from_static(b"SERVER_ERROR backend sent values to a non-retrieval command\r\n")
            }
            Err(e) => {
                pool.stats.errors.fetch_add(1, Relaxed);
                server_error(&server, &e)
            }
        };
        (!noreply).then_some(Out::Bytes(bytes))
    })
}

async fn retrieval(pool: &Arc<Pool>, req: Request, affinity: usize) -> PendingReply {
    let Request::Retrieval { cmd, exptime, keys } = req else { return ready(b"ERROR\r\n") };
    pool.stats.cmd_get.fetch_add(1, Relaxed);
    pool.stats.get_keys.fetch_add(keys.len() as u64, Relaxed);
    if keys.len() == 1 {
        return retrieval_one(pool, cmd, exptime, keys, affinity).await;
    }
    // Group the distinct keys by server, in first-seen order.
    let mut groups: Vec<(Arc<Server>, Vec<Bytes>)> = Vec::new();
    let mut loads = Vec::new();
    let mut seen: HashMap<&[u8], ()> = HashMap::new();
    for key in &keys {
        if seen.insert(&key[..], ()).is_some() {
            continue;
        }
        let Some((server, load)) = pool.acquire(key) else {
            pool.stats.errors.fetch_add(1, Relaxed);
            return ready(b"SERVER_ERROR no live server in pool\r\n");
        };
        loads.extend(load);
        match groups.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &server)) {
            Some((_, ks)) => ks.push(key.clone()),
            None => groups.push((server, vec![key.clone()])),
        }
    }
    let mut waits = Vec::with_capacity(groups.len());
    for (server, group_keys) in groups {
        let mut data = BytesMut::new();
        Request::Retrieval { cmd, exptime, keys: group_keys }.encode(&mut data);
        let rx = server.submit(data.freeze(), ReplyKind::Values, affinity).await;
        waits.push((server, rx));
    }
    let pool = pool.clone();
    bytes_reply(async move {
        let mut found: HashMap<Bytes, Bytes> = HashMap::new();
        let mut failure: Option<Bytes> = None;
        for (server, rx) in waits {
            match server.finish(rx).await {
                Ok(Reply::Values(raw)) => {
                    for v in values(&raw) {
                        found.entry(v.key).or_insert(v.raw);
                    }
                }
                Ok(Reply::Line(line)) => failure = failure.or(Some(line)),
                Ok(Reply::Stream(_)) => failure = failure.or(Some(Bytes::from_static(UNEXPECTED))),
                Err(e) => failure = failure.or_else(|| Some(server_error(&server, &e))),
            }
        }
        drop(loads);
        if let Some(f) = failure {
            pool.stats.errors.fetch_add(1, Relaxed);
            return Some(f);
        }
        let mut out = BytesMut::new();
        let mut hits = 0;
        for key in &keys {
            if let Some(raw) = found.get(key) {
                out.extend_from_slice(raw);
                hits += 1;
            }
        }
        pool.stats.get_hits.fetch_add(hits, Relaxed);
        out.extend_from_slice(b"END\r\n");
        Some(out.freeze())
    })
}

/// One key: one server, whose reply is forwarded as it came.
async fn retrieval_one(
    pool: &Arc<Pool>,
    cmd: RetrievalCmd,
    exptime: i64,
    keys: Vec<Bytes>,
    affinity: usize,
) -> PendingReply {
    let Some((server, load)) = pool.acquire(&keys[0]) else {
        pool.stats.errors.fetch_add(1, Relaxed);
        return ready(b"SERVER_ERROR no live server in pool\r\n");
    };
    let mut data = BytesMut::new();
    Request::Retrieval { cmd, exptime, keys }.encode(&mut data);
    let rx = server.submit(data.freeze(), ReplyKind::Values, affinity).await;
    let pool = pool.clone();
    Box::pin(async move {
        let result = server.finish(rx).await;
        drop(load);
        match result {
            Ok(Reply::Values(raw)) => {
                if raw.len() > 5 {
                    pool.stats.get_hits.fetch_add(1, Relaxed);
                }
                Some(Out::Bytes(raw))
            }
            Ok(Reply::Line(line)) => {
                pool.stats.errors.fetch_add(1, Relaxed);
                Some(Out::Bytes(line))
            }
            Ok(Reply::Stream(_)) => {
                pool.stats.errors.fetch_add(1, Relaxed);
                Some(Out::Bytes(Bytes::from_static(UNEXPECTED)))
            }
            Err(e) => {
                pool.stats.errors.fetch_add(1, Relaxed);
                Some(Out::Bytes(server_error(&server, &e)))
            }
        }
    })
}

async fn flush_all(pool: &Arc<Pool>, req: &Request, noreply: bool, affinity: usize) -> PendingReply {
    let servers: Vec<Arc<Server>> = pool.state().members.iter().map(|m| m.server.clone()).collect();
    let mut data = BytesMut::new();
    req.encode(&mut data);
    let data = data.freeze();
    let mut waits = Vec::new();
    for server in servers {
        let rx = server.submit(data.clone(), ReplyKind::Line, affinity).await;
        waits.push((server, rx));
    }
    bytes_reply(async move {
        let mut reply = Bytes::from_static(b"OK\r\n");
        for (server, rx) in waits {
            match server.finish(rx).await {
                Ok(Reply::Line(line)) if &line[..] == b"OK\r\n" => {}
                Ok(Reply::Line(line)) => reply = line,
                Ok(Reply::Values(_) | Reply::Stream(_)) => reply = Bytes::from_static(UNEXPECTED),
                Err(e) => reply = server_error(&server, &e),
            }
        }
        (!noreply).then_some(reply)
    })
}

/// The proxy's own counters in memcached's `stats` format.
fn stats_reply(pool: &Pool, shared: &Shared, group: Option<&[u8]>) -> Bytes {
    match group {
        None => {}
        Some(b"reset") => {
            // Counters here feed the admin endpoint too; they are not reset.
            return Bytes::from_static(b"RESET\r\n");
        }
        Some(b"settings") => {
            let o = &shared.options;
            return Bytes::from(format!(
                "STAT item_size_max {}\r\nSTAT idle_timeout {}\r\nEND\r\n",
                o.max_value_size,
                o.client_idle_timeout.map_or(0, |d| d.as_secs())
            ));
        }
        // Groups such as items and slabs describe a server's memory, which a
        // proxy does not have; unknown ones are errors, as in memcached.
        Some(_) => return Bytes::from_static(b"ERROR\r\n"),
    }
    let s = &pool.stats;
    let mut out = String::new();
    let mut stat = |name: &str, value: String| {
        out.push_str("STAT ");
        out.push_str(name);
        out.push(' ');
        out.push_str(&value);
        out.push_str("\r\n");
    };
    stat("pid", std::process::id().to_string());
    stat("uptime", shared.started.elapsed().as_secs().to_string());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    stat("time", now.to_string());
    stat("version", format!("chash-proxy-{}", env!("CARGO_PKG_VERSION")));
    stat("pool", pool.name.clone());
    stat("curr_connections", s.curr_connections.load(Relaxed).to_string());
    stat("total_connections", s.total_connections.load(Relaxed).to_string());
    stat("rejected_connections", s.rejected_connections.load(Relaxed).to_string());
    stat("cmd_get", s.cmd_get.load(Relaxed).to_string());
    stat("cmd_set", s.cmd_set.load(Relaxed).to_string());
    stat("get_keys", s.get_keys.load(Relaxed).to_string());
    stat("get_hits", s.get_hits.load(Relaxed).to_string());
    stat("get_misses", (s.get_keys.load(Relaxed).saturating_sub(s.get_hits.load(Relaxed))).to_string());
    stat("requests", s.requests.load(Relaxed).to_string());
    stat("errors", s.errors.load(Relaxed).to_string());
    let state = pool.state();
    stat("servers", state.members.len().to_string());
    stat("live_servers", state.live().count().to_string());
    out.push_str("END\r\n");
    Bytes::from(out)
}
