//! The memcached ASCII protocol, in layers: bytes to [`Request`]s
//! ([`request`]), backend bytes to [`Reply`]s ([`reply`]), and requests to the
//! bytes a backend is sent ([`Request::encode`]).

pub mod reply;
pub mod request;

pub use reply::{parse_reply, values, Reply, ReplyKind, ReplyParse, Value};
pub use request::{parse_request, ArithOp, Limits, Parsed, Request, RetrievalCmd, StorageCmd, MAX_KEY_LEN};
