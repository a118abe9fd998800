//! Errors the proxy answers a Redis client with, counted.

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;

use super::resp::error;
use crate::conn::{ready_owned, PendingReply};
use crate::pool::Pool;

/// An error the proxy answers (not a server), counted.
pub(super) fn err(pool: &Pool, msg: String) -> PendingReply {
    pool.counters().errors.fetch_add(1, Relaxed);
    ready_owned(error(&msg))
}

/// An error the proxy answers, counted, as bytes.
pub(super) fn err_bytes(pool: &Pool, msg: String) -> Bytes {
    pool.counters().errors.fetch_add(1, Relaxed);
    error(&msg)
}

/// An error the proxy made up because no server could answer.
pub(super) fn forward_error(pool: &Pool, msg: String) -> Bytes {
    let c = pool.counters();
    c.errors.fetch_add(1, Relaxed);
    c.forward_errors.fetch_add(1, Relaxed);
    error(&msg)
}

/// The error for a request its server did not answer: `TRYAGAIN` when
/// it may be sent again as is (a Sentinel group between primaries).
pub(super) fn backend_error(pool: &Pool, server: &str, e: &crate::backend::BackendError) -> Bytes {
    match e {
        crate::backend::BackendError::Retry(why) => forward_error(pool, format!("TRYAGAIN {why}")),
        e => forward_error(pool, format!("ERR backend {server} {e}")),
    }
}

/// Redis's error for a command with the wrong number of arguments.
pub(super) fn arity(name: &str) -> String {
    format!("ERR wrong number of arguments for '{}' command", name.to_ascii_lowercase())
}
