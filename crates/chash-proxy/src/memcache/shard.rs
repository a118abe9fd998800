//! Embedded cache shards: small memcached-compatible servers inside the
//! proxy process, so `chash proxy` and `chash demo` work with nothing
//! installed.
//!
//! Each shard listens on a loopback port and speaks the memcached ASCII
//! protocol (the same parser as the proxy); its store is a weight-bounded
//! cache (`quick_cache`, evicting by its CLOCK-Pro policy when the memory
//! bound is reached) with memcached's expiry rules, split into 16 locked
//! segments so read-modify-write commands (`cas`, `incr`, `append`, ...) are
//! atomic per key.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use quick_cache::unsync::Cache;
use quick_cache::Weighter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::request::skip_discarded;

mod meta;
use super::{parse_more_keys, parse_request, ArithOp, Limits, Parsed, Request, RetrievalCmd, StorageCmd};

/// Largest value a shard stores (memcached's default item size limit).
pub const MAX_VALUE: usize = 1024 * 1024;

/// Shards accept what memcached accepts (the proxy in front decides how
/// strict clients must be).
const SHARD_LIMITS: Limits = Limits { max_value: MAX_VALUE, lenient_keys: true };

#[derive(Clone, Debug)]
struct Item {
    data: Bytes,
    flags: u32,
    cas: u64,
    expires: Option<Instant>,
    /// Read since it was stored (meta `h`).
    fetched: bool,
    /// Last read or stored (meta `l`).
    accessed: Instant,
    /// Marked stale (`md ... I`, or a set with an old CAS and `I`).
    stale: bool,
    /// A client was told it won the right to recache it (meta `W`).
    won: bool,
    /// Stored under a base64 key (`b`): its key is shown in base64.
    binary_key: bool,
}

impl Item {
    fn new(data: Bytes, flags: u32, cas: u64, expires: Option<Instant>) -> Item {
        Item {
            data,
            flags,
            cas,
            expires,
            fetched: false,
            accessed: Instant::now(),
            stale: false,
            won: false,
            binary_key: false,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct ItemWeight;

impl Weighter<Bytes, Item> for ItemWeight {
    fn weight(&self, key: &Bytes, item: &Item) -> u64 {
        // Key, value and a fixed overhead per entry.
        (key.len() + item.data.len() + 64) as u64
    }
}

const SEGMENTS: usize = 16;

/// A store with expiry and a memory bound.
pub struct Store {
    segments: Vec<Mutex<Cache<Bytes, Item, ItemWeight>>>,
    next_cas: AtomicU64,
    /// Items stored.
    pub sets: AtomicU64,
    /// Lookups that found an item.
    pub hits: AtomicU64,
    /// Lookups that found nothing.
    pub misses: AtomicU64,
}

/// memcached's rule: 0 never expires, negative is already expired, up to 30
/// days is relative, more is an absolute unix time.
fn expiry(exptime: i64) -> Option<Option<Instant>> {
    const MONTH: i64 = 60 * 60 * 24 * 30;
    let now = Instant::now();
    match exptime {
        0 => Some(None),
        e if e < 0 => None,
        e if e <= MONTH => Some(Some(now + Duration::from_secs(e as u64))),
        e => {
            let unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
            if e <= unix {
                None
            } else {
                Some(Some(now + Duration::from_secs((e - unix) as u64)))
            }
        }
    }
}

impl Store {
    /// A store holding at most about `memory` bytes.
    pub fn new(memory: u64) -> Store {
        let per = (memory / SEGMENTS as u64).max(64 * 1024);
        Store {
            segments: (0..SEGMENTS).map(|_| Mutex::new(Cache::with_weighter(1024, per, ItemWeight))).collect(),
            next_cas: AtomicU64::new(1),
            sets: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Whether a live item is stored under `key`.
    pub fn contains(&self, key: &[u8]) -> bool {
        Store::live(&mut self.segment(key), key).is_some()
    }

    /// Items held now (expired ones not yet removed included).
    pub fn items(&self) -> usize {
        self.segments.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len()).sum()
    }

    fn segment(&self, key: &[u8]) -> std::sync::MutexGuard<'_, Cache<Bytes, Item, ItemWeight>> {
        let i = (chash::KeyHasher::Xxh3.hash(key) % SEGMENTS as u64) as usize;
        self.segments[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live item for `key` in a locked segment (expired ones are removed).
    fn live(seg: &mut Cache<Bytes, Item, ItemWeight>, key: &[u8]) -> Option<Item> {
        let item = seg.get(key)?.clone();
        if item.expires.is_some_and(|t| t <= Instant::now()) {
            seg.remove(key);
            return None;
        }
        Some(item)
    }

    fn cas(&self) -> u64 {
        self.next_cas.fetch_add(1, Relaxed)
    }

    /// Runs one request and appends its reply to `out`.
    pub fn execute(&self, req: &Request, out: &mut BytesMut) {
        let reply: &[u8] = match req {
            Request::Storage { cmd, key, flags, exptime, data, cas, .. } => {
                self.store(*cmd, key, *flags, *exptime, data, *cas)
            }
            Request::Retrieval { cmd, exptime, keys } => {
                for key in keys {
                    let mut seg = self.segment(key);
                    let Some(mut item) = Store::live(&mut seg, key) else {
                        self.misses.fetch_add(1, Relaxed);
                        continue;
                    };
                    if matches!(cmd, RetrievalCmd::Gat | RetrievalCmd::Gats) {
                        match expiry(*exptime) {
                            Some(expires) => {
                                item.expires = expires;
                                seg.insert(key.clone(), item.clone());
                            }
                            None => {
                                seg.remove(&key[..]);
                                self.misses.fetch_add(1, Relaxed);
                                continue;
                            }
                        }
                    }
                    if let Some(mut stored) = seg.get_mut(&key[..]) {
                        stored.fetched = true;
                        stored.accessed = Instant::now();
                    }
                    drop(seg);
                    self.hits.fetch_add(1, Relaxed);
                    out.extend_from_slice(b"VALUE ");
                    out.extend_from_slice(key);
                    let header = if cmd.with_cas() {
                        format!(" {} {} {}\r\n", item.flags, item.data.len(), item.cas)
                    } else {
                        format!(" {} {}\r\n", item.flags, item.data.len())
                    };
                    out.extend_from_slice(header.as_bytes());
                    out.extend_from_slice(&item.data);
                    out.extend_from_slice(b"\r\n");
                }
                b"END\r\n"
            }
            Request::Delete { key, .. } => {
                let mut seg = self.segment(key);
                match Store::live(&mut seg, key) {
                    Some(_) => {
                        seg.remove(&key[..]);
                        b"DELETED\r\n"
                    }
                    None => b"NOT_FOUND\r\n",
                }
            }
            Request::Touch { key, exptime, .. } => {
                let mut seg = self.segment(key);
                match (Store::live(&mut seg, key), expiry(*exptime)) {
                    (Some(mut item), Some(expires)) => {
                        item.expires = expires;
                        seg.insert(key.clone(), item);
                        b"TOUCHED\r\n"
                    }
                    (Some(_), None) => {
                        seg.remove(&key[..]);
                        b"TOUCHED\r\n"
                    }
                    (None, _) => b"NOT_FOUND\r\n",
                }
            }
            Request::Arith { op, key, delta, .. } => {
                let mut seg = self.segment(key);
                match Store::live(&mut seg, key) {
                    None => b"NOT_FOUND\r\n",
                    Some(item) => {
                        let current =
                            std::str::from_utf8(&item.data).ok().and_then(|s| s.trim_end().parse::<u64>().ok());
                        match current {
                            None => b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
                            Some(v) => {
                                let v = match op {
                                    ArithOp::Incr => v.wrapping_add(*delta),
                                    ArithOp::Decr => v.saturating_sub(*delta),
                                };
                                let text = v.to_string();
                                let item =
                                    Item { data: Bytes::from(text.clone()), cas: self.cas(), stale: false, ..item };
                                seg.insert(key.clone(), item);
                                out.extend_from_slice(text.as_bytes());
                                b"\r\n"
                            }
                        }
                    }
                }
            }
            Request::FlushAll { .. } => {
                for s in &self.segments {
                    s.lock().unwrap_or_else(|e| e.into_inner()).clear();
                }
                b"OK\r\n"
            }
            Request::Version => {
                out.extend_from_slice(
                    format!("VERSION {}-chash-embedded-{}", super::MEMCACHED_VERSION, env!("CARGO_PKG_VERSION"))
                        .as_bytes(),
                );
                b"\r\n"
            }
            Request::Verbosity { .. } => b"OK\r\n",
            Request::Stats { .. } => {
                let items: usize =
                    self.segments.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len()).sum();
                let bytes: u64 =
                    self.segments.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).weight()).sum();
                for (name, v) in [
                    ("curr_items", items as u64),
                    ("bytes", bytes),
                    ("cmd_set", self.sets.load(Relaxed)),
                    ("get_hits", self.hits.load(Relaxed)),
                    ("get_misses", self.misses.load(Relaxed)),
                ] {
                    out.extend_from_slice(format!("STAT {name} {v}\r\n").as_bytes());
                }
                b"END\r\n"
            }
            Request::Quit => b"",
            Request::Meta(m) => {
                self.execute_meta(m, out);
                b""
            }
        };
        out.extend_from_slice(reply);
    }

    fn store(&self, cmd: StorageCmd, key: &Bytes, flags: u32, exptime: i64, data: &Bytes, cas: u64) -> &'static [u8] {
        let mut seg = self.segment(key);
        let existing = Store::live(&mut seg, key);
        let Some(expires) = expiry(exptime) else {
            // Already expired: the store succeeds and the item is gone.
            seg.remove(&key[..]);
            return match (cmd, &existing) {
                (StorageCmd::Add, Some(_)) => b"NOT_STORED\r\n",
                (StorageCmd::Replace | StorageCmd::Append | StorageCmd::Prepend, None) => b"NOT_STORED\r\n",
                (StorageCmd::Cas, None) => b"NOT_FOUND\r\n",
                (StorageCmd::Cas, Some(i)) if i.cas != cas => b"EXISTS\r\n",
                _ => b"STORED\r\n",
            };
        };
        let new_item = |data: Bytes, flags: u32, expires: Option<Instant>| Item::new(data, flags, self.cas(), expires);
        let item = match (cmd, existing) {
            (StorageCmd::Set, _) | (StorageCmd::Add, None) | (StorageCmd::Replace, Some(_)) => {
                new_item(data.clone(), flags, expires)
            }
            (StorageCmd::Add, Some(_)) | (StorageCmd::Replace, None) => return b"NOT_STORED\r\n",
            (StorageCmd::Append | StorageCmd::Prepend, None) => return b"NOT_STORED\r\n",
            (StorageCmd::Append, Some(old)) => {
                let mut joined = BytesMut::with_capacity(old.data.len() + data.len());
                joined.extend_from_slice(&old.data);
                joined.extend_from_slice(data);
                new_item(joined.freeze(), old.flags, old.expires)
            }
            (StorageCmd::Prepend, Some(old)) => {
                let mut joined = BytesMut::with_capacity(old.data.len() + data.len());
                joined.extend_from_slice(data);
                joined.extend_from_slice(&old.data);
                new_item(joined.freeze(), old.flags, old.expires)
            }
            (StorageCmd::Cas, None) => return b"NOT_FOUND\r\n",
            (StorageCmd::Cas, Some(old)) if old.cas != cas => return b"EXISTS\r\n",
            (StorageCmd::Cas, Some(_)) => new_item(data.clone(), flags, expires),
        };
        if item.data.len() > MAX_VALUE {
            return b"SERVER_ERROR object too large for cache\r\n";
        }
        seg.insert(key.clone(), item);
        self.sets.fetch_add(1, Relaxed);
        b"STORED\r\n"
    }
}

/// A running embedded shard.
#[derive(Clone)]
pub struct Shard {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its store.
    pub store: Arc<Store>,
}

/// Starts a shard on a loopback port with a store of about `memory` bytes;
/// it stops when `shutdown` turns true.
///
/// # Errors
/// When no loopback port can be bound.
pub async fn start_shard(memory: u64, shutdown: watch::Receiver<bool>) -> std::io::Result<Shard> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let store = Arc::new(Store::new(memory));
    let shard = Shard { addr, store: store.clone() };
    tokio::spawn(async move {
        let mut stop = shutdown.clone();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let _ = stream.set_nodelay(true);
                    let store = store.clone();
                    let stop = shutdown.clone();
                    tokio::spawn(serve_shard_client(stream, store, stop));
                }
                _ = stop.changed() => return,
            }
        }
    });
    Ok(shard)
}

/// Serves one client of a shard (any byte stream) until it closes or quits,
/// or `stop` turns true.
pub(crate) async fn serve_shard_client<S>(mut stream: S, store: Arc<Store>, mut stop: watch::Receiver<bool>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut out = BytesMut::with_capacity(16 * 1024);
    let mut discard = 0usize;
    let mut skip_line = false;
    let mut continuing: Option<(RetrievalCmd, i64)> = None;
    loop {
        let n = tokio::select! {
            n = stream.read_buf(&mut buf) => n,
            _ = stop.changed() => return,
        };
        if !matches!(n, Ok(k) if k > 0) {
            return;
        }
        let mut quit = false;
        loop {
            if skip_line {
                match memchr::memchr(b'\n', &buf) {
                    Some(nl) => {
                        let _ = buf.split_to(nl + 1);
                        skip_line = false;
                    }
                    None => {
                        buf.clear();
                        break;
                    }
                }
            }
            if !skip_discarded(&mut buf, &mut discard) {
                break;
            }
            let cont = continuing.take();
            let parsed = match cont {
                Some((cmd, exptime)) => parse_more_keys(&mut buf, cmd, exptime, SHARD_LIMITS),
                None => parse_request(&mut buf, SHARD_LIMITS),
            };
            match parsed {
                Parsed::Incomplete => {
                    continuing = cont;
                    break;
                }
                Parsed::Refused { reply, skip, close } => {
                    out.extend_from_slice(reply);
                    discard = skip;
                    if close {
                        quit = true;
                        break;
                    }
                }
                Parsed::TooLarge { delete, skip, noreply } => {
                    // As memcached: the key's old value goes too.
                    let mut ignored = BytesMut::new();
                    store.execute(&delete, &mut ignored);
                    if !noreply {
                        out.extend_from_slice(super::errors::TOO_LARGE);
                    }
                    discard = skip;
                }
                Parsed::RefusedLine { reply } => {
                    out.extend_from_slice(reply);
                    skip_line = true;
                }
                Parsed::Partial(req) => {
                    // A segment of a long get line: its values, no END yet.
                    if let Request::Retrieval { cmd, exptime, .. } = &req {
                        continuing = Some((*cmd, *exptime));
                    }
                    store.execute(&req, &mut out);
                    out.truncate(out.len() - b"END\r\n".len());
                }
                Parsed::Request(Request::Quit) => {
                    quit = true;
                    break;
                }
                Parsed::Request(req) => {
                    let noreply = req.noreply();
                    let mark = out.len();
                    store.execute(&req, &mut out);
                    if noreply {
                        out.truncate(mark);
                    }
                }
            }
        }
        if !out.is_empty() {
            if stream.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if quit {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn run(store: &Store, input: &[u8]) -> String {
        let mut buf = BytesMut::from(input);
        let mut out = BytesMut::new();
        while let Parsed::Request(req) = parse_request(&mut buf, SHARD_LIMITS) {
            store.execute(&req, &mut out);
        }
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn memcached_semantics() {
        let s = Store::new(1 << 20);
        assert_eq!(run(&s, b"set a 7 0 2\r\nhi\r\nget a\r\n"), "STORED\r\nVALUE a 7 2\r\nhi\r\nEND\r\n");
        assert_eq!(run(&s, b"add a 0 0 1\r\nx\r\n"), "NOT_STORED\r\n");
        assert_eq!(
            run(&s, b"append a 0 0 1\r\n!\r\nprepend a 0 0 1\r\n>\r\nget a\r\n"),
            "STORED\r\nSTORED\r\nVALUE a 7 4\r\n>hi!\r\nEND\r\n"
        );
        assert_eq!(run(&s, b"set n 0 0 2\r\n10\r\nincr n 5\r\ndecr n 100\r\n"), "STORED\r\n15\r\n0\r\n");
        assert_eq!(run(&s, b"incr a 1\r\n"), "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
        let gets = run(&s, b"gets a\r\n");
        let cas: u64 = gets.split_whitespace().nth(4).unwrap().parse().unwrap();
        assert_eq!(run(&s, format!("cas a 0 0 1 {}\r\nz\r\n", cas + 1000).as_bytes()), "EXISTS\r\n");
        assert_eq!(run(&s, format!("cas a 0 0 1 {cas}\r\nz\r\n").as_bytes()), "STORED\r\n");
        assert_eq!(run(&s, b"cas nope 0 0 1 1\r\nz\r\n"), "NOT_FOUND\r\n");
        assert_eq!(run(&s, b"set gone 0 -1 1\r\nz\r\nget gone\r\n"), "STORED\r\nEND\r\n");
        assert_eq!(run(&s, b"touch a 100\r\ndelete a\r\ndelete a\r\n"), "TOUCHED\r\nDELETED\r\nNOT_FOUND\r\n");
        assert_eq!(run(&s, b"flush_all\r\nget n\r\n"), "OK\r\nEND\r\n");
    }

    #[test]
    fn memory_is_bounded() {
        let s = Store::new(2 << 20);
        let value = vec![b'v'; 1000];
        for i in 0..20_000 {
            let mut buf = BytesMut::from(format!("set k{i} 0 0 1000\r\n").as_bytes());
            buf.extend_from_slice(&value);
            buf.extend_from_slice(b"\r\n");
            let mut out = BytesMut::new();
            if let Parsed::Request(r) = parse_request(&mut buf, SHARD_LIMITS) {
                s.execute(&r, &mut out);
            }
        }
        let bytes: u64 = s.segments.iter().map(|seg| seg.lock().unwrap().weight()).sum();
        assert!(bytes <= 2 << 20, "{bytes}");
    }
}
