//! The placement algorithms by their `distribution:` names.

use std::fmt;
use std::str::FromStr;

use crate::{Error, KeyHasher, Result};

/// Every `distribution:` name chash knows.
pub const DISTRIBUTIONS: &[&str] = &[
    "ketama",
    "modula",
    "random",
    "nginx",
    "ring",
    "jump",
    "jumpback",
    "maglev",
    "rendezvous",
    "anchor",
    "multiprobe",
    "bounded",
];

/// A placement algorithm, as named by `distribution:`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Distribution {
    /// twemproxy's and libmemcached's weighted ketama (twemproxy's default).
    Ketama,
    /// twemproxy's `hash % n` over the servers (weights ignored).
    Modula,
    /// twemproxy's random choice per request.
    Random,
    /// nginx's `hash $key consistent`.
    Nginx,
    /// chash's native weighted ring.
    Ring,
    /// Jump consistent hash (Lamping & Veach): [`Jump`](crate::algo::Jump).
    Jump,
    /// JumpBackHash (Ertl, 2024), jump's family in O(1) expected steps:
    /// [`Jump::jump_back`](crate::algo::Jump::jump_back).
    JumpBack,
    /// Maglev (Eisenbud et al.): [`Maglev`](crate::algo::Maglev).
    Maglev,
    /// Rendezvous (highest random weight): [`Rendezvous`](crate::algo::Rendezvous).
    Rendezvous,
    /// AnchorHash (also named `memento` in configs): [`Anchor`](crate::algo::Anchor).
    Anchor,
    /// Multi-probe consistent hashing: [`MultiProbe`](crate::algo::MultiProbe).
    Multiprobe,
    /// Consistent hashing with bounded loads over the ring: [`Bounded`](crate::algo::Bounded).
    Bounded,
}

impl Distribution {
    const ALL: [Distribution; 12] = [
        Distribution::Ketama,
        Distribution::Modula,
        Distribution::Random,
        Distribution::Nginx,
        Distribution::Ring,
        Distribution::Jump,
        Distribution::JumpBack,
        Distribution::Maglev,
        Distribution::Rendezvous,
        Distribution::Anchor,
        Distribution::Multiprobe,
        Distribution::Bounded,
    ];

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Distribution::Ketama => "ketama",
            Distribution::Modula => "modula",
            Distribution::Random => "random",
            Distribution::Nginx => "nginx",
            Distribution::Ring => "ring",
            Distribution::Jump => "jump",
            Distribution::JumpBack => "jumpback",
            Distribution::Maglev => "maglev",
            Distribution::Rendezvous => "rendezvous",
            Distribution::Anchor => "anchor",
            Distribution::Multiprobe => "multiprobe",
            Distribution::Bounded => "bounded",
        }
    }

    /// The key hash a pool of this distribution uses when none is named, in
    /// a twemproxy config: twemproxy's `fnv1a_64`, nginx's CRC-32.
    pub fn twemproxy_hash(self) -> KeyHasher {
        match self {
            Distribution::Nginx => KeyHasher::Crc32a,
            _ => KeyHasher::Fnv1a64,
        }
    }

    /// The key hash chash picks when none is named (the CLI's `--node`
    /// pools): twemproxy's for its own distributions, nginx's CRC-32, xxh3
    /// for the rest.
    pub fn native_hash(self) -> KeyHasher {
        match self {
            Distribution::Ketama | Distribution::Modula | Distribution::Random => KeyHasher::Fnv1a64,
            Distribution::Nginx => KeyHasher::Crc32a,
            _ => KeyHasher::Xxh3,
        }
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Distribution {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == s || (s == "memento" && *d == Distribution::Anchor))
            .ok_or_else(|| Error::UnknownDistribution { name: s.to_owned(), known: DISTRIBUTIONS.join(", ") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in DISTRIBUTIONS {
            assert_eq!(name.parse::<Distribution>().unwrap().name(), *name);
        }
        assert_eq!("memento".parse::<Distribution>().unwrap(), Distribution::Anchor);
        assert!("circle".parse::<Distribution>().unwrap_err().to_string().contains("ketama, modula"));
    }
}
