//! RESP2 framing: client requests (arrays of bulk strings, or inline
//! commands) and backend replies (any frame, kept as raw bytes).
//!
//! Cheap checks first: a frame is only taken from the buffer when it is
//! complete; sizes are checked against limits before anything is buffered.

use bytes::{Buf, Bytes, BytesMut};

use crate::backend::{Frame, Framing, Large, Measured, Scan};

/// Default largest argument accepted from Redis clients: four times the
/// largest values twemproxy's own tests store; a value is held whole while
/// it is received (see the README).
pub const DEFAULT_MAX_VALUE: usize = 64 << 20;

/// A reply still incomplete with this many bytes buffered is passed on as
/// it arrives instead of being held whole.
pub const STREAM_AFTER: usize = 256 * 1024;

/// The largest reply held whole for a request that needs all of it (a part
/// of a split command); a larger one is read past and the request gets an
/// error.
pub const WHOLE_REPLY_LIMIT: usize = 64 << 20;

/// The framing of a reply forwarded to its client as it is: streamed when
/// large.
pub const STREAMED: &dyn Framing = &Streamed;

/// The framing of a reply the proxy needs whole (a part of a split
/// command), up to [`WHOLE_REPLY_LIMIT`].
pub const WHOLE: &dyn Framing = &Whole;

struct Streamed;
struct Whole;

impl Framing for Streamed {
    fn parse(&self, buf: &mut BytesMut) -> Frame {
        parse_reply(buf)
    }
    fn measure(&self, buf: &[u8]) -> Measured {
        measure_reply(buf)
    }
    fn large(&self) -> Large {
        Large::Stream { after: STREAM_AFTER }
    }
    fn scanner(&self) -> Option<Box<dyn Scan>> {
        Some(Box::new(FrameScanner::default()))
    }
}

impl Framing for Whole {
    fn parse(&self, buf: &mut BytesMut) -> Frame {
        parse_reply(buf)
    }
    fn measure(&self, buf: &[u8]) -> Measured {
        measure_reply(buf)
    }
    fn large(&self) -> Large {
        Large::Refuse { limit: WHOLE_REPLY_LIMIT }
    }
    fn scanner(&self) -> Option<Box<dyn Scan>> {
        Some(Box::new(FrameScanner::default()))
    }
}

impl Scan for FrameScanner {
    fn scan(&mut self, buf: &[u8]) -> Result<(usize, bool), String> {
        FrameScanner::scan(self, buf)
    }
}

/// Limits on what a client may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RespLimits {
    /// Most arguments in one command.
    pub max_args: usize,
    /// Largest single argument (bulk string), in bytes.
    pub max_bulk: usize,
}

impl Default for RespLimits {
    /// 1,048,576 arguments; 64 MiB per argument.
    fn default() -> Self {
        RespLimits { max_args: 1 << 20, max_bulk: 64 << 20 }
    }
}

/// A command's arguments, the name first: where each is in the command's
/// frame (start and length), the frame shared. Reading an argument costs
/// no reference count and no copy; the spans of up to 12 arguments (an
/// `MGET` of 11 keys) are held in place, more in a vector.
#[derive(Clone, Default)]
pub struct Args {
    /// The command as a RESP array of bulk strings: the client's own frame,
    /// or one framed here ([`Args::from`]).
    frame: Bytes,
    spans: smallvec::SmallVec<[(u32, u32); 12]>,
}

impl Args {
    /// Empties it: no arguments, the frame let go, and the room for spans
    /// too when it is over what a command parsed into keeps (1,024
    /// arguments' worth).
    pub fn clear(&mut self) {
        self.frame = Bytes::new();
        if self.spans.capacity() > KEPT_SPANS {
            self.spans = smallvec::SmallVec::new();
        }
        self.spans.clear();
    }

    /// How many arguments, the name included.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether there are none (an inline command is never empty; one built
    /// from nothing is).
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Argument `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        self.spans.get(i).map(|&span| self.at(span))
    }

    /// The command's name as sent.
    pub fn first(&self) -> Option<&[u8]> {
        self.get(0)
    }

    /// The last argument.
    pub fn last(&self) -> Option<&[u8]> {
        self.spans.last().map(|&span| self.at(span))
    }

    /// The arguments in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &[u8]> + ExactSizeIterator + Clone {
        self.spans.iter().map(|&span| self.at(span))
    }

    /// The arguments at `range` (`1..`: all but the name), in order.
    pub fn range<R>(&self, range: R) -> impl ExactSizeIterator<Item = &[u8]> + Clone
    where
        R: std::slice::SliceIndex<[(u32, u32)], Output = [(u32, u32)]>,
    {
        self.spans[range].iter().map(|&span| self.at(span))
    }

    /// Argument `i` as bytes of its own (sharing the frame), to keep.
    pub fn bytes(&self, i: usize) -> Bytes {
        let (start, len) = self.spans[i];
        self.frame.slice(start as usize..(start + len) as usize)
    }

    /// The arguments at `range` as framed in [`Args::frame`] (each bulk
    /// string's header, bytes and line end): what a command made of them
    /// carries, copied in one piece. Empty for an empty range.
    pub fn framed(&self, range: std::ops::Range<usize>) -> &[u8] {
        if range.is_empty() {
            return &[];
        }
        // An argument's header starts where the one before it ends (after
        // its line end), the first's after the array's header.
        let start = match range.start {
            0 => len_line_size(self.spans.len()),
            i => {
                let (s, l) = self.spans[i - 1];
                (s + l) as usize + 2
            }
        };
        let (s, l) = self.spans[range.end - 1];
        &self.frame[start..(s + l) as usize + 2]
    }

    /// The command as a RESP array of bulk strings.
    pub fn frame(&self) -> &Bytes {
        &self.frame
    }

    #[inline(always)]
    fn at(&self, (start, len): (u32, u32)) -> &[u8] {
        &self.frame[start as usize..(start + len) as usize]
    }
}

impl std::ops::Index<usize> for Args {
    type Output = [u8];

    #[inline]
    fn index(&self, i: usize) -> &[u8] {
        self.at(self.spans[i])
    }
}

impl<'a, T: AsRef<[u8]> + 'a> From<&'a [T]> for Args {
    /// The arguments framed as a RESP array.
    fn from(items: &'a [T]) -> Args {
        let mut out = BytesMut::new();
        encode_array(&mut out, items.iter().map(AsRef::as_ref));
        let frame = out.freeze();
        // Each bulk string's bytes follow its header line.
        let mut spans = smallvec::SmallVec::with_capacity(items.len());
        let mut at = len_line_size(items.len());
        for item in items {
            let len = item.as_ref().len();
            at += len_line_size(len);
            spans.push((at as u32, len as u32));
            at += len + 2;
        }
        assert!(at <= u32::MAX as usize, "arguments over 4 GiB");
        Args { frame, spans }
    }
}

impl<T: AsRef<[u8]>> From<Vec<T>> for Args {
    fn from(items: Vec<T>) -> Args {
        Args::from(&items[..])
    }
}

impl PartialEq for Args {
    fn eq(&self, other: &Args) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Args {}

impl std::fmt::Debug for Args {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter().map(String::from_utf8_lossy)).finish()
    }
}

/// A parsed client command: its arguments, the name first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Command {
    /// Arguments, `args[0]` being the command name as sent.
    pub args: Args,
}

impl Command {
    /// The command name in upper case.
    pub fn name(&self) -> String {
        String::from_utf8_lossy(&self.args[0]).to_ascii_uppercase()
    }

    /// The command name in upper case, written into `buf` without
    /// allocating; an empty string for names longer than `buf` or not ASCII
    /// (no command has such a name).
    pub fn name_in<'b>(&self, buf: &'b mut [u8; 32]) -> &'b str {
        let raw = &self.args[0];
        let Some(out) = buf.get_mut(..raw.len()) else { return "" };
        if !raw.is_ascii() {
            return "";
        }
        out.copy_from_slice(raw);
        out.make_ascii_uppercase();
        std::str::from_utf8(out).unwrap_or("")
    }

    /// A command from its arguments.
    pub fn new(args: impl Into<Args>) -> Command {
        Command { args: args.into() }
    }

    /// The bytes to send a server: the client's own frame when it sent a
    /// RESP array, else the arguments framed as one.
    pub fn wire(&self) -> Bytes {
        self.args.frame.clone()
    }
}

/// Room for a bulk string's framing beyond its bytes: `$`, its length (up
/// to 20 digits) and two line ends.
pub(crate) const ARG_FRAMING: usize = 1 + 20 + 4;

/// Appends a RESP array of bulk strings (the room for it reserved once).
pub fn encode_array<'a>(out: &mut BytesMut, items: impl ExactSizeIterator<Item = &'a [u8]> + Clone) {
    out.reserve(ARG_FRAMING + items.clone().map(|a| a.len() + ARG_FRAMING).sum::<usize>());
    put_len(out, b'*', items.len());
    for a in items {
        put_bulk(out, a);
    }
}

/// `$<len>\r\n<data>\r\n`.
pub(crate) fn put_bulk(out: &mut BytesMut, data: &[u8]) {
    out.reserve(LEN_LINE + data.len() + 2);
    put_len(out, b'$', data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// `<prefix><n>\r\n`.
pub(crate) fn put_len(out: &mut BytesMut, prefix: u8, n: usize) {
    let mut line = [0u8; LEN_LINE];
    let len = len_line(&mut line, prefix, n);
    out.extend_from_slice(&line[..len]);
}

/// The longest `<prefix><n>\r\n`: 20 digits.
const LEN_LINE: usize = 23;

/// The length of `<prefix><n>\r\n`.
pub(crate) fn len_line_size(n: usize) -> usize {
    (if n < 10 { 1 } else { n.ilog10() as usize + 1 }) + 3
}

/// Writes `<prefix><n>\r\n` at the start of `line`: its length.
#[inline]
fn len_line(line: &mut [u8; LEN_LINE], prefix: u8, mut n: usize) -> usize {
    let digits = if n < 10 { 1 } else { n.ilog10() as usize + 1 };
    line[0] = prefix;
    for at in (1..=digits).rev() {
        line[at] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    line[digits + 1] = b'\r';
    line[digits + 2] = b'\n';
    digits + 3
}

/// What the request parser made of the buffer's front. Small, so that it
/// is returned in registers, not copied: a command's arguments are in the
/// [`Command`] the parser was given.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A command, now in the `Command` given; its bytes were taken.
    Command,
    /// Need more bytes.
    Incomplete,
    /// Part of an HTTP request (a browser, or a request forgery aimed at
    /// the cache): a `POST` or `Host:` command, as Redis refuses them, or
    /// an inline request line `METHOD target HTTP/x`. The connection is
    /// closed without a reply and without reading further.
    Http,
    /// A protocol error: reply with it and close (the stream cannot be
    /// resynchronised after a bad frame, as in Redis).
    Error(String),
    /// A command with an argument of `len` bytes, over the limit: refused,
    /// and the rest of it (which may not have arrived) is read past with
    /// `skip`, so the connection goes on.
    TooLarge {
        /// The argument's length.
        len: usize,
        /// What is left of the command.
        skip: Skip,
    },
}

/// The rest of a refused command, dropped as it arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Skip {
    /// Bytes of the current argument (and its `\r\n`) still to come.
    bytes: usize,
    /// Arguments after it.
    args: usize,
}

impl Skip {
    /// Drops what it can of the command from the front of `buf`: `true`
    /// once all of it is gone.
    ///
    /// # Errors
    /// Bytes that are not the rest of a RESP command (the connection cannot
    /// go on).
    pub fn advance(&mut self, buf: &mut BytesMut) -> Result<bool, String> {
        loop {
            let take = self.bytes.min(buf.len());
            buf.advance(take);
            self.bytes -= take;
            if self.bytes > 0 {
                return Ok(false);
            }
            if self.args == 0 {
                return Ok(true);
            }
            if buf.is_empty() {
                return Ok(false);
            }
            if buf[0] != b'$' {
                return Err(format!("Protocol error: expected '$', got '{}'", buf[0] as char));
            }
            let Some(end) = line_end(buf, 1) else {
                if buf.len() > 32 {
                    return Err("Protocol error: invalid bulk length".into());
                }
                return Ok(false);
            };
            let len = match int(&buf[1..end]) {
                Some(l) if l >= 0 => l as usize,
                _ => return Err("Protocol error: invalid bulk length".into()),
            };
            buf.advance(end + 2);
            self.bytes = len.saturating_add(2);
            self.args -= 1;
        }
    }
}

/// Where the first `\r\n` at or after `from` starts.
fn line_end(buf: &[u8], mut from: usize) -> Option<usize> {
    loop {
        let cr = from + memchr::memchr(b'\r', buf.get(from..)?)?;
        if buf.get(cr + 1) == Some(&b'\n') {
            return Some(cr);
        }
        from = cr + 1;
    }
}

/// The common header line, read in one pass: up to 18 digits (no sign,
/// no leading zero) from `from`, then CRLF: the number and where its CR
/// is. `None` for anything else (incomplete, signed, longer, a leading
/// zero, malformed), which the general way ([`line_end`], then [`int`])
/// reads, to the same result when this finds one.
#[inline(always)]
fn number_line(buf: &[u8], from: usize) -> Option<(i64, usize)> {
    let mut n: i64 = 0;
    let mut at = from;
    while let Some(&d) = buf.get(at) {
        if d.is_ascii_digit() {
            if at - from == 18 {
                return None;
            }
            n = n * 10 + i64::from(d - b'0');
            at += 1;
            continue;
        }
        let plain = at == from + 1 || (at > from && buf[from] != b'0');
        return (d == b'\r' && plain && buf.get(at + 1) == Some(&b'\n')).then_some((n, at));
    }
    None
}

/// A decimal integer as `str::parse::<i64>` reads it (an optional sign,
/// then digits only), without a UTF-8 check: this runs several times per
/// request.
fn int(b: &[u8]) -> Option<i64> {
    let (negative, digits) = match b.first()? {
        b'-' => (true, &b[1..]),
        b'+' => (false, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if negative {
        (n <= 1 << 63).then(|| (n as i64).wrapping_neg())
    } else {
        i64::try_from(n).ok()
    }
}

/// Whether a command name is one Redis refuses as an HTTP request's
/// (`POST`, `Host:`), whatever the case.
pub fn is_http_word(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"post") || name.eq_ignore_ascii_case(b"host:")
}

/// Inline commands (`PING\r\n`) are at most this long, as in Redis.
const MAX_INLINE: usize = 64 * 1024;

/// Parses one client command (empty lines and empty arrays are skipped, as
/// Redis does): what was found, and the command (empty unless a command
/// was found).
pub fn parse_request(buf: &mut BytesMut, limits: RespLimits) -> (Parsed, Command) {
    let mut cmd = Command::default();
    match parse_request_into(buf, limits, &mut cmd) {
        Parsed::Command => (Parsed::Command, cmd),
        other => (other, Command::default()),
    }
}

/// [`parse_request`], the command parsed into `cmd` (a caller's, used
/// again from request to request): a command is not moved on its way out,
/// and its spans' room is kept. `cmd` holds a command only when
/// [`Parsed::Command`] is returned; otherwise what it holds is not one (it
/// may be part of one), and is not to be read.
pub fn parse_request_into(buf: &mut BytesMut, limits: RespLimits, cmd: &mut Command) -> Parsed {
    loop {
        if let Some(r) = parse_one(buf, limits, cmd) {
            return r;
        }
    }
}

/// Room for spans kept in a command parsed into from request to request:
/// a larger room (a request of thousands of arguments) is let go.
const KEPT_SPANS: usize = 1024;

/// One frame: `None` when it was empty and has been skipped.
fn parse_one(buf: &mut BytesMut, limits: RespLimits, cmd: &mut Command) -> Option<Parsed> {
    if buf.is_empty() {
        return Some(Parsed::Incomplete);
    }
    if buf[0] != b'*' {
        // Inline command: words split on spaces, up to CRLF (or LF).
        let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
            if buf.len() > MAX_INLINE {
                return Some(Parsed::Error("Protocol error: too big inline request".into()));
            }
            return Some(Parsed::Incomplete);
        };
        let line = buf.split_to(nl + 1);
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let args: smallvec::SmallVec<[&[u8]; 8]> = text.split(|&b| b == b' ').filter(|w| !w.is_empty()).collect();
        if args.is_empty() {
            return None;
        }
        const METHODS: [&[u8]; 9] =
            [b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH", b"CONNECT", b"TRACE"];
        let request_line = args.len() == 3 && METHODS.contains(&args[0]) && args[2].starts_with(b"HTTP/");
        if request_line || is_http_word(args[0]) {
            return Some(Parsed::Http);
        }
        *cmd = Command::new(&args[..]);
        return Some(Parsed::Command);
    }
    let Some((n, end)) = header_number(buf, 1, length) else {
        if buf.len() > 32 {
            return Some(Parsed::Error("Protocol error: invalid multibulk length".into()));
        }
        return Some(Parsed::Incomplete);
    };
    let Some(n) = n else {
        return Some(Parsed::Error("Protocol error: invalid multibulk length".into()));
    };
    if n <= 0 {
        buf.advance(end + 2);
        return None;
    }
    if n as usize > limits.max_args {
        return Some(Parsed::Error(format!("Protocol error: more than {} arguments", limits.max_args)));
    }
    // Walk the bulk strings without consuming until all are here.
    let mut pos = end + 2;
    // Room for what is announced only as it arrives: a header alone
    // must not make the proxy allocate for a million arguments. Most
    // commands have a few arguments: their spans stay on the stack.
    cmd.args.clear();
    let spans = &mut cmd.args.spans;
    if n as usize > spans.inline_size() {
        spans.reserve((n as usize).min(1024));
    }
    for i in 0..n as usize {
        if pos >= buf.len() {
            return Some(Parsed::Incomplete);
        }
        if buf[pos] != b'$' {
            return Some(Parsed::Error(format!("Protocol error: expected '$', got '{}'", buf[pos] as char)));
        }
        let Some((len, end)) = header_number(buf, pos + 1, length) else {
            if buf.len() - pos > 32 {
                return Some(Parsed::Error("Protocol error: invalid bulk length".into()));
            }
            return Some(Parsed::Incomplete);
        };
        let len = match len {
            Some(l) if l >= 0 && (l as usize) <= limits.max_bulk => l as usize,
            Some(l) if l >= 0 => {
                // Read past it all: the header lines so far, this argument
                // and the ones after it.
                buf.advance(end + 2);
                let skip = Skip { bytes: (l as usize).saturating_add(2), args: n as usize - i - 1 };
                return Some(Parsed::TooLarge { len: l as usize, skip });
            }
            _ => return Some(Parsed::Error("Protocol error: invalid bulk length".into())),
        };
        let start = end + 2;
        if start + len + 2 > u32::MAX as usize {
            // Its spans would not fit (Redis itself takes at most 1 GiB in
            // one request): refused at this header, before it is buffered.
            return Some(Parsed::Error("Protocol error: request over 4 GiB".into()));
        }
        if buf.len() < start + len + 2 {
            buf.reserve((start + len + 2 - buf.len()).min(1 << 20));
            return Some(Parsed::Incomplete);
        }
        if &buf[start + len..start + len + 2] != b"\r\n" {
            return Some(Parsed::Error("Protocol error: bulk string not followed by CRLF".into()));
        }
        spans.push((start as u32, len as u32));
        pos = start + len + 2;
    }
    cmd.args.frame = buf.split_to(pos).freeze();
    Some(Parsed::Command)
}

/// A length in a request, read as Redis reads one: digits with no leading
/// zero (`0` itself aside), a minus sign at most. A request with `$01` or
/// `*+2` would be refused by its server, which then closes the connection
/// other clients' requests share: such a request is refused here, as Redis
/// refuses it.
fn length(text: &[u8]) -> Option<i64> {
    let canonical = match text.strip_prefix(b"-").unwrap_or(text) {
        [b'0'] => text.len() == 1,
        [b'1'..=b'9', ..] => true,
        _ => false,
    };
    int(text).filter(|_| canonical)
}

/// The number of the header line from `from` to its CRLF: read in one
/// pass ([`number_line`]) when it is plain, else found by [`line_end`]
/// and read by `read` (`None` inside: a number `read` refuses). `None`
/// while the line has no end yet.
#[inline(always)]
fn header_number(buf: &[u8], from: usize, read: fn(&[u8]) -> Option<i64>) -> Option<(Option<i64>, usize)> {
    if let Some((n, cr)) = number_line(buf, from) {
        return Some((Some(n), cr));
    }
    let end = line_end(buf, from)?;
    Some((read(&buf[from..end]), end))
}

/// End (exclusive) of the frame starting at `pos`, if complete.
fn frame_end(buf: &[u8], pos: usize, depth: usize) -> Result<Option<usize>, String> {
    frame_end_as(buf, pos, depth, true)
}

/// The end of the bulk string at `pos` (its length a plain number, or a
/// null) read in one pass: `Some(None)` while incomplete; `None` for
/// anything else, which [`frame_end`] reads the general way.
#[inline(always)]
fn bulk_end(buf: &[u8], pos: usize) -> Option<Option<usize>> {
    if buf.get(pos) != Some(&b'$') {
        return None;
    }
    // A null (a key not found).
    if buf.get(pos + 1..pos + 5) == Some(b"-1\r\n") {
        return Some(Some(pos + 5));
    }
    let (len, cr) = number_line(buf, pos + 1).filter(|&(len, _)| len < 1 << 40)?;
    let stop = cr + 2 + len as usize + 2;
    Some((buf.len() >= stop).then_some(stop))
}

/// [`frame_end`]; `fast`: bulk strings and arrays whose header is a plain
/// number (all of them but nulls) are read in one pass over the digits,
/// not a search for the line's end then a parse of it (the tests check
/// both ways agree).
#[inline]
fn frame_end_as(buf: &[u8], pos: usize, depth: usize, fast: bool) -> Result<Option<usize>, String> {
    if depth > 64 {
        return Err("reply nested too deeply".into());
    }
    if pos >= buf.len() {
        return Ok(None);
    }
    if fast {
        if let Some(end) = bulk_end(buf, pos) {
            return Ok(end);
        }
        if buf[pos] == b'*' {
            if let Some((n, cr)) = number_line(buf, pos + 1).filter(|&(n, _)| n <= 1 << 32) {
                let mut p = cr + 2;
                for _ in 0..n {
                    // Bulk strings (an MGET's values) read here, without a
                    // call each; deeper than the limit, the call says so.
                    let end = match bulk_end(buf, p).filter(|_| depth < 64) {
                        Some(end) => end,
                        None => frame_end_as(buf, p, depth + 1, fast)?,
                    };
                    match end {
                        Some(e) => p = e,
                        None => return Ok(None),
                    }
                }
                return Ok(Some(p));
            }
        }
    }
    let Some(end) = line_end(buf, pos + 1) else { return Ok(None) };
    let kind = buf[pos];
    match Shape::of(kind)? {
        Shape::Line => Ok(Some(end + 2)),
        Shape::Blob => {
            let len = blob_len(&buf[pos + 1..end])?;
            if len < 0 {
                return Ok(Some(end + 2));
            }
            let stop = end + 2 + len as usize + 2;
            Ok((buf.len() >= stop).then_some(stop))
        }
        Shape::Aggregate { per_item, then_one } => {
            let n = aggregate_len(&buf[pos + 1..end])?;
            let mut p = end + 2;
            for _ in 0..n.max(0) * per_item + i64::from(then_one) {
                match frame_end_as(buf, p, depth + 1, fast)? {
                    Some(e) => p = e,
                    None => return Ok(None),
                }
            }
            Ok(Some(p))
        }
    }
}

/// A blob's length; past 1 TiB it is not from a Redis server (and would
/// overflow the arithmetic on it).
fn blob_len(header: &[u8]) -> Result<i64, String> {
    int(header).filter(|&l| l < 1 << 40).ok_or_else(|| "bad bulk length".into())
}

/// An aggregate's element count; past 2^32 it is not from a Redis server
/// (found by fuzzing: twice a larger count overflowed).
fn aggregate_len(header: &[u8]) -> Result<i64, String> {
    int(header).filter(|&n| n <= 1 << 32).ok_or_else(|| "bad aggregate length".into())
}

/// How a reply frame of each type byte is laid out (RESP2 and RESP3).
enum Shape {
    /// Up to the line's end: `+` `-` `:` and RESP3's `_` `#` `,` `(`.
    Line,
    /// A length, then that many bytes: `$`, and RESP3's `!` `=`.
    Blob,
    /// A count of elements, `per_item` frames each: `*`, RESP3's `~` `>`
    /// (one) and `%` (two); `|` (attributes: two each) prefixes one more
    /// frame, the value they describe.
    Aggregate { per_item: i64, then_one: bool },
}

impl Shape {
    fn of(kind: u8) -> Result<Shape, String> {
        Ok(match kind {
            b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => Shape::Line,
            b'$' | b'!' | b'=' => Shape::Blob,
            b'*' | b'~' | b'>' => Shape::Aggregate { per_item: 1, then_one: false },
            b'%' => Shape::Aggregate { per_item: 2, then_one: false },
            b'|' => Shape::Aggregate { per_item: 2, then_one: true },
            other => return Err(format!("unexpected reply type byte {other:#04x}")),
        })
    }
}

/// Parses one reply frame from the front of `buf`, taking it when complete.
pub fn parse_reply(buf: &mut BytesMut) -> Frame {
    match frame_end(buf, 0, 0) {
        Ok(Some(end)) => Frame::Done(buf.split_to(end).freeze()),
        Ok(None) => Frame::Incomplete,
        Err(e) => Frame::Invalid(e),
    }
}

/// Where the reply frame at the front of `buf` ends, as [`parse_reply`]
/// finds it, nothing taken.
pub fn measure_reply(buf: &[u8]) -> Measured {
    // The commonest replies first, in one pass: a bulk string (a GET's
    // value, or its RESP2 null), `+OK` (a SET's) and RESP3's null.
    if let Some(end) = bulk_end(buf, 0) {
        return end.map_or(Measured::Incomplete, Measured::Len);
    }
    if buf.starts_with(b"+OK\r\n") {
        return Measured::Len(5);
    }
    if buf.starts_with(b"_\r\n") {
        return Measured::Len(3);
    }
    match frame_end(buf, 0, 0) {
        Ok(Some(end)) => Measured::Len(end),
        Ok(None) => Measured::Incomplete,
        Err(e) => Measured::Invalid(e),
    }
}

/// Longest header line a streamed reply may have (`$<len>`, `*<count>`, a
/// status or an error line; long error lines come from scripts).
const MAX_REPLY_LINE: usize = 16 << 20;

/// Finds where one reply frame ends a piece at a time, so that a large reply
/// can be passed on as it arrives instead of being held whole: feed it the
/// bytes in order with [`FrameScanner::scan`].
#[derive(Debug, Default)]
pub struct FrameScanner {
    /// Elements still to come in each open array, innermost last.
    open: Vec<i64>,
    /// Bytes of the current bulk string (and its `\r\n`) still to come.
    bulk_left: usize,
}

impl FrameScanner {
    /// Scans the next bytes of the frame: how many of `buf` belong to it
    /// (a header line split across reads is left for the next call), and
    /// whether the frame ended there.
    ///
    /// # Errors
    /// Bytes that are not a RESP reply.
    pub fn scan(&mut self, buf: &[u8]) -> Result<(usize, bool), String> {
        let mut pos = 0;
        loop {
            if self.bulk_left > 0 {
                let take = self.bulk_left.min(buf.len() - pos);
                pos += take;
                self.bulk_left -= take;
                if self.bulk_left > 0 {
                    return Ok((pos, false));
                }
                if self.element_done() {
                    return Ok((pos, true));
                }
                continue;
            }
            if pos >= buf.len() {
                return Ok((pos, false));
            }
            let Some(end) = line_end(buf, pos + 1) else {
                if buf.len() - pos > MAX_REPLY_LINE {
                    return Err("reply line too long".into());
                }
                return Ok((pos, false));
            };
            let header = &buf[pos + 1..end];
            let kind = buf[pos];
            pos = end + 2;
            let finished = match Shape::of(kind)? {
                Shape::Line => true,
                Shape::Blob => match blob_len(header)? {
                    len if len < 0 => true,
                    len => {
                        self.bulk_left = usize::try_from(len).map_err(|_| "bad bulk length")?.saturating_add(2);
                        false
                    }
                },
                Shape::Aggregate { per_item, then_one } => {
                    match aggregate_len(header)?.max(0) * per_item + i64::from(then_one) {
                        0 => true,
                        n => {
                            if self.open.len() >= 64 {
                                return Err("reply nested too deeply".into());
                            }
                            self.open.push(n);
                            false
                        }
                    }
                }
            };
            if finished && self.element_done() {
                return Ok((pos, true));
            }
        }
    }

    /// One element is complete: closes the arrays it completes; true when
    /// that completes the frame.
    fn element_done(&mut self) -> bool {
        while let Some(left) = self.open.last_mut() {
            *left -= 1;
            if *left > 0 {
                return false;
            }
            self.open.pop();
        }
        true
    }
}

/// The frames of a reply made of several (a transaction's), in order.
pub fn frames(reply: &Bytes) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut p = 0;
    while let Ok(Some(e)) = frame_end(reply, p, 0) {
        out.push(reply.slice(p..e));
        p = e;
    }
    out
}

/// The elements of an array reply (raw frames), or `None` if it is not an array.
pub fn array_items(frame: &Bytes) -> Option<Vec<Bytes>> {
    if frame.first() != Some(&b'*') {
        return None;
    }
    let end = line_end(frame, 1)?;
    let n = int(&frame[1..end])?;
    let mut items = Vec::with_capacity(n.max(0) as usize);
    let mut p = end + 2;
    for _ in 0..n.max(0) {
        let e = frame_end(frame, p, 1).ok()??;
        items.push(frame.slice(p..e));
        p = e;
    }
    Some(items)
}

/// Where the first item of an array reply of `n` items starts (`None` for
/// another reply or another count): its items are then read with
/// [`item_end`], without taking them apart.
pub fn array_start(frame: &[u8], n: usize) -> Option<usize> {
    if frame.first() != Some(&b'*') {
        return None;
    }
    let (count, cr) = header_number(frame, 1, int)?;
    (usize::try_from(count?).ok()? == n).then_some(cr + 2)
}

/// Where the frame starting at `at` of `frame` ends, if it is complete and
/// well formed.
#[inline]
pub fn item_end(frame: &[u8], at: usize) -> Option<usize> {
    match bulk_end(frame, at) {
        Some(end) => end,
        None => frame_end(frame, at, 1).ok()?,
    }
}

/// The value of an integer reply.
pub fn integer(frame: &[u8]) -> Option<i64> {
    if frame.first() != Some(&b':') {
        return None;
    }
    int(frame[1..].strip_suffix(b"\r\n")?)
}

/// A RESP error reply.
pub fn error(msg: &str) -> Bytes {
    Bytes::from(format!("-{}\r\n", msg.replace(['\r', '\n'], " ")))
}

/// A RESP bulk string.
pub fn bulk(data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(data.len() + ARG_FRAMING);
    put_bulk(&mut out, data);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(input: &[u8]) -> (Parsed, Command) {
        parse_request(&mut BytesMut::from(input), RespLimits::default())
    }

    /// One command parsed into again and again holds each request's
    /// arguments only, whatever came before it (more arguments, an inline
    /// command, an incomplete one), and lets go of a large room for spans.
    #[test]
    fn a_command_parsed_into_again_holds_only_the_last_request() {
        let mut cmd = Command::default();
        let mut many = BytesMut::new();
        encode_array(&mut many, (0..2000).map(|_| &b"k"[..]));
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&many);
        buf.extend_from_slice(b"*2\r\n$3\r\nGET\r\n$1\r\na\r\nPING x\r\n*2\r\n$3\r\nGET\r\n$1\r\n");
        assert_eq!(parse_request_into(&mut buf, RespLimits::default(), &mut cmd), Parsed::Command);
        assert_eq!(cmd.args.len(), 2000);
        assert!(cmd.args.spans.capacity() > KEPT_SPANS);
        assert_eq!(parse_request_into(&mut buf, RespLimits::default(), &mut cmd), Parsed::Command);
        assert_eq!(cmd.args.iter().collect::<Vec<_>>(), [&b"GET"[..], b"a"]);
        assert!(cmd.args.spans.capacity() <= KEPT_SPANS, "the large room was let go");
        assert_eq!(cmd.wire(), &b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n"[..]);
        assert_eq!(parse_request_into(&mut buf, RespLimits::default(), &mut cmd), Parsed::Command);
        assert_eq!(cmd.args.iter().collect::<Vec<_>>(), [&b"PING"[..], b"x"]);
        assert_eq!(parse_request_into(&mut buf, RespLimits::default(), &mut cmd), Parsed::Incomplete);
        buf.extend_from_slice(b"b\r\n");
        assert_eq!(parse_request_into(&mut buf, RespLimits::default(), &mut cmd), Parsed::Command);
        assert_eq!(cmd.args.iter().collect::<Vec<_>>(), [&b"GET"[..], b"b"]);
        assert!(buf.is_empty());
        // What parse_request says of the same bytes.
        let mut buf = BytesMut::from(&b"*1\r\n$4\r\nPING\r\n*1\r\n$x\r\n"[..]);
        assert_eq!(
            parse_request(&mut buf, RespLimits::default()),
            (Parsed::Command, Command::new(&[&b"PING"[..]][..]))
        );
        assert_eq!(
            parse_request_into(&mut buf, RespLimits::default(), &mut cmd),
            Parsed::Error("Protocol error: invalid bulk length".into())
        );
    }

    /// The naive twins of the hand-written scanners.
    fn naive_int(b: &[u8]) -> Option<i64> {
        std::str::from_utf8(b).ok()?.parse().ok()
    }

    fn naive_line_end(buf: &[u8], from: usize) -> Option<usize> {
        buf[from..].windows(2).position(|w| w == b"\r\n").map(|i| from + i)
    }

    proptest::proptest! {
        #[test]
        fn int_reads_what_str_parse_reads(s in "[-+]?[0-9]{0,21}|[-+0-9a\\r\\n ]{0,6}", n: i64) {
            proptest::prop_assert_eq!(int(s.as_bytes()), naive_int(s.as_bytes()));
            let text = n.to_string();
            proptest::prop_assert_eq!(int(text.as_bytes()), Some(n));
        }

        #[test]
        fn the_fast_way_to_a_frame_end_agrees_with_the_general_way(tokens in proptest::collection::vec(proptest::sample::select(vec![
            "$3\r\n", "abc\r\n", "*2\r\n", "*0\r\n", ":1\r\n", "+OK\r\n", "$-1\r\n", "*-1\r\n", "$0\r\n", "\r\n",
            "$", "*", "9", "12", "-", "x", "\r", "%1\r\n", "$99999999999999\r\n", "*99999999999\r\n", "a",
        ]), 0..12), at in 0usize..4) {
            let buf = tokens.concat();
            let at = at.min(buf.len());
            proptest::prop_assert_eq!(
                frame_end_as(buf.as_bytes(), at, 0, true),
                frame_end_as(buf.as_bytes(), at, 0, false),
                "{:?} from {}", buf, at
            );
            proptest::prop_assert_eq!(
                item_end(buf.as_bytes(), at),
                frame_end_as(buf.as_bytes(), at, 1, false).ok().flatten(),
                "item {:?} from {}", buf, at
            );
        }

        #[test]
        fn arguments_framed_here_are_read_back_as_given(items in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..120), 1..20)) {
            let args = Args::from(&items[..]);
            proptest::prop_assert_eq!(args.len(), items.len());
            for (i, item) in items.iter().enumerate() {
                proptest::prop_assert_eq!(&args[i], &item[..]);
                proptest::prop_assert_eq!(&args.bytes(i)[..], &item[..]);
            }
            // The frame is the RESP array a client would send, and reads
            // back (through the request parser) as the same arguments.
            let mut buf = BytesMut::from(&args.frame()[..]);
            let (Parsed::Command, parsed) = parse_request(&mut buf, RespLimits::default()) else {
                return Err(proptest::test_runner::TestCaseError::fail("not a command"));
            };
            proptest::prop_assert!(buf.is_empty());
            proptest::prop_assert_eq!(parsed.wire(), args.frame().clone());
            proptest::prop_assert_eq!(&parsed.args, &args);
            // Any run of arguments, framed, is those arguments as a RESP
            // array's items.
            for from in 0..items.len() {
                for to in from..=items.len() {
                    let mut want = BytesMut::new();
                    for item in &items[from..to] {
                        put_bulk(&mut want, item);
                    }
                    proptest::prop_assert_eq!(args.framed(from..to), &want[..]);
                    proptest::prop_assert_eq!(parsed.args.framed(from..to), &want[..]);
                }
            }
        }

        #[test]
        fn a_length_line_is_what_formatting_writes(n: usize, small in 0usize..1000, prefix in proptest::sample::select(b"$*".to_vec())) {
            for n in [n, small, usize::MAX, 0, 9, 10, 99, 100] {
                let mut line = [0u8; LEN_LINE];
                let len = len_line(&mut line, prefix, n);
                proptest::prop_assert_eq!(len, len_line_size(n));
                let want = format!("{}{n}\r\n", prefix as char);
                proptest::prop_assert_eq!(&line[..len], want.as_bytes());
            }
        }

        #[test]
        fn number_line_reads_what_the_general_way_reads(buf in proptest::collection::vec(proptest::sample::select(b"0123456789\r\n-+a".to_vec()), 0..24), digits in "[0-9]{1,18}") {
            if let Some((n, cr)) = number_line(&buf, 0) {
                proptest::prop_assert_eq!(line_end(&buf, 0), Some(cr));
                proptest::prop_assert_eq!(int(&buf[..cr]), Some(n));
            }
            let line = format!("{digits}\r\n");
            // A leading zero is left to the general way (which requests refuse).
            let plain = digits.len() == 1 || !digits.starts_with('0');
            let want = plain.then(|| (digits.parse().unwrap(), digits.len()));
            proptest::prop_assert_eq!(number_line(line.as_bytes(), 0), want);
        }

        #[test]
        fn line_end_finds_what_a_window_scan_finds(buf in proptest::collection::vec(proptest::sample::select(vec![b'\r', b'\n', b'a']), 0..24), from in 0usize..24) {
            let from = from.min(buf.len());
            proptest::prop_assert_eq!(line_end(&buf, from), naive_line_end(&buf, from));
        }
    }

    #[test]
    fn a_reply_measured_ends_where_parsing_takes_it() {
        for frame in [
            &b"+OK\r\n:1\r\n"[..],
            b"$5\r\nhello\r\n$1",
            b"$-1\r\n",
            b"*2\r\n$1\r\na\r\n:7\r\n+x\r\n",
            b"%1\r\n+k\r\n+v\r\n",
            b"$5\r\nhel",
            b"*2\r\n:1\r\n",
            b"",
            b"?bad\r\n",
            b"$x\r\n",
            // Around the one-pass cases (a bulk string, +OK).
            b"+OK",
            b"+OK\r",
            b"+OKAY\r\n",
            b"+OK\r\n+OK\r\n",
            b"$0\r\n\r\n",
            b"$-1\r",
            b"$2\r\nab",
            b"$2\r\nabc\r\n",
            b"$01\r\na\r\n",
            // RESP3's null, and around it.
            b"_\r\n",
            b"_\r\n_\r\n",
            b"_\r",
            b"_x\r\n",
        ] {
            let mut buf = BytesMut::from(frame);
            let measured = measure_reply(frame);
            match parse_reply(&mut buf) {
                Frame::Done(reply) => assert_eq!(measured, Measured::Len(reply.len()), "{frame:?}"),
                Frame::Incomplete => assert_eq!(measured, Measured::Incomplete, "{frame:?}"),
                Frame::Invalid(e) => assert_eq!(measured, Measured::Invalid(e), "{frame:?}"),
            }
        }
    }

    #[test]
    fn array_start_reads_every_header_as_the_general_way_does() {
        let long = format!("*{}\r\n", 1u64 << 62);
        for (frame, n, want) in [
            (&b"*3\r\n$1\r\na"[..], 3, Some(4)),
            (b"*3\r\n", 2, None),
            (b"*12\r\n", 12, Some(5)),
            // Past the one-pass reader: a sign, a leading zero kept, 19 digits.
            (b"*+3\r\n", 3, Some(5)),
            (b"*03\r\n", 3, Some(5)),
            (long.as_bytes(), 1 << 62, Some(long.len())),
            (b"*-1\r\n", 1, None),
            (b"*3\r", 3, None),
            (b"*3\n", 3, None),
            (b"*\r\n", 0, None),
            (b"$3\r\n", 3, None),
            (b"", 0, None),
        ] {
            assert_eq!(array_start(frame, n), want, "{:?}", String::from_utf8_lossy(frame));
        }
    }

    #[test]
    fn int_at_the_edges() {
        for s in [
            "9223372036854775807",
            "-9223372036854775808",
            "9223372036854775808",
            "-9223372036854775809",
            "+1",
            "-0",
            "",
            "-",
            "+",
            "1 ",
            " 1",
            "00012",
        ] {
            assert_eq!(int(s.as_bytes()), naive_int(s.as_bytes()), "{s:?}");
        }
    }

    /// The scanner finds the same frame end as the whole-frame parser, fed
    /// any split of the bytes.
    #[test]
    fn scanner_agrees_with_the_parser_at_every_split() {
        let frames: [&[u8]; 12] = [
            b"%2\r\n+a\r\n:1\r\n$1\r\nb\r\n~2\r\n,1.5\r\n#t\r\n",
            b"_\r\n",
            b"|1\r\n+ttl\r\n:3\r\n*2\r\n(12345678901234567890\r\n=7\r\ntxt:abc\r\n",
            b"*2\r\n|1\r\n+k\r\n+v\r\n:1\r\n!3\r\nerr\r\n",
            b">2\r\n+message\r\n$1\r\nm\r\n",
            b"+OK\r\n",
            b"$5\r\nhello\r\n",
            b"$-1\r\n",
            b"*0\r\n",
            b"*3\r\n$1\r\na\r\n*2\r\n:1\r\n$-1\r\n-ERR x\r\n",
            b"*2\r\n*1\r\n*1\r\n$0\r\n\r\n+z\r\n",
            b"$12\r\nab\r\ncd\r\nefgh\r\n",
        ];
        for frame in frames {
            let mut stream = frame.to_vec();
            stream.extend_from_slice(b":7\r\n"); // the next reply must not be taken
            assert_eq!(frame_end(&stream, 0, 0), Ok(Some(frame.len())));
            for a in 0..=stream.len() {
                for b in a..=stream.len() {
                    let mut s = FrameScanner::default();
                    let mut taken = 0;
                    let mut done = false;
                    // Feed [0, a), then [.., b), then the rest; unconsumed
                    // bytes are offered again with the next piece.
                    for cut in [a, b, stream.len()] {
                        if done || cut < taken {
                            continue;
                        }
                        let (used, d) = s.scan(&stream[taken..cut]).unwrap();
                        taken += used;
                        done = d;
                    }
                    assert!(done, "{frame:?} split at {a}, {b}");
                    assert_eq!(taken, frame.len(), "{frame:?} split at {a}, {b}");
                }
            }
        }
        assert!(FrameScanner::default().scan(b"?x\r\n").is_err());
        assert!(FrameScanner::default().scan(b"$x\r\n").is_err());
    }

    #[test]
    fn requests() {
        let (Parsed::Command, c) = req(b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n") else { panic!() };
        assert_eq!(c.name(), "GET");
        assert_eq!(&c.args[1][..], b"key");
        let (Parsed::Command, c) = req(b"ping hello\r\n") else { panic!() };
        assert_eq!(c.args.len(), 2);
        assert_eq!(req(b"*2\r\n$3\r\nGET\r\n$3\r\nke").0, Parsed::Incomplete);
        assert!(matches!(req(b"*x\r\n").0, Parsed::Error(_)));
        // Lengths Redis would refuse (closing the server connection).
        for bad in [
            &b"*2\r\n$3\r\nGET\r\n$01\r\na\r\n"[..],
            b"*02\r\n$3\r\nGET\r\n$1\r\na\r\n",
            b"*+1\r\n$4\r\nPING\r\n",
            b"*1\r\n$+4\r\nPING\r\n",
            b"*-01\r\n",
            b"*1\r\n$-0\r\n",
        ] {
            assert!(matches!(req(bad).0, Parsed::Error(_)), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(matches!(req(b"*1\r\n$0\r\n\r\n").0, Parsed::Command));
        assert!(matches!(req(b"*1\r\n$10\r\n0123456789\r\n").0, Parsed::Command));
        assert!(matches!(req(b"*1\r\n$-5\r\n").0, Parsed::Error(_)));
        assert!(matches!(req(b"*1\r\n:5\r\n").0, Parsed::Error(_)));
        assert!(matches!(req(b"*1\r\n$3\r\nabcde\r\n").0, Parsed::Error(_)));
        let limits = RespLimits { max_args: 3, max_bulk: 4 };
        assert!(matches!(parse_request(&mut BytesMut::from(&b"*4\r\n"[..]), limits).0, Parsed::Error(_)));
        // A request whose arguments would pass 4 GiB is refused at the
        // header that takes it past, not after it is all buffered.
        let huge = RespLimits { max_args: 3, max_bulk: 8 << 30 };
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nSET\r\n$4294967290\r\nabc"[..]);
        let (Parsed::Error(e), _) = parse_request(&mut buf, huge) else { panic!("accepted a 4 GiB argument") };
        assert!(e.contains("4 GiB"), "{e}");
        // At the bound exactly: this argument's end (its header, 26 bytes
        // in, plus its length and CRLF) is u32::MAX, still taken; one byte
        // more is not.
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nSET\r\n$4294967267\r\nabc"[..]);
        assert!(matches!(parse_request(&mut buf, huge).0, Parsed::Incomplete));
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nSET\r\n$4294967268\r\nabc"[..]);
        assert!(matches!(parse_request(&mut buf, huge).0, Parsed::Error(_)));
        // An inline command's arguments are framed as a client would have
        // sent them in an array.
        let (Parsed::Command, inline) = req(b"MGET a bc\r\n") else { panic!("inline") };
        assert_eq!(inline.args.framed(1..3), b"$1\r\na\r\n$2\r\nbc\r\n");
        assert_eq!(inline.args.framed(0..1), b"$4\r\nMGET\r\n");
        // An argument over the limit is read past, whatever the pieces.
        let input = b"*3\r\n$3\r\nSET\r\n$5\r\nabcde\r\n$2\r\nxy\r\n*1\r\n$4\r\nPING\r\n";
        for piece in 1..input.len() {
            let mut buf = BytesMut::new();
            let mut chunks = input.chunks(piece);
            let mut skip = loop {
                buf.extend_from_slice(chunks.next().unwrap());
                match parse_request(&mut buf, limits).0 {
                    Parsed::TooLarge { len: 5, skip } => break skip,
                    Parsed::Incomplete => {}
                    other => panic!("{other:?}"),
                }
            };
            while !skip.advance(&mut buf).unwrap() {
                buf.extend_from_slice(chunks.next().unwrap());
            }
            for c in chunks {
                buf.extend_from_slice(c);
            }
            let (Parsed::Command, c) = parse_request(&mut buf, limits) else { panic!("piece {piece}") };
            assert_eq!(c.name(), "PING", "piece {piece}");
        }
        assert_eq!(&c.wire()[..], b"*2\r\n$4\r\nping\r\n$5\r\nhello\r\n");
    }

    #[test]
    fn replies() {
        // Counts no server sends are refused by both (found by fuzzing:
        // twice this count overflowed and the two disagreed).
        for bad in [&b"%8446744073709551615\r\n"[..], b"$9223372036854775800\r\n"] {
            assert!(matches!(parse_reply(&mut BytesMut::from(bad)), Frame::Invalid(_)));
            assert!(FrameScanner::default().scan(bad).is_err());
        }
        let mut b = BytesMut::from(&b"*3\r\n$1\r\na\r\n$-1\r\n*1\r\n:7\r\n+OK\r\n"[..]);
        let Frame::Done(f) = parse_reply(&mut b) else { panic!() };
        let items = array_items(&f).unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(&items[1][..], b"$-1\r\n");
        assert_eq!(parse_reply(&mut b), Frame::Done(Bytes::from_static(b"+OK\r\n")));
        let mut b = BytesMut::from(&b"$5\r\nab"[..]);
        assert_eq!(parse_reply(&mut b), Frame::Incomplete);
        assert_eq!(integer(b":42\r\n"), Some(42));
        assert!(matches!(parse_reply(&mut BytesMut::from(&b"?\r\n"[..])), Frame::Invalid(_)));
    }
}

#[cfg(test)]
mod skip_tests {
    use super::*;

    /// Many empty lines or empty arrays in a row are skipped without recursion.
    #[test]
    fn long_runs_of_empty_frames() {
        let mut input = BytesMut::new();
        for _ in 0..200_000 {
            input.extend_from_slice(b"\r\n*0\r\n");
        }
        input.extend_from_slice(b"PING\r\n");
        let (Parsed::Command, c) = parse_request(&mut input, RespLimits::default()) else { panic!() };
        assert_eq!(c.name(), "PING");
    }
}
