//! Redis client and backend bytes: neither parser panics or loops, and every
//! command re-encodes to itself.
#![no_main]
use bytes::BytesMut;
use chash_proxy::redis::resp::{array_items, parse_reply, parse_request, Frame, Request, RespLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = RespLimits { max_args: 1024, max_bulk: 1 << 16 };
    let mut buf = BytesMut::from(data);
    for _ in 0..10_000 {
        let before = buf.len();
        match parse_request(&mut buf, limits) {
            Request::Command(cmd) => {
                assert!(buf.len() < before);
                let mut again = BytesMut::new();
                cmd.encode(&mut again);
                match parse_request(&mut again, limits) {
                    Request::Command(back) => assert_eq!(back.args, cmd.args),
                    other => panic!("re-encoded command did not parse: {other:?}"),
                }
            }
            Request::Incomplete | Request::Error(_) => break,
        }
    }
    let mut buf = BytesMut::from(data);
    for _ in 0..10_000 {
        match parse_reply(&mut buf) {
            Frame::Done(f) => {
                let _ = array_items(&f);
            }
            Frame::Incomplete | Frame::Invalid(_) => break,
        }
    }
});
