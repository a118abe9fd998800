//! The admin endpoint. Over HTTPS (`--admin-tls-cert`, `--admin-tls-key`,
//! `--admin-tls-client-ca`), off loopback with its token; certificates
//! reloaded on SIGHUP; the warning for a certificate that expires within
//! 14 days, for a pool's certificate and the admin endpoint's. Its
//! `/metrics` as the monitoring kit (`deploy/prometheus`, `deploy/grafana`)
//! reads it. The tests speak TLS with rustls themselves; certificates are
//! made with openssl.

mod common;
use common::require;

#[path = "../../chash-proxy/tests/support/pki.rs"]
mod pki;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// A `chash proxy` whose admin endpoint serves HTTPS, and its log.
struct Proxy {
    child: Child,
    admin: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    fn start(args: &[&str]) -> Proxy {
        let mut child = Command::new(env!("CARGO_BIN_EXE_chash"))
            .arg("proxy")
            .args(["-s", "0", "--threads", "1"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let admin = loop {
            let line = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).unwrap_or_else(|_| {
                panic!("the proxy announces its admin endpoint; it said {:?}", log.lock().unwrap())
            });
            if let Some(rest) = line.split("admin on https://").nth(1) {
                let at: SocketAddr = rest.split_whitespace().next().unwrap().parse().unwrap();
                break SocketAddr::from(([127, 0, 0, 1], at.port()));
            }
        };
        Proxy { child, admin, log }
    }

    fn logged(&self, text: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(text))
    }

    fn wait_logged(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.logged(text) {
            assert!(Instant::now() < deadline, "not logged within 10 s: {text:?}; log: {:?}", self.log.lock().unwrap());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: &str) {
        assert!(Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap().success());
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn certs(path: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path).unwrap().map(Result::unwrap).collect()
}

/// One HTTPS request to `addr`, verified with `ca` (as 127.0.0.1), with a
/// client certificate and key when given: the response, or why the
/// connection failed.
fn https(addr: SocketAddr, ca: &str, client: Option<(&str, &str)>, request: &str) -> Result<String, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs(ca) {
        roots.add(cert).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => {
            builder.with_client_auth_cert(certs(cert), PrivateKeyDer::from_pem_file(key).unwrap()).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    tls.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => Ok(String::from_utf8_lossy(&out).into_owned()),
        Err(e) if !out.is_empty() && e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Ok(String::from_utf8_lossy(&out).into_owned())
        }
        Err(e) => Err(e.to_string()),
    }
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")
}

fn post(path: &str, body: &str, token: Option<&str>) -> String {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!("POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\n\r\n{body}", body.len())
}

/// The `/stats` number `admin_tls_cert_expiry_seconds`, in days.
fn admin_days_left(proxy: &Proxy, ca: &str) -> i64 {
    let stats = https(proxy.admin, ca, None, &get("/stats")).unwrap();
    let body = stats.split_once("\r\n\r\n").unwrap().1;
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["admin_tls_cert_expiry_seconds"].as_i64().unwrap_or_else(|| panic!("no expiry in {body}")) / 86_400
}

/// Off loopback, with its token, the admin endpoint speaks only HTTPS:
/// reading is open, a change needs the token, plain HTTP gets no answer.
/// A new certificate is taken on SIGHUP (new connections see it), and one
/// that ends within 14 days is warned about in the log, as is a pool's.
#[test]
fn the_admin_endpoint_over_https_off_loopback() {
    let pki = pki::Pki::new();
    pki.leaf_for_days("short", "ca", "subjectAltName=IP:127.0.0.1", 5);
    let dir = &pki.dir;
    let (cert, key) = (pki.path("admin.pem"), pki.path("admin.key"));
    std::fs::copy(pki.path("server.pem"), &cert).unwrap();
    std::fs::copy(pki.path("server.key"), &key).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, "admin-token-0123456789\n").unwrap();
    let config = dir.join("p.yml");
    let pool = format!(
        "web:\n  listen: 127.0.0.1:0\n  tls_cert: {}\n  tls_key: {}\n  servers:\n   - 127.0.0.1:41001:1 a\n",
        pki.path("short.pem"),
        pki.path("short.key")
    );
    std::fs::write(&config, pool).unwrap();
    let ca = pki.path("ca.pem");
    let token = token_file.to_str().unwrap();
    let p = Proxy::start(&[
        "-c",
        config.to_str().unwrap(),
        "--admin",
        "0.0.0.0:0",
        "--admin-token-file",
        token,
        "--admin-tls-cert",
        &cert,
        "--admin-tls-key",
        &key,
    ]);
    // The pool's 5-day certificate is warned about at start.
    p.wait_logged(&format!("tls_cert {}: the certificate expires in ", pki.path("short.pem")));
    assert!(p.logged(" days (43"), "5 days, less a few seconds: {:?}", p.log.lock().unwrap());
    assert!(!p.logged("token crosses the network in clear"), "served over TLS: no warning");

    let stats = https(p.admin, &ca, None, &get("/stats")).unwrap();
    assert!(stats.starts_with("HTTP/1.1 200"), "{stats}");
    assert!((29..=30).contains(&admin_days_left(&p, &ca)));
    let metrics = https(p.admin, &ca, None, &get("/metrics")).unwrap();
    assert!(metrics.contains("\nchash_admin_tls_cert_expiry_seconds "), "{metrics}");
    let refused = https(p.admin, &ca, None, &post("/pools/web/servers", "127.0.0.1:41002:1", None)).unwrap();
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    let done =
        https(p.admin, &ca, None, &post("/pools/web/servers", "127.0.0.1:41002:1", Some("admin-token-0123456789")));
    assert!(done.as_ref().unwrap().starts_with("HTTP/1.1 200"), "{done:?}");
    // Plain HTTP on the TLS port: no HTTP answer.
    let mut plain = TcpStream::connect(p.admin).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    plain.write_all(get("/stats").as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!String::from_utf8_lossy(&answer).contains("HTTP/1.1 200"), "plain HTTP was answered");

    // Rotation: the 5-day certificate in place of the 30-day one, SIGHUP.
    std::fs::copy(pki.path("short.pem"), &cert).unwrap();
    std::fs::copy(pki.path("short.key"), &key).unwrap();
    p.signal("-HUP");
    p.wait_logged("admin endpoint: TLS certificate (re)loaded");
    p.wait_logged(&format!("tls_cert {cert}: the certificate expires in "));
    assert!((4..=5).contains(&admin_days_left(&p, &ca)), "new connections see the new certificate");
    // A key that does not match is refused on SIGHUP; the old pair stays.
    std::fs::copy(pki.path("client.key"), &key).unwrap();
    p.signal("-HUP");
    p.wait_logged("admin endpoint: TLS files refused, the old ones stay");
    assert!((4..=5).contains(&admin_days_left(&p, &ca)), "the old pair stays");
}

/// With --admin-tls-client-ca, a client without a certificate, or with
/// one from another CA, is refused at the handshake; one with a good
/// certificate is served. Without a certificate on loopback, the flags are
/// checked: `-t` names a key that does not match.
#[test]
fn the_admin_endpoint_can_require_client_certificates() {
    let pki = pki::Pki::new();
    let config = pki.dir.join("p.yml");
    std::fs::write(&config, "web:\n  listen: 127.0.0.1:0\n  servers:\n   - 127.0.0.1:41001:1 a\n").unwrap();
    let (ca, cert, key) = (pki.path("ca.pem"), pki.path("server.pem"), pki.path("server.key"));
    let p = Proxy::start(&[
        "-c",
        config.to_str().unwrap(),
        "--admin",
        "127.0.0.1:0",
        "--admin-tls-cert",
        &cert,
        "--admin-tls-key",
        &key,
        "--admin-tls-client-ca",
        &ca,
    ]);
    assert!(https(p.admin, &ca, None, &get("/stats")).is_err(), "no client certificate");
    let other = (pki.path("other-client.pem"), pki.path("other-client.key"));
    assert!(https(p.admin, &ca, Some((&other.0, &other.1)), &get("/stats")).is_err(), "another CA's");
    let good = (pki.path("client.pem"), pki.path("client.key"));
    let ok = https(p.admin, &ca, Some((&good.0, &good.1)), &get("/stats")).unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");

    let check = Command::new(env!("CARGO_BIN_EXE_chash"))
        .args(["proxy", "-t", "-c", config.to_str().unwrap(), "--admin-tls-cert", &cert, "--admin-tls-key"])
        .arg(pki.path("client.key"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stderr);
    assert!(!check.status.success() && said.contains("the admin endpoint"), "{said}");
    assert!(said.contains("client.key"), "names the key: {said}");
}

fn run_ok(command: &mut Command) -> String {
    let out = command.output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{command:?}: {said}");
    said
}

/// The metric names a text uses: every `chash_...` word.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = std::collections::BTreeSet::new();
    for (at, _) in text.match_indices("chash_") {
        if text[..at].chars().next_back().is_some_and(word) {
            continue;
        }
        let end = text[at..].find(|c: char| !word(c)).map_or(text.len(), |n| at + n);
        names.insert(text[at..end].to_owned());
    }
    names
}

/// Every `expr` of the dashboard (its panels' queries).
fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// The monitoring kit: the alert rules pass `promtool check rules` and
/// their unit tests (`promtool test rules`), which fire every alert; the
/// dashboard's queries are PromQL promtool accepts; and every metric the
/// rules and the dashboard name is one a proxy's `/metrics` exports (a
/// proxy with every kind of metric: a fleet member, TLS to clients and to
/// servers, a Redis pool, a client limit, the admin endpoint over HTTPS).
#[test]
fn the_monitoring_kit_reads_what_the_proxy_exports() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let prometheus = root.join("deploy/prometheus");
    let rules = std::fs::read_to_string(prometheus.join("chash-alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(prometheus.join("chash-alerts.test.yml")).unwrap();
    let dashboard = std::fs::read_to_string(root.join("deploy/grafana/chash-proxies.json")).unwrap();
    let promtool = require("promtool", "prometheus");
    run_ok(Command::new(&promtool).args(["check", "rules", "chash-alerts.yml"]).current_dir(&prometheus));
    let tested =
        run_ok(Command::new(&promtool).args(["test", "rules", "chash-alerts.test.yml"]).current_dir(&prometheus));
    assert!(tested.contains("SUCCESS"), "{tested}");
    let alerts: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).collect();
    assert!(alerts.len() >= 10, "{alerts:?}");
    for alert in &alerts {
        assert!(tests.contains(&format!("alertname: {alert}\n")), "alert {alert} has no unit test");
    }

    let parsed: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    exprs(&parsed, &mut queries);
    assert!(queries.len() >= 20, "{} queries", queries.len());
    let mut as_rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in queries.iter().enumerate() {
        let q = q.replace("$__rate_interval", "5m").replace("$job", ".*").replace("$pool", ".*");
        as_rules.push_str(&format!("      - record: dashboard:query{i}\n        expr: |\n          {q}\n"));
    }
    let pki = pki::Pki::new();
    let dashboard_rules = pki.dir.join("dashboard-rules.yml");
    std::fs::write(&dashboard_rules, as_rules).unwrap();
    run_ok(Command::new(&promtool).arg("check").arg("rules").arg(&dashboard_rules));

    // A fleet member started from its membership cache (etcd is not there:
    // its membership metrics say so), with every kind of pool.
    let (cert, key, ca) = (pki.path("server.pem"), pki.path("server.key"), pki.path("ca.pem"));
    let (client_cert, client_key) = (pki.path("client.pem"), pki.path("client.key"));
    let cache = pki.dir.join("membership-cache.yml");
    std::fs::write(
        &cache,
        format!(
            "# chash membership cache: /kit/config revision 3 (config hash 0); written by the proxy after applying it\n\
             cache:\n  listen: 127.0.0.1:0\n  client_connections: 100\n  tls_cert: {cert}\n  tls_key: {key}\n\
             \x20 server_tls: true\n  server_tls_ca: {ca}\n  server_tls_cert: {client_cert}\n  server_tls_key: {client_key}\n\
             \x20 servers:\n   - 127.0.0.1:41001:1 a\n\
             sessions:\n  listen: 127.0.0.1:0\n  redis: true\n  servers:\n   - 127.0.0.1:41002:1 b\n"
        ),
    )
    .unwrap();
    let p = Proxy::start(&[
        "--membership",
        "etcd://127.0.0.1:1/kit",
        "--membership-cache",
        cache.to_str().unwrap(),
        "--admin",
        "127.0.0.1:0",
        "--admin-tls-cert",
        &cert,
        "--admin-tls-key",
        &key,
    ]);
    let metrics = https(p.admin, &ca, None, &get("/metrics")).unwrap();
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    let exported: std::collections::BTreeSet<&str> = metrics
        .split_once("\r\n\r\n")
        .unwrap()
        .1
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap())
        .collect();
    let used: std::collections::BTreeSet<String> =
        metric_names(&rules).into_iter().chain(metric_names(&dashboard)).collect();
    assert!(used.len() >= 25, "{used:?}");
    let missing: Vec<&String> = used.iter().filter(|n| !exported.contains(n.as_str())).collect();
    assert!(missing.is_empty(), "the kit uses metrics /metrics does not export: {missing:?}\nexported: {exported:?}");
}
