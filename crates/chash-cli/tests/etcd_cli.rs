//! A fleet on etcd (issue 17), end to end: a real etcd (Debian's
//! etcd-server) and real memcached servers started here on loopback ports
//! with temporary data directories, `chash proxy --membership` processes,
//! and changes made with `chash config ... --etcd`. Every process started
//! here is killed when its handle drops. The tests take turns (one lock):
//! the fleet test times convergence, which other tests' processes would
//! disturb on a small machine.

#![cfg(feature = "etcd")]

mod common;
#[path = "../../chash-proxy/tests/support/pki.rs"]
mod pki;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{chash, require, stderr, stdout};
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port nothing listens on now, never handed out before in this process.
fn free_port() -> u16 {
    static USED: Mutex<std::collections::BTreeSet<u16>> = Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if USED.lock().unwrap().insert(port) {
            return port;
        }
    }
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("chash-etcd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A one-member etcd on loopback ports with its own data directory.
struct Etcd {
    client: u16,
    peer: u16,
    data: PathBuf,
    child: Option<Child>,
    /// Serving clients TLS only, requiring their certificates: the files
    /// (CA, server certificate and key, a client certificate and key).
    tls: Option<EtcdFiles>,
}

/// The certificates of a TLS etcd and of its clients.
struct EtcdFiles {
    ca: String,
    cert: String,
    key: String,
    client_cert: String,
    client_key: String,
}

impl EtcdFiles {
    fn of(pki: &pki::Pki) -> EtcdFiles {
        EtcdFiles {
            ca: pki.path("ca.pem"),
            cert: pki.path("server.pem"),
            key: pki.path("server.key"),
            client_cert: pki.path("client.pem"),
            client_key: pki.path("client.key"),
        }
    }

    /// The CLI's flags for them.
    fn flags(&self) -> Vec<String> {
        ["--etcd-ca", &self.ca, "--etcd-cert", &self.client_cert, "--etcd-key", &self.client_key]
            .map(String::from)
            .to_vec()
    }
}

impl Etcd {
    fn start(dir: &TempDir) -> Etcd {
        Etcd::start_with(dir, None)
    }

    fn start_with(dir: &TempDir, tls: Option<EtcdFiles>) -> Etcd {
        let mut tls = tls;
        for _ in 0..3 {
            let mut etcd = Etcd {
                client: free_port(),
                peer: free_port(),
                data: dir.path("etcd-data"),
                child: None,
                tls: tls.take(),
            };
            if etcd.spawn() {
                return etcd;
            }
            etcd.stop();
            let _ = std::fs::remove_dir_all(&etcd.data);
            tls = etcd.tls.take();
        }
        panic!("etcd did not start after 3 tries");
    }

    /// Starts the process on this etcd's ports and data directory; `true`
    /// once it answers.
    fn spawn(&mut self) -> bool {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", self.client);
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let mut command = Command::new(require("etcd", "etcd-server"));
        if let Some(tls) = &self.tls {
            command.args(["--cert-file", &tls.cert, "--key-file", &tls.key, "--trusted-ca-file", &tls.ca]);
            command.arg("--client-cert-auth");
        }
        let child = command
            .args(["--name", "t", "--data-dir"])
            .arg(&self.data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.child.as_mut().unwrap().try_wait().unwrap().is_some() {
                return false;
            }
            if self.ctl(&["get", "/ready-check"]).status.success() {
                return true;
            }
            thread::sleep(Duration::from_millis(100));
        }
        false
    }

    fn url(&self, prefix: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "etcd" };
        format!("{scheme}://127.0.0.1:{}/{prefix}", self.client)
    }

    /// An URL whose first endpoint is dead: this etcd is the second.
    fn url_after_a_dead_one(&self, prefix: &str) -> String {
        format!("etcd://127.0.0.1:{},127.0.0.1:{}/{prefix}", free_port(), self.client)
    }

    /// etcdctl (v3 API) against this etcd.
    fn ctl(&self, args: &[&str]) -> Output {
        let mut command = Command::new(require("etcdctl", "etcd-client"));
        let mut endpoint = format!("127.0.0.1:{}", self.client);
        if let Some(tls) = &self.tls {
            endpoint = format!("https://{endpoint}");
            command.args(["--cacert", &tls.ca, "--cert", &tls.client_cert, "--key", &tls.client_key]);
        }
        command
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &endpoint, "--command-timeout", "5s"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// The store's current revision.
    fn revision(&self) -> i64 {
        let out = self.ctl(&["get", "/", "-w", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["header"]["revision"].as_i64().unwrap()
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn restart(&mut self) {
        self.stop();
        assert!(self.spawn(), "etcd restarts on its ports");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A memcached process on a loopback port.
struct Memcached {
    port: u16,
    child: Child,
}

impl Memcached {
    fn start() -> Memcached {
        for _ in 0..5 {
            let port = free_port();
            let mut child = Command::new(require("memcached", "memcached"))
                .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0", "-m", "32", "-u", "root", "-t", "1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Memcached { port, child };
                }
                thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("memcached did not start");
    }

    fn id(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `chash proxy --membership` process: its pools' and admin addresses
/// as it announced them, and its log lines.
struct Proxy {
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    pools: HashMap<String, SocketAddr>,
    admin: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    fn start(url: &str, id: &str, cache: &Path, pools: &[&str]) -> Proxy {
        Proxy::start_with(url, id, cache, pools, &[], &[])
    }

    /// As [`Proxy::start`], with more arguments and environment variables.
    fn start_with(url: &str, id: &str, cache: &Path, pools: &[&str], extra: &[String], env: &[(&str, &str)]) -> Proxy {
        let mut args: Vec<String> = ["proxy", "--membership", url, "--proxy-id", id, "--membership-cache"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(cache.display().to_string());
        args.extend(["--admin", "127.0.0.1:0", "--no-stats", "--threads", "1"].map(String::from));
        for pool in pools {
            args.push("--listen-override".into());
            args.push(format!("{pool}=127.0.0.1:0"));
        }
        args.extend_from_slice(extra);
        let mut proxy = Proxy {
            args,
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            child: None,
            pools: HashMap::new(),
            admin: "127.0.0.1:1".parse().unwrap(),
            log: Arc::new(Mutex::new(Vec::new())),
        };
        proxy.spawn();
        proxy
    }

    fn spawn(&mut self) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_chash"))
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let log = self.log.clone();
        thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                log.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        self.pools.clear();
        let mut admin = None;
        let deadline = Instant::now() + Duration::from_secs(30);
        while admin.is_none() {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("the proxy announces itself; it said: {:?}", self.log.lock().unwrap()));
            if let Some((name, addr)) =
                line.split_once("pool \"").and_then(|(_, r)| r.split_once("\" serving memcached on "))
            {
                self.pools.insert(name.to_owned(), addr.trim().parse().unwrap());
            }
            if let Some(rest) = line.split("admin on http://").nth(1) {
                admin = Some(rest.split_whitespace().next().unwrap().parse().unwrap());
            }
        }
        self.admin = admin.unwrap();
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn stats(&self) -> Value {
        let mut s = TcpStream::connect(self.admin).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET /stats HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        serde_json::from_str(out.split_once("\r\n\r\n").unwrap().1).unwrap()
    }

    fn revision(&self) -> i64 {
        self.stats()["membership"]["revision"].as_i64().unwrap()
    }

    fn logged(&self, text: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(text))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sets every key through `addr` to `value(i)`; returns the replies that
/// were not `STORED`.
fn set_all(addr: SocketAddr, keys: &[String], value: impl Fn(usize) -> String) -> usize {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut failed = 0;
    for (chunk_at, chunk) in keys.chunks(500).enumerate() {
        let mut batch = Vec::new();
        for (j, k) in chunk.iter().enumerate() {
            let v = value(chunk_at * 500 + j);
            batch.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
        }
        s.write_all(&batch).unwrap();
        for _ in chunk {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            if line != "STORED\r\n" {
                failed += 1;
            }
        }
    }
    failed
}

/// Every key's value through `addr` (multi-key gets).
fn get_all(addr: SocketAddr, keys: &[String]) -> HashMap<String, String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut values = HashMap::new();
    for chunk in keys.chunks(100) {
        s.write_all(format!("get {}\r\n", chunk.join(" ")).as_bytes()).unwrap();
        loop {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            if line == "END\r\n" {
                break;
            }
            let parts: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(parts.first(), Some(&"VALUE"), "unexpected reply {line:?}");
            let mut data = vec![0u8; parts[3].parse::<usize>().unwrap() + 2];
            r.read_exact(&mut data).unwrap();
            values.insert(parts[1].to_owned(), String::from_utf8_lossy(&data[..data.len() - 2]).into_owned());
        }
    }
    values
}

/// 10,000 keys of `pool` set through one proxy (`round` picks which) and
/// read back through the others: `Err` names how many went elsewhere.
fn placed_alike(proxies: &[&Proxy], pool: &str, round: usize) -> Result<(), String> {
    let keys: Vec<String> = (0..10_000).map(|i| format!("{pool}:{i}")).collect();
    let writer = proxies[round % proxies.len()];
    let value = |i: usize| format!("r{round}-{i}");
    let failed = set_all(writer.pools[pool], &keys, value);
    if failed > 0 {
        return Err(format!("{failed} sets failed"));
    }
    for p in proxies {
        let got = get_all(p.pools[pool], &keys);
        let differ = keys.iter().enumerate().filter(|(i, k)| got.get(*k) != Some(&value(*i))).count();
        if differ > 0 {
            return Err(format!("{differ} of 10000 keys of pool {pool} are elsewhere through {}", p.admin));
        }
    }
    Ok(())
}

/// Seeded xorshift: the same changes on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// What the test believes a pool's members are: id, active, weight.
struct Model {
    pool: &'static str,
    anchor: bool,
    members: Vec<(String, bool, u32)>,
}

impl Model {
    /// A random change that the pool can make, as `chash config` arguments.
    fn random_change(&mut self, rng: &mut Rng, all: &[String]) -> Vec<String> {
        let active = self.members.iter().filter(|m| m.1).count();
        let mut options: Vec<Vec<String>> = Vec::new();
        for id in all.iter().filter(|id| !self.members.iter().any(|m| &m.0 == *id)) {
            options.push(vec!["add".into(), format!("{id}:1")]);
        }
        for (id, on, weight) in &self.members {
            if !*on || active > 1 {
                options.push(vec!["remove".into(), id.clone()]);
            }
            if *on && active > 1 {
                options.push(vec!["eject".into(), id.clone()]);
            }
            if !*on {
                options.push(vec!["restore".into(), id.clone()]);
            }
            if !self.anchor {
                options.push(vec!["weight".into(), id.clone(), (weight % 3 + 1).to_string()]);
            }
        }
        let change = options.swap_remove(rng.below(options.len()));
        let id = change[1].trim_end_matches(":1").to_owned();
        match change[0].as_str() {
            "add" => self.members.push((id, true, 1)),
            "remove" => self.members.retain(|m| m.0 != id),
            "eject" | "restore" => {
                let m = self.members.iter_mut().find(|m| m.0 == id).unwrap();
                m.1 = change[0] == "restore";
            }
            _ => self.members.iter_mut().find(|m| m.0 == id).unwrap().2 = change[2].parse().unwrap(),
        }
        change
    }
}

/// A TCP relay to etcd that the test can cut: one proxy's link to etcd.
struct Link {
    port: u16,
    up: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Link {
    fn start(to: u16) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let (up2, open2) = (up.clone(), open.clone());
        thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                if !up2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else { continue };
                for (a, b) in [(&client, &server), (&server, &client)] {
                    let (mut a, mut b) = (a.try_clone().unwrap(), b.try_clone().unwrap());
                    thread::spawn(move || {
                        let _ = std::io::copy(&mut a, &mut b);
                        let _ = b.shutdown(Shutdown::Both);
                        let _ = a.shutdown(Shutdown::Both);
                    });
                }
                open2.lock().unwrap().extend([client, server]);
            }
        });
        Link { port, up, open }
    }

    fn url(&self, prefix: &str) -> String {
        format!("etcd://127.0.0.1:{}/{prefix}", self.port)
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

/// Runs a Python client script of `tests/clients/` (the client libraries
/// the test command installs) with `args`; its output on failure.
fn run_client_script(script: &str, args: &[&str]) {
    let path = format!("{}/tests/clients/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(require("python3", "python3")).arg(&path).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed:\n{text}");
}

/// Waits up to `secs` for `done`, polling.
fn eventually(secs: u64, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if done() {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    panic!("not within {secs} s: {what}");
}

fn run_ok(args: &[&str]) -> String {
    let out = chash(args, b"");
    assert!(out.status.success(), "chash {args:?}: {}{}", stdout(&out), stderr(&out));
    stdout(&out)
}

fn fleet_config(servers: &[String]) -> String {
    format!(
        "# The fleet's caches, stored in etcd.\nweb:\n  listen: 127.0.0.1:22121\n  distribution: anchor\n  hash: xxh3\n  \
         servers:\n   - {}:1\n   - {}:1\n   - {}:1\npages:\n  listen: 127.0.0.1:22122\n  distribution: ring\n  \
         servers:\n   - {}:1\n   - {}:1\n   - {}:1\n",
        servers[0], servers[1], servers[2], servers[1], servers[2], servers[3]
    )
}

#[test]
fn a_fleet_on_etcd_applies_every_change_everywhere() {
    let _serial = serial();
    let dir = TempDir::new("fleet");
    let mut etcd = Etcd::start(&dir);
    let caches: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let ids: Vec<String> = caches.iter().map(Memcached::id).collect();
    let url = etcd.url("chash/test");
    let file = dir.path("fleet.yml");
    std::fs::write(&file, fleet_config(&ids)).unwrap();
    let put = run_ok(&["config", "put", "--etcd", &url, file.to_str().unwrap()]);
    assert!(put.contains("created at revision"), "{put}");

    // Three proxies from one stored config on one host; the third reaches
    // etcd through a link the test can cut.
    let link = Link::start(etcd.client);
    let pools = ["web", "pages"];
    let mut proxies = vec![
        Proxy::start(&etcd.url_after_a_dead_one("chash/test"), "p1", &dir.path("p1.cache"), &pools),
        Proxy::start(&url, "p2", &dir.path("p2.cache"), &pools),
        Proxy::start(&link.url("chash/test"), "p3", &dir.path("p3.cache"), &pools),
    ];
    eventually(20, "every proxy registered", || {
        let out = chash(&["fleet", "status", "--etcd", &url, "--max-lag", "0"], b"");
        out.status.success() && stdout(&out).contains("agree: 3 proxies")
    });

    let mut models = [
        Model { pool: "web", anchor: true, members: ids[..3].iter().map(|i| (i.clone(), true, 1)).collect() },
        Model { pool: "pages", anchor: false, members: ids[1..].iter().map(|i| (i.clone(), true, 1)).collect() },
    ];
    let mut rng = Rng(0x005e_ed17);
    let mut waits = Vec::new();
    for step in 0..30 {
        let model = &mut models[rng.below(2)];
        let pool = model.pool;
        let change = model.random_change(&mut rng, &ids);
        let mut args: Vec<&str> = vec!["config", change[0].as_str(), "--etcd", &url, "--pool", pool];
        args.extend(change[1..].iter().map(String::as_str));

        match step {
            // A proxy killed in the middle of the sequence: the change is
            // made while it is down (--wait names it), then it restarts
            // and converges.
            10 => {
                proxies[1].kill();
                args.extend(["--wait", "1"]);
                let out = chash(&args, b"");
                assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
                assert!(
                    stdout(&out).contains("lagging:") && stdout(&out).contains("p2 at revision"),
                    "{}",
                    stdout(&out)
                );
                proxies[1].spawn();
                let (_, revision, _) = stored(&url);
                eventually(20, "the restarted proxy converges", || proxies[1].revision() == revision);
            }
            // etcd stopped for 5 s under load: no request fails; the next
            // change reaches every proxy.
            15 => {
                let stop = Arc::new(AtomicBool::new(false));
                let failures = Arc::new(AtomicU64::new(0));
                let requests = Arc::new(AtomicU64::new(0));
                let loaders: Vec<_> = proxies
                    .iter()
                    .enumerate()
                    .map(|(n, p)| {
                        let addr = p.pools["web"];
                        let (stop, failures, requests) = (stop.clone(), failures.clone(), requests.clone());
                        thread::spawn(move || {
                            let keys: Vec<String> = (0..200).map(|i| format!("load{n}:{i}")).collect();
                            while !stop.load(Ordering::SeqCst) {
                                let failed = set_all(addr, &keys, |i| format!("v{i}"));
                                let got = get_all(addr, &keys);
                                let missing = keys.iter().filter(|k| !got.contains_key(*k)).count();
                                failures.fetch_add((failed + missing) as u64, Ordering::SeqCst);
                                requests.fetch_add(400, Ordering::SeqCst);
                            }
                        })
                    })
                    .collect();
                thread::sleep(Duration::from_millis(300));
                etcd.stop();
                thread::sleep(Duration::from_secs(5));
                for p in &proxies {
                    assert_eq!(p.stats()["membership"]["connected"], Value::Bool(false), "{}", p.admin);
                }
                etcd.restart();
                thread::sleep(Duration::from_millis(300));
                stop.store(true, Ordering::SeqCst);
                for l in loaders {
                    l.join().unwrap();
                }
                assert!(requests.load(Ordering::SeqCst) > 1000, "the load ran");
                assert_eq!(failures.load(Ordering::SeqCst), 0, "requests failed while etcd was down");
            }
            // Invalid YAML put with etcdctl: refused everywhere, the last
            // good config kept and the error shown; then a good one put back.
            20 => {
                let good = run_ok(&["config", "get", "--etcd", &url]);
                let before: Vec<i64> = proxies.iter().map(Proxy::revision).collect();
                assert!(etcd.ctl(&["put", "/chash/test/config", "web: [not, a, pool"]).status.success());
                for p in &proxies {
                    eventually(20, "the invalid revision is refused", || {
                        p.stats()["membership"]["invalid_revisions"].as_u64() == Some(1)
                    });
                    let m = &p.stats()["membership"];
                    let error = m["last_error"].as_str().unwrap();
                    assert!(error.contains("refused") && error.contains("revision"), "{error}");
                    // The log line reaches the test through a pipe and a
                    // reader thread: it may trail the counter under load.
                    eventually(10, "the refusal is logged", || p.logged("refused, the last good config"));
                }
                assert_eq!(proxies.iter().map(Proxy::revision).collect::<Vec<_>>(), before);
                let refs: Vec<&Proxy> = proxies.iter().collect();
                placed_alike(&refs, "web", step).unwrap();
                let status = chash(&["fleet", "status", "--etcd", &url, "--max-lag", "0.5"], b"");
                assert_eq!(status.status.code(), Some(1), "an invalid stored config: {}", stdout(&status));
                assert!(stdout(&status).contains("INVALID"), "{}", stdout(&status));
                let good_file = dir.path("good.yml");
                std::fs::write(&good_file, good).unwrap();
                run_ok(&["config", "put", "--etcd", &url, good_file.to_str().unwrap(), "--wait", "20"]);
                let metrics = {
                    let mut s = TcpStream::connect(proxies[0].admin).unwrap();
                    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
                    let mut out = String::new();
                    s.read_to_string(&mut out).unwrap();
                    out
                };
                assert!(metrics.contains("chash_membership_invalid_revisions_total{source=\"etcd\"} 1"), "{metrics}");
            }
            // Compaction while a proxy is cut off from etcd: it re-reads
            // the key when it is back.
            25 => {
                link.cut();
                thread::sleep(Duration::from_millis(500));
                run_ok(&args);
                let change2 = models[0].random_change(&mut rng, &ids);
                let mut args2: Vec<&str> = vec!["config", change2[0].as_str(), "--etcd", &url, "--pool", "web"];
                args2.extend(change2[1..].iter().map(String::as_str));
                run_ok(&args2);
                let now = etcd.revision();
                assert!(etcd.ctl(&["compact", &now.to_string()]).status.success());
                link.restore();
                let (_, revision, _) = stored(&url);
                eventually(30, "the cut-off proxy converges after compaction", || proxies[2].revision() == revision);
                eventually(10, "the compaction is logged", || proxies[2].logged("compacted"));
                let refs: Vec<&Proxy> = proxies.iter().collect();
                placed_alike(&refs, "web", step).unwrap();
                placed_alike(&refs, "pages", step).unwrap();
                continue;
            }
            _ => {}
        }

        if step == 10 {
            // The change was made above.
        } else {
            args.extend(["--wait", "20"]);
            let out = chash(&args, b"");
            assert!(out.status.success(), "step {step} {args:?}: {}{}", stdout(&out), stderr(&out));
            let said = stdout(&out);
            assert!(said.contains("applied by 3 of 3 proxies"), "{said}");
            let secs: f64 = said.split(" in ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
            waits.push(secs);
        }
        let returned = Instant::now();
        let refs: Vec<&Proxy> = proxies.iter().collect();
        let mut last = Err(String::new());
        while returned.elapsed() < Duration::from_secs(2) {
            last = placed_alike(&refs, pool, step);
            if last.is_ok() {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        last.unwrap_or_else(|e| panic!("step {step} ({args:?}): not placed alike within 2 s: {e}"));
        // Each proxy's placement is a fresh build's of the stored config
        // (its versions and fingerprints, computed by the CLI).
        let status = chash(&["fleet", "status", "--etcd", &url, "--max-lag", "10"], b"");
        assert!(status.status.success(), "step {step}: {}", stdout(&status));
    }
    let status = chash(&["fleet", "status", "--etcd", &url, "--max-lag", "5"], b"");
    assert!(status.status.success(), "{}", stdout(&status));
    // The clients people run agree too: stored through one proxy, read
    // through the two others, in both pools.
    for pool in ["web", "pages"] {
        let addrs: Vec<String> = proxies.iter().map(|p| p.pools[pool].to_string()).collect();
        let mut args = vec![pool];
        args.extend(addrs.iter().map(String::as_str));
        run_client_script("fleet_clients.py", &args);
    }
    waits.sort_by(f64::total_cmp);
    eprintln!(
        "--wait: median {:.3} s, max {:.3} s over {} changes",
        waits[waits.len() / 2],
        waits[waits.len() - 1],
        waits.len()
    );
    // A proxy that stops says so: its registration goes at once.
    let mut last = proxies.pop().unwrap();
    Command::new("kill").args(["-TERM", &last.child.as_ref().unwrap().id().to_string()]).status().unwrap();
    let _ = last.child.as_mut().unwrap().wait();
    let out = etcd.ctl(&["get", "--prefix", "--keys-only", "/chash/test/proxies/"]);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("p3"),
        "{}\n{:#?}",
        String::from_utf8_lossy(&out.stdout),
        last.log.lock().unwrap()
    );
}

#[test]
fn racing_writers_lose_nothing_silently() {
    let _serial = serial();
    let dir = TempDir::new("race");
    let etcd = Etcd::start(&dir);
    // The writers are given a dead endpoint first: they go on to the next.
    let url = etcd.url_after_a_dead_one("race");
    let file = dir.path("race.yml");
    std::fs::write(&file, "web:\n  distribution: ring\n  servers:\n   - 127.0.0.1:1:1\n").unwrap();
    run_ok(&["config", "put", "--etcd", &url, file.to_str().unwrap()]);
    let (mut told, mut retried) = (0, 0);
    let mut claimed = Vec::new();
    for round in 0..20 {
        // Both writers read the same revision before either writes (the
        // CLI's test barrier holds each one after its read until `go`
        // exists), so every round is a real race: one compare-and-swap
        // wins, the other finds the revision changed. Half the rounds
        // retry on a conflict, half do not.
        let barrier = dir.path(&format!("barrier-{round}"));
        std::fs::create_dir_all(&barrier).unwrap();
        let retry = if round % 2 == 0 { "0" } else { "5" };
        let writers: Vec<_> = [2, 3]
            .into_iter()
            .map(|host| {
                let line = format!("127.0.0.{host}:{}:1", 1000 + round);
                let (url, barrier) = (url.clone(), barrier.clone());
                thread::spawn(move || {
                    let out = Command::new(env!("CARGO_BIN_EXE_chash"))
                        .args(["config", "add", "--etcd", &url, &line, "--retry", retry])
                        .env("CHASH_TEST_EDIT_BARRIER", &barrier)
                        .stdin(Stdio::null())
                        .output()
                        .unwrap();
                    (line, out)
                })
            })
            .collect();
        let first_reads = |b: &Path| {
            std::fs::read_dir(b)
                .unwrap()
                .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with("-0"))
                .count()
        };
        eventually(30, "both writers read the config", || first_reads(&barrier) == 2);
        std::fs::write(barrier.join("go"), b"").unwrap();
        let mut won = 0;
        for w in writers {
            let (line, out) = w.join().unwrap();
            let err = stderr(&out);
            if out.status.success() {
                claimed.push(line);
                won += 1;
                retried += usize::from(err.contains("retrying (1 of 5)"));
            } else {
                assert!(err.contains("conflict:") && err.contains("--retry"), "round {round}: {err}");
                assert_eq!(retry, "0", "a writer with --retry 5 gave up: {err}");
                told += 1;
            }
        }
        assert_eq!(won, if retry == "0" { 1 } else { 2 }, "round {round}");
    }
    let stored = run_ok(&["config", "get", "--etcd", &url]);
    for line in &claimed {
        assert!(stored.contains(&format!("- {line}")), "{line} was acknowledged but is not stored:\n{stored}");
    }
    // Every race had a loser: told of the conflict (no --retry) or retried.
    assert_eq!((claimed.len(), told, retried), (30, 10, 10));
    assert_eq!(stored.matches("- 127.0.0.").count(), 1 + 30, "{stored}");
}

/// `chash config put` checks a whole file before it writes it: invalid
/// YAML and an anchor pool renumbered are refused (`--force` uploads the
/// renumbering anyway), and nothing is written meanwhile.
#[test]
fn config_put_refuses_what_a_proxy_would_refuse() {
    let _serial = serial();
    let dir = TempDir::new("put");
    let etcd = Etcd::start(&dir);
    let url = etcd.url("put");
    let file = dir.path("put.yml");
    let anchor = |servers: &[&str]| {
        let mut text = String::from("web:\n  distribution: anchor\n  servers:\n");
        for s in servers {
            text.push_str(&format!("   - {s}:1\n"));
        }
        text
    };
    std::fs::write(&file, anchor(&["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])).unwrap();
    run_ok(&["config", "put", "--etcd", &url, file.to_str().unwrap()]);
    let revision = etcd.revision();

    std::fs::write(&file, "web: [not, a, pool").unwrap();
    let out = chash(&["config", "put", "--etcd", &url, file.to_str().unwrap()], b"");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("put.yml"), "{}", stderr(&out));

    // The middle server's line deleted by hand: every later bucket moves.
    std::fs::write(&file, anchor(&["127.0.0.1:1", "127.0.0.1:3"])).unwrap();
    let out = chash(&["config", "put", "--etcd", &url, file.to_str().unwrap()], b"");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    assert_eq!(etcd.revision(), revision, "a refused put wrote nothing");

    run_ok(&["config", "put", "--etcd", &url, file.to_str().unwrap(), "--force"]);
    assert!(etcd.revision() > revision);
    assert!(!run_ok(&["config", "get", "--etcd", &url]).contains("127.0.0.1:2:1"));
}

/// The stored config as `chash config get` prints it: text, revision and
/// config hash.
fn stored(url: &str) -> (String, i64, String) {
    stored_with(url, &[])
}

/// As [`stored`], with more arguments (TLS flags).
fn stored_with(url: &str, extra: &[String]) -> (String, i64, String) {
    let mut args = vec!["config", "get", "--etcd", url];
    args.extend(extra.iter().map(String::as_str));
    let out = chash(&args, b"");
    assert!(out.status.success(), "{}", stderr(&out));
    let header = stderr(&out);
    let revision = header.split("revision ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let hash = header.split("config hash ").nth(1).unwrap().trim_end().trim_end_matches(')').to_owned();
    (stdout(&out), revision, hash)
}

/// A membership cache file's revision and body (the stored text).
fn cached(path: &Path) -> Option<(i64, String)> {
    let text = std::fs::read_to_string(path).ok()?;
    let (header, body) = text.split_once('\n')?;
    let revision = header.split(" revision ").nth(1)?.split_whitespace().next()?.parse().ok()?;
    Some((revision, body.to_owned()))
}

/// The fleet's core over TLS with client certificates (etcd started with
/// `--client-cert-auth`): a config put and a change made with `chash
/// config --etcd https://...`, two proxies following it (one given the
/// files as flags, one as environment variables) that agree and place
/// keys alike; no client certificate, a CA that is not etcd's, a
/// plaintext URL, and TLS files for a plaintext URL are refused, each
/// saying why.
#[test]
fn a_fleet_on_etcd_over_tls_with_client_certificates() {
    let _serial = serial();
    let dir = TempDir::new("tls");
    let pki = pki::Pki::new();
    let etcd = Etcd::start_with(&dir, Some(EtcdFiles::of(&pki)));
    let files = EtcdFiles::of(&pki);
    let tls = files.flags();
    let caches: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let ids: Vec<String> = caches.iter().map(Memcached::id).collect();
    let url = etcd.url("chash/tls");
    assert!(url.starts_with("https://"), "{url}");
    let file = dir.path("fleet.yml");
    std::fs::write(&file, fleet_config(&ids)).unwrap();
    let file = file.to_str().unwrap();
    let with = |args: &[&str], extra: &[String]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(extra.iter().map(String::as_str));
        chash(&all, b"")
    };

    // Refused, each with its reason, and nothing written.
    let no_client_cert = with(&["config", "put", "--etcd", &url, file], &tls[..2]);
    let other_ca = ["--etcd-ca".to_owned(), pki.path("other-ca.pem")];
    let unknown_ca = with(&["config", "put", "--etcd", &url, file], &[&other_ca[..], &tls[2..]].concat());
    let plain = url.replacen("https://", "etcd://", 1);
    let plaintext = with(&["config", "put", "--etcd", &plain, file], &[]);
    let files_for_plain = with(&["config", "put", "--etcd", &plain, file], &tls);
    let half = with(&["config", "put", "--etcd", &url, file], &tls[..4]);
    for (out, says) in [
        (&no_client_cert, "etcd refused this client's certificate, or its absence"),
        (&unknown_ca, "does not chain to --etcd-ca"),
        (&plaintext, "unreachable"),
        (&files_for_plain, "is plaintext: write https://127.0.0.1:"),
        (&half, "--etcd-cert and --etcd-key go together"),
    ] {
        assert!(!out.status.success() && stderr(out).contains(says), "{}{}", stdout(out), stderr(out));
    }
    assert!(etcd.ctl(&["get", "/chash/tls/config"]).stdout.is_empty(), "nothing was written");

    let put = with(&["config", "put", "--etcd", &url, file], &tls);
    assert!(put.status.success() && stdout(&put).contains("created at revision"), "{}{}", stdout(&put), stderr(&put));
    let pools = ["web", "pages"];
    let env = [
        ("CHASH_ETCD_CA", files.ca.as_str()),
        ("CHASH_ETCD_CERT", &files.client_cert),
        ("CHASH_ETCD_KEY", &files.client_key),
    ];
    let proxies = [
        Proxy::start_with(&url, "t1", &dir.path("t1.cache"), &pools, &tls, &[]),
        Proxy::start_with(&url, "t2", &dir.path("t2.cache"), &pools, &[], &env),
    ];
    eventually(20, "both proxies registered over TLS", || {
        let out = with(&["fleet", "status", "--etcd", &url, "--max-lag", "0"], &tls);
        out.status.success() && stdout(&out).contains("agree: 2 proxies")
    });
    assert_eq!(proxies[0].stats()["membership"]["endpoints"][0], format!("https://127.0.0.1:{}", etcd.client));

    let line = format!("{}:1", ids[3]);
    let add = with(&["config", "add", "--etcd", &url, "--pool", "web", &line, "--wait", "20"], &tls);
    assert!(add.status.success(), "{}{}", stdout(&add), stderr(&add));
    let (text, revision, _) = stored_with(&url, &tls);
    assert!(text.contains(&line), "{text}");
    for p in &proxies {
        assert_eq!(p.revision(), revision, "{} applied the change", p.admin);
    }
    let both: Vec<&Proxy> = proxies.iter().collect();
    for pool in pools {
        placed_alike(&both, pool, 1).unwrap();
    }
}

/// A proxy that starts from its cache while etcd is out of its reach
/// follows etcd once it answers: it applies the revision it missed (its
/// watch resumed from the cached revision; nothing was compacted),
/// rewrites its cache after every applied revision, and reports the stored
/// config's hash. A running proxy cut off from etcd gets the change made
/// meanwhile the same way. Killed outright (SIGKILL), it cannot withdraw
/// its registration: that goes when its lease expires.
#[test]
fn a_proxy_started_from_its_cache_catches_up() {
    let _serial = serial();
    let dir = TempDir::new("catchup");
    let etcd = Etcd::start(&dir);
    let caches: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let ids: Vec<String> = caches.iter().map(Memcached::id).collect();
    let url = etcd.url("catchup");
    let file = dir.path("catchup.yml");
    let config = format!(
        "web:\n  listen: 127.0.0.1:22121\n  distribution: ring\n  servers:\n   - {}:1\n   - {}:1\n",
        ids[0], ids[1]
    );
    std::fs::write(&file, config).unwrap();
    run_ok(&["config", "put", "--etcd", &url, file.to_str().unwrap()]);
    let link = Link::start(etcd.client);
    let cache = dir.path("p.cache");

    // First run: the config read from etcd and cached.
    let mut proxy = Proxy::start(&link.url("catchup"), "p", &cache, &["web"]);
    let (text1, r1, hash1) = stored(&url);
    eventually(10, "the cache is written", || cached(&cache).is_some_and(|c| c.0 == r1));
    assert_eq!(cached(&cache).unwrap().1, text1);
    assert_eq!(proxy.stats()["membership"]["config_hash"], Value::String(hash1.clone()));
    proxy.kill();

    // A server added while it is down; etcd out of its reach as it starts.
    run_ok(&["config", "add", "--etcd", &url, &format!("{}:1", ids[2]), "--pool", "web"]);
    let (text2, r2, hash2) = stored(&url);
    assert!(r2 > r1 && hash2 != hash1);
    link.cut();
    proxy.spawn();
    let m = proxy.stats()["membership"].clone();
    assert_eq!((m["cache_used"].clone(), m["connected"].clone()), (Value::Bool(true), Value::Bool(false)), "{m}");
    assert_eq!((m["revision"].as_i64(), m["config_hash"].as_str()), (Some(r1), Some(hash1.as_str())), "{m}");
    assert!(proxy.logged("starting from the membership cache"), "{:?}", proxy.log.lock().unwrap());
    let keys: Vec<String> = (0..500).map(|i| format!("cached:{i}")).collect();
    assert_eq!(set_all(proxy.pools["web"], &keys, |i| format!("v{i}")), 0, "it serves from the cache");

    // etcd within reach again: the missed revision applied and cached.
    link.restore();
    eventually(20, "the proxy catches up", || proxy.revision() == r2);
    let m = proxy.stats()["membership"].clone();
    assert_eq!((m["cache_used"].clone(), m["connected"].clone()), (Value::Bool(false), Value::Bool(true)), "{m}");
    assert_eq!(m["config_hash"], Value::String(hash2), "{m}");
    assert_eq!(proxy.stats()["pools"][0]["live_servers"], 3);
    eventually(10, "the cache is rewritten", || cached(&cache) == Some((r2, text2.clone())));

    // Cut off while running: the change made meanwhile arrives through the
    // resumed watch once the link is back.
    link.cut();
    eventually(20, "the proxy sees etcd gone", || proxy.stats()["membership"]["connected"] == Value::Bool(false));
    run_ok(&["config", "weight", "--etcd", &url, &ids[0], "3", "--pool", "web"]);
    let (text3, r3, _) = stored(&url);
    link.restore();
    eventually(20, "the proxy gets the change made while it was cut off", || proxy.revision() == r3);
    eventually(10, "the cache is rewritten", || cached(&cache) == Some((r3, text3.clone())));
    assert!(!proxy.logged("compacted"), "{:?}", proxy.log.lock().unwrap());

    // SIGKILL: no revoke; the lease's time to live removes the registration.
    let registered = || {
        let out = etcd.ctl(&["get", "--prefix", "--keys-only", "/catchup/proxies/"]);
        String::from_utf8_lossy(&out.stdout).contains("/catchup/proxies/p")
    };
    // Registered again after the cut (a new lease; the old one may still
    // hold the key meanwhile).
    eventually(20, "the proxy is registered again", || {
        proxy.stats()["membership"]["registered"] == Value::Bool(true) && registered()
    });
    proxy.kill();
    let killed = Instant::now();
    eventually(30, "the killed proxy's registration expires", || !registered());
    eprintln!("registration gone {:.1} s after SIGKILL", killed.elapsed().as_secs_f64());
}

/// `--listen-override` names pools of the config, each once.
#[test]
fn listen_overrides_are_checked() {
    let dir = TempDir::new("override");
    let file = dir.path("o.yml");
    std::fs::write(&file, "web:\n  listen: 127.0.0.1:0\n  servers:\n   - 127.0.0.1:1:1\n").unwrap();
    let c = file.to_str().unwrap();
    for (flags, says) in [
        (vec!["--listen-override", "nosuch=127.0.0.1:0"], "which the config does not have (it has web)"),
        (vec!["--listen-override", "web=127.0.0.1:0", "--listen-override", "web=127.0.0.1:0"], "names pool web twice"),
        (vec!["--listen-override", "web"], "write POOL=ADDR"),
    ] {
        let mut args = vec!["proxy", "-c", c, "--admin", "127.0.0.1:0", "--no-stats"];
        args.extend(flags);
        let out = chash(&args, b"");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn start_needs_etcd_or_a_cache() {
    let _serial = serial();
    let dir = TempDir::new("start");
    // Nothing listens there.
    let url = format!("etcd://127.0.0.1:{}/nowhere", free_port());
    let out = chash(&["proxy", "--membership", &url, "--admin", "127.0.0.1:0", "--no-stats"], b"");
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot start") && err.contains("--membership-cache"), "{err}");

    let bad = chash(&["proxy", "--membership", "etcd://127.0.0.1:2379", "--no-stats"], b"");
    assert!(stderr(&bad).contains("no key prefix"), "{}", stderr(&bad));

    let cache = dir.path("cache.yml");
    std::fs::write(
        &cache,
        "# chash membership cache: /nowhere/config revision 7 (config hash 0); written by the proxy after applying it\n\
         web:\n  listen: 127.0.0.1:22121\n  servers:\n   - 127.0.0.1:1:1\n",
    )
    .unwrap();
    let proxy = Proxy::start(&url, "cached", &cache, &["web"]);
    let stats = proxy.stats();
    let m = &stats["membership"];
    assert_eq!(m["cache_used"], Value::Bool(true), "{m}");
    assert_eq!(m["connected"], Value::Bool(false), "{m}");
    assert_eq!(m["revision"], 7, "{m}");
    assert_eq!(stats["pools"][0]["membership_revision"], 7);
    assert!(proxy.logged("starting from the membership cache"), "{:?}", proxy.log.lock().unwrap());
    // Membership follows etcd: the admin endpoint's changes are refused.
    for (method, path) in [("DELETE", "/pools/web/servers/127.0.0.1:1"), ("POST", "/reload")] {
        let mut s = TcpStream::connect(proxy.admin).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 409") && out.contains("--etcd"), "{method} {path}: {out}");
    }
    assert_eq!(proxy.stats()["pools"][0]["live_servers"], 1);
}
