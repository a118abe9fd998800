//! The proxy in one runtime with the clock paused: servers on the tests'
//! memory network (embedded shards, or servers that misbehave on purpose),
//! pools built from configs with fixed server ids, and clients on
//! in-memory streams. Timeouts, ejection and retry run in no real time and
//! the same way every run; where keys go is the library's placement of the
//! fixed ids, whatever ports exist.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chash::PoolConfig;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{memory, Address, Setup, Speech};
use crate::conn::{ConnGuard, ConnSettings};
use crate::memcache::session::MemcacheSession;
use crate::memcache::shard::{serve_shard_client, Store};
use crate::options::{ProxyOptions, Shared};
use crate::pool::Pool;
use crate::workers::Workers;

/// A name on the memory network no other test uses.
fn unique(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}-{}", NEXT.fetch_add(1, Relaxed))
}

/// An embedded shard on the memory network; it stops listening when
/// dropped (connections made stay).
struct Shard {
    name: String,
    store: Arc<Store>,
    stop: watch::Sender<bool>,
}

impl Shard {
    fn start() -> Shard {
        let name = unique("shard");
        let store = Arc::new(Store::new(8 << 20));
        let (stop, _) = watch::channel(false);
        Shard::listen(&name, store.clone(), stop.subscribe());
        Shard { name, store, stop }
    }

    fn listen(name: &str, store: Arc<Store>, stop: watch::Receiver<bool>) {
        let mut incoming = memory::listen(name);
        tokio::spawn(async move {
            while let Some(stream) = incoming.recv().await {
                tokio::spawn(serve_shard_client(stream, store.clone(), stop.clone()));
            }
        });
    }

    /// Stops listening and closes its connections (a crash).
    fn kill(&self) {
        drop(memory::listen(&self.name));
        let _ = self.stop.send(true);
    }

    /// Listens again, with what it stored.
    fn restart(&mut self) {
        let (stop, _) = watch::channel(false);
        Shard::listen(&self.name, self.store.clone(), stop.subscribe());
        self.stop = stop;
    }
}

/// A server that accepts connections and never answers.
fn silent_server() -> String {
    let name = unique("silent");
    let mut incoming = memory::listen(&name);
    tokio::spawn(async move {
        while let Some(mut stream) = incoming.recv().await {
            tokio::spawn(async move {
                let mut sink = vec![0u8; 4096];
                while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
    });
    name
}

/// A pool `alpha` of servers `s1`, `s2`, ... (weight 1) at `names` on the
/// memory network, with `extra` config lines.
fn pool(extra: &str, names: &[String], setup: Option<Setup>) -> Arc<Pool> {
    let mut yml = format!("alpha:\n  distribution: ring\n  hash: xxh3\n{extra}  servers:\n");
    let mut addresses = HashMap::new();
    for (i, name) in names.iter().enumerate() {
        yml.push_str(&format!("   - s{}:1\n", i + 1));
        addresses.insert(format!("s{}", i + 1), Address::Memory(name.clone()));
    }
    let config = chash::config::Config::from_yaml(&yml).unwrap().pool(None).unwrap();
    let speech =
        Speech { protocol: "memcached", dialects: vec![setup], probe: None, before_return: None, locator: None };
    Pool::start(config, addresses, Workers::current(), speech).unwrap()
}

/// Where the library places `key` in `pool`'s config: `s1`, `s2`, ...
fn owner(config: &PoolConfig, key: &str) -> String {
    config.snapshot().unwrap().route(key.as_bytes()).unwrap().to_owned()
}

/// A client connection to `pool`, served by the memcached session.
struct Client {
    r: BufReader<tokio::io::ReadHalf<DuplexStream>>,
    w: tokio::io::WriteHalf<DuplexStream>,
}

impl Client {
    fn connect(pool: &Arc<Pool>) -> Client {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let shared = Arc::new(Shared { options: ProxyOptions::default(), started: std::time::Instant::now() });
        let requester = crate::conn::requester(shared.options.client_buffer);
        let session = MemcacheSession::new(pool.clone(), shared, requester.clone());
        let settings = ConnSettings { idle: None, budget: 4 << 20 };
        let guard = ConnGuard::open(pool.all_counters().clone());
        let (_stop, shutdown) = watch::channel(false);
        tokio::spawn(async move {
            let _keep = _stop;
            crate::conn::serve(theirs, session, requester, settings, shutdown, guard).await;
        });
        let (r, w) = tokio::io::split(ours);
        Client { r: BufReader::new(r), w }
    }

    async fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).await.unwrap();
        l
    }

    /// Sends a command and returns its first reply line.
    async fn cmd(&mut self, command: &str) -> String {
        self.w.write_all(command.as_bytes()).await.unwrap();
        self.line().await
    }

    async fn set(&mut self, key: &str, value: &str) -> String {
        self.cmd(&format!("set {key} 0 0 {}\r\n{value}\r\n", value.len())).await
    }

    /// A get's value, or its error line.
    async fn get(&mut self, key: &str) -> Result<Option<String>, String> {
        let first = self.cmd(&format!("get {key}\r\n")).await;
        if first == "END\r\n" {
            return Ok(None);
        }
        if !first.starts_with("VALUE ") {
            return Err(first);
        }
        let value = self.line().await;
        assert_eq!(self.line().await, "END\r\n");
        Ok(Some(value.trim_end().to_owned()))
    }
}

/// A key the library places on `server`.
fn key_on(config: &PoolConfig, server: &str) -> String {
    (0..).map(|i| format!("key:{i}")).find(|k| owner(config, k) == server).unwrap()
}

fn config_of(pool: &Pool) -> PoolConfig {
    pool.config()
}

#[tokio::test(start_paused = true)]
async fn keys_go_where_the_library_places_them() {
    let shards: Vec<Shard> = (0..3).map(|_| Shard::start()).collect();
    let names: Vec<String> = shards.iter().map(|s| s.name.clone()).collect();
    let pool = pool("", &names, None);
    let config = config_of(&pool);
    let mut c = Client::connect(&pool);
    for i in 0..300 {
        let key = format!("k{i}");
        assert_eq!(c.set(&key, "v").await, "STORED\r\n");
        let at: usize = owner(&config, &key)[1..].parse().unwrap();
        for (j, shard) in shards.iter().enumerate() {
            assert_eq!(shard.store.contains(key.as_bytes()), j + 1 == at, "{key} belongs on s{at}");
        }
    }
    // A multi-key get spans all three and comes back in the client's order.
    c.w.write_all(b"get k3 k1 k2 nope k0\r\n").await.unwrap();
    let mut keys = Vec::new();
    loop {
        let line = c.line().await;
        if line == "END\r\n" {
            break;
        }
        keys.push(line.split_whitespace().nth(1).unwrap().to_owned());
        c.line().await;
    }
    assert_eq!(keys, ["k3", "k1", "k2", "k0"]);
}

/// A server that never answers: the request gets its error when the pool's
/// timeout is up, to the millisecond, in no real time.
#[tokio::test(start_paused = true)]
async fn a_silent_server_times_out_on_time() {
    let pool = pool("  timeout: 400\n", &[silent_server()], None);
    let mut c = Client::connect(&pool);
    let started = Instant::now();
    let reply = c.set("k", "v").await;
    assert_eq!(reply, "SERVER_ERROR backend s1 timed out\r\n");
    assert_eq!(started.elapsed(), Duration::from_millis(400));
    // Pipelined behind it: each answered by its own deadline.
    c.w.write_all(b"get a\r\nget b\r\n").await.unwrap();
    assert!(c.line().await.contains("timed out"));
    assert!(c.line().await.contains("timed out"));
    assert_eq!(started.elapsed(), Duration::from_millis(800));
    let snap = pool.stats();
    assert_eq!(snap.servers[0].get("timeouts"), 3);
    assert!(snap.servers[0].get("server_timedout") >= 1);
}

/// A blocking request has a deadline of its own (its wait plus a grace)
/// even in a pool without a timeout: to a server that never answers, it
/// is answered then. Its connection's reader, which without a timeout is
/// not woken for every request written, is woken for it.
#[tokio::test(start_paused = true)]
async fn a_blocking_request_to_a_silent_server_is_answered_by_its_own_deadline() {
    let pool = pool("", &[silent_server()], None);
    let requester = crate::conn::requester(1 << 20);
    let server = pool.state().server_for(b"k").unwrap().clone();
    let pinned = server.pin(&requester);
    let started = Instant::now();
    let framing = crate::memcache::LINE;
    let pending = server
        .submit_blocking(&pinned, Bytes::from_static(b"wait\r\n"), framing, &requester, Some(Duration::from_secs(1)))
        .await;
    // Paused time: a request never timed fails here, at 10 s.
    let reply = tokio::time::timeout(Duration::from_secs(10), server.finish(pending)).await;
    let reply = reply.expect("answered by its own deadline");
    assert!(matches!(reply, Err(crate::backend::BackendError::Timeout)), "{reply:?}");
    // Its wait (1 s) and the grace of a pool without a timeout (1 s).
    assert_eq!(started.elapsed(), Duration::from_secs(2));
}

/// A server whose connection set-up fails is down, and every request gets
/// the server's refusal by its deadline (before, requests queued behind a
/// failed set-up were never answered).
#[tokio::test(start_paused = true)]
async fn a_failed_setup_answers_every_request() {
    let name = unique("refuser");
    let mut incoming = memory::listen(&name);
    tokio::spawn(async move {
        while let Some(mut stream) = incoming.recv().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {
                    let _ = stream.write_all(b"NO\r\n").await;
                }
            });
        }
    });
    let setup = Setup {
        requests: vec![Bytes::from_static(b"hello\r\n")],
        framing: crate::memcache::LINE,
        check: |reply| Err(format!("refused: {}", String::from_utf8_lossy(reply).trim_end())),
    };
    let pool = pool("  timeout: 400\n  preconnect: true\n", &[name], Some(setup));
    let mut c = Client::connect(&pool);
    for _ in 0..5 {
        let started = Instant::now();
        c.w.write_all(b"get a\r\nget b\r\n").await.unwrap();
        for _ in 0..2 {
            assert_eq!(c.line().await, "SERVER_ERROR backend s1 cannot connect: refused: NO\r\n");
        }
        assert!(started.elapsed() <= Duration::from_millis(400));
    }
    assert_eq!(pool.stats().servers[0].state, "down");
}

/// A server that is back takes the very next request: no back-off to wait
/// out (requests for a down server make a connection attempt).
#[tokio::test(start_paused = true)]
async fn a_server_that_is_back_takes_the_next_request() {
    let mut shard = Shard::start();
    let pool = pool("  timeout: 1000\n", std::slice::from_ref(&shard.name), None);
    let mut c = Client::connect(&pool);
    assert_eq!(c.set("k", "1").await, "STORED\r\n");
    shard.kill();
    let reply = c.set("k", "2").await;
    assert!(reply.starts_with("SERVER_ERROR backend s1 "), "{reply}");
    let reply = c.set("k", "2").await;
    assert!(reply.contains("cannot connect") && reply.contains("refused"), "{reply}");
    let started = Instant::now();
    shard.restart();
    assert_eq!(c.set("k", "3").await, "STORED\r\n");
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(c.get("k").await, Ok(Some("3".into())));
}

/// auto_eject_hosts: a server failing `server_failure_limit` times is
/// ejected (its keys go to the others), retried after
/// `server_retry_timeout` on probation (its connections try at once, and
/// one failure ejects it again: a dead server's retry costs no client an
/// error), and back for good once it answers.
#[tokio::test(start_paused = true)]
async fn ejection_and_retry() {
    let mut shards: Vec<Shard> = (0..2).map(|_| Shard::start()).collect();
    let names: Vec<String> = shards.iter().map(|s| s.name.clone()).collect();
    let extra = "  auto_eject_hosts: true\n  server_failure_limit: 2\n  server_retry_timeout: 30000\n  timeout: 500\n";
    let pool = pool(extra, &names, None);
    let key = key_on(&config_of(&pool), "s1");
    let mut c = Client::connect(&pool);
    assert_eq!(c.set(&key, "home").await, "STORED\r\n");
    shards[0].kill();
    // The connection breaks (one failure), a connection attempt is refused
    // (two): ejected, and the key is served by s2.
    let mut errors = 0;
    while c.set(&key, "away").await != "STORED\r\n" {
        errors += 1;
        assert!(errors <= 2, "more errors than the failure limit");
    }
    assert!(shards[1].store.contains(key.as_bytes()));
    assert_eq!(pool.stats().servers[0].state, "auto-ejected");
    // Retried after 30 s, still dead: its connection tries at once, fails,
    // and it is ejected again before any request goes there.
    tokio::time::sleep(Duration::from_secs(30) + Duration::from_millis(200)).await;
    assert_eq!(pool.stats().servers[0].state, "auto-ejected");
    assert_eq!(pool.stats().servers[0].get("ejections"), 2);
    assert_eq!(c.set(&key, "away").await, "STORED\r\n");
    // Back: after the next retry the key is home again, and stays.
    shards[0].restart();
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(c.set(&key, "home again").await, "STORED\r\n");
    assert_eq!(c.get(&key).await, Ok(Some("home again".into())));
    assert!(shards[0].store.contains(key.as_bytes()));
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(pool.stats().servers[0].state, "up");
    assert_eq!(pool.stats().get("server_ejects"), 2);
    assert_eq!(pool.stats().get("membership_changes"), 4, "two ejections, two retries");
}

/// A server that dies costs only the requests for its keys (each answered
/// at once with an error naming it), and its keys work again when it is
/// back.
#[tokio::test(start_paused = true)]
async fn a_dead_server_costs_only_its_keys() {
    let mut shards: Vec<Shard> = (0..3).map(|_| Shard::start()).collect();
    let names: Vec<String> = shards.iter().map(|s| s.name.clone()).collect();
    let pool = pool("  timeout: 1000\n", &names, None);
    let config = config_of(&pool);
    let keys: Vec<String> = (0..300).map(|i| format!("dead:{i}")).collect();
    let mut c = Client::connect(&pool);
    for k in &keys {
        assert_eq!(c.set(k, "v").await, "STORED\r\n");
    }
    shards[1].kill();
    let started = Instant::now();
    let mut failed = 0;
    for k in &keys {
        let reply = c.get(k).await;
        if owner(&config, k) == "s2" {
            let err = reply.unwrap_err();
            assert!(err.starts_with("SERVER_ERROR backend s2 "), "{err}");
            failed += 1;
        } else {
            assert_eq!(reply, Ok(Some("v".into())), "{k}");
        }
    }
    assert!(failed > 50, "s2 held {failed} of 300 keys");
    assert_eq!(started.elapsed(), Duration::ZERO, "failures are immediate");
    shards[1].restart();
    for k in &keys {
        assert_eq!(c.get(k).await, Ok(Some("v".into())), "{k}");
    }
}

/// A client that pipelines more large multi-gets than its window holds
/// and goes away without reading is let go of: its connection is closed
/// and uncounted (before, its reader waited for room that the dead writer
/// would never make, holding the socket: the soak found 230 such fds in
/// four minutes). On the memory network, in no real time.
#[tokio::test(start_paused = true)]
async fn a_client_gone_with_a_full_window_is_let_go() {
    let shards = [Shard::start(), Shard::start()];
    let names: Vec<String> = shards.iter().map(|s| s.name.clone()).collect();
    let pool = pool("  timeout: 1000\n", &names, None);
    let mut c = Client::connect(&pool);
    let keys: Vec<String> = (0..8).map(|i| format!("large:{i}")).collect();
    let value = "v".repeat(200_000);
    for k in &keys {
        assert_eq!(c.set(k, &value).await, "STORED\r\n");
    }
    let line = format!("get {}\r\n", keys.join(" "));
    for _ in 0..5 {
        let mut gone = Client::connect(&pool);
        for _ in 0..50 {
            if gone.w.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(gone);
    }
    // The one connection left is `c`.
    for _ in 0..1000 {
        if pool.open_connections() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(pool.open_connections(), 1, "connections are still held");
    assert_eq!(c.get("large:0").await.map(|v| v.map(|v| v.len())), Ok(Some(200_000)));
}

/// A reply that nobody waits for any more (the other part of a
/// multi-server request failed first, and its client went on) leaves its
/// client's account of unread reply bytes: before, its bytes stayed
/// counted for ever, and a client that met enough such failures found its
/// window shut for good, its next request never read.
#[tokio::test(start_paused = true)]
async fn a_reply_nobody_waits_for_leaves_the_clients_account() {
    let shard = Shard::start();
    let pool = pool("  timeout: 1000\n", std::slice::from_ref(&shard.name), None);
    let mut c = Client::connect(&pool);
    let value = "v".repeat(100_000);
    assert_eq!(c.set("big", &value).await, "STORED\r\n");
    let requester = crate::conn::requester(1 << 20);
    let server = pool.state().server_for(b"big").unwrap().clone();
    let framing = crate::memcache::VALUES;
    // Dropped before its reply came, and after (the reply waiting in its
    // channel): neither keeps its bytes on the account.
    let early = server.submit(Bytes::from_static(b"get big\r\n"), framing, &requester).await;
    drop(early);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(requester.account.held(), 0, "a reply dropped before it came");
    let late = server.submit(Bytes::from_static(b"get big\r\n"), framing, &requester).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(requester.account.held() >= 100_000, "a reply that came is counted until taken");
    drop(late);
    assert_eq!(requester.account.held(), 0, "a reply dropped unread");
    // And one that is taken is counted off once.
    let taken = server.submit(Bytes::from_static(b"get big\r\n"), framing, &requester).await;
    assert!(server.finish(taken).await.is_ok());
    assert_eq!(requester.account.held(), 0);
}

/// For every distribution, 50 random membership changes through the admin
/// path with `--persist`: after each, the config file as written, read
/// fresh, places 100,000 keys where the live pool sends them.
async fn persisted_changes_rebuild(distribution: &str, n: u64) {
    use chash::Edit;
    let dir = std::env::temp_dir().join(format!("chash-persist-{}-{distribution}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys: Vec<String> = (0..100_000).map(|i| format!("key:{i}")).collect();
    {
        let weighted = !matches!(distribution, "anchor" | "jump" | "jumpback" | "multiprobe");
        let hash = match distribution {
            "ketama" | "modula" => "fnv1a_64",
            "nginx" => "crc32a",
            _ => "xxh3",
        };
        let path = dir.join(format!("{distribution}.yml"));
        let mut yml = format!("# {distribution}\nalpha:\n  distribution: {distribution}\n  hash: {hash}\n  servers:\n");
        for i in 0..6 {
            yml.push_str(&format!("   - 127.0.0.1:{}:1\n", 40000 + i));
        }
        std::fs::write(&path, &yml).unwrap();
        let config = chash::config::Config::from_yaml(&yml).unwrap().pool(None).unwrap();
        let speech =
            Speech { protocol: "memcached", dialects: vec![None], probe: None, before_return: None, locator: None };
        let pool = Pool::start(config, HashMap::new(), Workers::current(), speech).unwrap();
        let options = ProxyOptions { config_path: Some(path.clone()), persist: true, ..Default::default() };
        let shared = Arc::new(Shared { options, started: std::time::Instant::now() });
        let registry = crate::registry::Registry::new(shared, vec![pool.clone()]);
        let mut seed = 0x5eed_u64 + n;
        let mut rand = |below: usize| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((seed >> 33) as usize) % below.max(1)
        };
        let mut next_port = 40100;

        let mut applied = 0;
        for step in 0..50 {
            let config = pool.config();
            let active: Vec<String> = config.servers.iter().map(|l| l.id.clone()).collect();
            let members: Vec<chash::ServerLine> = config.members().cloned().collect();
            let ejected: Vec<String> =
                members.iter().filter(|l| l.state != chash::LineState::Active).map(|l| l.id.clone()).collect();
            let pick = |list: &[String], i: usize| list[i % list.len()].clone();
            let edit = match rand(5) {
                0 | 1 => {
                    next_port += 1;
                    let w = if weighted { 1 + rand(3) } else { 1 };
                    Edit::Add(format!("127.0.0.1:{next_port}:{w}").parse().unwrap())
                }
                2 if active.len() > 2 => Edit::Remove(pick(&active, rand(99))),
                3 if !ejected.is_empty() => Edit::Restore(pick(&ejected, rand(99))),
                3 if active.len() > 2 => Edit::Eject(pick(&active, rand(99))),
                4 if weighted => Edit::Weight(pick(&active, rand(99)), 1 + rand(4) as u32),
                _ => continue,
            };
            match registry.edit("alpha", &edit) {
                Ok(change) => assert!(change.persisted),
                Err(e) => {
                    assert!(matches!(distribution, "jump" | "jumpback"), "{distribution} step {step}: {edit}: {e}");
                    continue;
                }
            }
            applied += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(text.starts_with(&format!("# {distribution}\n")), "the rest of the file stays");
            let fresh = chash::config::Config::from_yaml(&text).unwrap().pool(None).unwrap().snapshot().unwrap();
            let state = pool.state();
            let Some(crate::pool::Routing::Placed { snapshot: live, .. }) = state.routing.as_deref() else { panic!() };
            let differ = live.moved_keys(&fresh, keys.iter().map(|k| k.as_bytes()));
            assert_eq!(differ, 0, "{distribution} step {step} after {edit}: {differ} keys differ");
            // And the live routing sends each node's keys to that server.
            for k in keys.iter().take(200) {
                assert_eq!(state.server_for(k.as_bytes()).map(|s| s.id()), fresh.route(k.as_bytes()));
            }
        }
        assert!(applied > 10, "{distribution}: {applied} changes applied");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

macro_rules! persisted_changes {
    ($($test:ident: $distribution:literal,)*) => {$(
        #[tokio::test]
        async fn $test() {
            persisted_changes_rebuild($distribution, line!() as u64).await;
        }
    )*};
}

persisted_changes! {
    persisted_ring_changes_rebuild_the_live_placement: "ring",
    persisted_ketama_changes_rebuild_the_live_placement: "ketama",
    persisted_modula_changes_rebuild_the_live_placement: "modula",
    persisted_nginx_changes_rebuild_the_live_placement: "nginx",
    persisted_jump_changes_rebuild_the_live_placement: "jump",
    persisted_jumpback_changes_rebuild_the_live_placement: "jumpback",
    persisted_rendezvous_changes_rebuild_the_live_placement: "rendezvous",
    persisted_maglev_changes_rebuild_the_live_placement: "maglev",
    persisted_anchor_changes_rebuild_the_live_placement: "anchor",
    persisted_multiprobe_changes_rebuild_the_live_placement: "multiprobe",
    persisted_bounded_changes_rebuild_the_live_placement: "bounded",
}

/// A stored config (etcd) that does not parse, names a server without an
/// address or changes a pool's protocol is refused whole, with an error
/// that names its origin and keeps its cause (`source()`: the library's or
/// the pool's error); pools new to a config or gone from it are reported as
/// needing a restart. (File reloads take the same path, pool by pool: the
/// reload tests in `tests/` run it against real files.)
#[tokio::test(start_paused = true)]
async fn configs_take_one_typed_path_and_keep_their_cause() {
    use std::error::Error as _;
    let shard = Shard::start();
    let pool = pool("  timeout: 1000\n", std::slice::from_ref(&shard.name), None);
    let shared = Arc::new(Shared { options: ProxyOptions::default(), started: std::time::Instant::now() });
    let registry = crate::registry::Registry::new(shared, vec![pool.clone()]);
    let refused = |text: &str| registry.apply_config("etcd /p/config revision 7", text).unwrap_err();

    let e = refused("alpha: [");
    assert!(e.to_string().starts_with("etcd /p/config revision 7: "), "{e}");
    let invalid = e.source().and_then(|s| s.downcast_ref::<crate::registry::Invalid>()).expect("typed");
    assert!(matches!(invalid, crate::registry::Invalid::Config(_)), "{invalid:?}");
    assert!(invalid.source().and_then(|s| s.downcast_ref::<chash::Error>()).is_some(), "the library's error");

    let e = refused("alpha:\n  servers:\n   - nohost:1\n");
    let invalid = e.source().and_then(|s| s.downcast_ref::<crate::registry::Invalid>()).unwrap();
    assert!(matches!(invalid, crate::registry::Invalid::Server(_)), "{invalid:?}");
    assert!(e.to_string().contains("names no HOST:PORT"), "{e}");

    let e = refused("alpha:\n  redis: true\n  servers:\n   - 127.0.0.1:1:1\n");
    assert!(e.to_string().contains("its protocol changed (memcached to redis)"), "{e}");
    assert_eq!(pool.config().servers[0].id, "s1", "nothing changed");

    // Valid: the running pool takes it, a new pool and the pool gone are
    // reported as needing a restart.
    let results =
        registry.apply_config("etcd", "beta:\n  servers:\n   - 127.0.0.1:1:1\n").expect("a valid config is applied");
    let said: Vec<String> = results.iter().map(|(p, r)| format!("{p}: {}", r.as_ref().unwrap_err())).collect();
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(said[0].starts_with("beta: ") && said[0].contains("after a restart"), "{said:?}");
    assert!(said[1].starts_with("alpha: ") && said[1].contains("gone from the config"), "{said:?}");
}
