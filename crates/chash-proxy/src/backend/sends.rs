//! Replies written through to their clients in one system call per server
//! read instead of one `write` per client.
//!
//! A server connection's read often holds the replies of many clients
//! (each the one reply its client's writer offered: everything before it
//! written, nothing behind it). Written one `send` each, a proxy pays a
//! system call per reply; queued here instead ([`Sends::queue`]) and
//! written by [`Sends::flush`] at the end of the read, they go out in one
//! `io_uring_enter` on the worker thread's own ring.
//!
//! Each is sent with `MSG_DONTWAIT`: the kernel tries it at once and
//! completes it then, with what it wrote or `EAGAIN`, never waiting for
//! room in the client's socket. So every send has completed when the
//! call returns, and a flush is a synchronous, batched `send` whose
//! buffers are needed only until it returns. A short or failed send leaves
//! the rest of its reply to the client's writer, as a short `write` would
//! ([`super::ReplyAccount`]). A thread's ring is made on its first flush,
//! after a probe that the kernel completes a full socket's send at once;
//! where io_uring is refused (seccomp, `kernel.io_uring_disabled`), too old,
//! or turned off ([`set_enabled`]), replies are written one `send` each as
//! before.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;

use super::request::ReplyAccount;

/// Whether replies may be batched through io_uring (`chash proxy
/// --io-uring off` turns it off).
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns batched sends on or off for threads that have not made their ring
/// yet (set before the proxy starts).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Relaxed);
}

/// A reply queued for its client's socket.
pub(super) struct Queued {
    pub(super) account: Arc<ReplyAccount>,
    pub(super) slot: u32,
    /// Held until the send has completed: the socket stays open (its
    /// descriptor cannot be reused by another connection meanwhile).
    pub(super) socket: Arc<tokio::net::tcp::OwnedWriteHalf>,
    pub(super) bytes: Bytes,
}

/// The replies one server read wrote through, until [`Sends::flush`].
pub(crate) struct Sends {
    queued: Vec<Queued>,
    /// Results by queued index (bytes written, or minus an errno).
    results: Vec<i32>,
    on: bool,
}

impl Sends {
    /// Batches when this thread has a working ring (or can make one).
    pub(crate) fn new() -> Sends {
        Sends { queued: Vec::new(), results: Vec::new(), on: ring::available() }
    }

    /// Writes each reply at once, one by one (as where io_uring is
    /// unavailable).
    #[cfg(test)]
    pub(crate) fn one_by_one() -> Sends {
        Sends { queued: Vec::new(), results: Vec::new(), on: false }
    }

    /// Whether replies are queued (else written at once, one by one).
    #[inline]
    pub(super) fn on(&self) -> bool {
        self.on
    }

    /// Queues a reply; its slot says "being sent" until the flush.
    #[inline]
    pub(super) fn queue(&mut self, q: Queued) {
        self.queued.push(q);
    }

    /// Writes every queued reply, in one system call (more only past the
    /// ring's size), and settles each reply's slot by what was written.
    /// To be called before the buffer the replies came from is read into
    /// again, and before the task yields.
    pub(crate) fn flush(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        self.results.clear();
        ring::send_all(&self.queued, &mut self.results);
        for (q, &result) in self.queued.drain(..).zip(self.results.iter()) {
            q.account.sent(q.slot, q.bytes, result);
        }
    }
}

impl Drop for Sends {
    fn drop(&mut self) {
        // Nothing queued is left unwritten (its slot would wait forever).
        self.flush();
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod ring {
    //! The worker thread's io_uring, and the probe that it may be used.

    use std::cell::RefCell;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering::Relaxed;

    use io_uring::{opcode, types, IoUring};

    use super::Queued;

    /// Entries per submission; a flush of more goes in several.
    const ENTRIES: u32 = 256;

    enum State {
        Unknown,
        Off,
        On(IoUring),
    }

    thread_local! {
        static RING: RefCell<State> = const { RefCell::new(State::Unknown) };
    }

    /// Whether this thread batches its sends (its ring made and probed on
    /// the first call).
    pub(super) fn available() -> bool {
        RING.with(|r| {
            let mut state = r.borrow_mut();
            if let State::Unknown = *state {
                *state = if super::ENABLED.load(Relaxed) { make() } else { State::Off };
            }
            matches!(*state, State::On(_))
        })
    }

    fn make() -> State {
        let ring = match IoUring::new(ENTRIES) {
            Ok(ring) => ring,
            Err(e) => {
                tracing::info!("io_uring unavailable ({e}): replies are written one system call each");
                return State::Off;
            }
        };
        let mut ring = ring;
        match probe(&mut ring) {
            Ok(()) => State::On(ring),
            Err(why) => {
                tracing::info!("io_uring not used ({why}): replies are written one system call each");
                State::Off
            }
        }
    }

    /// Sends to a socket whose buffer is full must complete at once, with
    /// `EAGAIN`, not wait for room: a flush never blocks its worker.
    fn probe(ring: &mut IoUring) -> Result<(), String> {
        let (a, _b) = std::os::unix::net::UnixStream::pair().map_err(|e| e.to_string())?;
        a.set_nonblocking(true).map_err(|e| e.to_string())?;
        let chunk = vec![0u8; 64 * 1024];
        // The peer never reads: within a few MiB the socket is full.
        for _ in 0..1024 {
            let entry = opcode::Send::new(types::Fd(a.as_raw_fd()), chunk.as_ptr(), chunk.len() as u32)
                .flags(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                .build();
            // SAFETY: `chunk` outlives the send: it has completed (the
            // completion is read below) before this function returns,
            // or the ring is dropped (which waits for it) on the way out.
            unsafe { ring.submission().push(&entry) }.map_err(|e| e.to_string())?;
            ring.submit().map_err(|e| e.to_string())?;
            let Some(cqe) = ring.completion().next() else {
                // Waiting for room: not usable. The send may still read
                // `chunk` and use the socket: both are left to it.
                std::mem::forget(chunk);
                std::mem::forget(a);
                std::mem::forget(_b);
                return Err("a send to a full socket did not complete at once".into());
            };
            match cqe.result() {
                n if n > 0 => continue,
                n if -n == libc::EAGAIN => return Ok(()),
                n => return Err(std::io::Error::from_raw_os_error(-n).to_string()),
            }
        }
        Err("a socket never filled".into())
    }

    /// Sends every queued reply; `results[i]` is the i-th's outcome.
    pub(super) fn send_all(queued: &[Queued], results: &mut Vec<i32>) {
        results.resize(queued.len(), 0);
        RING.with(|r| {
            let mut state = r.borrow_mut();
            let State::On(ring) = &mut *state else {
                // Not reached (queued only with a ring): written one by one.
                for (q, result) in queued.iter().zip(results.iter_mut()) {
                    *result = match q.socket.try_write(&q.bytes) {
                        Ok(n) => n as i32,
                        Err(_) => 0,
                    };
                }
                return;
            };
            for (first, chunk) in (0..).step_by(ENTRIES as usize).zip(queued.chunks(ENTRIES as usize)) {
                submit(ring, first, chunk, results);
            }
        });
    }

    fn submit(ring: &mut IoUring, first: usize, chunk: &[Queued], results: &mut [i32]) {
        let mut left: usize = 0;
        {
            let mut sq = ring.submission();
            for (i, q) in chunk.iter().enumerate() {
                let stream: &tokio::net::TcpStream = (*q.socket).as_ref();
                let fd = stream.as_raw_fd();
                let len = u32::try_from(q.bytes.len()).unwrap_or(u32::MAX);
                let entry = opcode::Send::new(types::Fd(fd), q.bytes.as_ptr(), len)
                    .flags(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                    .build()
                    .user_data((first + i) as u64);
                // SAFETY: the bytes and the socket are held by `chunk`,
                // which outlives every send: each has completed when this
                // function returns (below). The queue has room: it is
                // empty before each chunk, of at most ENTRIES.
                match unsafe { sq.push(&entry) } {
                    Ok(()) => left += 1,
                    // Not sent: its client's writer writes it.
                    Err(_) => results[first + i] = 0,
                }
            }
        }
        let mut wait = 0;
        loop {
            if let Err(e) = ring.submitter().submit_and_wait(wait) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::warn!("io_uring_enter: {e}");
                }
            }
            for cqe in ring.completion() {
                if let Some(r) = usize::try_from(cqe.user_data()).ok().and_then(|i| results.get_mut(i)) {
                    *r = cqe.result();
                    left = left.saturating_sub(1);
                }
            }
            if left == 0 {
                return;
            }
            // Not expected (the probe saw sends complete at once): the
            // buffers must outlive the sends, so wait for them.
            wait = left;
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod ring {
    use super::Queued;

    pub(super) fn available() -> bool {
        false
    }

    pub(super) fn send_all(queued: &[Queued], results: &mut Vec<i32>) {
        results.clear();
        results.extend(queued.iter().map(|q| q.socket.try_write(&q.bytes).map_or(0, |n| n as i32)));
    }
}
