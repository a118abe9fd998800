//! Key hash functions: bytes to a position on the hash space.
//!
//! Each [`KeyHasher`] maps a key to a `u64` below `2^bits()`. Names that
//! twemproxy also has (`md5`, `crc32`, `crc32a`, `fnv1_64`, `fnv1a_64`,
//! `fnv1_32`, `fnv1a_32`) produce twemproxy's exact value, quirks included:
//! twemproxy's `fnv1a_64` runs in 32 bits, its `crc32` keeps only 15 bits, and
//! its FNV functions read key bytes as signed `char`, so bytes ≥ 0x80 are
//! sign-extended before they are mixed in.

use std::fmt;
use std::str::FromStr;

use md5::{Digest, Md5};

use crate::{Error, Result};

/// A hash function from key bytes to a position in `0..2^bits()`.
///
/// The default is [`KeyHasher::Xxh3`], the fastest and the only one with a
/// 64-bit space; the others exist to agree with systems that already route keys.
///
/// ```
/// use chash::KeyHasher;
/// let h: KeyHasher = "md5".parse().unwrap();
/// assert_eq!(h.hash(b"foo"), 0xdb18_bdac); // md5("foo") starts ac bd 18 db
/// assert_eq!(h.bits(), 32);
/// assert_eq!(KeyHasher::default(), KeyHasher::Xxh3);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyHasher {
    /// XXH3-64 with seed 0 (chash's default).
    #[default]
    Xxh3,
    /// twemproxy's `md5`: the first four digest bytes as a little-endian `u32`.
    Md5,
    /// twemproxy's `crc32` (libmemcached's): bits 16..31 of CRC-32, masked to 15 bits.
    Crc32,
    /// twemproxy's `crc32a`: the full CRC-32 (IEEE).
    Crc32a,
    /// twemproxy's `fnv1_64`: 64-bit FNV-1 over sign-extended bytes, truncated to 32 bits.
    Fnv1_64,
    /// twemproxy's `fnv1a_64`: FNV-1a with the 64-bit offset basis and prime,
    /// both truncated to 32 bits, over sign-extended bytes.
    Fnv1a64,
    /// twemproxy's `fnv1_32` over sign-extended bytes.
    Fnv1_32,
    /// twemproxy's `fnv1a_32` over sign-extended bytes.
    Fnv1a32,
}

const FNV_64_INIT: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_64_PRIME: u64 = 0x0000_0100_0000_01b3;
const FNV_32_INIT: u32 = 0x811c_9dc5;
const FNV_32_PRIME: u32 = 0x0100_0193;

/// A key byte as C's signed `char` converted to an unsigned integer.
#[inline]
fn sign_extended(b: u8) -> u64 {
    b as i8 as i64 as u64
}

impl KeyHasher {
    /// Every hasher, in the order `chash hash --help` lists them.
    pub const ALL: &'static [KeyHasher] = &[
        KeyHasher::Xxh3,
        KeyHasher::Md5,
        KeyHasher::Crc32,
        KeyHasher::Crc32a,
        KeyHasher::Fnv1_64,
        KeyHasher::Fnv1a64,
        KeyHasher::Fnv1_32,
        KeyHasher::Fnv1a32,
    ];

    /// The name used in config files and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            KeyHasher::Xxh3 => "xxh3",
            KeyHasher::Md5 => "md5",
            KeyHasher::Crc32 => "crc32",
            KeyHasher::Crc32a => "crc32a",
            KeyHasher::Fnv1_64 => "fnv1_64",
            KeyHasher::Fnv1a64 => "fnv1a_64",
            KeyHasher::Fnv1_32 => "fnv1_32",
            KeyHasher::Fnv1a32 => "fnv1a_32",
        }
    }

    /// All names, comma-separated (for error messages and help).
    pub fn names() -> String {
        Self::ALL.iter().map(|h| h.name()).collect::<Vec<_>>().join(", ")
    }

    /// Width of the output: every value is below `2^bits()`.
    pub const fn bits(self) -> u32 {
        match self {
            KeyHasher::Xxh3 => 64,
            KeyHasher::Crc32 => 15,
            _ => 32,
        }
    }

    /// Hashes `key`.
    #[inline]
    pub fn hash(self, key: &[u8]) -> u64 {
        match self {
            KeyHasher::Xxh3 => xxhash_rust::xxh3::xxh3_64(key),
            KeyHasher::Md5 => {
                let d = Md5::digest(key);
                u64::from(u32::from_le_bytes([d[0], d[1], d[2], d[3]]))
            }
            KeyHasher::Crc32 => u64::from((crc32fast::hash(key) >> 16) & 0x7fff),
            KeyHasher::Crc32a => u64::from(crc32fast::hash(key)),
            KeyHasher::Fnv1_64 => {
                let mut h = FNV_64_INIT;
                for &b in key {
                    h = h.wrapping_mul(FNV_64_PRIME);
                    h ^= sign_extended(b);
                }
                h & 0xffff_ffff
            }
            KeyHasher::Fnv1a64 => {
                // twemproxy declares the accumulator uint32_t: only the low
                // halves of the 64-bit constants take part.
                let mut h = FNV_64_INIT as u32;
                for &b in key {
                    h ^= sign_extended(b) as u32;
                    h = h.wrapping_mul(FNV_64_PRIME as u32);
                }
                u64::from(h)
            }
            KeyHasher::Fnv1_32 => {
                let mut h = FNV_32_INIT;
                for &b in key {
                    h = h.wrapping_mul(FNV_32_PRIME);
                    h ^= sign_extended(b) as u32;
                }
                u64::from(h)
            }
            KeyHasher::Fnv1a32 => {
                let mut h = FNV_32_INIT;
                for &b in key {
                    h ^= sign_extended(b) as u32;
                    h = h.wrapping_mul(FNV_32_PRIME);
                }
                u64::from(h)
            }
        }
    }
}

impl fmt::Display for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KeyHasher {
    type Err = Error;

    /// Parses a hasher name; matching is exact (config files are case-sensitive
    /// in twemproxy too).
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL.iter().copied().find(|h| h.name() == s).ok_or_else(|| Error::UnknownHash(s.to_owned()))
    }
}

/// The part of `key` that is hashed under twemproxy's `hash_tag` rule.
///
/// With a two-character tag such as `b"{}"`, the bytes after the first `{`
/// and before the next `}` are hashed. If there is no opening tag, no closing
/// tag after it, or nothing between them, the whole key is hashed.
///
/// ```
/// use chash::hash::tagged;
/// assert_eq!(tagged(b"user:{42}:name", Some(*b"{}")), b"42");
/// assert_eq!(tagged(b"user:{}:name", Some(*b"{}")), b"user:{}:name");
/// assert_eq!(tagged(b"plain", None), b"plain");
/// ```
pub fn tagged(key: &[u8], tag: Option<[u8; 2]>) -> &[u8] {
    let Some([open, close]) = tag else {
        return key;
    };
    let Some(start) = key.iter().position(|&b| b == open) else {
        return key;
    };
    let rest = &key[start + 1..];
    match rest.iter().position(|&b| b == close) {
        Some(end) if end > 0 => &rest[..end],
        _ => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for &h in KeyHasher::ALL {
            assert_eq!(h.name().parse::<KeyHasher>().unwrap(), h);
        }
        assert!(matches!("MD5".parse::<KeyHasher>(), Err(Error::UnknownHash(_))));
    }

    #[test]
    fn outputs_fit_their_width() {
        let keys: [&[u8]; 5] = [b"", b"a", b"foobar", b"\xff\x80\x7f", &[0xe5; 300]];
        for &h in KeyHasher::ALL {
            for k in keys {
                let v = h.hash(k);
                assert!(h.bits() == 64 || v < 1u64 << h.bits(), "{h} {k:?} {v}");
            }
        }
    }

    #[test]
    fn reference_values() {
        // FNV test vectors (ASCII input, where sign extension cannot matter).
        assert_eq!(KeyHasher::Fnv1a32.hash(b"foobar"), 0xbf9c_f968);
        assert_eq!(KeyHasher::Fnv1_32.hash(b"foobar"), 0x31f0_b262);
        assert_eq!(KeyHasher::Fnv1a32.hash(b""), 0x811c_9dc5);
        // Low 32 bits of 64-bit FNV-1("foobar") = 0x340d8765a4dda9c2.
        assert_eq!(KeyHasher::Fnv1_64.hash(b"foobar"), 0xa4dd_a9c2);
        // CRC-32 of "123456789" is 0xcbf43926.
        assert_eq!(KeyHasher::Crc32a.hash(b"123456789"), 0xcbf4_3926);
        assert_eq!(KeyHasher::Crc32.hash(b"123456789"), 0xcbf4 & 0x7fff);
        // md5("") = d41d8cd98f00b204...
        assert_eq!(KeyHasher::Md5.hash(b""), 0xd98c_1dd4);
        assert_eq!(KeyHasher::Xxh3.hash(b""), 0x2d06_8005_38d3_94c2);
    }

    #[test]
    fn fnv_sign_extends_high_bytes() {
        // With 0xff read as a signed char, the XOR flips the high 24 bits too.
        let mut h = FNV_32_INIT;
        h ^= 0xffff_ffff;
        h = h.wrapping_mul(FNV_32_PRIME);
        assert_eq!(KeyHasher::Fnv1a32.hash(&[0xff]), u64::from(h));
        let mut unsigned = FNV_32_INIT;
        unsigned ^= 0xff;
        unsigned = unsigned.wrapping_mul(FNV_32_PRIME);
        assert_ne!(KeyHasher::Fnv1a32.hash(&[0xff]), u64::from(unsigned));
    }

    #[test]
    fn hash_tag_rules() {
        let t = Some(*b"{}");
        assert_eq!(tagged(b"{a}b", t), b"a");
        assert_eq!(tagged(b"x{a", t), b"x{a");
        assert_eq!(tagged(b"x}a{b}", t), b"b");
        assert_eq!(tagged(b"a{b}{c}", t), b"b");
        assert_eq!(tagged(b"$$abc$$", Some(*b"$$")), b"$$abc$$");
        assert_eq!(tagged(b"$abc$", Some(*b"$$")), b"abc");
    }
}
