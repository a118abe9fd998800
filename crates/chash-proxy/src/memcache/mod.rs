//! The memcached ASCII protocol, in layers: bytes to [`Request`]s
//! ([`request`]; the meta commands in [`meta`]), server bytes to replies ([`reply`]: the backend
//! framings), a client connection's session (`session`), and the embedded
//! cache shards that speak it ([`shard`]).

mod errors;
pub mod meta;
pub mod reply;
pub mod request;
pub(crate) mod session;
pub mod shard;
mod warmup;

pub use meta::{MetaCmd, MetaRequest};
pub use reply::{values, Value, LINE, META, META_TO_MN, VALUES};
pub use request::{
    parse_more_keys, parse_request, ArithOp, Limits, Parsed, Request, RetrievalCmd, StorageCmd, MAX_KEY_LEN,
};
