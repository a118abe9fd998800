//! Maglev hashing (Eisenbud et al., NSDI 2016): `distribution: maglev`.

use super::mix::id_hash;
use crate::node::{check_unique, index_of};
use crate::placement::Placement;
use crate::points::Seen;
use crate::ring::MAX_POINTS;
use crate::{Error, KeyHasher, Node, Result};

/// Table size unless set: 65537, a prime (the paper's example size).
pub const DEFAULT_MAGLEV_TABLE_SIZE: u64 = 65_537;

/// Table entries per unit of weight that the table size must exceed, so
/// that every node's share is within about 1% of its fair share.
const ENTRIES_PER_WEIGHT: u64 = 100;

/// Seeds of the two xxh3 hashes of node ids (placement contract).
const OFFSET_SEED: u64 = 0x6d61_676c_6576_6f66; // "maglevof"
const SKIP_SEED: u64 = 0x6d61_676c_6576_736b; // "maglevsk"

/// Whether `n` is prime (trial division: table sizes are below 2^28).
fn is_prime(n: u64) -> bool {
    if n < 4 {
        return n >= 2;
    }
    if n.is_multiple_of(2) {
        return false;
    }
    let mut d = 3u64;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// The smallest prime `>= n`.
///
/// ```
/// assert_eq!(chash::algo::next_prime(65_536), 65_537);
/// assert_eq!(chash::algo::next_prime(100_001), 100_003);
/// ```
pub fn next_prime(n: u64) -> u64 {
    let mut p = n.max(2);
    while !is_prime(p) {
        p += 1;
    }
    p
}

/// The lookup table: owner per entry, as narrow as the node count allows.
#[derive(Clone, Debug)]
enum Table {
    Narrow(Vec<u16>),
    Wide(Vec<u32>),
}

/// Maglev: a lookup table of prime size `M` filled by letting the nodes take
/// turns, each claiming the next free entry of its own permutation of the
/// table.
///
/// - Node `i` with id hashes `o = xxh3(id, seed "maglevof")` and
///   `s = xxh3(id, seed "maglevsk")` has offset `o mod M` and skip
///   `s mod (M − 1) + 1`; its permutation is `offset + j × skip (mod M)` for
///   `j = 0, 1, …` (every entry once, since `M` is prime).
/// - The fill runs in rounds over the nodes in list order; in each round
///   node `i` claims `weight_i` entries, each the first entry of its
///   permutation not yet claimed. It stops when the table is full. So a
///   node's share of the table is its share of the total weight, within a
///   round's worth of entries.
/// - A key with hash `h` (in a `b`-bit space) reads entry
///   `⌊h × M / 2^b⌋` (a multiply and a shift; no division).
///
/// The table size must be prime and exceed 100 entries per unit of total
/// weight (for equal weights, 100 × the number of nodes), or building is an
/// error that names a prime that would do. Lookup is one multiplication and
/// one table read. Building costs O(M ln M) and only the table plus three
/// words per node (no permutation is materialised): at N = 1000 and
/// M = 100,003 about 1 ms and under 1 MiB.
///
/// A change rebuilds the table (a few milliseconds at most); it moves the
/// changed node's keys plus a few more (Maglev trades a little movement for
/// its balance and speed): at most 1.6× the optimum with a fixed table size.
///
/// ```
/// use chash::algo::Maglev;
/// use chash::{Node, Placement};
/// let m = Maglev::new(vec![Node::new("a", 1)?, Node::new("b", 2)?])?;
/// assert_eq!(m.table_size(), 65_537);
/// assert!(m.locate(b"user:42").is_some());
/// // 20 nodes need a prime above 2,000; the error names one.
/// let twenty = (0..20).map(|i| Node::new(format!("n{i}"), 1)).collect::<Result<Vec<_>, _>>()?;
/// let bad = Maglev::builder().table_size(1_009).build(twenty);
/// assert!(bad.unwrap_err().to_string().contains("2003"));
/// # Ok::<(), chash::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Maglev<T = ()> {
    nodes: Vec<Node<T>>,
    hasher: KeyHasher,
    size: u64,
    /// `64 - hasher bits`: shifts a key hash to the top of a `u64`.
    shift: u32,
    table: Table,
}

/// Settings for a [`Maglev`]; a consuming builder.
#[derive(Clone, Debug)]
#[must_use]
pub struct MaglevBuilder {
    hasher: KeyHasher,
    size: u64,
}

impl MaglevBuilder {
    /// The key hash. Defaults to [`KeyHasher::Xxh3`].
    pub fn hasher(mut self, hasher: KeyHasher) -> Self {
        self.hasher = hasher;
        self
    }

    /// The table size: a prime above 100 × the total weight. Defaults to
    /// [`DEFAULT_MAGLEV_TABLE_SIZE`] (65,537).
    pub fn table_size(mut self, size: u64) -> Self {
        self.size = size;
        self
    }

    /// Builds the table.
    ///
    /// # Errors
    /// [`Error::DuplicateNode`]; [`Error::BadParameter`] when the table size
    /// is not prime, is above 2^28, or is not above 100 × the total weight
    /// (the message names a prime that would do).
    pub fn build<T>(self, nodes: Vec<Node<T>>) -> Result<Maglev<T>> {
        check_unique(&nodes)?;
        check_table_size(self.size, &nodes)?;
        let table = fill(&nodes, self.size);
        Ok(Maglev { nodes, hasher: self.hasher, size: self.size, shift: 64 - self.hasher.bits(), table })
    }
}

fn check_table_size<T>(size: u64, nodes: &[Node<T>]) -> Result<()> {
    let bad = |reason: String| Error::BadParameter { name: "maglev_table_size", reason };
    if size > MAX_POINTS {
        return Err(bad(format!("{size} is above the largest table chash builds ({MAX_POINTS})")));
    }
    let weight: u64 = nodes.iter().map(|n| u64::from(n.weight())).sum();
    let needed = weight.saturating_mul(ENTRIES_PER_WEIGHT);
    if size <= needed {
        let hint = next_prime(needed + 1);
        let what = if nodes.iter().all(|n| n.weight() == 1) {
            format!("{} node{}", nodes.len(), if nodes.len() == 1 { "" } else { "s" })
        } else {
            format!("a total weight of {weight}")
        };
        return Err(bad(if hint <= MAX_POINTS {
            format!("{size} is too small for {what}: it must exceed {needed} (100 entries per unit of weight); {hint} is the smallest prime that does")
        } else {
            format!("{size} is too small for {what}, and no table chash builds is large enough")
        }));
    }
    if !is_prime(size) {
        return Err(bad(format!("{size} is not prime; {} is the next prime", next_prime(size))));
    }
    Ok(())
}

/// The paper's population loop, weighted and without the permutation
/// table: each node keeps only its current permutation entry and skip.
fn fill<T>(nodes: &[Node<T>], size: u64) -> Table {
    const EMPTY: u32 = u32::MAX;
    let m = size as u32;
    let mut table = vec![EMPTY; size as usize];
    if !nodes.is_empty() {
        // Current permutation entry and skip of each node.
        let mut cur: Vec<u32> = nodes.iter().map(|n| (id_hash(n.id(), OFFSET_SEED) % size) as u32).collect();
        let skip: Vec<u32> = nodes.iter().map(|n| (id_hash(n.id(), SKIP_SEED) % (size - 1)) as u32 + 1).collect();
        let mut filled = 0u32;
        'rounds: loop {
            for (i, node) in nodes.iter().enumerate() {
                for _ in 0..node.weight() {
                    // The table has a free entry, and node i's permutation
                    // visits every entry: this loop ends.
                    let mut c = cur[i];
                    while table[c as usize] != EMPTY {
                        c += skip[i];
                        if c >= m {
                            c -= m;
                        }
                    }
                    table[c as usize] = i as u32;
                    c += skip[i];
                    if c >= m {
                        c -= m;
                    }
                    cur[i] = c;
                    filled += 1;
                    if filled == m {
                        break 'rounds;
                    }
                }
            }
        }
    }
    if nodes.len() <= 1 << 16 {
        Table::Narrow(table.into_iter().map(|o| o as u16).collect())
    } else {
        Table::Wide(table)
    }
}

impl Maglev<()> {
    /// A builder with the defaults (xxh3, table size 65,537).
    pub fn builder() -> MaglevBuilder {
        MaglevBuilder { hasher: KeyHasher::Xxh3, size: DEFAULT_MAGLEV_TABLE_SIZE }
    }

    /// Maglev over `nodes` with the defaults.
    ///
    /// # Errors
    /// As [`MaglevBuilder::build`].
    pub fn new(nodes: Vec<Node>) -> Result<Maglev> {
        Maglev::builder().build(nodes)
    }
}

impl<T> Maglev<T> {
    /// The table size `M`.
    pub fn table_size(&self) -> u64 {
        self.size
    }

    /// Heap bytes of the lookup table.
    pub fn table_bytes(&self) -> usize {
        match &self.table {
            Table::Narrow(t) => t.capacity() * 2,
            Table::Wide(t) => t.capacity() * 4,
        }
    }

    /// The table entry a hash value reads.
    #[inline]
    fn entry(&self, hash: u64) -> usize {
        ((u128::from(hash << self.shift) * u128::from(self.size)) >> 64) as usize
    }

    /// Owner of table entry `e` (`e < table_size()`).
    #[inline]
    fn owner(&self, e: usize) -> usize {
        match &self.table {
            Table::Narrow(t) => usize::from(t[e]),
            Table::Wide(t) => t[e] as usize,
        }
    }

    /// The owner of every table entry, in table order (for tests and analysis).
    pub fn entries(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        (0..if self.nodes.is_empty() { 0 } else { self.size as usize }).map(|e| self.owner(e))
    }

    fn rebuilt(&self, nodes: Vec<Node<T>>) -> Result<Maglev<T>> {
        MaglevBuilder { hasher: self.hasher, size: self.size }.build(nodes)
    }
}

impl<T: Clone> Maglev<T> {
    /// A new table with `node` added (same table size).
    ///
    /// # Errors
    /// [`Error::DuplicateNode`]; [`Error::BadParameter`] when the table is
    /// now too small.
    pub fn with_node(&self, node: Node<T>) -> Result<Maglev<T>> {
        let mut nodes = self.nodes.clone();
        nodes.push(node);
        self.rebuilt(nodes)
    }

    /// A new table without node `id`. Nodes after it move down one index.
    ///
    /// # Errors
    /// [`Error::UnknownNode`].
    pub fn without_node(&self, id: &str) -> Result<Maglev<T>> {
        let at = index_of(&self.nodes, id)?;
        let mut nodes = self.nodes.clone();
        nodes.remove(at);
        self.rebuilt(nodes)
    }

    /// A new table where node `id` has `weight`.
    ///
    /// # Errors
    /// [`Error::UnknownNode`], [`Error::ZeroWeight`], [`Error::BadParameter`].
    pub fn with_weight(&self, id: &str, weight: u32) -> Result<Maglev<T>> {
        let at = index_of(&self.nodes, id)?;
        let mut nodes = self.nodes.clone();
        nodes[at] = nodes[at].reweighted(weight)?;
        self.rebuilt(nodes)
    }
}

impl<T: Send + Sync> Placement for Maglev<T> {
    type Payload = T;
    type Candidates<'a>
        = MaglevCandidates<'a>
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
        Some(self.owner(self.entry(hash)))
    }

    fn candidates_hash(&self, hash: u64) -> MaglevCandidates<'_> {
        let steps = if self.nodes.is_empty() { 0 } else { self.size as usize };
        let pos = if steps == 0 { 0 } else { self.entry(hash) };
        MaglevCandidates {
            table: &self.table,
            size: self.size as usize,
            pos,
            steps_left: steps,
            nodes_left: self.nodes.len(),
            seen: Seen::new(self.nodes.len()),
        }
    }
}

/// Distinct owners of the key's table entry and the entries after it,
/// wrapping: the owner first, then the nodes met walking the table.
///
/// At most one walk of the table; no step allocates (a table of more than
/// 1,024 nodes allocates one bit set when the iterator is made).
#[derive(Clone, Debug)]
pub struct MaglevCandidates<'a> {
    table: &'a Table,
    size: usize,
    pos: usize,
    steps_left: usize,
    nodes_left: usize,
    seen: Seen,
}

impl Iterator for MaglevCandidates<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.nodes_left > 0 && self.steps_left > 0 {
            let owner = match self.table {
                Table::Narrow(t) => usize::from(t[self.pos]),
                Table::Wide(t) => t[self.pos] as usize,
            };
            self.pos += 1;
            if self.pos == self.size {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<Node> {
        (0..n).map(|i| Node::new(format!("n{i}"), 1).unwrap()).collect()
    }

    #[test]
    fn table_size_rules() {
        let err = |size: u64, n: usize| Maglev::builder().table_size(size).build(nodes(n)).unwrap_err().to_string();
        assert!(err(65_536, 3).contains("not prime; 65537"), "{}", err(65_536, 3));
        let e = err(65_537, 1000);
        assert!(e.contains("1000 nodes") && e.contains("100003"), "{e}");
        assert!(err(1 << 30, 3).contains("largest"));
        assert!(Maglev::builder().table_size(0).build(nodes(0)).is_err());
        assert!(Maglev::builder().table_size(2).build(nodes(0)).is_ok());
        let weighted = vec![Node::new("a", 700).unwrap()];
        assert!(Maglev::builder().build(weighted).unwrap_err().to_string().contains("total weight of 700"));
    }

    #[test]
    fn every_entry_is_owned_in_proportion() {
        let m = Maglev::builder().table_size(1009).build(vec![Node::new("a", 1).unwrap(), Node::new("b", 3).unwrap()]);
        let m = m.unwrap();
        let a = m.entries().filter(|&o| o == 0).count();
        assert_eq!(m.entries().len(), 1009);
        assert!((250..=254).contains(&a), "{a}");
        assert_eq!(Maglev::new(vec![]).unwrap().locate_hash(5), None);
    }

    #[test]
    fn narrow_hashes_use_the_whole_table() {
        let m = Maglev::builder().hasher(KeyHasher::Crc32a).table_size(1009).build(nodes(3)).unwrap();
        assert_eq!(m.entry(0), 0);
        assert_eq!(m.entry(u64::from(u32::MAX)), 1008);
    }
}
