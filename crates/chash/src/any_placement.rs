//! [`AnyPlacement`]: a built placement of any algorithm, behind the one
//! [`Placement`] trait (its candidates iterate without allocating), changed
//! by each algorithm's own rules, and seen as an [`AnyPointRing`] when it is
//! made of points (what exact analysis works on).

use crate::algo::{
    Anchor, AnchorCandidates, Bounded, Jump, JumpCandidates, Maglev, MaglevCandidates, MultiProbe,
    MultiProbeCandidates, Rendezvous, RendezvousCandidates,
};
use crate::analysis::Diff;
use crate::compat::{Ketama, Modula, ModulaCandidates, NginxChash};
use crate::placement::{Placement, PointRing};
use crate::ring::{Ring, RingCandidates};
use crate::{Error, KeyHasher, Node, Result};

/// A built placement of any algorithm.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyPlacement {
    /// The native ring.
    Ring(Ring),
    /// twemproxy's / libmemcached's ketama.
    Ketama(Ketama),
    /// twemproxy's modula.
    Modula(Modula),
    /// nginx's consistent hash.
    Nginx(NginxChash),
    /// Jump consistent hash.
    Jump(Jump),
    /// Weighted rendezvous hashing.
    Rendezvous(Rendezvous),
    /// Maglev.
    Maglev(Maglev),
    /// AnchorHash (boxed: it is the largest).
    Anchor(Box<Anchor>),
    /// Multi-probe consistent hashing.
    MultiProbe(MultiProbe),
    /// Bounded loads over the native ring, with its load tracker (boxed).
    Bounded(Box<Bounded>),
}

/// Calls `$body` with `$p` bound to the concrete placement.
macro_rules! with_placement {
    ($any:expr, $p:ident => $body:expr) => {
        match $any {
            AnyPlacement::Ring($p) => $body,
            AnyPlacement::Ketama($p) => $body,
            AnyPlacement::Modula($p) => $body,
            AnyPlacement::Nginx($p) => $body,
            AnyPlacement::Jump($p) => $body,
            AnyPlacement::Rendezvous($p) => $body,
            AnyPlacement::Maglev($p) => $body,
            AnyPlacement::Anchor($p) => $body,
            AnyPlacement::MultiProbe($p) => $body,
            AnyPlacement::Bounded($p) => $body,
        }
    };
}

impl AnyPlacement {
    /// The placement with `node` added, by the algorithm's own change:
    /// merged into the ring, appended for jump, the top free bucket for
    /// anchor, a rebuild for maglev and the compatibility placements (as the
    /// original programs do). The load tracker of `bounded` keeps the loads
    /// of the nodes that stay.
    ///
    /// # Errors
    /// As the algorithm's `with_node` (duplicate id, weights it refuses, a
    /// full anchor or a maglev table now too small).
    pub fn with_node(&self, node: Node) -> Result<AnyPlacement> {
        let hasher = self.hasher();
        let nodes = || self.nodes().to_vec();
        Ok(match self {
            AnyPlacement::Ring(p) => AnyPlacement::Ring(p.with_node(node)?),
            AnyPlacement::Ketama(_) => AnyPlacement::Ketama(Ketama::new(push(nodes(), node)?, hasher)?),
            AnyPlacement::Modula(_) => AnyPlacement::Modula(Modula::new(push(nodes(), node)?, hasher)?),
            AnyPlacement::Nginx(_) => AnyPlacement::Nginx(NginxChash::new(push(nodes(), node)?)?),
            AnyPlacement::Jump(p) => AnyPlacement::Jump(p.with_node(node)?),
            AnyPlacement::Rendezvous(p) => AnyPlacement::Rendezvous(p.with_node(node)?),
            AnyPlacement::Maglev(p) => AnyPlacement::Maglev(p.with_node(node)?),
            AnyPlacement::Anchor(p) => AnyPlacement::Anchor(Box::new(p.with_node(node)?)),
            AnyPlacement::MultiProbe(p) => AnyPlacement::MultiProbe(p.with_node(node)?),
            AnyPlacement::Bounded(p) => AnyPlacement::Bounded(Box::new(p.with_node(node)?)),
        })
    }

    /// The placement without node `id`, by the algorithm's own change (see
    /// [`with_node`](AnyPlacement::with_node)). For anchor this is what keeps
    /// movement optimal: a fresh build of the shorter server list renumbers
    /// the buckets after the removed one.
    ///
    /// # Errors
    /// [`Error::UnknownNode`]; for jump, any node but the last.
    pub fn without_node(&self, id: &str) -> Result<AnyPlacement> {
        let hasher = self.hasher();
        let rest = || -> Result<Vec<Node>> {
            let at = self.nodes().iter().position(|n| n.id() == id).ok_or_else(|| Error::UnknownNode(id.to_owned()))?;
            let mut nodes = self.nodes().to_vec();
            nodes.remove(at);
            Ok(nodes)
        };
        Ok(match self {
            AnyPlacement::Ring(p) => AnyPlacement::Ring(p.without_node(id)?),
            AnyPlacement::Ketama(_) => AnyPlacement::Ketama(Ketama::new(rest()?, hasher)?),
            AnyPlacement::Modula(_) => AnyPlacement::Modula(Modula::new(rest()?, hasher)?),
            AnyPlacement::Nginx(_) => AnyPlacement::Nginx(NginxChash::new(rest()?)?),
            AnyPlacement::Jump(p) => AnyPlacement::Jump(p.without_node(id)?),
            AnyPlacement::Rendezvous(p) => AnyPlacement::Rendezvous(p.without_node(id)?),
            AnyPlacement::Maglev(p) => AnyPlacement::Maglev(p.without_node(id)?),
            AnyPlacement::Anchor(p) => AnyPlacement::Anchor(Box::new(p.without_node(id)?)),
            AnyPlacement::MultiProbe(p) => AnyPlacement::MultiProbe(p.without_node(id)?),
            AnyPlacement::Bounded(p) => AnyPlacement::Bounded(Box::new(p.without_node(id)?)),
        })
    }

    /// The placement where node `id` has `weight`.
    ///
    /// # Errors
    /// [`Error::UnknownNode`], [`Error::ZeroWeight`];
    /// [`Error::WeightsUnsupported`] for jump, jumpback, anchor and multiprobe (unless
    /// `weight` is 1, which changes nothing).
    pub fn with_weight(&self, id: &str, weight: u32) -> Result<AnyPlacement> {
        let hasher = self.hasher();
        let reweighted = || -> Result<Vec<Node>> {
            let at = self.nodes().iter().position(|n| n.id() == id).ok_or_else(|| Error::UnknownNode(id.to_owned()))?;
            let mut nodes = self.nodes().to_vec();
            nodes[at] = nodes[at].reweighted(weight)?;
            Ok(nodes)
        };
        let unweighted = |distribution: &'static str| -> Result<()> {
            reweighted()?;
            if weight == 1 {
                Ok(())
            } else {
                Err(Error::WeightsUnsupported { distribution, node: id.to_owned(), weight })
            }
        };
        Ok(match self {
            AnyPlacement::Ring(p) => AnyPlacement::Ring(p.with_weight(id, weight)?),
            AnyPlacement::Ketama(_) => AnyPlacement::Ketama(Ketama::new(reweighted()?, hasher)?),
            AnyPlacement::Modula(_) => AnyPlacement::Modula(Modula::new(reweighted()?, hasher)?),
            AnyPlacement::Nginx(_) => AnyPlacement::Nginx(NginxChash::new(reweighted()?)?),
            AnyPlacement::Rendezvous(p) => AnyPlacement::Rendezvous(p.with_weight(id, weight)?),
            AnyPlacement::Maglev(p) => AnyPlacement::Maglev(p.with_weight(id, weight)?),
            AnyPlacement::Bounded(p) => AnyPlacement::Bounded(Box::new(p.with_weight(id, weight)?)),
            AnyPlacement::Jump(p) => {
                unweighted(p.variant().name())?;
                self.clone()
            }
            AnyPlacement::Anchor(_) => {
                unweighted("anchor")?;
                self.clone()
            }
            AnyPlacement::MultiProbe(_) => {
                unweighted("multiprobe")?;
                self.clone()
            }
        })
    }

    /// The placement seen as a ring of points, when it is made of them:
    /// the native ring, `ketama`, `nginx`, and `bounded` by its ring (where
    /// keys go while loads allow).
    pub fn point_ring(&self) -> Option<AnyPointRing<'_>> {
        match self {
            AnyPlacement::Ring(p) => Some(AnyPointRing::Ring(p)),
            AnyPlacement::Ketama(p) => Some(AnyPointRing::Ketama(p)),
            AnyPlacement::Nginx(p) => Some(AnyPointRing::Nginx(p)),
            AnyPlacement::Bounded(p) => Some(AnyPointRing::Ring(p.ring())),
            _ => None,
        }
    }

    /// Exact ownership of the hash space per node, where the placement is
    /// made of points ([`point_ring`](AnyPlacement::point_ring)), and for
    /// `multiprobe` (its expected shares, computed from the node points:
    /// [`MultiProbe::expected_shares`]). `None` for the others.
    pub fn ownership(&self) -> Option<Vec<f64>> {
        match self {
            AnyPlacement::MultiProbe(p) => Some(p.expected_shares()),
            p => p.point_ring().map(|r| crate::analysis::ownership(&r)),
        }
    }

    /// The exact diff to `new` ([`crate::analysis::diff`]) when both are made
    /// of points, else `None`.
    pub fn diff(&self, new: &AnyPlacement) -> Option<Result<Diff>> {
        Some(crate::analysis::diff(&self.point_ring()?, &new.point_ring()?))
    }

    /// The node for a request for hash value `hash` that holds load until
    /// [`release`](AnyPlacement::release)d: with `bounded`, the first node
    /// under its cap ([`Bounded::acquire_hash`]); otherwise the owner.
    #[inline]
    pub fn acquire_hash(&self, hash: u64) -> Option<usize> {
        match self {
            AnyPlacement::Bounded(b) => b.acquire_hash(hash),
            p => p.locate_hash(hash),
        }
    }

    /// Gives back the load an [`acquire_hash`](AnyPlacement::acquire_hash)
    /// took on node `i` (nothing to do but for `bounded`).
    pub fn release(&self, i: usize) {
        if let AnyPlacement::Bounded(b) = self {
            b.release(i);
        }
    }
}

/// `nodes` with `node` appended, unless its id is taken.
fn push(mut nodes: Vec<Node>, node: Node) -> Result<Vec<Node>> {
    if nodes.iter().any(|n| n.id() == node.id()) {
        return Err(Error::DuplicateNode(node.id().to_owned()));
    }
    nodes.push(node);
    Ok(nodes)
}

impl Placement for AnyPlacement {
    type Payload = ();
    type Candidates<'a> = AnyCandidates<'a>;

    fn hasher(&self) -> KeyHasher {
        with_placement!(self, p => p.hasher())
    }

    fn nodes(&self) -> &[Node] {
        with_placement!(self, p => p.nodes())
    }

    #[inline]
    fn locate_hash(&self, hash: u64) -> Option<usize> {
        with_placement!(self, p => p.locate_hash(hash))
    }

    fn candidates_hash(&self, hash: u64) -> AnyCandidates<'_> {
        match self {
            AnyPlacement::Ring(p) => AnyCandidates::Ring(p.candidates_hash(hash)),
            AnyPlacement::Ketama(p) => AnyCandidates::Ring(p.candidates_hash(hash)),
            AnyPlacement::Nginx(p) => AnyCandidates::Ring(p.candidates_hash(hash)),
            AnyPlacement::Bounded(p) => AnyCandidates::Ring(p.candidates_hash(hash)),
            AnyPlacement::Modula(p) => AnyCandidates::Modula(p.candidates_hash(hash)),
            AnyPlacement::Jump(p) => AnyCandidates::Jump(p.candidates_hash(hash)),
            AnyPlacement::Rendezvous(p) => AnyCandidates::Rendezvous(p.candidates_hash(hash)),
            AnyPlacement::Maglev(p) => AnyCandidates::Maglev(p.candidates_hash(hash)),
            AnyPlacement::Anchor(p) => AnyCandidates::Anchor(p.candidates_hash(hash)),
            AnyPlacement::MultiProbe(p) => AnyCandidates::MultiProbe(p.candidates_hash(hash)),
        }
    }
}

/// The candidates of any placement: its algorithm's own iterator, no
/// allocation.
#[derive(Debug)]
pub enum AnyCandidates<'a> {
    /// The rings (native, ketama, nginx, bounded's).
    Ring(RingCandidates<'a>),
    /// modula's.
    Modula(ModulaCandidates<'a>),
    /// jump's.
    Jump(JumpCandidates),
    /// rendezvous's.
    Rendezvous(RendezvousCandidates<'a, ()>),
    /// maglev's.
    Maglev(MaglevCandidates<'a>),
    /// anchor's.
    Anchor(AnchorCandidates<'a, ()>),
    /// multi-probe's.
    MultiProbe(MultiProbeCandidates<'a>),
}

impl Iterator for AnyCandidates<'_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        match self {
            AnyCandidates::Ring(c) => c.next(),
            AnyCandidates::Modula(c) => c.next(),
            AnyCandidates::Jump(c) => c.next(),
            AnyCandidates::Rendezvous(c) => c.next(),
            AnyCandidates::Maglev(c) => c.next(),
            AnyCandidates::Anchor(c) => c.next(),
            AnyCandidates::MultiProbe(c) => c.next(),
        }
    }
}

/// A placement made of points, whichever: what
/// [`AnyPlacement::point_ring`] gives, for [`crate::analysis`].
#[derive(Clone, Copy, Debug)]
pub enum AnyPointRing<'a> {
    /// The native ring (also `bounded`'s).
    Ring(&'a Ring),
    /// twemproxy's / libmemcached's ketama.
    Ketama(&'a Ketama),
    /// nginx's consistent hash.
    Nginx(&'a NginxChash),
}

/// Calls `$body` with `$p` bound to the concrete ring.
macro_rules! with_ring {
    ($any:expr, $p:ident => $body:expr) => {
        match $any {
            AnyPointRing::Ring($p) => $body,
            AnyPointRing::Ketama($p) => $body,
            AnyPointRing::Nginx($p) => $body,
        }
    };
}

impl Placement for AnyPointRing<'_> {
    type Payload = ();
    type Candidates<'b>
        = RingCandidates<'b>
    where
        Self: 'b;

    fn hasher(&self) -> KeyHasher {
        with_ring!(self, p => p.hasher())
    }

    fn nodes(&self) -> &[Node] {
        with_ring!(self, p => p.nodes())
    }

    #[inline]
    fn locate_hash(&self, hash: u64) -> Option<usize> {
        with_ring!(self, p => p.locate_hash(hash))
    }

    fn candidates_hash(&self, hash: u64) -> RingCandidates<'_> {
        with_ring!(self, p => p.candidates_hash(hash))
    }
}

impl PointRing for AnyPointRing<'_> {
    fn point_hashes(&self) -> Vec<u64> {
        with_ring!(self, p => p.point_hashes())
    }

    fn point_owner(&self, pos: usize) -> usize {
        with_ring!(self, p => p.point_owner(pos))
    }

    fn space_bits(&self) -> u32 {
        with_ring!(self, p => p.space_bits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PoolConfig, ServerLine};

    /// Every placement's candidates: each node once, owner first, the same
    /// as its algorithm's own iterator.
    #[test]
    fn candidates_of_any_placement() {
        let servers: Vec<ServerLine> = ["a:1", "b:1", "c:1", "d:1", "e:1"].iter().map(|s| s.parse().unwrap()).collect();
        for d in crate::DISTRIBUTIONS.iter().filter(|d| **d != "random") {
            let pool = PoolConfig::builder("t").distribution(d).servers(servers.clone()).build().unwrap();
            let s = pool.snapshot().unwrap();
            let p = s.placement();
            for h in [0u64, 1, 12345, u64::MAX / 3, u32::MAX as u64 + 7] {
                let hash = h & (u64::MAX >> (64 - p.hasher().bits()));
                let c: Vec<usize> = p.candidates_hash(hash).collect();
                assert_eq!(c.len(), 5, "{d}");
                assert_eq!(Some(c[0]), p.locate_hash(hash), "{d}");
                let mut sorted = c.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), 5, "{d}: each node once");
            }
        }
    }

    /// The arcs of a point ring add up to each node's exact ownership.
    #[test]
    fn arcs_agree_with_ownership() {
        let pool = PoolConfig::builder("t")
            .distribution("ketama")
            .servers(["a:1", "b:2", "c:1"].iter().map(|s| s.parse().unwrap()).collect())
            .build()
            .unwrap();
        let s = pool.snapshot().unwrap();
        let ring = s.placement().point_ring().unwrap();
        let mut from_arcs = vec![0.0; 3];
        for (start, end, owner) in crate::analysis::arcs(&ring) {
            assert!(end > start);
            from_arcs[owner] += end - start;
        }
        let exact = s.placement().ownership().unwrap();
        for (a, b) in from_arcs.iter().zip(&exact) {
            assert!((a - b).abs() < 1e-12, "{from_arcs:?} {exact:?}");
        }
    }
}
