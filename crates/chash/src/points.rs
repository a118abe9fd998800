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

/// An owner index stored per point: `u16` while there are at most 65,536
/// nodes, else `u32`.
trait OwnerInt: Copy + Default + Eq + Send + Sync + 'static {
    fn from_index(i: usize) -> Self;
    fn index(self) -> usize;
}

impl OwnerInt for u16 {
    #[inline]
    fn from_index(i: usize) -> Self {
        i as u16
    }
    #[inline]
    fn index(self) -> usize {
        usize::from(self)
    }
}

impl OwnerInt for u32 {
    #[inline]
    fn from_index(i: usize) -> Self {
        i as u32
    }
    #[inline]
    fn index(self) -> usize {
        self as usize
    }
}

/// Node index per point, as narrow as the node count allows.
#[derive(Clone, Debug)]
enum Owners {
    Narrow(Vec<u16>),
    Wide(Vec<u32>),
}

const NARROW_LIMIT: usize = 1 << 16;

impl Owners {
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

/// `(hash, owner)` of one point.
pub(crate) type RawPoint = (u64, u32);

/// Index width for `n` points in a `bits`-wide space: `2^k` buckets with
/// `n/4 < 2^k <= n/2` (at least 2 buckets, at most `2^bits`).
fn index_bits(n: usize, bits: u32) -> u32 {
    let log2 = usize::BITS - 1 - n.max(1).leading_zeros();
    log2.saturating_sub(1).clamp(1, bits)
}

/// Sorts `hashes`/`owners` (the same length) by (hash, rank[owner]) with an
/// insertion sort: buckets hold a handful of points.
fn sort_bucket<O: OwnerInt>(hashes: &mut [u64], owners: &mut [O], rank: &[u32]) {
    for i in 1..hashes.len() {
        let (h, o) = (hashes[i], owners[i]);
        let mut j = i;
        while j > 0 && (hashes[j - 1], rank[owners[j - 1].index()]) > (h, rank[o.index()]) {
            hashes[j] = hashes[j - 1];
            owners[j] = owners[j - 1];
            j -= 1;
        }
        hashes[j] = h;
        owners[j] = o;
    }
}

/// Counting sort of points into buckets, then a small sort per bucket.
/// `raw` holds the point hashes grouped by owner: `counts[o]` for owner `o`.
fn scatter<O: OwnerInt>(raw: &[u64], counts: &[usize], index: &[u32], shift: u32, rank: &[u32]) -> (Vec<u64>, Vec<O>) {
    let buckets = index.len() - 1;
    let mut next: Vec<u32> = index[..buckets].to_vec();
    let mut hashes = vec![0u64; raw.len()];
    let mut owners = vec![O::default(); raw.len()];
    let mut start = 0;
    for (o, &count) in counts.iter().enumerate() {
        let owner = O::from_index(o);
        for &h in &raw[start..start + count] {
            let slot = &mut next[(h >> shift) as usize];
            hashes[*slot as usize] = h;
            owners[*slot as usize] = owner;
            *slot += 1;
        }
        start += count;
    }
    for b in 0..buckets {
        let (s, e) = (index[b] as usize, index[b + 1] as usize);
        if e - s > 1 {
            sort_bucket(&mut hashes[s..e], &mut owners[s..e], rank);
        }
    }
    (hashes, owners)
}

/// Position in `hashes`/`owners` where `p` goes: after every point that
/// orders before or equal to it.
fn insertion_point<O: OwnerInt>(hashes: &[u64], owners: &[O], p: RawPoint, rank: &[u32], from: usize) -> usize {
    let key = (p.0, rank[p.1 as usize]);
    let (mut lo, mut hi) = (from, hashes.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if (hashes[mid], rank[owners[mid].index()]) <= key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// `hashes`/`owners` with `added` (sorted) merged in: one binary search and
/// one block copy per added point.
fn merge_into<O: OwnerInt>(hashes: &[u64], owners: &[O], added: &[RawPoint], rank: &[u32]) -> (Vec<u64>, Vec<O>) {
    let total = hashes.len() + added.len();
    let mut out_h = Vec::with_capacity(total);
    let mut out_o = Vec::with_capacity(total);
    let mut from = 0;
    for &p in added {
        let at = insertion_point(hashes, owners, p, rank, from);
        out_h.extend_from_slice(&hashes[from..at]);
        out_o.extend_from_slice(&owners[from..at]);
        out_h.push(p.0);
        out_o.push(O::from_index(p.1 as usize));
        from = at;
    }
    out_h.extend_from_slice(&hashes[from..]);
    out_o.extend_from_slice(&owners[from..]);
    (out_h, out_o)
}

/// `hashes`/`owners` without the points in `removed` (sorted), renumbering
/// owners with `renumber`. Points of `removed` that are absent are skipped.
fn remove_from<O: OwnerInt>(
    hashes: &[u64],
    owners: &[O],
    removed: &[RawPoint],
    rank: &[u32],
    renumber: impl Fn(O) -> O,
) -> (Vec<u64>, Vec<O>) {
    let mut out_h = Vec::with_capacity(hashes.len().saturating_sub(removed.len()));
    let mut out_o = Vec::with_capacity(out_h.capacity());
    let mut from = 0;
    for &p in removed {
        // If present, the point is the last one ordering <= p.
        let at = insertion_point(hashes, owners, p, rank, from);
        if at == from || hashes[at - 1] != p.0 || owners[at - 1].index() != p.1 as usize {
            continue;
        }
        out_h.extend_from_slice(&hashes[from..at - 1]);
        out_o.extend_from_slice(&owners[from..at - 1]);
        from = at;
    }
    out_h.extend_from_slice(&hashes[from..]);
    out_o.extend_from_slice(&owners[from..]);
    for o in &mut out_o {
        *o = renumber(*o);
    }
    (out_h, out_o)
}

impl Points {
    /// Sorts points into a point set. `raw` holds each owner's point hashes
    /// in owner order (`counts[o]` for owner `o`); `rank[owner]` orders equal
    /// hashes (the owner's position in the tie order).
    pub(crate) fn build(bits: u32, raw: &[u64], counts: &[usize], rank: &[u32]) -> Points {
        // Counting sort on the index bucket, then a small sort inside each
        // bucket: linear time, and the bucket offsets are the index itself.
        let k = index_bits(raw.len(), bits);
        let shift = bits - k;
        let buckets = 1usize << k;
        let mut index = vec![0u32; buckets + 1];
        for &h in raw {
            index[(h >> shift) as usize + 1] += 1;
        }
        for b in 0..buckets {
            index[b + 1] += index[b];
        }
        let (hashes, owners) = if counts.len() <= NARROW_LIMIT {
            let (h, o) = scatter::<u16>(raw, counts, &index, shift, rank);
            (h, Owners::Narrow(o))
        } else {
            let (h, o) = scatter::<u32>(raw, counts, &index, shift, rank);
            (h, Owners::Wide(o))
        };
        Points { hashes, owners, index, shift, bits }
    }

    /// A new point set: these points plus `added` (sorted by [`cmp_points`]),
    /// block-copied around one binary search per added point.
    pub(crate) fn merged(&self, node_count: usize, added: &[RawPoint], rank: &[u32]) -> Points {
        let (hashes, owners) = match &self.owners {
            // The new node needs more than 16 bits: widen once, then merge.
            Owners::Narrow(o) if node_count > NARROW_LIMIT => {
                let wide: Vec<u32> = o.iter().map(|&x| u32::from(x)).collect();
                let (h, o) = merge_into(&self.hashes, &wide, added, rank);
                (h, Owners::Wide(o))
            }
            Owners::Narrow(o) => {
                let (h, o) = merge_into(&self.hashes, o, added, rank);
                (h, Owners::Narrow(o))
            }
            Owners::Wide(o) => {
                let (h, o) = merge_into(&self.hashes, o, added, rank);
                (h, Owners::Wide(o))
            }
        };
        self.reindexed(hashes, owners, added, 1)
    }

    /// A new point set without `removed` (sorted by [`cmp_points`]), owners
    /// renumbered by `renumber` (which must keep the tie order).
    pub(crate) fn without(&self, removed: &[RawPoint], rank: &[u32], renumber: impl Fn(usize) -> usize) -> Points {
        let (hashes, owners) = match &self.owners {
            Owners::Narrow(o) => {
                let (h, o) = remove_from(&self.hashes, o, removed, rank, |x| u16::from_index(renumber(x.index())));
                (h, Owners::Narrow(o))
            }
            Owners::Wide(o) => {
                let (h, o) = remove_from(&self.hashes, o, removed, rank, |x| u32::from_index(renumber(x.index())));
                (h, Owners::Wide(o))
            }
        };
        self.reindexed(hashes, owners, removed, -1)
    }

    /// The index for new sorted arrays that differ from these by `changed`
    /// points (added when `sign` is 1, removed when -1): shifted in one pass
    /// over the buckets when the bucket count stays, rebuilt otherwise.
    fn reindexed(&self, hashes: Vec<u64>, owners: Owners, changed: &[RawPoint], sign: i64) -> Points {
        let k = index_bits(hashes.len(), self.bits);
        let shift = self.bits - k;
        // A removal of absent points changes fewer points than listed: rebuild then.
        let expected = if sign > 0 { self.hashes.len() + changed.len() } else { self.hashes.len() - changed.len() };
        if shift != self.shift || hashes.len() != expected {
            return Points::with_fresh_index(self.bits, hashes, owners);
        }
        let mut index = Vec::with_capacity(self.index.len());
        let mut before = 0i64; // changed points in buckets < b
        let mut c = 0;
        for (b, &old) in self.index.iter().enumerate() {
            while c < changed.len() && ((changed[c].0 >> shift) as usize) < b {
                before += 1;
                c += 1;
            }
            index.push((i64::from(old) + sign * before) as u32);
        }
        Points { hashes, owners, index, shift, bits: self.bits }
    }

    fn with_fresh_index(bits: u32, hashes: Vec<u64>, owners: Owners) -> Points {
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
        Points { hashes, owners, index, shift, bits }
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

    /// Owner (node index) of the first point `>= h`, wrapping: where a key
    /// with hash `h` goes. `None` when empty.
    #[inline]
    pub(crate) fn locate_owner(&self, h: u64) -> Option<usize> {
        self.locate(h).map(|pos| self.owner(pos))
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
        // Grouped by owner: node 0 has 3 and 9, node 1 has 3 and 15, node 2 has 9 and 0.
        let raw: Vec<RawPoint> = vec![(3, 0), (9, 0), (3, 1), (15, 1), (9, 2), (0, 2)];
        let rank = [2, 0, 1]; // node 1 < node 2 < node 0 by id
        let hashes: Vec<u64> = raw.iter().map(|p| p.0).collect();
        let pts = Points::build(4, &hashes, &[2, 2, 2], &rank);
        let mut sorted = raw.clone();
        sorted.sort_by(|a, b| cmp_points(a, b, &rank));
        for h in 0..16 {
            let pos = pts.locate(h).unwrap();
            assert_eq!(pts.owner(pos) as u32, naive(&sorted, h), "h={h}");
        }
        assert_eq!(pts.owner(pts.locate(3).unwrap()), 1);
        assert_eq!(pts.owner(pts.locate(9).unwrap()), 2);
        assert!(Points::build(4, &[], &[], &[]).locate(5).is_none());
        // Merging and removing give the same points as building.
        let two = Points::build(4, &hashes[..4], &[2, 2], &rank);
        let mut third = vec![(9, 2), (0, 2)];
        third.sort_by(|a, b| cmp_points(a, b, &rank));
        let merged = two.merged(3, &third, &rank);
        assert_eq!(merged.hashes, pts.hashes);
        assert_eq!(
            (0..6).map(|i| merged.owner(i)).collect::<Vec<_>>(),
            (0..6).map(|i| pts.owner(i)).collect::<Vec<_>>()
        );
        let back = merged.without(&third, &rank, |o| o);
        assert_eq!(back.hashes, two.hashes);
        assert_eq!(back.index, two.index);
    }
}
