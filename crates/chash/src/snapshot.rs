//! [`Snapshot`]: one pool's routing table: a placement and the pool's key
//! rules, immutable, shared with `arc-swap`; a change builds a new one.

use crate::any_placement::AnyPlacement;
use crate::placement::Placement;
use crate::{hash, Node, Result};

/// An immutable routing table for one pool: the placement plus the pool's key
/// rules (hash tag, and twemproxy's: an empty key, or a pool of one server,
/// hashes to 0). Share it with `arc-swap`; a change builds a new one.
#[derive(Clone, Debug)]
pub struct Snapshot {
    hash_tag: Option<[u8; 2]>,
    twemproxy_rules: bool,
    placement: AnyPlacement,
}

impl Snapshot {
    /// A snapshot of `placement` with the pool's key rules.
    pub fn new(placement: AnyPlacement, hash_tag: Option<[u8; 2]>, twemproxy_rules: bool) -> Snapshot {
        Snapshot { hash_tag, twemproxy_rules, placement }
    }
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

    /// How many of `keys` this snapshot and `other` place on different
    /// servers (by id).
    pub fn moved_keys<'k>(&self, other: &Snapshot, keys: impl IntoIterator<Item = &'k [u8]>) -> usize {
        keys.into_iter().filter(|k| self.route(k) != other.route(k)).count()
    }

    /// The share of `samples` keys `key:0`, `key:1`, ... that this snapshot
    /// and `other` place on different servers (by id).
    pub fn moved_share(&self, other: &Snapshot, samples: usize) -> f64 {
        use std::fmt::Write as _;
        let mut key = String::with_capacity(24);
        let mut moved = 0usize;
        for i in 0..samples {
            key.clear();
            let _ = write!(key, "key:{i}");
            if self.route(key.as_bytes()) != other.route(key.as_bytes()) {
                moved += 1;
            }
        }
        moved as f64 / samples.max(1) as f64
    }

    /// A fingerprint of the placement itself: the owners of
    /// [`FINGERPRINT_PROBES`] fixed keys (`chash-probe:0`, ...), hashed.
    /// Processes whose fingerprints differ place some keys differently;
    /// equal ones place the probes alike (and, with equal
    /// [versions](crate::PoolConfig::version), every key). 16 hex digits.
    pub fn fingerprint(&self) -> String {
        let mut owners = Vec::with_capacity(FINGERPRINT_PROBES * 16);
        for i in 0..FINGERPRINT_PROBES {
            owners.extend_from_slice(self.route(format!("chash-probe:{i}").as_bytes()).unwrap_or("").as_bytes());
            owners.push(b'\n');
        }
        format!("{:016x}", hash::KeyHasher::Xxh3.hash(&owners))
    }
}

/// How many keys a [fingerprint](Snapshot::fingerprint) probes.
pub const FINGERPRINT_PROBES: usize = 4096;
