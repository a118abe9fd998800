//! `chash plan`: what a membership change will move before anyone makes it,
//! exactly (hash ranges) where both placements are made of points, from
//! sampled keys otherwise, and key by key for a key file.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use chash::analysis::optimal_movement;
use chash::ServerLine;
use chash::{AnyPlacement, Distribution, Placement, PoolConfig, Snapshot};
use clap::Args;
use serde_json::{json, Value};

use crate::keys::KeySet;
use crate::pool_args::pool_from_file;
use crate::progress;

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  chash plan --from nutcracker.yml --to nutcracker-new.yml --pool alpha
  chash plan --from old.yml --to new.yml --keys-file keys.txt --moves-only > moves.tsv
  chash plan --from old.yml --to new.yml --json

Servers are matched by id (the server line without weight and name). Both
pools must hash keys the same way. Where both placements are made of points
(ring, ketama, nginx; bounded's ring) the moved share is exact and the moved
hash ranges are listed (first..last inclusive, as hash values the way the
hash prints them, e.g. Java's signed longs); for the other distributions ranges
are not defined and the shares are measured over --keys N keys key:<i>.
The optimum is the least any placement must move: the sum over servers of
max(0, old share - new share), shares being weight / total weight.

When NEW differs from OLD by one server added, removed or re-weighted, with
the same settings, and the distribution is anchor or jump, the new placement
is OLD's changed by the algorithm's own change, as chash proxy applies it live
(anchor keeps its bucket history). The output says whether a process started
on NEW builds the same: it does when NEW was written by chash config or
chash proxy --persist (a removed anchor server's line stays, marked `removed
N`), not when a line was deleted by hand (--rebuild shows that placement).
Otherwise NEW is built from scratch, as chash route -c NEW builds it.

--keys-file F lists every key of F (one per line, split on LF only) that
moves: KEY<TAB>FROM<TAB>TO, in file order, keys placed as chash route places
them (--moves-only prints just these lines).

--json prints one object:
  from, to: {file, pool, distribution, hash, servers: [{id, weight}]},
  change: {added: [id], removed: [id], reweighted: [{id, from, to}]},
  method: \"incremental\" or \"rebuild\", method_note,
  exact (true: from the points; false: sampled), sampled_keys (null if exact),
  moved, optimal, ratio (moved / optimal; null when optimal is 0),
  pairs: [{from, to, fraction}] largest first,
  ranges: [{first, last, from, to, fraction}] in hash order, or null,
  key_file: null or {path, keys, moved, moves: [{key, from, to}]}.")]
pub struct PlanArgs {
    /// The config as it is now.
    #[arg(long, value_name = "OLD.yml")]
    from: PathBuf,

    /// The config after the change.
    #[arg(long, value_name = "NEW.yml")]
    to: PathBuf,

    /// Pool to compare, in both files (default: each file's first pool).
    #[arg(long, value_name = "NAME")]
    pool: Option<String>,

    /// Keys `key:0`, `key:1`, ... that measure the shares where ranges are
    /// not defined.
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    keys: u64,

    /// List the keys of this file that move, and where (`-` for standard input).
    #[arg(long, value_name = "F")]
    keys_file: Option<PathBuf>,

    /// Build NEW from scratch even where the change could be applied incrementally.
    #[arg(long)]
    rebuild: bool,

    /// Moved ranges to print in the table: a number or `all` (JSON lists all).
    #[arg(long, value_name = "N|all", default_value = "20", value_parser = parse_limit)]
    ranges: Limit,

    /// Print only the key file's move log (KEY<TAB>FROM<TAB>TO).
    #[arg(long, requires = "keys_file", conflicts_with = "json")]
    moves_only: bool,

    /// Print JSON (fields listed below) instead of tables.
    #[arg(long)]
    json: bool,
}

/// How many rows to print.
#[derive(Clone, Copy, Debug)]
pub struct Limit(usize);

fn parse_limit(s: &str) -> Result<Limit, String> {
    match s {
        "all" => Ok(Limit(usize::MAX)),
        n => n.parse().map(Limit).map_err(|_| format!("{n:?} is not a number or `all`")),
    }
}

/// How the server lists differ, by id.
struct Change {
    added: Vec<ServerLine>,
    removed: Vec<String>,
    reweighted: Vec<(String, u32, u32)>,
}

impl Change {
    fn between(old: &[ServerLine], new: &[ServerLine]) -> Change {
        let old_w: HashMap<&str, u32> = old.iter().map(|s| (s.id.as_str(), s.weight)).collect();
        let new_w: HashMap<&str, u32> = new.iter().map(|s| (s.id.as_str(), s.weight)).collect();
        Change {
            added: new.iter().filter(|s| !old_w.contains_key(s.id.as_str())).cloned().collect(),
            removed: old.iter().filter(|s| !new_w.contains_key(s.id.as_str())).map(|s| s.id.clone()).collect(),
            reweighted: old
                .iter()
                .filter_map(|s| {
                    new_w.get(s.id.as_str()).filter(|&&w| w != s.weight).map(|&w| (s.id.clone(), s.weight, w))
                })
                .collect(),
        }
    }

    fn count(&self) -> usize {
        self.added.len() + self.removed.len() + self.reweighted.len()
    }

    fn describe(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        parts.extend(self.added.iter().map(|s| format!("{} added (weight {})", s.id, s.weight)));
        parts.extend(self.removed.iter().map(|id| format!("{id} removed")));
        parts.extend(self.reweighted.iter().map(|(id, a, b)| format!("{id} re-weighted {a} -> {b}")));
        if parts.is_empty() {
            "no server changes".into()
        } else {
            parts.join(", ")
        }
    }

    /// OLD's placement changed by the algorithm's own single change, if this is one.
    fn apply(&self, old: &Snapshot) -> Option<chash::Result<Snapshot>> {
        match (self.added.as_slice(), self.removed.as_slice(), self.reweighted.as_slice()) {
            ([line], [], []) => Some(line.to_node().and_then(|n| old.with_node(n))),
            ([], [id], []) => Some(old.without_node(id)),
            ([], [], [(id, _, w)]) => Some(old.with_weight(id, *w)),
            _ => None,
        }
    }
}

/// Whether two pools place keys alike but for their servers.
fn same_settings(a: &PoolConfig, b: &PoolConfig) -> bool {
    a.hash == b.hash
        && a.hash_tag == b.hash_tag
        && a.distribution == b.distribution
        && a.vnodes == b.vnodes
        && a.point_label == b.point_label
        && a.maglev_table_size == b.maglev_table_size
        && a.probes == b.probes
        && a.balance_factor == b.balance_factor
        && a.anchor_capacity == b.anchor_capacity
}

/// Owner ids of every key under both placements, in key order, as chash
/// route places them; the loads bounded takes are given back afterwards.
fn for_each_owner_pair(
    old: &Snapshot,
    new: &Snapshot,
    keys: &KeySet,
    quiet: bool,
    mut f: impl FnMut(&[u8], &str, &str),
) {
    let bar = progress::bar(keys.len(), "placing keys", quiet);
    let mut held_old = vec![0u64; old.nodes().len()];
    let mut held_new = vec![0u64; new.nodes().len()];
    const CHUNK: u64 = 1 << 14;
    let mut start = 0;
    while start < keys.len() {
        let end = (start + CHUNK).min(keys.len());
        keys.for_each_in(start..end, |key| {
            let a = old.placement().acquire_hash(old.key_hash(key));
            let b = new.placement().acquire_hash(new.key_hash(key));
            if let Some(a) = a {
                held_old[a] += 1;
            }
            if let Some(b) = b {
                held_new[b] += 1;
            }
            let from = a.map_or("", |i| old.nodes()[i].id());
            let to = b.map_or("", |i| new.nodes()[i].id());
            f(key, from, to);
        });
        bar.inc(end - start);
        start = end;
    }
    bar.finish_and_clear();
    for (s, held) in [(old, held_old), (new, held_new)] {
        for (i, n) in held.into_iter().enumerate() {
            for _ in 0..n {
                s.placement().release(i);
            }
        }
    }
}

/// A hash value as JSON (they fit in i64 or u64).
fn int_json(v: i128) -> Value {
    match (i64::try_from(v), u64::try_from(v)) {
        (Ok(i), _) => json!(i),
        (_, Ok(u)) => json!(u),
        _ => json!(v.to_string()),
    }
}

fn side_json(file: &Path, pool: &PoolConfig, s: &Snapshot) -> Value {
    json!({
        "file": file.display().to_string(),
        "pool": pool.name,
        "distribution": pool.distribution.name(),
        "hash": pool.hash.to_string(),
        "servers": s.nodes().iter().map(|n| json!({"id": n.id(), "weight": n.weight()})).collect::<Vec<_>>(),
    })
}

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

/// A key as text (lossy for bytes that are not UTF-8).
fn key_text(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

pub fn run(args: PlanArgs) -> Result<()> {
    let old_pool = pool_from_file(&args.from, args.pool.as_deref())?;
    let new_pool = pool_from_file(&args.to, args.pool.as_deref())?;
    report(&args, old_pool, new_pool, &mut io::stdout().lock())
}

impl PlanArgs {
    /// A plan with the defaults, labelled `from` and `to` (for `chash
    /// config --plan`).
    pub fn labelled(from: PathBuf, to: PathBuf) -> PlanArgs {
        PlanArgs {
            from,
            to,
            pool: None,
            keys: 100_000,
            keys_file: None,
            rebuild: false,
            ranges: Limit(20),
            moves_only: false,
            json: false,
        }
    }
}

/// What changing `old_pool` into `new_pool` moves, written to `out` as
/// `chash plan` prints it.
pub fn report(args: &PlanArgs, old_pool: PoolConfig, new_pool: PoolConfig, out: &mut dyn Write) -> Result<()> {
    if old_pool.hash != new_pool.hash {
        bail!(
            "the hash spaces differ: {} hashes keys with {}, {} with {} (plan compares placements over one hash space)",
            args.from.display(),
            old_pool.hash,
            args.to.display(),
            new_pool.hash
        );
    }
    let key_file = args.keys_file.as_deref().map(KeySet::from_file).transpose()?;
    let old = old_pool.snapshot()?;
    let change = Change::between(&old_pool.servers, &new_pool.servers);
    let incremental_kind =
        matches!(old_pool.distribution, Distribution::Anchor | Distribution::Jump | Distribution::JumpBack)
            && same_settings(&old_pool, &new_pool)
            && change.count() == 1;
    let d = old_pool.distribution;
    let (new, incremental, method_note) = match change.apply(&old).filter(|_| incremental_kind && !args.rebuild) {
        Some(Ok(s)) => {
            // Does a process started on NEW agree? Files whose lines carry
            // the change (`removed N`) do; a line deleted by hand does not.
            let fresh = new_pool.snapshot()?;
            let agree = if fresh.fingerprint() == s.fingerprint() {
                "a process started on NEW builds the same placement".to_owned()
            } else {
                format!(
                    "a process started on NEW builds another, which --rebuild shows; chash proxy refuses to \
                     reload such a file: mark the server instead (chash config remove -c OLD {})",
                    change.removed.first().map_or("ID", String::as_str)
                )
            };
            (s, true, format!("incremental: {d}'s own change applied to OLD's placement, as chash proxy applies it live ({agree})"))
        }
        Some(Err(e)) => {
            (new_pool.snapshot()?, false, format!("built from NEW from scratch ({d} cannot apply it as a change: {e})"))
        }
        None if incremental_kind => (new_pool.snapshot()?, false, "built from NEW from scratch (--rebuild)".to_owned()),
        None => (new_pool.snapshot()?, false, "built from NEW from scratch".to_owned()),
    };
    let optimal = optimal_movement(old.nodes(), new.nodes());

    // Exact arcs where both are made of points, else shares of sampled keys.
    let exact = AnyPlacement::diff(old.placement(), new.placement()).transpose()?;
    let (moved, pairs, sampled_keys) = match &exact {
        Some(d) => {
            (d.moved, d.pairs.iter().map(|p| (p.from.clone(), p.to.clone(), p.fraction)).collect::<Vec<_>>(), None)
        }
        None => {
            let keys = KeySet::Numbered(args.keys);
            let mut counts: HashMap<(String, String), u64> = HashMap::new();
            for_each_owner_pair(&old, &new, &keys, args.json || args.moves_only, |_, from, to| {
                if from != to {
                    *counts.entry((from.to_owned(), to.to_owned())).or_default() += 1;
                }
            });
            let n = args.keys as f64;
            let mut pairs: Vec<(String, String, f64)> =
                counts.into_iter().map(|((f, t), c)| (f, t, c as f64 / n)).collect();
            pairs.sort_by(|a, b| b.2.total_cmp(&a.2).then_with(|| a.0.cmp(&b.0)).then_with(|| a.1.cmp(&b.1)));
            (pairs.iter().map(|p| p.2).sum(), pairs, Some(args.keys))
        }
    };
    let mut moves: Vec<(Vec<u8>, String, String)> = Vec::new();
    if let Some(keys) = &key_file {
        for_each_owner_pair(&old, &new, keys, args.json || args.moves_only, |key, from, to| {
            if from != to {
                moves.push((key.to_vec(), from.to_owned(), to.to_owned()));
            }
        });
    }

    let mut out = io::BufWriter::new(out);
    if args.moves_only {
        for (key, from, to) in &moves {
            out.write_all(key)?;
            writeln!(out, "\t{from}\t{to}")?;
        }
        out.flush()?;
        return Ok(());
    }
    let hasher = old.placement().hasher();
    let ratio = (optimal > 0.0).then(|| moved / optimal);
    if args.json {
        let ranges = exact.as_ref().map(|d| {
            d.arcs
                .iter()
                .map(|a| {
                    json!({"first": int_json(hasher.value_of_position(a.first)),
                           "last": int_json(hasher.value_of_position(a.last)),
                           "from": old.nodes()[a.from].id(), "to": new.nodes()[a.to].id(), "fraction": a.fraction})
                })
                .collect::<Vec<_>>()
        });
        let key_file_json = key_file.as_ref().map(|k| {
            json!({
                "path": args.keys_file.as_ref().map(|p| p.display().to_string()),
                "keys": k.len(),
                "moved": moves.len(),
                "moves": moves.iter().map(|(k, f, t)| json!({"key": key_text(k), "from": f, "to": t})).collect::<Vec<_>>(),
            })
        });
        let doc = json!({
            "from": side_json(&args.from, &old_pool, &old),
            "to": side_json(&args.to, &new_pool, &new),
            "change": {
                "added": change.added.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
                "removed": change.removed,
                "reweighted": change.reweighted.iter().map(|(id, a, b)| json!({"id": id, "from": a, "to": b})).collect::<Vec<_>>(),
            },
            "method": if incremental { "incremental" } else { "rebuild" },
            "method_note": method_note,
            "exact": exact.is_some(),
            "sampled_keys": sampled_keys,
            "moved": moved,
            "optimal": optimal,
            "ratio": ratio,
            "pairs": pairs.iter().map(|(f, t, x)| json!({"from": f, "to": t, "fraction": x})).collect::<Vec<_>>(),
            "ranges": ranges,
            "key_file": key_file_json,
        });
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
        out.flush()?;
        return Ok(());
    }

    let side = |file: &Path, p: &PoolConfig, s: &Snapshot| {
        format!("{} pool {} ({}, hash {}, {} servers)", file.display(), p.name, p.distribution, p.hash, s.nodes().len())
    };
    writeln!(out, "from: {}", side(&args.from, &old_pool, &old))?;
    writeln!(out, "to:   {}", side(&args.to, &new_pool, &new))?;
    writeln!(out, "change: {}", change.describe())?;
    writeln!(out, "new placement: {method_note}")?;
    let how = match sampled_keys {
        None => "exact, from the points".to_owned(),
        Some(n) => format!("measured over {n} sampled keys key:<i>"),
    };
    let vs = ratio.map_or(String::new(), |r| format!(" ({r:.2}x)"));
    writeln!(out, "moved: {} of the key space ({how}); optimum {}{vs}", pct(moved), pct(optimal))?;
    if !pairs.is_empty() {
        let w = pairs.iter().map(|p| p.0.len()).max().unwrap_or(0).max(4);
        let v = pairs.iter().map(|p| p.1.len()).max().unwrap_or(0).max(2);
        writeln!(out)?;
        writeln!(out, "{:<w$}  {:<v$}  {:>9}", "from", "to", "share")?;
        for (f, t, x) in &pairs {
            writeln!(out, "{f:<w$}  {t:<v$}  {:>9}", pct(*x))?;
        }
    }
    writeln!(out)?;
    match &exact {
        Some(d) => {
            writeln!(
                out,
                "moved hash ranges: {} (first..last inclusive, as {} prints hash values)",
                d.arcs.len(),
                hasher
            )?;
            let shown = d.arcs.len().min(args.ranges.0);
            let arcs = &d.arcs[..shown];
            let w = arcs.iter().map(|a| old.nodes()[a.from].id().len()).max().unwrap_or(0).max(4);
            let v = arcs.iter().map(|a| new.nodes()[a.to].id().len()).max().unwrap_or(0).max(2);
            if shown > 0 {
                writeln!(out, "{:>21}  {:>21}  {:<w$}  {:<v$}  {:>9}", "first", "last", "from", "to", "share")?;
            }
            for a in arcs {
                writeln!(
                    out,
                    "{:>21}  {:>21}  {:<w$}  {:<v$}  {:>9}",
                    hasher.value_of_position(a.first),
                    hasher.value_of_position(a.last),
                    old.nodes()[a.from].id(),
                    new.nodes()[a.to].id(),
                    format!("{:.4}%", 100.0 * a.fraction)
                )?;
            }
            if shown < d.arcs.len() {
                writeln!(out, "... {} more (--ranges all, or --json)", d.arcs.len() - shown)?;
            }
        }
        None => {
            let mut which: Vec<&str> = [&old_pool, &new_pool]
                .iter()
                .map(|p| p.distribution)
                .filter(|d| {
                    !matches!(
                        d,
                        Distribution::Ring | Distribution::Ketama | Distribution::Nginx | Distribution::Bounded
                    )
                })
                .map(Distribution::name)
                .collect();
            which.dedup();
            let verb = if which.len() == 1 { "is" } else { "are" };
            writeln!(
                out,
                "moved hash ranges: not defined ({} {verb} not made of points on the hash space)",
                which.join(" and ")
            )?;
        }
    }
    if [&old_pool, &new_pool].iter().any(|p| p.distribution == Distribution::Bounded) {
        writeln!(
            out,
            "bounded: shares and ranges are the ring's; under load, keys over a server's cap go to the next"
        )?;
    }
    if let Some(keys) = &key_file {
        writeln!(out)?;
        let share = moves.len() as f64 / keys.len().max(1) as f64;
        writeln!(out, "keys in {}: {} of {} move ({})", keys_path(args), moves.len(), keys.len(), pct(share))?;
        for (key, from, to) in &moves {
            out.write_all(key)?;
            writeln!(out, "\t{from}\t{to}")?;
        }
    }
    out.flush()?;
    Ok(())
}

fn keys_path(args: &PlanArgs) -> String {
    args.keys_file.as_ref().map_or(String::new(), |p| p.display().to_string())
}
