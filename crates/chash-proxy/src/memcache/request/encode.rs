//! A request as bytes again: what the proxy sends a server (a multi-get's
//! part, a request for another server), and what a request touches.

use bytes::{BufMut, Bytes, BytesMut};

use super::super::meta::MetaCmd;
use super::{ArithOp, Request, RetrievalCmd, StorageCmd};

impl Request {
    /// The key(s) this request touches, for routing (empty for proxy-level commands).
    pub fn single_key(&self) -> Option<&Bytes> {
        match self {
            Request::Storage { key, .. }
            | Request::Delete { key, .. }
            | Request::Arith { key, .. }
            | Request::Touch { key, .. } => Some(key),
            Request::Meta(m) if m.cmd != MetaCmd::Noop => Some(&m.real_key),
            _ => None,
        }
    }

    /// Whether the client asked for no reply.
    pub fn noreply(&self) -> bool {
        match self {
            Request::Storage { noreply, .. }
            | Request::Delete { noreply, .. }
            | Request::Arith { noreply, .. }
            | Request::Touch { noreply, .. }
            | Request::FlushAll { noreply, .. }
            | Request::Verbosity { noreply } => *noreply,
            _ => false,
        }
    }

    /// The bytes to send a backend for this request, always asking for a
    /// reply (the proxy drops it when the client said `noreply`, so that
    /// replies stay matched to requests in order).
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Request::Storage { cmd, key, flags, exptime, data, cas, .. } => {
                out.reserve(key.len() + data.len() + 64);
                out.put_slice(cmd.name().as_bytes());
                out.put_u8(b' ');
                out.put_slice(key);
                put_num(out, u64::from(*flags));
                put_int(out, *exptime);
                put_num(out, data.len() as u64);
                if *cmd == StorageCmd::Cas {
                    put_num(out, *cas);
                }
                out.put_slice(b"\r\n");
                out.put_slice(data);
                out.put_slice(b"\r\n");
            }
            Request::Retrieval { cmd, exptime, keys } => {
                out.reserve(keys.iter().map(|k| k.len() + 1).sum::<usize>() + 32);
                out.put_slice(cmd.name().as_bytes());
                if matches!(cmd, RetrievalCmd::Gat | RetrievalCmd::Gats) {
                    put_int(out, *exptime);
                }
                for k in keys {
                    out.put_u8(b' ');
                    out.put_slice(k);
                }
                out.put_slice(b"\r\n");
            }
            Request::Delete { key, .. } => {
                out.put_slice(b"delete ");
                out.put_slice(key);
                out.put_slice(b"\r\n");
            }
            Request::Arith { op, key, delta, .. } => {
                out.put_slice(if *op == ArithOp::Incr { b"incr " } else { b"decr " });
                out.put_slice(key);
                put_num(out, *delta);
                out.put_slice(b"\r\n");
            }
            Request::Touch { key, exptime, .. } => {
                out.put_slice(b"touch ");
                out.put_slice(key);
                put_int(out, *exptime);
                out.put_slice(b"\r\n");
            }
            Request::FlushAll { delay, .. } => {
                out.put_slice(b"flush_all");
                if let Some(d) = delay {
                    put_int(out, *d);
                }
                out.put_slice(b"\r\n");
            }
            Request::Version => out.put_slice(b"version\r\n"),
            Request::Verbosity { .. } => out.put_slice(b"verbosity 1\r\n"),
            Request::Stats { .. } => out.put_slice(b"stats\r\n"),
            Request::Quit => out.put_slice(b"quit\r\n"),
            Request::Meta(m) => m.encode(out, true),
        }
    }
}

/// Appends `' '` and `n` in decimal.
fn put_num(out: &mut BytesMut, n: u64) {
    out.put_u8(b' ');
    out.put_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Appends `' '` and a signed `n` in decimal.
fn put_int(out: &mut BytesMut, n: i64) {
    out.put_u8(b' ');
    out.put_slice(itoa::Buffer::new().format(n).as_bytes());
}
