//! What a memcached client is answered from its servers' replies: a
//! reply line or a retrieval's values, a meta reply, the replicas' replies
//! gathered, a request its server could not take tried on the key's next
//! servers, and `stats`.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::meta::{MetaCmd, MetaRequest};
use super::reply::{has_values, is_values, VALUES};
use super::{Request, RetrievalCmd};
use crate::backend::{BackendError, Reply, Requester, Server};
use crate::options::Shared;
use crate::pool::Pool;

/// A server's reply that does not fit the request.
pub(super) const UNEXPECTED: &[u8] = b"SERVER_ERROR unexpected reply from the server\r\n";

pub(super) const NO_SERVER: &[u8] = b"SERVER_ERROR no live server in pool\r\n";

pub(super) fn server_error(server: &Server, e: &BackendError) -> Bytes {
    Bytes::from(format!("SERVER_ERROR backend {} {e}\r\n", server.id()))
}

/// A meta command's reply for the client, counted; `None` when quiet
/// mode leaves it out.
pub(super) fn meta_reply(
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
pub(super) fn line_reply(pool: &Pool, server: &Server, result: Result<Reply, BackendError>, noreply: bool) -> Bytes {
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
pub(super) fn retrieval_reply(pool: &Pool, server: &Server, result: Result<Reply, BackendError>) -> Bytes {
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
pub(super) async fn other_replicas(
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
pub(super) async fn gather_replicas(pool: &Pool, waits: Vec<(Arc<Server>, crate::backend::Pending)>) -> Bytes {
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
pub(super) async fn elsewhere(
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
pub(super) fn stats_reply(pool: &Pool, shared: &Shared, group: Option<&[u8]>) -> Bytes {
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
pub(super) async fn one_key_elsewhere(
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
