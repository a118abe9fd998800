//! Redis pools: RESP2 and RESP3 framing ([`resp`]), how each command is routed
//! (`command`) by Redis's own key specs (`keyspec`, the table in
//! `commands` generated from a real redis-server), a client connection's
//! session (`session`) and the server connections' set-up (`handshake`).
//!
//! Single-key commands go to the key's server; `MGET`, `MSET`, `DEL`,
//! `UNLINK`, `EXISTS` and `TOUCH` are split by server and their replies
//! reassembled in order or summed; other multi-key commands (and scripts)
//! run when all their keys are on one server (hash tags make that so) and
//! are refused otherwise; `SCRIPT` and `FUNCTION` `LOAD`, `FLUSH` (...) go to every
//! server. `MULTI` ... `EXEC` transactions are queued by the
//! session and sent whole to the one server their keys are on; after `WATCH`
//! on a server connection of the client's own (pinned) until `EXEC`. `PING`,
//! `ECHO`, `QUIT`, `COMMAND`, `INFO`, `SELECT` (of the pool's `redis_db`),
//! `HELLO`, `AUTH` and `CLIENT` (about the client's own connection) are
//! answered by the proxy; after `HELLO 3` a client's requests go on the
//! servers' RESP3 connections. Everything that cannot be routed by key is
//! refused with an error naming the command and the reason.
//!
//! A membership change with `migrate` moves the moved keys' data
//! (`migrate`): on access first, and by a mover in the background.

pub(crate) mod access;
mod answers;
pub(crate) mod command;
#[rustfmt::skip]
pub(crate) mod commands;
pub mod copy;
mod errors;
mod everywhere;
pub(crate) mod handshake;
pub(crate) mod keyspec;
mod migrate;
pub(crate) mod protocol;
mod pubsub;
pub mod resp;
pub(crate) mod sentinel;
pub(crate) mod session;
mod subscribed;
mod transaction;
