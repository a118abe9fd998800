//! `chash demo`: the seeds' experiment in one command. Keys are written to
//! in-process cache shards through the ring; then a shard leaves and one
//! joins, and the tables show what moved and what a client would miss,
//! beside `hash % n` on the same keys.

use std::collections::HashSet;
use std::io::{self, Write};

use anyhow::Result;
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
    writeln!(out, "4. Balance and movement by vnodes (same shards, {} keys)", n_keys)?;
    writeln!(
        out,
        "   {:<16} {:>8} {:>10} {:>14} {:>14}",
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
        writeln!(
            out,
            "   {:<16} {:>8.4} {:>10.3} {:>14} {:>14}",
            format!("ring, {vnodes} vnodes"),
            b.cv,
            b.peak_over_mean,
            pct(moved_leave as f64 / n_keys as f64),
            pct(moved_join as f64 / n_keys as f64)
        )?;
    }
    let mod_leave = keys.iter().filter(|k| spec[modulo(k, 4)].0 != remaining[modulo(k, 3)]).count();
    let mod_join = keys.iter().filter(|k| remaining[modulo(k, 3)] != grown[modulo(k, 4)]).count();
    writeln!(
        out,
        "   {:<16} {:>8} {:>10} {:>14} {:>14}",
        "hash % n",
        "(equal)",
        "",
        pct(mod_leave as f64 / n_keys as f64),
        pct(mod_join as f64 / n_keys as f64)
    )?;
    writeln!(
        out,
        "   (the sampling floor for {} keys on 4 equal shards is CV {:.4})",
        n_keys,
        sampling_floor_cv(n_keys as u64, 4)
    )?;
    out.flush()?;
    Ok(())
}
