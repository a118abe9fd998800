//! Transactions through the proxy: `MULTI` ... `EXEC` queued by the proxy
//! and sent to their one server together, and `WATCH` on a server
//! connection of the client's own.

use std::sync::Arc;

use bytes::BytesMut;

use super::command::{keys_of, route, Route};
use super::errors::{arity, backend_error, err, forward_error};
use super::resp::{error, frames, Command, WHOLE, WHOLE_REPLY_LIMIT};
use super::session::{changed, RedisSession, Transaction, Watch, DECIDE_TRIES};
use crate::backend::{Reply, Server};
use crate::conn::{bytes_reply, ready, ready_owned, PendingReply};
use crate::pool::{routes_as_decided, same_placement, PoolState};

/// The most commands (and bytes) a transaction queues in the proxy.
const MAX_TRANSACTION: usize = 100_000;

impl RedisSession {
    /// `MULTI`, `EXEC`, `DISCARD`.
    pub(super) async fn transaction(&mut self, name: &str, cmd: Command) -> PendingReply {
        match (name, self.tx.take()) {
            ("WATCH", None) => self.watch(cmd).await,
            ("UNWATCH", None) => {
                // Closing the connection forgets what it watched.
                self.watch = None;
                ready(b"+OK\r\n")
            }
            ("MULTI", None) => {
                // Watched keys pin the transaction to their server.
                let server = self.watch.as_ref().map(|w| w.server.clone());
                self.tx = Some(Transaction { server, ..Transaction::default() });
                ready(b"+OK\r\n")
            }
            ("MULTI", Some(tx)) => {
                self.tx = Some(tx);
                err(&self.pool, "ERR MULTI calls can not be nested".into())
            }
            ("DISCARD", Some(_)) => {
                self.watch = None;
                ready(b"+OK\r\n")
            }
            ("EXEC", Some(tx)) => self.exec(tx).await,
            (_, None) => err(&self.pool, format!("ERR {name} without MULTI")),
            (_, Some(tx)) => {
                self.tx = Some(tx);
                err(&self.pool, format!("ERR {name} inside MULTI is not allowed"))
            }
        }
    }

    /// `WATCH`: on a server connection of the client's own, pinned until
    /// `EXEC`, `DISCARD` or `UNWATCH`. Its reply is awaited here, so the
    /// client's later commands (the reads its transaction depends on) run
    /// after the keys are watched even when it pipelines them.
    pub(super) async fn watch(&mut self, cmd: Command) -> PendingReply {
        let pool = self.pool.clone();
        let keys: Vec<&[u8]> = cmd.args.range(1..).collect();
        let state = match self.decide(&keys).await {
            Ok(Some(state)) => state,
            Ok(None) => return changed(&pool),
            Err(refused) => return refused,
        };
        let server = {
            let mut server: Option<Arc<Server>> = self.watch.as_ref().map(|w| w.server.clone());
            for key in cmd.args.range(1..) {
                let Some(s) = state.server_for(key) else {
                    return ready_owned(forward_error(&pool, "ERR no live server in pool".into()));
                };
                match &server {
                    Some(first) if !Arc::ptr_eq(first, s) => {
                        return err(
                            &pool,
                            format!(
                                "ERR 'watch' key '{}' is on another server than the other watched keys; keys \
                                 watched together (and their transaction's) need a common hash tag such as \
                                 {{user:1}} (pool hash_tag)",
                                String::from_utf8_lossy(key)
                            ),
                        );
                    }
                    Some(_) => {}
                    None => server = Some(s.clone()),
                }
            }
            match server {
                Some(s) => s,
                None => return err(&pool, arity("WATCH")),
            }
        };
        let watch = self.watch.get_or_insert_with(|| Watch {
            pinned: server.pin(&self.requester),
            server,
            state: state.clone(),
        });
        let pending = watch.server.submit_pinned(&watch.pinned, cmd.wire(), WHOLE, 1, &self.requester).await;
        match watch.server.finish(pending).await {
            Ok(Reply::Whole(frame)) => ready_owned(frame),
            Ok(Reply::Stream(_)) => err(&pool, "ERR backend sent an unexpected reply".into()),
            Err(e) => {
                let id = watch.server.id().to_owned();
                self.watch = None;
                ready_owned(forward_error(&pool, format!("ERR backend {id} {e}; nothing is watched")))
            }
        }
    }

    /// Queues a command of the transaction: `+QUEUED`, or an error that
    /// makes `EXEC` discard it all (as Redis does with a command it cannot
    /// queue): a command that cannot run in a transaction through the
    /// proxy, or whose keys are on another server than the transaction's.
    pub(super) fn queue(&mut self, name: &str, cmd: Command) -> PendingReply {
        let pool = self.pool.clone();
        let Some(tx) = self.tx.as_mut() else { return err(&pool, "ERR not in a transaction".into()) };
        let lower = name.to_ascii_lowercase();
        let route = route(name, &cmd.args);
        let positions: Vec<usize> = match &route {
            // Sent along and answered by the server, as Redis queues them.
            Route::Proxy if matches!(name, "PING" | "ECHO") => Vec::new(),
            Route::Transaction if name == "UNWATCH" => Vec::new(),
            Route::Arity => {
                tx.refused = true;
                return err(&pool, arity(name));
            }
            r => match keys_of(r, cmd.args.len()) {
                Some(p) => p,
                None => {
                    tx.refused = true;
                    return err(&pool, format!("ERR '{lower}' cannot run in a transaction through chash-proxy"));
                }
            },
        };
        let state = pool.routing_state();
        for p in positions {
            tx.keys.push(cmd.args.bytes(p));
            let Some(s) = state.server_for(&cmd.args[p]) else {
                tx.refused = true;
                return ready_owned(forward_error(&pool, "ERR no live server in pool".into()));
            };
            match &tx.server {
                Some(first) if !Arc::ptr_eq(first, s) => {
                    tx.refused = true;
                    return err(
                        &pool,
                        format!(
                            "ERR '{lower}' uses key '{}', on another server than the transaction's earlier keys; \
                             the keys of a transaction need a common hash tag such as {{user:1}} (pool hash_tag)",
                            String::from_utf8_lossy(&cmd.args[p])
                        ),
                    );
                }
                Some(_) => {}
                None => {
                    tx.server = Some(s.clone());
                    tx.queued = Some(state.clone());
                }
            }
        }
        tx.bytes += cmd.args.iter().map(|a| a.len() + 16).sum::<usize>();
        if tx.commands.len() >= MAX_TRANSACTION || tx.bytes > WHOLE_REPLY_LIMIT {
            tx.refused = true;
            return err(&pool, "ERR transaction too large for chash-proxy".into());
        }
        tx.commands.push(cmd);
        ready(b"+QUEUED\r\n")
    }

    /// Sends a queued transaction to its server as one write and answers
    /// with `EXEC`'s reply; nothing runs when it was refused.
    pub(super) async fn exec(&mut self, tx: Transaction) -> PendingReply {
        // EXEC ends the watch whatever happens.
        let watch = self.watch.take();
        if tx.refused {
            return err(&self.pool, "EXECABORT Transaction discarded because of previous errors.".into());
        }
        if tx.commands.is_empty() && watch.is_none() {
            return ready(b"*0\r\n");
        }
        // Watched keys: the transaction runs where they were watched. A
        // membership change or a migration since (its keys may have moved:
        // a move aborts it on its server, but a key that did not exist
        // would be written where it no longer belongs) aborts it here, as
        // a change of a watched key does: nothing runs.
        // During a migration its other keys move first too (the watched
        // ones moved at WATCH), by the very state they were watched by.
        let mut tx = tx;
        if let Some(w) = &watch {
            let mut holds = same_placement(&self.pool.routing_guard(), &w.state);
            if holds && w.state.migration.is_some() && !tx.keys.is_empty() {
                match self.move_first(tx.keys.iter().map(|k| &k[..])).await {
                    Ok(decided) => holds = decided.is_some_and(|d| Arc::ptr_eq(&d, &w.state)),
                    Err(refused) => return refused,
                }
            }
            if !holds {
                // The watching connection goes (it forgets what it watched).
                drop(watch);
                return ready(if self.requester.dialect == 1 { b"_\r\n" } else { b"*-1\r\n" });
            }
        }
        // Its keys move first (a migration), and it runs where they are
        // then, unless they are still where it was queued by.
        if watch.is_none() && !tx.keys.is_empty() {
            let keys: Vec<&[u8]> = tx.keys.iter().map(|k| &k[..]).collect();
            let state = match self.decide(&keys).await {
                Ok(Some(state)) => state,
                Ok(None) => return changed(&self.pool),
                Err(refused) => return refused,
            };
            let same = tx.queued.as_ref().is_some_and(|q| same_placement(&state, q));
            if !same {
                let mut servers = keys.iter().map(|k| state.server_for(k));
                let Some(first) = servers.next().flatten().cloned() else {
                    return ready_owned(forward_error(&self.pool, "ERR no live server in pool".into()));
                };
                if !servers.all(|s| s.is_some_and(|s| Arc::ptr_eq(s, &first))) {
                    return err(
                        &self.pool,
                        "EXECABORT Transaction discarded: the pool changed while it was queued and its keys are \
                         now on different servers"
                            .into(),
                    );
                }
                tx.server = Some(first);
            }
        }
        let server = match tx.server {
            Some(s) => s,
            // Only keyless commands (PING, ECHO): any server answers.
            None => match self.pool.state().server_for(b"") {
                Some(s) => s.clone(),
                None => return ready_owned(forward_error(&self.pool, "ERR no live server in pool".into())),
            },
        };
        let mut data = BytesMut::new();
        data.extend_from_slice(b"*1\r\n$5\r\nMULTI\r\n");
        for cmd in &tx.commands {
            data.extend_from_slice(&cmd.wire());
        }
        data.extend_from_slice(b"*1\r\n$4\r\nEXEC\r\n");
        let n = tx.commands.len() + 2;
        let pending = match &watch {
            // The transaction's server is the watched keys' (MULTI made it so).
            Some(w) => server.submit_pinned(&w.pinned, data.freeze(), WHOLE, n, &self.requester).await,
            None => server.submit_frames(data.freeze(), WHOLE, n, &self.requester).await,
        };
        let pool = self.pool.clone();
        bytes_reply(async move {
            match server.finish(pending).await {
                // MULTI's +OK, each command's +QUEUED (or its error, which
                // makes EXEC's reply -EXECABORT), then EXEC's reply.
                Ok(Reply::Whole(replies)) => {
                    // EXEC unwatched everything: the connection is clean.
                    if let Some(w) = watch {
                        server.release(w.pinned);
                    }
                    let all = frames(&replies);
                    Some(all.last().cloned().unwrap_or_else(|| error("ERR backend sent an unexpected reply")))
                }
                Ok(Reply::Stream(_)) => Some(error("ERR backend sent an unexpected reply")),
                Err(e) => Some(backend_error(&pool, server.id(), &e)),
            }
        })
    }
}

impl RedisSession {
    /// The state a command of `keys` is routed by, its keys moved first (a
    /// migration): the state their moves were decided by, or, with no
    /// migration, this worker's (see [`routes_as_decided`]). `None`: the
    /// pool changed each time.
    async fn decide(&self, keys: &[&[u8]]) -> Result<Option<Arc<PoolState>>, PendingReply> {
        for attempt in 0..DECIDE_TRIES {
            let mut decided = None;
            if attempt > 0 || self.pool.migrating() {
                decided = self.move_first(keys.iter().copied()).await?;
            }
            let state = self.pool.routing_state();
            if routes_as_decided(&state, decided.as_ref()) {
                return Ok(Some(state));
            }
        }
        Ok(None)
    }
}
