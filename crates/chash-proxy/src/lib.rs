//! chash-proxy: a sharding proxy for memcached and Redis clusters,
//! configured like twemproxy (the same YAML, the same placements), with
//! membership changes while traffic flows.
//!
//! # Layout
//! Arrows point down: a file uses only what is below it.
//! - `proxy`: [`start`] and [`Running`]: a listener per pool, each accepted
//!   connection handed to a worker and to its pool's protocol; the admin
//!   endpoint and the stats port; graceful shutdown.
//! - `admin` (the HTTP admin endpoint) and `twemproxy_stats` (twemproxy's
//!   stats document): renderings of the registry's counters and status.
//! - [`etcd`] (cargo feature `etcd`, on by default): a fleet's membership
//!   in etcd, by tenant: [`etcd::follow`] (the proxy's: the stored config
//!   watched, validated and applied through the registry, the lease-kept
//!   report) and [`etcd::store`] (the CLI's compare-and-swap writes and
//!   reads, never reached from the proxy's runtime).
//! - `registry`: the running pools by name, and one typed path for every
//!   config (file, reload, watch, etcd): text, pool configs, validated,
//!   applied.
//! - `protocols`: the one place that picks a pool's protocol.
//! - [`memcache`] and [`redis`]: one folder per protocol, each owning its
//!   bytes (requests, replies, the backend framings), its client session
//!   and its descriptor (`protocol.rs`: what its servers speak, its probes,
//!   what it supports). They never import each other.
//! - `protocol`: the trait those descriptors implement.
//! - `pool`: a pool's servers, health (ejection, failover, retry), the
//!   lock-free routing state and the change engine that swaps in a new one.
//! - `conn`: client connections whatever the protocol: the read loop,
//!   replies written in request order, idle timeout, shutdown, back-pressure,
//!   the open-connection count.
//! - `backend`: server connections whatever the protocol: pipelined
//!   requests, replies matched in order, timeouts, reconnects, streaming;
//!   the `Framing` seam the protocols implement.
//! - `stats` (one list of counters, per worker thread), `workers` (one
//!   single-threaded runtime per thread), `options`.
//! - [`embedded`] (`memcache/shard.rs`): in-process cache shards speaking
//!   memcached, for the no-config default and the demo.

#![warn(unreachable_pub)]

mod admin;
mod backend;
mod conn;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod memcache;
mod options;
mod pool;
mod protocol;
mod protocols;
mod proxy;
pub mod redis;
mod registry;
mod stats;
#[cfg(test)]
mod tests;
mod tls;
mod twemproxy_stats;
mod workers;

pub use backend::{Address, Frame, Framing, Measured};
pub use memcache::shard as embedded;
pub use options::{ProxyOptions, Shared, DEFAULT_CLIENT_BUFFER};
pub use pool::{check_servers, Change, MoveSettings, Pool, PoolError};
pub use protocols::{check_migration, prepare as resolve_secrets};
pub use proxy::{start, PoolSpec, Running, StartError};
pub use registry::{Invalid, MembershipStatus, PoolReload, Registry, ReloadError};
pub use stats::{MigrationView, PoolSnapshot, ServerSnapshot};
pub use tls::{check as check_tls, TlsError};
pub use twemproxy_stats::describe as describe_stats;
