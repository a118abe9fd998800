//! Redis pools in front of real redis-server processes on loopback ports
//! (started and stopped by the tests).

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::{require, Proxy, Redis};

/// A direct client of a Redis server (authenticated when it has a password).
fn direct(r: &Redis) -> Resp {
    let mut c = Resp::connect(([127, 0, 0, 1], r.port).into());
    if let Some(pw) = r.password() {
        assert_eq!(c.cmd(&["AUTH", pw]), "+OK");
    }
    c
}

/// A blocking RESP client; replies are rendered as text for assertions.
struct Resp {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Resp {
    fn connect(addr: SocketAddr) -> Resp {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Resp { r: BufReader::new(s.try_clone().unwrap()), w: s }
    }

    fn encode(args: &[&str]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        out
    }

    fn send(&mut self, args: &[&str]) {
        self.w.write_all(&Resp::encode(args)).unwrap();
    }

    /// Reads one reply: `+OK`, `-ERR ...`, `:3`, `"bulk"`, `nil`, `[a, b]`.
    fn read(&mut self) -> String {
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        let line = line.trim_end_matches("\r\n").to_owned();
        match line.chars().next() {
            Some('$') => {
                let n: i64 = line[1..].parse().unwrap();
                if n < 0 {
                    return "nil".into();
                }
                let mut data = vec![0u8; n as usize + 2];
                self.r.read_exact(&mut data).unwrap();
                format!("\"{}\"", String::from_utf8_lossy(&data[..n as usize]))
            }
            Some('*') => {
                let n: i64 = line[1..].parse().unwrap();
                if n < 0 {
                    return "nil".into();
                }
                let items: Vec<String> = (0..n.max(0)).map(|_| self.read()).collect();
                format!("[{}]", items.join(", "))
            }
            _ => line,
        }
    }

    fn cmd(&mut self, args: &[&str]) -> String {
        self.send(args);
        self.read()
    }
}

fn config(extra: &str, servers: &[&Redis]) -> String {
    let mut yml = format!("alpha:\n  listen: 127.0.0.1:0\n  redis: true\n{extra}  servers:\n");
    for s in servers {
        yml.push_str(&format!("   - {}:1\n", s.id()));
    }
    yml
}

fn servers(n: usize) -> Vec<Redis> {
    (0..n).map(|_| Redis::start(None)).collect()
}

#[test]
fn every_command_family_through_the_proxy() {
    let rs = servers(3);
    let refs: Vec<&Redis> = rs.iter().collect();
    // md5, not twemproxy's default fnv1a_64: FNV-1a puts short keys that
    // differ in their last byte (mk0, mk1, ...) next to each other on the
    // continuum, so with a few servers they can all land on one.
    let proxy = Proxy::start(&config("  hash: md5\n  hash_tag: \"{}\"\n", &refs));
    let mut c = Resp::connect(proxy.addr);
    assert_eq!(c.cmd(&["PING"]), "+PONG");
    assert_eq!(c.cmd(&["PING", "hi"]), "\"hi\"");
    assert_eq!(c.cmd(&["ECHO", "x y"]), "\"x y\"");
    // strings
    assert_eq!(c.cmd(&["SET", "s", "v", "EX", "100", "NX"]), "+OK");
    assert_eq!(c.cmd(&["SET", "s", "w", "XX", "GET"]), "\"v\"");
    assert_eq!(c.cmd(&["GET", "s"]), "\"w\"");
    assert_eq!(c.cmd(&["APPEND", "s", "!"]), ":2");
    assert_eq!(c.cmd(&["INCR", "n"]), ":1");
    assert_eq!(c.cmd(&["INCRBY", "n", "41"]), ":42");
    assert_eq!(c.cmd(&["GETDEL", "n"]), "\"42\"");
    assert_eq!(c.cmd(&["GETEX", "s", "PERSIST"]), "\"w!\"");
    assert_eq!(c.cmd(&["TTL", "s"]), ":-1");
    assert_eq!(c.cmd(&["EXPIRE", "s", "50"]), ":1");
    assert_eq!(c.cmd(&["TYPE", "s"]), "+string");
    assert_eq!(c.cmd(&["SETBIT", "b", "7", "1"]), ":0");
    assert_eq!(c.cmd(&["BITCOUNT", "b"]), ":1");
    // hashes, lists, sets, sorted sets, HyperLogLog
    assert_eq!(c.cmd(&["HSET", "h", "f", "1", "g", "2"]), ":2");
    assert_eq!(c.cmd(&["HGETALL", "h"]), "[\"f\", \"1\", \"g\", \"2\"]");
    assert_eq!(c.cmd(&["RPUSH", "l", "a", "b", "c"]), ":3");
    assert_eq!(c.cmd(&["LRANGE", "l", "0", "-1"]), "[\"a\", \"b\", \"c\"]");
    assert_eq!(c.cmd(&["SADD", "set", "x", "y"]), ":2");
    assert_eq!(c.cmd(&["SISMEMBER", "set", "x"]), ":1");
    assert_eq!(c.cmd(&["ZADD", "z", "1", "a", "2", "b"]), ":2");
    assert_eq!(c.cmd(&["ZRANGE", "z", "0", "-1", "WITHSCORES"]), "[\"a\", \"1\", \"b\", \"2\"]");
    assert_eq!(c.cmd(&["PFADD", "hll", "a", "b", "c"]), ":1");
    assert_eq!(c.cmd(&["PFCOUNT", "hll"]), ":3");
    // multi-key, split by server
    let keys: Vec<String> = (0..30).map(|i| format!("mk{i}")).collect();
    let mut mset = vec!["MSET"];
    let values: Vec<String> = keys.iter().map(|k| format!("v-{k}")).collect();
    for (k, v) in keys.iter().zip(&values) {
        mset.push(k);
        mset.push(v);
    }
    assert_eq!(c.cmd(&mset), "+OK");
    let held_on: std::collections::HashSet<u16> =
        keys.iter().filter_map(|k| rs.iter().find(|r| direct(r).cmd(&["EXISTS", k]) == ":1").map(|r| r.port)).collect();
    assert!(held_on.len() >= 2, "keys spread over servers: {held_on:?}");
    let mut mget = vec!["MGET", "missing"];
    mget.extend(keys.iter().rev().map(String::as_str));
    let want =
        std::iter::once("nil".to_owned()).chain(values.iter().rev().map(|v| format!("\"{v}\""))).collect::<Vec<_>>();
    assert_eq!(c.cmd(&mget), format!("[{}]", want.join(", ")));
    let mut exists = vec!["EXISTS", "missing"];
    exists.extend(keys.iter().map(String::as_str));
    assert_eq!(c.cmd(&exists), ":30");
    assert_eq!(c.cmd(&["TOUCH", "mk1", "mk2", "nope"]), ":2");
    assert_eq!(c.cmd(&["UNLINK", "mk1", "mk2"]), ":2");
    let mut del = vec!["DEL"];
    del.extend(keys.iter().map(String::as_str));
    assert_eq!(c.cmd(&del), ":28");
    // multi-key commands on one server: with a hash tag they work, without they are refused
    assert_eq!(c.cmd(&["SADD", "{u1}:a", "1", "2"]), ":2");
    assert_eq!(c.cmd(&["SADD", "{u1}:b", "2", "3"]), ":2");
    assert_eq!(c.cmd(&["SINTER", "{u1}:a", "{u1}:b"]), "[\"2\"]");
    assert_eq!(c.cmd(&["MSETNX", "{u2}:x", "1", "{u2}:y", "2"]), ":1");
    assert_eq!(c.cmd(&["RENAME", "{u2}:x", "{u2}:z"]), "+OK");
    assert_eq!(c.cmd(&["EVAL", "return redis.call('GET', KEYS[1])", "1", "{u2}:z"]), "\"1\"");
    let cross =
        (0..50).map(|i| format!("a{i}")).find(|k| c.cmd(&["MSETNX", k, "1", "b0", "2"]).starts_with("-ERR")).unwrap();
    assert!(c.cmd(&["MSETNX", &cross, "1", "b0", "2"]).contains("different servers"));
    // proxy-level and refused commands
    assert_eq!(c.cmd(&["SELECT", "0"]), "+OK");
    assert!(c.cmd(&["SELECT", "1"]).starts_with("-ERR"));
    assert!(c.cmd(&["INFO"]).contains("proxy:chash-proxy"));
    assert_eq!(c.cmd(&["COMMAND", "DOCS"]), "[]");
    assert!(c.cmd(&["HELLO", "2"]).contains("chash-proxy"));
    assert!(c.cmd(&["HELLO", "4"]).starts_with("-NOPROTO"));
    for refused in [
        vec!["EVAL", "return 1", "0"],
        vec!["MEMORY", "STATS"],
        vec!["WAIT", "1", "0"],
        vec!["CLUSTER", "INFO"],
        vec!["NOSUCHCOMMAND"],
    ] {
        let reply = c.cmd(&refused);
        assert!(reply.starts_with("-ERR"), "{refused:?}: {reply}");
        assert!(reply.to_lowercase().contains(&refused[0].to_lowercase()), "names the command: {reply}");
    }
    assert!(c.cmd(&["GET"]).contains("wrong number of arguments"));
    assert_eq!(c.cmd(&["GET", "s"]), "\"w!\"", "the connection survives errors");
    assert_eq!(c.cmd(&["QUIT"]), "+OK");
}

#[test]
fn auth_and_db_on_both_sides() {
    let rs = [Redis::start(Some("sekret")), Redis::start(Some("sekret"))];
    let refs: Vec<&Redis> = rs.iter().collect();
    let proxy = Proxy::start(&config("  redis_auth: sekret\n  redis_db: 3\n", &refs));
    let mut c = Resp::connect(proxy.addr);
    assert!(c.cmd(&["GET", "k"]).starts_with("-NOAUTH"));
    assert!(c.cmd(&["AUTH", "wrong"]).starts_with("-WRONGPASS"));
    assert_eq!(c.cmd(&["AUTH", "sekret"]), "+OK");
    assert_eq!(c.cmd(&["SET", "k", "v"]), "+OK");
    assert_eq!(c.cmd(&["SELECT", "3"]), "+OK");
    // The value went to database 3 of its server.
    let holder = rs.iter().find(|r| {
        let mut d = direct(r);
        assert_eq!(d.cmd(&["SELECT", "3"]), "+OK");
        d.cmd(&["GET", "k"]) == "\"v\""
    });
    assert!(holder.is_some());
    let mut hello = Resp::connect(proxy.addr);
    assert!(hello.cmd(&["HELLO", "2", "AUTH", "default", "sekret"]).contains("chash-proxy"));
    assert_eq!(hello.cmd(&["GET", "k"]), "\"v\"");
}

#[test]
fn pipelining_many_clients_never_mixes_replies() {
    let rs = servers(3);
    let refs: Vec<&Redis> = rs.iter().collect();
    let proxy = Proxy::start(&config("  server_connections: 2\n", &refs));
    let mismatches = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..30)
        .map(|t| {
            let (addr, mismatches) = (proxy.addr, mismatches.clone());
            thread::spawn(move || {
                let mut c = Resp::connect(addr);
                let keys: Vec<String> = (0..200).map(|i| format!("p{t}:{i}")).collect();
                let mut batch = Vec::new();
                for k in &keys {
                    batch.extend(Resp::encode(&["SET", k, &format!("val-{k}")]));
                    batch.extend(Resp::encode(&["GET", k]));
                }
                let mut mget = vec!["MGET"];
                mget.extend(keys.iter().map(String::as_str));
                batch.extend(Resp::encode(&mget));
                c.w.write_all(&batch).unwrap();
                for k in &keys {
                    if c.read() != "+OK" || c.read() != format!("\"val-{k}\"") {
                        mismatches.fetch_add(1, Relaxed);
                    }
                }
                let want = keys.iter().map(|k| format!("\"val-{k}\"")).collect::<Vec<_>>().join(", ");
                if c.read() != format!("[{want}]") {
                    mismatches.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(mismatches.load(Relaxed), 0);
}

/// Split commands back to back on one connection, pipelined (each
/// framed while the parts and replies of those before it are still held)
/// and then one at a time (each framed in the memory of the one before):
/// every MSET lands whole and every MGET gives its own round's values, in
/// its keys' order.
#[test]
fn split_commands_back_to_back_keep_their_own_parts_and_replies() {
    let rs = servers(3);
    let refs: Vec<&Redis> = rs.iter().collect();
    // md5: FNV-1a would put these keys, alike but for their end, together.
    let proxy = Proxy::start(&config("  hash: md5\n", &refs));
    let mut c = Resp::connect(proxy.addr);
    let keys: Vec<String> = (0..20).map(|i| format!("split:{i}")).collect();
    let round = |r: usize| -> (Vec<u8>, Vec<u8>, String) {
        let mut mset = vec!["MSET".to_owned()];
        for k in &keys {
            mset.push(k.clone());
            mset.push(format!("{k}={r}"));
        }
        let mset: Vec<&str> = mset.iter().map(String::as_str).collect();
        let mut mget = vec!["MGET"];
        mget.extend(keys.iter().rev().map(String::as_str));
        let want = keys.iter().rev().map(|k| format!("\"{k}={r}\"")).collect::<Vec<_>>().join(", ");
        (Resp::encode(&mset), Resp::encode(&mget), format!("[{want}]"))
    };
    let mut batch = Vec::new();
    let mut wants = Vec::new();
    for r in 0..50 {
        let (mset, mget, want) = round(r);
        batch.extend(mset);
        batch.extend(mget);
        wants.push(want);
    }
    c.w.write_all(&batch).unwrap();
    for (r, want) in wants.iter().enumerate() {
        assert_eq!(c.read(), "+OK", "pipelined round {r}: MSET");
        assert_eq!(&c.read(), want, "pipelined round {r}: MGET");
    }
    for r in 50..250 {
        let (mset, mget, want) = round(r);
        c.w.write_all(&mset).unwrap();
        assert_eq!(c.read(), "+OK", "round {r}: MSET");
        c.w.write_all(&mget).unwrap();
        assert_eq!(c.read(), want, "round {r}: MGET");
    }
    // The commands were split: every server holds some of the keys.
    for r in &rs {
        assert_ne!(direct(r).cmd(&["DBSIZE"]), ":0", "a server got none of the keys");
    }
}

/// A value of `len` bytes that encodes its key and every position.
fn big_value(key: &str, len: usize) -> String {
    let mut v = String::with_capacity(len + 16);
    let mut i = 0;
    while v.len() < len {
        v.push_str(&format!("{key}@{i:08};"));
        i += 1;
    }
    v.truncate(len);
    v
}

/// A reply written to its client by the server connection it came on
/// (the client waits on it alone), and what follows it on the same
/// connection: a local reply (PING) or another server's in the same write,
/// a request sent just after; a client that reads nothing for a while (its
/// socket fills, replies are written partly through and the rest by its
/// writer); a client that closes its side right after a request. Every
/// reply arrives whole, in request order, and the connection closes when
/// its client's side has.
#[test]
fn replies_written_through_keep_their_order_whatever_follows() {
    let rs = servers(3);
    let refs: Vec<&Redis> = rs.iter().collect();
    let proxy = Proxy::start(&config("", &refs));
    let mut c = Resp::connect(proxy.addr);
    let keys: Vec<String> = (0..30).map(|i| format!("wt{i}")).collect();
    for k in &keys {
        assert_eq!(c.cmd(&["SET", k, &format!("v-{k}")]), "+OK");
    }
    let want = |k: &str| format!("\"v-{k}\"");
    for round in 0..400 {
        let k = &keys[round % keys.len()];
        let other = &keys[(round * 7 + 3) % keys.len()];
        match round % 4 {
            0 => assert_eq!(c.cmd(&["GET", k]), want(k)),
            1 => {
                let mut both = Resp::encode(&["GET", k]);
                both.extend(Resp::encode(&["PING"]));
                c.w.write_all(&both).unwrap();
                assert_eq!(c.read(), want(k));
                assert_eq!(c.read(), "+PONG");
            }
            2 => {
                let mut both = Resp::encode(&["GET", k]);
                both.extend(Resp::encode(&["GET", other]));
                c.w.write_all(&both).unwrap();
                assert_eq!(c.read(), want(k));
                assert_eq!(c.read(), want(other));
            }
            _ => {
                c.send(&["GET", k]);
                thread::sleep(Duration::from_millis(1));
                c.send(&["PING"]);
                c.send(&["GET", other]);
                assert_eq!(c.read(), want(k));
                assert_eq!(c.read(), "+PONG");
                assert_eq!(c.read(), want(other));
            }
        }
    }
    // 40 replies of 200 KiB (held whole, not streamed), asked for one at
    // a time and read only at the end.
    let value = big_value("wtbig", 200 << 10);
    assert_eq!(c.cmd(&["SET", "wtbig", &value]), "+OK");
    let mut slow = Resp::connect(proxy.addr);
    for _ in 0..40 {
        slow.send(&["GET", "wtbig"]);
        thread::sleep(Duration::from_millis(2));
    }
    thread::sleep(Duration::from_millis(100));
    let whole = format!("\"{value}\"");
    for i in 0..40 {
        assert!(slow.read() == whole, "reply {i} of the slow client is not the value");
    }
    assert_eq!(slow.cmd(&["PING"]), "+PONG");
    // Half-closed right after a request: the reply, then the end (a
    // connection waiting on a reply written through would never end).
    for k in keys.iter().take(20) {
        let mut q = Resp::connect(proxy.addr);
        q.send(&["GET", k]);
        q.w.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(q.read(), want(k));
        let mut rest = Vec::new();
        q.r.read_to_end(&mut rest).expect("the connection ends");
        assert!(rest.is_empty());
    }
}

/// Large replies (a 3 MiB string, a list of 40,000 items) are passed on as
/// they arrive, whole and in order between other replies on the same
/// backend connection; a client that leaves halfway leaves the connection
/// usable; split commands get their parts whole, up to a limit past which
/// they are refused clearly.
#[test]
fn large_replies_are_streamed() {
    let rs = servers(2);
    let refs: Vec<&Redis> = rs.iter().collect();
    // md5: the MGET below must span both servers (FNV-1a, the default,
    // clusters short similar keys).
    let proxy = Proxy::start(&config("  server_connections: 1\n  hash: md5\n", &refs));
    let mut c = Resp::connect(proxy.addr);
    // Built with APPEND in pieces under the request size limit (1 MiB).
    let value = big_value("big", 3 << 20);
    for piece in value.as_bytes().chunks(512 << 10) {
        let reply = c.cmd(&["APPEND", "big", std::str::from_utf8(piece).unwrap()]);
        assert!(reply.starts_with(':'), "{reply}");
    }
    assert_eq!(c.cmd(&["STRLEN", "big"]), format!(":{}", 3 << 20));
    for i in 0..40_000 {
        c.send(&["RPUSH", "list", &format!("item-{i:06}")]);
    }
    for i in 0..40_000 {
        assert_eq!(c.read(), format!(":{}", i + 1));
    }
    c.cmd(&["SET", "small", "tiny"]);

    // Pipelined around each other: every reply whole and in order.
    let mut batch = Vec::new();
    for args in [&["GET", "big"][..], &["GET", "small"], &["LRANGE", "list", "0", "-1"], &["GET", "big"]] {
        batch.extend(Resp::encode(args));
    }
    c.w.write_all(&batch).unwrap();
    assert!(c.read() == format!("\"{value}\""), "first GET big differs");
    assert_eq!(c.read(), "\"tiny\"");
    let items: Vec<String> = (0..40_000).map(|i| format!("\"item-{i:06}\"")).collect();
    assert!(c.read() == format!("[{}]", items.join(", ")), "LRANGE differs");
    assert!(c.read() == format!("\"{value}\""), "second GET big differs");
    let (_, body) = proxy.admin("GET", "/stats", "");
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    let streamed = stats["pools"][0]["streamed_replies"].as_u64().unwrap();
    assert!(streamed >= 3, "streamed_replies = {streamed}");

    // A client that reads a little and leaves: the backend connection (one
    // per server per worker) goes on in step for everyone else.
    for _ in 0..4 {
        let mut quitter = Resp::connect(proxy.addr);
        quitter.send(&["GET", "big"]);
        let mut some = [0u8; 1000];
        quitter.r.read_exact(&mut some).unwrap();
        drop(quitter);
    }
    for i in 0..20 {
        let k = format!("after-{i}");
        assert_eq!(c.cmd(&["SET", &k, &k]), "+OK");
        assert_eq!(c.cmd(&["GET", &k]), format!("\"{k}\""));
    }
    assert!(c.cmd(&["GET", "big"]) == format!("\"{value}\""));

    // A split command needs its parts whole: a 3 MiB part is combined;
    // a part over the limit (64 MiB: the big key 22 times) is refused
    // clearly, and the connection goes on. On one server alone the same
    // keys are one reply, streamed.
    let mut keys = vec!["MGET".to_owned(), "big".to_owned()];
    keys.extend((0..20).map(|i| format!("after-{i}")));
    let args: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut want = vec![format!("\"{value}\"")];
    want.extend((0..20).map(|i| format!("\"after-{i}\"")));
    assert!(c.cmd(&args) == format!("[{}]", want.join(", ")), "MGET with a 3 MiB part differs");
    let routes = proxy.handle.pools()[0].config().snapshot().unwrap();
    let server_of = |k: &str| routes.route(k.as_bytes()).unwrap().to_owned();
    let elsewhere = (0..20).map(|i| format!("after-{i}")).find(|k| server_of(k) != server_of("big")).unwrap();
    let mut keys = vec!["MGET".to_owned(), elsewhere];
    keys.extend((0..22).map(|_| "big".to_owned()));
    let args: Vec<&str> = keys.iter().map(String::as_str).collect();
    let reply = c.cmd(&args);
    assert!(reply.starts_with("-ERR reply from") && reply.contains("too large"), "{}", &reply[..reply.len().min(200)]);
    let mut keys = vec!["MGET".to_owned()];
    keys.extend((0..22).map(|_| "big".to_owned()));
    let args: Vec<&str> = keys.iter().map(String::as_str).collect();
    let want = vec![format!("\"{value}\""); 22];
    assert!(c.cmd(&args) == format!("[{}]", want.join(", ")), "MGET of 22 × 3 MiB on one server differs");
    assert_eq!(c.cmd(&["GET", "small"]), "\"tiny\"");
}

#[test]
fn a_killed_server_costs_only_its_keys_and_comes_back() {
    let mut rs = servers(3);
    let refs: Vec<&Redis> = rs.iter().collect();
    let proxy = Proxy::start(&config("  timeout: 1000\n  hash: md5\n", &refs));
    let mut c = Resp::connect(proxy.addr);
    let keys: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
    for k in &keys {
        assert_eq!(c.cmd(&["SET", k, "v"]), "+OK");
    }
    let victim = rs[1].port;
    let on_victim: Vec<&String> = keys.iter().filter(|k| direct(&rs[1]).cmd(&["EXISTS", k]) == ":1").collect();
    assert!(!on_victim.is_empty());
    rs[1].kill();
    let started = Instant::now();
    let (mut ok, mut failed) = (0, 0);
    for k in &keys {
        let reply = c.cmd(&["GET", k]);
        if reply.starts_with("-ERR backend") {
            failed += 1;
        } else {
            assert_eq!(reply, "\"v\"");
            ok += 1;
        }
    }
    assert_eq!(failed, on_victim.len());
    assert_eq!(ok + failed, keys.len());
    assert!(started.elapsed() < Duration::from_secs(5));
    rs[1].restart();
    assert_eq!(rs[1].port, victim);
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.cmd(&["SET", on_victim[0], "back"]) != "+OK" {
        assert!(Instant::now() < deadline, "the server's keys did not come back");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn malformed_resp_gets_an_error_or_a_clean_close() {
    let rs = servers(1);
    let refs: Vec<&Redis> = rs.iter().collect();
    let proxy = Proxy::start(&config("", &refs));
    for junk in [
        &b"*x\r\n"[..],
        b"*2\r\n$3\r\nGET\r\n:5\r\n",
        b"*1\r\n$-7\r\n",
        b"*1\r\n$3\r\nabcdef\r\n",
        b"*99999999999\r\n",
        b"*1\r\n$999999999999\r\n",
        b"\x00\x01\x02\xff\r\n*",
    ] {
        let mut s = TcpStream::connect(proxy.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(junk).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.is_empty() || out.starts_with("-ERR") || out.starts_with('-'), "{junk:?}: {out:?}");
    }
    // Still serving.
    let mut c = Resp::connect(proxy.addr);
    assert_eq!(c.cmd(&["SET", "alive", "1"]), "+OK");
    assert_eq!(c.cmd(&["GET", "alive"]), "\"1\"");
}

#[test]
fn redis_cli_works_against_the_proxy() {
    let cli = require("redis-cli", "redis-tools");
    let rs = servers(2);
    let refs: Vec<&Redis> = rs.iter().collect();
    let proxy = Proxy::start(&config("", &refs));
    let port = proxy.addr.port().to_string();
    let run = |args: &[&str]| {
        let out = Command::new(&cli).args(["-h", "127.0.0.1", "-p", &port]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(run(&["SET", "cli", "works"]), "OK");
    assert_eq!(run(&["GET", "cli"]), "works");
    assert_eq!(run(&["PING"]), "PONG");
    assert!(run(&["KEYS", "*"]).lines().any(|k| k == "cli"), "KEYS over every server");
    assert!(run(&["CLUSTER", "INFO"]).contains("not supported"));
}

/// A server whose connection set-up fails (wrong `redis_auth`, or a
/// `redis_db` it does not have) is down: every request gets an error
/// within the pool's timeout, naming what the server said, and the stats
/// say so. Before, requests queued behind the failed set-up were never
/// answered.
#[test]
fn a_failing_connection_setup_answers_every_request() {
    let rs = [Redis::start(Some("sekret"))];
    let refs: Vec<&Redis> = rs.iter().collect();
    for (extra, said) in [
        ("  redis_auth: badpasswd\n  preconnect: true\n", "WRONGPASS"),
        ("  redis_auth: badpasswd\n  preconnect: false\n", "WRONGPASS"),
        ("  redis_auth: sekret\n  redis_db: 99\n", "DB index is out of range"),
    ] {
        let proxy = Proxy::start(&config(&format!("  timeout: 400\n{extra}"), &refs));
        let mut c = Resp::connect(proxy.addr);
        c.w.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        c.r.get_ref().set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let pw = if extra.contains("badpasswd") { "badpasswd" } else { "sekret" };
        assert_eq!(c.cmd(&["AUTH", pw]), "+OK", "{extra}");
        for i in 0..5 {
            let started = Instant::now();
            // Pipelined: the second waits behind the first.
            c.send(&["SET", &format!("k{i}"), "v"]);
            c.send(&["GET", &format!("k{i}")]);
            for _ in 0..2 {
                let reply = c.read();
                assert!(reply.starts_with("-ERR backend"), "{extra}: {reply}");
                assert!(reply.contains(said), "the server's refusal reaches the client: {reply}");
            }
            assert!(started.elapsed() < Duration::from_millis(1500), "{extra}: answered late: {:?}", started.elapsed());
        }
        let (_, stats) = proxy.admin("GET", "/stats", "");
        let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
        let server = &v["pools"][0]["servers"][0];
        assert_eq!(server["state"], "down", "{extra}: {server}");
        assert!(server["errors"].as_u64().unwrap() >= 10, "{extra}: {server}");
    }
}

/// Redis `INFO` carries every counter of the pool (the same list as every
/// other rendering).
#[test]
fn info_carries_every_counter() {
    let rs = servers(1);
    let refs: Vec<&Redis> = rs.iter().collect();
    let proxy = Proxy::start(&config("", &refs));
    let mut c = Resp::connect(proxy.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), "+OK");
    let info = c.cmd(&["INFO"]);
    for (d, _) in &proxy.handle.stats()[0].counters {
        assert!(info.contains(&format!("{}:", d.name)), "INFO lacks {}: {info}", d.name);
    }
    assert!(info.contains("total_commands_processed:"), "{info}");
}

/// A client that stops reading a streamed reply holds its server
/// connection up to the stream's patience (5 s); a request queued behind
/// it on that connection is still answered within the pool's timeout.
#[test]
fn a_request_behind_a_stuck_stream_is_answered_within_its_timeout() {
    let rs = servers(1);
    let refs: Vec<&Redis> = rs.iter().collect();
    let mut options = chash_proxy::ProxyOptions::default();
    // One worker: both clients share the one server connection.
    options.threads = Some(1);
    let proxy = Proxy::start_with(&config("  timeout: 400\n", &refs), options, None);
    let mut setup = Resp::connect(proxy.addr);
    let value = big_value("big", 20 << 20);
    assert_eq!(setup.cmd(&["SET", "big", &value]), "+OK");
    assert_eq!(setup.cmd(&["SET", "small", "v"]), "+OK");
    // The stuck client: asks for 20 MiB and never reads.
    let mut stuck = TcpStream::connect(proxy.addr).unwrap();
    stuck.write_all(&Resp::encode(&["GET", "big"])).unwrap();
    thread::sleep(Duration::from_millis(300));
    let mut other = Resp::connect(proxy.addr);
    let started = Instant::now();
    let reply = other.cmd(&["GET", "small"]);
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(1500), "answered after {waited:?}: {reply}");
    assert!(reply == "\"v\"" || reply.contains("timed out"), "{reply}");
    // Once the stream gives up on the stuck client, the connection serves again.
    drop(stuck);
    let deadline = Instant::now() + Duration::from_secs(10);
    while other.cmd(&["GET", "small"]) != "\"v\"" {
        assert!(Instant::now() < deadline, "the server connection never recovered");
        thread::sleep(Duration::from_millis(100));
    }
}

/// Transactions: `MULTI` ... `EXEC` on keys of one server run as one; keys
/// on two servers get an error naming the key and the hash-tag fix, `EXEC`
/// gets `-EXECABORT`, and nothing runs; a client that leaves inside `MULTI`
/// leaves nothing behind; 20 clients running transactions at once never see
/// each other's results.
#[test]
fn transactions_on_one_server() {
    let rs = servers(3);
    let refs: Vec<&Redis> = rs.iter().collect();
    let proxy = Proxy::start(&config("  hash_tag: \"{}\"\n", &refs));
    let routes = proxy.handle.pools()[0].config().snapshot().unwrap();
    let owner = |k: &str| routes.route(k.as_bytes()).unwrap().to_owned();
    let mut c = Resp::connect(proxy.addr);
    assert_eq!(c.cmd(&["EXEC"]), "-ERR EXEC without MULTI");
    assert_eq!(c.cmd(&["MULTI"]), "+OK");
    assert_eq!(c.cmd(&["MULTI"]), "-ERR MULTI calls can not be nested");
    assert_eq!(c.cmd(&["SET", "{u:1}:a", "1"]), "+QUEUED");
    assert_eq!(c.cmd(&["INCR", "{u:1}:b"]), "+QUEUED");
    assert_eq!(c.cmd(&["MGET", "{u:1}:a", "{u:1}:b"]), "+QUEUED");
    assert_eq!(c.cmd(&["EXEC"]), "[+OK, :1, [\"1\", \"1\"]]");
    // Two servers: refused at the second key, and EXEC discards it all.
    let one = "k0".to_owned();
    let other = (1..).map(|i| format!("k{i}")).find(|k| owner(k) != owner(&one)).unwrap();
    assert_eq!(c.cmd(&["MULTI"]), "+OK");
    assert_eq!(c.cmd(&["SET", &one, "x"]), "+QUEUED");
    let refused = c.cmd(&["SET", &other, "y"]);
    assert!(refused.starts_with("-ERR") && refused.contains(&other) && refused.contains("hash tag"), "{refused}");
    assert_eq!(c.cmd(&["EXEC"]), "-EXECABORT Transaction discarded because of previous errors.");
    assert_eq!(c.cmd(&["EXISTS", &one, &other]), ":0", "nothing ran");
    // DISCARD, and a client gone inside MULTI: nothing runs.
    assert_eq!(c.cmd(&["MULTI"]), "+OK");
    assert_eq!(c.cmd(&["SET", "{u:2}:a", "1"]), "+QUEUED");
    assert_eq!(c.cmd(&["DISCARD"]), "+OK");
    let mut gone = Resp::connect(proxy.addr);
    assert_eq!(gone.cmd(&["MULTI"]), "+OK");
    assert_eq!(gone.cmd(&["SET", "{u:3}:a", "1"]), "+QUEUED");
    drop(gone);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(c.cmd(&["EXISTS", "{u:2}:a", "{u:3}:a"]), ":0");
    // 20 clients at once, each its own tag and values naming their keys.
    let mismatches = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..20)
        .map(|w| {
            let (addr, mismatches) = (proxy.addr, mismatches.clone());
            thread::spawn(move || {
                let mut c = Resp::connect(addr);
                for i in 0..50 {
                    let (a, b) = (format!("{{w{w}}}:a:{i}"), format!("{{w{w}}}:b:{i}"));
                    let mut batch = Vec::new();
                    for args in
                        [vec!["MULTI"], vec!["SET", &a, &a], vec!["SET", &b, &b], vec!["MGET", &a, &b], vec!["EXEC"]]
                    {
                        batch.extend_from_slice(&Resp::encode(&args));
                    }
                    c.w.write_all(&batch).unwrap();
                    let replies: Vec<String> = (0..5).map(|_| c.read()).collect();
                    let want = format!("[+OK, +OK, [\"{a}\", \"{b}\"]]");
                    if replies[..4] != ["+OK", "+QUEUED", "+QUEUED", "+QUEUED"] || replies[4] != want {
                        mismatches.fetch_add(1, Relaxed);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(mismatches.load(Relaxed), 0);
}

/// `connected_clients` of a server, as its `INFO` says.
fn connected_clients(r: &Redis) -> u64 {
    let info = direct(r).cmd(&["INFO", "clients"]);
    let line = info.split("\r\n").find(|l| l.starts_with("connected_clients:")).unwrap_or_else(|| panic!("{info}"));
    // Less the INFO connection itself.
    line["connected_clients:".len()..].trim_end_matches('"').parse::<u64>().unwrap() - 1
}

/// Polls (bounded) until `f` is true.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..100 {
        if f() {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    panic!("{what}: not within 5 s");
}

/// `WATCH` pins the client to a server connection of its own until `EXEC`,
/// `DISCARD` or `UNWATCH`: another client's write in between makes `EXEC`
/// answer nil and nothing runs; watched keys and the transaction must share
/// a server; a client that leaves while watching closes its connection; a
/// released one serves the next client; and concurrent optimistic
/// increments lose nothing.
#[test]
fn watch_pins_a_server_connection_until_exec() {
    let rs = servers(3);
    let refs: Vec<&Redis> = rs.iter().collect();
    let proxy = Proxy::start(&config("  hash_tag: \"{}\"\n", &refs));
    let routes = proxy.handle.pools()[0].config().snapshot().unwrap();
    let owner = |k: &str| routes.route(k.as_bytes()).unwrap().to_owned();
    let server_of = |k: &str| rs.iter().find(|r| r.id() == owner(k)).unwrap();
    let k = "{w}:n";
    let (mut a, mut b) = (Resp::connect(proxy.addr), Resp::connect(proxy.addr));
    assert_eq!(a.cmd(&["GET", k]), "nil");
    let shared = connected_clients(server_of(k));
    // A client that leaves while watching: its connection closes.
    let mut gone = Resp::connect(proxy.addr);
    assert_eq!(gone.cmd(&["WATCH", k]), "+OK");
    assert_eq!(connected_clients(server_of(k)), shared + 1, "WATCH opened a connection of its own");
    drop(gone);
    eventually("the pinned connection closes", || connected_clients(server_of(k)) == shared);
    // Nobody else writes: the transaction runs.
    assert_eq!(a.cmd(&["WATCH", k, "{w}:other"]), "+OK");
    assert_eq!(a.cmd(&["GET", k]), "nil");
    assert_eq!(a.cmd(&["MULTI"]), "+OK");
    assert_eq!(a.cmd(&["SET", k, "1"]), "+QUEUED");
    assert_eq!(a.cmd(&["EXEC"]), "[+OK]");
    // Released clean after EXEC, and the next WATCH (another client's) takes it.
    assert_eq!(connected_clients(server_of(k)), shared + 1);
    assert_eq!(b.cmd(&["WATCH", k]), "+OK");
    assert_eq!(b.cmd(&["UNWATCH"]), "+OK");
    eventually("UNWATCH closes it", || connected_clients(server_of(k)) == shared);
    // Another client writes in between: EXEC answers nil, nothing runs.
    assert_eq!(a.cmd(&["WATCH", k]), "+OK");
    assert_eq!(b.cmd(&["SET", k, "5"]), "+OK");
    assert_eq!(a.cmd(&["MULTI"]), "+OK");
    assert_eq!(a.cmd(&["SET", k, "2"]), "+QUEUED");
    assert_eq!(a.cmd(&["SET", "{w}:side", "x"]), "+QUEUED");
    assert_eq!(a.cmd(&["EXEC"]), "nil");
    assert_eq!(b.cmd(&["MGET", k, "{w}:side"]), "[\"5\", nil]");
    // An empty transaction on a touched key: nil too.
    assert_eq!(a.cmd(&["WATCH", k]), "+OK");
    assert_eq!(b.cmd(&["INCR", k]), ":6");
    assert_eq!(a.cmd(&["MULTI"]), "+OK");
    assert_eq!(a.cmd(&["EXEC"]), "nil");
    // DISCARD forgets the watch: the next transaction runs although the
    // key changed (and WATCH inside MULTI is an error that aborts nothing).
    assert_eq!(a.cmd(&["WATCH", k]), "+OK");
    assert_eq!(b.cmd(&["INCR", k]), ":7");
    assert_eq!(a.cmd(&["MULTI"]), "+OK");
    assert_eq!(a.cmd(&["DISCARD"]), "+OK");
    assert_eq!(a.cmd(&["MULTI"]), "+OK");
    assert_eq!(a.cmd(&["WATCH", k]), "-ERR WATCH inside MULTI is not allowed");
    assert_eq!(a.cmd(&["INCR", k]), "+QUEUED");
    assert_eq!(a.cmd(&["EXEC"]), "[:8]");
    // UNWATCH too.
    assert_eq!(a.cmd(&["WATCH", k]), "+OK");
    assert_eq!(b.cmd(&["INCR", k]), ":9");
    assert_eq!(a.cmd(&["UNWATCH"]), "+OK");
    assert_eq!(a.cmd(&["MULTI"]), "+OK");
    assert_eq!(a.cmd(&["INCR", k]), "+QUEUED");
    assert_eq!(a.cmd(&["EXEC"]), "[:10]");
    // The watching connection is lost: EXEC is an error and nothing runs
    // (it is not retried on a new connection, which would watch nothing).
    assert_eq!(a.cmd(&["WATCH", k]), "+OK");
    assert!(direct(server_of(k)).cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]).starts_with(':'));
    assert_eq!(a.cmd(&["MULTI"]), "+OK");
    assert_eq!(a.cmd(&["SET", k, "lost"]), "+QUEUED");
    let lost = a.cmd(&["EXEC"]);
    assert!(lost.starts_with("-ERR backend"), "{lost}");
    assert_eq!(b.cmd(&["GET", k]), "\"10\"");
    // Watched keys, and the transaction's, must share a server.
    let one = "k0".to_owned();
    let other = (1..).map(|i| format!("k{i}")).find(|x| owner(x) != owner(&one)).unwrap();
    let refused = a.cmd(&["WATCH", &one, &other]);
    assert!(refused.starts_with("-ERR") && refused.contains("hash tag"), "{refused}");
    assert_eq!(a.cmd(&["WATCH", &one]), "+OK");
    assert!(a.cmd(&["WATCH", &other]).contains("another server"));
    assert_eq!(a.cmd(&["MULTI"]), "+OK");
    assert!(a.cmd(&["SET", &other, "1"]).contains("another server"));
    assert_eq!(a.cmd(&["EXEC"]), "-EXECABORT Transaction discarded because of previous errors.");
    assert_eq!(a.cmd(&["EXISTS", &other]), ":0");
    // Optimistic increments from 8 clients at once: none lost.
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let addr = proxy.addr;
            thread::spawn(move || {
                let mut c = Resp::connect(addr);
                let mut retries = 0;
                for _ in 0..25 {
                    loop {
                        assert_eq!(c.cmd(&["WATCH", "{w}:counter"]), "+OK");
                        let now = c.cmd(&["GET", "{w}:counter"]);
                        let n: u64 = now.trim_matches('"').parse().unwrap_or(0);
                        assert_eq!(c.cmd(&["MULTI"]), "+OK");
                        assert_eq!(c.cmd(&["SET", "{w}:counter", &(n + 1).to_string()]), "+QUEUED");
                        if c.cmd(&["EXEC"]) == "[+OK]" {
                            break;
                        }
                        retries += 1;
                    }
                }
                retries
            })
        })
        .collect();
    let retries: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(a.cmd(&["GET", "{w}:counter"]), "\"200\"", "after {retries} retries");
}

/// Every command of the key-spec table that has keys, through the proxy:
/// its keys are where Redis finds them. For each command, arguments Redis
/// accepts are found by asking a redis-server (`COMMAND GETKEYS`, which also
/// says which of them are keys); then, untagged, a command whose keys are on
/// two servers must get the hash-tag error (or be split, for the split
/// commands) and one whose keys are on one server must be sent; with the
/// same key hash-tagged it must be sent. Blocking commands are refused.
#[test]
fn every_keyed_command_goes_where_redis_finds_its_keys() {
    let rs = servers(3);
    let refs: Vec<&Redis> = rs.iter().collect();
    let proxy = Proxy::start(&config("  hash_tag: \"{}\"\n", &refs));
    let routes = proxy.handle.pools()[0].config().snapshot().unwrap();
    let owner = |k: &str| routes.route(k.as_bytes()).unwrap().to_owned();
    let mut oracle = direct(&rs[0]);
    let mut c = Resp::connect(proxy.addr);
    let table = include_str!("../src/redis/commands.rs");
    // Commands whose arguments a generic filler cannot make valid, given
    // by hand; channels of sharded pub/sub are not keys to Redis.
    // Filler arguments, each on another server than the one before, so
    // that a command's keys are spread when untagged.
    let mut fillers: Vec<String> = Vec::new();
    for j in 0.. {
        let w = format!("w{j}");
        if fillers.last().is_none_or(|prev| owner(prev) != owner(&w)) {
            fillers.push(w);
            if fillers.len() == 16 {
                break;
            }
        }
    }
    let f = |i: usize| fillers[i].clone();
    let by_hand: Vec<(&str, Vec<String>)> = vec![
        (
            "xread",
            vec!["XREAD".into(), "COUNT".into(), "1".into(), "STREAMS".into(), f(0), f(1), "0".into(), "0".into()],
        ),
        (
            "xreadgroup",
            vec![
                "XREADGROUP".into(),
                "GROUP".into(),
                "g".into(),
                "c".into(),
                "STREAMS".into(),
                f(0),
                f(1),
                ">".into(),
                ">".into(),
            ],
        ),
    ];
    let channels = ["spublish", "ssubscribe", "sunsubscribe"];
    let split = ["mget", "mset", "del", "unlink", "exists", "touch"];
    let (mut checked, mut spread_checked) = (0, 0);
    for line in table.lines().filter(|l| l.contains("Spec { name: ") && !l.contains("keys: &[] }")) {
        let field = |name: &str| line.split(&format!("{name}: ")).nth(1).unwrap().split([',', ' ']).next().unwrap();
        let name = field("name").trim_matches('"');
        let arity: i64 = field("arity").parse().unwrap();
        let blocking = field("blocking") == "true";
        if channels.contains(&name) {
            continue;
        }
        let words: Vec<String> = name.split('|').map(str::to_ascii_uppercase).collect();
        let n = if arity > 0 { arity - words.len() as i64 } else { -arity - words.len() as i64 + 2 }.max(0) as usize;
        // All fillers, then a count of 1 in each of the first places.
        let mut candidates: Vec<Vec<String>> = Vec::new();
        if let Some((_, args)) = by_hand.iter().find(|(n, _)| *n == name) {
            candidates.push(args.clone());
        }
        for one in [None, Some(0), Some(1), Some(2)] {
            let rest = (0..n).map(|i| if Some(i) == one { "1".to_owned() } else { f(i) });
            candidates.push(words.iter().cloned().chain(rest).collect());
        }
        let found = candidates.into_iter().find_map(|args| {
            let mut ask = vec!["COMMAND", "GETKEYS"];
            ask.extend(args.iter().map(String::as_str));
            let keys = oracle.cmd(&ask);
            let inner = keys.strip_prefix('[')?.strip_suffix(']')?;
            let keys: Vec<String> =
                inner.split(", ").filter(|k| !k.is_empty()).map(|k| k.trim_matches('"').to_owned()).collect();
            if keys.is_empty() {
                return None;
            }
            Some((args, keys))
        });
        let Some((args, keys)) = found else { panic!("no arguments found for {name} that Redis accepts") };
        let send = |c: &mut Resp, args: &[String]| c.cmd(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let hash_tag_error = |r: &str| r.starts_with("-ERR") && r.contains("hash tag");
        // The proxy's own refusals; an arity error must be Redis's too.
        let arity_error = |r: &str| r.starts_with("-ERR wrong number");
        let refused = |r: &str| r.starts_with("-ERR") && r.contains("chash-proxy");
        let untagged = send(&mut c, &args);
        if arity_error(&untagged) {
            assert!(arity_error(&send(&mut oracle, &args)), "{args:?}: {untagged}, from Redis too?");
        }
        // Blocking commands are routed by their keys too (on a connection
        // of the client's own); a timeout argument of the fillers' is not a
        // number, so Redis answers at once.
        let _ = blocking;
        let spread = keys.iter().map(|k| owner(k)).collect::<std::collections::BTreeSet<_>>().len();
        if spread > 1 {
            spread_checked += 1;
        }
        if spread > 1 && !split.contains(&name) {
            assert!(hash_tag_error(&untagged), "{args:?} (keys {keys:?} on {spread} servers): {untagged}");
        } else {
            assert!(!hash_tag_error(&untagged) && !refused(&untagged), "{args:?} (keys {keys:?}): {untagged}");
        }
        if name == "watch" {
            assert_eq!(c.cmd(&["UNWATCH"]), "+OK");
        }
        // The same command with every argument hash-tagged: one server.
        let tagged: Vec<String> = args
            .iter()
            .enumerate()
            .map(|(i, a)| if i < words.len() || !a.starts_with('w') { a.clone() } else { format!("{{t}}{a}") })
            .collect();
        let reply = send(&mut c, &tagged);
        assert!(!hash_tag_error(&reply) && !refused(&reply), "{tagged:?}: {reply}");
        if name == "watch" {
            assert_eq!(c.cmd(&["UNWATCH"]), "+OK");
        }
        checked += 1;
    }
    assert!(checked > 180 && spread_checked >= 20, "{checked} commands checked, {spread_checked} with keys spread");
}

/// The key-spec table is what the installed redis-server says: regenerated
/// from its `COMMAND` reply, it equals the committed one.
#[test]
fn the_key_spec_table_matches_the_installed_redis() {
    require("redis-server", "redis-server");
    let python = require("python3", "python3");
    let root = format!("{}/../..", env!("CARGO_MANIFEST_DIR"));
    let out =
        Command::new(python).args([&format!("{root}/scripts/gen-redis-keyspecs"), "--out", "-"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let committed = std::fs::read_to_string(format!("{root}/crates/chash-proxy/src/redis/commands.rs")).unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout) == committed,
        "src/redis/commands.rs differs from the installed redis-server's key specs: run scripts/gen-redis-keyspecs"
    );
}

/// Commands go where their keys are, as Redis's key specs place them:
/// members, options and counts are not keys (before, SMOVE, LMOVE, COPY ...
/// were refused as "keys on different servers"); single-key commands the
/// old table missed run; SCRIPT LOAD reaches every server so EVALSHA works
/// wherever its keys are; blocking commands are refused, clearly.
#[test]
fn commands_route_by_redis_key_specs() {
    let rs = servers(3);
    let refs: Vec<&Redis> = rs.iter().collect();
    let proxy = Proxy::start(&config("  hash_tag: \"{}\"\n", &refs));
    let mut c = Resp::connect(proxy.addr);
    let ok = |c: &mut Resp, args: &[&str], want: &str| {
        let reply = c.cmd(args);
        assert_eq!(reply, want, "{args:?}");
    };
    ok(&mut c, &["SADD", "{g}:a", "alice"], ":1");
    ok(&mut c, &["SMOVE", "{g}:a", "{g}:b", "alice"], ":1");
    ok(&mut c, &["RPUSH", "{g}:l", "x"], ":1");
    ok(&mut c, &["LMOVE", "{g}:l", "{g}:m", "LEFT", "RIGHT"], "\"x\"");
    ok(&mut c, &["SET", "{g}:s", "v"], "+OK");
    ok(&mut c, &["COPY", "{g}:s", "{g}:t", "REPLACE"], ":1");
    ok(&mut c, &["ZADD", "{g}:z", "1", "a"], ":1");
    ok(&mut c, &["ZRANGESTORE", "{g}:y", "{g}:z", "0", "-1"], ":1");
    ok(&mut c, &["LCS", "{g}:s", "{g}:t"], "\"v\"");
    ok(&mut c, &["SORT", "{g}:b", "ALPHA"], "[\"alice\"]");
    assert!(c.cmd(&["SORT", "{g}:b", "BY", "w_*"]).contains("patterns"));
    ok(&mut c, &["XADD", "st", "1-0", "f", "v"], "\"1-0\"");
    ok(&mut c, &["XGROUP", "CREATE", "st", "grp", "0"], "+OK");
    ok(
        &mut c,
        &["XREADGROUP", "GROUP", "grp", "c1", "COUNT", "1", "STREAMS", "st", ">"],
        "[[\"st\", [[\"1-0\", [\"f\", \"v\"]]]]]",
    );
    ok(&mut c, &["XACK", "st", "grp", "1-0"], ":1");
    assert!(c.cmd(&["XREAD", "COUNT", "1", "STREAMS", "st", "0"]).contains("1-0"));
    assert!(c.cmd(&["XINFO", "STREAM", "st"]).contains("length"));
    ok(&mut c, &["OBJECT", "ENCODING", "{g}:s"], "\"embstr\"");
    assert!(c.cmd(&["MEMORY", "USAGE", "{g}:s"]).starts_with(':'));
    ok(&mut c, &["GEOADD", "geo", "13.36", "38.11", "p"], ":1");
    assert!(c.cmd(&["GEORADIUS", "geo", "13.36", "38.11", "10", "km"]).contains("p"));
    // Scripts: loaded everywhere, so EVALSHA runs wherever its keys are.
    let sha = c.cmd(&["SCRIPT", "LOAD", "return redis.call('INCR', KEYS[1])"]).trim_matches('"').to_owned();
    assert_eq!(sha.len(), 40, "{sha}");
    for i in 0..30 {
        let key = format!("script:{i}");
        ok(&mut c, &["EVALSHA", &sha, "1", &key], ":1");
    }
    ok(&mut c, &["SCRIPT", "EXISTS", &sha, "0000000000000000000000000000000000000000"], "[:1, :0]");
    // Functions too: loaded on every server, called wherever the key is.
    let library = "#!lua name=chashlib\nredis.register_function('bump', function(keys) return redis.call('INCRBY', keys[1], 2) end)";
    ok(&mut c, &["FUNCTION", "LOAD", library], "\"chashlib\"");
    for i in 0..30 {
        ok(&mut c, &["FCALL", "bump", "1", &format!("script:{i}")], ":3");
    }
    ok(&mut c, &["FUNCTION", "DELETE", "chashlib"], "+OK");
    assert!(c.cmd(&["FCALL", "bump", "1", "script:0"]).contains("Function not found"));
    // Blocking commands and sharded pub/sub run (tests/redis_apps.rs has
    // the rest).
    ok(&mut c, &["LPUSH", "l", "x"], ":1");
    ok(&mut c, &["BLPOP", "l", "0"], "[\"l\", \"x\"]");
    ok(&mut c, &["XREAD", "BLOCK", "50", "STREAMS", "st", "$"], "nil");
    ok(&mut c, &["SSUBSCRIBE", "ch"], "[\"ssubscribe\", \"ch\", :1]");
    ok(&mut c, &["SUNSUBSCRIBE", "ch"], "[\"sunsubscribe\", \"ch\", :0]");
    ok(&mut c, &["GET", "{g}:s"], "\"v\"");
}

/// `failover: next` on a Redis pool: a killed server's keys go to their
/// next servers (misses, then writable), no other key moves, the placement
/// fingerprint stays; restarted, the server is taken back after
/// `server_retry_timeout` of answered `PING`s.
#[test]
fn failover_sends_only_a_dead_servers_keys_elsewhere() {
    let mut rs = servers(3);
    let refs: Vec<&Redis> = rs.iter().collect();
    let extra = "  timeout: 500\n  distribution: ring\n  hash: xxh3\n  failover: next\n  server_failure_limit: 1\n  \
                 server_retry_timeout: 500\n";
    let proxy = Proxy::start(&config(extra, &refs));
    let stats = || -> serde_json::Value { serde_json::from_str(&proxy.admin("GET", "/stats", "").1).unwrap() };
    let fingerprint = stats()["pools"][0]["placement_fingerprint"].clone();
    let mut c = Resp::connect(proxy.addr);
    let keys: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
    for k in &keys {
        assert_eq!(c.cmd(&["SET", k, "v"]), "+OK");
    }
    let holder: Vec<usize> =
        keys.iter().map(|k| (0..3).find(|&i| direct(&rs[i]).cmd(&["EXISTS", k]) == ":1").unwrap()).collect();
    let dead = rs[1].id();
    rs[1].kill();
    let state = |id: &str| -> String {
        let v = stats();
        let s = v["pools"][0]["servers"].as_array().unwrap().iter().find(|s| s["id"] == id).unwrap().clone();
        s["state"].as_str().unwrap().to_owned()
    };
    // The first request to it fails it over (limit 1); from then on its
    // keys are answered by their next servers.
    let _ = c.cmd(&["GET", &keys[holder.iter().position(|&h| h == 1).unwrap()]]);
    eventually("failed over", || state(&dead) == "failed-over");
    for (k, &h) in keys.iter().zip(&holder) {
        let want = if h == 1 { "nil" } else { "\"v\"" };
        assert_eq!(c.cmd(&["GET", k]), want, "{k}");
        assert_eq!(c.cmd(&["SET", k, "w"]), "+OK");
    }
    // Other keys stayed on their servers.
    for (k, &h) in keys.iter().zip(&holder).filter(|(_, &h)| h != 1) {
        assert_eq!(direct(&rs[h]).cmd(&["GET", k]), "\"w\"", "{k} moved");
    }
    assert_eq!(stats()["pools"][0]["placement_fingerprint"], fingerprint);
    rs[1].restart();
    eventually("taken back", || state(&dead) == "up");
    let k = &keys[holder.iter().position(|&h| h == 1).unwrap()];
    assert_eq!(c.cmd(&["SET", k, "x"]), "+OK");
    assert_eq!(direct(&rs[1]).cmd(&["GET", k]), "\"x\"", "its keys are its own again");
}

/// An MGET whose part on a dead server fails before its part on a live one
/// is read gets the dead server's error, and its client goes on: the live
/// part's reply, which nobody reads, leaves the client's account of unread
/// replies. Before, each such reply stayed counted, and after about 40 of
/// 100 KB (the 4 MiB budget) the client's next request was never read: no
/// reply, the connection held for ever (the 30-minute soak found it).
#[test]
fn an_mget_with_a_dead_part_never_stalls_its_client() {
    let mut rs = servers(2);
    let refs: Vec<&Redis> = rs.iter().collect();
    let proxy = Proxy::start(&config("  timeout: 1000\n  hash: md5\n  auto_eject_hosts: false\n", &refs));
    let mut c = Resp::connect(proxy.addr);
    let keys: Vec<String> = (0..20).map(|n| format!("k{n}")).collect();
    for k in &keys {
        assert_eq!(c.cmd(&["SET", k, "x"]), "+OK");
    }
    let on = |i: usize| keys.iter().find(|k| direct(&rs[i]).cmd(&["EXISTS", k]) == ":1").unwrap().clone();
    let (live, dead) = (on(0), on(1));
    let value = "v".repeat(100_000);
    assert_eq!(c.cmd(&["SET", &live, &value]), "+OK");
    rs[1].kill();
    // The dead server's key first: its part is the one awaited first.
    for round in 0..120 {
        let reply = c.cmd(&["MGET", &dead, &live]);
        assert!(reply.starts_with("-ERR backend"), "round {round}: {reply}");
    }
    assert_eq!(c.cmd(&["GET", &live]).len(), value.len() + 2, "the client is still served");
}
