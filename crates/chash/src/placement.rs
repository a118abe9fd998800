//! The one trait every placement algorithm implements.

use crate::{KeyHasher, Node};

/// Places keys on nodes.
///
/// A placement is an immutable value: lookups take `&self`, never allocate,
/// and never lock, so one value can be shared by every thread (see
/// [`Ring`](crate::Ring) for swapping in new versions with `arc-swap`).
/// Lookups return a node *index* into [`nodes`](Placement::nodes); an empty
/// placement returns `None`.
pub trait Placement: Send + Sync {
    /// The user payload carried by each node.
    type Payload;

    /// Iterator over distinct node indices in the algorithm's order of
    /// alternatives; the first is the owner.
    type Candidates<'a>: Iterator<Item = usize>
    where
        Self: 'a;

    /// The hash function keys go through.
    fn hasher(&self) -> KeyHasher;

    /// The nodes, in index order.
    fn nodes(&self) -> &[Node<Self::Payload>];

    /// Index of the node that owns hash value `hash`, or `None` when empty.
    fn locate_hash(&self, hash: u64) -> Option<usize>;

    /// Distinct nodes for `hash` in order of preference (owner first), for
    /// replicas and failover. Each node appears once; the iteration ends after
    /// every node has appeared.
    fn candidates_hash(&self, hash: u64) -> Self::Candidates<'_>;

    /// Index of the node that owns `key`.
    #[inline]
    fn locate(&self, key: &[u8]) -> Option<usize> {
        self.locate_hash(self.hasher().hash(key))
    }

    /// The node that owns `key`.
    #[inline]
    fn node_for(&self, key: &[u8]) -> Option<&Node<Self::Payload>> {
        self.locate(key).map(|i| &self.nodes()[i])
    }

    /// Distinct nodes for `key`, owner first.
    fn candidates(&self, key: &[u8]) -> Self::Candidates<'_> {
        self.candidates_hash(self.hasher().hash(key))
    }

    /// Whether there are no nodes.
    fn is_empty(&self) -> bool {
        self.nodes().is_empty()
    }

    /// Index of the node with id `id`.
    fn position(&self, id: &str) -> Option<usize> {
        self.nodes().iter().position(|n| n.id() == id)
    }
}

/// A placement made of sorted points on the hash space ("first point ≥ hash,
/// wrapping"): the native ring and the compatibility rings. Exact analysis
/// ([`ownership`](crate::analysis::ownership), [`diff`](crate::analysis::diff))
/// works on these.
pub trait PointRing: Placement {
    /// The sorted point positions (a copy: rings keep them split into
    /// halves for lookup speed; see [`Ring`](crate::Ring)).
    fn point_hashes(&self) -> Vec<u64>;

    /// Owner (node index) of the point at `pos` in [`point_hashes`](PointRing::point_hashes).
    fn point_owner(&self, pos: usize) -> usize;

    /// Width of the hash space: points and key hashes are below `2^space_bits()`.
    fn space_bits(&self) -> u32 {
        self.hasher().bits()
    }
}
