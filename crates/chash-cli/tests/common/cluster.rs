//! Real servers and `chash proxy` processes for the Redis end-to-end
//! tests (migration, Sentinel): loopback ports, each process killed when
//! its handle drops.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::require;
use serde_json::Value;

pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn free_port() -> u16 {
    static USED: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut used = USED.lock().unwrap();
        if !used.contains(&port) {
            used.push(port);
            return port;
        }
    }
}

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("chash-migrate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A redis-server on a loopback port.
pub struct Redis {
    pub port: u16,
    pub child: Child,
    /// Its working directory, removed when dropped.
    pub dir: PathBuf,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Redis {
        for _ in 0..5 {
            let port = free_port();
            // A directory of its own: a replica writes the data it syncs
            // (dump.rdb) there, and a server loads one from its directory
            // at start; never the tests' working directory.
            let dir = std::env::temp_dir().join(format!("chash-redis-{}-{port}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let mut child = Command::new(require("redis-server", "redis-server"))
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir)
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Redis { port, child, dir };
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server did not start");
    }

    pub fn id(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn signal(&self, sig: &str) {
        assert!(Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap().success());
    }

    /// Every key on the server (SCAN to its end).
    pub fn keys(&self) -> Vec<String> {
        let mut c = Resp::connect(SocketAddr::from(([127, 0, 0, 1], self.port)));
        let mut cursor = "0".to_owned();
        let mut keys = Vec::new();
        loop {
            let reply = c.ask(&["SCAN", &cursor, "COUNT", "1000"]);
            let Reply::Array(parts) = reply else { panic!("SCAN: {reply:?}") };
            let (Reply::Bulk(next), Reply::Array(found)) = (&parts[0], &parts[1]) else { panic!("SCAN") };
            keys.extend(found.iter().map(|k| match k {
                Reply::Bulk(k) => k.clone(),
                other => panic!("{other:?}"),
            }));
            if next == "0" {
                return keys;
            }
            cursor = next.clone();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.signal_quietly("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Redis {
    pub fn signal_quietly(&self, sig: &str) -> std::io::Result<std::process::ExitStatus> {
        Command::new("kill").args([sig, &self.child.id().to_string()]).stderr(Stdio::null()).status()
    }
}

/// A RESP reply, as far as these tests read them.
#[derive(Debug)]
pub enum Reply {
    /// A simple string or an integer (not read here).
    Other,
    Bulk(String),
    Array(Vec<Reply>),
    Nil,
}

/// A small blocking RESP client.
pub struct Resp {
    pub w: TcpStream,
    pub r: BufReader<TcpStream>,
}

impl Resp {
    pub fn connect(addr: SocketAddr) -> Resp {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Resp { r: BufReader::new(s.try_clone().unwrap()), w: s }
    }

    pub fn ask(&mut self, args: &[&str]) -> Reply {
        self.ask_or_error(args).unwrap_or_else(|e| panic!("error reply: {e}"))
    }

    /// [`Resp::ask`], an error reply returned rather than a panic.
    pub fn ask_or_error(&mut self, args: &[&str]) -> Result<Reply, String> {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.w.write_all(out.as_bytes()).unwrap();
        self.read_or_error()
    }

    pub fn read(&mut self) -> Reply {
        self.read_or_error().unwrap_or_else(|e| panic!("error reply: {e}"))
    }

    fn read_or_error(&mut self) -> Result<Reply, String> {
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        let line = line.trim_end().to_owned();
        let (kind, rest) = line.split_at(1);
        Ok(match kind {
            "+" | ":" => Reply::Other,
            "-" => return Err(rest.to_owned()),
            "$" | "*" if rest == "-1" => Reply::Nil,
            "$" => {
                let n: usize = rest.parse().unwrap();
                let mut buf = vec![0; n + 2];
                self.r.read_exact(&mut buf).unwrap();
                Reply::Bulk(String::from_utf8_lossy(&buf[..n]).into_owned())
            }
            "*" => Reply::Array((0..rest.parse::<usize>().unwrap()).map(|_| self.read()).collect()),
            _ => panic!("unexpected reply {line:?}"),
        })
    }
}

/// A `chash proxy -c FILE` process, its pool on a port of its own
/// (`--listen-override`), its admin endpoint, and its log.
pub struct Proxy {
    pub args: Vec<String>,
    pub child: Option<Child>,
    pub addr: String,
    pub admin: String,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    pub fn start(config: &Path, extra: &[&str]) -> Proxy {
        Proxy::start_from(&["-c", &config.display().to_string()], extra)
    }

    /// A proxy following the config stored in etcd.
    pub fn on_etcd(url: &str, extra: &[&str]) -> Proxy {
        Proxy::start_from(&["--membership", url], extra)
    }

    pub fn start_from(source: &[&str], extra: &[&str]) -> Proxy {
        let port = free_port();
        let admin = free_port();
        let mut args: Vec<String> = vec!["proxy".into()];
        args.extend(source.iter().map(|s| s.to_string()));
        args.extend(["--listen-override".into(), format!("cache=127.0.0.1:{port}")]);
        args.extend([
            "--admin".into(),
            format!("127.0.0.1:{admin}"),
            "--no-stats".into(),
            "--threads".into(),
            "1".into(),
        ]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut proxy = Proxy {
            args,
            child: None,
            addr: format!("127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin}"),
            log: Arc::default(),
        };
        proxy.spawn();
        proxy
    }

    pub fn spawn(&mut self) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_chash"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                log.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("the proxy announces its admin endpoint: {:?}", self.log.lock().unwrap()));
            if line.contains("admin on http://") {
                break;
            }
        }
        self.child = Some(child);
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
    }

    /// The pool's `/stats` object.
    pub fn pool(&self) -> Value {
        let authority = self.admin.trim_start_matches("http://");
        let mut s = TcpStream::connect(authority).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET /stats HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let v: Value = serde_json::from_str(out.split_once("\r\n\r\n").unwrap().1).unwrap();
        v["pools"][0].clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn chash(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_chash")).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chash {args:?}: {text}");
    text
}

pub fn chash_fails(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_chash")).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "chash {args:?} should fail: {text}");
    text
}

pub fn eventually(secs: u64, what: &str, done: impl FnMut() -> bool) {
    eventually_or(secs, what, done, String::new);
}

/// As [`eventually`]; on failure the panic also says what `state` says
/// (the proxies' status and logs).
pub fn eventually_or(secs: u64, what: &str, mut done: impl FnMut() -> bool, state: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        if Instant::now() >= deadline {
            panic!("not within {secs} s: {what}\n{}", state());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each proxy's pool status (migration numbers) and the last lines of its
/// log, for a failing test's message.
pub fn describe(proxies: &[&Proxy]) -> String {
    let mut out = String::new();
    for p in proxies {
        let pool = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.pool())).unwrap_or_default();
        let status: serde_json::Map<String, Value> = pool
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(k, _)| k.starts_with("migration") || k.as_str() == "membership_version")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        out.push_str(&format!("proxy {} ({}): {}\n", p.addr, p.admin, Value::Object(status)));
        let log = p.log.lock().unwrap();
        for line in &log[log.len().saturating_sub(40)..] {
            out.push_str(&format!("  | {line}\n"));
        }
    }
    out
}

/// A single-member etcd on loopback ports, stopped when dropped.
pub struct Etcd {
    pub client: u16,
    pub child: Child,
}

impl Etcd {
    pub fn start(dir: &TempDir) -> Etcd {
        for attempt in 0..3 {
            let (client, peer) = (free_port(), free_port());
            let data = dir.path(&format!("etcd-{attempt}"));
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let mut child = Command::new(require("etcd", "etcd-server"))
                .args(["--name", "m", "--data-dir"])
                .arg(&data)
                .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("m={peer_url}")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
                let ready = Command::new(require("etcdctl", "etcd-client"))
                    .env("ETCDCTL_API", "3")
                    .args(["--endpoints", &format!("127.0.0.1:{client}"), "--command-timeout", "2s", "get", "/r"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .unwrap();
                if ready.success() {
                    return Etcd { client, child };
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("etcd did not start after 3 tries");
    }

    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}/chash/migrate", self.client)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `chash ARGS`: its exit success and what it printed.
pub fn chash_status(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_chash")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}
