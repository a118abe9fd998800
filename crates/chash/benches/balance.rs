//! Balance and movement of every algorithm, chash's and the peers', on the
//! same 1,000,000 keys and 100 nodes of weight 1: the coefficient of
//! variation and peak/mean of keys per node, the keys that move when node
//! 37 leaves (jump and jumphash: the last node, the only one they can
//! remove) and when a 101st node joins, and whether a second instance built
//! the same way (as another process would) agrees on every key.
//!
//! The sampling floor for 1M keys on 100 nodes is CV 0.0099; the optimal
//! movement is 1.00% on the leave and 0.99% on the join.
//!
//! Run: `cargo bench -p chash-ring --bench balance` (about a minute).

use std::hash::BuildHasherDefault;

use chash::algo::{Anchor, Bounded, Jump, Maglev, MultiProbe, Rendezvous};
use chash::analysis::sampling_floor_cv;
use chash::{KeyHasher, Node, Placement, Ring};

const N: u32 = 100;
const GONE: u32 = 37;
const NEW: u32 = 1000;

fn nodes(ids: impl Iterator<Item = u32>) -> Vec<Node> {
    ids.map(|i| Node::new(format!("node-{i}"), 1).unwrap()).collect()
}

fn all() -> Vec<u32> {
    (0..N).collect()
}

fn without(gone: u32) -> Vec<u32> {
    (0..N).filter(|&i| i != gone).collect()
}

/// The node number of a chash node id `node-<i>`.
fn number<P: Placement>(p: &P, i: usize) -> u32 {
    p.nodes()[i].id()[5..].parse().unwrap()
}

/// Owners (node numbers) of every key.
type Owners = Vec<u32>;

fn chash_owners<P: Placement>(p: &P, hashes: &[u64]) -> Owners {
    hashes.iter().map(|&h| number(p, p.locate_hash(h).unwrap())).collect()
}

struct Row {
    name: String,
    before: Owners,
    leave: Option<Owners>,
    join: Option<Owners>,
    twin: Option<Owners>,
}

fn print(row: &Row) {
    let mut counts = std::collections::HashMap::<u32, f64>::new();
    for &o in &row.before {
        *counts.entry(o).or_default() += 1.0;
    }
    let mean = row.before.len() as f64 / f64::from(N);
    let cv = ((0..N).map(|i| (counts.get(&i).copied().unwrap_or(0.0) / mean - 1.0).powi(2)).sum::<f64>()
        / f64::from(N))
    .sqrt();
    let peak = counts.values().cloned().fold(0.0, f64::max) / mean;
    let moved = |other: &Option<Owners>| match other {
        Some(o) => {
            let m = row.before.iter().zip(o).filter(|(a, b)| a != b).count();
            format!("{:.2}%", 100.0 * m as f64 / row.before.len() as f64)
        }
        None => "n/a".into(),
    };
    let agree = match &row.twin {
        Some(t) => {
            let same = row.before.iter().zip(t).filter(|(a, b)| a == b).count();
            format!("{:.1}%", 100.0 * same as f64 / row.before.len() as f64)
        }
        None => "—".into(),
    };
    // Movement on the join is measured from the placement after the leave.
    let join = match (&row.leave, &row.join) {
        (Some(l), Some(j)) => {
            let m = l.iter().zip(j).filter(|(a, b)| a != b).count();
            format!("{:.2}%", 100.0 * m as f64 / l.len() as f64)
        }
        _ => "n/a".into(),
    };
    println!("| {} | {:.4} | {:.3} | {} | {} | {} |", row.name, cv, peak, moved(&row.leave), join, agree);
}

fn main() {
    let keys: Vec<String> = (0..1_000_000).map(|i| format!("key:{i}")).collect();
    let hashes: Vec<u64> = keys.iter().map(|k| KeyHasher::Xxh3.hash(k.as_bytes())).collect();
    println!(
        "1,000,000 keys on {N} nodes; sampling floor CV {:.4}; optimum 1.00% on the leave, 0.99% on the join\n",
        sampling_floor_cv(keys.len() as u64, N as usize)
    );
    println!("| placement | CV | peak/mean | moved on leave | moved on join | a 2nd instance agrees |");
    println!("|---|---|---|---|---|---|");

    // chash. Each change goes through the algorithm's own change API.
    let ring = Ring::new(nodes(all().into_iter())).unwrap();
    let left = ring.without_node("node-37").unwrap();
    print(&Row {
        name: "chash ring, 160 vnodes".into(),
        before: chash_owners(&ring, &hashes),
        join: Some(chash_owners(&left.with_node(Node::new("node-1000", 1).unwrap()).unwrap(), &hashes)),
        leave: Some(chash_owners(&left, &hashes)),
        twin: Some(chash_owners(&Ring::new(nodes(all().into_iter())).unwrap(), &hashes)),
    });
    // The jump family (Lamping & Veach's loop and JumpBackHash): only the
    // last node can leave.
    type Build = fn(Vec<Node>) -> chash::Result<Jump>;
    for (name, build) in [("chash jump", Jump::new as Build), ("chash jumpback", Jump::jump_back)] {
        let jump = build(nodes(all().into_iter())).unwrap();
        let left = jump.without_last();
        print(&Row {
            name: format!("{name} (node 99 leaves)"),
            before: chash_owners(&jump, &hashes),
            join: Some(chash_owners(&left.with_node(Node::new("node-1000", 1).unwrap()).unwrap(), &hashes)),
            leave: Some(chash_owners(&left, &hashes)),
            twin: Some(chash_owners(&build(nodes(all().into_iter())).unwrap(), &hashes)),
        });
    }
    let rv = Rendezvous::new(nodes(all().into_iter())).unwrap();
    let left = rv.without_node("node-37").unwrap();
    print(&Row {
        name: "chash rendezvous".into(),
        before: chash_owners(&rv, &hashes),
        join: Some(chash_owners(&left.with_node(Node::new("node-1000", 1).unwrap()).unwrap(), &hashes)),
        leave: Some(chash_owners(&left, &hashes)),
        twin: Some(chash_owners(&Rendezvous::new(nodes(all().into_iter())).unwrap(), &hashes)),
    });
    let mg = Maglev::new(nodes(all().into_iter())).unwrap();
    let left = mg.without_node("node-37").unwrap();
    print(&Row {
        name: "chash maglev, table 65537".into(),
        before: chash_owners(&mg, &hashes),
        join: Some(chash_owners(&left.with_node(Node::new("node-1000", 1).unwrap()).unwrap(), &hashes)),
        leave: Some(chash_owners(&left, &hashes)),
        twin: Some(chash_owners(&Maglev::new(nodes(all().into_iter())).unwrap(), &hashes)),
    });
    let an = Anchor::new(nodes(all().into_iter())).unwrap();
    let left = an.without_node("node-37").unwrap();
    print(&Row {
        name: "chash anchor, capacity 1024".into(),
        before: chash_owners(&an, &hashes),
        join: Some(chash_owners(&left.with_node(Node::new("node-1000", 1).unwrap()).unwrap(), &hashes)),
        leave: Some(chash_owners(&left, &hashes)),
        twin: Some(chash_owners(&Anchor::new(nodes(all().into_iter())).unwrap(), &hashes)),
    });
    for probes in [21, 41] {
        let mp = MultiProbe::with_probes(nodes(all().into_iter()), KeyHasher::Xxh3, probes).unwrap();
        let left = mp.without_node("node-37").unwrap();
        print(&Row {
            name: format!("chash multiprobe, {probes} probes"),
            before: chash_owners(&mp, &hashes),
            join: Some(chash_owners(&left.with_node(Node::new("node-1000", 1).unwrap()).unwrap(), &hashes)),
            leave: Some(chash_owners(&left, &hashes)),
            twin: Some(chash_owners(
                &MultiProbe::with_probes(nodes(all().into_iter()), KeyHasher::Xxh3, probes).unwrap(),
                &hashes,
            )),
        });
    }
    // Bounded loads: every key takes one unit of load, in order, and keeps it.
    let place = |ring: Ring| -> Owners {
        let b = Bounded::new(ring, 1.25).unwrap();
        hashes.iter().map(|&h| number(&b, b.acquire_hash(h).unwrap())).collect()
    };
    let ring = Ring::new(nodes(all().into_iter())).unwrap();
    let left = ring.without_node("node-37").unwrap();
    print(&Row {
        name: "chash bounded, c = 1.25 (keys held)".into(),
        before: place(ring.clone()),
        join: Some(place(left.with_node(Node::new("node-1000", 1).unwrap()).unwrap())),
        leave: Some(place(left)),
        twin: Some(place(ring)),
    });

    // Peers, each with its own key hashing and change API.
    type Sip = BuildHasherDefault<std::collections::hash_map::DefaultHasher>;
    let peer_maglev = |ids: Vec<u32>| -> Owners {
        let m: maglev::Maglev<u32, Sip> = maglev::Maglev::new(ids);
        keys.iter().map(|k| *maglev::ConsistentHasher::get(&m, k).unwrap()).collect()
    };
    print(&Row {
        name: "maglev 0.2 (table follows N)".into(),
        before: peer_maglev(all()),
        leave: Some(peer_maglev(without(GONE))),
        join: Some(peer_maglev(without(GONE).into_iter().chain([NEW]).collect())),
        twin: Some(peer_maglev(all())),
    });
    let hr_maglev = |ids: Vec<u32>| -> Owners {
        let refs: Vec<&u32> = ids.iter().collect();
        let m = hash_rings::maglev::Ring::new(refs);
        keys.iter().map(|k| *m.get_node(k)).collect()
    };
    print(&Row {
        name: "hash-rings 1.1 maglev".into(),
        before: hr_maglev(all()),
        leave: Some(hr_maglev(without(GONE))),
        join: Some(hr_maglev(without(GONE).into_iter().chain([NEW]).collect())),
        twin: Some(hr_maglev(all())),
    });
    let jh = |n: u32, seeded: bool| -> Owners {
        let j = if seeded { jumphash::JumpHasher::new_with_keys(1, 2) } else { jumphash::JumpHasher::new() };
        keys.iter().map(|k| j.slot(k, n)).collect()
    };
    print(&Row {
        name: "jumphash 0.1 `new()` (node 99 leaves)".into(),
        before: jh(N, true),
        leave: Some(jh(N - 1, true)),
        join: None,
        twin: Some(jh(N, false)),
    });
    // anchorhash: the bucket changes in place; capacity 101 leaves room for the join.
    let mut anchor: anchorhash::AnchorHash<&str, u32, _> =
        anchorhash::Builder::default().with_resources(all()).build(N as u16 + 1);
    let read = |a: &anchorhash::AnchorHash<&str, u32, _>| -> Owners {
        keys.iter().map(|k| *a.get_resource(k.as_str()).unwrap()).collect()
    };
    let before = read(&anchor);
    anchor.remove_resource(&GONE).unwrap();
    let leave = read(&anchor);
    anchor.add_resource(NEW).unwrap();
    let join = read(&anchor);
    let twin: anchorhash::AnchorHash<&str, u32, _> =
        anchorhash::Builder::default().with_resources(all()).build(N as u16 + 1);
    print(&Row {
        name: "anchorhash 0.2, capacity 101".into(),
        before,
        leave: Some(leave),
        join: Some(join),
        twin: Some(read(&twin)),
    });
    let ring = mpchash::HashRing::<u32>::new();
    for i in all() {
        ring.add(i);
    }
    let read = |r: &mpchash::HashRing<u32>| -> Owners { keys.iter().map(|k| *r.node(k).unwrap().node()).collect() };
    let before = read(&ring);
    ring.remove(&GONE);
    let leave = read(&ring);
    ring.add(NEW);
    let join = read(&ring);
    let twin = mpchash::HashRing::<u32>::new();
    for i in all() {
        twin.add(i);
    }
    print(&Row {
        name: "mpchash 2.0, 23 probes".into(),
        before,
        leave: Some(leave),
        join: Some(join),
        twin: Some(read(&twin)),
    });
    let ids: Vec<u32> = all().into_iter().chain([NEW]).collect();
    let mpc = |twin: bool| -> (Owners, Owners, Owners) {
        let mut r = hash_rings::mpc::Ring::new(21);
        for id in &ids[..N as usize] {
            r.insert_node(id);
        }
        let before: Owners = keys.iter().map(|k| *r.get_node(k)).collect();
        if twin {
            return (before, vec![], vec![]);
        }
        r.remove_node(&GONE);
        let leave = keys.iter().map(|k| *r.get_node(k)).collect();
        r.insert_node(&ids[N as usize]);
        let join = keys.iter().map(|k| *r.get_node(k)).collect();
        (before, leave, join)
    };
    let (before, leave, join) = mpc(false);
    print(&Row {
        name: "hash-rings 1.1 mpc, 21 probes".into(),
        before,
        leave: Some(leave),
        join: Some(join),
        twin: Some(mpc(true).0),
    });
}
