"""The same workload through the proxy and straight to one redis-server,
with redis-py's defaults (RESP3) and in its RESP2 mode: equal results.
Usage: redis_resp3.py PROXY_HOST:PORT DIRECT_HOST:PORT"""

import sys

import redis


def connect(addr, **kw):
    host, port = addr.rsplit(":", 1)
    return redis.Redis(host=host, port=int(port), socket_timeout=5, **kw)


def workload(r, p):
    """Results of a workload under key prefix p (keys on several servers)."""
    out = []
    out.append(r.set(p + "s", "v"))
    out.append(r.get(p + "s"))
    out.append(r.get(p + "missing"))
    out.append(r.incr(p + "n"))
    out.append(r.incrbyfloat(p + "f", 1.5))
    out.append(r.hset(p + "h", mapping={"a": "1", "b": "2"}))
    out.append(sorted(r.hgetall(p + "h").items()))
    out.append(r.sadd(p + "set", "x", "y"))
    out.append(sorted(r.smembers(p + "set")))
    out.append(r.zadd(p + "z", {"a": 1.5, "b": 2}))
    out.append(r.zscore(p + "z", "a"))
    out.append(r.zrange(p + "z", 0, -1, withscores=True))
    out.append(r.rpush(p + "l", 1, 2, 3))
    out.append(r.lrange(p + "l", 0, -1))
    out.append(r.mset({p + "m1": "1", p + "m2": "2", p + "m3": "3"}))
    out.append(r.mget([p + "m1", p + "nope", p + "m2", p + "m3"]))
    out.append(r.exists(p + "m1", p + "m2", p + "nope"))
    out.append(r.expire(p + "s", 100))
    out.append(r.ttl(p + "s"))
    out.append(r.type(p + "h"))
    out.append(r.getdel(p + "m3"))
    out.append(r.delete(p + "m1", p + "m2", p + "nope"))
    pipe = r.pipeline()
    pipe.incr("{" + p + "t}:a")
    pipe.hset("{" + p + "t}:h", "k", "v")
    pipe.hgetall("{" + p + "t}:h")
    out.append(pipe.execute())
    return out


failures = []
for protocol in (3, 2):
    proxy = connect(sys.argv[1], protocol=protocol, client_name="app")
    direct = connect(sys.argv[2], protocol=protocol)
    p = "p%d:" % protocol
    got, want = workload(proxy, p), workload(direct, p)
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            failures.append("RESP%d step %d: proxy %r, redis %r" % (protocol, i, g, w))
    print("RESP%d: %d results compared" % (protocol, len(want)))
# redis-py's defaults: RESP3.
assert connect(sys.argv[1]).connection_pool.make_connection().protocol in (3, "3")
if failures:
    print("\n".join(failures))
    sys.exit(1)
