//! Lookup and build speed of `chash::algo` against peer crates, in the same
//! run on the same machine: maglev, jumphash, anchorhash, hash-rings and
//! mpchash.
//!
//! Every lookup group runs twice, on the two key sets of `support::KeySet`:
//! `stream` (1,048,576 distinct 10-byte keys, each looked up once per pass,
//! as a proxy sees traffic) and `hot` (4,096 keys cycled: the best case, a
//! set the branch predictor and caches have learned). Nodes have weight 1.
//!
//! Groups:
//! - `algo_from_u64/{stream,hot}/N`: node from a precomputed 64-bit hash. Peers that take
//!   a generic `Hash` key get the u64 through an identity `Hasher` where the
//!   crate allows one without breaking its placement (jumphash, anchorhash,
//!   hash-rings' jump); maglev's and hash-rings' rendezvous hashers fold the
//!   u64 with a multiply (an identity would collapse maglev's node
//!   permutations, and give every rendezvous node the same score, since they
//!   hash node ids with the same hasher), and
//!   `hash-rings/rendezvous/default_hasher` is that crate as `Ring::new()`
//!   builds it (SipHash-1-3 with random keys); hash-rings' maglev and mpc and
//!   mpchash hash the u64 with
//!   their own fixed hashers (SipHash, SipHash, xxh3), so their figures
//!   include that hash.
//! - `algo_with_hash/{stream,hot}/N`: from key bytes, each crate with its own key hash
//!   (chash: xxh3; jumphash: SipHash-1-3; maglev: `DefaultHasher`;
//!   anchorhash: `RandomState`; mpchash: xxh3; hash-rings: SipHash or
//!   `RandomState`).
//! - `algo_build/1000`: building for 1000 nodes; Maglev's table is 100,003
//!   entries (the smallest prime above 100 × 1000, which the maglev crate
//!   and hash-rings also choose for 1000 nodes).
//!
//! chash's jump family has two members here: `chash/jump` (Lamping &
//! Veach's loop, as jumphash and hash-rings run it) and `chash/jumpback`
//! (JumpBackHash, its own placement). `chash/anchor` has the default capacity
//! of 1024 buckets; `anchor_capacity_n` and `anchor_capacity_2n` show what a
//! capacity sized to the pool buys; the anchorhash peer is built at the
//! same three capacities (`anchorhash` is capacity N).
//!
//! Run: `cargo bench -p chash-ring --bench algos`.

use std::hint::black_box;
use std::time::Duration;

use chash::algo::{
    mix2, next_prime, reduce, Anchor, Bounded, Jump, Maglev, MultiProbe, Rendezvous, DEFAULT_ANCHOR_CAPACITY,
};
use chash::{KeyHasher, Node, Placement, Ring};
use criterion::{BenchmarkGroup, Criterion, SamplingMode};

mod support;
use support::{bench_inputs, key_refs, FoldBuild, IdentityBuild, IdentityHasher, KeySet};

const SIZES: [usize; 3] = [10, 100, 1000];

fn nodes(n: usize) -> Vec<Node> {
    (0..n).map(|i| Node::new(format!("node-{i}"), 1).unwrap()).collect()
}

/// The table size chash uses for `n` nodes: 65,537, or the smallest prime
/// above 100 × n when that is larger.
fn maglev_size(n: usize) -> u64 {
    next_prime(100 * n as u64 + 1).max(65_537)
}

fn anchor_capacity(n: usize) -> u32 {
    DEFAULT_ANCHOR_CAPACITY.max(n as u32)
}

type Group<'a> = BenchmarkGroup<'a, criterion::measurement::WallTime>;

fn from_u64(c: &mut Criterion) {
    for set in KeySet::BOTH {
        let buffer = set.buffer();
        let hashes: Vec<u64> = key_refs(&buffer).iter().map(|k| KeyHasher::Xxh3.hash(k.as_bytes())).collect();
        for n in SIZES {
            let mut g = c.benchmark_group(format!("algo_from_u64/{}/{n}", set.name()));
            g.measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300));
            from_u64_group(&mut g, n, &hashes);
            g.finish();
        }
    }
}

fn from_u64_group(g: &mut Group<'_>, n: usize, hashes: &[u64]) {
    let jump = Jump::new(nodes(n)).unwrap();
    bench_inputs(g, "chash/jump", hashes, |h| jump.locate_hash(h));
    let jump_back = Jump::jump_back(nodes(n)).unwrap();
    bench_inputs(g, "chash/jumpback", hashes, |h| jump_back.locate_hash(h));
    let jh = jumphash::CustomJumpHasher::new(IdentityHasher::default());
    bench_inputs(g, "jumphash", hashes, |h| jh.slot(&h, n as u32));
    let hr_jump = hash_rings::jump::Ring::with_hasher(IdentityBuild, n as u32);
    bench_inputs(g, "hash-rings/jump", hashes, |h| hr_jump.get_node(&h));

    let maglev = Maglev::builder().table_size(maglev_size(n)).build(nodes(n)).unwrap();
    bench_inputs(g, "chash/maglev", hashes, |h| maglev.locate_hash(h));
    let peer = maglev::Maglev::with_hasher(0..n as u32, FoldBuild);
    bench_inputs(g, "maglev", hashes, |h| maglev::ConsistentHasher::get(&peer, &h).copied());
    drop(peer);
    let ids: Vec<u32> = (0..n as u32).collect();
    let hr_maglev = hash_rings::maglev::Ring::new(ids.iter().collect());
    bench_inputs(g, "hash-rings/maglev", hashes, |h| *hr_maglev.get_node(&h));
    drop(hr_maglev);

    let anchor = Anchor::with_capacity(nodes(n), KeyHasher::Xxh3, anchor_capacity(n)).unwrap();
    bench_inputs(g, "chash/anchor", hashes, |h| anchor.locate_hash(h));
    // The floor under anchor at capacity C on a pool built fresh: the
    // arithmetic of its re-draws alone (the paper's chain of draws, with
    // chash's pinned mix), without the bucket table; it gives the same
    // bucket (asserted), so the difference is what the table's loads cost.
    let capacity = u64::from(anchor_capacity(n));
    let chain = |h: u64| {
        let (mut b, mut draws) = (reduce(h, capacity), 0u32);
        while b >= n as u64 {
            b = reduce(mix2(h, b), b);
            draws += 1;
        }
        (b as usize, draws)
    };
    let draws: u64 = hashes.iter().map(|&h| u64::from(chain(h).1)).sum();
    assert!(hashes.iter().take(10_000).all(|&h| Some(chain(h).0) == anchor.locate_hash(h)));
    eprintln!("anchor capacity {capacity}, {n} nodes: {:.2} re-draws per lookup", draws as f64 / hashes.len() as f64);
    bench_inputs(g, "floor/anchor_draws_without_table", hashes, |h| chain(h).0);
    for (name, capacity) in [("chash/anchor_capacity_n", n), ("chash/anchor_capacity_2n", 2 * n)] {
        let sized = Anchor::with_capacity(nodes(n), KeyHasher::Xxh3, capacity as u32).unwrap();
        bench_inputs(g, name, hashes, |h| sized.locate_hash(h));
    }
    // The peer at chash's three capacities: N (`anchorhash`, as before),
    // 2N and 1024 (chash's default), so each chash row has its like.
    for (name, capacity) in [("anchorhash", n), ("anchorhash_capacity_2n", 2 * n), ("anchorhash_capacity_1024", 1024)] {
        let peer: anchorhash::AnchorHash<u64, u32, IdentityBuild> =
            anchorhash::Builder::with_hasher(IdentityBuild).with_resources(0..n as u32).build(capacity as u16);
        bench_inputs(g, name, hashes, |h| peer.get_resource(h).copied());
    }

    let mp = MultiProbe::new(nodes(n)).unwrap();
    bench_inputs(g, "chash/multiprobe", hashes, |h| mp.locate_hash(h));
    let peer = mpchash::HashRing::<u32>::new();
    for i in 0..n as u32 {
        peer.add(i);
    }
    bench_inputs(g, "mpchash", hashes, |h| peer.node(&h).map(|t| *t.node()));
    drop(peer);
    let mut hr_mpc = hash_rings::mpc::Ring::new(21);
    for id in &ids {
        hr_mpc.insert_node(id);
    }
    bench_inputs(g, "hash-rings/mpc", hashes, |h| *hr_mpc.get_node(&h));
    drop(hr_mpc);

    // Bounded loads: one acquisition and its release per lookup, the
    // proxy's pattern for a request.
    let bounded = Bounded::new(Ring::new(nodes(n)).unwrap(), 1.25).unwrap();
    bench_inputs(g, "chash/bounded_acquire_release", hashes, |h| {
        let i = bounded.acquire_hash(h);
        if let Some(i) = i {
            bounded.release(i);
        }
        i
    });
    let ring = Ring::new(nodes(n)).unwrap();
    bench_inputs(g, "chash/ring", hashes, |h| ring.locate_hash(h));

    let rv = Rendezvous::new(nodes(n)).unwrap();
    bench_inputs(g, "chash/rendezvous", hashes, |h| rv.locate_hash(h));
    // hash-rings combines (node, key) hashes with its hasher: an identity
    // hasher would give every node the same score, so it gets FoldBuild.
    let mut hr_rv = hash_rings::rendezvous::Ring::with_hasher(FoldBuild);
    for id in &ids {
        hr_rv.insert_node(id, 1);
    }
    bench_inputs(g, "hash-rings/rendezvous", hashes, |h| *hr_rv.get_node(&h));
    drop(hr_rv);
    // The same crate as its users get it: `Ring::new()`, SipHash-1-3 with
    // random keys (RandomState), whose scores mix properly.
    let mut hr_rv = hash_rings::rendezvous::Ring::new();
    for id in &ids {
        hr_rv.insert_node(id, 1);
    }
    bench_inputs(g, "hash-rings/rendezvous/default_hasher", hashes, |h| *hr_rv.get_node(&h));
    drop(hr_rv);
    let weighted = Rendezvous::new(nodes(n)).unwrap().with_weight("node-0", 2).unwrap();
    bench_inputs(g, "chash/rendezvous_weighted", hashes, |h| weighted.locate_hash(h));
    let mut hr_wrv = hash_rings::weighted_rendezvous::Ring::with_hasher(FoldBuild);
    for id in &ids {
        hr_wrv.insert_node(id, if *id == 0 { 2.0 } else { 1.0 });
    }
    bench_inputs(g, "hash-rings/weighted_rendezvous", hashes, |h| *hr_wrv.get_node(&h));
}

fn with_hash(c: &mut Criterion) {
    for set in KeySet::BOTH {
        let buffer = set.buffer();
        let keys = key_refs(&buffer);
        for n in SIZES {
            let mut g = c.benchmark_group(format!("algo_with_hash/{}/{n}", set.name()));
            g.measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300));

            let jump = Jump::new(nodes(n)).unwrap();
            bench_inputs(&mut g, "chash/jump", &keys, |k| jump.locate(k.as_bytes()));
            let jump_back = Jump::jump_back(nodes(n)).unwrap();
            bench_inputs(&mut g, "chash/jumpback", &keys, |k| jump_back.locate(k.as_bytes()));
            let jh = jumphash::JumpHasher::new_with_keys(1, 2);
            bench_inputs(&mut g, "jumphash", &keys, |k| jh.slot(&k, n as u32));

            let maglev = Maglev::builder().table_size(maglev_size(n)).build(nodes(n)).unwrap();
            bench_inputs(&mut g, "chash/maglev", &keys, |k| maglev.locate(k.as_bytes()));
            let peer = maglev::Maglev::new(0..n as u32);
            bench_inputs(&mut g, "maglev", &keys, |k| maglev::ConsistentHasher::get(&peer, &k).copied());
            drop(peer);

            let anchor = Anchor::with_capacity(nodes(n), KeyHasher::Xxh3, anchor_capacity(n)).unwrap();
            bench_inputs(&mut g, "chash/anchor", &keys, |k| anchor.locate(k.as_bytes()));
            for (name, capacity) in [("chash/anchor_capacity_n", n), ("chash/anchor_capacity_2n", 2 * n)] {
                let sized = Anchor::with_capacity(nodes(n), KeyHasher::Xxh3, capacity as u32).unwrap();
                bench_inputs(&mut g, name, &keys, |k| sized.locate(k.as_bytes()));
            }
            let peer: anchorhash::AnchorHash<&str, u32, _> =
                anchorhash::Builder::default().with_resources(0..n as u32).build(n as u16);
            bench_inputs(&mut g, "anchorhash", &keys, |k| peer.get_resource(k).copied());
            drop(peer);

            let mp = MultiProbe::new(nodes(n)).unwrap();
            bench_inputs(&mut g, "chash/multiprobe", &keys, |k| mp.locate(k.as_bytes()));
            let peer = mpchash::HashRing::<u32>::new();
            for i in 0..n as u32 {
                peer.add(i);
            }
            bench_inputs(&mut g, "mpchash", &keys, |k| peer.node(&k).map(|t| *t.node()));
            drop(peer);

            let rv = Rendezvous::new(nodes(n)).unwrap();
            bench_inputs(&mut g, "chash/rendezvous", &keys, |k| rv.locate(k.as_bytes()));
            g.finish();
        }
    }
}

fn build(c: &mut Criterion) {
    const N: usize = 1000;
    let mut g = c.benchmark_group(format!("algo_build/{N}"));
    g.sampling_mode(SamplingMode::Flat).sample_size(20).measurement_time(Duration::from_secs(3));
    let size = maglev_size(N);
    assert_eq!(size, 100_003);
    g.bench_function("chash/maglev", |b| {
        b.iter(|| Maglev::builder().table_size(size).build(black_box(nodes(N))).unwrap())
    });
    g.bench_function("maglev", |b| b.iter(|| maglev::Maglev::new(black_box(0..N as u32))));
    let ids: Vec<u32> = (0..N as u32).collect();
    g.bench_function("hash-rings/maglev", |b| {
        b.iter(|| hash_rings::maglev::Ring::new(black_box(ids.iter().collect())))
    });
    g.bench_function("chash/anchor", |b| b.iter(|| Anchor::new(black_box(nodes(N))).unwrap()));
    g.bench_function("anchorhash", |b| {
        b.iter(|| {
            let a: anchorhash::AnchorHash<u64, u32, _> =
                anchorhash::Builder::default().with_resources(black_box(0..N as u32)).build(N as u16);
            a
        })
    });
    g.bench_function("chash/multiprobe", |b| b.iter(|| MultiProbe::new(black_box(nodes(N))).unwrap()));
    g.bench_function("mpchash", |b| {
        b.iter(|| {
            let ring = mpchash::HashRing::<u32>::new();
            for i in 0..N as u32 {
                ring.add(black_box(i));
            }
            ring
        })
    });
    g.bench_function("chash/rendezvous", |b| b.iter(|| Rendezvous::new(black_box(nodes(N))).unwrap()));
    g.bench_function("chash/jump", |b| b.iter(|| Jump::new(black_box(nodes(N))).unwrap()));
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    from_u64(&mut c);
    with_hash(&mut c);
    build(&mut c);
    c.final_summary();
}
