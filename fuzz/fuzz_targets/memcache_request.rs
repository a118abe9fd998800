//! Client bytes in any split: the parser never panics, never loops, and
//! every request it returns re-encodes to something it parses again.
#![no_main]
use bytes::BytesMut;
use chash_proxy::memcache::{parse_request, Limits, Parsed};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_value: 4096, lenient_keys: data.first().is_some_and(|b| b & 1 == 1) };
    let mut buf = BytesMut::new();
    // Feed in two pieces to exercise incomplete input.
    let cut = data.len() / 2;
    for piece in [&data[..cut], &data[cut..]] {
        buf.extend_from_slice(piece);
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 100_000, "no progress");
            let before = buf.len();
            match parse_request(&mut buf, limits) {
                Parsed::Incomplete => break,
                Parsed::Refused { .. } => assert!(buf.len() <= before),
                Parsed::Request(req) => {
                    assert!(buf.len() < before);
                    let mut again = BytesMut::new();
                    req.encode(&mut again);
                    assert!(matches!(parse_request(&mut again, Limits { max_value: usize::MAX, lenient_keys: true }), Parsed::Request(_)));
                }
            }
        }
    }
});
