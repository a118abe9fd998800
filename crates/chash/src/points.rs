//! Sorted ring points with an O(1) bucket index: the storage shared by every
//! placement that is "first point ≥ hash, wrapping" (the native ring, and the
//! compatibility rings).
//!
//! Layout (structure of arrays, so a lookup touches few cache lines):
//! - `hi`, `lo`: the sorted point positions, scaled to a 64-bit space and
//!   split into their top and bottom 32 bits, 4 bytes each: lookups compare
//!   only `hi` (eight to a 32-byte window) and read `lo` only on a tie of
//!   the top 32 bits, which a random key meets about once in 2^32 / n;
//! - `owners`: the node index of each point, 2 bytes each while there are at
//!   most 65,536 nodes, else 4;
//! - `index`: `2^k + 1` offsets, where bucket `b` holds the points whose top
//!   `k` bits equal `b`. `k` is chosen so that a bucket holds 2 to 4 points
//!   on average, which keeps the index at 2 bytes per point or less: 12 bytes
//!   per point in all.
//!
//! A lookup reads `index[h >> shift]`, then counts the points of a fixed
//! window from there whose top half is below the key's: no branch depends on
//! the key, so a stream of keys never seen before costs what a hot set does
//! (see [`Points::locate`]). Points are ordered by hash, and equal hashes by
//! the owner's id (byte order), so the order never depends on the order in
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

/// Points a lookup compares at once (32 bytes of `hi`), from the first
/// point of the key's bucket: buckets hold 2 to 4 points on average, and
/// fewer than 1 in 50 more than 8.
const WINDOW: usize = 8;

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
    /// Top 32 bits of each position scaled to 64 bits (`hash << (64 -
    /// bits)`), then [`WINDOW`] copies of `u32::MAX`, so that a lookup can
    /// always read a whole window.
    hi: Vec<u32>,
    /// Bottom 32 bits of each scaled position.
    lo: Vec<u32>,
    owners: Owners,
    index: Vec<u32>,
    /// `64 - k`: a scaled position's bucket is `position >> shift`.
    shift: u32,
    /// Width of the hasher's space.
    bits: u32,
    /// The last point's hash (0 when there is none).
    last: u64,
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
        Points::split(&hashes, owners, index, k, bits)
    }

    /// The point set over sorted `hashes` and their `owners`, with an index
    /// of `2^k` buckets: positions split into their halves, and the
    /// lookup's padding.
    fn split(hashes: &[u64], owners: Owners, index: Vec<u32>, k: u32, bits: u32) -> Points {
        let scale = 64 - bits;
        let mut hi = Vec::with_capacity(hashes.len() + WINDOW);
        hi.extend(hashes.iter().map(|&h| ((h << scale) >> 32) as u32));
        hi.extend([u32::MAX; WINDOW]);
        let lo = hashes.iter().map(|&h| (h << scale) as u32).collect();
        let last = hashes.last().copied().unwrap_or(0);
        Points { hi, lo, owners, index, shift: 64 - k, bits, last }
    }

    /// The hash of the point at `pos` (in the hasher's space).
    #[inline]
    pub(crate) fn hash(&self, pos: usize) -> u64 {
        ((u64::from(self.hi[pos]) << 32) | u64::from(self.lo[pos])) >> (64 - self.bits)
    }

    /// Every point's hash, in ring order.
    pub(crate) fn hashes(&self) -> Vec<u64> {
        let scale = 64 - self.bits;
        self.hi.iter().zip(&self.lo).map(|(&hi, &lo)| ((u64::from(hi) << 32) | u64::from(lo)) >> scale).collect()
    }

    /// A new point set: these points plus `added` (sorted by [`cmp_points`]),
    /// block-copied around one binary search per added point.
    pub(crate) fn merged(&self, node_count: usize, added: &[RawPoint], rank: &[u32]) -> Points {
        let old = self.hashes();
        let (hashes, owners) = match &self.owners {
            // The new node needs more than 16 bits: widen once, then merge.
            Owners::Narrow(o) if node_count > NARROW_LIMIT => {
                let wide: Vec<u32> = o.iter().map(|&x| u32::from(x)).collect();
                let (h, o) = merge_into(&old, &wide, added, rank);
                (h, Owners::Wide(o))
            }
            Owners::Narrow(o) => {
                let (h, o) = merge_into(&old, o, added, rank);
                (h, Owners::Narrow(o))
            }
            Owners::Wide(o) => {
                let (h, o) = merge_into(&old, o, added, rank);
                (h, Owners::Wide(o))
            }
        };
        self.reindexed(hashes, owners, added, 1)
    }

    /// A new point set without `removed` (sorted by [`cmp_points`]), owners
    /// renumbered by `renumber` (which must keep the tie order).
    pub(crate) fn without(&self, removed: &[RawPoint], rank: &[u32], renumber: impl Fn(usize) -> usize) -> Points {
        let old = self.hashes();
        let (hashes, owners) = match &self.owners {
            Owners::Narrow(o) => {
                let (h, o) = remove_from(&old, o, removed, rank, |x| u16::from_index(renumber(x.index())));
                (h, Owners::Narrow(o))
            }
            Owners::Wide(o) => {
                let (h, o) = remove_from(&old, o, removed, rank, |x| u32::from_index(renumber(x.index())));
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
        let expected = if sign > 0 { self.len() + changed.len() } else { self.len() - changed.len() };
        if k != 64 - self.shift || hashes.len() != expected {
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
        Points::split(&hashes, owners, index, k, self.bits)
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
        Points::split(&hashes, owners, index, k, bits)
    }

    /// Position of the first point `>= h`, wrapping to 0; `None` when empty.
    ///
    /// Branch-free in the common case, so that its cost does not depend on
    /// the branch predictor having seen similar keys: the key's bucket gives
    /// the first point to look at, and of the [`WINDOW`] points from there,
    /// those whose top half is below the key's are counted. Points after the
    /// bucket are in later buckets, hence above the key, and the padding is
    /// `u32::MAX`, so the count is the answer unless the whole window is
    /// below (a bucket fuller than the window: under 2% of buckets) or a
    /// point's top half equals the key's (about one lookup in 2^32 / n):
    /// then the full positions are compared one by one from there.
    #[inline]
    pub(crate) fn locate(&self, h: u64) -> Option<usize> {
        if h > self.last || self.lo.is_empty() {
            return (!self.lo.is_empty()).then_some(0);
        }
        // h <= last < 2^bits: the scaled key keeps every bit, its bucket
        // exists, and some point at or after index[bucket] is >= h.
        let scaled = h << (64 - self.bits);
        let start = self.index[(scaled >> self.shift) as usize] as usize;
        let top = (scaled >> 32) as u32;
        let window: &[u32; WINDOW] = self.hi[start..start + WINDOW].try_into().ok()?;
        // A branch-free binary search of the window (three steps, each a
        // conditional move): `at` ends on the first point not below `top`,
        // or on the window's last point when all are below.
        let mut at = 0;
        for step in [4, 2, 1] {
            at = if window[at + step - 1] < top { at + step } else { at };
        }
        let mut pos = start + at;
        // Past the window, or a point with the key's top half: compare the
        // full positions (rare: under 2% and about n / 2^32 of lookups).
        if window[at] > top {
            return Some(pos);
        }
        while self.hash(pos) < h {
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

    pub(crate) fn len(&self) -> usize {
        self.lo.len()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        (self.hi.capacity() + self.lo.capacity()) * 4 + self.owners.heap_bytes() + self.index.capacity() * 4
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

    /// Every path of the lookup against a linear search: crowded buckets
    /// (longer than the window), positions sharing their top 32 bits,
    /// equal positions, wrapping, in 64-, 32- and 4-bit spaces; probed at,
    /// just below and just above every point.
    #[test]
    fn locate_agrees_with_a_linear_search_on_every_path() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for bits in [64u32, 32, 4] {
            let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
            for case in 0..40 {
                let owners_count = 1 + case % 7;
                let per_owner = 1 + (case * 13) % 60;
                let mut by_owner: Vec<Vec<u64>> = Vec::new();
                for o in 0..owners_count {
                    let mut mine = Vec::new();
                    for i in 0..per_owner {
                        let r = next();
                        let h = match (case + i + o) % 5 {
                            // Crowded: all near one place.
                            0 => (mask / 3).wrapping_add(r % 64) & mask,
                            // Same top half as a neighbour, another bottom half.
                            1 => ((mask / 2) & !0xffff_ffff) | (r & 0xffff_ffff & mask),
                            // Exactly equal to another owner's point.
                            2 => (mask / 5) & mask,
                            _ => r & mask,
                        };
                        mine.push(h);
                    }
                    by_owner.push(mine);
                }
                let counts: Vec<usize> = by_owner.iter().map(Vec::len).collect();
                let raw: Vec<u64> = by_owner.concat();
                let rank: Vec<u32> = (0..owners_count as u32).rev().collect();
                let pts = Points::build(bits, &raw, &counts, &rank);
                let mut sorted: Vec<RawPoint> = Vec::new();
                for (o, mine) in by_owner.iter().enumerate() {
                    sorted.extend(mine.iter().map(|&h| (h, o as u32)));
                }
                sorted.sort_by(|a, b| cmp_points(a, b, &rank));
                assert_eq!(pts.hashes(), sorted.iter().map(|p| p.0).collect::<Vec<_>>());
                let mut probes = vec![0, mask, mask / 2];
                for p in &sorted {
                    probes.extend([p.0, p.0.saturating_sub(1), (p.0 + 1).min(mask)]);
                }
                probes.extend((0..200).map(|_| next() & mask));
                for h in probes {
                    let want = naive(&sorted, h);
                    let pos = pts.locate(h).unwrap();
                    assert_eq!(pts.owner(pos) as u32, want, "bits {bits} case {case} h {h:#x}");
                    let first = sorted.iter().position(|p| p.0 >= h).unwrap_or(0);
                    assert_eq!(pos, first, "bits {bits} case {case} h {h:#x}");
                }
            }
        }
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
        assert_eq!(merged.hashes(), pts.hashes());
        assert_eq!(
            (0..6).map(|i| merged.owner(i)).collect::<Vec<_>>(),
            (0..6).map(|i| pts.owner(i)).collect::<Vec<_>>()
        );
        let back = merged.without(&third, &rank, |o| o);
        assert_eq!(back.hashes(), two.hashes());
        assert_eq!(back.index, two.index);
    }
}
