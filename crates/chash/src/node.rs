//! Nodes (the things keys are placed on) and twemproxy-style server lines.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// A physical node: a unique id, a weight, and an optional user payload.
///
/// The id is what lookups report and what placements hash (with the vnode
/// index) to make points; the payload travels along untouched (a socket
/// address, a connection pool, ...).
///
/// ```
/// use chash::Node;
/// let n = Node::new("cache-a", 2).unwrap();
/// assert_eq!((n.id(), n.weight()), ("cache-a", 2));
/// assert!(Node::new("cache-b", 0).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node<T = ()> {
    id: Box<str>,
    weight: u32,
    name: Option<Box<str>>,
    payload: T,
}

impl Node<()> {
    /// A node without payload.
    ///
    /// # Errors
    /// [`Error::EmptyNodeId`] for an empty id, [`Error::ZeroWeight`] for weight 0.
    pub fn new(id: impl Into<String>, weight: u32) -> Result<Self> {
        Node::with_payload(id, weight, ())
    }
}

impl<T> Node<T> {
    /// A node carrying `payload`.
    ///
    /// # Errors
    /// [`Error::EmptyNodeId`] for an empty id, [`Error::ZeroWeight`] for weight 0.
    pub fn with_payload(id: impl Into<String>, weight: u32, payload: T) -> Result<Self> {
        let id = id.into();
        if id.is_empty() {
            return Err(Error::EmptyNodeId);
        }
        if weight == 0 {
            return Err(Error::ZeroWeight(id));
        }
        Ok(Node { id: id.into_boxed_str(), weight, name: None, payload })
    }

    /// The node's unique id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The node's weight (at least 1).
    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// The user payload.
    pub fn payload(&self) -> &T {
        &self.payload
    }

    /// The optional display name (a server line's NAME). Compatibility
    /// placements that hash it (twemproxy's ketama) use it; the native ring
    /// hashes the id unless a `point_label` template names `{name}`.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The same node with a name.
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into().into_boxed_str());
        self
    }

    /// The same node with another weight.
    ///
    /// # Errors
    /// [`Error::ZeroWeight`] for weight 0.
    pub fn reweighted(&self, weight: u32) -> Result<Self>
    where
        T: Clone,
    {
        let node = Node::with_payload(self.id(), weight, self.payload.clone())?;
        Ok(Node { name: self.name.clone(), ..node })
    }
}

/// Checks a node list for the mistakes that are errors: duplicate ids (and,
/// through [`Node`]'s constructor, empty ids and zero weights).
pub(crate) fn check_unique<T>(nodes: &[Node<T>]) -> Result<()> {
    let mut ids: Vec<&str> = nodes.iter().map(Node::id).collect();
    ids.sort_unstable();
    match ids.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(Error::DuplicateNode(w[0].to_owned())),
        None => Ok(()),
    }
}

/// One entry of a pool's `servers:` list: `ID:WEIGHT [NAME] [STATE]`.
///
/// WEIGHT is the number after the last `:`; ID is everything before it
/// (`127.0.0.1:11211`, `cache-a`, `unix:/var/run/mc.sock`). NAME is optional
/// and separated by whitespace. STATE, chash's own (twemproxy reads lines
/// without it), is `ejected` (taken out by an operator, still a member),
/// `ejected N` or `removed N` (anchor: a bucket freed N-th; see
/// [`LineState`]). `ejected` and `removed` cannot be server names.
///
/// ```
/// use chash::ServerLine;
/// let s: ServerLine = "127.0.0.1:11211:2 cache-a".parse().unwrap();
/// assert_eq!(s.id, "127.0.0.1:11211");
/// assert_eq!(s.weight, 2);
/// assert_eq!(s.name.as_deref(), Some("cache-a"));
/// assert_eq!(s.host_port(), Some(("127.0.0.1", 11211)));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerLine {
    /// Everything before the last `:` of the first word.
    pub id: String,
    /// The number after the last `:` (at least 1).
    pub weight: u32,
    /// The optional second word.
    pub name: Option<String>,
    /// Whether it takes keys ([`LineState::Active`], the default).
    pub state: LineState,
}

/// What a server line stands for in the placement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LineState {
    /// A server that takes keys (no marker).
    #[default]
    Active,
    /// A member taken out by an operator (`ejected`): it takes no keys and
    /// can be restored. In an anchor pool `ejected N` marks the bucket its
    /// ejection freed, N-th of the freed buckets; plain `ejected` is a member
    /// without a bucket (another server took it).
    Ejected(Option<u32>),
    /// anchor only: the bucket of a server that was removed, freed N-th
    /// (`removed N`). Not a member: the line keeps the bucket's place, so
    /// that the servers after it keep theirs.
    Removed(u32),
}

impl LineState {
    /// The order in which its bucket was freed (anchor), if it holds a
    /// freed bucket.
    pub fn freed(self) -> Option<u32> {
        match self {
            LineState::Ejected(n) => n,
            LineState::Removed(n) => Some(n),
            LineState::Active => None,
        }
    }
}

impl ServerLine {
    /// `(host, port)` when the id has the form `HOST:PORT`, else `None`
    /// (for example a bare name or a unix socket path).
    pub fn host_port(&self) -> Option<(&str, u16)> {
        let (host, port) = self.id.rsplit_once(':')?;
        if host.is_empty() || host == "unix" {
            return None;
        }
        Some((host, port.parse().ok()?))
    }

    /// The node this line describes (with its name, if any).
    ///
    /// # Errors
    /// As [`Node::new`].
    pub fn to_node(&self) -> Result<Node> {
        let node = Node::new(self.id.clone(), self.weight)?;
        Ok(match &self.name {
            Some(name) => node.with_name(name.clone()),
            None => node,
        })
    }
}

impl FromStr for ServerLine {
    type Err = Error;

    fn from_str(line: &str) -> Result<Self> {
        let bad = |reason: &str| Error::ServerLine { line: line.to_owned(), reason: reason.to_owned() };
        let mut words: Vec<&str> = line.split_whitespace().collect();
        let addr = *words.first().ok_or_else(|| bad("it is empty"))?;
        // The state marker, from the end: `ejected`, `ejected N`, `removed N`.
        let number = |w: &str| w.parse::<u32>().ok().filter(|&n| n > 0);
        let marker_at = words.iter().position(|&w| w == "ejected" || w == "removed");
        let state = match marker_at {
            None => LineState::Active,
            Some(0) => return Err(bad("it starts with a state word")),
            Some(at) => {
                let order = match &words[at + 1..] {
                    [] => None,
                    [n] => Some(
                        number(n)
                            .ok_or_else(|| bad(&format!("{n:?} after {} is not an order (1, 2, ...)", words[at])))?,
                    ),
                    _ => return Err(bad("expected `ID:WEIGHT [NAME] [ejected [N] | removed N]`, found more words")),
                };
                let state = match (words[at], order) {
                    ("ejected", n) => LineState::Ejected(n),
                    ("removed", Some(n)) => LineState::Removed(n),
                    _ => return Err(bad("`removed` needs the order in which its bucket was freed: `removed N`")),
                };
                words.truncate(at);
                state
            }
        };
        let name = words.get(1).map(|w| (*w).to_owned());
        if words.len() > 2 {
            return Err(bad("expected `ID:WEIGHT [NAME]`, found more than two words"));
        }
        let (id, weight) =
            addr.rsplit_once(':').ok_or_else(|| bad("expected `ID:WEIGHT`, with the weight after the last ':'"))?;
        if id.is_empty() {
            return Err(bad("the id before the weight is empty"));
        }
        let weight: u32 = weight
            .parse()
            .map_err(|_| bad(&format!("weight {weight:?} is not a whole number from 1 to {}", u32::MAX)))?;
        if weight == 0 {
            return Err(bad("weight 0: weights start at 1"));
        }
        Ok(ServerLine { id: id.to_owned(), weight, name, state })
    }
}

impl ServerLine {
    /// A line for an active server.
    pub fn new(id: &str, weight: u32, name: Option<&str>) -> ServerLine {
        ServerLine { id: id.to_owned(), weight, name: name.map(str::to_owned), state: LineState::Active }
    }

    /// The same server in another state.
    pub fn with_state(&self, state: LineState) -> ServerLine {
        ServerLine { state, ..self.clone() }
    }

    /// Whether it is a member of the pool (active or ejected), not a freed
    /// bucket's place.
    pub fn is_member(&self) -> bool {
        !matches!(self.state, LineState::Removed(_))
    }
}

impl fmt::Display for ServerLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.id, self.weight)?;
        if let Some(name) = &self.name {
            write!(f, " {name}")?;
        }
        match self.state {
            LineState::Active => Ok(()),
            LineState::Ejected(None) => f.write_str(" ejected"),
            LineState::Ejected(Some(n)) => write!(f, " ejected {n}"),
            LineState::Removed(n) => write!(f, " removed {n}"),
        }
    }
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
    fn server_lines() {
        let s: ServerLine = "cache-a:3".parse().unwrap();
        assert_eq!((s.id.as_str(), s.weight, s.name.as_deref()), ("cache-a", 3, None));
        assert_eq!(s.host_port(), None);
        let s: ServerLine = "unix:/tmp/mc.sock:1 local".parse().unwrap();
        assert_eq!(s.id, "unix:/tmp/mc.sock");
        assert_eq!(s.host_port(), None);
        let s: ServerLine = "  10.0.0.1:6379:10   redis-1 ".parse().unwrap();
        assert_eq!(s.to_string(), "10.0.0.1:6379:10 redis-1");
        assert_eq!(s.host_port(), Some(("10.0.0.1", 6379)));
        let s: ServerLine = "10.0.0.1:11211:1 n1 ejected".parse().unwrap();
        assert_eq!((s.name.as_deref(), s.state), (Some("n1"), LineState::Ejected(None)));
        assert_eq!(s.to_string(), "10.0.0.1:11211:1 n1 ejected");
        let s: ServerLine = "10.0.0.1:11211:1 removed 3".parse().unwrap();
        assert_eq!((s.name.as_deref(), s.state), (None, LineState::Removed(3)));
        assert_eq!(s.to_string(), "10.0.0.1:11211:1 removed 3");
        assert_eq!("a:1 n ejected 2".parse::<ServerLine>().unwrap().state, LineState::Ejected(Some(2)));
        for bad in [
            "",
            "a",
            "a:0",
            ":1",
            "a:-1",
            "a:x",
            "a:1 b c",
            "a:99999999999",
            "a:1 removed",
            "a:1 removed 0",
            "a:1 ejected x",
            "a:1 n removed 2 3",
            "ejected",
        ] {
            assert!(bad.parse::<ServerLine>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn duplicate_ids_are_errors() {
        let nodes = vec![Node::new("a", 1).unwrap(), Node::new("b", 1).unwrap(), Node::new("a", 2).unwrap()];
        assert_eq!(check_unique(&nodes), Err(Error::DuplicateNode("a".into())));
    }
}
