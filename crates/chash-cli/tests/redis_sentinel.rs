//! Redis pools on Sentinel groups (issue 29), end to end: real
//! redis-servers (2 groups, each a primary and 2 replicas), 3 real
//! redis-sentinels, two `chash proxy` processes on one config, and 20
//! client threads writing versioned values through them while a group
//! fails over (`SENTINEL FAILOVER`, then a primary killed). Every process
//! started here is killed when its handle drops. The tests take turns.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::*;
use common::require;

/// A redis-sentinel watching the groups it is given.
struct Sentinel {
    port: u16,
    child: Child,
}

impl Sentinel {
    fn start(dir: &TempDir, groups: &[(&str, &Redis)]) -> Sentinel {
        let port = free_port();
        let log = dir.path(&format!("sentinel-{port}.log"));
        let mut conf = format!(
            "port {port}\nbind 127.0.0.1\ndaemonize no\nsentinel announce-ip 127.0.0.1\nlogfile {}\n",
            log.display()
        );
        for (name, primary) in groups {
            conf.push_str(&format!(
                "sentinel monitor {name} 127.0.0.1 {} 2\nsentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 10000\nsentinel parallel-syncs {name} 1\n",
                primary.port
            ));
        }
        let path = dir.path(&format!("sentinel-{port}.conf"));
        std::fs::write(&path, conf).unwrap();
        let child = Command::new(require("redis-sentinel", "redis-sentinel"))
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let s = Sentinel { port, child };
        eventually(10, "redis-sentinel listens", || TcpStream::connect(("127.0.0.1", port)).is_ok());
        s
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `SENTINEL MASTER NAME` as field → value.
    fn master(&self, name: &str) -> HashMap<String, String> {
        let mut c = Resp::connect(SocketAddr::from(([127, 0, 0, 1], self.port)));
        let Reply::Array(items) = c.ask(&["SENTINEL", "MASTER", name]) else { panic!("SENTINEL MASTER") };
        let strings: Vec<String> = items
            .into_iter()
            .map(|i| match i {
                Reply::Bulk(s) => s,
                other => panic!("{other:?}"),
            })
            .collect();
        strings.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One group: a primary and its two replicas.
struct Group {
    name: &'static str,
    servers: Vec<Redis>,
}

impl Group {
    fn start(name: &'static str) -> Group {
        let primary = Redis::start();
        let port = primary.port.to_string();
        let mut servers = vec![primary];
        for _ in 0..2 {
            servers.push(Redis::start_with(&["--replicaof", "127.0.0.1", &port]));
        }
        Group { name, servers }
    }

    fn by_id(&self, id: &str) -> &Redis {
        self.servers.iter().find(|r| r.id() == id).unwrap_or_else(|| panic!("{id} is not in group {}", self.name))
    }
}

/// `ROLE` of a server: `master` or `slave`.
fn role(r: &Redis) -> String {
    let mut c = Resp::connect(SocketAddr::from(([127, 0, 0, 1], r.port)));
    match c.ask(&["ROLE"]) {
        Reply::Array(items) => match &items[0] {
            Reply::Bulk(role) => role.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("ROLE: {other:?}"),
    }
}

/// The whole set-up: groups, Sentinels that know each other and the
/// replicas, and a config naming the groups.
struct Fleet {
    dir: TempDir,
    groups: Vec<Group>,
    sentinels: Vec<Sentinel>,
}

impl Fleet {
    fn start(name: &str) -> Fleet {
        let dir = TempDir::new(&format!("sentinel-{name}"));
        let groups = vec![Group::start("g1"), Group::start("g2")];
        let named: Vec<(&str, &Redis)> = groups.iter().map(|g| (g.name, &g.servers[0])).collect();
        let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(&dir, &named)).collect();
        // A failover needs the replicas known and, when a primary dies,
        // a quorum of Sentinels that know each other.
        eventually(30, "every Sentinel knows 2 replicas and 2 other Sentinels per group", || {
            sentinels.iter().all(|s| {
                groups.iter().all(|g| {
                    let m = s.master(g.name);
                    m["num-slaves"] == "2" && m["num-other-sentinels"] == "2"
                })
            })
        });
        Fleet { dir, groups, sentinels }
    }

    fn config(&self, extra: &str) -> std::path::PathBuf {
        let sentinels: Vec<String> = self.sentinels.iter().map(Sentinel::addr).collect();
        let text = format!(
            "cache:\n  listen: 127.0.0.1:22121\n  redis: true\n  distribution: ketama\n  timeout: 8000\n  \
             sentinels: [{}]\n{extra}  servers:\n   - g1:1\n   - g2:1\n",
            sentinels.join(", ")
        );
        let path = self.dir.path("sentinel.yml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn group(&self, name: &str) -> &Group {
        self.groups.iter().find(|g| g.name == name).unwrap()
    }

    /// The group's primary, as the Sentinels agree on it.
    fn primary(&self, name: &str) -> String {
        let m = self.sentinels[0].master(name);
        format!("{}:{}", m["ip"], m["port"])
    }

    /// Each group's primary once its failovers are over: every Sentinel
    /// names the same one with no failover under way (flags `master`
    /// alone), it says `ROLE` master, and that has held for [`SETTLED`].
    /// A failover can follow another: the Sentinels here declare a server
    /// down after 1 s without an answer to their pings, and a primary
    /// promoted a moment ago is sometimes found down and failed over again
    /// (the proxies follow; what was acknowledged is on the last primary).
    fn settled(&self, groups: &[&str]) -> HashMap<String, String> {
        let mut since: Option<(HashMap<String, String>, Instant)> = None;
        let mut last = String::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now: Option<HashMap<String, String>> = groups
                .iter()
                .map(|g| {
                    let views: Vec<HashMap<String, String>> = self.sentinels.iter().map(|s| s.master(g)).collect();
                    let named: Vec<String> = views.iter().map(|m| format!("{}:{}", m["ip"], m["port"])).collect();
                    last = format!("{g}: {:?}", views.iter().map(|m| (&m["port"], &m["flags"])).collect::<Vec<_>>());
                    let calm = views.iter().all(|m| m["flags"] == "master") && named.iter().all(|n| *n == named[0]);
                    // (A killed primary refuses connections: no `ROLE`.)
                    let answers = |r: &Redis| TcpStream::connect(("127.0.0.1", r.port)).is_ok();
                    let master = calm
                        && self
                            .group(g)
                            .servers
                            .iter()
                            .any(|r| r.id() == named[0] && answers(r) && role(r) == "master");
                    master.then(|| (g.to_string(), named[0].clone()))
                })
                .collect();
            since = match (now, since) {
                (Some(now), Some((before, at))) if now == before => {
                    if at.elapsed() >= SETTLED {
                        return now;
                    }
                    Some((now, at))
                }
                (Some(now), _) => Some((now, Instant::now())),
                (None, _) => None,
            };
            assert!(Instant::now() < deadline, "not within 60 s: the groups settle on a primary each ({last})");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// How long a group's Sentinels must agree, calm, on its primary before
/// it is taken as settled: past the time a ping may go unanswered.
const SETTLED: Duration = Duration::from_millis(2500);

/// The primary a proxy uses for a group (its `/stats`).
fn proxy_primary(p: &Proxy, group: &str) -> Option<String> {
    let pool = p.pool();
    let server = pool["servers"].as_array()?.iter().find(|s| s["id"] == group)?.clone();
    server["group"]["primary"].as_str().map(str::to_owned)
}

/// A write's outcome.
#[derive(Clone, Copy)]
struct Outcome {
    /// When the request was sent.
    sent: Instant,
    /// When its reply (or failure) was read.
    at: Instant,
    ok: bool,
    version: u64,
}

/// What the writers did to one key: the last version acknowledged, the
/// last one sent, and every write's outcome.
#[derive(Default)]
struct KeyLog {
    acked: u64,
    sent: u64,
    outcomes: Vec<Outcome>,
}

/// 20 threads writing `KEY = VERSION` (versions rising per key, each
/// thread its own keys) through the proxies, in turn, until stopped.
struct Writers {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    log: Arc<Mutex<HashMap<String, KeyLog>>>,
}

impl Writers {
    fn start(proxies: &[&Proxy]) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let log: Arc<Mutex<HashMap<String, KeyLog>>> = Arc::default();
        let threads = (0..20)
            .map(|t| {
                let addr = proxies[t % proxies.len()].addr.clone();
                let (stop, log) = (stop.clone(), log.clone());
                std::thread::spawn(move || write_loop(t, &addr, &stop, &log))
            })
            .collect();
        Writers { stop, threads, log }
    }

    fn finish(self) -> HashMap<String, KeyLog> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        Arc::try_unwrap(self.log).ok().unwrap().into_inner().unwrap()
    }
}

fn write_loop(t: usize, addr: &str, stop: &AtomicBool, log: &Mutex<HashMap<String, KeyLog>>) {
    let keys: Vec<String> = (0..10).map(|k| format!("w{t}:k{k}")).collect();
    let mut conn: Option<(TcpStream, BufReader<TcpStream>)> = None;
    let mut version = 0u64;
    while !stop.load(Ordering::Relaxed) {
        version += 1;
        for key in &keys {
            if conn.is_none() {
                let Ok(s) = TcpStream::connect(addr) else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                conn = Some((s.try_clone().unwrap(), BufReader::new(s)));
            }
            let Some((w, r)) = conn.as_mut() else { continue };
            let value = version.to_string();
            log.lock().unwrap().entry(key.clone()).or_default().sent = version;
            let sent = Instant::now();
            let cmd = format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n", key.len(), value.len());
            let mut line = String::new();
            let ok = w.write_all(cmd.as_bytes()).is_ok() && r.read_line(&mut line).is_ok_and(|n| n > 0);
            let acked = ok && line.starts_with("+OK");
            if !ok {
                conn = None;
            }
            let mut l = log.lock().unwrap();
            let entry = l.get_mut(key).unwrap();
            if acked {
                entry.acked = version;
            }
            entry.outcomes.push(Outcome { sent, at: Instant::now(), ok: acked, version });
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Which group each key is placed on (`chash route`).
fn groups_of(config: &std::path::Path, keys: &[&String]) -> HashMap<String, String> {
    let mut args = vec!["route".to_owned(), "-c".to_owned(), config.display().to_string()];
    args.extend(keys.iter().map(|k| k.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    chash(&args).lines().filter_map(|l| l.split_once('\t')).map(|(k, g)| (k.to_owned(), g.to_owned())).collect()
}

/// Every key holds a version at least its last acknowledged one (and no
/// more than the last sent), read from its group's primary; with `since`,
/// only acknowledged writes sent after it must be there (those a killed
/// primary acknowledged before it died may not have reached a replica:
/// Redis replicates asynchronously; such a reply can be read after the
/// kill, so what counts is when the write was sent), and those missing are
/// counted.
fn nothing_acknowledged_lost(
    fleet: &Fleet,
    proxies: &[&Proxy],
    primaries: &HashMap<String, String>,
    config: &std::path::Path,
    log: &HashMap<String, KeyLog>,
    since: Option<Instant>,
) -> (usize, usize) {
    let keys: Vec<&String> = log.keys().collect();
    let placed = groups_of(config, &keys);
    let (mut checked, mut lost_before) = (0, 0);
    for (key, l) in log {
        let group = &placed[key];
        let primary = fleet.group(group).by_id(&primaries[group]).port;
        let mut c = Resp::connect(SocketAddr::from(([127, 0, 0, 1], primary)));
        let got = match c.ask(&["GET", key]) {
            Reply::Bulk(v) => v.parse::<u64>().unwrap(),
            Reply::Nil => 0,
            other => panic!("{other:?}"),
        };
        let required = match since {
            None => l.acked,
            Some(t) => l.outcomes.iter().filter(|o| o.ok && o.sent > t).map(|o| o.version).max().unwrap_or(0),
        };
        assert!(
            got >= required && got <= l.sent,
            "{key} on {group}: holds version {got}, the last acknowledged was {} (sent up to {}); its last writes \
             (version, acknowledged, sent and answered in ms from the first shown): {:?}; what every server holds: \
             {:?}\n{}",
            required,
            l.sent,
            last_outcomes(&l.outcomes),
            everywhere(fleet, key),
            failover_log(fleet, proxies, group)
        );
        if got < l.acked {
            lost_before += 1;
        }
        checked += 1;
    }
    (checked, lost_before)
}

/// What every server of the fleet holds for `key`, for a failure's
/// message.
fn everywhere(fleet: &Fleet, key: &str) -> Vec<(String, String)> {
    let servers = fleet.groups.iter().flat_map(|g| g.servers.iter().map(move |r| (g.name, r)));
    servers
        .map(|(group, r)| {
            let addr = SocketAddr::from(([127, 0, 0, 1], r.port));
            let held = match TcpStream::connect(addr) {
                Ok(_) => format!("{} {:?}", role(r), Resp::connect(addr).ask_or_error(&["GET", key])),
                Err(e) => format!("down: {e}"),
            };
            (format!("{group} {}", r.id()), held)
        })
        .collect()
}

/// What the Sentinels logged about `group`, and each proxy's log lines
/// about groups and their connections (the last 80 of each), for a
/// failure's message.
fn failover_log(fleet: &Fleet, proxies: &[&Proxy], group: &str) -> String {
    let mut out = String::new();
    for s in &fleet.sentinels {
        let text = std::fs::read_to_string(fleet.dir.path(&format!("sentinel-{}.log", s.port))).unwrap_or_default();
        let about: Vec<&str> = text.lines().filter(|l| l.contains(&format!(" {group} "))).collect();
        out.push_str(&format!("Sentinel {}:\n", s.port));
        for line in &about[about.len().saturating_sub(80)..] {
            out.push_str(&format!("  | {line}\n"));
        }
    }
    for p in proxies {
        let log = p.log.lock().unwrap();
        let about: Vec<&String> = log
            .iter()
            .filter(|l| ["group", "primary", "Sentinel", "server", "failover"].iter().any(|w| l.contains(w)))
            .collect();
        out.push_str(&format!("proxy {}:\n", p.addr));
        for line in &about[about.len().saturating_sub(80)..] {
            out.push_str(&format!("  | {line}\n"));
        }
    }
    out
}

/// A key's last few writes, for a failure's message: version, whether
/// acknowledged, and when sent and answered (ms after the first shown).
fn last_outcomes(outcomes: &[Outcome]) -> Vec<(u64, bool, u128, u128)> {
    let last = &outcomes[outcomes.len().saturating_sub(6)..];
    let Some(first) = last.first() else { return Vec::new() };
    last.iter().map(|o| (o.version, o.ok, (o.sent - first.sent).as_millis(), (o.at - first.sent).as_millis())).collect()
}

/// The longest time without an acknowledged write among `group`'s keys
/// after `after`, and when it ended.
fn longest_gap(
    log: &HashMap<String, KeyLog>,
    placed: &HashMap<String, String>,
    group: &str,
    after: Instant,
) -> (Duration, Instant) {
    let mut acks: Vec<Instant> = log
        .iter()
        .filter(|(k, _)| placed[*k] == group)
        .flat_map(|(_, l)| l.outcomes.iter().filter(|o| o.ok).map(|o| o.at))
        .filter(|at| *at > after)
        .collect();
    acks.sort();
    let longest = acks.windows(2).max_by_key(|w| w[1] - w[0]).expect("writes were acknowledged");
    (longest[1] - longest[0], longest[1])
}

fn failures(log: &HashMap<String, KeyLog>, placed: &HashMap<String, String>, group: &str) -> usize {
    log.iter().filter(|(k, _)| placed[*k] == group).map(|(_, l)| l.outcomes.iter().filter(|o| !o.ok).count()).sum()
}

/// Waits until both proxies use `primary` for `group`; when they first
/// did.
fn switched_to(proxies: &[&Proxy], group: &str, primary: &str) -> Instant {
    eventually(30, &format!("every proxy uses {primary} for {group}"), || {
        proxies.iter().all(|p| proxy_primary(p, group).as_deref() == Some(primary))
    });
    Instant::now()
}

/// Waits until both proxies use the primary the Sentinels name for
/// `group` (asked again each time: another failover may follow); that
/// primary, and when they were first seen on it.
fn proxies_follow(fleet: &Fleet, proxies: &[&Proxy], group: &str) -> (String, Instant) {
    let mut named = String::new();
    eventually(30, &format!("every proxy uses the primary the Sentinels name for {group}"), || {
        named = fleet.primary(group);
        proxies.iter().all(|p| proxy_primary(p, group).as_deref() == Some(named.as_str()))
    });
    (named, Instant::now())
}

/// Once the writers have stopped: the primary each group settled on
/// ([`Fleet::settled`]), both proxies using it; the one `group` moved to
/// is named when it is not `first` (the group was failed over again).
fn await_settled(fleet: &Fleet, proxies: &[&Proxy], group: &str, first: &str) -> HashMap<String, String> {
    let primaries = fleet.settled(&["g1", "g2"]);
    for (g, p) in &primaries {
        switched_to(proxies, g, p);
    }
    if primaries[group] != first {
        eprintln!("{group} was failed over again, from {first} to {}", primaries[group]);
    }
    primaries
}

/// `chash fleet status` agrees, both proxies naming `primary` for `group`
/// (their reports follow a switch within a second).
fn fleet_status_names(url: &str, group: &str, primary: &str) {
    let mut last = String::new();
    eventually(10, &format!("chash fleet status shows both proxies on {primary} for {group}"), || {
        let (ok, out) = chash_status(&["fleet", "status", "--etcd", url]);
        let line = out.lines().find(|l| l.starts_with(&format!("group cache/{group}: primary"))).unwrap_or("");
        let done = ok && line.matches(&format!("={primary}")).count() == 2;
        last = out;
        done
    });
    eprintln!("{last}");
}

#[test]
fn writes_follow_a_failover_and_none_acknowledged_is_lost() {
    let _turn = serial();
    let fleet = Fleet::start("failover");
    let config = fleet.config("  sentinel_poll: 1000\n  failover_hold: 5000\n");
    // A fleet on etcd: `chash fleet status` compares the primaries.
    let etcd = Etcd::start(&fleet.dir);
    let url = etcd.url();
    chash(&["config", "put", "--etcd", &url, config.to_str().unwrap()]);
    // At debug level: a failure's message shows what the proxies did.
    let a = Proxy::on_etcd(&url, &["-v", "7"]);
    let b = Proxy::on_etcd(&url, &["-v", "7"]);
    let proxies = [&a, &b];
    for g in ["g1", "g2"] {
        let primary = fleet.primary(g);
        switched_to(&proxies, g, &primary);
    }

    // A manual failover of g1 while 20 clients write through both proxies.
    let writers = Writers::start(&proxies);
    std::thread::sleep(Duration::from_millis(500));
    let old = fleet.primary("g1");
    let mut s = Resp::connect(SocketAddr::from(([127, 0, 0, 1], fleet.sentinels[0].port)));
    let started = Instant::now();
    let _ = s.ask(&["SENTINEL", "FAILOVER", "g1"]);
    eventually(30, "the Sentinels name g1's new primary", || fleet.primary("g1") != old);
    let (new, switched) = proxies_follow(&fleet, &proxies, "g1");
    std::thread::sleep(Duration::from_millis(1000));
    let log = writers.finish();
    let primaries = await_settled(&fleet, &proxies, "g1", &new);

    let keys: Vec<&String> = log.keys().collect();
    let placed = groups_of(&config, &keys);
    assert!(placed.values().any(|g| g == "g1") && placed.values().any(|g| g == "g2"), "keys on both groups");
    assert_eq!(nothing_acknowledged_lost(&fleet, &proxies, &primaries, &config, &log, None), (200, 0));
    // The other group never noticed.
    assert_eq!(failures(&log, &placed, "g2"), 0, "no write to g2 failed during g1's failover");
    let (gap, resumed) = longest_gap(&log, &placed, "g1", started);
    eprintln!(
        "SENTINEL FAILOVER: g1 {old} -> {new}; longest gap in acknowledged writes {gap:?}, ended at +{:?}; both \
         proxies seen switched at +{:?}",
        resumed - started,
        switched - started
    );
    assert!(resumed < switched + Duration::from_secs(1), "writes resume within 1 s of the switch");
    let new = &primaries["g1"];
    assert_eq!(role(fleet.group("g1").by_id(new)), "master");
    fleet_status_names(&url, "g1", new);
    for p in proxies {
        assert!(
            p.pool()["servers"][0]["group"]["failovers"].as_u64().unwrap()
                + p.pool()["servers"][1]["group"]["failovers"].as_u64().unwrap()
                >= 1
        );
    }

    // Now g2's primary dies: its Sentinels agree it is down and fail over.
    let writers = Writers::start(&proxies);
    std::thread::sleep(Duration::from_millis(500));
    let old = fleet.primary("g2");
    let started = Instant::now();
    fleet.group("g2").by_id(&old).signal("-KILL");
    // Sent after this, a write cannot have reached the killed primary
    // (kill(2) has returned); one sent before may have been acknowledged
    // by it, unreplicated, and its reply read after.
    let killed = Instant::now();
    eventually(40, "the Sentinels name g2's new primary", || fleet.primary("g2") != old);
    let (new, switched) = proxies_follow(&fleet, &proxies, "g2");
    std::thread::sleep(Duration::from_millis(1000));
    let log = writers.finish();
    let primaries = await_settled(&fleet, &proxies, "g2", &new);
    let placed = groups_of(&config, &log.keys().collect::<Vec<_>>());
    let (checked, lost_before) = nothing_acknowledged_lost(&fleet, &proxies, &primaries, &config, &log, Some(killed));
    assert_eq!(checked, 200);
    // At most the writes in flight when it died (one per writer).
    assert!(lost_before <= 20, "{lost_before} keys lost writes the killed primary acknowledged");
    eprintln!("writes the killed primary acknowledged and had not replicated: {lost_before} keys");
    assert_eq!(failures(&log, &placed, "g1"), 0, "no write to g1 failed while g2's primary was down");
    let (gap, resumed) = longest_gap(&log, &placed, "g2", started);
    eprintln!(
        "primary killed: g2 {old} -> {new}; longest gap {gap:?}, ended at +{:?}; switched at +{:?}",
        resumed - started,
        switched - started
    );
    assert!(resumed < switched + Duration::from_secs(1), "writes resume within 1 s of the switch");
    fleet_status_names(&url, "g2", &primaries["g2"]);
    // The two proxies agree, and the placement did not change.
    assert_eq!(a.pool()["placement_fingerprint"], b.pool()["placement_fingerprint"]);
    assert_eq!(proxy_primary(&a, "g1"), proxy_primary(&b, "g1"));
    assert_eq!(proxy_primary(&a, "g2"), proxy_primary(&b, "g2"));
}

/// `GET` calls a server has run since its stats were reset
/// (`INFO commandstats`).
fn get_calls(r: &Redis) -> u64 {
    let mut c = Resp::connect(SocketAddr::from(([127, 0, 0, 1], r.port)));
    let Reply::Bulk(text) = c.ask(&["INFO", "commandstats"]) else { panic!("INFO") };
    text.lines()
        .find_map(|l| l.strip_prefix("cmdstat_get:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

fn reset_stats(servers: &[&Redis]) {
    for r in servers {
        let mut c = Resp::connect(SocketAddr::from(([127, 0, 0, 1], r.port)));
        let _ = c.ask(&["CONFIG", "RESETSTAT"]);
    }
}

/// The replicas of `group` a proxy says may serve reads.
fn usable_replicas(p: &Proxy, group: &str) -> Vec<String> {
    let pool = p.pool();
    let Some(server) = pool["servers"].as_array().and_then(|s| s.iter().find(|s| s["id"] == group).cloned()) else {
        return Vec::new();
    };
    server["group"]["replicas"]
        .as_array()
        .map(|rs| {
            rs.iter().filter(|r| r["usable"] == true).map(|r| r["address"].as_str().unwrap().to_owned()).collect()
        })
        .unwrap_or_default()
}

#[test]
fn reads_go_to_linked_replicas_with_prefer_replica() {
    let _turn = serial();
    let fleet = Fleet::start("reads");
    let config = fleet.config("  sentinel_poll: 200\n  read_policy: prefer-replica\n");
    let proxy = Proxy::start(&config, &[]);
    eventually(20, "the proxy finds 2 usable replicas per group", || {
        ["g1", "g2"].iter().all(|g| usable_replicas(&proxy, g).len() == 2)
    });
    let addr: SocketAddr = proxy.addr.parse().unwrap();
    let mut c = Resp::connect(addr);
    for i in 0..100 {
        let _ = c.ask(&["SET", &format!("r:{i}"), &i.to_string()]);
    }
    let everyone: Vec<&Redis> = fleet.groups.iter().flat_map(|g| g.servers.iter()).collect();
    // Replication is asynchronous: a read right after a write may come from
    // a replica that has not applied it yet. Wait for them to catch up.
    let names: Vec<String> = (0..100).map(|i| format!("r:{i}")).collect();
    let placed = groups_of(&config, &names.iter().collect::<Vec<_>>());
    eventually(10, "the replicas have the keys", || {
        names.iter().all(|k| {
            fleet.group(&placed[k]).servers.iter().all(|r| {
                let mut c = Resp::connect(SocketAddr::from(([127, 0, 0, 1], r.port)));
                matches!(c.ask(&["GET", k]), Reply::Bulk(_))
            })
        })
    });
    reset_stats(&everyone);
    for round in 0..5 {
        for i in 0..100 {
            match c.ask(&["GET", &format!("r:{i}")]) {
                Reply::Bulk(v) => assert_eq!(v, i.to_string(), "round {round}"),
                other => panic!("GET r:{i}: {other:?}"),
            }
        }
    }
    let primaries: u64 = fleet.groups.iter().map(|g| get_calls(g.by_id(&fleet.primary(g.name)))).sum();
    let replicas: u64 = everyone.iter().map(|r| get_calls(r)).sum::<u64>() - primaries;
    assert_eq!((primaries, replicas), (0, 500), "every read went to a replica");

    // One replica of g1 loses its link to the primary: it gets no reads.
    let g1 = fleet.group("g1");
    let primary = fleet.primary("g1");
    let cut = g1.servers.iter().find(|r| r.id() != primary).unwrap();
    let other = g1.servers.iter().find(|r| r.id() != primary && r.id() != cut.id()).unwrap();
    let mut admin = Resp::connect(SocketAddr::from(([127, 0, 0, 1], cut.port)));
    let _ = admin.ask(&["REPLICAOF", "127.0.0.1", &free_port().to_string()]);
    eventually(10, "the proxy stops reading from the cut replica", || usable_replicas(&proxy, "g1") == [other.id()]);
    let why = proxy.pool()["servers"].as_array().unwrap().iter().find(|s| s["id"] == "g1").unwrap()["group"]
        ["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["address"] == cut.id().as_str())
        .unwrap()["why"]
        .clone();
    assert!(why.as_str().unwrap().contains("link to the primary is down"), "{why}");
    reset_stats(&everyone);
    for i in 0..100 {
        let _ = c.ask(&["GET", &format!("r:{i}")]);
    }
    assert_eq!(get_calls(cut), 0, "the replica whose link is down got no reads");
    assert!(get_calls(other) > 0, "its linked sibling did");
    assert_eq!(get_calls(g1.by_id(&primary)), 0, "prefer-replica still has a replica: the primary got none");
}

#[test]
fn a_group_without_a_known_primary_answers_tryagain_after_the_hold() {
    let _turn = serial();
    let dir = TempDir::new("sentinel-none");
    // No Sentinel listens there: no group's primary is ever known.
    let config = dir.path("none.yml");
    std::fs::write(
        &config,
        format!(
            "cache:\n  listen: 127.0.0.1:22121\n  redis: true\n  sentinels: [127.0.0.1:{}]\n  failover_hold: 200\n  \
             servers:\n   - g1:1\n   - g2:1\n",
            free_port()
        ),
    )
    .unwrap();
    assert!(chash(&["proxy", "-t", "-c", &config.display().to_string()]).contains("ok"));
    let proxy = Proxy::start(&config, &[]);
    let s = TcpStream::connect(&proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    for _ in 0..2 {
        let asked = Instant::now();
        w.write_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.starts_with("-TRYAGAIN group g"), "{line}");
        assert!(line.contains("no primary known yet"), "{line}");
        assert!(asked.elapsed() >= Duration::from_millis(200), "held for failover_hold first");
    }
    assert_eq!(proxy_primary(&proxy, "g1"), None);
}

#[test]
fn reads_prefer_the_replicas_of_the_proxys_zone() {
    let _turn = serial();
    let fleet = Fleet::start("zones");
    // One replica of each group is in zone z1, the other in z2.
    let near: Vec<&Redis> = fleet.groups.iter().map(|g| &g.servers[1]).collect();
    let far: Vec<&Redis> = fleet.groups.iter().map(|g| &g.servers[2]).collect();
    let zones: Vec<String> = near
        .iter()
        .map(|r| format!("\"{}\": z1", r.id()))
        .chain(far.iter().map(|r| format!("\"{}\": z2", r.id())))
        .collect();
    let config = fleet.config(&format!(
        "  sentinel_poll: 200\n  read_policy: prefer-replica\n  server_zones: {{{}}}\n",
        zones.join(", ")
    ));
    // The proxy's zone comes from its environment.
    std::env::set_var("CHASH_ZONE", "z1");
    let proxy = Proxy::start(&config, &[]);
    std::env::remove_var("CHASH_ZONE");
    eventually(20, "the proxy finds 2 usable replicas per group", || {
        ["g1", "g2"].iter().all(|g| usable_replicas(&proxy, g).len() == 2)
    });
    let mut c = Resp::connect(proxy.addr.parse().unwrap());
    let everyone: Vec<&Redis> = fleet.groups.iter().flat_map(|g| g.servers.iter()).collect();
    reset_stats(&everyone);
    for i in 0..200 {
        let _ = c.ask(&["GET", &format!("z:{i}")]);
    }
    let near_reads: u64 = near.iter().map(|r| get_calls(r)).sum();
    let other_reads: u64 = everyone.iter().map(|r| get_calls(r)).sum::<u64>() - near_reads;
    assert_eq!((near_reads, other_reads), (200, 0), "every read went to a replica in the proxy's zone");
}
