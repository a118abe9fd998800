//! The native weighted virtual-node ring (`distribution: ring`).

use crate::node::check_unique;
use crate::placement::{Placement, PointRing};
use crate::points::{cmp_points, id_ranks, Points, RawPoint, Seen};
use crate::{Error, KeyHasher, Node, Result};

/// Points per unit of weight unless set: 160.
pub const DEFAULT_VNODES: u32 = 160;

/// The most points one ring holds (2^28, about 3 GiB of points).
pub const MAX_POINTS: u64 = 1 << 28;

/// A weighted consistent-hash ring with virtual nodes.
///
/// Each node gets `weight × vnodes` points. Point `i` of node `id` sits at
/// XXH3 of its label, scaled to the key hash's space (the top `bits()` bits),
/// where the label is the id's length as a little-endian `u32`, the id's
/// bytes, and `i` as a little-endian `u32`: two different `(id, i)` pairs
/// never share a label (`"a1"` point 0 and `"a"` point 10 differ). Points are
/// placed by XXH3 whatever the key hash, so a weak key hash cannot crowd
/// them; a [`PointLabel`] template instead hashes its text with the key hash,
/// as the programs it reproduces do. A key belongs to the first point at or after its hash, wrapping
/// to the first point. Equal point positions are ordered by node id (bytewise),
/// so the owner of a tie is the node with the smaller id, whatever order the
/// nodes came in.
///
/// Since a node's points depend only on its own id and weight, adding a node
/// moves keys only to it, removing one moves only its keys, and re-weighting
/// one moves keys only to or from it.
///
/// ```
/// use chash::{Node, Placement, Ring};
/// let ring = Ring::new(vec![Node::new("a", 1)?, Node::new("b", 2)?])?;
/// let owner = ring.node_for(b"user:42").unwrap().id();
/// assert!(owner == "a" || owner == "b");
///
/// // A change returns a new ring; the old one is untouched.
/// let bigger = ring.with_node(Node::new("c", 1)?)?;
/// let moved = bigger.node_for(b"user:42").unwrap().id();
/// assert!(moved == owner || moved == "c");
/// # Ok::<(), chash::Error>(())
/// ```
///
/// # Sharing across threads
/// A `Ring` is immutable and `Send + Sync`. Keep the current ring in an
/// `arc_swap::ArcSwap<Ring>`: readers call `load()` and look up without
/// locking; a writer builds the changed ring with [`with_node`](Ring::with_node),
/// [`without_node`](Ring::without_node) or [`with_weight`](Ring::with_weight)
/// and `store`s it. Readers holding the old snapshot finish on it.
///
/// ```
/// use std::sync::Arc;
/// use arc_swap::ArcSwap;
/// use chash::{Node, Placement, Ring};
///
/// let current = ArcSwap::from_pointee(Ring::new(vec![Node::new("a", 1)?])?);
/// let reader = std::thread::scope(|s| {
///     let h = s.spawn(|| current.load().node_for(b"k").map(|n| n.id().to_owned()));
///     h.join().unwrap()
/// });
/// assert_eq!(reader.as_deref(), Some("a"));
/// let next = current.load().with_node(Node::new("b", 1)?)?;
/// current.store(Arc::new(next));
/// assert_eq!(current.load().nodes().len(), 2);
/// # Ok::<(), chash::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Ring<T = ()> {
    nodes: Vec<Node<T>>,
    rank: Vec<u32>,
    hasher: KeyHasher,
    vnodes: u32,
    label: PointLabel,
    points: Points,
}

/// How a ring names its points before hashing them.
///
/// The default, [`PointLabel::Native`], is the unambiguous binary label
/// described on [`Ring`]. A template reproduces rings built by other code:
/// `"{id}&&VN{i}"` (seed 001), `"{id}#{i}"` (seed 002),
/// `"SHARD-{name}-NODE-{i}"` (seed 003). Variables: `{id}`, `{name}` (the
/// node's name, or its id when it has none), `{host}` and `{port}` (the id
/// split at its last `:`; the whole id and an empty port when it has none),
/// `{i}` (the point index from 0, in decimal), `{i*}` (the indices 0 to i run
/// together: seed 000's labels). `{{` and `}}` are literal braces.
///
/// ```
/// use chash::{PointLabel, Node, Ring, KeyHasher};
/// let label: PointLabel = "{id}&&VN{i}".parse()?;
/// assert_eq!(label.render(&Node::new("192.168.0.112:1000", 1)?, 4), b"192.168.0.112:1000&&VN4");
/// assert!("{colour}".parse::<PointLabel>().is_err());
/// # Ok::<(), chash::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PointLabel {
    /// `len(id) as u32 LE ‖ id ‖ i as u32 LE`.
    #[default]
    Native,
    /// A text template.
    Template(Vec<LabelPart>),
}

/// One piece of a [`PointLabel`] template.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LabelPart {
    /// Text copied as is.
    Text(String),
    /// `{id}`
    Id,
    /// `{name}`
    Name,
    /// `{host}`
    Host,
    /// `{port}`
    Port,
    /// `{i}`
    Index,
    /// `{i*}`: the indices 0 through i in decimal, run together (`0`, `01`,
    /// `012`, ...), the labels seed 000 builds by appending to one buffer.
    IndexRun,
}

impl std::str::FromStr for PointLabel {
    type Err = Error;

    fn from_str(template: &str) -> Result<PointLabel> {
        let bad = |why: String| Error::Config(format!("point_label {template:?}: {why}"));
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut chars = template.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    text.push('}');
                }
                '{' => {
                    let var: String = chars.by_ref().take_while(|&c| c != '}').collect();
                    let part = match var.as_str() {
                        "id" => LabelPart::Id,
                        "name" => LabelPart::Name,
                        "host" => LabelPart::Host,
                        "port" => LabelPart::Port,
                        "i" => LabelPart::Index,
                        "i*" => LabelPart::IndexRun,
                        _ => {
                            return Err(bad(format!(
                                "unknown variable {{{var}}} (known: {{id}}, {{name}}, {{host}}, {{port}}, {{i}})"
                            )))
                        }
                    };
                    if !text.is_empty() {
                        parts.push(LabelPart::Text(std::mem::take(&mut text)));
                    }
                    parts.push(part);
                }
                '}' => return Err(bad("a lone '}' (write '}}' for a literal brace)".into())),
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            parts.push(LabelPart::Text(text));
        }
        Ok(PointLabel::Template(parts))
    }
}

impl PointLabel {
    /// The label bytes of point `i` of `node`.
    pub fn render<T>(&self, node: &Node<T>, i: u32) -> Vec<u8> {
        let mut out = Vec::new();
        self.render_into(&mut out, node, i);
        out
    }

    fn render_into<T>(&self, out: &mut Vec<u8>, node: &Node<T>, i: u32) {
        out.clear();
        match self {
            PointLabel::Native => {
                let id = node.id().as_bytes();
                out.extend_from_slice(&(id.len() as u32).to_le_bytes());
                out.extend_from_slice(id);
                out.extend_from_slice(&i.to_le_bytes());
            }
            PointLabel::Template(parts) => {
                let (host, port) = node.id().rsplit_once(':').unwrap_or((node.id(), ""));
                for part in parts {
                    match part {
                        LabelPart::Text(t) => out.extend_from_slice(t.as_bytes()),
                        LabelPart::Id => out.extend_from_slice(node.id().as_bytes()),
                        LabelPart::Name => out.extend_from_slice(node.name().unwrap_or(node.id()).as_bytes()),
                        LabelPart::Host => out.extend_from_slice(host.as_bytes()),
                        LabelPart::Port => out.extend_from_slice(port.as_bytes()),
                        LabelPart::Index => out.extend_from_slice(i.to_string().as_bytes()),
                        LabelPart::IndexRun => {
                            for j in 0..=i {
                                out.extend_from_slice(j.to_string().as_bytes());
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Settings for a [`Ring`]; a consuming builder.
#[derive(Clone, Debug)]
#[must_use]
pub struct RingBuilder {
    hasher: KeyHasher,
    vnodes: u32,
    label: PointLabel,
}

impl Default for RingBuilder {
    fn default() -> Self {
        RingBuilder { hasher: KeyHasher::Xxh3, vnodes: DEFAULT_VNODES, label: PointLabel::Native }
    }
}

impl RingBuilder {
    /// The hash for keys and points. Defaults to [`KeyHasher::Xxh3`].
    pub fn hasher(mut self, hasher: KeyHasher) -> Self {
        self.hasher = hasher;
        self
    }

    /// Points per unit of weight. Defaults to 160.
    pub fn vnodes(mut self, vnodes: u32) -> Self {
        self.vnodes = vnodes;
        self
    }

    /// How points are labelled before hashing. Defaults to [`PointLabel::Native`].
    pub fn point_label(mut self, label: PointLabel) -> Self {
        self.label = label;
        self
    }

    /// Builds the ring.
    ///
    /// # Errors
    /// [`Error::DuplicateNode`], [`Error::ZeroVnodes`], or
    /// [`Error::TooManyPoints`] past [`MAX_POINTS`].
    pub fn build<T>(self, nodes: Vec<Node<T>>) -> Result<Ring<T>> {
        if self.vnodes == 0 {
            return Err(Error::ZeroVnodes);
        }
        check_unique(&nodes)?;
        check_point_count(&nodes, self.vnodes, 0)?;
        let rank = id_ranks(nodes.iter().map(Node::id));
        let mut raw = Vec::with_capacity(total_points(&nodes, self.vnodes) as usize);
        let mut counts = Vec::with_capacity(nodes.len());
        let mut label = Vec::new();
        for node in &nodes {
            let before = raw.len();
            push_hashes(&mut raw, &mut label, &self.label, self.hasher, node, self.vnodes);
            counts.push(raw.len() - before);
        }
        let points = Points::build(self.hasher.bits(), &raw, &counts, &rank);
        Ok(Ring { nodes, rank, hasher: self.hasher, vnodes: self.vnodes, label: self.label, points })
    }
}

fn total_points<T>(nodes: &[Node<T>], vnodes: u32) -> u64 {
    nodes.iter().map(|n| u64::from(n.weight()) * u64::from(vnodes)).sum()
}

fn check_point_count<T>(nodes: &[Node<T>], vnodes: u32, extra: u64) -> Result<()> {
    let requested = total_points(nodes, vnodes) + extra;
    if requested > MAX_POINTS {
        return Err(Error::TooManyPoints { requested, limit: MAX_POINTS });
    }
    Ok(())
}

/// Appends the point hashes of `node` to `out`, in vnode order.
fn push_hashes<T>(
    out: &mut Vec<u64>,
    buf: &mut Vec<u8>,
    label: &PointLabel,
    hasher: KeyHasher,
    node: &Node<T>,
    vnodes: u32,
) {
    let count = node.weight() as usize * vnodes as usize;
    if *label == PointLabel::Native {
        // Only the index changes: write the prefix once.
        label.render_into(buf, node, 0);
        let prefix = buf.len() - 4;
        for i in 0..count as u32 {
            buf.truncate(prefix);
            buf.extend_from_slice(&i.to_le_bytes());
            out.push(native_position(buf, hasher));
        }
    } else {
        for i in 0..count as u32 {
            label.render_into(buf, node, i);
            out.push(hasher.hash(buf));
        }
    }
}

/// Where a native label's point sits: XXH3 of the label, scaled to the key
/// hash's space (its top `bits` bits). Points are placed by a strong hash
/// whatever hash the keys use: a weak key hash such as FNV-1a would crowd
/// labels that differ only in their last bytes (the point index) into a few
/// arcs.
#[inline]
pub(crate) fn native_position(label: &[u8], hasher: KeyHasher) -> u64 {
    let h = xxhash_rust::xxh3::xxh3_64(label);
    match hasher.bits() {
        64 => h,
        bits => h >> (64 - bits),
    }
}

/// The points of `node` (index `owner`) from vnode `from` on, sorted in ring order.
fn sorted_points<T>(ring: &Ring<T>, node: &Node<T>, owner: usize, from: usize, rank: &[u32]) -> Vec<RawPoint> {
    let mut hashes = Vec::new();
    push_hashes(&mut hashes, &mut Vec::new(), &ring.label, ring.hasher, node, ring.vnodes);
    let mut pts: Vec<RawPoint> = hashes[from..].iter().map(|&h| (h, owner as u32)).collect();
    pts.sort_unstable_by(|a, b| cmp_points(a, b, rank));
    pts
}

impl Ring<()> {
    /// A builder with the defaults (xxh3, 160 vnodes); its `build` takes nodes
    /// with any payload.
    pub fn builder() -> RingBuilder {
        RingBuilder::default()
    }

    /// A ring over `nodes` with the defaults: xxh3 and 160 vnodes per unit of weight.
    ///
    /// # Errors
    /// As [`RingBuilder::build`].
    pub fn new(nodes: Vec<Node>) -> Result<Ring> {
        RingBuilder::default().build(nodes)
    }
}

impl<T> Ring<T> {
    /// Points per unit of weight.
    pub fn vnodes(&self) -> u32 {
        self.vnodes
    }

    /// Index of the node with id `id`.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id() == id)
    }

    /// Number of points on the ring.
    pub fn point_count(&self) -> usize {
        self.points.len()
    }

    /// Heap bytes held by the points and their index (not the nodes).
    pub fn point_bytes(&self) -> usize {
        self.points.heap_bytes()
    }

    /// The points in ring order, as `(position, node index)`.
    pub fn points(&self) -> impl ExactSizeIterator<Item = (u64, usize)> + '_ {
        (0..self.points.len()).map(|pos| (self.points.hash(pos), self.points.owner(pos)))
    }
}

impl<T: Clone> Ring<T> {
    /// A new ring with `node` added; this ring is unchanged.
    ///
    /// Cost: the new node's points are sorted and merged into the existing
    /// ones in one linear pass (no rehashing of other nodes).
    ///
    /// # Errors
    /// [`Error::DuplicateNode`] if the id is taken, [`Error::TooManyPoints`].
    pub fn with_node(&self, node: Node<T>) -> Result<Ring<T>> {
        if self.index_of(node.id()).is_some() {
            return Err(Error::DuplicateNode(node.id().to_owned()));
        }
        check_point_count(&self.nodes, self.vnodes, u64::from(node.weight()) * u64::from(self.vnodes))?;
        let mut nodes = self.nodes.clone();
        nodes.push(node);
        let rank = id_ranks(nodes.iter().map(Node::id));
        let owner = nodes.len() - 1;
        let added = sorted_points(self, &nodes[owner], owner, 0, &rank);
        let points = self.points.merged(nodes.len(), &added, &rank);
        Ok(Ring { nodes, rank, hasher: self.hasher, vnodes: self.vnodes, label: self.label.clone(), points })
    }

    /// A new ring without the node `id`; this ring is unchanged. Nodes after
    /// it move down one index.
    ///
    /// # Errors
    /// [`Error::UnknownNode`].
    pub fn without_node(&self, id: &str) -> Result<Ring<T>> {
        let gone = self.index_of(id).ok_or_else(|| Error::UnknownNode(id.to_owned()))?;
        let removed = sorted_points(self, &self.nodes[gone], gone, 0, &self.rank);
        let points = self.points.without(&removed, &self.rank, |o| if o > gone { o - 1 } else { o });
        let mut nodes = self.nodes.clone();
        nodes.remove(gone);
        let rank = id_ranks(nodes.iter().map(Node::id));
        Ok(Ring { nodes, rank, hasher: self.hasher, vnodes: self.vnodes, label: self.label.clone(), points })
    }

    /// A new ring where node `id` has `weight`; it keeps its index. Its
    /// points `0..old` become `0..new`, so only keys of its grown or shrunk
    /// share move.
    ///
    /// # Errors
    /// [`Error::UnknownNode`], [`Error::ZeroWeight`], [`Error::TooManyPoints`].
    pub fn with_weight(&self, id: &str, weight: u32) -> Result<Ring<T>> {
        let at = self.index_of(id).ok_or_else(|| Error::UnknownNode(id.to_owned()))?;
        let node = self.nodes[at].reweighted(weight)?;
        let old = u64::from(self.nodes[at].weight()) * u64::from(self.vnodes);
        let new = u64::from(weight) * u64::from(self.vnodes);
        check_point_count(&self.nodes, self.vnodes, new.saturating_sub(old))?;
        let mut nodes = self.nodes.clone();
        nodes[at] = node;
        // Points 0..min(old, new) stay; only the difference is added or removed.
        let points = if new >= old {
            let added = sorted_points(self, &nodes[at], at, old as usize, &self.rank);
            self.points.merged(nodes.len(), &added, &self.rank)
        } else {
            let removed = sorted_points(self, &self.nodes[at], at, new as usize, &self.rank);
            self.points.without(&removed, &self.rank, |o| o)
        };
        Ok(Ring {
            nodes,
            rank: self.rank.clone(),
            hasher: self.hasher,
            vnodes: self.vnodes,
            label: self.label.clone(),
            points,
        })
    }
}

impl<T: Send + Sync> Placement for Ring<T> {
    type Payload = T;
    type Candidates<'a>
        = RingCandidates<'a>
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
        self.points.locate_owner(hash)
    }

    fn candidates_hash(&self, hash: u64) -> RingCandidates<'_> {
        RingCandidates::new(&self.points, self.nodes.len(), hash)
    }
}

impl<T: Send + Sync> PointRing for Ring<T> {
    fn point_hashes(&self) -> Vec<u64> {
        self.points.hashes()
    }

    fn point_owner(&self, pos: usize) -> usize {
        self.points.owner(pos)
    }
}

/// Distinct nodes in ring order from a hash: the owner, then the owners of
/// the following points that have not appeared yet.
///
/// Work is bounded by one turn of the ring; no step allocates (a ring of
/// more than 1,024 nodes allocates one bit set when the iterator is made).
#[derive(Clone, Debug)]
pub struct RingCandidates<'a> {
    points: &'a Points,
    pos: usize,
    steps_left: usize,
    nodes_left: usize,
    seen: Seen,
}

impl<'a> RingCandidates<'a> {
    pub(crate) fn new(points: &'a Points, node_count: usize, hash: u64) -> Self {
        match points.locate(hash) {
            Some(pos) => RingCandidates {
                points,
                pos,
                steps_left: points.len(),
                nodes_left: node_count,
                seen: Seen::new(node_count),
            },
            None => RingCandidates { points, pos: 0, steps_left: 0, nodes_left: 0, seen: Seen::new(0) },
        }
    }
}

impl Iterator for RingCandidates<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.nodes_left > 0 && self.steps_left > 0 {
            let owner = self.points.owner(self.pos);
            self.pos += 1;
            if self.pos == self.points.len() {
                self.pos = 0;
            }
            self.steps_left -= 1;
            if self.seen.insert(owner) {
                self.nodes_left -= 1;
                return Some(owner);
            }
        }
        None
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::from(self.nodes_left > 0 && self.steps_left > 0), Some(self.nodes_left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(spec: &[(&str, u32)]) -> Vec<Node> {
        spec.iter().map(|&(id, w)| Node::new(id, w).unwrap()).collect()
    }

    #[test]
    fn errors_not_panics() {
        assert_eq!(Ring::new(nodes(&[("a", 1), ("a", 2)])).unwrap_err(), Error::DuplicateNode("a".into()));
        assert_eq!(Ring::builder().vnodes(0).build(nodes(&[("a", 1)])).unwrap_err(), Error::ZeroVnodes);
        let big = Ring::builder().vnodes(u32::MAX).build(nodes(&[("a", u32::MAX)]));
        assert!(matches!(big, Err(Error::TooManyPoints { .. })));
        let ring = Ring::new(nodes(&[("a", 1)])).unwrap();
        assert_eq!(ring.with_node(Node::new("a", 3).unwrap()).unwrap_err(), Error::DuplicateNode("a".into()));
        assert_eq!(ring.without_node("zz").unwrap_err(), Error::UnknownNode("zz".into()));
        assert_eq!(ring.with_weight("a", 0).unwrap_err(), Error::ZeroWeight("a".into()));
    }

    #[test]
    fn empty_ring_locates_nothing() {
        let ring = Ring::new(vec![]).unwrap();
        assert_eq!(ring.locate(b"k"), None);
        assert_eq!(ring.candidates(b"k").count(), 0);
        let ring = Ring::new(nodes(&[("a", 1)])).unwrap().without_node("a").unwrap();
        assert_eq!(ring.locate_hash(u64::MAX), None);
    }

    #[test]
    fn labels_are_unambiguous() {
        // "a1" point 0 and "a" point 10 would collide with plain concatenation.
        let ring = Ring::builder().vnodes(11).build(nodes(&[("a1", 1), ("a", 1)])).unwrap();
        let mut hashes: Vec<u64> = ring.points().map(|p| p.0).collect();
        hashes.dedup();
        assert_eq!(hashes.len(), 22);
    }

    #[test]
    fn point_counts_follow_weight() {
        let ring = Ring::builder().vnodes(10).build(nodes(&[("a", 1), ("b", 3)])).unwrap();
        assert_eq!(ring.point_count(), 40);
        assert_eq!(ring.points().filter(|p| p.1 == 1).count(), 30);
        let lighter = ring.with_weight("b", 2).unwrap();
        assert_eq!(lighter.points().filter(|p| p.1 == 1).count(), 20);
    }

    #[test]
    fn types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Ring>();
        check::<Ring<std::sync::Arc<String>>>();
        check::<RingCandidates<'static>>();
    }
}
