//! `chash proxy` as a process: the embedded default, SIGHUP reloads and
//! graceful shutdown on SIGTERM. Every process started here is stopped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running `chash proxy` with the addresses it announced.
struct ProxyProcess {
    child: Child,
    listen: SocketAddr,
    admin: SocketAddr,
}

impl ProxyProcess {
    fn start(args: &[&str]) -> ProxyProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_chash"))
            .arg("proxy")
            .args(["--admin", "127.0.0.1:0", "-a", "127.0.0.1"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (mut listen, mut admin) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(10);
        while listen.is_none() || admin.is_none() {
            let line =
                rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("proxy announces itself");
            if let Some(rest) = line.split("serving memcached on ").nth(1) {
                listen = Some(rest.trim().parse().unwrap());
            }
            if let Some(rest) = line.split("admin on http://").nth(1) {
                admin = Some(rest.split_whitespace().next().unwrap().parse().unwrap());
            }
        }
        ProxyProcess { child, listen: listen.unwrap(), admin: admin.unwrap() }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap().success();
        assert!(ok);
    }

    fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("chash proxy did not exit within {within:?}");
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn talk(addr: SocketAddr, request: &[u8], reply_lines: usize) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut r = BufReader::new(s);
    let mut out = String::new();
    for _ in 0..reply_lines {
        r.read_line(&mut out).unwrap();
    }
    out
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn embedded_default_serves_and_stops_gracefully() {
    let mut proxy = ProxyProcess::start(&["--listen", "127.0.0.1:0", "-s", "0"]);
    let reply = talk(proxy.listen, b"set greeting 0 0 5\r\nhello\r\nget greeting\r\n", 4);
    assert_eq!(reply, "STORED\r\nVALUE greeting 0 5\r\nhello\r\nEND\r\n");
    let stats = http_get(proxy.admin, "/pools");
    assert!(stats.contains("shard-a") && stats.contains("shard-c"), "{stats}");
    // A client with requests in flight when SIGTERM arrives still gets its replies.
    let mut s = TcpStream::connect(proxy.listen).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut batch = Vec::new();
    for i in 0..200 {
        batch.extend_from_slice(format!("set k{i} 0 0 1\r\nx\r\n").as_bytes());
    }
    s.write_all(&batch).unwrap();
    proxy.signal("-TERM");
    let mut r = BufReader::new(s);
    let mut stored = 0;
    let mut line = String::new();
    while r.read_line(&mut line).unwrap_or(0) > 0 {
        if line == "STORED\r\n" {
            stored += 1;
        }
        line.clear();
    }
    assert!(stored > 0, "the in-flight batch was answered before the close");
    assert_eq!(proxy.wait_exit(Duration::from_secs(10)), Some(0));
}

#[test]
fn sighup_reloads_the_config() {
    // The backends are two more `chash proxy` embedded defaults: any server
    // speaking memcached will do, and these need nothing installed.
    let backend_a = ProxyProcess::start(&["--listen", "127.0.0.1:0", "-s", "0"]);
    let backend_b = ProxyProcess::start(&["--listen", "127.0.0.1:0", "-s", "0"]);
    let dir = std::env::temp_dir().join(format!("chash-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("proxy.yml");
    let yml = |servers: &[SocketAddr]| {
        let mut y = "alpha:\n  listen: 127.0.0.1:0\n  distribution: ring\n  servers:\n".to_owned();
        for s in servers {
            y.push_str(&format!("   - {s}:1\n"));
        }
        y
    };
    std::fs::write(&path, yml(&[backend_a.listen])).unwrap();
    let mut proxy = ProxyProcess::start(&["-c", path.to_str().unwrap(), "-s", "0"]);
    assert_eq!(talk(proxy.listen, b"set a 0 0 1\r\n1\r\n", 1), "STORED\r\n");
    std::fs::write(&path, yml(&[backend_a.listen, backend_b.listen])).unwrap();
    proxy.signal("-HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pools = http_get(proxy.admin, "/pools");
        if pools.contains(&backend_b.listen.to_string()) {
            break;
        }
        assert!(Instant::now() < deadline, "SIGHUP did not add the server: {pools}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A broken file is reported and changes nothing; the proxy keeps serving.
    std::fs::write(&path, "alpha: [").unwrap();
    proxy.signal("-HUP");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(talk(proxy.listen, b"set b 0 0 1\r\n2\r\n", 1), "STORED\r\n");
    proxy.signal("-INT");
    assert_eq!(proxy.wait_exit(Duration::from_secs(10)), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn test_conf_checks_a_file() {
    let dir = std::env::temp_dir().join(format!("chash-tconf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.yml");
    std::fs::write(&good, "alpha:\n  listen: 127.0.0.1:22121\n  servers:\n   - 127.0.0.1:11211:1\n").unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_chash")).args(["proxy", "-t", "-c", good.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("syntax is ok"));
    let bad = dir.join("bad.yml");
    std::fs::write(&bad, "alpha:\n  listen: 127.0.0.1:22121\n  colour: red\n  servers:\n   - 127.0.0.1:11211:1\n")
        .unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_chash")).args(["proxy", "-t", "-c", bad.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("colour"));
    let _ = std::fs::remove_dir_all(&dir);
}
