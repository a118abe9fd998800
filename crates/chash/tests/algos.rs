//! The algorithms of `chash::algo` against naive twins (each computed the
//! slow, obvious way from its documented definition), and against the
//! invariants they promise: balance at the sampling floor, optimal movement
//! (maglev within 1.6×), weights, bounded loads, candidate order, and golden
//! values that pin placements across processes, platforms and versions.
//!
//! The statistical tests use 1,000,000 keys in release builds
//! (`cargo test --release -p chash-ring --test algos`) and 100,000 in debug
//! builds, with bands scaled to the sampling floor of each.

use std::collections::HashMap;

use chash::algo::{
    fmix64, jump_hash, mix2, Anchor, Bounded, Jump, Maglev, MultiProbe, Rendezvous, DEFAULT_ANCHOR_CAPACITY,
};
use chash::analysis::{sampling_floor_cv, Balance};
use chash::{KeyHasher, Node, Placement, Ring};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Fixed seed, no persistence: the same cases on every run and machine.
fn config(cases: u32) -> Config {
    Config { cases, rng_seed: RngSeed::Fixed(0x0a19_0517), failure_persistence: None, ..Config::default() }
}

fn reduce(x: u64, n: u64) -> u64 {
    ((u128::from(x) * u128::from(n)) >> 64) as u64
}

fn unit_nodes(ids: &[String]) -> Vec<Node> {
    ids.iter().map(|id| Node::new(id.clone(), 1).unwrap()).collect()
}

fn weighted_nodes(specs: &[(String, u32)]) -> Vec<Node> {
    specs.iter().map(|(id, w)| Node::new(id.clone(), *w).unwrap()).collect()
}

/// 0..max distinct short ids, in random order.
fn ids(max: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::btree_set("[a-d][0-9]{0,2}", 0..max)
        .prop_map(|s| s.into_iter().collect::<Vec<_>>())
        .prop_shuffle()
}

fn specs(max: usize, max_weight: u32) -> impl Strategy<Value = Vec<(String, u32)>> {
    prop::collection::btree_map("[a-d][0-9]{0,2}", 1..=max_weight, 0..max)
        .prop_map(|m| m.into_iter().collect::<Vec<_>>())
        .prop_shuffle()
}

fn id_of<P: Placement>(p: &P, h: u64) -> Option<&str> {
    p.locate_hash(h).map(|i| p.nodes()[i].id())
}

/// Candidates are distinct, start with the owner, and cover every node.
fn check_candidates<P: Placement>(p: &P, h: u64) -> Result<(), TestCaseError> {
    let c: Vec<usize> = p.candidates_hash(h).collect();
    prop_assert_eq!(c.first().copied(), p.locate_hash(h));
    let mut sorted = c.clone();
    sorted.sort_unstable();
    prop_assert_eq!(sorted, (0..p.nodes().len()).collect::<Vec<_>>());
    Ok(())
}

// ---------------------------------------------------------------- jump

/// The paper's loop, verbatim in spirit: signed integers and a double.
fn naive_jump(mut key: u64, buckets: i32) -> i32 {
    let (mut b, mut j): (i64, i64) = (-1, 0);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2862933555777941757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1i64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as i32
}

// ---------------------------------------------------------------- rendezvous

/// Every node scored with the documented formula, sorted best first.
fn naive_rendezvous(specs: &[(String, u32)], h: u64) -> Vec<String> {
    let mut scored: Vec<(f64, u64, &str)> = specs
        .iter()
        .map(|(id, w)| {
            let draw = mix2(fmix64(h), xxh3_64_with_seed(id.as_bytes(), 0x7265_6e64_657a_766f));
            let u = ((draw >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            (-f64::from(*w) / u.ln(), draw, id.as_str())
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(b.2)));
    scored.into_iter().map(|s| s.2.to_owned()).collect()
}

// ---------------------------------------------------------------- maglev

/// The paper's pseudocode with the explicit permutation table, weighted
/// by turns per round.
fn naive_maglev(specs: &[(String, u32)], m: u64) -> Vec<usize> {
    let n = specs.len();
    let permutation: Vec<Vec<u64>> = specs
        .iter()
        .map(|(id, _)| {
            let offset = xxh3_64_with_seed(id.as_bytes(), 0x6d61_676c_6576_6f66) % m;
            let skip = xxh3_64_with_seed(id.as_bytes(), 0x6d61_676c_6576_736b) % (m - 1) + 1;
            (0..m).map(|j| (offset + j * skip) % m).collect()
        })
        .collect();
    let mut next = vec![0usize; n];
    let mut entry: Vec<Option<usize>> = vec![None; m as usize];
    let mut filled = 0;
    if n == 0 {
        return vec![];
    }
    loop {
        for i in 0..n {
            for _ in 0..specs[i].1 {
                let mut c = permutation[i][next[i]];
                while entry[c as usize].is_some() {
                    next[i] += 1;
                    c = permutation[i][next[i]];
                }
                entry[c as usize] = Some(i);
                next[i] += 1;
                filled += 1;
                if filled == m {
                    return entry.into_iter().map(Option::unwrap).collect();
                }
            }
        }
    }
}

// ---------------------------------------------------------------- anchor

/// AnchorHash simulated the obvious way: the working list kept explicitly,
/// and a full copy of it taken at every removal.
struct NaiveAnchor {
    capacity: u64,
    shift: u32,
    /// The working list.
    list: Vec<u32>,
    /// For each free bucket: (its position when removed, the list right after).
    removed: HashMap<u32, (usize, Vec<u32>)>,
    free: Vec<u32>,
    owner: HashMap<u32, String>,
}

impl NaiveAnchor {
    fn new(ids: &[String], capacity: u32, bits: u32) -> NaiveAnchor {
        let w = ids.len() as u32;
        let mut removed = HashMap::new();
        let mut free = Vec::new();
        for b in (w..capacity).rev() {
            removed.insert(b, (b as usize, (0..b).collect()));
            free.push(b);
        }
        let owner = ids.iter().enumerate().map(|(i, id)| (i as u32, id.clone())).collect();
        NaiveAnchor { capacity: u64::from(capacity), shift: 64 - bits, list: (0..w).collect(), removed, free, owner }
    }

    fn remove(&mut self, id: &str) {
        let b = *self.owner.iter().find(|(_, v)| v.as_str() == id).unwrap().0;
        self.owner.remove(&b);
        let pos = self.list.iter().position(|&x| x == b).unwrap();
        let last = self.list.pop().unwrap();
        if pos < self.list.len() {
            self.list[pos] = last;
        }
        self.removed.insert(b, (pos, self.list.clone()));
        self.free.push(b);
    }

    fn add(&mut self, id: &str) {
        let b = self.free.pop().unwrap();
        let (pos, _) = self.removed.remove(&b).unwrap();
        if pos < self.list.len() {
            let moved = self.list[pos];
            self.list.push(moved);
            self.list[pos] = b;
        } else {
            self.list.push(b);
        }
        self.owner.insert(b, id.to_owned());
    }

    fn locate(&self, h: u64) -> Option<&str> {
        if self.list.is_empty() {
            return None;
        }
        let mut b = reduce(h << self.shift, self.capacity) as u32;
        while let Some((_, snapshot)) = self.removed.get(&b) {
            let p = reduce(mix2(h, u64::from(b)), snapshot.len() as u64) as usize;
            b = snapshot[p];
        }
        Some(&self.owner[&b])
    }
}

// ---------------------------------------------------------------- multiprobe

/// Every probe against every node's point.
fn naive_multiprobe(ids: &[String], probes: u32, h: u64) -> Option<String> {
    let points: Vec<(u64, &str)> =
        ids.iter().map(|id| (xxh3_64_with_seed(id.as_bytes(), 0x6d75_6c74_6970_726f), id.as_str())).collect();
    let mut best: Option<(u64, u32, &str)> = None;
    for j in 0..probes {
        let probe = mix2(h, u64::from(j));
        for &(p, id) in &points {
            let cand = (p.wrapping_sub(probe), j, id);
            if best.is_none_or(|b| (cand.0, cand.1, cand.2) < (b.0, b.1, b.2)) {
                best = Some(cand);
            }
        }
    }
    best.map(|b| b.2.to_owned())
}

fn hasher() -> impl Strategy<Value = KeyHasher> {
    prop::sample::select(vec![KeyHasher::Xxh3, KeyHasher::Crc32a, KeyHasher::Fnv1a64, KeyHasher::Md5])
}

/// Hash values for a hasher's space: random ones plus the extremes.
fn probe_hashes(random: &[u64], hasher: KeyHasher) -> Vec<u64> {
    let bits = hasher.bits();
    let mask = if bits == 64 { u64::MAX } else { (1 << bits) - 1 };
    random.iter().map(|h| h & mask).chain([0, mask, mask / 2]).collect()
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn jump_equals_the_papers_loop(key in any::<u64>(), n in 1i32..100_000) {
        prop_assert_eq!(jump_hash(key, n as u32) as i32, naive_jump(key, n));
    }

    #[test]
    fn jump_candidates_fail_over_like_jump(
        ids in ids(40), random in prop::collection::vec(any::<u64>(), 32),
    ) {
        let j = Jump::new(unit_nodes(&ids)).unwrap();
        for &h in &random {
            check_candidates(&j, h)?;
            let c: Vec<usize> = j.candidates_hash(h).collect();
            // Removing every node from the owner on, the key goes to the second candidate.
            if c.len() > 1 && c[0] > 0 {
                prop_assert_eq!(jump_hash(h, c[0] as u32) as usize, c[1]);
            }
        }
    }

    #[test]
    fn rendezvous_equals_scoring_every_node(
        specs in specs(24, 5), hasher in hasher(), random in prop::collection::vec(any::<u64>(), 32),
    ) {
        let r = Rendezvous::with_hasher(weighted_nodes(&specs), hasher).unwrap();
        for h in probe_hashes(&random, hasher) {
            let naive = naive_rendezvous(&specs, h);
            let ids: Vec<&str> = r.candidates_hash(h).map(|i| r.nodes()[i].id()).collect();
            prop_assert_eq!(&ids, &naive);
            prop_assert_eq!(id_of(&r, h), naive.first().map(String::as_str));
        }
    }

    #[test]
    fn maglev_equals_the_papers_pseudocode(
        specs in specs(12, 3), m in prop::sample::select(vec![1_201u64, 1_601, 2_003, 3_001, 4_001]),
        hasher in hasher(), random in prop::collection::vec(any::<u64>(), 32),
    ) {
        let weight: u64 = specs.iter().map(|s| u64::from(s.1)).sum();
        prop_assume!(m > 100 * weight);
        let mg = Maglev::builder().hasher(hasher).table_size(m).build(weighted_nodes(&specs)).unwrap();
        let naive = naive_maglev(&specs, m);
        prop_assert_eq!(mg.entries().collect::<Vec<_>>(), naive.clone());
        for h in probe_hashes(&random, hasher) {
            let entry = ((u128::from(h << (64 - hasher.bits())) * u128::from(m)) >> 64) as usize;
            prop_assert_eq!(mg.locate_hash(h), naive.get(entry).copied());
            check_candidates(&mg, h)?;
        }
    }

    #[test]
    fn anchor_equals_a_simulation(
        ids in ids(30), capacity in 30u32..80, hasher in hasher(),
        ops in prop::collection::vec((any::<bool>(), any::<prop::sample::Index>()), 0..40),
        random in prop::collection::vec(any::<u64>(), 24),
    ) {
        let mut anchor = Anchor::with_capacity(unit_nodes(&ids), hasher, capacity).unwrap();
        let mut naive = NaiveAnchor::new(&ids, capacity, hasher.bits());
        let mut fresh = 0;
        for (add, pick) in ops {
            if add && anchor.nodes().len() < capacity as usize {
                let id = format!("new{fresh}");
                fresh += 1;
                anchor = anchor.with_node(Node::new(id.clone(), 1).unwrap()).unwrap();
                naive.add(&id);
            } else if !anchor.nodes().is_empty() {
                let id = anchor.nodes()[pick.index(anchor.nodes().len())].id().to_owned();
                anchor = anchor.without_node(&id).unwrap();
                naive.remove(&id);
            }
            for h in probe_hashes(&random, hasher) {
                prop_assert_eq!(id_of(&anchor, h), naive.locate(h), "h={}", h);
                if !anchor.nodes().is_empty() {
                    check_candidates(&anchor, h)?;
                }
            }
        }
    }

    #[test]
    fn multiprobe_equals_scanning_every_node(
        ids in ids(24), probes in 1u32..30, hasher in hasher(), random in prop::collection::vec(any::<u64>(), 32),
    ) {
        let mp = MultiProbe::with_probes(unit_nodes(&ids), hasher, probes).unwrap();
        for h in probe_hashes(&random, hasher) {
            prop_assert_eq!(id_of(&mp, h).map(str::to_owned), naive_multiprobe(&ids, probes, h));
            if !ids.is_empty() {
                check_candidates(&mp, h)?;
            }
        }
    }

    /// Adding or removing one node moves only keys to or from it.
    #[test]
    fn changes_move_only_the_changed_nodes_keys(
        ids in ids(30), pick in any::<prop::sample::Index>(), random in prop::collection::vec(any::<u64>(), 300),
    ) {
        prop_assume!(ids.len() >= 2);
        let gone = ids[pick.index(ids.len())].clone();
        let last = ids[ids.len() - 1].clone();
        let newcomer = Node::new("zz", 1).unwrap();
        fn check<P: Placement>(before: &P, after: &P, changed: &str, hs: &[u64]) -> Result<(), TestCaseError> {
            for &h in hs {
                let (b, a) = (id_of(before, h), id_of(after, h));
                prop_assert!(b == a || b == Some(changed) || a == Some(changed), "{:?} -> {:?}", b, a);
            }
            Ok(())
        }
        let j = Jump::new(unit_nodes(&ids)).unwrap();
        check(&j, &j.with_node(newcomer.clone()).unwrap(), "zz", &random)?;
        check(&j, &j.without_node(&last).unwrap(), &last, &random)?;
        let r = Rendezvous::new(unit_nodes(&ids)).unwrap();
        check(&r, &r.with_node(newcomer.clone()).unwrap(), "zz", &random)?;
        check(&r, &r.without_node(&gone).unwrap(), &gone, &random)?;
        check(&r, &r.with_weight(&gone, 3).unwrap(), &gone, &random)?;
        let a = Anchor::new(unit_nodes(&ids)).unwrap();
        check(&a, &a.with_node(newcomer.clone()).unwrap(), "zz", &random)?;
        let a2 = a.without_node(&gone).unwrap();
        check(&a, &a2, &gone, &random)?;
        check(&a2, &a2.with_node(newcomer.clone()).unwrap(), "zz", &random)?;
        let mp = MultiProbe::new(unit_nodes(&ids)).unwrap();
        check(&mp, &mp.with_node(newcomer).unwrap(), "zz", &random)?;
        check(&mp, &mp.without_node(&gone).unwrap(), &gone, &random)?;
    }
}

// ---------------------------------------------------------------- statistics

/// Keys for the statistical tests: 1M in release builds, 100k in debug.
fn key_count() -> usize {
    if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    }
}

fn key_hashes(n: usize) -> Vec<u64> {
    (0..n).map(|i| KeyHasher::Xxh3.hash(format!("key:{i}").as_bytes())).collect()
}

fn balance<P: Placement>(p: &P, hashes: &[u64]) -> Balance {
    let mut counts = vec![0f64; p.nodes().len()];
    for &h in hashes {
        counts[p.locate_hash(h).unwrap()] += 1.0;
    }
    let weights: Vec<u32> = p.nodes().iter().map(Node::weight).collect();
    Balance::of(&counts, &weights)
}

fn moved<P: Placement, Q: Placement>(a: &P, b: &Q, hashes: &[u64]) -> f64 {
    hashes.iter().filter(|&&h| id_of(a, h) != id_of(b, h)).count() as f64 / hashes.len() as f64
}

fn hundred() -> Vec<Node> {
    (0..100).map(|i| Node::new(format!("node-{i}"), 1).unwrap()).collect()
}

/// Jump, rendezvous, maglev and anchor reach the sampling floor at N = 100
/// (CV within 1.5× of it); multi-probe's peak/mean is ≈ 1.09 at 21 probes and
/// ≤ 1.05 at 41.
#[test]
fn balance_at_the_sampling_floor() {
    let hashes = key_hashes(key_count());
    let floor = sampling_floor_cv(hashes.len() as u64, 100);
    let band = 1.5 * floor;
    let jump = Jump::new(hundred()).unwrap();
    let rendezvous = Rendezvous::new(hundred()).unwrap();
    let maglev = Maglev::builder().table_size(65_537).build(hundred()).unwrap();
    // Anchor after churn: 20 nodes removed at random positions, then 10 added back.
    let mut anchor = Anchor::new((0..110).map(|i| Node::new(format!("node-{i}"), 1).unwrap()).collect()).unwrap();
    for i in (3..110).step_by(5).take(20) {
        anchor = anchor.without_node(&format!("node-{i}")).unwrap();
    }
    for i in 0..10 {
        anchor = anchor.with_node(Node::new(format!("back-{i}"), 1).unwrap()).unwrap();
    }
    assert_eq!(anchor.nodes().len(), 100);
    let fresh_anchor = Anchor::new(hundred()).unwrap();
    let results = [
        ("jump", balance(&jump, &hashes)),
        ("rendezvous", balance(&rendezvous, &hashes)),
        ("maglev", balance(&maglev, &hashes)),
        ("anchor", balance(&fresh_anchor, &hashes)),
        ("anchor after churn", balance(&anchor, &hashes)),
    ];
    for (name, b) in results {
        println!("{name}: CV {:.4} (floor {floor:.4}), peak/mean {:.3}", b.cv, b.peak_over_mean);
        assert!(b.cv <= band, "{name}: CV {:.4} above 1.5 × floor {floor:.4}", b.cv);
    }
    // Multi-probe: a node's share is flat (1 + ε) except for the few whose
    // point follows a neighbour's closely, which get less. With 21 probes the
    // expected peak/mean is k/(k-1) = 1.05 averaged over node sets and
    // 1.0686 for this one (multiprobe_expected_shares_match_sampling and the
    // test after it), and 1M keys add about 2.5% of sampling noise to the
    // peak: about 1.09. 41 probes bring the peak to 1.05. (Debug builds:
    // 100k keys, ~8% noise.)
    let noise = if cfg!(debug_assertions) { 0.06 } else { 0.0 };
    for (probes, limit) in [(21, 1.10), (41, 1.05)] {
        let mp = balance(&MultiProbe::with_probes(hundred(), KeyHasher::Xxh3, probes).unwrap(), &hashes);
        println!("multiprobe, {probes} probes: CV {:.4}, peak/mean {:.3}", mp.cv, mp.peak_over_mean);
        assert!(mp.peak_over_mean <= limit + noise, "multiprobe {probes}: peak/mean {:.3}", mp.peak_over_mean);
    }
}

/// Multi-probe's expected shares (computed from the node points) are what
/// sampling measures: every node's sampled count is within five binomial
/// standard deviations of its expected share.
#[test]
fn multiprobe_expected_shares_match_sampling() {
    let hashes = key_hashes(key_count());
    for (nodes, probes) in [(hundred(), 21), (hundred(), 5), (hundred()[..7].to_vec(), 21)] {
        let mp = MultiProbe::with_probes(nodes, KeyHasher::Xxh3, probes).unwrap();
        let expected = mp.expected_shares();
        assert!((expected.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        let mut counts = vec![0f64; expected.len()];
        for &h in &hashes {
            counts[mp.locate_hash(h).unwrap()] += 1.0;
        }
        let n = hashes.len() as f64;
        for (i, (&c, &e)) in counts.iter().zip(&expected).enumerate() {
            let sd = (n * e * (1.0 - e)).sqrt().max(1.0);
            assert!((c - n * e).abs() <= 5.0 * sd, "{probes} probes, node {i}: {c} keys, expected {:.0}", n * e);
        }
    }
}

/// Appleton & O'Reilly: peak/mean 1 + ε with 1 + 1/ε probes. Averaged over
/// random node sets the expected peak/mean is k / (k − 1): 1.05 at 21
/// probes, 1.025 at 41; one node set lands a few percent either side.
#[test]
fn multiprobe_peak_over_mean_averages_one_plus_one_over_k_minus_one() {
    for (probes, target) in [(21u32, 1.05), (41, 1.025)] {
        let sets = 400;
        let mut sum = 0.0;
        for set in 0..sets {
            let nodes = (0..100).map(|i| Node::new(format!("set-{set}-node-{i}"), 1).unwrap()).collect();
            let shares = MultiProbe::with_probes(nodes, KeyHasher::Xxh3, probes).unwrap().expected_shares();
            sum += shares.iter().copied().fold(0.0, f64::max) * 100.0;
        }
        let mean = sum / f64::from(sets);
        println!("multiprobe, {probes} probes: peak/mean {mean:.4} averaged over {sets} node sets of 100");
        assert!((mean - target).abs() <= 0.004, "{probes} probes: mean peak/mean {mean:.4}, expected {target}");
    }
    let this = MultiProbe::new(hundred()).unwrap().expected_shares();
    println!(
        "multiprobe, 21 probes, node-0..node-99: expected peak/mean {:.4}",
        this.iter().copied().fold(0.0, f64::max) * 100.0
    );
}

/// Movement: the optimum (1/N of the keys) for a join or a leave; maglev
/// at most 1.6× the optimum.
#[test]
fn movement_is_optimal() {
    let hashes = key_hashes(key_count() / 2);
    let optimal_leave = 1.0 / 100.0;
    let optimal_join = 1.0 / 101.0;
    let tolerance = 5.0 * (optimal_leave / hashes.len() as f64).sqrt(); // five binomial sd
    let near = |x: f64, opt: f64| (x - opt).abs() <= tolerance;
    let newcomer = || Node::new("node-new", 1).unwrap();

    let jump = Jump::new(hundred()).unwrap();
    let (l, j) =
        (moved(&jump, &jump.without_last(), &hashes), moved(&jump, &jump.with_node(newcomer()).unwrap(), &hashes));
    assert!(near(l, optimal_leave) && near(j, optimal_join), "jump {l} {j}");

    let r = Rendezvous::new(hundred()).unwrap();
    let (l, j) = (
        moved(&r, &r.without_node("node-37").unwrap(), &hashes),
        moved(&r, &r.with_node(newcomer()).unwrap(), &hashes),
    );
    assert!(near(l, optimal_leave) && near(j, optimal_join), "rendezvous {l} {j}");

    let a = Anchor::new(hundred()).unwrap();
    let (l, j) = (
        moved(&a, &a.without_node("node-37").unwrap(), &hashes),
        moved(&a, &a.with_node(newcomer()).unwrap(), &hashes),
    );
    assert!(near(l, optimal_leave) && near(j, optimal_join), "anchor {l} {j}");

    let mp = MultiProbe::new(hundred()).unwrap();
    let (l, j) = (
        moved(&mp, &mp.without_node("node-37").unwrap(), &hashes),
        moved(&mp, &mp.with_node(newcomer()).unwrap(), &hashes),
    );
    // One point per node: a node's share varies (it is its balance), so
    // only the order of magnitude is fixed here; that only the changed
    // node's keys move is a property test above.
    assert!(l < 2.0 * optimal_leave && j < 2.0 * optimal_join, "multiprobe {l} {j}");

    let m = Maglev::new(hundred()).unwrap();
    let (l, j) = (
        moved(&m, &m.without_node("node-37").unwrap(), &hashes),
        moved(&m, &m.with_node(newcomer()).unwrap(), &hashes),
    );
    println!("maglev moves {:.2}× / {:.2}× the optimum", l / optimal_leave, j / optimal_join);
    assert!(l <= 1.6 * optimal_leave && j <= 1.6 * optimal_join, "maglev {l} {j}");
}

/// Rendezvous and maglev give each node its weight's share.
#[test]
fn weights_are_respected() {
    let specs: Vec<(String, u32)> = (0..20).map(|i| (format!("w-{i}"), 1 + i % 4)).collect();
    let total: u32 = specs.iter().map(|s| s.1).sum();
    let hashes = key_hashes(key_count() / 4);
    let r = Rendezvous::new(weighted_nodes(&specs)).unwrap();
    let b = balance(&r, &hashes);
    // The floor for unequal shares is close to the equal one at this size.
    assert!(b.cv <= 1.5 * sampling_floor_cv(hashes.len() as u64, 20), "rendezvous {b:?}");
    let m = Maglev::new(weighted_nodes(&specs)).unwrap();
    let mut entries = vec![0u64; specs.len()];
    for o in m.entries() {
        entries[o] += 1;
    }
    for (i, (_, w)) in specs.iter().enumerate() {
        let fair = 65_537.0 * f64::from(*w) / f64::from(total);
        assert!((entries[i] as f64 - fair).abs() <= 4.0, "maglev node {i}: {} vs {fair:.1}", entries[i]);
    }
    let b = balance(&m, &hashes);
    assert!(b.cv <= 1.5 * sampling_floor_cv(hashes.len() as u64, 20), "maglev {b:?}");
}

/// Bounded loads: no acquisition takes a node above its cap, and a key stays
/// on its ring owner whenever the owner is under its cap.
#[test]
fn bounded_loads_hold_their_bound() {
    let nodes: Vec<Node> = (0..50).map(|i| Node::new(format!("node-{i}"), 1 + i % 3).unwrap()).collect();
    let ring = Ring::new(nodes).unwrap();
    let b = Bounded::new(ring, 1.25).unwrap();
    let hashes = key_hashes(key_count() / 10);
    for &h in &hashes {
        let total = b.total_load();
        let owner = b.locate_hash(h).unwrap();
        let owner_under = b.loads()[owner] < b.cap(owner, total);
        let i = b.acquire_hash(h).unwrap();
        assert!(b.loads()[i] <= b.cap(i, total));
        if owner_under {
            assert_eq!(i, owner);
        }
    }
    let weights: Vec<u32> = b.nodes().iter().map(Node::weight).collect();
    let loads: Vec<f64> = b.loads().into_iter().map(|l| l as f64).collect();
    let bal = Balance::of(&loads, &weights);
    assert!(bal.peak_over_mean <= 1.25 + 1e-3, "{bal:?}");
}

// ---------------------------------------------------------------- golden

/// Placements pinned forever: the same keys on the same nodes in every
/// process, on every platform, in every version.
#[test]
fn golden_placements() {
    let nodes = || (0..7).map(|i| Node::new(format!("cache-{i}"), 1).unwrap()).collect::<Vec<_>>();
    let weighted = || (0..7).map(|i| Node::new(format!("cache-{i}"), 1 + i % 3).unwrap()).collect::<Vec<_>>();
    let keys = ["user:1", "user:2", "user:3", "user:42", "太阳", "", "{tag}:x", "a-much-longer-key-with-more-bytes"];
    let owners = |p: &dyn Fn(&[u8]) -> usize| keys.iter().map(|k| p(k.as_bytes())).collect::<Vec<_>>();
    let jump = Jump::new(nodes()).unwrap();
    let rendezvous = Rendezvous::new(weighted()).unwrap();
    let maglev = Maglev::builder().table_size(2_003).build(weighted()).unwrap();
    let anchor = Anchor::new(nodes()).unwrap().without_node("cache-2").unwrap();
    let multiprobe = MultiProbe::new(nodes()).unwrap();
    let got = [
        owners(&|k| jump.locate(k).unwrap()),
        owners(&|k| rendezvous.locate(k).unwrap()),
        owners(&|k| maglev.locate(k).unwrap()),
        owners(&|k| anchor.locate(k).unwrap()),
        owners(&|k| multiprobe.locate(k).unwrap()),
    ];
    let expected: Vec<Vec<usize>> = GOLDEN.iter().map(|r| r.to_vec()).collect();
    assert_eq!(got.to_vec(), expected, "{got:?}");
    assert_eq!(DEFAULT_ANCHOR_CAPACITY, 1024);
}

/// Owners (node indices) of the keys above: jump, rendezvous, maglev,
/// anchor, multiprobe.
const GOLDEN: [[usize; 8]; 5] = [
    [1, 4, 2, 1, 6, 0, 5, 0],
    [3, 3, 2, 6, 2, 5, 3, 6],
    [2, 0, 5, 2, 5, 3, 4, 3],
    [3, 4, 5, 5, 3, 2, 2, 5],
    [1, 1, 5, 2, 5, 3, 2, 2],
];

#[test]
fn types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Jump>();
    check::<Rendezvous<std::sync::Arc<String>>>();
    check::<Maglev>();
    check::<Anchor>();
    check::<MultiProbe>();
    check::<Bounded>();
    check::<chash::algo::JumpCandidates>();
    check::<chash::algo::RendezvousCandidates<'static, ()>>();
    check::<chash::algo::MaglevCandidates<'static>>();
    check::<chash::algo::AnchorCandidates<'static, ()>>();
    check::<chash::algo::MultiProbeCandidates<'static>>();
    check::<chash::AnyPlacement>();
}
