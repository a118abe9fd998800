"""redis-py with a client name, and its default pipeline (a MULTI/EXEC transaction) through the
proxy: tagged keys run as one transaction; keys on two servers are
refused and nothing of the transaction runs (before, the refused MULTI
left the queued commands to run one by one, so a retry applied them twice);
optimistic locking with WATCH (`Redis.transaction`), in RESP2 and RESP3.
Usage: redis_transactions.py HOST:PORT KEY_ON_ONE_SERVER KEY_ON_ANOTHER"""

import sys

import redis

host, port = sys.argv[1].rsplit(":", 1)
one, other = sys.argv[2], sys.argv[3]
r = redis.Redis(host=host, port=int(port), protocol=2, socket_timeout=5)

# A client name set on connect (CLIENT SETNAME), answered for this connection.
named = redis.Redis(host=host, port=int(port), protocol=2, client_name="web-1")
assert named.client_getname() == "web-1"
assert isinstance(named.client_id(), int)
assert named.ping()

p = r.pipeline()  # transaction=True is redis-py's default
p.incr("{n}:count")
p.incr("{n}:count")
p.set("{n}:name", "x")
p.get("{n}:name")
assert p.execute() == [1, 2, True, b"x"], "one transaction on one server"
assert r.get("{n}:count") == b"2"

p = r.pipeline()
p.incr(one)
p.incr(other)
try:
    p.execute()
except redis.exceptions.ResponseError as e:
    assert "hash tag" in str(e) or "EXECABORT" in str(e), str(e)
    print("refused:", e)
else:
    sys.exit("a transaction over two servers ran")
assert r.get(one) is None and r.get(other) is None, "nothing of a refused transaction runs"

with r.pipeline() as p:
    p.multi()
    p.set("{n}:gone", "1")
    p.reset()  # DISCARD
assert r.get("{n}:gone") is None

# WATCH: redis-py's optimistic-locking helper, its default protocol (RESP3)
# and RESP2; a write by another client between WATCH and EXEC makes it
# retry, so no increment is lost.
for protocol in (3, 2):
    c = redis.Redis(host=host, port=int(port), protocol=protocol, socket_timeout=5)
    key = "{w%d}:n" % protocol
    c.set(key, 0)
    interfered = []

    def bump(pipe):
        value = int(pipe.get(key))
        if not interfered:
            interfered.append(1)
            r.incr(key)  # another client writes the watched key
        pipe.multi()
        pipe.set(key, value + 1)

    c.transaction(bump, key)
    assert c.get(key) == b"2", (protocol, c.get(key))
    assert len(interfered) == 1
print("ok")
