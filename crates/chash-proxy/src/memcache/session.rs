//! A memcached client connection: requests parsed from its bytes, each sent
//! to its server at once; a multi-key get split by server and its reply
//! reassembled in the client's key order; a get line of any length taken a
//! segment at a time.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};

use super::errors::TOO_LARGE;
use super::meta::{MetaCmd, MetaRequest};
use super::reply::{has_values, is_values, values, ValuesScan, LINE, META, META_TO_MN, VALUES, VALUES_STREAMED};
use super::request::{parse_more_keys, skip_discarded};
use super::warmup::{self, Invalidation};
use super::{parse_request, Limits, Parsed, Request, RetrievalCmd};
use crate::backend::{BackendError, Chunk, Reply, ReplyStream, Requester, Scan as _, Server};
use crate::conn::{bytes_reply, nothing, ready, ready_owned, Out, PendingReply, Session, Step};
use crate::options::Shared;
use crate::pool::Pool;

/// A server's reply that does not fit the request.
const UNEXPECTED: &[u8] = b"SERVER_ERROR unexpected reply from the server\r\n";

const NO_SERVER: &[u8] = b"SERVER_ERROR no live server in pool\r\n";

fn server_error(server: &Server, e: &BackendError) -> Bytes {
    Bytes::from(format!("SERVER_ERROR backend {} {e}\r\n", server.id()))
}

/// One memcached client connection's state.
pub(crate) struct MemcacheSession {
    pool: Arc<Pool>,
    shared: Arc<Shared>,
    requester: Requester,
    limits: Limits,
    /// Bytes of a refused data block still to drop.
    discard: usize,
    /// Drop input up to the next `\n` (the rest of a refused get line).
    skip_line: bool,
    /// A get line being taken in segments.
    continuing: Option<(RetrievalCmd, i64)>,
}

impl MemcacheSession {
    pub(crate) fn new(pool: Arc<Pool>, shared: Arc<Shared>, requester: Requester) -> MemcacheSession {
        let o = &shared.options;
        let limits = Limits { max_value: o.max_value(super::request::DEFAULT_MAX_VALUE), lenient_keys: o.lenient_keys };
        MemcacheSession { pool, shared, requester, limits, discard: 0, skip_line: false, continuing: None }
    }

    /// The requester, for a reply future's further requests, while a
    /// warm-up window is open: reads that miss try the key's previous
    /// servers, writes delete it there.
    fn warming(&self) -> Option<Requester> {
        self.pool.warming().then(|| self.requester.clone())
    }

    /// The requester, for a reply future's further requests, when the pool
    /// sends a request its server could not take to the key's next server
    /// (`failover: next`, replicas).
    fn failing_over(&self) -> Option<Requester> {
        self.pool.fails_over().then(|| self.requester.clone())
    }

    fn refused(&self, reply: &'static [u8]) -> PendingReply {
        self.pool.counters().errors.fetch_add(1, Relaxed);
        ready(reply)
    }
}

impl Session for MemcacheSession {
    async fn next(&mut self, buf: &mut BytesMut) -> Step {
        if self.skip_line {
            match memchr::memchr(b'\n', buf) {
                Some(nl) => {
                    buf.advance(nl + 1);
                    self.skip_line = false;
                }
                None => {
                    buf.clear();
                    return Step::More;
                }
            }
        }
        if !skip_discarded(buf, &mut self.discard) {
            return Step::More;
        }
        let continuing = self.continuing.take();
        let parsed = match continuing {
            Some((cmd, exptime)) => parse_more_keys(buf, cmd, exptime, self.limits),
            None => parse_request(buf, self.limits),
        };
        match parsed {
            Parsed::Incomplete => {
                self.continuing = continuing;
                Step::More
            }
            Parsed::Refused { reply, skip, close } => {
                self.discard = skip;
                if close && reply.is_empty() {
                    // An HTTP request line: nothing after it is read.
                    self.pool.counters().http_refused.fetch_add(1, Relaxed);
                    tracing::warn!(
                        pool = %self.pool.name(),
                        client = self.requester.affinity,
                        "possible security attack: an HTTP request on a memcached pool (a browser, or a request forgery aimed at the cache); connection closed"
                    );
                    return Step::Close { reply: None, error: true };
                }
                let reply = self.refused(reply);
                if close {
                    Step::Close { reply: Some(reply), error: true }
                } else {
                    Step::Reply(reply)
                }
            }
            Parsed::TooLarge { delete, skip, noreply } => {
                // The key's old value goes (memcached's rule: a failed
                // store leaves nothing stale), on its replicas too, then
                // the refusal.
                self.discard = skip;
                self.pool.counters().errors.fetch_add(1, Relaxed);
                let deleted = match delete {
                    Request::Meta(m) => self.meta(m).await,
                    delete => self.single_key(delete).await,
                };
                Step::Reply(Box::pin(async move {
                    let _ = deleted.await;
                    (!noreply).then(|| crate::conn::Out::Bytes(Bytes::from_static(TOO_LARGE)))
                }))
            }
            Parsed::RefusedLine { reply } => {
                self.skip_line = true;
                Step::Reply(self.refused(reply))
            }
            Parsed::Partial(Request::Retrieval { cmd, exptime, keys }) => {
                self.continuing = Some((cmd, exptime));
                if continuing.is_none() {
                    self.count_retrieval();
                }
                Step::Reply(self.retrieval(cmd, exptime, keys, false).await)
            }
            Parsed::Partial(_) => Step::Reply(ready(b"ERROR\r\n")),
            Parsed::Request(Request::Quit) => Step::Close { reply: None, error: false },
            Parsed::Request(Request::Retrieval { cmd, exptime, keys }) if continuing.is_some() => {
                // The last segment of a long get line.
                Step::Reply(self.retrieval(cmd, exptime, keys, true).await)
            }
            Parsed::Request(req) => Step::Reply(self.dispatch(req).await),
        }
    }
}

impl MemcacheSession {
    fn count_retrieval(&self) {
        let c = self.pool.counters();
        c.requests.fetch_add(1, Relaxed);
        c.cmd_get.fetch_add(1, Relaxed);
    }

    /// Sends a request on its way and returns the future of its reply.
    async fn dispatch(&mut self, req: Request) -> PendingReply {
        if !matches!(req, Request::Retrieval { .. }) {
            self.pool.counters().requests.fetch_add(1, Relaxed);
        }
        match req {
            Request::Retrieval { cmd, exptime, keys } => {
                self.count_retrieval();
                if keys.len() == 1 {
                    self.retrieval_one(cmd, exptime, keys).await
                } else {
                    self.retrieval(cmd, exptime, keys, true).await
                }
            }
            Request::Storage { .. } | Request::Delete { .. } | Request::Arith { .. } | Request::Touch { .. } => {
                if matches!(req, Request::Storage { .. }) {
                    self.pool.counters().cmd_set.fetch_add(1, Relaxed);
                }
                self.single_key(req).await
            }
            Request::FlushAll { noreply, .. } => self.flush_all(&req, noreply).await,
            Request::Version => ready_owned(Bytes::from(format!(
                "VERSION {}-chash-proxy-{}\r\n",
                super::MEMCACHED_VERSION,
                env!("CARGO_PKG_VERSION")
            ))),
            Request::Verbosity { noreply: true } => nothing(),
            Request::Verbosity { noreply: false } => ready(b"OK\r\n"),
            Request::Stats { group } => ready_owned(stats_reply(&self.pool, &self.shared, group.as_deref())),
            Request::Quit => nothing(),
            Request::Meta(m) => self.meta(m).await,
        }
    }

    /// A meta command: to its key's server with its flags as sent, except
    /// `q`: the server is asked for every reply (so replies stay matched to
    /// requests) and the ones `q` leaves out are dropped here, as memcached
    /// would have left them out. `ma` with `q` and `N` goes with `q` and an
    /// `mn` (the server alone knows whether it created the key, a reply `q`
    /// keeps). `mn` is answered here, after everything before it.
    async fn meta(&self, m: MetaRequest) -> PendingReply {
        let c = self.pool.counters();
        c.cmd_meta.fetch_add(1, Relaxed);
        match m.cmd {
            MetaCmd::Noop => return ready(b"MN\r\n"),
            MetaCmd::Get => {
                c.cmd_get.fetch_add(1, Relaxed);
                c.get_keys.fetch_add(1, Relaxed);
            }
            MetaCmd::Set => {
                c.cmd_set.fetch_add(1, Relaxed);
            }
            _ => {}
        }
        let Some((server, load)) = self.pool.acquire(&m.real_key) else {
            self.forward_error();
            return ready(NO_SERVER);
        };
        let to_mn = m.cmd == MetaCmd::Arith && m.quiet && m.has(b'N');
        let mut data = BytesMut::new();
        m.encode(&mut data, to_mn);
        if to_mn {
            data.extend_from_slice(b"mn\r\n");
        }
        let framing = if to_mn { META_TO_MN } else { META };
        let warm = self.warming();
        let data = data.freeze();
        let invalidation = match (&warm, m.cmd) {
            (Some(r), MetaCmd::Set | MetaCmd::Delete | MetaCmd::Arith) => {
                Invalidation::start(&self.pool, r, &server, &m.real_key).await
            }
            _ => None,
        };
        let writes = matches!(m.cmd, MetaCmd::Set | MetaCmd::Delete | MetaCmd::Arith);
        if writes && self.pool.replicas() > 1 && !to_mn && !m.quiet {
            return self.replicated(&m.real_key, data, META, false).await;
        }
        let failover = self.failing_over().map(|r| (r, m.real_key.clone()));
        // Kept for sending again only when that can happen (a clone costs).
        let again = if warm.is_some() || failover.is_some() { data.clone() } else { Bytes::new() };
        let pending = server.submit(data, framing, &self.requester).await;
        let pool = self.pool.clone();
        if warm.is_none() && failover.is_none() && invalidation.is_none() {
            // The common case, in a future of its own: small to move.
            return Box::pin(async move {
                let result = server.finish(pending).await;
                drop(load);
                meta_reply(&pool, &server, result, &m, to_mn)
            });
        }
        Box::pin(async move {
            let mut result = server.finish(pending).await;
            drop(load);
            if let Some(i) = invalidation {
                Box::pin(i.finish()).await;
            }
            let mut server = server;
            if let (Some((r, key)), Err(_)) = (&failover, &result) {
                let read = !writes;
                (server, result) =
                    Box::pin(elsewhere(&pool, r, key, server, again.clone(), framing, read, result)).await;
            }
            if let (Some(r), MetaCmd::Get, Ok(Reply::Whole(reply))) = (&warm, m.cmd, &result) {
                if reply.starts_with(b"EN") && Box::pin(warmup::fill(&pool, r, &server, &m.real_key)).await {
                    result = server.finish(server.submit(again.clone(), framing, r).await).await;
                }
            }
            if let (Some((r, key)), MetaCmd::Get, Ok(Reply::Whole(reply))) = (&failover, m.cmd, &result) {
                if pool.replicas() > 1 && reply.starts_with(b"EN") {
                    let hit = |r: &[u8]| r.starts_with(b"VA ") || r.starts_with(b"HD");
                    if let Some(found) = Box::pin(other_replicas(&pool, r, key, &server, again, framing, hit)).await {
                        result = Ok(Reply::Whole(found));
                    }
                }
            }
            meta_reply(&pool, &server, result, &m, to_mn)
        })
    }

    /// Counts a request answered with an error the proxy made up.
    fn forward_error(&self) {
        let c = self.pool.counters();
        c.errors.fetch_add(1, Relaxed);
        c.forward_errors.fetch_add(1, Relaxed);
    }

    async fn single_key(&self, req: Request) -> PendingReply {
        let noreply = req.noreply();
        let Some(key) = req.single_key() else { return ready(b"ERROR\r\n") };
        let Some((server, load)) = self.pool.acquire(key) else {
            self.forward_error();
            return if noreply { nothing() } else { ready(NO_SERVER) };
        };
        let mut data = BytesMut::new();
        req.encode(&mut data);
        let data = data.freeze();
        if self.pool.replicas() > 1 {
            return self.replicated(key, data, LINE, noreply).await;
        }
        let invalidation = match self.warming() {
            Some(r) => Invalidation::start(&self.pool, &r, &server, key).await,
            None => None,
        };
        let failover = self.failing_over().map(|r| (r, Bytes::copy_from_slice(key), data.clone()));
        let pending = server.submit(data, LINE, &self.requester).await;
        let pool = self.pool.clone();
        if invalidation.is_none() && failover.is_none() {
            // The common case, in a future of its own: small to move.
            return Box::pin(async move {
                let result = server.finish(pending).await;
                drop(load);
                (!noreply).then(|| crate::conn::Out::Bytes(line_reply(&pool, &server, result, noreply)))
            });
        }
        Box::pin(async move {
            let mut result = server.finish(pending).await;
            drop(load);
            if let Some(i) = invalidation {
                Box::pin(i.finish()).await;
            }
            let mut server = server;
            if let (Some((r, key, data)), Err(_)) = (failover, &result) {
                (server, result) = Box::pin(elsewhere(&pool, &r, &key, server, data, LINE, false, result)).await;
            }
            (!noreply).then(|| crate::conn::Out::Bytes(line_reply(&pool, &server, result, noreply)))
        })
    }

    /// A write of a replicated pool: to the key's first `replicas`
    /// candidates at once; the client gets the first one's reply that came
    /// (in candidate order), and a replica that fails is counted and logged.
    async fn replicated(
        &self,
        key: &[u8],
        data: Bytes,
        framing: &'static dyn crate::backend::Framing,
        noreply: bool,
    ) -> PendingReply {
        let servers = self.pool.replicas_for(key);
        let mut waits = Vec::with_capacity(servers.len());
        for server in servers {
            let pending = server.submit(data.clone(), framing, &self.requester).await;
            waits.push((server, pending));
        }
        let pool = self.pool.clone();
        Box::pin(async move {
            let reply = gather_replicas(&pool, waits).await;
            (!noreply).then_some(crate::conn::Out::Bytes(reply))
        })
    }

    /// One key: one server, whose reply is forwarded as it came.
    async fn retrieval_one(&self, cmd: RetrievalCmd, exptime: i64, keys: Vec<Bytes>) -> PendingReply {
        self.pool.counters().get_keys.fetch_add(1, Relaxed);
        let Some((server, load)) = self.pool.acquire(&keys[0]) else {
            self.forward_error();
            return ready(NO_SERVER);
        };
        let warm = self.warming().map(|r| (r, keys[0].clone()));
        let failover = self.failing_over().map(|r| (r, keys[0].clone()));
        let mut data = BytesMut::new();
        Request::Retrieval { cmd, exptime, keys }.encode(&mut data);
        let data = data.freeze();
        if warm.is_none() && failover.is_none() {
            // The common case, in a future of its own: small to move.
            let pending = server.submit(data, VALUES, &self.requester).await;
            let pool = self.pool.clone();
            return bytes_reply(async move {
                let result = server.finish(pending).await;
                drop(load);
                Some(retrieval_reply(&pool, &server, result))
            });
        }
        // Kept for sending again only when that can happen (a clone costs).
        let again = if warm.is_some() || failover.is_some() { data.clone() } else { Bytes::new() };
        let pending = server.submit(data, VALUES, &self.requester).await;
        let pool = self.pool.clone();
        bytes_reply(async move {
            let mut result = server.finish(pending).await;
            drop(load);
            let mut server = server;
            if let (Some((r, key)), Err(_)) = (&failover, &result) {
                (server, result) =
                    Box::pin(elsewhere(&pool, r, key, server, again.clone(), VALUES, true, result)).await;
            }
            if let (Some((r, key)), Ok(Reply::Whole(raw))) = (&warm, &result) {
                if is_values(raw) && !has_values(raw) && Box::pin(warmup::fill(&pool, r, &server, key)).await {
                    result = server.finish(server.submit(again.clone(), VALUES, r).await).await;
                }
            }
            if let (Some((r, key)), Ok(Reply::Whole(raw))) = (&failover, &result) {
                if pool.replicas() > 1 && is_values(raw) && !has_values(raw) {
                    if let Some(hit) = Box::pin(other_replicas(&pool, r, key, &server, again, VALUES, has_values)).await
                    {
                        result = Ok(Reply::Whole(hit));
                    }
                }
            }
            Some(retrieval_reply(&pool, &server, result))
        })
    }

    /// Keys on several servers (or a segment of a long get line): one
    /// request per server, values gathered in the client's key order, and
    /// `END` when `end`.
    async fn retrieval(&self, cmd: RetrievalCmd, exptime: i64, keys: Vec<Bytes>, end: bool) -> PendingReply {
        self.pool.counters().get_keys.fetch_add(keys.len() as u64, Relaxed);
        // Group the distinct keys by server, in first-seen order.
        let mut groups: Vec<(Arc<Server>, Vec<Bytes>)> = Vec::new();
        let mut loads = Vec::new();
        let mut seen: HashMap<&[u8], ()> = HashMap::new();
        for key in &keys {
            if seen.insert(&key[..], ()).is_some() {
                continue;
            }
            let Some((server, load)) = self.pool.acquire(key) else {
                self.forward_error();
                return ready(NO_SERVER);
            };
            loads.extend(load);
            match groups.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &server)) {
                Some((_, ks)) => ks.push(key.clone()),
                None => groups.push((server, vec![key.clone()])),
            }
        }
        if groups.len() > 1 {
            self.pool.counters().fragments.fetch_add(groups.len() as u64, Relaxed);
        }
        // While warming up: each key's server, to try the misses again.
        let warm = self.warming().map(|r| {
            let owners: Vec<(Bytes, Arc<Server>)> =
                groups.iter().flat_map(|(s, ks)| ks.iter().map(|k| (k.clone(), s.clone()))).collect();
            (r, owners)
        });
        let failover = self.failing_over();
        let mut waits = Vec::with_capacity(groups.len());
        for (server, group_keys) in groups {
            let again = failover.as_ref().map(|_| group_keys.clone()).unwrap_or_default();
            let mut data = BytesMut::new();
            Request::Retrieval { cmd, exptime, keys: group_keys }.encode(&mut data);
            let pending = server.submit(data.freeze(), VALUES_STREAMED, &self.requester).await;
            waits.push((server, pending, again));
        }
        let pool = self.pool.clone();
        Box::pin(async move {
            let mut results = Vec::with_capacity(waits.len());
            for (server, pending, again) in waits {
                let result = server.finish(pending).await;
                results.push((server, result, again));
            }
            if results.iter().any(|(_, r, _)| matches!(r, Ok(Reply::Stream(_)))) {
                // A large reply: passed on as it arrives, never held whole.
                return Some(streamed_retrieval(pool, results, failover, cmd, exptime, end, loads));
            }
            let reply = gathered_retrieval(&pool, results, failover, warm, cmd, exptime, &keys, end).await;
            drop(loads);
            reply.map(Out::Bytes)
        })
    }

    async fn flush_all(&self, req: &Request, noreply: bool) -> PendingReply {
        let servers: Vec<Arc<Server>> = self.pool.state().members.iter().map(|m| m.server.clone()).collect();
        let mut data = BytesMut::new();
        req.encode(&mut data);
        let data = data.freeze();
        let mut waits = Vec::new();
        for server in servers {
            let pending = server.submit(data.clone(), LINE, &self.requester).await;
            waits.push((server, pending));
        }
        bytes_reply(async move {
            let mut reply = Bytes::from_static(b"OK\r\n");
            for (server, pending) in waits {
                match server.finish(pending).await {
                    Ok(Reply::Whole(line)) if &line[..] == b"OK\r\n" => {}
                    Ok(Reply::Whole(line)) => reply = line,
                    Ok(Reply::Stream(_)) => reply = Bytes::from_static(UNEXPECTED),
                    Err(e) => reply = server_error(&server, &e),
                }
            }
            (!noreply).then_some(reply)
        })
    }
}

/// A meta command's reply for the client, counted; `None` when quiet
/// mode leaves it out.
fn meta_reply(
    pool: &Pool,
    server: &Server,
    result: Result<Reply, BackendError>,
    m: &MetaRequest,
    to_mn: bool,
) -> Option<crate::conn::Out> {
    let c = pool.counters();
    let reply = match result {
        Ok(Reply::Whole(reply)) if to_mn => reply.slice(..reply.len().saturating_sub(b"MN\r\n".len())),
        Ok(Reply::Whole(reply)) => reply,
        Ok(Reply::Stream(_)) => Bytes::from_static(UNEXPECTED),
        Err(e) => {
            c.errors.fetch_add(1, Relaxed);
            c.forward_errors.fetch_add(1, Relaxed);
            return Some(crate::conn::Out::Bytes(server_error(server, &e)));
        }
    };
    if m.cmd == MetaCmd::Get && (reply.starts_with(b"VA ") || reply.starts_with(b"HD")) {
        c.get_hits.fetch_add(1, Relaxed);
    }
    if reply.starts_with(b"CLIENT_ERROR") || reply.starts_with(b"SERVER_ERROR") || reply.starts_with(b"ERROR") {
        c.errors.fetch_add(1, Relaxed);
    }
    (!reply.is_empty() && (to_mn || !m.quiet_drops(&reply))).then_some(crate::conn::Out::Bytes(reply))
}

/// A one-line reply for the client (errors counted unless `noreply`).
fn line_reply(pool: &Pool, server: &Server, result: Result<Reply, BackendError>, noreply: bool) -> Bytes {
    match result {
        Ok(Reply::Whole(line)) => line,
        Ok(Reply::Stream(_)) => Bytes::from_static(UNEXPECTED),
        Err(e) => {
            if !noreply {
                let c = pool.counters();
                c.errors.fetch_add(1, Relaxed);
                c.forward_errors.fetch_add(1, Relaxed);
            }
            server_error(server, &e)
        }
    }
}

/// A retrieval's reply for the client, counted.
fn retrieval_reply(pool: &Pool, server: &Server, result: Result<Reply, BackendError>) -> Bytes {
    let c = pool.counters();
    match result {
        Ok(Reply::Whole(raw)) if is_values(&raw) => {
            if has_values(&raw) {
                c.get_hits.fetch_add(1, Relaxed);
            }
            raw
        }
        Ok(Reply::Whole(line)) => {
            c.errors.fetch_add(1, Relaxed);
            line
        }
        Ok(Reply::Stream(_)) => {
            c.errors.fetch_add(1, Relaxed);
            Bytes::from_static(UNEXPECTED)
        }
        Err(e) => {
            c.errors.fetch_add(1, Relaxed);
            c.forward_errors.fetch_add(1, Relaxed);
            server_error(server, &e)
        }
    }
}

/// A read that missed on `server` in a replicated pool: the key's other
/// replicas in candidate order (a replica that came back empty, or was
/// flushed, misses what the others hold); the first hit.
async fn other_replicas(
    pool: &Arc<Pool>,
    requester: &Requester,
    key: &[u8],
    server: &Arc<Server>,
    data: Bytes,
    framing: &'static dyn crate::backend::Framing,
    hit: fn(&[u8]) -> bool,
) -> Option<Bytes> {
    for other in pool.replicas_for(key).iter().filter(|s| !Arc::ptr_eq(s, server)) {
        if let Ok(Reply::Whole(reply)) = other.finish(other.submit(data.clone(), framing, requester).await).await {
            if hit(&reply) {
                pool.counters().replica_reads.fetch_add(1, Relaxed);
                return Some(reply);
            }
        }
    }
    None
}

/// The replies of a replicated write: the first that came, in candidate
/// order; replicas that failed are counted and logged; an error when all
/// failed.
async fn gather_replicas(pool: &Pool, waits: Vec<(Arc<Server>, crate::backend::Pending)>) -> Bytes {
    let (mut reply, mut failure) = (None, None);
    for (server, pending) in waits {
        match server.finish(pending).await {
            Ok(Reply::Whole(r)) => {
                reply.get_or_insert(r);
            }
            Ok(Reply::Stream(_)) => {
                reply.get_or_insert(Bytes::from_static(UNEXPECTED));
            }
            Err(e) => {
                pool.counters().replica_failures.fetch_add(1, Relaxed);
                tracing::warn!(pool = %pool.name(), server = %server.id(), "replica write failed: {e}");
                failure.get_or_insert_with(|| server_error(&server, &e));
            }
        }
    }
    reply.unwrap_or_else(|| {
        let c = pool.counters();
        c.errors.fetch_add(1, Relaxed);
        c.forward_errors.fetch_add(1, Relaxed);
        failure.unwrap_or_else(|| Bytes::from_static(NO_SERVER))
    })
}

/// After `server` could not answer a request for `key`: the request sent
/// to the key's next candidates (`failover: next`, replicas) until one
/// answers. A read goes on after any failure; a write only when it never
/// reached the server (no connection), so it is never applied twice.
#[allow(clippy::too_many_arguments)]
async fn elsewhere(
    pool: &Arc<Pool>,
    requester: &Requester,
    key: &[u8],
    server: Arc<Server>,
    data: Bytes,
    framing: &'static dyn crate::backend::Framing,
    read: bool,
    mut result: Result<Reply, BackendError>,
) -> (Arc<Server>, Result<Reply, BackendError>) {
    let mut tried = vec![server];
    loop {
        let retry = match &result {
            Ok(_) => false,
            Err(BackendError::Connect(_) | BackendError::Gone) => true,
            Err(BackendError::Timeout | BackendError::Closed(_) | BackendError::Protocol(_)) => read,
            Err(_) => false,
        };
        if !retry {
            break;
        }
        let Some(next) = pool.next_candidate(key, &tried) else { break };
        pool.counters().failover_requests.fetch_add(1, Relaxed);
        result = next.finish(next.submit(data.clone(), framing, requester).await).await;
        tried.push(next);
    }
    (tried.pop().expect("one server at least"), result)
}

/// The pool's counters in memcached's `stats` format.
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
                o.max_value(super::request::DEFAULT_MAX_VALUE),
                o.client_idle_timeout.map_or(0, |d| d.as_secs())
            ));
        }
        // Groups such as items and slabs describe a server's memory, which a
        // proxy does not have; unknown ones are errors, as in memcached.
        Some(_) => return Bytes::from_static(b"ERROR\r\n"),
    }
    let snap = pool.stats();
    let mut out = String::new();
    let mut stat = |name: &str, value: &dyn std::fmt::Display| {
        use std::fmt::Write as _;
        let _ = write!(out, "STAT {name} {value}\r\n");
    };
    stat("pid", &std::process::id());
    stat("uptime", &shared.started.elapsed().as_secs());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    stat("time", &now);
    stat("version", &format!("chash-proxy-{}", env!("CARGO_PKG_VERSION")));
    stat("pool", &snap.name);
    stat("membership_version", &snap.version);
    stat("placement_fingerprint", &snap.fingerprint);
    stat("locally_ejected", &snap.locally_ejected.len());
    for (d, v) in &snap.counters {
        stat(d.name, v);
    }
    stat("get_misses", &snap.get("get_keys").saturating_sub(snap.get("get_hits")));
    stat("servers", &snap.servers.len());
    stat("live_servers", &snap.live_servers);
    out.push_str("END\r\n");
    Bytes::from(out)
}

/// A multi-get's key whose part failed on `server`, asked of the key's
/// next servers (failover).
async fn one_key_elsewhere(
    pool: &Arc<Pool>,
    requester: &Requester,
    server: &Arc<Server>,
    key: &Bytes,
    cmd: RetrievalCmd,
    exptime: i64,
) -> Result<Reply, BackendError> {
    let mut data = BytesMut::new();
    Request::Retrieval { cmd, exptime, keys: vec![key.clone()] }.encode(&mut data);
    let failed = Err(BackendError::Gone);
    let (_, one) = elsewhere(pool, requester, key, server.clone(), data.freeze(), VALUES, true, failed).await;
    one
}

/// One part of a multi-get: its server, what came back, and its keys (kept
/// only when failover may send them elsewhere).
type PartResult = (Arc<Server>, Result<Reply, BackendError>, Vec<Bytes>);

/// While warming up: the requester, and each key of a multi-get with its
/// server (to try a miss on the key's previous servers).
type WarmOwners = (Requester, Vec<(Bytes, Arc<Server>)>);

/// A multi-get's parts, each held whole: values gathered in the client's
/// key order, with failover, warm-up and replicas' second reads; `END`
/// when `end`.
#[allow(clippy::too_many_arguments)]
async fn gathered_retrieval(
    pool: &Arc<Pool>,
    results: Vec<PartResult>,
    failover: Option<Requester>,
    warm: Option<WarmOwners>,
    cmd: RetrievalCmd,
    exptime: i64,
    keys: &[Bytes],
    end: bool,
) -> Option<Bytes> {
    let pool = pool.clone();
    let mut found: HashMap<Bytes, Bytes> = HashMap::new();
    let mut failure: Option<Bytes> = None;
    let mut forward_error = false;
    for (server, mut result, again) in results {
        if let (Some(r), Err(_)) = (&failover, &result) {
            // Each key of the group to its next server, one by one.
            for key in again {
                match one_key_elsewhere(&pool, r, &server, &key, cmd, exptime).await {
                    Ok(Reply::Whole(raw)) if is_values(&raw) => {
                        for v in values(&raw) {
                            found.entry(v.key).or_insert(v.raw);
                        }
                        result = Ok(Reply::Whole(Bytes::from_static(b"END\r\n")));
                    }
                    other => {
                        result = other;
                        break;
                    }
                }
            }
        }
        match result {
            Ok(Reply::Whole(raw)) if is_values(&raw) => {
                for v in values(&raw) {
                    found.entry(v.key).or_insert(v.raw);
                }
            }
            Ok(Reply::Whole(line)) => failure = failure.or(Some(line)),
            Ok(Reply::Stream(_)) => failure = failure.or(Some(Bytes::from_static(UNEXPECTED))),
            Err(e) => {
                forward_error = true;
                failure = failure.or_else(|| Some(server_error(&server, &e)));
            }
        }
    }
    let c = pool.counters();
    if let Some(f) = failure {
        c.errors.fetch_add(1, Relaxed);
        if forward_error {
            c.forward_errors.fetch_add(1, Relaxed);
        }
        return Some(f);
    }
    if let Some((r, owners)) = warm {
        for (key, server) in &owners {
            if found.contains_key(key) || !Box::pin(warmup::fill(&pool, &r, server, key)).await {
                continue;
            }
            let mut data = BytesMut::new();
            Request::Retrieval { cmd, exptime, keys: vec![key.clone()] }.encode(&mut data);
            if let Ok(Reply::Whole(raw)) = server.finish(server.submit(data.freeze(), VALUES, &r).await).await {
                for v in values(&raw) {
                    found.entry(v.key).or_insert(v.raw);
                }
            }
        }
    }
    if let (Some(r), true) = (&failover, pool.replicas() > 1) {
        // Misses on a key's first replica: its other replicas.
        let missing: Vec<Bytes> = keys.iter().filter(|k| !found.contains_key(*k)).cloned().collect();
        for key in missing {
            let Some(server) = pool.state().server_for(&key).cloned() else { continue };
            let mut data = BytesMut::new();
            Request::Retrieval { cmd, exptime, keys: vec![key.clone()] }.encode(&mut data);
            if let Some(raw) =
                Box::pin(other_replicas(&pool, r, &key, &server, data.freeze(), VALUES, has_values)).await
            {
                for v in values(&raw) {
                    found.entry(v.key).or_insert(v.raw);
                }
            }
        }
    }
    let mut out = BytesMut::new();
    let mut hits = 0;
    for key in keys {
        if let Some(raw) = found.get(key) {
            out.extend_from_slice(raw);
            hits += 1;
        }
    }
    c.get_hits.fetch_add(hits, Relaxed);
    if end {
        out.extend_from_slice(b"END\r\n");
    }
    Some(out.freeze())
}

/// Chunks of a streamed multi-get buffered for its client.
const STREAM_CHUNKS: usize = 16;

/// A multi-get with a part too large to hold whole: the client gets the
/// whole parts' values first, then the streamed parts' values as they
/// arrive, a `VALUE` block at a time from whichever server has one ready
/// (so memory stays a few chunks per server however large the reply), then
/// with failover the keys of failed parts from their next servers, then
/// `END` when `end`. Values are not in the client's key order (clients
/// match them by key). A part that failed without failover makes the reply
/// that part's error alone, as when every part is whole.
fn streamed_retrieval(
    pool: Arc<Pool>,
    results: Vec<PartResult>,
    failover: Option<Requester>,
    cmd: RetrievalCmd,
    exptime: i64,
    end: bool,
    loads: Vec<crate::pool::LoadRelease>,
) -> Out {
    let c = pool.counters();
    let mut whole = BytesMut::new();
    let mut streams = Vec::new();
    let mut failed = Vec::new();
    let mut failure = None;
    let mut hits = 0;
    for (server, result, again) in results {
        match result {
            Ok(Reply::Whole(raw)) if is_values(&raw) => {
                let vs = values(&raw);
                hits += vs.len() as u64;
                for v in vs {
                    whole.extend_from_slice(&v.raw);
                }
            }
            Ok(Reply::Whole(line)) => failure = failure.or(Some(line)),
            Ok(Reply::Stream(s)) => streams.push(Part { rx: s.0, scan: ValuesScan::default(), carry: None }),
            Err(e) if failover.is_some() => failed.push((server, again, e)),
            Err(e) => {
                c.forward_errors.fetch_add(1, Relaxed);
                failure = failure.or_else(|| Some(server_error(&server, &e)));
            }
        }
    }
    if let Some(line) = failure {
        // The streams' receivers go: their servers' replies are read past.
        c.errors.fetch_add(1, Relaxed);
        return Out::Bytes(line);
    }
    c.streamed_replies.fetch_add(1, Relaxed);
    let (tx, rx) = tokio::sync::mpsc::channel(STREAM_CHUNKS);
    tokio::spawn(async move {
        let merged = merge_parts(&tx, whole, streams).await;
        let Ok(streamed_hits) = merged else { return };
        hits += streamed_hits;
        let mut tail = BytesMut::new();
        if let Some(r) = &failover {
            for (server, keys, _) in failed {
                for key in keys {
                    if let Ok(Reply::Whole(raw)) = one_key_elsewhere(&pool, r, &server, &key, cmd, exptime).await {
                        for v in values(&raw) {
                            hits += 1;
                            tail.extend_from_slice(&v.raw);
                        }
                    }
                }
            }
        }
        drop(loads);
        pool.counters().get_hits.fetch_add(hits, Relaxed);
        if end {
            tail.extend_from_slice(b"END\r\n");
        }
        let _ = tx.send(Chunk { data: tail.freeze(), last: true }).await;
    });
    Out::Stream(ReplyStream(rx))
}

/// One streamed part of a multi-get being passed on.
struct Part {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    scan: ValuesScan,
    /// A line split across chunks, kept for the next one.
    carry: Option<BytesMut>,
}

/// Passes `whole`, then every part's `VALUE` blocks (their `END`s left
/// out) to `tx`, switching parts only between blocks; the values seen.
/// `Err` when the client is gone or a part was cut short (its connection
/// then closes: it has part of a reply).
async fn merge_parts(tx: &tokio::sync::mpsc::Sender<Chunk>, whole: BytesMut, mut parts: Vec<Part>) -> Result<u64, ()> {
    if !whole.is_empty() {
        tx.send(Chunk { data: whole.freeze(), last: false }).await.map_err(drop)?;
    }
    // The part whose block is being passed on, if one is mid-block.
    let mut current: Option<usize> = None;
    let mut next = 0;
    let mut hits = 0;
    while !parts.is_empty() {
        let (i, chunk) = match current {
            Some(i) => (i, parts[i].rx.recv().await),
            None => {
                // Whichever part has a chunk ready, taking turns.
                let start = next;
                std::future::poll_fn(|cx| {
                    let n = parts.len();
                    for k in 0..n {
                        let i = (start + k) % n;
                        if let std::task::Poll::Ready(chunk) = parts[i].rx.poll_recv(cx) {
                            return std::task::Poll::Ready((i, chunk));
                        }
                    }
                    std::task::Poll::Pending
                })
                .await
            }
        };
        let Some(chunk) = chunk else { return Err(()) };
        let part = &mut parts[i];
        let data = match part.carry.take() {
            Some(mut carry) => {
                carry.extend_from_slice(&chunk.data);
                carry.freeze()
            }
            None => chunk.data,
        };
        let (used, last) = part.scan.scan(&data).map_err(drop)?;
        let mut out = data.slice(..used);
        if used < data.len() {
            part.carry = Some(BytesMut::from(&data[used..]));
        }
        if last {
            if !out.ends_with(b"END\r\n") {
                // An error line ended the part: it cannot be passed on
                // inside a reply of values.
                return Err(());
            }
            out.truncate(out.len() - b"END\r\n".len());
        } else if chunk.last {
            return Err(());
        }
        if !out.is_empty() {
            tx.send(Chunk { data: out, last: false }).await.map_err(drop)?;
        }
        if last {
            hits += parts[i].scan.values();
            parts.remove(i);
            current = None;
            next = if parts.is_empty() { 0 } else { i % parts.len() };
        } else if parts[i].scan.at_boundary() && parts[i].carry.is_none() {
            current = None;
            next = (i + 1) % parts.len();
        } else {
            current = Some(i);
        }
    }
    Ok(hits)
}
