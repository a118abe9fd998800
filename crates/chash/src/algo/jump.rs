//! Jump consistent hash (Lamping & Veach, 2014): `distribution: jump`, and
//! JumpBackHash (Ertl, 2024), the same family in O(1) expected steps:
//! `distribution: jumpback`.

use crate::node::{check_unique, check_unweighted, index_of};
use crate::placement::Placement;
use crate::points::Seen;
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

/// The bucket in `0..buckets` that JumpBackHash (Ertl, 2024) gives `key`; 0
/// when `buckets` is 0 or 1.
///
/// The same guarantee as [`jump_hash`] (growing `buckets` by one moves a key
/// only to the new bucket, and every bucket gets an equal share), reached
/// the other way round: instead of following the key's jumps up from bucket
/// 0, one random bit per power-of-two range `[q, 2q)` says whether the key's
/// last jump below `2q` lands in that range, and the search goes down from
/// the highest such range below `buckets`. A range that reaches past
/// `buckets` redraws within `[0, 2q)` until the draw falls below `q` (next
/// range down) or below `buckets` (the answer). That takes fewer than two
/// draws on average whatever `buckets` is, and no division: the random bits
/// come from a SplitMix64 stream seeded with `key`. Its placement differs
/// from `jump_hash`'s (it is another distribution, `jumpback`).
///
/// ```
/// use chash::algo::jump_back_hash;
/// let b = jump_back_hash(0xdead_beef, 100);
/// assert!(b < 100);
/// let grown = jump_back_hash(0xdead_beef, 101);
/// assert!(grown == b || grown == 100);
/// ```
#[inline]
pub fn jump_back_hash(key: u64, buckets: u32) -> u32 {
    if buckets <= 1 {
        return 0;
    }
    let mut stream = SplitMix64(key);
    let first = stream.next();
    // One bit per range [2^j, 2^(j+1)) that holds a bucket below `buckets`.
    let ranges = u32::MAX >> (buckets - 1).leading_zeros();
    let mut pending = (first ^ (first >> 32)) as u32 & ranges;
    while pending != 0 {
        let q = 1u32 << (31 - pending.leading_zeros());
        // The key's place in [q, 2q), from the half of the first draw that
        // the range bits above did not use up.
        let half = (first >> ((pending.count_ones() << 5) & 63)) as u32;
        let landed = q + (half & (q - 1));
        if landed < buckets {
            return landed;
        }
        // Past the end: draw again in [0, 2q), two candidates per draw.
        let within = (q << 1).wrapping_sub(1);
        'redraw: loop {
            let w = stream.next();
            for candidate in [w as u32 & within, (w >> 32) as u32 & within] {
                if candidate < q {
                    break 'redraw;
                }
                if candidate < buckets {
                    return candidate;
                }
            }
        }
        pending ^= q;
    }
    0
}

/// SplitMix64 (Steele, Lea & Flood): the random stream of a key.
struct SplitMix64(u64);

impl SplitMix64 {
    #[inline]
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Which member of the jump family a [`Jump`] placement runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JumpVariant {
    /// Lamping & Veach's loop ([`jump_hash`]): `distribution: jump`.
    #[default]
    Lamping,
    /// Ertl's JumpBackHash ([`jump_back_hash`]): `distribution: jumpback`.
    Back,
}

impl JumpVariant {
    /// The `distribution:` name.
    pub fn name(self) -> &'static str {
        match self {
            JumpVariant::Lamping => "jump",
            JumpVariant::Back => "jumpback",
        }
    }

    #[inline]
    fn bucket(self, key: u64, buckets: u32) -> u32 {
        match self {
            JumpVariant::Lamping => jump_hash(key, buckets),
            JumpVariant::Back => jump_back_hash(key, buckets),
        }
    }
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
///
/// [`Jump::jump_back`] runs [`jump_back_hash`] instead (`distribution:
/// jumpback`): the same guarantees and limits, a different placement, and a
/// lookup that costs the same at any node count.
#[derive(Clone, Debug)]
pub struct Jump<T = ()> {
    nodes: Vec<Node<T>>,
    hasher: KeyHasher,
    variant: JumpVariant,
}

impl Jump<()> {
    /// Jump over `nodes` with key hash xxh3.
    ///
    /// # Errors
    /// As [`Jump::with_hasher`].
    pub fn new(nodes: Vec<Node>) -> Result<Jump> {
        Jump::with_hasher(nodes, KeyHasher::Xxh3)
    }

    /// JumpBackHash over `nodes` with key hash xxh3.
    ///
    /// # Errors
    /// As [`Jump::with_hasher`].
    pub fn jump_back(nodes: Vec<Node>) -> Result<Jump> {
        Jump::with_variant(nodes, KeyHasher::Xxh3, JumpVariant::Back)
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
        Jump::with_variant(nodes, hasher, JumpVariant::Lamping)
    }

    /// As [`Jump::with_hasher`], running `variant`.
    ///
    /// # Errors
    /// As [`Jump::with_hasher`].
    pub fn with_variant(nodes: Vec<Node<T>>, hasher: KeyHasher, variant: JumpVariant) -> Result<Jump<T>> {
        check_unique(&nodes)?;
        check_unweighted(&nodes, variant.name())?;
        if nodes.len() > i32::MAX as usize {
            return Err(Error::Unsupported(format!("{} holds at most {} nodes", variant.name(), i32::MAX)));
        }
        Ok(Jump { nodes, hasher, variant })
    }

    /// Which member of the family this placement runs.
    pub fn variant(&self) -> JumpVariant {
        self.variant
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
        Jump::with_variant(nodes, self.hasher, self.variant)
    }

    /// A new placement without the last node: only its keys move.
    /// Without nodes it returns an empty placement.
    pub fn without_last(&self) -> Jump<T> {
        let mut nodes = self.nodes.clone();
        nodes.pop();
        Jump { nodes, hasher: self.hasher, variant: self.variant }
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
                "distribution {} can only remove its last node ({:?}); {id:?} is node {} of {}: \
                 use anchor to remove any node",
                self.variant.name(),
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
        Some(self.variant.bucket(hash, self.nodes.len() as u32) as usize)
    }

    fn candidates_hash(&self, hash: u64) -> JumpCandidates {
        JumpCandidates::new(hash, self.nodes.len() as u32, self.variant)
    }
}

/// Jump's order of alternatives: the owner; then the node that would own the
/// key if the owner and every node after it left (`jump_hash(h, owner)`), and
/// so on down to node 0; then the remaining nodes in index order.
///
/// The first part is exact failover for jump's only removal: when the last
/// node leaves, its keys go to their second candidate. No step allocates;
/// the first part costs O(ln n) per step, the rest O(1) amortised.
/// (JumpBackHash: the same order; its first part is remembered in a bit set,
/// which allocates once past 1,024 nodes.)
#[derive(Clone, Debug)]
pub struct JumpCandidates {
    hash: u64,
    buckets: u32,
    variant: JumpVariant,
    /// JumpBackHash's first part, to skip it in the second.
    chained: Option<Seen>,
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
    fn new(hash: u64, buckets: u32, variant: JumpVariant) -> Self {
        let chained = (variant == JumpVariant::Back).then(|| Seen::new(buckets as usize));
        JumpCandidates {
            hash,
            buckets,
            variant,
            chained,
            chain: None,
            chain_done: buckets == 0,
            index: 0,
            steps: JumpSteps::new(hash),
        }
    }
}

impl Iterator for JumpCandidates {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if !self.chain_done {
            let b = self.variant.bucket(self.hash, self.chain.unwrap_or(self.buckets));
            self.chain = Some(b);
            if let Some(seen) = &mut self.chained {
                seen.insert(b as usize);
            }
            self.chain_done = b == 0;
            return Some(b as usize);
        }
        while self.index < self.buckets {
            let i = self.index;
            self.index += 1;
            if let Some(seen) = &mut self.chained {
                if seen.insert(i as usize) {
                    return Some(i as usize);
                }
                continue;
            }
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
        for j in [Jump::new(nodes(37)).unwrap(), Jump::jump_back(nodes(37)).unwrap()] {
            candidates_of(&j);
        }
        // JumpBackHash's first part: the owner's bucket after the owner and
        // every node after it left.
        let j = Jump::jump_back(nodes(100)).unwrap();
        for h in 0..200u64 {
            let c: Vec<usize> = j.candidates_hash(h).collect();
            if c[0] > 0 {
                assert_eq!(c[1], jump_back_hash(h, c[0] as u32) as usize);
            }
        }
    }

    /// Growing the bucket count moves keys only to the new bucket, and every
    /// bucket gets its share (within 6 sigma of the binomial spread).
    #[test]
    fn jump_back_is_consistent_and_balanced() {
        let mut state = 7u64;
        let keys: Vec<u64> = (0..20_000)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                state ^ (state >> 29)
            })
            .collect();
        let mut before: Vec<u32> = keys.iter().map(|&k| jump_back_hash(k, 1)).collect();
        assert!(before.iter().all(|&b| b == 0));
        for n in 2..=70u32 {
            let now: Vec<u32> = keys.iter().map(|&k| jump_back_hash(k, n)).collect();
            for (a, b) in before.iter().zip(&now) {
                assert!(a == b || *b == n - 1, "n {n}: {a} -> {b}");
            }
            before = now;
        }
        for n in [3u32, 10, 64, 65, 100, 1000, (1 << 31) + 5] {
            let buckets = n.min(1000) as usize;
            let mut counts = vec![0u32; buckets];
            let total = 200_000u64;
            for k in 0..total {
                let b = jump_back_hash(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), n);
                assert!(b < n);
                if (b as usize) < buckets {
                    counts[b as usize] += 1;
                }
            }
            if n <= 1000 {
                let mean = total as f64 / n as f64;
                let sigma = (mean * (1.0 - 1.0 / n as f64)).sqrt();
                for (b, &c) in counts.iter().enumerate() {
                    assert!((f64::from(c) - mean).abs() < 6.0 * sigma, "n {n} bucket {b}: {c} vs {mean}");
                }
            }
        }
    }

    fn candidates_of(j: &Jump) {
        for h in [0u64, 1, 42, u64::MAX, 0x1234_5678_9abc_def0] {
            let c: Vec<usize> = j.candidates_hash(h).collect();
            assert_eq!(c[0], j.locate_hash(h).unwrap());
            let mut s = c.clone();
            s.sort_unstable();
            assert_eq!(s, (0..37).collect::<Vec<_>>());
        }
    }
}
