"""redis-py (RESP2) through a proxy started with --max-value-size 1048576:
a value over the limit gets an error that names the limit and the flag, and
the connection goes on. Usage: redis_too_large.py HOST:PORT"""

import sys

import redis

host, port = sys.argv[1].rsplit(":", 1)
r = redis.Redis(host=host, port=int(port), protocol=2, socket_timeout=5)
assert r.set("small", "v")
try:
    r.set("big", b"x" * (2 << 20))
except redis.exceptions.ResponseError as e:
    text = str(e)
    assert "2097152" in text and "1048576" in text and "--max-value-size" in text, text
    print("refused:", text)
else:
    sys.exit("a value over the limit was accepted")
assert r.get("small") == b"v", "the connection goes on"
assert r.set("fits", b"y" * (1 << 20))
assert len(r.get("fits")) == 1 << 20
print("ok")
