//! A Redis client connection: commands parsed from its bytes and sent to
//! their servers at once, multi-key commands split by server and their
//! replies reassembled, and the commands the proxy answers itself.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

use super::command::{keys_of, route, Gather, Route};
use super::errors::{arity, backend_error, err, forward_error};
use super::resp::{
    array_items, array_start, error, integer, item_end, len_line_size, parse_request_into, put_len, Command, Parsed,
    RespLimits, Skip, STREAMED, WHOLE,
};
use crate::backend::{BackendError, Job, Pending, Pinned, Reply, Requester, Server, Submitted};
use crate::conn::{bytes_reply, later, ready_owned, Out, PendingReply, Session, Step};
use crate::options::Shared;
use crate::pool::Pool;
use crate::pool::{routes_as_decided, LoadRelease, PoolState};

/// One Redis client connection's state.
pub(crate) struct RedisSession {
    pub(super) pool: Arc<Pool>,
    pub(super) shared: Arc<Shared>,
    pub(super) requester: Requester,
    pub(super) limits: RespLimits,
    pub(super) authed: bool,
    /// Who the client logged in as (`None`: not logged in, or a pool
    /// without logins).
    pub(super) login: Option<super::access::Login>,
    /// The rest of a refused command, dropped as it arrives.
    pub(super) skip: Option<Skip>,
    /// A transaction being queued (between `MULTI` and `EXEC`).
    pub(super) tx: Option<Transaction>,
    /// `CLIENT SETNAME` and `CLIENT SETINFO` of this connection.
    pub(super) name: Option<Bytes>,
    pub(super) lib: [Option<Bytes>; 2],
    /// Keys watched (`WATCH`), on a server connection of this client's own.
    pub(super) watch: Option<Watch>,
    /// Channels and patterns listened to (`SUBSCRIBE` ...).
    pub(super) sub: Option<super::pubsub::Subscribed>,
    /// A Sentinel pool whose reads may go to replicas: its policy.
    pub(super) reads: Option<chash::ReadPolicy>,
    /// Where a split command's parts are framed ([`RedisSession::split`]),
    /// kept from command to command: the parts are dropped once written to
    /// their servers, so the next command's reuse the same memory.
    split_buf: BytesMut,
    /// Where a split command's reply is put together (`MGET`), lent to
    /// each [`Gathering`] and reclaimed once its reply has been written to
    /// the client (`None` until the first).
    merge_buf: Option<BytesMut>,
    /// Where each request is parsed ([`parse_request_into`]): the common
    /// command is forwarded from here, not moved; any other is taken out
    /// for the general path.
    parsed: Command,
}

/// The largest split command (its parts framed) whose parts are framed in
/// the session's kept buffer; larger ones get a buffer of their own, so a
/// session keeps at most this much (with [`MERGE_BUF`], 20 KiB once it has
/// split a command, beside its connection's 16 KiB read and write
/// buffers).
const SPLIT_BUF: usize = 16 * 1024;

/// The size of a new kept buffer at least: room for several commands.
const SPLIT_BUF_MIN: usize = 1024;

/// The size of the buffer a session lends to its split commands' replies
/// (`MERGE_BUF`): larger replies get one of their own.
const MERGE_BUF: usize = 4 * 1024;

/// The server connection a client's `WATCH` went on: its `EXEC` goes on
/// the same one, and nothing of another client's does.
pub(super) struct Watch {
    pub(super) server: Arc<Server>,
    pub(super) pinned: Pinned,
    /// The state the keys were watched by: `EXEC` by one where they may
    /// be elsewhere ([`same_placement`](crate::pool::same_placement))
    /// aborts.
    pub(super) state: Arc<PoolState>,
}

/// A transaction's commands, queued by the proxy until `EXEC`, then sent
/// to their server together (`MULTI`, the commands, `EXEC` in one write on
/// one connection, nothing of another client's between them).
#[derive(Default)]
pub(super) struct Transaction {
    pub(super) commands: Vec<Command>,
    /// The server of its keys.
    pub(super) server: Option<Arc<Server>>,
    /// Why it will be discarded at `EXEC`, if a command was refused.
    pub(super) refused: bool,
    pub(super) bytes: usize,
    /// Its commands' keys (moved first at `EXEC` during a migration).
    pub(super) keys: Vec<Bytes>,
    /// The state `server` was found by (`None`: no key yet): found again
    /// at `EXEC` unless its keys are still where that state put them
    /// ([`same_placement`](crate::pool::same_placement)).
    pub(super) queued: Option<Arc<PoolState>>,
}

/// What [`RedisSession::forward_now`] did.
enum Forward {
    /// Sent (or answered by the proxy): the reply.
    Sent(PendingReply),
    /// Waiting for room in its server connection's queue.
    Full(Box<Full>),
    /// Not sent: the state it would be routed by is not the one its keys'
    /// moves were decided by (a change came meanwhile); it decides again.
    Changed,
}

/// A command waiting for room in its server connection's queue.
pub(crate) struct Full {
    server: Arc<Server>,
    job: Box<Job>,
    pending: Pending,
    load: Option<LoadRelease>,
}

/// A client counted in `blocked_clients` while it lives (its reply
/// given, or given up).
struct BlockedClient(Arc<Pool>);

impl BlockedClient {
    fn new(pool: Arc<Pool>) -> BlockedClient {
        pool.counters().blocked_clients.fetch_add(1, Relaxed);
        BlockedClient(pool)
    }
}

impl Drop for BlockedClient {
    fn drop(&mut self) {
        self.0.counters().blocked_clients.fetch_sub(1, Relaxed);
    }
}

impl RedisSession {
    pub(crate) fn new(pool: Arc<Pool>, shared: Arc<Shared>, requester: Requester) -> RedisSession {
        let limits = RespLimits {
            max_args: 1 << 20,
            max_bulk: shared.options.max_value(super::resp::DEFAULT_MAX_VALUE).max(512),
        };
        let authed = !super::access::needs_login(pool.spec());
        let reads = pool.spec().sentinel.as_ref().map(|s| s.read_policy).filter(|p| *p != chash::ReadPolicy::Primary);
        RedisSession {
            pool,
            shared,
            requester,
            limits,
            authed,
            login: None,
            skip: None,
            tx: None,
            name: None,
            lib: [None, None],
            watch: None,
            sub: None,
            reads,
            split_buf: BytesMut::new(),
            merge_buf: None,
            parsed: Command::default(),
        }
    }
}

/// How many times a command decides where its keys are before it is
/// refused (`TRYAGAIN`) because the pool's migration changed each time.
pub(super) const DECIDE_TRIES: usize = 4;

/// The refusal of a command whose pool changed (a change armed or
/// completed, a server ejected) each time it decided where its keys are.
pub(super) fn changed(pool: &Pool) -> PendingReply {
    err(
        pool,
        format!("TRYAGAIN chash-proxy: pool {} changed {DECIDE_TRIES} times while the command was routed", pool.name()),
    )
}

/// What [`RedisSession::next_now`] leaves to [`RedisSession::next_later`].
/// Small (the command itself stays in the session until taken), so that
/// the step is not copied on its way.
pub(crate) enum Later {
    /// A request that is not a command to forward at once (an error, an
    /// HTTP word, an argument over the limit): never `Parsed::Command`.
    Request(Parsed),
    /// A command (counted) for the general path: the session's parsed
    /// one.
    Command,
    /// A command whose server's queue was full.
    Full(Box<Full>),
}

impl Session for RedisSession {
    type Later = Later;

    fn next_now(&mut self, buf: &mut BytesMut) -> Result<Step, Later> {
        if let Some(skip) = &mut self.skip {
            match skip.advance(buf) {
                Ok(true) => self.skip = None,
                Ok(false) => return Ok(Step::More),
                Err(msg) => return Ok(Step::Close { reply: Some(err(&self.pool, format!("ERR {msg}"))), error: true }),
            }
        }
        match parse_request_into(buf, self.limits, &mut self.parsed) {
            Parsed::Command => {}
            Parsed::Incomplete => return Ok(Step::More),
            other => return Err(Later::Request(other)),
        }
        // `GET` or `SET` (never an HTTP word: that is looked for in the
        // others only).
        let common = super::command::common_key(&self.parsed.args);
        if common.is_none() && crate::redis::resp::is_http_word(&self.parsed.args[0]) {
            return Err(Later::Request(Parsed::Http));
        }
        self.pool.counters().requests.fetch_add(1, Relaxed);
        if self.sub.is_none() && self.plain() {
            if let Some(position) = common {
                // `GET` or `SET` of a plain session: to the key's server,
                // with no future made (the commonest path).
                let cmd = &self.parsed;
                let step = match self.forward_now(&cmd.args[position], cmd, None) {
                    Forward::Sent(reply) => Ok(Step::Reply(reply)),
                    Forward::Full(full) => Err(Later::Full(full)),
                    // A migration began after `plain` was asked: the
                    // general path, which moves the key first.
                    Forward::Changed => return Err(Later::Command),
                };
                // The frame let go now: the client's read buffer is not
                // held shared until the next request.
                self.parsed.args.clear();
                return step;
            }
        }
        Err(Later::Command)
    }

    async fn next_later(&mut self, later: Later, _buf: &mut BytesMut) -> Step {
        let cmd = match later {
            Later::Full(full) => return Step::Reply(self.forward_waiting(full).await),
            Later::Command => std::mem::take(&mut self.parsed),
            Later::Request(Parsed::Incomplete) => return Step::More,
            Later::Request(Parsed::Error(msg)) => {
                return Step::Close { reply: Some(err(&self.pool, format!("ERR {msg}"))), error: true }
            }
            // (`Command` is not sent here: a command goes as `Later::Command`.)
            Later::Request(Parsed::Http | Parsed::Command) => return self.http_refused(),
            Later::Request(Parsed::TooLarge { len, skip }) => {
                self.skip = Some(skip);
                self.pool.counters().requests.fetch_add(1, Relaxed);
                return Step::Reply(err(
                    &self.pool,
                    format!(
                        "ERR argument of {len} bytes is over chash-proxy's limit of {} bytes (chash proxy \
                         --max-value-size)",
                        self.limits.max_bulk
                    ),
                ));
            }
        };
        let mut name_buf = [0u8; 32];
        let name = cmd.name_in(&mut name_buf);
        if self.sub.is_some() || name == "RESET" || super::pubsub::pubsub_kind(name).is_some() {
            let name = name.to_owned();
            return self.pubsub_step(&name, cmd).await;
        }
        if self.plain() {
            // The common case, without the general path's layers:
            // a client logged in (or needing no login), no
            // transaction, no migration; a command of one key, to
            // its server (or a replica, by the read policy, in
            // `forward_now`).
            let route = route(name, &cmd.args);
            if let Route::Key(position) = route {
                match self.forward_now(&cmd.args[position], &cmd, None) {
                    // Inline, not `forward`'s future.
                    Forward::Sent(reply) => return Step::Reply(reply),
                    Forward::Full(full) => return Step::Reply(self.forward_waiting(full).await),
                    // A migration began: the general path below.
                    Forward::Changed => {}
                }
            }
            let quit = name == "QUIT";
            let reply = self.dispatch_routed(name, cmd, route).await;
            return if quit { Step::Close { reply: Some(reply), error: false } } else { Step::Reply(reply) };
        }
        let quit = name == "QUIT";
        let reply = self.dispatch_named(name, cmd).await;
        if quit {
            Step::Close { reply: Some(reply), error: false }
        } else {
            Step::Reply(reply)
        }
    }
}

impl RedisSession {
    /// Whether a transaction is being queued.
    pub(super) fn in_transaction(&self) -> bool {
        self.tx.is_some()
    }

    /// `RESET`: the transaction discarded, nothing watched, RESP2, no
    /// client name, logged out (a pool with logins asks again).
    pub(super) fn reset(&mut self) {
        self.tx = None;
        self.watch = None;
        self.name = None;
        self.requester.dialect = 0;
        self.login = None;
        self.authed = !super::access::needs_login(self.pool.spec());
    }

    /// The transaction being queued is discarded at `EXEC` (a command it
    /// cannot hold was sent).
    pub(super) fn refuse_transaction(&mut self) {
        if let Some(tx) = self.tx.as_mut() {
            tx.refused = true;
        }
    }

    /// Redis's `NOPERM` for a command that may change data, asked by a
    /// read-only user (its flags in the command table; scripts and
    /// functions may write whatever their flags say, except the `_RO`
    /// ones).
    fn refused_to_readonly(&self, name: &str, cmd: &Command) -> Option<PendingReply> {
        let script_change = name == "SCRIPT"
            && cmd.args.get(1).is_some_and(|a| a.eq_ignore_ascii_case(b"FLUSH") || a.eq_ignore_ascii_case(b"LOAD"));
        let writes = matches!(name, "EVAL" | "EVALSHA" | "FCALL")
            || script_change
            || super::command::spec_of(&cmd.args).is_some_and(|spec| spec.write);
        writes.then(|| {
            self.pool.counters().noperm.fetch_add(1, Relaxed);
            // Redis 7.0's wording (the installed redis-server's).
            err(
                &self.pool,
                format!(
                    "NOPERM this user has no permissions to run the '{}' command",
                    String::from_utf8_lossy(&cmd.args[0]).to_ascii_lowercase()
                ),
            )
        })
    }

    /// An HTTP request on a Redis pool: closed at once, logged and counted,
    /// as redis-server does ("Possible SECURITY ATTACK detected").
    fn http_refused(&self) -> Step {
        self.pool.counters().http_refused.fetch_add(1, Relaxed);
        tracing::warn!(
            pool = %self.pool.name(),
            client = self.requester.affinity,
            "possible security attack: an HTTP request on a Redis pool (a browser, or a request forgery aimed at the cache); connection closed"
        );
        Step::Close { reply: None, error: true }
    }
}

impl RedisSession {
    pub(super) async fn dispatch(&mut self, cmd: Command) -> PendingReply {
        let mut name_buf = [0u8; 32];
        let name = cmd.name_in(&mut name_buf).to_owned();
        self.dispatch_named(&name, cmd).await
    }

    /// [`RedisSession::dispatch`] of a command whose name (in capitals,
    /// `Command::name_in`) is known.
    async fn dispatch_named(&mut self, name: &str, cmd: Command) -> PendingReply {
        let pool = &self.pool;
        if !self.authed && !matches!(name, "AUTH" | "HELLO" | "QUIT") {
            return err(pool, "NOAUTH Authentication required.".into());
        }
        if self.login.as_ref().is_some_and(|l| l.readonly) {
            if let Some(refused) = self.refused_to_readonly(name, &cmd) {
                if let Some(tx) = self.tx.as_mut() {
                    tx.refused = true;
                }
                return refused;
            }
        }
        if self.tx.is_some() && !matches!(name, "MULTI" | "EXEC" | "DISCARD" | "WATCH" | "QUIT") {
            return self.queue(name, cmd);
        }
        let route = route(name, &cmd.args);
        self.dispatch_routed(name, cmd, route).await
    }

    /// Whether a command goes its route with nothing of the session's to
    /// check first: logged in without restrictions, no transaction being
    /// queued, no migration under way.
    fn plain(&self) -> bool {
        self.authed && self.tx.is_none() && !self.login.as_ref().is_some_and(|l| l.readonly) && !self.pool.migrating()
    }

    /// [`RedisSession::dispatch_named`] once the session's checks are
    /// passed and the command's `route` is known.
    async fn dispatch_routed(&mut self, name: &str, cmd: Command, route: Route) -> PendingReply {
        // A command's keys are moved (a migration) and routed by one state
        // (or, with no migration, by any without one): when the state it
        // would be routed by is another (a change armed, completed or
        // replaced in between, a server ejected), it decides again. One
        // more try is what a change costs; a try after the first asks the
        // state itself, not the flag that sent it here.
        for attempt in 0..DECIDE_TRIES {
            let mut decided = None;
            if attempt > 0 || self.pool.migrating() {
                if let Some(reply) = self.read_where_it_is(&route, &cmd).await {
                    return reply;
                }
                if let Some(positions) = keys_of(&route, cmd.args.len()) {
                    match self.move_first(positions.iter().map(|&p| &cmd.args[p])).await {
                        Ok(state) => decided = state,
                        Err(refused) => return refused,
                    }
                }
            }
            let decided = decided.as_ref();
            let pool = &self.pool;
            match &route {
                Route::Transaction => return self.transaction(name, cmd).await,
                Route::Proxy => return self.proxy_command(name, &cmd),
                Route::Script => return self.script(cmd).await,
                Route::Everywhere(what) => return self.everywhere(*what, cmd).await,
                Route::Arity => return err(pool, arity(&String::from_utf8_lossy(&cmd.args[0]))),
                Route::Refused(why) => {
                    return err(
                        pool,
                        format!("ERR '{}' is not supported by chash-proxy: {why}", cmd.name().to_ascii_lowercase()),
                    )
                }
                Route::Key(position) => {
                    if let Some(reply) = self.forward(&cmd.args[*position], &cmd, decided).await {
                        return reply;
                    }
                }
                Route::Keys(positions) if positions.len() == 1 => {
                    if let Some(reply) = self.forward(&cmd.args[positions[0]], &cmd, decided).await {
                        return reply;
                    }
                }
                Route::Keys(positions) => match self.server_of_all(name, &cmd, positions, decided) {
                    Ok(Some(server)) => return self.send(server, &cmd).await,
                    Ok(None) => {}
                    Err(refused) => return refused,
                },
                Route::Blocking(positions) => match self.server_of_all(name, &cmd, positions, decided) {
                    Ok(Some(server)) => return self.blocking(server, name, cmd).await,
                    Ok(None) => {}
                    Err(refused) => return refused,
                },
                Route::Split { step, gather } => {
                    if let Some(reply) = self.split(&cmd, 1, *step, *gather, decided).await {
                        return reply;
                    }
                }
            }
        }
        changed(&self.pool)
    }

    /// The one server the keys at `positions` are on, routed as their
    /// moves were decided by `decided` (`None`: this worker's state is
    /// another now; decide again); or the error: keys on several servers
    /// (the hash-tag advice), no live server.
    fn server_of_all(
        &self,
        name: &str,
        cmd: &Command,
        positions: &[usize],
        decided: Option<&Arc<PoolState>>,
    ) -> Result<Option<Arc<Server>>, PendingReply> {
        let pool = &self.pool;
        let state = pool.routing_guard();
        if !routes_as_decided(&state, decided) {
            return Ok(None);
        }
        let mut server: Option<&Arc<Server>> = None;
        for &p in positions {
            let Some(s) = state.server_for(&cmd.args[p]) else {
                return Err(ready_owned(forward_error(pool, "ERR no live server in pool".into())));
            };
            match server {
                Some(first) if !Arc::ptr_eq(first, s) => {
                    return Err(err(
                        pool,
                        format!(
                            "ERR '{}' keys are on different servers; keys used together need a common hash tag such \
                             as {{user:1}} (pool hash_tag)",
                            name.to_ascii_lowercase()
                        ),
                    ));
                }
                _ => server = Some(s),
            }
        }
        server.cloned().map(Some).ok_or_else(|| err(pool, arity(name)))
    }

    /// A blocking command, on a server connection of the client's own
    /// (one of the server's `blocking_connections`), answered when the
    /// server answers: the command's own timeout governs. A client that
    /// goes while blocked has that connection closed at once, so the
    /// server does not hand it an element; after the reply the connection
    /// is clean and kept for the next blocked client.
    async fn blocking(&self, server: Arc<Server>, name: &str, cmd: Command) -> PendingReply {
        let pool = &self.pool;
        let cap = pool.spec().blocking_connections as usize;
        let Some(place) = server.try_block(cap) else {
            pool.counters().blocking_refused.fetch_add(1, Relaxed);
            return err(
                pool,
                format!(
                    "ERR chash-proxy: {cap} clients are blocked on server {} already, its limit (pool key \
                     blocking_connections): retry later, or raise the limit",
                    server.id()
                ),
            );
        };
        let wait = super::command::blocking_wait(name, &cmd.args);
        let pinned = server.pin(&self.requester);
        let pending = server.submit_blocking(&pinned, cmd.wire(), STREAMED, &self.requester, wait).await;
        let pool = pool.clone();
        let account = self.requester.account.clone();
        pool.counters().blocking_commands.fetch_add(1, Relaxed);
        let counted = BlockedClient::new(pool.clone());
        later(async move {
            let _held = (place, counted);
            tokio::select! {
                biased;
                reply = server.finish(pending) => Some(match reply {
                    Ok(Reply::Whole(frame)) => {
                        server.release(pinned);
                        Out::Bytes(frame)
                    }
                    Ok(Reply::Stream(stream)) => Out::Stream(stream),
                    Err(e) => Out::Bytes(backend_error(&pool, server.id(), &e)),
                }),
                // Dropping the connection closes it: the server drops the
                // blocked client with it.
                () = account.gone() => None,
            }
        })
    }

    /// `SCRIPT LOAD`, `EXISTS` or `FLUSH` on every server: the same SHA
    /// everywhere (so `EVALSHA` works wherever its keys are), a script
    /// known only if every server knows it, flushed everywhere.
    async fn script(&self, cmd: Command) -> PendingReply {
        let servers: Vec<Arc<Server>> = self.pool.state().live().map(|m| m.server.clone()).collect();
        if servers.is_empty() {
            return ready_owned(forward_error(&self.pool, "ERR no live server in pool".into()));
        }
        let exists = cmd.args[1].eq_ignore_ascii_case(b"EXISTS");
        let data = cmd.wire();
        let mut waits = Vec::with_capacity(servers.len());
        for server in servers {
            let pending = server.submit(data.clone(), WHOLE, &self.requester).await;
            waits.push((server, pending));
        }
        let pool = self.pool.clone();
        bytes_reply(async move {
            let mut first: Option<Bytes> = None;
            let mut known: Option<Vec<bool>> = None;
            for (server, pending) in waits {
                let frame = match server.finish(pending).await {
                    Ok(Reply::Whole(f)) => f,
                    Ok(Reply::Stream(_)) => return Some(error("ERR backend sent an unexpected reply")),
                    Err(e) => return Some(backend_error(&pool, server.id(), &e)),
                };
                if frame.starts_with(b"-") {
                    return Some(frame);
                }
                if exists {
                    let flags: Vec<bool> =
                        array_items(&frame).unwrap_or_default().iter().map(|i| integer(i) == Some(1)).collect();
                    known = Some(match known {
                        None => flags,
                        Some(k) => k.iter().zip(&flags).map(|(a, b)| *a && *b).collect(),
                    });
                }
                first.get_or_insert(frame);
            }
            Some(match known {
                Some(k) => {
                    let mut out = BytesMut::from(format!("*{}\r\n", k.len()).as_bytes());
                    for flag in k {
                        out.extend_from_slice(if flag { b":1\r\n" } else { b":0\r\n" });
                    }
                    out.freeze()
                }
                None => first.unwrap_or_else(|| Bytes::from_static(b"+OK\r\n")),
            })
        })
    }

    async fn forward(&self, key: &[u8], cmd: &Command, decided: Option<&Arc<PoolState>>) -> Option<PendingReply> {
        match self.forward_now(key, cmd, decided) {
            Forward::Sent(reply) => Some(reply),
            Forward::Full(full) => Some(self.forward_waiting(full).await),
            Forward::Changed => None,
        }
    }

    /// Sends a command of one key to its server now, without waiting:
    /// its reply; or, when the server connection's queue is full, what
    /// [`RedisSession::forward_waiting`] queues once there is room. Routed
    /// only as its key's move was decided by `decided` (`None`: no
    /// migration; see [`routes_as_decided`]); else [`Forward::Changed`].
    fn forward_now(&self, key: &[u8], cmd: &Command, decided: Option<&Arc<PoolState>>) -> Forward {
        let Ok(acquired) = self.pool.acquire_under(key, decided) else {
            return Forward::Changed;
        };
        let Some((mut server, load)) = acquired else {
            return Forward::Sent(ready_owned(forward_error(&self.pool, "ERR no live server in pool".into())));
        };
        if let Some(policy) = self.reads.filter(|_| super::sentinel::reads::is_read(&cmd.args)) {
            let standbys = self.pool.locator().map(|l| l.standbys(server.id())).unwrap_or_default();
            match super::sentinel::reads::read_server(&server, &standbys, policy) {
                Ok(s) => server = s,
                Err(why) => return Forward::Sent(ready_owned(forward_error(&self.pool, format!("ERR {why}")))),
            }
        }
        match server.submit_now(cmd.wire(), STREAMED, &self.requester) {
            Submitted::Queued(pending) => Forward::Sent(self.forwarded(server, pending, load)),
            Submitted::Full(job, pending) => Forward::Full(Box::new(Full { server, job, pending, load })),
        }
    }

    /// A command [`RedisSession::forward_now`] could not queue, queued
    /// once there is room: its reply.
    async fn forward_waiting(&self, full: Box<Full>) -> PendingReply {
        let Full { server, job, pending, load } = *full;
        server.submit_waiting(job, &self.requester).await;
        self.forwarded(server, pending, load)
    }

    /// The reply of a command sent to `server`, holding `load` on it (a
    /// pool with bounded loads) until it comes.
    fn forwarded(&self, server: Arc<Server>, pending: Pending, load: Option<LoadRelease>) -> PendingReply {
        let reply = PendingReply::server(server, pending, self.pool.clone(), backend_error);
        match load {
            Some(load) => later(async move {
                let r = reply.await;
                drop(load);
                r
            }),
            None => reply,
        }
    }

    async fn send(&self, server: Arc<Server>, cmd: &Command) -> PendingReply {
        let pending = server.submit(cmd.wire(), STREAMED, &self.requester).await;
        PendingReply::server(server, pending, self.pool.clone(), backend_error)
    }

    /// Splits a multi-key command by server: keys from argument `first`,
    /// each followed by `step - 1` values.
    async fn split(
        &mut self,
        cmd: &Command,
        first: usize,
        step: usize,
        gather: Gather,
        decided: Option<&Arc<PoolState>>,
    ) -> Option<PendingReply> {
        let pool = &self.pool;
        if !(cmd.args.len() - first).is_multiple_of(step) {
            // The command table refuses these counts before a split (MSET
            // with a key and no value); kept here so a split never frames a
            // key without its value.
            return Some(err(pool, arity(&String::from_utf8_lossy(&cmd.args[0]))));
        }
        let total = (cmd.args.len() - first) / step;
        // Each key's group (by server), and per group its server and how
        // many keys.
        // Held in place for the common sizes: nothing allocated for them.
        let mut group_of: SmallVec<[u16; 32]> = SmallVec::with_capacity(total);
        let mut groups: SmallVec<[(Arc<Server>, usize); 8]> = SmallVec::new();
        {
            // This worker's state, let go before anything is sent.
            let state = pool.routing_guard();
            if !routes_as_decided(&state, decided) {
                // Not the state its keys' moves were decided by: nothing
                // sent; it decides again.
                return None;
            }
            for at in (first..cmd.args.len()).step_by(step) {
                let Some(server) = state.server_for(&cmd.args[at]) else {
                    return Some(ready_owned(forward_error(pool, "ERR no live server in pool".into())));
                };
                let g = match groups.iter().position(|g| Arc::ptr_eq(&g.0, server)) {
                    Some(i) => i,
                    None => {
                        groups.push((server.clone(), 0));
                        groups.len() - 1
                    }
                };
                group_of.push(g as u16);
                groups[g].1 += 1;
                if groups.len() > usize::from(u16::MAX) {
                    // Not from any pool chash serves; refused rather than wrapped.
                    return Some(ready_owned(forward_error(pool, "ERR too many servers for one command".into())));
                }
            }
        }
        if groups.len() == 1 {
            // One server: the command goes as it came, and its reply (in the
            // client's key order already) comes back as the server sends it,
            // streamed when large.
            let server = groups.swap_remove(0).0;
            return Some(self.send(server, cmd).await);
        }
        pool.counters().fragments.fetch_add(groups.len() as u64, Relaxed);
        let name = cmd.args.framed(0..first);
        let mut waits: SmallVec<[_; 4]> = SmallVec::with_capacity(groups.len());
        // Every group's command in one buffer, each split off as it is
        // framed: the session's kept buffer when they fit it (nothing
        // allocated once its earlier parts are written), else one
        // allocation for them all. The keys (each with its values) are
        // copied as the client framed them, a run of them bound for one
        // server in one piece.
        let need = cmd.args.frame().len() + groups.len() * (len_line_size(first + total * step) + name.len());
        let (mut out, kept) = framing_buf(&mut self.split_buf, need);
        for (g, (server, keys)) in groups.into_iter().enumerate() {
            put_len(&mut out, b'*', first + keys * step);
            out.extend_from_slice(name);
            let mut run: Option<usize> = None;
            for (k, &of) in group_of.iter().enumerate() {
                match (usize::from(of) == g, run) {
                    (true, None) => run = Some(k),
                    (false, Some(from)) => {
                        out.extend_from_slice(cmd.args.framed(first + from * step..first + k * step));
                        run = None;
                    }
                    _ => {}
                }
            }
            if let Some(from) = run {
                out.extend_from_slice(cmd.args.framed(first + from * step..first + total * step));
            }
            let pending = match server.submit_now(out.split().freeze(), WHOLE, &self.requester) {
                Submitted::Queued(pending) => pending,
                Submitted::Full(job, pending) => {
                    server.submit_waiting(job, &self.requester).await;
                    pending
                }
            };
            waits.push((server, pending, keys));
        }
        if kept {
            // Empty now; what the parts did not use is for the next.
            self.split_buf = out;
        }
        let buf = match gather {
            Gather::InOrder => lend(&mut self.merge_buf),
            Gather::AllOk | Gather::Sum => BytesMut::new(),
        };
        Some(later(Gathering {
            buf,
            waits,
            next: 0,
            parts: SmallVec::new(),
            size: len_line_size(total),
            sum: 0,
            total,
            group_of,
            gather,
            null: self.null(),
            pool: pool.clone(),
        }))
    }
}

/// The buffer a split command's parts (`need` bytes in all) are framed in,
/// and whether it is `kept`'s, to be given back once they are split off:
/// its room is reused, and once the parts framed in it before have been
/// written and dropped it starts again at the front (nothing allocated).
/// A command over [`SPLIT_BUF`] gets one of its own.
fn framing_buf(kept: &mut BytesMut, need: usize) -> (BytesMut, bool) {
    if need > SPLIT_BUF {
        return (BytesMut::with_capacity(need), false);
    }
    let mut buf = std::mem::take(kept);
    // Room left, or the whole buffer again once nothing else holds it;
    // else a new one (the old one is freed with the last part framed in
    // it), never larger than the limit.
    if !buf.try_reclaim(need) {
        buf = BytesMut::with_capacity(need.max(SPLIT_BUF_MIN));
    }
    (buf, true)
}

/// A buffer of [`MERGE_BUF`] bytes from `kept`, which keeps a handle on it:
/// the same memory each time once the reply it went into last has been
/// written and dropped (nothing allocated); while that reply is still
/// held (pipelined commands), an empty buffer, allocated when filled.
fn lend(kept: &mut Option<BytesMut>) -> BytesMut {
    let buf = kept.get_or_insert_with(|| BytesMut::with_capacity(MERGE_BUF));
    if buf.try_reclaim(MERGE_BUF) {
        buf.split_off(0)
    } else {
        BytesMut::new()
    }
}

/// The reply of a command split by server ([`RedisSession::split`]): each
/// part's reply awaited in turn, then put together as the command's
/// [`Gather`] says. Polled as it is (no future nested in a future, moved
/// and boxed whole, as an `async` block would be).
struct Gathering {
    /// Where the reply is put together (`InOrder`): the session's lent
    /// buffer, or an empty one (allocated when needed).
    buf: BytesMut,
    /// Each part's server, its reply to come and how many keys it holds.
    waits: SmallVec<[(Arc<Server>, Pending, usize); 4]>,
    /// The first of `waits` whose reply has not come.
    next: usize,
    /// The parts' replies so far (`InOrder`), each with where its next
    /// item starts.
    parts: SmallVec<[(Bytes, usize); 4]>,
    /// The merged reply's exact size when every part is whole (reserved
    /// before it is put together: one allocation at most).
    size: usize,
    /// The parts' integers so far (`Sum`).
    sum: i64,
    /// The command's keys.
    total: usize,
    /// Each key's part, in the client's order.
    group_of: SmallVec<[u16; 32]>,
    gather: Gather,
    /// The client's null (RESP2 or RESP3).
    null: &'static [u8],
    pool: Arc<Pool>,
}

impl Gathering {
    /// Takes in the reply of part `part`; `Some` ends the command with
    /// that reply (an error).
    fn take(&mut self, part: usize, result: Result<Reply, BackendError>) -> Option<Bytes> {
        let (server, _, keys) = &self.waits[part];
        let frame = match result {
            Ok(Reply::Whole(f)) => f,
            Ok(Reply::Stream(_)) => {
                self.pool.counters().errors.fetch_add(1, Relaxed);
                return Some(error("ERR backend sent an unexpected reply"));
            }
            Err(BackendError::TooLarge(limit)) => {
                self.pool.counters().errors.fetch_add(1, Relaxed);
                return Some(error(&format!(
                    "ERR reply from {} too large to combine with other servers' (over {limit} bytes): ask per \
                     server",
                    server.id()
                )));
            }
            Err(e) => return Some(backend_error(&self.pool, server.id(), &e)),
        };
        if frame.starts_with(b"-") {
            return Some(frame);
        }
        match self.gather {
            Gather::InOrder => {
                let Some(start) = array_start(&frame, *keys) else {
                    return Some(error("ERR backend sent an unexpected reply"));
                };
                self.size += frame.len() - start;
                self.parts.push((frame, start));
            }
            Gather::AllOk => {}
            Gather::Sum => self.sum += integer(&frame).unwrap_or(0),
        }
        None
    }

    /// The command's reply, every part's taken in.
    fn merged(&mut self) -> Bytes {
        match self.gather {
            Gather::InOrder => {
                let mut out = std::mem::take(&mut self.buf);
                out.reserve(self.size);
                put_len(&mut out, b'*', self.total);
                for &g in &self.group_of {
                    let Some((frame, at)) = self.parts.get_mut(usize::from(g)) else {
                        out.extend_from_slice(self.null);
                        continue;
                    };
                    // Complete frames (the server connection read them
                    // whole) of as many items as keys (checked in take).
                    match item_end(frame, *at) {
                        Some(end) => {
                            out.extend_from_slice(&frame[*at..end]);
                            *at = end;
                        }
                        None => out.extend_from_slice(self.null),
                    }
                }
                out.freeze()
            }
            Gather::AllOk => Bytes::from_static(b"+OK\r\n"),
            Gather::Sum => Bytes::from(format!(":{}\r\n", self.sum)),
        }
    }
}

impl std::future::Future for Gathering {
    type Output = Option<Out>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Out>> {
        let this = self.get_mut();
        while let Some((server, pending, _)) = this.waits.get_mut(this.next) {
            let result = std::task::ready!(server.poll_finish(pending, cx));
            let part = this.next;
            this.next += 1;
            if let Some(reply) = this.take(part, result) {
                // The other parts' replies are given up when this is dropped.
                return std::task::Poll::Ready(Some(Out::Bytes(reply)));
            }
        }
        std::task::Poll::Ready(Some(Out::Bytes(this.merged())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `part` lies in the memory `first` (its start and capacity)
    /// was given.
    fn within(part: &[u8], first: (usize, usize)) -> bool {
        let at = part.as_ptr() as usize;
        at >= first.0 && at + part.len() <= first.0 + first.1
    }

    /// Split commands one after the other, each's parts dropped before the
    /// next (written to their servers): all framed in the memory of the
    /// first buffer, nothing allocated after it; a part still held when
    /// the room runs out makes a new buffer, and no part is overwritten.
    #[test]
    fn split_parts_reuse_the_sessions_buffer_once_written() {
        let mut kept = BytesMut::new();
        let (buf, is_kept) = framing_buf(&mut kept, 300);
        assert!(is_kept);
        let first = (buf.as_ptr() as usize, buf.capacity());
        assert!(first.1 <= SPLIT_BUF);
        kept = buf;
        let mut end = first.0;
        let (mut follow_on, mut from_front) = (0, 0);
        for round in 0..1000u32 {
            let (mut out, is_kept) = framing_buf(&mut kept, 300);
            assert!(is_kept);
            // The room left after the last command's parts, or the front
            // again: never a buffer of its own (which would start at the
            // front of its memory every time).
            let start = out.as_ptr() as usize;
            if start == end {
                follow_on += 1;
            } else {
                assert_eq!(start, first.0, "round {round}: neither after the last parts nor at the front");
                from_front += 1;
            }
            let mut parts = Vec::new();
            for p in 0..3u32 {
                out.extend_from_slice(format!("*2\r\n$4\r\nMGET\r\n${round}:{p}\r\n").as_bytes());
                parts.push(out.split().freeze());
            }
            end = out.as_ptr() as usize;
            kept = out;
            assert!(kept.capacity() <= SPLIT_BUF);
            for (p, part) in parts.iter().enumerate() {
                assert!(within(part, first), "round {round}: part {p} framed in new memory");
                assert_eq!(&part[..], format!("*2\r\n$4\r\nMGET\r\n${round}:{p}\r\n").as_bytes());
            }
        }
        assert!(follow_on > 500 && from_front > 10, "{follow_on} after the last, {from_front} from the front");
        // A part not yet written when the room runs out: new memory, the
        // held part intact.
        let (mut out, _) = framing_buf(&mut kept, 300);
        out.extend_from_slice(b"held");
        let held = out.split().freeze();
        kept = out;
        for _ in 0..100 {
            let (mut out, _) = framing_buf(&mut kept, 300);
            out.extend_from_slice(&[b'x'; 200]);
            drop(out.split());
            kept = out;
        }
        assert_eq!(&held[..], b"held");
        // Over the limit: a buffer of its own, the kept one untouched.
        let before = kept.as_ptr();
        let (big, is_kept) = framing_buf(&mut kept, SPLIT_BUF + 1);
        assert!(!is_kept && big.capacity() > SPLIT_BUF);
        assert_eq!(kept.as_ptr(), before);
    }

    /// The buffer a split command's reply is put together in: the same
    /// memory each time once the last reply is dropped; while it is held
    /// (pipelined commands), an empty one, so the held reply is never
    /// written over.
    #[test]
    fn merge_buffers_are_lent_again_once_their_reply_is_dropped() {
        let mut kept = None;
        let mut buf = lend(&mut kept);
        assert!(buf.capacity() >= MERGE_BUF);
        let first = (buf.as_ptr() as usize, buf.capacity());
        for round in 0..1000u32 {
            buf.extend_from_slice(format!("*1\r\n${round}\r\n").as_bytes());
            let reply = buf.freeze();
            assert!(within(&reply, first), "round {round}: a reply put together in new memory");
            drop(reply);
            buf = lend(&mut kept);
        }
        buf.extend_from_slice(b"*1\r\n$1\r\nA\r\n");
        let held = buf.freeze();
        let mut other = lend(&mut kept);
        assert_eq!(other.capacity(), 0, "lent while the last reply is held");
        other.extend_from_slice(b"*1\r\n$1\r\nB\r\n");
        assert_eq!(&held[..], b"*1\r\n$1\r\nA\r\n");
        drop((held, other));
        assert!(lend(&mut kept).capacity() >= MERGE_BUF);
    }
}
