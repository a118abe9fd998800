//! The commands every new connection to a Redis pool's servers runs first:
//! `AUTH` with the pool's `redis_auth`, `SELECT` of its `redis_db`.

use bytes::BytesMut;

use super::resp::{encode_array, WHOLE};
use crate::backend::Setup;

/// The set-up for a pool's server connections (`None`: nothing to send).
pub(crate) fn setup(auth: Option<&str>, db: u32) -> Option<Setup> {
    let mut requests = Vec::new();
    let mut frame = |args: &[&[u8]]| {
        let mut out = BytesMut::new();
        encode_array(&mut out, args.iter().copied());
        requests.push(out.freeze());
    };
    if let Some(pw) = auth {
        frame(&[b"AUTH", pw.as_bytes()]);
    }
    if db > 0 {
        frame(&[b"SELECT", db.to_string().as_bytes()]);
    }
    (!requests.is_empty()).then_some(Setup { requests, framing: WHOLE, check })
}

/// Each set-up command must be answered with a status (`+OK`).
fn check(reply: &[u8]) -> Result<(), String> {
    if reply.starts_with(b"+") {
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
        assert!(setup(None, 0).is_none());
        let s = setup(Some("pw"), 3).unwrap();
        assert_eq!(&s.requests[0][..], b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n");
        assert_eq!(&s.requests[1][..], b"*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n");
        assert!(check(b"+OK\r\n").is_ok());
        assert!(check(b"-WRONGPASS invalid\r\n").unwrap_err().contains("WRONGPASS"));
    }
}
