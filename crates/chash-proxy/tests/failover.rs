//! Replicated pools and failover without reshuffle, in front of real
//! memcached servers that the tests kill, restart and stall.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use chash::Placement as _;
use support::{memcacheds, ring_config, Client, Proxy};

/// The ids of `key`'s candidates in the placement's order.
fn candidates(yml: &str, key: &str) -> Vec<String> {
    let pool = chash::config::Config::from_yaml(yml).unwrap().pool(None).unwrap();
    let snapshot = pool.snapshot().unwrap();
    let nodes = snapshot.nodes();
    snapshot.placement().candidates_hash(snapshot.key_hash(key.as_bytes())).map(|i| nodes[i].id().to_owned()).collect()
}

fn stats(proxy: &Proxy) -> serde_json::Value {
    serde_json::from_str(&proxy.admin("GET", "/stats", "").1).unwrap()
}

fn server_state(proxy: &Proxy, id: &str) -> String {
    let v = stats(proxy);
    let servers = v["pools"][0]["servers"].as_array().unwrap();
    servers.iter().find(|s| s["id"] == id).unwrap()["state"].as_str().unwrap().to_owned()
}

/// Sets every key to `value(key)` through the proxy; every reply STORED.
fn set_all(c: &mut Client, keys: &[String], value: impl Fn(&str) -> String) {
    for chunk in keys.chunks(200) {
        let mut batch = Vec::new();
        for k in chunk {
            let v = value(k);
            batch.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
        }
        c.send(&batch);
        for k in chunk {
            assert_eq!(c.line(), "STORED\r\n", "set {k}");
        }
    }
}

/// `replicas: 2`: each key on its first two candidates; one of four
/// servers killed: every key still readable and writable, zero errors;
/// restarted: it is taken back and writes reach it again.
#[test]
fn replicas_keep_every_key_through_a_dead_server() {
    let mut mc = memcacheds(4);
    let yml = ring_config(
        "  timeout: 400\n  replicas: 2\n  server_retry_timeout: 500\n  server_failure_limit: 3\n",
        &mc.iter().collect::<Vec<_>>(),
    );
    let proxy = Proxy::start(&yml);
    let mut c = proxy.client();
    let keys: Vec<String> = (0..2000).map(|i| format!("r:{i}")).collect();
    set_all(&mut c, &keys, |k| format!("{k}=1"));
    // Each key is on exactly its first two candidates.
    let held: Vec<Vec<bool>> = mc.iter().map(|m| m.holds_each(&keys)).collect();
    for (j, k) in keys.iter().enumerate() {
        let want = &candidates(&yml, k)[..2];
        let on: Vec<String> = (0..4).filter(|&m| held[m][j]).map(|m| mc[m].id()).collect();
        assert_eq!(on.len(), 2, "{k} on {on:?}");
        assert!(on.iter().all(|id| want.contains(id)), "{k} on {on:?}, candidates {want:?}");
    }
    let dead = mc[1].id();
    mc[1].kill();
    // Every key readable, one request at a time and in multi-key gets.
    for k in keys.iter().take(300) {
        assert_eq!(c.get(k).as_deref(), Some(format!("{k}=1").as_bytes()), "{k}");
    }
    let got = c.get_each(&keys);
    let missing = keys.iter().zip(&got).filter(|(k, v)| v.as_deref() != Some(format!("{k}=1").as_bytes())).count();
    assert_eq!(missing, 0, "keys unreadable with one server dead");
    set_all(&mut c, &keys, |k| format!("{k}=2"));
    let v = stats(&proxy);
    assert_eq!(v["pools"][0]["errors"].as_u64(), Some(0), "{v}");
    assert!(v["pools"][0]["failovers"].as_u64().unwrap() >= 1);
    assert_eq!(server_state(&proxy, &dead), "failed-over");
    // Back: after server_retry_timeout of answered probes, writes reach it.
    mc[1].restart();
    let started = Instant::now();
    while server_state(&proxy, &dead) != "up" {
        assert!(started.elapsed() < Duration::from_secs(10), "the restarted server was not taken back");
        thread::sleep(Duration::from_millis(50));
    }
    // It came back empty: reads that miss on it find its keys on the other
    // replica.
    let got = c.get_each(&keys);
    let missing = keys.iter().zip(&got).filter(|(k, v)| v.as_deref() != Some(format!("{k}=2").as_bytes())).count();
    assert_eq!(missing, 0, "keys unreadable after the replica came back empty");
    assert!(c.get(&keys[0]).is_some());
    set_all(&mut c, &keys, |k| format!("{k}=3"));
    let on_dead: Vec<&String> = keys.iter().filter(|k| candidates(&yml, k)[..2].contains(&dead)).collect();
    assert!(on_dead.len() > 500, "{}", on_dead.len());
    let on_dead: Vec<String> = on_dead.into_iter().cloned().collect();
    assert!(mc[1].holds_each(&on_dead).iter().all(|h| *h), "writes reach the restarted replica");
}

/// `failover: next`: a dead server's keys go to their next candidates and
/// no other key moves (checked key by key on the servers), the placement
/// fingerprint unchanged; a server flapping every 200 ms is not taken back
/// until it stays up for `server_retry_timeout`.
#[test]
fn failover_moves_only_the_dead_servers_keys() {
    let mut mc = memcacheds(4);
    let yml = ring_config(
        "  timeout: 100\n  failover: next\n  server_retry_timeout: 1000\n  server_failure_limit: 3\n",
        &mc.iter().collect::<Vec<_>>(),
    );
    let proxy = Proxy::start(&yml);
    let fingerprint = stats(&proxy)["pools"][0]["placement_fingerprint"].clone();
    let mut c = proxy.client();
    let keys: Vec<String> = (0..2000).map(|i| format!("f:{i}")).collect();
    set_all(&mut c, &keys, |k| format!("{k}=1"));
    let dead = mc[2].id();
    mc[2].kill();
    // Reads of the dead server's keys miss once (their next server does not
    // have them yet), then writes go there; nothing errors.
    let _ = c.get_each(&keys);
    set_all(&mut c, &keys, |k| format!("{k}=2"));
    let got = c.get_each(&keys);
    for (k, v) in keys.iter().zip(&got) {
        assert_eq!(v.as_deref(), Some(format!("{k}=2").as_bytes()), "{k}");
    }
    let held: Vec<Vec<bool>> = [0, 1, 3].iter().map(|&m| mc[m].holds_each(&keys)).collect();
    let ids: Vec<String> = [0, 1, 3].iter().map(|&m| mc[m].id()).collect();
    let mut moved = 0;
    for (j, k) in keys.iter().enumerate() {
        let c = candidates(&yml, k);
        // The key's server now: its owner, or (owner dead) the next one.
        let want = if c[0] == dead { &c[1] } else { &c[0] };
        moved += usize::from(c[0] == dead);
        // Version 2 was written there only.
        let on: Vec<&String> = (0..3).filter(|&m| held[m][j]).map(|m| &ids[m]).collect();
        assert!(on.contains(&want), "{k}: wanted on {want}, held by {on:?}");
        let mut direct = Client::connect(std::net::SocketAddr::from(([127, 0, 0, 1], port_of(want))));
        assert_eq!(direct.get(k).as_deref(), Some(format!("{k}=2").as_bytes()), "{k} on {want}");
    }
    assert!(moved > 300, "{moved}");
    let v = stats(&proxy);
    assert_eq!(v["pools"][0]["placement_fingerprint"], fingerprint, "the placement is unchanged");
    assert_eq!(v["pools"][0]["errors"].as_u64(), Some(0), "{v}");
    assert_eq!(v["pools"][0]["locally_ejected"][0].as_str(), Some(dead.as_str()));
    // Restarted, then flapping (stalled 200 ms of every 400 ms): kept out.
    mc[2].restart();
    let flap_until = Instant::now() + Duration::from_millis(2400);
    while Instant::now() < flap_until {
        mc[2].pause(Duration::from_millis(200));
        thread::sleep(Duration::from_millis(400));
        assert_eq!(server_state(&proxy, &dead), "failed-over", "a flapping server was taken back");
    }
    let started = Instant::now();
    while server_state(&proxy, &dead) != "up" {
        assert!(started.elapsed() < Duration::from_secs(10), "the steady server was not taken back");
        thread::sleep(Duration::from_millis(50));
    }
    assert!(started.elapsed() >= Duration::from_millis(700), "taken back before server_retry_timeout");
    // A server that stalls (its values kept) while its keys are written
    // elsewhere never serves those older values when it is taken back.
    let owner0: Vec<&String> = keys.iter().filter(|k| candidates(&yml, k)[0] == mc[0].id()).collect();
    mc[0].pause(Duration::from_millis(1500));
    for k in owner0.iter().take(3) {
        let _ = c.get(k); // timed out (or answered by the next server)
    }
    let stalled = mc[0].id();
    let started = Instant::now();
    while server_state(&proxy, &stalled) != "failed-over" {
        assert!(started.elapsed() < Duration::from_secs(10), "the stalled server was not failed over");
        let _ = c.get(owner0[0]);
        thread::sleep(Duration::from_millis(20));
    }
    let owner0: Vec<String> = owner0.into_iter().cloned().collect();
    set_all(&mut c, &owner0, |k| format!("{k}=3"));
    while server_state(&proxy, &stalled) != "up" {
        assert!(started.elapsed() < Duration::from_secs(15), "the stalled server was not taken back");
        thread::sleep(Duration::from_millis(50));
    }
    for (k, v) in owner0.iter().zip(c.get_each(&owner0)) {
        assert!(v.is_none() || v.as_deref() == Some(format!("{k}=3").as_bytes()), "{k}: an older value came back");
    }
}

fn port_of(id: &str) -> u16 {
    id.rsplit(':').next().unwrap().parse().unwrap()
}
