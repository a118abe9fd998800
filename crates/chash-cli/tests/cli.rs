//! Runs the `chash` binary as a user would.

mod common;

use common::{chash, stderr, stdout};

#[test]
fn route_keys_from_arguments() {
    let o = chash(&["route", "--node", "a:1", "--node", "b:2", "k1", "k2"], b"");
    assert!(o.status.success(), "{}", stderr(&o));
    // Pinned by the native ring's definition (see the golden tests).
    assert_eq!(stdout(&o), "k1\ta\nk2\tb\n");
}

#[test]
fn route_agrees_with_the_library() {
    use chash::{Node, Placement, Ring};
    let ring = Ring::new(vec![Node::new("10.0.0.1:11211", 1).unwrap(), Node::new("cache-b", 3).unwrap()]).unwrap();
    let keys: Vec<String> = (0..500).map(|i| format!("user:{i}")).collect();
    let input = keys.join("\n");
    let o = chash(&["route", "--node", "10.0.0.1:11211:1 first", "--node", "cache-b:3"], input.as_bytes());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), keys.len());
    for (k, line) in keys.iter().zip(lines) {
        assert_eq!(line, format!("{k}\t{}", ring.node_for(k.as_bytes()).unwrap().id()));
    }
}

#[test]
fn stdin_splits_on_lf_only() {
    let o = chash(&["route", "--node", "a:1"], b"x\ny\r\n\nlast");
    assert_eq!(o.stdout, b"x\ta\ny\r\ta\n\ta\nlast\ta\n");
    let o = chash(&["route", "--node", "a:1"], b"");
    assert!(o.status.success());
    assert!(o.stdout.is_empty());
    // Bytes that are not UTF-8 pass through unchanged.
    let o = chash(&["route", "--node", "a:1"], b"\xff\xfe\n");
    assert_eq!(o.stdout, b"\xff\xfe\ta\n");
}

#[test]
fn json_lines() {
    let o = chash(&["route", "--node", "a:1", "--format", "json", "say \"hi\"", "太阳"], b"");
    assert!(o.status.success());
    let out = stdout(&o);
    let rows: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows[0]["key"], "say \"hi\"");
    assert_eq!(rows[0]["id"], "a");
    assert_eq!(rows[1]["key"], "太阳");
}

#[test]
fn config_file_and_pools() {
    let dir = std::env::temp_dir().join(format!("chash-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("nutcracker.yml");
    std::fs::write(
        &path,
        "alpha:\n  distribution: ring\n  hash_tag: \"{}\"\n  servers:\n   - a:1\n   - b:1\n   - c:1\n\
         beta:\n  distribution: ring\n  servers:\n   - only:1\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let o = chash(&["route", "-c", p, "u{1}", "v{1}", "{1}"], b"");
    assert!(o.status.success(), "{}", stderr(&o));
    let ids: Vec<String> = stdout(&o).lines().map(|l| l.split('\t').nth(1).unwrap().to_owned()).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "hash tag keeps them together: {ids:?}");
    let o = chash(&["route", "-c", p, "--pool", "beta", "k"], b"");
    assert_eq!(stdout(&o), "k\tonly\n");
    let o = chash(&["route", "-c", p, "--pool", "gamma", "k"], b"");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("alpha, beta"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Bad input: exit status 2 and exactly one line on stderr naming the problem.
#[test]
fn bad_input_is_one_line_and_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["route", "--node", "a:0", "k"], "weight 0"),
        (&["route", "--node", "a:1", "--node", "a:2", "k"], "duplicate node id \"a\""),
        (&["route", "--node", "a", "k"], "bad server line"),
        (&["route", "--node", "a:1", "--hash", "sha1", "k"], "unknown hash \"sha1\""),
        (&["route", "--node", "a:1", "--distribution", "circle", "k"], "unknown distribution \"circle\""),
        (&["route", "--node", "a:1", "--vnodes", "0", "k"], "vnodes"),
        (&["route", "--node", "a:1", "--hash-tag", "{", "k"], "two characters"),
        (&["route", "-c", "/nonexistent/chash.yml", "k"], "cannot read /nonexistent/chash.yml"),
        (&["hash", "-H", "nope", "k"], "unknown hash"),
    ];
    for (args, needle) in cases {
        let o = chash(args, b"");
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = stderr(&o);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
        if args[0] == "route" && !err.starts_with("error:") {
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        }
    }
    // Neither -c nor --node: a usage error.
    let o = chash(&["route", "k"], b"");
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn hash_prints_decimal_values() {
    let o = chash(&["hash", "-H", "crc32a", "123456789"], b"");
    assert_eq!(stdout(&o), format!("123456789\t{}\n", 0xcbf4_3926u32));
    let o = chash(&["hash", "-H", "md5"], b"foo\n\n");
    assert_eq!(stdout(&o), format!("foo\t{}\n\t{}\n", 0xdb18_bdacu32, 0xd98c_1dd4u32));
    let o = chash(&["hash", "--help"], b"");
    assert!(o.status.success());
}

#[test]
fn help_and_version() {
    let o = chash(&["--help"], b"");
    assert!(o.status.success());
    assert!(stdout(&o).contains("route"));
    let o = chash(&["route", "--help"], b"");
    assert!(stdout(&o).contains("Examples:"));
    let o = chash(&["--version"], b"");
    assert!(stdout(&o).starts_with("chash "));
}

/// The demo's numbers agree with each other and with the weights, and it
/// writes its report.
#[test]
fn demo_is_consistent() {
    let report = std::env::temp_dir().join(format!("chash-demo-{}.html", std::process::id()));
    let o = chash(&["demo", "--keys", "5000", "--report", report.to_str().unwrap()], b"");
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let numbers = |line: &str| -> Vec<u64> {
        line.split(|c: char| !c.is_ascii_digit() && c != '.').filter_map(|w| w.parse::<u64>().ok()).collect()
    };
    // Leaving: every moved key came from the shard that left, and it held exactly those.
    let leave = out.lines().find(|l| l.contains("keys moved") && l.contains("from shard-c")).expect(&out);
    let nums = numbers(leave);
    assert_eq!(nums[0], nums[1], "{leave}");
    assert_eq!(nums[1], nums[2], "{leave}");
    // Joining: the new shard holds exactly the keys that moved.
    let join = out.lines().find(|l| l.contains("keys moved") && l.contains("shard-e holds")).expect(&out);
    assert!(join.contains("every moved key went to it"), "{join}");
    // Key shares follow weights 1:2:1:4 within a few points.
    for (shard, fair) in [("shard-a", 12.5), ("shard-b", 25.0), ("shard-d", 50.0)] {
        let row = out.lines().find(|l| l.trim_start().starts_with(shard)).unwrap();
        let share: f64 = row.split_whitespace().last().unwrap().trim_end_matches('%').parse().unwrap();
        assert!((share - fair).abs() < 4.0, "{row}");
    }
    // Hash % n loses far more of the cache than the ring when a shard
    // leaves; with warm-up nothing is lost, on leave and on join.
    let rates = |line: &str| -> Vec<f64> {
        line.split_whitespace().filter_map(|w| w.strip_suffix('%')).filter_map(|w| w.parse().ok()).collect()
    };
    let hits: Vec<&str> = out.lines().filter(|l| l.contains("cache hit rate right after")).collect();
    for line in &hits {
        let r = rates(line);
        assert!(r[0] > 80.0 && r[1] >= 99.9 && r[2] < r[0], "{line}");
    }
    assert_eq!(hits.len(), 2, "{out}");
    // A shard killed: replicas lose nothing; failover loses its keys once.
    let replicas = out.lines().find(|l| l.contains("`replicas: 2`")).expect(&out);
    assert_eq!(rates(replicas), [100.0], "{replicas}");
    let failover = out.lines().find(|l| l.contains("`failover: next`")).expect(&out);
    let r = rates(failover);
    assert!((r[0] + r[1] - 100.0).abs() < 0.02 && r[2] == 100.0, "only its keys miss, once: {failover}");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("<svg") && html.contains("Every distribution"), "report written");
    let _ = std::fs::remove_file(&report);
    let bad = chash(&["demo", "--keys", "5"], b"");
    assert_eq!(bad.status.code(), Some(2));
}

/// Seed 001's printed runs, through `chash route --with-hash`.
#[test]
fn route_reproduces_seed_001() {
    let servers: Vec<String> = (1000..1005).map(|p| format!("192.168.0.112:{p}:1")).collect();
    let mut args: Vec<&str> = vec!["route"];
    for s in &servers {
        args.extend(["--node", s]);
    }
    let keys = ["太阳", "月亮", "星星"];
    let mut vn = args.clone();
    vn.extend(["--hash", "java-fnv1-32", "--vnodes", "5", "--point-label", "{id}&&VN{i}", "--with-hash"]);
    vn.extend(keys);
    let o = chash(&vn, b"");
    assert_eq!(
        stdout(&o),
        "太阳\t192.168.0.112:1004\t1977106057\n月亮\t192.168.0.112:1003\t1132637661\n星星\t192.168.0.112:1002\t880019273\n"
    );
    let mut novn = args.clone();
    novn.extend(["--hash", "java-fnv1-32-inloop", "--vnodes", "1", "--point-label", "{id}", "--with-hash"]);
    novn.extend(keys);
    let o = chash(&novn, b"");
    assert_eq!(
        stdout(&o),
        "太阳\t192.168.0.112:1002\t606807096\n月亮\t192.168.0.112:1003\t244383856\n星星\t192.168.0.112:1004\t1233020469\n"
    );
    let o = chash(&["hash", "-H", "java-murmur64a", "1111號客戶端"], b"");
    assert_eq!(stdout(&o), "1111號客戶端\t-5471088278396709594\n");
}

/// `random` has no placement to print; route says so.
#[test]
fn route_refuses_random() {
    let o = chash(&["route", "--node", "a:1", "--distribution", "random", "k"], b"");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("random server"), "{}", stderr(&o));
}

/// twemproxy's defaults with -c: ketama and fnv1a_64 (the compat golden
/// tests check the placements; here the CLI path).
#[test]
fn config_defaults_are_twemproxys() {
    let dir = std::env::temp_dir().join(format!("chash-cli-tw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("nutcracker.yml");
    std::fs::write(
        &path,
        "alpha:\n  listen: 127.0.0.1:22121\n  servers:\n   - 127.0.0.1:11211:1\n   - 127.0.0.1:11212:1\n",
    )
    .unwrap();
    let o = chash(&["route", "-c", path.to_str().unwrap(), "--with-hash", "foo"], b"");
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let fields: Vec<&str> = out.trim_end().split('\t').collect();
    assert_eq!(fields[2], "4275688823", "fnv1a_64 of foo, as `chash hash -H fnv1a_64 foo` prints it");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `chash config` edits one pool's server list and nothing else (comments,
/// other pools, quoting stay); for every distribution, removing a server
/// with it and routing with the new file moves only that server's keys
/// (anchor included: the line stays, marked `removed 1`); jump refuses to
/// remove a server from the middle, saying what to do.
#[test]
fn config_remove_moves_only_the_removed_servers_keys() {
    let dir = std::env::temp_dir().join(format!("chash-config-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys: String = (0..20_000).map(|i| format!("user:{i}\n")).collect();
    for d in [
        "ring",
        "ketama",
        "modula",
        "nginx",
        "jump",
        "jumpback",
        "rendezvous",
        "maglev",
        "anchor",
        "multiprobe",
        "bounded",
    ] {
        let hash = match d {
            "ketama" | "modula" => "fnv1a_64",
            "nginx" => "crc32a",
            _ => "xxh3",
        };
        let before = dir.join(format!("{d}.yml"));
        let after = dir.join(format!("{d}-after.yml"));
        let text = format!(
            "# {d} pool\nweb:   # the one we edit\n  distribution: {d}\n  hash: {hash}\n  servers:\n   - 10.0.0.1:11211:1 a\n   \
             - \"10.0.0.2:11211:1 b\"   # quoted\n   - 10.0.0.3:11211:1 c\n   - 10.0.0.4:11211:1 d\n   - 10.0.0.5:11211:1 e\n\
             other:\n  servers:\n   - 10.0.1.1:11211:1\n"
        );
        std::fs::write(&before, &text).unwrap();
        // The middle server, or (jump) the last.
        let gone = if matches!(d, "jump" | "jumpback") { "10.0.0.5:11211" } else { "10.0.0.2:11211" };
        if matches!(d, "jump" | "jumpback") {
            let o =
                chash(&["config", "remove", "-c", before.to_str().unwrap(), "--pool", "web", "10.0.0.2:11211"], b"");
            assert_eq!(o.status.code(), Some(2));
            let err = stderr(&o);
            assert!(err.lines().count() == 1 && err.contains("end") && err.contains("anchor"), "{err}");
        }
        let o = chash(
            &["config", "remove", "-c", before.to_str().unwrap(), "--pool", "web", gone, "-o", after.to_str().unwrap()],
            b"",
        );
        assert!(o.status.success(), "{d}: {}", stderr(&o));
        let edited = std::fs::read_to_string(&after).unwrap();
        let want = match d {
            "anchor" => text.replace("\"10.0.0.2:11211:1 b\"", "\"10.0.0.2:11211:1 b removed 1\""),
            "jump" | "jumpback" => text.replace("   - 10.0.0.5:11211:1 e\n", ""),
            _ => text.replace("   - \"10.0.0.2:11211:1 b\"   # quoted\n", ""),
        };
        assert_eq!(edited, want, "{d}: only the server's line changes");
        let route = |file: &std::path::Path| {
            let o = chash(&["route", "-c", file.to_str().unwrap(), "--pool", "web"], keys.as_bytes());
            assert!(o.status.success(), "{}", stderr(&o));
            stdout(&o).lines().map(|l| l.split('\t').nth(1).unwrap().to_owned()).collect::<Vec<_>>()
        };
        let (old, new) = (route(&before), route(&after));
        let moved: Vec<(&String, &String)> = old.iter().zip(&new).filter(|(a, b)| a != b).collect();
        assert!(!moved.is_empty(), "{d}");
        // modula and maglev move more by design; route holds each key's load
        // under bounded, so capacities shift with one server fewer.
        if !matches!(d, "modula" | "maglev" | "bounded") {
            assert!(moved.iter().all(|(a, _)| *a == gone), "{d}: keys of other servers moved");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Man pages for chash and every subcommand (and nutcracker), from the
/// command's own definitions; completion scripts for bash, zsh and fish.
#[test]
fn man_pages_and_completions() {
    let dir = std::env::temp_dir().join(format!("chash-man-{}", std::process::id()));
    let out = chash(&["man", dir.to_str().unwrap()], b"");
    assert!(out.status.success(), "{}", stderr(&out));
    for page in ["chash.1", "chash-proxy.1", "chash-config-add.1", "chash-fleet-status.1", "nutcracker.1"] {
        let text = std::fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page} is a man page");
    }
    let proxy = std::fs::read_to_string(dir.join("chash-proxy.1")).unwrap();
    assert!(proxy.contains("membership") && proxy.contains("admin\\-tls\\-cert"), "the proxy's flags");
    let nutcracker = std::fs::read_to_string(dir.join("nutcracker.1")).unwrap();
    assert!(nutcracker.contains(".TH nutcracker"), "{}", &nutcracker[..200]);
    let _ = std::fs::remove_dir_all(&dir);
    for (shell, says) in [("bash", "_chash()"), ("zsh", "#compdef chash"), ("fish", "complete -c chash")] {
        let out = chash(&["completions", shell], b"");
        assert!(out.status.success() && stdout(&out).contains(says), "{shell}: {}", stderr(&out));
        assert!(stdout(&out).contains("membership"), "{shell} completes the proxy's flags");
    }
}
