//! Server replies: what memcached sends back for each request, framed so
//! that replies are matched to requests in order (the backend's
//! [`Framing`] for a one-line reply and for a retrieval's `VALUE` blocks),
//! and taken apart per key for multi-key gets.

use bytes::{Bytes, BytesMut};

use crate::backend::{Frame, Framing, Large, Scan};

/// One `VALUE` block of a retrieval reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    /// The key.
    pub key: Bytes,
    /// The whole block, `VALUE ...\r\n<data>\r\n`, as the server sent it.
    pub raw: Bytes,
}

/// The framing of a one-line reply (`STORED`, `DELETED`, a number, `OK`,
/// `VERSION ...`, an error line, ...).
pub const LINE: &dyn Framing = &Line;

/// The framing of a retrieval's reply: zero or more `VALUE` blocks, then
/// `END` (or one error line).
pub const VALUES: &dyn Framing = &Values;

/// The framing of a meta command's reply: one line (`HD ...`, `EN`,
/// `NF`, `NS`, `EX`, `ME ...`, an error), or `VA <size> ...` and its data.
pub const META: &dyn Framing = &Meta;

/// The framing of a quiet meta request sent with `mn` after it: whatever
/// replies come (none, when the server left its reply out), up to and
/// including `MN`.
pub const META_TO_MN: &dyn Framing = &MetaToMn;

/// The framing of a multi-get's part (one server's share of the keys):
/// as [`VALUES`], but a reply still incomplete past
/// [`STREAM_VALUES_AFTER`] bytes is passed on as it arrives (scanned by
/// [`ValuesScan`]), so a multi-get of large values is never held whole.
pub const VALUES_STREAMED: &dyn Framing = &ValuesStreamed;

/// Bytes of a multi-get part buffered before it is streamed.
pub const STREAM_VALUES_AFTER: usize = 256 * 1024;

struct Line;
struct Values;
struct ValuesStreamed;
struct Meta;
struct MetaToMn;

impl Framing for Meta {
    fn parse(&self, buf: &mut BytesMut) -> Frame {
        match meta_reply_end(buf, 0) {
            Ok(Some(end)) => Frame::Done(buf.split_to(end).freeze()),
            Ok(None) => Frame::Incomplete,
            Err(e) => Frame::Invalid(e),
        }
    }
}

impl Framing for MetaToMn {
    fn parse(&self, buf: &mut BytesMut) -> Frame {
        let mut pos = 0;
        loop {
            match meta_reply_end(buf, pos) {
                Ok(Some(end)) if &buf[pos..end] == b"MN\r\n" => return Frame::Done(buf.split_to(end).freeze()),
                Ok(Some(end)) => pos = end,
                Ok(None) => return Frame::Incomplete,
                Err(e) => return Frame::Invalid(e),
            }
        }
    }
}

/// The end of the meta reply starting at `from`, when it is all there.
fn meta_reply_end(buf: &mut BytesMut, from: usize) -> Result<Option<usize>, String> {
    let end = match line_at(buf, from) {
        Some(Ok(end)) => end,
        Some(Err(e)) => return Err(e),
        None => return Ok(None),
    };
    let line = &buf[from..end];
    if !line.starts_with(b"VA ") {
        return Ok(Some(end));
    }
    let len = trim_crlf(line)[3..].split(|&b| b == b' ').next().and_then(|l| std::str::from_utf8(l).ok());
    let Some(len) = len.and_then(|l| l.parse::<usize>().ok()).filter(|&l| l <= MAX_VALUE_LEN) else {
        return Err("bad VA length".into());
    };
    let block_end = end + len + 2;
    if buf.len() < block_end {
        reserve_for(buf, block_end);
        return Ok(None);
    }
    if &buf[end + len..block_end] != b"\r\n" {
        return Err("VA data not followed by CRLF".into());
    }
    Ok(Some(block_end))
}

impl Framing for Line {
    fn parse(&self, buf: &mut BytesMut) -> Frame {
        match line_at(buf, 0) {
            Some(Ok(end)) => Frame::Done(buf.split_to(end).freeze()),
            Some(Err(e)) => Frame::Invalid(e),
            None => Frame::Incomplete,
        }
    }
}

impl Framing for Values {
    fn parse(&self, buf: &mut BytesMut) -> Frame {
        values_reply(buf)
    }
}

impl Framing for ValuesStreamed {
    fn parse(&self, buf: &mut BytesMut) -> Frame {
        values_reply(buf)
    }

    fn large(&self) -> Large {
        Large::Stream { after: STREAM_VALUES_AFTER }
    }

    fn scanner(&self) -> Option<Box<dyn Scan>> {
        Some(Box::new(ValuesScan::default()))
    }
}

/// Finds the end of a retrieval reply fed a piece at a time, and where its
/// `VALUE` blocks begin and end (a multi-get's streamed parts are
/// interleaved at those boundaries).
#[derive(Debug, Default)]
pub struct ValuesScan {
    /// Bytes of the current block's data (and its `\r\n`) still to come.
    data_left: usize,
    /// Whether a line has been seen (an error line ends only a reply that
    /// starts with it).
    started: bool,
    /// `VALUE` blocks seen.
    values: u64,
}

impl ValuesScan {
    /// Whether the bytes scanned so far end between two blocks.
    pub fn at_boundary(&self) -> bool {
        self.data_left == 0
    }

    /// `VALUE` blocks seen so far.
    pub fn values(&self) -> u64 {
        self.values
    }
}

impl Scan for ValuesScan {
    fn scan(&mut self, buf: &[u8]) -> Result<(usize, bool), String> {
        let mut pos = 0;
        loop {
            if self.data_left > 0 {
                let take = self.data_left.min(buf.len() - pos);
                pos += take;
                self.data_left -= take;
                if self.data_left > 0 {
                    return Ok((pos, false));
                }
            }
            let end = match line_at(buf, pos) {
                Some(Ok(end)) => end,
                Some(Err(e)) => return Err(e),
                // A line split across reads: left for the next call.
                None => return Ok((pos, false)),
            };
            let line = trim_crlf(&buf[pos..end]);
            if line == b"END" || (!self.started && is_error_line(line)) {
                return Ok((end, true));
            }
            self.started = true;
            let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
            let (Some(b"VALUE"), Some(_key), Some(_flags), Some(len)) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return Err(format!("unexpected reply line {:?}", String::from_utf8_lossy(line)));
            };
            let len = std::str::from_utf8(len).ok().and_then(|l| l.parse::<usize>().ok());
            let Some(len) = len.filter(|&l| l <= MAX_VALUE_LEN) else { return Err("bad VALUE length".into()) };
            self.values += 1;
            self.data_left = len + 2;
            pos = end;
        }
    }
}

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

/// Whether a complete retrieval reply is `VALUE` blocks and `END` (rather
/// than an error line).
pub fn is_values(reply: &[u8]) -> bool {
    reply.starts_with(b"VALUE ") || reply == b"END\r\n"
}

/// Whether a retrieval reply carries at least one value.
pub fn has_values(reply: &[u8]) -> bool {
    reply.starts_with(b"VALUE ")
}

const MAX_REPLY_LINE: usize = 64 * 1024;

/// The largest value a memcached server can hold (`-I` goes up to 1 GiB):
/// a reply announcing more is not from a memcached.
const MAX_VALUE_LEN: usize = 1 << 30;

/// Makes room for a reply of `end` bytes as it arrives: at most 1 MiB
/// ahead, so that what a server announces is not allocated before it is
/// sent.
fn reserve_for(buf: &mut BytesMut, end: usize) {
    buf.reserve((end - buf.len()).min(1 << 20));
}

fn is_error_line(line: &[u8]) -> bool {
    line == b"ERROR" || line.starts_with(b"CLIENT_ERROR") || line.starts_with(b"SERVER_ERROR")
}

/// End (after `\n`) of the line starting at `from`.
fn line_at(buf: &[u8], from: usize) -> Option<Result<usize, String>> {
    match buf[from..].iter().position(|&b| b == b'\n') {
        Some(i) => Some(Ok(from + i + 1)),
        None if buf.len() - from > MAX_REPLY_LINE => Some(Err("reply line too long".into())),
        None => None,
    }
}

fn values_reply(buf: &mut BytesMut) -> Frame {
    // Find the end of the whole reply without consuming; then take it.
    let mut pos = 0;
    let mut first = true;
    loop {
        let end = match line_at(buf, pos) {
            Some(Ok(end)) => end,
            Some(Err(e)) => return Frame::Invalid(e),
            None => return Frame::Incomplete,
        };
        let line = trim_crlf(&buf[pos..end]);
        if line == b"END" || (first && is_error_line(line)) {
            return Frame::Done(buf.split_to(end).freeze());
        }
        first = false;
        let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
        let (Some(b"VALUE"), Some(_key), Some(_flags), Some(len)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return Frame::Invalid(format!("unexpected reply line {:?}", String::from_utf8_lossy(line)));
        };
        let len = std::str::from_utf8(len).ok().and_then(|l| l.parse::<usize>().ok());
        let Some(len) = len.filter(|&l| l <= MAX_VALUE_LEN) else {
            return Frame::Invalid("bad VALUE length".into());
        };
        let block_end = end + len + 2;
        if buf.len() < block_end {
            reserve_for(buf, block_end);
            return Frame::Incomplete;
        }
        if &buf[end + len..block_end] != b"\r\n" {
            return Frame::Invalid("VALUE data not followed by CRLF".into());
        }
        pos = block_end;
    }
}

fn trim_crlf(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_lines() {
        let mut b = BytesMut::from(&b"VALUE a 0 1\r\nx\r\nVALUE bb 3 2 77\r\nyz\r\nEND\r\nSTORED\r\n"[..]);
        let Frame::Done(raw) = VALUES.parse(&mut b) else { panic!() };
        assert!(raw.ends_with(b"END\r\n") && is_values(&raw) && has_values(&raw));
        let v = values(&raw);
        assert_eq!(v.len(), 2);
        assert_eq!(&v[1].key[..], b"bb");
        assert_eq!(&v[1].raw[..], b"VALUE bb 3 2 77\r\nyz\r\n");
        assert_eq!(LINE.parse(&mut b), Frame::Done(Bytes::from_static(b"STORED\r\n")));
        let mut b = BytesMut::from(&b"VALUE a 0 5\r\nxy"[..]);
        assert_eq!(VALUES.parse(&mut b), Frame::Incomplete);
        assert_eq!(b.len(), 15, "nothing consumed");
        let mut b = BytesMut::from(&b"SERVER_ERROR out of memory\r\n"[..]);
        let Frame::Done(line) = VALUES.parse(&mut b) else { panic!() };
        assert!(!is_values(&line));
        let mut b = BytesMut::from(&b"HELLO\r\n"[..]);
        assert!(matches!(VALUES.parse(&mut b), Frame::Invalid(_)));
        assert!(is_values(b"END\r\n") && !has_values(b"END\r\n"));
    }

    /// The streaming scanner ends a reply where the whole-reply parser
    /// does, fed it at every split, and knows its block boundaries.
    #[test]
    fn values_scan_agrees_with_the_parser_at_every_split() {
        let reply = b"VALUE a 0 3\r\nx\r\n\r\nVALUE bb 3 2 77\r\nyz\r\nEND\r\n";
        for split in 0..=reply.len() {
            let mut scan = ValuesScan::default();
            let (first, second) = reply.split_at(split);
            let (used, last) = scan.scan(first).unwrap();
            assert!(!last || used == reply.len());
            let mut rest = first[used..].to_vec();
            rest.extend_from_slice(second);
            let (more, last) = if last { (0, true) } else { scan.scan(&rest).unwrap() };
            assert!(last, "split at {split}");
            assert_eq!(used + more, reply.len(), "split at {split}");
            assert!(scan.at_boundary());
            assert_eq!(scan.values(), 2);
        }
        let mut scan = ValuesScan::default();
        assert_eq!(scan.scan(b"VALUE a 0 10\r\n0123").unwrap(), (18, false));
        assert!(!scan.at_boundary());
        assert_eq!(scan.scan(b"456789\r\nVALUE").unwrap(), (8, false));
        assert!(scan.at_boundary(), "a header split across reads is left for the next call");
        assert!(ValuesScan::default().scan(b"HELLO\r\n").is_err());
        assert_eq!(ValuesScan::default().scan(b"SERVER_ERROR x\r\n").unwrap(), (16, true));
    }

    #[test]
    fn meta_replies() {
        let mut b = BytesMut::from(&b"VA 2 c5 O1\r\nhi\r\nEN\r\nHD W\r\nMN\r\nVA 3\r\nab"[..]);
        assert_eq!(META.parse(&mut b), Frame::Done(Bytes::from_static(b"VA 2 c5 O1\r\nhi\r\n")));
        assert_eq!(META.parse(&mut b), Frame::Done(Bytes::from_static(b"EN\r\n")));
        assert_eq!(META_TO_MN.parse(&mut b), Frame::Done(Bytes::from_static(b"HD W\r\nMN\r\n")));
        assert_eq!(META.parse(&mut b), Frame::Incomplete);
        let mut b = BytesMut::from(&b"VA x\r\n"[..]);
        assert!(matches!(META.parse(&mut b), Frame::Invalid(_)));
        let mut b = BytesMut::from(&b"VA 1\r\nxyz"[..]);
        assert!(matches!(META.parse(&mut b), Frame::Invalid(_)));
        // A length no memcached sends (found by fuzzing: it was allocated).
        let mut b = BytesMut::from(&b"VA 211444444444\n2"[..]);
        assert!(matches!(META.parse(&mut b), Frame::Invalid(_)));
        let mut b = BytesMut::from(&b"VALUE k 0 211444444\r\nx"[..]);
        assert_eq!(VALUES.parse(&mut b), Frame::Incomplete);
        assert!(b.capacity() < 4 << 20, "room for what came, not for what was announced");
    }
}
