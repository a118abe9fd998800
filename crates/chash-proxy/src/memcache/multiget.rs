//! A multi-key get split by server: its parts gathered whole in the
//! client's key order (with failover, warm-up and replicas' second reads),
//! or, when a part is large, its values streamed to the client as they
//! arrive.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::replies::{one_key_elsewhere, other_replicas, server_error, UNEXPECTED};
use super::reply::{has_values, is_values, values, ValuesScan, VALUES};
use super::warmup;
use super::{Request, RetrievalCmd};
use crate::backend::{BackendError, Chunk, Reply, ReplyStream, Requester, Scan as _, Server};
use crate::conn::Out;
use crate::pool::Pool;

/// One part of a multi-get: its server, what came back, and its keys (kept
/// only when failover may send them elsewhere).
pub(super) type PartResult = (Arc<Server>, Result<Reply, BackendError>, Vec<Bytes>);

/// While warming up: the requester, and each key of a multi-get with its
/// server (to try a miss on the key's previous servers).
pub(super) type WarmOwners = (Requester, Vec<(Bytes, Arc<Server>)>);

/// A multi-get's parts, each held whole: values gathered in the client's
/// key order, with failover, warm-up and replicas' second reads; `END`
/// when `end`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn gathered_retrieval(
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
pub(super) fn streamed_retrieval(
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
