//! The commands every new connection to a Redis pool's servers runs first:
//! `AUTH` as the pool's `server_user` with `server_password` (or with its
//! `redis_auth`), `SELECT` of its `redis_db`.

use bytes::BytesMut;

use super::resp::{encode_array, WHOLE};
use crate::backend::Setup;

/// The dialects of a Redis pool's server connections: RESP2 (for clients
/// that speak it, the default) and RESP3 (for clients that said `HELLO 3`),
/// each with its set-up.
/// `login`: the user and password the proxy logs in as.
pub(crate) fn dialects(login: Option<(&str, &str)>, db: u32) -> Vec<Option<Setup>> {
    vec![setup(login, db, false), setup(login, db, true)]
}

/// The set-up for a pool's server connections (`None`: nothing to send).
pub(crate) fn setup(login: Option<(&str, &str)>, db: u32, resp3: bool) -> Option<Setup> {
    let mut requests = Vec::new();
    let mut frame = |args: &[&[u8]]| {
        let mut out = BytesMut::new();
        encode_array(&mut out, args.iter().copied());
        requests.push(out.freeze());
    };
    match (login, resp3) {
        (Some((user, pw)), true) => frame(&[b"HELLO", b"3", b"AUTH", user.as_bytes(), pw.as_bytes()]),
        (None, true) => frame(&[b"HELLO", b"3"]),
        // `AUTH pw` alone works on servers before Redis 6 (no ACLs).
        (Some(("default", pw)), false) => frame(&[b"AUTH", pw.as_bytes()]),
        (Some((user, pw)), false) => frame(&[b"AUTH", user.as_bytes(), pw.as_bytes()]),
        (None, false) => {}
    }
    if db > 0 {
        frame(&[b"SELECT", db.to_string().as_bytes()]);
    }
    (!requests.is_empty()).then_some(Setup { requests, framing: WHOLE, check })
}

/// Each set-up command must be answered with a status (`+OK`), or a map
/// (`HELLO 3`'s).
fn check(reply: &[u8]) -> Result<(), String> {
    if reply.starts_with(b"+") || reply.starts_with(b"%") {
        Ok(())
    } else {
        Err(format!("server refused the connection set-up: {}", String::from_utf8_lossy(reply).trim_end()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_then_select() {
        assert!(setup(None, 0, false).is_none());
        assert_eq!(&setup(None, 0, true).unwrap().requests[0][..], b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n");
        let s = setup(Some(("default", "pw")), 3, false).unwrap();
        assert_eq!(&s.requests[0][..], b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n");
        assert_eq!(&s.requests[1][..], b"*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n");
        let acl = setup(Some(("proxy", "pw")), 0, false).unwrap();
        assert_eq!(&acl.requests[0][..], b"*3\r\n$4\r\nAUTH\r\n$5\r\nproxy\r\n$2\r\npw\r\n");
        let hello = setup(Some(("proxy", "pw")), 0, true).unwrap();
        assert!(hello.requests[0].windows(5).any(|w| w == b"proxy"));
        assert!(check(b"+OK\r\n").is_ok());
        assert!(check(b"-WRONGPASS invalid\r\n").unwrap_err().contains("WRONGPASS"));
    }
}
