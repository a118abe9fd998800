//! Consistent hashing: place keys on servers so that a change of membership
//! moves as few keys as possible, exactly the way the systems you already run
//! do it, only faster.
//!
//! ```
//! use chash::{Node, Placement, Ring};
//!
//! let ring = Ring::new(vec![
//!     Node::new("cache-a", 1)?,
//!     Node::new("cache-b", 1)?,
//!     Node::new("cache-c", 2)?, // twice the share
//! ])?;
//! let owner = ring.node_for(b"user:42").unwrap();
//! println!("user:42 lives on {}", owner.id());
//!
//! // Failover and replicas: distinct nodes in ring order, owner first.
//! let replicas: Vec<&str> = ring.candidates(b"user:42").take(2).map(|i| ring.nodes()[i].id()).collect();
//! assert_eq!(replicas[0], owner.id());
//! assert_ne!(replicas[0], replicas[1]);
//! # Ok::<(), chash::Error>(())
//! ```
//!
//! # Layout
//! - [`KeyHasher`] (`hash`): key bytes to a position on the hash space;
//!   twemproxy's names give twemproxy's exact values.
//! - [`Node`], [`ServerLine`] (`node`): what keys are placed on.
//! - [`Placement`] (`placement`): the one trait every algorithm implements;
//!   [`PointRing`] for the "first point ≥ hash" family.
//! - [`Ring`] (`ring`): the native weighted ring; its sorted points and O(1)
//!   bucket index live in `points`.
//! - [`algo`]: the other algorithms — [`Jump`](algo::Jump),
//!   [`Rendezvous`](algo::Rendezvous), [`Maglev`](algo::Maglev),
//!   [`Anchor`](algo::Anchor), [`MultiProbe`](algo::MultiProbe) and
//!   [`Bounded`](algo::Bounded) loads — one file each.
//! - [`AnyPlacement`] (`any_placement`): a built placement of any
//!   algorithm, behind the same trait, and [`AnyPointRing`] for those made
//!   of points; [`Snapshot`] (`snapshot`): a pool's routing table.
//! - [`analysis`]: exact ownership, arcs, diffs between placements, sampled load.
//! - [`config`]: twemproxy-shaped YAML files; [`PoolConfig`]
//!   (`pool_config`): a pool with every setting resolved, made by the one
//!   validating [`PoolBuilder`]; [`Distribution`] (`distribution`): the
//!   algorithms by name.
//!
//! The crate is pure: no I/O, no threads, no global state. Lookups take
//! `&self`, never allocate, and every type is `Send + Sync`.

pub mod algo;
pub mod analysis;
mod any_placement;
pub mod compat;
pub mod config;
pub mod config_edit;
mod distribution;
mod error;
pub mod hash;
mod membership;
mod node;
mod placement;
mod points;
mod pool_config;
mod ring;
mod sentinel_config;
mod snapshot;

pub use any_placement::{AnyCandidates, AnyPlacement, AnyPointRing};
pub use distribution::{Distribution, DISTRIBUTIONS};
pub use error::{Error, Result};
pub use hash::KeyHasher;
pub use membership::{Edit, LineOp};
pub use node::{LineState, Node, ServerLine};
pub use placement::{Placement, PointRing};
pub use pool_config::{
    MigrateMethod, Migration, MigrationState, PoolBuilder, PoolConfig, PoolTls, RedisAccess, RedisUser, ServerTls,
    DEFAULT_LISTEN,
};
pub use ring::{LabelPart, PointLabel, Ring, RingBuilder, RingCandidates, DEFAULT_VNODES, MAX_POINTS};
pub use sentinel_config::{
    ReadPolicy, SentinelKeys, SentinelSettings, DEFAULT_FAILOVER_HOLD, DEFAULT_REPLICA_MAX_LAG, DEFAULT_SENTINEL_POLL,
};
pub use snapshot::{Snapshot, FINGERPRINT_PROBES};

/// The README's Rust examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
