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
    // Accepted and served first (on a busy machine the signal could
    // otherwise come before the proxy accepts the connection at all).
    s.write_all(b"get nothing\r\n").unwrap();
    let mut end = [0u8; 5];
    std::io::Read::read_exact(&mut s, &mut end).unwrap();
    assert_eq!(&end, b"END\r\n");
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
    // A server line without a weight reads as a host without a port: refused.
    let no_weight = dir.join("no-weight.yml");
    std::fs::write(&no_weight, "alpha:\n  listen: 127.0.0.1:22121\n  servers:\n   - 127.0.0.1:21211\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_chash"))
        .args(["proxy", "-t", "-c", no_weight.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("HOST:PORT:WEIGHT") && err.contains("127.0.0.1:21211"), "{err}");
    // An anchor pool far smaller than its capacity: valid, with advice.
    for (capacity, advised) in [("", true), ("  anchor_capacity: 16\n", false)] {
        let anchor = dir.join("anchor.yml");
        let servers = "   - 127.0.0.1:11211:1\n   - 127.0.0.1:11212:1\n   - 127.0.0.1:11213:1\n";
        std::fs::write(
            &anchor,
            format!("alpha:\n  listen: 127.0.0.1:22121\n  distribution: anchor\n{capacity}  servers:\n{servers}"),
        )
        .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_chash"))
            .args(["proxy", "-t", "-c", anchor.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err.contains("anchor_capacity 1024 for 3 servers: a lookup re-draws about 5.8 times"),
            advised,
            "{err}"
        );
    }
    // TLS files are read: one that does not exist is named, with why.
    let tls = dir.join("tls.yml");
    let missing = dir.join("missing.pem");
    std::fs::write(
        &tls,
        format!(
            "alpha:\n  listen: 127.0.0.1:22121\n  tls_cert: {0}\n  tls_key: {0}\n  servers:\n   - 127.0.0.1:11211:1\n",
            missing.display()
        ),
    )
    .unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_chash")).args(["proxy", "-t", "-c", tls.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tls_cert") && err.contains("missing.pem"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A temporary directory, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("chash-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits (at most 10 s) until `file` holds `text` `times` times.
fn wait_for_log(file: &std::path::Path, text: &str, times: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(file).unwrap_or_default();
        if log.matches(text).count() >= times {
            return log;
        }
        assert!(Instant::now() < deadline, "{} never showed {text:?} {times} times:\n{log}", file.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `-o` logs to a file that SIGHUP reopens (logrotate moves it, then
/// signals), `-p` writes the pid and removes it on exit, SIGTTIN/SIGTTOU
/// move the log level by one, SIGUSR1/SIGUSR2 are ignored (SIGUSR1 used to
/// kill the proxy).
#[test]
fn log_file_pid_file_and_signals() {
    let dir = TempDir::new("signals");
    let (log, rotated, pid) = (dir.path("proxy.log"), dir.path("proxy.log.1"), dir.path("proxy.pid"));
    let mut proxy = ProxyProcess::start(&[
        "--listen",
        "127.0.0.1:0",
        "-s",
        "0",
        "-v",
        "5",
        "-o",
        log.to_str().unwrap(),
        "-p",
        pid.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read_to_string(&pid).unwrap().trim(), proxy.child.id().to_string());
    wait_for_log(&log, "serving memcached", 1);
    for sig in ["-USR1", "-USR2"] {
        proxy.signal(sig);
    }
    wait_for_log(&log, "signal 12 (SIGUSR2) received: ignored", 1);
    assert_eq!(talk(proxy.listen, b"version\r\n", 1).split_whitespace().next(), Some("VERSION"));
    // Every handled signal is logged by name, at warning level: at level
    // 4 too (twemproxy's test_signal greps for TTIN).
    proxy.signal("-TTOU");
    wait_for_log(&log, "signal 22 (SIGTTOU) received: log level down, 5 -> 4", 1);
    proxy.signal("-HUP");
    wait_for_log(&log, "signal 1 (SIGHUP) received: reopening the log file (no config file to reload)", 1);
    proxy.signal("-TTIN");
    wait_for_log(&log, "signal 21 (SIGTTIN) received: log level up, 4 -> 5", 1);
    // logrotate: move the file, then SIGHUP; later lines go to a new file.
    std::fs::rename(&log, &rotated).unwrap();
    proxy.signal("-HUP");
    wait_for_log(&rotated, "(SIGHUP) received", 1);
    proxy.signal("-TTIN");
    wait_for_log(&log, "signal 21 (SIGTTIN) received: log level up, 5 -> 6", 1);
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert_eq!(old.matches("(SIGHUP) received").count(), 2, "both SIGHUPs end up in the rotated file:\n{old}");
    proxy.signal("-TERM");
    assert_eq!(proxy.wait_exit(Duration::from_secs(10)), Some(0));
    assert!(!pid.exists(), "the pid file is removed on exit");
    wait_for_log(&log, "signal 15 (SIGTERM) received: stopping", 1);
    wait_for_log(&log, "stopped", 1);
}

/// SIGSEGV is not swallowed: the process dies of it (and can dump core).
#[test]
fn sigsegv_is_not_swallowed() {
    use std::os::unix::process::ExitStatusExt;
    let mut proxy = ProxyProcess::start(&["--listen", "127.0.0.1:0", "-s", "0"]);
    proxy.signal("-SEGV");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = proxy.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still running after SIGSEGV");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.signal(), Some(11), "{status:?}");
}

/// The pid of a process that is still running (not a zombie).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// `-d` returns once the proxy serves, leaving it running in the
/// background with its pid in the pid file; a start-up error is reported
/// by the command itself.
#[test]
fn daemonize_returns_once_serving() {
    let dir = TempDir::new("daemon");
    let (log, pid) = (dir.path("proxy.log"), dir.path("proxy.pid"));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let out = Command::new(env!("CARGO_BIN_EXE_chash"))
        .args(["proxy", "-d", "--listen", &listen, "--admin", "127.0.0.1:0", "-s", "0", "-a", "127.0.0.1"])
        .args(["-o", log.to_str().unwrap(), "-p", pid.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let daemon = std::fs::read_to_string(&pid).unwrap().trim().to_owned();
    assert!(running(&daemon));
    // Serving already: no wait.
    let addr: SocketAddr = listen.parse().unwrap();
    assert_eq!(talk(addr, b"set d 0 0 1\r\n1\r\n", 1), "STORED\r\n");
    assert!(Command::new("kill").args(["-TERM", &daemon]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while running(&daemon) || pid.exists() {
        assert!(Instant::now() < deadline, "the daemon did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for_log(&log, "stopped", 1);
    // A start-up error comes back to the command.
    let bad = dir.path("bad.yml");
    std::fs::write(&bad, "alpha:\n  listen: 127.0.0.1:1\n  colour: red\n  servers:\n   - 127.0.0.1:11211:1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_chash"))
        .args(["proxy", "-d", "-c", bad.to_str().unwrap(), "--admin", "127.0.0.1:0", "-s", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("colour"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// nutcracker's other flags: `-D` describes the stats fields, `-m` is
/// accepted within nutcracker's bounds, `-V` prints the version.
#[test]
fn describe_stats_mbuf_and_version() {
    let chash = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_chash")).arg("proxy").args(args).output().unwrap();
    let out = chash(&["-D"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for field in ["pool stats:", "client_eof", "forward_error", "server stats:", "server_ejected_at", "out_queue_bytes"]
    {
        assert!(text.contains(field), "{field} missing:\n{text}");
    }
    let dir = TempDir::new("flags");
    let good = dir.path("good.yml");
    std::fs::write(&good, "alpha:\n  listen: 127.0.0.1:22121\n  servers:\n   - 127.0.0.1:11211:1\n").unwrap();
    assert!(chash(&["-m", "16384", "-t", "-c", good.to_str().unwrap()]).status.success());
    let out = chash(&["-m", "100", "-t", "-c", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("512"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = chash(&["-V"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

/// Debian's systemd unit for nutcracker runs chash with only the binary's
/// path changed (a `nutcracker` symlink to chash): the unit's ExecStart
/// with its $DAEMON_OPTS, logrotate's move-and-SIGHUP, and systemd's
/// SIGTERM on stop.
#[test]
fn debian_nutcracker_unit_runs_with_the_path_changed() {
    let unit_file = "/lib/systemd/system/nutcracker.service";
    let unit = std::fs::read_to_string(unit_file)
        .unwrap_or_else(|e| panic!("{unit_file}: {e} (scripts/test installs Debian's nutcracker package)"));
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
    assert!(unit.contains("EnvironmentFile=-/etc/default/nutcracker"), "{unit}");
    let dir = TempDir::new("unit");
    let nutcracker = dir.path("nutcracker");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_chash"), &nutcracker).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let stats = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // The backend: an embedded shard of another chash proxy.
    let backend = ProxyProcess::start(&["--listen", "127.0.0.1:0", "-s", "0"]);
    let conf = dir.path("nutcracker.yml");
    std::fs::write(&conf, format!("alpha:\n  listen: 127.0.0.1:{port}\n  servers:\n   - {}:1\n", backend.listen))
        .unwrap();
    let log = dir.path("nutcracker.log");
    // /etc/default/nutcracker, as an operator writes it for nutcracker.
    let daemon_opts = format!("-c {} -o {} -s {stats} -a 127.0.0.1 -v 6", conf.display(), log.display());
    // systemd: $DAEMON_OPTS is split on whitespace.
    let argv: Vec<String> = exec
        .split_whitespace()
        .flat_map(|w| match w {
            "$DAEMON_OPTS" => daemon_opts.split_whitespace().map(str::to_owned).collect(),
            "/usr/sbin/nutcracker" => vec![nutcracker.to_str().unwrap().to_owned()],
            other => vec![other.to_owned()],
        })
        .collect();
    assert_eq!(argv[0], nutcracker.to_str().unwrap(), "ExecStart names /usr/sbin/nutcracker: {exec}");
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _stop = KillOnDrop(child.id());
    wait_for_log(&log, "serving memcached", 1);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert_eq!(talk(addr, b"set u 0 0 1\r\n1\r\n", 1), "STORED\r\n");
    let mut doc = String::new();
    TcpStream::connect(("127.0.0.1", stats)).unwrap().read_to_string(&mut doc).unwrap();
    assert!(doc.starts_with("{\"service\":") && doc.contains("\"alpha\": {"), "{doc}");
    // logrotate: move, then the reload (SIGHUP).
    std::fs::rename(&log, dir.path("nutcracker.log.1")).unwrap();
    assert!(Command::new("kill").args(["-HUP", &child.id().to_string()]).status().unwrap().success());
    wait_for_log(&dir.path("nutcracker.log.1"), "(SIGHUP) received", 1);
    assert_eq!(talk(addr, b"get u\r\n", 3), "VALUE u 0 1\r\n1\r\nEND\r\n");
    // systemctl stop: SIGTERM, then a clean exit.
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    wait_for_log(&log, "stopped", 1);
}

/// Kills a process by pid when dropped (a test that fails midway).
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-KILL", &self.0.to_string()]).status();
    }
}

/// One HTTP/1.1 request: (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &str, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}

/// A pool's `membership_version` in a proxy's /stats.
fn version_of(admin: SocketAddr) -> String {
    let (_, body) = http(admin, "GET", "/stats", "", None);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["pools"][0]["membership_version"].as_str().unwrap().to_owned()
}

/// Three proxies started from one file, each changed differently through
/// its admin endpoint with `--persist` (changes that end the same):
/// their files converge to the same content, comments kept; restarted from
/// their files they agree (`chash fleet check` exits 0, also against the
/// file); a proxy run from another file is named, exit 1.
#[test]
fn a_fleet_with_persisted_changes_agrees() {
    let dir = TempDir::new("fleet");
    let yml =
        "# The web tier's caches.\nweb:\n  listen: 127.0.0.1:0\n  distribution: ring\n  hash: xxh3\n  servers:\n   \
               - 127.0.0.1:41001:1 a   # rack 1\n   - 127.0.0.1:41002:1 b\n   - 127.0.0.1:41003:1 c\n";
    let files: Vec<std::path::PathBuf> = (0..3).map(|i| dir.path(&format!("p{i}.yml"))).collect();
    for f in &files {
        std::fs::write(f, yml).unwrap();
    }
    let start = |f: &std::path::Path| ProxyProcess::start(&["-c", f.to_str().unwrap(), "--persist", "-s", "0"]);
    let proxies: Vec<ProxyProcess> = files.iter().map(|f| start(f)).collect();
    let changes: [&[(&str, &str, &str)]; 3] = [
        &[("DELETE", "/pools/web/servers/127.0.0.1:41002", ""), ("POST", "/pools/web/servers", "127.0.0.1:41004:2 d")],
        &[("POST", "/pools/web/servers", "127.0.0.1:41004:2 d"), ("DELETE", "/pools/web/servers/127.0.0.1:41002", "")],
        &[
            ("POST", "/pools/web/servers/127.0.0.1:41003/eject", ""),
            ("POST", "/pools/web/servers", "127.0.0.1:41004:2 d"),
            ("POST", "/pools/web/servers/127.0.0.1:41003/restore", ""),
            ("DELETE", "/pools/web/servers/127.0.0.1:41002", ""),
        ],
    ];
    for (p, list) in proxies.iter().zip(changes) {
        for (method, path, body) in list {
            let (status, reply) = http(p.admin, method, path, body, None);
            assert_eq!(status, 200, "{method} {path}: {reply}");
            assert!(reply.contains("\"persisted\": true"), "{reply}");
        }
    }
    let texts: Vec<String> = files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect();
    assert_eq!(texts[0], texts[1]);
    assert_eq!(texts[0], texts[2]);
    assert!(texts[0].starts_with("# The web tier's caches.\n") && texts[0].contains("a   # rack 1\n"), "{}", texts[0]);
    assert!(!texts[0].contains("41002") && texts[0].ends_with("   - 127.0.0.1:41004:2 d\n"), "{}", texts[0]);
    let live: Vec<String> = proxies.iter().map(|p| version_of(p.admin)).collect();
    drop(proxies);
    // Restarted from their files: the same placement everywhere.
    let proxies: Vec<ProxyProcess> = files.iter().map(|f| start(f)).collect();
    let restarted: Vec<String> = proxies.iter().map(|p| version_of(p.admin)).collect();
    assert_eq!(restarted, live);
    let urls: Vec<String> = proxies.iter().map(|p| format!("http://{}", p.admin)).collect();
    let mut args: Vec<&str> = vec!["fleet", "check"];
    args.extend(urls.iter().map(String::as_str));
    args.extend(["-c", files[0].to_str().unwrap()]);
    let out = Command::new(env!("CARGO_BIN_EXE_chash")).args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("agree: 1 pool(s) on 4 source(s)"), "{text}");
    // One proxy with another file: named, exit 1.
    let other = dir.path("other.yml");
    std::fs::write(&other, texts[0].replace("41004:2 d", "41004:3 d")).unwrap();
    let odd = start(&other);
    let odd_url = format!("http://{}", odd.admin);
    args.insert(2, &odd_url);
    let out = Command::new(env!("CARGO_BIN_EXE_chash")).args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("DISAGREE") && text.contains(&odd_url), "{text}");
}

/// With a token, admin requests that change anything need it (401
/// otherwise, and nothing changes); reading stays open. Off loopback
/// without a token the proxy refuses to start.
#[test]
fn the_admin_token_guards_changes() {
    let dir = TempDir::new("token");
    let config = dir.path("p.yml");
    std::fs::write(&config, "web:\n  listen: 127.0.0.1:0\n  servers:\n   - 127.0.0.1:41001:1 a\n").unwrap();
    let token_file = dir.path("token");
    std::fs::write(&token_file, "s3cret-token-0123456789\n").unwrap();
    let p = ProxyProcess::start(&[
        "-c",
        config.to_str().unwrap(),
        "-s",
        "0",
        "--admin-token-file",
        token_file.to_str().unwrap(),
    ]);
    let before = version_of(p.admin);
    for token in [None, Some("wrong-token-0123456789")] {
        let (status, body) = http(p.admin, "POST", "/pools/web/servers", "127.0.0.1:41002:1", token);
        assert_eq!(status, 401, "{body}");
        assert!(body.contains("Authorization: Bearer"), "{body}");
    }
    assert_eq!(version_of(p.admin), before, "nothing changed");
    let (status, body) =
        http(p.admin, "POST", "/pools/web/servers", "127.0.0.1:41002:1", Some("s3cret-token-0123456789"));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("not persisted"), "{body}");
    assert_ne!(version_of(p.admin), before);
    let out = Command::new(env!("CARGO_BIN_EXE_chash"))
        .args(["proxy", "-c", config.to_str().unwrap(), "-s", "0", "--admin", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--admin-token-file"));
}

/// The config file is watched: replaced by a rename, rewritten in place,
/// and swapped the way Kubernetes updates a ConfigMap volume (a symlink to
/// a new directory); each new placement is in use within 2 s. An invalid
/// file keeps the last good placement and says why in /stats and
/// /metrics. A client setting and reading keys all along never gets an
/// error or another key's value.
#[test]
fn a_watched_config_file_reloads_itself() {
    let backends: Vec<ProxyProcess> =
        (0..3).map(|_| ProxyProcess::start(&["--listen", "127.0.0.1:0", "-s", "0"])).collect();
    let dir = TempDir::new("watch");
    let yml = |n: usize| {
        let mut y = "web:\n  listen: 127.0.0.1:0\n  distribution: ring\n  timeout: 2000\n  servers:\n".to_owned();
        for (i, b) in backends.iter().take(n).enumerate() {
            y.push_str(&format!("   - {}:1 s{i}\n", b.listen));
        }
        y
    };
    // Kubernetes' layout: config.yml -> ..data/config.yml, ..data -> ..v1.
    std::fs::create_dir_all(dir.path("..v1")).unwrap();
    std::fs::write(dir.path("..v1/config.yml"), yml(1)).unwrap();
    std::os::unix::fs::symlink("..v1", dir.path("..data")).unwrap();
    std::os::unix::fs::symlink("..data/config.yml", dir.path("config.yml")).unwrap();
    let config = dir.path("config.yml");
    let proxy = ProxyProcess::start(&["-c", config.to_str().unwrap(), "-s", "0"]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (addr, stop) = (proxy.listen, stop.clone());
        std::thread::spawn(move || {
            let mut s = BufReader::new(TcpStream::connect(addr).unwrap());
            s.get_ref().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.get_ref().set_nodelay(true).unwrap();
            let (mut bad, mut done) = (Vec::new(), 0);
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let key = format!("w{}", i % 500);
                let request = format!("set {key} 0 0 {}\r\n{key}\r\nget {key}\r\n", key.len());
                s.get_mut().write_all(request.as_bytes()).unwrap();
                let mut line = String::new();
                s.read_line(&mut line).unwrap();
                if line != "STORED\r\n" {
                    bad.push(line.clone());
                }
                line.clear();
                s.read_line(&mut line).unwrap();
                if line.starts_with("VALUE") {
                    let mut value = String::new();
                    s.read_line(&mut value).unwrap();
                    if value != format!("{key}\r\n") {
                        bad.push(format!("{key} read {value:?}"));
                    }
                    line.clear();
                    s.read_line(&mut line).unwrap();
                }
                if line != "END\r\n" {
                    bad.push(line);
                }
                done += 1;
            }
            (bad, done)
        })
    };
    let expect = |n: usize, how: &str| {
        let want = chash::config::Config::from_yaml(&yml(n)).unwrap().pool(None).unwrap().version();
        let started = Instant::now();
        while version_of(proxy.admin) != want {
            assert!(started.elapsed() < Duration::from_secs(2), "{how}: not in use after 2 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Replaced by a rename.
    std::fs::write(dir.path("..v1/.config.tmp"), yml(2)).unwrap();
    std::fs::rename(dir.path("..v1/.config.tmp"), dir.path("..v1/config.yml")).unwrap();
    expect(2, "renamed over");
    // Rewritten in place.
    std::fs::write(dir.path("..v1/config.yml"), yml(3)).unwrap();
    expect(3, "rewritten");
    // A ConfigMap update: a new directory, the ..data link swapped.
    std::fs::create_dir_all(dir.path("..v2")).unwrap();
    std::fs::write(dir.path("..v2/config.yml"), yml(2)).unwrap();
    std::os::unix::fs::symlink("..v2", dir.path("..data.tmp")).unwrap();
    std::fs::rename(dir.path("..data.tmp"), dir.path("..data")).unwrap();
    expect(2, "symlink swap");
    // An invalid file: the last good placement stays, and it says why.
    let good = version_of(proxy.admin);
    std::fs::write(dir.path("..v2/config.yml"), "web:\n  servers: [\n").unwrap();
    let started = Instant::now();
    loop {
        let (_, stats) = http(proxy.admin, "GET", "/stats", "", None);
        if stats.contains("\"reload_failures\": 1") {
            assert!(stats.contains("\"last_error\": \"") && !stats.contains("\"last_error\": null"), "{stats}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(2), "an invalid file was not reported: {stats}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(version_of(proxy.admin), good);
    let (_, metrics) = http(proxy.admin, "GET", "/metrics", "", None);
    assert!(
        metrics.contains("chash_config_reload_failures_total 1") && metrics.contains("chash_config_last_reload_ok 0")
    );
    std::fs::write(dir.path("..v2/config.yml"), yml(3)).unwrap();
    expect(3, "fixed");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (bad, done) = load.join().unwrap();
    assert!(bad.is_empty(), "{} of {done} requests failed: {:?}", bad.len(), &bad[..bad.len().min(5)]);
    assert!(done > 100, "{done} requests");
}

/// An anchor pool's file with a middle line deleted by hand would renumber
/// buckets: the reload is refused naming the server and the command to use,
/// and the proxy keeps its placement. The file edited with `chash config
/// remove` reloads, and the proxy then runs exactly the placement
/// `chash route --fingerprint` computes from the file.
#[test]
fn a_reload_that_would_renumber_is_refused() {
    let dir = TempDir::new("renumber");
    let config = dir.path("p.yml");
    let lines = ["127.0.0.1:41001:1 a", "127.0.0.1:41002:1 b", "127.0.0.1:41003:1 c"];
    let yml = |lines: &[&str]| {
        let mut y = "web:\n  listen: 127.0.0.1:0\n  distribution: anchor\n  servers:\n".to_owned();
        for l in lines {
            y.push_str(&format!("   - {l}\n"));
        }
        y
    };
    std::fs::write(&config, yml(&lines)).unwrap();
    let p = ProxyProcess::start(&["-c", config.to_str().unwrap(), "-s", "0", "--no-watch"]);
    let before = version_of(p.admin);
    std::fs::write(&config, yml(&[lines[0], lines[2]])).unwrap();
    let (status, body) = http(p.admin, "POST", "/reload", "", None);
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("\"error\"") && body.contains("127.0.0.1:41002") && body.contains("chash config remove"),
        "{body}"
    );
    assert_eq!(version_of(p.admin), before, "the last good placement stays");
    std::fs::write(&config, yml(&lines)).unwrap();
    let chash = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_chash")).args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    chash(&["config", "remove", "-c", config.to_str().unwrap(), "-i", "127.0.0.1:41002"]);
    assert!(std::fs::read_to_string(&config).unwrap().contains("127.0.0.1:41002:1 b removed 1\n"));
    let (status, body) = http(p.admin, "POST", "/reload", "", None);
    assert!(status == 200 && !body.contains("\"error\""), "{body}");
    let offline = chash(&["route", "-c", config.to_str().unwrap(), "--fingerprint"]);
    let row: Vec<&str> = offline.lines().nth(1).unwrap().split_whitespace().collect();
    let (_, stats) = http(p.admin, "GET", "/stats", "", None);
    let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(v["pools"][0]["membership_version"].as_str(), Some(row[1]));
    assert_eq!(v["pools"][0]["placement_fingerprint"].as_str(), Some(row[2]));
    assert_ne!(row[1], before);
}

/// `chash config remove --drain SECS` writes the removal and the pool's
/// `drain:` key (the time the window ends); a proxy that reloads the file
/// keeps the removed server as a warm-up source for that window, where a
/// plain removal gets the pool's `warmup` (none here).
#[test]
fn a_drained_removal_in_the_file_gets_its_window_on_reload() {
    let dir = TempDir::new("drainfile");
    let config = dir.path("p.yml");
    std::fs::write(
        &config,
        "web:\n  listen: 127.0.0.1:0\n  distribution: ring\n  servers:   # the cache tier\n   - 127.0.0.1:41001:1 a\n   \
         - 127.0.0.1:41002:1 b\n   - 127.0.0.1:41003:1 c\n",
    )
    .unwrap();
    let p = ProxyProcess::start(&["-c", config.to_str().unwrap(), "-s", "0", "--no-watch"]);
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_chash")).args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    run(&["config", "remove", "-c", config.to_str().unwrap(), "-i", "--drain", "120", "127.0.0.1:41002"]);
    let text = std::fs::read_to_string(&config).unwrap();
    let until: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("drain: {\"127.0.0.1:41002\": "))
        .and_then(|rest| rest.trim_end_matches('}').parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!((now + 119..=now + 122).contains(&until), "{until} {now}");
    assert!(!text.contains("41002:1") && text.contains("servers:   # the cache tier"), "{text}");
    let (status, body) = http(p.admin, "POST", "/reload", "", None);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let window = v["reloaded"][0]["warmup_seconds"].as_u64().unwrap();
    assert!((115..=120).contains(&window), "{body}");
    // A plain removal: no window (the pool has no `warmup`).
    run(&["config", "remove", "-c", config.to_str().unwrap(), "-i", "127.0.0.1:41003"]);
    let (_, body) = http(p.admin, "POST", "/reload", "", None);
    assert!(body.contains("\"warmup_seconds\": 0"), "{body}");
}

/// The first line of `file` (waited for) holding `text`, and what follows
/// it up to the next space.
fn logged_addr(file: &std::path::Path, text: &str) -> SocketAddr {
    let log = wait_for_log(file, text, 1);
    let rest = log.lines().find_map(|l| l.split(text).nth(1)).unwrap();
    rest.trim_start_matches("http://").split_whitespace().next().unwrap().parse().unwrap()
}

/// twemproxy's stats document from its port.
fn stats_doc(addr: SocketAddr) -> String {
    let mut doc = String::new();
    TcpStream::connect(addr).unwrap().read_to_string(&mut doc).unwrap();
    doc
}

/// Waits until the process `pid` is gone and `pid_file` removed.
fn wait_gone(pid: &str, pid_file: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while running(pid) || pid_file.exists() {
        assert!(Instant::now() < deadline, "process {pid} did not stop on SIGTERM (or left its pid file)");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `nutcracker -d` through a symlink named nutcracker, as init scripts and
/// twemproxy's test harness run it: the background process reads
/// twemproxy's flags as nutcracker does, serves, writes its pid file, logs
/// to -o, stops on SIGTERM and removes the pid file; a start-up error of
/// the background process comes back with its cause and a non-zero exit.
#[test]
fn nutcracker_daemonizes_through_its_symlink() {
    let dir = TempDir::new("nutcracker-d");
    let nutcracker = dir.path("nutcracker");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_chash"), &nutcracker).unwrap();
    let backend = ProxyProcess::start(&["--listen", "127.0.0.1:0", "-s", "0"]);
    let conf = dir.path("nutcracker.yml");
    std::fs::write(&conf, format!("alpha:\n  listen: 127.0.0.1:0\n  servers:\n   - {}:1\n", backend.listen)).unwrap();
    let (log, pid) = (dir.path("nutcracker.log"), dir.path("nutcracker.pid"));
    let out = Command::new(&nutcracker)
        .args(["-d", "-c", conf.to_str().unwrap(), "-o", log.to_str().unwrap(), "-p", pid.to_str().unwrap()])
        .args(["-s", "0", "-a", "127.0.0.1", "-v", "6"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "nutcracker -d: {}", String::from_utf8_lossy(&out.stderr));
    let daemon = std::fs::read_to_string(&pid).unwrap().trim().to_owned();
    let _stop = KillOnDrop(daemon.parse().unwrap());
    assert!(running(&daemon));
    let listen = logged_addr(&log, "serving memcached on ");
    assert_eq!(talk(listen, b"set d 0 0 1\r\n1\r\nget d\r\n", 4), "STORED\r\nVALUE d 0 1\r\n1\r\nEND\r\n");
    let doc = stats_doc(logged_addr(&log, "stats (twemproxy's JSON) on "));
    assert!(doc.contains("\"alpha\": {"), "{doc}");
    assert!(Command::new("kill").args(["-TERM", &daemon]).status().unwrap().success());
    wait_gone(&daemon, &pid);
    wait_for_log(&log, "signal 15 (SIGTERM) received: stopping", 1);
    wait_for_log(&log, "stopped", 1);

    // Start-up errors of the background process, with their cause.
    let bad = dir.path("bad.yml");
    std::fs::write(&bad, "alpha:\n  listen: 127.0.0.1:0\n  colour: red\n  servers:\n   - 127.0.0.1:11211:1\n").unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = dir.path("busy.yml");
    let taken_addr = taken.local_addr().unwrap();
    std::fs::write(&busy, format!("alpha:\n  listen: {taken_addr}\n  servers:\n   - {}:1\n", backend.listen)).unwrap();
    for (conf, cause) in [(&bad, "colour".to_owned()), (&busy, format!("cannot listen on {taken_addr}"))] {
        let out = Command::new(&nutcracker)
            .args(["-d", "-c", conf.to_str().unwrap(), "-o", log.to_str().unwrap(), "-s", "0", "-a", "127.0.0.1"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains("did not start") && err.contains(&cause), "{cause} not in: {err}");
    }
    // A usage error says which flag.
    let out = Command::new(&nutcracker).args(["-d", "--no-such-flag"]).stdin(Stdio::null()).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Instances side by side on one host, from configs that differ only in
/// their listen address and -s (as nutcracker is run once per core or per
/// pool, or from a template unit): all start and serve, each with its
/// stats port; the first takes the admin endpoint's default port and the
/// others a free one, which each announces (and logs).
#[test]
fn instances_side_by_side_on_one_host() {
    let dir = TempDir::new("instances");
    let nutcracker = dir.path("nutcracker");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_chash"), &nutcracker).unwrap();
    let backend = ProxyProcess::start(&["--listen", "127.0.0.1:0", "-s", "0"]);
    for program in ["nutcracker", "chash proxy"] {
        let mut running = Vec::new();
        for i in 0..3 {
            let conf = dir.path(&format!("{}-{i}.yml", program.replace(' ', "-")));
            std::fs::write(&conf, format!("alpha:\n  listen: 127.0.0.1:0\n  servers:\n   - {}:1\n", backend.listen))
                .unwrap();
            let log = dir.path(&format!("{}-{i}.log", program.replace(' ', "-")));
            let mut cmd = match program {
                "nutcracker" => Command::new(&nutcracker),
                _ => {
                    let mut c = Command::new(env!("CARGO_BIN_EXE_chash"));
                    c.arg("proxy");
                    c
                }
            };
            let child = cmd
                .args(["-c", conf.to_str().unwrap(), "-o", log.to_str().unwrap(), "-s", "0", "-a", "127.0.0.1"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let stop = KillOnDrop(child.id());
            let listen = logged_addr(&log, "serving memcached on ");
            let stats = logged_addr(&log, "stats (twemproxy's JSON) on ");
            let admin = logged_addr(&log, "admin on ");
            running.push((child, stop, listen, stats, admin));
        }
        let mut admins: Vec<SocketAddr> = running.iter().map(|r| r.4).collect();
        admins.sort();
        admins.dedup();
        assert_eq!(admins.len(), 3, "{program}: each instance has an admin endpoint of its own: {admins:?}");
        for (i, (_, _, listen, stats, admin)) in running.iter().enumerate() {
            let key = format!("{program}-{i}").replace(' ', "-");
            let req = format!("set {key} 0 0 1\r\n{i}\r\nget {key}\r\n");
            assert_eq!(talk(*listen, req.as_bytes(), 4), format!("STORED\r\nVALUE {key} 0 1\r\n{i}\r\nEND\r\n"));
            assert!(stats_doc(*stats).contains("\"alpha\": {"), "{program} {i}: stats");
            assert!(http_get(*admin, "/pools").contains("alpha"), "{program} {i}: admin");
        }
        for (mut child, _stop, ..) in running {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            assert!(child.wait().unwrap().success(), "{program}: a clean stop");
        }
    }
}
