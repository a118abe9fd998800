//! Client bytes in any split: the parser never panics, never loops, and
//! every request it returns re-encodes to something it parses again.
#![no_main]
use bytes::BytesMut;
use chash_proxy::memcache::{parse_more_keys, parse_request, Limits, Parsed, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_value: 4096, lenient_keys: data.first().is_some_and(|b| b & 1 == 1) };
    let mut buf = BytesMut::new();
    // A get line taken in segments continues here.
    let mut continuing = None;
    // Feed in two pieces to exercise incomplete input.
    let cut = data.len() / 2;
    for piece in [&data[..cut], &data[cut..]] {
        buf.extend_from_slice(piece);
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 100_000, "no progress");
            let before = buf.len();
            let cont = continuing.take();
            let parsed = match cont {
                Some((cmd, exptime)) => parse_more_keys(&mut buf, cmd, exptime, limits),
                None => parse_request(&mut buf, limits),
            };
            match parsed {
                Parsed::Incomplete => {
                    continuing = cont;
                    break;
                }
                Parsed::Refused { .. } | Parsed::RefusedLine { .. } | Parsed::TooLarge { .. } => {
                    assert!(buf.len() <= before)
                }
                Parsed::Partial(Request::Retrieval { cmd, exptime, .. }) => {
                    assert!(buf.len() < before);
                    continuing = Some((cmd, exptime));
                }
                Parsed::Partial(other) => panic!("a partial request that is not a get: {other:?}"),
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
