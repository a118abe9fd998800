//! Peer fixtures shared by the benches: node addresses and vnodes in the
//! shapes the peer crates take, and `Hasher`s that feed them precomputed
//! hashes. Each bench uses some of them.
#![allow(dead_code)]

use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use pingora_ketama::Bucket;

/// Points per node in the ring benchmarks (twemproxy's and pingora's 160).
pub const VNODES: u32 = 160;

/// Node `i` as an address, for pingora-ketama (which places `ip\0port`).
pub fn addr(i: usize) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 0, (i >> 8) as u8, i as u8), 11211))
}

/// `n` pingora-ketama buckets of weight 1.
pub fn ketama_buckets(n: usize) -> Vec<Bucket> {
    (0..n).map(|i| Bucket::new(addr(i), 1)).collect()
}

/// A hashring virtual node: hashring has no vnodes of its own, the usual way
/// is to add `(node, replica)` values. 8 bytes, so 16 bytes per ring entry.
#[derive(Clone, Copy, Debug, Hash, PartialEq)]
pub struct VNode {
    pub node: u32,
    pub replica: u32,
}

/// [`VNODES`] virtual nodes for each of `n` nodes.
pub fn hashring_vnodes(n: usize) -> Vec<VNode> {
    (0..n as u32).flat_map(|node| (0..VNODES).map(move |replica| VNode { node, replica })).collect()
}

/// A `Hasher` that returns the last `u64` written: lets crates that take a
/// generic `Hash` key look up a precomputed hash without hashing it again.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdentityHasher(pub u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s (and `u32`s) are written in these benchmarks; fold
        // anything else so the hasher stays total.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct IdentityBuild;

impl BuildHasher for IdentityBuild {
    type Hasher = IdentityHasher;

    fn build_hasher(&self) -> IdentityHasher {
        IdentityHasher(0)
    }
}

/// maglev hashes `(seed, key)` with its `BuildHasher`, for the node
/// permutations as well as for lookups, so an identity hasher would collapse
/// the permutations (and give every rendezvous node the same score); this
/// one folds the words in with one multiply each.
#[derive(Clone, Copy, Debug, Default)]
pub struct FoldHasher(pub u64);

impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct FoldBuild;

impl BuildHasher for FoldBuild {
    type Hasher = FoldHasher;

    fn build_hasher(&self) -> FoldHasher {
        FoldHasher(0)
    }
}
