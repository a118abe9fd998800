//! Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam,
//! 2016) over the native ring: `distribution: bounded`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::placement::Placement;
use crate::ring::{Ring, RingCandidates};
use crate::{Error, KeyHasher, Node, Result};

/// Balance factor `c` unless set: 1.25 (no node above 125% of its fair share).
pub const DEFAULT_BALANCE_FACTOR: f64 = 1.25;

/// The native [`Ring`] plus a load tracker: a key goes to the first node in
/// ring order ([`candidates`](Placement::candidates)) whose load is under
/// its cap.
///
/// - Each node has a load (requests or connections in flight, or keys
///   held), changed by [`acquire`](Bounded::acquire) and
///   [`release`](Bounded::release) with atomic counters, so one value serves
///   every thread through `&self`.
/// - With `L` the total load before an acquisition, node `i` of weight
///   `w_i` (total weight `W`) accepts it while its load is below
///   `⌈c × (L + 1) × w_i / W⌉` — for equal weights `⌈c × (L + 1) / n⌉`,
///   `c` times the mean load counting the new one. The key takes the first
///   node in ring order that accepts; so a key stays on its ring owner while
///   the owner is under its cap, and no node takes a key that would bring it
///   above `⌈c × mean⌉`.
/// - Under concurrent acquisitions the cap is computed from the total load
///   each thread saw, so it can be off by the acquisitions in flight.
///
/// [`locate_hash`](Placement::locate_hash) is stateless: it returns the ring
/// owner, where the key goes when loads allow. Only `acquire` applies the
/// bound.
///
/// ```
/// use chash::algo::Bounded;
/// use chash::{Node, Ring};
/// let ring = Ring::new(vec![Node::new("a", 1)?, Node::new("b", 1)?])?;
/// let bounded = Bounded::new(ring, 1.25)?;
/// let held: Vec<usize> = (0..100).map(|i| bounded.acquire(format!("k{i}").as_bytes()).unwrap()).collect();
/// assert!(bounded.loads().iter().all(|&l| l <= 63)); // ⌈1.25 × 100 / 2⌉
/// for i in held {
///     bounded.release(i);
/// }
/// assert_eq!(bounded.total_load(), 0);
/// # Ok::<(), chash::Error>(())
/// ```
#[derive(Debug)]
pub struct Bounded<T = ()> {
    ring: Ring<T>,
    factor: f64,
    total_weight: f64,
    loads: Vec<AtomicU64>,
    total: AtomicU64,
}

impl<T: Clone> Clone for Bounded<T> {
    /// A copy with the current loads.
    fn clone(&self) -> Self {
        Bounded {
            ring: self.ring.clone(),
            factor: self.factor,
            total_weight: self.total_weight,
            loads: self.loads.iter().map(|l| AtomicU64::new(l.load(Ordering::Relaxed))).collect(),
            total: AtomicU64::new(self.total.load(Ordering::Relaxed)),
        }
    }
}

impl<T> Bounded<T> {
    /// Bounded loads over `ring` with balance factor `factor` (`c`), every
    /// load 0.
    ///
    /// # Errors
    /// [`Error::BadParameter`] unless `factor` is a number ≥ 1.
    pub fn new(ring: Ring<T>, factor: f64) -> Result<Bounded<T>>
    where
        T: Send + Sync,
    {
        if !(factor.is_finite() && factor >= 1.0) {
            return Err(Error::BadParameter {
                name: "balance_factor",
                reason: format!("{factor} must be a number of at least 1 (default {DEFAULT_BALANCE_FACTOR})"),
            });
        }
        let total_weight = ring.nodes().iter().map(|n| f64::from(n.weight())).sum();
        let loads = ring.nodes().iter().map(|_| AtomicU64::new(0)).collect();
        Ok(Bounded { ring, factor, total_weight, loads, total: AtomicU64::new(0) })
    }

    /// The ring underneath.
    pub fn ring(&self) -> &Ring<T> {
        &self.ring
    }

    /// The balance factor `c`.
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// Current load of each node.
    pub fn loads(&self) -> Vec<u64> {
        self.loads.iter().map(|l| l.load(Ordering::Relaxed)).collect()
    }

    /// Current total load.
    pub fn total_load(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The cap of node `i` for an acquisition when the total load is `total`:
    /// `⌈c × (total + 1) × w_i / W⌉`.
    pub fn cap(&self, i: usize, total: u64) -> u64
    where
        T: Send + Sync,
    {
        let w = self.ring.nodes().get(i).map_or(0.0, |n| f64::from(n.weight()));
        (self.factor * (total as f64 + 1.0) * w / self.total_weight).ceil() as u64
    }

    /// Takes one unit of load for `key` on the first node in ring order under
    /// its cap, and returns that node's index (`None` when there are no nodes).
    pub fn acquire(&self, key: &[u8]) -> Option<usize>
    where
        T: Send + Sync,
    {
        self.acquire_hash(self.ring.hasher().hash(key))
    }

    /// As [`acquire`](Bounded::acquire), from the key's hash value.
    pub fn acquire_hash(&self, hash: u64) -> Option<usize>
    where
        T: Send + Sync,
    {
        self.acquire_hash_in(hash, |i| &self.loads[i], &self.total)
    }

    /// As [`acquire_hash`](Bounded::acquire_hash), taking the load in
    /// counters kept elsewhere: `load(i)` is node `i`'s, `total` their sum.
    /// For callers whose loads outlive one placement (a proxy whose
    /// membership changes while requests hold load keeps one counter per
    /// server, shared by every placement it builds).
    pub fn acquire_hash_in<'l>(
        &self,
        hash: u64,
        load: impl Fn(usize) -> &'l AtomicU64,
        total: &AtomicU64,
    ) -> Option<usize>
    where
        T: Send + Sync,
    {
        let owner = self.ring.locate_hash(hash)?;
        let seen = total.load(Ordering::Acquire);
        // The owner first: the common case, and no candidate iterator (which
        // allocates a bit set past 1,024 nodes).
        if self.try_take(load(owner), owner, seen, total) {
            return Some(owner);
        }
        for i in self.ring.candidates_hash(hash).skip(1) {
            if self.try_take(load(i), i, seen, total) {
                return Some(i);
            }
        }
        // Every node at its cap: only when other threads raced past the
        // total this one saw. The owner takes it.
        load(owner).fetch_add(1, Ordering::AcqRel);
        total.fetch_add(1, Ordering::AcqRel);
        Some(owner)
    }

    /// Takes one unit on node `i` (counter `load`) if it is under its cap
    /// for total load `seen`.
    #[inline]
    fn try_take(&self, load: &AtomicU64, i: usize, seen: u64, total: &AtomicU64) -> bool
    where
        T: Send + Sync,
    {
        let cap = self.cap(i, seen);
        let mut cur = load.load(Ordering::Relaxed);
        while cur < cap {
            match load.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    total.fetch_add(1, Ordering::AcqRel);
                    return true;
                }
                Err(now) => cur = now,
            }
        }
        false
    }

    /// As [`acquire`](Bounded::acquire), with a guard that releases the load
    /// when dropped.
    pub fn acquire_guard(&self, key: &[u8]) -> Option<LoadGuard<'_, T>>
    where
        T: Send + Sync,
    {
        self.acquire(key).map(|node| LoadGuard { bounded: self, node })
    }

    /// Gives back one unit of load on node `i`; returns whether it had any.
    pub fn release(&self, i: usize) -> bool {
        let Some(load) = self.loads.get(i) else {
            return false;
        };
        if load.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |l| l.checked_sub(1)).is_err() {
            return false;
        }
        let _ = self.total.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |t| t.checked_sub(1));
        true
    }

    /// A tracker over another ring, keeping the loads of nodes that stay.
    fn over(&self, ring: Ring<T>) -> Bounded<T>
    where
        T: Send + Sync,
    {
        let loads: Vec<AtomicU64> = ring
            .nodes()
            .iter()
            .map(|n| {
                let before = self.ring.index_of(n.id()).map_or(0, |i| self.loads[i].load(Ordering::Relaxed));
                AtomicU64::new(before)
            })
            .collect();
        let total = loads.iter().map(|l| l.load(Ordering::Relaxed)).sum();
        let total_weight = ring.nodes().iter().map(|n| f64::from(n.weight())).sum();
        Bounded { ring, factor: self.factor, total_weight, loads, total: AtomicU64::new(total) }
    }
}

impl<T: Clone + Send + Sync> Bounded<T> {
    /// A new tracker with `node` added to the ring (loads of the others kept).
    ///
    /// # Errors
    /// As [`Ring::with_node`].
    pub fn with_node(&self, node: Node<T>) -> Result<Bounded<T>> {
        Ok(self.over(self.ring.with_node(node)?))
    }

    /// A new tracker without node `id` (its load is dropped).
    ///
    /// # Errors
    /// As [`Ring::without_node`].
    pub fn without_node(&self, id: &str) -> Result<Bounded<T>> {
        Ok(self.over(self.ring.without_node(id)?))
    }

    /// A new tracker where node `id` has `weight`.
    ///
    /// # Errors
    /// As [`Ring::with_weight`].
    pub fn with_weight(&self, id: &str, weight: u32) -> Result<Bounded<T>> {
        Ok(self.over(self.ring.with_weight(id, weight)?))
    }
}

impl<T: Send + Sync> Placement for Bounded<T> {
    type Payload = T;
    type Candidates<'a>
        = RingCandidates<'a>
    where
        T: 'a;

    fn hasher(&self) -> KeyHasher {
        self.ring.hasher()
    }

    fn nodes(&self) -> &[Node<T>] {
        self.ring.nodes()
    }

    /// The ring owner (stateless; [`Bounded::acquire`] applies the loads).
    #[inline]
    fn locate_hash(&self, hash: u64) -> Option<usize> {
        self.ring.locate_hash(hash)
    }

    fn candidates_hash(&self, hash: u64) -> RingCandidates<'_> {
        self.ring.candidates_hash(hash)
    }
}

/// One unit of load on a node, released when dropped.
#[derive(Debug)]
#[must_use = "the load is released as soon as the guard is dropped"]
pub struct LoadGuard<'a, T> {
    bounded: &'a Bounded<T>,
    node: usize,
}

impl<T> LoadGuard<'_, T> {
    /// The node holding the load.
    pub fn node(&self) -> usize {
        self.node
    }
}

impl<T> Drop for LoadGuard<'_, T> {
    fn drop(&mut self) {
        self.bounded.release(self.node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(n: usize) -> Ring {
        Ring::new((0..n).map(|i| Node::new(format!("n{i}"), 1 + i as u32 % 3).unwrap()).collect()).unwrap()
    }

    #[test]
    fn no_node_above_its_cap() {
        let b = Bounded::new(ring(10), 1.1).unwrap();
        for k in 0..20_000u32 {
            let total = b.total_load();
            let i = b.acquire(&k.to_le_bytes()).unwrap();
            assert!(b.loads()[i] <= b.cap(i, total), "key {k}");
        }
        let w: Vec<f64> = b.nodes().iter().map(|n| f64::from(n.weight())).collect();
        let tw: f64 = w.iter().sum();
        for (i, l) in b.loads().into_iter().enumerate() {
            assert!(l as f64 <= (1.1 * 20_000.0 * w[i] / tw).ceil(), "node {i}: {l}");
        }
    }

    #[test]
    fn guards_release_and_changes_keep_loads() {
        let b = Bounded::new(ring(3), 1.25).unwrap();
        {
            let g = b.acquire_guard(b"k").unwrap();
            assert_eq!(b.loads()[g.node()], 1);
        }
        assert_eq!(b.total_load(), 0);
        assert!(!b.release(0));
        assert!(!b.release(99));
        let i = b.acquire(b"k").unwrap();
        let grown = b.with_node(Node::new("x", 1).unwrap()).unwrap();
        assert_eq!(grown.loads()[i], 1);
        assert_eq!(grown.total_load(), 1);
        assert!(Bounded::new(ring(2), 0.5).is_err());
        assert!(Bounded::new(ring(2), f64::NAN).is_err());
        let empty = Bounded::new(Ring::new(vec![]).unwrap(), 1.25).unwrap();
        assert_eq!(empty.acquire(b"k"), None);
    }

    #[test]
    fn loads_kept_elsewhere_follow_the_same_rule() {
        let b = Bounded::new(ring(6), 1.1).unwrap();
        let mine: Vec<AtomicU64> = (0..6).map(|_| AtomicU64::new(0)).collect();
        let total = AtomicU64::new(0);
        for k in 0..5_000u32 {
            let a = b.acquire(&k.to_le_bytes()).unwrap();
            let hash = b.hasher().hash(&k.to_le_bytes());
            let c = b.acquire_hash_in(hash, |i| &mine[i], &total).unwrap();
            assert_eq!(a, c, "key {k}: same loads, same choice");
        }
        assert_eq!(total.load(Ordering::Relaxed), 5_000);
        assert_eq!(b.total_load(), 5_000, "the tracker's own loads were not touched by the other");
    }

    #[test]
    fn threads_share_one_tracker() {
        let b = Bounded::new(ring(8), 1.25).unwrap();
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let b = &b;
                s.spawn(move || {
                    for k in 0..2000u32 {
                        let i = b.acquire(&(t * 10_000 + k).to_le_bytes()).unwrap();
                        if k % 2 == 0 {
                            b.release(i);
                        }
                    }
                });
            }
        });
        assert_eq!(b.total_load(), 4000);
        assert_eq!(b.loads().iter().sum::<u64>(), 4000);
    }
}
