//! Sorted ring points with an O(1) bucket index: the storage shared by every
//! placement that is "first point ≥ hash, wrapping" (the native ring, and the
//! compatibility rings).
//!
//! Layout (structure of arrays, so a lookup touches few cache lines):
//! - `hashes`: the sorted point positions, 8 bytes each;
//! - `owners`: the node index of each point, 2 bytes each while there are at
//!   most 65,536 nodes, else 4;
//! - `index`: `2^k + 1` offsets, where bucket `b` holds the points whose top
//!   `k` bits (of the hasher's `bits`-wide space) equal `b`. `k` is chosen so
//!   that a bucket holds 2 to 4 points on average, which keeps the index at
//!   2 bytes per point or less: 12 bytes per point in all.
//!
//! A lookup reads `index[h >> shift]` and steps forward over the few points of
//! that bucket that are below `h`. Points are ordered by hash, and equal hashes
//! by the owner's id (byte order), so the order never depends on the order in
//! which nodes were added.

use std::cmp::Ordering;

/// Node index per point, as narrow as the node count allows.
#[derive(Clone, Debug)]
enum Owners {
    Narrow(Vec<u16>),
    Wide(Vec<u32>),
}

impl Owners {
    fn collect(node_count: usize, owners: impl Iterator<Item = u32>) -> Owners {
        if node_count <= 1 << 16 {
            Owners::Narrow(owners.map(|o| o as u16).collect())
        } else {
            Owners::Wide(owners.collect())
        }
    }

    #[inline]
    fn get(&self, pos: usize) -> usize {
        match self {
            Owners::Narrow(v) => usize::from(v[pos]),
            Owners::Wide(v) => v[pos] as usize,
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Owners::Narrow(v) => v.capacity() * 2,
            Owners::Wide(v) => v.capacity() * 4,
        }
    }
}

/// The sorted points of a ring and their bucket index.
#[derive(Clone, Debug)]
pub(crate) struct Points {
    hashes: Vec<u64>,
    owners: Owners,
    index: Vec<u32>,
    shift: u32,
    bits: u32,
}

/// `(hash, owner)` before sorting.
pub(crate) type RawPoint = (u64, u32);

/// Index width for `n` points in a `bits`-wide space: `2^k` buckets with
/// `n/4 < 2^k <= n/2` (at least 2 buckets, at most `2^bits`).
fn index_bits(n: usize, bits: u32) -> u32 {
    let log2 = usize::BITS - 1 - n.max(1).leading_zeros();
    log2.saturating_sub(1).clamp(1, bits)
}

impl Points {
    /// Sorts `raw` (hash, owner) pairs into a point set. `rank[owner]` orders
    /// equal hashes (the owner's position among the nodes sorted by id).
    pub(crate) fn build(bits: u32, node_count: usize, mut raw: Vec<RawPoint>, rank: &[u32]) -> Points {
        // Counting sort on the index bucket, then a small sort inside each
        // bucket: linear time, and the bucket offsets are the index itself.
        let k = index_bits(raw.len(), bits);
        let shift = bits - k;
        let buckets = 1usize << k;
        let mut index = vec![0u32; buckets + 1];
        for &(h, _) in &raw {
            index[(h >> shift) as usize + 1] += 1;
        }
        for b in 0..buckets {
            index[b + 1] += index[b];
        }
        let mut next: Vec<u32> = index[..buckets].to_vec();
        let mut sorted: Vec<RawPoint> = vec![(0, 0); raw.len()];
        for &(h, o) in &raw {
            let slot = &mut next[(h >> shift) as usize];
            sorted[*slot as usize] = (h, o);
            *slot += 1;
        }
        raw.clear();
        for b in 0..buckets {
            let bucket = &mut sorted[index[b] as usize..index[b + 1] as usize];
            if bucket.len() > 1 {
                bucket.sort_unstable_by(|a, b| cmp_points(a, b, rank));
            }
        }
        let hashes = sorted.iter().map(|p| p.0).collect();
        let owners = Owners::collect(node_count, sorted.iter().map(|p| p.1));
        Points { hashes, owners, index, shift, bits }
    }

    /// A new point set: these points plus `added` (sorted by [`cmp_points`]),
    /// in one linear merge.
    pub(crate) fn merged(&self, node_count: usize, added: &[RawPoint], rank: &[u32]) -> Points {
        let total = self.hashes.len() + added.len();
        let mut hashes = Vec::with_capacity(total);
        let mut owners = Vec::with_capacity(total);
        let (mut i, mut j) = (0, 0);
        while i < self.hashes.len() && j < added.len() {
            let mine = (self.hashes[i], self.owners.get(i) as u32);
            if cmp_points(&mine, &added[j], rank) != Ordering::Greater {
                hashes.push(mine.0);
                owners.push(mine.1);
                i += 1;
            } else {
                hashes.push(added[j].0);
                owners.push(added[j].1);
                j += 1;
            }
        }
        for p in i..self.hashes.len() {
            hashes.push(self.hashes[p]);
            owners.push(self.owners.get(p) as u32);
        }
        for &(h, o) in &added[j..] {
            hashes.push(h);
            owners.push(o);
        }
        Points::from_sorted(self.bits, node_count, hashes, owners.into_iter())
    }

    /// A new point set keeping the points for which `keep(owner)` returns a new
    /// owner index. The mapping must preserve the relative id order of owners.
    pub(crate) fn filtered(&self, node_count: usize, keep: impl Fn(u32) -> Option<u32>) -> Points {
        let mut hashes = Vec::with_capacity(self.hashes.len());
        let mut owners = Vec::with_capacity(self.hashes.len());
        for (pos, &h) in self.hashes.iter().enumerate() {
            if let Some(o) = keep(self.owners.get(pos) as u32) {
                hashes.push(h);
                owners.push(o);
            }
        }
        Points::from_sorted(self.bits, node_count, hashes, owners.into_iter())
    }

    fn from_sorted(bits: u32, node_count: usize, hashes: Vec<u64>, owners: impl Iterator<Item = u32>) -> Points {
        let k = index_bits(hashes.len(), bits);
        let shift = bits - k;
        let buckets = 1usize << k;
        let mut index = Vec::with_capacity(buckets + 1);
        let mut pos = 0usize;
        for b in 0..=buckets as u64 {
            while pos < hashes.len() && hashes[pos] >> shift < b {
                pos += 1;
            }
            index.push(pos as u32);
        }
        Points { owners: Owners::collect(node_count, owners), hashes, index, shift, bits }
    }

    /// Position of the first point `>= h`, wrapping to 0; `None` when empty.
    #[inline]
    pub(crate) fn locate(&self, h: u64) -> Option<usize> {
        let last = *self.hashes.last()?;
        if h > last {
            return Some(0);
        }
        // h <= last < 2^bits, so the bucket exists, and some point at or after
        // index[bucket] is >= h: the scan needs no end check.
        let mut pos = self.index[(h >> self.shift) as usize] as usize;
        while self.hashes[pos] < h {
            pos += 1;
        }
        Some(pos)
    }

    /// Owner (node index) of the point at `pos`.
    #[inline]
    pub(crate) fn owner(&self, pos: usize) -> usize {
        self.owners.get(pos)
    }

    pub(crate) fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    pub(crate) fn len(&self) -> usize {
        self.hashes.len()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.hashes.capacity() * 8 + self.owners.heap_bytes() + self.index.capacity() * 4
    }
}

/// Ring order: by hash, then by the owner's id rank.
#[inline]
pub(crate) fn cmp_points(a: &RawPoint, b: &RawPoint, rank: &[u32]) -> Ordering {
    a.0.cmp(&b.0).then_with(|| rank[a.1 as usize].cmp(&rank[b.1 as usize]))
}

/// `rank[i]` = position of node `i` when the ids are sorted bytewise.
pub(crate) fn id_ranks<'a>(ids: impl ExactSizeIterator<Item = &'a str>) -> Vec<u32> {
    let mut order: Vec<(usize, &str)> = ids.enumerate().collect();
    order.sort_unstable_by(|a, b| a.1.cmp(b.1));
    let mut rank = vec![0u32; order.len()];
    for (r, (i, _)) in order.into_iter().enumerate() {
        rank[i] = r as u32;
    }
    rank
}

/// A set of bits over node indices that needs no allocation up to 1,024
/// nodes and one allocation beyond (for candidate iterators).
#[derive(Clone, Debug)]
pub(crate) enum Seen {
    Inline([u64; 16]),
    Heap(Vec<u64>),
}

impl Seen {
    pub(crate) fn new(node_count: usize) -> Seen {
        if node_count <= 16 * 64 {
            Seen::Inline([0; 16])
        } else {
            Seen::Heap(vec![0; node_count.div_ceil(64)])
        }
    }

    /// Marks `i`; returns whether it was unmarked before.
    #[inline]
    pub(crate) fn insert(&mut self, i: usize) -> bool {
        let words: &mut [u64] = match self {
            Seen::Inline(w) => w,
            Seen::Heap(w) => w,
        };
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        let fresh = words[word] & bit == 0;
        words[word] |= bit;
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(points: &[RawPoint], h: u64) -> u32 {
        points.iter().find(|p| p.0 >= h).unwrap_or(&points[0]).1
    }

    #[test]
    fn index_bits_keeps_buckets_between_a_quarter_and_a_half() {
        for n in [4usize, 5, 7, 8, 100, 16_000, 160_000, 1 << 20] {
            let b = 1usize << index_bits(n, 64);
            assert!(n / 4 < b && b <= n / 2, "{n} {b}");
        }
        assert_eq!(index_bits(0, 64), 1);
        assert_eq!(index_bits(1 << 20, 15), 15);
    }

    #[test]
    fn small_spaces_and_ties() {
        // 4-bit space with many equal hashes: ties go to the lower rank.
        let raw: Vec<RawPoint> = vec![(3, 0), (3, 1), (9, 2), (15, 1), (0, 2), (9, 0)];
        let rank = [2, 0, 1]; // node 1 < node 2 < node 0 by id
        let pts = Points::build(4, 3, raw.clone(), &rank);
        let mut sorted = raw.clone();
        sorted.sort_by(|a, b| cmp_points(a, b, &rank));
        for h in 0..16 {
            let pos = pts.locate(h).unwrap();
            assert_eq!(pts.owner(pos) as u32, naive(&sorted, h), "h={h}");
        }
        assert_eq!(pts.owner(pts.locate(3).unwrap()), 1);
        assert_eq!(pts.owner(pts.locate(9).unwrap()), 2);
        assert!(Points::build(4, 0, vec![], &[]).locate(5).is_none());
    }
}
