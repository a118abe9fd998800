//! AnchorHash (Mendelson, Vargaftik, Barabash, Lorenz, Keslassy, Orda,
//! 2020): `distribution: anchor` (alias `memento`).

use super::mix::{mix2, reduce};
use crate::node::{check_unique, check_unweighted, index_of};
use crate::placement::Placement;
use crate::{Error, KeyHasher, Node, Result};

/// Buckets unless set: 1024. Lookups stay O(1) for any node count up to
/// it (about ln(capacity / nodes) extra steps per lookup).
pub const DEFAULT_ANCHOR_CAPACITY: u32 = 1024;

/// The largest capacity chash builds (20 bytes per bucket: 320 MiB).
const MAX_CAPACITY: u32 = 1 << 24;

/// "Not a working bucket" in `bucket_node`.
const NO_NODE: u32 = u32::MAX;

/// AnchorHash: any node can leave, with optimal movement and perfect
/// balance, and lookups stay O(1).
///
/// There is a fixed set of `capacity` buckets (the *anchor*); each node owns
/// one. A key with hash `h` (in a `b`-bit space) first picks bucket
/// `⌊h × capacity / 2^b⌋`. A bucket without a node was *removed* when the
/// number of working buckets fell to some `s`; the key then re-draws
/// uniformly among those `s` buckets (position `⌊mix2(h, bucket) × s / 2^64⌋`
/// in the working list as it was right after that removal; see
/// [`mix2`](crate::algo::mix2)) and repeats until it reaches a working
/// bucket. So removing a node moves exactly its keys, spread evenly over the
/// others, and adding one moves keys only to it.
///
/// # What the placement depends on
/// The capacity, which bucket each node holds, and the stack of free
/// buckets — that is, the membership and the order of changes:
/// - a fresh build puts node `i` on bucket `i` and frees buckets
///   `capacity − 1` down to `n`, so bucket `n` is on top of the stack;
/// - [`without_node`](Anchor::without_node) frees the node's bucket (it goes
///   on top of the stack, and the working list moves its last bucket into
///   the freed position);
/// - [`with_node`](Anchor::with_node) gives the new node the bucket on top
///   of the stack, undoing that bucket's removal exactly.
///
/// So appending nodes to the list, or removing the last ones, gives the same
/// placement as a fresh build of the new list; any other history is
/// reproduced by replaying the same changes in the same order (two processes
/// that apply the same changes agree on every key). A node that joins right
/// after another left takes over exactly the keys the leaver had.
///
/// Lookup: O(1) expected, about `ln(capacity / n)` re-draws for keys that
/// start on a free bucket. Memory: 20 bytes per bucket. Weights are not
/// supported (every node must have weight 1). The capacity is a `u32` (up to
/// 2^24 buckets), not a `u16`.
///
/// ```
/// use chash::algo::Anchor;
/// use chash::{Node, Placement};
/// let nodes = (0..5).map(|i| Node::new(format!("n{i}"), 1)).collect::<Result<Vec<_>, _>>()?;
/// let anchor = Anchor::new(nodes)?;
/// let owner = anchor.node_for(b"user:42").unwrap().id().to_owned();
/// let smaller = anchor.without_node("n2")?;       // any node can leave
/// let now = smaller.node_for(b"user:42").unwrap().id();
/// assert!(now == owner || owner == "n2");
/// # Ok::<(), chash::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Anchor<T = ()> {
    nodes: Vec<Node<T>>,
    hasher: KeyHasher,
    /// `64 - hasher bits`.
    shift: u32,
    /// `A[b]`: 0 while bucket `b` works, else the number of working buckets
    /// right after its removal.
    removed_at: Vec<u32>,
    /// `K[b]`: the bucket that took `b`'s position in the working list.
    next: Vec<u32>,
    /// `W`: the working list (positions `0..working` are the working buckets).
    list: Vec<u32>,
    /// `L[b]`: position of bucket `b` in the working list.
    position: Vec<u32>,
    /// `R`: free buckets, the next to be used last.
    free: Vec<u32>,
    /// Node index of each working bucket (`NO_NODE` for free ones).
    bucket_node: Vec<u32>,
    /// Bucket of each node.
    node_bucket: Vec<u32>,
}

impl Anchor<()> {
    /// AnchorHash over `nodes` with key hash xxh3 and capacity 1024.
    ///
    /// # Errors
    /// As [`Anchor::with_capacity`].
    pub fn new(nodes: Vec<Node>) -> Result<Anchor> {
        Anchor::with_capacity(nodes, KeyHasher::Xxh3, DEFAULT_ANCHOR_CAPACITY)
    }
}

impl<T> Anchor<T> {
    /// AnchorHash with `capacity` buckets over `nodes` (node `i` on bucket `i`).
    ///
    /// # Errors
    /// [`Error::DuplicateNode`]; [`Error::WeightsUnsupported`];
    /// [`Error::BadParameter`] when `capacity` is 0, above 2^24, or below
    /// the number of nodes.
    pub fn with_capacity(nodes: Vec<Node<T>>, hasher: KeyHasher, capacity: u32) -> Result<Anchor<T>> {
        check_unique(&nodes)?;
        check_unweighted(&nodes, "anchor")?;
        let bad = |reason: String| Error::BadParameter { name: "anchor_capacity", reason };
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(bad(format!("{capacity} is not between 1 and {MAX_CAPACITY}")));
        }
        if nodes.len() > capacity as usize {
            return Err(bad(format!(
                "{capacity} buckets cannot hold {} nodes: set a capacity of at least {} (a new capacity moves most keys)",
                nodes.len(),
                nodes.len()
            )));
        }
        let a = capacity as usize;
        let w = nodes.len();
        let ids: Vec<u32> = (0..capacity).collect();
        let mut removed_at = vec![0u32; a];
        let mut free = Vec::with_capacity(a);
        // The paper's INITANCHOR: buckets w..a are removed last-first.
        for b in (w..a).rev() {
            free.push(b as u32);
            removed_at[b] = b as u32;
        }
        let bucket_node = (0..a).map(|b| if b < w { b as u32 } else { NO_NODE }).collect();
        Ok(Anchor {
            nodes,
            hasher,
            shift: 64 - hasher.bits(),
            removed_at,
            next: ids.clone(),
            list: ids.clone(),
            position: ids,
            free,
            bucket_node,
            node_bucket: (0..w as u32).collect(),
        })
    }

    /// The number of buckets.
    pub fn capacity(&self) -> u32 {
        self.removed_at.len() as u32
    }

    /// The bucket node `i` holds.
    pub fn bucket_of(&self, i: usize) -> Option<u32> {
        self.node_bucket.get(i).copied()
    }

    /// Free buckets, the next to be taken last.
    pub fn free_buckets(&self) -> &[u32] {
        &self.free
    }

    /// Heap bytes of the bucket arrays.
    pub fn bucket_bytes(&self) -> usize {
        4 * (self.removed_at.capacity()
            + self.next.capacity()
            + self.list.capacity()
            + self.position.capacity()
            + self.free.capacity()
            + self.bucket_node.capacity()
            + self.node_bucket.capacity())
    }

    /// The working bucket for `hash` (the paper's GETBUCKET). Needs at
    /// least one working bucket.
    #[inline]
    fn bucket(&self, hash: u64) -> usize {
        let mut b = reduce(hash << self.shift, self.removed_at.len() as u64) as usize;
        loop {
            let s = self.removed_at[b];
            if s == 0 {
                return b;
            }
            // A uniform position among the s buckets that worked right after
            // b's removal; follow the buckets that held that position and
            // were removed before (at a larger size), to its holder then.
            let mut h = reduce(mix2(hash, b as u64), u64::from(s)) as usize;
            while self.removed_at[h] >= s {
                h = self.next[h] as usize;
            }
            b = h;
        }
    }

    /// The paper's REMOVEBUCKET.
    fn remove_bucket(&mut self, b: u32) {
        let working = self.nodes.len() as u32 - 1; // after the removal
        self.free.push(b);
        self.removed_at[b as usize] = working;
        let last = self.list[working as usize];
        let at = self.position[b as usize];
        self.list[at as usize] = last;
        self.position[last as usize] = at;
        self.next[b as usize] = last;
    }

    /// The paper's ADDBUCKET: restores the bucket on top of the stack.
    fn add_bucket(&mut self) -> Option<u32> {
        let b = self.free.pop()?;
        let working = self.nodes.len() as u32; // before the addition
        self.removed_at[b as usize] = 0;
        let moved = self.list[working as usize];
        self.position[moved as usize] = working;
        self.list[self.position[b as usize] as usize] = b;
        self.next[b as usize] = b;
        Some(b)
    }
}

impl<T: Clone> Anchor<T> {
    /// A new placement with `node` added on the bucket on top of the free
    /// stack: only keys moving to it move.
    ///
    /// # Errors
    /// [`Error::DuplicateNode`], [`Error::WeightsUnsupported`];
    /// [`Error::BadParameter`] when every bucket is taken.
    pub fn with_node(&self, node: Node<T>) -> Result<Anchor<T>> {
        if self.nodes.iter().any(|n| n.id() == node.id()) {
            return Err(Error::DuplicateNode(node.id().to_owned()));
        }
        check_unweighted(std::slice::from_ref(&node), "anchor")?;
        let mut next = self.clone();
        let b = next.add_bucket().ok_or_else(|| Error::BadParameter {
            name: "anchor_capacity",
            reason: format!(
                "all {} buckets are taken: a larger capacity is needed (a new capacity moves most keys)",
                self.capacity()
            ),
        })?;
        next.bucket_node[b as usize] = next.nodes.len() as u32;
        next.node_bucket.push(b);
        next.nodes.push(node);
        Ok(next)
    }

    /// A new placement without node `id`; only its keys move, evenly over
    /// the others. Nodes after it move down one index.
    ///
    /// # Errors
    /// [`Error::UnknownNode`].
    pub fn without_node(&self, id: &str) -> Result<Anchor<T>> {
        let at = index_of(&self.nodes, id)?;
        let mut next = self.clone();
        let b = next.node_bucket[at];
        next.remove_bucket(b);
        next.nodes.remove(at);
        next.node_bucket.remove(at);
        next.bucket_node[b as usize] = NO_NODE;
        for owner in &mut next.bucket_node {
            if *owner != NO_NODE && *owner as usize > at {
                *owner -= 1;
            }
        }
        Ok(next)
    }
}

impl<T: Send + Sync> Placement for Anchor<T> {
    type Payload = T;
    type Candidates<'a>
        = AnchorCandidates<'a, T>
    where
        T: 'a;

    fn hasher(&self) -> KeyHasher {
        self.hasher
    }

    fn nodes(&self) -> &[Node<T>] {
        &self.nodes
    }

    #[inline]
    fn locate_hash(&self, hash: u64) -> Option<usize> {
        if self.nodes.is_empty() {
            return None;
        }
        Some(self.bucket_node[self.bucket(hash)] as usize)
    }

    fn candidates_hash(&self, hash: u64) -> AnchorCandidates<'_, T> {
        AnchorCandidates { anchor: self, hash, step: 0, owner: 0, failover: 0, pos: 0 }
    }
}

/// AnchorHash's order of alternatives: the owner; then exactly the node its
/// keys would go to if the owner left (its failover); then the other
/// working buckets in working-list order, from the one after the failover's
/// position, wrapping. O(1) per step, no allocation.
#[derive(Clone, Debug)]
pub struct AnchorCandidates<'a, T> {
    anchor: &'a Anchor<T>,
    hash: u64,
    /// Candidates yielded so far.
    step: usize,
    owner: u32,
    failover: u32,
    /// Next working-list position to consider, after the first two.
    pos: usize,
}

impl<T> Iterator for AnchorCandidates<'_, T> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let a = self.anchor;
        let n = a.nodes.len();
        if self.step >= n {
            return None;
        }
        let bucket = match self.step {
            0 => {
                self.owner = a.bucket(self.hash) as u32;
                self.owner
            }
            1 => {
                // REMOVEBUCKET(owner) in thought: it would leave n - 1 working
                // buckets, its position taken by the last one, and the key
                // re-draws among those positions.
                let s = n - 1;
                let p = reduce(mix2(self.hash, u64::from(self.owner)), s as u64) as usize;
                let at = a.position[self.owner as usize] as usize;
                self.failover = if p == at { a.list[s] } else { a.list[p] };
                self.pos = (a.position[self.failover as usize] as usize + 1) % n;
                self.failover
            }
            _ => loop {
                let b = a.list[self.pos];
                self.pos = (self.pos + 1) % n;
                if b != self.owner && b != self.failover {
                    break b;
                }
            },
        };
        self.step += 1;
        Some(a.bucket_node[bucket as usize] as usize)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.anchor.nodes.len().saturating_sub(self.step);
        (left, Some(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<Node> {
        (0..n).map(|i| Node::new(format!("n{i}"), 1).unwrap()).collect()
    }

    #[test]
    fn errors_not_panics() {
        let e = Anchor::with_capacity(nodes(5), KeyHasher::Xxh3, 4).unwrap_err().to_string();
        assert!(e.contains("at least 5"), "{e}");
        assert!(Anchor::with_capacity(nodes(0), KeyHasher::Xxh3, 0).is_err());
        let full = Anchor::with_capacity(nodes(2), KeyHasher::Xxh3, 2).unwrap();
        assert!(full.with_node(Node::new("x", 1).unwrap()).unwrap_err().to_string().contains("taken"));
        assert!(Anchor::new(vec![Node::new("a", 2).unwrap()]).is_err());
        let one = Anchor::new(nodes(1)).unwrap();
        let none = one.without_node("n0").unwrap();
        assert_eq!(none.locate_hash(3), None);
        assert_eq!(none.candidates_hash(3).count(), 0);
        let back = none.with_node(Node::new("m", 1).unwrap()).unwrap();
        assert_eq!(back.locate_hash(3), Some(0));
    }

    #[test]
    fn appends_equal_fresh_builds() {
        let grown = Anchor::new(nodes(7)).unwrap().with_node(Node::new("n7", 1).unwrap()).unwrap();
        let fresh = Anchor::new(nodes(8)).unwrap();
        let shrunk = fresh.without_node("n7").unwrap();
        let small = Anchor::new(nodes(7)).unwrap();
        for h in (0..5000u64).map(|h| h.wrapping_mul(0x9e37_79b9_7f4a_7c15)) {
            assert_eq!(grown.locate_hash(h), fresh.locate_hash(h));
            assert_eq!(shrunk.locate_hash(h), small.locate_hash(h));
        }
    }

    #[test]
    fn failover_candidate_is_exact() {
        let a = Anchor::new(nodes(9)).unwrap().without_node("n3").unwrap();
        for h in (0..3000u64).map(|h| h.wrapping_mul(0x9e37_79b9_7f4a_7c15)) {
            let c: Vec<usize> = a.candidates_hash(h).collect();
            let mut sorted = c.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..8).collect::<Vec<_>>());
            let gone = a.without_node(a.nodes()[c[0]].id()).unwrap();
            let now = gone.node_for_hash_id(h);
            assert_eq!(now, a.nodes()[c[1]].id());
        }
    }

    impl Anchor {
        fn node_for_hash_id(&self, h: u64) -> &str {
            self.nodes[self.locate_hash(h).unwrap()].id()
        }
    }
}
