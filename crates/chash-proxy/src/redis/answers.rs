//! The commands a Redis pool's proxy answers itself: `PING`, `ECHO`,
//! `COMMAND`, `INFO`, `SELECT`, `HELLO`, `AUTH` and `CLIENT` (about the
//! client's own connection).

use bytes::{Bytes, BytesMut};

use super::errors::{arity, err};
use super::resp::{bulk, Command};
use super::session::RedisSession;
use crate::conn::{ready, ready_owned, PendingReply};
use crate::options::Shared;
use crate::pool::Pool;

impl RedisSession {
    pub(super) fn proxy_command(&mut self, name: &str, cmd: &Command) -> PendingReply {
        let pool = &self.pool;
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
            "SELECT" if args.len() == 2 => {
                if std::str::from_utf8(&args[1]).ok().and_then(|d| d.parse::<u32>().ok()) == Some(pool.spec().redis_db)
                {
                    ready(b"+OK\r\n")
                } else {
                    err(pool, format!("ERR this pool serves database {} only (redis_db)", pool.spec().redis_db))
                }
            }
            "AUTH" if args.len() == 2 => self.auth(None, &args[1]),
            "AUTH" if args.len() == 3 => self.auth(Some(&args[1]), &args[2]),
            "CLIENT" => self.client_command(cmd),
            "HELLO" => {
                let mut i = 1;
                let mut resp3 = self.requester.dialect == 1;
                if let Some(v) = args.get(1) {
                    match v {
                        b"2" => resp3 = false,
                        b"3" => resp3 = true,
                        _ => {
                            return err(pool, "NOPROTO unsupported protocol version (this proxy speaks 2 and 3)".into())
                        }
                    }
                    i = 2;
                }
                while i < args.len() {
                    match String::from_utf8_lossy(&args[i]).to_ascii_uppercase().as_str() {
                        "AUTH" if i + 2 < args.len() => {
                            // A wrong pair refuses the whole HELLO, logged in
                            // before or not (as Redis does).
                            // Without logins configured, HELLO's AUTH is taken
                            // as it always was (no password to check).
                            let logins = super::access::needs_login(self.pool.spec());
                            if logins {
                                if let Err(refused) = self.login_as(Some(&args[i + 1]), &args[i + 2]) {
                                    return refused;
                                }
                            }
                            i += 3;
                        }
                        "SETNAME" if i + 1 < args.len() => {
                            self.name = Some(args.bytes(i + 1));
                            i += 2;
                        }
                        _ => return err(&self.pool, "ERR syntax error in HELLO".into()),
                    }
                }
                if !self.authed {
                    return err(&self.pool, "NOAUTH HELLO must be called with the client's password".into());
                }
                // RESP3 from here on: this client's requests go on server
                // connections that speak it, so replies come as RESP3.
                self.requester.dialect = usize::from(resp3);
                ready_owned(hello_reply(resp3, self.requester.affinity))
            }
            _ => err(pool, arity(name)),
        }
    }

    /// `CLIENT` about this client's own connection to the proxy (each of
    /// its commands may go to another server connection, so the servers'
    /// `CLIENT` would describe someone else's).
    fn client_command(&mut self, cmd: &Command) -> PendingReply {
        let args = &cmd.args;
        let sub = args.get(1).map(|a| String::from_utf8_lossy(a).to_ascii_uppercase()).unwrap_or_default();
        match (sub.as_str(), args.len()) {
            ("SETNAME", 3) => {
                if args[2].iter().any(|&b| b <= b' ' || b == 0x7f) {
                    return err(
                        &self.pool,
                        "ERR Client names cannot contain spaces, newlines or special characters.".into(),
                    );
                }
                self.name = (!args[2].is_empty()).then(|| args.bytes(2));
                ready(b"+OK\r\n")
            }
            ("GETNAME", 2) => match &self.name {
                Some(n) => ready_owned(bulk(n)),
                None => ready(self.null()),
            },
            ("ID", 2) => ready_owned(Bytes::from(format!(":{}\r\n", self.requester.affinity))),
            ("SETINFO", 4) => {
                let at = match String::from_utf8_lossy(&args[2]).to_ascii_uppercase().as_str() {
                    "LIB-NAME" => 0,
                    "LIB-VER" => 1,
                    _ => return err(&self.pool, "ERR Unrecognized option for CLIENT SETINFO".into()),
                };
                self.lib[at] = Some(args.bytes(3));
                ready(b"+OK\r\n")
            }
            ("INFO", 2) => {
                let text =
                    |v: &Option<Bytes>| v.as_ref().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
                let line = format!(
                    "id={} name={} db={} lib-name={} lib-ver={}\n",
                    self.requester.affinity,
                    text(&self.name),
                    self.pool.spec().redis_db,
                    text(&self.lib[0]),
                    text(&self.lib[1])
                );
                ready_owned(bulk(line.as_bytes()))
            }
            _ => err(
                &self.pool,
                format!(
                    "ERR 'client {}' is not supported by chash-proxy: it answers SETNAME, GETNAME, SETINFO, ID and \
                     INFO for the client's own connection",
                    sub.to_ascii_lowercase()
                ),
            ),
        }
    }

    /// A null reply in the client's protocol.
    pub(super) fn null(&self) -> &'static [u8] {
        if self.requester.dialect == 1 {
            b"_\r\n"
        } else {
            b"$-1\r\n"
        }
    }

    /// `AUTH [user] password`, against the pool's `redis_auth` (the
    /// `default` user) and `users`.
    fn auth(&mut self, user: Option<&[u8]>, password: &[u8]) -> PendingReply {
        match self.login_as(user, password) {
            Ok(()) => ready(b"+OK\r\n"),
            Err(refused) => refused,
        }
    }

    /// Logs the client in, or says why not (a wrong pair: `WRONGPASS`;
    /// Redis keeps the connection's earlier login then, and so does the
    /// proxy).
    fn login_as(&mut self, user: Option<&[u8]>, password: &[u8]) -> Result<(), PendingReply> {
        let config = self.pool.config();
        if !super::access::needs_login(&config) {
            return Err(err(
                &self.pool,
                "ERR AUTH <password> called without any password configured for the default user. Are you sure \
                 your configuration is correct?"
                    .into(),
            ));
        }
        match super::access::login(&config, user, password) {
            Some(login) => {
                self.authed = true;
                self.login = Some(login);
                Ok(())
            }
            None => {
                self.pool.counters().auth_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(err(&self.pool, "WRONGPASS invalid username-password pair or user is disabled.".into()))
            }
        }
    }
}

/// `HELLO`'s reply: the proxy's fields as Redis lists its own, a RESP3 map
/// or a RESP2 array of field, value pairs.
fn hello_reply(resp3: bool, id: usize) -> Bytes {
    let mut frame = BytesMut::new();
    frame.extend_from_slice(if resp3 { b"%7\r\n" } else { b"*14\r\n" });
    let field = |frame: &mut BytesMut, name: &[u8]| frame.extend_from_slice(&bulk(name));
    field(&mut frame, b"server");
    field(&mut frame, b"chash-proxy");
    field(&mut frame, b"version");
    field(&mut frame, env!("CARGO_PKG_VERSION").as_bytes());
    field(&mut frame, b"proto");
    frame.extend_from_slice(if resp3 { b":3\r\n" } else { b":2\r\n" });
    field(&mut frame, b"id");
    frame.extend_from_slice(format!(":{id}\r\n").as_bytes());
    field(&mut frame, b"mode");
    field(&mut frame, b"proxy");
    field(&mut frame, b"role");
    field(&mut frame, b"master");
    field(&mut frame, b"modules");
    frame.extend_from_slice(b"*0\r\n");
    frame.freeze()
}

/// The pool's counters in the format of Redis's `INFO` (its `# Proxy`
/// section and `# Stats`).
pub(super) fn info(pool: &Pool, shared: &Shared) -> String {
    use std::fmt::Write as _;
    let snap = pool.stats();
    let mut text = String::from("# Proxy\r\n");
    let _ = write!(
        text,
        "proxy:chash-proxy\r\nversion:{}\r\npool:{}\r\ndistribution:{}\r\nservers:{}\r\nlive_servers:{}\r\n\
         uptime_in_seconds:{}\r\nkey_specs_of_redis:{}\r\nmembership_version:{}\r\nplacement_fingerprint:{}\r\n\
         locally_ejected:{}\r\n",
        env!("CARGO_PKG_VERSION"),
        snap.name,
        snap.distribution,
        snap.servers.len(),
        snap.live_servers,
        shared.started.elapsed().as_secs(),
        super::commands::REDIS_VERSION,
        snap.version,
        snap.fingerprint,
        snap.locally_ejected.join(","),
    );
    // Redis's names for what both count.
    let _ = write!(
        text,
        "connected_clients:{}\r\ntotal_commands_processed:{}\r\n# Stats\r\n",
        snap.get("curr_connections"),
        snap.get("requests")
    );
    for (d, v) in &snap.counters {
        let _ = write!(text, "{}:{v}\r\n", d.name);
    }
    text
}
