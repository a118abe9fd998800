//! Rings built from fuzzed nodes: lookups agree with a linear scan, changes
//! never panic.
#![no_main]
use chash::{KeyHasher, Node, Placement, Ring};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let hasher = KeyHasher::ALL[data[0] as usize % KeyHasher::ALL.len()];
    let vnodes = u32::from(data[1] % 16) + 1;
    let nodes: Vec<Node> = data[2..]
        .chunks(3)
        .filter_map(|c| Node::new(format!("n{}", c[0] % 32), u32::from(*c.get(1).unwrap_or(&1) % 4) + 1).ok())
        .collect();
    let Ok(ring) = Ring::builder().hasher(hasher).vnodes(vnodes).build(nodes) else { return };
    let points: Vec<(u64, usize)> = ring.points().collect();
    for window in data.windows(8).take(64) {
        let h = u64::from_le_bytes(window.try_into().unwrap());
        let naive = points.iter().find(|p| p.0 >= h).or(points.first()).map(|p| p.1);
        assert_eq!(ring.locate_hash(h), naive);
        let _ = ring.candidates_hash(h).count();
    }
    if let Some(n) = ring.nodes().first().map(|n| n.id().to_owned()) {
        let _ = ring.without_node(&n);
        let _ = ring.with_weight(&n, 3);
    }
});
