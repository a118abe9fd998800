//! The Redis descriptor: what the proxy asks of a Redis pool.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use chash::PoolConfig;

use super::handshake::dialects;
use super::resp::WHOLE;
use super::session::RedisSession;
use crate::backend::{Setup, Speech};
use crate::protocol::{Client, Protocol};

/// Redis (RESP2 and RESP3).
pub(crate) struct Redis;

/// The Redis descriptor.
pub(crate) static REDIS: Redis = Redis;

impl Protocol for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn speech(&self, config: &PoolConfig) -> Speech {
        Speech {
            protocol: self.name(),
            dialects: dialects(super::access::server_login(config), config.redis_db),
            // A failed-over server must answer `PING`. Nothing is flushed
            // when it comes back: Redis keys are data, not a cache's.
            probe: Some(Setup {
                requests: vec![Bytes::from_static(b"*1\r\n$4\r\nPING\r\n")],
                framing: WHOLE,
                check: |r| if r.starts_with(b"+PONG") { Ok(()) } else { Err(String::from_utf8_lossy(r).into_owned()) },
            }),
            before_return: None,
            locator: super::sentinel::Sentinels::of(config)
                .map(|s| std::sync::Arc::new(s) as std::sync::Arc<dyn crate::backend::Locator>),
        }
    }

    /// The passwords named by file (`server_password_file`, users').
    fn prepare(&self, config: &mut PoolConfig) -> Result<(), crate::pool::PoolError> {
        super::access::resolve_secrets(config)
    }

    /// Warm-up reads memcached values; a Redis pool does not drain.
    fn drains(&self) -> bool {
        false
    }

    /// Keys move with `MIGRATE`.
    fn mover(&self, settings: crate::pool::MoveSettings) -> Option<crate::pool::Mover> {
        Some(super::migrate::mover(settings))
    }

    fn check_migration(&self, before: &PoolConfig, after: &PoolConfig) -> Result<(), String> {
        super::migrate::check(before, after)
    }

    fn serve(&self, stream: crate::conn::ClientStream, c: Client) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let session = RedisSession::new(c.pool.clone(), c.shared.clone(), c.requester.clone());
        c.serve(stream, session)
    }
}
