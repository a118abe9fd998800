//! How each Redis command is routed.

/// What the proxy does with a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// One key, at argument 1.
    Single,
    /// Keys from argument `first`, every `step`-th, up to the end (or
    /// `count` keys when the count is at argument `count_at`); all must be
    /// on one server.
    Together {
        /// First key's argument index.
        first: usize,
        /// Distance between keys.
        step: usize,
        /// Index of an argument holding the number of keys (which then
        /// follow it), instead of "to the end".
        count_at: Option<usize>,
        /// Also a destination key at argument 1 (the *STORE commands).
        dest: bool,
    },
    /// `MGET k...`: split by server, replies reassembled in order.
    Mget,
    /// `MSET k v ...`: split by server, `+OK` when all are.
    Mset,
    /// `DEL`/`UNLINK`/`EXISTS`/`TOUCH k...`: split by server, counts summed.
    Sum,
    /// `EVAL script numkeys key... arg...`: by its keys (at least one, all on one server).
    Eval,
    /// Answered by the proxy itself.
    Proxy,
    /// `MULTI`, `EXEC`, `DISCARD`: the session queues the transaction and
    /// sends it whole to the one server its keys are on.
    Transaction,
    /// Refused, with the reason.
    Refused(&'static str),
}

const SINGLE: &[&str] = &[
    // strings
    "GET",
    "SET",
    "SETNX",
    "SETEX",
    "PSETEX",
    "APPEND",
    "STRLEN",
    "GETSET",
    "GETDEL",
    "GETEX",
    "GETRANGE",
    "SUBSTR",
    "SETRANGE",
    "INCR",
    "INCRBY",
    "INCRBYFLOAT",
    "DECR",
    "DECRBY",
    // bitmaps
    "GETBIT",
    "SETBIT",
    "BITCOUNT",
    "BITPOS",
    "BITFIELD",
    "BITFIELD_RO",
    // keys and expiry
    "EXPIRE",
    "EXPIREAT",
    "PEXPIRE",
    "PEXPIREAT",
    "PERSIST",
    "TTL",
    "PTTL",
    "EXPIRETIME",
    "PEXPIRETIME",
    "TYPE",
    "DUMP",
    "RESTORE",
    // hashes
    "HSET",
    "HSETNX",
    "HGET",
    "HMSET",
    "HMGET",
    "HDEL",
    "HLEN",
    "HSTRLEN",
    "HEXISTS",
    "HKEYS",
    "HVALS",
    "HGETALL",
    "HINCRBY",
    "HINCRBYFLOAT",
    "HRANDFIELD",
    "HSCAN",
    // lists
    "LPUSH",
    "LPUSHX",
    "RPUSH",
    "RPUSHX",
    "LPOP",
    "RPOP",
    "LLEN",
    "LINDEX",
    "LINSERT",
    "LRANGE",
    "LREM",
    "LSET",
    "LTRIM",
    "LPOS",
    // sets
    "SADD",
    "SREM",
    "SCARD",
    "SISMEMBER",
    "SMISMEMBER",
    "SMEMBERS",
    "SPOP",
    "SRANDMEMBER",
    "SSCAN",
    // sorted sets
    "ZADD",
    "ZCARD",
    "ZCOUNT",
    "ZINCRBY",
    "ZLEXCOUNT",
    "ZRANGE",
    "ZRANGEBYLEX",
    "ZRANGEBYSCORE",
    "ZRANK",
    "ZREM",
    "ZREMRANGEBYLEX",
    "ZREMRANGEBYRANK",
    "ZREMRANGEBYSCORE",
    "ZREVRANGE",
    "ZREVRANGEBYLEX",
    "ZREVRANGEBYSCORE",
    "ZREVRANK",
    "ZSCORE",
    "ZMSCORE",
    "ZPOPMIN",
    "ZPOPMAX",
    "ZRANDMEMBER",
    "ZSCAN",
    // HyperLogLog (one key)
    "PFADD",
    // geo
    "GEOADD",
    "GEODIST",
    "GEOHASH",
    "GEOPOS",
    "GEOSEARCH",
    "GEORADIUS_RO",
    "GEORADIUSBYMEMBER_RO",
    // streams
    "XADD",
    "XLEN",
    "XRANGE",
    "XREVRANGE",
    "XDEL",
    "XTRIM",
];

/// The route of a command (by its upper-case name), from a table built once.
pub fn route(name: &str) -> Route {
    static TABLE: std::sync::OnceLock<std::collections::HashMap<&'static str, Route>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t: std::collections::HashMap<&'static str, Route> =
            SINGLE.iter().map(|&n| (n, Route::Single)).collect();
        for &n in NAMED {
            t.insert(n, route_of(n));
        }
        t
    });
    table.get(name).copied().unwrap_or(Route::Refused("chash-proxy does not know how to route it"))
}

/// Every command name with a route other than `Single`.
const NAMED: &[&str] = &[
    "MGET",
    "MSET",
    "DEL",
    "UNLINK",
    "EXISTS",
    "TOUCH",
    "MSETNX",
    "RENAME",
    "RENAMENX",
    "RPOPLPUSH",
    "LMOVE",
    "SMOVE",
    "COPY",
    "LCS",
    "PFMERGE",
    "PFCOUNT",
    "SDIFF",
    "SINTER",
    "SUNION",
    "SDIFFSTORE",
    "SINTERSTORE",
    "SUNIONSTORE",
    "ZRANGESTORE",
    "ZUNIONSTORE",
    "ZINTERSTORE",
    "ZDIFFSTORE",
    "ZUNION",
    "ZINTER",
    "ZDIFF",
    "SINTERCARD",
    "ZINTERCARD",
    "LMPOP",
    "ZMPOP",
    "EVAL",
    "EVALSHA",
    "EVAL_RO",
    "EVALSHA_RO",
    "PING",
    "ECHO",
    "QUIT",
    "COMMAND",
    "INFO",
    "SELECT",
    "HELLO",
    "AUTH",
    "MULTI",
    "EXEC",
    "DISCARD",
    "WATCH",
    "UNWATCH",
    "SUBSCRIBE",
    "PSUBSCRIBE",
    "UNSUBSCRIBE",
    "PUNSUBSCRIBE",
    "SSUBSCRIBE",
    "SUNSUBSCRIBE",
    "PUBLISH",
    "SPUBLISH",
    "PUBSUB",
    "KEYS",
    "SCAN",
    "RANDOMKEY",
    "DBSIZE",
    "FLUSHALL",
    "FLUSHDB",
    "BLPOP",
    "BRPOP",
    "BRPOPLPUSH",
    "BLMOVE",
    "BZPOPMIN",
    "BZPOPMAX",
    "BLMPOP",
    "BZMPOP",
    "XREAD",
    "XREADGROUP",
    "WAIT",
    "CLUSTER",
    "READONLY",
    "READWRITE",
    "ASKING",
    "SCRIPT",
    "FUNCTION",
    "FCALL",
    "FCALL_RO",
    "MOVE",
    "SWAPDB",
    "MIGRATE",
    "CONFIG",
    "DEBUG",
    "SHUTDOWN",
    "SAVE",
    "BGSAVE",
    "BGREWRITEAOF",
    "LASTSAVE",
    "REPLICAOF",
    "SLAVEOF",
    "MONITOR",
    "CLIENT",
    "SLOWLOG",
    "LATENCY",
    "MEMORY",
    "OBJECT",
    "ACL",
    "ROLE",
    "TIME",
    "SYNC",
    "PSYNC",
    "FAILOVER",
    "RESET",
    "LOLWUT",
];

/// The route of a named (non-`Single`) command.
fn route_of(name: &str) -> Route {
    let together = |first, step| Route::Together { first, step, count_at: None, dest: false };
    match name {
        "MGET" => Route::Mget,
        "MSET" => Route::Mset,
        "DEL" | "UNLINK" | "EXISTS" | "TOUCH" => Route::Sum,
        "MSETNX" => together(1, 2),
        "RENAME" | "RENAMENX" | "RPOPLPUSH" | "LMOVE" | "SMOVE" | "COPY" | "LCS" | "PFMERGE" | "PFCOUNT" | "SDIFF"
        | "SINTER" | "SUNION" | "SDIFFSTORE" | "SINTERSTORE" | "SUNIONSTORE" | "ZRANGESTORE" => together(1, 1),
        "ZUNIONSTORE" | "ZINTERSTORE" | "ZDIFFSTORE" => {
            Route::Together { first: 3, step: 1, count_at: Some(2), dest: true }
        }
        "ZUNION" | "ZINTER" | "ZDIFF" | "SINTERCARD" | "ZINTERCARD" | "LMPOP" | "ZMPOP" => {
            Route::Together { first: 2, step: 1, count_at: Some(1), dest: false }
        }
        "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO" => Route::Eval,
        "PING" | "ECHO" | "QUIT" | "COMMAND" | "INFO" | "SELECT" | "HELLO" | "AUTH" | "CLIENT" => Route::Proxy,
        "MULTI" | "EXEC" | "DISCARD" => Route::Transaction,
        "WATCH" | "UNWATCH" => Route::Refused(
            "WATCH needs a connection of its own to the key's server, which chash-proxy does not give yet; \
             MULTI/EXEC on keys of one server works",
        ),
        "SUBSCRIBE" | "PSUBSCRIBE" | "UNSUBSCRIBE" | "PUNSUBSCRIBE" | "SSUBSCRIBE" | "SUNSUBSCRIBE" | "PUBLISH"
        | "SPUBLISH" | "PUBSUB" => Route::Refused("pub/sub is not routed by key"),
        "KEYS" | "SCAN" | "RANDOMKEY" | "DBSIZE" => Route::Refused("it spans the whole key space of every server"),
        "FLUSHALL" | "FLUSHDB" => Route::Refused("it would empty every server; it is disabled in this proxy"),
        "BLPOP" | "BRPOP" | "BRPOPLPUSH" | "BLMOVE" | "BZPOPMIN" | "BZPOPMAX" | "BLMPOP" | "BZMPOP" | "XREAD"
        | "XREADGROUP" | "WAIT" => Route::Refused("blocking commands would hold a shared backend connection"),
        "CLUSTER" | "READONLY" | "READWRITE" | "ASKING" => Route::Refused("this is a proxy, not a Redis Cluster"),
        "SCRIPT" | "FUNCTION" | "FCALL" | "FCALL_RO" => Route::Refused("scripts without keys cannot be routed"),
        "MOVE" | "SWAPDB" | "MIGRATE" => Route::Refused("it changes databases or servers behind the proxy"),
        "CONFIG" | "DEBUG" | "SHUTDOWN" | "SAVE" | "BGSAVE" | "BGREWRITEAOF" | "LASTSAVE" | "REPLICAOF" | "SLAVEOF"
        | "MONITOR" | "SLOWLOG" | "LATENCY" | "MEMORY" | "OBJECT" | "ACL" | "ROLE" | "TIME" | "SYNC" | "PSYNC"
        | "FAILOVER" | "RESET" | "LOLWUT" => Route::Refused("it addresses one server, not a key"),
        _ => Route::Refused("chash-proxy does not know how to route it"),
    }
}

/// The key positions of a `Together` or `Eval` command with `n` arguments,
/// or `None` when the arguments do not match the command's shape.
pub fn key_positions(r: Route, args: &[bytes::Bytes]) -> Option<Vec<usize>> {
    let n = args.len();
    let count = |at: usize| -> Option<usize> { std::str::from_utf8(args.get(at)?).ok()?.parse().ok() };
    match r {
        Route::Together { first, step, count_at: None, dest } => {
            let mut v: Vec<usize> = (first..n).step_by(step).collect();
            if dest {
                v.insert(0, 1);
            }
            (!v.is_empty()).then_some(v)
        }
        Route::Together { first, count_at: Some(at), dest, .. } => {
            let k = count(at)?;
            if k == 0 || first + k > n {
                return None;
            }
            let mut v: Vec<usize> = (first..first + k).collect();
            if dest {
                v.insert(0, 1);
            }
            Some(v)
        }
        Route::Eval => {
            let k = count(2)?;
            if k == 0 || 3 + k > n {
                return None;
            }
            Some((3..3 + k).collect())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn args(s: &str) -> Vec<Bytes> {
        s.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    #[test]
    fn routes_and_keys() {
        assert_eq!(route("GET"), Route::Single);
        assert_eq!(route("MGET"), Route::Mget);
        assert_eq!(route("MULTI"), Route::Transaction);
        assert!(matches!(route("WATCH"), Route::Refused(_)));
        assert!(matches!(route("NOPE"), Route::Refused(_)));
        assert_eq!(key_positions(route("MSETNX"), &args("MSETNX a 1 b 2")), Some(vec![1, 3]));
        assert_eq!(key_positions(route("ZUNIONSTORE"), &args("ZUNIONSTORE d 2 a b WEIGHTS 1 2")), Some(vec![1, 3, 4]));
        assert_eq!(key_positions(route("EVAL"), &args("EVAL s 2 a b x")), Some(vec![3, 4]));
        assert_eq!(key_positions(route("EVAL"), &args("EVAL s 0")), None);
        assert_eq!(key_positions(route("SINTERCARD"), &args("SINTERCARD 2 a b LIMIT 1")), Some(vec![2, 3]));
    }
}
