//! A plain RESP2 connection for the Sentinel watcher: to a Sentinel (its
//! questions and its event channel) or to a server (`ROLE`, `INFO`).
//! One command at a time, each within a time limit.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::backend::Frame;
use crate::redis::resp::{array_items, encode_array, parse_reply};

/// How long one connection attempt or one command may take.
pub(super) const ASK_LIMIT: Duration = Duration::from_millis(500);

/// A connection to a Sentinel or a server.
pub(super) struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    /// Connects to `addr`, logging in with `login` (`user`, `password`)
    /// when given.
    pub(super) async fn open(addr: &str, login: Option<(&str, &str)>) -> Result<Conn, String> {
        let connecting = TcpStream::connect(addr);
        let stream = match tokio::time::timeout(ASK_LIMIT, connecting).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("{addr}: {e}")),
            Err(_) => return Err(format!("{addr}: connect timed out")),
        };
        let _ = stream.set_nodelay(true);
        let mut conn = Conn { stream, buf: BytesMut::with_capacity(4096) };
        if let Some((user, password)) = login {
            let reply = match user {
                "default" => conn.ask(&[b"AUTH", password.as_bytes()]).await?,
                user => conn.ask(&[b"AUTH", user.as_bytes(), password.as_bytes()]).await?,
            };
            if !reply.starts_with(b"+") {
                return Err(format!("{addr}: AUTH refused: {}", text(&reply)));
            }
        }
        Ok(conn)
    }

    /// Sends a command and reads its reply.
    pub(super) async fn ask(&mut self, args: &[&[u8]]) -> Result<Bytes, String> {
        let mut out = BytesMut::new();
        encode_array(&mut out, args.iter().copied());
        match tokio::time::timeout(ASK_LIMIT, self.stream.write_all(&out)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("write timed out".into()),
        }
        match tokio::time::timeout(ASK_LIMIT, self.next()).await {
            Ok(r) => r,
            Err(_) => Err("reply timed out".into()),
        }
    }

    /// Sends a command without waiting for a reply.
    pub(super) async fn send(&mut self, args: &[&[u8]]) -> Result<(), String> {
        let mut out = BytesMut::new();
        encode_array(&mut out, args.iter().copied());
        self.stream.write_all(&out).await.map_err(|e| e.to_string())
    }

    /// The next reply or message, however long it takes.
    pub(super) async fn next(&mut self) -> Result<Bytes, String> {
        loop {
            match parse_reply(&mut self.buf) {
                Frame::Done(reply) => return Ok(reply),
                Frame::Invalid(e) => return Err(e),
                Frame::Incomplete => {}
            }
            if self.buf.len() > 16 << 20 {
                return Err("reply over 16 MiB".into());
            }
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) => return Err("connection closed".into()),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

/// A reply as text, for messages.
pub(super) fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).trim_end().to_owned()
}

/// The content of a bulk or simple string frame.
pub(super) fn string(frame: &[u8]) -> Option<String> {
    let body = match frame.first()? {
        b'$' => {
            let nl = frame.iter().position(|&b| b == b'\n')?;
            frame.get(nl + 1..frame.len().checked_sub(2)?)?
        }
        b'+' => frame.get(1..frame.len().checked_sub(2)?)?,
        _ => return None,
    };
    Some(String::from_utf8_lossy(body).into_owned())
}

/// An array of strings (`None` if the frame is not one).
pub(super) fn strings(frame: &Bytes) -> Option<Vec<String>> {
    array_items(frame)?.iter().map(|f| string(f)).collect()
}

/// A flat array of field, value, field, value ... (Sentinel's replies
/// about an instance) as pairs.
pub(super) fn fields(frame: &Bytes) -> Option<Vec<(String, String)>> {
    let items = strings(frame)?;
    Some(items.chunks_exact(2).map(|p| (p[0].clone(), p[1].clone())).collect())
}

/// A field's value.
pub(super) fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_decode() {
        let f = Bytes::from_static(b"*4\r\n$4\r\nname\r\n$2\r\ng1\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n");
        let pairs = fields(&f).unwrap();
        assert_eq!(field(&pairs, "ip"), Some("127.0.0.1"));
        assert_eq!(field(&pairs, "port"), None);
        assert_eq!(string(b"+OK\r\n").as_deref(), Some("OK"));
        assert_eq!(strings(&Bytes::from_static(b":1\r\n")), None);
    }
}
