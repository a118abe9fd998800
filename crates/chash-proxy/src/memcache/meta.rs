//! memcached's meta commands (`mg`, `ms`, `md`, `ma`, `me`, `mn`): a
//! request line checked as memcached 1.6 checks it (the same errors, in the
//! same cases), its key decoded when it is base64 (`b`), and its flags kept
//! as sent, in order.
//!
//! The proxy needs only the key (to route), `q` (to know which replies the
//! client does not want) and `ms`'s data length; the embedded shards read
//! every flag ([`MetaRequest::flag`]).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::errors::{BAD_CHUNK, BAD_FORMAT, ERROR, TOO_LARGE};

/// memcached's key length limit (of the key as sent, base64 or not).
const MAX_KEY_LEN: usize = 250;

/// Which meta command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaCmd {
    /// `mg`: get.
    Get,
    /// `ms`: set.
    Set,
    /// `md`: delete.
    Delete,
    /// `ma`: arithmetic.
    Arith,
    /// `me`: debug (an item's metadata).
    Debug,
    /// `mn`: no-op (answered `MN`: everything before it has been answered).
    Noop,
}

impl MetaCmd {
    /// The command word.
    pub fn name(self) -> &'static str {
        match self {
            MetaCmd::Get => "mg",
            MetaCmd::Set => "ms",
            MetaCmd::Delete => "md",
            MetaCmd::Arith => "ma",
            MetaCmd::Debug => "me",
            MetaCmd::Noop => "mn",
        }
    }

    /// The command named by a two-byte word, if it is one.
    pub fn from_word(word: &[u8]) -> Option<MetaCmd> {
        match word {
            b"mg" => Some(MetaCmd::Get),
            b"ms" => Some(MetaCmd::Set),
            b"md" => Some(MetaCmd::Delete),
            b"ma" => Some(MetaCmd::Arith),
            b"me" => Some(MetaCmd::Debug),
            b"mn" => Some(MetaCmd::Noop),
            _ => None,
        }
    }
}

/// A meta request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaRequest {
    /// Which command.
    pub cmd: MetaCmd,
    /// The key as sent (base64 with `b`); empty for `mn`.
    pub key: Bytes,
    /// The key itself: decoded with `b`, else as sent. Routing and the
    /// stores use this one.
    pub real_key: Bytes,
    /// Whether the key was sent in base64 (`b`).
    pub base64: bool,
    /// The flag tokens as sent (letter, then its argument), in order.
    pub flags: Vec<Bytes>,
    /// Whether `q` asks for the expected replies to be left out.
    pub quiet: bool,
    /// `ms`'s value.
    pub data: Option<Bytes>,
}

/// The flag letters memcached 1.6 accepts (on every meta command; a flag a
/// command has no use for is ignored).
const FLAGS: &[u8] = b"bNTRlOPLkstcfvhuqFCMJDI";

/// The longest opaque token, its `O` included.
const MAX_OPAQUE: usize = 32;

enum FlagError {
    Invalid,
    Duplicate,
    BadToken,
    Opaque,
    Decode,
}

impl FlagError {
    /// memcached's reply: `mg` and `ms` name the problem, `md` and `ma`
    /// give one message for all but the opaque's length.
    fn reply(self, cmd: MetaCmd) -> &'static [u8] {
        let specific = matches!(cmd, MetaCmd::Get | MetaCmd::Set);
        match self {
            FlagError::Opaque => b"CLIENT_ERROR opaque token too long\r\n",
            _ if !specific => b"CLIENT_ERROR invalid or duplicate flag\r\n",
            FlagError::Invalid => b"CLIENT_ERROR invalid flag\r\n",
            FlagError::Duplicate => b"CLIENT_ERROR duplicate flag\r\n",
            FlagError::BadToken => b"CLIENT_ERROR bad token in command line format\r\n",
            FlagError::Decode => b"CLIENT_ERROR error decoding key\r\n",
        }
    }
}

fn num<T: std::str::FromStr>(word: &[u8]) -> Option<T> {
    std::str::from_utf8(word).ok()?.parse().ok()
}

/// Checks the flags left to right as memcached does: known letters, each
/// once, numbers where numbers go, a short enough opaque.
fn check_flags(flags: &[&[u8]]) -> Result<(), FlagError> {
    let mut seen = [false; 128];
    for flag in flags {
        let letter = flag[0];
        if letter >= 128 || !FLAGS.contains(&letter) {
            return Err(FlagError::Invalid);
        }
        if std::mem::replace(&mut seen[letter as usize], true) {
            return Err(FlagError::Duplicate);
        }
        let arg = &flag[1..];
        let ok = match letter {
            b'N' | b'T' | b'R' => num::<i32>(arg).is_some(),
            b'C' | b'J' | b'D' => num::<u64>(arg).is_some(),
            b'O' => {
                if flag.len() > MAX_OPAQUE {
                    return Err(FlagError::Opaque);
                }
                true
            }
            _ => true,
        };
        if !ok {
            return Err(FlagError::BadToken);
        }
    }
    Ok(())
}

/// What [`parse_meta`] made of a meta command.
pub(super) enum MetaParsed {
    /// A whole request; its bytes have been taken.
    Request(MetaRequest),
    /// More bytes are needed (`ms`'s data).
    Incomplete,
    /// An `ms` in set mode whose value is over the size limit: refused
    /// (its line taken, `skip` more bytes to drop), and, as memcached does,
    /// its key's old value is to go (`delete`) so that none stays readable.
    TooLarge {
        /// The `md` that removes the key.
        delete: MetaRequest,
        /// Bytes to drop after the line.
        skip: usize,
    },
    /// Refused with `reply`; its line has been taken and `skip` more bytes
    /// (its data) are to be dropped.
    Refused {
        /// The reply line.
        reply: &'static [u8],
        /// Bytes to drop after the line.
        skip: usize,
    },
}

fn refused(reply: &'static [u8]) -> MetaParsed {
    MetaParsed::Refused { reply, skip: 0 }
}

/// Parses a meta command whose line (`line_len` bytes with its `\n`) is at
/// the front of `buf`, split into `words`; takes its bytes when it is
/// complete (`ms`: with its data).
pub(super) fn parse_meta(
    buf: &mut BytesMut,
    cmd: MetaCmd,
    line: &Bytes,
    words: &[&[u8]],
    line_len: usize,
    max_value: usize,
    lenient_keys: bool,
) -> MetaParsed {
    let line_only = |buf: &mut BytesMut, parsed: MetaParsed| {
        buf.advance(line_len);
        parsed
    };
    if cmd == MetaCmd::Noop {
        let req = MetaRequest {
            cmd,
            key: Bytes::new(),
            real_key: Bytes::new(),
            base64: false,
            flags: Vec::new(),
            quiet: false,
            data: None,
        };
        return line_only(buf, MetaParsed::Request(req));
    }
    let Some(&key) = words.get(1) else {
        return line_only(buf, refused(if cmd == MetaCmd::Debug { BAD_FORMAT } else { ERROR }));
    };
    if key.len() > MAX_KEY_LEN {
        // An ms's data length is not read: its data is read as commands.
        return line_only(buf, refused(BAD_FORMAT));
    }
    if cmd == MetaCmd::Debug {
        // me <key> [b]: only the word after the key counts.
        let base64 = words.get(2) == Some(&&b"b"[..]);
        let real_key = if base64 { decode_key(key) } else { Some(line.slice_ref(key)) };
        let Some(real_key) = real_key else { return line_only(buf, refused(BAD_FORMAT)) };
        let flags = if base64 { vec![Bytes::from_static(b"b")] } else { Vec::new() };
        let req = MetaRequest { cmd, key: line.slice_ref(key), real_key, base64, flags, quiet: false, data: None };
        return line_only(buf, MetaParsed::Request(req));
    }
    let (len, flags) = if cmd == MetaCmd::Set {
        let len = words.get(2).and_then(|w| num::<i32>(w)).filter(|&l| (0..=i32::MAX - 2).contains(&l));
        let Some(len) = len else { return line_only(buf, refused(BAD_FORMAT)) };
        (Some(len as usize), &words[3..])
    } else {
        (None, &words[2..])
    };
    // From here an ms's data is skipped with its line whatever the error.
    let skip = len.map_or(0, |l| l + 2);
    let refuse = |buf: &mut BytesMut, reply: &'static [u8]| {
        buf.advance(line_len);
        MetaParsed::Refused { reply, skip }
    };
    let max_flags = if cmd == MetaCmd::Set { 16 } else { 17 };
    if flags.len() > max_flags {
        let reply: &'static [u8] = if cmd == MetaCmd::Get {
            b"CLIENT_ERROR options flags are too long\r\n"
        } else {
            b"CLIENT_ERROR options flags too long\r\n"
        };
        return refuse(buf, reply);
    }
    if let Err(e) = check_flags(flags) {
        return refuse(buf, e.reply(cmd));
    }
    let base64 = flags.iter().any(|f| f[0] == b'b');
    let real_key = if base64 { decode_key(key) } else { Some(line.slice_ref(key)) };
    let Some(real_key) = real_key else { return refuse(buf, FlagError::Decode.reply(cmd)) };
    if !base64 && !lenient_keys && !real_key.iter().all(|&b| b > b' ' && b != 0x7f) {
        return refuse(buf, BAD_FORMAT);
    }
    // Arguments only some commands read.
    for flag in flags {
        let arg = &flag[1..];
        match (cmd, flag[0]) {
            (MetaCmd::Set, b'F') if num::<u64>(arg).is_none() => {
                return refuse(buf, BAD_FORMAT);
            }
            (MetaCmd::Set | MetaCmd::Arith, b'M') if arg.len() != 1 => {
                return refuse(buf, b"CLIENT_ERROR incorrect length for M token\r\n");
            }
            (MetaCmd::Set, b'M') if !b"SEAPR".contains(&arg[0]) => {
                return refuse(buf, b"CLIENT_ERROR invalid mode for ms M token\r\n");
            }
            (MetaCmd::Arith, b'M') if !b"I+D-".contains(&arg[0]) => {
                return refuse(buf, b"CLIENT_ERROR invalid mode for ma M token\r\n");
            }
            _ => {}
        }
    }
    let quiet = flags.iter().any(|f| f[0] == b'q');
    let mut req = MetaRequest {
        cmd,
        key: line.slice_ref(key),
        real_key,
        base64,
        flags: flags.iter().map(|f| line.slice_ref(f)).collect(),
        quiet,
        data: None,
    };
    let Some(len) = len else { return line_only(buf, MetaParsed::Request(req)) };
    if len > max_value {
        // Set mode (the default): memcached drops the old value too.
        if req.flag(b'M').is_none_or(|m| m.eq_ignore_ascii_case(b"S")) {
            let flags = if req.base64 { vec![Bytes::from_static(b"b")] } else { Vec::new() };
            let delete = MetaRequest { cmd: MetaCmd::Delete, flags, quiet: false, data: None, ..req };
            buf.advance(line_len);
            return MetaParsed::TooLarge { delete, skip };
        }
        return refuse(buf, TOO_LARGE);
    }
    if buf.len() < line_len + len + 2 {
        buf.reserve((line_len + len + 2 - buf.len()).min(1 << 20));
        return MetaParsed::Incomplete;
    }
    if &buf[line_len + len..line_len + len + 2] != b"\r\n" {
        // As memcached: the block and its two would-be terminator bytes go.
        buf.advance(line_len + len + 2);
        return refused(BAD_CHUNK);
    }
    buf.advance(line_len);
    req.data = Some(buf.split_to(len).freeze());
    buf.advance(2);
    MetaParsed::Request(req)
}

impl MetaRequest {
    /// The argument of flag `letter` when it was sent (empty for a flag
    /// without one).
    pub fn flag(&self, letter: u8) -> Option<&[u8]> {
        self.flags.iter().find(|f| f[0] == letter).map(|f| &f[1..])
    }

    /// Whether flag `letter` was sent.
    pub fn has(&self, letter: u8) -> bool {
        self.flags.iter().any(|f| f[0] == letter)
    }

    /// A number flag's value (the parser checked it is one).
    pub fn number<T: std::str::FromStr>(&self, letter: u8) -> Option<T> {
        self.flag(letter).and_then(num)
    }

    /// The request as sent to a server, without `q` when `quiet_out` is
    /// false (the proxy then leaves out the replies the client did not
    /// want, so that every request still gets exactly one reply).
    pub fn encode(&self, out: &mut BytesMut, quiet_out: bool) {
        let data_len = self.data.as_ref().map_or(0, Bytes::len);
        out.reserve(self.key.len() + data_len + self.flags.iter().map(|f| f.len() + 1).sum::<usize>() + 24);
        out.put_slice(self.cmd.name().as_bytes());
        if self.cmd != MetaCmd::Noop {
            out.put_u8(b' ');
            out.put_slice(&self.key);
        }
        if let Some(data) = &self.data {
            out.put_u8(b' ');
            let mut n = itoa::Buffer::new();
            out.put_slice(n.format(data.len()).as_bytes());
        }
        for f in &self.flags {
            if f[0] == b'q' && !quiet_out {
                continue;
            }
            out.put_u8(b' ');
            out.put_slice(f);
        }
        out.put_slice(b"\r\n");
        if let Some(data) = &self.data {
            out.put_slice(data);
            out.put_slice(b"\r\n");
        }
    }

    /// Whether a server's reply to this request (sent without `q`) is one
    /// that `q` leaves out: a miss for `mg`, `HD` for `ms` and `md`, a
    /// plain success for `ma`.
    pub fn quiet_drops(&self, reply: &[u8]) -> bool {
        if !self.quiet {
            return false;
        }
        match self.cmd {
            MetaCmd::Get => reply.starts_with(b"EN"),
            MetaCmd::Set | MetaCmd::Delete => reply.starts_with(b"HD"),
            MetaCmd::Arith => reply.starts_with(b"HD") || reply.starts_with(b"VA "),
            MetaCmd::Debug | MetaCmd::Noop => false,
        }
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Decodes a base64 key as memcached does: the standard alphabet, padded
/// to a multiple of four.
pub fn decode_key(text: &[u8]) -> Option<Bytes> {
    if text.is_empty() || !text.len().is_multiple_of(4) {
        return None;
    }
    let value = |c: u8| B64.iter().position(|&b| b == c).map(|v| v as u32);
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let chunks = text.len() / 4;
    for (i, chunk) in text.chunks(4).enumerate() {
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && i + 1 != chunks) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | value(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(Bytes::from(out))
}

/// Encodes bytes in padded standard base64 (keys the shards send back).
pub fn encode_key(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i)) as usize & 63]);
            } else {
                out.push(b'=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memcache::{parse_request, Limits, Parsed, Request};

    fn parse(input: &str) -> (Parsed, usize) {
        let mut buf = BytesMut::from(input.as_bytes());
        let parsed = parse_request(&mut buf, Limits::default());
        (parsed, buf.len())
    }

    fn reply(input: &str) -> String {
        match parse(input).0 {
            Parsed::Refused { reply, .. } => String::from_utf8_lossy(reply).trim_end().to_owned(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn base64_round_trips() {
        assert_eq!(&decode_key(b"Zm9v").unwrap()[..], b"foo");
        assert_eq!(&decode_key(b"QQ==").unwrap()[..], b"A");
        assert_eq!(decode_key(b"QQ"), None);
        assert_eq!(decode_key(b"QQ="), None);
        assert_eq!(decode_key(b"QUJ%"), None);
        assert_eq!(decode_key(b"QQ==QQ=="), None);
        for input in [&b""[..], b"a", b"ab", b"abc", b"a b\x00\xff"] {
            let enc = encode_key(input);
            if !input.is_empty() {
                assert_eq!(&decode_key(&enc).unwrap()[..], input);
            }
        }
    }

    #[test]
    fn errors_as_memcached_sends_them() {
        assert_eq!(reply("mg foo v v\r\n"), "CLIENT_ERROR duplicate flag");
        assert_eq!(reply("mg foo zz\r\n"), "CLIENT_ERROR invalid flag");
        assert_eq!(reply("mg foo E5\r\n"), "CLIENT_ERROR invalid flag");
        assert_eq!(reply("mg k Tx\r\n"), "CLIENT_ERROR bad token in command line format");
        assert_eq!(reply("mg k N\r\n"), "CLIENT_ERROR bad token in command line format");
        assert_eq!(reply(&format!("mg {} v\r\n", "a".repeat(251))), "CLIENT_ERROR bad command line format");
        assert_eq!(reply("mg QQ b v\r\n"), "CLIENT_ERROR error decoding key");
        assert_eq!(reply("md QQ b\r\n"), "CLIENT_ERROR invalid or duplicate flag");
        assert_eq!(reply("md k q q\r\n"), "CLIENT_ERROR invalid or duplicate flag");
        assert_eq!(reply("ma n Dabc\r\n"), "CLIENT_ERROR invalid or duplicate flag");
        assert_eq!(reply("ma n D-1\r\n"), "CLIENT_ERROR invalid or duplicate flag");
        assert_eq!(reply("ma n v Mi\r\n"), "CLIENT_ERROR invalid mode for ma M token");
        assert_eq!(reply(&format!("mg k O{}\r\n", "x".repeat(32))), "CLIENT_ERROR opaque token too long");
        assert_eq!(reply("mg\r\n"), "ERROR");
        assert_eq!(reply("me\r\n"), "CLIENT_ERROR bad command line format");
        assert_eq!(reply("mz foo\r\n"), "ERROR");
        assert_eq!(reply("MG foo\r\n"), "ERROR");
        let flags17 = "b N1 T1 R1 l O1 P L k s t c f v h u q";
        assert!(matches!(parse(&format!("mg Zm9v {flags17}\r\n")).0, Parsed::Request(_)));
        assert_eq!(reply(&format!("mg Zm9v {flags17} F1\r\n")), "CLIENT_ERROR options flags are too long");
        // ms: errors before the length leave the data to be read as a
        // command; after it, the data goes with the line.
        assert!(matches!(parse("ms k1 abc\r\nabc\r\n"), (Parsed::Refused { skip: 0, .. }, 5)));
        assert!(matches!(parse("ms k1 3 zz\r\nabc\r\n"), (Parsed::Refused { skip: 5, .. }, 5)));
        assert_eq!(reply("ms k1 3 MX\r\nabc\r\n"), "CLIENT_ERROR invalid mode for ms M token");
        assert_eq!(reply("ms k1 3 MSS\r\nabc\r\n"), "CLIENT_ERROR incorrect length for M token");
        assert_eq!(reply("ms k1 3 Fx\r\nabc\r\n"), "CLIENT_ERROR bad command line format");
        assert_eq!(reply("ms k1 3\r\nabcd\r\n"), "CLIENT_ERROR bad data chunk");
        assert!(matches!(parse("ms k1 3\r\nab"), (Parsed::Incomplete, _)));
    }

    #[test]
    fn binary_requests_are_refused_and_closed() {
        let mut buf = BytesMut::from(&[0x80u8, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0][..]);
        let parsed = parse_request(&mut buf, Limits::default());
        let left = buf.len();
        assert!(
            matches!(parsed, Parsed::Refused { close: true, reply, .. } if reply.starts_with(b"CLIENT_ERROR the binary protocol"))
        );
        assert_eq!(left, 0);
    }

    #[test]
    fn requests_keep_their_flags() {
        let (Parsed::Request(Request::Meta(m)), 0) = parse("ms Zm9v 2 b T30 F5 q c O7\r\nhi\r\n") else { panic!() };
        assert_eq!((m.cmd, &m.real_key[..], m.base64, m.quiet), (MetaCmd::Set, &b"foo"[..], true, true));
        assert_eq!(m.number::<i32>(b'T'), Some(30));
        assert_eq!(m.flag(b'O'), Some(&b"7"[..]));
        assert_eq!(m.data.as_deref(), Some(&b"hi"[..]));
        let mut out = BytesMut::new();
        m.encode(&mut out, false);
        assert_eq!(&out[..], b"ms Zm9v 2 b T30 F5 c O7\r\nhi\r\n");
        out.clear();
        m.encode(&mut out, true);
        assert_eq!(&out[..], b"ms Zm9v 2 b T30 F5 q c O7\r\nhi\r\n");
        let (Parsed::Request(Request::Meta(m)), _) = parse("mn extra\r\n") else { panic!() };
        assert_eq!(m.cmd, MetaCmd::Noop);
        assert!(!m.quiet_drops(b"EN\r\n"));
        let (Parsed::Request(Request::Meta(m)), _) = parse("mg k q v\r\n") else { panic!() };
        assert!(m.quiet_drops(b"EN\r\n") && !m.quiet_drops(b"VA 1\r\nx\r\n"));
    }
}
