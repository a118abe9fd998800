//! Configuration files in the shape of twemproxy's `nutcracker.yml`.
//!
//! A file is a map of pool name to pool. Every key twemproxy 0.5 accepts is
//! accepted and means what it means there, with twemproxy's defaults
//! (`distribution: ketama`, `hash: fnv1a_64`); chash adds `vnodes`,
//! `point_label`, `maglev_table_size`, `probes`, `balance_factor` and
//! `anchor_capacity`, each for the distributions it applies to. An unknown
//! key is an error that names it.
//!
//! ```
//! use chash::config::Config;
//! let cfg = Config::from_yaml(r#"
//! alpha:
//!   listen: 127.0.0.1:22121
//!   distribution: ring
//!   hash: md5
//!   servers:
//!    - 127.0.0.1:11211:1
//!    - 127.0.0.1:11212:2 cache-b
//! "#).unwrap();
//! let pool = cfg.pool(None).unwrap();
//! assert_eq!(pool.name, "alpha");
//! let snapshot = pool.snapshot().unwrap();
//! assert!(snapshot.route(b"user:1").is_some());
//! ```

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::algo::{
    Anchor, Bounded, Jump, Maglev, MultiProbe, Rendezvous, DEFAULT_ANCHOR_CAPACITY, DEFAULT_BALANCE_FACTOR,
    DEFAULT_MAGLEV_TABLE_SIZE, DEFAULT_PROBES,
};
use crate::compat::{twemproxy_order, Ketama, Modula, NginxChash};
use crate::placement::Placement;
use crate::ring::{Ring, DEFAULT_VNODES};
use crate::PointLabel;
use crate::{hash, Error, KeyHasher, Node, Result, ServerLine};

/// Every `distribution:` name chash knows, implemented or not.
pub const DISTRIBUTIONS: &[&str] =
    &["ketama", "modula", "random", "nginx", "ring", "jump", "maglev", "rendezvous", "anchor", "multiprobe", "bounded"];

/// A placement algorithm, as named by `distribution:`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Distribution {
    /// twemproxy's and libmemcached's weighted ketama (twemproxy's default).
    Ketama,
    /// twemproxy's `hash % n` over the servers (weights ignored).
    Modula,
    /// twemproxy's random choice per request.
    Random,
    /// nginx's `hash $key consistent`.
    Nginx,
    /// chash's native weighted ring.
    Ring,
    /// Jump consistent hash (Lamping & Veach): [`Jump`].
    Jump,
    /// Maglev (Eisenbud et al.): [`Maglev`].
    Maglev,
    /// Rendezvous (highest random weight): [`Rendezvous`].
    Rendezvous,
    /// AnchorHash (also named `memento` in configs): [`Anchor`].
    Anchor,
    /// Multi-probe consistent hashing: [`MultiProbe`].
    Multiprobe,
    /// Consistent hashing with bounded loads over the ring: [`Bounded`].
    Bounded,
}

impl Distribution {
    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Distribution::Ketama => "ketama",
            Distribution::Modula => "modula",
            Distribution::Random => "random",
            Distribution::Nginx => "nginx",
            Distribution::Ring => "ring",
            Distribution::Jump => "jump",
            Distribution::Maglev => "maglev",
            Distribution::Rendezvous => "rendezvous",
            Distribution::Anchor => "anchor",
            Distribution::Multiprobe => "multiprobe",
            Distribution::Bounded => "bounded",
        }
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Distribution {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        use Distribution::*;
        [Ketama, Modula, Random, Nginx, Ring, Jump, Maglev, Rendezvous, Anchor, Multiprobe, Bounded]
            .into_iter()
            .find(|d| d.name() == s || (s == "memento" && *d == Anchor))
            .ok_or_else(|| Error::UnknownDistribution(s.to_owned()))
    }
}

/// One pool as written in the file (all keys optional but `servers`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PoolFile {
    /// `HOST:PORT` or a unix socket path the proxy listens on.
    pub listen: Option<String>,
    /// Key hash name.
    pub hash: Option<String>,
    /// Two characters delimiting the hashed part of a key, e.g. `"{}"`.
    pub hash_tag: Option<String>,
    /// Placement algorithm name.
    pub distribution: Option<String>,
    /// Backend timeout in milliseconds (twemproxy: wait forever).
    pub timeout: Option<u64>,
    /// Listen backlog (twemproxy: 512).
    pub backlog: Option<u32>,
    /// Maximum client connections (twemproxy: unlimited).
    pub client_connections: Option<u32>,
    /// Whether the pool speaks Redis (twemproxy: false, memcached).
    pub redis: Option<bool>,
    /// TCP keepalive on backend connections (twemproxy: false).
    pub tcpkeepalive: Option<bool>,
    /// SO_REUSEPORT on the listener (twemproxy: false).
    pub reuseport: Option<bool>,
    /// Password the proxy sends to Redis backends and requires from clients.
    pub redis_auth: Option<String>,
    /// Redis database on the backends (twemproxy: 0).
    pub redis_db: Option<u32>,
    /// Connect to every server at start (twemproxy: false).
    pub preconnect: Option<bool>,
    /// Eject servers after `server_failure_limit` failures (twemproxy: false).
    pub auto_eject_hosts: Option<bool>,
    /// Connections per server (twemproxy: 1).
    pub server_connections: Option<u32>,
    /// Milliseconds before an ejected server is retried (twemproxy: 30000).
    pub server_retry_timeout: Option<u64>,
    /// Consecutive failures that eject a server (twemproxy: 2).
    pub server_failure_limit: Option<u32>,
    /// Server lines, `ID:WEIGHT [NAME]`.
    #[serde(default)]
    pub servers: Vec<String>,
    /// chash: ring points per unit of weight (`distribution: ring`; default 160).
    pub vnodes: Option<u32>,
    /// chash: text template for ring point labels (`distribution: ring`),
    /// e.g. `"{id}&&VN{i}"`; see [`PointLabel`].
    pub point_label: Option<String>,
    /// chash: Maglev's table size, a prime above 100 × the total weight
    /// (`distribution: maglev`; default 65537).
    pub maglev_table_size: Option<u64>,
    /// chash: probes per key (`distribution: multiprobe`; default 21).
    pub probes: Option<u32>,
    /// chash: the bound `c` on load over mean load (`distribution: bounded`;
    /// default 1.25).
    pub balance_factor: Option<f64>,
    /// chash: AnchorHash's number of buckets, at least the number of servers
    /// (`distribution: anchor`; default 1024).
    pub anchor_capacity: Option<u32>,
}

/// A whole config file: pools in file order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    /// `(name, pool)` in the order the file lists them.
    pub pools: Vec<(String, PoolFile)>,
}

impl<'de> Deserialize<'de> for Config {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Pools;
        impl<'de> Visitor<'de> for Pools {
            type Value = Config;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of pool names to pools")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Config, A::Error> {
                let mut pools: Vec<(String, PoolFile)> = Vec::new();
                while let Some((name, pool)) = map.next_entry::<String, PoolFile>()? {
                    if pools.iter().any(|(n, _)| *n == name) {
                        return Err(de::Error::custom(format!("pool {name:?} is defined twice")));
                    }
                    pools.push((name, pool));
                }
                Ok(Config { pools })
            }
        }
        d.deserialize_map(Pools)
    }
}

impl Config {
    /// Parses YAML text.
    ///
    /// # Errors
    /// [`Error::Config`] with the YAML error (and its line) or the first
    /// semantic problem of any pool.
    pub fn from_yaml(text: &str) -> Result<Config> {
        let cfg: Config = serde_norway::from_str(text).map_err(|e| Error::Config(format!("invalid config: {e}")))?;
        if cfg.pools.is_empty() {
            return Err(Error::Config("invalid config: it defines no pools".into()));
        }
        for (name, _) in &cfg.pools {
            cfg.pool(Some(name))?;
        }
        Ok(cfg)
    }

    /// The pool named `name`, or the only/first pool when `None`.
    ///
    /// # Errors
    /// [`Error::Config`] for an unknown name, or a pool whose settings are invalid.
    pub fn pool(&self, name: Option<&str>) -> Result<Pool> {
        let (n, p) = match name {
            Some(name) => self.pools.iter().find(|(n, _)| n == name).ok_or_else(|| {
                let names: Vec<&str> = self.pools.iter().map(|(n, _)| n.as_str()).collect();
                Error::Config(format!("no pool named {name:?} (pools: {})", names.join(", ")))
            })?,
            None => self.pools.first().ok_or_else(|| Error::Config("the config defines no pools".into()))?,
        };
        Pool::from_file(n, p).map_err(|e| Error::Config(format!("pool {n:?}: {e}")))
    }
}

/// A pool with every setting resolved (defaults applied, names parsed).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Pool {
    /// Pool name.
    pub name: String,
    /// Key hash.
    pub hash: KeyHasher,
    /// Hash tag delimiters.
    pub hash_tag: Option<[u8; 2]>,
    /// Placement algorithm.
    pub distribution: Distribution,
    /// Ring points per unit of weight.
    pub vnodes: u32,
    /// Ring point labels.
    pub point_label: PointLabel,
    /// Maglev's table size.
    pub maglev_table_size: u64,
    /// Multi-probe's probes per key.
    pub probes: u32,
    /// Bounded loads' factor `c`.
    pub balance_factor: f64,
    /// AnchorHash's bucket count.
    pub anchor_capacity: u32,
    /// Servers in file order.
    pub servers: Vec<ServerLine>,
    /// The file's settings as written (for the proxy's own keys).
    pub file: PoolFile,
}

impl Pool {
    /// Resolves a pool read from a file, with twemproxy's defaults.
    ///
    /// # Errors
    /// Unknown hash or distribution names, a bad hash tag, a bad server line,
    /// or no servers.
    pub fn from_file(name: &str, file: &PoolFile) -> Result<Pool> {
        let distribution: Distribution = file.distribution.as_deref().unwrap_or("ketama").parse()?;
        // nginx hashes keys with CRC-32 and nothing else.
        let default_hash = if distribution == Distribution::Nginx { "crc32a" } else { "fnv1a_64" };
        let hash: KeyHasher = file.hash.as_deref().unwrap_or(default_hash).parse()?;
        let hash_tag = match file.hash_tag.as_deref() {
            None => None,
            Some(tag) => match tag.as_bytes() {
                &[open, close] => Some([open, close]),
                _ => {
                    return Err(Error::Config(format!(
                        "hash_tag {tag:?} must be exactly two characters, e.g. \"{{}}\""
                    )))
                }
            },
        };
        let servers = file.servers.iter().map(|s| s.parse()).collect::<Result<Vec<ServerLine>>>()?;
        if servers.is_empty() {
            return Err(Error::Config("it has no servers".into()));
        }
        if file.redis_db.is_some_and(|db| db > 0) && file.redis != Some(true) {
            return Err(Error::Config("redis_db is set but redis is not true".into()));
        }
        let pool = Pool {
            name: name.to_owned(),
            hash,
            hash_tag,
            distribution,
            vnodes: file.vnodes.unwrap_or(DEFAULT_VNODES),
            point_label: match &file.point_label {
                Some(t) => t.parse()?,
                None => PointLabel::Native,
            },
            maglev_table_size: file.maglev_table_size.unwrap_or(DEFAULT_MAGLEV_TABLE_SIZE),
            probes: file.probes.unwrap_or(DEFAULT_PROBES),
            balance_factor: file.balance_factor.unwrap_or(DEFAULT_BALANCE_FACTOR),
            anchor_capacity: file.anchor_capacity.unwrap_or(DEFAULT_ANCHOR_CAPACITY),
            servers,
            file: file.clone(),
        };
        use Distribution::{
            Anchor as A, Bounded as B, Ketama, Maglev as M, Modula, Multiprobe as P, Nginx, Random, Ring as R,
        };
        let own_keys: [(&str, bool, &[Distribution]); 6] = [
            ("vnodes", file.vnodes.is_some(), &[R, B]),
            ("point_label", file.point_label.is_some(), &[R, B]),
            ("maglev_table_size", file.maglev_table_size.is_some(), &[M]),
            ("probes", file.probes.is_some(), &[P]),
            ("balance_factor", file.balance_factor.is_some(), &[B]),
            ("anchor_capacity", file.anchor_capacity.is_some(), &[A]),
        ];
        for (key, set, applies) in own_keys {
            if set && !applies.contains(&distribution) {
                let names: Vec<&str> = applies.iter().map(|d| d.name()).collect();
                let to = match names.as_slice() {
                    [one] => format!("distribution {one} only"),
                    many => format!("distributions {}", many.join(" and ")),
                };
                return Err(Error::Config(format!("{key} applies to {to} (this pool's is {distribution})")));
            }
        }
        pool.check_supported()?;
        if !matches!(distribution, Ketama | Modula | Random | Nginx | R) {
            // Weights and parameters these algorithms refuse are errors of
            // the file: build once to report them now (milliseconds at most).
            pool.snapshot()?;
        }
        Ok(pool)
    }

    /// A pool from server lines with chash's own defaults (the `--node` flags).
    pub fn from_servers(servers: Vec<ServerLine>) -> Pool {
        Pool {
            name: "cli".into(),
            hash: KeyHasher::Xxh3,
            hash_tag: None,
            distribution: Distribution::Ring,
            vnodes: DEFAULT_VNODES,
            point_label: PointLabel::Native,
            maglev_table_size: DEFAULT_MAGLEV_TABLE_SIZE,
            probes: DEFAULT_PROBES,
            balance_factor: DEFAULT_BALANCE_FACTOR,
            anchor_capacity: DEFAULT_ANCHOR_CAPACITY,
            servers,
            file: PoolFile::default(),
        }
    }

    /// Checks that this version of chash can place keys for this pool.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a hash the distribution cannot take.
    pub fn check_supported(&self) -> Result<()> {
        match self.distribution {
            Distribution::Ring | Distribution::Modula | Distribution::Random => Ok(()),
            Distribution::Jump
            | Distribution::Maglev
            | Distribution::Rendezvous
            | Distribution::Anchor
            | Distribution::Multiprobe
            | Distribution::Bounded => Ok(()),
            Distribution::Ketama if self.hash.bits() > 32 => Err(Error::Unsupported(format!(
                "distribution ketama has a 32-bit continuum, but hash {} gives {}-bit values",
                self.hash,
                self.hash.bits()
            ))),
            Distribution::Ketama => Ok(()),
            Distribution::Nginx if self.hash != KeyHasher::Crc32a => Err(Error::Unsupported(format!(
                "distribution nginx hashes keys with CRC-32 (crc32a) only, not {}",
                self.hash
            ))),
            Distribution::Nginx => Ok(()),
        }
    }

    /// Builds the placement for this pool.
    ///
    /// # Errors
    /// As [`Pool::check_supported`]; `random` (which has no fixed placement);
    /// placement errors such as duplicate server ids, `vnodes: 0`, weights
    /// for an algorithm without them, or a bad `maglev_table_size`,
    /// `probes`, `balance_factor` or `anchor_capacity`.
    pub fn snapshot(&self) -> Result<Snapshot> {
        self.check_supported()?;
        let nodes = self.servers.iter().map(ServerLine::to_node).collect::<Result<Vec<Node>>>()?;
        let ring = |nodes| {
            Ring::builder().hasher(self.hash).vnodes(self.vnodes).point_label(self.point_label.clone()).build(nodes)
        };
        let placement = match self.distribution {
            Distribution::Ring => AnyPlacement::Ring(ring(nodes)?),
            Distribution::Bounded => AnyPlacement::Bounded(Box::new(Bounded::new(ring(nodes)?, self.balance_factor)?)),
            Distribution::Jump => AnyPlacement::Jump(Jump::with_hasher(nodes, self.hash)?),
            Distribution::Rendezvous => AnyPlacement::Rendezvous(Rendezvous::with_hasher(nodes, self.hash)?),
            Distribution::Maglev => AnyPlacement::Maglev(
                Maglev::builder().hasher(self.hash).table_size(self.maglev_table_size).build(nodes)?,
            ),
            Distribution::Anchor => {
                AnyPlacement::Anchor(Box::new(Anchor::with_capacity(nodes, self.hash, self.anchor_capacity)?))
            }
            Distribution::Multiprobe => {
                AnyPlacement::MultiProbe(MultiProbe::with_probes(nodes, self.hash, self.probes)?)
            }
            Distribution::Ketama => AnyPlacement::Ketama(Ketama::new(twemproxy_order(nodes)?, self.hash)?),
            Distribution::Modula => AnyPlacement::Modula(Modula::new(twemproxy_order(nodes)?, self.hash)?),
            Distribution::Nginx => AnyPlacement::Nginx(NginxChash::new(nodes)?),
            Distribution::Random => {
                return Err(Error::Unsupported(
                    "distribution random sends each request to a random server: keys have no fixed place to route \
                     (the proxy serves it; route, analyze and plan cannot)"
                        .into(),
                ))
            }
        };
        let twemproxy_rules = matches!(self.distribution, Distribution::Ketama | Distribution::Modula);
        Ok(Snapshot { hash_tag: self.hash_tag, twemproxy_rules, placement })
    }
}

/// A built placement of any algorithm.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyPlacement {
    /// The native ring.
    Ring(Ring),
    /// twemproxy's / libmemcached's ketama.
    Ketama(Ketama),
    /// twemproxy's modula.
    Modula(Modula),
    /// nginx's consistent hash.
    Nginx(NginxChash),
    /// Jump consistent hash.
    Jump(Jump),
    /// Weighted rendezvous hashing.
    Rendezvous(Rendezvous),
    /// Maglev.
    Maglev(Maglev),
    /// AnchorHash (boxed: it is the largest).
    Anchor(Box<Anchor>),
    /// Multi-probe consistent hashing.
    MultiProbe(MultiProbe),
    /// Bounded loads over the native ring, with its load tracker (boxed).
    Bounded(Box<Bounded>),
}

/// Calls `$body` with `$p` bound to the concrete placement.
macro_rules! with_placement {
    ($any:expr, $p:ident => $body:expr) => {
        match $any {
            AnyPlacement::Ring($p) => $body,
            AnyPlacement::Ketama($p) => $body,
            AnyPlacement::Modula($p) => $body,
            AnyPlacement::Nginx($p) => $body,
            AnyPlacement::Jump($p) => $body,
            AnyPlacement::Rendezvous($p) => $body,
            AnyPlacement::Maglev($p) => $body,
            AnyPlacement::Anchor($p) => $body,
            AnyPlacement::MultiProbe($p) => $body,
            AnyPlacement::Bounded($p) => $body,
        }
    };
}

impl AnyPlacement {
    /// The placement with `node` added, by the algorithm's own change:
    /// merged into the ring, appended for jump, the top free bucket for
    /// anchor, a rebuild for maglev and the compatibility placements (as the
    /// original programs do). The load tracker of `bounded` keeps the loads
    /// of the nodes that stay.
    ///
    /// # Errors
    /// As the algorithm's `with_node` (duplicate id, weights it refuses, a
    /// full anchor or a maglev table now too small).
    pub fn with_node(&self, node: Node) -> Result<AnyPlacement> {
        let hasher = self.hasher();
        let nodes = || self.nodes().to_vec();
        Ok(match self {
            AnyPlacement::Ring(p) => AnyPlacement::Ring(p.with_node(node)?),
            AnyPlacement::Ketama(_) => AnyPlacement::Ketama(Ketama::new(push(nodes(), node)?, hasher)?),
            AnyPlacement::Modula(_) => AnyPlacement::Modula(Modula::new(push(nodes(), node)?, hasher)?),
            AnyPlacement::Nginx(_) => AnyPlacement::Nginx(NginxChash::new(push(nodes(), node)?)?),
            AnyPlacement::Jump(p) => AnyPlacement::Jump(p.with_node(node)?),
            AnyPlacement::Rendezvous(p) => AnyPlacement::Rendezvous(p.with_node(node)?),
            AnyPlacement::Maglev(p) => AnyPlacement::Maglev(p.with_node(node)?),
            AnyPlacement::Anchor(p) => AnyPlacement::Anchor(Box::new(p.with_node(node)?)),
            AnyPlacement::MultiProbe(p) => AnyPlacement::MultiProbe(p.with_node(node)?),
            AnyPlacement::Bounded(p) => AnyPlacement::Bounded(Box::new(p.with_node(node)?)),
        })
    }

    /// The placement without node `id`, by the algorithm's own change (see
    /// [`with_node`](AnyPlacement::with_node)). For anchor this is what keeps
    /// movement optimal: a fresh build of the shorter server list renumbers
    /// the buckets after the removed one.
    ///
    /// # Errors
    /// [`Error::UnknownNode`]; for jump, any node but the last.
    pub fn without_node(&self, id: &str) -> Result<AnyPlacement> {
        let hasher = self.hasher();
        let rest = || -> Result<Vec<Node>> {
            let at = self.nodes().iter().position(|n| n.id() == id).ok_or_else(|| Error::UnknownNode(id.to_owned()))?;
            let mut nodes = self.nodes().to_vec();
            nodes.remove(at);
            Ok(nodes)
        };
        Ok(match self {
            AnyPlacement::Ring(p) => AnyPlacement::Ring(p.without_node(id)?),
            AnyPlacement::Ketama(_) => AnyPlacement::Ketama(Ketama::new(rest()?, hasher)?),
            AnyPlacement::Modula(_) => AnyPlacement::Modula(Modula::new(rest()?, hasher)?),
            AnyPlacement::Nginx(_) => AnyPlacement::Nginx(NginxChash::new(rest()?)?),
            AnyPlacement::Jump(p) => AnyPlacement::Jump(p.without_node(id)?),
            AnyPlacement::Rendezvous(p) => AnyPlacement::Rendezvous(p.without_node(id)?),
            AnyPlacement::Maglev(p) => AnyPlacement::Maglev(p.without_node(id)?),
            AnyPlacement::Anchor(p) => AnyPlacement::Anchor(Box::new(p.without_node(id)?)),
            AnyPlacement::MultiProbe(p) => AnyPlacement::MultiProbe(p.without_node(id)?),
            AnyPlacement::Bounded(p) => AnyPlacement::Bounded(Box::new(p.without_node(id)?)),
        })
    }

    /// The placement where node `id` has `weight`.
    ///
    /// # Errors
    /// [`Error::UnknownNode`], [`Error::ZeroWeight`];
    /// [`Error::WeightsUnsupported`] for jump, anchor and multiprobe (unless
    /// `weight` is 1, which changes nothing).
    pub fn with_weight(&self, id: &str, weight: u32) -> Result<AnyPlacement> {
        let hasher = self.hasher();
        let reweighted = || -> Result<Vec<Node>> {
            let at = self.nodes().iter().position(|n| n.id() == id).ok_or_else(|| Error::UnknownNode(id.to_owned()))?;
            let mut nodes = self.nodes().to_vec();
            nodes[at] = nodes[at].reweighted(weight)?;
            Ok(nodes)
        };
        let unweighted = |distribution: &'static str| -> Result<()> {
            reweighted()?;
            if weight == 1 {
                Ok(())
            } else {
                Err(Error::WeightsUnsupported { distribution, node: id.to_owned(), weight })
            }
        };
        Ok(match self {
            AnyPlacement::Ring(p) => AnyPlacement::Ring(p.with_weight(id, weight)?),
            AnyPlacement::Ketama(_) => AnyPlacement::Ketama(Ketama::new(reweighted()?, hasher)?),
            AnyPlacement::Modula(_) => AnyPlacement::Modula(Modula::new(reweighted()?, hasher)?),
            AnyPlacement::Nginx(_) => AnyPlacement::Nginx(NginxChash::new(reweighted()?)?),
            AnyPlacement::Rendezvous(p) => AnyPlacement::Rendezvous(p.with_weight(id, weight)?),
            AnyPlacement::Maglev(p) => AnyPlacement::Maglev(p.with_weight(id, weight)?),
            AnyPlacement::Bounded(p) => AnyPlacement::Bounded(Box::new(p.with_weight(id, weight)?)),
            AnyPlacement::Jump(_) => {
                unweighted("jump")?;
                self.clone()
            }
            AnyPlacement::Anchor(_) => {
                unweighted("anchor")?;
                self.clone()
            }
            AnyPlacement::MultiProbe(_) => {
                unweighted("multiprobe")?;
                self.clone()
            }
        })
    }

    /// The nodes, in server-line order.
    pub fn nodes(&self) -> &[Node] {
        with_placement!(self, p => p.nodes())
    }

    /// The key hash.
    pub fn hasher(&self) -> KeyHasher {
        with_placement!(self, p => p.hasher())
    }

    /// Index of the node owning hash value `hash`.
    #[inline]
    pub fn locate_hash(&self, hash: u64) -> Option<usize> {
        with_placement!(self, p => p.locate_hash(hash))
    }

    /// Distinct nodes for `hash`, owner first.
    pub fn candidates_hash(&self, hash: u64) -> Vec<usize> {
        with_placement!(self, p => p.candidates_hash(hash).collect())
    }

    /// Exact ownership of the hash space per node, where the placement is
    /// made of points: the rings (for `bounded`, the ring's ownership, where
    /// keys go while loads allow), and `multiprobe` (its expected shares,
    /// computed from the node points: [`crate::algo::MultiProbe::expected_shares`]).
    /// `None` for the others.
    pub fn ownership(&self) -> Option<Vec<f64>> {
        match self {
            AnyPlacement::MultiProbe(p) => Some(p.expected_shares()),
            AnyPlacement::Ring(p) => Some(crate::analysis::ownership(p)),
            AnyPlacement::Ketama(p) => Some(crate::analysis::ownership(p)),
            AnyPlacement::Nginx(p) => Some(crate::analysis::ownership(p)),
            AnyPlacement::Bounded(p) => Some(crate::analysis::ownership(p.ring())),
            _ => None,
        }
    }

    /// The exact diff to `new` ([`crate::analysis::diff`]) when both are made
    /// of points (the rings; `bounded` by its ring), else `None`.
    pub fn diff(&self, new: &AnyPlacement) -> Option<Result<crate::analysis::Diff>> {
        fn against<A: crate::PointRing>(old: &A, new: &AnyPlacement) -> Option<Result<crate::analysis::Diff>> {
            Some(match new {
                AnyPlacement::Ring(n) => crate::analysis::diff(old, n),
                AnyPlacement::Ketama(n) => crate::analysis::diff(old, n),
                AnyPlacement::Nginx(n) => crate::analysis::diff(old, n),
                AnyPlacement::Bounded(n) => crate::analysis::diff(old, n.ring()),
                _ => return None,
            })
        }
        match self {
            AnyPlacement::Ring(o) => against(o, new),
            AnyPlacement::Ketama(o) => against(o, new),
            AnyPlacement::Nginx(o) => against(o, new),
            AnyPlacement::Bounded(o) => against(o.ring(), new),
            _ => None,
        }
    }

    /// The node for a request for hash value `hash` that holds load until
    /// [`release`](AnyPlacement::release)d: with `bounded`, the first node
    /// under its cap ([`Bounded::acquire_hash`]); otherwise the owner.
    #[inline]
    pub fn acquire_hash(&self, hash: u64) -> Option<usize> {
        match self {
            AnyPlacement::Bounded(b) => b.acquire_hash(hash),
            p => p.locate_hash(hash),
        }
    }

    /// Gives back the load an [`acquire_hash`](AnyPlacement::acquire_hash)
    /// took on node `i` (nothing to do but for `bounded`).
    pub fn release(&self, i: usize) {
        if let AnyPlacement::Bounded(b) = self {
            b.release(i);
        }
    }
}

/// An immutable routing table for one pool: the placement plus the pool's key
/// rules (hash tag, and twemproxy's: an empty key, or a pool of one server,
/// hashes to 0). Share it with `arc-swap`; a change builds a new one.
#[derive(Clone, Debug)]
pub struct Snapshot {
    hash_tag: Option<[u8; 2]>,
    twemproxy_rules: bool,
    placement: AnyPlacement,
}

/// `nodes` with `node` appended, unless its id is taken.
fn push(mut nodes: Vec<Node>, node: Node) -> Result<Vec<Node>> {
    if nodes.iter().any(|n| n.id() == node.id()) {
        return Err(Error::DuplicateNode(node.id().to_owned()));
    }
    nodes.push(node);
    Ok(nodes)
}

impl Snapshot {
    /// A new snapshot with `node` added (same key rules); see
    /// [`AnyPlacement::with_node`].
    ///
    /// # Errors
    /// As [`AnyPlacement::with_node`].
    pub fn with_node(&self, node: Node) -> Result<Snapshot> {
        Ok(Snapshot {
            hash_tag: self.hash_tag,
            twemproxy_rules: self.twemproxy_rules,
            placement: self.placement.with_node(node)?,
        })
    }

    /// A new snapshot without node `id`; see [`AnyPlacement::without_node`].
    ///
    /// # Errors
    /// As [`AnyPlacement::without_node`].
    pub fn without_node(&self, id: &str) -> Result<Snapshot> {
        Ok(Snapshot {
            hash_tag: self.hash_tag,
            twemproxy_rules: self.twemproxy_rules,
            placement: self.placement.without_node(id)?,
        })
    }

    /// A new snapshot where node `id` has `weight`; see [`AnyPlacement::with_weight`].
    ///
    /// # Errors
    /// As [`AnyPlacement::with_weight`].
    pub fn with_weight(&self, id: &str, weight: u32) -> Result<Snapshot> {
        Ok(Snapshot {
            hash_tag: self.hash_tag,
            twemproxy_rules: self.twemproxy_rules,
            placement: self.placement.with_weight(id, weight)?,
        })
    }

    /// The placement.
    pub fn placement(&self) -> &AnyPlacement {
        &self.placement
    }

    /// The hash input for `key` after the hash tag rule.
    pub fn hashed_part<'k>(&self, key: &'k [u8]) -> &'k [u8] {
        hash::tagged(key, self.hash_tag)
    }

    /// The position of `key` on the hash space, as the pool's program computes it.
    #[inline]
    pub fn key_hash(&self, key: &[u8]) -> u64 {
        let part = self.hashed_part(key);
        if self.twemproxy_rules && (part.is_empty() || self.placement.nodes().len() == 1) {
            return 0;
        }
        self.placement.hasher().hash(part)
    }

    /// Index of the server that owns `key`.
    #[inline]
    pub fn route_index(&self, key: &[u8]) -> Option<usize> {
        self.placement.locate_hash(self.key_hash(key))
    }

    /// Id of the server that owns `key`.
    #[inline]
    pub fn route(&self, key: &[u8]) -> Option<&str> {
        self.route_index(key).map(|i| self.placement.nodes()[i].id())
    }

    /// The nodes, in server-line order.
    pub fn nodes(&self) -> &[Node] {
        self.placement.nodes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
alpha:
  listen: 127.0.0.1:22121
  hash: fnv1a_64
  hash_tag: "{}"
  distribution: ring
  timeout: 400
  backlog: 1024
  client_connections: 100
  redis: true
  tcpkeepalive: true
  reuseport: false
  redis_auth: secret
  redis_db: 1
  preconnect: true
  auto_eject_hosts: true
  server_connections: 2
  server_retry_timeout: 2000
  server_failure_limit: 3
  vnodes: 100
  servers:
   - 127.0.0.1:6379:1 one
   - 127.0.0.1:6380:2
beta:
  distribution: ring
  servers:
   - cache-a:1
"#;

    #[test]
    fn snapshots_change_by_each_algorithms_own_rules() {
        let servers: Vec<ServerLine> = ["a:1", "b:1", "c:1", "d:1"].iter().map(|s| s.parse().unwrap()).collect();
        let keys: Vec<String> = (0..3000).map(|i| format!("k{i}")).collect();
        for d in DISTRIBUTIONS.iter().filter(|d| **d != "random") {
            let mut pool = Pool::from_servers(servers.clone());
            pool.distribution = d.parse().unwrap();
            pool.hash = if *d == "nginx" { KeyHasher::Crc32a } else { KeyHasher::Fnv1a64 };
            let s = pool.snapshot().unwrap();
            let grown = s.with_node(Node::new("e", 1).unwrap()).unwrap();
            assert_eq!(grown.nodes().len(), 5, "{d}");
            assert_eq!(s.with_node(Node::new("a", 1).unwrap()).unwrap_err(), Error::DuplicateNode("a".into()));
            let gone = if *d == "jump" { "d" } else { "b" };
            let smaller = s.without_node(gone).unwrap();
            assert_eq!(smaller.without_node("zz").unwrap_err(), Error::UnknownNode("zz".into()));
            if matches!(*d, "ring" | "jump" | "rendezvous" | "anchor" | "multiprobe" | "nginx") {
                // Optimal movement: only the removed node's keys move.
                for k in &keys {
                    let (before, after) = (s.route(k.as_bytes()).unwrap(), smaller.route(k.as_bytes()).unwrap());
                    assert!(before == after || before == gone, "{d}: {k} {before} -> {after}");
                }
            }
            let reweighted = s.with_weight("a", 2);
            if matches!(*d, "jump" | "anchor" | "multiprobe") {
                assert!(matches!(reweighted, Err(Error::WeightsUnsupported { .. })), "{d}");
                assert!(s.with_weight("a", 1).is_ok());
            } else {
                assert_eq!(reweighted.unwrap().nodes()[0].weight(), 2, "{d}");
            }
        }
    }

    #[test]
    fn whole_twemproxy_schema_parses() {
        let cfg = Config::from_yaml(FULL).unwrap();
        assert_eq!(cfg.pools.len(), 2);
        let a = cfg.pool(Some("alpha")).unwrap();
        assert_eq!((a.hash, a.hash_tag, a.vnodes), (KeyHasher::Fnv1a64, Some(*b"{}"), 100));
        assert_eq!(a.servers[0].name.as_deref(), Some("one"));
        assert_eq!(a.file.server_connections, Some(2));
        assert_eq!(cfg.pool(None).unwrap().name, "alpha");
        let s = a.snapshot().unwrap();
        assert_eq!(s.route(b"x{tag}y"), s.route(b"tag"));
    }

    #[test]
    fn errors_name_the_problem() {
        let err = |text: &str| Config::from_yaml(text).unwrap_err().to_string();
        assert!(err("a:\n  distribution: ring\n  colour: blue\n  servers: [x:1]\n").contains("colour"));
        assert!(err("a:\n  distribution: ring\n  hash: sha1\n  servers: [x:1]\n").contains("sha1"));
        assert!(err("a:\n  distribution: ring\n  hash_tag: \"{\"\n  servers: [x:1]\n").contains("two characters"));
        assert!(err("a:\n  distribution: ring\n  servers: [x:0]\n").contains("weight 0"));
        assert!(err("a:\n  distribution: ring\n  servers: []\n").contains("no servers"));
        assert!(err("a:\n  distribution: jump\n  servers: [x:1, y:2]\n").contains("does not support weights"));
        assert!(err("a:\n  distribution: ring\n  probes: 3\n  servers: [x:1]\n").contains("multiprobe only"));
        assert!(err("a:\n  distribution: maglev\n  maglev_table_size: 100\n  servers: [x:1]\n").contains("101"));
        assert!(err("a:\n  distribution: bounded\n  balance_factor: 0.5\n  servers: [x:1]\n").contains("at least 1"));
        assert!(err("a:\n  distribution: anchor\n  anchor_capacity: 1\n  servers: [x:1, y:1]\n").contains("at least 2"));
        assert!(err("a:\n  distribution: jump\n  vnodes: 3\n  servers: [x:1]\n").contains("ring and bounded"));
        assert!(err("a:\n  distribution: nginx\n  hash: md5\n  servers: [x:1]\n").contains("crc32a"));
        assert!(err("a:\n  distribution: ketama\n  hash: xxh3\n  servers: [x:1]\n").contains("32-bit"));
        assert!(err("a:\n  vnodes: 10\n  servers: [x:1]\n").contains("distributions ring and bounded"));
        assert!(
            err("a:\n  distribution: ring\n  point_label: \"{x}\"\n  servers: [x:1]\n").contains("unknown variable")
        );
        assert!(err("a:\n  distribution: circle\n  servers: [x:1]\n").contains("circle"));
        assert!(err("a: [1, 2]\n").contains("invalid config"));
        assert!(err("").contains("invalid config") || err("").contains("no pools"));
        let dup = Config::from_yaml("a:\n  distribution: ring\n  servers: [x:1, x:2]\n").unwrap();
        assert_eq!(dup.pool(None).unwrap().snapshot().unwrap_err(), Error::DuplicateNode("x".into()));
        assert!(Config::from_yaml(FULL).unwrap().pool(Some("gamma")).unwrap_err().to_string().contains("alpha, beta"));
    }
}
