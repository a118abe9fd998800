//! `chash route` with every algorithm of `chash::algo`: the binary agrees
//! with the library (two processes, the same placement), run after run.

mod common;

use common::chash;

use chash::ServerLine;
use chash::{Distribution, PoolConfig};

#[test]
fn every_distribution_routes_as_the_library_does() {
    let servers = ["10.0.0.1:11211:1", "10.0.0.2:11211:1", "10.0.0.3:11211:1", "cache-d:1", "cache-e:1"];
    let keys: Vec<String> = (0..2000).map(|i| format!("user:{i}")).collect();
    let input = keys.join("\n");
    for name in ["jump", "jumpback", "rendezvous", "maglev", "anchor", "memento", "multiprobe", "bounded"] {
        let mut args = vec!["route", "--distribution", name];
        for s in &servers {
            args.extend(["--node", s]);
        }
        let first = chash(&args, input.as_bytes());
        assert!(first.status.success(), "{name}: {}", String::from_utf8_lossy(&first.stderr));
        let second = chash(&args, input.as_bytes());
        assert_eq!(first.stdout, second.stdout, "{name}: two runs differ");

        let mut pool =
            PoolConfig::from_servers(servers.iter().map(|s| s.parse::<ServerLine>().unwrap()).collect()).unwrap();
        pool.distribution = name.parse::<Distribution>().unwrap();
        let snapshot = pool.snapshot().unwrap();
        let expected: String = keys
            .iter()
            .map(|k| {
                let i = snapshot.placement().acquire_hash(snapshot.key_hash(k.as_bytes())).unwrap();
                format!("{k}\t{}\n", snapshot.nodes()[i].id())
            })
            .collect();
        assert_eq!(String::from_utf8(first.stdout).unwrap(), expected, "{name}");
    }
}

#[test]
fn bounded_route_caps_every_server() {
    let keys: String = (0..10_000).map(|i| format!("k{i}\n")).collect();
    let args = ["route", "--node", "a:1", "--node", "b:1", "--node", "c:2", "--distribution", "bounded"];
    let o = chash(&[&args[..], &["--balance-factor", "1.1"]].concat(), keys.as_bytes());
    assert!(o.status.success());
    let out = String::from_utf8(o.stdout).unwrap();
    for (id, share) in [("a", 0.25), ("b", 0.25), ("c", 0.5)] {
        let n = out.lines().filter(|l| l.ends_with(&format!("\t{id}"))).count();
        let cap = (1.1f64 * 10_000.0 * share).ceil() as usize;
        assert!(n <= cap, "{id}: {n} > {cap}");
    }
}

/// Bad input: exit status 2 and one line on stderr naming the problem.
#[test]
fn bad_parameters_are_one_line_and_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["route", "--node", "a:1", "--node", "b:2", "--distribution", "jump", "k"], "does not support weights"),
        (&["route", "--node", "a:3", "--distribution", "anchor", "k"], "does not support weights"),
        (&["route", "--node", "a:1", "--distribution", "maglev", "--table-size", "65536", "k"], "not prime; 65537"),
        (&["route", "--node", "a:1", "--distribution", "maglev", "--table-size", "97", "k"], "101"),
        (&["route", "--node", "a:1", "--distribution", "ring", "--probes", "3", "k"], "multiprobe only"),
        (&["route", "--node", "a:1", "--distribution", "multiprobe", "--probes", "0", "k"], "probes: 0"),
        (&["route", "--node", "a:1", "--distribution", "bounded", "--balance-factor", "0.9", "k"], "at least 1"),
        (
            &["route", "--node", "a:1", "--node", "b:1", "--distribution", "anchor", "--capacity", "1", "k"],
            "at least 2",
        ),
    ];
    for (args, needle) in cases {
        let o = chash(args, b"");
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(o.stderr).unwrap();
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(o.stdout.is_empty());
    }
}
