//! Redis pools migrating (issue 28), end to end: real redis-servers, two
//! `chash proxy` processes reading one config file (a file fleet), the
//! changes made with `chash config ... --migrate` and `chash migrate
//! start|finish`, and 20 clients (redis-py, `clients/redis_migrate.py`)
//! writing and reading through both proxies all along. Every process
//! started here is killed when its handle drops. The tests take turns.

mod common;

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cluster::*;
use common::require;
use serde_json::Value;

fn script() -> String {
    format!("{}/tests/clients/redis_migrate.py", env!("CARGO_MANIFEST_DIR"))
}

fn python(args: &[&str]) -> Value {
    let out = Command::new(require("python3", "python3")).arg(script()).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let v: Value = serde_json::from_str(text.lines().last().unwrap_or(""))
        .unwrap_or_else(|_| panic!("redis_migrate.py {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success() || args[0] == "verify", "redis_migrate.py {args:?}: {v}");
    v
}

/// The pool's version in the file now.
fn file_version(config: &Path) -> String {
    let text = std::fs::read_to_string(config).unwrap();
    chash::config::Config::from_yaml(&text).unwrap().pool(None).unwrap().version()
}

/// Waits until every proxy runs the file's version (SIGHUP: a proxy
/// that does not watch the file reads it too).
fn all_reloaded(config: &Path, proxies: &[&Proxy]) {
    let want = file_version(config);
    for p in proxies {
        if p.pool()["membership_version"].as_str() != Some(want.as_str()) {
            p.signal("-HUP");
        }
    }
    eventually(20, "every proxy runs the file's version", || {
        proxies.iter().all(|p| p.pool()["membership_version"].as_str() == Some(want.as_str()))
    });
}

/// `chash migrate start`, then waits until every proxy completed.
fn migrate_through(config: &Path, proxies: &[&Proxy]) {
    migrate_through_with(config, proxies, || {});
}

/// [`migrate_through`], with `during` run once keys have begun to move.
fn migrate_through_with(config: &Path, proxies: &[&Proxy], during: impl FnOnce()) {
    all_reloaded(config, proxies);
    let mut args = vec!["migrate".to_owned(), "start".into(), "-c".into(), config.display().to_string(), "-i".into()];
    for p in proxies {
        args.extend(["--check".into(), p.admin.clone()]);
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    chash(&refs);
    all_reloaded(config, proxies);
    during();
    eventually_or(
        180,
        "every proxy completes the migration",
        || {
            proxies.iter().all(|p| {
                let pool = p.pool();
                pool.get("migration").is_none() && pool["migrations_completed"].as_u64() >= Some(1)
            })
        },
        || describe(proxies),
    );
    let mut finish = refs.clone();
    finish[1] = "finish";
    chash(&finish);
    all_reloaded(config, proxies);
}

/// No key on a server that does not own it under the file's placement
/// (`gone`: servers that must be empty). A copying migration's tombstones
/// (`chash-copy:done:*`, expiring a minute after their copy) are not
/// counted; any other key of its bookkeeping left is an error.
fn every_key_on_its_owner(config: &Path, servers: &[&Redis], gone: &[&Redis]) -> usize {
    let text = std::fs::read_to_string(config).unwrap();
    let pool = chash::config::Config::from_yaml(&text).unwrap().pool(None).unwrap();
    let snapshot = pool.snapshot().unwrap();
    let mut total = 0;
    for s in servers {
        let keys: Vec<String> = s.keys().into_iter().filter(|k| !k.starts_with("chash-copy:done:")).collect();
        total += keys.len();
        let misplaced: Vec<&String> =
            keys.iter().filter(|k| snapshot.route(k.as_bytes()).map(str::to_owned) != Some(s.id())).collect();
        assert!(
            misplaced.is_empty(),
            "{} holds {} keys it does not own, e.g. {:?}",
            s.id(),
            misplaced.len(),
            &misplaced[..misplaced.len().min(3)]
        );
    }
    for s in gone {
        let left: Vec<String> = s.keys().into_iter().filter(|k| !k.starts_with("chash-copy:done:")).collect();
        assert!(left.is_empty(), "the removed server {} still holds keys: {:?}", s.id(), &left[..left.len().min(3)]);
    }
    total
}

fn pool_file(servers: &[&Redis], extra: &str) -> String {
    let mut yml = format!(
        "cache:\n  listen: 127.0.0.1:0\n  redis: true\n  distribution: ring\n  timeout: 2000\n  migrate: true\n{extra}  servers:\n"
    );
    for (i, s) in servers.iter().enumerate() {
        yml.push_str(&format!("   - {}:1 s{i}\n", s.id()));
    }
    yml
}

/// The clients' workload, in the background until `stop`.
struct Work {
    child: Child,
    stop: PathBuf,
}

impl Work {
    fn start(dir: &TempDir, a: &Proxy, b: &Proxy, state: &Path) -> Work {
        let stop = dir.path("stop");
        let child = Command::new(require("python3", "python3"))
            .arg(script())
            .args(["work", &a.addr, &b.addr])
            .arg(state)
            .arg(&stop)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Work { child, stop }
    }

    fn finish(mut self) -> Value {
        std::fs::write(&self.stop, b"").unwrap();
        let mut out = String::new();
        self.child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        let mut err = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(self.child.wait().unwrap().success(), "the clients failed: {out}{err}");
        serde_json::from_str(out.lines().last().unwrap_or("")).unwrap_or_else(|_| panic!("{out}{err}"))
    }
}

impl Drop for Work {
    /// A test that fails before `finish` does not leave its clients
    /// writing to whatever takes their ports next.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn zero(v: &Value, keys: &[&str]) {
    for k in keys {
        assert_eq!(v[k].as_u64(), Some(0), "{k} in {v}");
    }
}

/// The clients' figures, all zero where `keys` say; else the proxies'
/// logs (each line timed, as the clients' wrong reads are) go with the
/// failure, to tell which step of the migration a wrong read fell in.
fn zero_or_logs(v: &Value, keys: &[&str], proxies: &[(&str, &Proxy)]) {
    if keys.iter().all(|k| v[k].as_u64() == Some(0)) {
        return;
    }
    for (name, p) in proxies {
        for line in p.log.lock().unwrap().iter() {
            eprintln!("proxy {name}: {line}");
        }
    }
    zero(v, keys);
}

/// 100,000 keys of every type on 3 servers; 20 clients through two
/// proxies; a fourth server added with migration, then one removed with
/// migration. After each: every key as last acknowledged, TTLs kept, no
/// read older than an acknowledged write, no key left off its owner.
#[test]
fn a_server_added_then_one_removed_without_losing_a_key() {
    let _turn = serial();
    let dir = TempDir::new("add-remove");
    let servers: Vec<Redis> = (0..4).map(|_| Redis::start()).collect();
    let config = dir.path("pool.yml");
    std::fs::write(&config, pool_file(&[&servers[0], &servers[1], &servers[2]], "")).unwrap();
    let a = Proxy::start(&config, &[]);
    let b = Proxy::start(&config, &[]);
    let state = dir.path("state.json");
    python(&["load", &a.addr, "100000", state.to_str().unwrap()]);
    let work = Work::start(&dir, &a, &b, &state);
    std::thread::sleep(Duration::from_secs(1));

    let file = config.to_str().unwrap();
    let added = format!("{}:1 s3", servers[3].id());
    let said = chash(&["config", "add", "-c", file, "--migrate", &added, "-i"]);
    assert!(std::fs::read_to_string(&config).unwrap().contains("migrate_state: armed"));
    assert!(said.contains("written armed") && said.contains(&format!("chash migrate start -c {file} -i")), "{said}");
    migrate_through(&config, &[&a, &b]);
    let s: Vec<&Redis> = servers.iter().collect();
    every_key_on_its_owner(&config, &s, &[]);
    assert!(servers[3].keys().len() > 15_000, "the new server took its share");

    chash(&["config", "remove", "-c", file, "--migrate", &servers[1].id(), "-i"]);
    migrate_through(&config, &[&a, &b]);
    // A removal from a ring moves the removed server's keys only: its mover
    // scanned that server alone.
    let scanned: Vec<String> =
        a.log.lock().unwrap().iter().filter(|l| l.contains("migration: scanning")).cloned().collect();
    assert_eq!(scanned.len(), 2, "{scanned:?}");
    assert!(scanned[1].contains(&format!("scanning {} pool=", servers[1].id())), "{scanned:?}");
    assert_eq!(scanned[0].matches("127.0.0.1:").count(), 3, "an addition moves keys from every server: {scanned:?}");
    let stats = work.finish();
    zero_or_logs(&stats, &["older_reads", "wrong_loaded"], &[("a", &a), ("b", &b)]);
    assert!(stats["writes"].as_u64().unwrap() > 1000, "{stats}");
    let verified = python(&["verify", &a.addr, state.to_str().unwrap()]);
    zero(&verified, &["loaded_wrong", "ttl_off", "lost_writes", "counters_off", "lists_off"]);
    let total = every_key_on_its_owner(&config, &[&servers[0], &servers[2], &servers[3]], &[&servers[1]]);
    assert!(total >= 100_000, "{total} keys");
    eprintln!("clients: {stats}; verified: {verified}");
}

/// `--now` in a pool with `migrate: true` (no `--migrate` needed) writes
/// the change moving, for the one proxy that reads the file, and says
/// what to run next; without a migration to start it is refused with why.
#[test]
fn now_writes_a_file_migration_moving() {
    let _turn = serial();
    let dir = TempDir::new("now");
    let servers: Vec<Redis> = (0..3).map(|_| Redis::start()).collect();
    let config = dir.path("pool.yml");
    std::fs::write(&config, pool_file(&[&servers[0], &servers[1]], "")).unwrap();
    let file = config.to_str().unwrap();
    let added = format!("{}:1 s2", servers[2].id());
    let said = chash(&["config", "add", "-c", file, "--now", &added, "-i"]);
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("migrate_state: moving") && text.contains("migrate_from:"), "{text}");
    assert!(
        said.contains("written moving (--now)")
            && said.contains(&format!("chash migrate status URL -c {file} --watch")),
        "{said}"
    );

    // A pool that does not migrate, and a change that moves nothing.
    let plain = dir.path("plain.yml");
    std::fs::write(&plain, pool_file(&[&servers[0], &servers[1]], "").replace("  migrate: true\n", "")).unwrap();
    let refused = chash_fails(&["config", "add", "-c", plain.to_str().unwrap(), "--now", &added, "-i"]);
    assert!(refused.contains("--now starts a migration: pool cache does not migrate"), "{refused}");
    let refused = chash_fails(&["config", "eject", "-c", plain.to_str().unwrap(), "--now", &servers[0].id(), "-i"]);
    assert!(refused.contains("--now goes with add, remove and weight"), "{refused}");
    assert!(!std::fs::read_to_string(&plain).unwrap().contains("migrate_state"), "nothing written");
    let refused =
        chash_fails(&["migrate", "start", "-c", plain.to_str().unwrap(), "-i", "--check", "http://127.0.0.1:9"]);
    assert!(refused.contains("nothing to start: pool cache of") && refused.contains("no armed change"), "{refused}");
    // A memcached pool is not told to add --migrate (it warms up instead).
    let memcached = dir.path("memcached.yml");
    let text =
        pool_file(&[&servers[0], &servers[1]], "").replace("  migrate: true\n", "").replace("  redis: true\n", "");
    std::fs::write(&memcached, text).unwrap();
    let refused = chash_fails(&["config", "add", "-c", memcached.to_str().unwrap(), "--now", &added, "-i"]);
    assert!(refused.contains("is a memcached pool, which warms up instead"), "{refused}");
}

/// A `--now` change the proxy has not loaded yet (it reloads on SIGHUP
/// only here, so it lags as long as the test needs): `chash migrate
/// finish` is refused, though the proxy completed an earlier migration
/// (taking the record away before it moved a key would lose the keys the
/// change moves); `chash migrate status -c FILE` says it has not loaded
/// the change, and `--watch` waits through the reload to the end.
#[test]
fn finish_and_watch_wait_for_a_proxy_to_load_the_change() {
    let _turn = serial();
    let dir = TempDir::new("lagging");
    let servers: Vec<Redis> = (0..3).map(|_| Redis::start()).collect();
    let config = dir.path("pool.yml");
    std::fs::write(&config, pool_file(&[&servers[0], &servers[1]], "")).unwrap();
    let a = Proxy::start(&config, &["--no-watch"]);
    let state = dir.path("state.json");
    python(&["load", &a.addr, "20000", state.to_str().unwrap()]);
    let file = config.to_str().unwrap();
    let completed = |n: u64| {
        let pool = a.pool();
        pool.get("migration").is_none() && pool["migrations_completed"].as_u64() == Some(n)
    };

    // A first migration, through to its end.
    chash(&["config", "add", "-c", file, "--now", &format!("{}:1 s2", servers[2].id()), "-i"]);
    all_reloaded(&config, &[&a]);
    eventually_or(120, "the first migration completes", || completed(1), || describe(&[&a]));
    chash(&["migrate", "finish", "-c", file, "-i", "--check", &a.admin]);
    all_reloaded(&config, &[&a]);

    // The second, written and not loaded.
    chash(&["config", "remove", "-c", file, "--now", &servers[0].id(), "-i"]);
    let status = chash(&["migrate", "status", &a.admin, "-c", file]);
    assert!(status.contains("cache: has not loaded") && status.contains(&format!("{file}'s change yet")), "{status}");
    let refused = chash_fails(&["migrate", "finish", "-c", file, "-i", "--check", &a.admin]);
    assert!(refused.contains("has not completed the migration of pool cache: it runs version"), "{refused}");
    assert!(refused.contains(&format!("the change is version {} in {file} while it moves", file_version(&config))));
    assert!(std::fs::read_to_string(&config).unwrap().contains("migrate_state: moving"), "nothing written");

    let mut watch = Command::new(env!("CARGO_BIN_EXE_chash"))
        .args(["migrate", "status", &a.admin, "-c", file, "--watch", "--interval", "0.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reader = {
        let (out, lines) = (watch.stdout.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        })
    };
    eventually(20, "--watch looks", || lines.lock().unwrap().iter().any(|l| l.contains("has not loaded")));
    assert!(watch.try_wait().unwrap().is_none(), "--watch ended before the proxy loaded the change");
    a.signal("-HUP");
    let ended = Instant::now() + Duration::from_secs(120);
    let exit = loop {
        if let Some(exit) = watch.try_wait().unwrap() {
            break exit;
        }
        if Instant::now() >= ended {
            let _ = watch.kill();
            panic!("--watch did not end: {:?}\n{}", lines.lock().unwrap(), describe(&[&a]));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    reader.join().unwrap();
    let lines = lines.lock().unwrap();
    assert!(exit.success(), "{lines:?}");
    assert!(completed(2), "{lines:?}");
    assert_eq!(lines.last().map(String::as_str), Some("no proxy is migrating"), "{lines:?}");
    chash(&["migrate", "finish", "-c", file, "-i", "--check", &a.admin]);
    all_reloaded(&config, &[&a]);
    let verified = python(&["verify", &a.addr, state.to_str().unwrap()]);
    zero(&verified, &["loaded_wrong", "ttl_off", "lost_writes", "counters_off", "lists_off"]);
    every_key_on_its_owner(&config, &[&servers[1], &servers[2]], &[&servers[0]]);
}

/// Mid-move, one proxy is killed (SIGKILL) and started again, and a server
/// keys move from is paused (SIGSTOP) for 2 s: the move resumes and
/// completes, and nothing is lost.
#[test]
fn a_killed_proxy_and_a_paused_server_lose_nothing() {
    let _turn = serial();
    let dir = TempDir::new("kill");
    let servers: Vec<Redis> = (0..4).map(|_| Redis::start()).collect();
    let config = dir.path("pool.yml");
    std::fs::write(&config, pool_file(&[&servers[0], &servers[1], &servers[2]], "")).unwrap();
    // Slow movers, so that the kill and the pause land mid-move.
    let slow = ["--migrate-keys-per-second", "4000"];
    let mut a = Proxy::start(&config, &slow);
    let b = Proxy::start(&config, &slow);
    let state = dir.path("state.json");
    python(&["load", &a.addr, "50000", state.to_str().unwrap()]);
    let work = Work::start(&dir, &a, &b, &state);
    let file = config.to_str().unwrap();
    let added = format!("{}:1 s3", servers[3].id());
    chash(&["config", "add", "-c", file, "--migrate", &added, "-i"]);
    all_reloaded(&config, &[&a, &b]);
    chash(&["migrate", "start", "-c", file, "-i", "--check", &a.admin, "--check", &b.admin]);
    eventually(20, "the move is under way", || a.pool()["migration_keys_moved"].as_u64() > Some(1000));
    // Reads of keys not moved yet are answered by their old server.
    eventually_or(
        20,
        "a read answered by a key's old server",
        || [&a, &b].iter().any(|p| p.pool()["migration_reads_from_old"].as_u64() > Some(0)),
        || describe(&[&a, &b]),
    );
    a.kill();
    std::thread::sleep(Duration::from_millis(500));
    a.spawn();
    servers[0].signal("-STOP");
    std::thread::sleep(Duration::from_secs(2));
    servers[0].signal("-CONT");
    eventually_or(
        180,
        "both proxies complete",
        || {
            [&a, &b]
                .iter()
                .all(|p| p.pool().get("migration").is_none() && p.pool()["migrations_completed"].as_u64() >= Some(1))
        },
        || describe(&[&a, &b]),
    );
    chash(&["migrate", "finish", "-c", file, "-i", "--check", &a.admin, "--check", &b.admin]);
    let stats = work.finish();
    zero_or_logs(&stats, &["older_reads", "wrong_loaded"], &[("a", &a), ("b", &b)]);
    let verified = python(&["verify", &b.addr, state.to_str().unwrap()]);
    zero(&verified, &["loaded_wrong", "ttl_off", "lost_writes", "counters_off", "lists_off"]);
    let s: Vec<&Redis> = servers.iter().collect();
    every_key_on_its_owner(&config, &s, &[]);
    eprintln!("clients: {stats}; verified: {verified}");
}

/// The barrier: while a proxy still runs the old config (it does not watch
/// the file), `chash migrate start` refuses and no key moves; once it has
/// the armed change (SIGHUP), the move starts. A proxy alone migrates
/// through its admin endpoint (moving at once, persisted, and the record
/// removed when done). Without migration the same change loses keys.
#[test]
fn no_key_moves_before_every_proxy_is_armed() {
    let _turn = serial();
    let dir = TempDir::new("barrier");
    let servers: Vec<Redis> = (0..4).map(|_| Redis::start()).collect();
    let config = dir.path("pool.yml");
    std::fs::write(&config, pool_file(&[&servers[0], &servers[1], &servers[2]], "")).unwrap();
    let a = Proxy::start(&config, &[]);
    let b = Proxy::start(&config, &["--no-watch"]);
    let state = dir.path("state.json");
    python(&["load", &a.addr, "10000", state.to_str().unwrap()]);
    let file = config.to_str().unwrap();
    let added = format!("{}:1 s3", servers[3].id());
    chash(&["config", "add", "-c", file, "--migrate", &added, "-i"]);
    all_reloaded(&config, &[&a]);
    let refused = chash_fails(&["migrate", "start", "-c", file, "-i", "--check", &a.admin, "--check", &b.admin]);
    assert!(refused.contains("not the armed change"), "{refused}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(servers[3].keys().len(), 0, "no key moved while a proxy was not armed");
    // Armed, a moved key's command waits (and then is refused, retryable).
    let mut c = Resp::connect(a.addr.parse().unwrap());
    let text = std::fs::read_to_string(&config).unwrap();
    let snapshot = chash::config::Config::from_yaml(&text).unwrap().pool(None).unwrap().snapshot().unwrap();
    let moved_key = (0..10_000 / 7)
        .map(|i| format!("string:{}", i * 7))
        .find(|k| snapshot.route(k.as_bytes()).map(str::to_owned) == Some(servers[3].id()))
        .unwrap();
    c.w.write_all(format!("*2\r\n$3\r\nGET\r\n${}\r\n{moved_key}\r\n", moved_key.len()).as_bytes()).unwrap();
    let mut line = String::new();
    c.r.read_line(&mut line).unwrap();
    assert!(line.starts_with("-TRYAGAIN"), "{line}");
    // A key on both its old server and its new one (written on the new one
    // by hand): the new server's copy is kept, the old one deleted.
    let pool = chash::config::Config::from_yaml(&text).unwrap().pool(None).unwrap();
    let before = pool.migration_source().unwrap().unwrap().snapshot().unwrap();
    let twice = (0..10_000)
        .map(|i| format!("twice:{i}"))
        .find(|k| snapshot.route(k.as_bytes()).map(str::to_owned) == Some(servers[3].id()))
        .unwrap();
    let old_owner = servers.iter().find(|s| before.route(twice.as_bytes()).map(str::to_owned) == Some(s.id())).unwrap();
    Resp::connect(SocketAddr::from(([127, 0, 0, 1], old_owner.port))).ask(&["SET", &twice, "old"]);
    Resp::connect(SocketAddr::from(([127, 0, 0, 1], servers[3].port))).ask(&["SET", &twice, "new"]);
    // A transaction through b (not armed yet) watching a key that does
    // not exist and moves, executed once the migration is done: aborted
    // (nil), not run on the key's old server.
    let watched = (0..10_000)
        .map(|i| format!("watched:{i}"))
        .find(|k| snapshot.route(k.as_bytes()).map(str::to_owned) == Some(servers[3].id()))
        .unwrap();
    let mut w = Resp::connect(b.addr.parse().unwrap());
    w.ask(&["WATCH", &watched]);
    w.ask(&["MULTI"]);
    w.ask(&["SET", &watched, "late"]);
    // And one not watching: it runs where its key is at EXEC.
    let queued = (0..10_000)
        .map(|i| format!("queued:{i}"))
        .find(|k| snapshot.route(k.as_bytes()).map(str::to_owned) == Some(servers[3].id()))
        .unwrap();
    let mut q = Resp::connect(b.addr.parse().unwrap());
    q.ask(&["MULTI"]);
    q.ask(&["SET", &queued, "queued"]);
    b.signal("-HUP");
    all_reloaded(&config, &[&a, &b]);
    migrate_through(&config, &[&a, &b]);
    assert!(matches!(w.ask(&["EXEC"]), Reply::Nil), "a transaction watched before the change ran after it");
    let watched_before = servers.iter().find(|s| before.route(watched.as_bytes()).map(str::to_owned) == Some(s.id()));
    let mut old = Resp::connect(SocketAddr::from(([127, 0, 0, 1], watched_before.unwrap().port)));
    assert!(matches!(old.ask(&["GET", &watched]), Reply::Nil), "written on its server before the change");
    assert!(matches!(c.ask(&["GET", &watched]), Reply::Nil));
    assert!(matches!(q.ask(&["EXEC"]), Reply::Array(r) if r.len() == 1), "the transaction queued before ran");
    let queued_before = servers.iter().find(|s| before.route(queued.as_bytes()).map(str::to_owned) == Some(s.id()));
    let mut old = Resp::connect(SocketAddr::from(([127, 0, 0, 1], queued_before.unwrap().port)));
    assert!(matches!(old.ask(&["GET", &queued]), Reply::Nil), "run on its key's server before the change");
    assert!(matches!(c.ask(&["GET", &queued]), Reply::Bulk(v) if v == "queued"));
    let verified = python(&["verify", &a.addr, state.to_str().unwrap()]);
    zero(&verified, &["loaded_wrong", "ttl_off"]);
    assert!(matches!(c.ask(&["GET", &twice]), Reply::Bulk(v) if v == "new"));
    let said = |p: &Proxy| p.log.lock().unwrap().iter().any(|l| l.contains("the copy on its new server is kept"));
    assert!(said(&a) || said(&b), "{}", describe(&[&a, &b]));
    let s: Vec<&Redis> = servers.iter().collect();
    every_key_on_its_owner(&config, &s, &[]);
    drop((a, b));

    // One proxy alone, through its admin endpoint, persisting.
    std::fs::write(&config, pool_file(&[&servers[0], &servers[2], &servers[3]], "")).unwrap();
    let p = Proxy::start(&config, &["--persist"]);
    let http = |method: &str, path: &str, body: &str| http_to(&p, method, path, body);
    let answer = http("POST", "/pools/cache/servers?migrate=true", &format!("{}:1 s1", servers[1].id()));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    eventually(60, "the proxy completes its migration", || p.pool()["migrations_completed"].as_u64() >= Some(1));
    eventually(10, "the record leaves the file", || !std::fs::read_to_string(&config).unwrap().contains("migrate_"));
    let verified = python(&["verify", &p.addr, state.to_str().unwrap()]);
    zero(&verified, &["loaded_wrong", "ttl_off"]);
    let s: Vec<&Redis> = servers.iter().collect();
    every_key_on_its_owner(&config, &s, &[]);

    // Without migration: the keys that move are lost to their clients.
    let answer = http("DELETE", &format!("/pools/cache/servers/{}?migrate=false", servers[3].id()), "");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let verified = python(&["verify", &p.addr, state.to_str().unwrap()]);
    let lost = verified["loaded_wrong"].as_u64().unwrap();
    eprintln!("without migration, removing a server of four lost {lost} of 10,000 keys");
    assert!(lost > 1000, "{verified}");

    // A server that does not allow MIGRATE (as some managed services):
    // refused before anything changes, by the CLI and by the admin endpoint.
    let locked = Redis::start_with(&["--rename-command", "MIGRATE", ""]);
    std::fs::write(&config, pool_file(&[&locked, &servers[0]], "")).unwrap();
    let before = std::fs::read_to_string(&config).unwrap();
    let line = format!("{}:1 s2", servers[2].id());
    let refused = chash_fails(&["config", "add", "-c", file, "--migrate", &line, "-i"]);
    assert!(refused.contains("MIGRATE from") && refused.contains("nothing was changed"), "{refused}");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), before, "the file is unchanged");
    let q = Proxy::start(&config, &[]);
    let answer = http_to(&q, "POST", "/pools/cache/servers?migrate=true", &line);
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("nothing was changed"), "{answer}");
    assert_eq!(q.pool()["servers"].as_array().unwrap().len(), 2, "the pool is unchanged");
}

fn http_to(p: &Proxy, method: &str, path: &str, body: &str) -> String {
    let authority = p.admin.trim_start_matches("http://");
    let mut s = TcpStream::connect(authority).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The stored config, written to `path` (for the placement checks).
fn stored_to(url: &str, path: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_chash")).args(["config", "get", "--etcd", url]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    std::fs::write(path, &text).unwrap();
    text
}

/// A fleet on etcd: the barrier is every registered proxy. One proxy
/// stopped (SIGSTOP, its lease alive) holds the move back: the armed change
/// is taken back after --wait and no key has moved. Stopped again and then
/// killed during a second change's wait, it holds the move back until its
/// lease expires; the other proxy moves meanwhile, the killed one restarts
/// into the moving state, and `chash migrate finish --etcd` removes the
/// record only once both completed. Nothing is lost.
#[test]
fn an_etcd_fleet_moves_nothing_until_every_registered_proxy_is_armed() {
    let _turn = serial();
    let dir = TempDir::new("etcd");
    let etcd = Etcd::start(&dir);
    let url = etcd.url();
    let servers: Vec<Redis> = (0..4).map(|_| Redis::start()).collect();
    let file = dir.path("pool.yml");
    std::fs::write(&file, pool_file(&[&servers[0], &servers[1], &servers[2]], "")).unwrap();
    chash(&["config", "put", "--etcd", &url, file.to_str().unwrap()]);
    let a = Proxy::on_etcd(&url, &[]);
    let mut b = Proxy::on_etcd(&url, &[]);
    eventually(20, "both proxies registered", || {
        chash_status(&["fleet", "status", "--etcd", &url]).1.contains("agree: 2 proxies")
    });
    let state = dir.path("state.json");
    python(&["load", &a.addr, "20000", state.to_str().unwrap()]);
    let added = format!("{}:1 s3", servers[3].id());

    // B stopped, its registration alive: the change is taken back.
    b.signal("-STOP");
    let (ok, out) = chash_status(&["config", "add", "--etcd", &url, "--migrate", &added, "--wait", "2"]);
    b.signal("-CONT");
    assert!(!ok, "{out}");
    assert!(out.contains("lagging (1 of them)") && out.contains("taken back"), "{out}");
    eprintln!("the first change: {out}");
    assert_eq!(servers[3].keys().len(), 0, "no key moved while a proxy was not armed");
    let text = stored_to(&url, &file);
    assert!(!text.contains("migrate_") && !text.contains(&servers[3].id()), "{text}");
    let verified = python(&["verify", &a.addr, state.to_str().unwrap()]);
    zero(&verified, &["loaded_wrong", "ttl_off"]);

    // B stopped again, then killed while the change waits for it: nothing
    // moves until its lease expires (10 s), then the change goes ahead.
    eventually(20, "B follows etcd again", || b.pool()["membership_version"] == a.pool()["membership_version"]);
    b.signal("-STOP");
    let started = Instant::now();
    let change = Command::new(env!("CARGO_BIN_EXE_chash"))
        .args(["config", "add", "--etcd", &url, "--migrate", &added, "--wait", "40"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(20, "A runs the armed change", || a.pool()["migration"]["state"] == "armed");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(servers[3].keys().len(), 0, "nothing moves while B's registration stands");
    assert_eq!(a.pool()["migration"]["state"], "armed");
    b.kill();
    let out = change.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("armed: 1 of 1 proxies") && text.contains("moving"), "{text}");
    assert!(started.elapsed() > Duration::from_secs(3), "the change waited for B's lease: {text}");
    eprintln!("the second change: {text}");
    b.spawn();
    let work = Work::start(&dir, &a, &b, &state);
    std::thread::sleep(Duration::from_secs(2));
    // Finish waits until both proxies completed, then removes the record.
    let (ok, out) = chash_status(&["migrate", "finish", "--etcd", &url, "--wait", "120"]);
    assert!(ok, "{out}");
    assert!(out.contains("completed by 2 of 2 proxies") && out.contains("record removed"), "{out}");
    eprintln!("finish: {out}");
    let status = chash(&["migrate", "status", "--etcd", &url]);
    assert_eq!(status.matches("not migrating").count(), 2, "{status}");
    let stats = work.finish();
    zero_or_logs(&stats, &["older_reads", "wrong_loaded"], &[("a", &a), ("b", &b)]);
    let verified = python(&["verify", &b.addr, state.to_str().unwrap()]);
    zero(&verified, &["loaded_wrong", "ttl_off", "lost_writes", "counters_off", "lists_off"]);
    let text = stored_to(&url, &file);
    assert!(!text.contains("migrate_"), "{text}");
    let s: Vec<&Redis> = servers.iter().collect();
    every_key_on_its_owner(&file, &s, &[]);
    assert!(servers[3].keys().len() > 2_000, "the new server took its share");
    eprintln!("clients: {stats}; verified: {verified}");
}

/// Servers that refuse `MIGRATE` (renamed away, as some managed services
/// do) with `migrate_method: copy`: the proxies copy each moved key with
/// `DUMP` and `RESTORE` under claims, through the same add and remove as
/// above, with 20 clients through two proxies. Before the move, a copier
/// that died is staged on the servers: three keys claimed and never
/// restored, two restored and never released; the proxies resolve them
/// once their lease has passed, and when the dead copier wakes up after a
/// client deleted one of its keys, its restore is refused and the key
/// stays deleted. A server that cannot run the copy's scripts is refused
/// before anything changes.
#[test]
fn servers_without_migrate_copy_through_the_proxy() {
    let _turn = serial();
    let dir = TempDir::new("copy");
    let no_migrate = ["--rename-command", "MIGRATE", ""];
    let servers: Vec<Redis> = (0..4).map(|_| Redis::start_with(&no_migrate)).collect();
    let config = dir.path("pool.yml");
    let copy = "  migrate_method: copy\n";
    let file = config.to_str().unwrap();

    // No EVAL: refused, nothing changed.
    let locked = Redis::start_with(&["--rename-command", "EVAL", ""]);
    std::fs::write(&config, pool_file(&[&servers[0], &locked], copy)).unwrap();
    let before = std::fs::read_to_string(&config).unwrap();
    let refused = chash_fails(&["config", "add", "-c", file, "--migrate", &format!("{}:1 s9", servers[1].id()), "-i"]);
    assert!(refused.contains("cannot copy keys") && refused.contains("nothing was changed"), "{refused}");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), before);
    drop(locked);

    std::fs::write(&config, pool_file(&[&servers[0], &servers[1], &servers[2]], copy)).unwrap();
    let a = Proxy::start(&config, &[]);
    let b = Proxy::start(&config, &[]);
    let state = dir.path("state.json");
    python(&["load", &a.addr, "30000", state.to_str().unwrap()]);
    let work = Work::start(&dir, &a, &b, &state);
    std::thread::sleep(Duration::from_secs(1));
    let added = format!("{}:1 s3", servers[3].id());
    chash(&["config", "add", "-c", file, "--migrate", &added, "-i"]);
    all_reloaded(&config, &[&a, &b]);

    // The dead copier, while the change is armed (nothing moves yet).
    let text = std::fs::read_to_string(&config).unwrap();
    let pool = chash::config::Config::from_yaml(&text).unwrap().pool(None).unwrap();
    let snapshot = pool.snapshot().unwrap();
    let before = pool.migration_source().unwrap().expect("the pool before the change").snapshot().unwrap();
    let stranded: Vec<String> = (0..30_000)
        .map(|i| format!("string:{}", i * 7))
        .filter(|k| {
            before.route(k.as_bytes()).map(str::to_owned) == Some(servers[0].id())
                && snapshot.route(k.as_bytes()).map(str::to_owned) == Some(servers[3].id())
        })
        .take(5)
        .collect();
    assert_eq!(stranded.len(), 5);
    let scripts = dir.path("scripts.json");
    let texts = serde_json::json!({
        "claim": chash_proxy::redis::copy::CLAIM,
        "restore": chash_proxy::redis::copy::RESTORE,
    });
    std::fs::write(&scripts, texts.to_string()).unwrap();
    let saved = dir.path("saved.json");
    let mut args = vec!["strand".to_owned(), servers[0].id(), servers[3].id()];
    args.extend([scripts.display().to_string(), "6000".into(), saved.display().to_string()]);
    args.extend(stranded.iter().cloned());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let staged = python(&refs);
    assert_eq!(staged["claimed"].as_u64(), Some(5), "{staged}");

    // While the dead copier's claims last, a read of a claimed key (gone
    // from its old server, not yet on its new one) is answered with its
    // value or a retryable error, never as a key that does not exist.
    let mut during = Vec::new();
    migrate_through_with(&config, &[&a, &b], || {
        let mut c = Resp::connect(a.addr.parse().unwrap());
        for k in &stranded[..3] {
            let i: usize = k.trim_start_matches("string:").parse().unwrap();
            match c.ask_or_error(&["GET", k]) {
                Ok(Reply::Bulk(v)) => assert_eq!(v, format!("v{i}"), "{k}"),
                Err(e) => assert!(e.starts_with("TRYAGAIN"), "{k}: {e}"),
                Ok(other) => panic!("{k}, claimed by a copier that stopped, read as {other:?}"),
            }
            during.push(k.clone());
        }
    });
    assert_eq!(during.len(), 3);
    let s: Vec<&Redis> = servers.iter().collect();
    every_key_on_its_owner(&config, &s, &[]);
    assert!(servers[3].keys().len() > 5_000, "the new server took its share");

    chash(&["config", "remove", "-c", file, "--migrate", &servers[1].id(), "-i"]);
    migrate_through(&config, &[&a, &b]);
    let stats = work.finish();
    zero_or_logs(&stats, &["older_reads", "wrong_loaded"], &[("a", &a), ("b", &b)]);
    assert!(stats["writes"].as_u64().unwrap() > 500, "{stats}");
    let verified = python(&["verify", &a.addr, state.to_str().unwrap()]);
    zero(&verified, &["loaded_wrong", "ttl_off", "lost_writes", "counters_off", "lists_off"]);
    let total = every_key_on_its_owner(&config, &[&servers[0], &servers[2], &servers[3]], &[&servers[1]]);
    assert!(total >= 30_000, "{total} keys");
    for (name, p) in [("a", &a), ("b", &b)] {
        let log = p.log.lock().unwrap();
        assert!(!log.iter().any(|l| l.contains("MIGRATE")), "proxy {name} tried MIGRATE: {log:?}");
    }

    // The dead copier wakes up after a client deleted one of its keys.
    let gone = stranded[4].clone();
    let mut c = Resp::connect(a.addr.parse().unwrap());
    c.ask(&["DEL", &gone]);
    let late = python(&["late", &servers[3].id(), scripts.to_str().unwrap(), saved.to_str().unwrap()]);
    let answer = late["answer"].as_str().unwrap();
    assert!(answer == "done" || answer == "expired", "{late}");
    assert!(matches!(c.ask(&["GET", &gone]), Reply::Nil), "a late restore brought back a deleted key");
    eprintln!("clients: {stats}; verified: {verified}; staged: {staged}; late restore: {late}");
}
