//! The request parser's tests.

use super::*;

fn parse(input: &[u8]) -> (Parsed, usize) {
    let mut buf = BytesMut::from(input);
    let p = parse_request(&mut buf, Limits { max_value: 1024, lenient_keys: false });
    (p, buf.len())
}

#[test]
fn storage_commands() {
    let (p, rest) = parse(b"set k 5 0 3\r\nabc\r\nget k\r\n");
    assert_eq!(
        p,
        Parsed::Request(Request::Storage {
            cmd: StorageCmd::Set,
            key: Bytes::from_static(b"k"),
            flags: 5,
            exptime: 0,
            data: Bytes::from_static(b"abc"),
            cas: 0,
            noreply: false
        })
    );
    assert_eq!(rest, 7);
    assert_eq!(parse(b"set k 0 0 3\r\nab").0, Parsed::Incomplete);
    let (p, _) = parse(b"cas k 0 0 1 99 noreply\r\nx\r\n");
    assert!(matches!(p, Parsed::Request(Request::Storage { cas: 99, noreply: true, .. })));
    let mut enc = BytesMut::new();
    if let Parsed::Request(r) = p {
        r.encode(&mut enc);
    }
    assert_eq!(&enc[..], b"cas k 0 0 1 99\r\nx\r\n");
}

#[test]
fn refusals() {
    let too_long_key = format!("set {} 0 0 1\r\nx\r\n", "k".repeat(251));
    assert_eq!(parse(too_long_key.as_bytes()).0, Parsed::Refused { reply: BAD_FORMAT, skip: 3, close: false });
    // A set's refusal takes the key's old value with it; add's does not.
    let delete = Request::Delete { key: Bytes::from_static(b"k"), noreply: false };
    assert_eq!(parse(b"set k 0 0 4096\r\n").0, Parsed::TooLarge { delete: delete.clone(), skip: 4098, noreply: false });
    assert_eq!(parse(b"set k 0 0 4096 noreply\r\n").0, Parsed::TooLarge { delete, skip: 4098, noreply: true });
    assert_eq!(parse(b"add k 0 0 4096\r\n").0, Parsed::Refused { reply: TOO_LARGE, skip: 4098, close: false });
    assert_eq!(parse(b"GET / HTTP/1.1\r\n").0, Parsed::Refused { reply: b"", skip: 0, close: true });
    assert_eq!(parse(b"Host: cache\r\n").0, Parsed::Refused { reply: b"", skip: 0, close: true });
    assert_eq!(parse(b"set k 0 0 -1\r\n").0, refused(BAD_FORMAT));
    assert_eq!(parse(b"set k 0 0 1\r\nxyz\r\n"), (refused(BAD_CHUNK), 2));
    assert_eq!(parse(b"bogus\r\n").0, refused(ERROR));
    assert_eq!(parse(b"\r\n").0, refused(ERROR));
    assert_eq!(parse(b"get\r\n").0, refused(ERROR));
    assert_eq!(parse(b"get a\x01b\r\n").0, refused(BAD_FORMAT));
    assert_eq!(parse(b"incr k x\r\n").0, refused(b"CLIENT_ERROR invalid numeric delta argument\r\n"));
    // noreply: no reply at all, not even an error (memcached's rule).
    assert_eq!(parse(b"add k 0 0 4096 noreply\r\n").0, Parsed::Refused { reply: b"", skip: 4098, close: false });
    assert_eq!(parse(b"set k 0 0 1 noreply\r\nxyz\r\n"), (Parsed::Refused { reply: b"", skip: 0, close: false }, 2));
    assert_eq!(parse(b"incr k x noreply\r\n").0, Parsed::Refused { reply: b"", skip: 0, close: false });
    let mut huge = BytesMut::from(&vec![b'a'; MAX_LINE + 1][..]);
    assert!(matches!(parse_request(&mut huge, Limits::default()), Parsed::Refused { close: true, .. }));
    let mut huge = BytesMut::from(format!("get {}", "k".repeat(MAX_LINE)).as_bytes());
    assert_eq!(parse_request(&mut huge, Limits::default()), Parsed::RefusedLine { reply: BAD_FORMAT });
    let mut lenient = BytesMut::from(&b"get \x10k\r\n"[..]);
    let limits = Limits { lenient_keys: true, ..Limits::default() };
    assert!(matches!(parse_request(&mut lenient, limits), Parsed::Request(Request::Retrieval { .. })));
}

/// A get line longer than a segment comes in pieces that together hold
/// every key once, in order, however the bytes arrive.
#[test]
fn long_get_lines_come_in_segments() {
    let keys: Vec<String> = (0..3000).map(|i| format!("key:{i:05}:{}", "x".repeat(i % 40))).collect();
    for cmd in ["get", "gats 60"] {
        let line = format!("{cmd} {}\r\nversion\r\n", keys.join(" "));
        for piece in [4096, 70_000, line.len()] {
            let mut buf = BytesMut::new();
            let mut got: Vec<Bytes> = Vec::new();
            let mut segments = 0;
            let mut continuing: Option<(RetrievalCmd, i64)> = None;
            let mut rest = line.as_bytes();
            let mut after = None;
            while after.is_none() {
                let take = piece.min(rest.len());
                buf.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                loop {
                    let parsed = match continuing {
                        Some((c, t)) => parse_more_keys(&mut buf, c, t, Limits::default()),
                        None => parse_request(&mut buf, Limits::default()),
                    };
                    match parsed {
                        Parsed::Partial(Request::Retrieval { cmd, exptime, keys }) => {
                            let bytes = keys.iter().map(|k| k.len() + 1).sum::<usize>();
                            assert!(bytes <= MAX_LINE + piece, "a segment is about one buffer: {bytes}");
                            continuing = Some((cmd, exptime));
                            got.extend(keys);
                            segments += 1;
                        }
                        Parsed::Request(Request::Retrieval { keys, .. }) if after.is_none() => {
                            continuing = None;
                            got.extend(keys);
                            segments += 1;
                            after = Some(parse_request(&mut buf, Limits::default()));
                            break;
                        }
                        Parsed::Incomplete => break,
                        other => panic!("{other:?}"),
                    }
                }
            }
            assert_eq!(after, Some(Parsed::Request(Request::Version)), "{cmd} in pieces of {piece}");
            let got: Vec<&[u8]> = got.iter().map(|k| &k[..]).collect();
            let want: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
            assert!(got == want, "{cmd} in pieces of {piece}: keys differ");
            assert!(segments > 1 || piece == line.len(), "{cmd}: {segments} segments");
        }
    }
}

#[test]
fn retrieval_and_others() {
    let (p, _) = parse(b"gat 100 a b a\r\n");
    assert_eq!(
        p,
        Parsed::Request(Request::Retrieval {
            cmd: RetrievalCmd::Gat,
            exptime: 100,
            keys: vec![Bytes::from_static(b"a"), Bytes::from_static(b"b"), Bytes::from_static(b"a")]
        })
    );
    assert_eq!(parse(b"delete k noreply\r\n").0, Parsed::Request(Request::Delete { key: "k".into(), noreply: true }));
    assert_eq!(parse(b"delete k 0\r\n").0, Parsed::Request(Request::Delete { key: "k".into(), noreply: false }));
    assert_eq!(parse(b"flush_all 10\n").0, Parsed::Request(Request::FlushAll { delay: Some(10), noreply: false }));
    assert_eq!(parse(b"verbosity 1 noreply\r\n").0, Parsed::Request(Request::Verbosity { noreply: true }));
    assert_eq!(parse(b"quit\r\n").0, Parsed::Request(Request::Quit));
}
