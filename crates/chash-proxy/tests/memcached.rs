//! The proxy in front of real memcached servers (and beside a real
//! nutcracker), all on loopback ports the tests pick and processes the tests
//! start and stop.

mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::{memcacheds, require, wait_listening, Client, Memcached, Nutcracker, Proxy};

fn refs(m: &[Memcached]) -> Vec<&Memcached> {
    m.iter().collect()
}

#[test]
fn every_command_through_the_proxy() {
    let mc = memcacheds(4);
    let proxy = Proxy::start(&support::config("", &refs(&mc)));
    let mut c = proxy.client();
    assert_eq!(c.set("k1", b"hello"), "STORED\r\n");
    assert_eq!(c.cmd("add k1 0 0 1\r\nx\r\n"), "NOT_STORED\r\n");
    assert_eq!(c.cmd("add k2 3 0 2\r\nhi\r\n"), "STORED\r\n");
    assert_eq!(c.cmd("replace k2 4 0 2\r\nho\r\n"), "STORED\r\n");
    assert_eq!(c.cmd("replace nope 0 0 1\r\nx\r\n"), "NOT_STORED\r\n");
    assert_eq!(c.cmd("append k1 0 0 1\r\n!\r\n"), "STORED\r\n");
    assert_eq!(c.cmd("prepend k1 0 0 1\r\n>\r\n"), "STORED\r\n");
    assert_eq!(c.get("k1").unwrap(), b">hello!");
    c.send(b"gets k2\r\n");
    let v = c.read_get_reply();
    assert_eq!((v[0].1, &v[0].2[..]), (4, &b"ho"[..]));
    let cas = v[0].3.unwrap();
    assert_eq!(c.cmd(&format!("cas k2 0 0 1 {}\r\nz\r\n", cas + 1)), "EXISTS\r\n");
    assert_eq!(c.cmd(&format!("cas k2 0 0 1 {cas}\r\nz\r\n")), "STORED\r\n");
    assert_eq!(c.cmd("cas nope 0 0 1 1\r\nz\r\n"), "NOT_FOUND\r\n");
    assert_eq!(c.set("n", b"10"), "STORED\r\n");
    assert_eq!(c.cmd("incr n 5\r\n"), "15\r\n");
    assert_eq!(c.cmd("decr n 20\r\n"), "0\r\n");
    assert_eq!(c.cmd("incr nope 1\r\n"), "NOT_FOUND\r\n");
    assert_eq!(c.cmd("touch k1 100\r\n"), "TOUCHED\r\n");
    c.send(b"gat 100 k1 nope k2\r\n");
    let v = c.read_get_reply();
    assert_eq!(v.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(), ["k1", "k2"]);
    c.send(b"gats 0 k2\r\n");
    assert!(c.read_get_reply()[0].3.is_some());
    assert_eq!(c.cmd("delete k1\r\n"), "DELETED\r\n");
    assert_eq!(c.cmd("delete k1\r\n"), "NOT_FOUND\r\n");
    // noreply: nothing comes back, and the next reply is the next command's.
    c.send(b"set q 0 0 1 noreply\r\na\r\nincr n 1 noreply\r\ndelete k2 noreply\r\ntouch q 10 noreply\r\n");
    assert_eq!(c.get("q").unwrap(), b"a");
    assert_eq!(c.get("k2"), None);
    assert!(c.cmd("version\r\n").starts_with("VERSION 1.6.18-chash-proxy-"));
    assert_eq!(c.cmd("verbosity 1\r\n"), "OK\r\n");
    c.send(b"stats\r\n");
    let mut stats = Vec::new();
    loop {
        let l = c.line();
        if l == "END\r\n" {
            break;
        }
        stats.push(l);
    }
    assert!(stats.iter().any(|l| l.starts_with("STAT curr_connections 1")), "{stats:?}");
    assert_eq!(c.cmd("flush_all\r\n"), "OK\r\n");
    assert_eq!(c.get("n"), None);
    for m in &mc {
        assert!(!m.holds("q"), "flush_all reached every server");
    }
    c.send(b"quit\r\n");
    let mut rest = Vec::new();
    let _ = TcpStream::read_to_end(&mut c.into_stream(), &mut rest);
    assert!(rest.is_empty());
}

#[test]
fn multi_get_spans_servers_in_client_order() {
    let mc = memcacheds(4);
    let proxy = Proxy::start(&support::config("  distribution: ketama\n  hash: md5\n", &refs(&mc)));
    let mut c = proxy.client();
    let keys: Vec<String> = (0..100).map(|i| format!("mk:{i}")).collect();
    for k in keys.iter().step_by(2) {
        assert_eq!(c.set(k, k.as_bytes()), "STORED\r\n");
    }
    // The keys really are on several servers.
    let holders: std::collections::HashSet<u16> =
        keys.iter().step_by(2).map(|k| mc.iter().find(|m| m.holds(k)).unwrap().port).collect();
    assert!(holders.len() >= 3, "{holders:?}");
    let mut asked: Vec<&str> = keys.iter().rev().map(String::as_str).collect();
    asked.push("mk:0"); // a duplicate is answered twice, as memcached does
    c.send(format!("get {}\r\n", asked.join(" ")).as_bytes());
    let got = c.read_get_reply();
    let want: Vec<&str> =
        asked.iter().copied().filter(|k| k.trim_start_matches("mk:").parse::<u32>().unwrap() % 2 == 0).collect();
    assert_eq!(got.iter().map(|v| v.0.as_str()).collect::<Vec<_>>(), want);
    assert!(got.iter().all(|v| v.2 == v.0.as_bytes()));
}

/// 50 clients pipelining sets and gets whose values encode their keys: every
/// reply must belong to its own request.
#[test]
fn pipelining_fifty_clients_never_mixes_replies() {
    let mc = memcacheds(4);
    let proxy = Proxy::start(&support::config("  server_connections: 2\n", &refs(&mc)));
    let mismatches = Arc::new(AtomicU64::new(0));
    let checked = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..50)
        .map(|client| {
            let (addr, mismatches, checked) = (proxy.addr, mismatches.clone(), checked.clone());
            thread::spawn(move || {
                let mut c = Client::connect(addr);
                for round in 0..4 {
                    let mut batch = Vec::new();
                    let keys: Vec<String> = (0..100).map(|i| format!("c{client}:r{round}:k{i}")).collect();
                    for k in &keys {
                        let v = format!("value-of-{k}");
                        batch.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\nget {k}\r\n", v.len()).as_bytes());
                    }
                    batch.extend_from_slice(format!("get {}\r\n", keys.join(" ")).as_bytes());
                    c.send(&batch);
                    for k in &keys {
                        assert_eq!(c.line(), "STORED\r\n");
                        let v = c.read_get_reply();
                        if v.len() != 1 || v[0].0 != *k || v[0].2 != format!("value-of-{k}").as_bytes() {
                            mismatches.fetch_add(1, Relaxed);
                        }
                        checked.fetch_add(1, Relaxed);
                    }
                    let all = c.read_get_reply();
                    for (v, k) in all.iter().zip(&keys) {
                        if v.0 != *k || v.2 != format!("value-of-{k}").as_bytes() {
                            mismatches.fetch_add(1, Relaxed);
                        }
                    }
                    if all.len() != keys.len() {
                        mismatches.fetch_add(1, Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(checked.load(Relaxed), 50 * 4 * 100);
    assert_eq!(mismatches.load(Relaxed), 0);
}

/// The same config in nutcracker and in chash-proxy, in front of the same
/// memcached servers: whatever one stores, the other finds.
#[test]
fn placement_equals_nutcracker() {
    let mc = memcacheds(4);
    let configs = ["", "  hash: md5\n  hash_tag: \"{}\"\n", "  distribution: modula\n  hash: crc32a\n"];
    // The configs side by side: their keys differ (each names its own
    // nutcracker's port), so they can share the servers.
    thread::scope(|scope| {
        for extra in configs {
            let mc = &mc;
            scope.spawn(move || {
                let yml = support::config(extra, &refs(mc));
                let proxy = Proxy::start(&yml);
                let tw = Nutcracker::start(&yml, 30_000);
                let tw_port = tw.port;
                let mut via_tw = Client::connect(tw.addr());
                let mut via_chash = proxy.client();
                // Fresh keys per direction (memcached's flush_all has one-second
                // granularity, so flushing between rounds would race).
                let keys = |dir: &str| {
                    (0..2000).map(|i| format!("nc:{tw_port}:{dir}:{{u{}}}:{i}", i % 37)).collect::<Vec<_>>()
                };
                let tw_keys = keys("tw");
                for k in &tw_keys {
                    assert_eq!(via_tw.set(k, k.as_bytes()), "STORED\r\n");
                }
                let misses = tw_keys.iter().filter(|k| via_chash.get(k).as_deref() != Some(k.as_bytes())).count();
                assert_eq!(misses, 0, "{extra:?}: chash-proxy missed keys nutcracker stored");
                let chash_keys = keys("chash");
                for k in &chash_keys {
                    assert_eq!(via_chash.set(k, b"x"), "STORED\r\n");
                }
                let misses = chash_keys.iter().filter(|k| via_tw.get(k).is_none()).count();
                assert_eq!(misses, 0, "{extra:?}: nutcracker missed keys chash-proxy stored");
            });
        }
    });
}

/// twemproxy's stats document, served on the stats port: the same fields in
/// the same order as a real nutcracker's for the same config, and the same
/// counts after the same traffic (one worker thread, so one connection per
/// server as nutcracker keeps).
#[test]
fn stats_port_matches_nutcracker_field_by_field() {
    let mc = memcacheds(2);
    let extra = "  hash: md5\n  timeout: 2000\n";
    let mut yml = support::config(extra, &refs(&mc));
    // One server unnamed (shown as host:port), one named (shown by name).
    yml = yml.replacen(&format!("{}:1 s1\n", mc[0].id()), &format!("{}:1\n", mc[0].id()), 1);
    yml = yml.replacen(" s2\n", " cache-b\n", 1);
    let tw = Nutcracker::start(&yml, 100);
    let mut options = chash_proxy::ProxyOptions::default();
    options.stats_addr = Some("127.0.0.1:0".parse().unwrap());
    options.stats_interval = Duration::from_millis(100);
    options.threads = Some(1);
    let proxy = Proxy::start_with(&yml, options, None);
    // Starting nutcracker made one connection to see it listen: so here.
    wait_listening(proxy.addr.port());
    let traffic = |addr: std::net::SocketAddr| {
        let mut c = Client::connect(addr);
        for i in 0..40 {
            assert_eq!(c.set(&format!("s:{i}"), format!("value {i}").as_bytes()), "STORED\r\n");
        }
        for i in 0..50 {
            let _ = c.get(&format!("s:{i}"));
        }
        assert_eq!(c.cmd("delete s:1\r\n"), "DELETED\r\n");
        assert_eq!(c.cmd("delete nope\r\n"), "NOT_FOUND\r\n");
        assert_eq!(c.cmd("incr s:2 1\r\n").split_whitespace().next(), Some("CLIENT_ERROR"));
        drop(c);
        // A second client that quits.
        let mut c = Client::connect(addr);
        assert_eq!(c.set("q", b"1"), "STORED\r\n");
        c.send(b"quit\r\n");
        thread::sleep(Duration::from_millis(50));
    };
    traffic(tw.addr());
    traffic(proxy.addr);
    thread::sleep(Duration::from_millis(600));
    let theirs = support::read_stats_port(([127, 0, 0, 1], tw.stats_port).into());
    let ours = support::read_stats_port(proxy.stats.unwrap());
    assert!(ours.ends_with("}}}\n") && !ours.contains('\r'), "one line, as twemproxy's: {ours:?}");
    let parse = |doc: &str| -> serde_json::Value { serde_json::from_str(doc).unwrap() };
    let (t, o) = (parse(&theirs), parse(&ours));
    // Same fields in the same order, at every level (serde_json keeps the
    // order of the text: preserve_order is not on, so compare the text).
    let keys = |doc: &str| -> Vec<String> {
        doc.split('"').skip(1).step_by(2).filter(|k| !k.is_empty()).map(str::to_owned).collect()
    };
    let differ = ["service", "source", "version", "uptime", "timestamp"];
    let (tk, ok): (Vec<String>, Vec<String>) = (keys(&theirs), keys(&ours));
    let strip = |ks: Vec<String>, doc: &serde_json::Value| -> Vec<String> {
        ks.into_iter().filter(|k| !differ.iter().any(|d| doc[d] == serde_json::json!(k))).collect()
    };
    assert_eq!(strip(tk, &t), strip(ok, &o), "\nnutcracker: {theirs}\nchash:      {ours}");
    let pool = |v: &serde_json::Value| v["alpha"].clone();
    let (tp, op) = (pool(&t), pool(&o));
    for field in ["client_eof", "client_err", "client_connections", "server_ejects", "forward_error", "fragments"] {
        assert_eq!(tp[field], op[field], "pool {field}\nnutcracker: {theirs}\nchash:      {ours}");
    }
    for server in [mc[0].id(), "cache-b".to_owned()] {
        for (field, _) in tp[&server].as_object().unwrap() {
            assert_eq!(
                tp[&server][field], op[&server][field],
                "{server} {field}\nnutcracker: {theirs}\nchash:      {ours}"
            );
        }
    }
    for field in ["total_connections", "curr_connections"] {
        assert_eq!(t[field], o[field], "{field}\nnutcracker: {theirs}\nchash:      {ours}");
    }
    assert!(op[mc[0].id()]["requests"].as_u64().unwrap() > 0);
}

#[test]
fn memccapable_passes_all_27_ascii_tests() {
    let memccapable = require("memccapable", "libmemcached-tools");
    let mc = memcacheds(4);
    let proxy = Proxy::start(&support::config("", &refs(&mc)));
    let out = Command::new(memccapable)
        .args(["-a", "-h", "127.0.0.1", "-p", &proxy.addr.port().to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(text.matches("[pass]").count(), 27, "{text}");
    assert!(text.contains("All tests passed"), "{text}");
}

/// A server's latency is its own part (from writing the request to reading
/// the reply), not the time its reply waits for a slow client, and a stall
/// longer than the top bucket's bound is reported as what it was.
#[test]
fn server_latency_is_the_servers_part_and_quantiles_are_honest() {
    let mc = memcacheds(1);
    let proxy = Proxy::start(&support::config("", &refs(&mc)));
    let mut c = proxy.client();
    let big = vec![b'x'; 512 * 1024];
    assert_eq!(c.set("big", &big), "STORED\r\n");
    // 40 replies of 512 KiB wait for a client that reads only after 0.6 s.
    for _ in 0..40 {
        c.send(b"get big\r\n");
    }
    thread::sleep(Duration::from_millis(600));
    for _ in 0..40 {
        assert_eq!(c.read_get_reply()[0].2.len(), big.len());
    }
    let latency = |proxy: &Proxy| {
        let (_, stats) = proxy.admin("GET", "/stats", "");
        let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
        v["pools"][0]["servers"][0]["latency_us"].clone()
    };
    let l = latency(&proxy);
    assert!(l["max"].as_u64().unwrap() < 300_000, "the client's reading is not the server's latency: {l}");
    // Now the server itself stalls for 1.5 s (past the 1 s bucket) during a get.
    // (The clock starts before the pause: the server resumes at least 1.5 s
    // after it, whenever this thread gets to run.)
    let started = Instant::now();
    mc[0].pause(Duration::from_millis(1500));
    assert_eq!(c.get("big").map(|v| v.len()), Some(big.len()));
    assert!(started.elapsed() >= Duration::from_millis(1500));
    for _ in 0..20 {
        assert!(c.get("big").is_some());
    }
    let l = latency(&proxy);
    let (p99, max) = (l["p99"].as_u64().unwrap(), l["max"].as_u64().unwrap());
    assert!((1_000_000..5_000_000).contains(&max), "{l}");
    assert_eq!(p99, max, "p99 falls in the stalled request's bucket and is its value, not the bucket's bound: {l}");
}

/// Servers added, re-weighted and removed through the admin endpoint while
/// clients keep working: no request fails or gets another key's value, and
/// a key misses only when its set and get straddle the change that moved it
/// (at most once per client per change).
#[test]
fn membership_changes_under_load_fail_nothing() {
    let mc = memcacheds(4);
    let proxy = Proxy::start(&support::config("  distribution: ring\n  hash: xxh3\n", &refs(&mc[..3])));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let misses = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let clients = 8;
    let workers: Vec<_> = (0..clients)
        .map(|w| {
            let (addr, stop, errors, misses, done) =
                (proxy.addr, stop.clone(), errors.clone(), misses.clone(), done.clone());
            thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut i = 0u64;
                while !stop.load(Relaxed) && i < 200_000 {
                    let k = format!("load:{w}:{}", i % 500);
                    let mut batch = format!("set {k} 0 0 {}\r\n{k}\r\nget {k}\r\n", k.len()).into_bytes();
                    batch.extend_from_slice(b"version\r\n");
                    c.send(&batch);
                    let stored = c.line();
                    if stored != "STORED\r\n" {
                        eprintln!("set {k}: {stored:?}");
                        errors.fetch_add(1, Relaxed);
                    }
                    let v = c.read_get_reply();
                    if v.is_empty() {
                        misses.fetch_add(1, Relaxed);
                    } else if v.len() != 1 || v[0].2 != k.as_bytes() {
                        eprintln!("get {k}: {v:?}");
                        errors.fetch_add(1, Relaxed);
                    }
                    let _ = c.line();
                    done.fetch_add(1, Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let (status, body) = proxy.admin("POST", "/pools/alpha/servers", &format!("{}:1", mc[3].id()));
    assert_eq!(status, 200, "{body}");
    let added: serde_json::Value = serde_json::from_str(&body).unwrap();
    let moved = added["moved_fraction"].as_f64().unwrap();
    assert!(moved > 0.1 && moved < 0.4, "adding 1 of 4 equal servers moves about a quarter: {moved}");
    thread::sleep(Duration::from_millis(300));
    let (status, body) = proxy.admin("PUT", &format!("/pools/alpha/servers/{}/weight", mc[0].id()), "3");
    assert_eq!(status, 200, "{body}");
    thread::sleep(Duration::from_millis(300));
    let (status, body) = proxy.admin("DELETE", &format!("/pools/alpha/servers/{}", mc[1].id()), "");
    assert_eq!(status, 200, "{body}");
    thread::sleep(Duration::from_millis(300));
    let (status, _) = proxy.admin("DELETE", "/pools/alpha/servers/127.0.0.1:1", "");
    assert_eq!(status, 400);
    stop.store(true, Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert!(done.load(Relaxed) > 1000, "{}", done.load(Relaxed));
    assert_eq!(errors.load(Relaxed), 0, "requests failed during membership changes");
    let changes = 3;
    assert!(misses.load(Relaxed) <= clients * changes, "{} misses", misses.load(Relaxed));
}

/// Malformed input gets an error or a clean close, and the proxy keeps
/// serving this and other clients.
#[test]
fn bad_input_never_stops_the_proxy() {
    let mc = memcacheds(2);
    let proxy = Proxy::start(&support::config("", &refs(&mc)));
    let corpus: &[(&[u8], &str)] = &[
        (b"bogus command\r\n", "ERROR\r\n"),
        (b"\r\n", "ERROR\r\n"),
        (b"set k 0 0 notanumber\r\n", "CLIENT_ERROR bad command line format\r\n"),
        (b"set k 0 0 -5\r\n", "CLIENT_ERROR bad command line format\r\n"),
        // memcached consumes the declared block plus two bytes ("abcde"); "f" is a new command.
        (b"set k 0 0 3\r\nabcdef\r\n", "CLIENT_ERROR bad data chunk\r\nERROR\r\n"),
        (b"get\r\n", "ERROR\r\n"),
        (b"incr k notanumber\r\n", "CLIENT_ERROR invalid numeric delta argument\r\n"),
        (b"get k\x01ey\r\n", "CLIENT_ERROR bad command line format\r\n"),
        (b"\x00\x01\x02\xff\xfe\r\n", "ERROR\r\n"),
        (b"set k 0 0 4294967296\r\n", "CLIENT_ERROR bad command line format\r\n"),
    ];
    let mut c = proxy.client();
    for (input, want) in corpus {
        c.send(input);
        let got: String = (0..want.matches("\r\n").count()).map(|_| c.line()).collect();
        assert_eq!(&got, want, "{:?}", String::from_utf8_lossy(input));
        // Whatever followed the bad request is discarded; the connection still works.
        assert_eq!(c.set("alive", b"yes"), "STORED\r\n", "after {:?}", String::from_utf8_lossy(input));
    }
    let long_key = "k".repeat(251);
    assert_eq!(c.cmd(&format!("set {long_key} 0 0 1\r\nx\r\n")), "CLIENT_ERROR bad command line format\r\n");
    assert_eq!(c.cmd(&format!("get {long_key}\r\n")), "CLIENT_ERROR bad command line format\r\n");
    // A value over the limit is refused without being buffered; its bytes are skipped.
    let big = vec![b'v'; 2 * 1024 * 1024];
    let mut req = format!("set big 0 0 {}\r\n", big.len()).into_bytes();
    req.extend_from_slice(&big);
    req.extend_from_slice(b"\r\n");
    c.send(&req);
    assert_eq!(c.line(), "SERVER_ERROR object too large for cache\r\n");
    assert_eq!(c.get("alive").unwrap(), b"yes");
    // A slow writer: one byte at a time.
    let mut slow = proxy.client();
    for b in b"set slow 0 0 2\r\nok\r\n" {
        slow.send(&[*b]);
        thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(slow.line(), "STORED\r\n");
    // An endless line without a newline is cut off and the connection closed.
    let mut junk = TcpStream::connect(proxy.addr).unwrap();
    junk.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = junk.write_all(&vec![b'x'; 70 * 1024]);
    let mut out = Vec::new();
    let _ = junk.read_to_end(&mut out);
    assert!(
        String::from_utf8_lossy(&out).starts_with("CLIENT_ERROR line too long"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    // Random binary junk on many connections, then a normal client.
    let mut seed = 0x1234_5678_9abc_def0u64;
    for _ in 0..20 {
        let mut s = TcpStream::connect(proxy.addr).unwrap();
        let junk: Vec<u8> = (0..4096)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let _ = s.write_all(&junk);
    }
    let mut fresh = proxy.client();
    assert_eq!(fresh.get("alive").unwrap(), b"yes");
}

#[test]
fn admin_stats_and_metrics() {
    let mc = memcacheds(2);
    let proxy = Proxy::start(&support::config("", &refs(&mc)));
    let mut c = proxy.client();
    for i in 0..20 {
        assert_eq!(c.set(&format!("s{i}"), b"v"), "STORED\r\n");
    }
    let (status, body) = proxy.admin("GET", "/stats", "");
    assert_eq!(status, 200);
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    let pool = &stats["pools"][0];
    assert_eq!(pool["name"], "alpha");
    let sent: u64 = pool["servers"].as_array().unwrap().iter().map(|s| s["requests"].as_u64().unwrap()).sum();
    assert_eq!(sent, 20);
    assert!(pool["servers"][0]["latency_us"]["p99"].as_u64().is_some());
    let (status, metrics) = proxy.admin("GET", "/metrics", "");
    assert_eq!(status, 200);
    assert!(metrics.contains("# TYPE chash_server_requests_total counter"));
    assert!(metrics.contains("chash_pool_requests_total{pool=\"alpha\"} 20"), "{metrics}");
    assert!(metrics.contains("chash_server_latency_seconds_bucket"));
    let (status, _) = proxy.admin("GET", "/nothing", "");
    assert_eq!(status, 404);
    let (status, body) = proxy.admin("POST", "/pools/alpha/servers", "not a server line");
    assert_eq!(status, 400, "{body}");
    let (status, body) = proxy.admin("PUT", &format!("/pools/alpha/servers/{}/weight", mc[0].id()), "0");
    assert_eq!(status, 400, "{body}");
}

/// A config reload changes servers live and reports what moved.
#[test]
fn reload_applies_new_servers() {
    let mc = memcacheds(3);
    let dir = std::env::temp_dir().join(format!("chash-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("proxy.yml");
    let yml = support::config("  distribution: ring\n", &refs(&mc[..2]));
    std::fs::write(&path, &yml).unwrap();
    let proxy = Proxy::start_with(&yml, chash_proxy::ProxyOptions::default(), Some(path.clone()));
    let mut c = proxy.client();
    assert_eq!(c.set("r1", b"v"), "STORED\r\n");
    let grown = yml.replace("  servers:\n", &format!("  servers:\n   - {}:1\n", mc[2].id()));
    std::fs::write(&path, &grown).unwrap();
    let (status, body) = proxy.admin("POST", "/reload", "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let moved = v["reloaded"][0]["moved_fraction"].as_f64().unwrap();
    assert!(moved > 0.1 && moved < 0.6, "{body}");
    assert_eq!(proxy.handle.pools()[0].stats().servers.len(), 3);
    std::fs::write(&path, "alpha: [broken").unwrap();
    let (status, _) = proxy.admin("POST", "/reload", "");
    assert_eq!(status, 400);
    assert_eq!(proxy.handle.pools()[0].stats().servers.len(), 3, "a bad file changes nothing");
    let _ = std::fs::remove_dir_all(&dir);
    let _: HashMap<(), ()> = HashMap::new();
}

/// `client_connections` caps clients (more are closed at once), and idle
/// clients are closed after `client_idle_timeout`.
#[test]
fn connection_limit_and_idle_timeout() {
    let mc = memcacheds(1);
    let yml = support::config("  client_connections: 2\n", &refs(&mc));
    let mut options = chash_proxy::ProxyOptions::default();
    options.client_idle_timeout = Some(Duration::from_millis(400));
    let proxy = Proxy::start_with(&yml, options, None);
    let mut a = proxy.client();
    let mut b = proxy.client();
    assert_eq!(a.set("x", b"1"), "STORED\r\n");
    assert_eq!(b.set("y", b"2"), "STORED\r\n");
    let mut third = TcpStream::connect(proxy.addr).unwrap();
    third.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = third.write_all(b"version\r\n");
    let mut out = Vec::new();
    let _ = third.read_to_end(&mut out);
    assert!(out.is_empty(), "a connection over the limit is closed: {:?}", String::from_utf8_lossy(&out));
    // Idle clients are closed after the timeout, which frees their places.
    thread::sleep(Duration::from_millis(900));
    let mut rest = Vec::new();
    let mut idle = a.into_stream();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = idle.read_to_end(&mut rest);
    assert!(rest.is_empty());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut fresh = proxy.client();
        fresh.send(b"version\r\n");
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut std::io::BufReader::new(fresh.into_stream()), &mut line).is_ok()
            && line.starts_with("VERSION")
        {
            break;
        }
        assert!(Instant::now() < deadline, "places were not freed");
        thread::sleep(Duration::from_millis(50));
    }
    let stats = proxy.handle.pools()[0].stats().get("rejected_connections");
    assert!(stats >= 1);
}

/// One list of counters, four renderings: memcached's `stats`, the admin
/// endpoint's JSON and Prometheus text, and twemproxy's document (its own
/// fields) all carry every counter the pool has.
#[test]
fn every_rendering_carries_every_counter() {
    let mc = memcacheds(1);
    let mut options = chash_proxy::ProxyOptions::default();
    options.stats_addr = Some("127.0.0.1:0".parse().unwrap());
    options.stats_interval = Duration::from_millis(50);
    let proxy = Proxy::start_with(&support::config("", &refs(&mc)), options, None);
    let mut c = proxy.client();
    assert_eq!(c.set("k", b"v"), "STORED\r\n");
    let snapshot = &proxy.handle.stats()[0];
    let pool_names: Vec<&str> = snapshot.counters.iter().map(|(d, _)| d.name).collect();
    let server_names: Vec<&str> = snapshot.servers[0].counters.iter().map(|(d, _)| d.name).collect();
    assert!(pool_names.len() >= 15 && server_names.len() >= 15);
    c.send(b"stats\r\n");
    let mut stats = String::new();
    loop {
        let line = c.line();
        if line == "END\r\n" {
            break;
        }
        stats.push_str(&line);
    }
    let (_, json) = proxy.admin("GET", "/stats", "");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let (_, metrics) = proxy.admin("GET", "/metrics", "");
    for name in &pool_names {
        assert!(stats.contains(&format!("STAT {name} ")), "memcached stats lacks {name}:\n{stats}");
        assert!(json["pools"][0].get(name).is_some(), "JSON lacks {name}");
        let metric = name.strip_prefix("total_").unwrap_or(name);
        assert!(metrics.contains(&format!("chash_pool_{metric}")), "Prometheus lacks {name}");
    }
    for name in &server_names {
        assert!(json["pools"][0]["servers"][0].get(name).is_some(), "JSON lacks server {name}");
        assert!(metrics.contains(&format!("chash_server_{name}")), "Prometheus lacks server {name}");
    }
    thread::sleep(Duration::from_millis(200));
    let doc = support::read_stats_port(proxy.stats.unwrap());
    for field in ["client_eof", "forward_error", "fragments", "server_ejected_at", "out_queue_bytes", "response_bytes"]
    {
        assert!(doc.contains(&format!("\"{field}\":")), "stats document lacks {field}: {doc}");
    }
}

/// `noreply` means no reply at all, not even for a refused request, as in
/// memcached (pymemcache sets with noreply by default: an error reply would
/// be read as the next request's).
#[test]
fn refused_noreply_requests_send_nothing_as_memcached() {
    let mc = memcacheds(1);
    let proxy = Proxy::start(&support::config("", &refs(&mc)));
    let mut input = b"set big 0 0 2000000 noreply\r\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 2_000_000));
    input.extend_from_slice(
        b"\r\nset k 0 0 1 noreply\r\nq\r\nincr k x noreply\r\nset c 0 0 1 noreply\r\nxyz\r\nget k\r\n",
    );
    let talk = |addr: std::net::SocketAddr| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&input).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while !out.ends_with(b"END\r\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&out));
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(out).unwrap()
    };
    let direct = talk(([127, 0, 0, 1], mc[0].port).into());
    assert_eq!(direct, "ERROR\r\nVALUE k 0 1\r\nq\r\nEND\r\n", "memcached itself");
    assert_eq!(talk(proxy.addr), direct);
}

/// One step of the meta differential script: bytes to send (with `{name}`
/// standing for a CAS captured earlier in the same run), the name to
/// capture the first `c<cas>` of its reply under, and whether the embedded
/// shards are held to it (`me` shows what a shard has, not memcached's
/// slab details).
struct Step {
    send: String,
    capture: Option<&'static str>,
    shards_too: bool,
}

fn step(send: &str) -> Step {
    Step { send: send.to_owned(), capture: None, shards_too: true }
}

/// Every meta command and the flag combinations clients use: hits, misses,
/// quiet, opaque, base64 keys, CAS conflicts, invalidation, vivify and
/// recache, the set modes, arithmetic modes, classic commands between
/// them, and memcached's errors.
fn meta_script() -> Vec<Step> {
    let mut s: Vec<Step> = [
        "ms foo 3 T0 F5 c k O9\r\nbar\r\n",
        "mg foo\r\n",
        "mg foo k v O123 t f s c\r\n",
        "mg foo c s f t O123 v k\r\n",
        "mg missing\r\nmg missing O1 k\r\nmg missing O\r\n",
        "mg  foo   O1    k  \r\n",
        "mg foo v\nmg foo k\n",
        // Quiet: misses and HD left out, hits and errors kept; Dalli's shapes.
        "mg nope q\r\nmg nope2 q v k O5\r\nmg foo q v k f s\r\nmn\r\n",
        "ms q1 2 q T0\r\nq1\r\nms q2 2 q MR\r\nq2\r\nmd q1 q\r\nmd q1 q\r\nmn\r\n",
        "ms dal:1 3 T0 F0 q\r\nab1\r\nms dal:2 3 T0 F0 q\r\nab2\r\nms dal:3 3 T0 F0 q\r\nab3\r\nms dal:4 3 T0 F0 q\r\nab4\r\nms dal:5 3 T0 F0 q\r\nab5\r\nms dal:6 3 T0 F0 q\r\nab6\r\nmn\r\n",
        "mg dal:1 v f k q s\r\nmg dal:2 v f k q s\r\nmg dal:x v f k q s\r\nmg dal:3 v f k q s\r\nmg dal:4 v f k q s\r\nmg dal:y v f k q s\r\nmg dal:5 v f k q s\r\nmg dal:6 v f k q s\r\nmn\r\n",
        // Set modes.
        "ms a1 1 ME c O1 k\r\nx\r\nms a1 1 ME c O1 k\r\ny\r\nms a1 1 ME c O1 k q\r\ny\r\n",
        "ms b1 1 MR c O1 k\r\ny\r\nms b1 1 MA c\r\ny\r\nms b1 1 MP\r\ny\r\n",
        "ms ap 1 T0 F3\r\nx\r\nms ap 1 MA\r\nZ\r\nms ap 1 MP\r\nA\r\nmg ap v f\r\n",
        "ms e0 0\r\n\r\nmg e0 v s\r\n",
        "ms exp 1 T-1\r\nx\r\nmg exp v\r\n",
        // CAS.
        "mg foo c\r\n",
        "ms nocas 1 C999999 c O1 k\r\nq\r\nms foo 1 MS C999999 c O1 k\r\nq\r\n",
        "ms nocas 1 ME C999999 c\r\nq\r\nms foo 1 C0 c\r\nq\r\n",
        // Invalidation and stale-while-revalidate.
        "ms sw 5 T100 c\r\nhello\r\n",
        "md sw I T30 O7 k c\r\n",
        "mg sw v t\r\nmg sw v t\r\n",
        // Vivify, recache.
        "mg v1 N30 v t s O1 k\r\nmg v1 N30 v t s\r\nmg v2 N30 q\r\nmn\r\n",
        "mg v3 t N30\r\nmg v4 N30 t\r\n",
        "ms r1 2 T10\r\nhi\r\nmg r1 R30 v t\r\nmg r1 R30 v t\r\nms r2 2 T0\r\nhi\r\nmg r2 R30 v t\r\n",
        "ms hh 1\r\nx\r\nmg hh h u\r\nmg hh h\r\nmg hh h\r\n",
        "mg hh t T30\r\nmg hh T50 t\r\n",
        // Deletes.
        "md hh q\r\nmd hh q\r\nmd hh C1 O1 k\r\nmn\r\n",
        "ms d1 1\r\nx\r\nmd d1 C999999 O1 k\r\nmd d1 C999999 q\r\nmd d1 O2 k\r\nmd nope I\r\n",
        "ms d2 1 T0\r\nx\r\nmd d2 T5\r\nmg d2\r\n",
        // Arithmetic.
        "ma n1\r\nma n1 O1 k v t c\r\nma n1 N0 J10 v t O1 k\r\n",
        "ma n1 v\r\nma n1 v D5\r\nma n1 v MD D100\r\nma n1 v M+ D7\r\nma n1 v M-\r\n",
        "ma n1 q\r\nmn\r\nma nq q\r\nmn\r\nma nv q N0\r\nmn\r\n",
        "ma n1 T100 t v\r\nma n1 C999999 v\r\n",
        "ms t1 3\r\nabc\r\nma t1\r\nma t1 q\r\n",
        "ms big 20\r\n18446744073709551615\r\nma big v\r\n",
        // Base64 keys: the same items as plain ones.
        "ms Zm9vMg== 2 b k\r\nhi\r\nmg foo2 v k\r\nmg Zm9vMg== b v k\r\nmg QQ== b v k\r\nmd Zm9vMg== b q\r\nmg foo2\r\n",
        // Classic and meta on one connection, in order.
        "set cl 3 0 2\r\nab\r\nmg cl v f\r\nms cl 2 F4\r\ncd\r\nget cl\r\nmn\r\ndelete cl\r\nmg cl\r\n",
        "incr n1 1\r\nma n1 v\r\ntouch n1 100\r\nmg n1 t v\r\n",
        // Errors: as memcached sends them, and the connection goes on.
        "mg foo v v\r\nmg foo zz\r\nmg foo E5\r\nmg foo q zz\r\nmg k Tx\r\nmg k N\r\n",
        "mg QQ b v\r\nmg QQ= b v\r\nmd QQ b\r\nma QQ b\r\n",
        "md k x\r\nmd k q q\r\nmd k Tx I\r\nma n1 Dabc\r\nma n1 D-1\r\nma n1 Jx\r\nma n1 v Mi\r\n",
        "mg\r\nmz foo\r\nMG foo\r\nmgx foo\r\nme\r\nmn extra\r\n",
        "ms k1\r\nms k1 abc\r\nabc\r\nms k1 -1\r\nabc\r\n",
        "ms k1 3 zz\r\nabc\r\nms k1 3 MX\r\nabc\r\nms k1 3 MSS\r\nabc\r\nms k1 3 Fx\r\nabc\r\nms k1 3 c c\r\nabc\r\nms k1 3 Tx\r\nabc\r\n",
        "ms k1 3\r\nabcd\r\nmg k1 v\r\n",
    ]
    .iter()
    .map(|s| step(s))
    .collect();
    s.push(step(&format!("mg {} v\r\nmg {} v\r\n", "a".repeat(250), "a".repeat(251))));
    s.push(step(&format!("mg nope O{}\r\nmg nope O{}\r\n", "x".repeat(31), "x".repeat(32))));
    s.push(step(&format!("ms {} 3\r\nabc\r\n", "a".repeat(251))));
    s.push(step("mg foo b N1 T1 R1 l O1 P L k s t c f v h u q\r\nmg foo b N1 T1 R1 l O1 P L k s t c f v h u q F1\r\n"));
    s.push(step(&format!("ms huge {}\r\n{}\r\nmg huge\r\n", 2_000_000, "x".repeat(2_000_000))));
    // A CAS captured, then used: it matches once, then it is stale.
    s.push(Step { send: "mg foo c\r\n".into(), capture: Some("foo"), shards_too: true });
    s.push(step("ms foo 3 C{foo} c\r\nnew\r\nms foo 3 C{foo} c\r\nold\r\n"));
    // An older writer's value with I: kept, marked stale.
    s.push(Step { send: "ms st 5 T100 c\r\nfirst\r\n".into(), capture: Some("st1"), shards_too: true });
    s.push(step("ms st 6 T100\r\nsecond\r\n"));
    s.push(step("ms st 5 C{st1} I\r\nolder\r\nmg st v\r\nmg st v\r\n"));
    s.push(Step { send: "me foo\r\nme nope\r\nme Zm9vMg== b\r\n".into(), capture: None, shards_too: false });
    s
}

/// Runs the script on one connection: each step's reply, read up to the
/// `MN` of an `mn` sent after it (and those of its own `mn`s).
fn run_meta_script(addr: std::net::SocketAddr, shard: bool) -> Vec<String> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut captured: HashMap<&str, String> = HashMap::new();
    let mut out = Vec::new();
    for step in meta_script().into_iter().filter(|s| !shard || s.shards_too) {
        let mut send = step.send.clone();
        for (name, value) in &captured {
            send = send.replace(&format!("{{{name}}}"), value);
        }
        let expected_mn = send.matches("mn\r\n").count() + send.matches("mn extra\r\n").count() + 1;
        stream.write_all(send.as_bytes()).unwrap();
        stream.write_all(b"mn\r\n").unwrap();
        let reply = read_to_mn(&mut stream, expected_mn);
        if let Some(name) = step.capture {
            let cas = reply.split([' ', '\r']).find_map(|t| t.strip_prefix('c').filter(|n| n.parse::<u64>().is_ok()));
            captured.insert(name, cas.unwrap_or_else(|| panic!("no CAS in {reply:?}")).to_owned());
        }
        out.push(reply);
    }
    out
}

/// Reads replies (value blocks skipped whole) until `n` `MN` lines came.
fn read_to_mn(stream: &mut TcpStream, n: usize) -> String {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let mut pos = 0;
        let mut seen = 0;
        while let Some(i) = buf[pos..].iter().position(|&b| b == b'\n') {
            let line = &buf[pos..pos + i + 1];
            let text = String::from_utf8_lossy(line);
            let mut words = text.split_whitespace();
            let data = match (words.next(), words.next()) {
                (Some("VA"), Some(len)) => len.parse::<usize>().unwrap() + 2,
                (Some("VALUE"), _) => words.nth(1).unwrap().parse::<usize>().unwrap() + 2,
                _ => 0,
            };
            if text == "MN\r\n" {
                seen += 1;
            }
            pos += i + 1 + data;
            if seen == n {
                return String::from_utf8_lossy(&buf[..pos]).into_owned();
            }
            if pos > buf.len() {
                break;
            }
        }
        let got = stream.read(&mut chunk).expect("a reply within 10 s");
        assert!(got > 0, "connection closed; so far {:?}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..got]);
    }
}

/// Replaces what depends on the clock (`t`, `l`, and `me`'s times) and,
/// unless `keep_cas`, CAS values (each server counts its own) with `#`.
fn normalise(reply: &str, keep_cas: bool) -> String {
    reply
        .split("\r\n")
        .map(|line| {
            if line.starts_with("VALUE") {
                return line.to_owned();
            }
            line.split(' ')
                .map(|t| {
                    let digits = |rest: &str| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit());
                    match t.split_at_checked(1) {
                        Some(("t" | "l", rest)) if digits(rest) => format!("{}#", &t[..1]),
                        Some(("c", rest)) if digits(rest) && !keep_cas => "c#".into(),
                        _ => match t.split_once('=') {
                            Some((k @ ("exp" | "la" | "size" | "cls"), _)) => format!("{k}=#"),
                            Some(("cas", _)) if !keep_cas => "cas=#".into(),
                            _ => t.to_owned(),
                        },
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// The meta differential: the script straight to a real memcached and
/// through the proxy with that one server behind it gives the same bytes
/// (the clock's figures aside); through the proxy with four servers the
/// same replies (CAS values aside: each server counts its own), the keys
/// spread over all four; and the embedded shards give the same for what
/// they claim (all but `me`'s details).
#[test]
fn meta_commands_answer_as_memcached_does() {
    let direct = Memcached::start();
    let behind = Memcached::start();
    let want: Vec<String> = run_meta_script(([127, 0, 0, 1], direct.port).into(), false);
    // Sanity: the script exercised what it means to.
    let all = want.concat();
    for seen in ["VA 3 kfoo O123 t-1 f5 s3 c", "EN O1 kmissing", "X W", "Z X", "W\r\n", "EX", "NS", "NF", "MN"] {
        assert!(all.contains(seen), "{seen:?} not in memcached's replies");
    }
    let one = Proxy::start(&support::config("", &[&behind]));
    let got = run_meta_script(one.addr, false);
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(normalise(g, true), normalise(w, true), "step {i}: {:?}", meta_script()[i].send);
    }
    assert_eq!(got.len(), want.len());
    // Counted as memcached counts them: mg as gets, ms as sets, all as meta.
    let mut c = one.client();
    c.send(b"stats\r\n");
    let mut stats = HashMap::new();
    loop {
        let line = c.line();
        if line == "END\r\n" {
            break;
        }
        let w: Vec<&str> = line.split_whitespace().collect();
        stats.insert(w[1].to_owned(), w[2].to_owned());
    }
    let stat = |name: &str| stats[name].parse::<u64>().unwrap();
    let script = meta_script().iter().map(|s| s.send.clone()).collect::<String>();
    let count = |prefix: &str| script.split('\n').filter(|l| l.starts_with(prefix)).count() as u64;
    assert!(stat("cmd_meta") >= count("mg ") + count("ms ") + count("md ") + count("ma "), "{stats:?}");
    assert!(stat("cmd_get") >= count("mg ") - 20 && stat("cmd_set") >= count("ms ") - 20, "{stats:?}");
    let four = memcacheds(4);
    let proxy4 = Proxy::start(&support::config("", &refs(&four)));
    let got = run_meta_script(proxy4.addr, false);
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(normalise(g, false), normalise(w, false), "step {i}: {:?}", meta_script()[i].send);
    }
    for m in &four {
        let mut c = Client::connect(([127, 0, 0, 1], m.port).into());
        c.send(b"stats\r\n");
        let mut used = 0;
        loop {
            let line = c.line();
            if line == "END\r\n" {
                break;
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            if matches!(w[1], "cmd_get" | "cmd_set" | "cmd_touch" | "delete_hits" | "delete_misses") {
                used += w[2].parse::<u64>().unwrap();
            }
        }
        assert!(used > 0, "server {} got none of the script's commands", m.id());
    }
    // The embedded shards.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let shard = rt.block_on(chash_proxy::embedded::start_shard(64 << 20, stop)).unwrap();
    let runner = thread::spawn(move || {
        rt.block_on(async { tokio::time::sleep(Duration::from_secs(60)).await });
    });
    let got = run_meta_script(shard.addr, true);
    let want_shard: Vec<&String> =
        meta_script().iter().zip(&want).filter(|(s, _)| s.shards_too).map(|(_, w)| w).collect();
    for (i, (w, g)) in want_shard.iter().zip(&got).enumerate() {
        assert_eq!(normalise(g, false), normalise(w, false), "shard step {i}");
    }
    drop(runner);
}

/// Classic-protocol cases from memcached 1.6.18's own `t/` tests (and the
/// gaps they found): each on a fresh connection, then `mn` as a marker.
fn classic_cases() -> Vec<Vec<u8>> {
    let mut cases: Vec<Vec<u8>> = [
        // verbosity's argument is a number.
        "verbosity invalid\r\n",
        "verbosity 1\r\n",
        "verbosity\r\n",
        "verbosity 1 noreply\r\n",
        "verbosity 1 2 3\r\n",
        // A wrong word count is an unknown command: its data is read as one.
        "cas foo 0 0 6 \r\nabcdef\r\n",
        "set foo 0 0\r\n",
        "cas foo 0 0 1\r\n",
        "incr foo\r\n",
        "decr foo\r\n",
        "touch foo\r\n",
        "delete\r\n",
        "get\r\n",
        "flush_all 0 noreply x\r\n",
        "incr foo 1 noreply x\r\n",
        "touch foo 1 noreply x\r\n",
        // A time that is not a number.
        "flush_all invalid\r\n",
        "gat abc foo\r\n",
        "gats foo\r\n",
        "touch foo abc\r\n",
        "gat 10\r\n",
        "incr foo abc\r\n",
        // Bad numbers with the right count: the data line is a command.
        "set foo abc 0 1\r\nx\r\n",
        "set foo 0 abc 1\r\nx\r\n",
        "set foo 0 0 abc\r\nx\r\n",
        "cas foo 0 0 1 abc\r\nx\r\n",
        "set foo 0 0 -1\r\n",
        // A length whose sum with "\r\n" overflows memcached's int.
        "set k 0 0 2147483647\r\nabc\r\nget k\r\n",
        "set k 0 0 2147483646\r\nget k\r\n",
        // delete's optional zero time.
        "set d 0 0 1\r\n1\r\ndelete d 0\r\ndelete d 0\r\n",
        "delete foo 0 noreply\r\n",
        "delete foo 1\r\n",
        "delete foo noreply x\r\n",
        // A last word that is not noreply is ignored.
        "set foo 0 0 1 HTTP/1.1\r\nx\r\nget foo HTTP/1.1\r\n",
        "flush_all 10 20\r\nflush_all 0\r\n",
        // HTTP: hung up on, nothing stored.
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 25\r\n\r\nset pwned 0 0 5\r\nhello\r\n",
        "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "get pwned\r\n",
    ]
    .iter()
    .map(|c| c.as_bytes().to_vec())
    .collect();
    // A set refused as too large leaves no old value readable; ms too.
    let big = vec![b'x'; 1_049_600];
    let mut set = b"set k 0 0 3\r\nMOO\r\nset k 0 0 1049600\r\n".to_vec();
    set.extend_from_slice(&big);
    set.extend_from_slice(b"\r\nget k\r\n");
    cases.push(set);
    let mut ms = b"ms mk 3\r\nMOO\r\nms mk 1049600\r\n".to_vec();
    ms.extend_from_slice(&big);
    ms.extend_from_slice(b"\r\nmg mk v\r\n");
    cases.push(ms);
    cases
}

/// The replies to `case` on a fresh connection up to the `mn` marker's
/// `MN`, and whether the connection was closed before it.
fn run_case(addr: std::net::SocketAddr, case: &[u8]) -> (String, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(case).unwrap();
    let _ = s.write_all(b"mn\r\n");
    let mut got = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        if got.ends_with(b"MN\r\n") {
            return (String::from_utf8_lossy(&got[..got.len() - 4]).into_owned(), false);
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
    }
}

/// memcached's own protocol tests, through the proxy and in the embedded
/// shards, byte for byte against a real memcached: error lines for bad
/// word counts and bad numbers, `verbosity`'s number, lengths that
/// overflow, a refused too-large set that leaves no stale value (on the
/// replicas too), and HTTP requests hung up on with nothing stored.
#[test]
fn classic_errors_answer_as_memcached_does() {
    let direct = Memcached::start();
    let behind = Memcached::start();
    let proxy = Proxy::start(&support::config("", &[&behind]));
    let three = memcacheds(3);
    let replicated = Proxy::start(&support::config("  replicas: 3\n", &refs(&three)));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let shard = rt.block_on(chash_proxy::embedded::start_shard(64 << 20, stop)).unwrap();
    let runner = thread::spawn(move || {
        rt.block_on(async { tokio::time::sleep(Duration::from_secs(60)).await });
    });
    for case in classic_cases() {
        let want = run_case(([127, 0, 0, 1], direct.port).into(), &case);
        let shown = String::from_utf8_lossy(&case[..case.len().min(80)]).into_owned();
        for (what, addr) in [("proxy", proxy.addr), ("replicas: 3", replicated.addr), ("shard", shard.addr)] {
            assert_eq!(run_case(addr, &case), want, "{what}: {shown:?}");
        }
    }
    // The too-large set took the old value off every replica.
    for m in &three {
        assert!(!m.holds("k"), "{} still holds k", m.id());
    }
    // The HTTP requests were counted.
    let (_, stats) = proxy.admin("GET", "/stats", "");
    assert!(stats.contains("\"http_refused\": 2"), "{stats}");
    drop(runner);
}

/// Redis's rule too: a `POST` or `Host:` line closes a memcached pool's
/// connection (memcached itself answers them `ERROR`; a request forgery
/// can put either first), and a Redis pool closes on those and on an HTTP
/// request line, as redis-server does, with nothing run.
#[test]
fn http_requests_are_hung_up_on() {
    let mc = Memcached::start();
    let proxy = Proxy::start(&support::config("", &[&mc]));
    for case in ["POST /x\r\nset a 0 0 1\r\n1\r\n", "Host: cache\r\nset a 0 0 1\r\n1\r\n", "post\r\n"] {
        assert_eq!(run_case(proxy.addr, case.as_bytes()), (String::new(), true), "{case:?}");
    }
    assert_eq!(run_case(proxy.addr, b"get a\r\n"), ("END\r\n".to_owned(), false));
    let redis = support::Redis::start(None);
    let rproxy =
        Proxy::start(&format!("r:\n  listen: 127.0.0.1:0\n  redis: true\n  servers:\n   - {}:1\n", redis.id()));
    for case in [
        "GET / HTTP/1.1\r\nHost: x\r\n\r\nSET pwned 1\r\n",
        "POST / HTTP/1.1\r\nSET pwned 1\r\n",
        "*1\r\n$5\r\nHost:\r\n*3\r\n$3\r\nSET\r\n$5\r\npwned\r\n$1\r\n1\r\n",
    ] {
        let mut s = TcpStream::connect(rproxy.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(case.as_bytes()).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        assert!(got.is_empty(), "{case:?}: {:?}", String::from_utf8_lossy(&got));
    }
    let mut s = TcpStream::connect(rproxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"*2\r\n$6\r\nEXISTS\r\n$5\r\npwned\r\n").unwrap();
    let mut reply = [0u8; 4];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b":0\r\n", "nothing was stored");
    let (_, stats) = rproxy.admin("GET", "/stats", "");
    assert!(stats.contains("\"http_refused\": 3"), "{stats}");
}
