//! The seed documents' rings, written as configs in `testdata/seeds/`:
//! chash must reproduce every hash and placement the seeds print.

use std::path::PathBuf;

use chash::config::Config;
use chash::Snapshot;
use chash::{Error, KeyHasher, Placement, PointLabel, PointRing};

fn snapshot(file: &str) -> Snapshot {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/seeds").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    Config::from_yaml(&text).unwrap().pool(None).unwrap().snapshot().unwrap()
}

fn route<'s>(s: &'s Snapshot, key: &str) -> (&'s str, i128) {
    let hash = s.key_hash(key.as_bytes());
    (s.route(key.as_bytes()).unwrap(), s.placement().hasher().value_of_position(hash))
}

#[test]
fn seed001_without_virtual_nodes() {
    let s = snapshot("seed001-novn.yml");
    let h = KeyHasher::JavaFnv1_32InLoop;
    let printed = [481_136_787, 1_207_862_292, 970_668_381, 255_327_084, 2_131_030_089];
    for (i, want) in printed.iter().enumerate() {
        assert_eq!(h.value(format!("192.168.0.112:100{i}").as_bytes()), *want);
    }
    assert_eq!(route(&s, "太阳"), ("192.168.0.112:1002", 606_807_096));
    assert_eq!(route(&s, "月亮"), ("192.168.0.112:1003", 244_383_856));
    assert_eq!(route(&s, "星星"), ("192.168.0.112:1004", 1_233_020_469));
}

#[test]
fn seed001_with_virtual_nodes() {
    let s = snapshot("seed001-vn.yml");
    let chash::AnyPlacement::Ring(ring) = s.placement() else { panic!("a ring") };
    // The 25 virtual-node hashes the seed prints, server by server, VN0..VN4.
    let printed: [[i128; 5]; 5] = [
        [426_605_410, 806_679_074, 1_854_117_913, 1_685_468_505, 819_484_125],
        [1_631_497_057, 919_025_337, 1_323_825_146, 280_852_816, 648_131_592],
        [857_453_929, 239_883_060, 887_503_354, 548_174_262, 392_490_292],
        [96_663_676, 1_227_495_797, 559_011_748, 296_302_209, 1_211_728_920],
        [1_881_924_403, 1_991_114_675, 1_652_311_339, 1_096_234_241, 1_405_901_184],
    ];
    let label: PointLabel = "{id}&&VN{i}".parse().unwrap();
    let hasher = KeyHasher::JavaFnv1_32;
    for (server, hashes) in printed.iter().enumerate() {
        let node = &ring.nodes()[server];
        for (i, want) in hashes.iter().enumerate() {
            assert_eq!(hasher.value(&label.render(node, i as u32)), *want, "{}&&VN{i}", node.id());
        }
    }
    // The ring holds exactly those 25 points.
    let mut on_ring: Vec<i128> = ring.point_hashes().iter().map(|&p| hasher.value_of_position(p)).collect();
    let mut all: Vec<i128> = printed.iter().flatten().copied().collect();
    on_ring.sort_unstable();
    all.sort_unstable();
    assert_eq!(on_ring, all);
    // Keys, and the virtual node each lands on.
    for (key, server, vn, hash) in [
        ("太阳", "192.168.0.112:1004", 1, 1_977_106_057),
        ("月亮", "192.168.0.112:1003", 4, 1_132_637_661),
        ("星星", "192.168.0.112:1002", 2, 880_019_273),
    ] {
        assert_eq!(route(&s, key), (server, hash));
        let pos = ring.point_hashes().partition_point(|&p| p < s.key_hash(key.as_bytes()));
        assert_eq!(hasher.value_of_position(ring.point_hashes()[pos]), printed[ring.point_owner(pos)][vn]);
    }
}

#[test]
fn seed003_murmur_ring_and_removal() {
    let s = snapshot("seed003.yml");
    let printed = [
        ("1111號客戶端", "n1", -5_471_088_278_396_709_594),
        ("1112號客戶端", "n1", -4_258_942_853_280_738_263),
        ("1113號客戶端", "n2", -5_572_167_153_201_263_216),
        ("1114號客戶端", "n3", 5_327_220_965_487_432_534),
        ("1115號客戶端", "n2", 8_779_702_325_765_675_350),
        ("1116號客戶端", "n2", 7_453_177_204_180_435_892),
        ("1117號客戶端", "n4", 947_297_217_823_232_516),
        ("1118號客戶端", "n3", -6_530_750_244_435_769_735),
        ("1119號客戶端", "n1", 4_250_876_462_402_385_736),
    ];
    for (key, node, hash) in printed {
        assert_eq!(route(&s, key), (node, hash), "{key}");
    }
    // Removing n2 moves exactly its three clients and nothing else.
    let chash::AnyPlacement::Ring(ring) = s.placement() else { panic!("a ring") };
    let without = ring.without_node("n2").unwrap();
    let moved: Vec<(&str, &str)> = printed
        .iter()
        .filter_map(|(key, before, _)| {
            let after = without.node_for(key.as_bytes()).unwrap().id();
            (after != *before).then_some((*key, after))
        })
        .collect();
    assert_eq!(moved, [("1113號客戶端", "n4"), ("1115號客戶端", "n1"), ("1116號客戶端", "n4")]);
    // Each went to the owner of the next surviving point after it.
    for (key, to) in &moved {
        let h = s.key_hash(key.as_bytes());
        let next = ring.points().find(|&(p, o)| p >= h && ring.nodes()[o].id() != "n2");
        let (_, owner) = next.unwrap_or_else(|| ring.points().find(|&(_, o)| ring.nodes()[o].id() != "n2").unwrap());
        assert_eq!(ring.nodes()[owner].id(), *to);
    }
    // The seed then adds a second node called "n3": in chash that is an error.
    let again = chash::Node::new("n3", 1).unwrap();
    assert_eq!(without.with_node(again).unwrap_err(), Error::DuplicateNode("n3".into()));
}

/// The seed's own run reports 1115 → n3 and 1116 → n1 after removing n2,
/// not n1 and n4: its `deleteNode` calls `tailNodes.remove(...)` on a
/// `TreeMap` view, which writes through, so every deleted virtual node also
/// deletes the point after it (100 points of other hosts in all). Replaying
/// that procedure on chash's copy of the seed's ring reproduces the seed's
/// move log exactly, which shows the rings are the same and the difference
/// is the seed's bug.
#[test]
fn seed003_printed_move_log_comes_from_its_view_bug() {
    use std::collections::BTreeMap;
    let s = snapshot("seed003.yml");
    let chash::AnyPlacement::Ring(ring) = s.placement() else { panic!("a ring") };
    let hasher = ring.hasher();
    let label: PointLabel = "SHARD-{id}-NODE-{i}".parse().unwrap();
    let mut points: BTreeMap<u64, usize> = ring.points().collect();
    let keys: Vec<String> = (1111..1120).map(|c| format!("{c}號客戶端")).collect();
    let mut clients: BTreeMap<u64, usize> =
        keys.iter().map(|k| (s.key_hash(k.as_bytes()), s.route_index(k.as_bytes()).unwrap())).collect();
    let n2 = ring.index_of("n2").unwrap();
    let mut log = Vec::new();
    for i in 0..100 {
        let key = hasher.hash(&label.render(&ring.nodes()[n2], i));
        let between: Vec<u64> = match points.range(..key).next_back() {
            Some((&prev, _)) => clients.range(prev..key).map(|(&k, _)| k).collect(),
            None => {
                let last = *points.keys().next_back().unwrap();
                clients.range(last..).map(|(&k, _)| k).collect()
            }
        };
        // nodes.remove(tailNodes.firstKey()); tailNodes.remove(tailNodes.firstKey());
        for _ in 0..2 {
            if let Some(&first) = points.range(key..).next().map(|(k, _)| k) {
                points.remove(&first);
            }
        }
        for kt in between {
            let to = points.range(key..).next().map_or_else(|| *points.values().next().unwrap(), |(_, &o)| o);
            clients.insert(kt, to);
            log.push((kt, ring.nodes()[to].id()));
        }
    }
    let named: Vec<(&str, &str)> = log
        .iter()
        .map(|&(h, to)| (keys.iter().find(|k| s.key_hash(k.as_bytes()) == h).unwrap().as_str(), to))
        .collect();
    assert_eq!(named, [("1113號客戶端", "n4"), ("1116號客戶端", "n1"), ("1115號客戶端", "n3")]);
    assert_eq!(points.len(), 200, "the seed's ring lost 100 points of other hosts");
}

#[test]
fn seed002_config_builds() {
    let s = snapshot("seed002.yml");
    assert_eq!(s.placement().hasher(), KeyHasher::JavaMd5Int31);
    assert!(s.route(b"some-key").is_some());
}

/// Seed 000's ring as a config: its labels and its md5-sum hash.
#[test]
fn seed000_ring_as_a_config() {
    let s = snapshot("seed000.yml");
    let chash::AnyPlacement::Ring(ring) = s.placement() else { panic!("a ring") };
    assert_eq!(ring.point_count(), 50 + 80 + 20 + 100);
    let label: PointLabel = "{id}{i*}".parse().unwrap();
    let a = &ring.nodes()[0];
    assert_eq!(label.render(a, 0), b"machineA0");
    assert_eq!(label.render(a, 2), b"machineA012");
    assert_eq!(label.render(a, 11), b"machineA01234567891011");
    // The seed's hash: the four little-endian words of MD5 added up.
    let sum = |text: &[u8]| {
        use md5::{Digest, Md5};
        let d = Md5::digest(text);
        d.chunks(4).map(|w| u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))).sum::<u64>()
    };
    assert_eq!(KeyHasher::Md5Sum.hash(b"machineA012"), sum(b"machineA012"));
    let hashes: Vec<u64> = ring.point_hashes().to_vec();
    assert!(hashes.contains(&sum(b"machineA01")));
    assert!(s.route(b"10.3.0.201").is_some());
}

/// Seed 004's ring as a config: one point per server at FNV1_32 of the
/// server string; its String.hashCode() counter-example is tested in hash.rs.
#[test]
fn seed004_ring_as_a_config() {
    let s = snapshot("seed004.yml");
    let chash::AnyPlacement::Ring(ring) = s.placement() else { panic!("a ring") };
    assert_eq!(ring.point_count(), 5);
    for (pos, &p) in ring.point_hashes().iter().enumerate() {
        let id = ring.nodes()[ring.point_owner(pos)].id();
        assert_eq!(p, KeyHasher::JavaFnv1_32.hash(id.as_bytes()), "{id}");
    }
    // Unlike String.hashCode(), FNV1_32 spreads these neighbours over the ring.
    let values: Vec<i128> = ring.point_hashes().iter().map(|&p| KeyHasher::JavaFnv1_32.value_of_position(p)).collect();
    let spread = values.iter().max().unwrap() - values.iter().min().unwrap();
    assert!(spread > 1 << 29, "{values:?}");
}
