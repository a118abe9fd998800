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
use super::multiget::{gathered_retrieval, streamed_retrieval};
use super::replies::{
    elsewhere, gather_replicas, line_reply, meta_reply, other_replicas, retrieval_reply, server_error, stats_reply,
    NO_SERVER, UNEXPECTED,
};
use super::reply::{has_values, is_values, LINE, META, META_TO_MN, VALUES, VALUES_STREAMED};
use super::request::{parse_more_keys, skip_discarded};
use super::warmup::{self, Invalidation};
use super::{parse_request, Limits, Parsed, Request, RetrievalCmd};
use crate::backend::{Reply, Requester, Server};
use crate::conn::{bytes_reply, nothing, ready, ready_owned, Out, PendingReply, Session, Step};
use crate::options::Shared;
use crate::pool::Pool;

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
    type Later = ();

    fn next_now(&mut self, _buf: &mut BytesMut) -> Result<Step, ()> {
        Err(())
    }

    fn next_later(&mut self, (): (), buf: &mut BytesMut) -> impl std::future::Future<Output = Step> + Send {
        self.next(buf)
    }
}

impl MemcacheSession {
    /// The next request from the front of `buf`, sent on its way.
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
                Step::Reply(crate::conn::later(async move {
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
            return crate::conn::later(async move {
                let result = server.finish(pending).await;
                drop(load);
                meta_reply(&pool, &server, result, &m, to_mn)
            });
        }
        crate::conn::later(async move {
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
            return crate::conn::later(async move {
                let result = server.finish(pending).await;
                drop(load);
                (!noreply).then(|| crate::conn::Out::Bytes(line_reply(&pool, &server, result, noreply)))
            });
        }
        crate::conn::later(async move {
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
        crate::conn::later(async move {
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
        crate::conn::later(async move {
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
