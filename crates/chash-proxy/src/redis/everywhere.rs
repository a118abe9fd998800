//! Commands about the whole keyspace, answered from every server of the
//! pool: `SCAN` (one server after another, the cursor carrying which
//! server and the membership it was made under), `KEYS`, `DBSIZE`,
//! `RANDOMKEY`, `FLUSHDB` and `FLUSHALL`, `INFO` (the proxy's section and
//! the servers' combined), `TIME` and `LASTSAVE`.
//!
//! `SCAN` and `KEYS` return a key only from the server the pool places it
//! on: a copy left on another server by a membership change (not
//! migrated) is not the key clients read, and is not listed, so each key
//! comes once.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::command::Every;
use super::errors::{arity, err, forward_error};
use super::resp::{array_items, bulk, error, integer, Command, WHOLE};
use super::session::RedisSession;
use crate::backend::{Reply, Server};
use crate::conn::{bytes_reply, ready_owned, PendingReply};
use crate::pool::Pool;

/// A `SCAN` cursor through the proxy: the server's own cursor, which
/// server of the pool's live ones (in config order), and a tag of the
/// membership it was made under, packed into one number as Redis's are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cursor {
    server: u64,
    index: u64,
    tag: u64,
}

const INDEX_BITS: u32 = 10;
const TAG_BITS: u32 = 12;
/// The largest server cursor a proxy cursor holds: Redis's cursors index
/// its hash table, far below this (4 × 10¹²) for any real keyspace.
const MAX_SERVER_CURSOR: u64 = (1 << (64 - INDEX_BITS - TAG_BITS)) - 1;

impl Cursor {
    fn pack(self) -> u64 {
        (self.server << (INDEX_BITS + TAG_BITS)) | (self.tag << INDEX_BITS) | self.index
    }

    fn unpack(n: u64) -> Cursor {
        Cursor {
            server: n >> (INDEX_BITS + TAG_BITS),
            index: n & ((1 << INDEX_BITS) - 1),
            tag: (n >> INDEX_BITS) & ((1 << TAG_BITS) - 1),
        }
    }
}

/// A tag of the pool's live membership (never 0, so that a cursor past
/// the first reply always carries one).
fn membership_tag(state: &crate::pool::PoolState) -> u64 {
    let mut text = state.version.clone();
    for m in state.live() {
        text.push(' ');
        text.push_str(&m.line.id);
    }
    (chash::KeyHasher::Xxh3.hash(text.as_bytes()) % ((1 << TAG_BITS) - 1)) + 1
}

/// The content of a bulk (or RESP3 verbatim) string reply.
fn text_of(frame: &[u8]) -> Option<&[u8]> {
    let kind = *frame.first()?;
    if kind != b'$' && kind != b'=' {
        return None;
    }
    let nl = frame.iter().position(|&b| b == b'\n')?;
    let body = frame.get(nl + 1..frame.len().checked_sub(2)?)?;
    // A verbatim string starts with its format: `txt:`.
    Some(if kind == b'=' { body.get(4..)? } else { body })
}

impl RedisSession {
    pub(super) async fn everywhere(&self, what: Every, cmd: Command) -> PendingReply {
        let pool = &self.pool;
        if !what.fits(cmd.args.len()) {
            return err(pool, arity(&cmd.name()));
        }
        match what {
            Every::Scan => self.scan(cmd).await,
            Every::Keys => self.keys(cmd).await,
            Every::Dbsize => self.gather(cmd, Combine::Sum, false).await,
            Every::LastSave => self.gather(cmd, Combine::Min, false).await,
            Every::Flush => {
                let mode = cmd.args.get(1).map(|a| a.to_ascii_uppercase());
                if mode.as_deref().is_some_and(|m| m != b"ASYNC" && m != b"SYNC") {
                    return err(pool, "ERR syntax error".into());
                }
                // Every member: a flush that left an ejected server's keys
                // would bring them back with it.
                self.gather(cmd, Combine::AllOk, true).await
            }
            Every::Time | Every::RandomKey => self.one(what, cmd).await,
            Every::Info => self.info_all(cmd).await,
            Every::Pubsub => self.pubsub_info(cmd).await,
        }
    }

    /// The live servers, or all members.
    fn servers(&self, members: bool) -> Vec<Arc<Server>> {
        let state = self.pool.state();
        if members {
            state.members.iter().map(|m| m.server.clone()).collect()
        } else {
            state.key_servers()
        }
    }

    /// `cmd` sent to each of `servers`; their replies, or why there is none.
    async fn ask_all(
        &self,
        servers: Vec<Arc<Server>>,
        cmd: &Command,
    ) -> impl std::future::Future<Output = Vec<(Arc<Server>, Result<Bytes, String>)>> + Send + 'static {
        let data = cmd.wire();
        let mut waits = Vec::with_capacity(servers.len());
        for server in servers {
            let pending = server.submit(data.clone(), WHOLE, &self.requester).await;
            waits.push((server, pending));
        }
        async move {
            let mut out = Vec::with_capacity(waits.len());
            for (server, pending) in waits {
                let r = match server.finish(pending).await {
                    Ok(Reply::Whole(f)) if f.starts_with(b"-") => {
                        Err(String::from_utf8_lossy(&f[1..]).trim_end().to_owned())
                    }
                    Ok(Reply::Whole(f)) => Ok(f),
                    Ok(Reply::Stream(_)) => Err("sent a reply too large to combine".into()),
                    Err(e) => Err(e.to_string()),
                };
                out.push((server, r));
            }
            out
        }
    }

    /// The servers' integer (or status) replies, combined.
    async fn gather(&self, cmd: Command, how: Combine, members: bool) -> PendingReply {
        let servers = self.servers(members);
        if servers.is_empty() {
            return ready_owned(forward_error(&self.pool, "ERR no live server in pool".into()));
        }
        let replies = self.ask_all(servers, &cmd).await;
        let pool = self.pool.clone();
        let name = cmd.name().to_ascii_lowercase();
        bytes_reply(async move {
            let replies = replies.await;
            let mut values = Vec::new();
            for (server, reply) in &replies {
                match reply {
                    Ok(frame) => values.push(integer(frame)),
                    Err(why) => return Some(failed(&pool, &name, server, why, replies.len())),
                }
            }
            Some(match how {
                Combine::AllOk => Bytes::from_static(b"+OK\r\n"),
                Combine::Sum => Bytes::from(format!(":{}\r\n", values.iter().flatten().sum::<i64>())),
                Combine::Min => Bytes::from(format!(":{}\r\n", values.iter().flatten().min().copied().unwrap_or(0))),
            })
        })
    }

    /// `TIME` (any server's clock) and `RANDOMKEY` (a key of a server
    /// chosen at random, one it is the owner of; the next server when it
    /// has none).
    async fn one(&self, what: Every, cmd: Command) -> PendingReply {
        let mut servers = self.servers(false);
        if servers.is_empty() {
            return ready_owned(forward_error(&self.pool, "ERR no live server in pool".into()));
        }
        if what == Every::Time {
            servers.truncate(1);
            let replies = self.ask_all(servers, &cmd).await;
            let pool = self.pool.clone();
            return bytes_reply(async move {
                let (server, reply) = replies.await.pop()?;
                Some(reply.unwrap_or_else(|why| failed(&pool, "time", &server, &why, 1)))
            });
        }
        let start = rand_index(servers.len());
        servers.rotate_left(start);
        let pool = self.pool.clone();
        let requester = self.requester.clone();
        let null = self.null();
        crate::conn::later(async move {
            for server in servers {
                // A few draws per server: a key it holds a stale copy of
                // is drawn again.
                for _ in 0..4 {
                    let pending = server.submit(cmd.wire(), WHOLE, &requester).await;
                    let frame = match server.finish(pending).await {
                        Ok(Reply::Whole(f)) => f,
                        Ok(Reply::Stream(_)) => break,
                        Err(e) => {
                            return Some(crate::conn::Out::Bytes(failed(
                                &pool,
                                "randomkey",
                                &server,
                                &e.to_string(),
                                2,
                            )))
                        }
                    };
                    let Some(key) = text_of(&frame) else { break };
                    if pool.state().server_for(key).is_some_and(|s| Arc::ptr_eq(s, &server)) {
                        return Some(crate::conn::Out::Bytes(frame));
                    }
                }
            }
            Some(crate::conn::Out::Bytes(Bytes::from_static(null)))
        })
    }

    /// `SCAN cursor [MATCH p] [COUNT n] [TYPE t]`: the live servers one
    /// after another, each scanned to its end.
    async fn scan(&self, cmd: Command) -> PendingReply {
        let pool = &self.pool;
        let Some(n) = std::str::from_utf8(&cmd.args[1]).ok().and_then(|c| c.parse::<u64>().ok()) else {
            return err(pool, "ERR invalid cursor".into());
        };
        let (servers, tag) = {
            let state = pool.state();
            (state.key_servers(), membership_tag(&state))
        };
        let cursor = if n == 0 { Cursor { server: 0, index: 0, tag } } else { Cursor::unpack(n) };
        if cursor.tag != tag {
            return err(
                pool,
                "ERR the pool's servers changed since this SCAN began (a membership change or an ejection): start \
                 it again from cursor 0, or keys may be missed"
                    .into(),
            );
        }
        let Some(server) = servers.get(cursor.index as usize).cloned() else {
            return err(pool, "ERR invalid cursor".into());
        };
        let at = cursor.server.to_string();
        let args: Vec<&[u8]> =
            cmd.args.iter().enumerate().map(|(i, a)| if i == 1 { at.as_bytes() } else { a }).collect();
        let pending = server.submit(Command::new(args).wire(), WHOLE, &self.requester).await;
        let pool = pool.clone();
        let count = servers.len() as u64;
        bytes_reply(async move {
            let frame = match server.finish(pending).await {
                Ok(Reply::Whole(f)) if f.starts_with(b"-") => return Some(f),
                Ok(Reply::Whole(f)) => f,
                Ok(Reply::Stream(_)) => {
                    return Some(error("ERR backend sent a SCAN reply too large: use a smaller COUNT"))
                }
                Err(e) => return Some(failed(&pool, "scan", &server, &e.to_string(), 2)),
            };
            let parts = array_items(&frame).filter(|p| p.len() == 2);
            let Some(parts) = parts else { return Some(error("ERR backend sent an unexpected SCAN reply")) };
            let next = text_of(&parts[0]).and_then(|c| std::str::from_utf8(c).ok()?.parse::<u64>().ok());
            let (Some(next), Some(keys)) = (next, array_items(&parts[1])) else {
                return Some(error("ERR backend sent an unexpected SCAN reply"));
            };
            if next > MAX_SERVER_CURSOR {
                return Some(error(&format!(
                    "ERR server {} returned SCAN cursor {next}, larger than chash-proxy's cursors carry",
                    server.id()
                )));
            }
            let following = match (next, cursor.index + 1 < count) {
                (0, false) => 0,
                (0, true) => Cursor { server: 0, index: cursor.index + 1, tag }.pack(),
                (next, _) => Cursor { server: next, index: cursor.index, tag }.pack(),
            };
            Some(key_list(&pool, Some(following), &[(server, keys)]))
        })
    }

    /// `KEYS pattern`: every live server's keys it is the owner of.
    async fn keys(&self, cmd: Command) -> PendingReply {
        let servers = self.servers(false);
        if servers.is_empty() {
            return ready_owned(forward_error(&self.pool, "ERR no live server in pool".into()));
        }
        let replies = self.ask_all(servers, &cmd).await;
        let pool = self.pool.clone();
        bytes_reply(async move {
            let replies = replies.await;
            let mut lists = Vec::new();
            for (server, reply) in &replies {
                match reply.as_ref().map(array_items) {
                    Ok(Some(keys)) => lists.push((server.clone(), keys)),
                    Ok(None) => return Some(error("ERR backend sent an unexpected KEYS reply")),
                    Err(why) => return Some(failed(&pool, "keys", server, why, replies.len())),
                }
            }
            Some(key_list(&pool, None, &lists))
        })
    }

    /// `PUBSUB CHANNELS|SHARDCHANNELS [pattern]` (the servers' lists
    /// together), `NUMPAT` (any server's: patterns are on every one),
    /// `NUMSUB|SHARDNUMSUB channel...` (each channel's server's count: the
    /// subscribers it knows, one per proxy that subscribed for its
    /// clients).
    async fn pubsub_info(&self, cmd: Command) -> PendingReply {
        let sub = String::from_utf8_lossy(&cmd.args[1]).to_ascii_uppercase();
        let pool = self.pool.clone();
        match sub.as_str() {
            "CHANNELS" | "SHARDCHANNELS" if cmd.args.len() <= 3 => {
                let replies = self.ask_all(self.servers(false), &cmd).await;
                bytes_reply(async move {
                    let mut names: Vec<Bytes> = Vec::new();
                    for (server, reply) in replies.await {
                        match reply.as_ref().map(array_items) {
                            Ok(Some(items)) => {
                                for i in items {
                                    if !names.contains(&i) {
                                        names.push(i);
                                    }
                                }
                            }
                            Ok(None) => return Some(error("ERR backend sent an unexpected PUBSUB reply")),
                            Err(why) => return Some(failed(&pool, "pubsub", &server, why, 2)),
                        }
                    }
                    let mut out = BytesMut::from(format!("*{}\r\n", names.len()).as_bytes());
                    for n in names {
                        out.extend_from_slice(&n);
                    }
                    Some(out.freeze())
                })
            }
            "NUMPAT" if cmd.args.len() == 2 => {
                let mut servers = self.servers(false);
                servers.truncate(1);
                let replies = self.ask_all(servers, &cmd).await;
                bytes_reply(async move {
                    let (server, reply) = replies.await.pop()?;
                    Some(reply.unwrap_or_else(|why| failed(&pool, "pubsub", &server, &why, 1)))
                })
            }
            "NUMSUB" | "SHARDNUMSUB" => {
                let mut asks = Vec::new();
                for channel in cmd.args.range(2..) {
                    let Some(server) = pool.state().server_for(channel).cloned() else {
                        return ready_owned(forward_error(&pool, "ERR no live server in pool".into()));
                    };
                    let one = Command::new(vec![&cmd.args[0], &cmd.args[1], channel]);
                    asks.push(self.ask_all(vec![server], &one).await);
                }
                bytes_reply(async move {
                    let mut out = BytesMut::from(format!("*{}\r\n", asks.len() * 2).as_bytes());
                    for ask in asks {
                        let Some((server, reply)) = ask.await.pop() else { continue };
                        match reply.as_ref().map(array_items) {
                            Ok(Some(pair)) if pair.len() == 2 => {
                                out.extend_from_slice(&pair[0]);
                                out.extend_from_slice(&pair[1]);
                            }
                            Ok(_) => return Some(error("ERR backend sent an unexpected PUBSUB reply")),
                            Err(why) => return Some(failed(&pool, "pubsub", &server, why, 2)),
                        }
                    }
                    Some(out.freeze())
                })
            }
            _ => err(
                &pool,
                format!(
                    "ERR unknown subcommand or wrong number of arguments for 'pubsub|{}'",
                    sub.to_ascii_lowercase()
                ),
            ),
        }
    }

    /// `INFO [section ...]`: the proxy's own section, then the servers'
    /// sections combined: counts and memory summed, the oldest
    /// `redis_version` (what clients such as BullMQ check), the keyspace
    /// summed per database.
    async fn info_all(&self, cmd: Command) -> PendingReply {
        let asked: Vec<String> = cmd.args.range(1..).map(|a| String::from_utf8_lossy(a).to_ascii_lowercase()).collect();
        let everything =
            asked.is_empty() || asked.iter().any(|s| matches!(s.as_str(), "all" | "everything" | "default"));
        let own = super::answers::info(&self.pool, &self.shared);
        let only_proxy = !everything && asked.iter().all(|s| s == "proxy");
        if only_proxy {
            return ready_owned(self.text(own.as_bytes()));
        }
        let servers = self.servers(false);
        let replies = self.ask_all(servers, &cmd).await;
        let pool = self.pool.clone();
        let resp3 = self.requester.dialect == 1;
        let with_own = everything || asked.iter().any(|s| s == "proxy");
        bytes_reply(async move {
            let replies = replies.await;
            let mut texts = Vec::new();
            for (server, reply) in &replies {
                match reply.as_ref().map(|f| text_of(f).map(|t| String::from_utf8_lossy(t).into_owned())) {
                    Ok(Some(t)) => texts.push(t),
                    Ok(None) => return Some(error("ERR backend sent an unexpected INFO reply")),
                    Err(why) => return Some(failed(&pool, "info", server, why, replies.len())),
                }
            }
            let mut text = if with_own { own } else { String::new() };
            text.push_str(&combine_info(&texts, replies.len()));
            Some(if resp3 { verbatim(text.as_bytes()) } else { bulk(text.as_bytes()) })
        })
    }

    /// A text reply in the client's protocol (RESP3: verbatim).
    fn text(&self, text: &[u8]) -> Bytes {
        if self.requester.dialect == 1 {
            verbatim(text)
        } else {
            bulk(text)
        }
    }
}

fn verbatim(text: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(text.len() + 16);
    out.extend_from_slice(format!("={}\r\ntxt:", text.len() + 4).as_bytes());
    out.extend_from_slice(text);
    out.extend_from_slice(b"\r\n");
    out.freeze()
}

/// How servers' integer replies combine.
#[derive(Clone, Copy)]
enum Combine {
    Sum,
    Min,
    AllOk,
}

/// The error for a command over every server that one server failed.
fn failed(pool: &Pool, name: &str, server: &Server, why: &str, of: usize) -> Bytes {
    let whole = if of > 1 { format!(" ({of} servers asked; the reply would be partial)") } else { String::new() };
    forward_error(pool, format!("ERR backend {} {why}: '{name}' needs every server{whole}", server.id()))
}

/// A SCAN reply (`next` given) or a key array: the keys of each server's
/// list that the pool places on that server.
fn key_list(pool: &Pool, next: Option<u64>, lists: &[(Arc<Server>, Vec<Bytes>)]) -> Bytes {
    let state = pool.state();
    let mut body = BytesMut::new();
    let mut n = 0usize;
    for (server, keys) in lists {
        for k in keys {
            // A copying migration's bookkeeping (`chash-copy:`) is never listed.
            if text_of(k).is_some_and(|key| state.lists_key_on(key, server) && !super::copy::is_internal(key)) {
                body.extend_from_slice(k);
                n += 1;
            }
        }
    }
    let mut out = BytesMut::new();
    if let Some(next) = next {
        out.extend_from_slice(b"*2\r\n");
        out.extend_from_slice(&bulk(next.to_string().as_bytes()));
    }
    out.extend_from_slice(format!("*{n}\r\n").as_bytes());
    out.extend_from_slice(&body);
    out.freeze()
}

/// A number in `[0, n)`, from the clock (no need for more).
fn rand_index(n: usize) -> usize {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    (t as usize) % n.max(1)
}

/// The sums and firsts of the servers' INFO fields worth combining.
const SUMMED: &[&str] = &[
    "connected_clients",
    "blocked_clients",
    "used_memory",
    "used_memory_rss",
    "used_memory_peak",
    "maxmemory",
    "total_connections_received",
    "total_commands_processed",
    "instantaneous_ops_per_sec",
    "keyspace_hits",
    "keyspace_misses",
    "expired_keys",
    "evicted_keys",
    "pubsub_channels",
    "pubsub_patterns",
];

/// The servers' INFO texts as one: per section, the summed fields, the
/// oldest `redis_version`, the fields that agree everywhere; the keyspace
/// summed per database.
fn combine_info(texts: &[String], servers: usize) -> String {
    use std::fmt::Write as _;
    // section -> field -> values (one per server that has it)
    let mut sections: Vec<(String, BTreeMap<String, Vec<String>>)> = Vec::new();
    for text in texts {
        let mut section = String::new();
        for line in text.lines() {
            let line = line.trim_end();
            if let Some(name) = line.strip_prefix("# ") {
                section = name.to_owned();
                if !sections.iter().any(|(s, _)| *s == section) {
                    sections.push((section.clone(), BTreeMap::new()));
                }
            } else if let Some((k, v)) = line.split_once(':') {
                if let Some((_, fields)) = sections.iter_mut().find(|(s, _)| *s == section) {
                    fields.entry(k.to_owned()).or_default().push(v.to_owned());
                }
            }
        }
    }
    let mut out = String::new();
    for (section, fields) in &sections {
        let _ = write!(out, "# {section}\r\n");
        if section == "Keyspace" {
            for (db, values) in fields {
                let (mut keys, mut expires) = (0u64, 0u64);
                for v in values {
                    for part in v.split(',') {
                        match part.split_once('=') {
                            Some(("keys", n)) => keys += n.parse::<u64>().unwrap_or(0),
                            Some(("expires", n)) => expires += n.parse::<u64>().unwrap_or(0),
                            _ => {}
                        }
                    }
                }
                let _ = write!(out, "{db}:keys={keys},expires={expires},avg_ttl=0\r\n");
            }
            continue;
        }
        for (field, values) in fields {
            let value = if SUMMED.contains(&field.as_str()) {
                let sum: u64 = values.iter().filter_map(|v| v.parse::<u64>().ok()).sum();
                sum.to_string()
            } else if field == "redis_version" {
                values.iter().min_by_key(|v| version_key(v)).cloned().unwrap_or_default()
            } else if field.ends_with("_human") {
                continue;
            } else if values.len() == servers && values.iter().all(|v| *v == values[0]) {
                values[0].clone()
            } else {
                continue;
            };
            let _ = write!(out, "{field}:{value}\r\n");
        }
        if section == "Memory" {
            if let Some(used) = fields.get("used_memory") {
                let sum: u64 = used.iter().filter_map(|v| v.parse::<u64>().ok()).sum();
                let _ = write!(out, "used_memory_human:{}\r\n", human(sum));
            }
        }
    }
    out
}

/// `7.0.15` as comparable numbers.
fn version_key(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// Bytes as Redis's `_human` fields write them.
fn human(n: u64) -> String {
    let units = [("G", 1u64 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    for (unit, size) in units {
        if n >= size {
            return format!("{:.2}{unit}", n as f64 / size as f64);
        }
    }
    format!("{n}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_pack_and_unpack() {
        for c in [
            Cursor { server: 0, index: 1, tag: 7 },
            Cursor { server: 12345, index: 1023, tag: 4095 },
            Cursor { server: MAX_SERVER_CURSOR, index: 0, tag: 1 },
        ] {
            assert_eq!(Cursor::unpack(c.pack()), c);
        }
        assert_ne!(Cursor { server: 0, index: 0, tag: 1 }.pack(), 0, "a cursor past the start is never 0");
    }

    #[test]
    fn info_combines() {
        let a = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\nprocess_id:11\r\n# Memory\r\n\
                 used_memory:1024\r\nused_memory_human:1.00K\r\nmaxmemory_policy:noeviction\r\n# Keyspace\r\n\
                 db0:keys=3,expires=1,avg_ttl=5\r\n";
        let b = "# Server\r\nredis_version:6.2.1\r\nredis_mode:standalone\r\nprocess_id:12\r\n# Memory\r\n\
                 used_memory:2048\r\nused_memory_human:2.00K\r\nmaxmemory_policy:noeviction\r\n# Keyspace\r\n\
                 db0:keys=4,expires=0,avg_ttl=0\r\n";
        let info = combine_info(&[a.into(), b.into()], 2);
        assert!(info.contains("redis_version:6.2.1\r\n"), "the oldest: {info}");
        assert!(info.contains("redis_mode:standalone\r\n") && !info.contains("process_id"), "{info}");
        assert!(
            info.contains("maxmemory_policy:noeviction\r\nused_memory:3072\r\nused_memory_human:3.00K\r\n"),
            "{info}"
        );
        assert!(info.contains("db0:keys=7,expires=1,avg_ttl=0\r\n"), "{info}");
    }

    #[test]
    fn bulk_and_verbatim_text() {
        assert_eq!(text_of(b"$3\r\nabc\r\n"), Some(&b"abc"[..]));
        assert_eq!(text_of(b"=7\r\ntxt:abc\r\n"), Some(&b"abc"[..]));
        assert_eq!(text_of(b"$-1\r\n"), None);
        assert_eq!(text_of(b":1\r\n"), None);
    }
}
