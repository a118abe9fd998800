"""redis-py logging in to the proxy as the pool's users (RESP2 and RESP3):
the read-write user writes, the read-only one reads and is refused writes
with NOPERM, a wrong password is WRONGPASS, no login is NOAUTH.

Usage: redis_acl.py HOST:PORT
"""
import sys

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

# redis-py retries an AuthenticationError (a ConnectionError) with back-off;
# once is enough here.
ONCE = Retry(NoBackoff(), 0)


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    port = int(port)
    for protocol in (2, 3):
        rw = redis.Redis(host=host, port=port, username="app", password="app-pw", protocol=protocol,
                         socket_timeout=5)
        assert rw.set(f"acl:{protocol}", "v"), "the read-write user writes"
        assert rw.get(f"acl:{protocol}") == b"v"
        ro = redis.Redis(host=host, port=port, username="reader", password="reader-pw", protocol=protocol,
                         socket_timeout=5)
        assert ro.get(f"acl:{protocol}") == b"v", "the read-only user reads"
        assert ro.mget([f"acl:{protocol}", "nope"]) == [b"v", None]
        for write in (lambda: ro.set("acl:x", "1"), lambda: ro.incr("acl:n"), lambda: ro.delete("acl:2"),
                      lambda: ro.eval("return 1", 0)):
            try:
                write()
                raise AssertionError("a write by the read-only user went through")
            except redis.exceptions.NoPermissionError as e:
                assert "no permissions" in str(e), e
        with ro.pipeline(transaction=True) as p:
            p.get("acl:2")
            p.set("acl:y", "1")
            try:
                p.execute()
                raise AssertionError("a transaction with a write by the read-only user ran")
            except (redis.exceptions.NoPermissionError, redis.exceptions.ExecAbortError):
                pass
        assert rw.get("acl:y") is None and rw.get("acl:x") is None, "nothing was written"
        try:
            redis.Redis(host=host, port=port, username="app", password="wrong", protocol=protocol, retry=ONCE).ping()
            raise AssertionError("a wrong password was taken")
        except redis.exceptions.AuthenticationError as e:
            assert "WRONGPASS" in str(e) or "invalid username-password" in str(e), e
        try:
            redis.Redis(host=host, port=port, protocol=2, retry=ONCE).get("acl:2")
            raise AssertionError("a client that did not log in was served")
        except redis.exceptions.AuthenticationError as e:
            assert "Authentication required" in str(e), e
    print("ok")


if __name__ == "__main__":
    main()
