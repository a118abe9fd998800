//! `chash route`.

use std::io::{self, Write};

use anyhow::Result;
use chash::Placement;
use clap::{Args, ValueEnum};

use crate::keys::{for_each_key, write_json_string};
use crate::pool_args::PoolArgs;

/// `--fingerprint`: every pool of the file (or the one named, or the
/// `--node` pool), its version and fingerprint.
fn fingerprints(args: &RouteArgs) -> Result<()> {
    let pools = args.pool.pools("route")?;
    let mut out = io::stdout().lock();
    let w = pools.iter().map(|p| p.name.len()).max().unwrap_or(0).max(4);
    writeln!(out, "{:<w$}  {:<16}  {:<16}  servers", "pool", "version", "fingerprint")?;
    for p in pools {
        let fingerprint = match p.snapshot() {
            Ok(s) => s.fingerprint(),
            Err(_) => "random".into(),
        };
        writeln!(out, "{:<w$}  {:<16}  {:<16}  {}", p.name, p.version(), fingerprint, p.servers.len())?;
    }
    Ok(())
}

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
weight). Distributions: ring, ketama, modula, nginx, jump, jumpback,
rendezvous, maglev, anchor (or memento), multiprobe, bounded (random has no
fixed placement to print). --fingerprint prints each pool's membership
version and placement fingerprint instead (every pool of the file unless
--pool names one). jump, jumpback, anchor and multiprobe take equal weights
only. With bounded, keys are placed
in input order and each holds one unit of load to the end, so no
server gets more than ceil(balance factor x mean) of them.")]
pub struct RouteArgs {
    #[command(flatten)]
    pool: PoolArgs,

    /// Also print each key's hash value, as the original program prints it
    /// (a third column, or a "hash" field in JSON).
    #[arg(long)]
    with_hash: bool,

    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,

    /// Print each pool's membership version and placement fingerprint (as
    /// a proxy running the file reports them in /stats; `chash fleet check`
    /// compares them) instead of routing keys.
    #[arg(long, conflicts_with_all = ["keys", "with_hash", "format"])]
    fingerprint: bool,

    /// Keys to route; without any, keys are read from standard input.
    #[arg(value_name = "KEY")]
    keys: Vec<String>,
}

pub fn run(args: RouteArgs) -> Result<()> {
    if args.fingerprint {
        return fingerprints(&args);
    }
    let snapshot = args.pool.pool("route")?.snapshot()?;
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
