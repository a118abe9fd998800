//! How each Redis command is routed: the proxy's policy over Redis's own
//! key specs (`commands`, generated from a real redis-server): a command
//! goes where its keys are, as Redis itself locates them.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

use crate::redis::resp::Args;

use super::commands::COMMANDS;
use super::keyspec::Spec;

/// How split replies come back together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gather {
    /// Array items in the client's key order (MGET).
    InOrder,
    /// `+OK` when every part is (MSET).
    AllOk,
    /// Integers added up (DEL, EXISTS, ...).
    Sum,
}

/// The commands about the whole keyspace, answered from every server
/// (`everywhere`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Every {
    Scan,
    Keys,
    Dbsize,
    RandomKey,
    Flush,
    Info,
    Time,
    LastSave,
    Pubsub,
}

impl Every {
    /// The command `name` (in capitals) names, if it is one of them.
    pub(crate) fn of(name: &str) -> Option<Every> {
        Some(match name {
            "SCAN" => Every::Scan,
            "KEYS" => Every::Keys,
            "DBSIZE" => Every::Dbsize,
            "RANDOMKEY" => Every::RandomKey,
            "FLUSHDB" | "FLUSHALL" => Every::Flush,
            "INFO" => Every::Info,
            "TIME" => Every::Time,
            "LASTSAVE" => Every::LastSave,
            "PUBSUB" => Every::Pubsub,
            _ => return None,
        })
    }

    /// Whether `argc` arguments (the name included) fit it.
    pub(crate) fn fits(self, argc: usize) -> bool {
        match self {
            Every::Scan => argc >= 2 && argc.is_multiple_of(2),
            Every::Keys => argc == 2,
            Every::Dbsize | Every::RandomKey | Every::Time | Every::LastSave => argc == 1,
            Every::Flush => argc <= 2,
            Every::Info => true,
            Every::Pubsub => argc >= 2,
        }
    }
}

/// What the proxy does with a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Answered by the proxy itself.
    Proxy,
    /// `MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH`: the session queues
    /// the transaction and sends it whole to the one server its keys are
    /// on (on a connection of the client's own after `WATCH`).
    Transaction,
    /// To the server of the key at this position.
    Key(usize),
    /// To the server of these keys (all must be on one).
    Keys(Vec<usize>),
    /// Split by server: keys from argument 1, each followed by `step - 1`
    /// values; the parts' replies gathered.
    Split {
        /// Arguments per key.
        step: usize,
        /// How the replies come together.
        gather: Gather,
    },
    /// `SCRIPT LOAD`, `EXISTS` or `FLUSH`, `FUNCTION LOAD`, `DELETE` or
    /// `FLUSH`: to every server.
    Script,
    /// About the whole keyspace: answered from every server
    /// (`everywhere`).
    Everywhere(Every),
    /// A blocking command (`BLPOP`, `XREAD ... BLOCK`, ...) on a server
    /// connection of the client's own, to the server of these keys (all
    /// on one).
    Blocking(Vec<usize>),
    /// Refused, with the reason.
    Refused(String),
    /// The arguments do not fit the command (Redis's arity error).
    Arity,
}

/// Why keyless commands are refused.
const NO_KEY: &str = "it addresses one server, not a key";

/// The route of the command `args` (the name first), `name` being its
/// name in capitals (`Command::name_in`; empty when it is not a word).
pub(crate) fn route(name: &str, args: &Args) -> Route {
    // The commonest commands, located without the table.
    match common_key(args) {
        Some(key) => Route::Key(key),
        None => route_by_table(name, args),
    }
}

/// The key's position in the commonest commands (`GET`, `SET`), told
/// from the name as sent, in any case: no upper-casing, no table (the
/// table says the same of them, as the tests check).
#[inline]
pub(crate) fn common_key(args: &Args) -> Option<usize> {
    let &[a, b, c] = args.first()? else { return None };
    // Setting bit 5 lower-cases a letter, and only `G` and `g` become
    // `g` so (likewise `e`, `s`, `t`): the names in any case, and no
    // other bytes.
    let name = [a | 0x20, b | 0x20, c | 0x20];
    match args.len() {
        2 if name == *b"get" => Some(1),
        3.. if name == *b"set" => Some(1),
        _ => None,
    }
}

/// [`route`] by the command table (and the commands the proxy treats its
/// own way).
fn route_by_table(name: &str, args: &Args) -> Route {
    if args.is_empty() {
        return Route::Arity;
    }
    let has = |word: &str| args.range(1..).any(|a| a.eq_ignore_ascii_case(word.as_bytes()));
    match name {
        "PING" | "ECHO" | "QUIT" | "COMMAND" | "SELECT" | "HELLO" | "AUTH" | "CLIENT" => return Route::Proxy,
        "SCAN" | "KEYS" | "DBSIZE" | "RANDOMKEY" | "FLUSHDB" | "FLUSHALL" | "INFO" | "TIME" | "LASTSAVE" => {
            return Every::of(name).map_or(Route::Arity, Route::Everywhere)
        }
        "MULTI" | "EXEC" | "DISCARD" | "UNWATCH" if args.len() != 1 => return Route::Arity,
        "WATCH" if args.len() < 2 => return Route::Arity,
        "MULTI" | "EXEC" | "DISCARD" | "WATCH" | "UNWATCH" => return Route::Transaction,
        "MGET" | "DEL" | "UNLINK" | "EXISTS" | "TOUCH" if args.len() < 2 => return Route::Arity,
        "MGET" => return Route::Split { step: 1, gather: Gather::InOrder },
        "DEL" | "UNLINK" | "EXISTS" | "TOUCH" => return Route::Split { step: 1, gather: Gather::Sum },
        "MSET" if args.len() < 3 || args.len().is_multiple_of(2) => return Route::Arity,
        "MSET" => return Route::Split { step: 2, gather: Gather::AllOk },
        "SCRIPT" | "FUNCTION" if args.len() < 2 => return Route::Arity,
        "SCRIPT" | "FUNCTION" => {
            let sub = args.get(1).map(|s| String::from_utf8_lossy(s).to_ascii_uppercase()).unwrap_or_default();
            let everywhere: &[&str] =
                if name == "SCRIPT" { &["LOAD", "EXISTS", "FLUSH"] } else { &["LOAD", "DELETE", "FLUSH"] };
            return if everywhere.contains(&sub.as_str()) {
                Route::Script
            } else {
                Route::Refused(format!("{name} {sub} addresses one server; {} go to all", everywhere.join(", ")))
            };
        }
        // Subscriptions are the session's (`subscribed`); inside MULTI
        // they are refused.
        "SUBSCRIBE" | "PSUBSCRIBE" | "SSUBSCRIBE" | "UNSUBSCRIBE" | "PUNSUBSCRIBE" | "SUNSUBSCRIBE" | "RESET" => {
            return Route::Refused("it cannot be queued in a transaction through the proxy".into())
        }
        // A channel lives on the server its name is placed on.
        "PUBLISH" if args.len() == 3 => return Route::Key(1),
        "PUBLISH" => return Route::Arity,
        "PUBSUB" if args.len() < 2 => return Route::Arity,
        "PUBSUB" => return Route::Everywhere(Every::Pubsub),
        _ => {}
    }
    let Some(spec) = spec_named(name, args) else {
        return Route::Refused("chash-proxy does not know how to route it".into());
    };
    if !spec.fits(args.len()) {
        return Route::Arity;
    }
    let blocking = if name == "XREAD" || name == "XREADGROUP" { has("BLOCK") } else { spec.blocking };
    if blocking {
        return match spec.key_positions(args) {
            None => Route::Arity,
            Some(keys) if keys.is_empty() => Route::Arity,
            Some(keys) => Route::Blocking(keys),
        };
    }
    // SORT's patterns: keys its specs cannot locate.
    if spec.has_unknown_keys() && (has("BY") || has("GET")) {
        return Route::Refused("with BY or GET it reads keys named by patterns, which may be on any server".into());
    }
    if spec.keys.is_empty() {
        return Route::Refused(NO_KEY.into());
    }
    if let Some(key) = spec.single_key(args.len()) {
        return Route::Key(key);
    }
    match spec.key_positions(args) {
        None => Route::Arity,
        Some(keys) if keys.is_empty() => Route::Refused("without keys it cannot be routed by key".into()),
        Some(keys) => Route::Keys(keys),
    }
}

/// The positions of the keys of a routed command (for transactions).
pub(crate) fn keys_of(route: &Route, argc: usize) -> Option<Vec<usize>> {
    match route {
        Route::Key(k) => Some(vec![*k]),
        Route::Keys(k) => Some(k.clone()),
        Route::Split { step, .. } => Some((1..argc).step_by(*step).collect()),
        // In a transaction a blocking command does not block (as in Redis).
        Route::Blocking(k) => Some(k.clone()),
        _ => None,
    }
}

/// The spec of the command `args` names: a container's subcommand
/// (`OBJECT ENCODING`) by both words.
pub(crate) fn spec_of(args: &Args) -> Option<&'static Spec> {
    // Long enough for every name in the table; longer ones are not there.
    let mut buf = [0u8; 48];
    let n = upper_into(&mut buf, args.first()?)?;
    let index = index();
    let &(spec, containing) = index.get(&buf[..n])?;
    if containing && args.len() > 1 {
        buf[n] = b'|';
        if let Some(m) = upper_into(&mut buf[n + 1..], &args[1]) {
            if let Some(&(sub, _)) = index.get(&buf[..n + 1 + m]) {
                return Some(sub);
            }
        }
    }
    Some(spec)
}

/// [`spec_of`] for a command whose name is known in capitals (`name`,
/// from `Command::name_in`; empty when it could not be): no second
/// upper-casing of the name on the request path.
fn spec_named(name: &str, args: &Args) -> Option<&'static Spec> {
    if name.is_empty() {
        return spec_of(args);
    }
    match index().get(name.as_bytes())? {
        &(spec, false) => Some(spec),
        _ => spec_of(args),
    }
}

/// The table by upper-case name, each with whether it has subcommands.
type Index = HashMap<Box<[u8]>, (&'static Spec, bool), BuildHasherDefault<Fnv>>;

/// The command table indexed once: a lookup per request costs a hash of
/// the name, not a binary search of string comparisons.
fn index() -> &'static Index {
    static INDEX: OnceLock<Index> = OnceLock::new();
    INDEX.get_or_init(|| {
        COMMANDS
            .iter()
            .map(|spec| {
                let prefix = format!("{}|", spec.name);
                let containing = COMMANDS.iter().any(|s| s.name.starts_with(&prefix));
                (spec.name.to_ascii_uppercase().into_bytes().into_boxed_slice(), (spec, containing))
            })
            .collect()
    })
}

/// FNV-1a: command names are short and not chosen to collide (a client
/// that sends odd names only costs itself a longer probe).
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 { 0xcbf2_9ce4_8422_2325 } else { self.0 };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// Writes `word` in upper case at the start of `buf`: its length, or `None`
/// when it does not fit.
fn upper_into(buf: &mut [u8], word: &[u8]) -> Option<usize> {
    let dest = buf.get_mut(..word.len())?;
    for (d, s) in dest.iter_mut().zip(word) {
        *d = s.to_ascii_uppercase();
    }
    Some(word.len())
}

/// How long a blocking command may block, as it says; `None`: for ever
/// (a timeout of 0), or a timeout that does not parse or is negative (the
/// server answers that with its error at once).
pub(crate) fn blocking_wait(name: &str, args: &Args) -> Option<std::time::Duration> {
    let text = |b: &[u8]| std::str::from_utf8(b).ok().map(str::to_owned);
    let (value, millis) = match name {
        "XREAD" | "XREADGROUP" => {
            let at = args.iter().position(|a| a.eq_ignore_ascii_case(b"BLOCK"))?;
            (text(args.get(at + 1)?)?, true)
        }
        "BLMPOP" | "BZMPOP" => (text(args.get(1)?)?, false),
        _ => (text(args.last()?)?, false),
    };
    let n: f64 = value.parse().ok()?;
    if !n.is_finite() || n <= 0.0 {
        return None;
    }
    Some(
        std::time::Duration::from_secs_f64(if millis { n / 1000.0 } else { n })
            .min(std::time::Duration::from_secs(1 << 40)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> Route {
        route(&s.split(' ').next().unwrap().to_ascii_uppercase(), &args(s))
    }

    #[test]
    fn the_fast_path_routes_as_the_table_does() {
        for s in [
            "GET k",
            "GET",
            "GET a b",
            "SET k v",
            "SET k",
            "SET k v EX 10 GET",
            "SET k v NX",
            "set k v",
            "gEt k",
            "GETSET k v",
            "GETEX k",
        ] {
            let args = args(s);
            let name = s.split(' ').next().unwrap().to_ascii_uppercase();
            assert_eq!(route(&name, &args), route_by_table(&name, &args), "{s}");
            if let Some(key) = common_key(&args) {
                assert_eq!(Route::Key(key), route_by_table(&name, &args), "{s}");
            }
        }
        // Every byte in each place of the name: only the letter itself,
        // in either case, makes GET or SET.
        for word in [*b"GET", *b"SET"] {
            for at in 0..3 {
                for byte in 0..=255u8 {
                    let mut name = word;
                    name[at] = byte;
                    let args = Args::from(&[&name[..], b"k", b"v"][..2 + usize::from(word == *b"SET")]);
                    let same = byte.eq_ignore_ascii_case(&word[at]);
                    assert_eq!(common_key(&args).is_some(), same, "{name:?}");
                }
            }
        }
    }

    #[test]
    fn routes() {
        assert_eq!(r("GET k"), Route::Key(1));
        assert_eq!(r("GET"), Route::Arity);
        assert_eq!(r("SMOVE {g}:a {g}:b alice"), Route::Keys(vec![1, 2]));
        assert_eq!(r("MGET a b"), Route::Split { step: 1, gather: Gather::InOrder });
        assert_eq!(r("MSET a 1 b"), Route::Arity);
        assert_eq!(r("MULTI"), Route::Transaction);
        assert_eq!(r("SCRIPT LOAD x"), Route::Script);
        assert_eq!(r("FUNCTION FLUSH"), Route::Script);
        assert_eq!(r("SCRIPT"), Route::Arity);
        assert!(matches!(r("FUNCTION DUMP"), Route::Refused(_)));
        assert_eq!(r("SORT k LIMIT 0 1"), Route::Keys(vec![1]));
        assert!(matches!(r("SORT k BY w_*"), Route::Refused(_)));
        assert_eq!(r("BLPOP l 0"), Route::Blocking(vec![1]));
        assert_eq!(r("BLPOP a b 0"), Route::Blocking(vec![1, 2]));
        assert_eq!(r("BLMOVE a b LEFT RIGHT 0"), Route::Blocking(vec![1, 2]));
        assert_eq!(r("BLMPOP 0 2 a b LEFT"), Route::Blocking(vec![3, 4]));
        assert_eq!(r("BZPOPMIN z 1.5"), Route::Blocking(vec![1]));
        assert_eq!(r("XREAD BLOCK 0 STREAMS s t 0 0"), Route::Blocking(vec![4, 5]));
        assert_eq!(r("BLPOP l"), Route::Arity);
        let wait = |c: &str| blocking_wait(c.split(' ').next().unwrap(), &args(c));
        assert_eq!(wait("BLPOP l 0"), None, "0: for ever");
        assert_eq!(wait("BLPOP l 1.5"), Some(std::time::Duration::from_millis(1500)));
        assert_eq!(wait("BLMPOP 2 1 l LEFT"), Some(std::time::Duration::from_secs(2)));
        assert_eq!(wait("XREAD BLOCK 250 STREAMS s $"), Some(std::time::Duration::from_millis(250)));
        assert_eq!(wait("BLPOP l x"), None, "not a number: the server says so at once");
        assert_eq!(r("XREAD COUNT 1 STREAMS s 0"), Route::Keys(vec![4]));
        assert_eq!(r("XGROUP CREATE s g $"), Route::Key(2));
        assert_eq!(r("OBJECT ENCODING k"), Route::Key(2));
        assert_eq!(r("MEMORY USAGE k"), Route::Key(2));
        assert!(matches!(r("EVAL s 0"), Route::Refused(_)));
        assert_eq!(r("KEYS *"), Route::Everywhere(Every::Keys));
        assert_eq!(r("SCAN 0 MATCH a*"), Route::Everywhere(Every::Scan));
        assert!(matches!(r("MEMORY STATS"), Route::Refused(_)));
        assert!(matches!(r("NOSUCH"), Route::Refused(_)));
        assert_eq!(r("WATCH k"), Route::Transaction);
        assert_eq!(r("WATCH"), Route::Arity);
        assert_eq!(r("PUBLISH ch m"), Route::Key(1));
        assert_eq!(r("SPUBLISH ch m"), Route::Key(1));
    }

    fn args(s: &str) -> Args {
        Args::from(s.split(' ').collect::<Vec<_>>())
    }

    fn keys(s: &str) -> Option<Vec<usize>> {
        let a = args(s);
        spec_of(&a).unwrap().key_positions(&a)
    }

    #[test]
    fn keys_where_redis_says() {
        // Members, options and counts are not keys.
        assert_eq!(keys("SMOVE {g}:a {g}:b alice"), Some(vec![1, 2]));
        assert_eq!(keys("LMOVE a b LEFT RIGHT"), Some(vec![1, 2]));
        assert_eq!(keys("COPY a b REPLACE"), Some(vec![1, 2]));
        assert_eq!(keys("ZRANGESTORE d s 0 -1"), Some(vec![1, 2]));
        assert_eq!(keys("LCS a b IDX"), Some(vec![1, 2]));
        assert_eq!(keys("MSET a 1 b 2"), Some(vec![1, 3]));
        assert_eq!(keys("EVAL s 2 a b x"), Some(vec![3, 4]));
        assert_eq!(keys("EVAL s 0"), Some(vec![]));
        assert_eq!(keys("EVAL s x a"), None);
        assert_eq!(keys("XREAD COUNT 2 STREAMS a b 0 0"), Some(vec![4, 5]));
        assert_eq!(keys("OBJECT ENCODING k"), Some(vec![2]));
        assert_eq!(keys("GEORADIUS k 0 0 1 km STORE d"), Some(vec![1, 7]));
        assert_eq!(keys("ZUNIONSTORE d 2 a b WEIGHTS 1 2"), Some(vec![1, 3, 4]));
        assert!(spec_of(&args("SORT k BY x")).unwrap().has_unknown_keys());
        assert!(spec_of(&args("BLPOP a 0")).unwrap().blocking);
        assert!(spec_of(&args("NOSUCH")).is_none());
        assert!(spec_of(&args("GET")).unwrap().fits(2) && !spec_of(&args("GET")).unwrap().fits(3));
    }

    #[test]
    fn the_table_is_sorted() {
        let table = COMMANDS;
        assert!(table.windows(2).all(|w| w[0].name < w[1].name));
        assert!(table.len() > 200);
    }
}
