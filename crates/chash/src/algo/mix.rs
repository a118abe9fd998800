//! The fixed mixing functions the algorithms hash with: part of their
//! placement contract (the same node ids and key hashes give the same
//! placement in every version, on every platform).

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
pub fn reduce(x: u64, n: u64) -> u64 {
    ((u128::from(x) * u128::from(n)) >> 64) as u64
}

/// xxh3 of a node id with a fixed seed (each algorithm has its own seeds).
#[inline]
pub(crate) fn id_hash(id: &str, seed: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(id.as_bytes(), seed)
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
