//! `chash demo`: the seeds' experiment in one command. Keys are written to
//! in-process cache shards through the ring; then a shard leaves and one
//! joins, and the tables show what moved and what a client would miss,
//! beside `hash % n` on the same keys.

use std::collections::HashSet;
use std::io::{self, Write};

use anyhow::Result;
use chash::algo::{Anchor, Bounded, Jump, Maglev, MultiProbe, Rendezvous, DEFAULT_BALANCE_FACTOR};
use chash::analysis::{ownership, sample_load, sampling_floor_cv, Balance};
use chash::{KeyHasher, Node, Placement, Ring};
use clap::Args;

#[derive(Args, Debug)]
#[command(after_help = "\
The demo runs in-process: four cache shards with weights 1, 2, 1 and 4, a
workload of --keys keys written through the ring, then one shard leaving and
one joining. It prints what moved and the cache hit rate a client would see
right after each change, for chash's ring and for `hash % n`.")]
pub struct DemoArgs {
    /// Keys in the workload.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(100..=10_000_000))]
    keys: u32,
}

/// An in-process cache shard: the keys it holds.
struct Shard {
    id: String,
    held: HashSet<Vec<u8>>,
}

/// Writes every key to the shard `owner(key)` names.
fn fill(shards: &mut [Shard], keys: &[Vec<u8>], owner: impl Fn(&[u8]) -> usize) {
    for s in shards.iter_mut() {
        s.held.clear();
    }
    for k in keys {
        shards[owner(k)].held.insert(k.clone());
    }
}

/// Share of `keys` that `owner` sends to a shard that still holds them.
fn hit_rate<'r>(shards: &[Shard], keys: &[Vec<u8>], owner: impl Fn(&[u8]) -> Option<&'r str>) -> f64 {
    let hits = keys
        .iter()
        .filter(|k| owner(k).and_then(|id| shards.iter().find(|s| s.id == id)).is_some_and(|s| s.held.contains(*k)))
        .count();
    hits as f64 / keys.len() as f64
}

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

/// Share of `keys` whose owner's id differs between `a` and `b`.
fn moved_share<P: Placement, Q: Placement>(a: &P, b: &Q, keys: &[Vec<u8>]) -> f64 {
    let moved = keys.iter().filter(|k| a.node_for(k).map(Node::id) != b.node_for(k).map(Node::id)).count();
    moved as f64 / keys.len() as f64
}

/// Balance of `p` over `keys`, per unit of each node's weight.
fn balance_of<P: Placement>(p: &P, keys: &[Vec<u8>]) -> Balance {
    let load = sample_load(p, keys);
    let weights: Vec<u32> = p.nodes().iter().map(Node::weight).collect();
    Balance::of(&load.iter().map(|&c| c as f64).collect::<Vec<_>>(), &weights)
}

/// One row of the table in section 4: balance before, keys moved on the leave and the join.
fn table_row(out: &mut impl Write, name: &str, b: Balance, leave: f64, join: f64) -> io::Result<()> {
    writeln!(out, "   {:<34} {:>8.4} {:>10.3} {:>14} {:>14}", name, b.cv, b.peak_over_mean, pct(leave), pct(join))
}

/// Section 4's rows for the other algorithms: the same shards, `leaving`
/// leaves, then cache-e (weight 1) joins. Algorithms without weights run on
/// the same shards at weight 1; jump can only lose its last node.
fn algorithm_rows(out: &mut impl Write, spec: &[(&str, u32)], leaving: &str, keys: &[Vec<u8>]) -> Result<()> {
    let weighted = || spec.iter().map(|&(id, w)| Node::new(id, w)).collect::<chash::Result<Vec<_>>>();
    let equal = || spec.iter().map(|&(id, _)| Node::new(id, 1)).collect::<chash::Result<Vec<_>>>();
    let newcomer = || Node::new("cache-e", 1);

    let r = Rendezvous::new(weighted()?)?;
    let left = r.without_node(leaving)?;
    let joined = left.with_node(newcomer()?)?;
    table_row(
        out,
        "rendezvous",
        balance_of(&r, keys),
        moved_share(&r, &left, keys),
        moved_share(&left, &joined, keys),
    )?;

    let m = Maglev::new(weighted()?)?;
    let left = m.without_node(leaving)?;
    let joined = left.with_node(newcomer()?)?;
    table_row(
        out,
        "maglev, table 65537",
        balance_of(&m, keys),
        moved_share(&m, &left, keys),
        moved_share(&left, &joined, keys),
    )?;

    let j = Jump::new(equal()?)?;
    let last = spec[spec.len() - 1].0;
    let left = j.without_last();
    let joined = left.with_node(newcomer()?)?;
    table_row(
        out,
        &format!("jump (w=1; only {last} can leave)"),
        balance_of(&j, keys),
        moved_share(&j, &left, keys),
        moved_share(&left, &joined, keys),
    )?;

    let a = Anchor::new(equal()?)?;
    let left = a.without_node(leaving)?;
    let joined = left.with_node(newcomer()?)?;
    table_row(
        out,
        "anchor (w=1)",
        balance_of(&a, keys),
        moved_share(&a, &left, keys),
        moved_share(&left, &joined, keys),
    )?;

    let mp = MultiProbe::new(equal()?)?;
    let left = mp.without_node(leaving)?;
    let joined = left.with_node(newcomer()?)?;
    table_row(
        out,
        "multiprobe (w=1), 21 probes",
        balance_of(&mp, keys),
        moved_share(&mp, &left, keys),
        moved_share(&left, &joined, keys),
    )?;

    // Bounded loads: every key acquires one unit of load, in order, and
    // keeps it; a change re-places every key on the changed ring.
    let place = |b: &Bounded| -> Vec<String> {
        keys.iter().map(|k| b.acquire(k).map_or(String::new(), |i| b.nodes()[i].id().to_owned())).collect()
    };
    let ring = Ring::new(weighted()?)?;
    let b = Bounded::new(ring.clone(), DEFAULT_BALANCE_FACTOR)?;
    let before = place(&b);
    let loads: Vec<f64> = b.loads().into_iter().map(|l| l as f64).collect();
    let weights: Vec<u32> = spec.iter().map(|s| s.1).collect();
    let left_ring = ring.without_node(leaving)?;
    let after_leave = place(&Bounded::new(left_ring.clone(), DEFAULT_BALANCE_FACTOR)?);
    let after_join = place(&Bounded::new(left_ring.with_node(newcomer()?)?, DEFAULT_BALANCE_FACTOR)?);
    let changed =
        |a: &[String], b: &[String]| a.iter().zip(b).filter(|(x, y)| x != y).count() as f64 / keys.len() as f64;
    table_row(
        out,
        &format!("bounded, c = {DEFAULT_BALANCE_FACTOR}, 160 vnodes"),
        Balance::of(&loads, &weights),
        changed(&before, &after_leave),
        changed(&after_leave, &after_join),
    )?;
    Ok(())
}

pub fn run(args: DemoArgs) -> Result<()> {
    let out = &mut io::stdout().lock();
    let n_keys = args.keys as usize;
    let spec = [("cache-a", 1u32), ("cache-b", 2), ("cache-c", 1), ("cache-d", 4)];
    let nodes = spec.iter().map(|&(id, w)| Node::new(id, w)).collect::<chash::Result<Vec<_>>>()?;
    let ring = Ring::new(nodes)?;
    let keys: Vec<Vec<u8>> = (0..n_keys).map(|i| format!("user:{i}").into_bytes()).collect();
    let mut shards: Vec<Shard> = spec.iter().map(|&(id, _)| Shard { id: id.into(), held: HashSet::new() }).collect();

    writeln!(
        out,
        "chash demo: {} keys on 4 in-process cache shards (native ring, xxh3, 160 vnodes per weight)\n",
        n_keys
    )?;

    // 1. Load per shard against weight.
    fill(&mut shards, &keys, |k| ring.locate(k).unwrap_or(0));
    let share = ownership(&ring);
    let total_w: u32 = spec.iter().map(|s| s.1).sum();
    writeln!(out, "1. Keys per shard against weight")?;
    writeln!(
        out,
        "   {:<9} {:>6} {:>10} {:>12} {:>8} {:>10}",
        "shard", "weight", "fair share", "hash space", "keys", "key share"
    )?;
    for (i, s) in shards.iter().enumerate() {
        writeln!(
            out,
            "   {:<9} {:>6} {:>10} {:>12} {:>8} {:>10}",
            s.id,
            spec[i].1,
            pct(f64::from(spec[i].1) / f64::from(total_w)),
            pct(share[i]),
            s.held.len(),
            pct(s.held.len() as f64 / n_keys as f64)
        )?;
    }
    let loads: Vec<f64> = shards.iter().map(|s| s.held.len() as f64).collect();
    let weights: Vec<u32> = spec.iter().map(|s| s.1).collect();
    let b = Balance::of(&loads, &weights);
    writeln!(out, "   balance: CV {:.4}, peak/mean {:.3} (per unit of weight)\n", b.cv, b.peak_over_mean)?;

    // 2. A shard leaves.
    let leaving = "cache-c";
    let after = ring.without_node(leaving)?;
    let moved: Vec<(usize, usize)> = keys
        .iter()
        .filter_map(|k| {
            let (from, to) = (ring.locate(k)?, after.locate(k)?);
            (ring.nodes()[from].id() != after.nodes()[to].id()).then_some((from, to))
        })
        .collect();
    let from_leaving = moved.iter().filter(|(f, _)| ring.nodes()[*f].id() == leaving).count();
    let ring_hits = hit_rate(&shards, &keys, |k| after.node_for(k).map(Node::id));
    // hash % n on the same keys: fill as 4 shards, then route with 3.
    let modulo = |k: &[u8], n: usize| (KeyHasher::Xxh3.hash(k) % n as u64) as usize;
    let mut mod_shards: Vec<Shard> =
        spec.iter().map(|&(id, _)| Shard { id: id.into(), held: HashSet::new() }).collect();
    fill(&mut mod_shards, &keys, |k| modulo(k, 4));
    let remaining: Vec<&str> = spec.iter().map(|s| s.0).filter(|id| *id != leaving).collect();
    let mod_hits = hit_rate(&mod_shards, &keys, |k| Some(remaining[modulo(k, 3)]));
    writeln!(out, "2. {leaving} leaves")?;
    writeln!(
        out,
        "   ring: {} keys moved ({}), {} of them from {leaving} (it held {})",
        moved.len(),
        pct(moved.len() as f64 / n_keys as f64),
        from_leaving,
        shards[2].held.len()
    )?;
    writeln!(out, "   cache hit rate right after:  ring {}   hash % n {}\n", pct(ring_hits), pct(mod_hits))?;

    // 3. A shard joins.
    let joined = after.with_node(Node::new("cache-e", 1)?)?;
    let mut to_new = 0usize;
    let mut elsewhere = 0usize;
    for k in &keys {
        let (before, now) = (after.node_for(k).map(Node::id), joined.node_for(k).map(Node::id));
        if before != now {
            if now == Some("cache-e") {
                to_new += 1;
            } else {
                elsewhere += 1;
            }
        }
    }
    let w_after: u32 = after.nodes().iter().map(Node::weight).sum();
    writeln!(out, "3. cache-e (weight 1) joins")?;
    writeln!(
        out,
        "   {} keys moved ({}), all to cache-e: {}; its fair share is 1/{} = {}",
        to_new + elsewhere,
        pct((to_new + elsewhere) as f64 / n_keys as f64),
        if elsewhere == 0 { "yes" } else { "NO" },
        w_after + 1,
        pct(1.0 / f64::from(w_after + 1))
    )?;
    let mut mod_after: Vec<Shard> = remaining.iter().map(|&id| Shard { id: id.into(), held: HashSet::new() }).collect();
    fill(&mut mod_after, &keys, |k| modulo(k, 3));
    let grown: Vec<&str> = remaining.iter().copied().chain(["cache-e"]).collect();
    let mod_join_hits = hit_rate(&mod_after, &keys, |k| Some(grown[modulo(k, 4)]));
    fill(&mut shards, &keys, |k| {
        after.locate(k).map_or(0, |i| spec.iter().position(|s| s.0 == after.nodes()[i].id()).unwrap_or(0))
    });
    let ring_join_hits = hit_rate(&shards, &keys, |k| joined.node_for(k).map(Node::id));
    writeln!(out, "   cache hit rate right after:  ring {}   hash % n {}\n", pct(ring_join_hits), pct(mod_join_hits))?;

    // 4. The trade-off of the ring's one knob.
    writeln!(out, "4. Balance and movement by placement (same shards, {} keys)", n_keys)?;
    writeln!(
        out,
        "   {:<34} {:>8} {:>10} {:>14} {:>14}",
        "placement", "CV", "peak/mean", "moved on leave", "moved on join"
    )?;
    for vnodes in [10u32, 40, 160, 640] {
        let nodes = spec.iter().map(|&(id, w)| Node::new(id, w)).collect::<chash::Result<Vec<_>>>()?;
        let r = Ring::builder().vnodes(vnodes).build(nodes)?;
        let load = sample_load(&r, &keys);
        let b = Balance::of(&load.iter().map(|&c| c as f64).collect::<Vec<_>>(), &weights);
        let left = r.without_node(leaving)?;
        let joined = left.with_node(Node::new("cache-e", 1)?)?;
        let moved_leave = keys.iter().filter(|k| r.node_for(k).map(Node::id) != left.node_for(k).map(Node::id)).count();
        let moved_join =
            keys.iter().filter(|k| left.node_for(k).map(Node::id) != joined.node_for(k).map(Node::id)).count();
        table_row(
            out,
            &format!("ring, {vnodes} vnodes"),
            b,
            moved_leave as f64 / n_keys as f64,
            moved_join as f64 / n_keys as f64,
        )?;
    }
    algorithm_rows(out, &spec, leaving, &keys)?;
    let mod_leave = keys.iter().filter(|k| spec[modulo(k, 4)].0 != remaining[modulo(k, 3)]).count();
    let mod_join = keys.iter().filter(|k| remaining[modulo(k, 3)] != grown[modulo(k, 4)]).count();
    writeln!(
        out,
        "   {:<34} {:>8} {:>10} {:>14} {:>14}",
        "hash % n",
        "(equal)",
        "",
        pct(mod_leave as f64 / n_keys as f64),
        pct(mod_join as f64 / n_keys as f64)
    )?;
    writeln!(
        out,
        "   (the sampling floor for {} keys on 4 equal shards is CV {:.4}; CV and peak/mean are per unit of\n   \
         weight; the optimum is {} on the leave ({leaving}'s share) and {} on the join, and 25.00% for\n   \
         both at weight 1 (w=1); jump's leave is cache-d's)",
        n_keys,
        sampling_floor_cv(n_keys as u64, 4),
        pct(f64::from(spec[2].1) / f64::from(total_w)),
        pct(1.0 / f64::from(total_w - spec[2].1 + 1)),
    )?;
    out.flush()?;
    Ok(())
}
