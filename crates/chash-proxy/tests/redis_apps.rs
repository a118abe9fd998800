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
    let mut yml =
        String::from("alpha:\n  listen: 127.0.0.1:0\n  redis: true\n  hash: md5\n  timeout: 5000\n  servers:\n");
    for (i, s) in servers.iter().enumerate() {
        yml.push_str(&format!("   - {}:1 s{}\n", s.id(), i + 1));
    }
    let proxy = Proxy::start(&yml);
    // redis-cli's own scan loop, before the script flushes: 300 keys.
    let keys: Vec<String> = (0..300).map(|i| format!("cli:{i}")).collect();
    let mut session: Vec<Vec<&str>> = Vec::new();
    session.extend(keys.iter().map(|k| vec!["SET", k.as_str(), "v"]));
    let commands: Vec<&[&str]> = session.iter().map(Vec::as_slice).collect();
    assert!(support::redis_session(proxy.addr, &commands).iter().all(|r| r == "+OK"));
    let out = Command::new(require("redis-cli", "redis-tools"))
        .args(["-h", "127.0.0.1", "-p", &proxy.addr.port().to_string(), "--scan", "--pattern", "cli:1*"])
        .output()
        .unwrap();
    let mut listed: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
    listed.sort();
    let mut expected: Vec<String> = keys.iter().filter(|k| k.starts_with("cli:1")).cloned().collect();
    expected.sort();
    assert_eq!(listed, expected, "redis-cli --scan: every match once");

    let line = format!("{}:1 s4", added.id());
    run_script("redis_keyspace.py", &[&proxy.addr.to_string(), &proxy.admin.to_string(), &line]);
}
