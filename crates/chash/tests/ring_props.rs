//! Property tests of the native ring against a naive twin and against the
//! invariants consistent hashing promises.

use chash::analysis::{diff, ownership};
use chash::{KeyHasher, Node, Placement, Ring};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

/// Fixed seed, no persistence: the same cases on every run and machine.
fn config(cases: u32) -> Config {
    Config { cases, rng_seed: RngSeed::Fixed(0x00c4_a54e), failure_persistence: None, ..Config::default() }
}

/// The ring as the documentation defines it, computed the slow way: every
/// point from its label, sorted by (hash, id), first point >= h, wrapping.
struct NaiveRing {
    points: Vec<(u64, String)>,
}

impl NaiveRing {
    fn new(nodes: &[(String, u32)], vnodes: u32, hasher: KeyHasher) -> NaiveRing {
        let mut points = Vec::new();
        for (id, w) in nodes {
            for i in 0..w * vnodes {
                let mut label = (id.len() as u32).to_le_bytes().to_vec();
                label.extend_from_slice(id.as_bytes());
                label.extend_from_slice(&i.to_le_bytes());
                // XXH3 of the label, scaled to the key hash's space.
                let h = xxhash_rust::xxh3::xxh3_64(&label);
                let pos = if hasher.bits() == 64 { h } else { h >> (64 - hasher.bits()) };
                points.push((pos, id.clone()));
            }
        }
        points.sort();
        NaiveRing { points }
    }

    fn locate(&self, h: u64) -> Option<&str> {
        let p = self.points.iter().find(|p| p.0 >= h).or(self.points.first())?;
        Some(&p.1)
    }
}

fn hasher() -> impl Strategy<Value = KeyHasher> {
    prop::sample::select(KeyHasher::ALL.to_vec())
}

/// 0..8 nodes with short ids (so ids like "a1"/"a" and ties occur), weights 1..4.
fn node_specs(max: usize) -> impl Strategy<Value = Vec<(String, u32)>> {
    prop::collection::btree_map("[a-c][0-9]?", 1u32..4, 0..max)
        .prop_map(|m| m.into_iter().collect::<Vec<_>>())
        .prop_shuffle()
}

fn build(specs: &[(String, u32)], vnodes: u32, hasher: KeyHasher) -> Ring {
    let nodes = specs.iter().map(|(id, w)| Node::new(id.clone(), *w).unwrap()).collect();
    Ring::builder().hasher(hasher).vnodes(vnodes).build(nodes).unwrap()
}

fn id_at(ring: &Ring, h: u64) -> Option<&str> {
    ring.locate_hash(h).map(|i| ring.nodes()[i].id())
}

/// Probe hashes: random ones, every point, and the values beside each point.
fn probes(ring: &Ring, random: &[u64]) -> Vec<u64> {
    let mut v = random.to_vec();
    for (h, _) in ring.points() {
        v.extend([h, h.wrapping_sub(1), h.wrapping_add(1)]);
    }
    v.extend([0, u64::MAX]);
    v
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn lookup_equals_naive_scan(
        specs in node_specs(8), vnodes in 1u32..24, hasher in hasher(),
        random in prop::collection::vec(any::<u64>(), 64),
    ) {
        let ring = build(&specs, vnodes, hasher);
        let naive = NaiveRing::new(&specs, vnodes, hasher);
        let random: Vec<u64> = random.iter().map(|h| if hasher.bits() == 64 { *h } else { h % (1 << hasher.bits()) }).collect();
        for h in probes(&ring, &random) {
            prop_assert_eq!(id_at(&ring, h), naive.locate(h), "h={}", h);
        }
    }

    /// Crowded 15-bit space: many points share a position, so the tie order
    /// (by node id) decides owners.
    #[test]
    fn lookup_equals_naive_scan_with_ties(specs in node_specs(8), vnodes in 150u32..400) {
        let ring = build(&specs, vnodes, KeyHasher::Crc32);
        let naive = NaiveRing::new(&specs, vnodes, KeyHasher::Crc32);
        for h in probes(&ring, &[]) {
            prop_assert_eq!(id_at(&ring, h), naive.locate(h), "h={}", h);
        }
    }

    #[test]
    fn merged_changes_equal_fresh_builds(
        specs in node_specs(7), extra in 1u32..5, vnodes in 1u32..20, hasher in hasher(),
    ) {
        prop_assume!(!specs.is_empty());
        let (head, tail) = specs.split_at(specs.len() - 1);
        let ring = build(head, vnodes, hasher);
        let added = ring.with_node(Node::new(tail[0].0.clone(), tail[0].1).unwrap()).unwrap();
        let fresh = build(&specs, vnodes, hasher);
        let ids = |r: &Ring| r.points().map(|(h, o)| (h, r.nodes()[o].id().to_owned())).collect::<Vec<_>>();
        prop_assert_eq!(ids(&added), ids(&fresh));
        let removed = fresh.without_node(&tail[0].0).unwrap();
        prop_assert_eq!(ids(&removed), ids(&ring));
        let (id, w) = &specs[0];
        let reweighted = fresh.with_weight(id, w + extra).unwrap();
        let mut bumped = specs.clone();
        bumped[0].1 += extra;
        prop_assert_eq!(ids(&reweighted), ids(&build(&bumped, vnodes, hasher)));
        prop_assert_eq!(ids(&reweighted.with_weight(id, *w).unwrap()), ids(&fresh));
        // The bucket index of a changed ring is updated, not rebuilt: lookups
        // must agree with the fresh builds everywhere.
        let bumped_ring = build(&bumped, vnodes, hasher);
        for (changed, reference) in [(&added, &fresh), (&removed, &ring), (&reweighted, &bumped_ring)] {
            for h in probes(reference, &[]).into_iter().chain(probes(changed, &[])) {
                prop_assert_eq!(id_at(changed, h), id_at(reference, h), "h={}", h);
            }
        }
    }

    #[test]
    fn candidates_are_distinct_and_start_with_the_owner(
        specs in node_specs(8), vnodes in 1u32..10, h in any::<u64>(),
    ) {
        let ring = build(&specs, vnodes, KeyHasher::Xxh3);
        let c: Vec<usize> = ring.candidates_hash(h).collect();
        prop_assert_eq!(c.first().copied(), ring.locate_hash(h));
        let mut sorted = c.clone();
        sorted.sort_unstable();
        sorted.dedup();
        prop_assert_eq!(sorted.len(), c.len());
        prop_assert_eq!(c.len(), specs.len());
    }
}

/// Keys `key:0..n`.
fn keys(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("key:{i}").into_bytes()).collect()
}

fn owners(ring: &Ring, keys: &[Vec<u8>]) -> Vec<String> {
    keys.iter().map(|k| ring.node_for(k).unwrap().id().to_owned()).collect()
}

proptest! {
    #![proptest_config(config(40))]

    #[test]
    fn changes_move_only_the_changed_nodes_keys(
        specs in node_specs(8), vnodes in 1u32..40, new_weight in 1u32..6,
    ) {
        prop_assume!(specs.len() >= 2);
        let ring = build(&specs, vnodes, KeyHasher::Xxh3);
        let ks = keys(2000);
        let before = owners(&ring, &ks);

        let added = ring.with_node(Node::new("zz", 2).unwrap()).unwrap();
        for (b, a) in before.iter().zip(owners(&added, &ks)) {
            prop_assert!(*b == a || a == "zz", "{} -> {}", b, a);
        }
        let gone = &specs[0].0;
        let removed = ring.without_node(gone).unwrap();
        for (b, a) in before.iter().zip(owners(&removed, &ks)) {
            prop_assert!(*b == a || b == gone, "{} -> {}", b, a);
        }
        let changed = &specs[1].0;
        let reweighted = ring.with_weight(changed, new_weight).unwrap();
        for (b, a) in before.iter().zip(owners(&reweighted, &ks)) {
            prop_assert!(*b == a || b == changed || a == *changed, "{} -> {}", b, a);
        }
    }
}

/// In a 15-bit space every hash value can be enumerated: ownership and diff
/// must agree exactly with counting.
#[test]
fn ownership_and_diff_are_exact_in_a_small_space() {
    let hasher = KeyHasher::Crc32;
    let specs: Vec<(String, u32)> = vec![("a".into(), 1), ("b".into(), 3), ("c".into(), 2)];
    let old = build(&specs, 20, hasher);
    let new = old.without_node("b").unwrap().with_node(Node::new("d", 2).unwrap()).unwrap();
    let space = 1u64 << hasher.bits();
    let mut counts = [0u64; 3];
    let mut moved = std::collections::BTreeMap::<(String, String), u64>::new();
    for h in 0..space {
        counts[old.locate_hash(h).unwrap()] += 1;
        let (f, t) = (id_at(&old, h).unwrap(), id_at(&new, h).unwrap());
        if f != t {
            *moved.entry((f.to_owned(), t.to_owned())).or_default() += 1;
        }
    }
    let share = ownership(&old);
    for i in 0..3 {
        assert_eq!((share[i] * space as f64).round() as u64, counts[i], "node {i}");
    }
    let d = diff(&old, &new).unwrap();
    let total: u64 = moved.values().sum();
    assert_eq!((d.moved * space as f64).round() as u64, total);
    for p in &d.pairs {
        assert_eq!((p.fraction * space as f64).round() as u64, moved[&(p.from.clone(), p.to.clone())]);
    }
    assert_eq!(d.pairs.len(), moved.len());
    // Every value inside a reported arc changes owner, and the arcs cover exactly `total` values.
    let covered: u64 = d.arcs.iter().map(|a| a.last - a.first + 1).sum();
    assert_eq!(covered, total);
    for a in &d.arcs {
        for h in [a.first, a.last] {
            assert_eq!(id_at(&old, h), Some(old.nodes()[a.from].id()));
            assert_eq!(id_at(&new, h), Some(new.nodes()[a.to].id()));
        }
    }
}

/// Each node's exact share is its weight's share, within the band that
/// `weight × vnodes` random points allow (relative sd ≈ 1/sqrt(points)).
#[test]
fn ownership_is_proportional_to_weight() {
    let specs: Vec<(String, u32)> = (0..50).map(|i| (format!("node-{i}"), 1 + i % 4)).collect();
    let ring = build(&specs, 160, KeyHasher::Xxh3);
    let total: u32 = specs.iter().map(|s| s.1).sum();
    let share = ownership(&ring);
    assert!((share.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    let mut worst = 0.0f64;
    for (i, (_, w)) in specs.iter().enumerate() {
        let expected = f64::from(*w) / f64::from(total);
        let sd = 1.0 / f64::from(w * 160).sqrt();
        let z = (share[i] / expected - 1.0) / sd;
        worst = worst.max(z.abs());
    }
    // 50 nodes: a 4.5-sigma outlier has odds below 1 in 5,000.
    assert!(worst < 4.5, "worst deviation {worst:.2} sd");
    // And the spread is close to the theory's 1/sqrt(160) for weight 1.
    let w1: Vec<f64> = specs.iter().zip(&share).filter(|(s, _)| s.1 == 1).map(|(_, &x)| x * f64::from(total)).collect();
    let mean = w1.iter().sum::<f64>() / w1.len() as f64;
    let cv = (w1.iter().map(|x| (x / mean - 1.0).powi(2)).sum::<f64>() / w1.len() as f64).sqrt();
    assert!(cv > 0.03 && cv < 0.15, "cv {cv}");
}

#[test]
fn sampled_load_follows_ownership() {
    let specs: Vec<(String, u32)> = vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 5)];
    let ring = build(&specs, 160, KeyHasher::Xxh3);
    let n = 200_000;
    let load = chash::analysis::sample_load(&ring, keys(n));
    let share = ownership(&ring);
    for i in 0..3 {
        let p = share[i];
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        assert!((load[i] as f64 - n as f64 * p).abs() < 5.0 * sd, "node {i}: {} vs {}", load[i], n as f64 * p);
    }
}
