//! Jump consistent hash (Lamping & Veach, 2014): `distribution: jump`.

use crate::node::{check_unique, check_unweighted, index_of};
use crate::placement::Placement;
use crate::{Error, KeyHasher, Node, Result};

/// The bucket in `0..buckets` that jump consistent hash gives `key`, exactly
/// as the paper's loop computes it (a 64-bit LCG and a double-precision
/// division per step); 0 when `buckets` is 0.
///
/// Growing `buckets` by one moves a key only to the new bucket.
///
/// ```
/// use chash::algo::jump_hash;
/// assert_eq!(jump_hash(0, 1), 0);
/// let b = jump_hash(0xdead_beef, 100);
/// assert!(b < 100);
/// let grown = jump_hash(0xdead_beef, 101);
/// assert!(grown == b || grown == 100);
/// ```
#[inline]
pub fn jump_hash(key: u64, buckets: u32) -> u32 {
    let mut steps = JumpSteps::new(key);
    let mut b = 0;
    while steps.next < i64::from(buckets) {
        b = steps.next;
        steps.advance();
    }
    b as u32
}

/// The paper's loop, one bucket at a time: the buckets a key visits as the
/// bucket count grows (0 first, strictly increasing).
#[derive(Clone, Copy, Debug)]
struct JumpSteps {
    key: u64,
    /// The next bucket the key jumps to.
    next: i64,
}

impl JumpSteps {
    #[inline]
    fn new(key: u64) -> Self {
        JumpSteps { key, next: 0 }
    }

    #[inline]
    fn advance(&mut self) {
        let b = self.next;
        self.key = self.key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        // A float-to-int cast saturates: no overflow whatever the key.
        self.next = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((self.key >> 33) + 1) as f64)) as i64;
    }
}

/// Jump consistent hash over a list of equal nodes: node `i` is bucket `i`,
/// and a key with hash `h` belongs to `jump_hash(h, n)`.
///
/// No table and no memory beyond the node list; O(ln n) steps per lookup,
/// and perfect balance up to sampling. Its one limit is in the changes it
/// allows: a node can only be added at the end ([`with_node`](Jump::with_node))
/// and only the last node can leave ([`without_last`](Jump::without_last));
/// removing any other node is an error, because jump has no way to take a
/// bucket out of the middle without renumbering the ones after it (which
/// moves their keys). Use [`Anchor`](crate::algo::Anchor) when any node can
/// fail. Weights are not supported: every node must have weight 1.
///
/// ```
/// use chash::algo::Jump;
/// use chash::{Node, Placement};
/// let jump = Jump::new(vec![Node::new("a", 1)?, Node::new("b", 1)?])?;
/// let grown = jump.with_node(Node::new("c", 1)?)?;
/// let (before, after) = (jump.locate(b"k").unwrap(), grown.locate(b"k").unwrap());
/// assert!(after == before || after == 2);
/// assert!(grown.without_node("a").is_err()); // only the last node can leave
/// assert_eq!(grown.without_last().nodes().len(), 2);
/// # Ok::<(), chash::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Jump<T = ()> {
    nodes: Vec<Node<T>>,
    hasher: KeyHasher,
}

impl Jump<()> {
    /// Jump over `nodes` with key hash xxh3.
    ///
    /// # Errors
    /// As [`Jump::with_hasher`].
    pub fn new(nodes: Vec<Node>) -> Result<Jump> {
        Jump::with_hasher(nodes, KeyHasher::Xxh3)
    }
}

impl<T> Jump<T> {
    /// Jump over `nodes` (bucket `i` is `nodes[i]`) with key hash `hasher`.
    ///
    /// # Errors
    /// [`Error::DuplicateNode`]; [`Error::WeightsUnsupported`] for a weight
    /// other than 1; [`Error::Unsupported`] past `i32::MAX` nodes (the
    /// paper's loop counts buckets in a signed 32-bit range).
    pub fn with_hasher(nodes: Vec<Node<T>>, hasher: KeyHasher) -> Result<Jump<T>> {
        check_unique(&nodes)?;
        check_unweighted(&nodes, "jump")?;
        if nodes.len() > i32::MAX as usize {
            return Err(Error::Unsupported(format!("jump holds at most {} nodes", i32::MAX)));
        }
        Ok(Jump { nodes, hasher })
    }
}

impl<T: Clone> Jump<T> {
    /// A new placement with `node` added as the last bucket: only keys that
    /// move to it move.
    ///
    /// # Errors
    /// [`Error::DuplicateNode`], [`Error::WeightsUnsupported`].
    pub fn with_node(&self, node: Node<T>) -> Result<Jump<T>> {
        let mut nodes = self.nodes.clone();
        nodes.push(node);
        Jump::with_hasher(nodes, self.hasher)
    }

    /// A new placement without the last node: only its keys move.
    /// Without nodes it returns an empty placement.
    pub fn without_last(&self) -> Jump<T> {
        let mut nodes = self.nodes.clone();
        nodes.pop();
        Jump { nodes, hasher: self.hasher }
    }

    /// A new placement without node `id`, which must be the last node.
    ///
    /// # Errors
    /// [`Error::UnknownNode`]; [`Error::Unsupported`] when `id` is not the
    /// last node (jump can only remove its last bucket).
    pub fn without_node(&self, id: &str) -> Result<Jump<T>> {
        let at = index_of(&self.nodes, id)?;
        if at + 1 != self.nodes.len() {
            return Err(Error::Unsupported(format!(
                "distribution jump can only remove its last node ({:?}); {id:?} is node {} of {}: \
                 use anchor to remove any node",
                self.nodes[self.nodes.len() - 1].id(),
                at + 1,
                self.nodes.len()
            )));
        }
        Ok(self.without_last())
    }
}

impl<T: Send + Sync> Placement for Jump<T> {
    type Payload = T;
    type Candidates<'a>
        = JumpCandidates
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
        Some(jump_hash(hash, self.nodes.len() as u32) as usize)
    }

    fn candidates_hash(&self, hash: u64) -> JumpCandidates {
        JumpCandidates::new(hash, self.nodes.len() as u32)
    }
}

/// Jump's order of alternatives: the owner; then the node that would own the
/// key if the owner and every node after it left (`jump_hash(h, owner)`), and
/// so on down to node 0; then the remaining nodes in index order.
///
/// The first part is exact failover for jump's only removal: when the last
/// node leaves, its keys go to their second candidate. No step allocates;
/// the first part costs O(ln n) per step, the rest O(1) amortised.
#[derive(Clone, Debug)]
pub struct JumpCandidates {
    hash: u64,
    buckets: u32,
    /// The last node of the first part yielded, while in the first part.
    chain: Option<u32>,
    /// The first part has ended (node 0 was yielded).
    chain_done: bool,
    /// Next index to consider in the second part.
    index: u32,
    /// Walks the first part's nodes in increasing order, to skip them.
    steps: JumpSteps,
}

impl JumpCandidates {
    fn new(hash: u64, buckets: u32) -> Self {
        JumpCandidates { hash, buckets, chain: None, chain_done: buckets == 0, index: 0, steps: JumpSteps::new(hash) }
    }
}

impl Iterator for JumpCandidates {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if !self.chain_done {
            let b = match self.chain {
                None => jump_hash(self.hash, self.buckets),
                Some(prev) => jump_hash(self.hash, prev),
            };
            self.chain = Some(b);
            self.chain_done = b == 0;
            return Some(b as usize);
        }
        while self.index < self.buckets {
            let i = self.index;
            self.index += 1;
            if i64::from(i) == self.steps.next {
                self.steps.advance();
                continue;
            }
            return Some(i as usize);
        }
        None
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
        let weighted = vec![Node::new("a", 1).unwrap(), Node::new("b", 2).unwrap()];
        let err = Jump::new(weighted).unwrap_err();
        assert!(err.to_string().contains("does not support weights"), "{err}");
        let j = Jump::new(nodes(3)).unwrap();
        assert!(j.without_node("n0").unwrap_err().to_string().contains("only remove its last node"));
        assert_eq!(j.without_node("zz").unwrap_err(), Error::UnknownNode("zz".into()));
        assert_eq!(j.without_node("n2").unwrap().nodes().len(), 2);
        let empty = Jump::new(vec![]).unwrap();
        assert_eq!(empty.locate_hash(7), None);
        assert_eq!(empty.candidates_hash(7).count(), 0);
        assert_eq!(empty.without_last().nodes().len(), 0);
    }

    #[test]
    fn candidates_cover_every_node_once() {
        let j = Jump::new(nodes(37)).unwrap();
        for h in [0u64, 1, 42, u64::MAX, 0x1234_5678_9abc_def0] {
            let c: Vec<usize> = j.candidates_hash(h).collect();
            assert_eq!(c[0], j.locate_hash(h).unwrap());
            let mut s = c.clone();
            s.sort_unstable();
            assert_eq!(s, (0..37).collect::<Vec<_>>());
        }
    }
}
