//! The memcached descriptor: what the proxy asks of a memcached pool.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use chash::PoolConfig;

use super::session::MemcacheSession;
use super::LINE;
use crate::backend::{Setup, Speech};
use crate::protocol::{Client, Protocol};

/// memcached (ASCII and meta commands).
pub(crate) struct Memcached;

/// The memcached descriptor.
pub(crate) static MEMCACHED: Memcached = Memcached;

impl Protocol for Memcached {
    fn name(&self) -> &'static str {
        "memcached"
    }

    fn speech(&self, _: &PoolConfig) -> Speech {
        Speech {
            protocol: self.name(),
            dialects: vec![None],
            // A failed-over server must answer `version`; before it is taken
            // back it is flushed, since writes of its keys went to other
            // servers while it was out.
            probe: Some(Setup {
                requests: vec![Bytes::from_static(b"version\r\n")],
                framing: LINE,
                check: |r| {
                    if r.starts_with(b"VERSION") {
                        Ok(())
                    } else {
                        Err(String::from_utf8_lossy(r).into_owned())
                    }
                },
            }),
            before_return: Some(Setup {
                requests: vec![Bytes::from_static(b"flush_all\r\n")],
                framing: LINE,
                check: |r| if r.starts_with(b"OK") { Ok(()) } else { Err(String::from_utf8_lossy(r).into_owned()) },
            }),
            locator: None,
        }
    }

    fn drains(&self) -> bool {
        true
    }

    fn serve(&self, stream: crate::conn::ClientStream, c: Client) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let session = MemcacheSession::new(c.pool.clone(), c.shared.clone(), c.requester.clone());
        c.serve(stream, session)
    }
}
