//! The `copy` method of a migration (`migrate_method: copy`): a moved key's
//! data goes through the proxy with `DUMP` and `RESTORE`, for servers where
//! `MIGRATE` is disabled (as some managed services do) or that cannot reach
//! each other.
//!
//! A copy is three steps on two servers, so unlike `MIGRATE` it is not
//! atomic by itself; scripts on each server make it safe for any number of
//! proxies copying at once, any of which may stop at any point:
//!
//! 1. **Claim** (a script on the old server): each key that is there is
//!    dumped and renamed to its holding key (`chash-copy:held:KEY`, its TTL
//!    kept), and the hash `chash-copy:meta` records a claim `TOKEN
//!    DEADLINE` for it: a token of this copy, a deadline a lease away.
//!    A key held already is not claimed again; a key that is not there has
//!    moved, or never existed.
//! 2. **Restore** (a script on the new server): unless the copy's
//!    tombstone `chash-copy:done:TOKEN` exists (restored already: nothing
//!    to do) or the new server's clock is past the deadline (refused), each
//!    dump is restored (`RESTORE ... ABSTTL`, so the TTL is kept to the
//!    millisecond) where the key does not exist yet (where it does, the new
//!    server's copy is newer and is kept), and the tombstone is set until a
//!    minute past the deadline.
//! 3. **Release** (a script on the old server): the holding keys and
//!    claims of that token are deleted.
//!
//! Every decision about a copy's fate is taken by the new server's clock
//! in one script: before the deadline, a restore may happen (and leaves a
//! tombstone); after it, none can. So a claim left behind by a proxy that
//! stopped is resolved by whoever finds it (the mover, or a command on the
//! key) only once the new server says the deadline has passed: tombstone
//! there, the data arrived (release); none, it never will, and the holding
//! key is claimed again under a new token and copied. A copier that wakes
//! up late finds its restore refused or already done, and its release
//! ignored (the claim is no longer its token's): nothing is restored twice
//! and nothing a client deleted comes back.
//!
//! No proxy writes a moved key to its old server once any proxy moves keys
//! (the migration's protocol): a key absent from the old server and not
//! held there is on its new server, or nowhere. And no proxy touches a
//! moved key on its new server without first resolving a claim on it (a
//! proxy that has completed the migration found none left, and none can
//! be made after): so restoring again after a claim is found lost, where
//! the key is on the new server already, keeps the new server's copy, and
//! the tombstone (which only saves that work) may expire.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;

use super::resp::{array_items, encode_array, integer, WHOLE};
use crate::backend::{Pinned, Reply, Requester, Server};

/// Keys of the copy's own bookkeeping start with this (never a client's
/// key: a pool that copies reserves it).
pub const PREFIX: &[u8] = b"chash-copy:";

/// Whether `key` is the copy's own bookkeeping.
pub fn is_internal(key: &[u8]) -> bool {
    key.starts_with(PREFIX)
}

/// Claims the keys given as `KEYS` that are there: ARGV token, lease (ms).
/// Returns the deadline and, per key, `0` (absent), `{claim}` (held by a
/// copy in progress) or `{dump, pexpiretime}` (claimed now).
pub const CLAIM: &str = "\
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
local claim = ARGV[1] .. ' ' .. deadline
local out = {}
for i, k in ipairs(KEYS) do
  local held = redis.call('HGET', 'chash-copy:meta', k)
  if held then
    out[i] = {held}
  elseif redis.call('EXISTS', k) == 0 then
    out[i] = 0
  else
    local d = redis.call('DUMP', k)
    local at = redis.call('PEXPIRETIME', k)
    redis.call('RENAME', k, 'chash-copy:held:' .. k)
    redis.call('HSET', 'chash-copy:meta', k, claim)
    out[i] = {d, at}
  end
end
return {deadline, out}";

/// Restores dumps under a token: ARGV token, deadline, then per key in
/// `KEYS` its pexpiretime and dump. Returns `done` (restored before),
/// `expired` (refused), or the 1-based positions of keys that existed
/// already (their new copy kept).
pub const RESTORE: &str = "\
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[2])
local tomb = 'chash-copy:done:' .. ARGV[1]
if redis.call('EXISTS', tomb) == 1 then return 'done' end
if now > deadline then return 'expired' end
local busy = {}
for i, k in ipairs(KEYS) do
  if redis.call('EXISTS', k) == 1 then
    busy[#busy + 1] = i
  else
    local at = tonumber(ARGV[1 + 2 * i])
    if at < 0 then
      redis.call('RESTORE', k, 0, ARGV[2 + 2 * i])
    else
      redis.call('RESTORE', k, at, ARGV[2 + 2 * i], 'ABSTTL')
    end
  end
end
redis.call('SET', tomb, '1', 'PX', deadline - now + 60000)
return busy";

/// Deletes the holding keys and claims of `KEYS` made under token `ARGV[1]`;
/// the number deleted.
pub const RELEASE: &str = "\
local n = 0
local mine = ARGV[1] .. ' '
for i, k in ipairs(KEYS) do
  local held = redis.call('HGET', 'chash-copy:meta', k)
  if held and string.sub(held, 1, #mine) == mine then
    redis.call('DEL', 'chash-copy:held:' .. k)
    redis.call('HDEL', 'chash-copy:meta', k)
    n = n + 1
  end
end
return n";

/// A claim's fate, by the new server's clock: ARGV token, deadline.
/// `done` (restored), `wait` (the deadline is ahead), `lost` (past it, and
/// never restored: it never will be).
pub const STATUS: &str = "\
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', 'chash-copy:done:' .. ARGV[1]) == 1 then return 'done' end
if now > tonumber(ARGV[2]) then return 'lost' end
return 'wait'";

/// Claims a lost claim's holding key again: `KEYS[1]` the key, ARGV the old
/// claim, the new token, the lease (ms). `0`: the claim is not that one any
/// more (resolved by someone else); `1`: the holding key expired meanwhile
/// (claim removed); else `{deadline, dump, pexpiretime}`.
pub const RECLAIM: &str = "\
local k = KEYS[1]
if redis.call('HGET', 'chash-copy:meta', k) ~= ARGV[1] then return 0 end
local h = 'chash-copy:held:' .. k
if redis.call('EXISTS', h) == 0 then
  redis.call('HDEL', 'chash-copy:meta', k)
  return 1
end
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
redis.call('HSET', 'chash-copy:meta', k, ARGV[2] .. ' ' .. deadline)
return {deadline, redis.call('DUMP', h), redis.call('PEXPIRETIME', h)}";

/// What a copy needs to ask of a server: the server, the connection
/// (the mover's own, or the shared ones after the requester's earlier
/// requests), and how long an answer may take.
pub(super) struct Link<'a> {
    pub server: &'a Server,
    pub pinned: Option<&'a Pinned>,
    pub requester: &'a Requester,
    pub limit: Duration,
}

impl Link<'_> {
    /// The reply to `args`; an error reply is an `Err`.
    async fn ask(&self, args: &[&[u8]]) -> Result<Bytes, String> {
        let mut out = bytes::BytesMut::new();
        encode_array(&mut out, args.iter().copied());
        let data = out.freeze();
        let pending = match self.pinned {
            Some(p) => self.server.submit_blocking(p, data, WHOLE, self.requester, Some(self.limit)).await,
            None => self.server.submit(data, WHOLE, self.requester).await,
        };
        match self.server.finish(pending).await {
            Ok(Reply::Whole(f)) if f.starts_with(b"-") => {
                Err(String::from_utf8_lossy(f.strip_suffix(b"\r\n").unwrap_or(&f)).into_owned())
            }
            Ok(Reply::Whole(f)) => Ok(f),
            Ok(Reply::Stream(_)) => Err("an unexpected reply".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// `EVAL script numkeys keys... args...`.
    async fn eval(&self, script: &str, keys: &[&[u8]], args: &[&[u8]]) -> Result<Bytes, String> {
        let n = keys.len().to_string();
        let mut all: Vec<&[u8]> = Vec::with_capacity(3 + keys.len() + args.len());
        all.extend([b"EVAL".as_slice(), script.as_bytes(), n.as_bytes()]);
        all.extend_from_slice(keys);
        all.extend_from_slice(args);
        self.ask(&all).await
    }
}

/// What copying some keys did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Copied {
    /// Keys restored on the new server by this call.
    pub moved: u64,
    /// Keys found on both servers: the new server's copy kept.
    pub conflicts: u64,
    /// Keys held by a copy still within its lease (another proxy's, or
    /// one of ours that was refused): to be tried again.
    pub pending: Vec<Bytes>,
}

/// A token no other copy has: this process's random hasher over its id,
/// the time and a counter.
fn token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(NEXT.fetch_add(1, Relaxed));
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    format!("{:016x}{:08x}", h.finish(), std::process::id())
}

/// The text of a bulk string frame.
fn bulk(frame: &[u8]) -> Option<&[u8]> {
    let rest = frame.strip_prefix(b"$")?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    rest.get(nl + 1..rest.len().checked_sub(2)?)
}

fn unexpected(what: &str, frame: &[u8]) -> String {
    format!("{what}: an unexpected reply ({})", String::from_utf8_lossy(&frame[..frame.len().min(80)]).trim_end())
}

/// A dump on its way: the key, its expiry (`PEXPIRETIME`, -1: none), the
/// payload.
struct Dump {
    key: Bytes,
    at: Bytes,
    payload: Bytes,
}

/// Copies `keys` (all moving from `from` to `to`) under claims that last
/// `lease`: claims what is on `from`, restores it on `to`, releases it
/// on `from`; claims found there already are resolved (or, within their
/// lease, returned as pending).
///
/// # Errors
/// A server's error or no reply: claims made stay, and are resolved
/// (after their lease) by whoever finds them next.
pub(super) async fn copy_keys(
    from: &Link<'_>,
    to: &Link<'_>,
    keys: &[Bytes],
    lease: Duration,
) -> Result<Copied, String> {
    let mut done = Copied::default();
    if keys.is_empty() {
        return Ok(done);
    }
    let token = token();
    let lease_ms = lease.as_millis().max(1).to_string();
    let key_refs: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
    let reply = from.eval(CLAIM, &key_refs, &[token.as_bytes(), lease_ms.as_bytes()]).await?;
    let parts = array_items(&reply).filter(|p| p.len() == 2).ok_or_else(|| unexpected("claim", &reply))?;
    let deadline = integer(&parts[0]).ok_or_else(|| unexpected("claim", &reply))?;
    let items = array_items(&parts[1]).filter(|i| i.len() == keys.len()).ok_or_else(|| unexpected("claim", &reply))?;
    let mut dumps = Vec::new();
    let mut held = Vec::new();
    for (key, item) in keys.iter().zip(items) {
        if integer(&item).is_some() {
            continue; // not there: moved, or never written
        }
        let inner = array_items(&item).ok_or_else(|| unexpected("claim", &item))?;
        match inner.as_slice() {
            [claim] => held.push((key.clone(), Bytes::copy_from_slice(bulk(claim).unwrap_or_default()))),
            [payload, at] => dumps.push(Dump {
                key: key.clone(),
                at: Bytes::from(integer(at).ok_or_else(|| unexpected("claim", &item))?.to_string()),
                payload: Bytes::copy_from_slice(bulk(payload).ok_or_else(|| unexpected("claim", payload))?),
            }),
            _ => return Err(unexpected("claim", &item)),
        }
    }
    if !dumps.is_empty() {
        let deadline = deadline.to_string();
        let restored = restore(to, &token, &deadline, &dumps).await?;
        match restored {
            Restored::Done(busy) => {
                done.moved += (dumps.len() - busy) as u64;
                done.conflicts += busy as u64;
                let keys: Vec<&[u8]> = dumps.iter().map(|d| d.key.as_ref()).collect();
                from.eval(RELEASE, &keys, &[token.as_bytes()]).await?;
            }
            // Too late (the lease passed on the way): the claims stay, and
            // are claimed again once their deadline has passed.
            Restored::Expired => done.pending.extend(dumps.into_iter().map(|d| d.key)),
        }
    }
    for (key, claim) in held {
        match resolve(from, to, &key, &claim, lease).await? {
            Resolved::Settled(moved) => done.moved += moved,
            Resolved::Pending => done.pending.push(key),
        }
    }
    Ok(done)
}

/// What a restore did.
enum Restored {
    /// Restored now (or before, under this token): how many of the keys
    /// were on the new server already (kept).
    Done(usize),
    /// Refused: past the deadline.
    Expired,
}

async fn restore(to: &Link<'_>, token: &str, deadline: &str, dumps: &[Dump]) -> Result<Restored, String> {
    let keys: Vec<&[u8]> = dumps.iter().map(|d| d.key.as_ref()).collect();
    let mut args: Vec<&[u8]> = vec![token.as_bytes(), deadline.as_bytes()];
    for d in dumps {
        args.push(&d.at);
        args.push(&d.payload);
    }
    let reply = to.eval(RESTORE, &keys, &args).await?;
    match bulk(&reply) {
        Some(b"done") => Ok(Restored::Done(0)),
        Some(b"expired") => Ok(Restored::Expired),
        _ => array_items(&reply).map(|busy| Restored::Done(busy.len())).ok_or_else(|| unexpected("restore", &reply)),
    }
}

/// What became of a claim found on the old server.
enum Resolved {
    /// It is settled: its data is on the new server (restored by this
    /// call: 1, or before: 0), or it expired while held.
    Settled(u64),
    /// Its lease has not passed yet.
    Pending,
}

/// Resolves the claim `claim` (`TOKEN DEADLINE`) of `key` on `from`.
async fn resolve(
    from: &Link<'_>,
    to: &Link<'_>,
    key: &Bytes,
    claim: &[u8],
    lease: Duration,
) -> Result<Resolved, String> {
    let text = std::str::from_utf8(claim).map_err(|_| "a claim that is not text".to_owned())?;
    let (old_token, deadline) = text.split_once(' ').ok_or_else(|| format!("a malformed claim {text:?}"))?;
    let status = to.eval(STATUS, &[], &[old_token.as_bytes(), deadline.as_bytes()]).await?;
    match bulk(&status) {
        Some(b"wait") => Ok(Resolved::Pending),
        Some(b"done") => {
            from.eval(RELEASE, &[key], &[old_token.as_bytes()]).await?;
            Ok(Resolved::Settled(0))
        }
        Some(b"lost") => {
            let token = token();
            let lease_ms = lease.as_millis().max(1).to_string();
            let reply = from.eval(RECLAIM, &[key], &[claim, token.as_bytes(), lease_ms.as_bytes()]).await?;
            if let Some(n) = integer(&reply) {
                // 0: someone else took it on; 1: it expired while held.
                return Ok(if n == 0 { Resolved::Pending } else { Resolved::Settled(0) });
            }
            let parts = array_items(&reply).filter(|p| p.len() == 3).ok_or_else(|| unexpected("reclaim", &reply))?;
            let deadline = integer(&parts[0]).ok_or_else(|| unexpected("reclaim", &reply))?.to_string();
            let dump = Dump {
                key: key.clone(),
                at: Bytes::from(integer(&parts[2]).ok_or_else(|| unexpected("reclaim", &reply))?.to_string()),
                payload: Bytes::copy_from_slice(bulk(&parts[1]).ok_or_else(|| unexpected("reclaim", &reply))?),
            };
            match restore(to, &token, &deadline, std::slice::from_ref(&dump)).await? {
                Restored::Done(busy) => {
                    from.eval(RELEASE, &[key], &[token.as_bytes()]).await?;
                    Ok(Resolved::Settled(u64::from(busy == 0)))
                }
                Restored::Expired => Ok(Resolved::Pending),
            }
        }
        _ => Err(unexpected("claim status", &status)),
    }
}

/// The claims left on `from` (by copies that stopped, or are in
/// progress): each key with its claim.
pub(super) async fn claims(from: &Link<'_>) -> Result<Vec<(Bytes, Bytes)>, String> {
    // Asked in RESP2 (the mover's dialect): a flat array.
    let reply = from.ask(&[b"HGETALL", b"chash-copy:meta"]).await?;
    let items = array_items(&reply).ok_or_else(|| unexpected("HGETALL", &reply))?;
    let mut out = Vec::new();
    for pair in items.chunks(2) {
        if let [k, v] = pair {
            let k = bulk(k).ok_or_else(|| unexpected("HGETALL", k))?;
            let v = bulk(v).ok_or_else(|| unexpected("HGETALL", v))?;
            out.push((Bytes::copy_from_slice(k), Bytes::copy_from_slice(v)));
        }
    }
    Ok(out)
}

/// Resolves the claims left on `from` whose keys move to `to`: how many
/// keys that moved, and how many are still within their lease.
pub(super) async fn resolve_left(
    from: &Link<'_>,
    to: &Link<'_>,
    left: &[(Bytes, Bytes)],
    lease: Duration,
) -> Result<(u64, u64), String> {
    let (mut moved, mut pending) = (0, 0);
    for (key, claim) in left {
        match resolve(from, to, key, claim, lease).await? {
            Resolved::Settled(n) => moved += n,
            Resolved::Pending => pending += 1,
        }
    }
    Ok((moved, pending))
}

/// Before a change that copies: can each of `servers` run the scripts a
/// copy needs (`EVAL` with `DUMP`, `RESTORE ... ABSTTL`, `PEXPIRETIME`,
/// `TIME`)? A probe key is dumped, restored under another name and both
/// deleted.
pub const PROBE: &str = "\
local k = KEYS[1]
redis.call('SET', k, '1', 'PX', 60000)
local d = redis.call('DUMP', k)
local at = redis.call('PEXPIRETIME', k)
redis.call('TIME')
redis.call('RESTORE', k .. ':restored', at, d, 'ABSTTL', 'REPLACE')
redis.call('DEL', k, k .. ':restored')
return 'OK'";
