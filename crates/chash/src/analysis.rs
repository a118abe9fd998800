//! Exact and sampled analysis of placements: who owns how much of the hash
//! space, how evenly keys spread, and what a change moves.

use std::collections::HashMap;

use crate::placement::{Placement, PointRing};
use crate::{Error, Node, Result};

/// Exact share of the hash space owned by each node (indexed like
/// [`Placement::nodes`]); the shares add up to 1 for a non-empty ring.
///
/// ```
/// use chash::{analysis::ownership, Node, Ring};
/// let ring = Ring::new(vec![Node::new("a", 1)?, Node::new("b", 3)?])?;
/// let share = ownership(&ring);
/// assert!((share[0] + share[1] - 1.0).abs() < 1e-12);
/// assert!(share[1] > share[0]);
/// # Ok::<(), chash::Error>(())
/// ```
pub fn ownership<P: PointRing>(ring: &P) -> Vec<f64> {
    let mut owned = vec![0u128; ring.nodes().len()];
    let hashes = ring.point_hashes();
    let Some(&last) = hashes.last() else {
        return vec![0.0; owned.len()];
    };
    let space = 1u128 << ring.space_bits();
    // The first point owns [0, p0] and the wrap-around arc (last, space).
    owned[ring.point_owner(0)] += u128::from(hashes[0]) + 1 + (space - 1 - u128::from(last));
    for pos in 1..hashes.len() {
        owned[ring.point_owner(pos)] += u128::from(hashes[pos] - hashes[pos - 1]);
    }
    owned.into_iter().map(|o| o as f64 / space as f64).collect()
}

/// The arcs of a ring as `(start, end, owner)`: fractions of the hash space
/// (`end` exclusive), in order, owners as node indices. A key with hash `h`
/// belongs to the first point at or after `h`, so point `p` owns the hash
/// values after the previous point up to `p` itself: its arc ends at
/// `(p + 1) / 2^bits`. The first point also owns the wrap-around arc, the
/// last one listed.
pub fn arcs<P: PointRing>(ring: &P) -> Vec<(f64, f64, usize)> {
    let hashes = ring.point_hashes();
    let space = 2f64.powi(ring.space_bits() as i32);
    let mut arcs = Vec::with_capacity(hashes.len() + 1);
    let mut start = 0.0;
    for (pos, &h) in hashes.iter().enumerate() {
        let end = (h as f64 + 1.0) / space;
        arcs.push((start, end, ring.point_owner(pos)));
        start = end;
    }
    if !hashes.is_empty() && start < 1.0 {
        arcs.push((start, 1.0, ring.point_owner(0)));
    }
    arcs
}

/// A contiguous range of hash values `first..=last` whose owner changes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MovedArc {
    /// First hash value of the range.
    pub first: u64,
    /// Last hash value of the range (inclusive).
    pub last: u64,
    /// Index of the old owner in the old placement's nodes.
    pub from: usize,
    /// Index of the new owner in the new placement's nodes.
    pub to: usize,
    /// Share of the whole hash space.
    pub fraction: f64,
}

/// The share of the hash space moving from one node to another.
#[derive(Clone, Debug, PartialEq)]
pub struct PairShare {
    /// Id of the old owner.
    pub from: String,
    /// Id of the new owner.
    pub to: String,
    /// Share of the whole hash space.
    pub fraction: f64,
}

/// What changes between two placements over the same hash space.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Diff {
    /// Changed ranges in hash order; adjacent ranges with the same owners are merged.
    pub arcs: Vec<MovedArc>,
    /// Totals per (from, to) pair, largest first.
    pub pairs: Vec<PairShare>,
    /// Share of the hash space whose owner changes.
    pub moved: f64,
}

/// The arcs of the hash space whose owner differs between `old` and `new`,
/// with totals per (from, to) pair. Owners are compared by node id.
///
/// # Errors
/// [`Error::Incomparable`] when the two have different hash spaces or either is empty.
///
/// ```
/// use chash::{analysis::diff, Node, Ring};
/// let old = Ring::new(vec![Node::new("a", 1)?, Node::new("b", 1)?])?;
/// let new = old.with_node(Node::new("c", 1)?)?;
/// let d = diff(&old, &new)?;
/// assert!(d.pairs.iter().all(|p| p.to == "c"));
/// assert!(d.moved > 0.2 && d.moved < 0.45);
/// # Ok::<(), chash::Error>(())
/// ```
pub fn diff<A: PointRing, B: PointRing>(old: &A, new: &B) -> Result<Diff> {
    if old.space_bits() != new.space_bits() || old.hasher() != new.hasher() {
        return Err(Error::Incomparable(format!("the hash spaces differ ({} vs {})", old.hasher(), new.hasher())));
    }
    let (ho, hn) = (old.point_hashes(), new.point_hashes());
    if ho.is_empty() || hn.is_empty() {
        return Err(Error::Incomparable("one of them has no nodes".into()));
    }
    // Map each new node index to the old index with the same id, if any.
    let same: Vec<Option<usize>> = new.nodes().iter().map(|n| old.position(n.id())).collect();
    let space = 1u128 << old.space_bits();
    let mut arcs: Vec<MovedArc> = Vec::new();
    let mut push = |first: u64, last: u64, from: usize, to: usize| {
        if same[to] == Some(from) {
            return;
        }
        if let Some(prev) = arcs.last_mut() {
            if prev.from == from && prev.to == to && prev.last.checked_add(1) == Some(first) {
                prev.last = last;
                return;
            }
        }
        arcs.push(MovedArc { first, last, from, to, fraction: 0.0 });
    };
    // Every boundary of either ring: between consecutive boundaries both
    // owners are constant, and equal to the owners at the upper boundary.
    let (mut i, mut j) = (0usize, 0usize);
    let mut start = 0u64;
    while i < ho.len() || j < hn.len() {
        let b = match (ho.get(i), hn.get(j)) {
            (Some(&x), Some(&y)) => x.min(y),
            (Some(&x), None) => x,
            (None, Some(&y)) => y,
            (None, None) => break,
        };
        let from = old.point_owner(if i < ho.len() { i } else { 0 });
        let to = new.point_owner(if j < hn.len() { j } else { 0 });
        push(start, b, from, to);
        while i < ho.len() && ho[i] == b {
            i += 1;
        }
        while j < hn.len() && hn[j] == b {
            j += 1;
        }
        start = b.wrapping_add(1);
    }
    let max = (space - 1) as u64;
    let last_boundary = ho[ho.len() - 1].max(hn[hn.len() - 1]);
    if last_boundary < max {
        push(start, max, old.point_owner(0), new.point_owner(0));
    }
    let mut pairs: Vec<(usize, usize, u128)> = Vec::new();
    let mut moved = 0u128;
    for arc in &mut arcs {
        let len = u128::from(arc.last - arc.first) + 1;
        arc.fraction = len as f64 / space as f64;
        moved += len;
        match pairs.iter_mut().find(|p| p.0 == arc.from && p.1 == arc.to) {
            Some(p) => p.2 += len,
            None => pairs.push((arc.from, arc.to, len)),
        }
    }
    pairs.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
    let pairs = pairs
        .into_iter()
        .map(|(f, t, len)| PairShare {
            from: old.nodes()[f].id().to_owned(),
            to: new.nodes()[t].id().to_owned(),
            fraction: len as f64 / space as f64,
        })
        .collect();
    Ok(Diff { arcs, pairs, moved: moved as f64 / space as f64 })
}

/// Keys per node (indexed like [`Placement::nodes`]) for the given keys.
pub fn sample_load<P: Placement, K: AsRef<[u8]>>(placement: &P, keys: impl IntoIterator<Item = K>) -> Vec<u64> {
    let mut counts = vec![0u64; placement.nodes().len()];
    for key in keys {
        if let Some(i) = placement.locate(key.as_ref()) {
            counts[i] += 1;
        }
    }
    counts
}

/// Balance of a load vector against the nodes' weights.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Balance {
    /// Coefficient of variation of load per unit of weight (0 = perfect).
    pub cv: f64,
    /// Largest load per unit of weight over the mean load per unit of weight.
    pub peak_over_mean: f64,
}

impl Balance {
    /// Balance of `loads` (keys or shares per node) given each node's weight.
    /// Both slices are indexed alike; an empty or all-zero input gives zeros.
    pub fn of(loads: &[f64], weights: &[u32]) -> Balance {
        let total_w: f64 = weights.iter().map(|&w| f64::from(w)).sum();
        let total: f64 = loads.iter().sum();
        if loads.is_empty() || total <= 0.0 || total_w <= 0.0 {
            return Balance { cv: 0.0, peak_over_mean: 0.0 };
        }
        // Load relative to the node's fair share: 1.0 is exactly fair.
        let rel: Vec<f64> = loads.iter().zip(weights).map(|(&l, &w)| (l / total) / (f64::from(w) / total_w)).collect();
        // Weighted by weight, so a heavy node's deviation counts for its share.
        let var = rel.iter().zip(weights).map(|(r, &w)| f64::from(w) / total_w * (r - 1.0).powi(2)).sum::<f64>();
        let peak = rel.iter().cloned().fold(f64::MIN, f64::max);
        Balance { cv: var.sqrt(), peak_over_mean: peak }
    }
}

/// The coefficient of variation that sampling alone produces when `keys`
/// keys fall uniformly on `nodes` equal nodes: `sqrt((nodes - 1) / keys)`.
/// No placement measured with that many keys can look better than this.
pub fn sampling_floor_cv(keys: u64, nodes: usize) -> f64 {
    if keys == 0 || nodes == 0 {
        return 0.0;
    }
    ((nodes as f64 - 1.0) / keys as f64).sqrt()
}

/// The least share of the key space any placement must move when its nodes
/// change from `old` to `new` (nodes matched by id): the sum over nodes of
/// `max(0, old share - new share)`, each share being the node's weight over
/// the total weight (0 for a node absent from that side). It is 0 when both
/// sides are empty and 1 when only one is.
///
/// ```
/// use chash::{analysis::optimal_movement, Node};
/// let four: Vec<Node> = ["a", "b", "c", "d"].iter().map(|id| Node::new(*id, 1)).collect::<Result<_, _>>()?;
/// // One of four equal nodes leaves: its quarter moves.
/// assert!((optimal_movement(&four, &four[..3]) - 0.25).abs() < 1e-12);
/// // A fifth joins: it takes a fifth.
/// let five = [four.clone(), vec![Node::new("e", 1)?]].concat();
/// assert!((optimal_movement(&four, &five) - 0.2).abs() < 1e-12);
/// // Doubling a's weight: a's share goes from 1/4 to 2/5.
/// let heavier = [vec![Node::new("a", 2)?], four[1..].to_vec()].concat();
/// assert!((optimal_movement(&four, &heavier) - 0.15).abs() < 1e-12);
/// # Ok::<(), chash::Error>(())
/// ```
pub fn optimal_movement<T, U>(old: &[Node<T>], new: &[Node<U>]) -> f64 {
    let total = |ws: &mut dyn Iterator<Item = u32>| ws.map(f64::from).sum::<f64>();
    let (old_w, new_w) = (total(&mut old.iter().map(Node::weight)), total(&mut new.iter().map(Node::weight)));
    if old_w == 0.0 || new_w == 0.0 {
        return if old_w == new_w { 0.0 } else { 1.0 };
    }
    let now: HashMap<&str, u32> = new.iter().map(|m| (m.id(), m.weight())).collect();
    old.iter()
        .map(|n| {
            let share = now.get(n.id()).map_or(0.0, |&w| f64::from(w) / new_w);
            (f64::from(n.weight()) / old_w - share).max(0.0)
        })
        .sum()
}
