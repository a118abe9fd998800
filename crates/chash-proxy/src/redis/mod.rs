//! Redis pools: RESP2 client connections routed by key.
//!
//! Single-key commands go to the key's server; `MGET`, `MSET`, `DEL`,
//! `UNLINK`, `EXISTS` and `TOUCH` are split by server and their replies
//! reassembled in order or summed; other multi-key commands (and scripts)
//! run when all their keys are on one server (hash tags make that so) and
//! are refused otherwise. `PING`, `ECHO`, `QUIT`, `COMMAND`, `INFO`,
//! `SELECT` (of the pool's `redis_db`), `HELLO 2` and `AUTH` are answered by
//! the proxy. Everything that cannot be routed by key is refused with an
//! error naming the command and the reason.

pub mod command;
pub mod resp;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::backend::{BackendError, Server};
use crate::client::{bytes_reply, ready, ready_owned, reply_writer, Input, Out, PendingReply, NEXT_CLIENT};
use crate::memcache::{Reply, ReplyKind};
use crate::pool::Pool;
use crate::Shared;
use command::{key_positions, route, Route};
use resp::{array_items, bulk, error, integer, parse_request, Command, Request, RespLimits};

/// Per-connection state.
struct Conn {
    authed: bool,
    affinity: usize,
}

/// Serves one Redis client connection.
pub async fn serve<S>(stream: S, pool: Arc<Pool>, shared: Arc<Shared>, shutdown: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(stream);
    let (tx, writer) = reply_writer(w);
    let reader = async move {
        let mut conn = Conn { authed: pool.settings.redis_auth.is_none(), affinity: NEXT_CLIENT.fetch_add(1, Relaxed) };
        let limits = RespLimits { max_args: 1 << 20, max_bulk: shared.options.max_value_size.max(512) };
        let mut input = Input::new(r, shutdown, shared.options.client_idle_timeout);
        let mut buf = BytesMut::with_capacity(16 * 1024);
        'conn: while input.read(&mut buf).await {
            loop {
                match parse_request(&mut buf, limits) {
                    Request::Incomplete => break,
                    Request::Error(msg) => {
                        pool.stats.errors.fetch_add(1, Relaxed);
                        let _ = tx.send(ready_owned(error(&format!("ERR {msg}")))).await;
                        break 'conn;
                    }
                    Request::Command(cmd) => {
                        pool.stats.requests.fetch_add(1, Relaxed);
                        let quit = cmd.args[0].eq_ignore_ascii_case(b"QUIT");
                        let reply = dispatch(&pool, &shared, cmd, &mut conn).await;
                        if tx.send(reply).await.is_err() || quit {
                            break 'conn;
                        }
                    }
                }
            }
        }
        drop(tx);
    };
    tokio::join!(reader, writer);
}

fn err(pool: &Pool, msg: String) -> PendingReply {
    pool.stats.errors.fetch_add(1, Relaxed);
    ready_owned(error(&msg))
}

fn arity(name: &str) -> String {
    format!("ERR wrong number of arguments for '{}' command", name.to_ascii_lowercase())
}

async fn dispatch(pool: &Arc<Pool>, shared: &Arc<Shared>, cmd: Command, conn: &mut Conn) -> PendingReply {
    let mut name_buf = [0u8; 32];
    let name: &str = cmd.name_in(&mut name_buf);
    if !conn.authed && !matches!(name, "AUTH" | "HELLO" | "QUIT") {
        return err(pool, "NOAUTH Authentication required.".into());
    }
    match route(name) {
        Route::Proxy => proxy_command(pool, shared, name, &cmd, conn),
        Route::Refused(why) => {
            err(pool, format!("ERR '{}' is not supported by chash-proxy: {why}", cmd.name().to_ascii_lowercase()))
        }
        Route::Single => match cmd.args.get(1).cloned() {
            Some(key) => forward(pool, &key, cmd, conn.affinity).await,
            None => err(pool, arity(name)),
        },
        r @ (Route::Together { .. } | Route::Eval) => {
            let Some(positions) = key_positions(r, &cmd.args) else {
                return err(
                    pool,
                    if r == Route::Eval {
                        format!("ERR '{}' without keys cannot be routed by chash-proxy", name.to_ascii_lowercase())
                    } else {
                        arity(name)
                    },
                );
            };
            let state = pool.state();
            let mut server: Option<Arc<Server>> = None;
            for p in positions {
                let Some(s) = state.server_for(&cmd.args[p]) else {
                    return err(pool, "ERR no live server in pool".into());
                };
                match &server {
                    Some(first) if !Arc::ptr_eq(first, s) => {
                        return err(
                            pool,
                            format!(
                                "ERR '{}' keys are on different servers; keys used together need a common hash tag \
                                 such as {{user:1}} (pool hash_tag)",
                                name.to_ascii_lowercase()
                            ),
                        );
                    }
                    _ => server = Some(s.clone()),
                }
            }
            drop(state);
            match server {
                Some(s) => send(pool, s, cmd, conn.affinity).await,
                None => err(pool, arity(name)),
            }
        }
        Route::Mget => split(pool, cmd, 1, 1, Gather::InOrder, conn.affinity).await,
        Route::Mset => {
            if cmd.args.len() < 3 || cmd.args.len().is_multiple_of(2) {
                return err(pool, arity(name));
            }
            split(pool, cmd, 1, 2, Gather::AllOk, conn.affinity).await
        }
        Route::Sum => {
            if cmd.args.len() < 2 {
                return err(pool, arity(name));
            }
            split(pool, cmd, 1, 1, Gather::Sum, conn.affinity).await
        }
    }
}

fn proxy_command(pool: &Arc<Pool>, shared: &Arc<Shared>, name: &str, cmd: &Command, conn: &mut Conn) -> PendingReply {
    let args = &cmd.args;
    match name {
        "PING" => match args.len() {
            1 => ready(b"+PONG\r\n"),
            2 => ready_owned(bulk(&args[1])),
            _ => err(pool, arity(name)),
        },
        "ECHO" if args.len() == 2 => ready_owned(bulk(&args[1])),
        "QUIT" => ready(b"+OK\r\n"),
        // Enough for redis-cli: no command documentation to offer.
        "COMMAND" => ready(b"*0\r\n"),
        "INFO" => {
            let state = pool.state();
            let text = format!(
                "# Proxy\r\nproxy:chash-proxy\r\nversion:{}\r\npool:{}\r\ndistribution:{}\r\nservers:{}\r\nlive_servers:{}\r\n\
                 uptime_in_seconds:{}\r\nconnected_clients:{}\r\ntotal_commands_processed:{}\r\n",
                env!("CARGO_PKG_VERSION"),
                pool.name,
                pool.distribution().name(),
                state.members.len(),
                state.live().count(),
                shared.started.elapsed().as_secs(),
                pool.stats.curr_connections.load(Relaxed),
                pool.stats.requests.load(Relaxed),
            );
            ready_owned(bulk(text.as_bytes()))
        }
        "SELECT" if args.len() == 2 => {
            if std::str::from_utf8(&args[1]).ok().and_then(|d| d.parse::<u32>().ok()) == Some(pool.settings.redis_db) {
                ready(b"+OK\r\n")
            } else {
                err(pool, format!("ERR this pool serves database {} only (redis_db)", pool.settings.redis_db))
            }
        }
        "AUTH" if args.len() == 2 || args.len() == 3 => auth(pool, &args[args.len() - 1], conn),
        "HELLO" => {
            let mut i = 1;
            if let Some(v) = args.get(1) {
                if &v[..] != b"2" {
                    return err(pool, "NOPROTO this proxy speaks RESP2 only (HELLO 2)".into());
                }
                i = 2;
            }
            while i < args.len() {
                match String::from_utf8_lossy(&args[i]).to_ascii_uppercase().as_str() {
                    "AUTH" if i + 2 < args.len() => {
                        let reply = auth(pool, &args[i + 2], conn);
                        if !conn.authed {
                            return reply;
                        }
                        i += 3;
                    }
                    "SETNAME" if i + 1 < args.len() => i += 2,
                    _ => return err(pool, "ERR syntax error in HELLO".into()),
                }
            }
            if !conn.authed {
                return err(pool, "NOAUTH HELLO must be called with the client's password".into());
            }
            // A flat RESP2 array of field, value pairs; proto is an integer, as Redis sends it.
            let mut frame = BytesMut::new();
            frame.extend_from_slice(b"*10\r\n");
            for part in [&b"server"[..], b"chash-proxy", b"version", env!("CARGO_PKG_VERSION").as_bytes(), b"proto"] {
                frame.extend_from_slice(&bulk(part));
            }
            frame.extend_from_slice(b":2\r\n");
            for part in [&b"mode"[..], b"proxy", b"role", b"master"] {
                frame.extend_from_slice(&bulk(part));
            }
            ready_owned(frame.freeze())
        }
        _ => err(pool, arity(name)),
    }
}

fn auth(pool: &Pool, password: &[u8], conn: &mut Conn) -> PendingReply {
    match &pool.settings.redis_auth {
        None => err(
            pool,
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your \
             configuration is correct?"
                .into(),
        ),
        Some(pw) if pw.as_bytes() == password => {
            conn.authed = true;
            ready(b"+OK\r\n")
        }
        Some(_) => {
            conn.authed = false;
            err(pool, "WRONGPASS invalid username-password pair or user is disabled.".into())
        }
    }
}

async fn forward(pool: &Arc<Pool>, key: &[u8], cmd: Command, affinity: usize) -> PendingReply {
    let Some((server, load)) = pool.acquire(key) else { return err(pool, "ERR no live server in pool".into()) };
    let reply = send(pool, server, cmd, affinity).await;
    Box::pin(async move {
        let r = reply.await;
        drop(load);
        r
    })
}

async fn send(pool: &Arc<Pool>, server: Arc<Server>, cmd: Command, affinity: usize) -> PendingReply {
    let rx = server.submit(cmd.wire(), ReplyKind::Resp, affinity).await;
    let pool = pool.clone();
    Box::pin(async move {
        match server.finish(rx).await {
            Ok(Reply::Line(frame)) | Ok(Reply::Values(frame)) => Some(Out::Bytes(frame)),
            Ok(Reply::Stream(stream)) => {
                pool.stats.streamed_replies.fetch_add(1, Relaxed);
                Some(Out::Stream(stream))
            }
            Err(e) => {
                pool.stats.errors.fetch_add(1, Relaxed);
                Some(Out::Bytes(error(&format!("ERR backend {} {e}", server.id()))))
            }
        }
    })
}

/// How split replies come back together.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gather {
    /// Array items in the client's key order (MGET).
    InOrder,
    /// `+OK` when every part is (MSET).
    AllOk,
    /// Integers added up (DEL, EXISTS, ...).
    Sum,
}

/// Splits a multi-key command by server: keys from argument `first`, each
/// followed by `step - 1` values.
async fn split(
    pool: &Arc<Pool>,
    cmd: Command,
    first: usize,
    step: usize,
    gather: Gather,
    affinity: usize,
) -> PendingReply {
    let name = cmd.args[0].clone();
    let state = pool.state();
    // (server, argument groups, client positions)
    let mut groups: Vec<(Arc<Server>, Vec<Bytes>, Vec<usize>)> = Vec::new();
    for (slot, at) in (first..cmd.args.len()).step_by(step).enumerate() {
        let Some(server) = state.server_for(&cmd.args[at]) else {
            return err(pool, "ERR no live server in pool".into());
        };
        let g = match groups.iter().position(|g| Arc::ptr_eq(&g.0, server)) {
            Some(i) => i,
            None => {
                groups.push((server.clone(), vec![name.clone()], Vec::new()));
                groups.len() - 1
            }
        };
        groups[g].1.extend_from_slice(&cmd.args[at..at + step]);
        groups[g].2.push(slot);
    }
    drop(state);
    if groups.len() == 1 {
        // One server: the command goes as it came, and its reply (in the
        // client's key order already) comes back as the server sends it,
        // streamed when large.
        let server = groups.swap_remove(0).0;
        return send(pool, server, cmd, affinity).await;
    }
    let total = (cmd.args.len() - first) / step;
    let mut waits = Vec::with_capacity(groups.len());
    for (server, args, slots) in groups {
        let rx = server.submit(Command::new(args).wire(), ReplyKind::RespWhole, affinity).await;
        waits.push((server, rx, slots));
    }
    let pool = pool.clone();
    bytes_reply(async move {
        let mut items: Vec<Option<Bytes>> = vec![None; total];
        let mut sum = 0i64;
        for (server, rx, slots) in waits {
            let frame = match server.finish(rx).await {
                Ok(Reply::Line(f)) | Ok(Reply::Values(f)) => f,
                Ok(Reply::Stream(_)) => {
                    pool.stats.errors.fetch_add(1, Relaxed);
                    return Some(error("ERR backend sent an unexpected reply"));
                }
                Err(BackendError::TooLarge(limit)) => {
                    pool.stats.errors.fetch_add(1, Relaxed);
                    return Some(error(&format!(
                        "ERR reply from {} too large to combine with other servers' (over {limit} bytes): \
                         ask per server",
                        server.id()
                    )));
                }
                Err(e) => {
                    pool.stats.errors.fetch_add(1, Relaxed);
                    return Some(error(&format!("ERR backend {} {e}", server.id())));
                }
            };
            if frame.starts_with(b"-") {
                return Some(frame);
            }
            match gather {
                Gather::InOrder => {
                    let Some(parts) = array_items(&frame).filter(|p| p.len() == slots.len()) else {
                        return Some(error("ERR backend sent an unexpected reply"));
                    };
                    for (slot, part) in slots.into_iter().zip(parts) {
                        items[slot] = Some(part);
                    }
                }
                Gather::AllOk => {}
                Gather::Sum => sum += integer(&frame).unwrap_or(0),
            }
        }
        Some(match gather {
            Gather::InOrder => {
                let mut out = BytesMut::new();
                out.extend_from_slice(format!("*{total}\r\n").as_bytes());
                for item in items {
                    out.extend_from_slice(item.as_deref().unwrap_or(b"$-1\r\n"));
                }
                out.freeze()
            }
            Gather::AllOk => Bytes::from_static(b"+OK\r\n"),
            Gather::Sum => Bytes::from(format!(":{sum}\r\n")),
        })
    })
}
