//! The shards' meta commands, with memcached 1.6's semantics: CAS, TTLs,
//! client flags, append and add modes, `N` (create on miss), `R`
//! (recache), `I` (invalidate: stale items), the `W`/`X`/`Z` win and stale
//! flags, `h`/`l`/`t`, base64 keys, `q`. Flags are applied and echoed in
//! request order, as memcached does. `me` shows what a shard has: the
//! remaining time to live (not memcached's negative figure), `cls=1` and
//! the entry's weight as `size`.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::{expiry, Item, Store, MAX_VALUE};
use crate::memcache::meta::{encode_key, MetaCmd, MetaRequest};

/// Seconds left to live, `-1` for never (rounded up, so a fresh `T30`
/// shows 30).
fn ttl(item: &Item, now: Instant) -> i64 {
    match item.expires {
        None => -1,
        Some(t) => (t.saturating_duration_since(now) + Duration::from_millis(999)).as_secs() as i64,
    }
}

/// Writes ` <letter><value>`.
fn put(out: &mut BytesMut, letter: u8, value: &[u8]) {
    out.extend_from_slice(&[b' ', letter]);
    out.extend_from_slice(value);
}

fn put_num(out: &mut BytesMut, letter: u8, n: impl itoa::Integer) {
    put(out, letter, itoa::Buffer::new().format(n).as_bytes());
}

/// ` k<key>`: the key as the item was stored (base64 and ` b` when it was
/// stored with `b`), or as the request sent it when there is no item.
fn put_key(out: &mut BytesMut, m: &MetaRequest, item: Option<&Item>) {
    let binary = item.map_or(m.base64, |i| i.binary_key);
    if binary {
        put(out, b'k', &encode_key(&m.real_key));
        out.extend_from_slice(b" b");
    } else {
        put(out, b'k', &m.real_key);
    }
}

/// The reply to a request without an item (`EN`, `NF`, `NS`, `EX`): only
/// `O` and `k` are echoed (and `ms`'s `c`, as `c0`).
fn miss(out: &mut BytesMut, code: &[u8], m: &MetaRequest) {
    out.extend_from_slice(code);
    for f in &m.flags {
        match f[0] {
            b'O' => put(out, b'O', &f[1..]),
            b'k' => put_key(out, m, None),
            b'c' if m.cmd == MetaCmd::Set => put(out, b'c', b"0"),
            _ => {}
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// `HD <flags>` or, with `v`, `VA <size> <flags>` and the value.
fn found(out: &mut BytesMut, m: &MetaRequest, flags: &[u8], value: &[u8]) {
    if m.has(b'v') {
        out.extend_from_slice(b"VA ");
        out.extend_from_slice(itoa::Buffer::new().format(value.len()).as_bytes());
        out.extend_from_slice(flags);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(b"HD");
        out.extend_from_slice(flags);
        out.extend_from_slice(b"\r\n");
    }
}

/// A TTL flag's new expiry; `None`: already expired.
fn expiry_of(m: &MetaRequest, letter: u8) -> Option<Option<Instant>> {
    expiry(i64::from(m.number::<i32>(letter).unwrap_or(0)))
}

impl Store {
    /// Runs a meta request and appends its reply to `out` (none when `q`
    /// leaves it out).
    pub(super) fn execute_meta(&self, m: &MetaRequest, out: &mut BytesMut) {
        let mark = out.len();
        let quiet_drops = match m.cmd {
            MetaCmd::Noop => {
                out.extend_from_slice(b"MN\r\n");
                false
            }
            MetaCmd::Get => self.meta_get(m, out),
            MetaCmd::Set => self.meta_set(m, out),
            MetaCmd::Delete => self.meta_delete(m, out),
            MetaCmd::Arith => self.meta_arith(m, out),
            MetaCmd::Debug => {
                self.meta_debug(m, out);
                false
            }
        };
        if m.quiet && quiet_drops {
            out.truncate(mark);
        }
    }

    /// `mg`; whether the reply is one `q` leaves out (a miss).
    fn meta_get(&self, m: &MetaRequest, out: &mut BytesMut) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let key = &m.real_key;
        let now = Instant::now();
        let mut seg = self.segment(key);
        let mut won = false;
        let mut vivified = false;
        let item = match Store::live(&mut seg, key) {
            Some(item) => item,
            None if m.has(b'N') => {
                // Created empty for the client that wins the right to fill it.
                let mut item = Item::new(Bytes::new(), 0, self.cas(), None);
                item.binary_key = m.base64;
                item.won = true;
                won = true;
                vivified = true;
                item
            }
            None => {
                drop(seg);
                self.misses.fetch_add(1, Relaxed);
                miss(out, b"EN", m);
                return true;
            }
        };
        let mut item = item;
        let (was_fetched, was_accessed) = (item.fetched, item.accessed);
        let mut flags = BytesMut::new();
        for f in &m.flags {
            match f[0] {
                b'T' => {
                    if let Some(expires) = expiry_of(m, b'T') {
                        item.expires = expires;
                    } else {
                        item.expires = Some(now);
                    }
                }
                b'N' if vivified => item.expires = expiry_of(m, b'N').unwrap_or(Some(now)),
                b'R' if !vivified && !item.won => {
                    let limit = now + Duration::from_secs(m.number::<i32>(b'R').unwrap_or(0).max(0) as u64);
                    if item.expires.is_some_and(|t| t < limit) {
                        item.won = true;
                        won = true;
                    }
                }
                b'c' => put_num(&mut flags, b'c', item.cas),
                b'f' => put_num(&mut flags, b'f', item.flags),
                b'h' => put(&mut flags, b'h', if was_fetched { b"1" } else { b"0" }),
                b'k' => put_key(&mut flags, m, Some(&item)),
                b'l' => put_num(&mut flags, b'l', now.saturating_duration_since(was_accessed).as_secs()),
                b'O' => put(&mut flags, b'O', &f[1..]),
                b's' => put_num(&mut flags, b's', item.data.len()),
                b't' => put_num(&mut flags, b't', ttl(&item, now)),
                _ => {}
            }
        }
        // A stale item's first reader wins the right to refresh it.
        if item.stale && !item.won {
            item.won = true;
            won = true;
        }
        if item.won && !won {
            flags.extend_from_slice(b" Z");
        }
        if item.stale {
            flags.extend_from_slice(b" X");
        }
        if won {
            flags.extend_from_slice(b" W");
        }
        if !m.has(b'u') {
            item.fetched = true;
            item.accessed = now;
        }
        let value = item.data.clone();
        seg.insert(key.clone(), item);
        drop(seg);
        self.hits.fetch_add(1, Relaxed);
        found(out, m, &flags, &value);
        false
    }

    /// `ms`; whether the reply is one `q` leaves out (`HD`).
    fn meta_set(&self, m: &MetaRequest, out: &mut BytesMut) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let key = &m.real_key;
        let data = m.data.clone().unwrap_or_default();
        let mode = m.flag(b'M').map_or(b'S', |a| a[0]);
        let compare = m.number::<u64>(b'C');
        let mut seg = self.segment(key);
        let existing = Store::live(&mut seg, key);
        let now = Instant::now();
        let mut stale = false;
        let code: &[u8] = match (mode, &existing, compare) {
            (b'E', Some(_), _) => b"NS",
            (b'E', None, _) => b"HD",
            (b'S' | b'R', None, Some(_)) => b"NF",
            (b'R' | b'A' | b'P', None, _) => b"NS",
            (_, Some(old), Some(cas)) if cas != old.cas => {
                if m.has(b'I') && cas < old.cas {
                    // An older writer's value: kept, but marked stale.
                    stale = true;
                    b"HD"
                } else {
                    b"EX"
                }
            }
            _ => b"HD",
        };
        if code != b"HD" {
            drop(seg);
            miss(out, code, m);
            return false;
        }
        let flags = m.number::<u64>(b'F').map_or(0, |f| f as u32);
        let expires = expiry_of(m, b'T');
        let item = match (mode, existing) {
            (b'A' | b'P', Some(old)) => {
                let mut joined = BytesMut::with_capacity(old.data.len() + data.len());
                let (first, second) = if mode == b'A' { (&old.data, &data) } else { (&data, &old.data) };
                joined.extend_from_slice(first);
                joined.extend_from_slice(second);
                let mut item = Item::new(joined.freeze(), old.flags, self.cas(), old.expires);
                item.binary_key = old.binary_key;
                item
            }
            (_, Some(old)) if stale => {
                let mut item = Item::new(data, flags, self.cas(), old.expires);
                item.won = old.won;
                item.stale = true;
                item
            }
            _ => {
                let mut item = Item::new(data, flags, self.cas(), expires.unwrap_or(Some(now)));
                item.binary_key = m.base64;
                item
            }
        };
        if item.data.len() > MAX_VALUE {
            seg.remove(&key[..]);
            drop(seg);
            out.extend_from_slice(b"SERVER_ERROR object too large for cache\r\n");
            return false;
        }
        let cas = item.cas;
        let shown = item.clone();
        seg.insert(key.clone(), item);
        drop(seg);
        self.sets.fetch_add(1, Relaxed);
        out.extend_from_slice(b"HD");
        for f in &m.flags {
            match f[0] {
                b'c' => put_num(out, b'c', cas),
                b'k' => put_key(out, m, Some(&shown)),
                b'O' => put(out, b'O', &f[1..]),
                _ => {}
            }
        }
        out.extend_from_slice(b"\r\n");
        true
    }

    /// `md`; whether the reply is one `q` leaves out (`HD`).
    fn meta_delete(&self, m: &MetaRequest, out: &mut BytesMut) -> bool {
        let key = &m.real_key;
        let mut seg = self.segment(key);
        let Some(mut item) = Store::live(&mut seg, key) else {
            drop(seg);
            miss(out, b"NF", m);
            return false;
        };
        if m.number::<u64>(b'C').is_some_and(|cas| cas != item.cas) {
            drop(seg);
            miss(out, b"EX", m);
            return false;
        }
        if m.has(b'I') {
            // Invalidated: kept for readers, stale, and up for a new winner.
            item.stale = true;
            item.won = false;
            item.cas = self.cas();
            if m.has(b'T') {
                item.expires = expiry_of(m, b'T').unwrap_or(Some(Instant::now()));
            }
            seg.insert(key.clone(), item);
        } else {
            seg.remove(&key[..]);
        }
        drop(seg);
        miss(out, b"HD", m);
        true
    }

    /// `ma`; whether the reply is one `q` leaves out (a plain success).
    fn meta_arith(&self, m: &MetaRequest, out: &mut BytesMut) -> bool {
        let key = &m.real_key;
        let now = Instant::now();
        let mut seg = self.segment(key);
        let (mut item, created) = match Store::live(&mut seg, key) {
            Some(item) => (item, false),
            None if m.has(b'N') => {
                let initial = m.number::<u64>(b'J').unwrap_or(0);
                let expires = expiry_of(m, b'N').unwrap_or(Some(now));
                let mut item = Item::new(Bytes::from(initial.to_string()), 0, self.cas(), expires);
                item.binary_key = m.base64;
                (item, true)
            }
            None => {
                drop(seg);
                miss(out, b"NF", m);
                return false;
            }
        };
        if !created {
            if m.number::<u64>(b'C').is_some_and(|cas| cas != item.cas) {
                drop(seg);
                miss(out, b"EX", m);
                return false;
            }
            let current = std::str::from_utf8(&item.data).ok().and_then(|s| s.parse::<u64>().ok());
            let Some(current) = current.filter(|_| item.data.len() <= 20) else {
                drop(seg);
                out.extend_from_slice(b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
                return false;
            };
            let delta = m.number::<u64>(b'D').unwrap_or(1);
            let decrement = m.flag(b'M').is_some_and(|a| a[0] == b'D' || a[0] == b'-');
            let value = if decrement { current.saturating_sub(delta) } else { current.wrapping_add(delta) };
            item.data = Bytes::from(value.to_string());
            item.cas = self.cas();
        }
        let mut flags = BytesMut::new();
        for f in &m.flags {
            match f[0] {
                b'T' if !created => item.expires = expiry_of(m, b'T').unwrap_or(Some(now)),
                b't' => put_num(&mut flags, b't', ttl(&item, now)),
                b'c' => put_num(&mut flags, b'c', item.cas),
                b'k' => put_key(&mut flags, m, Some(&item)),
                b'O' => put(&mut flags, b'O', &f[1..]),
                _ => {}
            }
        }
        let value = item.data.clone();
        seg.insert(key.clone(), item);
        drop(seg);
        found(out, m, &flags, &value);
        !created
    }

    /// `me`: an item's metadata, or `EN`.
    fn meta_debug(&self, m: &MetaRequest, out: &mut BytesMut) {
        let key = &m.real_key;
        let mut seg = self.segment(key);
        let Some(item) = Store::live(&mut seg, key) else {
            out.extend_from_slice(b"EN\r\n");
            return;
        };
        drop(seg);
        let now = Instant::now();
        let shown = if item.binary_key { encode_key(key) } else { key.to_vec() };
        out.extend_from_slice(b"ME ");
        out.extend_from_slice(&shown);
        let line = format!(
            " exp={} la={} cas={} fetch={} cls=1 size={}\r\n",
            ttl(&item, now),
            now.saturating_duration_since(item.accessed).as_secs(),
            item.cas,
            if item.fetched { "yes" } else { "no" },
            key.len() + item.data.len() + 64
        );
        out.extend_from_slice(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use crate::memcache::shard::tests::run;
    use crate::memcache::shard::Store;

    #[test]
    fn meta_semantics() {
        let s = Store::new(1 << 20);
        assert_eq!(run(&s, b"ms foo 3 T0 F5 c k O9\r\nbar\r\n"), "HD c1 kfoo O9\r\n");
        assert_eq!(run(&s, b"mg foo k v O123 t f s c\r\n"), "VA 3 kfoo O123 t-1 f5 s3 c1\r\nbar\r\n");
        assert_eq!(run(&s, b"mg foo\r\n"), "HD\r\n");
        assert_eq!(run(&s, b"mg nope O1 k\r\nmg nope q\r\nmn\r\n"), "EN O1 knope\r\nMN\r\n");
        assert_eq!(
            run(&s, b"ms foo 1 MA\r\n!\r\nms foo 1 MP\r\n>\r\nmg foo v f\r\n"),
            "HD\r\nHD\r\nVA 5 f5\r\n>bar!\r\n"
        );
        assert_eq!(run(&s, b"ms foo 1 ME c O1 k\r\nx\r\n"), "NS c0 O1 kfoo\r\n");
        assert_eq!(run(&s, b"ms new 1 MR\r\nx\r\nms new 1 C5\r\nx\r\n"), "NS\r\nNF\r\n");
        assert_eq!(run(&s, b"ms foo 1 C999 c\r\nx\r\n"), "EX c0\r\n");
        // Base64 keys are the same items as plain ones, shown as stored.
        assert_eq!(run(&s, b"ms Zm9v 2 b k\r\nhi\r\nmg foo v k\r\n"), "HD kZm9v b\r\nVA 2 kZm9v b\r\nhi\r\n");
        // Vivify: the first client wins, the next sees Z.
        assert_eq!(run(&s, b"mg v1 N30 s t O1 k\r\n"), "HD s0 t30 O1 kv1 W\r\n");
        assert_eq!(run(&s, b"mg v1 N30 s\r\n"), "HD s0 Z\r\n");
        // Invalidation: stale, one winner, then a fresh set clears it.
        assert_eq!(run(&s, b"ms s 5 T100\r\nhello\r\nmd s I T30 O7 k c\r\n"), "HD\r\nHD O7 ks\r\n");
        assert_eq!(run(&s, b"mg s v t\r\nmg s t\r\n"), "VA 5 t30 X W\r\nhello\r\nHD t30 Z X\r\n");
        let cas: u64 = run(&s, b"mg s c\r\n").split_whitespace().nth(1).unwrap()[1..].parse().unwrap();
        assert_eq!(run(&s, format!("ms s 3 C{} I c\r\nold\r\n", cas - 1).as_bytes()), format!("HD c{}\r\n", cas + 1));
        assert_eq!(run(&s, b"mg s v\r\n"), "VA 3 Z X\r\nold\r\n");
        assert_eq!(run(&s, b"ms s 3 T100\r\nnew\r\nmg s v\r\n"), "HD\r\nVA 3\r\nnew\r\n");
        // Recache: a client wins when the item expires within R seconds.
        assert_eq!(run(&s, b"ms r 2 T10\r\nhi\r\nmg r R30 t\r\nmg r R30\r\n"), "HD\r\nHD t10 W\r\nHD Z\r\n");
        assert_eq!(run(&s, b"ms r3 2 T0\r\nhi\r\nmg r3 R30 t\r\n"), "HD\r\nHD t-1\r\n");
        // h, u.
        assert_eq!(
            run(&s, b"ms hh 1\r\nx\r\nmg hh h u\r\nmg hh h\r\nmg hh h\r\n"),
            "HD\r\nHD h0\r\nHD h0\r\nHD h1\r\n"
        );
        // T before or after t.
        assert_eq!(run(&s, b"mg hh t T30\r\nmg hh T50 t\r\n"), "HD t-1\r\nHD t50\r\n");
        // md.
        assert_eq!(run(&s, b"md hh q\r\nmd hh q\r\nmd nope C1 O1 k\r\nmn\r\n"), "NF\r\nNF O1 knope\r\nMN\r\n");
        // ma.
        assert_eq!(run(&s, b"ma n1\r\nma n1 N0 J10 v t O1 k\r\n"), "NF\r\nVA 2 t-1 O1 kn1\r\n10\r\n");
        assert_eq!(
            run(&s, b"ma n1 v\r\nma n1 v D5\r\nma n1 v MD D100\r\nma n1 q\r\nmn\r\n"),
            "VA 2\r\n11\r\nVA 2\r\n16\r\nVA 1\r\n0\r\nMN\r\n"
        );
        assert_eq!(run(&s, b"ma nope q N0\r\nmn\r\n"), "HD\r\nMN\r\n");
        assert_eq!(run(&s, b"ma foo\r\n"), "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
        assert_eq!(run(&s, b"ms big 20\r\n18446744073709551615\r\nma big v\r\n"), "HD\r\nVA 1\r\n0\r\n");
        // me.
        assert!(run(&s, b"me n1\r\n").starts_with("ME n1 exp=-1 la=0 cas="));
        assert_eq!(run(&s, b"me gone\r\n"), "EN\r\n");
        // Classic and meta share items.
        assert_eq!(
            run(&s, b"set cl 3 0 2\r\nab\r\nmg cl v f\r\nms cl 2 F4\r\ncd\r\nget cl\r\n"),
            "STORED\r\nVA 2 f3\r\nab\r\nHD\r\nVALUE cl 4 2\r\ncd\r\nEND\r\n"
        );
    }
}
