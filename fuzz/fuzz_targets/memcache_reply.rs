//! Server bytes: the reply framings never panic and only consume what they return.
#![no_main]
use bytes::BytesMut;
use chash_proxy::memcache::{values, LINE, META, META_TO_MN, VALUES};
use chash_proxy::Frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for framing in [LINE, VALUES, META, META_TO_MN] {
        let mut buf = BytesMut::from(data);
        for _ in 0..1000 {
            let before = buf.len();
            match framing.parse(&mut buf) {
                Frame::Done(raw) => {
                    assert_eq!(before - buf.len(), raw.len());
                    let _ = values(&raw);
                }
                Frame::Incomplete | Frame::Invalid(_) => {
                    assert_eq!(buf.len(), before);
                    break;
                }
            }
        }
    }
});
