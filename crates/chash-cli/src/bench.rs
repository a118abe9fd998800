//! `chash bench`: lookups per second for a pool's placement on this machine,
//! from the key and from a precomputed hash, on one thread and on all cores.

use std::hint::black_box;
use std::io::{self, Write};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Result;
use chash::{AnyPlacement, Placement, Snapshot};
use clap::Args;
use serde_json::json;

use crate::analyze::point_count;
use crate::keys::KeyArgs;
use crate::pool_args::PoolArgs;

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  chash bench -c nutcracker.yml --pool alpha
  chash bench --node a:1 --node b:1 --node c:2 --distribution maglev --seconds 4
  chash bench -c nutcracker.yml --keys-file keys.txt --json

Eight measurements share --seconds equally: lookups with key hashing (the key's
hash tag, hash and lookup, as the proxy routes a request) and from precomputed
hashes (the lookup alone), each on one thread and on one thread per available
core, each on two key sets built before timing:
  stream  every key (--keys N keys key:<i>, default 1000000, or --keys-file
          F), each looked up once per pass, in order: what a proxy sees, and
          the figure to plan with;
  hot     the first 4096 of them, cycled: the best case, a set the CPU's
          branch predictor and caches have learnt (several times faster than
          real traffic for some distributions).
ns/lookup is per thread (wall time x threads / lookups); lookups/s counts all
threads together, on the stream. With bounded, a lookup is an acquire and its
release, as the proxy does per request.

--json prints one object:
  pool, distribution, hash, servers, points (null unless made of points), keys,
  hot_keys, threads (available cores), seconds (per measurement), build_ms,
  operation (\"lookup\" or \"acquire+release\"), results: [{set (\"stream\" or
  \"hot\"), hashing (true: from the key; false: precomputed hash), threads,
  lookups, seconds, lookups_per_second, ns_per_lookup}].")]
pub struct BenchArgs {
    #[command(flatten)]
    pool: PoolArgs,

    #[command(flatten)]
    keys: KeyArgs,

    /// Total run time in seconds, split across the eight measurements.
    #[arg(long, value_name = "S", default_value = "2", value_parser = parse_seconds)]
    seconds: f64,

    /// Print JSON (fields listed below) instead of a table.
    #[arg(long)]
    json: bool,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds between 0 and 3600")),
    }
}

/// Keys in the hot set: the first ones of the stream, cycled.
const HOT_KEYS: usize = 4096;

/// One measurement's result.
struct Measurement {
    /// On the hot set (else the stream).
    hot: bool,
    hashing: bool,
    threads: usize,
    lookups: u64,
    elapsed: Duration,
}

impl Measurement {
    fn per_second(&self) -> f64 {
        self.lookups as f64 / self.elapsed.as_secs_f64()
    }

    fn ns_per_lookup(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e9 * self.threads as f64 / self.lookups.max(1) as f64
    }
}

/// Lookups between two looks at the clock.
const BATCH: u64 = 1024;

/// Runs `lookup` over key numbers `0..n` (from a different start per
/// thread) on `threads` threads until `budget` is spent.
fn measure(threads: usize, budget: Duration, n: usize, lookup: impl Fn(usize) -> usize + Sync) -> (u64, Duration) {
    let start = Instant::now();
    let deadline = start + budget;
    let lookups = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let lookup = &lookup;
                scope.spawn(move || {
                    let mut i = t * n / threads;
                    let (mut done, mut sink) = (0u64, 0usize);
                    loop {
                        for _ in 0..BATCH {
                            sink = sink.wrapping_add(lookup(i));
                            i += 1;
                            if i == n {
                                i = 0;
                            }
                        }
                        done += BATCH;
                        if Instant::now() >= deadline {
                            break;
                        }
                    }
                    black_box(sink);
                    done
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or(0)).sum::<u64>()
    });
    (lookups, start.elapsed())
}

/// The eight measurements for `snapshot` over `keys` (`spans` into
/// `bytes`): the stream, then its first [`HOT_KEYS`].
fn run_all(
    snapshot: &Snapshot,
    bytes: &[u8],
    spans: &[(usize, usize)],
    budget: Duration,
    cores: usize,
) -> Vec<Measurement> {
    let placement = snapshot.placement();
    let hashes: Vec<u64> = spans.iter().map(|&(a, b)| snapshot.key_hash(&bytes[a..b])).collect();
    let bounded = matches!(placement, AnyPlacement::Bounded(_));
    let mut out = Vec::new();
    for (hot, hashing) in [(false, true), (false, false), (true, true), (true, false)] {
        let n = if hot { spans.len().min(HOT_KEYS) } else { spans.len() };
        for threads in [1, cores] {
            let (lookups, elapsed) = match (hashing, bounded) {
                (true, false) => measure(threads, budget, n, |i| {
                    let (a, b) = spans[i];
                    snapshot.route_index(&bytes[a..b]).unwrap_or(0)
                }),
                (false, false) => measure(threads, budget, n, |i| placement.locate_hash(hashes[i]).unwrap_or(0)),
                (true, true) => measure(threads, budget, n, |i| {
                    let (a, b) = spans[i];
                    let node = placement.acquire_hash(snapshot.key_hash(&bytes[a..b])).unwrap_or(0);
                    placement.release(node);
                    node
                }),
                (false, true) => measure(threads, budget, n, |i| {
                    let node = placement.acquire_hash(hashes[i]).unwrap_or(0);
                    placement.release(node);
                    node
                }),
            };
            out.push(Measurement { hot, hashing, threads, lookups, elapsed });
        }
    }
    out
}

/// `1234567.0` as `1.23 M`.
fn si(x: f64) -> String {
    match x {
        x if x >= 1e9 => format!("{:.2} G", x / 1e9),
        x if x >= 1e6 => format!("{:.2} M", x / 1e6),
        x if x >= 1e3 => format!("{:.2} k", x / 1e3),
        x => format!("{x:.0} "),
    }
}

pub fn run(args: BenchArgs) -> Result<()> {
    let pool = args.pool.pool("bench")?;
    let keys = args.keys.key_set_or(1_000_000)?;
    let built = Instant::now();
    let snapshot = pool.snapshot()?;
    let build = built.elapsed();
    let (mut bytes, mut spans) = (Vec::new(), Vec::with_capacity(keys.len() as usize));
    keys.for_each(|k| {
        spans.push((bytes.len(), bytes.len() + k.len()));
        bytes.extend_from_slice(k);
    });
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    let budget = Duration::from_secs_f64(args.seconds / 8.0);
    let results = run_all(&snapshot, &bytes, &spans, budget, cores);
    let bounded = matches!(snapshot.placement(), AnyPlacement::Bounded(_));
    let points = point_count(snapshot.placement());

    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    if args.json {
        let doc = json!({
            "pool": pool.name,
            "distribution": pool.distribution.name(),
            "hash": pool.hash.to_string(),
            "servers": snapshot.nodes().len(),
            "points": points,
            "keys": keys.len(),
            "hot_keys": spans.len().min(HOT_KEYS),
            "threads": cores,
            "seconds": budget.as_secs_f64(),
            "build_ms": build.as_secs_f64() * 1e3,
            "operation": if bounded { "acquire+release" } else { "lookup" },
            "results": results.iter().map(|m| json!({
                "set": if m.hot { "hot" } else { "stream" }, "hashing": m.hashing, "threads": m.threads, "lookups": m.lookups,
                "seconds": m.elapsed.as_secs_f64(), "lookups_per_second": m.per_second(),
                "ns_per_lookup": m.ns_per_lookup(),
            })).collect::<Vec<_>>(),
        });
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
        out.flush()?;
        return Ok(());
    }
    let points = points.map_or(String::new(), |n| format!(", {n} points"));
    writeln!(
        out,
        "pool {}: {}, hash {}, {} servers{points}; built in {:.3} ms",
        pool.name,
        pool.distribution,
        pool.hash,
        snapshot.nodes().len(),
        build.as_secs_f64() * 1e3
    )?;
    writeln!(
        out,
        "stream: {}; hot: the first {} cycled; {:.2} s per measurement; {cores} cores",
        keys.describe(),
        spans.len().min(HOT_KEYS),
        budget.as_secs_f64()
    )?;
    if bounded {
        writeln!(out, "bounded: each lookup is an acquire and its release, as the proxy does per request")?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<18}  {:>7}  {:>16}  {:>13}  {:>18}",
        "lookup", "threads", "stream ns/lookup", "hot ns/lookup", "stream lookups/s"
    )?;
    let half = results.len() / 2;
    for (m, h) in results[..half].iter().zip(&results[half..]) {
        let what = if m.hashing { "with key hashing" } else { "precomputed hash" };
        writeln!(
            out,
            "{what:<18}  {:>7}  {:>16.1}  {:>13.1}  {:>18}",
            m.threads,
            m.ns_per_lookup(),
            h.ns_per_lookup(),
            si(m.per_second())
        )?;
    }
    writeln!(out)?;
    writeln!(out, "ns/lookup is per thread (wall time x threads / lookups); lookups/s is all threads together.")?;
    writeln!(out, "Plan with the stream: real traffic is not a hot set the CPU has learnt.")?;
    out.flush()?;
    Ok(())
}
