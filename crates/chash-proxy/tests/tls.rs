//! TLS on both sides of the proxy, against real redis-servers speaking TLS
//! (`--tls-port`) and real clients (`redis-cli --tls`), with certificates
//! made by the test (openssl): a CA, servers' and a client's certificates,
//! and a second CA the proxy does not trust.

#[path = "support/pki.rs"]
mod pki;
mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pki::Pki;
use support::{require, run_script, spawn_server, Proxy};

/// A redis-server speaking only TLS, with certificate `cert` (of the
/// Pki); `clients_need_certs`: `--tls-auth-clients yes`.
struct TlsRedis {
    port: u16,
    child: Child,
}

impl TlsRedis {
    fn start(pki: &Pki, cert: &str, clients_need_certs: bool) -> TlsRedis {
        require("redis-server", "redis-server");
        let (port, child) = spawn_server(|port| {
            let mut c = Command::new("redis-server");
            c.args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--tls-cert-file", &pki.path(&format!("{cert}.pem"))])
                .args(["--tls-key-file", &pki.path(&format!("{cert}.key"))])
                .args(["--tls-ca-cert-file", &pki.path("ca.pem")])
                .args(["--tls-auth-clients", if clients_need_certs { "yes" } else { "no" }])
                .args(["--save", "", "--appendonly", "no"]);
            c
        });
        TlsRedis { port, child }
    }

    fn id(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One RESP command on a plaintext connection.
fn cmd(addr: SocketAddr, args: &[&str]) -> String {
    support::redis_session(addr, &[args]).remove(0)
}

/// `redis-cli --tls` with `extra` flags: (exit status ok, what it printed).
fn redis_cli_tls(addr: SocketAddr, pki: &Pki, extra: &[String], args: &[&str]) -> (bool, String) {
    let cli = require("redis-cli", "redis-tools");
    let out = Command::new(cli)
        .args(["--tls", "--cacert", &pki.path("ca.pem"), "-h", "127.0.0.1", "-p", &addr.port().to_string()])
        .args(extra)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success() && !text.contains("Could not") && !text.contains("rror"), text.trim().to_owned())
}

/// Pool keys for TLS on both sides: the server certificate served on
/// `tls_listen` (`listen` stays plaintext), servers verified with the CA.
fn both_sides(pki: &Pki) -> String {
    format!(
        "  tls_cert: {}\n  tls_key: {}\n  tls_listen: 127.0.0.1:0\n  server_tls: true\n  server_tls_ca: {}\n",
        pki.path("server.pem"),
        pki.path("server.key"),
        pki.path("ca.pem")
    )
}

/// A Redis pool (ketama, md5) of `servers` named `s1`, `s2`, ...: ketama
/// places by name, so where keys go does not depend on the ports drawn.
fn pool(extra: &str, servers: &[&TlsRedis]) -> String {
    let mut yml =
        format!("alpha:\n  listen: 127.0.0.1:0\n  redis: true\n  hash: md5\n  timeout: 2000\n{extra}  servers:\n");
    for (i, s) in servers.iter().enumerate() {
        yml.push_str(&format!("   - {}:1 s{}\n", s.id(), i + 1));
    }
    yml
}

/// A Redis pool over TLS servers, one of which requires client
/// certificates: every key written through the proxy reads back, on both.
#[test]
fn a_redis_pool_over_tls_servers() {
    let pki = Pki::new();
    let servers = [TlsRedis::start(&pki, "server", false), TlsRedis::start(&pki, "server", true)];
    let extra = format!(
        "  server_tls: true\n  server_tls_ca: {}\n  server_tls_cert: {}\n  server_tls_key: {}\n",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key")
    );
    let proxy = Proxy::start(&pool(&extra, &[&servers[0], &servers[1]]));
    for i in 0..60 {
        let key = format!("tls:{i}");
        assert_eq!(cmd(proxy.addr, &["SET", &key, &format!("v{i}")]), "+OK", "{key}");
    }
    for i in 0..60 {
        assert_eq!(cmd(proxy.addr, &["GET", &format!("tls:{i}")]), format!("v{i}"));
    }
    // Both servers took keys (straight to each, over TLS with the client
    // certificate).
    let client = ["--cert".to_owned(), pki.path("client.pem"), "--key".to_owned(), pki.path("client.key")];
    for s in &servers {
        let (ok, keys) = redis_cli_tls(SocketAddr::from(([127, 0, 0, 1], s.port)), &pki, &client, &["DBSIZE"]);
        assert!(ok, "{keys}");
        assert!(keys.parse::<u32>().unwrap() > 5, "{} holds {keys} keys", s.id());
    }
}

/// A server whose certificate the proxy cannot verify is not used: its
/// requests get an error naming the reason, within the pool's timeout.
/// An explicit `server_tls_verify: false` takes it.
#[test]
fn servers_are_verified() {
    let pki = Pki::new();
    let stranger = TlsRedis::start(&pki, "stranger", false);
    let ca = format!("  server_tls: true\n  server_tls_ca: {}\n", pki.path("ca.pem"));
    let proxy = Proxy::start(&pool(&ca, &[&stranger]));
    let started = Instant::now();
    let reply = cmd(proxy.addr, &["GET", "k"]);
    assert!(reply.starts_with("-ERR backend") && reply.contains("certificate"), "{reply}");
    assert!(started.elapsed() < Duration::from_secs(3), "answered within its timeout");
    drop(proxy);

    let right = TlsRedis::start(&pki, "server", false);
    let named = format!("{ca}  server_tls_name: cache.example\n");
    let proxy = Proxy::start(&pool(&named, &[&right]));
    let reply = cmd(proxy.addr, &["GET", "k"]);
    assert!(reply.starts_with("-ERR backend") && reply.contains("certificate"), "{reply}");
    drop(proxy);

    let unverified = "  server_tls: true\n  server_tls_verify: false\n";
    let proxy = Proxy::start(&pool(unverified, &[&stranger]));
    assert_eq!(cmd(proxy.addr, &["SET", "k", "v"]), "+OK");
    assert_eq!(cmd(proxy.addr, &["GET", "k"]), "v");
}

/// A pool half moved to TLS (`server_tls_overrides`, by server ID): s1
/// over TLS, s2 in plaintext, both taking keys. An override that names a
/// CA s1's certificate does not chain to fails s1's requests (naming the
/// reason) and only s1's; the file fixed and reloaded, s1 is used without
/// a restart. The overrides do not move a key (placement is by ID).
#[test]
fn a_pool_half_moved_to_tls() {
    let pki = Pki::new();
    let tls = TlsRedis::start(&pki, "server", false);
    let plain = support::Redis::start(None);
    let yml = |s1: &str| {
        format!(
            "alpha:\n  listen: 127.0.0.1:0\n  redis: true\n  hash: md5\n  timeout: 2000\n  server_tls: true\n  \
             server_tls_ca: {}\n  server_tls_overrides:\n    s2: {{server_tls: false}}\n{s1}  servers:\n   - {}:1 \
             s1\n   - {}:1 s2\n",
            pki.path("ca.pem"),
            tls.id(),
            plain.id()
        )
    };
    let wrong_ca = format!("    s1: {{server_tls_ca: {}}}\n", pki.path("other-ca.pem"));
    let fingerprint = |y: &str| chash::config::Config::from_yaml(y).unwrap().pool(None).unwrap().snapshot().unwrap();
    let bare = yml("").replace("  server_tls_overrides:\n    s2: {server_tls: false}\n", "");
    for a in [yml(""), yml(&wrong_ca)] {
        let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
        let (with, without) = (fingerprint(&a), fingerprint(&bare));
        assert!(keys.iter().all(|k| with.route(k.as_bytes()) == without.route(k.as_bytes())), "no key moves");
    }

    let path = pki.dir.join("half.yml");
    std::fs::write(&path, yml(&wrong_ca)).unwrap();
    let proxy = Proxy::start_with(&yml(&wrong_ca), chash_proxy::ProxyOptions::default(), Some(path.clone()));
    let replies: Vec<String> = (0..60).map(|i| cmd(proxy.addr, &["SET", &format!("half:{i}"), "v"])).collect();
    let failed: Vec<&String> = replies.iter().filter(|r| *r != "+OK").collect();
    assert!(failed.len() > 5 && failed.len() < 55, "s1's keys fail, s2's do not: {replies:?}");
    assert!(failed.iter().all(|r| r.starts_with("-ERR backend") && r.contains("UnknownIssuer")), "{failed:?}");

    std::fs::write(&path, yml("")).unwrap();
    assert_eq!(proxy.admin("POST", "/reload", "").0, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    let all_ok = || (0..60).all(|i| cmd(proxy.addr, &["SET", &format!("half:{i}"), &format!("v{i}")]) == "+OK");
    while !all_ok() {
        assert!(Instant::now() < deadline, "s1 is used after the reload");
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in 0..60 {
        assert_eq!(cmd(proxy.addr, &["GET", &format!("half:{i}")]), format!("v{i}"));
    }
    let on_plain = cmd(SocketAddr::from(([127, 0, 0, 1], plain.port)), &["DBSIZE"]);
    assert!(on_plain.trim_start_matches(':').parse::<u32>().unwrap() > 5, "s2 (plaintext) took keys: {on_plain}");
}

/// Clients speak TLS to the proxy on `tls_listen` while `listen` stays
/// plaintext; with `tls_client_ca`, a client without a certificate, or with
/// one from another CA, is refused at the handshake.
#[test]
fn clients_speak_tls_to_the_proxy() {
    let pki = Pki::new();
    let server = TlsRedis::start(&pki, "server", false);
    let tls = both_sides(&pki);
    let proxy = Proxy::start(&pool(&tls, &[&server]));
    let at = proxy.tls.expect("a TLS listener");
    let (ok, out) = redis_cli_tls(at, &pki, &[], &["SET", "over", "tls"]);
    assert!(ok && out == "OK", "{out}");
    assert_eq!(cmd(proxy.addr, &["GET", "over"]), "tls", "the plaintext listener serves the same pool");
    // Plaintext bytes on the TLS listener get no reply.
    let mut raw = TcpStream::connect(at).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut buf = [0u8; 64];
    let n = std::io::Read::read(&mut raw, &mut buf).unwrap_or(0);
    assert!(!String::from_utf8_lossy(&buf[..n]).contains("PONG"));
    drop(proxy);

    let mutual = format!("{tls}  tls_client_ca: {}\n", pki.path("ca.pem"));
    let proxy = Proxy::start(&pool(&mutual, &[&server]));
    let at = proxy.tls.unwrap();
    let (ok, out) = redis_cli_tls(at, &pki, &[], &["PING"]);
    assert!(!ok, "no client certificate: {out}");
    let other = ["--cert".to_owned(), pki.path("other-client.pem"), "--key".to_owned(), pki.path("other-client.key")];
    let (ok, out) = redis_cli_tls(at, &pki, &other, &["PING"]);
    assert!(!ok, "a certificate from another CA: {out}");
    pki.leaf_for_days("expired-client", "ca", "extendedKeyUsage=clientAuth", -1);
    let expired =
        ["--cert".to_owned(), pki.path("expired-client.pem"), "--key".to_owned(), pki.path("expired-client.key")];
    let (ok, out) = redis_cli_tls(at, &pki, &expired, &["PING"]);
    assert!(!ok, "an expired certificate: {out}");
    let good = ["--cert".to_owned(), pki.path("client.pem"), "--key".to_owned(), pki.path("client.key")];
    let (ok, out) = redis_cli_tls(at, &pki, &good, &["GET", "over"]);
    assert!(ok && out == "tls", "{out}");
    let stats = &proxy.handle.stats()[0];
    assert_eq!(stats.get("tls_handshake_errors"), 3, "the three refused clients are counted");
    // The test's certificates are made for 30 days.
    let left = stats.get("tls_cert_expiry_seconds");
    assert!((29 * 86_400..=30 * 86_400).contains(&left), "{left} s left");
    let metrics = proxy.admin("GET", "/metrics", "").1;
    assert!(metrics.contains("tls_cert_expiry_seconds{pool=\"alpha\"}"), "{metrics}");
    assert!(metrics.contains("tls_handshake_errors_total{pool=\"alpha\"} 3"), "{metrics}");
    assert_eq!(stats.get("tls_handshakes"), 1);
}

/// TLS settings are checked when they are read: files that do not exist
/// or do not parse, a key that is not its certificate's, keys that need
/// others.
#[test]
fn tls_settings_are_checked() {
    let pki = Pki::new();
    let tls = |yml: &str| chash::config::Config::from_yaml(yml).and_then(|c| c.pool(None)).map(|p| p.tls);
    let with = |keys: &str| format!("alpha:\n{keys}  servers:\n   - 127.0.0.1:1:1\n");
    let e = tls(&with("  tls_cert: a.pem\n")).unwrap_err().to_string();
    assert!(e.contains("tls_cert and tls_key go together"), "{e}");
    let e = tls(&with("  server_tls_ca: ca.pem\n")).unwrap_err().to_string();
    assert!(e.contains("need server_tls: true"), "{e}");
    let e = tls(&with("  server_tls_overrides:\n    s1: {server_tls_name: a}\n")).unwrap_err().to_string();
    assert!(e.contains("server_tls_overrides of s1") && e.contains("need server_tls: true"), "{e}");
    let e = tls(&with("  server_tls: true\n  server_tls_overrides:\n    s1: {tls_name: a}\n")).unwrap_err().to_string();
    assert!(e.contains("tls_name"), "an unknown key is named: {e}");
    let on = tls(&with("  server_tls_overrides:\n    127.0.0.1:1: {server_tls: true, server_tls_name: a}\n")).unwrap();
    assert!(on.any_server_tls() && !on.server, "one server over TLS in a plaintext pool");
    assert_eq!(on.for_server("127.0.0.1:1").unwrap().server_name.as_deref(), Some("a"));

    let check = |keys: String| chash_proxy::check_tls(&tls(&with(&keys)).unwrap()).map_err(|e| e.to_string());
    let missing = check(format!("  tls_cert: {}\n  tls_key: {}\n", pki.path("nope.pem"), pki.path("server.key")));
    assert!(missing.as_ref().unwrap_err().contains("nope.pem"), "{missing:?}");
    let mismatched = check(format!("  tls_cert: {}\n  tls_key: {}\n", pki.path("server.pem"), pki.path("client.key")));
    assert!(mismatched.is_err(), "a key that is not the certificate's");
    let not_a_ca = check(format!("  server_tls: true\n  server_tls_ca: {}\n", pki.path("server.key")));
    assert!(not_a_ca.as_ref().unwrap_err().contains("server_tls_ca"), "{not_a_ca:?}");
    assert_eq!(
        check(format!("  tls_cert: {}\n  tls_key: {}\n", pki.path("server.pem"), pki.path("server.key"))),
        Ok(())
    );
    assert!(Path::new(&pki.path("ca.pem")).exists());
}

/// Open file descriptors this process may have (the soft limit).
fn fd_limit() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap_or_default();
    line.split_whitespace().nth(3).and_then(|n| n.parse().ok()).unwrap_or(1024)
}

/// 1,000 connections that open TCP and never start their handshake hold
/// nothing but their sockets, and those only until the handshake timeout:
/// a client meanwhile is served, and then every one of them is closed,
/// counted, and gone from the pool's open connections.
#[test]
fn stuck_handshakes_are_bounded() {
    let pki = Pki::new();
    let server = TlsRedis::start(&pki, "server", false);
    let tls = both_sides(&pki);
    let mut options = chash_proxy::ProxyOptions::default();
    options.tls_handshake_timeout = Duration::from_secs(3);
    let proxy = Proxy::start_with(&pool(&tls, &[&server]), options, None);
    let at = proxy.tls.unwrap();
    // Both ends of each connection are in this process: leave room.
    let n = 1000.min(fd_limit().saturating_sub(200) / 2);
    let stuck: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(at).unwrap()).collect();
    let stat = |name: &str| proxy.handle.stats()[0].get(name);
    let open = || stat("curr_connections");
    // Accepted (counted when accepted: some may time out before the last
    // is, so not all need be open at once).
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat("total_connections") < n as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stat("total_connections"), n as u64, "all {n} accepted");
    // Served meanwhile.
    let (ok, out) = redis_cli_tls(at, &pki, &[], &["SET", "k", "v"]);
    assert!(ok && out == "OK", "{out}");
    assert_eq!(cmd(proxy.addr, &["GET", "k"]), "v");
    // Each stuck one is closed by the proxy once its time is up.
    for mut s in stuck {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut byte = [0u8; 1];
        let closed = matches!(std::io::Read::read(&mut s, &mut byte), Ok(0) | Err(_));
        assert!(closed, "a connection that never shook hands was closed");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while open() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = &proxy.handle.stats()[0];
    assert_eq!(stats.get("curr_connections"), 0);
    assert_eq!(stats.get("tls_handshake_timeouts"), n as u64);
    assert_eq!(stats.get("tls_handshakes"), 1);
    assert_eq!(stats.get("total_connections"), n as u64 + 2, "the stuck ones, redis-cli and the plaintext client");
}

/// A memcached speaking only TLS (`memcached -Z`), with the Pki's server
/// certificate.
struct TlsMemcached {
    port: u16,
    child: Child,
}

impl TlsMemcached {
    fn start(pki: &Pki) -> TlsMemcached {
        let memcached = require("memcached", "memcached");
        let (port, child) = spawn_server(|port| {
            let mut c = Command::new(&memcached);
            let ssl = format!(
                "ssl_chain_cert={},ssl_key={},ssl_ca_cert={}",
                pki.path("server.pem"),
                pki.path("server.key"),
                pki.path("ca.pem")
            );
            c.args(["-Z", "-o", &ssl, "-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0", "-m", "64", "-u", "root"]);
            c
        });
        TlsMemcached { port, child }
    }
}

impl Drop for TlsMemcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// TLS on both sides, with the client libraries applications use:
/// pymemcache (an ssl context) through a memcached pool over `memcached
/// -Z` servers, and redis-py (`ssl=True`, with a client certificate)
/// through a Redis pool over TLS redis-servers, one requiring client
/// certificates; what they write reads back, plaintext clients see it.
#[test]
fn client_libraries_over_tls_on_both_sides() {
    let pki = Pki::new();
    let client_tls = both_sides(&pki);
    let mcs = [TlsMemcached::start(&pki), TlsMemcached::start(&pki)];
    let mut yml = format!("alpha:\n  listen: 127.0.0.1:0\n  hash: md5\n  timeout: 2000\n{client_tls}  servers:\n");
    for (i, m) in mcs.iter().enumerate() {
        yml.push_str(&format!("   - 127.0.0.1:{}:1 s{}\n", m.port, i + 1));
    }
    let proxy = Proxy::start(&yml);
    let (tls_at, plain_at) = (proxy.tls.unwrap().to_string(), proxy.addr.to_string());
    run_script("tls_clients.py", &["memcached", &tls_at, &plain_at, &pki.path("ca.pem")]);
    drop(proxy);

    let servers = [TlsRedis::start(&pki, "server", false), TlsRedis::start(&pki, "server", true)];
    let both = format!(
        "{client_tls}  tls_client_ca: {}\n  server_tls_cert: {}\n  server_tls_key: {}\n",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key")
    );
    let proxy = Proxy::start(&pool(&both, &[&servers[0], &servers[1]]));
    let (tls_at, plain_at) = (proxy.tls.unwrap().to_string(), proxy.addr.to_string());
    let (cert, key) = (pki.path("client.pem"), pki.path("client.key"));
    run_script("tls_clients.py", &["redis", &tls_at, &plain_at, &pki.path("ca.pem"), &cert, &key]);
}

/// Replaces `to` with a copy of `from`, atomically (a rename).
fn replace(from: &str, to: &str) {
    let tmp = format!("{to}.new");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

/// Certificates and CAs reload without a restart (`POST /reload`, as
/// SIGHUP does): a server CA fixed in its file makes the server usable;
/// the proxy's certificate replaced while 20 clients keep TLS connections
/// busy costs no request, and new connections see the new certificate.
#[test]
fn certificates_reload_without_a_restart() {
    let pki = Pki::new();
    let server = TlsRedis::start(&pki, "server", false);
    let (live_ca, live_cert, live_key) = (pki.path("live-ca.pem"), pki.path("live.pem"), pki.path("live.key"));
    replace(&pki.path("other-ca.pem"), &live_ca);
    replace(&pki.path("server.pem"), &live_cert);
    replace(&pki.path("server.key"), &live_key);
    let yml = pool(
        &format!(
            "  tls_cert: {live_cert}\n  tls_key: {live_key}\n  tls_listen: 127.0.0.1:0\n  server_tls: true\n  \
             server_tls_ca: {live_ca}\n"
        ),
        &[&server],
    );
    let path = pki.dir.join("proxy.yml");
    std::fs::write(&path, &yml).unwrap();
    let proxy = Proxy::start_with(&yml, chash_proxy::ProxyOptions::default(), Some(path));
    let reply = cmd(proxy.addr, &["SET", "k", "v"]);
    assert!(reply.contains("UnknownIssuer"), "the server's CA is not the one in the file yet: {reply}");
    replace(&pki.path("ca.pem"), &live_ca);
    assert_eq!(proxy.admin("POST", "/reload", "").0, 200);
    assert_eq!(cmd(proxy.addr, &["SET", "k", "v"]), "+OK", "the fixed CA, without a restart");

    // The proxy's own certificate, replaced under load.
    let bundle = pki.path("bundle.pem");
    let both = std::fs::read_to_string(pki.path("ca.pem")).unwrap()
        + &std::fs::read_to_string(pki.path("other-ca.pem")).unwrap();
    std::fs::write(&bundle, both).unwrap();
    let at = proxy.tls.unwrap();
    let python = require("python3", "python3");
    let script = format!("{}/tests/clients/tls_rotation.py", env!("CARGO_MANIFEST_DIR"));
    let mut load = Command::new(python)
        .args([&script, &at.to_string(), &bundle, "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(load.stdout.take().unwrap());
    let mut ready = String::new();
    out.read_line(&mut ready).unwrap();
    assert_eq!(ready.trim(), "ready");
    std::thread::sleep(Duration::from_millis(500));
    replace(&pki.path("stranger.pem"), &live_cert);
    replace(&pki.path("stranger.key"), &live_key);
    assert_eq!(proxy.admin("POST", "/reload", "").0, 200);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(load.wait().unwrap().success(), "{rest}");
    let last = rest.lines().last().unwrap_or_default().to_owned();
    assert!(last.starts_with("requests ") && last.ends_with(" failed 0"), "{rest}");
    let made: u64 = last.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(made > 100, "{last}");
    // New connections get the new certificate (signed by the other CA).
    let with_ca = |ca: &str| {
        let cli = require("redis-cli", "redis-tools");
        let out = Command::new(cli)
            .args(["--tls", "--cacert", &pki.path(ca), "-h", "127.0.0.1", "-p", &at.port().to_string(), "PING"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "PONG"
    };
    assert!(with_ca("other-ca.pem"), "the new certificate");
    assert!(!with_ca("ca.pem"), "not the old one");
}
