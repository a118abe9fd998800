//! A client's side of pub/sub: `SUBSCRIBE`, `PSUBSCRIBE`, `SSUBSCRIBE` and
//! their `UN` forms against the pool's [`Hub`], and the subscribed state:
//! from the first subscription until the last is gone, everything the
//! client is sent (confirmations, messages, replies) goes on one stream,
//! in order. A RESP2 client may then only (un)subscribe, `PING`, `QUIT`
//! and `RESET`, as Redis says; a RESP3 client may run any command, its
//! reply among the pushed messages.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::pubsub::{pubsub_kind, Hub, Kind, Outbox, Subscribed, Topic};
use super::resp::{bulk, error, Command};
use super::session::RedisSession;
use crate::conn::{Out, Step};

/// How long a new subscription may wait for its servers' confirmation.
const CONFIRM_WITHIN: Duration = Duration::from_secs(10);

/// A confirmation frame: `[word, name or nil, count]`, pushed in RESP3.
fn confirmation(resp3: bool, word: &[u8], name: Option<&[u8]>, count: usize) -> Bytes {
    let mut out = BytesMut::new();
    out.extend_from_slice(if resp3 { b">3\r\n" } else { b"*3\r\n" });
    out.extend_from_slice(&bulk(word));
    match name {
        Some(n) => out.extend_from_slice(&bulk(n)),
        None => out.extend_from_slice(if resp3 { b"_\r\n" } else { b"$-1\r\n" }),
    }
    out.extend_from_slice(format!(":{count}\r\n").as_bytes());
    out.freeze()
}

impl RedisSession {
    /// A command of a client that is subscribed, or subscribes now.
    pub(super) async fn pubsub_step(&mut self, name: &str, cmd: Command) -> Step {
        let resp3 = self.requester.dialect == 1;
        if let Some((kind, on)) = pubsub_kind(name) {
            if !self.authed {
                let e = super::errors::err_bytes(&self.pool, "NOAUTH Authentication required.".into());
                return self.reply_or_push(e);
            }
            if self.in_transaction() {
                // As any command the proxy cannot queue: EXEC then aborts.
                self.refuse_transaction();
                let msg = format!("ERR '{}' inside MULTI is not supported by chash-proxy", name.to_ascii_lowercase());
                return self.reply_or_push(super::errors::err_bytes(&self.pool, msg));
            }
            if on && cmd.args.len() < 2 {
                return self.reply_or_push(super::errors::err_bytes(&self.pool, super::errors::arity(name)));
            }
            return self.subscription(kind, on, cmd).await;
        }
        let Some(sub) = self.sub.as_ref() else {
            // RESET outside the subscribed state.
            self.reset();
            return Step::Reply(crate::conn::ready(b"+RESET\r\n"));
        };
        let outbox = sub.outbox.clone();
        match name {
            "PING" if !resp3 => {
                let mut out = BytesMut::from(&b"*2\r\n$4\r\npong\r\n"[..]);
                out.extend_from_slice(&bulk(cmd.args.get(1).unwrap_or_default()));
                outbox.push(out.freeze());
                Step::Taken
            }
            "QUIT" => {
                outbox.push(Bytes::from_static(b"+OK\r\n"));
                self.sub = None;
                outbox.finish();
                Step::Close { reply: None, error: false }
            }
            "RESET" => {
                self.sub = None;
                self.reset();
                outbox.push(Bytes::from_static(b"+RESET\r\n"));
                outbox.finish();
                Step::Taken
            }
            _ if !resp3 => {
                outbox.push(error(&format!(
                    "ERR Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are \
                     allowed in this context",
                    name.to_ascii_lowercase()
                )));
                self.pool.counters().errors.fetch_add(1, Relaxed);
                Step::Taken
            }
            _ if super::command::spec_of(&cmd.args).is_some_and(|s| s.blocking) => {
                // Awaited here, a blocked command would keep the proxy from
                // seeing the client go: refused.
                outbox.push(super::errors::err_bytes(
                    &self.pool,
                    format!(
                        "ERR '{}' while subscribed is not supported by chash-proxy: block on another connection",
                        name.to_ascii_lowercase()
                    ),
                ));
                Step::Taken
            }
            _ => {
                // RESP3: any command, its reply among the messages.
                let reply = self.dispatch(cmd).await;
                match reply.await {
                    Some(Out::Bytes(b)) => {
                        outbox.push(b);
                    }
                    Some(Out::Stream(mut s)) => {
                        while let Some(chunk) = s.0.recv().await {
                            outbox.push(chunk.data);
                            if chunk.last {
                                break;
                            }
                        }
                    }
                    Some(Out::Sent(_)) | None => {}
                }
                // HELLO 2 turns the messages back into RESP2 arrays.
                outbox.set_resp3(self.requester.dialect == 1);
                Step::Taken
            }
        }
    }

    /// `(P|S)SUBSCRIBE` (`on`) or `(P|S)UNSUBSCRIBE`.
    async fn subscription(&mut self, kind: Kind, on: bool, cmd: Command) -> Step {
        let resp3 = self.requester.dialect == 1;
        let Some(hub) = Hub::of(&self.pool) else {
            return Step::Reply(super::errors::err(&self.pool, "ERR pub/sub is not available on this pool".into()));
        };
        let names: Vec<Bytes> = (1..cmd.args.len()).map(|i| cmd.args.bytes(i)).collect();
        if !on {
            let Some(sub) = self.sub.as_mut() else {
                // Not subscribed: Redis answers each name (or nil) with 0.
                let mut out = BytesMut::new();
                if names.is_empty() {
                    out.extend_from_slice(&confirmation(resp3, kind.word(false), None, 0));
                }
                for n in &names {
                    out.extend_from_slice(&confirmation(resp3, kind.word(false), Some(n), 0));
                }
                return Step::Reply(crate::conn::ready_owned(out.freeze()));
            };
            let leaving: Vec<Topic> = if names.is_empty() {
                sub.topics.iter().filter(|t| t.0 == kind).cloned().collect()
            } else {
                names.iter().map(|n| (kind, n.clone())).collect()
            };
            if leaving.is_empty() {
                sub.outbox.push(confirmation(resp3, kind.word(false), None, sub.count(kind)));
            }
            for topic in leaving {
                sub.topics.retain(|t| *t != topic);
                hub.leave(sub.id, std::slice::from_ref(&topic));
                sub.outbox.push(confirmation(resp3, kind.word(false), Some(&topic.1), sub.count(kind)));
            }
            if sub.topics.is_empty() {
                sub.outbox.finish();
                self.sub = None;
            }
            return Step::Taken;
        }
        // Subscribed on the servers first, confirmed to the client after.
        let mut ready = Vec::new();
        for n in &names {
            let topic = (kind, n.clone());
            match hub.reserve(&topic) {
                Ok(acks) => ready.push((topic, acks)),
                Err(why) => {
                    for (t, _) in &ready {
                        hub.unreserve(t);
                    }
                    let msg = format!("ERR cannot subscribe to {}: {why}", String::from_utf8_lossy(n));
                    return self.reply_or_push(super::errors::err_bytes(&self.pool, msg));
                }
            }
        }
        let mut unconfirmed = None;
        for (topic, acks) in &mut ready {
            for ack in acks.drain(..) {
                if !matches!(tokio::time::timeout(CONFIRM_WITHIN, ack).await, Ok(Ok(()))) {
                    unconfirmed.get_or_insert_with(|| topic.1.clone());
                }
            }
        }
        if let Some(name) = unconfirmed {
            for (t, _) in &ready {
                hub.unreserve(t);
            }
            let msg = format!(
                "ERR the servers did not confirm the subscription to {} within {} s",
                String::from_utf8_lossy(&name),
                CONFIRM_WITHIN.as_secs()
            );
            return self.reply_or_push(super::errors::err_bytes(&self.pool, msg));
        }
        let mut stream = None;
        if self.sub.is_none() {
            let (outbox, s) = Outbox::start(self.pool.clone(), resp3, self.requester.account.clone());
            self.sub = Some(Subscribed { id: hub.client_id(), hub: hub.clone(), outbox, topics: Vec::new() });
            stream = Some(s);
        }
        let sub = self.sub.as_mut().expect("subscribed");
        for (topic, _) in ready {
            if sub.topics.contains(&topic) {
                // Already listening: confirmed again, as Redis does.
                hub.unreserve(&topic);
                sub.outbox.push(confirmation(resp3, kind.word(true), Some(&topic.1), sub.count(kind)));
            } else {
                sub.topics.push(topic.clone());
                let frame = confirmation(resp3, kind.word(true), Some(&topic.1), sub.count(kind));
                hub.join(&topic, sub.id, &sub.outbox, frame);
            }
        }
        match stream {
            Some(s) => Step::Reply(crate::conn::PendingReply::Now(Some(Out::Stream(s)))),
            None => Step::Taken,
        }
    }

    /// An error for a client: on its stream when subscribed.
    fn reply_or_push(&mut self, frame: Bytes) -> Step {
        match &self.sub {
            Some(sub) => {
                sub.outbox.push(frame);
                Step::Taken
            }
            None => Step::Reply(crate::conn::ready_owned(frame)),
        }
    }
}
