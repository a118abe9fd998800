//! Lookup, build and add-node speed of chash's native [`Ring`] against peer
//! crates, measured in the same run on the same machine.
//!
//! Every ring has 160 points per node (weight 1). Every lookup group runs
//! twice, on the two key sets of `support::KeySet`: `stream` (1,048,576
//! distinct 10-byte keys, each looked up once per pass, in order: the way a
//! proxy sees traffic; no branch predictor learns them) and `hot` (4,096 keys
//! cycled: the best case). Keys are built before timing in one contiguous
//! buffer.
//!
//! Groups:
//! - `lookup_with_hash/{stream,hot}/N`: key bytes to node, key hashing included, each
//!   crate with its own key hash (chash: xxh3; hashring: SipHash-2-4;
//!   pingora-ketama: CRC32; consistent_hash: SipHash-1-3).
//! - `lookup_from_u64/{stream,hot}/N`: from a precomputed 64-bit hash. Peers that only
//!   take a generic `Hash` key are fed through an identity `Hasher`
//!   (documented APIs: `with_hasher`, a custom `RingHash`); jumphash,
//!   anchorhash and maglev are not point rings and are there as reference
//!   points. pingora-ketama is absent: its lookups hash the key bytes with
//!   CRC32 internally and there is no public call taking a hash.
//!   `floor/one_random_load` is the floor under any lookup into the points:
//!   one load from a random place of an array as large as chash's point
//!   positions, on the same stream.
//! - `hash_only/{stream,hot}`: the key hash alone, the floor under every
//!   lookup with hashing.
//! - `build/1000`: a ring of 1000 nodes (160,000 points) from scratch.
//! - `add_node/1000`: the 1001st node.
//!
//! Run: `cargo bench -p chash-ring --bench ring`.

use std::hash::{Hash, Hasher};
use std::hint::black_box;
use std::time::Duration;

use chash::{KeyHasher, Node, Placement, Ring};
use consistent_hash::{RingHash, StaticHashRing};
use criterion::{BatchSize, Criterion, SamplingMode};
use hashring::HashRing;
use pingora_ketama::Continuum;

mod support;
use support::{
    bench_inputs, hashring_vnodes, ketama_buckets, key_refs, FoldBuild, IdentityBuild, IdentityHasher, KeySet, VNode,
    VNODES,
};

const SIZES: [usize; 3] = [10, 100, 1000];

fn chash_nodes(n: usize) -> Vec<Node> {
    (0..n).map(|i| Node::new(format!("node-{i}"), 1).unwrap()).collect()
}

fn chash_ring(n: usize) -> Ring {
    Ring::builder().vnodes(VNODES).build(chash_nodes(n)).unwrap()
}

fn hashring_ring(n: usize) -> HashRing<VNode> {
    let mut ring = HashRing::new();
    ring.batch_add(hashring_vnodes(n));
    ring
}

fn consistent_hash_nodes(n: usize) -> impl Iterator<Item = consistent_hash::Node<u32, ()>> {
    (0..n as u32).map(|i| consistent_hash::Node::new(i).quantity(VNODES as usize))
}

/// A hashring point whose position was computed beforehand (xxh3 of a
/// label); with [`IdentityBuild`] hashring puts it exactly there.
#[derive(Clone, Copy, Debug, PartialEq)]
struct PlacedVNode {
    position: u64,
    node: u32,
}

impl Hash for PlacedVNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.position);
    }
}

fn placed_hashring(n: usize) -> HashRing<PlacedVNode, IdentityBuild> {
    let mut ring = HashRing::with_hasher(IdentityBuild);
    ring.batch_add(
        (0..n as u32)
            .flat_map(|node| {
                (0..VNODES).map(move |r| PlacedVNode {
                    position: KeyHasher::Xxh3.hash(format!("node-{node}-{r}").as_bytes()),
                    node,
                })
            })
            .collect(),
    );
    ring
}

/// consistent_hash's `RingHash` for precomputed keys: points are hashed with
/// xxh3, a `u64` key is taken as it is.
#[derive(Clone, Copy, Debug)]
struct PrehashedRingHash;

impl RingHash for PrehashedRingHash {
    fn hash_item<T: Hash>(&self, item: &T) -> u64 {
        let mut h = IdentityHasher::default();
        item.hash(&mut h);
        h.finish()
    }

    fn hash_vnode<K: Hash>(&self, node_key: &K, vnode_seq: usize) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        (node_key, vnode_seq).hash(&mut h);
        h.finish()
    }
}

fn lookup_with_hash(c: &mut Criterion) {
    for set in KeySet::BOTH {
        let buffer = set.buffer();
        let keys = key_refs(&buffer);
        for n in SIZES {
            let mut group = c.benchmark_group(format!("lookup_with_hash/{}/{n}", set.name()));

            let ring = chash_ring(n);
            assert!(keys.iter().all(|k| ring.locate(k.as_bytes()).is_some()));
            bench_inputs(&mut group, "chash", &keys, |k| ring.locate(k.as_bytes()));
            drop(ring);

            let ring = hashring_ring(n);
            assert!(ring.get(&keys[0]).is_some());
            bench_inputs(&mut group, "hashring", &keys, |k| ring.get(&k).map(|v| v.node));
            drop(ring);

            let ring = Continuum::new(&ketama_buckets(n));
            assert!(ring.node(keys[0].as_bytes()).is_some());
            bench_inputs(&mut group, "pingora-ketama", &keys, |k| ring.node(k.as_bytes()));
            drop(ring);

            // Its only lookup is the candidate iterator; the first `next()`
            // inserts into a splay-tree set, so each lookup allocates once.
            let ring = StaticHashRing::new(consistent_hash::DefaultHash, consistent_hash_nodes(n));
            assert_eq!(ring.len(), n * VNODES as usize);
            bench_inputs(&mut group, "consistent_hash", &keys, |k| {
                ring.calc_candidates(&k).next().map(|node| node.key)
            });
            drop(ring);

            group.finish();
        }
    }
}

fn lookup_from_u64(c: &mut Criterion) {
    for set in KeySet::BOTH {
        let buffer = set.buffer();
        let hashes: Vec<u64> = key_refs(&buffer).iter().map(|k| KeyHasher::Xxh3.hash(k.as_bytes())).collect();
        for n in SIZES {
            let mut group = c.benchmark_group(format!("lookup_from_u64/{}/{n}", set.name()));

            let ring = chash_ring(n);
            bench_inputs(&mut group, "chash", &hashes, |h| ring.locate_hash(h));
            drop(ring);

            // hashring has no call taking a hash; with `with_hasher` and an
            // identity hasher its `get(&u64)` searches for the u64 as it is.
            let ring = placed_hashring(n);
            assert_eq!(ring.len(), n * VNODES as usize);
            bench_inputs(&mut group, "hashring/identity_hasher", &hashes, |h| ring.get(&h).map(|v| v.node));
            drop(ring);

            // Same for consistent_hash through a custom `RingHash` (points by
            // xxh3); the lookup still allocates once (see `lookup_with_hash`).
            let ring = StaticHashRing::new(PrehashedRingHash, consistent_hash_nodes(n));
            bench_inputs(&mut group, "consistent_hash/identity_hasher", &hashes, |h| {
                ring.calc_candidates(&h).next().map(|node| node.key)
            });
            drop(ring);

            // pingora-ketama: skipped, `Continuum::node`/`node_idx` take key
            // bytes and CRC32 them; the ring search on a u32 is private.

            // The floor under any lookup into the points: one load from a
            // random position of an array the size of chash's points
            // (8 bytes each), with the same stream of hashes.
            let floor: Vec<u64> = (0..(n * VNODES as usize) as u64).collect();
            let len = floor.len() as u128;
            bench_inputs(&mut group, "floor/one_random_load", &hashes, |h| {
                floor[((u128::from(h) * len) >> 64) as usize]
            });
            drop(floor);

            // Reference points, not point rings:
            // jump consistent hash (no table at all, O(ln n) loop) on the u64.
            let jump = jumphash::CustomJumpHasher::new(IdentityHasher::default());
            let slots = n as u32;
            assert!(jump.slot(&hashes[0], slots) < slots);
            bench_inputs(&mut group, "jumphash/slot", &hashes, |h| jump.slot(&h, slots));

            // AnchorHash with every bucket working (capacity = n); uses the low
            // 32 bits of the hash, then maps bucket to resource in a HashMap.
            let anchor: anchorhash::AnchorHash<u64, u32, IdentityBuild> =
                anchorhash::Builder::with_hasher(IdentityBuild).with_resources(0..n as u32).build(n as u16);
            assert!(anchor.get_resource(hashes[0]).is_some());
            bench_inputs(&mut group, "anchorhash/get_resource", &hashes, |h| anchor.get_resource(h).copied());
            drop(anchor);

            // Maglev with its default table size (smallest prime >= 100 n); its
            // hasher folds (seed, u64) with two multiplies, then `% table size`.
            let maglev = maglev::Maglev::with_hasher(0..n as u32, FoldBuild);
            assert!(maglev::ConsistentHasher::get(&maglev, &hashes[0]).is_some());
            bench_inputs(&mut group, "maglev/get", &hashes, |h| maglev::ConsistentHasher::get(&maglev, &h).copied());
            drop(maglev);

            group.finish();
        }
    }
}

fn hash_only(c: &mut Criterion) {
    for set in KeySet::BOTH {
        let buffer = set.buffer();
        let keys = key_refs(&buffer);
        let mut group = c.benchmark_group(format!("hash_only/{}", set.name()));
        bench_inputs(&mut group, "xxh3", &keys, |k| KeyHasher::Xxh3.hash(k.as_bytes()));
        // pingora-ketama's key hash, for scale.
        bench_inputs(&mut group, "crc32fast", &keys, |k| crc32fast::hash(k.as_bytes()));
        group.finish();
    }
}

/// Settings for the groups whose iterations take milliseconds.
fn slow_group<'a>(c: &'a mut Criterion, name: &str) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut group = c.benchmark_group(name);
    group.sampling_mode(SamplingMode::Flat).sample_size(30).measurement_time(Duration::from_secs(3));
    group
}

fn build(c: &mut Criterion) {
    const N: usize = 1000;
    let mut group = slow_group(c, &format!("build/{N}"));

    let nodes = chash_nodes(N);
    group.bench_function("chash", |b| {
        b.iter_batched(
            || nodes.clone(),
            |nodes| Ring::builder().vnodes(VNODES).build(black_box(nodes)).unwrap(),
            BatchSize::LargeInput,
        )
    });

    let buckets = ketama_buckets(N);
    group.bench_function("pingora-ketama", |b| b.iter(|| Continuum::new(black_box(&buckets))));

    // One `batch_add` (one sort): hashring's `add` re-sorts the whole ring
    // on every call, which is far slower for 160,000 vnodes.
    let vnodes = hashring_vnodes(N);
    group.bench_function("hashring/batch_add", |b| {
        b.iter_batched(
            || vnodes.clone(),
            |vnodes| {
                let mut ring = HashRing::new();
                ring.batch_add(black_box(vnodes));
                ring
            },
            BatchSize::LargeInput,
        )
    });

    group.finish();
}

fn add_node(c: &mut Criterion) {
    const N: usize = 1000;
    let mut group = slow_group(c, &format!("add_node/{N}"));

    // A new snapshot; the old ring stays usable.
    let ring = chash_ring(N);
    group.bench_function("chash/with_node", |b| {
        b.iter(|| black_box(&ring).with_node(Node::new(format!("node-{N}"), 1).unwrap()).unwrap())
    });
    drop(ring);

    // hashring mutates in place: the clone is made outside the timing for
    // `batch_add_in_place`, inside it for the snapshot-equivalent.
    let ring = hashring_ring(N);
    let added: Vec<VNode> = (0..VNODES).map(|replica| VNode { node: N as u32, replica }).collect();
    group.bench_function("hashring/batch_add_in_place", |b| {
        b.iter_batched(
            || (ring.clone(), added.clone()),
            |(mut ring, added)| {
                ring.batch_add(black_box(added));
                ring
            },
            BatchSize::LargeInput,
        )
    });
    group.bench_function("hashring/clone_then_batch_add", |b| {
        b.iter_batched(
            || added.clone(),
            |added| {
                let mut ring = black_box(&ring).clone();
                ring.batch_add(added);
                ring
            },
            BatchSize::LargeInput,
        )
    });
    drop(ring);

    // No incremental API: a new Continuum over all 1001 buckets.
    let buckets = ketama_buckets(N + 1);
    group.bench_function("pingora-ketama/rebuild", |b| b.iter(|| Continuum::new(black_box(&buckets))));

    group.finish();
}

fn main() {
    let mut c = Criterion::default()
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .configure_from_args();
    lookup_with_hash(&mut c);
    lookup_from_u64(&mut c);
    hash_only(&mut c);
    build(&mut c);
    add_node(&mut c);
    c.final_summary();
}
