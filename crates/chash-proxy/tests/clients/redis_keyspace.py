"""Commands over the whole keyspace through the proxy, with redis-py:
FLUSHALL, DBSIZE, SCAN (scan_iter, MATCH, COUNT, TYPE), KEYS, RANDOMKEY,
INFO, TIME, LASTSAVE over 100,000 keys on 3 servers; then a server added
mid-scan (through the admin endpoint) gives the restart error, and a scan
after it lists exactly the keys a GET finds.

Usage: redis_keyspace.py PROXY_HOST:PORT ADMIN_HOST:PORT NEW_SERVER_LINE
"""
import http.client
import sys

import redis

N = 100_000


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    admin_host, admin_port = sys.argv[2].rsplit(":", 1)
    new_line = sys.argv[3]
    r = redis.Redis(host=host, port=int(port), socket_timeout=20)
    assert r.flushall() is True
    assert r.dbsize() == 0
    keys = [f"k:{i}" for i in range(N)]
    p = r.pipeline(transaction=False)
    for i in range(0, N, 1000):
        p.mset({k: "v" for k in keys[i:i + 1000]})
    p.execute()
    r.rpush("a-list", "x")
    assert r.dbsize() == N + 1, r.dbsize()

    seen = list(r.scan_iter(count=1000))
    assert len(seen) == N + 1, len(seen)
    assert set(seen) == {k.encode() for k in keys} | {b"a-list"}, "every key once"
    matched = sorted(r.scan_iter(match="k:123*", count=500))
    expected = sorted(k.encode() for k in keys if k.startswith("k:123"))
    assert matched == expected, (len(matched), len(expected))
    assert list(r.scan_iter(_type="list", count=5000)) == [b"a-list"]
    assert sorted(r.keys("k:9999*")) == sorted(k.encode() for k in keys if k.startswith("k:9999"))
    for _ in range(5):
        assert r.randomkey().decode() in set(keys) | {"a-list"}
    info = r.info()
    assert info["redis_version"], info
    assert info["db0"]["keys"] == N + 1, info["db0"]
    assert "membership_version" in info, "the proxy's own section"
    assert "proxy" in r.info("proxy") and "redis_version" not in r.info("proxy")
    assert r.info("keyspace")["db0"]["keys"] == N + 1
    secs, micros = r.time()
    assert secs > 1_700_000_000 and 0 <= micros < 1_000_000
    assert r.lastsave().year >= 2024

    # A membership change in the middle of a scan: the next step refuses.
    cursor, _ = r.scan(0, count=100)
    assert cursor != 0
    c = http.client.HTTPConnection(admin_host, int(admin_port), timeout=10)
    c.request("POST", "/pools/alpha/servers", body=new_line)
    reply = c.getresponse()
    assert reply.status == 200, reply.read()
    try:
        r.scan(cursor, count=100)
        raise AssertionError("a scan across a membership change went on")
    except redis.exceptions.ResponseError as e:
        assert "start it again from cursor 0" in str(e), e
    # Started again: exactly the keys a GET finds (keys that moved to the
    # new server stay on their old one as copies nobody reads: not listed).
    listed = set(r.scan_iter(count=1000))
    p = r.pipeline(transaction=False)
    for k in keys:
        p.exists(k)
    found = {k.encode() for k, e in zip(keys, p.execute()) if e}
    assert listed - {b"a-list"} == found, (len(listed), len(found))
    assert 0 < len(found) < N, "some keys moved to the new server"
    assert r.flushdb(asynchronous=True) is True
    assert r.dbsize() == 0, "flushed everywhere, the new server and the old copies"
    print("ok")


if __name__ == "__main__":
    main()
