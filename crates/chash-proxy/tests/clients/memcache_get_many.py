"""A get_many of 1,000 keys of 250 bytes (a get line of about 250 KB)
through the proxy with the common Python memcached clients: every value
comes back. Usage: memcache_get_many.py HOST:PORT"""

import sys

import memcache  # python-memcached
import pylibmc
from pymemcache.client.base import Client as PymemcacheClient

host, port = sys.argv[1].rsplit(":", 1)
port = int(port)
failures = []


def keys_for(client):
    return ["%s:%s" % (client, str(i).rjust(245 - len(client), "k")) for i in range(1000)]


def check(client, got, keys):
    missing = [k for k in keys if got.get(k) != ("v-" + k[-6:])]
    if missing:
        failures.append("%s: %d of %d values missing or wrong" % (client, len(missing), len(keys)))
    else:
        print("%s: %d of %d values" % (client, len(keys), len(keys)))


keys = keys_for("pymemcache")
c = PymemcacheClient((host, port))
for k in keys:
    c.set(k, ("v-" + k[-6:]).encode())
got = {k.decode() if isinstance(k, bytes) else k: v.decode() for k, v in c.get_many(keys).items()}
check("pymemcache", got, keys)

keys = keys_for("pylibmc")
c = pylibmc.Client(["%s:%d" % (host, port)])
for k in keys:
    c.set(k, "v-" + k[-6:])
check("pylibmc", c.get_multi(keys), keys)

keys = keys_for("python-memcached")
c = memcache.Client(["%s:%d" % (host, port)])
for k in keys:
    c.set(k, "v-" + k[-6:])
check("python-memcached", c.get_multi(keys), keys)

if failures:
    print("\n".join(failures))
    sys.exit(1)
