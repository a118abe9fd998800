//! twemproxy's `distribution: modula`.

use crate::node::check_unique;
use crate::placement::Placement;
use crate::points::Seen;
use crate::ring::MAX_POINTS;
use crate::{Error, KeyHasher, Node, Result};

/// twemproxy's modula: one slot per unit of weight, servers in list order,
/// and a key goes to slot `hash % slots`. Any change of membership moves
/// most keys; it is here for compatibility.
///
/// ```
/// use chash::compat::Modula;
/// use chash::{KeyHasher, Node, Placement};
/// let m = Modula::new(vec![Node::new("a", 1)?, Node::new("b", 2)?], KeyHasher::Crc32a)?;
/// assert_eq!(m.locate_hash(0), Some(0)); // slots: a, b, b
/// assert_eq!(m.locate_hash(4), Some(1));
/// # Ok::<(), chash::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Modula {
    nodes: Vec<Node>,
    hasher: KeyHasher,
    slots: Vec<u32>,
}

impl Modula {
    /// Builds the slot table.
    ///
    /// # Errors
    /// Duplicate ids; more than [`MAX_POINTS`] slots.
    pub fn new(nodes: Vec<Node>, hasher: KeyHasher) -> Result<Modula> {
        check_unique(&nodes)?;
        let total: u64 = nodes.iter().map(|n| u64::from(n.weight())).sum();
        if total > MAX_POINTS {
            return Err(Error::TooManyPoints { requested: total, limit: MAX_POINTS });
        }
        let slots =
            nodes.iter().enumerate().flat_map(|(i, n)| std::iter::repeat_n(i as u32, n.weight() as usize)).collect();
        Ok(Modula { nodes, hasher, slots })
    }
}

impl Placement for Modula {
    type Payload = ();
    type Candidates<'a> = ModulaCandidates<'a>;

    fn hasher(&self) -> KeyHasher {
        self.hasher
    }

    fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    #[inline]
    fn locate_hash(&self, hash: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        Some(self.slots[(hash % self.slots.len() as u64) as usize] as usize)
    }

    fn candidates_hash(&self, hash: u64) -> ModulaCandidates<'_> {
        let start = if self.slots.is_empty() { 0 } else { (hash % self.slots.len() as u64) as usize };
        ModulaCandidates {
            slots: &self.slots,
            pos: start,
            steps_left: self.slots.len(),
            seen: Seen::new(self.nodes.len()),
        }
    }
}

/// Distinct nodes from a key's slot onwards, in slot order.
#[derive(Clone, Debug)]
pub struct ModulaCandidates<'a> {
    slots: &'a [u32],
    pos: usize,
    steps_left: usize,
    seen: Seen,
}

impl Iterator for ModulaCandidates<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.steps_left > 0 {
            let owner = self.slots[self.pos] as usize;
            self.pos = (self.pos + 1) % self.slots.len();
            self.steps_left -= 1;
            if self.seen.insert(owner) {
                return Some(owner);
            }
        }
        None
    }
}
