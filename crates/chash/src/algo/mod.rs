//! Placement algorithms other than rings of points, each behind the one
//! [`Placement`](crate::Placement) trait, one file each:
//!
//! | type | `distribution:` | balance | a change moves | lookup | weights |
//! |---|---|---|---|---|---|
//! | [`Jump`] | `jump` | at the sampling floor | the optimum; only the last node can leave | O(ln n) | no |
//! | [`Rendezvous`] | `rendezvous` | at the floor | the optimum | O(n) | yes |
//! | [`Maglev`] | `maglev` | at the floor | ≤ 1.6× the optimum | O(1), one table read | yes |
//! | [`Anchor`] | `anchor`, `memento` | at the floor | the optimum, any node can leave | O(1) expected | no |
//! | [`MultiProbe`] | `multiprobe` | peak/mean ≈ 1.05 at 21 probes | the optimum | O(probes) | no |
//! | [`Bounded`] | `bounded` | no node above ⌈c × mean⌉ (with load tracking) | as the ring while under cap | as the ring | yes |
//!
//! Every algorithm is deterministic across processes and platforms: the only
//! hashes are the pool's key hash, xxh3 of node ids with fixed seeds, and the
//! fixed mixing functions below. Lookups take `&self`, never allocate and
//! never panic.

mod anchor;
mod bounded;
mod jump;
mod maglev;
mod multiprobe;
mod rendezvous;

pub use anchor::{Anchor, AnchorCandidates, DEFAULT_ANCHOR_CAPACITY};
pub use bounded::{Bounded, LoadGuard, DEFAULT_BALANCE_FACTOR};
pub use jump::{jump_hash, Jump, JumpCandidates};
pub use maglev::{next_prime, Maglev, MaglevBuilder, MaglevCandidates, DEFAULT_MAGLEV_TABLE_SIZE};
pub use multiprobe::{MultiProbe, MultiProbeCandidates, DEFAULT_PROBES};
pub use rendezvous::{Rendezvous, RendezvousCandidates};

use crate::{Error, Node, Result};

/// MurmurHash3's 64-bit finalizer: a bijection of `u64` with full avalanche.
#[inline]
pub fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// Mixes two words into one: the 128-bit product of both (each xor-ed with
/// a fixed constant, the first hex digits of π), its halves folded, then
/// [`fmix64`]. Unlike a hash of `a ^ b`, it is not symmetric in a way that
/// pairs keys with nodes. This is the "fixed-seed 64-bit mix" rendezvous,
/// multi-probe and anchor use; it is part of their placement contract.
#[inline]
pub fn mix2(a: u64, b: u64) -> u64 {
    let p = u128::from(a ^ 0x243f_6a88_85a3_08d3) * u128::from(b ^ 0x1319_8a2e_0370_7344);
    fmix64(p as u64 ^ (p >> 64) as u64)
}

/// `x` scaled from `0..2^64` to `0..n` (Lemire's multiply-shift reduction):
/// uniform for uniform `x`, no division.
#[inline]
pub(crate) fn reduce(x: u64, n: u64) -> u64 {
    ((u128::from(x) * u128::from(n)) >> 64) as u64
}

/// xxh3 of a node id with a fixed seed (each algorithm has its own seeds).
#[inline]
pub(crate) fn id_hash(id: &str, seed: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(id.as_bytes(), seed)
}

/// Index of the node `id`.
pub(crate) fn index_of<T>(nodes: &[Node<T>], id: &str) -> Result<usize> {
    nodes.iter().position(|n| n.id() == id).ok_or_else(|| Error::UnknownNode(id.to_owned()))
}

/// Err unless every node has weight 1.
pub(crate) fn check_unweighted<T>(nodes: &[Node<T>], distribution: &'static str) -> Result<()> {
    match nodes.iter().find(|n| n.weight() != 1) {
        Some(n) => Err(Error::WeightsUnsupported { distribution, node: n.id().to_owned(), weight: n.weight() }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_covers_the_range() {
        assert_eq!(reduce(0, 10), 0);
        assert_eq!(reduce(u64::MAX, 10), 9);
        assert_eq!(reduce(u64::MAX, 1), 0);
        assert_eq!(reduce(1 << 63, 10), 5);
    }

    #[test]
    fn mixers_are_pinned() {
        // Placement contract: these values never change.
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
        assert_ne!(mix2(1, 2), mix2(2, 1));
    }
}
