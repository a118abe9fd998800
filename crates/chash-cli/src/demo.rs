//! `chash demo`: the seeds' experiment on a real running system.
//!
//! In-process cache shards (memcached protocol, on loopback ports) with
//! different weights sit behind the proxy; a workload of keys is written and
//! read through the proxy over TCP. Then a shard leaves and one joins, while
//! a second pool on the same kind of shards does the same under `hash % n`,
//! and the hit rates a client sees right after each change are compared
//! (and with warm-up). A shard is killed under replicas and under failover.
//! Finally the same servers run under every distribution chash has. The
//! terminal gets tables; an HTML report with SVG charts gets written.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::io::{self, IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use chash::analysis::{sampling_floor_cv, Balance};
use chash::{Distribution, PoolConfig, Snapshot};
use chash::{Node, ServerLine};
use chash_proxy::embedded::{start_shard, Shard};
use chash_proxy::{Address, PoolSpec, ProxyOptions};
use clap::Args;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::svg::{bar_chart, esc, grouped_bars, ring_diagram, Bar};

#[derive(Args, Debug)]
#[command(after_help = "\
Four in-process cache shards (weights 1, 2, 1, 4) behind the proxy, a workload
of --keys keys written and read through it over TCP, then shard-c leaving and
shard-e (weight 1) joining. Pools on shards of their own do the same with
`hash % n` (twemproxy's modula) and with warm-up (`warmup: 600`: a miss is
tried on the key's shard before the change). Then shard-b is killed under
`replicas: 2` and under `failover: next`, and the same servers run under
every distribution. Writes an HTML report with charts (--report).")]
pub struct DemoArgs {
    /// Keys in the workload.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(100..=2_000_000))]
    keys: u32,

    /// Where to write the HTML report.
    #[arg(long, value_name = "FILE", default_value = "chash-demo-report.html")]
    report: PathBuf,
}

const SPEC: [(&str, u32); 4] = [("shard-a", 1), ("shard-b", 2), ("shard-c", 1), ("shard-d", 4)];
const LEAVING: &str = "shard-c";
const JOINING: (&str, u32) = ("shard-e", 1);
const KILLED: &str = "shard-b";

/// Progress on standard error when it is a terminal.
struct Progress {
    on: bool,
    started: Instant,
}

impl Progress {
    fn step(&self, what: &str) {
        if self.on {
            eprint!("\r\x1b[2K  … {what} ({:.1} s)", self.started.elapsed().as_secs_f64());
            let _ = io::stderr().flush();
        }
    }

    fn done(&self) {
        if self.on {
            eprint!("\r\x1b[2K");
        }
    }
}

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

pub fn run(args: DemoArgs) -> Result<()> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    runtime.block_on(demo(args))
}

/// One pool of the demo: its shards by id and where the proxy serves it.
struct Cluster {
    addr: SocketAddr,
    shards: HashMap<String, Shard>,
}

/// Each shard's off switch, by pool and id.
type Stops = Vec<(String, tokio::sync::watch::Sender<bool>)>;

impl Cluster {
    fn items(&self, id: &str) -> usize {
        self.shards.get(id).map_or(0, |s| s.store.items())
    }
}

async fn pool_spec(
    name: &'static str,
    distribution: Distribution,
    tune: fn(&mut PoolConfig),
    stops: &mut Stops,
) -> Result<(PoolSpec, HashMap<String, Shard>)> {
    let mut shards = HashMap::new();
    let mut addresses = HashMap::new();
    for (id, _) in SPEC.iter().chain([&JOINING]) {
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        stops.push((format!("{name}/{id}"), stop));
        let shard = start_shard(256 << 20, stop_rx).await.context("cannot start a shard")?;
        addresses.insert((*id).to_owned(), Address::Tcp(shard.addr.to_string()));
        shards.insert((*id).to_owned(), shard);
    }
    let servers =
        SPEC.iter().map(|(id, w)| format!("{id}:{w}").parse::<ServerLine>()).collect::<chash::Result<Vec<_>>>()?;
    let mut pool = PoolConfig::from_servers(servers)?;
    pool.name = name.into();
    pool.distribution = distribution;
    pool.listen = "127.0.0.1:0".into();
    tune(&mut pool);
    Ok((PoolSpec { config: pool, addresses }, shards))
}

/// A proxy connection's buffered read side.
type Replies = BufReader<OwnedReadHalf>;

/// Runs `work` on each quarter of `keys` over a connection of its own to the
/// proxy, the four at once; the results come back in key order.
async fn on_four_connections<T, F, Fut>(addr: SocketAddr, keys: &[String], work: F) -> Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(Replies, OwnedWriteHalf, Vec<String>) -> Fut,
    Fut: Future<Output = Result<Vec<T>>> + Send + 'static,
{
    let mut tasks = Vec::new();
    for part in keys.chunks(keys.len().div_ceil(4).max(1)) {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (r, w) = stream.into_split();
        tasks.push(tokio::spawn(work(BufReader::new(r), w, part.to_vec())));
    }
    let mut all = Vec::with_capacity(keys.len());
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// Writes `keys` (value = key) through the proxy, pipelined over 4 connections.
async fn set_all(addr: SocketAddr, keys: &[String]) -> Result<()> {
    on_four_connections(addr, keys, |mut r, mut w, part| async move {
        let mut line = String::new();
        for batch in part.chunks(500) {
            let mut req = Vec::new();
            for k in batch {
                req.extend_from_slice(format!("set {k} 0 0 {}\r\n{k}\r\n", k.len()).as_bytes());
            }
            w.write_all(&req).await?;
            for _ in batch {
                line.clear();
                r.read_line(&mut line).await?;
                if line != "STORED\r\n" {
                    bail!("the proxy answered {line:?} to a set");
                }
            }
        }
        Ok(Vec::<()>::new())
    })
    .await
    .map(drop)
}

/// Reads `keys` through the proxy; `true` for a hit. A hit must carry the
/// key's own value.
async fn get_all(addr: SocketAddr, keys: &[String]) -> Result<Vec<bool>> {
    on_four_connections(addr, keys, |mut r, mut w, part| async move {
        let mut hits = Vec::with_capacity(part.len());
        let mut line = String::new();
        for batch in part.chunks(500) {
            let mut req = Vec::new();
            for k in batch {
                req.extend_from_slice(format!("get {k}\r\n").as_bytes());
            }
            w.write_all(&req).await?;
            for k in batch {
                line.clear();
                r.read_line(&mut line).await?;
                if line == "END\r\n" {
                    hits.push(false);
                    continue;
                }
                let len: usize =
                    line.split_whitespace().nth(3).and_then(|l| l.parse().ok()).context("bad VALUE line")?;
                let mut data = vec![0u8; len + 2];
                r.read_exact(&mut data).await?;
                if &data[..len] != k.as_bytes() {
                    bail!("the proxy returned another key's value for {k}");
                }
                line.clear();
                r.read_line(&mut line).await?;
                hits.push(true);
            }
        }
        Ok(hits)
    })
    .await
}

fn hit_rate(hits: &[bool]) -> f64 {
    hits.iter().filter(|&&h| h).count() as f64 / hits.len() as f64
}

/// Misses of `hits` (the keys a cache would now refill).
fn missed(keys: &[String], hits: &[bool]) -> Vec<String> {
    keys.iter().zip(hits).filter(|(_, &h)| !h).map(|(k, _)| k.clone()).collect()
}

/// Everything the report shows.
struct Results {
    keys: usize,
    per_shard: Vec<(String, u32, f64, f64, usize)>,
    ring_arcs: Vec<(f64, f64, usize)>,
    balance: Balance,
    leave_moved: usize,
    leave_from_leaving: usize,
    leaving_held: usize,
    leave_exact: f64,
    leave_hits: (f64, f64, f64),
    join_moved: usize,
    join_on_new: usize,
    join_fair: f64,
    join_exact: f64,
    join_hits: (f64, f64, f64),
    killed: (f64, f64, f64),
    algorithms: Vec<AlgoRow>,
}

struct AlgoRow {
    name: String,
    note: String,
    cv: f64,
    peak: f64,
    leave: f64,
    join: f64,
}

async fn demo(args: DemoArgs) -> Result<()> {
    let started = Instant::now();
    let progress = Progress { on: io::stderr().is_terminal(), started };
    let out = &mut io::stdout().lock();
    let n = args.keys as usize;
    let keys: Vec<String> = (0..n).map(|i| format!("user:{i}")).collect();
    let mut stops = Stops::new();

    progress.step("starting 25 cache shards and the proxy");
    let keep = |_: &mut PoolConfig| {};
    let (ring_spec, ring_shards) = pool_spec("ring", Distribution::Ring, keep, &mut stops).await?;
    let (mod_spec, mod_shards) = pool_spec("modula", Distribution::Modula, keep, &mut stops).await?;
    let warm = |p: &mut PoolConfig| p.warmup = std::time::Duration::from_secs(600);
    let (warm_spec, warm_shards) = pool_spec("warm", Distribution::Ring, warm, &mut stops).await?;
    let replicated = |p: &mut PoolConfig| p.replicas = 2;
    let (rep_spec, _) = pool_spec("replicas", Distribution::Ring, replicated, &mut stops).await?;
    let failover = |p: &mut PoolConfig| {
        p.failover = true;
        p.server_failure_limit = 1;
    };
    let (fo_spec, _) = pool_spec("failover", Distribution::Ring, failover, &mut stops).await?;
    let ring_config = ring_spec.config.clone();
    let specs = vec![ring_spec, mod_spec, warm_spec, rep_spec, fo_spec];
    let running = chash_proxy::start(specs, ProxyOptions::default()).await?;
    let ring = Cluster { addr: running.listeners()[0].1, shards: ring_shards };
    let modula = Cluster { addr: running.listeners()[1].1, shards: mod_shards };
    let warm = Cluster { addr: running.listeners()[2].1, shards: warm_shards };
    let (replicas_addr, failover_addr) = (running.listeners()[3].1, running.listeners()[4].1);
    let ring_pool = running.registry().pool("ring").context("ring pool")?;
    let mod_pool = running.registry().pool("modula").context("modula pool")?;
    let warm_pool = running.registry().pool("warm").context("warm pool")?;

    writeln!(
        out,
        "chash demo: {n} keys through the proxy (127.0.0.1:{}) onto 4 in-process cache shards; ring: chash's native ring (xxh3, 160 vnodes per weight)\n",
        ring.addr.port()
    )?;

    // 1. Load per shard.
    progress.step("writing the keys through the proxy");
    for addr in [ring.addr, modula.addr, warm.addr, replicas_addr, failover_addr] {
        set_all(addr, &keys).await?;
    }
    let snapshot = ring_config.snapshot()?;
    let share = snapshot.placement().ownership().unwrap_or_default();
    let total_w: u32 = SPEC.iter().map(|s| s.1).sum();
    let mut per_shard = Vec::new();
    for (i, (id, w)) in SPEC.iter().enumerate() {
        let fair = f64::from(*w) / f64::from(total_w);
        per_shard.push(((*id).to_owned(), *w, fair, share.get(i).copied().unwrap_or(0.0), ring.items(id)));
    }
    let held: usize = per_shard.iter().map(|s| s.4).sum();
    if held != n {
        bail!("the shards hold {held} keys, {n} were written");
    }
    let balance = Balance::of(&per_shard.iter().map(|s| s.4 as f64).collect::<Vec<_>>(), &SPEC.map(|s| s.1));
    progress.done();
    writeln!(out, "1. Keys per shard against weight (written through the proxy, counted in each shard)")?;
    writeln!(
        out,
        "   {:<9} {:>6} {:>10} {:>12} {:>8} {:>10}",
        "shard", "weight", "fair share", "hash space", "keys", "key share"
    )?;
    for (id, w, fair, space, count) in &per_shard {
        writeln!(
            out,
            "   {:<9} {:>6} {:>10} {:>12} {:>8} {:>10}",
            id,
            w,
            pct(*fair),
            pct(*space),
            count,
            pct(*count as f64 / n as f64)
        )?;
    }
    writeln!(
        out,
        "   balance: CV {:.4}, peak/mean {:.3} per unit of weight (160 vnodes give about 1/sqrt(160 x weight); the sampling floor for {n} keys is CV {:.4})\n",
        balance.cv,
        balance.peak_over_mean,
        sampling_floor_cv(n as u64, SPEC.len())
    )?;

    // 2. A shard leaves.
    progress.step(&format!("{LEAVING} leaves; reading every key back"));
    let leaving_held = ring.items(LEAVING);
    let leave_change = ring_pool.remove_server(LEAVING).map_err(anyhow::Error::msg)?;
    mod_pool.remove_server(LEAVING).map_err(anyhow::Error::msg)?;
    warm_pool.remove_server(LEAVING).map_err(anyhow::Error::msg)?;
    let ring_hits = get_all(ring.addr, &keys).await?;
    let mod_hits = get_all(modula.addr, &keys).await?;
    let warm_hits = get_all(warm.addr, &keys).await?;
    set_all(warm.addr, &missed(&keys, &warm_hits)).await?;
    let ring_missed = missed(&keys, &ring_hits);
    // The missed keys are exactly the ones the leaving shard held.
    let leaving_store = &ring.shards[LEAVING].store;
    let from_leaving = ring_missed.iter().filter(|k| leaving_store.contains(k.as_bytes())).count();
    progress.step("refilling the missed keys");
    set_all(ring.addr, &ring_missed).await?;
    set_all(modula.addr, &missed(&keys, &mod_hits)).await?;
    let leave_hits = (hit_rate(&ring_hits), hit_rate(&mod_hits), hit_rate(&warm_hits));
    let leave_moved = ring_missed.len();
    progress.done();
    writeln!(out, "2. {LEAVING} leaves (the admin API's remove, live)")?;
    writeln!(
        out,
        "   ring: {} keys moved ({}), {} of them from {LEAVING}, which held {}; the proxy reported {} of the key space moved",
        ring_missed.len(),
        pct(ring_missed.len() as f64 / n as f64),
        from_leaving,
        leaving_held,
        pct(leave_change.moved_fraction)
    )?;
    writeln!(
        out,
        "   cache hit rate right after:  ring {}   ring with warm-up {}   hash % n {}\n",
        pct(leave_hits.0),
        pct(leave_hits.2),
        pct(leave_hits.1)
    )?;

    // 3. A shard joins.
    progress.step(&format!("{} joins; reading every key back", JOINING.0));
    let joining_line: ServerLine = format!("{}:{}", JOINING.0, JOINING.1).parse()?;
    let join_change = ring_pool.add_server(joining_line.clone()).map_err(anyhow::Error::msg)?;
    mod_pool.add_server(joining_line.clone()).map_err(anyhow::Error::msg)?;
    warm_pool.add_server(joining_line).map_err(anyhow::Error::msg)?;
    let ring_hits = get_all(ring.addr, &keys).await?;
    let mod_hits = get_all(modula.addr, &keys).await?;
    let warm_hits = get_all(warm.addr, &keys).await?;
    let ring_missed = missed(&keys, &ring_hits);
    set_all(ring.addr, &ring_missed).await?;
    let join_on_new = ring.items(JOINING.0);
    let w_after: u32 = SPEC.iter().filter(|s| s.0 != LEAVING).map(|s| s.1).sum::<u32>() + JOINING.1;
    let join_fair = f64::from(JOINING.1) / f64::from(w_after);
    let join_hits = (hit_rate(&ring_hits), hit_rate(&mod_hits), hit_rate(&warm_hits));
    progress.done();
    writeln!(out, "3. {} (weight {}) joins (the admin API's add, live)", JOINING.0, JOINING.1)?;
    writeln!(
        out,
        "   ring: {} keys moved ({}); after refilling them {} holds {} keys: {}; its fair share is {}/{w_after} = {}",
        ring_missed.len(),
        pct(ring_missed.len() as f64 / n as f64),
        JOINING.0,
        join_on_new,
        if join_on_new == ring_missed.len() { "every moved key went to it" } else { "NOT only the moved keys" },
        JOINING.1,
        pct(join_fair)
    )?;
    writeln!(
        out,
        "   cache hit rate right after:  ring {}   ring with warm-up {}   hash % n {}\n",
        pct(join_hits.0),
        pct(join_hits.2),
        pct(join_hits.1)
    )?;
    let warmed = warm_pool.stats();
    writeln!(
        out,
        "   warm-up (pool key `warmup: 600`): a read that misses on a key's new shard is tried on its shard before the change and the value copied over: {} found there, {} copied\n",
        warmed.get("warmup_hits"),
        warmed.get("warmup_copies")
    )?;

    // 4. A shard killed outright.
    progress.step(&format!("{KILLED} killed; reading every key back"));
    for (name, stop) in &stops {
        if name.ends_with(&format!("/{KILLED}")) && (name.starts_with("replicas/") || name.starts_with("failover/")) {
            let _ = stop.send(true);
        }
    }
    let killed_share = per_shard.iter().find(|s| s.0 == KILLED).map_or(0.0, |s| s.4 as f64 / n as f64);
    let replica_hits = get_all(replicas_addr, &keys).await?;
    let failover_hits = get_all(failover_addr, &keys).await?;
    set_all(failover_addr, &missed(&keys, &failover_hits)).await?;
    let failover_again = get_all(failover_addr, &keys).await?;
    let killed = (hit_rate(&replica_hits), hit_rate(&failover_hits), hit_rate(&failover_again));
    progress.done();
    writeln!(out, "4. {KILLED} is killed (its process gone, no membership change)")?;
    writeln!(out, "   `replicas: 2` (each key on its first two candidates): hit rate {} with no error", pct(killed.0))?;
    writeln!(
        out,
        "   `failover: next` (its keys to their next shard, nothing else moves): hit rate {} (it held {} of the keys), then {} once they are written again\n",
        pct(killed.1),
        pct(killed_share),
        pct(killed.2)
    )?;

    for (_, stop) in &stops {
        let _ = stop.send(true);
    }
    running.shutdown().await;

    // 4. Every distribution on the same servers.
    progress.step("comparing the distributions");
    let algorithms = compare(&keys)?;
    progress.done();
    writeln!(
        out,
        "5. The same servers under every distribution ({n} keys; {LEAVING} leaves, then {} joins)",
        JOINING.0
    )?;
    writeln!(
        out,
        "   {:<36} {:>8} {:>10} {:>14} {:>14}",
        "distribution", "CV", "peak/mean", "moved on leave", "moved on join"
    )?;
    for r in &algorithms {
        writeln!(
            out,
            "   {:<36} {:>8.4} {:>10.3} {:>14} {:>14}",
            format!("{}{}", r.name, r.note),
            r.cv,
            r.peak,
            pct(r.leave),
            pct(r.join)
        )?;
    }
    writeln!(
        out,
        "   optimal movement: {} on leave and {} on join with the weights, 25.00% for both with weights 1;\n   \
         CV is per unit of weight; the sampling floor for {n} keys on 4 equal shards is CV {:.4}\n",
        pct(f64::from(SPEC[2].1) / f64::from(total_w)),
        pct(join_fair),
        sampling_floor_cv(n as u64, 4)
    )?;

    let results = Results {
        keys: n,
        per_shard,
        balance,
        leave_moved,
        ring_arcs: ring_arcs(&snapshot),
        leave_from_leaving: from_leaving,
        leaving_held,
        leave_exact: leave_change.moved_fraction,
        leave_hits,
        join_moved: ring_missed.len(),
        join_on_new,
        join_fair,
        join_exact: join_change.moved_fraction,
        join_hits,
        killed,
        algorithms,
    };
    let html = report(&results);
    std::fs::write(&args.report, html).with_context(|| format!("cannot write {}", args.report.display()))?;
    let path = std::fs::canonicalize(&args.report).unwrap_or(args.report.clone());
    writeln!(out, "Report: {}  ({:.1} s)", path.display(), started.elapsed().as_secs_f64())?;
    Ok(())
}

/// The servers of the demo under one distribution, `shard-c` leaving and
/// `shard-e` joining, by each algorithm's own change.
fn compare(keys: &[String]) -> Result<Vec<AlgoRow>> {
    let mut rows = Vec::new();
    for (dist, hash) in [
        ("ring", "xxh3"),
        ("ketama", "md5"),
        ("modula", "xxh3"),
        ("nginx", "crc32a"),
        ("rendezvous", "xxh3"),
        ("maglev", "xxh3"),
        ("jump", "xxh3"),
        ("jumpback", "xxh3"),
        ("anchor", "xxh3"),
        ("multiprobe", "xxh3"),
        ("bounded", "xxh3"),
    ] {
        let distribution: Distribution = dist.parse()?;
        let weighted = !matches!(
            distribution,
            Distribution::Jump | Distribution::JumpBack | Distribution::Anchor | Distribution::Multiprobe
        );
        let servers = SPEC
            .iter()
            .map(|(id, w)| format!("{id}:{}", if weighted { *w } else { 1 }).parse::<ServerLine>())
            .collect::<chash::Result<Vec<_>>>()?;
        let mut pool = PoolConfig::from_servers(servers)?;
        pool.distribution = distribution;
        pool.hash = hash.parse()?;
        let before = pool.snapshot()?;
        let mut note = String::new();
        if !weighted {
            note.push_str(" (weights 1)");
        }
        let left = if matches!(distribution, Distribution::Jump | Distribution::JumpBack) {
            // Jump can only lose its last bucket.
            note.push_str(&format!(", {} leaves", SPEC[SPEC.len() - 1].0));
            before.without_node(SPEC[SPEC.len() - 1].0)?
        } else {
            before.without_node(LEAVING)?
        };
        let joined = left.with_node(Node::new(JOINING.0, JOINING.1)?)?;
        let load = count(&before, keys);
        let weights: Vec<u32> = before.nodes().iter().map(Node::weight).collect();
        let b = Balance::of(&load, &weights);
        rows.push(AlgoRow {
            name: dist.into(),
            note,
            cv: b.cv,
            peak: b.peak_over_mean,
            leave: moved(&before, &left, keys),
            join: moved(&left, &joined, keys),
        });
    }
    Ok(rows)
}

/// The ring's arcs as fractions of the hash space, with their owners.
fn ring_arcs(s: &Snapshot) -> Vec<(f64, f64, usize)> {
    s.placement().point_ring().map(|r| chash::analysis::arcs(&r)).unwrap_or_default()
}

fn count(s: &Snapshot, keys: &[String]) -> Vec<f64> {
    let mut c = vec![0.0; s.nodes().len()];
    for k in keys {
        if let Some(i) = s.route_index(k.as_bytes()) {
            c[i] += 1.0;
        }
    }
    c
}

fn moved(a: &Snapshot, b: &Snapshot, keys: &[String]) -> f64 {
    keys.iter().filter(|k| a.route(k.as_bytes()) != b.route(k.as_bytes())).count() as f64 / keys.len() as f64
}

fn report(r: &Results) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>chash demo</title><style>\
         body{{font-family:sans-serif;max-width:900px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}\
         th{{background:#f4f4f4}}td:first-child,th:first-child{{text-align:left}}.note{{color:#555}}</style></head><body>\
         <h1>chash demo</h1><p class=\"note\">{} keys written and read through the chash proxy over TCP, onto in-process \
         cache shards with weights 1, 2, 1 and 4; chash's native ring (xxh3, 160 vnodes per unit of weight) against \
         <code>hash % n</code> (twemproxy's modula) on its own shards.</p>",
        r.keys
    );
    // 1.
    let bars: Vec<Bar> = r
        .per_shard
        .iter()
        .map(|(id, w, fair, _, count)| Bar {
            label: format!("{id} (w{w})"),
            value: 100.0 * *count as f64 / r.keys as f64,
            target: Some(100.0 * fair),
        })
        .collect();
    let _ = write!(h, "<h2>1. Keys per shard against weight</h2>{}", bar_chart("Share of keys per shard", "%", &bars));
    h.push_str("<table><tr><th>shard</th><th>weight</th><th>fair share</th><th>hash space</th><th>keys</th><th>key share</th></tr>");
    for (id, w, fair, space, count) in &r.per_shard {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{w}</td><td>{}</td><td>{}</td><td>{count}</td><td>{}</td></tr>",
            esc(id),
            pct(*fair),
            pct(*space),
            pct(*count as f64 / r.keys as f64)
        );
    }
    let _ = write!(
        h,
        "</table><p>Balance per unit of weight: CV {:.4}, peak/mean {:.3}.</p>",
        r.balance.cv, r.balance.peak_over_mean
    );
    let names: Vec<String> = r.per_shard.iter().map(|s| format!("{} (weight {})", s.0, s.1)).collect();
    let _ =
        write!(h, "{}", ring_diagram("The ring: each arc coloured by the shard that owns it", &r.ring_arcs, &names));
    // 2 and 3.
    let _ = write!(
        h,
        "<h2>2. {LEAVING} leaves, 3. {} joins</h2><p>Leaving: {} keys missed, {} of the key space moved (the \
         proxy's exact figure); every key that missed was one {LEAVING} held ({} of {}). Joining: {} moved; {} keys \
         moved and {} now holds exactly {} keys, against a fair share of {}.</p>",
        JOINING.0,
        r.leave_moved,
        pct(r.leave_exact),
        r.leave_from_leaving,
        r.leaving_held,
        pct(r.join_exact),
        r.join_moved,
        JOINING.0,
        r.join_on_new,
        pct(r.join_fair)
    );
    let _ = write!(
        h,
        "{}",
        grouped_bars(
            "Cache hit rate right after the change",
            "%",
            &[format!("{LEAVING} leaves"), format!("{} joins", JOINING.0)],
            &[
                ("chash ring".into(), vec![100.0 * r.leave_hits.0, 100.0 * r.join_hits.0]),
                ("chash ring with warm-up".into(), vec![100.0 * r.leave_hits.2, 100.0 * r.join_hits.2]),
                ("hash % n".into(), vec![100.0 * r.leave_hits.1, 100.0 * r.join_hits.1]),
            ],
        )
    );
    // 4.
    let _ = write!(
        h,
        "<h2>4. {KILLED} killed</h2><p>Its process gone, no membership change. With <code>replicas: 2</code> \
         every key is on its first two candidates: hit rate {}. With <code>failover: next</code> its keys go to \
         their next shard and nothing else moves: hit rate {}, then {} once they are written again.</p>",
        pct(r.killed.0),
        pct(r.killed.1),
        pct(r.killed.2)
    );
    // 5.
    h.push_str("<h2>5. Every distribution on the same servers</h2><table><tr><th>distribution</th><th>CV</th><th>peak/mean</th><th>moved on leave</th><th>moved on join</th></tr>");
    for a in &r.algorithms {
        let _ = write!(
            h,
            "<tr><td>{}{}</td><td>{:.4}</td><td>{:.3}</td><td>{}</td><td>{}</td></tr>",
            esc(&a.name),
            esc(&a.note),
            a.cv,
            a.peak,
            pct(a.leave),
            pct(a.join)
        );
    }
    h.push_str("</table>");
    let names: Vec<String> = r.algorithms.iter().map(|a| a.name.clone()).collect();
    let _ = write!(
        h,
        "{}",
        grouped_bars(
            "Keys moved by the change",
            "%",
            &names,
            &[
                ("leave".into(), r.algorithms.iter().map(|a| 100.0 * a.leave).collect()),
                ("join".into(), r.algorithms.iter().map(|a| 100.0 * a.join).collect()),
            ],
        )
    );
    h.push_str("</body></html>\n");
    h
}
