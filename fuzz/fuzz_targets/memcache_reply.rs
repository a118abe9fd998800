//! Backend bytes: the reply parser never panics and only consumes what it returns.
#![no_main]
use bytes::BytesMut;
use chash_proxy::memcache::{parse_reply, values, Reply, ReplyKind, ReplyParse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for kind in [ReplyKind::Line, ReplyKind::Values] {
        let mut buf = BytesMut::from(data);
        for _ in 0..1000 {
            match parse_reply(&mut buf, kind) {
                ReplyParse::Done(Reply::Values(raw)) => {
                    let _ = values(&raw);
                }
                ReplyParse::Done(Reply::Line(_) | Reply::Stream(_)) => {}
                ReplyParse::Incomplete | ReplyParse::Invalid(_) => break,
            }
        }
    }
});
