//! A connection slot's request queue: many submitters (client sessions on
//! the slot's worker thread, mostly), one receiver (the slot's task); and
//! the same, without a bound, from a server connection's writer to its
//! reader (the requests written, in order).
//!
//! What tokio's mpsc channels did here, for less per request: a push or a
//! pop is one uncontended lock of a `VecDeque` (every submitter and the
//! slot run on one worker thread), the receiver is woken only when it
//! waits, and submitters wait only when the queue is full.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Poll, Waker};

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;

use super::request::Job;

struct State<T> {
    jobs: VecDeque<T>,
    /// The receiver, when it waits for a job (or only for the end:
    /// `for_end`).
    waiting: Option<Waker>,
    /// The receiver waits for the last sender to go, not for jobs: a send
    /// leaves it be ([`Receiver::recv_or_end`]), unless it is `urgent`.
    for_end: bool,
    /// A job queued must be taken in even by a receiver that waits for
    /// the end only (a request with a deadline to time).
    urgent: bool,
    /// The receiver is gone or closed: sends fail.
    closed: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    capacity: usize,
    /// Senders alive; at 0 the receiver sees the end once the queue is empty.
    senders: AtomicUsize,
    /// Submitters waiting for room.
    full: AtomicUsize,
    room: Notify,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Not poisoned by a panic while locked: every change is one push
        // or pop, which a panic cannot leave half-done.
        self.state.lock()
    }
}

/// A queue of at most `capacity` jobs.
pub(super) fn channel<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State { jobs: VecDeque::new(), waiting: None, for_end: false, urgent: false, closed: false }),
        capacity: capacity.max(1),
        senders: AtomicUsize::new(1),
        full: AtomicUsize::new(0),
        room: Notify::new(),
    });
    (Sender(shared.clone()), Receiver(shared))
}

/// A connection slot's request queue, submitting side.
pub(super) type JobSender = Sender<Job>;

/// A connection slot's request queue, receiving side.
pub(super) type JobReceiver = Receiver<Job>;

/// The submitting side.
pub(super) struct Sender<T>(Arc<Shared<T>>);

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Sender<T> {
        self.0.senders.fetch_add(1, Relaxed);
        Sender(self.0.clone())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.0.senders.fetch_sub(1, Relaxed) == 1 {
            let waker = self.0.lock().waiting.take();
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

impl<T> Sender<T> {
    /// Queues every job of `jobs` (emptied) under one lock, whether or not
    /// the queue is full (a queue without a bound); an error, `jobs` left
    /// as they were, when the receiver is gone. `urgent`: the receiver
    /// takes them in even if it waits for the end only.
    pub(super) fn push_all(&self, jobs: &mut VecDeque<T>, urgent: bool) -> Result<(), ()> {
        let mut state = self.0.lock();
        if state.closed {
            return Err(());
        }
        if jobs.is_empty() {
            return Ok(());
        }
        state.urgent |= urgent;
        if state.jobs.is_empty() {
            // Capacities change hands: neither side allocates in the steady state.
            std::mem::swap(&mut state.jobs, jobs);
        } else {
            state.jobs.append(jobs);
        }
        wake_receiver(state);
        Ok(())
    }

    /// Queues `job` if there is room now and no one waits for room before
    /// it: `None`; else the job back, for [`Sender::send`] (which waits
    /// for room, or says the receiver is gone).
    pub(super) fn try_send(&self, job: T) -> Option<T> {
        let state = self.0.lock();
        if state.closed || state.jobs.len() >= self.0.capacity || self.0.full.load(Relaxed) > 0 {
            return Some(job);
        }
        self.queue(state, job);
        None
    }

    /// Queues `job`, waiting while the queue is full; the job back when
    /// the receiver is gone.
    pub(super) async fn send(&self, job: T) -> Result<(), T> {
        let mut job = Some(job);
        loop {
            let notified = self.0.room.notified();
            tokio::pin!(notified);
            {
                let state = self.0.lock();
                if state.closed {
                    return Err(job.take().expect("a job"));
                }
                if state.jobs.len() < self.0.capacity {
                    self.queue(state, job.take().expect("a job"));
                    return Ok(());
                }
                // Registered before the lock is let go: a pop after it
                // wakes this one.
                notified.as_mut().enable();
                self.0.full.fetch_add(1, Relaxed);
            }
            notified.await;
            self.0.full.fetch_sub(1, Relaxed);
        }
    }

    /// Puts `job` at the end of the queue `state` holds locked, and wakes
    /// the receiver if it waits.
    fn queue(&self, mut state: MutexGuard<'_, State<T>>, job: T) {
        state.jobs.push_back(job);
        wake_receiver(state);
    }

    /// Whether the receiver is gone (or closed).
    pub(super) fn is_closed(&self) -> bool {
        self.0.lock().closed
    }
}

/// Lets go of the queue `state` holds locked, then wakes the receiver if
/// it waits for a job.
fn wake_receiver<T>(mut state: MutexGuard<'_, State<T>>) {
    if state.for_end && !state.urgent {
        return;
    }
    let waker = state.waiting.take();
    drop(state);
    if let Some(w) = waker {
        w.wake();
    }
}

/// Why [`JobReceiver::try_recv`] got nothing.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Empty {
    /// Nothing queued now.
    Now,
    /// Nothing queued and no sender left.
    ForEver,
}

/// The receiving side (the slot's task).
pub(super) struct Receiver<T>(Arc<Shared<T>>);

impl<T> Drop for Receiver<T> {
    /// Jobs still queued are dropped now (their requesters get a closed
    /// reply), as no one will take them.
    fn drop(&mut self) {
        let jobs = {
            let mut state = self.0.lock();
            state.closed = true;
            std::mem::take(&mut state.jobs)
        };
        self.0.room.notify_waiters();
        drop(jobs);
    }
}

impl<T> Receiver<T> {
    /// The next job; `None` once every sender is gone and the queue is
    /// empty. Cancel-safe (a job is taken only when returned).
    pub(super) async fn recv(&mut self) -> Option<T> {
        self.recv_or_end(true).await
    }

    /// With `jobs`, [`Receiver::recv`]. Without, `None` once every sender
    /// is gone, and jobs sent meanwhile do not wake it (they wait in the
    /// queue, which may not be empty then) unless they were sent
    /// `urgent` ([`Sender::push_all`]): then the next job.
    pub(super) async fn recv_or_end(&mut self, jobs: bool) -> Option<T> {
        poll_fn(|cx| {
            let mut state = self.0.lock();
            if jobs || state.urgent {
                if let Some(job) = state.jobs.pop_front() {
                    if state.jobs.is_empty() {
                        state.urgent = false;
                    }
                    drop(state);
                    self.made_room(1);
                    return Poll::Ready(Some(job));
                }
                state.urgent = false;
            }
            if self.0.senders.load(Relaxed) == 0 {
                return Poll::Ready(None);
            }
            state.for_end = !jobs;
            match &state.waiting {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => state.waiting = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }

    /// A job queued now, if any.
    pub(super) fn try_recv(&mut self) -> Result<T, Empty> {
        let job = self.0.lock().jobs.pop_front();
        match job {
            Some(job) => {
                self.made_room(1);
                Ok(job)
            }
            None if self.0.senders.load(Relaxed) == 0 => Err(Empty::ForEver),
            None => Err(Empty::Now),
        }
    }

    /// Jobs queued now, in order, moved to the end of `into` under one
    /// lock while `weight` of those moved stays under `budget` (the last
    /// one taken may cross it). The weight taken.
    pub(super) fn take_up_to(&mut self, into: &mut Vec<T>, budget: usize, weight: impl Fn(&T) -> usize) -> usize {
        let (mut taken, before) = (0, into.len());
        let mut state = self.0.lock();
        while taken < budget {
            let Some(job) = state.jobs.pop_front() else { break };
            taken += weight(&job);
            into.push(job);
        }
        drop(state);
        self.made_room(into.len() - before);
        taken
    }

    /// Every job queued now, moved to the end of `into` under one lock.
    pub(super) fn take_all(&mut self, into: &mut VecDeque<T>) {
        let mut state = self.0.lock();
        if state.jobs.is_empty() {
            return;
        }
        let n = state.jobs.len();
        state.urgent = false;
        if into.is_empty() {
            std::mem::swap(into, &mut state.jobs);
        } else {
            into.append(&mut state.jobs);
        }
        drop(state);
        self.made_room(n);
    }

    /// No more jobs are taken (sends fail); those queued can still be
    /// received.
    pub(super) fn close(&mut self) {
        self.0.lock().closed = true;
        self.0.room.notify_waiters();
    }

    /// `n` jobs left the queue: as many submitters waiting for room are
    /// woken.
    fn made_room(&self, n: usize) {
        for _ in 0..n.min(self.0.full.load(Relaxed)) {
            self.0.room.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::framing::{Frame, Framing};
    use crate::backend::request::ReplyAccount;
    use bytes::{Bytes, BytesMut};
    use std::future::Future;

    struct Any;
    impl Framing for Any {
        fn parse(&self, _: &mut BytesMut) -> Frame {
            Frame::Incomplete
        }
    }

    type Answer = crate::backend::request::Pending;

    fn job(n: u8) -> (Job, Answer) {
        let (tx, rx) = ReplyAccount::new(1 << 20).reserve();
        let job = Job { data: Bytes::from(vec![n]), framing: &Any, frames: 1, reply: tx, deadline: None };
        (job, rx)
    }

    #[tokio::test]
    async fn jobs_come_out_in_order_and_a_full_queue_waits() {
        let (tx, mut rx) = channel(2);
        let (a, _ra) = job(1);
        let (b, _rb) = job(2);
        let (c, _rc) = job(3);
        tx.send(a).await.ok().unwrap();
        tx.send(b).await.ok().unwrap();
        let sender = tx.clone();
        let third = tokio::spawn(async move { sender.send(c).await.is_ok() });
        tokio::task::yield_now().await;
        assert!(!third.is_finished(), "a full queue makes the sender wait");
        assert_eq!(&rx.recv().await.unwrap().data[..], [1]);
        assert!(third.await.unwrap(), "room made, the send went through");
        assert_eq!(&rx.try_recv().ok().unwrap().data[..], [2]);
        assert_eq!(&rx.recv().await.unwrap().data[..], [3]);
        assert_eq!(rx.try_recv().err(), Some(Empty::Now));
        drop(tx);
        assert!(rx.recv().await.is_none(), "every sender gone: the end");
        assert_eq!(rx.try_recv().err(), Some(Empty::ForEver));
    }

    #[tokio::test(start_paused = true)]
    async fn jobs_taken_together_keep_their_order_stop_at_the_budget_and_make_room_for_each_waiter() {
        let (tx, mut rx) = channel(2);
        let (a, _ra) = job(1);
        let (b, _rb) = job(2);
        tx.send(a).await.ok().unwrap();
        tx.send(b).await.ok().unwrap();
        // Two submitters wait for room in the full queue.
        let mut waiters = Vec::new();
        for n in [3, 4] {
            let sender = tx.clone();
            waiters.push(tokio::spawn(async move {
                let (j, _r) = job(n);
                sender.send(j).await.is_ok()
            }));
        }
        tokio::task::yield_now().await;
        assert!(waiters.iter().all(|w| !w.is_finished()), "a full queue makes both wait");
        let mut into = Vec::new();
        assert_eq!(rx.take_up_to(&mut into, 10, |j| j.data.len()), 2, "everything queued, in one take");
        assert_eq!(into.iter().map(|j| j.data[0]).collect::<Vec<_>>(), [1, 2]);
        for w in waiters {
            // Paused time: a waiter never woken times out at once.
            let sent = tokio::time::timeout(std::time::Duration::from_secs(1), w).await;
            assert!(sent.expect("each job taken makes room for one waiter").unwrap());
        }
        // A budget of one byte: the first job crosses it, and is the only one taken.
        let mut rest = Vec::new();
        assert_eq!(rx.take_up_to(&mut rest, 1, |j| j.data.len()), 1);
        assert_eq!(rx.take_up_to(&mut rest, 64, |j| j.data.len()), 1, "the rest of what was queued");
        let mut got: Vec<u8> = rest.iter().map(|j| j.data[0]).collect();
        got.sort();
        assert_eq!(got, [3, 4]);
    }

    #[tokio::test]
    async fn a_closed_or_dropped_receiver_refuses_and_answers_what_waited() {
        let (tx, mut rx) = channel::<Job>(4);
        let (a, ra) = job(1);
        tx.send(a).await.ok().unwrap();
        rx.close();
        assert!(tx.is_closed());
        let (b, _rb) = job(2);
        assert!(tx.send(b).await.is_err(), "closed: the job comes back");
        assert!(rx.try_recv().is_ok(), "what was queued can still be taken");
        drop(ra);
        let (tx2, rx2) = channel(4);
        let (d, rd) = job(4);
        tx2.send(d).await.ok().unwrap();
        drop(rx2);
        let mut rd = rd;
        let heard = std::future::poll_fn(|cx| rd.poll_reply(cx)).await;
        assert!(
            matches!(heard, Err(crate::backend::BackendError::Closed(_))),
            "a job queued when the receiver went is dropped: its requester hears at once"
        );
    }

    #[tokio::test]
    async fn a_receiver_waiting_for_the_end_is_not_woken_by_sends() {
        let (tx, mut rx) = channel::<Job>(4);
        let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        struct Count(Arc<std::sync::atomic::AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Relaxed);
            }
        }
        let waker = Waker::from(Arc::new(Count(woken.clone())));
        let mut cx = std::task::Context::from_waker(&waker);
        {
            let ended = std::pin::pin!(rx.recv_or_end(false));
            assert!(ended.poll(&mut cx).is_pending());
        }
        let (a, _ra) = job(1);
        tx.send(a).await.ok().unwrap();
        assert_eq!(woken.load(Relaxed), 0, "a send leaves a receiver waiting for the end be");
        drop(tx);
        assert_eq!(woken.load(Relaxed), 1, "the last sender going wakes it");
        assert_eq!(&rx.try_recv().ok().unwrap().data[..], [1], "what was sent waits in the queue");
        assert!(rx.recv_or_end(false).await.is_none(), "ended");

        // One receiver, waiting for the end, then for a job: a send wakes
        // it then.
        let (tx, mut rx) = channel::<Job>(4);
        {
            let ended = std::pin::pin!(rx.recv_or_end(false));
            assert!(ended.poll(&mut cx).is_pending());
        }
        {
            let recv = std::pin::pin!(rx.recv());
            assert!(recv.poll(&mut cx).is_pending());
        }
        let (b, _rb) = job(2);
        tx.send(b).await.ok().unwrap();
        assert_eq!(woken.load(Relaxed), 2, "a receiver waiting for a job is woken by a send");
        assert_eq!(&rx.try_recv().ok().unwrap().data[..], [2]);

        // Waiting for the end: jobs pushed urgent wake it, and it takes
        // them in, one by one, as `recv` does; then it waits for the end
        // again.
        {
            let ended = std::pin::pin!(rx.recv_or_end(false));
            assert!(ended.poll(&mut cx).is_pending());
        }
        let (c, _rc) = job(3);
        let (d, _rd) = job(4);
        let mut urgent = VecDeque::from([c, d]);
        tx.push_all(&mut urgent, true).unwrap();
        assert_eq!(woken.load(Relaxed), 3, "an urgent push wakes a receiver waiting for the end");
        assert_eq!(&rx.recv_or_end(false).await.unwrap().data[..], [3]);
        assert_eq!(&rx.recv_or_end(false).await.unwrap().data[..], [4]);
        {
            let ended = std::pin::pin!(rx.recv_or_end(false));
            assert!(ended.poll(&mut cx).is_pending(), "nothing urgent left: it waits for the end");
        }
        let (e, _re) = job(5);
        let mut plain = VecDeque::from([e]);
        tx.push_all(&mut plain, false).unwrap();
        assert_eq!(woken.load(Relaxed), 3, "a push that is not urgent leaves it be");
        drop(tx);
        assert_eq!(woken.load(Relaxed), 4);
        assert!(rx.recv_or_end(false).await.is_none());
        assert_eq!(&rx.try_recv().ok().unwrap().data[..], [5]);
    }

    #[tokio::test]
    async fn a_waiting_receiver_wakes_on_a_send_and_on_the_last_sender_going() {
        let (tx, mut rx) = channel::<Job>(4);
        let waiter = tokio::spawn(async move {
            let first = rx.recv().await.map(|j| j.data);
            let end = rx.recv().await.is_none();
            (first, end)
        });
        tokio::task::yield_now().await;
        let (a, _ra) = job(7);
        tx.send(a).await.ok().unwrap();
        tokio::task::yield_now().await;
        drop(tx);
        let (first, end) = waiter.await.unwrap();
        assert_eq!(first.as_deref(), Some(&[7u8][..]));
        assert!(end);
    }
}
