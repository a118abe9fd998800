//! The pool a command works on: `-c FILE [--pool NAME]`, or `--node` server
//! lines with chash's defaults (shared by `route`, `analyze` and `bench`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use chash::config::{Config, Distribution, Pool};
use chash::{KeyHasher, ServerLine};
use clap::Args;

/// Where the servers come from, and the placement settings for `--node`.
#[derive(Args, Debug)]
pub struct PoolArgs {
    /// twemproxy-style YAML config file.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    config: Option<PathBuf>,

    /// Pool to use (default: the first pool in the file).
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
}

/// Pool `name` (or the first) of the config file at `path`.
///
/// # Errors
/// An unreadable file, an invalid config or an unknown pool, each naming the file.
pub fn pool_from_file(path: &Path, name: Option<&str>) -> Result<Pool> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let config = Config::from_yaml(&text).with_context(|| path.display().to_string())?;
    config.pool(name).with_context(|| path.display().to_string())
}

/// The hash a distribution uses when none is named: twemproxy's for its own
/// distributions, nginx's CRC-32, chash's xxh3 for the rest.
pub fn default_hash(distribution: Distribution) -> KeyHasher {
    match distribution {
        Distribution::Ketama | Distribution::Modula | Distribution::Random => KeyHasher::Fnv1a64,
        Distribution::Nginx => KeyHasher::Crc32a,
        _ => KeyHasher::Xxh3,
    }
}

impl PoolArgs {
    /// The pool the arguments describe.
    ///
    /// # Errors
    /// As [`pool_from_file`]; no servers; a bad server line, name or
    /// parameter, or a parameter for another distribution.
    pub fn pool(&self, command: &str) -> Result<Pool> {
        if let Some(path) = &self.config {
            return pool_from_file(path, self.pool.as_deref());
        }
        if self.node.is_empty() {
            bail!("no servers: give -c FILE, or one or more --node SERVERLINE (see chash {command} --help)");
        }
        let servers = self.node.iter().map(|s| s.parse::<ServerLine>()).collect::<chash::Result<Vec<_>>>()?;
        let mut pool = Pool::from_servers(servers);
        pool.distribution = self.distribution.parse::<Distribution>()?;
        pool.hash = match &self.hash {
            Some(h) => h.parse::<KeyHasher>()?,
            None => default_hash(pool.distribution),
        };
        pool.vnodes = self.vnodes;
        if let Some(template) = &self.point_label {
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
        only("--table-size", self.table_size.is_some(), Distribution::Maglev)?;
        only("--probes", self.probes.is_some(), Distribution::Multiprobe)?;
        only("--balance-factor", self.balance_factor.is_some(), Distribution::Bounded)?;
        only("--capacity", self.capacity.is_some(), Distribution::Anchor)?;
        pool.maglev_table_size = self.table_size.unwrap_or(pool.maglev_table_size);
        pool.probes = self.probes.unwrap_or(pool.probes);
        pool.balance_factor = self.balance_factor.unwrap_or(pool.balance_factor);
        pool.anchor_capacity = self.capacity.unwrap_or(pool.anchor_capacity);
        pool.hash_tag = match self.hash_tag.as_deref().map(str::as_bytes) {
            None => None,
            Some(&[open, close]) => Some([open, close]),
            Some(_) => bail!("--hash-tag must be exactly two characters, e.g. '{{}}'"),
        };
        pool.check_supported()?;
        Ok(pool)
    }
}
