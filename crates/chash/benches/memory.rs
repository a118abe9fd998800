//! Heap memory of chash's native ring against peer rings, 160 points per node.
//!
//! A counting global allocator records the bytes live now and the peak. Each
//! structure is built from scratch inside the measurement (its node list
//! included), so "retained" is every heap byte the finished structure owns
//! (points, node ids or addresses, indexes) and "peak" is the most that was
//! live at once while building it. Bytes per point divide by the nominal
//! point count, n × 160.
//!
//! A second table does the same for the other algorithms at N = 1000
//! (Maglev with a 100,003-entry table, the smallest prime above 100 × N).
//!
//! Run: `cargo bench -p chash-ring --bench memory`.

// A `GlobalAlloc` impl is `unsafe` by definition; this bench needs one to
// count allocations, and it only forwards to `System` (workspace lints deny
// `unsafe_code` elsewhere).
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

use chash::{Node, Ring};
use hashring::HashRing;
use pingora_ketama::{Bucket, Continuum};

mod support;
use support::{hashring_vnodes, ketama_buckets, VNODES};

/// `System`, counting the bytes live and the peak.
struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = CURRENT.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrank(bytes: usize) {
    CURRENT.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every call forwards to `System` with the caller's arguments; the
// counters are only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes retained by what `build` returns, and the peak above the starting
/// point while it ran. The value is dropped after measuring.
fn measure<T>(build: impl FnOnce() -> T) -> (usize, usize) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let value = black_box(build());
    let retained = CURRENT.load(Ordering::Relaxed) - base;
    let peak = PEAK.load(Ordering::Relaxed) - base;
    drop(value);
    (retained, peak)
}

fn main() {
    // Criterion-style flags (`--bench`) are passed by `cargo bench`; ignore them.
    println!(
        "{:<16} {:>5} {:>8} {:>12} {:>12} {:>10} {:>10}",
        "crate", "nodes", "points", "retained B", "peak B", "B/point", "peak/point"
    );
    for n in [100usize, 1000] {
        let points = n * VNODES as usize;
        let row = |name: &str, (retained, peak): (usize, usize)| {
            println!(
                "{:<16} {:>5} {:>8} {:>12} {:>12} {:>10.2} {:>10.2}",
                name,
                n,
                points,
                retained,
                peak,
                retained as f64 / points as f64,
                peak as f64 / points as f64
            );
        };

        row(
            "chash",
            measure(|| {
                let nodes: Vec<Node> = (0..n).map(|i| Node::new(format!("node-{i}"), 1).unwrap()).collect();
                Ring::builder().vnodes(VNODES).build(nodes).unwrap()
            }),
        );
        row(
            "pingora-ketama",
            measure(|| {
                let buckets: Vec<Bucket> = ketama_buckets(n);
                Continuum::new(&buckets)
            }),
        );
        row(
            "hashring",
            measure(|| {
                let mut ring = HashRing::new();
                ring.batch_add(hashring_vnodes(n));
                ring
            }),
        );
        row(
            "consistent_hash",
            measure(|| {
                consistent_hash::StaticHashRing::new(
                    consistent_hash::DefaultHash,
                    (0..n as u32).map(|i| consistent_hash::Node::new(i).quantity(VNODES as usize)),
                )
            }),
        );

        let ring = Ring::builder()
            .vnodes(VNODES)
            .build((0..n).map(|i| Node::new(format!("node-{i}"), 1).unwrap()).collect())
            .unwrap();
        println!(
            "  chash point_bytes()/point_count() = {} / {} = {:.2} B/point (points + index only)",
            ring.point_bytes(),
            ring.point_count(),
            ring.point_bytes() as f64 / ring.point_count() as f64
        );
    }
    algorithms();
}

/// Retained and peak bytes of the other algorithms at N = 1000, beside their peers.
fn algorithms() {
    use chash::algo::{Anchor, Jump, Maglev, MultiProbe, Rendezvous};
    const N: usize = 1000;
    let nodes = || (0..N).map(|i| Node::new(format!("node-{i}"), 1).unwrap()).collect::<Vec<Node>>();
    println!("\n{:<26} {:>5} {:>12} {:>12}", "algorithm", "nodes", "retained B", "peak B");
    let row = |name: &str, (retained, peak): (usize, usize)| {
        println!("{:<26} {:>5} {:>12} {:>12}", name, N, retained, peak);
    };
    row("chash maglev (100003)", measure(|| Maglev::builder().table_size(100_003).build(nodes()).unwrap()));
    row("maglev 0.2", measure(|| maglev::Maglev::new(0..N as u32)));
    let ids: Vec<u32> = (0..N as u32).collect();
    row("hash-rings maglev", measure(|| hash_rings::maglev::Ring::new(ids.iter().collect())));
    row("chash anchor (1024)", measure(|| Anchor::new(nodes()).unwrap()));
    row(
        "anchorhash (1000)",
        measure(|| {
            let a: anchorhash::AnchorHash<u64, u32, _> =
                anchorhash::Builder::default().with_resources(0..N as u32).build(N as u16);
            a
        }),
    );
    row("chash multiprobe", measure(|| MultiProbe::new(nodes()).unwrap()));
    row(
        "mpchash",
        measure(|| {
            let r = mpchash::HashRing::<u32>::new();
            for i in 0..N as u32 {
                r.add(i);
            }
            r
        }),
    );
    row("chash rendezvous", measure(|| Rendezvous::new(nodes()).unwrap()));
    row("chash jump", measure(|| Jump::new(nodes()).unwrap()));
    println!("(chash's figures include its 1000 node ids, about 40 KB; the peers hold u32 node ids)");
}
