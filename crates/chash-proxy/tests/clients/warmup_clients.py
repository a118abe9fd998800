"""pymemcache, python-memcached and meta-memcache (the clients people run)
through a pool with warm-up, across a membership change made between two
runs of this script: `write` stores 1,000 keys per client; `read` reads
them back after the change and every one must hit with its own value.
Usage: warmup_clients.py HOST:PORT write|read"""

import sys

import memcache
from meta_memcache import CacheClient, ServerAddress, connection_pool_factory_builder
from pymemcache.client.base import Client

addr, phase = sys.argv[1], sys.argv[2]
host, port = addr.rsplit(":", 1)
pym = Client((host, int(port)))
old = memcache.Client([addr])
meta = CacheClient.cache_client_from_servers(
    servers=[ServerAddress(host=host, port=int(port))],
    connection_pool_factory_fn=connection_pool_factory_builder(),
)
keys = {name: [f"{name}:{i}" for i in range(1000)] for name in ("pym", "old", "meta")}

if phase == "write":
    assert not pym.set_many({k: k.encode() for k in keys["pym"]}), "pymemcache set_many failed"
    assert not old.set_multi({k: k for k in keys["old"]}), "python-memcached set_multi failed"
    for k in keys["meta"]:
        assert meta.set(key=k, value=k, ttl=600)
else:
    got = pym.get_many(keys["pym"])
    missing = [k for k in keys["pym"] if got.get(k) != k.encode()]
    got = old.get_multi(keys["old"])
    missing += [k for k in keys["old"] if got.get(k) != k]
    missing += [k for k in keys["meta"] if meta.get(key=k) != k]
    assert not missing, f"{len(missing)} keys missed after the change, e.g. {missing[:5]}"
print("ok")
