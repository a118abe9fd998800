//! An in-process network for tests: named listeners that accept in-memory
//! streams, so a test can run servers, the proxy and clients in one
//! runtime with tokio's clock paused (no real socket whose readiness the
//! paused clock could race).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::io::DuplexStream;
use tokio::sync::mpsc;

static LISTENERS: Mutex<Option<HashMap<String, mpsc::UnboundedSender<DuplexStream>>>> = Mutex::new(None);

/// Listens on `name` (replacing whoever listened there): connections arrive
/// on the receiver; dropping it refuses further connections.
pub(crate) fn listen(name: &str) -> mpsc::UnboundedReceiver<DuplexStream> {
    let (tx, rx) = mpsc::unbounded_channel();
    LISTENERS.lock().unwrap().get_or_insert_with(HashMap::new).insert(name.to_owned(), tx);
    rx
}

/// Connects to `name`: refused when nobody listens there.
pub(crate) fn connect(name: &str) -> std::io::Result<DuplexStream> {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let listeners = LISTENERS.lock().unwrap();
    match listeners.as_ref().and_then(|l| l.get(name)) {
        Some(tx) if tx.send(theirs).is_ok() => Ok(ours),
        _ => Err(std::io::ErrorKind::ConnectionRefused.into()),
    }
}
