//! Test support: real memcached (and nutcracker) processes on loopback
//! ports, the proxy in its own runtime, and a small blocking client.
//! Every process started here is killed when its handle drops.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// A port nothing listens on right now, never handed out before in this
/// process (tests run in parallel threads: two servers must not race for one
/// port).
pub fn free_port() -> u16 {
    static USED: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if USED.lock().unwrap().insert(port) {
            return port;
        }
    }
}

/// Starts a server on a fresh port (`command(port)`), waits until it accepts
/// connections, and makes sure it is this child that does (a child that
/// failed to bind is retried on another port).
pub fn spawn_server(mut command: impl FnMut(u16) -> Command) -> (u16, Child) {
    for _ in 0..5 {
        let port = free_port();
        let mut child = command(port).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("server starts");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut up = false;
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                up = true;
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        thread::sleep(Duration::from_millis(30));
        if up && child.try_wait().ok().flatten().is_none() {
            return (port, child);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("could not start a server after 5 tries");
}

fn which(program: &str) -> Option<String> {
    for dir in std::env::var("PATH").unwrap_or_default().split(':').chain(["/usr/sbin", "/usr/bin", "/sbin"]) {
        let p = format!("{dir}/{program}");
        if std::path::Path::new(&p).exists() {
            return Some(p);
        }
    }
    None
}

/// The path of a program the tests need; scripts/test installs them.
pub fn require(program: &str, package: &str) -> String {
    which(program).unwrap_or_else(|| {
        panic!("{program} is not installed: run scripts/test as root (it installs the Debian package {package}), or apt-get install {package}")
    })
}

/// Waits until something accepts on `port` (at most 5 s).
pub fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
    panic!("nothing listens on 127.0.0.1:{port} after 5 s");
}

/// A memcached process on a loopback port.
pub struct Memcached {
    pub port: u16,
    child: Option<Child>,
}

impl Memcached {
    fn command(port: u16) -> Command {
        Memcached::command_with_memory(port, 32)
    }

    fn command_with_memory(port: u16, mib: u32) -> Command {
        let mut c = Command::new(require("memcached", "memcached"));
        c.args([
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-m",
            &mib.to_string(),
            "-u",
            "root",
            "-t",
            "1",
        ]);
        c
    }

    pub fn start() -> Memcached {
        let (port, child) = spawn_server(Memcached::command);
        Memcached { port, child: Some(child) }
    }

    /// With `mib` MiB of item memory (32 otherwise).
    pub fn start_with_memory(mib: u32) -> Memcached {
        let (port, child) = spawn_server(|port| Memcached::command_with_memory(port, mib));
        Memcached { port, child: Some(child) }
    }

    /// On a given port (a restart): the port is this test's already.
    pub fn start_on(port: u16) -> Memcached {
        let child =
            Memcached::command(port).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("memcached starts");
        wait_listening(port);
        Memcached { port, child: Some(child) }
    }

    pub fn id(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the process (as a crash would).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the process for `d` (SIGSTOP, then SIGCONT), as a stalled
    /// server would; returns at once.
    pub fn pause(&self, d: Duration) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill").args(["-STOP", &pid]).status().unwrap();
        assert!(status.success());
        // The stop takes effect as each thread next runs: wait until every
        // thread is stopped, so that nothing is answered before the pause.
        let stopped = || {
            std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten().all(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                // The state follows the command name's closing parenthesis.
                stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while !stopped() && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        thread::spawn(move || {
            thread::sleep(d);
            let _ = Command::new("kill").args(["-CONT", &pid]).status();
        });
    }

    /// Starts it again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        *self = Memcached::start_on(self.port);
    }

    /// Which of `keys` this server holds (one connection, pipelined gets).
    pub fn holds_each(&self, keys: &[String]) -> Vec<bool> {
        let mut c = Client::connect(SocketAddr::from(([127, 0, 0, 1], self.port)));
        let mut batch = Vec::new();
        for k in keys {
            batch.extend_from_slice(format!("get {k}\r\n").as_bytes());
        }
        c.send(&batch);
        keys.iter().map(|_| !c.read_get_reply().is_empty()).collect()
    }

    /// Whether this server holds `key`.
    pub fn holds(&self, key: &str) -> bool {
        let mut c = Client::connect(SocketAddr::from(([127, 0, 0, 1], self.port)));
        c.send(format!("get {key}\r\n").as_bytes());
        let reply = c.read_get_reply();
        !reply.is_empty()
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Four memcached servers.
pub fn memcacheds(n: usize) -> Vec<Memcached> {
    (0..n).map(|_| Memcached::start()).collect()
}

/// A twemproxy-shaped config for the servers, listening on port 0 (the
/// proxy's bound address is read back from it).
/// Servers are named `s1`, `s2`, ...: twemproxy's distributions (`ketama`,
/// the default, and `modula`) place keys by the name, so where a key goes
/// does not depend on which ports were drawn.
pub fn config(pool_extra: &str, servers: &[&Memcached]) -> String {
    let mut yml = format!("alpha:\n  listen: 127.0.0.1:0\n{pool_extra}  servers:\n");
    for (i, s) in servers.iter().enumerate() {
        yml.push_str(&format!("   - {}:{} s{}\n", s.id(), 1 + i % 2, i + 1));
    }
    yml
}

/// A `distribution: ring` (xxh3) pool of `servers` with `extra` pool keys.
/// Servers are named `s1`, `s2`, ... and the ring's points are labelled by
/// name (`point_label`), so where a key goes does not depend on which ports
/// were drawn (tests still read it from the library's placement).
pub fn ring_config(extra: &str, servers: &[&Memcached]) -> String {
    let mut yml = format!(
        "alpha:\n  listen: 127.0.0.1:0\n  distribution: ring\n  hash: xxh3\n  point_label: \"{{name}}#{{i}}\"\n{extra}  servers:\n"
    );
    for (i, s) in servers.iter().enumerate() {
        yml.push_str(&format!("   - {}:1 s{}\n", s.id(), i + 1));
    }
    yml
}

/// A real twemproxy (Debian's nutcracker) on loopback ports, from a YAML
/// config whose first `listen:` line is replaced with its own port.
pub struct Nutcracker {
    pub port: u16,
    pub stats_port: u16,
    child: Child,
    dir: std::path::PathBuf,
}

impl Nutcracker {
    /// Starts it with `-i interval_ms` (stats aggregation). nutcracker
    /// refuses `listen: HOST:0` (its config check wants a port from 1), so
    /// its ports are drawn here, and a start that lost a port to another
    /// process is made again on others ([`spawn_server`]).
    pub fn start(yml: &str, interval_ms: u64) -> Nutcracker {
        let nutcracker = require("nutcracker", "nutcracker");
        let (stats_port, dir) = (std::cell::Cell::new(0), std::cell::RefCell::new(std::path::PathBuf::new()));
        let (port, child) = spawn_server(|port| {
            stats_port.set(free_port());
            let mut lines: Vec<String> = yml.lines().map(str::to_owned).collect();
            if let Some(l) = lines.iter_mut().find(|l| l.trim_start().starts_with("listen:")) {
                *l = format!("  listen: 127.0.0.1:{port}");
            }
            // A failed attempt's directory goes with it.
            let _ = std::fs::remove_dir_all(&*dir.borrow());
            let d = std::env::temp_dir().join(format!("chash-nc-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            let conf = d.join("nutcracker.yml");
            std::fs::write(&conf, lines.join("\n") + "\n").unwrap();
            let mut command = Command::new(&nutcracker);
            command
                .args(["-c", conf.to_str().unwrap(), "-s", &stats_port.get().to_string(), "-a", "127.0.0.1"])
                .args(["-i", &interval_ms.to_string()])
                .args(["-o", d.join("nc.log").to_str().unwrap(), "-p", d.join("nc.pid").to_str().unwrap()]);
            *dir.borrow_mut() = d;
            command
        });
        wait_listening(stats_port.get());
        Nutcracker { port, stats_port: stats_port.get(), child, dir: dir.into_inner() }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

impl Drop for Nutcracker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Everything a stats port sends (it closes after the document).
pub fn read_stats_port(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A redis-server on a loopback port.
pub struct Redis {
    pub port: u16,
    password: Option<String>,
    child: Option<Child>,
}

impl Redis {
    fn command(port: u16, password: Option<&str>) -> Command {
        let mut args = vec!["--port".to_owned(), port.to_string(), "--bind".into(), "127.0.0.1".into()];
        args.extend(["--save", "", "--appendonly", "no", "--daemonize", "no"].map(String::from));
        if let Some(pw) = password {
            args.extend(["--requirepass".to_owned(), pw.to_owned()]);
        }
        let mut c = Command::new(require("redis-server", "redis-server"));
        c.args(&args);
        c
    }

    pub fn start(password: Option<&str>) -> Redis {
        let (port, child) = spawn_server(|p| Redis::command(p, password));
        Redis { port, password: password.map(str::to_owned), child: Some(child) }
    }

    /// With more arguments (ACL users: `--user NAME on >PW ...`).
    pub fn start_with(extra: &[&str]) -> Redis {
        let (port, child) = spawn_server(|p| {
            let mut c = Redis::command(p, None);
            c.args(extra);
            c
        });
        Redis { port, password: None, child: Some(child) }
    }

    /// On a given port (a restart): the port is this test's already.
    pub fn start_on(port: u16, password: Option<&str>) -> Redis {
        let child = Redis::command(port, password).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        wait_listening(port);
        Redis { port, password: password.map(str::to_owned), child: Some(child) }
    }

    pub fn id(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        let pw = self.password.clone();
        *self = Redis::start_on(self.port, pw.as_deref());
    }

    /// The password the server wants, if any.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The proxy running in its own runtime on a background thread.
pub struct Proxy {
    pub addr: SocketAddr,
    /// The first pool's TLS address, if it serves TLS.
    pub tls: Option<SocketAddr>,
    pub admin: SocketAddr,
    pub stats: Option<SocketAddr>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
    pub handle: std::sync::Arc<chash_proxy::Registry>,
}

impl Proxy {
    pub fn start(yaml: &str) -> Proxy {
        Proxy::start_with(yaml, chash_proxy::ProxyOptions::default(), None)
    }

    pub fn start_with(yaml: &str, mut options: chash_proxy::ProxyOptions, path: Option<std::path::PathBuf>) -> Proxy {
        let config = chash::config::Config::from_yaml(yaml).unwrap();
        let pools: Vec<_> = config
            .pools
            .iter()
            .map(|(n, _)| chash_proxy::PoolSpec {
                config: config.pool(Some(n)).unwrap(),
                addresses: Default::default(),
            })
            .collect();
        options.admin_addr = Some("127.0.0.1:0".parse().unwrap());
        options.config_path = path;
        // As `chash proxy` runs: client and backend connections on worker
        // threads (two, so that requests and membership changes cross them).
        options.threads.get_or_insert(2);
        let (tx, rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let thread = thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(async move {
                let running = chash_proxy::start(pools, options).await.expect("proxy starts");
                tx.send((
                    running.listeners()[0].1,
                    running.tls_listeners().first().map(|l| l.1),
                    running.admin().unwrap(),
                    running.stats(),
                    running.registry().clone(),
                ))
                .unwrap();
                tokio::task::spawn_blocking(move || {
                    let _ = stop_rx.recv();
                })
                .await
                .unwrap();
                running.shutdown().await;
            });
        });
        let (addr, tls, admin, stats, handle) = rx.recv_timeout(Duration::from_secs(10)).expect("proxy started");
        Proxy { addr, tls, admin, stats, stop: Some(stop_tx), thread: Some(thread), handle }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    /// An admin HTTP request; returns (status, body).
    pub fn admin(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        http(self.admin, method, path, body)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One HTTP/1.1 request with `Connection: close`.
pub fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// A blocking memcached ASCII client with a 10 s read timeout.
pub struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        Client { r: BufReader::new(s.try_clone().unwrap()), w: s }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.w.write_all(bytes).unwrap();
    }

    /// One reply line, with its CRLF.
    pub fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        l
    }

    /// Sends a command and returns its one-line reply.
    pub fn cmd(&mut self, command: &str) -> String {
        self.send(command.as_bytes());
        self.line()
    }

    /// Reads `VALUE` blocks up to `END`: `(key, flags, data, cas)`; an error
    /// line panics.
    pub fn read_get_reply(&mut self) -> Vec<(String, u32, Vec<u8>, Option<u64>)> {
        let mut out = Vec::new();
        loop {
            let line = self.line();
            if line == "END\r\n" {
                return out;
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(w.first(), Some(&"VALUE"), "unexpected line {line:?}");
            let len: usize = w[3].parse().unwrap();
            let mut data = vec![0u8; len + 2];
            self.r.read_exact(&mut data).unwrap();
            data.truncate(len);
            out.push((w[1].to_owned(), w[2].parse().unwrap(), data, w.get(4).map(|c| c.parse().unwrap())));
        }
    }

    pub fn set(&mut self, key: &str, value: &[u8]) -> String {
        let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        self.send(&req);
        self.line()
    }

    pub fn into_stream(self) -> TcpStream {
        self.w
    }

    /// The values of `keys` (`None` for a miss), by multi-key gets of a
    /// hundred keys each.
    pub fn get_each(&mut self, keys: &[String]) -> Vec<Option<Vec<u8>>> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(100) {
            self.send(format!("get {}\r\n", chunk.join(" ")).as_bytes());
            let mut found: std::collections::HashMap<String, Vec<u8>> =
                self.read_get_reply().into_iter().map(|(k, _, v, _)| (k, v)).collect();
            out.extend(chunk.iter().map(|k| found.remove(k)));
        }
        out
    }

    pub fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        self.send(format!("get {key}\r\n").as_bytes());
        self.read_get_reply().pop().map(|v| v.2)
    }
}

/// Runs a Python client script of `tests/clients/` with `args`; fails the
/// test with what it printed unless it exits 0.
pub fn run_script(script: &str, args: &[&str]) {
    let python = require("python3", "python3");
    let path = format!("{}/tests/clients/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python).arg(&path).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed:\n{text}");
}

/// RESP commands on one plaintext connection, in turn: each reply's first
/// line (and a bulk's value), line ends trimmed.
pub fn redis_session(addr: SocketAddr, commands: &[&[&str]]) -> Vec<String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut replies = Vec::new();
    for args in commands {
        let mut out = format!("*{}\r\n", args.len());
        for a in *args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(out.as_bytes()).unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line.starts_with('$') && !line.starts_with("$-1") {
            let mut value = String::new();
            r.read_line(&mut value).unwrap();
            replies.push(value.trim_end().to_owned());
        } else {
            replies.push(line.trim_end().to_owned());
        }
    }
    replies
}
