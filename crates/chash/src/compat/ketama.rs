//! twemproxy's and libmemcached's weighted ketama continuum.

use md5::{Digest, Md5};

use crate::node::check_unique;
use crate::placement::{Placement, PointRing};
use crate::points::Points;
use crate::ring::RingCandidates;
use crate::{Error, KeyHasher, Node, Result};

/// Points per server at equal weights (40 MD5 digests of 4 points each).
const POINTS_PER_SERVER: f32 = 160.0;

/// twemproxy formats labels into an 86-byte buffer but hashes the untruncated
/// length, so a longer label reads past the buffer: behaviour chash cannot
/// reproduce, and refuses.
const MAX_LABEL: usize = 85;

/// The weighted ketama continuum of twemproxy and libmemcached.
///
/// - Server `s` gets `floorf(w_s / W × 160 / 4 × n + 1e-10) × 4` points, the
///   arithmetic done in single precision as the C code does (`W` the total
///   weight, `n` the number of servers), so point counts depend on the
///   other servers' weights too.
/// - Its label is [`ketama_label_base`] followed by `-i` for `i` from 0; each
///   label's MD5 digest gives four points, the little-endian `u32`s of digest
///   bytes 0–3, 4–7, 8–11 and 12–15.
/// - A key hashes with the pool's hash (twemproxy's default `fnv1a_64`;
///   libmemcached's weighted ketama uses `md5`) and belongs to the first point
///   at or above its hash, wrapping. Equal points keep server order (the C
///   code sorts them with glibc's stable `qsort` and binary-searches for the
///   first), so the earlier server in the list owns a tie.
///
/// ```
/// use chash::compat::Ketama;
/// use chash::{KeyHasher, Placement, ServerLine};
/// let servers: Vec<ServerLine> = ["127.0.0.1:11211:1", "127.0.0.1:11212:1"].iter().map(|s| s.parse().unwrap()).collect();
/// let nodes = servers.iter().map(|s| s.to_node()).collect::<Result<Vec<_>, _>>()?;
/// let k = Ketama::new(nodes, KeyHasher::Md5)?;
/// assert_eq!(k.point_count(), 320);
/// assert!(k.locate(b"foo").is_some());
/// # Ok::<(), chash::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Ketama {
    nodes: Vec<Node>,
    hasher: KeyHasher,
    points: Points,
}

/// Points for a server of `weight` among `servers` servers of `total_weight`,
/// exactly as twemproxy's `ketama_update` computes them in `float`.
///
/// ```
/// use chash::compat::ketama_points_per_server;
/// assert_eq!(ketama_points_per_server(1, 4, 4), 160);
/// assert_eq!(ketama_points_per_server(1, 3, 2), 104); // 106.67 rounded down to a multiple of 4
/// ```
pub fn ketama_points_per_server(weight: u32, total_weight: u32, servers: u32) -> u32 {
    let pct = weight as f32 / total_weight as f32;
    let scaled = pct * POINTS_PER_SERVER / 4.0 * servers as f32;
    // The C expression adds a double constant, then converts back to float.
    let nudged = (f64::from(scaled) + 0.000_000_000_1) as f32;
    (nudged.floor() * 4.0) as u32
}

/// The text before `-i` in a server's labels: its name when the server line
/// has one; else `HOST` when the port is 11211 (libmemcached's rule); else the
/// id (`HOST:PORT`). A unix socket path `/path` becomes `/path:`, as twemproxy
/// (which appends the empty port's separator) hashes it.
pub fn ketama_label_base<T>(node: &Node<T>) -> String {
    if let Some(name) = node.name() {
        return name.to_owned();
    }
    let id = node.id();
    if id.starts_with('/') {
        return format!("{id}:");
    }
    match id.rsplit_once(':') {
        Some((host, "11211")) if !host.is_empty() => host.to_owned(),
        _ => id.to_owned(),
    }
}

/// Puts servers in the order twemproxy keeps them: it sorts a pool's servers
/// by name ([`ketama_label_base`]), shorter names first and equal lengths
/// bytewise, when it checks the config for duplicates, and never restores
/// the file's order. Modula's slots and ketama's ties follow that order.
///
/// # Errors
/// Two servers with the same name, which twemproxy refuses too.
///
/// ```
/// use chash::{compat::twemproxy_order, ServerLine};
/// let nodes = ["10.0.0.1:11212:1", "10.0.0.1:11211:1", "10.0.0.1:9999:1"]
///     .iter().map(|l| l.parse::<ServerLine>().unwrap().to_node().unwrap()).collect();
/// let ids: Vec<String> = twemproxy_order(nodes)?.iter().map(|n| n.id().to_owned()).collect();
/// // Names: "10.0.0.1:11212", "10.0.0.1" (port 11211), "10.0.0.1:9999".
/// assert_eq!(ids, ["10.0.0.1:11211", "10.0.0.1:9999", "10.0.0.1:11212"]);
/// # Ok::<(), chash::Error>(())
/// ```
pub fn twemproxy_order<T>(nodes: Vec<Node<T>>) -> Result<Vec<Node<T>>> {
    let mut named: Vec<(String, Node<T>)> = nodes.into_iter().map(|n| (ketama_label_base(&n), n)).collect();
    named.sort_by(|a, b| a.0.len().cmp(&b.0.len()).then_with(|| a.0.as_bytes().cmp(b.0.as_bytes())));
    if let Some(w) = named.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::Config(format!(
            "servers {:?} and {:?} have the same name {:?} (twemproxy refuses that too)",
            w[0].1.id(),
            w[1].1.id(),
            w[0].0
        )));
    }
    Ok(named.into_iter().map(|(_, n)| n).collect())
}

impl Ketama {
    /// Builds the continuum for `nodes` (all live, in the order given; see
    /// [`twemproxy_order`] for twemproxy's) with key hash `hasher`.
    ///
    /// # Errors
    /// Duplicate ids; a hash wider than 32 bits (the continuum is 32 bits);
    /// a total weight over `u32::MAX`; a label over 85 bytes.
    pub fn new(nodes: Vec<Node>, hasher: KeyHasher) -> Result<Ketama> {
        check_unique(&nodes)?;
        if hasher.bits() > 32 {
            return Err(Error::Unsupported(format!(
                "distribution ketama has a 32-bit continuum, but hash {hasher} gives {}-bit values: use one of twemproxy's hashes",
                hasher.bits()
            )));
        }
        let total: u64 = nodes.iter().map(|n| u64::from(n.weight())).sum();
        let total = u32::try_from(total).map_err(|_| {
            Error::Unsupported(format!("ketama: total weight {total} exceeds twemproxy's 32-bit counter"))
        })?;
        let servers = nodes.len() as u32;
        let mut raw = Vec::new();
        let mut counts = Vec::with_capacity(nodes.len());
        for node in &nodes {
            let base = ketama_label_base(node);
            let per_server = ketama_points_per_server(node.weight(), total, servers);
            let before = raw.len();
            for i in 0..per_server / 4 {
                let label = format!("{base}-{i}");
                if label.len() > MAX_LABEL {
                    return Err(Error::Unsupported(format!(
                        "ketama label {label:?} is longer than twemproxy's {MAX_LABEL}-byte limit"
                    )));
                }
                let d = Md5::digest(label.as_bytes());
                for w in d.chunks_exact(4) {
                    raw.push(u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]])));
                }
            }
            counts.push(raw.len() - before);
        }
        let server_order: Vec<u32> = (0..nodes.len() as u32).collect();
        let points = Points::build(32, &raw, &counts, &server_order);
        Ok(Ketama { nodes, hasher, points })
    }

    /// Number of points on the continuum.
    pub fn point_count(&self) -> usize {
        self.points.len()
    }
}

impl Placement for Ketama {
    type Payload = ();
    type Candidates<'a> = RingCandidates<'a>;

    fn hasher(&self) -> KeyHasher {
        self.hasher
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

impl PointRing for Ketama {
    fn point_hashes(&self) -> Vec<u64> {
        self.points.hashes()
    }

    fn point_owner(&self, pos: usize) -> usize {
        self.points.owner(pos)
    }

    fn space_bits(&self) -> u32 {
        32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_counts_use_single_precision() {
        // Equal weights: 160 each.
        assert_eq!(ketama_points_per_server(1, 3, 3), 160);
        // Weighted: 1 of 1+2+3 over 3 servers: 1/6*40*3 = 20 -> 80 points.
        assert_eq!(ketama_points_per_server(1, 6, 3), 80);
        assert_eq!(ketama_points_per_server(3, 6, 3), 240);
        // 1/7 * 40 * 5 = 28.571 -> 28 -> 112.
        assert_eq!(ketama_points_per_server(1, 7, 5), 112);
    }

    #[test]
    fn labels_follow_twemproxy() {
        let n = |line: &str| line.parse::<crate::ServerLine>().unwrap().to_node().unwrap();
        assert_eq!(ketama_label_base(&n("10.0.0.1:11211:1")), "10.0.0.1");
        assert_eq!(ketama_label_base(&n("10.0.0.1:11212:1")), "10.0.0.1:11212");
        assert_eq!(ketama_label_base(&n("10.0.0.1:11212:1 cache-a")), "cache-a");
        assert_eq!(ketama_label_base(&n("/tmp/mc.sock:1")), "/tmp/mc.sock:");
    }

    #[test]
    fn refuses_what_twemproxy_cannot_do() {
        let long = Node::new("x".repeat(90), 1).unwrap();
        assert!(matches!(Ketama::new(vec![long], KeyHasher::Md5), Err(Error::Unsupported(_))));
        let a = Node::new("a:11211", 1).unwrap();
        assert!(matches!(Ketama::new(vec![a], KeyHasher::Xxh3), Err(Error::Unsupported(_))));
        assert!(Ketama::new(vec![], KeyHasher::Md5).unwrap().locate(b"k").is_none());
    }
}
