//! Every placement algorithm behind the proxy, in front of real memcached
//! servers: keys land where the library says, anchor's removals move only the
//! removed server's keys, and bounded loads are taken and given back.

mod support;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;

use chash::config::AnyPlacement;
use chash_proxy::pool::Routing;
use support::{memcacheds, Client, Memcached, Proxy};

fn config(extra: &str, servers: &[&Memcached]) -> String {
    // Equal weights: jump, anchor and multiprobe take no weights.
    let mut yml = format!("alpha:\n  listen: 127.0.0.1:{}\n{extra}  servers:\n", support::free_port());
    for s in servers {
        yml.push_str(&format!("   - {}:1\n", s.id()));
    }
    yml
}

#[test]
fn every_distribution_places_keys_where_the_library_does() {
    let mc = memcacheds(4);
    let refs: Vec<&Memcached> = mc.iter().collect();
    for dist in ["ring", "jump", "rendezvous", "maglev", "anchor", "multiprobe", "bounded", "ketama", "modula", "nginx"]
    {
        let extra = match dist {
            "nginx" => "  distribution: nginx\n".to_owned(),
            d => format!(
                "  distribution: {d}\n  hash: {}\n",
                if matches!(d, "ketama" | "modula") { "md5" } else { "xxh3" }
            ),
        };
        let yml = config(&extra, &refs);
        let proxy = Proxy::start(&yml);
        let snapshot = chash::config::Config::from_yaml(&yml).unwrap().pool(None).unwrap().snapshot().unwrap();
        let mut c = proxy.client();
        for i in 0..100 {
            let key = format!("{dist}:{i}");
            assert_eq!(c.set(&key, b"v"), "STORED\r\n", "{dist}");
            let want = snapshot.route(key.as_bytes()).unwrap();
            let holder = mc.iter().find(|m| m.holds(&key)).map(|m| m.id());
            // bounded may send a key past an overloaded owner; with one client
            // at a time no server is over its cap, so it is the owner here.
            assert_eq!(holder.as_deref(), Some(want), "{dist}: {key}");
        }
    }
}

/// Removing a server from an anchor pool moves only its keys: the proxy
/// applies AnchorHash's own removal instead of rebuilding.
#[test]
fn anchor_removal_moves_only_that_servers_keys() {
    let mc = memcacheds(4);
    let refs: Vec<&Memcached> = mc.iter().collect();
    let proxy = Proxy::start(&config("  distribution: anchor\n  hash: xxh3\n", &refs));
    let mut c = proxy.client();
    let keys: Vec<String> = (0..2000).map(|i| format!("anchor:{i}")).collect();
    for k in &keys {
        assert_eq!(c.set(k, b"v"), "STORED\r\n");
    }
    let gone = mc[1].id();
    let on_gone = keys.iter().filter(|k| mc[1].holds(k)).count();
    let (status, body) = proxy.admin("DELETE", &format!("/pools/alpha/servers/{gone}"), "");
    assert_eq!(status, 200, "{body}");
    let change: serde_json::Value = serde_json::from_str(&body).unwrap();
    let moved = change["moved_fraction"].as_f64().unwrap();
    assert!((moved - on_gone as f64 / keys.len() as f64).abs() < 0.05, "moved {moved}, its share {on_gone}/2000");
    let misses = keys.iter().filter(|k| c.get(k).is_none()).count();
    assert_eq!(misses, on_gone, "exactly the removed server's keys miss");
    // Ejecting and restoring a server brings every key back where it was.
    let before: Vec<Option<Vec<u8>>> = keys.iter().map(|k| c.get(k)).collect();
    let other = mc[2].id();
    assert_eq!(proxy.admin("POST", &format!("/pools/alpha/servers/{other}/eject"), "").0, 200);
    assert_eq!(proxy.admin("POST", &format!("/pools/alpha/servers/{other}/restore"), "").0, 200);
    let after: Vec<Option<Vec<u8>>> = keys.iter().map(|k| c.get(k)).collect();
    assert_eq!(before, after);
}

/// With `bounded`, every request holds load on its server until its reply,
/// and all load is given back. (A get may miss here: under load a key can be
/// sent past its owner, which is the point of bounded loads and why they
/// suit stateless backends better than caches.)
#[test]
fn bounded_loads_are_released() {
    let mc = memcacheds(3);
    let refs: Vec<&Memcached> = mc.iter().collect();
    let proxy = Proxy::start(&config("  distribution: bounded\n  balance_factor: 1.25\n", &refs));
    let errors = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let (addr, errors) = (proxy.addr, errors.clone());
            thread::spawn(move || {
                let mut c = Client::connect(addr);
                for i in 0..300 {
                    let k = format!("b:{w}:{i}");
                    if c.set(&k, k.as_bytes()) != "STORED\r\n" {
                        errors.fetch_add(1, Relaxed);
                    }
                    c.send(format!("get {k} b:{w}:0\r\n").as_bytes());
                    let _ = c.read_get_reply();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(errors.load(Relaxed), 0);
    let pools = proxy.handle.pools();
    let state = pools[0].state();
    let Some(Routing::Placed { snapshot, .. }) = state.routing.as_ref() else { panic!("placed") };
    let AnyPlacement::Bounded(b) = snapshot.placement() else { panic!("bounded") };
    assert!(b.loads().iter().all(|&l| l == 0), "load left behind: {:?}", b.loads());
}
