//! The memcached ASCII protocol, in layers: bytes to [`Request`]s
//! ([`request`]; the meta commands in [`meta`]), server bytes to replies ([`reply`]: the backend
//! framings), a client connection's session (`session`), and the embedded
//! cache shards that speak it ([`shard`]).

mod errors;

/// The memcached version the proxy and the embedded shards answer `version`
/// with, before their own name: libmemcached (php-memcached, pylibmc's
/// `get_stats`) parses the reply as `MAJOR.MINOR.MICRO` and gives up on a
/// major of 0 or a word (memcached 1.6's protocol, meta commands
/// included, is what they speak).
pub const MEMCACHED_VERSION: &str = "1.6.18";
pub mod meta;
mod multiget;
pub(crate) mod protocol;
mod replies;
pub mod reply;
pub mod request;
pub(crate) mod session;
pub mod shard;
mod warmup;

pub use meta::{MetaCmd, MetaRequest};
pub use reply::{values, Value, ValuesScan, LINE, META, META_TO_MN, VALUES, VALUES_STREAMED};
pub use request::{
    parse_more_keys, parse_request, ArithOp, Limits, Parsed, Request, RetrievalCmd, StorageCmd, MAX_KEY_LEN,
};
