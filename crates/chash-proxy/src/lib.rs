//! chash-proxy: a sharding proxy for memcached clusters, configured like
//! twemproxy (the same YAML, the same placements), with membership changes
//! while traffic flows.
//!
//! # Layout
//! - [`memcache`]: the ASCII protocol, bytes to requests and replies.
//! - [`redis`]: RESP2 framing, the command table, Redis client connections.
//! - [`backend`]: servers and their pipelined connections, replies matched
//!   to requests in order, fail-fast while a server is unreachable.
//! - [`pool`]: a pool's members, health (ejection and retry) and the
//!   lock-free routing snapshot; membership changes swap in a new one.
//! - [`client`]: client connections, pipelining with replies in order,
//!   multi-key gets split by server and reassembled.
//! - [`admin`]: the HTTP admin/stats endpoint (JSON, Prometheus text).
//! - [`embedded`]: in-process cache shards for the no-config default.
//! - [`workers`]: one single-threaded runtime per worker thread, each with
//!   its own client and backend connections.
//! - [`proxy`]: listeners, signals (SIGHUP reload, SIGINT/SIGTERM graceful
//!   shutdown) and the whole running proxy.

use std::time::{Duration, Instant};

pub mod admin;
pub mod backend;
pub mod client;
pub mod embedded;
pub mod memcache;
pub mod pool;
pub mod proxy;
pub mod redis;
pub mod stats;
pub mod workers;

pub use pool::{Change, Pool, PoolError};
pub use proxy::{start, Proxy, ProxyOptions, Running};

/// Process-wide settings and state shared by every connection.
#[derive(Debug)]
pub struct Shared {
    /// The options the proxy was started with.
    pub options: ProxyOptions,
    /// When it started.
    pub started: Instant,
}

/// Default largest value accepted from clients (memcached's default item size).
pub const DEFAULT_MAX_VALUE: usize = 1024 * 1024;

/// Default time a graceful shutdown waits for in-flight requests.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);
