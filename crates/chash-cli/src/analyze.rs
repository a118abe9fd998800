//! `chash analyze`: how a pool spreads keys over its servers, exactly where
//! the placement is made of points and over a sampled key set always, against
//! each server's fair share; optionally beside other distributions.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use chash::analysis::{sampling_floor_cv, Balance};
use chash::PointRing;
use chash::{AnyPlacement, Distribution, PoolConfig, DISTRIBUTIONS};
use clap::Args;
use indicatif::ProgressBar;
use serde_json::{json, Value};

use crate::keys::{KeyArgs, KeySet};
use crate::pool_args::PoolArgs;
use crate::progress;
use crate::svg;

/// Ring diagrams are drawn for rings of at most this many points (beyond it
/// the arcs are thinner than a pixel).
const RING_DIAGRAM_POINTS: usize = 2000;

/// An arc of the ring for the diagram: `(start, end, owner)`, the ends as
/// fractions of the hash space.
type RingArc = (f64, f64, usize);

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  chash analyze -c nutcracker.yml --pool alpha
  chash analyze --node a:1 --node b:2 --node c:1 --compare ketama,ring,maglev,jump
  chash analyze -c nutcracker.yml --keys-file keys.txt --svg shares.svg
  chash analyze --node a:1 --node b:1 --compare all --json

Per server: its fair share (weight / total weight), its exact share of the hash
space where the placement is made of points (ring, ketama, nginx, and bounded's
ring; n/a for the others), and its share of a sampled key set (--keys N keys
key:0..key:<N-1>, default 100000, or --keys-file F, one key per line split on LF
only). Then the balance (CV of load per unit of weight, weighted by weight; and
peak/mean: the most loaded server's load over its fair share) and the sampling
floor: the CV that sampling alone gives a perfectly balanced placement with that
many keys, sqrt((servers - 1) / keys). Keys are placed as chash route places
them (with bounded, in order, each holding its load to the end).

--compare D,D,... (or all) places the same servers under each distribution, with
the pool's hash where the distribution takes it and its default hash otherwise
(ketama: fnv1a_64, nginx: crc32a); a distribution that cannot take the servers
(jump with weights, an anchor capacity below the number of servers, ...) gets a
note instead of numbers.

--json prints one object:
  pool, distribution, hash, keys (count), key_source, points (null unless made
  of points), servers: [{id, weight, fair_share, exact_share (null: n/a),
  sampled_share, sampled_keys}], exact: {cv, peak_over_mean} or null,
  sampled: {cv, peak_over_mean}, sampling_floor_cv, compare: [{distribution,
  hash, error (null or why it cannot take the servers), servers, exact,
  sampled}] (as above; empty without --compare).")]
pub struct AnalyzeArgs {
    #[command(flatten)]
    pool: PoolArgs,

    #[command(flatten)]
    keys: KeyArgs,

    /// Also place the same servers under these distributions, side by side
    /// (comma-separated, or `all`).
    #[arg(long, value_name = "D,D,...", value_delimiter = ',')]
    compare: Vec<String>,

    /// Write an SVG chart of the shares against the fair shares (and a ring
    /// diagram for rings of at most 2000 points).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,

    /// Print JSON (fields listed below) instead of tables.
    #[arg(long)]
    json: bool,
}

/// One server's shares.
struct ServerShare {
    id: String,
    weight: u32,
    fair: f64,
    exact: Option<f64>,
    sampled: f64,
    keys: u64,
}

/// One placement of the pool's servers, analysed.
struct Analysis {
    distribution: Distribution,
    hash: chash::KeyHasher,
    /// In the pool's server order.
    servers: Vec<ServerShare>,
    points: Option<usize>,
    exact: Option<Balance>,
    sampled: Balance,
    /// The ring's arcs `(start, end, server)` for the diagram, when small.
    arcs: Option<Vec<RingArc>>,
}

/// Number of points, where the placement is made of them.
pub fn point_count(p: &AnyPlacement) -> Option<usize> {
    p.point_ring().map(|r| r.point_hashes().len())
}

/// Points of the placement and, when there are few, its arcs.
fn ring_points(p: &AnyPlacement) -> Option<(usize, Option<Vec<RingArc>>)> {
    let ring = p.point_ring()?;
    let n = ring.point_hashes().len();
    Some((n, (n <= RING_DIAGRAM_POINTS).then(|| chash::analysis::arcs(&ring))))
}

/// Places `keys` with `pool`'s placement and measures the shares.
fn analyse(pool: &PoolConfig, keys: &KeySet, bar: &ProgressBar) -> Result<Analysis> {
    let snapshot = pool.snapshot()?;
    let placement = snapshot.placement();
    let nodes = snapshot.nodes();
    let mut counts = vec![0u64; nodes.len()];
    const CHUNK: u64 = 1 << 14;
    let mut start = 0;
    while start < keys.len() {
        let end = (start + CHUNK).min(keys.len());
        keys.for_each_in(start..end, |key| {
            // As chash route places keys (bounded: each holds its load).
            if let Some(i) = placement.acquire_hash(snapshot.key_hash(key)) {
                counts[i] += 1;
            }
        });
        bar.inc(end - start);
        start = end;
    }
    let exact = placement.ownership();
    let (points, arcs) = match ring_points(placement) {
        Some((n, arcs)) => (Some(n), arcs),
        None => (None, None),
    };
    // Report in the pool's server order (ketama and modula sort by name).
    let order: Vec<usize> = pool
        .servers
        .iter()
        .map(|s| nodes.iter().position(|n| n.id() == s.id).context("a server is missing from its placement"))
        .collect::<Result<_>>()?;
    let total_weight: f64 = nodes.iter().map(|n| f64::from(n.weight())).sum();
    let sampled_total = counts.iter().sum::<u64>().max(1) as f64;
    let servers: Vec<ServerShare> = order
        .iter()
        .map(|&i| ServerShare {
            id: nodes[i].id().to_owned(),
            weight: nodes[i].weight(),
            fair: f64::from(nodes[i].weight()) / total_weight,
            exact: exact.as_ref().map(|e| e[i]),
            sampled: counts[i] as f64 / sampled_total,
            keys: counts[i],
        })
        .collect();
    let weights: Vec<u32> = servers.iter().map(|s| s.weight).collect();
    let balance = |shares: Vec<f64>| Balance::of(&shares, &weights);
    let position_in_pool = |i: usize| order.iter().position(|&o| o == i).unwrap_or(i);
    Ok(Analysis {
        distribution: pool.distribution,
        hash: pool.hash,
        exact: exact.as_ref().map(|_| balance(servers.iter().map(|s| s.exact.unwrap_or(0.0)).collect())),
        sampled: balance(servers.iter().map(|s| s.keys as f64).collect()),
        arcs: arcs.map(|a| a.into_iter().map(|(s, e, o)| (s, e, position_in_pool(o))).collect()),
        points,
        servers,
    })
}

/// The pool under another distribution: the pool's hash if that
/// distribution takes it, else the distribution's default.
fn under(pool: &PoolConfig, distribution: Distribution) -> PoolConfig {
    let mut other = pool.clone();
    other.distribution = distribution;
    if other.check_supported().is_err() {
        other.hash = distribution.native_hash();
    }
    other
}

/// The distributions `--compare` names.
fn compared(names: &[String]) -> Result<Vec<Distribution>> {
    let mut out: Vec<Distribution> = Vec::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let more: Vec<Distribution> = if name == "all" {
            DISTRIBUTIONS.iter().filter(|d| **d != "random").map(|d| d.parse()).collect::<chash::Result<_>>()?
        } else {
            vec![name.parse().with_context(|| "in --compare")?]
        };
        for d in more {
            if !out.contains(&d) {
                out.push(d);
            }
        }
    }
    Ok(out)
}

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

fn balance_json(b: Option<Balance>) -> Value {
    b.map_or(Value::Null, |b| json!({"cv": b.cv, "peak_over_mean": b.peak_over_mean}))
}

fn servers_json(a: &Analysis) -> Value {
    a.servers
        .iter()
        .map(|s| {
            json!({"id": s.id, "weight": s.weight, "fair_share": s.fair, "exact_share": s.exact,
                   "sampled_share": s.sampled, "sampled_keys": s.keys})
        })
        .collect()
}

/// Lays charts one under another in one SVG document.
fn stack(charts: &[String]) -> String {
    let size = |svg: &str, attr: &str| -> f64 {
        let head = &svg[..svg.find('>').unwrap_or(svg.len())];
        let pat = format!(" {attr}=\"");
        head.find(&pat)
            .and_then(|at| head[at + pat.len()..].split('"').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let width = charts.iter().map(|c| size(c, "width")).fold(0.0, f64::max);
    let height: f64 = charts.iter().map(|c| size(c, "height")).sum();
    let mut out = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"><rect width="100%" height="100%" fill="#fff"/>"##
    );
    let mut y = 0.0;
    for c in charts {
        out.push_str(&format!(r#"<g transform="translate(0,{y})">{c}</g>"#));
        y += size(c, "height");
    }
    out.push_str("</svg>\n");
    out
}

fn write_svg(
    path: &Path,
    pool: &PoolConfig,
    keys: &KeySet,
    main: &Analysis,
    others: &[(Distribution, Result<Analysis>)],
) -> Result<()> {
    let ids: Vec<String> = main.servers.iter().map(|s| s.id.clone()).collect();
    // One colour per server throughout (bars and ring), the fair share as the mark.
    let bars = |share: &dyn Fn(&ServerShare) -> f64| -> Vec<svg::Bar> {
        main.servers
            .iter()
            .map(|s| svg::Bar { label: s.id.clone(), value: 100.0 * share(s), target: Some(100.0 * s.fair) })
            .collect()
    };
    let about = format!("pool {}, {}, hash {}", pool.name, main.distribution, main.hash);
    let mut charts = Vec::new();
    if main.exact.is_some() {
        let title = format!("Exact share of the hash space per server ({about})");
        charts.push(svg::bar_chart(&title, "%", &bars(&|s| s.exact.unwrap_or(0.0))));
    }
    let title = format!("Share of {} sampled keys per server ({about})", keys.len());
    charts.push(svg::bar_chart(&title, "%", &bars(&|s| s.sampled)));
    if let Some(arcs) = &main.arcs {
        let title = format!("The ring: {} points, arcs coloured by owner", main.points.unwrap_or(0));
        charts.push(svg::ring_diagram(&title, arcs, &ids));
    }
    let bars: Vec<svg::Bar> = others
        .iter()
        .filter_map(|(d, a)| a.as_ref().ok().map(|a| (d, a)))
        .map(|(d, a)| svg::Bar { label: d.to_string(), value: a.sampled.peak_over_mean, target: Some(1.0) })
        .collect();
    if !bars.is_empty() {
        charts.push(svg::bar_chart("Most loaded server over its fair share (sampled; 1 = fair)", "", &bars));
    }
    std::fs::write(path, stack(&charts)).with_context(|| format!("cannot write {}", path.display()))
}

fn print_text(
    out: &mut impl Write,
    pool: &PoolConfig,
    keys: &KeySet,
    main: &Analysis,
    others: &[(Distribution, Result<Analysis>)],
) -> io::Result<()> {
    let total_weight: u64 = main.servers.iter().map(|s| u64::from(s.weight)).sum();
    let points = main.points.map_or(String::new(), |n| format!(", {n} points"));
    writeln!(
        out,
        "pool {}: distribution {}, hash {}, {} servers, total weight {total_weight}{points}",
        pool.name,
        main.distribution,
        main.hash,
        main.servers.len()
    )?;
    writeln!(out, "sampled: {}", keys.describe())?;
    writeln!(out)?;
    let w = main.servers.iter().map(|s| s.id.len()).max().unwrap_or(0).max(6);
    writeln!(
        out,
        "{:<w$}  {:>6}  {:>10}  {:>11}  {:>13}  {:>12}",
        "server", "weight", "fair share", "exact share", "sampled share", "sampled/fair"
    )?;
    for s in &main.servers {
        let exact = s.exact.map_or("n/a".to_owned(), pct);
        writeln!(
            out,
            "{:<w$}  {:>6}  {:>10}  {:>11}  {:>13}  {:>12.3}",
            s.id,
            s.weight,
            pct(s.fair),
            exact,
            pct(s.sampled),
            s.sampled / s.fair
        )?;
    }
    writeln!(out)?;
    writeln!(out, "{:<16}  {:>8}  {:>9}", "balance", "CV", "peak/mean")?;
    match main.exact {
        Some(b) => writeln!(out, "{:<16}  {:>8.4}  {:>9.3}", "exact", b.cv, b.peak_over_mean)?,
        None => writeln!(out, "{:<16}  {:>8}  {:>9}", "exact", "n/a", "n/a")?,
    }
    writeln!(out, "{:<16}  {:>8.4}  {:>9.3}", "sampled", main.sampled.cv, main.sampled.peak_over_mean)?;
    writeln!(
        out,
        "{:<16}  {:>8.4}  (sampling alone: a perfect placement measured with {} keys shows this CV)",
        "sampling floor",
        sampling_floor_cv(keys.len(), main.servers.len()),
        keys.len()
    )?;
    if main.exact.is_none() {
        writeln!(out, "exact shares: n/a ({} is not made of points on the hash space)", main.distribution)?;
    }
    if main.distribution == Distribution::Bounded {
        writeln!(out, "bounded: exact shares are the ring's; sampled keys over a server's cap went to the next")?;
    }
    if main.distribution == Distribution::Multiprobe {
        writeln!(out, "multiprobe: exact shares are the expected shares of uniformly random keys, from the points")?;
    }
    if others.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(out, "the same servers under other distributions ({} each):", keys.describe())?;
    writeln!(
        out,
        "{:<12}  {:<20}  {:>8}  {:>9}  {:>10}  {:>11}  note",
        "distribution", "hash", "exact CV", "exact p/m", "sampled CV", "sampled p/m"
    )?;
    for (d, a) in others {
        match a {
            Ok(a) => {
                let (cv, pm) = a.exact.map_or(("n/a".to_owned(), "n/a".to_owned()), |b| {
                    (format!("{:.4}", b.cv), format!("{:.3}", b.peak_over_mean))
                });
                let note = if a.hash == pool.hash {
                    String::new()
                } else {
                    format!("{d} cannot take hash {}: its default instead", pool.hash)
                };
                let row = format!(
                    "{:<12}  {:<20}  {cv:>8}  {pm:>9}  {:>10.4}  {:>11.3}  {note}",
                    d.name(),
                    a.hash.to_string(),
                    a.sampled.cv,
                    a.sampled.peak_over_mean
                );
                writeln!(out, "{}", row.trim_end())?;
            }
            Err(e) => {
                let why = format!("{e:#}").replace('\n', " ");
                writeln!(
                    out,
                    "{:<12}  {:<20}  {:>8}  {:>9}  {:>10}  {:>11}  cannot place these servers: {why}",
                    d.name(),
                    "-",
                    "-",
                    "-",
                    "-",
                    "-"
                )?;
            }
        }
    }
    let ok: Vec<(&Distribution, &Analysis)> =
        others.iter().filter_map(|(d, a)| a.as_ref().ok().map(|a| (d, a))).collect();
    if ok.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(out, "sampled share per server:")?;
    write!(out, "{:<w$}  {:>10}", "server", "fair share")?;
    for (d, _) in &ok {
        write!(out, "  {:>10}", d.name())?;
    }
    writeln!(out)?;
    for (row, s) in main.servers.iter().enumerate() {
        write!(out, "{:<w$}  {:>10}", s.id, pct(s.fair))?;
        for (_, a) in &ok {
            write!(out, "  {:>10}", pct(a.servers[row].sampled))?;
        }
        writeln!(out)?;
    }
    Ok(())
}

pub fn run(args: AnalyzeArgs) -> Result<()> {
    let pool = args.pool.pool("analyze")?;
    let keys = args.keys.key_set()?;
    let distributions = compared(&args.compare)?;
    let bar = progress::bar(keys.len() * (1 + distributions.len() as u64), "placing keys", args.json);
    let main = analyse(&pool, &keys, &bar)?;
    let others: Vec<(Distribution, Result<Analysis>)> =
        distributions.iter().map(|&d| (d, analyse(&under(&pool, d), &keys, &bar))).collect();
    bar.finish_and_clear();
    if let Some(path) = &args.svg {
        write_svg(path, &pool, &keys, &main, &others)?;
    }
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    if args.json {
        let compare: Vec<Value> = others
            .iter()
            .map(|(d, a)| match a {
                Ok(a) => json!({"distribution": d.name(), "hash": a.hash.to_string(), "error": null,
                    "servers": servers_json(a), "exact": balance_json(a.exact), "sampled": balance_json(Some(a.sampled))}),
                Err(e) => json!({"distribution": d.name(), "hash": null, "error": format!("{e:#}"),
                    "servers": [], "exact": null, "sampled": null}),
            })
            .collect();
        let key_source = match &keys {
            KeySet::Numbered(_) => "key:<i>".to_owned(),
            KeySet::File { path, .. } => path.display().to_string(),
        };
        let doc = json!({
            "pool": pool.name,
            "distribution": main.distribution.name(),
            "hash": main.hash.to_string(),
            "keys": keys.len(),
            "key_source": key_source,
            "points": main.points,
            "servers": servers_json(&main),
            "exact": balance_json(main.exact),
            "sampled": balance_json(Some(main.sampled)),
            "sampling_floor_cv": sampling_floor_cv(keys.len(), main.servers.len()),
            "compare": compare,
        });
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        print_text(&mut out, &pool, &keys, &main, &others)?;
        if let Some(path) = &args.svg {
            writeln!(out, "\nchart written to {}", path.display())?;
        }
    }
    out.flush()?;
    Ok(())
}
