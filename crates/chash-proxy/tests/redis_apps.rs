//! Redis applications through the proxy unchanged (issue 27): logins per
//! side (ACL users), commands over the whole keyspace (SCAN, KEYS, DBSIZE,
//! FLUSHDB, INFO, ...), against real redis-servers, redis-py and
//! redis-cli.

mod support;

use std::net::SocketAddr;
use std::process::Command;

use support::{require, run_script, Proxy, Redis};

/// Servers with the `default` user off and an ACL user of the proxy's
/// own; clients logging in as a read-write and a read-only user of the
/// pool's (one password inline, one from a file, the proxy's too).
#[test]
fn logins_on_both_sides() {
    let acl = ["--user", "default", "off", "--user", "proxy", "on", ">proxy-pw", "~*", "&*", "+@all"];
    let servers = [Redis::start_with(&acl), Redis::start_with(&acl)];
    let dir = std::env::temp_dir().join(format!("chash-acl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (proxy_pw, reader_pw) = (dir.join("proxy-pw"), dir.join("reader-pw"));
    std::fs::write(&proxy_pw, "proxy-pw\n").unwrap();
    std::fs::write(&reader_pw, "reader-pw\n").unwrap();
    let yml = format!(
        "alpha:\n  listen: 127.0.0.1:0\n  redis: true\n  hash: md5\n  timeout: 2000\n  server_user: proxy\n  \
         server_password_file: {}\n  users:\n   - {{name: app, password: app-pw}}\n   - {{name: reader, \
         password_file: {}, readonly: true}}\n  servers:\n   - {}:1 s1\n   - {}:1 s2\n",
        proxy_pw.display(),
        reader_pw.display(),
        servers[0].id(),
        servers[1].id()
    );
    let proxy = Proxy::start(&yml);
    run_script("redis_acl.py", &[&proxy.addr.to_string()]);
    let stats = &proxy.handle.stats()[0];
    assert!(stats.get("noperm") >= 10, "refused writes are counted: {}", stats.get("noperm"));
    assert!(stats.get("auth_failures") >= 2, "the wrong passwords are counted");
    // Both servers took keys: the proxy logged in to each as its user.
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let mut session: Vec<Vec<&str>> = vec![vec!["AUTH", "app", "app-pw"]];
    session.extend(keys.iter().map(|k| vec!["SET", k.as_str(), "v"]));
    let commands: Vec<&[&str]> = session.iter().map(Vec::as_slice).collect();
    let replies = support::redis_session(proxy.addr, &commands);
    assert!(replies.iter().all(|r| r == "+OK"), "{replies:?}");
    for s in &servers {
        let direct = SocketAddr::from(([127, 0, 0, 1], s.port));
        let replies = support::redis_session(direct, &[&["AUTH", "proxy", "proxy-pw"], &["DBSIZE"]]);
        let keys: u32 = replies[1].trim_start_matches(':').parse().unwrap();
        assert!(keys >= 2, "{} holds {keys} keys", s.id());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// SCAN and the other keyspace commands over 3 servers (redis-py, the
/// script's assertions), `redis-cli --scan --pattern` listing every match
/// once, and a membership change mid-scan refused with the restart error.
#[test]
fn the_keyspace_over_every_server() {
    let servers = [Redis::start(None), Redis::start(None), Redis::start(None)];
    let added = Redis::start(None);
    let refs: Vec<&Redis> = servers.iter().collect();
    let yml = redis_pool(&refs, "  timeout: 5000\n");
    let proxy = Proxy::start(&yml);
    // redis-cli's own scan loop, before the script flushes: 100,000 keys.
    let keys: Vec<String> = (0..100_000).map(|i| format!("cli:{i}")).collect();
    let mut c = Resp::connect(proxy.addr);
    for chunk in keys.chunks(1000) {
        for k in chunk {
            c.send(&["SET", k, "v"]);
        }
        for _ in chunk {
            assert_eq!(c.read(), Value::Ok("OK".into()));
        }
    }
    let scan = |pattern: &str| {
        let out = Command::new(require("redis-cli", "redis-tools"))
            .args(["-h", "127.0.0.1", "-p", &proxy.addr.port().to_string(), "--scan", "--pattern", pattern])
            .output()
            .unwrap();
        let mut listed: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
        listed.sort();
        listed
    };
    let mut all = keys.clone();
    all.sort();
    assert_eq!(scan("cli:*"), all, "redis-cli --scan: every key once");
    let expected: Vec<String> = all.iter().filter(|k| k.starts_with("cli:42")).cloned().collect();
    assert_eq!(scan("cli:42*"), expected, "redis-cli --scan --pattern: every match once");

    let line = format!("{}:1 s4", added.id());
    run_script("redis_keyspace.py", &[&proxy.addr.to_string(), &proxy.admin.to_string(), &line]);
}

/// A small RESP2 client of the test's own: a command, its whole reply.
struct Resp {
    w: std::net::TcpStream,
    r: std::io::BufReader<std::net::TcpStream>,
}

#[derive(Debug, PartialEq, Eq)]
enum Value {
    Ok(String),
    Err(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Option<Vec<Value>>),
}

impl Resp {
    fn connect(addr: SocketAddr) -> Resp {
        let w = std::net::TcpStream::connect(addr).unwrap();
        w.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
        let r = std::io::BufReader::new(w.try_clone().unwrap());
        Resp { w, r }
    }

    fn send(&mut self, args: &[&str]) {
        use std::io::Write as _;
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.w.write_all(out.as_bytes()).unwrap();
    }

    fn read(&mut self) -> Value {
        use std::io::{BufRead as _, Read as _};
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        let (kind, rest) = line.trim_end().split_at(1);
        match kind {
            "+" => Value::Ok(rest.to_owned()),
            "-" => Value::Err(rest.to_owned()),
            ":" => Value::Int(rest.parse().unwrap()),
            "$" if rest == "-1" => Value::Bulk(None),
            "$" => {
                let mut data = vec![0u8; rest.parse::<usize>().unwrap() + 2];
                self.r.read_exact(&mut data).unwrap();
                Value::Bulk(Some(String::from_utf8_lossy(&data[..data.len() - 2]).into_owned()))
            }
            "*" if rest == "-1" => Value::Array(None),
            "*" => Value::Array(Some((0..rest.parse::<usize>().unwrap()).map(|_| self.read()).collect())),
            _ => panic!("unexpected reply {line:?}"),
        }
    }

    fn cmd(&mut self, args: &[&str]) -> Value {
        self.send(args);
        self.read()
    }
}

/// The number in field `field` of a server's `INFO clients`.
fn server_info(port: u16, field: &str) -> i64 {
    let mut c = Resp::connect(SocketAddr::from(([127, 0, 0, 1], port)));
    let Value::Bulk(Some(text)) = c.cmd(&["INFO", "clients"]) else { panic!("INFO") };
    let line = text.lines().find(|l| l.starts_with(&format!("{field}:"))).unwrap();
    line.split(':').nth(1).unwrap().trim().parse().unwrap()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "not within 10 s: {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn blocking_pool(servers: &[&Redis], extra: &str) -> String {
    redis_pool(servers, &format!("  hash_tag: \"{{}}\"\n  timeout: 500\n{extra}"))
}

/// A Redis pool (md5, ketama by name: s1, s2, ...) of `servers`, with
/// `keys` (pool key lines).
fn redis_pool(servers: &[&Redis], keys: &str) -> String {
    let mut yml = format!("alpha:\n  listen: 127.0.0.1:0\n  redis: true\n  hash: md5\n{keys}  servers:\n");
    for (i, s) in servers.iter().enumerate() {
        yml.push_str(&format!("   - {}:1 s{}\n", s.id(), i + 1));
    }
    yml
}

/// A client that goes while blocked has its server connection closed at
/// once (100 times): the server counts no blocked client, and the element
/// pushed next is in the list, not handed to the gone client. A BRPOP's
/// own timeout governs (2 s, over the pool's 500 ms). Keys on two servers
/// get the hash-tag error.
#[test]
fn blocked_clients_that_go_lose_nothing() {
    let servers = [Redis::start(None), Redis::start(None)];
    let proxy = Proxy::start(&blocking_pool(&[&servers[0], &servers[1]], ""));
    let mut c = Resp::connect(proxy.addr);
    // Where {q} lives.
    let owner = servers.iter().find(|s| {
        c.cmd(&["SET", "{q}:probe", "x"]);
        let mut d = Resp::connect(SocketAddr::from(([127, 0, 0, 1], s.port)));
        d.cmd(&["EXISTS", "{q}:probe"]) == Value::Int(1)
    });
    let owner = owner.unwrap().port;
    for round in 0..100 {
        let mut blocked = Resp::connect(proxy.addr);
        blocked.send(&["BRPOP", "{q}:jobs", "0"]);
        wait_until(&format!("round {round}: the client is blocked on its server"), || {
            server_info(owner, "blocked_clients") == 1
        });
        drop(blocked);
        wait_until("the server drops the gone client", || server_info(owner, "blocked_clients") == 0);
        let job = format!("job{round}");
        assert_eq!(c.cmd(&["LPUSH", "{q}:jobs", &job]), Value::Int(1), "round {round}: nobody took it");
        assert_eq!(c.cmd(&["RPOP", "{q}:jobs"]), Value::Bulk(Some(job)));
    }
    assert_eq!(proxy.handle.stats()[0].get("blocked_clients"), 0);

    let started = std::time::Instant::now();
    assert_eq!(c.cmd(&["BRPOP", "{q}:empty", "2"]), Value::Array(None), "nil after its own timeout");
    let took = started.elapsed();
    assert!(took >= std::time::Duration::from_millis(1900), "not before its 2 s: {took:?}");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    // Served on a connection that was blocked before: kept, clean.
    c.cmd(&["LPUSH", "{q}:jobs", "j"]);
    assert_eq!(c.cmd(&["BLMOVE", "{q}:jobs", "{q}:processing", "RIGHT", "LEFT", "1"]), Value::Bulk(Some("j".into())));
    assert_eq!(c.cmd(&["LLEN", "{q}:processing"]), Value::Int(1));

    let apart = (0..100).map(|i| format!("k{i}")).find(|k| {
        c.cmd(&["SET", k, "x"]);
        let mut d = Resp::connect(SocketAddr::from(([127, 0, 0, 1], owner)));
        d.cmd(&["EXISTS", k]) == Value::Int(0)
    });
    let apart = apart.unwrap();
    let Value::Err(e) = c.cmd(&["BLPOP", "{q}:jobs", &apart, "1"]) else { panic!("keys on two servers") };
    assert!(e.contains("different servers") && e.contains("hash tag"), "{e}");
}

/// At `blocking_connections`, one more blocked client gets the error at
/// once, naming the key; other clients' requests are served meanwhile
/// (500 clients blocked on one server under a larger cap).
#[test]
fn the_blocking_cap_and_other_clients() {
    let server = Redis::start(None);
    let proxy = Proxy::start(&blocking_pool(&[&server], "  blocking_connections: 3\n"));
    let mut held: Vec<Resp> = (0..3)
        .map(|i| {
            let mut b = Resp::connect(proxy.addr);
            b.send(&["BLPOP", &format!("wait{i}"), "0"]);
            b
        })
        .collect();
    wait_until("3 blocked", || server_info(server.port, "blocked_clients") == 3);
    let mut c = Resp::connect(proxy.addr);
    let Value::Err(e) = c.cmd(&["BLPOP", "wait9", "0"]) else { panic!("over the cap") };
    assert!(e.contains("blocking_connections") && e.contains("3 clients are blocked"), "{e}");
    assert_eq!(c.cmd(&["SET", "k", "v"]), Value::Ok("OK".into()));
    // One unblocks: its place is free again.
    assert_eq!(c.cmd(&["LPUSH", "wait0", "x"]), Value::Int(1));
    assert_eq!(
        held[0].read(),
        Value::Array(Some(vec![Value::Bulk(Some("wait0".into())), Value::Bulk(Some("x".into()))]))
    );
    held[0].send(&["BLPOP", "wait0", "0"]);
    wait_until("blocked again", || server_info(server.port, "blocked_clients") == 3);
    assert_eq!(proxy.handle.stats()[0].get("blocking_refused"), 1);
    drop(held);
    drop(proxy);

    let proxy = Proxy::start(&blocking_pool(&[&server], "  blocking_connections: 600\n"));
    let held: Vec<Resp> = (0..500)
        .map(|i| {
            let mut b = Resp::connect(proxy.addr);
            b.send(&["BLPOP", &format!("many{i}"), "0"]);
            b
        })
        .collect();
    wait_until("500 blocked", || server_info(server.port, "blocked_clients") == 500);
    let mut c = Resp::connect(proxy.addr);
    for i in 0..1000 {
        assert_eq!(c.cmd(&["GET", "k"]), Value::Bulk(Some("v".into())), "GET {i} with 500 clients blocked");
    }
    drop(held);
    wait_until("all 500 let go", || server_info(server.port, "blocked_clients") == 0);
}

/// The reliable-queue pattern: 10 producers LPUSH 50,000 jobs, 10
/// consumers BLMOVE each into a processing list of their own and, in one
/// transaction, take it off and count it done. Consumers drop their
/// connection (as if killed) right after asking, 100 times: a job moved
/// meanwhile stays in that processing list, from which it is put back.
/// Every job is done exactly once.
#[test]
fn a_reliable_queue_processes_every_job_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const JOBS: usize = 50_000;
    let servers = [Redis::start(None), Redis::start(None)];
    let proxy = Proxy::start(&blocking_pool(&[&servers[0], &servers[1]], ""));
    let addr = proxy.addr;
    let kills = std::sync::Arc::new(AtomicUsize::new(0));
    let producers: Vec<_> = (0..10)
        .map(|p| {
            std::thread::spawn(move || {
                let mut c = Resp::connect(addr);
                for chunk in (0..JOBS / 10).collect::<Vec<_>>().chunks(500) {
                    for j in chunk {
                        c.send(&["LPUSH", "{jobs}:queue", &format!("job:{p}:{j}")]);
                    }
                    for _ in chunk {
                        assert!(matches!(c.read(), Value::Int(_)));
                    }
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..10)
        .map(|n| {
            let kills = kills.clone();
            std::thread::spawn(move || {
                let processing = format!("{{jobs}}:processing:{n}");
                let mut c = Resp::connect(addr);
                let mut idle = 0;
                let mut asked = 0u64;
                while idle < 3 {
                    asked += 1;
                    c.send(&["BLMOVE", "{jobs}:queue", &processing, "RIGHT", "LEFT", "1"]);
                    if asked % 97 == (n as u64) && kills.fetch_add(1, Ordering::SeqCst) < 100 {
                        // Killed while blocked (or with a job on its way).
                        c = Resp::connect(addr);
                        continue;
                    }
                    let job = match c.read() {
                        Value::Bulk(job) => job,
                        Value::Array(None) => None,
                        other => panic!("BLMOVE: {other:?}"),
                    };
                    let Some(job) = job else {
                        idle += 1;
                        continue;
                    };
                    idle = 0;
                    c.send(&["MULTI"]);
                    c.send(&["LREM", &processing, "1", &job]);
                    c.send(&["HINCRBY", "{jobs}:done", &job, "1"]);
                    c.send(&["EXEC"]);
                    for _ in 0..3 {
                        c.read();
                    }
                    assert!(matches!(c.read(), Value::Array(Some(_))), "EXEC");
                }
            })
        })
        .collect();
    for t in producers.into_iter().chain(consumers) {
        t.join().unwrap();
    }
    let mut c = Resp::connect(addr);
    // Jobs left in processing lists (their consumer went): back to work.
    for n in 0..10 {
        let processing = format!("{{jobs}}:processing:{n}");
        while let Value::Bulk(Some(job)) = c.cmd(&["RPOP", &processing]) {
            c.cmd(&["HINCRBY", "{jobs}:done", &job, "1"]);
        }
    }
    assert_eq!(c.cmd(&["LLEN", "{jobs}:queue"]), Value::Int(0));
    assert_eq!(c.cmd(&["HLEN", "{jobs}:done"]), Value::Int(JOBS as i64), "every job done");
    let Value::Array(Some(counts)) = c.cmd(&["HVALS", "{jobs}:done"]) else { panic!("HVALS") };
    assert!(counts.iter().all(|v| *v == Value::Bulk(Some("1".into()))), "each once");
    assert!(kills.load(Ordering::SeqCst) >= 100, "100 consumers killed");
}

/// Pub/sub through two proxies of the same servers (redis-py, RESP2 and
/// RESP3; the script's assertions): 10,000 messages over 50 channels and
/// 2 patterns, each delivered once and in order, also while a server is
/// added.
#[test]
fn pubsub_across_proxies() {
    let servers = [Redis::start(None), Redis::start(None), Redis::start(None)];
    let added = Redis::start(None);
    let refs: Vec<&Redis> = servers.iter().collect();
    let yml = redis_pool(&refs, "  timeout: 5000\n");
    let (subs, publisher) = (Proxy::start(&yml), Proxy::start(&yml));
    let line = format!("{}:1 s4", added.id());
    run_script(
        "redis_pubsub.py",
        &[
            &subs.addr.to_string(),
            &publisher.addr.to_string(),
            &subs.admin.to_string(),
            &publisher.admin.to_string(),
            &line,
            &added.port.to_string(),
        ],
    );
    assert!(subs.handle.stats()[0].get("pubsub_moves") > 0, "subscriptions followed their channels");
}

/// 1,000 subscribers of one channel through one proxy: each gets every
/// message, and the server counts one subscriber (the proxy's). RESP2
/// subscribed-state rules: only (un)subscribing, PING, QUIT and RESET.
#[test]
fn a_thousand_subscribers_cost_the_server_one() {
    let server = Redis::start(None);
    let proxy = Proxy::start(&blocking_pool(&[&server], ""));
    let mut clients: Vec<Resp> = (0..1000)
        .map(|_| {
            let mut c = Resp::connect(proxy.addr);
            let confirm = c.cmd(&["SUBSCRIBE", "news"]);
            assert_eq!(
                confirm,
                Value::Array(Some(vec![
                    Value::Bulk(Some("subscribe".into())),
                    Value::Bulk(Some("news".into())),
                    Value::Int(1)
                ]))
            );
            c
        })
        .collect();
    let mut direct = Resp::connect(SocketAddr::from(([127, 0, 0, 1], server.port)));
    assert_eq!(
        direct.cmd(&["PUBSUB", "NUMSUB", "news"]),
        Value::Array(Some(vec![Value::Bulk(Some("news".into())), Value::Int(1)])),
        "one subscriber on the server"
    );
    let mut publisher = Resp::connect(proxy.addr);
    for i in 0..100 {
        assert_eq!(publisher.cmd(&["PUBLISH", "news", &format!("m{i}")]), Value::Int(1));
    }
    for (n, c) in clients.iter_mut().enumerate() {
        for i in 0..100 {
            let m = c.read();
            let want = Value::Array(Some(vec![
                Value::Bulk(Some("message".into())),
                Value::Bulk(Some("news".into())),
                Value::Bulk(Some(format!("m{i}"))),
            ]));
            assert_eq!(m, want, "subscriber {n}, message {i}");
        }
    }
    let c = &mut clients[0];
    let Value::Err(e) = c.cmd(&["GET", "k"]) else { panic!("GET while subscribed") };
    assert!(e.contains("only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET"), "{e}");
    assert_eq!(
        c.cmd(&["PING"]),
        Value::Array(Some(vec![Value::Bulk(Some("pong".into())), Value::Bulk(Some(String::new()))]))
    );
    assert_eq!(
        c.cmd(&["UNSUBSCRIBE"]),
        Value::Array(Some(vec![
            Value::Bulk(Some("unsubscribe".into())),
            Value::Bulk(Some("news".into())),
            Value::Int(0)
        ]))
    );
    assert_eq!(c.cmd(&["GET", "k"]), Value::Bulk(None), "out of the subscribed state");
    drop(clients);
    wait_until("the proxy leaves the channel when its last client goes", || {
        direct.cmd(&["PUBSUB", "NUMSUB", "news"])
            == Value::Array(Some(vec![Value::Bulk(Some("news".into())), Value::Int(0)]))
    });
}

/// A subscriber that does not read is disconnected once 32 MiB of
/// messages wait for it; one that reads gets them all.
#[test]
fn a_subscriber_that_does_not_read_is_disconnected() {
    let server = Redis::start(None);
    let proxy = Proxy::start(&blocking_pool(&[&server], ""));
    let mut stuck = Resp::connect(proxy.addr);
    stuck.cmd(&["SUBSCRIBE", "big"]);
    let mut reader = Resp::connect(proxy.addr);
    reader.cmd(&["SUBSCRIBE", "big"]);
    let payload = "x".repeat(100_000);
    let mut publisher = Resp::connect(proxy.addr);
    let reading = std::thread::spawn(move || {
        for i in 0..600 {
            let Value::Array(Some(m)) = reader.read() else { panic!("message {i}") };
            assert_eq!(m.len(), 3);
        }
    });
    for _ in 0..600 {
        publisher.cmd(&["PUBLISH", "big", &payload]);
    }
    reading.join().unwrap();
    wait_until("the stuck subscriber is disconnected", || proxy.handle.stats()[0].get("pubsub_slow_clients") == 1);
    // Its connection is closed: reading ends (after what the kernel held).
    use std::io::Read as _;
    let mut sink = Vec::new();
    let read = stuck.r.read_to_end(&mut sink);
    assert!(read.is_ok() && sink.len() < 60 * 100_000, "closed after {} bytes", sink.len());
}

/// A Node.js client script of `tests/clients/node` (its libraries
/// installed there by scripts/test), which prints `ok` or fails.
fn run_node(script: &str, args: &[&str]) {
    let dir = format!("{}/tests/clients/node", env!("CARGO_MANIFEST_DIR"));
    assert!(
        std::path::Path::new(&format!("{dir}/node_modules/bullmq")).exists(),
        "the Node.js client libraries are not installed: run scripts/test (it runs npm ci in {dir})"
    );
    let out = Command::new(require("node", "nodejs"))
        .arg(format!("{dir}/{script}"))
        .args(args)
        .env("NODE_PATH", format!("{dir}/node_modules"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("ok"), "{script} failed:\n{text}");
}

/// BullMQ (npm), unchanged but for a hash-tagged prefix: 5,000 jobs, 4
/// workers, every job completed once, through a pool of 3 servers; and
/// ioredis pub/sub across two proxies.
#[test]
fn bullmq_and_ioredis_through_the_proxy() {
    let servers = [Redis::start(None), Redis::start(None), Redis::start(None)];
    let refs: Vec<&Redis> = servers.iter().collect();
    let yml = redis_pool(&refs, "  hash_tag: \"{}\"\n  timeout: 5000\n");
    let (a, b) = (Proxy::start(&yml), Proxy::start(&yml));
    run_node("bullmq_jobs.js", &["127.0.0.1", &a.addr.port().to_string()]);
    assert!(a.handle.stats()[0].get("blocking_commands") > 0, "BullMQ's workers blocked through the proxy");
    run_node("ioredis_pubsub.js", &[&a.addr.to_string(), &b.addr.to_string()]);
}

/// What a review found against redis-server, fixed: a wrong HELLO AUTH on
/// a logged-in connection is refused; RESET logs out; SUBSCRIBE inside
/// MULTI makes EXEC abort; a subscribed RESP3 client's blocking command
/// is refused (awaited, it would keep the proxy from seeing the client go
/// and strand the next element on the server).
#[test]
fn review_findings_stay_fixed() {
    use std::io::{Read as _, Write as _};
    let server = Redis::start(None);
    let yml = blocking_pool(&[&server], "  users:\n   - {name: app, password: app-pw}\n");
    let proxy = Proxy::start(&yml);
    let mut c = Resp::connect(proxy.addr);
    assert_eq!(c.cmd(&["AUTH", "app", "app-pw"]), Value::Ok("OK".into()));
    let Value::Err(e) = c.cmd(&["HELLO", "2", "AUTH", "app", "wrong"]) else { panic!("HELLO with a wrong pair") };
    assert!(e.starts_with("WRONGPASS"), "{e}");
    assert_eq!(c.cmd(&["MULTI"]), Value::Ok("OK".into()));
    assert_eq!(c.cmd(&["SET", "k", "1"]), Value::Ok("QUEUED".into()));
    assert!(matches!(c.cmd(&["SUBSCRIBE", "ch"]), Value::Err(_)));
    let Value::Err(e) = c.cmd(&["EXEC"]) else { panic!("EXEC") };
    assert!(e.starts_with("EXECABORT"), "{e}");
    assert_eq!(c.cmd(&["GET", "k"]), Value::Bulk(None), "nothing of the transaction ran");
    assert_eq!(c.cmd(&["RESET"]), Value::Ok("RESET".into()));
    let Value::Err(e) = c.cmd(&["GET", "k"]) else { panic!("GET after RESET") };
    assert!(e.starts_with("NOAUTH"), "{e}");

    let mut raw = std::net::TcpStream::connect(proxy.addr).unwrap();
    raw.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    raw.write_all(b"*3\r\n$4\r\nAUTH\r\n$3\r\napp\r\n$6\r\napp-pw\r\n*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n").unwrap();
    raw.write_all(b"*2\r\n$9\r\nSUBSCRIBE\r\n$2\r\nch\r\n*3\r\n$5\r\nBLPOP\r\n$1\r\nl\r\n$1\r\n0\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("while subscribed") {
        let n = raw.read(&mut buf).expect("the refusal within 10 s");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(server_info(server.port, "blocked_clients"), 0);
}
