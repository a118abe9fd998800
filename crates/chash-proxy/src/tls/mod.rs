//! TLS with rustls (the ring provider): the acceptor a pool serves its
//! clients with and the connector its server connections use, built from
//! the PEM files its config names ([`chash::PoolTls`]) and checked when
//! they are (certificate chains and keys that parse and match, CAs that
//! parse). Protocol-free: bytes in, bytes out.
//!
//! - `build`: the acceptor and connector from a pool's settings, every file
//!   checked;
//! - `live`: a pool's TLS as it runs, reloaded and reconfigured without a
//!   restart.

mod build;
mod live;

#[cfg(feature = "etcd")]
pub(crate) use build::check_client_files;
pub(crate) use build::Connector;
pub use build::TlsError;
pub use live::check;
pub(crate) use live::{warn_unverified, LiveTls};

/// How long a client's TLS handshake may take before its connection is
/// closed (a client that opens a connection and sends nothing holds no
/// more than its socket, and not for longer).
pub(crate) const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
