//! Warm-up after a membership change (`warmup:`, or a drain): a read that
//! misses on a key's server is tried on the servers that held the key
//! before the change; a hit is copied to the key's server with an `add`
//! (so a write that got there first wins), and the client's request is
//! then answered by its own server. Writes of a key during the window also
//! delete it on those servers, so an older value cannot come back from
//! them. [`KeyWrites`](crate::pool::KeyWrites) keeps a copy that races a
//! write of its key from leaving an older value behind.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::meta::encode_key;
use super::reply::META;
use crate::backend::{Pending, Reply, Requester, Server};
use crate::pool::Pool;

/// How a key is written in a meta command: as it is, or in base64 (`b`)
/// when it holds bytes a text command cannot carry.
fn meta_key(key: &[u8], out: &mut BytesMut) -> bool {
    let plain = !key.is_empty() && key.iter().all(|&b| b > b' ' && b < 0x7f);
    if plain {
        out.extend_from_slice(key);
    } else {
        out.extend_from_slice(&encode_key(key));
    }
    !plain
}

fn meta_command(cmd: &str, key: &[u8], flags: &str) -> BytesMut {
    let mut out = BytesMut::with_capacity(key.len() + 24);
    out.extend_from_slice(cmd.as_bytes());
    out.extend_from_slice(b" ");
    if meta_key(key, &mut out) {
        out.extend_from_slice(b" b");
    }
    out.extend_from_slice(flags.as_bytes());
    out
}

/// A value found on a previous server: data, client flags, and the
/// remaining TTL when the server told it (`None`: no expiry).
struct Found {
    data: Bytes,
    flags: Bytes,
    ttl: Option<Option<u32>>,
}

/// `VA <len> f<flags> t<ttl>\r\n<data>\r\n`.
fn parse_found(reply: &Bytes) -> Option<Found> {
    let nl = memchr::memchr(b'\n', reply)?;
    let line = reply[..nl].strip_suffix(b"\r").unwrap_or(&reply[..nl]);
    let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
    if words.next()? != b"VA" {
        return None;
    }
    let len: usize = std::str::from_utf8(words.next()?).ok()?.parse().ok()?;
    let (mut flags, mut ttl) = (Bytes::from_static(b"0"), None);
    for w in words {
        match w.split_first() {
            Some((b'f', v)) => flags = reply.slice_ref(v),
            Some((b't', b"-1")) => ttl = Some(None),
            Some((b't', v)) => ttl = std::str::from_utf8(v).ok()?.parse::<u32>().ok().map(|t| Some(t.max(1))),
            _ => {}
        }
    }
    let data = reply.get(nl + 1..nl + 1 + len)?;
    Some(Found { data: reply.slice_ref(data), flags, ttl })
}

async fn ask(server: &Server, data: BytesMut, requester: &Requester) -> Option<Bytes> {
    let pending: Pending = server.submit(data.freeze(), META, requester).await;
    match server.finish(pending).await {
        Ok(Reply::Whole(reply)) => Some(reply),
        _ => None,
    }
}

/// Tries per read at most: a copy that raced a write of its stripe is
/// taken back and tried again.
const ATTEMPTS: usize = 4;

/// After a read of `key` missed on `to`: looks for the key on its previous
/// servers and copies a hit to `to`. True when `to` may have the key now
/// (copied, or written meanwhile by someone else): the caller asks `to`
/// again. Free when the pool has no warm-up window open.
pub(crate) async fn fill(pool: &Arc<Pool>, requester: &Requester, to: &Arc<Server>, key: &[u8]) -> bool {
    // By the worker's state, the one requests are routed by (a change
    // swaps it in before the shared one): a read routed by the new
    // placement looks where the change says the key was.
    let sources = pool.routing_guard().previous_servers(key, to);
    if sources.is_empty() {
        return false;
    }
    let limit = pool.backend().timeout.unwrap_or(Duration::from_secs(1));
    for attempt in 0..ATTEMPTS {
        // Not while a write of the stripe runs: afterwards, its server or
        // the previous ones (where it deleted the key) tell the truth.
        let Some(copy) = pool.writes().begin_copy(key, limit).await else { return true };
        if attempt > 0 {
            // After a race: the key's server may have it now.
            let mut has = meta_command("mg", key, "");
            has.extend_from_slice(b"\r\n");
            if ask(to, has, requester).await.is_some_and(|r| r.starts_with(b"HD")) {
                return true;
            }
        }
        let Some(found) = find(&sources, key, requester).await else {
            pool.counters().warmup_misses.fetch_add(1, Relaxed);
            return false;
        };
        let c = pool.counters();
        if attempt == 0 {
            c.warmup_hits.fetch_add(1, Relaxed);
        }
        let ttl = match found.ttl {
            Some(Some(t)) => t,
            Some(None) => 0,
            None => pool.spec().warmup_ttl,
        };
        // `ms <key> <len> [b] F.. T.. ME c`: stored only if absent (a write
        // that got there first wins); its CAS names this copy.
        let mut set = BytesMut::new();
        set.extend_from_slice(b"ms ");
        let base64 = meta_key(key, &mut set);
        let b = if base64 { " b" } else { "" };
        let flags = String::from_utf8_lossy(&found.flags);
        set.extend_from_slice(format!(" {}{b} F{flags} T{ttl} ME c\r\n", found.data.len()).as_bytes());
        set.extend_from_slice(&found.data);
        set.extend_from_slice(b"\r\n");
        let Some(reply) = ask(to, set, requester).await else { return false };
        if reply.starts_with(b"NS") {
            return true; // written there meanwhile
        }
        if !reply.starts_with(b"HD") {
            return false;
        }
        if !copy.raced() {
            c.warmup_copies.fetch_add(1, Relaxed);
            return true;
        }
        // A write of the stripe began meanwhile: the copy may be older than
        // it. Take it back unless it was written over since (its CAS).
        let cas = reply.split(|&b| b == b' ' || b == b'\r').find_map(|w| w.strip_prefix(b"c")).unwrap_or(b"0");
        let mut delete = meta_command("md", key, &format!(" C{}", String::from_utf8_lossy(cas)));
        delete.extend_from_slice(b"\r\n");
        let _ = ask(to, delete, requester).await;
    }
    true
}

/// The key on the first of `sources` that has it.
async fn find(sources: &[Arc<Server>], key: &[u8], requester: &Requester) -> Option<Found> {
    for source in sources {
        let mut get = meta_command("mg", key, " v f t");
        get.extend_from_slice(b"\r\n");
        if let Some(found) = ask(source, get, requester).await.as_ref().and_then(parse_found) {
            return Some(found);
        }
    }
    None
}

/// A write of `key` to `to` during a warm-up window: deletes of the key on
/// its previous servers, sent now; [`Invalidation::finish`] waits for them
/// (and for copies of the key in flight) before the write is answered.
pub(crate) struct Invalidation {
    pool: Arc<Pool>,
    stripe: usize,
    deletes: Vec<(Arc<Server>, Pending)>,
}

impl Invalidation {
    /// `None` (and free) outside a window, or when `key` had no other server.
    pub(crate) async fn start(
        pool: &Arc<Pool>,
        requester: &Requester,
        to: &Arc<Server>,
        key: &[u8],
    ) -> Option<Invalidation> {
        // By the worker's state, as the write was routed: a write routed
        // by the new placement, while the shared state was still the old
        // one (no previous servers yet), skipped the key's old server,
        // whose copy a later read then brought back.
        let sources = pool.routing_guard().previous_servers(key, to);
        if sources.is_empty() {
            return None;
        }
        let stripe = pool.writes().begin_write(key);
        let mut deletes = Vec::with_capacity(sources.len());
        for source in sources {
            let mut delete = meta_command("md", key, "");
            delete.extend_from_slice(b"\r\n");
            let pending = source.submit(delete.freeze(), META, requester).await;
            deletes.push((source, pending));
        }
        Some(Invalidation { pool: pool.clone(), stripe, deletes })
    }

    /// Waits for the deletes and for copies of the key in flight.
    pub(crate) async fn finish(self) {
        for (server, pending) in self.deletes {
            if server.finish(pending).await.is_ok() {
                self.pool.counters().warmup_deletes.fetch_add(1, Relaxed);
            }
        }
        let limit = self.pool.backend().timeout.unwrap_or(Duration::from_secs(1));
        self.pool.writes().end_write(self.stripe, limit).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_values_are_parsed() {
        let f = parse_found(&Bytes::from_static(b"VA 3 f7 t-1\r\nabc\r\n")).unwrap();
        assert_eq!((&f.data[..], &f.flags[..], f.ttl), (&b"abc"[..], &b"7"[..], Some(None)));
        let f = parse_found(&Bytes::from_static(b"VA 0 f0 t0\r\n\r\n")).unwrap();
        assert_eq!(f.ttl, Some(Some(1)), "an expiring value keeps a TTL");
        assert!(parse_found(&Bytes::from_static(b"EN\r\n")).is_none());
        assert!(parse_found(&Bytes::from_static(b"VA 5 f1\r\nab\r\n")).is_none(), "short data");
        let mut out = BytesMut::new();
        assert!(meta_key(b"a b", &mut out));
        assert_eq!(&out[..], b"YSBi");
        assert_eq!(&meta_command("md", b"k", " q")[..], b"md k q");
        assert_eq!(&meta_command("md", b"\x01", "")[..], b"md AQ== b");
    }
}
