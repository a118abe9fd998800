//! nginx's `hash $key consistent`.

use crate::node::check_unique;
use crate::placement::{Placement, PointRing};
use crate::points::Points;
use crate::ring::{RingCandidates, MAX_POINTS};
use crate::{Error, KeyHasher, Node, Result};

/// nginx's consistent hash (`ngx_http_upstream_hash_module`), the scheme of
/// Cache::Memcached::Fast.
///
/// Each server `HOST:PORT` of weight `w` gets `w × 160` points: the first is
/// CRC-32 of `HOST`, a zero byte, `PORT` and four zero bytes; each next one
/// continues the CRC of `HOST \0 PORT` over the previous point's four
/// little-endian bytes. Points are sorted and equal ones keep the first
/// (earlier server). Keys hash with CRC-32 (`crc32a`) and belong to the first
/// point at or above their hash, wrapping.
#[derive(Clone, Debug)]
pub struct NginxChash {
    nodes: Vec<Node>,
    points: Points,
}

/// How nginx splits a server address for hashing: `unix:PATH` gives
/// `(PATH, "")`; `HOST:DIGITS` gives `(HOST, DIGITS)`; anything else is all host.
pub fn nginx_host_port(id: &str) -> (&str, &str) {
    if id.len() >= 5 && id[..5].eq_ignore_ascii_case("unix:") {
        return (&id[5..], "");
    }
    match id.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => (host, port),
        _ => (id, ""),
    }
}

impl NginxChash {
    /// Builds the points.
    ///
    /// # Errors
    /// Duplicate ids; more than [`MAX_POINTS`] points.
    pub fn new(nodes: Vec<Node>) -> Result<NginxChash> {
        check_unique(&nodes)?;
        let requested: u64 = nodes.iter().map(|n| u64::from(n.weight()) * 160).sum();
        if requested > MAX_POINTS {
            return Err(Error::TooManyPoints { requested, limit: MAX_POINTS });
        }
        let mut raw = Vec::with_capacity(requested as usize);
        let mut counts = Vec::with_capacity(nodes.len());
        for node in &nodes {
            let (host, port) = nginx_host_port(node.id());
            let mut base = crc32fast::Hasher::new();
            base.update(host.as_bytes());
            base.update(&[0]);
            base.update(port.as_bytes());
            let mut prev = 0u32;
            let count = node.weight() as usize * 160;
            for _ in 0..count {
                let mut h = base.clone();
                h.update(&prev.to_le_bytes());
                prev = h.finalize();
                raw.push(u64::from(prev));
            }
            counts.push(count);
        }
        let server_order: Vec<u32> = (0..nodes.len() as u32).collect();
        Ok(NginxChash { points: Points::build(32, &raw, &counts, &server_order), nodes })
    }
}

impl Placement for NginxChash {
    type Payload = ();
    type Candidates<'a> = RingCandidates<'a>;

    fn hasher(&self) -> KeyHasher {
        KeyHasher::Crc32a
    }

    fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    #[inline]
    fn locate_hash(&self, hash: u64) -> Option<usize> {
        self.points.locate_owner(hash)
    }

    fn candidates_hash(&self, hash: u64) -> RingCandidates<'_> {
        RingCandidates::new(&self.points, self.nodes.len(), hash)
    }
}

impl PointRing for NginxChash {
    fn point_hashes(&self) -> Vec<u64> {
        self.points.hashes()
    }

    fn point_owner(&self, pos: usize) -> usize {
        self.points.owner(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_split() {
        assert_eq!(nginx_host_port("127.0.0.1:8080"), ("127.0.0.1", "8080"));
        assert_eq!(nginx_host_port("backend"), ("backend", ""));
        assert_eq!(nginx_host_port("unix:/tmp/s.sock"), ("/tmp/s.sock", ""));
        assert_eq!(nginx_host_port("[::1]:80"), ("[::1]", "80"));
        assert_eq!(nginx_host_port("host:http"), ("host:http", ""));
    }

    #[test]
    fn first_point_chains_from_zero() {
        let n = NginxChash::new(vec![Node::new("127.0.0.1:8080", 1).unwrap()]).unwrap();
        let first = crc32fast::hash(b"127.0.0.1\x008080\0\0\0\0");
        assert!(n.point_hashes().contains(&u64::from(first)));
        assert_eq!(n.point_hashes().len(), 160);
    }
}
