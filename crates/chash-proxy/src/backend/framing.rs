//! The seam between transport and protocol: how a server's byte stream
//! splits into replies ([`Framing`]), what a reply is ([`Reply`]), and the
//! commands a new connection runs first ([`Setup`]). Each protocol folder
//! implements these; the backend knows only bytes.

use std::fmt;

use bytes::{Bytes, BytesMut};

/// What a [`Framing`] made of the front of a server's byte stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// One whole reply, as sent; its bytes have been taken.
    Done(Bytes),
    /// More bytes are needed (nothing was taken).
    Incomplete,
    /// The server sent something that is not a reply of this protocol.
    Invalid(String),
}

/// Where the reply at the front of a server's byte stream ends, found
/// without taking it ([`Framing::measure`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Measured {
    /// It is whole, and this long.
    Len(usize),
    /// More bytes are needed.
    Incomplete,
    /// The server sent something that is not a reply of this protocol.
    Invalid(String),
    /// The framing does not measure: [`Framing::parse`] takes its replies.
    Unknown,
}

/// What happens to a reply that keeps growing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Large {
    /// Held whole however large (memcached replies: bounded by the
    /// server's item size).
    Hold,
    /// Passed on to the client as it arrives once this many bytes are
    /// buffered and it is still incomplete.
    Stream {
        /// Bytes buffered before streaming starts.
        after: usize,
    },
    /// Needed whole (a part of a split command), up to this many bytes;
    /// a larger reply is read past and the request gets
    /// [`BackendError::TooLarge`](super::BackendError::TooLarge).
    Refuse {
        /// The largest reply held.
        limit: usize,
    },
}

/// How replies of one kind are framed. Implemented by the protocol
/// folders as zero-sized statics; a request names the framing its reply
/// needs.
pub trait Framing: Send + Sync + 'static {
    /// Takes one reply from the front of `buf` when it is complete.
    fn parse(&self, buf: &mut BytesMut) -> Frame;

    /// Where the reply at the front of `buf` ends, leaving it there (a
    /// reply passed on as it is can then be written from the read buffer,
    /// taken from it only if it has to wait). Defaults to
    /// [`Measured::Unknown`]: `parse` takes the replies.
    fn measure(&self, _buf: &[u8]) -> Measured {
        Measured::Unknown
    }

    /// What to do with a reply that keeps growing. Defaults to holding it.
    fn large(&self) -> Large {
        Large::Hold
    }

    /// A scanner that finds the end of one reply a piece at a time (needed
    /// unless [`large`](Framing::large) is `Large::Hold`).
    fn scanner(&self) -> Option<Box<dyn Scan>> {
        None
    }
}

/// Finds where one reply ends, fed its bytes in order.
pub trait Scan: Send {
    /// How many bytes at the front of `buf` belong to the reply (a header
    /// split across reads is left for the next call), and whether the reply
    /// ends there.
    ///
    /// # Errors
    /// Bytes that are not a reply of the protocol.
    fn scan(&mut self, buf: &[u8]) -> Result<(usize, bool), String>;
}

/// A server's reply to one request.
#[derive(Debug)]
pub enum Reply {
    /// The whole reply, as the server sent it.
    Whole(Bytes),
    /// A large reply passed on as it arrives (see [`ReplyStream`]).
    Stream(ReplyStream),
}

impl Reply {
    /// Its bytes when it is whole; 0 for a stream (whose chunks are
    /// bounded by its channel instead).
    pub(crate) fn whole_len(&self) -> usize {
        match self {
            Reply::Whole(b) => b.len(),
            Reply::Stream(_) => 0,
        }
    }
}

/// A piece of a streamed reply.
#[derive(Debug)]
pub struct Chunk {
    /// The next bytes of the reply, as the server sent them.
    pub data: Bytes,
    /// Whether they end it.
    pub last: bool,
}

/// A large reply on its way from a server, a chunk at a time (a few chunks
/// are buffered; the server connection waits for the client). A channel
/// that closes before the `last` chunk means the reply was cut short: the
/// client has part of a reply and its connection must close.
#[derive(Debug)]
pub struct ReplyStream(pub tokio::sync::mpsc::Receiver<Chunk>);

/// Commands a new server connection sends before any request (Redis `AUTH`
/// and `SELECT`); each reply must pass `check`, else the connection attempt
/// fails with the reason `check` gives.
#[derive(Clone)]
pub struct Setup {
    /// The commands, as sent.
    pub requests: Vec<Bytes>,
    /// How their replies are framed.
    pub framing: &'static dyn Framing,
    /// Accepts a reply, or says why the server refused the set-up.
    pub check: fn(&[u8]) -> Result<(), String>,
}

impl fmt::Debug for Setup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Setup").field("requests", &self.requests.len()).finish()
    }
}
