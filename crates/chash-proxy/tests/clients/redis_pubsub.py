"""redis-py pub/sub through two proxies of the same servers: subscribers on
one, the publisher on the other (RESP2 and RESP3). 10,000 messages over 50
channels and 2 patterns: every message delivered exactly once, in order
per channel. Then the same while a server is added (to the subscribers'
proxy first, then the publisher's, through their admin endpoints): none
lost.

Usage: redis_pubsub.py SUB_PROXY PUB_PROXY SUB_ADMIN PUB_ADMIN NEW_SERVER_LINE NEW_SERVER_PORT
"""
import http.client
import sys
import threading
import time

import redis

CHANNELS = [f"ch:{i}" for i in range(50)]
PATTERNS = ["ch:1*", "ch:2?"]


def addr(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


def expected_patterns(channel):
    import fnmatch
    return [p for p in PATTERNS if fnmatch.fnmatchcase(channel, p)]


def run(sub_at, pub_at, protocol, count, during=None):
    """Publishes `count` messages round-robin over the channels; returns
    what the subscriber got: {(kind, channel): [payloads]}."""
    host, port = addr(sub_at)
    sub = redis.Redis(host=host, port=port, protocol=protocol, socket_timeout=30)
    ps = sub.pubsub()
    ps.subscribe(*CHANNELS)
    ps.psubscribe(*PATTERNS)
    confirmed = 0
    deadline = time.time() + 10
    while confirmed < len(CHANNELS) + len(PATTERNS) and time.time() < deadline:
        m = ps.get_message(timeout=1)
        if m and m["type"] in ("subscribe", "psubscribe"):
            confirmed += 1
    assert confirmed == len(CHANNELS) + len(PATTERNS), confirmed
    phost, pport = addr(pub_at)
    pub = redis.Redis(host=phost, port=pport, protocol=protocol, socket_timeout=30)
    got = {}

    def publish():
        for i in range(count):
            ch = CHANNELS[i % len(CHANNELS)]
            pub.publish(ch, f"{i}")
            if during and i == count // 3:
                during()
    t = threading.Thread(target=publish)
    t.start()
    want = sum(1 + len(expected_patterns(CHANNELS[i % len(CHANNELS)])) for i in range(count))
    n = 0
    deadline = time.time() + 120
    while n < want and time.time() < deadline:
        m = ps.get_message(timeout=1)
        if not m or m["type"] not in ("message", "pmessage"):
            continue
        key = (m["type"], m["pattern"].decode() if m["pattern"] else None, m["channel"].decode())
        got.setdefault(key, []).append(int(m["data"]))
        n += 1
    t.join()
    # Nothing more comes (no duplicates).
    extra = ps.get_message(timeout=0.5)
    while extra and extra["type"] not in ("message", "pmessage"):
        extra = ps.get_message(timeout=0.5)
    assert extra is None, f"a message more than published: {extra}"
    assert n == want, f"got {n} of {want} messages"
    for i, ch in enumerate(CHANNELS):
        sent = [j for j in range(count) if j % len(CHANNELS) == i]
        assert got.get(("message", None, ch)) == sent, f"{ch}: once each, in order"
        for p in expected_patterns(ch):
            assert got.get(("pmessage", p, ch)) == sent, f"{p} {ch}"
    ps.close()


def main():
    sub_at, pub_at, sub_admin, pub_admin, new_line, new_port = sys.argv[1:7]
    for protocol in (2, 3):
        run(sub_at, pub_at, protocol, 10_000)

    def add_server():
        for admin in (sub_admin, pub_admin):
            c = http.client.HTTPConnection(*addr(admin), timeout=10)
            c.request("POST", "/pools/alpha/servers", body=new_line)
            r = c.getresponse()
            assert r.status == 200, r.read()
            if admin == sub_admin:
                # The subscribers' proxy has moved its subscriptions to the
                # new server before the publisher's proxy sends there.
                direct = redis.Redis(host="127.0.0.1", port=int(new_port))
                deadline = time.time() + 10
                while not direct.pubsub_channels() and time.time() < deadline:
                    time.sleep(0.02)
                assert direct.pubsub_channels(), "moved channels are subscribed on the new server"
    run(sub_at, pub_at, 2, 10_000, during=add_server)
    print("ok")


if __name__ == "__main__":
    main()
