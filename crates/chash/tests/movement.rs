//! Weighted ketama's point counts depend on the total weight, so removing a
//! server also moves keys between the servers that stay (twemproxy and
//! libmemcached do this, and chash's ketama must too); the native ring never
//! moves a key between two remaining servers.

use chash::compat::Ketama;
use chash::{KeyHasher, Node, Placement, Ring};

fn nodes(spec: &[(&str, u32)]) -> Vec<Node> {
    spec.iter().map(|&(id, w)| Node::new(id, w).unwrap()).collect()
}

/// Keys whose owner changes between two remaining servers.
fn moved_between_survivors<P: Placement>(before: &P, after: &P, gone: &str, keys: &[Vec<u8>]) -> (usize, usize) {
    let (mut from_gone, mut between) = (0, 0);
    for k in keys {
        let (b, a) = (before.node_for(k).unwrap().id(), after.node_for(k).unwrap().id());
        if b != a {
            if b == gone {
                from_gone += 1;
            } else {
                between += 1;
            }
        }
    }
    (from_gone, between)
}

#[test]
fn ketama_moves_keys_between_survivors_and_the_ring_does_not() {
    let spec = [("127.0.0.1:11211", 1), ("127.0.0.1:11212", 2), ("127.0.0.1:11213", 1), ("127.0.0.1:11214", 3)];
    let keys: Vec<Vec<u8>> = (0..100_000).map(|i| format!("key:{i}").into_bytes()).collect();
    let gone = "127.0.0.1:11214";

    let k_before = Ketama::new(nodes(&spec), KeyHasher::Md5).unwrap();
    let k_after = Ketama::new(nodes(&spec[..3]), KeyHasher::Md5).unwrap();
    let (from_gone, between) = moved_between_survivors(&k_before, &k_after, gone, &keys);
    assert!(from_gone > 30_000, "{from_gone}");
    assert!(between > 1_000, "ketama re-balances the survivors too: {between} keys");

    let r_before = Ring::builder().hasher(KeyHasher::Md5).build(nodes(&spec)).unwrap();
    let r_after = r_before.without_node(gone).unwrap();
    let (from_gone, between) = moved_between_survivors(&r_before, &r_after, gone, &keys);
    assert!(from_gone > 30_000, "{from_gone}");
    assert_eq!(between, 0, "the native ring moves only the removed server's keys");
}
