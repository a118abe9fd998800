//! The error lines memcached answers bad requests with, shared by the
//! classic and the meta parsers.

/// An unknown command or an empty line.
pub(super) const ERROR: &[u8] = b"ERROR\r\n";
/// A line memcached cannot read.
pub(super) const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";
/// A data block not followed by `\r\n`.
pub(super) const BAD_CHUNK: &[u8] = b"CLIENT_ERROR bad data chunk\r\n";
/// A value over the size limit.
pub(super) const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";
/// A time that is not a number.
pub(super) const BAD_EXPTIME: &[u8] = b"CLIENT_ERROR invalid exptime argument\r\n";
