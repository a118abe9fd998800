//! The pool a command works on: `-c FILE [--pool NAME]`, or `--node` server
//! lines with chash's defaults (shared by `route`, `analyze` and `bench`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use chash::config::Config;
use chash::{Distribution, PoolConfig};
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
    /// distribution anchor; default 1024). A lookup re-draws about
    /// ln(buckets / servers) times: about twice the most servers the pool
    /// will hold keeps small pools fast.
    #[arg(long, value_name = "N", conflicts_with = "config")]
    capacity: Option<u32>,
}

/// PoolConfig `name` (or the first) of the config file at `path`.
///
/// # Errors
/// An unreadable file, an invalid config or an unknown pool, each naming the file.
pub fn pool_from_file(path: &Path, name: Option<&str>) -> Result<PoolConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let config = Config::from_yaml(&text).with_context(|| path.display().to_string())?;
    config.pool(name).with_context(|| path.display().to_string())
}

impl PoolArgs {
    /// Every pool of the file (or the one `--pool` names), or the `--node` pool.
    ///
    /// # Errors
    /// As [`PoolArgs::pool`].
    pub fn pools(&self, command: &str) -> Result<Vec<PoolConfig>> {
        match (&self.config, &self.pool) {
            (Some(path), None) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
                let config = Config::from_yaml(&text).with_context(|| path.display().to_string())?;
                config.pools.iter().map(|(n, _)| Ok(config.pool(Some(n))?)).collect()
            }
            _ => Ok(vec![self.pool(command)?]),
        }
    }

    /// The pool the arguments describe: the file's, or one built from the
    /// flags by the library's validating builder with chash's defaults.
    ///
    /// # Errors
    /// As [`pool_from_file`]; no servers; a bad server line, name or
    /// parameter, or a parameter for another distribution.
    pub fn pool(&self, command: &str) -> Result<PoolConfig> {
        if let Some(path) = &self.config {
            return pool_from_file(path, self.pool.as_deref());
        }
        if self.node.is_empty() {
            bail!("no servers: give -c FILE, or one or more --node SERVERLINE (see chash {command} --help)");
        }
        let mut b = PoolConfig::native_builder("cli").distribution(&self.distribution);
        for line in &self.node {
            b = b.server_line(line);
        }
        let d: Distribution = self.distribution.parse()?;
        // --vnodes has a default: it is the ring's setting, so it is only
        // passed for the distributions it applies to.
        if matches!(d, Distribution::Ring | Distribution::Bounded) {
            b = b.vnodes(self.vnodes);
        }
        if let Some(v) = &self.hash {
            b = b.hash(v);
        }
        if let Some(v) = &self.hash_tag {
            b = b.hash_tag(v);
        }
        if let Some(v) = &self.point_label {
            b = b.point_label(v);
        }
        if let Some(v) = self.table_size {
            b = b.maglev_table_size(v);
        }
        if let Some(v) = self.probes {
            b = b.probes(v);
        }
        if let Some(v) = self.balance_factor {
            b = b.balance_factor(v);
        }
        if let Some(v) = self.capacity {
            b = b.anchor_capacity(v);
        }
        Ok(b.build()?)
    }
}
