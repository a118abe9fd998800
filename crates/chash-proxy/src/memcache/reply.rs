//! Backend replies: what memcached sends back for each request, split so that
//! replies are matched to requests in order and multi-key replies can be
//! taken apart per key.

use bytes::{Buf, Bytes, BytesMut};

/// The shape of reply a request expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    /// One line (`STORED`, `DELETED`, a number, `OK`, `VERSION ...`, ...).
    Line,
    /// Zero or more `VALUE` blocks, then `END`.
    Values,
    /// One RESP frame (Redis pools), returned as [`Reply::Line`], or as
    /// [`Reply::Stream`] when it is large.
    Resp,
    /// One RESP frame that is needed whole (a part of a split command):
    /// never streamed.
    RespWhole,
}

/// One `VALUE` block of a retrieval reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    /// The key.
    pub key: Bytes,
    /// The whole block, `VALUE ...\r\n<data>\r\n`, as the backend sent it.
    pub raw: Bytes,
}

/// A reply.
#[derive(Debug)]
pub enum Reply {
    /// A one-line reply, with its `\r\n` (also an error line to a retrieval).
    Line(Bytes),
    /// A retrieval's whole reply, `VALUE` blocks and the `END` line, as sent
    /// (a single-server get is forwarded as is; [`values`] splits it).
    Values(Bytes),
    /// A large RESP reply passed on as it arrives (see [`ReplyStream`]).
    Stream(ReplyStream),
}

/// A piece of a streamed reply.
#[derive(Debug)]
pub struct Chunk {
    /// The next bytes of the reply, as the backend sent them.
    pub data: Bytes,
    /// Whether they end it.
    pub last: bool,
}

/// A large reply on its way from a backend, a chunk at a time (a few
/// chunks are buffered; the backend connection waits for the client). A
/// channel that closes before the `last` chunk means the reply was cut
/// short: the client has part of a frame and its connection must close.
#[derive(Debug)]
pub struct ReplyStream(pub tokio::sync::mpsc::Receiver<Chunk>);

/// The `VALUE` blocks of a complete retrieval reply.
pub fn values(raw: &Bytes) -> Vec<Value> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(i) = raw[pos..].iter().position(|&b| b == b'\n') {
        let end = pos + i + 1;
        let line = trim_crlf(&raw[pos..end]);
        let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
        let (Some(b"VALUE"), Some(key), Some(_), Some(len)) = (words.next(), words.next(), words.next(), words.next())
        else {
            break;
        };
        let Some(len) = std::str::from_utf8(len).ok().and_then(|l| l.parse::<usize>().ok()) else { break };
        let key_start = key.as_ptr() as usize - raw.as_ptr() as usize;
        let block_end = (end + len + 2).min(raw.len());
        out.push(Value { key: raw.slice(key_start..key_start + key.len()), raw: raw.slice(pos..block_end) });
        pos = block_end;
    }
    out
}

/// What the parser made of the front of a backend's byte stream.
#[derive(Debug)]
pub enum ReplyParse {
    /// A whole reply; its bytes have been taken.
    Done(Reply),
    /// More bytes are needed.
    Incomplete,
    /// The backend sent something that is not a memcached reply.
    Invalid(String),
}

const MAX_REPLY_LINE: usize = 64 * 1024;

fn is_error_line(line: &[u8]) -> bool {
    line == b"ERROR" || line.starts_with(b"CLIENT_ERROR") || line.starts_with(b"SERVER_ERROR")
}

/// Parses one reply of `kind` from the front of `buf`, taking its bytes when
/// it is complete.
pub fn parse_reply(buf: &mut BytesMut, kind: ReplyKind) -> ReplyParse {
    match kind {
        ReplyKind::Line => match line_at(buf, 0) {
            Some(Ok(end)) => ReplyParse::Done(Reply::Line(buf.split_to(end).freeze())),
            Some(Err(e)) => ReplyParse::Invalid(e),
            None => ReplyParse::Incomplete,
        },
        ReplyKind::Values => values_reply(buf),
        ReplyKind::Resp | ReplyKind::RespWhole => match crate::redis::resp::parse_reply(buf) {
            crate::redis::resp::Frame::Done(f) => ReplyParse::Done(Reply::Line(f)),
            crate::redis::resp::Frame::Incomplete => ReplyParse::Incomplete,
            crate::redis::resp::Frame::Invalid(e) => ReplyParse::Invalid(e),
        },
    }
}

/// End (after `\n`) of the line starting at `from`.
fn line_at(buf: &[u8], from: usize) -> Option<Result<usize, String>> {
    match buf[from..].iter().position(|&b| b == b'\n') {
        Some(i) => Some(Ok(from + i + 1)),
        None if buf.len() - from > MAX_REPLY_LINE => Some(Err("reply line too long".into())),
        None => None,
    }
}

fn values_reply(buf: &mut BytesMut) -> ReplyParse {
    // Find the end of the whole reply without consuming; then take it.
    let mut pos = 0;
    let mut first = true;
    loop {
        let end = match line_at(buf, pos) {
            Some(Ok(end)) => end,
            Some(Err(e)) => return ReplyParse::Invalid(e),
            None => return ReplyParse::Incomplete,
        };
        let line = trim_crlf(&buf[pos..end]);
        if line == b"END" {
            return ReplyParse::Done(Reply::Values(buf.split_to(end).freeze()));
        }
        if first && is_error_line(line) {
            return ReplyParse::Done(Reply::Line(buf.split_to(end).freeze()));
        }
        first = false;
        let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
        let (Some(b"VALUE"), Some(_key), Some(_flags), Some(len)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return ReplyParse::Invalid(format!("unexpected reply line {:?}", String::from_utf8_lossy(line)));
        };
        let Some(len) = std::str::from_utf8(len).ok().and_then(|l| l.parse::<usize>().ok()) else {
            return ReplyParse::Invalid("bad VALUE length".into());
        };
        let block_end = end + len + 2;
        if buf.len() < block_end {
            buf.reserve(block_end - buf.len());
            return ReplyParse::Incomplete;
        }
        if &buf[end + len..block_end] != b"\r\n" {
            return ReplyParse::Invalid("VALUE data not followed by CRLF".into());
        }
        pos = block_end;
    }
}

fn trim_crlf(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Whether a one-line reply is an error memcached sent.
pub fn line_is_error(line: &[u8]) -> bool {
    is_error_line(trim_crlf(line))
}

/// Skips `n` bytes of `buf` (helper for callers that consumed a reply elsewhere).
pub fn advance(buf: &mut BytesMut, n: usize) {
    buf.advance(n.min(buf.len()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_lines() {
        let mut b = BytesMut::from(&b"VALUE a 0 1\r\nx\r\nVALUE bb 3 2 77\r\nyz\r\nEND\r\nSTORED\r\n"[..]);
        let ReplyParse::Done(Reply::Values(raw)) = parse_reply(&mut b, ReplyKind::Values) else { panic!() };
        assert!(raw.ends_with(b"END\r\n"));
        let v = values(&raw);
        assert_eq!(v.len(), 2);
        assert_eq!(&v[1].key[..], b"bb");
        assert_eq!(&v[1].raw[..], b"VALUE bb 3 2 77\r\nyz\r\n");
        assert!(
            matches!(parse_reply(&mut b, ReplyKind::Line), ReplyParse::Done(Reply::Line(l)) if &l[..] == b"STORED\r\n")
        );
        let mut b = BytesMut::from(&b"VALUE a 0 5\r\nxy"[..]);
        assert!(matches!(parse_reply(&mut b, ReplyKind::Values), ReplyParse::Incomplete));
        assert_eq!(b.len(), 15, "nothing consumed");
        let mut b = BytesMut::from(&b"SERVER_ERROR out of memory\r\n"[..]);
        assert!(matches!(parse_reply(&mut b, ReplyKind::Values), ReplyParse::Done(Reply::Line(_))));
        let mut b = BytesMut::from(&b"HELLO\r\n"[..]);
        assert!(matches!(parse_reply(&mut b, ReplyKind::Values), ReplyParse::Invalid(_)));
    }
}
