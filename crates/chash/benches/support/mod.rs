//! Peer fixtures shared by the benches: node addresses and vnodes in the
//! shapes the peer crates take, and `Hasher`s that feed them precomputed
//! hashes. Each bench uses some of them.
#![allow(dead_code)]

use std::hash::{BuildHasher, Hasher};
use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use criterion::measurement::WallTime;
use criterion::BenchmarkGroup;
use pingora_ketama::Bucket;

/// The two key sets every lookup benchmark runs on.
///
/// - `Stream`: 1,048,576 (2^20) distinct keys `k:00000000`…, each looked up
///   once per pass, in order: the way a proxy sees traffic. No branch
///   predictor or cache learns a million keys, so this is the figure users
///   get, and the one the tables lead with.
/// - `Hot`: 4,096 keys `user:10000`…`user:14095`, cycled: the best case, a
///   key set the predictor and the caches have learned.
///
/// Keys are 10 bytes, built before timing in one contiguous buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySet {
    Stream,
    Hot,
}

impl KeySet {
    pub const BOTH: [KeySet; 2] = [KeySet::Stream, KeySet::Hot];

    /// The group name segment: `stream` or `hot`.
    pub fn name(self) -> &'static str {
        match self {
            KeySet::Stream => "stream",
            KeySet::Hot => "hot",
        }
    }

    pub fn len(self) -> usize {
        match self {
            KeySet::Stream => 1 << 20,
            KeySet::Hot => 4096,
        }
    }

    /// The keys' bytes, back to back (10 bytes each).
    pub fn buffer(self) -> String {
        let mut buf = String::with_capacity(self.len() * 10);
        for i in 0..self.len() {
            match self {
                KeySet::Stream => buf.push_str(&format!("k:{i:08}")),
                KeySet::Hot => buf.push_str(&format!("user:{}", 10_000 + i)),
            }
        }
        assert_eq!(buf.len(), self.len() * 10);
        buf
    }
}

/// Key `i` of a [`KeySet::buffer`]s, as `&str` slices of it.
pub fn key_refs(buffer: &str) -> Vec<&str> {
    (0..buffer.len() / 10).map(|i| &buffer[i * 10..i * 10 + 10]).collect()
}

/// Benchmarks `f` on `inputs` (a power-of-two count), taking the next input
/// on every iteration and wrapping at the end.
pub fn bench_inputs<I: Copy, R>(g: &mut BenchmarkGroup<'_, WallTime>, name: &str, inputs: &[I], f: impl Fn(I) -> R) {
    assert!(inputs.len().is_power_of_two());
    let mask = inputs.len() - 1;
    g.bench_function(name, |b| {
        let mut i = 0usize;
        b.iter(|| {
            let x = inputs[i & mask];
            i = i.wrapping_add(1);
            f(black_box(x))
        })
    });
}

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
