//! `chash route`.

use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use chash::config::{Config, Distribution, Pool};
use chash::{KeyHasher, ServerLine};
use clap::{Args, ValueEnum};

use crate::keys::{for_each_key, write_json_string};

/// Output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// `KEY<TAB>ID` lines.
    #[default]
    Text,
    /// One JSON object per line: {"key": ..., "id": ...}.
    Json,
}

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  chash route --node a:1 --node b:2 k1 k2
  chash route -c nutcracker.yml --pool alpha < keys.txt
  printf 'k1\\nk2\\n' | chash route --node 10.0.0.1:11211:1 --node 10.0.0.2:11211:1 --format json

  chash route --node 192.168.0.112:1000:1 --node 192.168.0.112:1001:1 \\
      --hash java-fnv1-32 --vnodes 5 --point-label '{id}&&VN{i}' --with-hash 太阳
  chash route --node a:1 --node b:1 --node c:1 --distribution maglev --table-size 65537 k1 k2

Without KEY arguments, keys are read from standard input, one per line (split on
LF only; every other byte is part of the key). With -c, the pool's settings and
twemproxy's defaults apply (distribution ketama, hash fnv1a_64); with --node,
chash's defaults apply (distribution ring, hash xxh3, 160 vnodes per unit of
weight). Distributions: ring, ketama, modula, nginx, jump, rendezvous, maglev,
anchor (or memento), multiprobe, bounded (random has no fixed placement to
print). jump, anchor and multiprobe take equal weights only. With bounded, keys
are placed in input order and each holds one unit of load to the end, so no
server gets more than ceil(balance factor x mean) of them.")]
pub struct RouteArgs {
    /// twemproxy-style YAML config file.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    config: Option<PathBuf>,

    /// Pool to route for (default: the first pool in the file).
    #[arg(long, value_name = "NAME", requires = "config")]
    pool: Option<String>,

    /// A server line `ID:WEIGHT [NAME]`, e.g. `10.0.0.1:11211:1` or `cache-a:2` (repeatable).
    #[arg(long = "node", value_name = "SERVERLINE", conflicts_with = "config")]
    node: Vec<String>,

    /// Placement algorithm (with --node).
    #[arg(long, value_name = "D", default_value = "ring", conflicts_with = "config")]
    distribution: String,

    /// Key hash (with --node; default: xxh3 for ring, fnv1a_64 for ketama and
    /// modula as in twemproxy, crc32a for nginx).
    #[arg(long, value_name = "H", conflicts_with = "config")]
    hash: Option<String>,

    /// Ring points per unit of weight (with --node).
    #[arg(long, value_name = "N", default_value_t = chash::DEFAULT_VNODES, conflicts_with = "config")]
    vnodes: u32,

    /// Two characters around the hashed part of a key, e.g. '{}' (with --node).
    #[arg(long, value_name = "XY", conflicts_with = "config")]
    hash_tag: Option<String>,

    /// Ring point label template, e.g. '{id}&&VN{i}' (with --node, distribution ring).
    #[arg(long, value_name = "TEMPLATE", conflicts_with = "config")]
    point_label: Option<String>,

    /// Maglev table size, a prime above 100 x the total weight (with --node,
    /// distribution maglev; default 65537).
    #[arg(long, value_name = "PRIME", conflicts_with = "config")]
    table_size: Option<u64>,

    /// Probes per key (with --node, distribution multiprobe; default 21).
    #[arg(long, value_name = "K", conflicts_with = "config")]
    probes: Option<u32>,

    /// Bound on a server's load over the mean, c >= 1 (with --node,
    /// distribution bounded; default 1.25).
    #[arg(long, value_name = "C", conflicts_with = "config")]
    balance_factor: Option<f64>,

    /// AnchorHash buckets, at least the number of servers (with --node,
    /// distribution anchor; default 1024).
    #[arg(long, value_name = "N", conflicts_with = "config")]
    capacity: Option<u32>,

    /// Also print each key's hash value, as the original program prints it
    /// (a third column, or a "hash" field in JSON).
    #[arg(long)]
    with_hash: bool,

    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,

    /// Keys to route; without any, keys are read from standard input.
    #[arg(value_name = "KEY")]
    keys: Vec<String>,
}

/// The pool described by the arguments.
fn pool(args: &RouteArgs) -> Result<Pool> {
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let config = Config::from_yaml(&text).with_context(|| path.display().to_string())?;
        return config.pool(args.pool.as_deref()).with_context(|| path.display().to_string());
    }
    if args.node.is_empty() {
        bail!("no servers: give -c FILE, or one or more --node SERVERLINE (see chash route --help)");
    }
    let servers = args.node.iter().map(|s| s.parse::<ServerLine>()).collect::<chash::Result<Vec<_>>>()?;
    let mut pool = Pool::from_servers(servers);
    pool.distribution = args.distribution.parse::<Distribution>()?;
    pool.hash = match (&args.hash, pool.distribution) {
        (Some(h), _) => h.parse::<KeyHasher>()?,
        (None, Distribution::Ketama | Distribution::Modula | Distribution::Random) => KeyHasher::Fnv1a64,
        (None, Distribution::Nginx) => KeyHasher::Crc32a,
        (None, _) => KeyHasher::Xxh3,
    };
    pool.vnodes = args.vnodes;
    if let Some(template) = &args.point_label {
        if !matches!(pool.distribution, Distribution::Ring | Distribution::Bounded) {
            bail!("--point-label applies to distributions ring and bounded only");
        }
        pool.point_label = template.parse()?;
    }
    let only = |flag: &str, set: bool, d: Distribution| -> Result<()> {
        if set && pool.distribution != d {
            bail!("{flag} applies to distribution {d} only");
        }
        Ok(())
    };
    only("--table-size", args.table_size.is_some(), Distribution::Maglev)?;
    only("--probes", args.probes.is_some(), Distribution::Multiprobe)?;
    only("--balance-factor", args.balance_factor.is_some(), Distribution::Bounded)?;
    only("--capacity", args.capacity.is_some(), Distribution::Anchor)?;
    pool.maglev_table_size = args.table_size.unwrap_or(pool.maglev_table_size);
    pool.probes = args.probes.unwrap_or(pool.probes);
    pool.balance_factor = args.balance_factor.unwrap_or(pool.balance_factor);
    pool.anchor_capacity = args.capacity.unwrap_or(pool.anchor_capacity);
    pool.hash_tag = match args.hash_tag.as_deref().map(str::as_bytes) {
        None => None,
        Some(&[open, close]) => Some([open, close]),
        Some(_) => bail!("--hash-tag must be exactly two characters, e.g. '{{}}'"),
    };
    pool.check_supported()?;
    Ok(pool)
}

pub fn run(args: RouteArgs) -> Result<()> {
    let snapshot = pool(&args)?.snapshot()?;
    let hasher = snapshot.placement().hasher();
    let stdout = io::stdout();
    let mut out = io::BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut line = Vec::with_capacity(512);
    for_each_key(&args.keys, |key| {
        let hash = snapshot.key_hash(key);
        // Each key holds its load to the end (bounded); the owner otherwise.
        let id = snapshot.placement().acquire_hash(hash).map_or("", |i| snapshot.nodes()[i].id());
        line.clear();
        match args.format {
            Format::Text => {
                line.extend_from_slice(key);
                line.push(b'\t');
                line.extend_from_slice(id.as_bytes());
                if args.with_hash {
                    line.push(b'\t');
                    line.extend_from_slice(hasher.value_of_position(hash).to_string().as_bytes());
                }
            }
            Format::Json => {
                line.extend_from_slice(b"{\"key\":");
                write_json_string(&mut line, key);
                line.extend_from_slice(b",\"id\":");
                write_json_string(&mut line, id.as_bytes());
                if args.with_hash {
                    line.extend_from_slice(format!(",\"hash\":{}", hasher.value_of_position(hash)).as_bytes());
                }
                line.push(b'}');
            }
        }
        line.push(b'\n');
        out.write_all(&line)
    })?;
    out.flush()?;
    Ok(())
}
