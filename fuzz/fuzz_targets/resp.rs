//! Redis client and backend bytes: neither parser panics or loops, every
//! command re-encodes to itself, and the streaming frame scanner, fed the
//! bytes in two pieces, ends each reply where the whole-frame parser does.
#![no_main]
use bytes::BytesMut;
use chash_proxy::redis::resp::{array_items, encode_array, parse_reply, parse_request, parse_request_into, Command, FrameScanner, Parsed, RespLimits};
use chash_proxy::Frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = RespLimits { max_args: 1024, max_bulk: 1 << 16 };
    let mut buf = BytesMut::from(data);
    // Parsed into one command again and again, as a session does.
    let mut cmd = Command::default();
    for _ in 0..10_000 {
        let before = buf.len();
        match parse_request_into(&mut buf, limits, &mut cmd) {
            Parsed::Command => {
                assert!(buf.len() < before);
                let mut again = BytesMut::new();
                encode_array(&mut again, cmd.args.iter());
                match parse_request(&mut again, limits) {
                    (Parsed::Command, back) => assert_eq!(back.args, cmd.args),
                    (other, _) => panic!("re-encoded command did not parse: {other:?}"),
                }
            }
            Parsed::TooLarge { mut skip, .. } => {
                // Read past the rest of the refused command, then go on.
                match skip.advance(&mut buf) {
                    Ok(true) => {}
                    Ok(false) | Err(_) => break,
                }
            }
            Parsed::Incomplete | Parsed::Http | Parsed::Error(_) => break,
        }
    }
    let mut buf = BytesMut::from(data);
    for _ in 0..10_000 {
        let rest = buf.clone();
        match parse_reply(&mut buf) {
            Frame::Done(f) => {
                let _ = array_items(&f);
                // Split the frame's bytes at a point taken from its length.
                let cut = f.len() / 2;
                let mut scanner = FrameScanner::default();
                let (used, done) = scanner.scan(&rest[..cut]).expect("a parsed frame scans");
                let (more, done) = if done { (0, true) } else { scanner.scan(&rest[used..]).expect("a parsed frame scans") };
                assert!(done, "scanner did not finish a frame the parser took");
                assert_eq!(used + more, f.len(), "scanner and parser disagree on the frame end");
            }
            Frame::Incomplete | Frame::Invalid(_) => break,
        }
    }
});
