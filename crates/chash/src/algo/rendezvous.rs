//! Rendezvous (highest random weight) hashing, weighted by the logarithmic
//! method: `distribution: rendezvous`.

use std::cmp::Ordering;

use super::mix::{fmix64, id_hash, mix2};
use crate::node::{check_unique, index_of};
use crate::placement::Placement;
use crate::points::id_ranks;
use crate::{KeyHasher, Node, Result};

/// Seed of the xxh3 hash of node ids (placement contract).
const NODE_SEED: u64 = 0x7265_6e64_657a_766f; // "rendezvo"

/// Weighted rendezvous hashing: every node scores every key, and the highest
/// score wins.
///
/// For a key with hash `h` and node `i` with id hash `n_i = xxh3(id, seed
/// 0x72656e64657a766f)`, the node's draw is `d = mix2(fmix64(h), n_i)` (see
/// [`mix2`](crate::algo::mix2)), taken as `u = ((d >> 11) + 0.5) / 2^53` in
/// (0, 1), and its score is `-weight / ln(u)` (Schindelhauer & Schomaker's
/// logarithmic method: node `i` wins with probability `weight_i / Σ weight`).
/// Equal scores go to the larger draw, then to the smaller id. When every
/// weight is equal the score is monotone in the draw, so lookups compare
/// draws and skip the logarithm (same result).
///
/// Each lookup costs O(n): one mix per node; when weights differ, a cheap
/// upper bound on the score (`weight / (1 − u)`) rules out most nodes, and
/// only the others need a logarithm. Balance is at the sampling floor; adding, removing or
/// re-weighting a node moves only keys to or from it. Memory: 8 bytes per
/// node beside the node list.
///
/// ```
/// use chash::algo::Rendezvous;
/// use chash::{Node, Placement};
/// let r = Rendezvous::new(vec![Node::new("a", 1)?, Node::new("b", 3)?])?;
/// let owner = r.locate(b"user:42").unwrap();
/// let without_a = r.without_node("a")?;
/// assert_eq!(without_a.node_for(b"user:42").unwrap().id(), "b");
/// # let _ = owner;
/// # Ok::<(), chash::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Rendezvous<T = ()> {
    nodes: Vec<Node<T>>,
    hasher: KeyHasher,
    /// xxh3 of each node id.
    seeds: Vec<u64>,
    /// Each node's rank when ids are sorted (the last tie-break).
    rank: Vec<u32>,
    /// Every weight is the same: compare draws, not scores.
    uniform: bool,
}

/// A node's standing for one key: score, then draw, then (smaller) id rank.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Standing {
    score: f64,
    draw: u64,
    rank: u32,
}

impl Standing {
    /// Total order: greater is preferred.
    #[inline]
    fn cmp(&self, other: &Standing) -> Ordering {
        self.score.total_cmp(&other.score).then(self.draw.cmp(&other.draw)).then(other.rank.cmp(&self.rank))
    }
}

/// A draw as a number in (0, 1): `((draw >> 11) + 0.5) / 2^53`.
#[inline]
fn unit(draw: u64) -> f64 {
    ((draw >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
}

/// The logarithmic-method score of a draw for a node of `weight`.
#[inline]
fn score(draw: u64, weight: u32) -> f64 {
    -f64::from(weight) / unit(draw).ln()
}

impl Rendezvous<()> {
    /// Rendezvous over `nodes` with key hash xxh3.
    ///
    /// # Errors
    /// As [`Rendezvous::with_hasher`].
    pub fn new(nodes: Vec<Node>) -> Result<Rendezvous> {
        Rendezvous::with_hasher(nodes, KeyHasher::Xxh3)
    }
}

impl<T> Rendezvous<T> {
    /// Rendezvous over `nodes` with key hash `hasher`.
    ///
    /// # Errors
    /// [`Error::DuplicateNode`](crate::Error::DuplicateNode).
    pub fn with_hasher(nodes: Vec<Node<T>>, hasher: KeyHasher) -> Result<Rendezvous<T>> {
        check_unique(&nodes)?;
        let seeds = nodes.iter().map(|n| id_hash(n.id(), NODE_SEED)).collect();
        let rank = id_ranks(nodes.iter().map(Node::id));
        let uniform = nodes.windows(2).all(|w| w[0].weight() == w[1].weight());
        Ok(Rendezvous { nodes, hasher, seeds, rank, uniform })
    }

    #[inline]
    fn standing(&self, key: u64, i: usize) -> Standing {
        let draw = mix2(key, self.seeds[i]);
        // With equal weights every score is ordered as its draw: skip the log.
        let score = if self.uniform { 0.0 } else { score(draw, self.nodes[i].weight()) };
        Standing { score, draw, rank: self.rank[i] }
    }

    /// The best node strictly below `bound` (all nodes when `None`).
    #[inline]
    fn best_below(&self, key: u64, bound: Option<&Standing>) -> Option<(usize, Standing)> {
        let mut best: Option<(usize, Standing)> = None;
        for i in 0..self.nodes.len() {
            if !self.uniform {
                if let Some((_, b)) = &best {
                    // -ln(u) >= 1 - u, so w / (1 - u) bounds the score from
                    // above: most nodes lose without a logarithm. The margin
                    // covers rounding; a node skipped is strictly worse.
                    let draw = mix2(key, self.seeds[i]);
                    if f64::from(self.nodes[i].weight()) / (1.0 - unit(draw)) * (1.0 + 1e-9) < b.score {
                        continue;
                    }
                }
            }
            let s = self.standing(key, i);
            if bound.is_some_and(|b| s.cmp(b) != Ordering::Less) {
                continue;
            }
            if best.as_ref().is_none_or(|(_, b)| s.cmp(b) == Ordering::Greater) {
                best = Some((i, s));
            }
        }
        best
    }

    /// The score node `i` gives hash value `hash`: `-weight / ln(u)` (see
    /// the type's documentation); `None` past the last node.
    pub fn score(&self, hash: u64, i: usize) -> Option<f64> {
        let node = self.nodes.get(i)?;
        Some(score(mix2(fmix64(hash), self.seeds[i]), node.weight()))
    }
}

impl<T: Clone> Rendezvous<T> {
    /// A new placement with `node` added: only keys moving to it move.
    ///
    /// # Errors
    /// [`Error::DuplicateNode`](crate::Error::DuplicateNode).
    pub fn with_node(&self, node: Node<T>) -> Result<Rendezvous<T>> {
        let mut nodes = self.nodes.clone();
        nodes.push(node);
        Rendezvous::with_hasher(nodes, self.hasher)
    }

    /// A new placement without node `id`: only its keys move. Nodes after it
    /// move down one index.
    ///
    /// # Errors
    /// [`Error::UnknownNode`](crate::Error::UnknownNode).
    pub fn without_node(&self, id: &str) -> Result<Rendezvous<T>> {
        let at = index_of(&self.nodes, id)?;
        let mut nodes = self.nodes.clone();
        nodes.remove(at);
        Rendezvous::with_hasher(nodes, self.hasher)
    }

    /// A new placement where node `id` has `weight`: keys move only to or from it.
    ///
    /// # Errors
    /// [`Error::UnknownNode`](crate::Error::UnknownNode), [`Error::ZeroWeight`](crate::Error::ZeroWeight).
    pub fn with_weight(&self, id: &str, weight: u32) -> Result<Rendezvous<T>> {
        let at = index_of(&self.nodes, id)?;
        let mut nodes = self.nodes.clone();
        nodes[at] = nodes[at].reweighted(weight)?;
        Rendezvous::with_hasher(nodes, self.hasher)
    }
}

impl<T: Send + Sync> Placement for Rendezvous<T> {
    type Payload = T;
    type Candidates<'a>
        = RendezvousCandidates<'a, T>
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
        let key = fmix64(hash);
        if self.uniform {
            // The hot loop of the common case: the largest draw, kept with
            // conditional moves. Two nodes drawing the same 64-bit value for
            // a key (about n² / 2^65 of keys) go to the exact rule below,
            // where the lower rank wins.
            let mut best = 0;
            let mut best_draw = mix2(key, *self.seeds.first()?);
            let mut tie = false;
            for (i, &seed) in self.seeds.iter().enumerate().skip(1) {
                let d = mix2(key, seed);
                tie |= d == best_draw;
                let better = d > best_draw;
                best = if better { i } else { best };
                best_draw = if better { d } else { best_draw };
            }
            if tie {
                // The exact rule: the largest (draw, -rank).
                for (i, &seed) in self.seeds.iter().enumerate() {
                    let d = mix2(key, seed);
                    if d == best_draw && self.rank[i] < self.rank[best] {
                        best = i;
                    }
                }
            }
            return Some(best);
        }
        self.best_below(key, None).map(|b| b.0)
    }

    fn candidates_hash(&self, hash: u64) -> RendezvousCandidates<'_, T> {
        RendezvousCandidates { placement: self, key: fmix64(hash), last: None, left: self.nodes.len() }
    }
}

/// Nodes in descending score order, computed lazily: each step scans every
/// node for the best one below the last yielded, so taking `k` candidates
/// costs O(n × k) and no allocation.
#[derive(Clone, Debug)]
pub struct RendezvousCandidates<'a, T> {
    placement: &'a Rendezvous<T>,
    key: u64,
    last: Option<Standing>,
    left: usize,
}

impl<T> Iterator for RendezvousCandidates<'_, T> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        let (i, s) = self.placement.best_below(self.key, self.last.as_ref())?;
        self.last = Some(s);
        self.left -= 1;
        Some(i)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn uniform_fast_path_equals_scores() {
        let nodes: Vec<Node> = (0..20).map(|i| Node::new(format!("n{i}"), 3).unwrap()).collect();
        let r = Rendezvous::new(nodes).unwrap();
        for h in 0..2000u64 {
            let h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let best = (0..20).max_by(|&a, &b| r.score(h, a).unwrap().total_cmp(&r.score(h, b).unwrap())).unwrap();
            assert_eq!(r.locate_hash(h), Some(best));
            assert_eq!(r.candidates_hash(h).next(), Some(best));
        }
    }

    /// Equal draws (forced here by giving nodes the same seed) go to the
    /// smaller id, on the fast path as in the candidates' exact rule.
    #[test]
    fn equal_draws_go_to_the_smaller_id() {
        let ids = ["d", "b", "e", "a", "c"];
        let mut r = Rendezvous::new(ids.iter().map(|id| Node::new(*id, 1).unwrap()).collect()).unwrap();
        // "e" (index 2) and "b" (index 1) draw alike; "a" (index 3) too.
        let seed = r.seeds[2];
        r.seeds[1] = seed;
        r.seeds[3] = seed;
        let mut ties = 0;
        for h in 0..4000u64 {
            let h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let exact = r.candidates_hash(h).next();
            assert_eq!(r.locate_hash(h), exact, "hash {h:#x}");
            if exact == Some(3) {
                ties += 1;
            }
        }
        // The shared draw beats the two others for about 1 key in 3.
        assert!(ties > 1000, "{ties}");
    }

    #[test]
    fn empty_and_errors() {
        let r = Rendezvous::new(vec![]).unwrap();
        assert_eq!(r.locate_hash(1), None);
        assert_eq!(r.candidates_hash(1).count(), 0);
        assert_eq!(r.without_node("x").unwrap_err(), Error::UnknownNode("x".into()));
        let dup = vec![Node::new("a", 1).unwrap(), Node::new("a", 1).unwrap()];
        assert_eq!(Rendezvous::new(dup).unwrap_err(), Error::DuplicateNode("a".into()));
    }
}
