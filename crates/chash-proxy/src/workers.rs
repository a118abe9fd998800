//! Worker threads: one single-threaded runtime per thread, each with its own
//! client connections and its own backend connections.
//!
//! A request then lives on one thread from the client's socket to the
//! backend's and back: the client task, the backend connection it is queued
//! on and that connection's reply reader all run on the same thread, so
//! handing a request or a reply from one task to the next is a push onto a
//! local run queue, never a wake-up of another thread (a futex call and a
//! context switch). This is twemproxy's event loop, once per core.
//!
//! The price is connections: each worker opens its own `server_connections`
//! to every server, so a pool with `server_connections: 1` holds one
//! connection per server per worker (`chash proxy --threads 1` for exactly
//! twemproxy's count).
//!
//! Without worker threads ([`Workers::current`], the library default) every
//! task runs on the runtime that started the proxy, as one worker.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::watch;

thread_local! {
    /// The index of the worker whose thread this is (0 elsewhere).
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// The worker running the calling thread: 0 outside worker threads.
pub(crate) fn current_index() -> usize {
    WORKER.with(Cell::get)
}

/// Where the proxy's connections run.
#[derive(Debug)]
pub struct Workers {
    /// The worker runtimes; empty: the runtime that started the proxy.
    handles: Vec<Handle>,
    next: AtomicUsize,
    /// Dropped or set to true: the worker threads end.
    stop: watch::Sender<bool>,
}

impl Workers {
    /// No worker threads: everything runs on the calling runtime.
    pub fn current() -> Arc<Workers> {
        Arc::new(Workers { handles: Vec::new(), next: AtomicUsize::new(0), stop: watch::channel(false).0 })
    }

    /// Starts `threads` worker threads (at least one), each running a
    /// single-threaded runtime until [`Workers::stop`] or until the last
    /// reference is dropped.
    ///
    /// # Errors
    /// A thread or runtime that cannot be created.
    pub fn start(threads: usize) -> std::io::Result<Arc<Workers>> {
        let (stop, _) = watch::channel(false);
        let mut handles = Vec::new();
        for index in 0..threads.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .on_thread_park(std::thread::yield_now)
                .build()?;
            handles.push(runtime.handle().clone());
            let mut stopped = stop.subscribe();
            std::thread::Builder::new().name(format!("chash-worker-{index}")).spawn(move || {
                WORKER.with(|w| w.set(index));
                runtime.block_on(async move {
                    // Ends on stop, or when the sender is dropped.
                    let _ = stopped.wait_for(|&s| s).await;
                });
                // Dropping the runtime here cancels what is left on it.
            })?;
        }
        Ok(Arc::new(Workers { handles, next: AtomicUsize::new(0), stop }))
    }

    /// How many workers there are (1 without worker threads).
    pub fn count(&self) -> usize {
        self.handles.len().max(1)
    }

    /// Runs `task` on worker `index` (on the calling runtime without
    /// worker threads).
    pub fn spawn_on<F>(&self, index: usize, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.handles.get(index) {
            Some(handle) => handle.spawn(task),
            None => tokio::spawn(task),
        }
    }

    /// Serves an accepted TCP connection on the next worker in turn:
    /// `serve` gets the stream registered with that worker's runtime (or
    /// the error that prevented moving it there).
    pub fn serve_tcp<F, Fut>(&self, stream: tokio::net::TcpStream, serve: F)
    where
        F: FnOnce(std::io::Result<tokio::net::TcpStream>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        if self.handles.is_empty() {
            tokio::spawn(serve(Ok(stream)));
            return;
        }
        let index = self.next.fetch_add(1, Relaxed) % self.handles.len();
        // Move the socket from the accepting runtime's reactor to the
        // worker's.
        let moved = stream.into_std();
        self.handles[index].spawn(async move {
            serve(moved.and_then(tokio::net::TcpStream::from_std)).await;
        });
    }

    /// Ends the worker threads (tasks left on them are dropped).
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}
