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
//! assert_eq!(pool.listen, "127.0.0.1:22121");
//! let snapshot = pool.snapshot().unwrap();
//! assert!(snapshot.route(b"user:1").is_some());
//! ```

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::pool_config::{PoolBuilder, PoolConfig};
use crate::{Error, Result};

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
    /// chash (proxy, Redis pools): the most clients blocked at once
    /// (`BLPOP`, `XREAD ... BLOCK`, ...) per server, each on a server
    /// connection of its own (default 64; 0 refuses blocking commands).
    pub blocking_connections: Option<u32>,
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
    /// e.g. `"{id}&&VN{i}"`; see [`PointLabel`](crate::PointLabel).
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
    /// chash (proxy, memcached pools): seconds after a membership change
    /// during which a read that misses on a key's new server is tried on
    /// its previous one (default 0: off).
    pub warmup: Option<u64>,
    /// chash: the TTL in seconds of a value copied by warm-up when its
    /// server cannot tell the remaining one (default 0: no expiry).
    pub warmup_ttl: Option<u64>,
    /// chash (proxy, memcached pools): copies of each key, on its first
    /// `replicas` distinct candidates (default 1).
    pub replicas: Option<u32>,
    /// chash: where reads of a replicated pool go: `first` (the first
    /// healthy candidate, the default) or `random` (any healthy replica).
    pub read: Option<String>,
    /// chash (proxy): `next` sends a key whose server is unreachable to its
    /// next candidate without changing the placement; `none` (default).
    pub failover: Option<String>,
    /// chash (proxy, memcached pools): servers removed with a drain, each
    /// with the Unix time (seconds) until which a proxy that reloads the
    /// file keeps it as a warm-up source (written by `chash config remove
    /// --drain`).
    pub drain: Option<std::collections::BTreeMap<String, u64>>,
    /// chash (proxy, Redis pools): membership changes move the data of
    /// the keys that change server (online, by `MIGRATE`); default false.
    pub migrate: Option<bool>,
    /// chash (proxy, Redis pools): how moved keys' data moves: `migrate`
    /// (server to server with `MIGRATE`; default) or `copy` (through the
    /// proxy with `DUMP` and `RESTORE`, where `MIGRATE` is disabled).
    pub migrate_method: Option<String>,
    /// chash (proxy, Redis pools): a migration in progress: the server
    /// lines before the change (written by `chash config add|remove|weight
    /// --migrate`, removed when it completes).
    pub migrate_from: Option<Vec<String>>,
    /// chash (proxy, Redis pools): the migration's state, `armed` (moved
    /// keys wait until every proxy of the fleet has the change) or `moving`.
    pub migrate_state: Option<String>,
    /// chash (proxy): the certificate chain served to clients (PEM file).
    pub tls_cert: Option<String>,
    /// chash (proxy): its private key (PEM file).
    pub tls_key: Option<String>,
    /// chash (proxy): clients must present a certificate chaining to this CA.
    pub tls_client_ca: Option<String>,
    /// chash (proxy): serve TLS here and keep `listen` plaintext.
    pub tls_listen: Option<String>,
    /// chash (proxy): speak TLS to the servers.
    pub server_tls: Option<bool>,
    /// chash (proxy): the CA servers are verified with (default: system roots).
    pub server_tls_ca: Option<String>,
    /// chash (proxy): the client certificate presented to servers (PEM file).
    pub server_tls_cert: Option<String>,
    /// chash (proxy): its private key (PEM file).
    pub server_tls_key: Option<String>,
    /// chash (proxy): the name servers' certificates must carry (default:
    /// each server's host).
    pub server_tls_name: Option<String>,
    /// chash (proxy): `false` skips verifying servers (logged loudly).
    pub server_tls_verify: Option<bool>,
    /// chash (proxy): per-server TLS, by server ID (`HOST:PORT`) or name:
    /// any of the `server_tls*` keys, over the pool's. A
    /// pool half moved to TLS, a server with a name of its own. Placement
    /// is unchanged (the ID is the same).
    pub server_tls_overrides: Option<std::collections::BTreeMap<String, crate::pool_config::ServerTls>>,
    /// chash (proxy, Redis pools): the user the proxy logs in to servers as.
    pub server_user: Option<String>,
    /// chash (proxy, Redis pools): its password.
    pub server_password: Option<String>,
    /// chash (proxy, Redis pools): a file holding it.
    pub server_password_file: Option<String>,
    /// chash (proxy, Redis pools): the users clients log in as.
    pub users: Option<Vec<crate::pool_config::RedisUser>>,
    /// chash (proxy, Redis pools): Redis Sentinels, `HOST:PORT` each; with
    /// them every server line's ID names a Sentinel master group.
    pub sentinels: Option<Vec<String>>,
    /// chash (proxy, Sentinel pools): the Sentinels' password.
    pub sentinel_password: Option<String>,
    /// chash (proxy, Sentinel pools): milliseconds a group's requests wait
    /// for its new primary during a failover (default 5000; 0: `TRYAGAIN`
    /// at once).
    pub failover_hold: Option<u64>,
    /// chash (proxy, Sentinel pools): milliseconds between polls of the
    /// Sentinels (default 1000; their events act at once).
    pub sentinel_poll: Option<u64>,
    /// chash (proxy, Sentinel pools): where reads go: `primary` (default),
    /// `prefer-primary`, `replica`, `prefer-replica`, `any`.
    pub read_policy: Option<String>,
    /// chash (proxy, Sentinel pools): seconds of replication lag past which
    /// a replica gets no reads (default 10).
    pub replica_max_lag: Option<u64>,
    /// chash (proxy, Sentinel pools): servers' zones by `HOST:PORT`; reads
    /// prefer replicas in the proxy's zone (`chash proxy --zone`).
    pub server_zones: Option<std::collections::BTreeMap<String, String>>,
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
    pub fn pool(&self, name: Option<&str>) -> Result<PoolConfig> {
        let (n, p) = match name {
            Some(name) => self.pools.iter().find(|(n, _)| n == name).ok_or_else(|| {
                let names: Vec<&str> = self.pools.iter().map(|(n, _)| n.as_str()).collect();
                Error::Config(format!("no pool named {name:?} (pools: {})", names.join(", ")))
            })?,
            None => self.pools.first().ok_or_else(|| Error::Config("the config defines no pools".into()))?,
        };
        p.resolve(n).map_err(|e| Error::Config(format!("pool {n:?}: {e}")))
    }
}

impl PoolFile {
    /// The pool these keys describe, through [`PoolConfig::builder`]
    /// (twemproxy's defaults; every key checked there).
    ///
    /// # Errors
    /// As [`PoolBuilder::build`].
    pub fn resolve(&self, name: &str) -> Result<PoolConfig> {
        let mut b = PoolConfig::builder(name);
        fn set<T: Clone>(b: PoolBuilder, v: &Option<T>, f: fn(PoolBuilder, T) -> PoolBuilder) -> PoolBuilder {
            match v {
                Some(v) => f(b, v.clone()),
                None => b,
            }
        }
        b = set(b, &self.listen, |b, v: String| b.listen(&v));
        b = set(b, &self.hash, |b, v: String| b.hash(&v));
        b = set(b, &self.hash_tag, |b, v: String| b.hash_tag(&v));
        b = set(b, &self.distribution, |b, v: String| b.distribution(&v));
        b = set(b, &self.timeout, PoolBuilder::timeout_ms);
        b = set(b, &self.backlog, PoolBuilder::backlog);
        b = set(b, &self.client_connections, PoolBuilder::client_connections);
        b = set(b, &self.redis, PoolBuilder::redis);
        b = set(b, &self.tcpkeepalive, PoolBuilder::tcpkeepalive);
        b = set(b, &self.reuseport, PoolBuilder::reuseport);
        b = set(b, &self.redis_auth, |b, v: String| b.redis_auth(&v));
        b = set(b, &self.redis_db, PoolBuilder::redis_db);
        b = set(b, &self.preconnect, PoolBuilder::preconnect);
        b = set(b, &self.auto_eject_hosts, PoolBuilder::auto_eject_hosts);
        b = set(b, &self.server_connections, PoolBuilder::server_connections);
        b = set(b, &self.blocking_connections, PoolBuilder::blocking_connections);
        b = set(b, &self.server_retry_timeout, PoolBuilder::server_retry_timeout_ms);
        b = set(b, &self.server_failure_limit, PoolBuilder::server_failure_limit);
        b = set(b, &self.vnodes, PoolBuilder::vnodes);
        b = set(b, &self.point_label, |b, v: String| b.point_label(&v));
        b = set(b, &self.maglev_table_size, PoolBuilder::maglev_table_size);
        b = set(b, &self.probes, PoolBuilder::probes);
        b = set(b, &self.balance_factor, PoolBuilder::balance_factor);
        b = set(b, &self.anchor_capacity, PoolBuilder::anchor_capacity);
        b = set(b, &self.warmup, PoolBuilder::warmup_secs);
        b = set(b, &self.warmup_ttl, PoolBuilder::warmup_ttl_secs);
        b = set(b, &self.replicas, PoolBuilder::replicas);
        b = set(b, &self.read, |b, v: String| b.read(&v));
        b = set(b, &self.failover, |b, v: String| b.failover(&v));
        b = set(b, &self.drain, |b, v| b.drain(v.into_iter().collect()));
        b = set(b, &self.migrate, PoolBuilder::migrate);
        b = set(b, &self.migrate_method, |b, v: String| b.migrate_method(&v));
        b = set(b, &self.migrate_from, PoolBuilder::migrate_from);
        b = set(b, &self.migrate_state, |b, v: String| b.migrate_state(&v));
        let mut tls = crate::pool_config::PoolTls::default();
        tls.cert.clone_from(&self.tls_cert);
        tls.key.clone_from(&self.tls_key);
        tls.client_ca.clone_from(&self.tls_client_ca);
        tls.listen.clone_from(&self.tls_listen);
        tls.server = self.server_tls.unwrap_or(false);
        tls.server_ca.clone_from(&self.server_tls_ca);
        tls.server_cert.clone_from(&self.server_tls_cert);
        tls.server_key.clone_from(&self.server_tls_key);
        tls.server_name.clone_from(&self.server_tls_name);
        tls.server_verify = self.server_tls_verify.unwrap_or(true);
        tls.servers = self.server_tls_overrides.clone().unwrap_or_default();
        b = b.tls(tls);
        let mut access = crate::pool_config::RedisAccess::default();
        access.server_user.clone_from(&self.server_user);
        access.server_password.clone_from(&self.server_password);
        access.server_password_file.clone_from(&self.server_password_file);
        access.users = self.users.clone().unwrap_or_default();
        b = b.access(access);
        let mut sentinel = crate::SentinelKeys::default();
        sentinel.sentinels.clone_from(&self.sentinels);
        sentinel.password.clone_from(&self.sentinel_password);
        sentinel.failover_hold_ms = self.failover_hold;
        sentinel.poll_ms = self.sentinel_poll;
        sentinel.read_policy.clone_from(&self.read_policy);
        sentinel.replica_max_lag_secs = self.replica_max_lag;
        sentinel.zones.clone_from(&self.server_zones);
        b = b.sentinel(sentinel);
        for line in &self.servers {
            b = b.server_line(line);
        }
        b.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KeyHasher, Node, ServerLine, DISTRIBUTIONS};

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
            let hash = if *d == "nginx" { "crc32a" } else { "fnv1a_64" };
            let pool = PoolConfig::builder("t").distribution(d).hash(hash).servers(servers.clone()).build().unwrap();
            let s = pool.snapshot().unwrap();
            let grown = s.with_node(Node::new("e", 1).unwrap()).unwrap();
            assert_eq!(grown.nodes().len(), 5, "{d}");
            assert_eq!(s.with_node(Node::new("a", 1).unwrap()).unwrap_err(), Error::DuplicateNode("a".into()));
            let gone = if matches!(*d, "jump" | "jumpback") { "d" } else { "b" };
            let smaller = s.without_node(gone).unwrap();
            assert_eq!(smaller.without_node("zz").unwrap_err(), Error::UnknownNode("zz".into()));
            if matches!(*d, "ring" | "jump" | "jumpback" | "rendezvous" | "anchor" | "multiprobe" | "nginx") {
                // Optimal movement: only the removed node's keys move.
                for k in &keys {
                    let (before, after) = (s.route(k.as_bytes()).unwrap(), smaller.route(k.as_bytes()).unwrap());
                    assert!(before == after || before == gone, "{d}: {k} {before} -> {after}");
                }
            }
            let reweighted = s.with_weight("a", 2);
            if matches!(*d, "jump" | "jumpback" | "anchor" | "multiprobe") {
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
        assert_eq!((a.server_connections, a.redis_db, a.timeout), (2, 1, Some(std::time::Duration::from_millis(400))));
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
        assert!(err("a:\n  distribution: ring\n  servers: [x:1, x:2]\n").contains("duplicate node id \"x\""));
        assert!(Config::from_yaml(FULL).unwrap().pool(Some("gamma")).unwrap_err().to_string().contains("alpha, beta"));
    }
}
