//! Warm-up and drain in front of real memcached servers: membership
//! changes under load that lose no key and never bring an older value back.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::{memcacheds, ring_config, Client, Memcached, Proxy};

const KEYS: usize = 100_000;
const CLIENTS: usize = 20;

fn key(i: usize) -> String {
    format!("w:{i}")
}

/// A value that names its key and its version.
fn value(i: usize, version: u32) -> String {
    format!("{}|{version}", key(i))
}

/// Stores keys `range` at version 0 (pipelined, a thousand at a time).
fn preload(c: &mut Client, range: std::ops::Range<usize>) {
    let ids: Vec<usize> = range.collect();
    for chunk in ids.chunks(1000) {
        let mut batch = Vec::new();
        for &i in chunk {
            let v = value(i, 0);
            batch.extend_from_slice(format!("set {} 0 0 {}\r\n{v}\r\n", key(i), v.len()).as_bytes());
        }
        c.send(&batch);
        for _ in chunk {
            assert_eq!(c.line(), "STORED\r\n");
        }
    }
}

fn counter(proxy: &Proxy, name: &str) -> u64 {
    let (_, body) = proxy.admin("GET", "/stats", "");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["pools"][0][name].as_u64().unwrap_or_else(|| panic!("no {name} in {body}"))
}

/// Checks every key of `owned` against what its client last did (`state`):
/// a hit with exactly the last version written, or a miss after a delete.
fn sweep(c: &mut Client, owned: &[usize], state: &HashMap<usize, Option<u32>>, problems: &mut Vec<String>) {
    let keys: Vec<String> = owned.iter().map(|&i| key(i)).collect();
    for ((&i, k), got) in owned.iter().zip(&keys).zip(c.get_each(&keys)) {
        let want = state[&i].map(|v| value(i, v));
        let got = got.map(|g| String::from_utf8_lossy(&g).into_owned());
        if got != want {
            problems.push(format!("{k}: read {got:?}, last written {want:?}"));
        }
    }
}

/// 100,000 keys; a server added, one re-weighted and one removed, each
/// under load from 20 clients that pipeline sets, deletes and multi-key
/// gets of their own keys (values name key and version). With `warmup`,
/// every read returns exactly the last acknowledged write of its key:
/// no miss for a key stored before a change, no older value after a write,
/// nothing back after a delete; the same holds for every key at the end.
#[test]
fn warmup_changes_under_load_lose_no_key() {
    let mc = memcacheds(4);
    let proxy = Proxy::start(&ring_config("  warmup: 600\n", &[&mc[0], &mc[1], &mc[2]]));
    let mut c = proxy.client();
    preload(&mut c, 0..KEYS);
    let stop = Arc::new(AtomicBool::new(false));
    let batches = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (addr, stop, batches) = (proxy.addr, stop.clone(), batches.clone());
            thread::spawn(move || {
                let owned: Vec<usize> = (client..KEYS).step_by(CLIENTS).collect();
                let mut state: HashMap<usize, Option<u32>> = owned.iter().map(|&i| (i, Some(0))).collect();
                let mut c = Client::connect(addr);
                let mut problems = Vec::new();
                let mut seed = 0x9e37_79b9_u64 + client as u64;
                let mut next = |below: usize| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed % below as u64) as usize
                };
                while !stop.load(Relaxed) {
                    // Eight distinct keys: writes and deletes first, then
                    // one multi-key get of the rest, all in one send.
                    let mut picked: Vec<usize> = Vec::new();
                    while picked.len() < 8 {
                        let i = owned[next(owned.len())];
                        if !picked.contains(&i) {
                            picked.push(i);
                        }
                    }
                    let (mut batch, mut writes, mut reads) = (Vec::new(), Vec::new(), Vec::new());
                    for &i in &picked {
                        match next(10) {
                            0..=1 => {
                                let version = state[&i].map_or(1, |v| v + 1);
                                let v = value(i, version);
                                batch
                                    .extend_from_slice(format!("set {} 0 0 {}\r\n{v}\r\n", key(i), v.len()).as_bytes());
                                writes.push((i, Some(version)));
                            }
                            2 => {
                                batch.extend_from_slice(format!("delete {}\r\n", key(i)).as_bytes());
                                writes.push((i, None));
                            }
                            _ => reads.push(i),
                        }
                    }
                    if !reads.is_empty() {
                        let names: Vec<String> = reads.iter().map(|&i| key(i)).collect();
                        batch.extend_from_slice(format!("get {}\r\n", names.join(" ")).as_bytes());
                    }
                    c.send(&batch);
                    for (i, after) in writes {
                        let line = c.line();
                        let ok = match after {
                            Some(_) => line == "STORED\r\n",
                            None => line == "DELETED\r\n" || line == "NOT_FOUND\r\n",
                        };
                        if !ok {
                            problems.push(format!("{}: {line:?}", key(i)));
                        }
                        state.insert(i, after);
                    }
                    if !reads.is_empty() {
                        let got: HashMap<String, Vec<u8>> =
                            c.read_get_reply().into_iter().map(|(k, _, v, _)| (k, v)).collect();
                        for i in reads {
                            let want = state[&i].map(|v| value(i, v));
                            let got = got.get(&key(i)).map(|g| String::from_utf8_lossy(g).into_owned());
                            if got != want {
                                problems.push(format!("{}: read {got:?}, last written {want:?}", key(i)));
                            }
                        }
                    }
                    batches.fetch_add(1, Relaxed);
                }
                sweep(&mut c, &owned, &state, &mut problems);
                problems
            })
        })
        .collect();
    // Each change once every client has had time to run batches around it.
    let wait_batches = |n: u64| {
        let target = batches.load(Relaxed) + n;
        let started = Instant::now();
        while batches.load(Relaxed) < target {
            assert!(started.elapsed() < Duration::from_secs(120), "the clients stalled");
            thread::sleep(Duration::from_millis(5));
        }
    };
    wait_batches(500);
    let changes = [
        ("POST", "/pools/alpha/servers".to_owned(), format!("{}:1", mc[3].id())),
        ("PUT", format!("/pools/alpha/servers/{}/weight", mc[0].id()), "3".to_owned()),
        ("DELETE", format!("/pools/alpha/servers/{}", mc[1].id()), String::new()),
    ];
    for (method, path, body) in &changes {
        let (status, reply) = proxy.admin(method, path, body);
        assert_eq!(status, 200, "{method} {path}: {reply}");
        assert!(reply.contains("\"warmup_seconds\": 600"), "{reply}");
        wait_batches(2000);
    }
    stop.store(true, Relaxed);
    let problems: Vec<String> = clients.into_iter().flat_map(|t| t.join().unwrap()).collect();
    assert!(problems.is_empty(), "{} problems, e.g. {:?}", problems.len(), &problems[..problems.len().min(8)]);
    // Keys were found on their previous servers and copied over.
    let (hits, copies) = (counter(&proxy, "warmup_hits"), counter(&proxy, "warmup_copies"));
    assert!(hits > 10_000 && copies > 10_000, "hits {hits}, copies {copies}");
    assert!(counter(&proxy, "warmup_deletes") > 0);
    // The removed server's keys were copied to their new servers.
    let sample: Vec<String> = (0..20_000).map(key).collect();
    let on_removed = mc[1].holds_each(&sample);
    let elsewhere: Vec<Vec<bool>> = [0, 2, 3].iter().map(|&m| mc[m].holds_each(&sample)).collect();
    let copied = (0..sample.len()).filter(|&j| on_removed[j] && elsewhere.iter().any(|h| h[j])).count();
    assert!(copied > 1000, "{copied} of the removed server's keys copied");
}

/// Without warm-up the same change misses: the test above could fail.
#[test]
fn without_warmup_moved_keys_miss() {
    let mc = memcacheds(3);
    let proxy = Proxy::start(&ring_config("", &[&mc[0], &mc[1]]));
    let mut c = proxy.client();
    preload(&mut c, 0..2000);
    let (status, reply) = proxy.admin("POST", "/pools/alpha/servers", &format!("{}:1", mc[2].id()));
    assert_eq!(status, 200, "{reply}");
    assert!(reply.contains("\"warmup_seconds\": 0"), "{reply}");
    let keys: Vec<String> = (0..2000).map(key).collect();
    let misses = c.get_each(&keys).iter().filter(|v| v.is_none()).count();
    assert!(misses > 400, "a third of the keys moved to the new server: {misses} misses");
    assert_eq!(counter(&proxy, "warmup_hits"), 0);
}

/// `DELETE ...?drain=SECS`: the server owns no key at once, its keys stay
/// readable through the window (copied to their new servers as they are
/// read), and then the proxy's connections to it close. Nothing errors.
#[test]
fn a_drained_server_serves_its_keys_then_is_let_go() {
    let mc = memcacheds(4);
    let yml = ring_config("  preconnect: true\n", &[&mc[0], &mc[1], &mc[2], &mc[3]]);
    let proxy = Proxy::start(&yml);
    let mut c = proxy.client();
    preload(&mut c, 0..3000);
    let keys: Vec<String> = (0..3000).map(key).collect();
    let on_drained: Vec<String> =
        keys.iter().zip(mc[1].holds_each(&keys)).filter(|(_, h)| *h).map(|(k, _)| k.clone()).collect();
    assert!(on_drained.len() > 400, "{}", on_drained.len());
    let connections = |m: &Memcached| {
        let mut s = Client::connect(std::net::SocketAddr::from(([127, 0, 0, 1], m.port)));
        s.send(b"stats\r\n");
        let mut n = 0;
        loop {
            let l = s.line();
            if l == "END\r\n" {
                return n;
            }
            if let Some(v) = l.strip_prefix("STAT curr_connections ") {
                n = v.trim().parse::<u64>().unwrap();
            }
        }
    };
    // A long window: every key of the drained server is read from it.
    let (status, reply) = proxy.admin("DELETE", &format!("/pools/alpha/servers/{}?drain=600", mc[1].id()), "");
    assert_eq!(status, 200, "{reply}");
    assert!(reply.contains("\"warmup_seconds\": 600"), "{reply}");
    let got = c.get_each(&on_drained);
    let misses = got.iter().filter(|v| v.is_none()).count();
    assert_eq!(misses, 0, "the drained server's keys are read from it during the window");
    for (k, v) in on_drained.iter().zip(&got) {
        let i: usize = k[2..].parse().unwrap();
        assert_eq!(v.as_deref(), Some(value(i, 0).as_bytes()));
    }
    // A short one: when it ends, the proxy's connections to the server close.
    let before = connections(&mc[2]);
    assert!(before >= 2, "the proxy is connected: {before}");
    let (status, reply) = proxy.admin("DELETE", &format!("/pools/alpha/servers/{}?drain=1", mc[2].id()), "");
    assert_eq!(status, 200, "{reply}");
    let started = Instant::now();
    while connections(&mc[2]) >= before {
        assert!(started.elapsed() < Duration::from_secs(20), "the drained server's connections stay open");
        thread::sleep(Duration::from_millis(50));
    }
    assert!(started.elapsed() >= Duration::from_millis(900), "closed before the window ended");
    // The first server's longer window goes on: a key it held before the
    // changes is still found there.
    let first = chash::config::Config::from_yaml(&yml).unwrap().pool(None).unwrap().snapshot().unwrap();
    let k = (0..).map(|i| format!("late:{i}")).find(|k| first.route(k.as_bytes()) == Some(&*mc[1].id())).unwrap();
    let mut direct = Client::connect(std::net::SocketAddr::from(([127, 0, 0, 1], mc[1].port)));
    assert_eq!(direct.set(&k, b"still here"), "STORED\r\n");
    assert_eq!(c.get(&k).as_deref(), Some(&b"still here"[..]), "a shorter drain ended a longer one");
    assert_eq!(counter(&proxy, "errors"), 0);
    let (status, reply) = proxy.admin("DELETE", &format!("/pools/alpha/servers/{}?drain=x", mc[0].id()), "");
    assert_eq!(status, 400, "{reply}");
}
