//! The library's error type.

use std::fmt;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when building or changing a placement, or
/// reading a configuration.
///
/// Every variant is caused by input (a node list, a config file, a name); the
/// library never panics on input, it returns one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// Two nodes share an id.
    DuplicateNode(String),
    /// A node has weight 0 (weights start at 1).
    ZeroWeight(String),
    /// A node id is empty.
    EmptyNodeId,
    /// A change names a node that is not in the placement.
    UnknownNode(String),
    /// `vnodes` is 0.
    ZeroVnodes,
    /// The placement would need more points than it can index.
    TooManyPoints {
        /// Points that were asked for.
        requested: u64,
        /// The most a placement holds.
        limit: u64,
    },
    /// A hash function name that chash does not know.
    UnknownHash {
        /// The name given.
        name: String,
        /// The names chash knows, comma-separated.
        known: String,
    },
    /// A distribution name that chash does not know.
    UnknownDistribution {
        /// The name given.
        name: String,
        /// The names chash knows, comma-separated.
        known: String,
    },
    /// A known setting with a value chash does not support (yet, or at all).
    Unsupported(String),
    /// Two placements cannot be compared (different hash spaces, or one is empty).
    Incomparable(String),
    /// A malformed server line such as `host:port:weight name`.
    ServerLine {
        /// The line as written.
        line: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration file that cannot be used.
    Config(String),
    /// A membership change that cannot be made (an unknown server, or one
    /// the placement cannot express), with what to do instead.
    Change(String),
    /// The algorithm places keys on equal nodes only, and a node has another weight.
    WeightsUnsupported {
        /// The algorithm's `distribution:` name.
        distribution: &'static str,
        /// The first node whose weight is not 1.
        node: String,
        /// Its weight.
        weight: u32,
    },
    /// An algorithm parameter (table size, probes, balance factor, capacity)
    /// that cannot be used.
    BadParameter {
        /// The parameter's config name, e.g. `maglev_table_size`.
        name: &'static str,
        /// What is wrong, with a hint where there is one.
        reason: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::DuplicateNode(id) => write!(f, "duplicate node id {id:?}: node ids must be unique"),
            Error::ZeroWeight(id) => write!(f, "node {id:?} has weight 0: weights start at 1"),
            Error::EmptyNodeId => f.write_str("a node id is empty"),
            Error::UnknownNode(id) => write!(f, "no node with id {id:?}"),
            Error::ZeroVnodes => f.write_str("vnodes must be at least 1"),
            Error::TooManyPoints { requested, limit } => write!(
                f,
                "the placement needs {requested} points, more than the limit of {limit}: lower vnodes or the weights"
            ),
            Error::UnknownHash { name, known } => write!(f, "unknown hash {name:?} (known: {known})"),
            Error::UnknownDistribution { name, known } => write!(f, "unknown distribution {name:?} (known: {known})"),
            Error::Unsupported(what) => f.write_str(what),
            Error::Incomparable(why) => write!(f, "cannot compare placements: {why}"),
            Error::ServerLine { line, reason } => write!(f, "bad server line {line:?}: {reason}"),
            Error::Change(why) => f.write_str(why),
            Error::Config(msg) => f.write_str(msg),
            Error::WeightsUnsupported { distribution, node, weight } => write!(
                f,
                "distribution {distribution} does not support weights: node {node:?} has weight {weight} \
                 (give every server weight 1, or use ring, rendezvous or maglev, which take weights)"
            ),
            Error::BadParameter { name, reason } => write!(f, "{name}: {reason}"),
        }
    }
}

impl std::error::Error for Error {}
