//! The Sentinel watcher of a pool: one task asks every Sentinel about
//! every group (`SENTINEL MASTER`) each `sentinel_poll`, and at once when
//! woken; one task per Sentinel listens to its events (`PSUBSCRIBE *`).
//! Both end when the pool is gone.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::client::{field, fields, string, strings, text, Conn};
use super::{Group, Sentinels};
use crate::redis::resp::array_items;
use crate::stats::ReplicaView;

/// How often the watcher asks again while a group is unsettled (failing
/// over, or its new primary not yet `master`).
const UNSETTLED_POLL: Duration = Duration::from_millis(50);

/// How long an event listener waits before connecting again.
const RECONNECT: Duration = Duration::from_secs(1);

/// Events that mean a group's failover has started: its requests are held
/// from then until the Sentinels name the primary after it (events after
/// the promotion are not among them: by then the proxy may already use
/// the promoted replica).
const STARTS: [&str; 7] = [
    "+odown",
    "+try-failover",
    "+elected-leader",
    "+failover-state-select-slave",
    "+selected-slave",
    "+failover-state-send-slaveof-noone",
    "+failover-state-wait-promotion",
];

pub(super) fn start(s: &Arc<Sentinels>) {
    let weak = Arc::downgrade(s);
    tokio::spawn(poll(weak.clone()));
    for addr in &s.settings.sentinels {
        tokio::spawn(listen(weak.clone(), addr.clone()));
    }
}

/// Asks the Sentinels about every group, again and again.
async fn poll(weak: Weak<Sentinels>) {
    let mut conns: Vec<Option<Conn>> = Vec::new();
    loop {
        let Some(s) = weak.upgrade() else { return };
        conns.resize_with(s.settings.sentinels.len(), || None);
        let mut unsettled = false;
        for group in s.groups() {
            unsettled |= refresh(&s, &group, &mut conns).await;
        }
        let (wake, pause) = (s.wake.clone(), if unsettled { UNSETTLED_POLL } else { s.settings.poll });
        drop(s);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = wake.notified() => {}
        }
    }
}

/// One Sentinel's account of a group's master.
struct Answer {
    primary: String,
    epoch: u64,
    failing_over: bool,
    /// Failing over, or the Sentinel finds the primary down (`s_down`).
    suspect: bool,
}

/// Asks `addr` (connecting first if need be); a failed connection is
/// dropped, to be made again next time.
async fn ask(s: &Sentinels, conn: &mut Option<Conn>, addr: &str, args: &[&[u8]]) -> Result<bytes::Bytes, String> {
    if conn.is_none() {
        *conn = Some(Conn::open(addr, s.sentinel_login()).await?);
    }
    let Some(c) = conn.as_mut() else { return Err("no connection".into()) };
    let reply = c.ask(args).await;
    if reply.is_err() {
        *conn = None;
    }
    reply
}

/// Whether a Sentinel's comma-separated `flags` include any of `names`.
fn has_flag(flags: &str, names: &[&str]) -> bool {
    flags.split(',').any(|f| names.contains(&f))
}

/// Brings a group's target up to date with its Sentinels; whether it is
/// still unsettled.
async fn refresh(s: &Sentinels, group: &Group, conns: &mut [Option<Conn>]) -> bool {
    let mut answers = Vec::new();
    for (addr, conn) in s.settings.sentinels.iter().zip(conns.iter_mut()) {
        match ask(s, conn, addr, &[b"SENTINEL", b"MASTER", group.name.as_bytes()]).await {
            Ok(reply) => match fields(&reply) {
                Some(f) => {
                    let (Some(ip), Some(port)) = (field(&f, "ip"), field(&f, "port")) else { continue };
                    let flags = field(&f, "flags").unwrap_or_default();
                    let failing_over = has_flag(flags, &["failover_in_progress", "o_down"]);
                    answers.push(Answer {
                        primary: format!("{ip}:{port}"),
                        epoch: field(&f, "config-epoch").and_then(|e| e.parse().ok()).unwrap_or(0),
                        failing_over,
                        suspect: failing_over || has_flag(flags, &["s_down"]),
                    });
                }
                None => tracing::warn!(pool = %s.pool, group = %group.name, "Sentinel {addr}: {}", text(&reply)),
            },
            Err(e) => tracing::debug!(pool = %s.pool, group = %group.name, "Sentinel {addr}: {e}"),
        }
    }
    // The Sentinels that know the latest configuration decide; among
    // them, the primary most name.
    let Some(top) = answers.iter().map(|a| a.epoch).max() else {
        return group.now().switching;
    };
    let latest: Vec<&Answer> = answers.iter().filter(|a| a.epoch == top).collect();
    let mut named: Vec<(&str, usize)> = Vec::new();
    for a in &latest {
        match named.iter_mut().find(|(p, _)| *p == a.primary) {
            Some((_, n)) => *n += 1,
            None => named.push((&a.primary, 1)),
        }
    }
    named.sort_by_key(|n| std::cmp::Reverse(n.1));
    let mut primary = named[0].0.to_owned();
    let mut failing_over = latest.iter().any(|a| a.failing_over);
    let now = group.now();
    if failing_over {
        // A replica the failover has promoted is the primary to be: its
        // writes are kept, so the group's requests need not wait for the
        // Sentinels to finish reconfiguring the other replicas. Not one a
        // Sentinel at the latest configuration finds down or failing over
        // (a primary promoted a moment ago, still flagged by the Sentinel
        // that promoted it, failed over again): its writes may be lost to
        // the next promotion.
        let suspects: Vec<&str> = latest.iter().filter(|a| a.suspect).map(|a| a.primary.as_str()).collect();
        let flagged = promoted(s, group, conns).await;
        match primary_to_be(&flagged, &suspects) {
            Some(promoted) => {
                primary = promoted.to_owned();
                failing_over = false;
                group.ahead_since(top);
            }
            None => match without_candidate(group.ahead().is_some(), now.primary.as_deref(), &suspects) {
                Unflagged::Hold(current) => {
                    group.hold(&format!("{current}, promoted a moment ago, is being failed over itself"));
                    return true;
                }
                Unflagged::Stay => return true,
                Unflagged::Named => {}
            },
        }
    } else if let Some(since) = group.ahead() {
        // Ahead of the Sentinels (switched at the promotion): until they
        // name the promoted primary, or a later configuration, what they
        // say is the configuration before it; going back would send writes
        // to the primary being demoted.
        if now.primary.as_deref() == Some(primary.as_str()) || top > since {
            group.in_step();
        } else {
            return true;
        }
    }
    let primary = primary.as_str();
    if now.primary.as_deref() != Some(primary) {
        if let Err(why) = check_primary(s, primary).await {
            group.hold(&format!("Sentinels name {primary}, but {why}"));
            return true;
        }
    }
    group.settle(primary, top, failing_over);
    if !failing_over {
        replicas(s, group, conns, primary).await;
    }
    failing_over
}

/// Finds the group's replicas (the Sentinels' list) and which may serve
/// reads: not down, linked to the primary (their `INFO`), listed by it
/// and lagging no more than `replica_max_lag` (its `INFO`).
async fn replicas(s: &Sentinels, group: &Group, conns: &mut [Option<Conn>], primary: &str) {
    let mut listed = None;
    for (addr, conn) in s.settings.sentinels.iter().zip(conns.iter_mut()) {
        let Ok(reply) = ask(s, conn, addr, &[b"SENTINEL", b"REPLICAS", group.name.as_bytes()]).await else { continue };
        let Some(items) = array_items(&reply) else { continue };
        let found: Vec<(String, String)> = items
            .iter()
            .filter_map(fields)
            .filter_map(|f| {
                let addr = format!("{}:{}", field(&f, "ip")?, field(&f, "port")?);
                Some((addr, field(&f, "flags").unwrap_or_default().to_owned()))
            })
            .collect();
        listed = Some(found);
        break;
    }
    let Some(listed) = listed else { return };
    let lags = info(s, primary).await.map(|text| lags_of(&text)).unwrap_or_default();
    let max = s.settings.replica_max_lag.as_secs();
    let mut views = Vec::new();
    for (addr, flags) in listed {
        if addr == primary {
            continue;
        }
        let down = has_flag(&flags, &["s_down", "o_down", "disconnected"]);
        let lag = lags.iter().find(|(a, _)| *a == addr).map(|(_, l)| *l);
        let why = if down {
            Some(format!("down (Sentinel flags {flags})"))
        } else {
            match info(s, &addr).await {
                Err(e) => Some(e),
                Ok(text) => unusable(&text, lag, max, primary),
            }
        };
        views.push(ReplicaView {
            usable: why.is_none(),
            why,
            lag,
            reads: 0,
            zone: s.settings.zones.get(&addr).cloned(),
            address: addr,
        });
    }
    let backend = (s.settings.read_policy != chash::ReadPolicy::Primary).then(|| s.backend.get()).flatten();
    group.found(views, backend, s.zone.as_deref());
}

/// Why a replica may not serve reads, from its `INFO replication` and
/// its lag as its primary lists it (`None`: not listed online), against
/// the cutoff `max` (s); `None`: it may.
fn unusable(replica_info: &str, lag: Option<u64>, max: u64, primary: &str) -> Option<String> {
    if !replica_info.lines().any(|l| l.trim_end() == "master_link_status:up") {
        return Some("its link to the primary is down".to_owned());
    }
    match lag {
        None => Some(format!("{primary} does not list it as an online replica")),
        Some(l) if l > max => Some(format!("lagging {l} s (replica_max_lag: {max})")),
        Some(_) => None,
    }
}

/// A server's `INFO replication`.
async fn info(s: &Sentinels, addr: &str) -> Result<String, String> {
    let mut conn = Conn::open(addr, s.login()).await?;
    let reply = conn.ask(&[b"INFO", b"replication"]).await?;
    string(&reply).ok_or_else(|| format!("{addr}: INFO: {}", text(&reply)))
}

/// A primary's online replicas and their lag, from its `INFO`
/// (`slave0:ip=...,port=...,state=online,offset=...,lag=0`).
fn lags_of(info: &str) -> Vec<(String, u64)> {
    info.lines()
        .filter(|l| l.starts_with("slave"))
        .filter_map(|l| {
            let (_, kv) = l.split_once(':')?;
            let get = |k: &str| kv.split(',').find_map(|p| p.strip_prefix(k)?.strip_prefix('='));
            if get("state")? != "online" {
                return None;
            }
            Some((format!("{}:{}", get("ip")?, get("port")?), get("lag")?.trim_end().parse().ok()?))
        })
        .collect()
}

/// The replicas the Sentinels flag as promoted in a failover of the
/// group (flag `promoted`), not down, by address.
async fn promoted(s: &Sentinels, group: &Group, conns: &mut [Option<Conn>]) -> Vec<String> {
    let mut flagged = Vec::new();
    for (addr, conn) in s.settings.sentinels.iter().zip(conns.iter_mut()) {
        let Ok(reply) = ask(s, conn, addr, &[b"SENTINEL", b"REPLICAS", group.name.as_bytes()]).await else { continue };
        for replica in array_items(&reply).unwrap_or_default() {
            let Some(f) = fields(&replica) else { continue };
            let flags = field(&f, "flags").unwrap_or_default();
            if has_flag(flags, &["promoted"]) && !has_flag(flags, &["s_down"]) {
                if let (Some(ip), Some(port)) = (field(&f, "ip"), field(&f, "port")) {
                    let address = format!("{ip}:{port}");
                    if !flagged.contains(&address) {
                        flagged.push(address);
                    }
                }
            }
        }
    }
    flagged
}

/// What a failing-over group does when no flagged replica may be
/// switched to ([`without_candidate`]).
#[derive(Debug, PartialEq, Eq)]
enum Unflagged<'a> {
    /// Held: the promoted primary in use is itself being failed over.
    Hold(&'a str),
    /// Stays on the promoted primary in use (its flag was not found this
    /// time: a Sentinel did not answer).
    Stay,
    /// Goes by what the Sentinels name (and is held if that is not a
    /// primary).
    Named,
}

/// [`Unflagged`] for a group: `ahead`, on a promoted primary (`current`)
/// the Sentinels do not name yet, it never goes back to the configuration
/// before it (whose primary is being demoted).
fn without_candidate<'a>(ahead: bool, current: Option<&'a str>, suspects: &[&str]) -> Unflagged<'a> {
    match current {
        Some(current) if ahead && suspects.contains(&current) => Unflagged::Hold(current),
        _ if ahead => Unflagged::Stay,
        _ => Unflagged::Named,
    }
}

/// Of the replicas flagged as promoted, the one to switch to ahead of
/// the Sentinels: the first that no Sentinel names as a primary it finds
/// down or failing over (`suspects`). A replica promoted in an earlier
/// failover keeps its flag at the Sentinel that promoted it until that
/// failover ends; if another already finds it down, it is the primary
/// being replaced, not the one to be.
fn primary_to_be<'a>(flagged: &'a [String], suspects: &[&str]) -> Option<&'a str> {
    flagged.iter().map(String::as_str).find(|p| !suspects.contains(p))
}

/// Whether `addr` says it is a master (`ROLE`), before anything is sent
/// to it. With server TLS the check is left to the connections (each runs
/// `ROLE` too).
async fn check_primary(s: &Sentinels, addr: &str) -> Result<(), String> {
    if s.server_tls {
        return Ok(());
    }
    let mut conn = Conn::open(addr, s.login()).await?;
    let reply = conn.ask(&[b"ROLE"]).await?;
    super::is_master(&reply)
}

/// Listens to one Sentinel's events for as long as the pool lives.
async fn listen(weak: Weak<Sentinels>, addr: String) {
    loop {
        let login = match weak.upgrade() {
            Some(s) => s.settings.password.clone(),
            None => return,
        };
        let opened = Conn::open(&addr, login.as_deref().map(|p| ("default", p))).await;
        match opened {
            Ok(mut conn) => match conn.send(&[b"PSUBSCRIBE", b"*"]).await {
                Ok(()) => loop {
                    let message = tokio::select! {
                        m = conn.next() => m,
                        // Checks now and then that the pool is still there.
                        () = tokio::time::sleep(Duration::from_secs(5)) => {
                            if weak.strong_count() == 0 { return }
                            continue;
                        }
                    };
                    let Ok(message) = message else { break };
                    let Some(s) = weak.upgrade() else { return };
                    event(&s, &message);
                },
                Err(e) => tracing::debug!("Sentinel {addr}: {e}"),
            },
            Err(e) => tracing::debug!("Sentinel {addr}: {e}"),
        }
        tokio::time::sleep(RECONNECT).await;
    }
}

/// A message of a Sentinel's: `pmessage * CHANNEL PAYLOAD`.
fn event(s: &Sentinels, message: &bytes::Bytes) {
    let Some(parts) = strings(message) else { return };
    let [kind, _, channel, payload] = parts.as_slice() else { return };
    if kind != "pmessage" {
        return;
    }
    let Some(name) = group_of(channel, payload) else { return };
    let Some(group) = s.groups().into_iter().find(|g| g.name == name) else { return };
    tracing::debug!(pool = %s.pool, group = %name, "Sentinel event {channel} {payload}");
    // Only a failover away from the primary in use holds requests (a late
    // event about the one before it does not).
    let about = master_of(payload);
    let current = group.now().primary;
    let of_current = current.is_none() || about.is_some_and(|a| current.as_deref() == Some(a.as_str()));
    if STARTS.contains(&channel.as_str()) && (channel != "+odown" || payload.starts_with("master ")) && of_current {
        group.hold(channel);
    }
    s.wake.notify_one();
}

/// The address of the master an instance's event is about: `master NAME
/// IP PORT`, or `... @ NAME IP PORT`.
fn master_of(payload: &str) -> Option<String> {
    let words: Vec<&str> = payload.split(' ').collect();
    let at = match words.iter().position(|w| *w == "@") {
        Some(at) => at + 1,
        None if words.first() == Some(&"master") => 1,
        None => return None,
    };
    Some(format!("{}:{}", words.get(at + 1)?, words.get(at + 2)?))
}

/// The master group an event is about: `+switch-master NAME ...`; an
/// instance's events `master NAME IP PORT` or `TYPE ID IP PORT @ NAME IP
/// PORT`.
fn group_of<'a>(channel: &str, payload: &'a str) -> Option<&'a str> {
    let words: Vec<&str> = payload.split(' ').collect();
    if channel == "+switch-master" {
        return words.first().copied();
    }
    if let Some(at) = words.iter().position(|w| *w == "@") {
        return words.get(at + 1).copied();
    }
    (words.first() == Some(&"master")).then(|| words.get(1).copied()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_primarys_info_gives_its_online_replicas_lag() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
                    slave0:ip=127.0.0.1,port=7002,state=online,offset=99,lag=0\r\n\
                    slave1:ip=127.0.0.1,port=7003,state=wait_bgsave,offset=0,lag=3\r\n";
        assert_eq!(lags_of(info), vec![("127.0.0.1:7002".to_owned(), 0)]);
    }

    #[test]
    fn a_replica_reads_only_linked_listed_and_within_the_lag_cutoff() {
        let up = "# Replication\r\nrole:slave\r\nmaster_link_status:up\r\n";
        let down = "# Replication\r\nrole:slave\r\nmaster_link_status:down\r\n";
        let p = "127.0.0.1:7001";
        assert_eq!(unusable(up, Some(0), 10, p), None);
        assert_eq!(unusable(up, Some(10), 10, p), None);
        assert_eq!(unusable(up, Some(11), 10, p).as_deref(), Some("lagging 11 s (replica_max_lag: 10)"));
        assert_eq!(unusable(up, None, 10, p).as_deref(), Some("127.0.0.1:7001 does not list it as an online replica"));
        assert_eq!(unusable(down, Some(0), 10, p).as_deref(), Some("its link to the primary is down"));
    }

    #[test]
    fn a_promoted_replica_being_failed_over_itself_is_not_switched_to() {
        let flagged = vec!["127.0.0.1:7002".to_owned(), "127.0.0.1:7003".to_owned()];
        // The first failover: the old primary (7001) is failing over, the
        // replica promoted for it is the primary to be.
        assert_eq!(primary_to_be(&flagged[..1], &["127.0.0.1:7001"]), Some("127.0.0.1:7002"));
        // A failover of the replica promoted a moment ago (7002), while the
        // Sentinel that promoted it still flags it: not 7002 (its writes
        // would be lost to the next promotion), the replica promoted now.
        assert_eq!(primary_to_be(&flagged[..1], &["127.0.0.1:7001", "127.0.0.1:7002"]), None);
        assert_eq!(primary_to_be(&flagged, &["127.0.0.1:7002"]), Some("127.0.0.1:7003"));
        assert_eq!(primary_to_be(&[], &["127.0.0.1:7001"]), None);
    }

    #[test]
    fn a_group_ahead_on_a_promoted_primary_never_goes_back_to_the_one_before() {
        let (old, promoted) = ("127.0.0.1:7001", "127.0.0.1:7002");
        // Ahead, and the promoted primary is being failed over itself: held.
        assert_eq!(without_candidate(true, Some(promoted), &[old, promoted]), Unflagged::Hold(promoted));
        // Ahead, its flag not found this time: stays (not back to 7001).
        assert_eq!(without_candidate(true, Some(promoted), &[old]), Unflagged::Stay);
        // Not ahead (the first failover, nothing promoted yet): by what the
        // Sentinels name.
        assert_eq!(without_candidate(false, Some(old), &[old]), Unflagged::Named);
        assert_eq!(without_candidate(false, None, &[]), Unflagged::Named);
    }

    #[test]
    fn events_name_their_group() {
        assert_eq!(group_of("+switch-master", "g1 127.0.0.1 7001 127.0.0.1 7002"), Some("g1"));
        assert_eq!(group_of("+try-failover", "master g2 127.0.0.1 7001"), Some("g2"));
        assert_eq!(group_of("+selected-slave", "slave 127.0.0.1:7002 127.0.0.1 7002 @ g3 127.0.0.1 7001"), Some("g3"));
        assert_eq!(group_of("+sdown", "sentinel abc 127.0.0.1 26380 @ g4 127.0.0.1 7001"), Some("g4"));
        assert_eq!(group_of("+new-epoch", "12"), None);
        assert_eq!(master_of("master g2 127.0.0.1 7001 #quorum 2/2").as_deref(), Some("127.0.0.1:7001"));
        assert_eq!(
            master_of("slave 127.0.0.1:7002 127.0.0.1 7002 @ g3 127.0.0.1 7001").as_deref(),
            Some("127.0.0.1:7001")
        );
        assert_eq!(master_of("g1 127.0.0.1 7001 127.0.0.1 7002"), None);
    }
}
