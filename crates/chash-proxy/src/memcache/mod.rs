//! The memcached ASCII protocol, in layers: bytes to [`Request`]s
//! ([`request`]), server bytes to replies ([`reply`]: the backend
//! framings), a client connection's session (`session`), and the embedded
//! cache shards that speak it ([`shard`]).

pub mod reply;
pub mod request;
pub(crate) mod session;
pub mod shard;

pub use reply::{values, Value, LINE, VALUES};
pub use request::{
    parse_more_keys, parse_request, ArithOp, Limits, Parsed, Request, RetrievalCmd, StorageCmd, MAX_KEY_LEN,
};
