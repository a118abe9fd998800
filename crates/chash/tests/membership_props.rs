//! The config file is the whole truth: for every distribution, random
//! sequences of 50 membership changes (adds, removes, re-weights, operator
//! ejections and restores); after each, the pool written out as its
//! `servers:` lines and read back places every one of 100,000 keys where
//! the algorithm's own incremental changes put it (anchor's bucket history
//! included), or, for the algorithms that rebuild from their list (maglev,
//! jump), where a fresh build of the expected list does.

use chash::{AnyPlacement, Edit, LineState, Node, PoolConfig, ServerLine, Snapshot};

/// A small deterministic generator (the sequences are the same every run).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
}

const KEYS: usize = 100_000;

fn owners(s: &Snapshot, keys: &[String]) -> Vec<String> {
    keys.iter().map(|k| s.route(k.as_bytes()).unwrap().to_owned()).collect()
}

/// The pool as a file would carry it: its lines written and parsed again.
fn reread(p: &PoolConfig) -> PoolConfig {
    let mut b = PoolConfig::builder(&p.name).distribution(p.distribution.name()).hash(&p.hash.to_string());
    for line in &p.lines {
        b = b.server_line(&line.to_string());
    }
    b.build().unwrap()
}

fn run(distribution: &str, seed: u64) {
    let weighted = !matches!(distribution, "anchor" | "jump" | "jumpback" | "multiprobe");
    let hash = if matches!(distribution, "ketama" | "modula") {
        "fnv1a_64"
    } else if distribution == "nginx" {
        "crc32a"
    } else {
        "xxh3"
    };
    let keys: Vec<String> = (0..KEYS).map(|i| format!("key:{seed}:{i}")).collect();
    let mut b = PoolConfig::builder("p").distribution(distribution).hash(hash);
    for i in 0..8 {
        b = b.server_line(&format!("s{i}:1"));
    }
    let mut pool = b.build().unwrap();
    // The reference: the algorithm's own changes, or the expected list.
    let incremental = !matches!(distribution, "maglev" | "jump" | "jumpback" | "modula" | "nginx");
    let mut reference: AnyPlacement = pool.snapshot().unwrap().placement().clone();
    let mut expected: Vec<ServerLine> = pool.lines.clone();
    let mut rng = Rng(seed);
    let mut next_id = 8;
    let mut refused = 0;
    for step in 0..50 {
        let active: Vec<String> = pool.servers.iter().map(|l| l.id.clone()).collect();
        let ejected: Vec<String> =
            pool.members().filter(|l| l.state != LineState::Active).map(|l| l.id.clone()).collect();
        let members: Vec<String> = pool.members().map(|l| l.id.clone()).collect();
        let edit = match rng.below(5) {
            0 | 1 => {
                next_id += 1;
                let w = if weighted { 1 + rng.below(3) as u32 } else { 1 };
                Edit::Add(format!("s{next_id}:{w}").parse().unwrap())
            }
            2 if members.len() > 2 && active.len() > 1 => {
                let id = &members[rng.below(members.len())];
                if active.len() == 1 && active[0] == *id {
                    continue;
                }
                Edit::Remove(id.clone())
            }
            3 if !ejected.is_empty() => Edit::Restore(ejected[rng.below(ejected.len())].clone()),
            3 if active.len() > 1 => Edit::Eject(active[rng.below(active.len())].clone()),
            4 if weighted => Edit::Weight(members[rng.below(members.len())].clone(), 1 + rng.below(4) as u32),
            _ => continue,
        };
        let (next, _ops) = match pool.apply(&edit) {
            Ok(done) => done,
            Err(e) => {
                assert!(matches!(distribution, "jump" | "jumpback"), "{distribution} step {step}: {edit} refused: {e}");
                refused += 1;
                continue;
            }
        };
        // The reference makes the same change its own way.
        let line_of = |id: &str| pool.members().find(|l| l.id == id).cloned().unwrap();
        let node_of = |l: &ServerLine| -> Node { l.to_node().unwrap() };
        match &edit {
            Edit::Add(line) => {
                reference = reference.with_node(node_of(line)).unwrap();
                expected.push(line.clone());
            }
            Edit::Remove(id) => {
                if line_of(id).state == LineState::Active {
                    reference = reference.without_node(id).unwrap();
                }
                expected.retain(|l| l.id != *id);
            }
            Edit::Weight(id, w) => {
                if line_of(id).state == LineState::Active {
                    reference = reference.with_weight(id, *w).unwrap();
                }
                for l in expected.iter_mut().filter(|l| l.id == *id) {
                    l.weight = *w;
                }
            }
            Edit::Eject(id) => {
                reference = reference.without_node(id).unwrap();
                for l in expected.iter_mut().filter(|l| l.id == *id) {
                    l.state = LineState::Ejected(None);
                }
            }
            Edit::Restore(id) => {
                let line = line_of(id).with_state(LineState::Active);
                reference = reference.with_node(node_of(&line)).unwrap();
                for l in expected.iter_mut().filter(|l| l.id == *id) {
                    l.state = LineState::Active;
                }
            }
        }
        pool = next;
        let written = reread(&pool);
        assert_eq!(written.version(), pool.version(), "{distribution} step {step}: the file reads back alike");
        let fresh = written.snapshot().unwrap();
        let want = if incremental {
            let snapshot = Snapshot::new(reference.clone(), None, matches!(distribution, "ketama" | "modula"));
            owners(&snapshot, &keys)
        } else {
            let mut b = PoolConfig::builder("p").distribution(distribution).hash(hash);
            for l in expected.iter().filter(|l| l.state == LineState::Active) {
                b = b.server_line(&l.to_string());
            }
            owners(&b.build().unwrap().snapshot().unwrap(), &keys)
        };
        let got = owners(&fresh, &keys);
        let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{distribution} step {step} after {edit}: {differ} of {KEYS} keys differ");
    }
    if !matches!(distribution, "jump" | "jumpback") {
        assert_eq!(refused, 0);
    }
}

macro_rules! follows_its_file {
    ($($test:ident: $distribution:literal, $seeds:expr;)*) => {$(
        #[test]
        fn $test() {
            for seed in $seeds {
                run($distribution, seed);
            }
        }
    )*};
}

// Anchor's bucket history is the one that needs the file's markers: more
// sequences of it.
follows_its_file! {
    anchor_follows_its_file: "anchor", [1, 7];
    ring_follows_its_file: "ring", [7];
    ketama_follows_its_file: "ketama", [7];
    modula_follows_its_file: "modula", [7];
    nginx_follows_its_file: "nginx", [7];
    rendezvous_follows_its_file: "rendezvous", [7];
    maglev_follows_its_file: "maglev", [7];
    multiprobe_follows_its_file: "multiprobe", [7];
    bounded_follows_its_file: "bounded", [7];
    jump_follows_its_file: "jump", [7];
    jumpback_follows_its_file: "jumpback", [7];
}
