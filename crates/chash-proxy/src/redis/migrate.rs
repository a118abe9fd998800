//! A migration's keys moved between Redis servers with `MIGRATE` (atomic
//! per key, the TTL kept): a command on a moved key first moves it
//! ([`RedisSession::move_first`]), and the mover ([`MOVER`]) scans every
//! server keys move from and moves the rest in batches, throttled, large
//! keys last. `MIGRATE` answers `NOKEY` for a key already moved (or never
//! there): every step can be repeated, so a restarted proxy, or two
//! proxies at once, move each key once.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chash::{MigrateMethod, MigrationState};
use std::sync::atomic::Ordering::Relaxed;

use super::command::Route;
use super::copy;
use super::errors::{err, forward_error};
use super::resp::{array_items, encode_array, integer, Command, WHOLE};
use super::session::RedisSession;
use crate::backend::{Address, Pinned, Reply, ReplyAccount, Requester, Server};
use crate::conn::{ready_owned, PendingReply};
use crate::pool::{Migration, MoveFuture, MoveSettings, Mover, Phase, Pool, PoolState};

/// The Redis mover, with `settings`.
pub(crate) fn mover(settings: MoveSettings) -> Mover {
    Mover { run, settings }
}

fn run(pool: Arc<Pool>, m: Arc<Migration>, settings: MoveSettings) -> MoveFuture {
    Box::pin(move_all(pool, m, settings))
}

/// What `MIGRATE` said.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Moved (`+OK`).
    Moved,
    /// None of the keys was there: moved already, or never written.
    NoKey,
    /// A key is on the destination already (`-BUSYKEY`).
    Busy,
    /// Anything else: the reply, or why there was none.
    Failed(String),
}

/// How `MIGRATE` says a key is on its target already (the target's
/// `BUSYKEY`, as redis-server words it in `migrateCommand`).
const TARGET_BUSY: &[u8] = b"-ERR Target instance replied with error: BUSYKEY";

fn outcome(reply: Result<Reply, crate::backend::BackendError>) -> Outcome {
    match reply {
        Ok(Reply::Whole(f)) if f.starts_with(b"+OK") => Outcome::Moved,
        Ok(Reply::Whole(f)) if f.starts_with(b"+NOKEY") => Outcome::NoKey,
        // MIGRATE passes the target's refusal on inside its own error:
        // "-ERR Target instance replied with error: BUSYKEY ...".
        Ok(Reply::Whole(f)) if f.starts_with(b"-BUSYKEY") || f.starts_with(TARGET_BUSY) => Outcome::Busy,
        Ok(Reply::Whole(f)) => Outcome::Failed(String::from_utf8_lossy(f.strip_suffix(b"\r\n").unwrap_or(&f)).into()),
        Ok(Reply::Stream(_)) => Outcome::Failed("an unexpected reply".into()),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// `MIGRATE host port "" db timeout [AUTH ...] KEYS key...` from a key's
/// server before the change to `to`, as the proxy reaches `to` (the
/// servers must reach each other at the addresses the proxy uses).
fn migrate_command(pool: &Pool, to: &Server, timeout: Duration, keys: &[Bytes]) -> Result<Bytes, String> {
    let Address::Tcp(addr) = to.address() else {
        return Err(format!("server {} is not reached over TCP: MIGRATE needs HOST:PORT", to.id()));
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("server address {addr} has no port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let db = pool.spec().redis_db.to_string();
    let ms = timeout.as_millis().max(1).to_string();
    let mut args: Vec<&[u8]> = vec![b"MIGRATE", host.as_bytes(), port.as_bytes(), b"", db.as_bytes(), ms.as_bytes()];
    match super::access::server_login(pool.spec()) {
        Some(("default", pw)) => args.extend([b"AUTH".as_slice(), pw.as_bytes()]),
        Some((user, pw)) => args.extend([b"AUTH2".as_slice(), user.as_bytes(), pw.as_bytes()]),
        None => {}
    }
    args.push(b"KEYS");
    args.extend(keys.iter().map(|k| k.as_ref()));
    let mut out = BytesMut::new();
    encode_array(&mut out, args.into_iter());
    Ok(out.freeze())
}

fn command(args: &[&[u8]]) -> Bytes {
    let mut out = BytesMut::new();
    encode_array(&mut out, args.iter().copied());
    out.freeze()
}

/// The keys `MIGRATE` refused as already on `to` moved one by one; a key
/// on both is resolved for the destination's copy (the source's can only
/// be a write that raced the move, which no proxy acknowledged after the
/// key moved): the source's copy is deleted.
async fn settle_busy(
    pool: &Pool,
    m: &Migration,
    from: &Server,
    to: &Server,
    keys: &[Bytes],
    requester: &Requester,
) -> Result<(), String> {
    let timeout = pool.spec().timeout.unwrap_or(Duration::from_secs(5));
    for key in keys {
        let one = migrate_command(pool, to, timeout, std::slice::from_ref(key))?;
        let pending = from.submit(one, WHOLE, requester).await;
        match outcome(from.finish(pending).await) {
            Outcome::Moved | Outcome::NoKey => {}
            Outcome::Busy => {
                let pending = from.submit(command(&[b"DEL", key]), WHOLE, requester).await;
                if let Outcome::Failed(e) = outcome(from.finish(pending).await.map(|r| match r {
                    Reply::Whole(f) if f.starts_with(b":") => Reply::Whole(Bytes::from_static(b"+OK\r\n")),
                    other => other,
                })) {
                    return Err(e);
                }
                m.progress.conflicts.fetch_add(1, Relaxed);
                tracing::warn!(
                    pool = %pool.name(), from = %from.id(), to = %to.id(), key = %String::from_utf8_lossy(key),
                    "migration: the key was on both servers; the copy on its new server is kept"
                );
            }
            Outcome::Failed(e) => return Err(e),
        }
    }
    Ok(())
}

/// Moves `keys` from `from` to `to` on the pool's connections to `from`
/// (after the requester's earlier requests to it).
async fn move_now(
    pool: &Pool,
    m: &Migration,
    from: &Server,
    to: &Server,
    keys: &[Bytes],
    requester: &Requester,
) -> Result<bool, String> {
    let timeout = pool.spec().timeout.unwrap_or(Duration::from_secs(5));
    if pool.spec().migrate_method == MigrateMethod::Copy {
        return copy_now(pool, m, from, to, keys, requester, timeout).await;
    }
    let data = migrate_command(pool, to, timeout, keys)?;
    let pending = from.submit(data, WHOLE, requester).await;
    match outcome(from.finish(pending).await) {
        Outcome::Moved => Ok(true),
        Outcome::NoKey => Ok(false),
        Outcome::Busy => settle_busy(pool, m, from, to, keys, requester).await.map(|()| true),
        Outcome::Failed(e) => Err(e),
    }
}

/// How long a copy's claims last (`migrate_method: copy`): time for the
/// claim, the restore and the release, each answered within the pool's
/// timeout (and `extra` for a large key).
fn lease(pool: &Pool, extra: Duration) -> Duration {
    pool.spec().timeout.unwrap_or(Duration::from_secs(5)) * 3 + Duration::from_secs(1) + extra
}

/// [`move_now`] by copying: claims held by another copy are waited for
/// (polled) up to the pool's timeout.
async fn copy_now(
    pool: &Pool,
    m: &Migration,
    from: &Server,
    to: &Server,
    keys: &[Bytes],
    requester: &Requester,
    timeout: Duration,
) -> Result<bool, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let src = copy::Link { server: from, pinned: None, requester, limit: timeout };
    let dst = copy::Link { server: to, pinned: None, requester, limit: timeout };
    let mut keys = keys.to_vec();
    let mut moved = false;
    loop {
        let done = copy::copy_keys(&src, &dst, &keys, lease(pool, Duration::ZERO)).await?;
        moved |= done.moved > 0;
        m.progress.conflicts.fetch_add(done.conflicts, Relaxed);
        if done.pending.is_empty() {
            return Ok(moved);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "{} key(s) being copied by another proxy (or a copy that stopped, resolved once its lease ends)",
                done.pending.len()
            ));
        }
        keys = done.pending;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

impl RedisSession {
    /// A read of one key that moves but may not have moved yet, while keys
    /// move: answered by its old server when the key is still there (one
    /// round trip, nothing moved: `MULTI`, `EXISTS`, the command, `EXEC`
    /// on the old server, so the answer is the key's as it is there, and
    /// no proxy writes a moved key to its old server any more); `None`
    /// when the key is not there (it is then known moved) or for anything
    /// else, which takes the usual way (moved first, then run).
    pub(super) async fn read_where_it_is(&self, route: &Route, cmd: &Command) -> Option<PendingReply> {
        let position = match route {
            Route::Key(p) => *p,
            Route::Keys(ps) if ps.len() == 1 => ps[0],
            _ => return None,
        };
        if !super::sentinel::reads::is_read(&cmd.args) {
            return None;
        }
        let key = cmd.args.get(position)?;
        let (m, from) = {
            let state = self.pool.routing_state();
            let m = state.migration.clone()?;
            if m.phase() != Phase::Moving {
                return None;
            }
            let to = state.server_for(key)?;
            let from = m.source_for(key)?.clone();
            if Arc::ptr_eq(to, &from) || m.known_moved(key) {
                return None;
            }
            (m, from)
        };
        let mut data = BytesMut::with_capacity(64 + key.len() + cmd.args.frame().len());
        data.extend_from_slice(b"*1\r\n$5\r\nMULTI\r\n");
        encode_array(&mut data, [&b"EXISTS"[..], key].into_iter());
        data.extend_from_slice(cmd.args.frame());
        data.extend_from_slice(b"*1\r\n$4\r\nEXEC\r\n");
        let pending = from.submit_frames(data.freeze(), WHOLE, 4, &self.requester).await;
        let Ok(Reply::Whole(frames)) = from.finish(pending).await else { return None };
        // The last of the four replies is EXEC's: EXISTS's, then the
        // command's (as the server framed it for this client's dialect).
        let exec = super::resp::frames(&frames).pop()?;
        let items = array_items(&exec).filter(|i| i.len() == 2)?;
        match integer(&items[0]) {
            Some(1) => {
                m.progress.reads_from_old.fetch_add(1, Relaxed);
                Some(ready_owned(items[1].clone()))
            }
            // Absent from its old server: moved, when keys move with
            // MIGRATE (atomic: gone from the old server only once on the
            // new one). A copy may instead hold it under its claim, not yet
            // on the new server: the usual way then (the copy waited for).
            Some(0) if self.pool.spec().migrate_method == MigrateMethod::Migrate => {
                m.note_moved([key]);
                None
            }
            _ => None,
        }
    }

    /// A migration in progress: the moved keys among `keys` are moved to
    /// their servers now before the command runs there (a command's keys
    /// all first). While the migration holds (`armed`, or its first
    /// moments), this waits up to the pool's timeout.
    ///
    /// The state this was decided by (`None`: no migration): the command
    /// is routed by that state only
    /// ([`routes_as_decided`](crate::pool::routes_as_decided)), else it
    /// decides again.
    pub(super) async fn move_first<'a>(
        &self,
        keys: impl Iterator<Item = &'a [u8]>,
    ) -> Result<Option<Arc<PoolState>>, PendingReply> {
        let pool = &self.pool;
        let keys: Vec<&[u8]> = keys.collect();
        let limit = pool.spec().timeout.unwrap_or(Duration::from_secs(5));
        let deadline = tokio::time::Instant::now() + limit;
        // Held while the migration holds: a reload may replace it (armed to
        // moving) or end it, so the pool's current one is asked again.
        let (m, groups, decided) = loop {
            let state = pool.routing_state();
            let Some(m) = state.migration.clone() else { return Ok(None) };
            let mut groups: Vec<(Arc<Server>, Arc<Server>, Vec<Bytes>)> = Vec::new();
            if m.phase() != Phase::Done {
                for key in &keys {
                    let (Some(to), Some(from)) = (state.server_for(key), m.source_for(key)) else { continue };
                    if Arc::ptr_eq(to, from) || m.known_moved(key) {
                        continue;
                    }
                    match groups.iter_mut().find(|g| Arc::ptr_eq(&g.0, from) && Arc::ptr_eq(&g.1, to)) {
                        Some(g) => g.2.push(Bytes::copy_from_slice(key)),
                        None => groups.push((from.clone(), to.clone(), vec![Bytes::copy_from_slice(key)])),
                    }
                }
            }
            if groups.is_empty() {
                return Ok(Some(state));
            }
            if m.phase() != Phase::Hold {
                break (m, groups, state);
            }
            drop(state);
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(err(
                    pool,
                    format!(
                        "TRYAGAIN chash-proxy: pool {} is migrating (migrate_state: {}) and keys that move wait until \
                         every proxy of the fleet has the change and it is started (chash migrate start)",
                        pool.name(),
                        m.state.name()
                    ),
                ));
            }
            m.wait_moving((deadline - now).min(Duration::from_millis(50))).await;
        };
        for (from, to, keys) in groups {
            match move_now(pool, &m, &from, &to, &keys, &self.requester).await {
                Ok(moved) => {
                    m.note_moved(&keys);
                    if moved {
                        m.progress.moved_on_access.fetch_add(keys.len() as u64, Relaxed);
                    }
                }
                Err(e) => {
                    m.progress.errors.fetch_add(1, Relaxed);
                    return Err(ready_owned(forward_error(
                        pool,
                        format!(
                            "TRYAGAIN chash-proxy: moving key '{}' from {} to {} failed: {e}",
                            String::from_utf8_lossy(&keys[0]),
                            from.id(),
                            to.id()
                        ),
                    )));
                }
            }
        }
        Ok(Some(decided))
    }
}

/// Keeps the mover within its keys and bytes per second.
struct Throttle {
    start: tokio::time::Instant,
    keys: u64,
    bytes: u64,
    settings: MoveSettings,
}

impl Throttle {
    fn new(settings: MoveSettings) -> Throttle {
        Throttle { start: tokio::time::Instant::now(), keys: 0, bytes: 0, settings }
    }

    async fn took(&mut self, keys: u64, bytes: u64) {
        self.keys += keys;
        self.bytes += bytes;
        let by = |n: u64, per: u64| if per == 0 { 0.0 } else { n as f64 / per as f64 };
        let due = by(self.keys, self.settings.keys_per_second).max(by(self.bytes, self.settings.bytes_per_second));
        tokio::time::sleep_until(self.start + Duration::from_secs_f64(due)).await;
    }
}

/// Why a pass over a source stopped.
enum Stop {
    /// The migration is no longer the pool's (completed, or replaced).
    Replaced,
    /// The source could not be scanned or moved from: tried again later.
    Failed(String),
    /// Copies of its keys are in progress (within their lease): tried
    /// again later, not an error.
    Pending(String),
}

/// Whether `m` is still the pool's migration.
fn current(pool: &Pool, m: &Arc<Migration>) -> bool {
    pool.state().migration.as_ref().is_some_and(|o| Arc::ptr_eq(o, m))
}

/// A request on the mover's own connection to `server`, answered within
/// `limit` (plus the pool's timeout).
async fn ask(
    server: &Server,
    pinned: &Pinned,
    data: Bytes,
    requester: &Requester,
    limit: Duration,
) -> Result<Bytes, String> {
    let pending = server.submit_blocking(pinned, data, WHOLE, requester, Some(limit)).await;
    match server.finish(pending).await {
        Ok(Reply::Whole(f)) if f.starts_with(b"-") => {
            Err(String::from_utf8_lossy(f.strip_suffix(b"\r\n").unwrap_or(&f)).into_owned())
        }
        Ok(Reply::Whole(f)) => Ok(f),
        Ok(Reply::Stream(_)) => Err("an unexpected reply".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The mover: settles, then passes over every source until a pass finds
/// no key to move; then the migration completes.
async fn move_all(pool: Arc<Pool>, m: Arc<Migration>, settings: MoveSettings) {
    if m.state == MigrationState::Armed {
        tracing::info!(pool = %pool.name(), "migration armed: keys that move wait for migrate_state: moving");
        return;
    }
    let requester = Requester { affinity: 0, account: ReplyAccount::new(256 << 20), dialect: 0 };
    // Requests routed before the change (to a moved key's old server) are
    // answered first: a PING behind them on every connection to every
    // source, and a moment for requests being routed as the change came.
    for source in m.sources() {
        for pending in source.submit_everywhere(command(&[b"PING"]), WHOLE, &requester).await {
            let _ = source.finish(pending).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    if !current(&pool, &m) {
        return;
    }
    m.advance(Phase::Moving);
    m.progress.start();
    tracing::info!(pool = %pool.name(), "migration moving: moved keys move on access and in the background");
    let sources = m.sources();
    let limit = pool.spec().timeout.unwrap_or(Duration::from_secs(5));
    let mut total = 0;
    for source in &sources {
        let pinned = source.pin(&requester);
        if let Ok(f) = ask(source, &pinned, command(&[b"DBSIZE"]), &requester, limit).await {
            total += integer(&f).unwrap_or(0).max(0) as u64;
        }
    }
    m.progress.total_keys.store(total, Relaxed);
    let ids: Vec<&str> = sources.iter().map(|s| s.id()).collect();
    tracing::info!(pool = %pool.name(), keys = total, "migration: scanning {}", ids.join(" "));
    let mut throttle = Throttle::new(settings);
    loop {
        let mut found = 0;
        let mut failed = None;
        for source in &sources {
            match pass(&pool, &m, source, settings, &mut throttle, &requester).await {
                Ok(n) => found += n,
                Err(Stop::Replaced) => return,
                Err(Stop::Pending(e)) => {
                    tracing::info!(pool = %pool.name(), source = %source.id(), "migration: {e}; trying again");
                    failed = Some(e);
                }
                Err(Stop::Failed(e)) => {
                    m.progress.errors.fetch_add(1, Relaxed);
                    tracing::warn!(pool = %pool.name(), source = %source.id(), "migration: {e}; trying again");
                    if let Ok(mut last) = m.progress.last_error.lock() {
                        *last = Some(format!("{}: {e}", source.id()));
                    }
                    failed = Some(e);
                }
            }
        }
        m.progress.passes.fetch_add(1, Relaxed);
        if !current(&pool, &m) {
            return;
        }
        // One pass without an error moved every key that moves: no proxy
        // writes a moved key to its old server once any moves (they hold,
        // or move it first), so none comes back behind the scan.
        match failed {
            None => {
                tracing::info!(pool = %pool.name(), keys = found, "migration: every server keys move from scanned");
                let took = m.progress.elapsed().unwrap_or_default();
                m.progress.finished_after_us.store(took.as_micros() as u64, Relaxed);
                pool.migration_done(&m);
                return;
            }
            Some(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// One pass over `source`: every key there whose server changed moved to
/// its server now, large keys last. The keys found that move.
async fn pass(
    pool: &Pool,
    m: &Arc<Migration>,
    source: &Arc<Server>,
    settings: MoveSettings,
    throttle: &mut Throttle,
    requester: &Requester,
) -> Result<u64, Stop> {
    let limit = pool.spec().timeout.unwrap_or(Duration::from_secs(5));
    let pinned = source.pin(requester);
    let count = settings.batch.max(1).to_string();
    let mut cursor = Bytes::from_static(b"0");
    let mut found = 0u64;
    let mut large: Vec<(Arc<Server>, Bytes, u64)> = Vec::new();
    loop {
        if !current(pool, m) {
            return Err(Stop::Replaced);
        }
        let reply = ask(source, &pinned, command(&[b"SCAN", &cursor, b"COUNT", count.as_bytes()]), requester, limit)
            .await
            .map_err(|e| Stop::Failed(format!("SCAN: {e}")))?;
        let (next, keys) = scan_reply(&reply).ok_or_else(|| Stop::Failed("SCAN: an unexpected reply".into()))?;
        m.progress.scanned.fetch_add(keys.len() as u64, Relaxed);
        let mut groups: Vec<(Arc<Server>, Vec<Bytes>)> = Vec::new();
        {
            let state = pool.state();
            // Where keys go is this migration's placement: one that
            // replaced it (while SCAN was answered) has its own mover.
            if !state.migration.as_ref().is_some_and(|o| Arc::ptr_eq(o, m)) {
                return Err(Stop::Replaced);
            }
            for key in keys {
                if copy::is_internal(&key) {
                    continue;
                }
                let Some(to) = state.server_for(&key) else { continue };
                if Arc::ptr_eq(to, source) {
                    continue;
                }
                match groups.iter_mut().find(|g| Arc::ptr_eq(&g.0, to)) {
                    Some(g) => g.1.push(key),
                    None => groups.push((to.clone(), vec![key])),
                }
            }
        }
        for (to, keys) in groups {
            found += keys.len() as u64;
            m.progress.scanned_moving.fetch_add(keys.len() as u64, Relaxed);
            let sizes = sizes(source, &pinned, &keys, requester, limit).await?;
            // Batches of at most `batch_bytes` (one key at least).
            let (mut small, mut bytes) = (Vec::new(), 0u64);
            let mut keys = keys.into_iter().zip(sizes).peekable();
            while let Some((key, size)) = keys.next() {
                if size > settings.large_key_bytes {
                    large.push((to.clone(), key, size));
                } else {
                    bytes += size;
                    small.push(key);
                }
                let full = keys.peek().is_some_and(|(_, next)| bytes + next > settings.batch_bytes.max(1));
                if !small.is_empty() && (full || keys.peek().is_none()) {
                    move_batch(pool, m, source, &pinned, &to, &small, requester, limit).await?;
                    m.progress.moved_bytes.fetch_add(bytes, Relaxed);
                    throttle.took(small.len() as u64, bytes).await;
                    (small, bytes) = (Vec::new(), 0);
                }
            }
        }
        if next.as_ref() == b"0" {
            break;
        }
        cursor = next;
    }
    for (to, key, size) in large {
        m.progress.large_keys.fetch_add(1, Relaxed);
        if let Ok(mut list) = m.progress.large.lock() {
            if list.len() < 100 {
                list.push((String::from_utf8_lossy(&key).into_owned(), size));
            }
        }
        tracing::info!(pool = %pool.name(), key = %String::from_utf8_lossy(&key), bytes = size, "migration: moving a large key");
        // A large key takes its time: a second per 8 MiB on top.
        let long = limit + Duration::from_secs(size / (8 << 20) + 1);
        move_batch(pool, m, source, &pinned, &to, std::slice::from_ref(&key), requester, long).await?;
        m.progress.moved_bytes.fetch_add(size, Relaxed);
        throttle.took(1, size).await;
    }
    if pool.spec().migrate_method == MigrateMethod::Copy {
        settle_claims(pool, m, source, &pinned, requester, limit).await?;
    }
    Ok(found)
}

/// Copies (`migrate_method: copy`) whose claims are left on `source` (by
/// a proxy that stopped mid-copy, or in progress elsewhere): resolved;
/// a pass is not over while one is within its lease.
async fn settle_claims(
    pool: &Pool,
    m: &Migration,
    source: &Server,
    pinned: &Pinned,
    requester: &Requester,
    limit: Duration,
) -> Result<(), Stop> {
    let src = copy::Link { server: source, pinned: Some(pinned), requester, limit };
    let left = copy::claims(&src).await.map_err(|e| Stop::Failed(format!("claims left: {e}")))?;
    if left.is_empty() {
        return Ok(());
    }
    let mut waiting = 0;
    for (key, claim) in left {
        let to = {
            let state = pool.state();
            if !state.migration.as_ref().is_some_and(|o| std::ptr::eq(&**o, m)) {
                return Err(Stop::Replaced);
            }
            let Some(to) = state.server_for(&key).cloned() else { continue };
            to
        };
        let dst = copy::Link { server: &to, pinned: None, requester, limit };
        let (moved, pending) = copy::resolve_left(&src, &dst, &[(key, claim)], lease(pool, Duration::ZERO))
            .await
            .map_err(|e| Stop::Failed(format!("a claim left: {e}")))?;
        m.progress.moved.fetch_add(moved, Relaxed);
        waiting += pending;
    }
    if waiting > 0 {
        return Err(Stop::Pending(format!("{waiting} key(s) of {} held by copies within their lease", source.id())));
    }
    Ok(())
}

/// `MIGRATE ... KEYS` of a batch on the mover's connection.
#[allow(clippy::too_many_arguments)]
async fn move_batch(
    pool: &Pool,
    m: &Migration,
    source: &Server,
    pinned: &Pinned,
    to: &Server,
    keys: &[Bytes],
    requester: &Requester,
    limit: Duration,
) -> Result<(), Stop> {
    if pool.spec().migrate_method == MigrateMethod::Copy {
        let src = copy::Link { server: source, pinned: Some(pinned), requester, limit };
        let dst = copy::Link { server: to, pinned: None, requester, limit };
        let extra = limit.saturating_sub(pool.spec().timeout.unwrap_or(Duration::from_secs(5)));
        let done = copy::copy_keys(&src, &dst, keys, lease(pool, extra))
            .await
            .map_err(|e| Stop::Failed(format!("copy to {}: {e}", to.id())))?;
        m.progress.moved.fetch_add(done.moved, Relaxed);
        m.progress.conflicts.fetch_add(done.conflicts, Relaxed);
        m.note_moved(keys.iter().filter(|k| !done.pending.contains(k)));
        // Keys held by another copy: resolved at the end of the pass.
        return Ok(());
    }
    let data = migrate_command(pool, to, limit, keys).map_err(Stop::Failed)?;
    let pending = source.submit_blocking(pinned, data, WHOLE, requester, Some(limit)).await;
    match outcome(source.finish(pending).await) {
        Outcome::Moved => {
            m.progress.moved.fetch_add(keys.len() as u64, Relaxed);
            m.note_moved(keys);
            Ok(())
        }
        Outcome::NoKey => {
            m.note_moved(keys);
            Ok(())
        }
        Outcome::Busy => {
            settle_busy(pool, m, source, to, keys, requester).await.map_err(Stop::Failed)?;
            m.progress.moved.fetch_add(keys.len() as u64, Relaxed);
            m.note_moved(keys);
            Ok(())
        }
        Outcome::Failed(e) => Err(Stop::Failed(format!("MIGRATE to {}: {e}", to.id()))),
    }
}

/// Each key's `MEMORY USAGE` (0 when gone), asked in one script call.
const SIZES: &[u8] =
    b"local r = {} for i, k in ipairs(KEYS) do r[i] = redis.call('MEMORY', 'USAGE', k) or 0 end return r";

async fn sizes(
    source: &Server,
    pinned: &Pinned,
    keys: &[Bytes],
    requester: &Requester,
    limit: Duration,
) -> Result<Vec<u64>, Stop> {
    let n = keys.len().to_string();
    let mut args: Vec<&[u8]> = vec![b"EVAL", SIZES, n.as_bytes()];
    args.extend(keys.iter().map(|k| k.as_ref()));
    let reply = ask(source, pinned, command(&args), requester, limit)
        .await
        .map_err(|e| Stop::Failed(format!("MEMORY USAGE: {e}")))?;
    let sizes: Vec<u64> = array_items(&reply)
        .ok_or_else(|| Stop::Failed("MEMORY USAGE: an unexpected reply".into()))?
        .iter()
        .map(|f| integer(f).unwrap_or(0).max(0) as u64)
        .collect();
    if sizes.len() != keys.len() {
        return Err(Stop::Failed("MEMORY USAGE: an unexpected reply".into()));
    }
    Ok(sizes)
}

/// `SCAN`'s next cursor and keys.
fn scan_reply(reply: &Bytes) -> Option<(Bytes, Vec<Bytes>)> {
    let parts = array_items(reply).filter(|p| p.len() == 2)?;
    let next = bulk_text(&parts[0])?;
    let keys = array_items(&parts[1])?.iter().map(bulk_text).collect::<Option<Vec<Bytes>>>()?;
    Some((next, keys))
}

/// The content of a bulk string frame.
fn bulk_text(frame: &Bytes) -> Option<Bytes> {
    if frame.first() != Some(&b'$') {
        return None;
    }
    let nl = frame.iter().position(|&b| b == b'\n')?;
    Some(frame.slice(nl + 1..frame.len().checked_sub(2)?))
}

/// Before a migrating change: can every server keys move from `MIGRATE`
/// to the servers they move to? A probe key is set on the source, moved,
/// and deleted on the destination (blocking: the CLI and the admin
/// endpoint ask this before anything changes). TLS pools are not probed
/// (MIGRATE between TLS servers needs `tls-cluster yes` on them).
pub(crate) fn check(before: &chash::PoolConfig, after: &chash::PoolConfig) -> Result<(), String> {
    if before.tls.any_server_tls() || after.tls.any_server_tls() {
        tracing::warn!(pool = %after.name, "servers over TLS: MIGRATE between them is not probed (they need tls-cluster yes)");
        return Ok(());
    }
    let ids = |c: &chash::PoolConfig| -> Vec<String> { c.members().map(|l| l.id.clone()).collect() };
    let (from, to) = (ids(before), ids(after));
    if after.migrate_method == MigrateMethod::Copy {
        return check_copy(after, from.iter().chain(to.iter().filter(|d| !from.contains(d))));
    }
    let new: Vec<&String> = to.iter().filter(|d| !from.contains(d)).collect();
    let gone: Vec<&String> = from.iter().filter(|s| !to.contains(s)).collect();
    let mut pairs: Vec<(&String, &String)> = Vec::new();
    for s in &from {
        for d in &to {
            // Keys move to new servers and from removed ones; a weight
            // change moves them between any two.
            let moves = new.contains(&d) || gone.contains(&s) || (new.is_empty() && gone.is_empty());
            if s != d && moves && pairs.len() < 200 {
                pairs.push((s, d));
            }
        }
    }
    let nonce = format!(
        "chash:migrate:probe:{}:{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
    );
    for (s, d) in pairs {
        probe(after, s, d, &nonce).map_err(|e| {
            format!(
                "pool {}: MIGRATE from {s} to {d} fails ({e}): nothing was changed. The servers must reach each \
                 other at the addresses the proxy uses, and allow MIGRATE (some managed services rename or disable \
                 it); without it, set migrate_method: copy in the pool (the proxy copies each key with DUMP and \
                 RESTORE)",
                after.name
            )
        })?;
    }
    Ok(())
}

/// Before a change that copies (`migrate_method: copy`): every server
/// runs the scripts a copy needs (a probe key dumped, restored, deleted).
fn check_copy<'a>(config: &chash::PoolConfig, servers: impl Iterator<Item = &'a String>) -> Result<(), String> {
    let nonce = format!("chash:migrate:probe:{}:{}", std::process::id(), rand_suffix());
    for id in servers {
        let mut server = Blocking::connect(id, config).map_err(|e| refused_copy(config, id, &e))?;
        server
            .ask(&[b"EVAL", copy::PROBE.as_bytes(), b"1", nonce.as_bytes()])
            .map_err(|e| refused_copy(config, id, &e))?;
    }
    Ok(())
}

fn refused_copy(config: &chash::PoolConfig, id: &str, e: &str) -> String {
    format!(
        "pool {}: server {id} cannot copy keys ({e}): nothing was changed. migrate_method: copy needs EVAL with DUMP, \
         RESTORE ... ABSTTL, PEXPIRETIME and TIME (Redis 7.0 or later); without them, move the data first and \
         change the membership without --migrate",
        config.name
    )
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// One probe key moved from `s` to `d`.
fn probe(config: &chash::PoolConfig, s: &str, d: &str, key: &str) -> Result<(), String> {
    let to = d.trim_start_matches('[').replace("]:", ":");
    let mut source = Blocking::connect(s, config)?;
    source.ask(&[b"SET", key.as_bytes(), b"1", b"PX", b"60000"])?;
    let (host, port) = to.rsplit_once(':').ok_or_else(|| format!("{d} has no port"))?;
    let db = config.redis_db.to_string();
    let mut args: Vec<&[u8]> =
        vec![b"MIGRATE", host.as_bytes(), port.as_bytes(), key.as_bytes(), db.as_bytes(), b"2000"];
    let login = super::access::server_login(config);
    match login {
        Some(("default", pw)) => args.extend([b"AUTH".as_slice(), pw.as_bytes()]),
        Some((user, pw)) => args.extend([b"AUTH2".as_slice(), user.as_bytes(), pw.as_bytes()]),
        None => {}
    }
    let moved = source.ask(&args);
    let _ = source.ask(&[b"DEL", key.as_bytes()]);
    let reply = moved?;
    if !reply.starts_with("+OK") {
        return Err(reply.trim_end().to_owned());
    }
    let mut dest = Blocking::connect(d, config)?;
    dest.ask(&[b"DEL", key.as_bytes()])?;
    Ok(())
}

/// A blocking connection for the probe, logged in and on the pool's database.
struct Blocking(std::net::TcpStream, std::io::BufReader<std::net::TcpStream>);

impl Blocking {
    fn connect(id: &str, config: &chash::PoolConfig) -> Result<Blocking, String> {
        use std::net::ToSocketAddrs;
        let addr = id.to_socket_addrs().map_err(|e| format!("{id}: {e}"))?.next().ok_or(format!("{id}: no address"))?;
        let s =
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| format!("{id}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
        let r = std::io::BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
        let mut b = Blocking(s, r);
        match super::access::server_login(config) {
            Some(("default", pw)) => b.ask(&[b"AUTH", pw.as_bytes()])?,
            Some((user, pw)) => b.ask(&[b"AUTH", user.as_bytes(), pw.as_bytes()])?,
            None => String::new(),
        };
        if config.redis_db > 0 {
            b.ask(&[b"SELECT", config.redis_db.to_string().as_bytes()])?;
        }
        Ok(b)
    }

    /// A command's reply line (an error reply is an `Err`).
    fn ask(&mut self, args: &[&[u8]]) -> Result<String, String> {
        use std::io::{BufRead, Write};
        self.0.write_all(&command(args)).map_err(|e| e.to_string())?;
        let mut line = String::new();
        self.1.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.starts_with('-') || line.is_empty() {
            return Err(line.trim_end().trim_start_matches('-').to_owned());
        }
        Ok(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(reply: &'static [u8]) -> Outcome {
        outcome(Ok(Reply::Whole(Bytes::from_static(reply))))
    }

    #[test]
    fn migrate_replies_are_read_as_redis_words_them() {
        assert_eq!(of(b"+OK\r\n"), Outcome::Moved);
        assert_eq!(of(b"+NOKEY\r\n"), Outcome::NoKey);
        // A key on both servers (a MIGRATE whose source timed out after the
        // target restored it): the refusal comes wrapped in MIGRATE's error.
        assert_eq!(
            of(b"-ERR Target instance replied with error: BUSYKEY Target key name already exists.\r\n"),
            Outcome::Busy
        );
        assert_eq!(
            of(b"-IOERR error or timeout reading to target instance\r\n"),
            Outcome::Failed("-IOERR error or timeout reading to target instance".into())
        );
    }
}
