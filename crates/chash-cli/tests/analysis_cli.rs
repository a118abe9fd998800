//! `chash analyze`, `chash plan` and `chash bench` run as a user would, with
//! their numbers checked against the library and against `chash route`.

mod common;

use common::chash;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use chash::config::Config;
use chash::PoolConfig;
use chash::ServerLine;
use serde_json::Value;

/// Runs chash and expects success.
fn ok(args: &[&str]) -> String {
    let o = chash(args, b"");
    assert!(o.status.success(), "chash {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(args)).unwrap()
}

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("chash-analysis-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A one-pool config. Its hash spreads sequential keys evenly (twemproxy's
/// 32-bit FNV-1a, the file default, clusters them), so that shares of the
/// hash space and shares of a key list agree within sampling error.
fn config(distribution: &str, servers: &[&str]) -> String {
    let hash = if distribution == "ketama" { "md5" } else { "xxh3" };
    let servers: String = servers.iter().map(|s| format!("   - {s}\n")).collect();
    format!("p:\n  distribution: {distribution}\n  hash: {hash}\n  servers:\n{servers}")
}

fn pool_of(text: &str) -> PoolConfig {
    Config::from_yaml(text).unwrap().pool(None).unwrap()
}

/// `KEY -> ID` as `chash route -c FILE` prints it for `keys`.
fn routed(file: &str, keys: &str) -> HashMap<String, String> {
    let o = chash(&["route", "-c", file], keys.as_bytes());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, id) = l.rsplit_once('\t').unwrap();
            (k.to_owned(), id.to_owned())
        })
        .collect()
}

fn numbered(n: usize) -> String {
    (0..n).map(|i| format!("user:{i}\n")).collect()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn analyze_matches_the_library() {
    let servers = ["a:1", "b:2", "c:1"];
    let doc = json(&["analyze", "--node", "a:1", "--node", "b:2", "--node", "c:1", "--keys", "20000", "--json"]);
    let pool = PoolConfig::from_servers(servers.iter().map(|s| s.parse::<ServerLine>().unwrap()).collect()).unwrap();
    let snapshot = pool.snapshot().unwrap();
    let ownership = snapshot.placement().ownership().unwrap();
    let mut counts: HashMap<&str, u64> = HashMap::new();
    for i in 0..20000 {
        *counts.entry(snapshot.route(format!("key:{i}").as_bytes()).unwrap()).or_default() += 1;
    }
    let rows = doc["servers"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let (mut exact_sum, mut sampled_sum) = (0.0, 0.0);
    for (i, row) in rows.iter().enumerate() {
        let id = row["id"].as_str().unwrap();
        assert_eq!(id, snapshot.nodes()[i].id());
        // Exact shares are the library's ownership (up to JSON rounding).
        assert!((f(&row["exact_share"]) - ownership[i]).abs() < 1e-15, "{id}");
        // Sampled keys are the keys chash route sends there.
        assert_eq!(row["sampled_keys"].as_u64().unwrap(), counts[id], "{id}");
        assert!((f(&row["sampled_share"]) - f(&row["exact_share"])).abs() < 0.02, "{row}");
        assert_eq!(f(&row["fair_share"]), [0.25, 0.5, 0.25][i]);
        exact_sum += f(&row["exact_share"]);
        sampled_sum += f(&row["sampled_share"]);
    }
    assert!((exact_sum - 1.0).abs() < 1e-12 && (sampled_sum - 1.0).abs() < 1e-12, "{exact_sum} {sampled_sum}");
    assert!((f(&doc["sampling_floor_cv"]) - (2.0f64 / 20000.0).sqrt()).abs() < 1e-12);
    assert!(f(&doc["sampled"]["cv"]) > 0.0 && f(&doc["exact"]["peak_over_mean"]) >= 1.0);
    assert_eq!(doc["points"], 4 * 160);
}

#[test]
fn analyze_a_config_file_and_a_key_file() {
    let dir = scratch("config");
    let file = write(
        &dir,
        "two.yml",
        &(config("ketama", &["10.0.0.1:11211:1", "10.0.0.2:11211:1"])
            + &config("maglev", &["x:1", "y:3"]).replace("p:", "q:")),
    );
    let keys = write(&dir, "keys.txt", &numbered(3000));
    let text = ok(&["analyze", "-c", &file, "--pool", "q", "--keys-file", &keys]);
    assert!(text.contains("pool q: distribution maglev"), "{text}");
    assert!(text.contains("3000 keys from"), "{text}");
    // Maglev is not made of points: no exact share.
    let x = text.lines().find(|l| l.starts_with("x ")).unwrap();
    assert!(x.contains("n/a") && x.contains("25.00%"), "{x}");
    let doc = json(&["analyze", "-c", &file, "--pool", "q", "--keys-file", &keys, "--json"]);
    assert!(doc["exact"].is_null() && doc["servers"][1]["exact_share"].is_null());
    let sampled: u64 = doc["servers"].as_array().unwrap().iter().map(|s| s["sampled_keys"].as_u64().unwrap()).sum();
    assert_eq!(sampled, 3000);
    // The key file's keys, placed as chash route places them.
    let routes = routed(&write(&dir, "q.yml", &config("maglev", &["x:1", "y:3"])), &numbered(3000));
    let on_y = routes.values().filter(|id| *id == "y").count() as u64;
    assert_eq!(doc["servers"][1]["sampled_keys"].as_u64().unwrap(), on_y);
    // The first pool by default: ketama, exact shares add up to 1.
    let doc = json(&["analyze", "-c", &file, "--keys", "1000", "--json"]);
    assert_eq!(doc["distribution"], "ketama");
    let exact: f64 = doc["servers"].as_array().unwrap().iter().map(|s| f(&s["exact_share"])).sum();
    assert!((exact - 1.0).abs() < 1e-12);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn analyze_compares_distributions() {
    let list = "ketama,ring,jump,jumpback,maglev,rendezvous,anchor,multiprobe,bounded,nginx,modula";
    let weighted = ["analyze", "--node", "a:1", "--node", "b:2", "--node", "c:1", "--keys", "5000"];
    let text = ok(&[&weighted[..], &["--compare", list]].concat());
    for d in list.split(',') {
        let row = text.lines().find(|l| l.starts_with(&format!("{d} "))).unwrap_or_else(|| panic!("{d}: {text}"));
        // The algorithms without weights say why instead of aborting.
        let refused = matches!(d, "jump" | "jumpback" | "anchor" | "multiprobe");
        assert_eq!(row.contains("cannot place these servers"), refused, "{row}");
    }
    assert!(text.contains("does not support weights"), "{text}");
    let doc = json(&[&weighted[..], &["--compare", list, "--json"]].concat());
    let compare = doc["compare"].as_array().unwrap();
    assert_eq!(compare.iter().map(|c| c["distribution"].as_str().unwrap()).collect::<Vec<_>>().join(","), list);
    for c in compare {
        if c["error"].is_null() {
            let sum: f64 = c["servers"].as_array().unwrap().iter().map(|s| f(&s["sampled_share"])).sum();
            assert!((sum - 1.0).abs() < 1e-12, "{c}");
        }
    }
    // Ketama cannot take xxh3: it runs with twemproxy's default hash.
    assert_eq!(compare[0]["hash"], "fnv1a_64");
    // Equal weights: every distribution places them; `all` lists each once.
    let doc = json(&["analyze", "--node", "a:1", "--node", "b:1", "--keys", "2000", "--compare", "all,ring", "--json"]);
    let compare = doc["compare"].as_array().unwrap();
    assert_eq!(compare.len(), 11);
    assert!(compare.iter().all(|c| c["error"].is_null()), "{compare:?}");
    let bad = chash(&["analyze", "--node", "a:1", "--compare", "ring,circle"], b"");
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn analyze_draws_charts() {
    let dir = scratch("svg");
    let small = dir.join("small.svg");
    ok(&[
        "analyze",
        "--node",
        "a:1",
        "--node",
        "b:2",
        "--vnodes",
        "10",
        "--keys",
        "1000",
        "--svg",
        small.to_str().unwrap(),
    ]);
    let svg = std::fs::read_to_string(&small).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("Exact share") && svg.contains("sampled keys"), "shares charted");
    // A ring of 30 points: a diagram with an arc per point and the wrap-around.
    assert!(svg.contains("The ring: 30 points") && svg.matches("<path").count() >= 30);
    let large = dir.join("large.svg");
    ok(&[
        "analyze",
        "--node",
        "a:1",
        "--node",
        "b:2",
        "--keys",
        "1000",
        "--vnodes",
        "1000",
        "--svg",
        large.to_str().unwrap(),
    ]);
    assert!(!std::fs::read_to_string(&large).unwrap().contains("The ring"), "no diagram for 3000 points");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Seed 003's ring without n2: the move log of its clients.
#[test]
fn plan_seed003_move_log() {
    let dir = scratch("seed003");
    let seed = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/seeds/seed003.yml");
    let text = std::fs::read_to_string(seed).unwrap();
    let smaller = write(&dir, "seed003-without-n2.yml", &text.replace("   - n2:1\n", ""));
    let clients: String = (1111..=1119).map(|i| format!("{i}號客戶端\n")).collect();
    let keys = write(&dir, "clients.txt", &clients);
    let log = ok(&["plan", "--from", seed, "--to", &smaller, "--keys-file", &keys, "--moves-only"]);
    assert_eq!(log, "1113號客戶端\tn2\tn4\n1115號客戶端\tn2\tn1\n1116號客戶端\tn2\tn4\n");
    let doc = json(&["plan", "--from", seed, "--to", &smaller, "--keys-file", &keys, "--json"]);
    assert_eq!(doc["change"]["removed"][0], "n2");
    assert_eq!(doc["exact"], true);
    assert!((f(&doc["optimal"]) - 0.25).abs() < 1e-12);
    // Only n2's arcs move, and the ranges add up to the total.
    let ranges = doc["ranges"].as_array().unwrap();
    assert!(ranges.iter().all(|r| r["from"] == "n2"));
    let sum: f64 = ranges.iter().map(|r| f(&r["fraction"])).sum();
    assert!((sum - f(&doc["moved"])).abs() < 1e-9);
    let pairs: f64 = doc["pairs"].as_array().unwrap().iter().map(|p| f(&p["fraction"])).sum();
    assert!((pairs - f(&doc["moved"])).abs() < 1e-9);
    // n2 owned its exact share; all of it moves (the ring's optimum).
    let owned = pool_of(&text).snapshot().unwrap().placement().ownership().unwrap()[1];
    assert!((f(&doc["moved"]) - owned).abs() < 1e-9, "{} vs {owned}", doc["moved"]);
    assert_eq!(doc["key_file"]["moved"], 3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Plan against routing every key of a key file through both configs.
fn check_plan_against_route(dir: &Path, old: &str, new: &str, band: f64, extra: &[&str]) -> Value {
    let old_file = write(dir, "old.yml", old);
    let new_file = write(dir, "new.yml", new);
    let keys = numbered(5000);
    let key_file = write(dir, "keys.txt", &keys);
    let args =
        [&["plan", "--from", old_file.as_str(), "--to", new_file.as_str(), "--keys-file", key_file.as_str()], extra]
            .concat();
    let doc = json(&[&args[..], &["--json"]].concat());
    let (before, after) = (routed(&old_file, &keys), routed(&new_file, &keys));
    let mut changed: Vec<String> =
        keys.lines().filter(|k| before[*k] != after[*k]).map(|k| format!("{k}\t{}\t{}", before[k], after[k])).collect();
    // The move log is exactly the keys whose route changes, in file order.
    let log = ok(&[&args[..], &["--moves-only"]].concat());
    assert_eq!(log.lines().collect::<Vec<_>>(), changed.iter().map(String::as_str).collect::<Vec<_>>());
    changed.sort();
    assert_eq!(doc["key_file"]["moved"].as_u64().unwrap() as usize, changed.len());
    let share = changed.len() as f64 / 5000.0;
    assert!((f(&doc["moved"]) - share).abs() < band, "plan {} vs route {share}", doc["moved"]);
    doc
}

#[test]
fn plan_agrees_with_route() {
    let dir = scratch("route");
    // The ring, a server joining: exact, and optimal.
    let doc = check_plan_against_route(
        &dir,
        &config("ring", &["a:1", "b:1", "c:2"]),
        &config("ring", &["a:1", "b:1", "c:2", "d:1"]),
        0.03,
        &[],
    );
    assert!((f(&doc["optimal"]) - 0.2).abs() < 1e-12);
    assert!(doc["pairs"].as_array().unwrap().iter().all(|p| p["to"] == "d"));
    // Ketama re-weighting a server: exact ranges; keys also move between the others.
    let doc = check_plan_against_route(
        &dir,
        &config("ketama", &["a:1", "b:1", "c:1"]),
        &config("ketama", &["a:1", "b:2", "c:1"]),
        0.03,
        &[],
    );
    assert_eq!(doc["change"]["reweighted"][0]["id"], "b");
    assert!(doc["ranges"].as_array().unwrap().len() > 1);
    // Maglev, a server leaving: no ranges, shares from sampled keys.
    let doc = check_plan_against_route(
        &dir,
        &config("maglev", &["a:1", "b:1", "c:1", "d:1"]),
        &config("maglev", &["a:1", "b:1", "d:1"]),
        0.03,
        &[],
    );
    assert_eq!((doc["exact"].clone(), doc["ranges"].clone()), (Value::Bool(false), Value::Null));
    assert_eq!(doc["sampled_keys"], 100000);
    assert!(f(&doc["ratio"]) >= 1.0);
    // Anchor rebuilt from scratch renumbers buckets: plan shows what a restart moves.
    let doc = check_plan_against_route(
        &dir,
        &config("anchor", &["a:1", "b:1", "c:1", "d:1"]),
        &config("anchor", &["a:1", "c:1", "d:1"]),
        0.03,
        &["--rebuild"],
    );
    assert_eq!(doc["method"], "rebuild");
    assert!(f(&doc["moved"]) > 0.4);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Anchor and jump take a single change incrementally, as the proxy does.
#[test]
fn plan_applies_single_changes_incrementally() {
    let dir = scratch("incremental");
    let old = write(&dir, "old.yml", &config("anchor", &["a:1", "b:1", "c:1", "d:1"]));
    let new = write(&dir, "new.yml", &config("anchor", &["a:1", "c:1", "d:1"]));
    let keys = write(&dir, "keys.txt", &numbered(4000));
    let doc = json(&["plan", "--from", &old, "--to", &new, "--keys-file", &keys, "--json"]);
    assert_eq!(doc["method"], "incremental");
    // Only b's keys move, about a quarter of them: anchor's optimal movement.
    assert!(doc["pairs"].as_array().unwrap().iter().all(|p| p["from"] == "b"));
    assert!((f(&doc["moved"]) - 0.25).abs() < 0.01, "{}", doc["moved"]);
    let moves = doc["key_file"]["moves"].as_array().unwrap();
    let before = routed(&old, &numbered(4000));
    assert!(moves.iter().all(|m| m["from"] == "b" && before[m["key"].as_str().unwrap()] == "b"));
    assert_eq!(moves.len(), before.values().filter(|id| *id == "b").count());
    let text = ok(&["plan", "--from", &old, "--to", &new]);
    assert!(text.contains("new placement: incremental"), "{text}");
    assert!(text.contains("ranges: not defined"), "{text}");
    // A fifth server joining takes a fifth, from every other server, and nothing else moves.
    let five = write(&dir, "five.yml", &config("anchor", &["a:1", "b:1", "c:1", "d:1", "e:1"]));
    let doc = json(&["plan", "--from", &old, "--to", &five, "--json"]);
    assert_eq!((doc["method"].as_str(), doc["change"]["added"][0].as_str()), (Some("incremental"), Some("e")));
    assert!(doc["pairs"].as_array().unwrap().iter().all(|p| p["to"] == "e"));
    assert!((f(&doc["moved"]) - 0.2).abs() < 0.01 && (f(&doc["optimal"]) - 0.2).abs() < 1e-12);
    // Jump can remove only its last server: a fresh build, said so.
    let old = write(&dir, "j4.yml", &config("jump", &["a:1", "b:1", "c:1", "d:1"]));
    let new = write(&dir, "j3.yml", &config("jump", &["a:1", "c:1", "d:1"]));
    let text = ok(&["plan", "--from", &old, "--to", &new]);
    assert!(text.contains("from scratch") && text.contains("can only remove its last"), "{text}");
    let last = write(&dir, "j3-last.yml", &config("jump", &["a:1", "b:1", "c:1"]));
    let doc = json(&["plan", "--from", &old, "--to", &last, "--json"]);
    assert_eq!(doc["method"], "incremental");
    assert!((f(&doc["moved"]) - 0.25).abs() < 0.01);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_reports_positive_rates() {
    let text = ok(&["bench", "--node", "a:1", "--node", "b:1", "--node", "c:2", "--keys", "1000", "--seconds", "0.2"]);
    let rows: Vec<&str> =
        text.lines().filter(|l| l.starts_with("with key hashing") || l.starts_with("precomputed")).collect();
    assert_eq!(rows.len(), 4, "{text}");
    for row in rows {
        let ns: f64 = row.split_whitespace().rev().nth(2).unwrap().parse().unwrap();
        assert!(ns > 0.0, "{row}");
    }
    let doc =
        json(&["bench", "--node", "a:1", "--node", "b:1", "--distribution", "bounded", "--seconds", "0.2", "--json"]);
    assert_eq!(doc["operation"], "acquire+release");
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 8);
    let sets: Vec<&str> = results.iter().map(|r| r["set"].as_str().unwrap()).collect();
    assert_eq!(sets, ["stream", "stream", "stream", "stream", "hot", "hot", "hot", "hot"]);
    assert_eq!(doc["keys"], 1_000_000);
    assert_eq!(doc["hot_keys"], 4096);
    for r in results {
        assert!(
            f(&r["lookups_per_second"]) > 0.0 && f(&r["ns_per_lookup"]) > 0.0 && r["lookups"].as_u64().unwrap() > 0
        );
    }
    let threads: Vec<u64> = results.iter().map(|r| r["threads"].as_u64().unwrap()).collect();
    assert_eq!(threads[0], 1);
    assert_eq!(threads[1], doc["threads"].as_u64().unwrap());
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let dir = scratch("bad");
    let ring = write(&dir, "ring.yml", &config("ring", &["a:1", "b:1"]));
    let md5 = write(&dir, "md5.yml", &config("ring", &["a:1", "b:1"]).replace("xxh3", "md5"));
    let missing = dir.join("missing.yml");
    let missing = missing.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["analyze", "-c", missing], "cannot read"),
        (vec!["analyze", "-c", &ring, "--pool", "nope"], "no pool named"),
        (vec!["analyze"], "no servers"),
        (vec!["analyze", "--node", "a:1", "--keys-file", missing], "cannot read"),
        (vec!["plan", "--from", &ring, "--to", &md5], "hash spaces differ"),
        (vec!["plan", "--from", &ring, "--to", missing], "cannot read"),
        (vec!["plan", "--from", &ring, "--to", &ring, "--pool", "nope"], "no pool named"),
        (vec!["bench", "-c", missing], "cannot read"),
        (vec!["bench", "--node", "a:0"], "weight"),
        (vec!["bench", "--node", "a:1", "--seconds", "0"], "seconds"),
    ];
    for (args, says) in cases {
        let o = chash(&args, b"");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
        if !args.contains(&"--seconds") {
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        }
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reader that stops early (`chash plan --json | head`) is not an error:
/// no message, exit 0, for the JSON writers too.
#[test]
fn json_into_a_closed_pipe_is_not_an_error() {
    let dir = scratch("closed-pipe");
    let old = write(&dir, "old.yml", &config("ring", &["a:1", "b:1", "c:1"]));
    let new = write(&dir, "new.yml", &config("ring", &["a:1", "b:1"]));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_chash"))
        .args(["plan", "--from", &old, "--to", &new, "--json", "--ranges", "all"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert!(out.status.success());
}
