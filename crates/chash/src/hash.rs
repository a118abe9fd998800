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
    /// twemproxy's `one_at_a_time` (Jenkins) over sign-extended bytes.
    OneAtATime,
    /// twemproxy's `crc16`: the CRC-16/XMODEM table step (polynomial 0x1021,
    /// initial 0) on a 32-bit accumulator that is never masked, so values use
    /// all 32 bits; their low 16 bits are CRC-16/XMODEM.
    Crc16,
    /// twemproxy's `hsieh` (Paul Hsieh's SuperFastHash, little-endian reads).
    Hsieh,
    /// twemproxy's `murmur` (MurmurHash2, seed `0xdeadbeef × length`).
    Murmur,
    /// twemproxy's `jenkins` (lookup3 `hashlittle`, initial value 13).
    Jenkins,
    /// Seeds 001/004: Java FNV1_32_HASH over UTF-16 code units, mixing after
    /// the loop, then `Math.abs`; ordered as Java's signed `int`.
    JavaFnv1_32,
    /// Seed 001's first program: the same with the mixing inside the loop.
    JavaFnv1_32InLoop,
    /// Seed 002: `new BigInteger(1, md5(utf8)).intValue() & 0x7fffffff`.
    JavaMd5Int31,
    /// Seed 003: MurmurHash64A over UTF-8 bytes, seed `0x1234ABCD`, as Java's
    /// signed `long` (and ordered as one).
    JavaMurmur64a,
    /// Seed 000: the four little-endian `u32` words of MD5 added as a 64-bit integer.
    Md5Sum,
    /// Seed 004's counter-example: Java's `String.hashCode()` (a signed `int`
    /// over UTF-16 code units), ordered as Java's `int`.
    JavaStringHashCode,
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
        KeyHasher::OneAtATime,
        KeyHasher::Crc16,
        KeyHasher::Hsieh,
        KeyHasher::Murmur,
        KeyHasher::Jenkins,
        KeyHasher::JavaFnv1_32,
        KeyHasher::JavaFnv1_32InLoop,
        KeyHasher::JavaMd5Int31,
        KeyHasher::JavaMurmur64a,
        KeyHasher::Md5Sum,
        KeyHasher::JavaStringHashCode,
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
            KeyHasher::OneAtATime => "one_at_a_time",
            KeyHasher::Crc16 => "crc16",
            KeyHasher::Hsieh => "hsieh",
            KeyHasher::Murmur => "murmur",
            KeyHasher::Jenkins => "jenkins",
            KeyHasher::JavaFnv1_32 => "java-fnv1-32",
            KeyHasher::JavaFnv1_32InLoop => "java-fnv1-32-inloop",
            KeyHasher::JavaMd5Int31 => "java-md5-int31",
            KeyHasher::JavaMurmur64a => "java-murmur64a",
            KeyHasher::Md5Sum => "md5-sum",
            KeyHasher::JavaStringHashCode => "java-string-hashcode",
        }
    }

    /// All names, comma-separated (for error messages and help).
    pub fn names() -> String {
        Self::ALL.iter().map(|h| h.name()).collect::<Vec<_>>().join(", ")
    }

    /// Width of the hash space: every position is below `2^bits()`.
    pub const fn bits(self) -> u32 {
        match self {
            KeyHasher::Xxh3 | KeyHasher::JavaMurmur64a => 64,
            KeyHasher::Crc32 => 15,
            KeyHasher::JavaMd5Int31 => 31,
            KeyHasher::Md5Sum => 34,
            _ => 32,
        }
    }

    /// Whether the original program compares values as signed integers (Java's
    /// `TreeMap<Integer>` / `TreeMap<Long>`). Positions then are the value with
    /// its sign bit flipped, which keeps Java's order on an unsigned ring.
    pub const fn signed(self) -> bool {
        matches!(
            self,
            KeyHasher::JavaFnv1_32
                | KeyHasher::JavaFnv1_32InLoop
                | KeyHasher::JavaMurmur64a
                | KeyHasher::JavaStringHashCode
        )
    }

    /// The value as the original program prints it (Java's negative `int`s and
    /// `long`s included).
    pub fn value(self, key: &[u8]) -> i128 {
        self.value_of_position(self.hash(key))
    }

    /// Turns a ring position back into the value the original program prints.
    pub fn value_of_position(self, pos: u64) -> i128 {
        match self {
            KeyHasher::JavaFnv1_32 | KeyHasher::JavaFnv1_32InLoop | KeyHasher::JavaStringHashCode => {
                i128::from((pos as u32 ^ 0x8000_0000) as i32)
            }
            KeyHasher::JavaMurmur64a => i128::from((pos ^ (1 << 63)) as i64),
            _ => i128::from(pos),
        }
    }

    /// The position on the ring of `key`: its hash value, below `2^bits()`,
    /// in the order the original program sorts values.
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
            KeyHasher::OneAtATime => u64::from(one_at_a_time(key)),
            KeyHasher::Crc16 => u64::from(crc16(key)),
            KeyHasher::Hsieh => u64::from(hsieh(key)),
            KeyHasher::Murmur => u64::from(murmur2(key)),
            KeyHasher::Jenkins => u64::from(jenkins(key)),
            KeyHasher::JavaFnv1_32 => u64::from(java_abs(java_fnv1_32(key, false)) as u32 ^ 0x8000_0000),
            KeyHasher::JavaFnv1_32InLoop => u64::from(java_abs(java_fnv1_32(key, true)) as u32 ^ 0x8000_0000),
            KeyHasher::JavaMd5Int31 => {
                let d = Md5::digest(key);
                // BigInteger(1, digest).intValue(): the low 32 bits of the
                // big-endian number, i.e. the last four bytes.
                u64::from(u32::from_be_bytes([d[12], d[13], d[14], d[15]]) & 0x7fff_ffff)
            }
            KeyHasher::JavaMurmur64a => murmur64a(key, 0x1234_abcd) ^ (1 << 63),
            KeyHasher::JavaStringHashCode => {
                let h = String::from_utf8_lossy(key)
                    .encode_utf16()
                    .fold(0i32, |h, unit| h.wrapping_mul(31).wrapping_add(i32::from(unit)));
                u64::from(h as u32 ^ 0x8000_0000)
            }
            KeyHasher::Md5Sum => {
                let d = Md5::digest(key);
                d.chunks_exact(4).map(|w| u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))).sum()
            }
        }
    }
}

/// Java's `Math.abs(int)`: `Integer.MIN_VALUE` stays negative.
fn java_abs(v: i32) -> i32 {
    v.wrapping_abs()
}

/// FNV1_32_HASH as the seeds' Java code writes it, over the UTF-16 code units
/// of the key decoded as UTF-8 (malformed bytes become U+FFFD, as Java's
/// decoder does), with Java's arithmetic (`>>` is arithmetic on `int`).
fn java_fnv1_32(key: &[u8], in_loop: bool) -> i32 {
    let text = String::from_utf8_lossy(key);
    let mut h = 0x811c_9dc5u32 as i32;
    for unit in text.encode_utf16() {
        h = (h ^ i32::from(unit)).wrapping_mul(16_777_619);
        if in_loop {
            // Seed 001's first program: four steps, inside the loop.
            h = h.wrapping_add(h << 13);
            h ^= h >> 7;
            h ^= h >> 17;
            h = h.wrapping_add(h << 5);
        }
    }
    if !in_loop {
        h = h.wrapping_add(h << 13);
        h ^= h >> 7;
        h = h.wrapping_add(h << 3);
        h ^= h >> 17;
        h = h.wrapping_add(h << 5);
    }
    h
}

/// MurmurHash64A as seed 003's Java code computes it: little-endian 8-byte
/// blocks, the tail zero-padded and mixed in as one block. Returned as the
/// bits of Java's `long`.
fn murmur64a(key: &[u8], seed: u32) -> u64 {
    const M: u64 = 0xc6a4_a793_5bd1_e995;
    const R: u32 = 47;
    let mut h = u64::from(seed) ^ (key.len() as u64).wrapping_mul(M);
    let mut blocks = key.chunks_exact(8);
    for b in &mut blocks {
        let mut k = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h ^= k;
        h = h.wrapping_mul(M);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut last = [0u8; 8];
        last[..tail.len()].copy_from_slice(tail);
        h ^= u64::from_le_bytes(last);
        h = h.wrapping_mul(M);
    }
    h ^= h >> R;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h
}

fn one_at_a_time(key: &[u8]) -> u32 {
    let mut v = 0u32;
    for &b in key {
        v = v.wrapping_add(sign_extended(b) as u32);
        v = v.wrapping_add(v << 10);
        v ^= v >> 6;
    }
    v = v.wrapping_add(v << 3);
    v ^= v >> 11;
    v.wrapping_add(v << 15)
}

/// CRC-16/XMODEM lookup table (polynomial 0x1021, not reflected).
const CRC16_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = (i as u16) << 8;
        let mut j = 0;
        while j < 8 {
            c = if c & 0x8000 != 0 { (c << 1) ^ 0x1021 } else { c << 1 };
            j += 1;
        }
        t[i] = c as u32;
        i += 1;
    }
    t
};

/// twemproxy 0.5's `hash_crc16`: the accumulator is a `uint32_t` shifted left
/// each step and never masked back to 16 bits.
fn crc16(key: &[u8]) -> u32 {
    key.iter().fold(0u32, |crc, &b| (crc << 8) ^ CRC16_TABLE[((crc >> 8) ^ u32::from(b)) as usize & 0xff])
}

fn hsieh(key: &[u8]) -> u32 {
    if key.is_empty() {
        return 0;
    }
    let get16 = |d: &[u8]| u32::from(d[0]) | (u32::from(d[1]) << 8);
    let mut h = 0u32;
    let mut chunks = key.chunks_exact(4);
    for c in &mut chunks {
        h = h.wrapping_add(get16(c));
        let tmp = (get16(&c[2..]) << 11) ^ h;
        h = (h << 16) ^ tmp;
        h = h.wrapping_add(h >> 11);
    }
    let rest = chunks.remainder();
    match rest.len() {
        3 => {
            h = h.wrapping_add(get16(rest));
            h ^= h << 16;
            // The C code reads this byte as a signed char.
            h ^= (sign_extended(rest[2]) as u32) << 18;
            h = h.wrapping_add(h >> 11);
        }
        2 => {
            h = h.wrapping_add(get16(rest));
            h ^= h << 11;
            h = h.wrapping_add(h >> 17);
        }
        1 => {
            h = h.wrapping_add(u32::from(rest[0]));
            h ^= h << 10;
            h = h.wrapping_add(h >> 1);
        }
        _ => {}
    }
    h ^= h << 3;
    h = h.wrapping_add(h >> 5);
    h ^= h << 4;
    h = h.wrapping_add(h >> 17);
    h ^= h << 25;
    h.wrapping_add(h >> 6)
}

fn murmur2(key: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let len = key.len() as u32;
    let mut h = 0xdead_beefu32.wrapping_mul(len) ^ len;
    let mut blocks = key.chunks_exact(4);
    for b in &mut blocks {
        let mut k = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        for (i, &b) in tail.iter().enumerate().rev() {
            h ^= u32::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

/// Bob Jenkins' lookup3 `hashlittle` with initial value 13, as twemproxy
/// uses it (every read path gives the little-endian byte interpretation).
fn jenkins(key: &[u8]) -> u32 {
    let mut a = 0xdead_beefu32.wrapping_add(key.len() as u32).wrapping_add(13);
    let (mut b, mut c) = (a, a);
    if key.is_empty() {
        return c;
    }
    let word = |d: &[u8]| {
        let mut w = [0u8; 4];
        w[..d.len()].copy_from_slice(d);
        u32::from_le_bytes(w)
    };
    let mut rest = key;
    while rest.len() > 12 {
        a = a.wrapping_add(word(&rest[0..4]));
        b = b.wrapping_add(word(&rest[4..8]));
        c = c.wrapping_add(word(&rest[8..12]));
        // mix(a, b, c)
        a = a.wrapping_sub(c);
        a ^= c.rotate_left(4);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= a.rotate_left(6);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= b.rotate_left(8);
        b = b.wrapping_add(a);
        a = a.wrapping_sub(c);
        a ^= c.rotate_left(16);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= a.rotate_left(19);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= b.rotate_left(4);
        b = b.wrapping_add(a);
        rest = &rest[12..];
    }
    a = a.wrapping_add(word(&rest[..rest.len().min(4)]));
    if rest.len() > 4 {
        b = b.wrapping_add(word(&rest[4..rest.len().min(8)]));
    }
    if rest.len() > 8 {
        c = c.wrapping_add(word(&rest[8..]));
    }
    // final(a, b, c)
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c.wrapping_sub(b.rotate_left(24))
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
        Self::ALL
            .iter()
            .copied()
            .find(|h| h.name() == s)
            .ok_or_else(|| Error::UnknownHash { name: s.to_owned(), known: Self::names() })
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
        assert!(matches!("MD5".parse::<KeyHasher>(), Err(Error::UnknownHash { .. })));
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

#[cfg(test)]
mod seed_tests {
    use super::*;

    /// Values printed by the seeds' own runs (seed 001 and 003).
    #[test]
    fn java_hashes_reproduce_the_seeds() {
        let v = |h: KeyHasher, k: &str| h.value(k.as_bytes());
        // Seed 001, program without virtual nodes (mixing inside the loop).
        let inloop = KeyHasher::JavaFnv1_32InLoop;
        assert_eq!(v(inloop, "192.168.0.112:1000"), 481_136_787);
        assert_eq!(v(inloop, "192.168.0.112:1004"), 2_131_030_089);
        assert_eq!(v(inloop, "太阳"), 606_807_096);
        assert_eq!(v(inloop, "月亮"), 244_383_856);
        assert_eq!(v(inloop, "星星"), 1_233_020_469);
        // Seed 001, program with virtual nodes (mixing after the loop).
        let post = KeyHasher::JavaFnv1_32;
        assert_eq!(v(post, "192.168.0.112:1000&&VN0"), 426_605_410);
        assert_eq!(v(post, "192.168.0.112:1004&&VN4"), 1_405_901_184);
        assert_eq!(v(post, "太阳"), 1_977_106_057);
        assert_eq!(v(post, "月亮"), 1_132_637_661);
        assert_eq!(v(post, "星星"), 880_019_273);
        // Seed 003 (MurmurHash64A, signed long). The seed writes its keys in
        // traditional characters (號客戶端); its printed hashes are of those.
        let m = KeyHasher::JavaMurmur64a;
        assert_eq!(v(m, "1111號客戶端"), -5_471_088_278_396_709_594);
        assert_eq!(v(m, "1114號客戶端"), 5_327_220_965_487_432_534);
        assert_eq!(v(m, "1119號客戶端"), 4_250_876_462_402_385_736);
    }

    /// Seed 004 prints `String.hashCode()` of consecutive addresses.
    #[test]
    fn java_string_hashcode() {
        let h = KeyHasher::JavaStringHashCode;
        assert_eq!(h.value(b"192.168.0.0:1111"), 1_845_870_087);
        assert_eq!(h.value(b"192.168.0.4:1111"), 1_960_386_691);
        assert!(h.value(b"192.168.1.0:1111") < 0, "the seed notes this one is negative");
    }

    #[test]
    fn signed_order_is_kept_on_the_ring() {
        let m = KeyHasher::JavaMurmur64a;
        let (a, b) = (m.hash("1111號客戶端".as_bytes()), m.hash("1114號客戶端".as_bytes()));
        assert!(a < b, "a negative long sorts before a positive one");
        assert_eq!(KeyHasher::JavaFnv1_32.value_of_position(0), i128::from(i32::MIN));
    }

    #[test]
    fn crc16_is_xmodem_in_its_low_bits() {
        let v = KeyHasher::Crc16.hash(b"123456789");
        assert_eq!(v & 0xffff, 0x31c3);
        assert!(v > 0xffff, "twemproxy never masks the accumulator");
    }
}
