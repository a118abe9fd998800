//! Client requests: a cheap scan for a complete line, then a parse of that
//! line, then (for storage commands) the data block.
//!
//! The parser never allocates more than the request itself needs: a storage
//! command's data is only buffered when it fits the configured maximum; a
//! larger one is answered at once and its bytes are skipped as they arrive.
//! A get line of any length is taken a segment at a time
//! ([`Parsed::Partial`], then [`parse_more_keys`]), so it is never held
//! whole.

use bytes::{Buf, Bytes, BytesMut};

use super::errors::{BAD_CHUNK, BAD_EXPTIME, BAD_FORMAT, ERROR, TOO_LARGE};
use super::meta::{parse_meta, MetaCmd, MetaParsed, MetaRequest};

/// Default largest value accepted from memcached clients (memcached's
/// default item size).
pub const DEFAULT_MAX_VALUE: usize = 1024 * 1024;

/// memcached's key length limit.
pub const MAX_KEY_LEN: usize = 250;

/// A command line longer than this without `\r\n` is refused and the
/// connection closed, unless it is a get line: those are taken in segments
/// of about this size.
pub const MAX_LINE: usize = 64 * 1024;

/// `set`, `add`, `replace`, `append`, `prepend`, `cas`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageCmd {
    /// `set`
    Set,
    /// `add`
    Add,
    /// `replace`
    Replace,
    /// `append`
    Append,
    /// `prepend`
    Prepend,
    /// `cas`
    Cas,
}

impl StorageCmd {
    /// The command word.
    pub fn name(self) -> &'static str {
        match self {
            StorageCmd::Set => "set",
            StorageCmd::Add => "add",
            StorageCmd::Replace => "replace",
            StorageCmd::Append => "append",
            StorageCmd::Prepend => "prepend",
            StorageCmd::Cas => "cas",
        }
    }
}

/// `get`, `gets`, `gat`, `gats`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetrievalCmd {
    /// `get`
    Get,
    /// `gets` (values carry their cas unique)
    Gets,
    /// `gat` (get and touch)
    Gat,
    /// `gats`
    Gats,
}

impl RetrievalCmd {
    /// The command word.
    pub fn name(self) -> &'static str {
        match self {
            RetrievalCmd::Get => "get",
            RetrievalCmd::Gets => "gets",
            RetrievalCmd::Gat => "gat",
            RetrievalCmd::Gats => "gats",
        }
    }

    /// Whether values carry a cas unique.
    pub fn with_cas(self) -> bool {
        matches!(self, RetrievalCmd::Gets | RetrievalCmd::Gats)
    }
}

/// `incr` or `decr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithOp {
    /// `incr`
    Incr,
    /// `decr`
    Decr,
}

/// One client request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// A storage command with its data block.
    Storage {
        /// Which one.
        cmd: StorageCmd,
        /// The key.
        key: Bytes,
        /// Opaque client flags.
        flags: u32,
        /// Expiration time as sent.
        exptime: i64,
        /// The value.
        data: Bytes,
        /// The cas unique (`cas` only).
        cas: u64,
        /// Whether the client wants no reply.
        noreply: bool,
    },
    /// A retrieval command.
    Retrieval {
        /// Which one.
        cmd: RetrievalCmd,
        /// Expiration time for `gat`/`gats`.
        exptime: i64,
        /// The keys, in the client's order (duplicates kept).
        keys: Vec<Bytes>,
    },
    /// `delete <key> [noreply]`
    Delete {
        /// The key.
        key: Bytes,
        /// No reply wanted.
        noreply: bool,
    },
    /// `incr`/`decr <key> <value> [noreply]`
    Arith {
        /// Which one.
        op: ArithOp,
        /// The key.
        key: Bytes,
        /// The amount.
        delta: u64,
        /// No reply wanted.
        noreply: bool,
    },
    /// `touch <key> <exptime> [noreply]`
    Touch {
        /// The key.
        key: Bytes,
        /// New expiration time.
        exptime: i64,
        /// No reply wanted.
        noreply: bool,
    },
    /// `flush_all [delay] [noreply]`
    FlushAll {
        /// Delay in seconds, if given.
        delay: Option<i64>,
        /// No reply wanted.
        noreply: bool,
    },
    /// `version`
    Version,
    /// `verbosity <level> [noreply]`
    Verbosity {
        /// No reply wanted.
        noreply: bool,
    },
    /// `stats [group]`
    Stats {
        /// The group asked for, if any.
        group: Option<Bytes>,
    },
    /// `quit`
    Quit,
    /// A meta command (`mg`, `ms`, `md`, `ma`, `me`, `mn`).
    Meta(MetaRequest),
}

/// What the parser made of the bytes at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole request; its bytes have been taken from the buffer.
    Request(Request),
    /// More bytes are needed.
    Incomplete,
    /// A request that gets `reply` and nothing else; its line has been taken.
    /// `skip` more bytes (a refused data block) are to be discarded as they
    /// arrive; `close` asks the connection to be closed after the reply.
    Refused {
        /// The reply line, with `\r\n`.
        reply: &'static [u8],
        /// Bytes to discard after the line.
        skip: usize,
        /// Whether the connection must be closed.
        close: bool,
    },
    /// A `set` (or `ms` in set mode) whose value is over the size limit:
    /// answered `SERVER_ERROR object too large for cache` (unless
    /// `noreply`) once `delete` has removed the key's old value, as
    /// memcached does (a failed store must not leave a stale value
    /// readable); `skip` bytes of data are discarded as they arrive.
    TooLarge {
        /// The request that removes the key.
        delete: Request,
        /// Bytes to discard after the line.
        skip: usize,
        /// Whether the client wants no reply.
        noreply: bool,
    },
    /// A request that gets `reply`; the rest of its line (which has not
    /// arrived yet) is to be discarded up to and including its `\n`.
    RefusedLine {
        /// The reply line, with `\r\n`.
        reply: &'static [u8],
    },
    /// The first keys of a get line too long to take whole, as a
    /// retrieval whose reply has no `END`; its bytes have been taken. The
    /// rest of the line is parsed with [`parse_more_keys`].
    Partial(Request),
}

const LINE_TOO_LONG: &[u8] = b"CLIENT_ERROR line too long\r\n";
const BINARY: &[u8] = b"CLIENT_ERROR the binary protocol is not supported: use the text protocol (classic or meta)\r\n";

fn refused(reply: &'static [u8]) -> Parsed {
    Parsed::Refused { reply, skip: 0, close: false }
}

/// What an HTTP request line (a browser, or a server-side request forgery
/// aimed at the cache) gets: nothing, and the connection closed before
/// anything after it is read as commands. memcached closes on an unknown
/// command whose last word starts `HTTP/`; Redis on `POST` and `Host:`.
const HTTP_REFUSED: &[u8] = b"";

/// Whether an unknown command line is part of an HTTP request.
pub(crate) fn is_http_line(cmd: &[u8], last: &[u8]) -> bool {
    last.starts_with(b"HTTP/") || cmd.eq_ignore_ascii_case(b"post") || cmd.eq_ignore_ascii_case(b"host:")
}

/// What the parser accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest data block accepted; larger ones are refused and skipped.
    pub max_value: usize,
    /// Accept control bytes in keys, as memcached and twemproxy do (they
    /// only split on spaces); protocol.txt forbids them, so the default is
    /// to refuse them. Some tools (memcaslap) generate such keys.
    pub lenient_keys: bool,
}

impl Default for Limits {
    /// 1 MiB values, strict keys.
    fn default() -> Self {
        Limits { max_value: 1024 * 1024, lenient_keys: false }
    }
}

/// A key protocol.txt allows: 1 to 250 bytes, no control characters or spaces.
pub fn valid_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && key.iter().all(|&b| b > b' ' && b != 0x7f)
}

fn key_ok(key: &[u8], limits: Limits) -> bool {
    if limits.lenient_keys {
        !key.is_empty() && key.len() <= MAX_KEY_LEN
    } else {
        valid_key(key)
    }
}

fn num<T: std::str::FromStr>(word: &[u8]) -> Option<T> {
    std::str::from_utf8(word).ok()?.parse().ok()
}

/// Commands that take `noreply`.
const QUIETABLE: [&[u8]; 12] = [
    b"set",
    b"add",
    b"replace",
    b"append",
    b"prepend",
    b"cas",
    b"delete",
    b"incr",
    b"decr",
    b"touch",
    b"flush_all",
    b"verbosity",
];

/// Whether the complete line at the front of `buf` asks for no reply: then,
/// as memcached, not even an error is sent (a client that sent `noreply`
/// reads no reply for it, so one would be taken for the next request's).
fn quiet_line(buf: &[u8]) -> bool {
    let Some(nl) = memchr::memchr(b'\n', buf) else { return false };
    let line = &buf[..nl];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
    let (Some(cmd), Some(last)) = (words.next(), words.next_back()) else { return false };
    last == b"noreply" && QUIETABLE.contains(&cmd)
}

/// Parses one request from the front of `buf`, taking its bytes when it is
/// complete. A refused request that asked for no reply gets an empty one.
pub fn parse_request(buf: &mut BytesMut, limits: Limits) -> Parsed {
    let quiet = quiet_line(buf);
    match parse_line(buf, limits) {
        Parsed::Refused { skip, close: false, .. } if quiet => Parsed::Refused { reply: b"", skip, close: false },
        Parsed::TooLarge { delete, skip, .. } if quiet => Parsed::TooLarge { delete, skip, noreply: true },
        parsed => parsed,
    }
}

fn parse_line(buf: &mut BytesMut, limits: Limits) -> Parsed {
    if buf.first() == Some(&0x80) {
        // A binary-protocol request: its bytes cannot be read as text.
        buf.clear();
        return Parsed::Refused { reply: BINARY, skip: 0, close: true };
    }
    let Some(nl) = memchr::memchr(b'\n', buf) else {
        if buf.len() > MAX_LINE {
            if let Some(partial) = get_line_start(buf, limits) {
                return partial;
            }
            buf.clear();
            return Parsed::Refused { reply: LINE_TOO_LONG, skip: 0, close: true };
        }
        return Parsed::Incomplete;
    };
    // The line without "\r\n" (a bare "\n" is accepted, as memcached does).
    let line_end = if nl > 0 && buf[nl - 1] == b'\r' { nl - 1 } else { nl };
    let line_len = nl + 1;
    // One copy of the line; keys are slices of it.
    let line = Bytes::copy_from_slice(&buf[..line_end]);
    let words: Vec<&[u8]> = line.split(|&b| b == b' ').filter(|w| !w.is_empty()).collect();
    let Some(&cmd) = words.first() else {
        buf.advance(line_len);
        return refused(ERROR);
    };
    if let (2, Some(meta)) = (cmd.len(), MetaCmd::from_word(cmd)) {
        return match parse_meta(buf, meta, &line, &words, line_len, limits.max_value, limits.lenient_keys) {
            MetaParsed::Request(m) => Parsed::Request(Request::Meta(m)),
            MetaParsed::Incomplete => Parsed::Incomplete,
            MetaParsed::Refused { reply, skip } => Parsed::Refused { reply, skip, close: false },
            MetaParsed::TooLarge { delete, skip } => {
                Parsed::TooLarge { delete: Request::Meta(delete), skip, noreply: false }
            }
        };
    }
    match cmd {
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => storage(buf, &line, &words, line_len, limits),
        b"get" | b"gets" | b"gat" | b"gats" => {
            let (rcmd, first_key) = match cmd {
                b"get" => (RetrievalCmd::Get, 1),
                b"gets" => (RetrievalCmd::Gets, 1),
                b"gat" => (RetrievalCmd::Gat, 2),
                _ => (RetrievalCmd::Gats, 2),
            };
            let exptime = if first_key == 2 { words.get(1).and_then(|w| num::<i64>(w)) } else { Some(0) };
            let keys = &words[first_key.min(words.len())..];
            let result = match exptime {
                Some(exptime) if !keys.is_empty() && keys.iter().all(|k| key_ok(k, limits)) => {
                    let keys = keys.iter().map(|k| line.slice_ref(k)).collect();
                    Parsed::Request(Request::Retrieval { cmd: rcmd, exptime, keys })
                }
                // `gat 10`: a time and no keys, which memcached answers.
                Some(_) if keys.is_empty() && first_key == 2 && words.len() == 2 => refused(b"END\r\n"),
                Some(_) if keys.is_empty() => refused(ERROR),
                None if words.len() < 2 => refused(ERROR),
                None => refused(BAD_EXPTIME),
                _ => refused(BAD_FORMAT),
            };
            buf.advance(line_len);
            result
        }
        b"delete" => {
            // delete <key> [0] [noreply]: memcached still accepts a zero
            // time; a wrong word count is an unknown command to it.
            let noreply = words.last() == Some(&&b"noreply"[..]) && words.len() > 2;
            let valid = match words.len() {
                2 => true,
                3 => words[2] == b"0" || noreply,
                4 => words[2] == b"0" && noreply,
                _ => false,
            };
            let result = if !(2..=4).contains(&words.len()) {
                refused(ERROR)
            } else if !valid {
                refused(b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n")
            } else if key_ok(words[1], limits) {
                Parsed::Request(Request::Delete { key: line.slice_ref(words[1]), noreply })
            } else {
                refused(BAD_FORMAT)
            };
            buf.advance(line_len);
            result
        }
        b"incr" | b"decr" => {
            // incr <key> <delta> [noreply]: another word count is an
            // unknown command to memcached (a fourth word that is not
            // noreply is ignored).
            let noreply = words.len() == 4 && words[3] == b"noreply";
            let result = if !(3..=4).contains(&words.len()) {
                refused(ERROR)
            } else if key_ok(words[1], limits) {
                match num::<u64>(words[2]) {
                    Some(delta) => Parsed::Request(Request::Arith {
                        op: if cmd == b"incr" { ArithOp::Incr } else { ArithOp::Decr },
                        key: line.slice_ref(words[1]),
                        delta,
                        noreply,
                    }),
                    None => refused(b"CLIENT_ERROR invalid numeric delta argument\r\n"),
                }
            } else {
                refused(BAD_FORMAT)
            };
            buf.advance(line_len);
            result
        }
        b"touch" => {
            let noreply = words.len() == 4 && words[3] == b"noreply";
            let result = if !(3..=4).contains(&words.len()) {
                refused(ERROR)
            } else if !key_ok(words[1], limits) {
                refused(BAD_FORMAT)
            } else {
                match num(words[2]) {
                    Some(exptime) => {
                        Parsed::Request(Request::Touch { key: line.slice_ref(words[1]), exptime, noreply })
                    }
                    None => refused(BAD_EXPTIME),
                }
            };
            buf.advance(line_len);
            result
        }
        b"flush_all" => {
            // flush_all [delay] [noreply]: more words are an unknown
            // command to memcached; a second word that is not noreply is
            // ignored.
            let noreply = words.len() > 1 && words.last() == Some(&&b"noreply"[..]);
            let args = &words[1..words.len() - usize::from(noreply)];
            let result = match args {
                _ if words.len() > 3 => refused(ERROR),
                [] => Parsed::Request(Request::FlushAll { delay: None, noreply }),
                [d, ..] => match num::<i64>(d) {
                    Some(d) => Parsed::Request(Request::FlushAll { delay: Some(d), noreply }),
                    None => refused(BAD_EXPTIME),
                },
            };
            buf.advance(line_len);
            result
        }
        b"version" => {
            buf.advance(line_len);
            Parsed::Request(Request::Version)
        }
        b"verbosity" => {
            // verbosity <level> [noreply]: the level must be a number.
            let noreply = words.len() == 3 && words[2] == b"noreply";
            let result = match words.get(1).map(|w| num::<u32>(w)) {
                _ if !(2..=3).contains(&words.len()) => refused(ERROR),
                Some(Some(_)) => Parsed::Request(Request::Verbosity { noreply }),
                _ => refused(BAD_FORMAT),
            };
            buf.advance(line_len);
            result
        }
        b"stats" => {
            let group = words.get(1).map(|w| line.slice_ref(w));
            buf.advance(line_len);
            Parsed::Request(Request::Stats { group })
        }
        b"quit" => {
            buf.advance(line_len);
            Parsed::Request(Request::Quit)
        }
        _ => {
            buf.advance(line_len);
            if words.last().is_some_and(|last| is_http_line(cmd, last)) {
                return Parsed::Refused { reply: HTTP_REFUSED, skip: 0, close: true };
            }
            refused(ERROR)
        }
    }
}

fn storage(buf: &mut BytesMut, line: &Bytes, words: &[&[u8]], line_len: usize, limits: Limits) -> Parsed {
    let cmd = match words[0] {
        b"set" => StorageCmd::Set,
        b"add" => StorageCmd::Add,
        b"replace" => StorageCmd::Replace,
        b"append" => StorageCmd::Append,
        b"prepend" => StorageCmd::Prepend,
        _ => StorageCmd::Cas,
    };
    let fixed = if cmd == StorageCmd::Cas { 6 } else { 5 };
    if words.len() != fixed && words.len() != fixed + 1 {
        // A wrong word count is an unknown command to memcached: its data
        // (unknown length) is read as commands.
        buf.advance(line_len);
        return refused(ERROR);
    }
    // A last word that is not noreply is ignored, as memcached does.
    let noreply = words.len() == fixed + 1 && words[fixed] == b"noreply";
    let parsed = {
        let flags = num::<u32>(words[2]);
        let exptime = num::<i64>(words[3]);
        // memcached reads the length as a 32-bit int and adds 2 for the
        // "\r\n": a length whose sum overflows is a format error.
        let bytes = num::<i32>(words[4]).map(i64::from);
        let cas = if cmd == StorageCmd::Cas { num::<u64>(words[5]) } else { Some(0) };
        match (flags, exptime, bytes, cas) {
            (Some(f), Some(e), Some(b), Some(c)) if (0..=i64::from(i32::MAX - 2)).contains(&b) => {
                Some((f, e, b as usize, c))
            }
            _ => None,
        }
    };
    let Some((flags, exptime, len, cas)) = parsed else {
        // The data length is unknown: like memcached, answer and read on.
        buf.advance(line_len);
        return refused(BAD_FORMAT);
    };
    if !key_ok(words[1], limits) {
        buf.advance(line_len);
        // The length is known: skip the data block so it is not read as commands.
        return Parsed::Refused { reply: BAD_FORMAT, skip: len + 2, close: false };
    }
    if len > limits.max_value {
        buf.advance(line_len);
        if cmd == StorageCmd::Set {
            // memcached also drops the old value of a set it refuses.
            let delete = Request::Delete { key: line.slice_ref(words[1]), noreply: false };
            return Parsed::TooLarge { delete, skip: len + 2, noreply };
        }
        return Parsed::Refused { reply: TOO_LARGE, skip: len + 2, close: false };
    }
    if buf.len() < line_len + len + 2 {
        buf.reserve((line_len + len + 2 - buf.len()).min(1 << 20));
        return Parsed::Incomplete;
    }
    if &buf[line_len + len..line_len + len + 2] != b"\r\n" {
        // As memcached: the block (and its two would-be terminator bytes) is
        // consumed; whatever follows is read as the next command.
        buf.advance(line_len + len + 2);
        return refused(BAD_CHUNK);
    }
    let key = line.slice_ref(words[1]);
    buf.advance(line_len);
    let data = buf.split_to(len).freeze();
    buf.advance(2);
    Parsed::Request(Request::Storage { cmd, key, flags, exptime, data, cas, noreply })
}

/// The start of a get line with no end in sight: its command word (and
/// `gat`'s time) and the complete keys buffered so far, taken as a
/// [`Parsed::Partial`]. `None` when the line is not a retrieval.
fn get_line_start(buf: &mut BytesMut, limits: Limits) -> Option<Parsed> {
    let (cmd, with_time, exptime) = {
        let mut words = buf[..].split(|&b| b == b' ').filter(|w| !w.is_empty());
        let (cmd, with_time) = match words.next()? {
            b"get" => (RetrievalCmd::Get, false),
            b"gets" => (RetrievalCmd::Gets, false),
            b"gat" => (RetrievalCmd::Gat, true),
            b"gats" => (RetrievalCmd::Gats, true),
            _ => return None,
        };
        let exptime = if with_time { words.next().and_then(num::<i64>) } else { Some(0) };
        (cmd, with_time, exptime)
    };
    let Some(exptime) = exptime else {
        buf.clear();
        return Some(Parsed::RefusedLine { reply: BAD_EXPTIME });
    };
    // Skip the command word (and time), then take keys as a continuation.
    let mut pos = 0;
    for _ in 0..1 + usize::from(with_time) {
        while buf.get(pos) == Some(&b' ') {
            pos += 1;
        }
        while buf.get(pos).is_some_and(|&b| b != b' ') {
            pos += 1;
        }
    }
    buf.advance(pos);
    Some(parse_more_keys(buf, cmd, exptime, limits))
}

/// Continues a get line begun with [`Parsed::Partial`]: the keys up to the
/// line's end as the last segment ([`Parsed::Request`], whose reply ends
/// with `END`; it may have no keys), or the next segment's complete keys
/// as another [`Parsed::Partial`] once a segment's worth is buffered.
/// A bad key gets [`Parsed::RefusedLine`].
pub fn parse_more_keys(buf: &mut BytesMut, cmd: RetrievalCmd, exptime: i64, limits: Limits) -> Parsed {
    let (end, last) = match memchr::memchr(b'\n', buf) {
        Some(nl) => (nl, true),
        None if buf.len() > MAX_LINE => {
            let space = memchr::memrchr(b' ', buf);
            match space {
                // The unfinished key at the end is already too long.
                _ if buf.len() - space.map_or(0, |s| s + 1) > MAX_KEY_LEN => {
                    buf.clear();
                    return Parsed::RefusedLine { reply: BAD_FORMAT };
                }
                Some(space) => (space, false),
                None => return Parsed::Incomplete,
            }
        }
        None => return Parsed::Incomplete,
    };
    let line = buf.split_to(end).freeze();
    if last {
        buf.advance(1);
    }
    let text = if last { line.strip_suffix(b"\r").unwrap_or(&line) } else { &line[..] };
    let keys: Vec<Bytes> = text.split(|&b| b == b' ').filter(|w| !w.is_empty()).map(|k| line.slice_ref(k)).collect();
    if !keys.iter().all(|k| key_ok(k, limits)) {
        return if last { refused(BAD_FORMAT) } else { Parsed::RefusedLine { reply: BAD_FORMAT } };
    }
    let request = Request::Retrieval { cmd, exptime, keys };
    if last {
        Parsed::Request(request)
    } else {
        Parsed::Partial(request)
    }
}

/// Drops up to `*discard` bytes of a refused data block from the front of
/// `buf`; `true` when the whole block is gone (parsing may go on).
pub fn skip_discarded(buf: &mut BytesMut, discard: &mut usize) -> bool {
    let d = (*discard).min(buf.len());
    buf.advance(d);
    *discard -= d;
    *discard == 0
}

mod encode;
#[cfg(test)]
mod tests;
