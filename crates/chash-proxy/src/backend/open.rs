//! Opening a server connection: TCP or Unix socket, TLS when the pool
//! speaks it, and the protocol's set-up commands, within the connect limit.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::framing::{Frame, Setup};
use super::request::{Address, BackendError};

pub(crate) type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
pub(crate) type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// How long a connection attempt may take without a pool timeout.
pub(super) const CONNECT_LIMIT: Duration = Duration::from_secs(10);

async fn connect(
    address: &Address,
    timeout: Option<Duration>,
    tls: Option<&crate::tls::Connector>,
) -> std::io::Result<(BoxRead, BoxWrite)> {
    let limit = timeout.unwrap_or(CONNECT_LIMIT).max(Duration::from_millis(100));
    let connecting = async {
        match address {
            Address::Tcp(a) => {
                let s = tokio::net::TcpStream::connect(a.as_str()).await?;
                s.set_nodelay(true)?;
                if let Some(tls) = tls {
                    // The handshake is part of the connection attempt: a
                    // failure is a failed connection, with its reason.
                    let host = a.rsplit_once(':').map_or(a.as_str(), |(host, _)| host);
                    let stream = tls
                        .connect(host, s)
                        .await
                        .map_err(|e| std::io::Error::new(e.kind(), format!("TLS handshake with {a}: {e}")))?;
                    let (r, w) = tokio::io::split(stream);
                    return Ok((Box::new(r) as BoxRead, Box::new(w) as BoxWrite));
                }
                let (r, w) = s.into_split();
                Ok::<(BoxRead, BoxWrite), std::io::Error>((Box::new(r), Box::new(w)))
            }
            Address::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p).await?;
                let (r, w) = s.into_split();
                Ok((Box::new(r) as BoxRead, Box::new(w) as BoxWrite))
            }
            // Resolved by `open` before it connects.
            Address::Moving(m) => {
                Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("group {} not resolved", m.name)))
            }
            #[cfg(test)]
            Address::Memory(name) => {
                let (r, w) = tokio::io::split(super::memory::connect(name)?);
                Ok((Box::new(r) as BoxRead, Box::new(w) as BoxWrite))
            }
        }
    };
    match tokio::time::timeout(limit, connecting).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")),
    }
}

/// An open, set-up connection.
pub(super) struct Opened {
    pub read: BoxRead,
    pub write: BoxWrite,
    /// The primary it was opened to, when the server's address moves.
    pub primary: Option<String>,
}

/// Connects and runs the set-up commands; either failing is a failed
/// connection attempt. A moving address is resolved first (waiting, up to
/// its hold, while it switches: [`BackendError::Retry`] when it does not
/// settle) and its connections are verified after the set-up.
pub(super) async fn open(
    address: &Address,
    timeout: Option<Duration>,
    setup: Option<&Setup>,
    tls: Option<&crate::tls::Connector>,
) -> Result<Opened, BackendError> {
    let (resolved, primary, verify) = match address {
        Address::Moving(m) => {
            let primary = m.primary().await.map_err(BackendError::Retry)?;
            (Address::Tcp(primary.clone()), Some(primary), m.verify.as_ref())
        }
        other => (other.clone(), None, None),
    };
    let (mut r, mut w) = connect(&resolved, timeout, tls).await.map_err(|e| BackendError::Connect(e.to_string()))?;
    for setup in [setup, verify].into_iter().flatten() {
        let exchange = run_setup(&mut r, &mut w, setup);
        match tokio::time::timeout(timeout.unwrap_or(CONNECT_LIMIT), exchange).await {
            Ok(result) => result.map_err(BackendError::Connect)?,
            Err(_) => return Err(BackendError::Connect("connection set-up timed out".into())),
        }
    }
    Ok(Opened { read: r, write: w, primary })
}

/// Sends the set-up commands and checks each reply.
async fn run_setup(r: &mut BoxRead, w: &mut BoxWrite, setup: &Setup) -> Result<(), String> {
    for cmd in &setup.requests {
        w.write_all(cmd).await.map_err(|e| e.to_string())?;
    }
    let mut buf = BytesMut::new();
    let mut answered = 0;
    while answered < setup.requests.len() {
        match setup.framing.parse(&mut buf) {
            Frame::Done(reply) => {
                (setup.check)(&reply)?;
                answered += 1;
            }
            Frame::Invalid(e) => return Err(e),
            Frame::Incomplete => {
                if r.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
                    return Err("server closed the connection during set-up".into());
                }
            }
        }
    }
    Ok(())
}
