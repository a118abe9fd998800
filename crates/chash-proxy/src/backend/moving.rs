//! A server whose address moves: a Redis Sentinel master group, reached at
//! its current primary. Protocol-free: whoever discovers the address (the
//! Redis folder's Sentinel watcher) publishes a [`Target`]; connections
//! open to its `primary`, check it with `verify` first (Redis: `ROLE`),
//! wait up to `hold` while it is `switching`, and close (their outstanding
//! requests answered with an error) as soon as it switches.

use std::fmt;
use std::time::Duration;

use tokio::sync::watch;

use super::framing::Setup;

/// Where a moving server is now, as its discoverer says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    /// `HOST:PORT` of its primary, once known.
    pub primary: Option<String>,
    /// A switch is under way: requests wait (up to the hold) for the
    /// primary after it.
    pub switching: bool,
}

impl Target {
    /// The primary to send to now, unless it is switching.
    pub fn usable(&self) -> Option<&str> {
        self.primary.as_deref().filter(|_| !self.switching)
    }
}

/// A server reached at an address that moves.
pub struct Moving {
    /// Its name (the server line's id: the Sentinel group).
    pub name: String,
    /// Where it is now.
    pub target: watch::Receiver<Target>,
    /// How long requests wait for a usable target (zero: not at all).
    pub hold: Duration,
    /// Commands every connection to it runs after its set-up, each reply
    /// checked (Redis: `ROLE` must say `master`).
    pub verify: Option<Setup>,
}

impl fmt::Debug for Moving {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Moving").field("name", &self.name).field("target", &*self.target.borrow()).finish()
    }
}

impl PartialEq for Moving {
    fn eq(&self, other: &Moving) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for Moving {}

impl Moving {
    /// Waits up to the hold for a usable primary.
    ///
    /// # Errors
    /// Why there is none (the request may be tried again).
    pub(super) async fn primary(&self) -> Result<String, String> {
        let mut rx = self.target.clone();
        let wait = async {
            loop {
                if let Some(p) = rx.borrow_and_update().usable() {
                    return p.to_owned();
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        match tokio::time::timeout(self.hold, wait).await {
            Ok(p) => Ok(p),
            Err(_) => {
                let t = self.target.borrow().clone();
                Err(match t.primary {
                    None => format!("group {}: no primary known yet (its Sentinels have not answered)", self.name),
                    Some(p) => format!(
                        "group {}: failing over from {p}, no new primary within {} ms; try again",
                        self.name,
                        self.hold.as_millis()
                    ),
                })
            }
        }
    }
}

/// Resolves when a connection to `primary` must end: the target switched
/// away from it (or started switching). Never resolves for `None`.
pub(super) async fn switched(target: Option<&mut watch::Receiver<Target>>, primary: &str) {
    let Some(rx) = target else { return std::future::pending().await };
    loop {
        if rx.borrow_and_update().usable() != Some(primary) {
            return;
        }
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}
