//! [`PoolConfig`]: a pool with every setting resolved — twemproxy's keys
//! with twemproxy's defaults, chash's own placement keys — and the one
//! validating [`PoolBuilder`] that both a config file and the command
//! line's `--node` flags go through.

use std::time::Duration;

use crate::algo::{
    Anchor, Bounded, Jump, JumpVariant, Maglev, MultiProbe, Rendezvous, DEFAULT_ANCHOR_CAPACITY,
    DEFAULT_BALANCE_FACTOR, DEFAULT_MAGLEV_TABLE_SIZE, DEFAULT_PROBES,
};
use crate::any_placement::AnyPlacement;
use crate::compat::{twemproxy_order, Ketama, Modula, NginxChash};
use crate::distribution::Distribution;
use crate::ring::{PointLabel, Ring, DEFAULT_VNODES};
use crate::sentinel_config::{SentinelKeys, SentinelSettings};
use crate::snapshot::Snapshot;
use crate::{Error, KeyHasher, LineState, Node, Result, ServerLine};

/// Where a pool listens when its config does not say.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:22121";

/// A pool with every setting resolved (defaults applied, names parsed,
/// combinations checked). Build one with [`PoolConfig::builder`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Pool name.
    pub name: String,
    /// Key hash.
    pub hash: KeyHasher,
    /// Hash tag delimiters.
    pub hash_tag: Option<[u8; 2]>,
    /// Placement algorithm.
    pub distribution: Distribution,
    /// Ring points per unit of weight (`ring`, `bounded`; default 160).
    pub vnodes: u32,
    /// Ring point labels (`ring`, `bounded`).
    pub point_label: PointLabel,
    /// Maglev's table size (default 65537).
    pub maglev_table_size: u64,
    /// Multi-probe's probes per key (default 21).
    pub probes: u32,
    /// Bounded loads' factor `c` (default 1.25).
    pub balance_factor: f64,
    /// AnchorHash's bucket count (default 1024).
    pub anchor_capacity: u32,
    /// The servers that take keys, in the order given (the active lines).
    pub servers: Vec<ServerLine>,
    /// Every line of `servers:` as written: active, ejected and (anchor)
    /// removed ones; [`PoolConfig::apply`] changes them.
    pub lines: Vec<ServerLine>,
    /// `HOST:PORT` to listen on (`listen`; default 127.0.0.1:22121).
    pub listen: String,
    /// Reply timeout (`timeout` in ms; none, the default: wait forever).
    pub timeout: Option<Duration>,
    /// Listen backlog (`backlog`; default 512).
    pub backlog: u32,
    /// Most client connections, 0 for no limit (`client_connections`; default 0).
    pub client_connections: u32,
    /// Whether the pool speaks Redis (`redis`; default false: memcached).
    pub redis: bool,
    /// The password of the Redis servers, required from clients too (`redis_auth`).
    pub redis_auth: Option<String>,
    /// The Redis database on the servers (`redis_db`; default 0).
    pub redis_db: u32,
    /// Connect to every server at start (`preconnect`; default false).
    pub preconnect: bool,
    /// Eject servers that keep failing (`auto_eject_hosts`; default false).
    pub auto_eject_hosts: bool,
    /// Connections per server (`server_connections`; default 1).
    pub server_connections: u32,
    /// Redis: the most clients blocked at once per server, each on a
    /// server connection of its own (`blocking_connections`; default 64;
    /// 0: blocking commands refused).
    pub blocking_connections: u32,
    /// How long an ejected server stays out (`server_retry_timeout`; default 30 s).
    pub server_retry_timeout: Duration,
    /// Consecutive failures that eject a server (`server_failure_limit`; default 2).
    pub server_failure_limit: u32,
    /// TCP keepalive on server connections (`tcpkeepalive`; default false).
    pub tcpkeepalive: bool,
    /// `SO_REUSEPORT` on the listener (`reuseport`; default false).
    pub reuseport: bool,
    /// How long after a membership change a key's previous server is
    /// tried when its new one misses (`warmup` in seconds; default 0: off).
    pub warmup: Duration,
    /// TTL of a value warm-up copies when the server it came from cannot
    /// tell the remaining one (`warmup_ttl` in seconds; default 0: none).
    pub warmup_ttl: u32,
    /// Copies of each key, on its first distinct candidates (`replicas`;
    /// default 1).
    pub replicas: u32,
    /// Reads of a replicated pool: any healthy replica instead of the
    /// first healthy candidate (`read: random`; default `first`).
    pub read_random: bool,
    /// A key whose server is unreachable goes to its next candidate, the
    /// placement unchanged (`failover: next`; default `none`).
    pub failover: bool,
    /// Removed servers that stay warm-up sources until a Unix time
    /// (`drain`: id to seconds), for the reload that removes them.
    pub drain: Vec<(String, u64)>,
    /// Membership changes move moved keys' data (`migrate`; Redis pools;
    /// default false).
    pub migrate: bool,
    /// How moved keys' data moves (`migrate_method`; default `migrate`).
    pub migrate_method: MigrateMethod,
    /// A migration in progress (`migrate_from`, `migrate_state`): the
    /// server lines before the change that started it.
    pub migration: Option<Migration>,
    /// TLS to clients and to servers (file paths; the proxy reads them).
    pub tls: PoolTls,
    /// Redis credentials: the proxy's own login to its servers and the
    /// users clients log in as (`server_user`, `server_password`, `users`).
    pub access: RedisAccess,
    /// Redis pools whose server lines name Sentinel master groups
    /// (`sentinels` and the keys that go with it).
    pub sentinel: Option<SentinelSettings>,
}

/// A Redis pool's membership change whose moved keys are being moved:
/// `servers:` is the new membership, [`Migration::from`] the one before.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Migration {
    /// The `servers:` lines before the change (`migrate_from`).
    pub from: Vec<ServerLine>,
    /// Where the migration is (`migrate_state`).
    pub state: MigrationState,
}

/// How a Redis pool's migration moves a key's data (`migrate_method`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MigrateMethod {
    /// Server to server with `MIGRATE` (atomic per key): the servers must
    /// reach each other and allow it (`migrate`; the default).
    #[default]
    Migrate,
    /// Through the proxy with `DUMP` and `RESTORE`, in scripts that make
    /// each key's copy happen once (`copy`): for servers where `MIGRATE`
    /// is disabled or that cannot reach each other.
    Copy,
}

impl MigrateMethod {
    /// Its name in the config file.
    pub fn name(self) -> &'static str {
        match self {
            MigrateMethod::Migrate => "migrate",
            MigrateMethod::Copy => "copy",
        }
    }
}

impl std::str::FromStr for MigrateMethod {
    type Err = Error;
    fn from_str(s: &str) -> Result<MigrateMethod> {
        match s {
            "migrate" => Ok(MigrateMethod::Migrate),
            "copy" => Ok(MigrateMethod::Copy),
            other => Err(Error::Config(format!("migrate_method: {other:?}: use migrate or copy"))),
        }
    }
}

/// Where a migration is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrationState {
    /// The change is known, nothing moves yet: commands on moved keys wait
    /// (up to the pool's timeout) until every proxy of the fleet has the
    /// change (`armed`).
    Armed,
    /// Moved keys are moved: on access, and in the background (`moving`).
    Moving,
}

impl MigrationState {
    /// Its name in the config file.
    pub fn name(self) -> &'static str {
        match self {
            MigrationState::Armed => "armed",
            MigrationState::Moving => "moving",
        }
    }
}

impl std::str::FromStr for MigrationState {
    type Err = Error;
    fn from_str(s: &str) -> Result<MigrationState> {
        match s {
            "armed" => Ok(MigrationState::Armed),
            "moving" => Ok(MigrationState::Moving),
            other => Err(Error::Config(format!("migrate_state: {other:?}: use armed or moving"))),
        }
    }
}

impl Migration {
    /// A migration from `from` (the pool before a change) in `state`.
    pub fn new(from: Vec<ServerLine>, state: MigrationState) -> Migration {
        Migration { from, state }
    }
}

/// Who logs in where, in a Redis pool: the proxy to its servers
/// (`server_user`, `server_password` or `server_password_file`; Redis 6
/// ACLs, ElastiCache RBAC) and clients to the proxy (`users`), apart.
/// Secrets named by file are read by the proxy (this library does no I/O).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisAccess {
    /// The user the proxy logs in to its servers as (`server_user`;
    /// default: `default`, Redis's user of a password alone).
    pub server_user: Option<String>,
    /// Its password (`server_password`).
    pub server_password: Option<String>,
    /// A file holding it instead (`server_password_file`; one line).
    pub server_password_file: Option<String>,
    /// The users clients `AUTH user pass` as (`users`).
    pub users: Vec<RedisUser>,
}

/// A user clients log in to the proxy as.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RedisUser {
    /// Its name (`AUTH name password`).
    pub name: String,
    /// Its password.
    pub password: Option<String>,
    /// A file holding it instead (one line).
    pub password_file: Option<String>,
    /// Commands that change data are refused to it (`NOPERM`).
    #[serde(default)]
    pub readonly: bool,
}

impl RedisAccess {
    /// Whether any of it is set.
    pub fn is_set(&self) -> bool {
        *self != RedisAccess::default()
    }

    /// Checks that the keys go together.
    ///
    /// # Errors
    /// A password given both inline and by file (or a user with neither),
    /// `server_user` without a password, a user named twice or not at all.
    pub fn check(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(msg));
        if self.server_password.is_some() && self.server_password_file.is_some() {
            return bad("server_password and server_password_file: give one of them".into());
        }
        if self.server_user.is_some() && self.server_password.is_none() && self.server_password_file.is_none() {
            return bad("server_user needs server_password or server_password_file".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for user in &self.users {
            if user.name.is_empty() || user.name.chars().any(|c| c.is_whitespace()) {
                return bad(format!("users: {:?} is not a user name (one word)", user.name));
            }
            if !seen.insert(user.name.as_str()) {
                return bad(format!("users: {} is named twice", user.name));
            }
            if user.password.is_some() == user.password_file.is_some() {
                return bad(format!("users: {} needs one of password and password_file", user.name));
            }
        }
        Ok(())
    }
}

/// Redis clients blocked at once per server, by default
/// (`blocking_connections`).
pub const DEFAULT_BLOCKING_CONNECTIONS: u32 = 64;

/// A pool's TLS settings as its config names them: PEM file paths, which
/// the proxy reads and checks (this library does no I/O).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolTls {
    /// The certificate chain clients are served (`tls_cert`): with it the
    /// pool's clients speak TLS.
    pub cert: Option<String>,
    /// Its private key (`tls_key`).
    pub key: Option<String>,
    /// Clients must present a certificate that chains to this CA
    /// (`tls_client_ca`): mutual TLS.
    pub client_ca: Option<String>,
    /// Serve TLS on this address and keep `listen` plaintext (`tls_listen`);
    /// without it, `listen` itself is TLS.
    pub listen: Option<String>,
    /// Speak TLS to the servers (`server_tls`).
    pub server: bool,
    /// The CA servers are verified with (`server_tls_ca`; default: the
    /// system's roots).
    pub server_ca: Option<String>,
    /// The certificate the proxy presents to servers that ask for one
    /// (`server_tls_cert`), with its key (`server_tls_key`).
    pub server_cert: Option<String>,
    /// See `server_cert`.
    pub server_key: Option<String>,
    /// The name servers' certificates must carry (`server_tls_name`;
    /// default: each server's host, an IP verified as an IP).
    pub server_name: Option<String>,
    /// Verify servers' certificates (`server_tls_verify`; default true).
    pub server_verify: bool,
    /// Per-server settings over these (`server_tls_overrides`), by server
    /// ID (`HOST:PORT`) or name. One the pool does not have is ignored (a
    /// server removed since: its override may stay in the file).
    pub servers: std::collections::BTreeMap<String, ServerTls>,
}

/// One server's TLS settings over its pool's (`server_tls_overrides`):
/// the keys it sets replace the pool's.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ServerTls {
    /// `server_tls`: speak TLS to this server (or not).
    pub server_tls: Option<bool>,
    /// `server_tls_ca`.
    pub server_tls_ca: Option<String>,
    /// `server_tls_cert`.
    pub server_tls_cert: Option<String>,
    /// `server_tls_key`.
    pub server_tls_key: Option<String>,
    /// `server_tls_name`.
    pub server_tls_name: Option<String>,
    /// `server_tls_verify`.
    pub server_tls_verify: Option<bool>,
}

impl Default for PoolTls {
    fn default() -> PoolTls {
        PoolTls {
            cert: None,
            key: None,
            client_ca: None,
            listen: None,
            server: false,
            server_ca: None,
            server_cert: None,
            server_key: None,
            server_name: None,
            server_verify: true,
            servers: std::collections::BTreeMap::new(),
        }
    }
}

impl PoolTls {
    /// Whether clients are served TLS.
    pub fn serves_tls(&self) -> bool {
        self.cert.is_some()
    }

    /// Checks that the keys go together.
    ///
    /// # Errors
    /// A certificate without its key (or the other way round), a client CA
    /// or TLS listen address without a certificate, server keys without
    /// `server_tls: true`.
    pub fn check(&self) -> Result<()> {
        self.check_one()?;
        for id in self.servers.keys() {
            if let Some(server) = self.for_server(id) {
                server.check_one().map_err(|e| Error::Config(format!("server_tls_overrides of {id}: {e}")))?;
            }
        }
        Ok(())
    }

    /// The server-side settings of server `id`: the pool's with its
    /// override's keys in their place (`None`: it has no override).
    pub fn for_server(&self, id: &str) -> Option<PoolTls> {
        let o = self.servers.get(id)?;
        let mut t = self.clone();
        t.servers.clear();
        t.server = o.server_tls.unwrap_or(t.server);
        let set = |mine: &mut Option<String>, theirs: &Option<String>| {
            if theirs.is_some() {
                mine.clone_from(theirs);
            }
        };
        set(&mut t.server_ca, &o.server_tls_ca);
        set(&mut t.server_cert, &o.server_tls_cert);
        set(&mut t.server_key, &o.server_tls_key);
        set(&mut t.server_name, &o.server_tls_name);
        t.server_verify = o.server_tls_verify.unwrap_or(t.server_verify);
        if o.server_tls == Some(false) {
            // Plaintext to this server: the pool's server keys do not
            // apply (its own would be an error, which `check` reports).
            t.server_ca.clone_from(&o.server_tls_ca);
            t.server_cert.clone_from(&o.server_tls_cert);
            t.server_key.clone_from(&o.server_tls_key);
            t.server_name.clone_from(&o.server_tls_name);
            t.server_verify = o.server_tls_verify.unwrap_or(true);
        }
        Some(t)
    }

    /// Whether any server is spoken to over TLS (the pool's `server_tls`
    /// or an override's).
    pub fn any_server_tls(&self) -> bool {
        self.server || self.servers.keys().any(|id| self.for_server(id).is_some_and(|t| t.server))
    }

    fn check_one(&self) -> Result<()> {
        let bad = |msg: &str| Err(Error::Config(msg.to_owned()));
        if self.cert.is_some() != self.key.is_some() {
            return bad("tls_cert and tls_key go together (a certificate chain and its private key, PEM files)");
        }
        if self.cert.is_none() && (self.client_ca.is_some() || self.listen.is_some()) {
            return bad("tls_client_ca and tls_listen need tls_cert and tls_key (the certificate clients are served)");
        }
        if self.server_cert.is_some() != self.server_key.is_some() {
            return bad("server_tls_cert and server_tls_key go together (the client certificate the proxy presents)");
        }
        let server_keys =
            self.server_ca.is_some() || self.server_cert.is_some() || self.server_name.is_some() || !self.server_verify;
        if server_keys && !self.server {
            return bad("server_tls_ca, server_tls_cert, server_tls_key, server_tls_name and server_tls_verify need server_tls: true");
        }
        Ok(())
    }
}

impl PoolConfig {
    /// A builder with twemproxy's defaults (`distribution: ketama`, `hash:
    /// fnv1a_64`), as a config file has them.
    pub fn builder(name: &str) -> PoolBuilder {
        PoolBuilder::new(name, Defaults::Twemproxy)
    }

    /// A builder with chash's own defaults (`distribution: ring`, and the
    /// distribution's [native hash](Distribution::native_hash)), as the
    /// command line's `--node` flags have them.
    pub fn native_builder(name: &str) -> PoolBuilder {
        PoolBuilder::new(name, Defaults::Native)
    }

    /// A pool of `servers` with chash's own defaults.
    ///
    /// # Errors
    /// No servers.
    pub fn from_servers(servers: Vec<ServerLine>) -> Result<PoolConfig> {
        PoolConfig::native_builder("cli").servers(servers).build()
    }

    /// Checks that this version of chash can place keys for this pool.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a hash the distribution cannot take.
    pub fn check_supported(&self) -> Result<()> {
        match self.distribution {
            Distribution::Ketama if self.hash.bits() > 32 => Err(Error::Unsupported(format!(
                "distribution ketama has a 32-bit continuum, but hash {} gives {}-bit values",
                self.hash,
                self.hash.bits()
            ))),
            Distribution::Nginx if self.hash != KeyHasher::Crc32a => Err(Error::Unsupported(format!(
                "distribution nginx hashes keys with CRC-32 (crc32a) only, not {}",
                self.hash
            ))),
            _ => Ok(()),
        }
    }

    /// Builds the placement for this pool.
    ///
    /// # Errors
    /// As [`PoolConfig::check_supported`]; `random` (which has no fixed
    /// placement); placement errors such as duplicate server ids,
    /// `vnodes: 0`, weights for an algorithm without them, or a bad
    /// `maglev_table_size`, `probes`, `balance_factor` or `anchor_capacity`.
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
            Distribution::JumpBack => AnyPlacement::Jump(Jump::with_variant(nodes, self.hash, JumpVariant::Back)?),
            Distribution::Rendezvous => AnyPlacement::Rendezvous(Rendezvous::with_hasher(nodes, self.hash)?),
            Distribution::Maglev => AnyPlacement::Maglev(
                Maglev::builder().hasher(self.hash).table_size(self.maglev_table_size).build(nodes)?,
            ),
            Distribution::Anchor if self.lines.iter().all(|l| l.state == LineState::Active) => {
                AnyPlacement::Anchor(Box::new(Anchor::with_capacity(nodes, self.hash, self.anchor_capacity)?))
            }
            Distribution::Anchor => AnyPlacement::Anchor(Box::new(self.anchor()?)),
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
        Ok(Snapshot::new(placement, self.hash_tag, twemproxy_rules))
    }
}

/// Whose defaults a builder applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Defaults {
    Twemproxy,
    Native,
}

/// Builds a [`PoolConfig`], checking every setting and combination in one
/// place; errors name the config key. Names (distribution, hash) are
/// parsed at [`build`](PoolBuilder::build).
#[derive(Clone, Debug)]
#[must_use]
pub struct PoolBuilder {
    name: String,
    defaults: Defaults,
    distribution: Option<String>,
    hash: Option<String>,
    hash_tag: Option<String>,
    vnodes: Option<u32>,
    point_label: Option<String>,
    maglev_table_size: Option<u64>,
    probes: Option<u32>,
    balance_factor: Option<f64>,
    anchor_capacity: Option<u32>,
    servers: Vec<ServerLine>,
    server_lines: Vec<String>,
    listen: Option<String>,
    timeout_ms: Option<u64>,
    backlog: Option<u32>,
    client_connections: Option<u32>,
    redis: Option<bool>,
    redis_auth: Option<String>,
    redis_db: Option<u32>,
    preconnect: Option<bool>,
    auto_eject_hosts: Option<bool>,
    server_connections: Option<u32>,
    blocking_connections: Option<u32>,
    server_retry_timeout_ms: Option<u64>,
    server_failure_limit: Option<u32>,
    tcpkeepalive: Option<bool>,
    reuseport: Option<bool>,
    warmup_secs: Option<u64>,
    warmup_ttl_secs: Option<u64>,
    replicas: Option<u32>,
    read: Option<String>,
    failover: Option<String>,
    drain: Vec<(String, u64)>,
    migrate: Option<bool>,
    migrate_method: Option<String>,
    migrate_from: Option<Vec<String>>,
    migrate_state: Option<String>,
    tls: PoolTls,
    access: RedisAccess,
    sentinel: SentinelKeys,
}

/// A setter for an optional builder field.
macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $ty:ty) => {
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.$name = Some(value.into());
            self
        }
    };
}

impl PoolBuilder {
    fn new(name: &str, defaults: Defaults) -> PoolBuilder {
        PoolBuilder {
            name: name.to_owned(),
            defaults,
            distribution: None,
            hash: None,
            hash_tag: None,
            vnodes: None,
            point_label: None,
            maglev_table_size: None,
            probes: None,
            balance_factor: None,
            anchor_capacity: None,
            servers: Vec::new(),
            server_lines: Vec::new(),
            listen: None,
            timeout_ms: None,
            backlog: None,
            client_connections: None,
            redis: None,
            redis_auth: None,
            redis_db: None,
            preconnect: None,
            auto_eject_hosts: None,
            server_connections: None,
            blocking_connections: None,
            server_retry_timeout_ms: None,
            server_failure_limit: None,
            tcpkeepalive: None,
            reuseport: None,
            warmup_secs: None,
            warmup_ttl_secs: None,
            replicas: None,
            read: None,
            failover: None,
            drain: Vec::new(),
            migrate: None,
            migrate_method: None,
            migrate_from: None,
            migrate_state: None,
            tls: PoolTls::default(),
            access: RedisAccess::default(),
            sentinel: SentinelKeys::default(),
        }
    }

    /// The pool's TLS settings (checked by [`PoolBuilder::build`]).
    pub fn tls(mut self, tls: PoolTls) -> Self {
        self.tls = tls;
        self
    }

    /// The pool's Redis credentials (checked by [`PoolBuilder::build`]).
    pub fn access(mut self, access: RedisAccess) -> Self {
        self.access = access;
        self
    }

    /// The pool's Sentinel keys (checked by [`PoolBuilder::build`]).
    pub fn sentinel(mut self, keys: SentinelKeys) -> Self {
        self.sentinel = keys;
        self
    }

    setter!(
        /// `distribution` by name (`memento` is `anchor`).
        distribution: &str
    );
    setter!(
        /// `hash` by name.
        hash: &str
    );
    setter!(
        /// `hash_tag`: two characters, e.g. `{}`.
        hash_tag: &str
    );
    setter!(
        /// `vnodes` (ring and bounded).
        vnodes: u32
    );
    setter!(
        /// `point_label` template (ring and bounded).
        point_label: &str
    );
    setter!(
        /// `maglev_table_size` (maglev).
        maglev_table_size: u64
    );
    setter!(
        /// `probes` (multiprobe).
        probes: u32
    );
    setter!(
        /// `balance_factor` (bounded).
        balance_factor: f64
    );
    setter!(
        /// `anchor_capacity` (anchor).
        anchor_capacity: u32
    );
    setter!(
        /// `listen`.
        listen: &str
    );
    setter!(
        /// `timeout` in milliseconds (0: none).
        timeout_ms: u64
    );
    setter!(
        /// `backlog`.
        backlog: u32
    );
    setter!(
        /// `client_connections` (0: no limit).
        client_connections: u32
    );
    setter!(
        /// `redis`.
        redis: bool
    );
    setter!(
        /// `redis_auth`.
        redis_auth: &str
    );
    setter!(
        /// `redis_db`.
        redis_db: u32
    );
    setter!(
        /// `preconnect`.
        preconnect: bool
    );
    setter!(
        /// `auto_eject_hosts`.
        auto_eject_hosts: bool
    );
    setter!(
        /// `server_connections`.
        server_connections: u32
    );
    setter!(
        /// `blocking_connections` (Redis pools).
        blocking_connections: u32
    );
    setter!(
        /// `server_retry_timeout` in milliseconds.
        server_retry_timeout_ms: u64
    );
    setter!(
        /// `server_failure_limit`.
        server_failure_limit: u32
    );
    setter!(
        /// `tcpkeepalive`.
        tcpkeepalive: bool
    );
    setter!(
        /// `reuseport`.
        reuseport: bool
    );
    setter!(
        /// `warmup` in seconds (0: off).
        warmup_secs: u64
    );
    setter!(
        /// `warmup_ttl` in seconds (0: no expiry).
        warmup_ttl_secs: u64
    );
    setter!(
        /// `replicas` (at least 1).
        replicas: u32
    );
    setter!(
        /// `read`: `first` or `random`.
        read: &str
    );
    setter!(
        /// `failover`: `none` or `next`.
        failover: &str
    );

    /// `drain`: removed servers' ids with the Unix time their warm-up
    /// window ends.
    pub fn drain(mut self, drain: Vec<(String, u64)>) -> Self {
        self.drain = drain;
        self
    }

    setter!(
        /// `migrate` (Redis pools).
        migrate: bool
    );
    setter!(
        /// `migrate_method`: `migrate` (the default) or `copy`.
        migrate_method: &str
    );
    setter!(
        /// `migrate_state`: `armed` or `moving` (with `migrate_from`).
        migrate_state: &str
    );

    /// `migrate_from`: the server lines before the change a migration is
    /// moving keys for.
    pub fn migrate_from(mut self, lines: Vec<String>) -> Self {
        self.migrate_from = Some(lines);
        self
    }

    /// A migration in progress, parsed already.
    pub fn migration(mut self, migration: Option<Migration>) -> Self {
        match migration {
            Some(m) => {
                self.migrate_from = Some(m.from.iter().map(ToString::to_string).collect());
                self.migrate_state = Some(m.state.name().to_owned());
            }
            None => {
                self.migrate_from = None;
                self.migrate_state = None;
            }
        }
        self
    }

    /// Servers, parsed already (lines in any state).
    pub fn servers(mut self, servers: Vec<ServerLine>) -> Self {
        self.servers.extend(servers);
        self
    }

    /// A server line `ID:WEIGHT [NAME] [STATE]`, parsed at build.
    pub fn server_line(mut self, line: &str) -> Self {
        self.server_lines.push(line.to_owned());
        self
    }

    /// The resolved pool.
    ///
    /// # Errors
    /// [`Error::UnknownDistribution`], [`Error::UnknownHash`], a bad hash
    /// tag, point label or server line, no servers, `redis_db` without
    /// `redis`, a chash key set for a distribution it does not apply to, a
    /// hash the distribution cannot take, and (for the algorithms that
    /// check them when built) weights or parameters they refuse.
    pub fn build(self) -> Result<PoolConfig> {
        let distribution: Distribution = match &self.distribution {
            Some(d) => d.parse()?,
            None if self.defaults == Defaults::Native => Distribution::Ring,
            None => Distribution::Ketama,
        };
        let hash: KeyHasher = match &self.hash {
            Some(h) => h.parse()?,
            None if self.defaults == Defaults::Native => distribution.native_hash(),
            None => distribution.twemproxy_hash(),
        };
        let hash_tag = match self.hash_tag.as_deref() {
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
        let mut lines = self.servers.clone();
        for line in &self.server_lines {
            lines.push(line.parse()?);
        }
        let servers: Vec<ServerLine> = lines.iter().filter(|l| l.state == LineState::Active).cloned().collect();
        if self.warmup_secs.is_some_and(|w| w > 0) && self.redis == Some(true) {
            return Err(Error::Config("warmup applies to memcached pools (redis is true)".into()));
        }
        let migration = match (&self.migrate_from, &self.migrate_state) {
            (None, None) => None,
            (Some(from), Some(state)) => {
                let from = from.iter().map(|l| l.parse()).collect::<Result<Vec<ServerLine>>>()?;
                if !from.iter().any(|l| l.state == LineState::Active) {
                    return Err(Error::Config("migrate_from: no server of it takes keys".into()));
                }
                Some(Migration { from, state: state.parse()? })
            }
            (Some(_), None) => return Err(Error::Config("migrate_from needs migrate_state (armed or moving)".into())),
            (None, Some(_)) => return Err(Error::Config("migrate_state needs migrate_from".into())),
        };
        let migrate_method: MigrateMethod = match &self.migrate_method {
            Some(m) => m.parse()?,
            None => MigrateMethod::default(),
        };
        if self.migrate_method.is_some() && self.redis != Some(true) {
            return Err(Error::Config("migrate_method applies to Redis pools (redis is not true)".into()));
        }
        if (self.migrate == Some(true) || migration.is_some()) && self.redis != Some(true) {
            return Err(Error::Config(
                "migrate applies to Redis pools (redis is not true): a memcached pool warms up instead (warmup)".into(),
            ));
        }
        if self.blocking_connections.is_some() && self.redis != Some(true) {
            return Err(Error::Config("blocking_connections applies to Redis pools (redis is not true)".into()));
        }
        if self.redis_db.is_some_and(|db| db > 0) && self.redis != Some(true) {
            return Err(Error::Config("redis_db is set but redis is not true".into()));
        }
        use Distribution::{Anchor as A, Bounded as B, Maglev as M, Multiprobe as P, Ring as R};
        let own_keys: [(&str, bool, &[Distribution]); 6] = [
            ("vnodes", self.vnodes.is_some(), &[R, B]),
            ("point_label", self.point_label.is_some(), &[R, B]),
            ("maglev_table_size", self.maglev_table_size.is_some(), &[M]),
            ("probes", self.probes.is_some(), &[P]),
            ("balance_factor", self.balance_factor.is_some(), &[B]),
            ("anchor_capacity", self.anchor_capacity.is_some(), &[A]),
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
        let pool = PoolConfig {
            name: self.name,
            hash,
            hash_tag,
            distribution,
            vnodes: self.vnodes.unwrap_or(DEFAULT_VNODES),
            point_label: match &self.point_label {
                Some(t) => t.parse()?,
                None => PointLabel::Native,
            },
            maglev_table_size: self.maglev_table_size.unwrap_or(DEFAULT_MAGLEV_TABLE_SIZE),
            probes: self.probes.unwrap_or(DEFAULT_PROBES),
            balance_factor: self.balance_factor.unwrap_or(DEFAULT_BALANCE_FACTOR),
            anchor_capacity: self.anchor_capacity.unwrap_or(DEFAULT_ANCHOR_CAPACITY),
            servers,
            lines,
            listen: self.listen.unwrap_or_else(|| DEFAULT_LISTEN.into()),
            timeout: self.timeout_ms.filter(|&t| t > 0).map(Duration::from_millis),
            backlog: self.backlog.unwrap_or(512),
            client_connections: self.client_connections.unwrap_or(0),
            redis: self.redis.unwrap_or(false),
            redis_auth: self.redis_auth,
            redis_db: self.redis_db.unwrap_or(0),
            preconnect: self.preconnect.unwrap_or(false),
            auto_eject_hosts: self.auto_eject_hosts.unwrap_or(false),
            server_connections: self.server_connections.unwrap_or(1).max(1),
            blocking_connections: self.blocking_connections.unwrap_or(DEFAULT_BLOCKING_CONNECTIONS),
            server_retry_timeout: Duration::from_millis(self.server_retry_timeout_ms.unwrap_or(30_000)),
            server_failure_limit: self.server_failure_limit.unwrap_or(2).max(1),
            tcpkeepalive: self.tcpkeepalive.unwrap_or(false),
            reuseport: self.reuseport.unwrap_or(false),
            warmup: Duration::from_secs(self.warmup_secs.unwrap_or(0)),
            warmup_ttl: u32::try_from(self.warmup_ttl_secs.unwrap_or(0))
                .map_err(|_| Error::Config("warmup_ttl is more than 2^32 seconds".into()))?,
            replicas: self.replicas.unwrap_or(1),
            read_random: match self.read.as_deref() {
                None | Some("first") => false,
                Some("random") => true,
                Some(other) => return Err(Error::Config(format!("read: {other:?}: use first or random"))),
            },
            failover: match self.failover.as_deref() {
                None | Some("none") => false,
                Some("next") => true,
                Some(other) => return Err(Error::Config(format!("failover: {other:?}: use none or next"))),
            },
            drain: self.drain,
            migrate: self.migrate.unwrap_or(false),
            migrate_method,
            migration,
            sentinel: self.sentinel.resolve(self.redis == Some(true))?,
            tls: self.tls,
            access: self.access,
        };
        pool.tls.check()?;
        pool.access.check()?;
        if pool.access.is_set() && !pool.redis {
            return Err(Error::Config(
                "server_user, server_password and users apply to Redis pools (redis is not true)".into(),
            ));
        }
        if pool.sentinel.is_some() && (pool.migrate || pool.migration.is_some()) {
            return Err(Error::Config(
                "migrate and sentinels together are not supported yet: a Sentinel pool's groups keep their keys \
                 through a failover; change its membership without migrate"
                    .into(),
            ));
        }
        if pool.replicas == 0 {
            return Err(Error::Config("replicas: 0: every key needs at least one copy (the default is 1)".into()));
        }
        if pool.replicas > 1 && pool.redis {
            return Err(Error::Config("replicas applies to memcached pools (redis is true)".into()));
        }
        if (pool.replicas > 1 || pool.failover) && pool.distribution == Distribution::Random {
            return Err(Error::Config("replicas and failover need a placement (distribution random has none)".into()));
        }
        if pool.read_random && pool.replicas < 2 {
            return Err(Error::Config("read: random chooses among replicas: it needs replicas: 2 or more".into()));
        }
        if !pool.warmup.is_zero() && pool.distribution == Distribution::Random {
            return Err(Error::Config("warmup needs a placement (distribution random has none)".into()));
        }
        if pool.failover && pool.auto_eject_hosts {
            return Err(Error::Config(
                "failover: next and auto_eject_hosts: true both handle failing servers; choose one (failover keeps \
                 the placement, auto_eject_hosts rebuilds it without the server)"
                    .into(),
            ));
        }
        pool.check_lines()?;
        pool.check_supported()?;
        if !matches!(
            distribution,
            Distribution::Ketama | Distribution::Modula | Distribution::Random | Distribution::Nginx | R
        ) {
            // Weights and parameters these algorithms refuse are errors of
            // the pool: build once to report them now (milliseconds at most).
            pool.snapshot()?;
        }
        Ok(pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twemproxy_defaults() {
        let p = PoolConfig::builder("a").server_line("127.0.0.1:11211:1").build().unwrap();
        assert_eq!((p.distribution, p.hash), (Distribution::Ketama, KeyHasher::Fnv1a64));
        assert_eq!((p.listen.as_str(), p.timeout, p.backlog), (DEFAULT_LISTEN, None, 512));
        assert_eq!((p.client_connections, p.redis, p.redis_db, p.preconnect), (0, false, 0, false));
        assert_eq!((p.auto_eject_hosts, p.server_connections, p.server_failure_limit), (false, 1, 2));
        assert_eq!(p.server_retry_timeout, Duration::from_secs(30));
        let n = PoolConfig::builder("n").distribution("nginx").server_line("x:1").build().unwrap();
        assert_eq!(n.hash, KeyHasher::Crc32a);
    }

    #[test]
    fn native_defaults() {
        let p = PoolConfig::native_builder("cli").server_line("a:1").build().unwrap();
        assert_eq!((p.distribution, p.hash, p.vnodes), (Distribution::Ring, KeyHasher::Xxh3, DEFAULT_VNODES));
        let k = PoolConfig::native_builder("cli").distribution("ketama").server_line("a:1").build().unwrap();
        assert_eq!(k.hash, KeyHasher::Fnv1a64);
        assert_eq!(PoolConfig::from_servers(vec!["a:1".parse().unwrap()]).unwrap().servers.len(), 1);
        assert!(PoolConfig::from_servers(Vec::new()).is_err());
    }

    #[test]
    fn combinations_are_checked() {
        let err = |b: PoolBuilder| b.build().unwrap_err().to_string();
        let base = || PoolConfig::builder("a").server_line("x:1");
        assert!(err(base().distribution("ring").probes(3)).contains("multiprobe only"));
        assert!(err(base().vnodes(10)).contains("distributions ring and bounded"));
        assert!(err(base().hash_tag("{")).contains("two characters"));
        assert!(err(base().redis_db(2)).contains("redis is not true"));
        assert!(err(PoolConfig::builder("a")).contains("no servers"));
        assert!(err(base().distribution("ketama").hash("xxh3")).contains("32-bit"));
        assert!(err(base().distribution("circle")).contains("circle"));
        assert!(err(base().server_line("y:0")).contains("weight 0"));
    }
}
