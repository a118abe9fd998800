//! The client libraries people use, through the proxy (Python ones, which
//! the test command installs): what a new user would run.

mod support;

use std::process::Command;

use support::{memcacheds, require, run_script, Memcached, Proxy};

/// A get_many of 1,000 keys of 250 bytes (a get line of 250 KB): before,
/// pymemcache raised "line too long" and pylibmc and python-memcached
/// silently got nothing.
#[test]
fn long_multi_gets_from_python_clients() {
    let mc = memcacheds(3);
    let refs: Vec<&Memcached> = mc.iter().collect();
    let proxy = Proxy::start(&support::config("  hash: md5\n", &refs));
    run_script("memcache_get_many.py", &[&proxy.addr.to_string()]);
}

/// php-memcached's getVersion() and getStats() (libmemcached sends
/// `version` first and gives up unless the reply is a version number:
/// before, both returned false through the proxy) and pylibmc's
/// get_stats(); then the everyday calls.
#[test]
fn libmemcached_clients_read_version_and_stats() {
    let mc = memcacheds(2);
    let refs: Vec<&Memcached> = mc.iter().collect();
    let proxy = Proxy::start(&support::config("", &refs));
    let php = require("php", "php-cli");
    let path = format!("{}/tests/clients/php_memcached.php", env!("CARGO_MANIFEST_DIR"));
    // With PHP sessions in memcached, in the text protocol (README: Debian
    // defaults memcached.sess_binary_protocol to On).
    let out = Command::new(php)
        .args(["-d", "session.save_handler=memcached", "-d", "memcached.sess_binary_protocol=0"])
        .args(["-d", &format!("session.save_path={}", proxy.addr), "-d", "session.use_cookies=0"])
        .arg(&path)
        .arg(proxy.addr.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("session: stored and read back"),
        "php_memcached.php failed:\n{text}"
    );
    run_script("pylibmc_stats.py", &[&proxy.addr.to_string()]);
}

/// A Redis value over `--max-value-size` gets an error redis-py can read,
/// naming the limit and the flag, and the connection goes on (before, the
/// proxy closed it: redis-py reported a broken pipe after 3.5 s of
/// retries).
#[test]
fn redis_py_is_told_the_value_limit() {
    let redis = support::Redis::start(None);
    let yml = format!("alpha:\n  listen: 127.0.0.1:0\n  redis: true\n  servers:\n   - {}:1\n", redis.id());
    let mut options = chash_proxy::ProxyOptions::default();
    options.max_value_size = Some(1 << 20);
    let proxy = Proxy::start_with(&yml, options, None);
    run_script("redis_too_large.py", &[&proxy.addr.to_string()]);
}

/// redis-py's default pipeline is a MULTI/EXEC transaction: it runs when
/// its keys share a server (hash tags), and when they do not nothing of it
/// runs (before, the refused MULTI left its commands to run one by one).
#[test]
fn redis_py_transactions() {
    let redis = [support::Redis::start(None), support::Redis::start(None), support::Redis::start(None)];
    let mut yml = "alpha:\n  listen: 127.0.0.1:0\n  redis: true\n  hash_tag: \"{}\"\n  servers:\n".to_owned();
    for r in &redis {
        yml.push_str(&format!("   - {}:1\n", r.id()));
    }
    let proxy = Proxy::start(&yml);
    let routes = proxy.handle.pools()[0].config().snapshot().unwrap();
    let owner = |k: &str| routes.route(k.as_bytes()).unwrap().to_owned();
    let one = "tx:0".to_owned();
    let other = (1..).map(|i| format!("tx:{i}")).find(|k| owner(k) != owner(&one)).unwrap();
    run_script("redis_transactions.py", &[&proxy.addr.to_string(), &one, &other]);
}

/// redis-py with its defaults (RESP3, `HELLO 3`) and in RESP2 mode: the
/// same workload through the proxy (three servers) and straight to one
/// redis-server gives equal results (maps, sets, doubles, nulls included);
/// and `redis-cli -3` too.
#[test]
fn redis_py_resp3_and_resp2_match_redis() {
    let redis = [support::Redis::start(None), support::Redis::start(None), support::Redis::start(None)];
    let direct = support::Redis::start(None);
    let mut yml = "alpha:\n  listen: 127.0.0.1:0\n  redis: true\n  servers:\n".to_owned();
    for r in &redis {
        yml.push_str(&format!("   - {}:1\n", r.id()));
    }
    let proxy = Proxy::start(&yml);
    run_script("redis_resp3.py", &[&proxy.addr.to_string(), &direct.id()]);
    let cli = require("redis-cli", "redis-tools");
    let run = |port: u16, args: &[&str]| {
        let out =
            Command::new(&cli).args(["-3", "-h", "127.0.0.1", "-p", &port.to_string()]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for port in [proxy.addr.port(), direct.port] {
        run(port, &["HSET", "cli:h", "a", "1", "b", "2"]);
        run(port, &["ZADD", "cli:z", "1.5", "m"]);
    }
    for args in [&["HGETALL", "cli:h"][..], &["ZSCORE", "cli:z", "m"], &["GET", "cli:none"], &["HELLO", "3"]] {
        let (via, straight) = (run(proxy.addr.port(), args), run(direct.port, args));
        if args[0] == "HELLO" {
            assert!(via.contains("proto") && via.contains("3"), "{via}");
        } else {
            assert_eq!(via, straight, "redis-cli -3 {args:?}");
        }
    }
}

/// meta-memcache (a client that speaks only the meta protocol) through the
/// proxy in front of four memcached: its commands and recipes, and 20
/// clients at once with values naming their keys; the keys land on all four.
#[test]
fn meta_memcache_through_the_proxy() {
    let mc = memcacheds(4);
    let refs: Vec<&Memcached> = mc.iter().collect();
    let proxy = Proxy::start(&support::config("", &refs));
    run_script("memcached_meta.py", &[&proxy.addr.to_string()]);
    let keys: Vec<String> = (0..2000).map(|i| format!("w{}:k{}", i / 100, i % 100)).collect();
    for m in &mc {
        let held = m.holds_each(&keys).into_iter().filter(|&h| h).count();
        assert!(held > 0, "{} holds none of the 2,000 keys", m.id());
    }
}

/// pymemcache, python-memcached and meta-memcache (Dalli's protocol)
/// through a pool with `warmup`: keys they stored before a server is
/// removed all read back after it (multi-gets and `mg`), found on the
/// removed server and copied to their new ones.
#[test]
fn client_libraries_lose_no_key_across_a_change_with_warmup() {
    let mc = memcacheds(3);
    let refs: Vec<&Memcached> = mc.iter().collect();
    let proxy = Proxy::start(&support::ring_config("  warmup: 600\n", &refs));
    let addr = proxy.addr.to_string();
    run_script("warmup_clients.py", &[&addr, "write"]);
    let (status, body) = proxy.admin("DELETE", &format!("/pools/alpha/servers/{}", mc[1].id()), "");
    assert_eq!(status, 200, "{body}");
    run_script("warmup_clients.py", &[&addr, "read"]);
    let (_, stats) = proxy.admin("GET", "/stats", "");
    let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert!(v["pools"][0]["warmup_copies"].as_u64().unwrap() > 300, "{stats}");
}
