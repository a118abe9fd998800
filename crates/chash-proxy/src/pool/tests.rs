//! Unit tests of the pool, without a socket: servers named by fixed ids on
//! the tests' memory network (nothing connects: no request is sent), the
//! clock paused. Where keys go is checked against the library's placement
//! of the same config.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use chash::{Edit, PoolConfig};

use super::{Pool, PoolError};
use crate::backend::{Address, Speech};
use crate::workers::Workers;

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("key:{i}")).collect()
}

/// A pool `alpha` of servers `s1`..`sN` (weight 1) with `extra` config
/// lines; servers up to `s9` can be added.
fn pool(extra: &str, n: usize) -> Arc<Pool> {
    pool_on(extra, n, Workers::current())
}

/// [`pool`], its connections on `workers`.
fn pool_on(extra: &str, n: usize, workers: Arc<Workers>) -> Arc<Pool> {
    let mut yml = format!("alpha:\n{extra}  servers:\n");
    for i in 1..=n {
        yml.push_str(&format!("   - s{i}:1\n"));
    }
    let addresses = (1..=9).map(|i| (format!("s{i}"), Address::Memory(format!("pool-unit-s{i}")))).collect();
    let config = chash::config::Config::from_yaml(&yml).unwrap().pool(None).unwrap();
    let speech = Speech { protocol: "test", dialects: vec![None], probe: None, before_return: None, locator: None };
    Pool::start(config, addresses, workers, speech).unwrap()
}

fn owner(pool: &Pool, key: &str) -> String {
    pool.state().server_for(key.as_bytes()).unwrap().id().to_owned()
}

/// Share of `keys` whose server differs between two placements of a config.
fn moved(a: &PoolConfig, b: &PoolConfig, keys: &[String]) -> f64 {
    let (a, b) = (a.snapshot().unwrap(), b.snapshot().unwrap());
    keys.iter().filter(|k| a.route(k.as_bytes()) != b.route(k.as_bytes())).count() as f64 / keys.len() as f64
}

#[tokio::test(start_paused = true)]
async fn keys_go_where_the_library_places_them() {
    for distribution in ["ring", "ketama", "maglev", "rendezvous", "jump", "bounded"] {
        let hash = if distribution == "ketama" { "md5" } else { "xxh3" };
        let p = pool(&format!("  distribution: {distribution}\n  hash: {hash}\n"), 5);
        let snapshot = p.config().snapshot().unwrap();
        for k in keys(2000) {
            assert_eq!(Some(owner(&p, &k).as_str()), snapshot.route(k.as_bytes()), "{distribution} {k}");
        }
    }
}

/// The moved fraction a change reports is what the library's placements
/// say moved (exact for a ring), and a server added takes only its share.
#[tokio::test(start_paused = true)]
async fn a_change_reports_what_it_moved() {
    let p = pool("  distribution: ring\n  hash: xxh3\n", 4);
    let ks = keys(20_000);
    let before = p.config();
    let change = p.add_server("s5:1".parse().unwrap()).unwrap();
    let after = p.config();
    let sampled = moved(&before, &after, &ks);
    assert!((change.moved_fraction - sampled).abs() < 0.02, "{} vs {sampled}", change.moved_fraction);
    assert!((0.1..0.3).contains(&change.moved_fraction), "{}", change.moved_fraction);
    assert_eq!(change.live_servers, 5);
    assert_ne!(change.version, "");
    // Every key that moved went to the new server.
    let old = before.snapshot().unwrap();
    for k in &ks {
        let now = owner(&p, k);
        if old.route(k.as_bytes()) != Some(now.as_str()) {
            assert_eq!(now, "s5", "{k} moved between old servers");
        }
    }
    // Back to four: back to the old placement, the same share moved back.
    let back = p.remove_server("s5").unwrap();
    assert!((back.moved_fraction - change.moved_fraction).abs() < 1e-9);
    for k in ks.iter().take(2000) {
        assert_eq!(Some(owner(&p, k).as_str()), old.route(k.as_bytes()));
    }
}

/// Ejected by hand, a server takes no key; restored, it has its own back.
#[tokio::test(start_paused = true)]
async fn eject_and_restore() {
    let p = pool("  distribution: ketama\n", 3);
    let ks = keys(3000);
    let home: Vec<String> = ks.iter().map(|k| owner(&p, k)).collect();
    p.eject("s2").unwrap();
    assert_eq!(p.state().live().count(), 2);
    for (k, h) in ks.iter().zip(&home) {
        let now = owner(&p, k);
        assert_ne!(now, "s2");
        if h != "s2" {
            assert_eq!(&now, h, "{k}: only s2's keys move");
        }
    }
    assert!(p.eject("s2").is_err(), "already ejected");
    assert!(p.eject("s9").is_err(), "no such server");
    p.restore("s2").unwrap();
    for (k, h) in ks.iter().zip(&home) {
        assert_eq!(&owner(&p, k), h);
    }
}

/// Refused changes leave the pool as it was.
#[tokio::test(start_paused = true)]
async fn refused_changes_change_nothing() {
    let p = pool("  distribution: ring\n", 2);
    let version = p.state().version.clone();
    assert!(p.add_server("s1:1".parse().unwrap()).is_err(), "a duplicate");
    assert!(p.set_weight("s1", 0).is_err(), "weight 0");
    assert!(p.remove_server("nope").is_err());
    let persist_fails = |_: &str, _: &Edit, _: &PoolConfig, _: &PoolConfig| Err("disk full".to_owned());
    let err = p.edit(&Edit::Remove("s2".into()), Some(&persist_fails)).unwrap_err();
    assert!(matches!(err, PoolError::Persist { .. }), "{err}");
    assert!(err.to_string().contains("disk full"), "{err}");
    assert_eq!(p.state().version, version);
    assert_eq!(p.state().live().count(), 2);
}

/// `bounded`: no server holds more than its cap of the load in flight,
/// and load given back (guards dropped) leaves every counter at zero.
#[tokio::test(start_paused = true)]
async fn bounded_load_stays_under_its_cap() {
    let p = pool("  distribution: bounded\n  balance_factor: 1.25\n  hash: xxh3\n", 4);
    // The same hot key, many times in flight: it spills to other servers.
    let held: Vec<_> = (0..400).map(|_| p.acquire(b"hot").unwrap()).collect();
    let mut per: HashMap<String, u64> = HashMap::new();
    for (server, _) in &held {
        *per.entry(server.id().to_owned()).or_default() += 1;
    }
    assert_eq!(per.len(), 4, "the hot key spilled to every server: {per:?}");
    for (id, n) in &per {
        assert!(*n <= (1.25f64 * 100.0).ceil() as u64 + 1, "{id} holds {n} of 400: {per:?}");
    }
    assert_eq!(p.events().load.load(Relaxed), 400);
    drop(held);
    assert_eq!(p.events().load.load(Relaxed), 0);
    for m in &p.state().members {
        assert_eq!(m.server.events.load.load(Relaxed), 0, "{}", m.line.id);
    }
}

/// A membership change with `warmup`: the old placement is a source for
/// the moved keys for the window, then not.
#[tokio::test(start_paused = true)]
async fn the_replaced_placement_warms_up_for_its_window() {
    let p = pool("  distribution: ring\n  warmup: 30\n", 3);
    let ks = keys(3000);
    let home: Vec<String> = ks.iter().map(|k| owner(&p, k)).collect();
    let change = p.add_server("s4:1".parse().unwrap()).unwrap();
    assert_eq!(change.warmup_seconds, 30);
    assert!(p.warming());
    let state = p.state();
    let mut sources = 0;
    for (k, h) in ks.iter().zip(&home) {
        let now = state.server_for(k.as_bytes()).unwrap().clone();
        let previous: Vec<String> =
            state.previous_servers(k.as_bytes(), &now).iter().map(|s| s.id().to_owned()).collect();
        if now.id() == h {
            assert!(previous.is_empty(), "{k} did not move");
        } else {
            assert_eq!(previous, std::slice::from_ref(h), "{k}");
            sources += 1;
        }
    }
    assert!(sources > 300, "{sources} moved keys");
    drop(state);
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(!p.warming(), "the window ended");
    let state = p.state();
    for k in &ks {
        let now = state.server_for(k.as_bytes()).unwrap().clone();
        assert!(state.previous_servers(k.as_bytes(), &now).is_empty());
    }
}

/// A warm-up copy does not start while a write of its key runs, and a copy
/// that a write overtook knows it raced.
#[tokio::test(start_paused = true)]
async fn warm_up_copies_never_overtake_writes() {
    let p = pool("  distribution: ring\n", 1);
    let writes = p.writes();
    let stripe = writes.begin_write(b"k");
    assert!(writes.begin_copy(b"k", Duration::from_millis(50)).await.is_none(), "a write of k runs");
    writes.end_write(stripe, Duration::from_millis(50)).await;
    let copy = writes.begin_copy(b"k", Duration::from_millis(50)).await.unwrap();
    assert!(!copy.raced());
    let stripe = writes.begin_write(b"k");
    assert!(copy.raced(), "a write began after the copy did");
    drop(copy);
    writes.end_write(stripe, Duration::from_millis(50)).await;
}

/// Requests are routed by each worker's copy of the state, which every
/// change replaces: `acquire` agrees with the state after each change,
/// and a removed server is let go at once (no copy keeps it).
#[tokio::test(start_paused = true)]
async fn requests_route_by_the_state_each_change_leaves() {
    let workers = Workers::start(3).unwrap();
    let p = pool_on("  distribution: ketama\n", 3, workers.clone());
    let ks = keys(500);
    let agree = |p: &Arc<Pool>, when: &str| {
        // Every worker's copy is the state itself.
        let state = p.state.load_full();
        assert_eq!(p.local.all().count(), 3);
        for copy in p.local.all() {
            assert!(Arc::ptr_eq(&copy.lock(), &state), "{when}: a worker's copy is not the state");
        }
        for k in &ks {
            let (server, _) = p.acquire(k.as_bytes()).unwrap();
            assert_eq!(server.id(), owner(p, k), "{when}: {k}");
        }
    };
    agree(&p, "at start");
    p.add_server("s4:1".parse().unwrap()).unwrap();
    agree(&p, "s4 added");
    let s4 = p.state().members.iter().find(|m| m.server.id() == "s4").map(|m| Arc::downgrade(&m.server)).unwrap();
    assert!(ks.iter().any(|k| p.acquire(k.as_bytes()).unwrap().0.id() == "s4"));
    p.remove_server("s4").unwrap();
    agree(&p, "s4 removed");
    assert!(s4.upgrade().is_none(), "the removed server is still held");
    p.eject("s2").unwrap();
    agree(&p, "s2 ejected");
    assert!(ks.iter().all(|k| p.acquire(k.as_bytes()).unwrap().0.id() != "s2"));
    p.restore("s2").unwrap();
    agree(&p, "s2 restored");
    workers.stop();
}

/// A request decides where its key is (a migration's moves, or none) and
/// is routed only by the state it decided by, or, having found no
/// migration, by a state without one: a change between the two (armed,
/// completed, a server ejected) has it decide again. Without this, a key
/// decided with no migration and routed by the armed change's placement
/// went to its new server before its data (on its server before the
/// change) was moved there.
#[tokio::test(start_paused = true)]
async fn a_request_is_routed_only_by_the_state_it_decided_by() {
    use super::{same_placement, Migration, MoveSettings, Mover};
    let p = pool("  redis: true\n  distribution: ring\n  auto_eject_hosts: true\n", 3);
    let idle = |_: Arc<Pool>, _: Arc<Migration>, _: MoveSettings| -> super::MoveFuture { Box::pin(async {}) };
    p.set_mover(Mover { run: idle, settings: MoveSettings::default() });
    let ks = keys(2000);
    let before = p.routing_state();
    assert!(before.migration.is_none());
    p.edit_migrating(&Edit::Add("s4:1".parse().unwrap()), None, chash::MigrationState::Armed).unwrap();
    let armed = p.routing_state();
    let m = armed.migration.clone().expect("the change is armed");
    let moving: Vec<&String> = ks.iter().filter(|k| p.acquire(k.as_bytes()).unwrap().0.id() == "s4").collect();
    assert!(moving.len() > 200, "{} of {} keys move", moving.len(), ks.len());
    for k in &moving {
        // Decided with no migration: not routed by the armed placement.
        assert!(p.acquire_under(k.as_bytes(), None).is_err(), "{k}");
        let (server, _) = p.acquire_under(k.as_bytes(), Some(&armed)).unwrap().unwrap();
        assert_eq!(server.id(), "s4", "{k}");
    }
    // A failing server ejected: the same migration, another placement.
    p.server_failing("s1");
    let ejected = p.routing_state();
    assert!(!Arc::ptr_eq(&ejected, &armed), "s1 was not ejected");
    assert!(Arc::ptr_eq(ejected.migration.as_ref().unwrap(), &m));
    for k in &moving {
        assert!(p.acquire_under(k.as_bytes(), Some(&armed)).is_err(), "{k}");
        assert!(p.acquire_under(k.as_bytes(), Some(&ejected)).unwrap().is_some(), "{k}");
    }
    // Completed: one decided by a state with the migration decides again.
    p.migration_done(&m);
    for k in &moving {
        assert!(p.acquire_under(k.as_bytes(), Some(&ejected)).is_err(), "{k}");
        assert!(p.acquire_under(k.as_bytes(), None).unwrap().is_some(), "{k}");
    }
    // A transaction queued (or watched) by one state runs as queued by
    // another only where its keys are still where they were.
    let done = p.routing_state();
    assert!(!same_placement(&armed, &before), "a migration began");
    assert!(!same_placement(&ejected, &armed), "another state during a migration");
    assert!(!same_placement(&done, &ejected), "the migration ended");
    assert!(!same_placement(&done, &before), "the membership changed");
    p.server_failing("s2");
    let healthier = p.routing_state();
    assert!(!Arc::ptr_eq(&healthier, &done), "s2 was not ejected");
    assert!(same_placement(&healthier, &done), "a health change with no migration keeps where keys are");
}
