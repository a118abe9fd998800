"""pymemcache, python-memcached and meta-memcache (the clients people run)
against a fleet of proxies that follow one config in etcd: each client
stores 1,000 keys through the first proxy and reads every one back, with its
own value, through each of the others (which agree on where every key is).
Usage: fleet_clients.py TAG WRITER_HOST:PORT READER_HOST:PORT [...]"""

import sys

import memcache
from meta_memcache import CacheClient, ServerAddress, connection_pool_factory_builder
from pymemcache.client.base import Client


def clients(addr):
    host, port = addr.rsplit(":", 1)
    meta = CacheClient.cache_client_from_servers(
        servers=[ServerAddress(host=host, port=int(port))],
        connection_pool_factory_fn=connection_pool_factory_builder(),
    )
    return Client((host, int(port))), memcache.Client([addr]), meta


tag, writer, readers = sys.argv[1], sys.argv[2], sys.argv[3:]
keys = {name: [f"{tag}:{name}:{i}" for i in range(1000)] for name in ("pym", "old", "meta")}
value = lambda k: f"{k}=v"

pym, old, meta = clients(writer)
assert not pym.set_many({k: value(k).encode() for k in keys["pym"]}), "pymemcache set_many failed"
assert not old.set_multi({k: value(k) for k in keys["old"]}), "python-memcached set_multi failed"
for k in keys["meta"]:
    assert meta.set(key=k, value=value(k), ttl=600), f"meta-memcache set {k} failed"

for reader in readers:
    pym, old, meta = clients(reader)
    got = pym.get_many(keys["pym"])
    wrong = [k for k in keys["pym"] if got.get(k) != value(k).encode()]
    got = old.get_multi(keys["old"])
    wrong += [k for k in keys["old"] if got.get(k) != value(k)]
    wrong += [k for k in keys["meta"] if meta.get(key=k) != value(k)]
    assert not wrong, f"through {reader}: {len(wrong)} of 3000 keys missing or wrong, e.g. {wrong[:5]}"
print("ok")
