//! Memory under hostile clients, measured on a `chash proxy` process (its
//! RSS from /proc): clients that pipeline large gets and never read cannot
//! make it hold more than their reply budgets, and a normal client is
//! served throughout.

#[path = "../../chash-proxy/tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::{free_port, memcacheds, Memcached, Redis};

/// A `chash proxy -c FILE` process (and the directory of its config).
struct ProxyProcess {
    child: Child,
    dir: std::path::PathBuf,
}

impl ProxyProcess {
    fn start(config: &str, listen: u16) -> ProxyProcess {
        let dir = std::env::temp_dir().join(format!("chash-mem-{}-{listen}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("proxy.yml");
        std::fs::write(&path, config).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_chash"))
            .args(["proxy", "-c", path.to_str().unwrap(), "--admin", "127.0.0.1:0", "--no-stats", "-v", "4"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        support::wait_listening(listen);
        ProxyProcess { child, dir }
    }

    /// Resident memory, in KiB.
    fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }

    /// A figure of /proc/PID/status, in KiB (`VmHWM:`: the peak RSS).
    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three clients each pipeline 2,000 requests for a 1 MiB value and never
/// read; a fourth makes small requests meanwhile. Returns the proxy's peak
/// RSS growth (MiB) and the fourth client's request latencies, sorted.
fn hostile_clients(
    proxy: &ProxyProcess,
    addr: SocketAddr,
    request: &'static [u8],
    normal: fn(&mut Normal),
) -> (f64, Vec<Duration>) {
    thread::sleep(Duration::from_millis(200));
    let idle = proxy.rss_kib();
    let stop = Arc::new(AtomicBool::new(false));
    let hostile: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
                let mut sent = 0;
                // Never reads; writes until the proxy stops reading.
                while sent < 2000 && !stop.load(Relaxed) {
                    if s.write_all(request).is_ok() {
                        sent += 1;
                    }
                }
                while !stop.load(Relaxed) {
                    thread::sleep(Duration::from_millis(20));
                }
                s
            })
        })
        .collect();
    let mut peak = idle;
    let mut latencies = Vec::new();
    let mut n = Normal::connect(addr);
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let started = Instant::now();
        normal(&mut n);
        latencies.push(started.elapsed());
        peak = peak.max(proxy.rss_kib());
        thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Relaxed);
    for h in hostile {
        drop(h.join().unwrap());
    }
    latencies.sort();
    ((peak - idle) as f64 / 1024.0, latencies)
}

/// `p50 / p99 / max` of sorted latencies.
fn summary(l: &[Duration]) -> String {
    let at = |q: f64| l[((l.len() as f64 * q) as usize).min(l.len() - 1)];
    format!("{:?} / {:?} / {:?} over {} requests", at(0.5), at(0.99), l[l.len() - 1], l.len())
}

/// The normal client.
struct Normal {
    r: BufReader<TcpStream>,
    w: TcpStream,
    i: u64,
}

impl Normal {
    fn connect(addr: SocketAddr) -> Normal {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Normal { r: BufReader::new(s.try_clone().unwrap()), w: s, i: 0 }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        l
    }
}

fn normal_memcached(n: &mut Normal) {
    n.i += 1;
    let key = format!("normal:{}", n.i % 50);
    n.w.write_all(format!("set {key} 0 0 5\r\nhello\r\nget {key}\r\n").as_bytes()).unwrap();
    assert_eq!(n.line(), "STORED\r\n");
    assert!(n.line().starts_with("VALUE "));
    let mut rest = [0u8; 7 + 5];
    n.r.read_exact(&mut rest).unwrap();
    assert_eq!(&rest, b"hello\r\nEND\r\n");
}

fn normal_redis(n: &mut Normal) {
    n.i += 1;
    let key = format!("normal:{}", n.i % 50);
    let cmd = format!(
        "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$5\r\nhello\r\n*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n",
        key.len(),
        key.len()
    );
    n.w.write_all(cmd.as_bytes()).unwrap();
    assert_eq!(n.line(), "+OK\r\n");
    assert_eq!(n.line(), "$5\r\n");
    assert_eq!(n.line(), "hello\r\n");
}

#[test]
fn clients_that_never_read_cannot_pin_memory_memcached() {
    let mc = memcacheds(4);
    let listen = free_port();
    let mut yml = format!("alpha:\n  listen: 127.0.0.1:{listen}\n  hash: md5\n  servers:\n");
    for m in &mc {
        yml.push_str(&format!("   - {}:1\n", m.id()));
    }
    let proxy = ProxyProcess::start(&yml, listen);
    let addr = SocketAddr::from(([127, 0, 0, 1], listen));
    let mut c = support::Client::connect(addr);
    // A little under memcached's 1 MiB item limit.
    assert_eq!(c.set("big", &vec![b'x'; 1_000_000]), "STORED\r\n");
    let (grew, latencies) = hostile_clients(&proxy, addr, b"get big\r\n", normal_memcached);
    println!("memcached: RSS grew {grew:.1} MiB; the normal client's p50 / p99 / max: {}", summary(&latencies));
    assert!(grew < 100.0, "three clients that never read pinned {grew:.1} MiB");
    assert!(
        latencies[latencies.len() - 1] < Duration::from_secs(1),
        "the normal client waited: {}",
        summary(&latencies)
    );
    // Still serving, and the hostile clients' connections are gone.
    assert_eq!(c.set("after", b"1"), "STORED\r\n");
}

#[test]
fn clients_that_never_read_cannot_pin_memory_redis() {
    let rs: Vec<Redis> = (0..2).map(|_| Redis::start(None)).collect();
    let listen = free_port();
    let mut yml = format!("alpha:\n  listen: 127.0.0.1:{listen}\n  redis: true\n  servers:\n");
    for r in &rs {
        yml.push_str(&format!("   - {}:1\n", r.id()));
    }
    let proxy = ProxyProcess::start(&yml, listen);
    let addr = SocketAddr::from(([127, 0, 0, 1], listen));
    let mut n = Normal::connect(addr);
    let value = "x".repeat(1 << 20);
    n.w.write_all(format!("*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n${}\r\n{value}\r\n", value.len()).as_bytes()).unwrap();
    assert_eq!(n.line(), "+OK\r\n");
    let (grew, latencies) = hostile_clients(&proxy, addr, b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n", normal_redis);
    println!("redis: RSS grew {grew:.1} MiB; the normal client's p50 / p99 / max: {}", summary(&latencies));
    assert!(grew < 100.0, "three clients that never read pinned {grew:.1} MiB");
    assert!(
        latencies[latencies.len() - 1] < Duration::from_secs(1),
        "the normal client waited: {}",
        summary(&latencies)
    );
    normal_redis(&mut n);
}

/// The value of big key `i`: 1,000,000 bytes (a little under memcached's
/// 1 MiB item), each key's its own.
fn big_value(i: usize) -> Vec<u8> {
    let mut v = format!("{i:07}|").repeat(1_000_000 / 8);
    v.truncate(1_000_000);
    v.into_bytes()
}

/// Reads one retrieval reply: (key, data) of each value, until `END`.
fn read_values(r: &mut BufReader<TcpStream>) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut out = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).map_err(|e| e.to_string())?;
        if line == "END\r\n" {
            return Ok(out);
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() < 4 || words[0] != "VALUE" {
            return Err(format!("after {} values: {line:?}", out.len()));
        }
        let mut data = vec![0; words[3].parse::<usize>().unwrap() + 2];
        r.read_exact(&mut data).map_err(|e| e.to_string())?;
        data.truncate(data.len() - 2);
        out.push((words[1].to_owned(), data));
    }
}

/// A multi-get of 150, and of 300, values of 1 MB over 4 servers (a
/// php-memcached getMulti of large values), 20 tries each, by a client that
/// reads as it goes: every value every time (before, about half the tries
/// of 150 and every try of 300 got `SERVER_ERROR ... the client holds too
/// many unread replies` and nothing else), through pylibmc's get_multi too,
/// while the proxy's peak RSS stays a fraction of one reply (the parts are
/// streamed, not held).
#[test]
fn large_multi_gets_stream_every_value() {
    let mc: Vec<Memcached> = (0..4).map(|_| Memcached::start_with_memory(160)).collect();
    let listen = free_port();
    let mut yml = format!("alpha:\n  listen: 127.0.0.1:{listen}\n  hash: md5\n  servers:\n");
    for m in &mc {
        yml.push_str(&format!("   - {}:1\n", m.id()));
    }
    let proxy = ProxyProcess::start(&yml, listen);
    let addr = SocketAddr::from(([127, 0, 0, 1], listen));
    let mut c = support::Client::connect(addr);
    let values: Vec<Vec<u8>> = (0..300).map(big_value).collect();
    for (i, v) in values.iter().enumerate() {
        assert_eq!(c.set(&format!("big:{i}"), v), "STORED\r\n", "big:{i}");
    }
    let keys: Vec<String> = (0..300).map(|i| format!("big:{i}")).collect();
    let held: Vec<usize> = mc.iter().map(|m| m.holds_each(&keys).iter().filter(|&&h| h).count()).collect();
    assert_eq!(held.iter().sum::<usize>(), 300, "every key stored once: {held:?}");
    assert!(held.iter().filter(|&&n| n > 0).count() >= 3, "the keys are spread over the servers: {held:?}");
    let base = proxy.rss_kib();
    let started = Instant::now();
    for n in [150, 300] {
        let keys: Vec<String> = (0..n).map(|i| format!("big:{i}")).collect();
        let line = format!("get {}\r\n", keys.join(" "));
        for attempt in 0..20 {
            let s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            (&s).write_all(line.as_bytes()).unwrap();
            let mut r = BufReader::new(s);
            let got = read_values(&mut r).unwrap_or_else(|e| panic!("{n} values, try {attempt}: {e}"));
            assert_eq!(got.len(), n, "{n} values, try {attempt}");
            let mut seen = std::collections::HashSet::new();
            for (key, data) in got {
                let i: usize = key.strip_prefix("big:").unwrap().parse().unwrap();
                assert!(data == values[i], "{key}: wrong data");
                assert!(seen.insert(i), "{key} twice");
            }
        }
    }
    println!("raw: {:?}", started.elapsed());
    // pylibmc (libmemcached) reads them as an application would.
    let python = support::require("python3", "python3");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../chash-proxy/tests/clients/large_get_multi.py");
    let started = Instant::now();
    let out = Command::new(python).args([script, &addr.to_string(), "20"]).output().unwrap();
    println!("pylibmc: {:?}", started.elapsed());
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "large_get_multi.py:\n{text}");
    // And php-memcached's getMulti.
    let php = support::require("php", "php-cli");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../chash-proxy/tests/clients/php_large_get_multi.php");
    let started = Instant::now();
    let out = Command::new(php).args(["-d", "memory_limit=-1", script, &addr.to_string(), "20"]).output().unwrap();
    println!("php-memcached: {:?}", started.elapsed());
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "php_large_get_multi.php:\n{text}");
    // The peak over all of it: the raw gets and both libraries'.
    let peak = proxy.status_kib("VmHWM:");
    let grew = peak.saturating_sub(base) as f64 / 1024.0;
    println!(
        "multi-gets of 150 and 300 MB: the proxy's peak RSS {:.1} MiB ({grew:.1} MiB over its RSS before them)",
        peak as f64 / 1024.0
    );
    assert!(grew < 64.0, "the proxy held {grew:.1} MiB for multi-gets it should stream");
}
