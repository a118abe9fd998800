"""meta-memcache, a client that speaks only memcached's meta protocol, through
the proxy as if it were one memcached: get/set/delete/touch/cas/multi-get,
counters, its lease and stale-while-revalidate recipes, and 20 clients at
once whose values name their keys (zero mismatches).
Usage: memcached_meta.py HOST:PORT"""

import sys
import threading

from meta_memcache import (CacheClient, LeasePolicy, RecachePolicy, ServerAddress, SetMode, StalePolicy,
                           connection_pool_factory_builder)

host, port = sys.argv[1].rsplit(":", 1)


def client():
    return CacheClient.cache_client_from_servers(
        servers=[ServerAddress(host=host, port=int(port))],
        connection_pool_factory_fn=connection_pool_factory_builder(),
    )


c = client()
assert c.set(key="foo", value="bar", ttl=60)
assert c.get(key="foo") == "bar"
value, cas = c.get_cas(key="foo")
assert value == "bar" and cas
assert c.set(key="foo", value="baz", ttl=60, cas_token=cas), "a CAS set with the current token"
assert not c.set(key="foo", value="qux", ttl=60, cas_token=cas), "a CAS set with a spent token"
assert c.get(key="foo") == "baz"
assert c.touch(key="foo", ttl=120)
assert c.multi_get(keys=["foo", "nope"]) == {"foo": "baz", "nope": None} or \
    {str(k.key if hasattr(k, "key") else k): v for k, v in c.multi_get(keys=["foo", "nope"]).items()} == \
    {"foo": "baz", "nope": None}
assert c.delete(key="foo") and not c.delete(key="foo")
assert c.get(key="foo") is None
assert c.refill(key="foo", value=b"raw", ttl=60) and not c.refill(key="foo", value=b"again", ttl=60)
assert c.set(key="obj", value={"a": 1}, ttl=60) and c.get(key="obj") == {"a": 1}
assert c.set(key="sp ace", value="spaced", ttl=60) and c.get(key="sp ace") == "spaced", "base64 keys"
assert c.delta_initialize_and_get(key="ctr", delta=5, initial_value=10, initial_ttl=60) == 10
assert c.delta_and_get(key="ctr", delta=5) == 15
assert c.delta(key="ctr", delta=-3)
assert c.delta_and_get(key="ctr", delta=0) == 12
assert c.set(key="mode", value="x", ttl=60, set_mode=SetMode.ADD)
assert not c.set(key="mode", value="y", ttl=60, set_mode=SetMode.ADD)

# Lease: the first caller of a missing key wins (None: it must fill it);
# another waits, retries and gets a miss; once filled, everyone gets it.
quick = LeasePolicy(ttl=30, miss_retries=2, miss_retry_wait=0.01, miss_max_retry_wait=0.02)
assert c.get_or_lease(key="leased", lease_policy=quick) is None
assert client().get_or_lease(key="leased", lease_policy=quick) is None
assert c.set(key="leased", value="computed", ttl=60)
assert client().get_or_lease(key="leased", lease_policy=quick) == "computed"

# Stale-while-revalidate: a delete marks the value stale; the first reader
# wins the right to refresh it (None), others keep getting the stale value.
stale = StalePolicy(mark_stale_on_deletion_ttl=30, mark_stale_on_cas_mismatch=True)
assert c.set(key="swr", value="v1", ttl=60)
assert c.delete(key="swr", stale_policy=stale)
assert c.get(key="swr") is None, "the first reader refreshes"
assert client().get(key="swr") == "v1", "the others read the stale value"
assert c.set(key="swr", value="v2", ttl=60)
assert client().get(key="swr") == "v2"

# Recache: a value close to expiry is handed to one client to refresh.
assert c.set(key="rc", value="old", ttl=10)
assert c.get(key="rc", recache_policy=RecachePolicy(ttl=3600)) is None, "the winner refreshes"
assert client().get(key="rc", recache_policy=RecachePolicy(ttl=3600)) == "old"

# 20 clients at once, values naming their keys.
mismatches = []


def work(w):
    mine = client()
    keys = [f"w{w}:k{i}" for i in range(100)]
    for k in keys:
        assert mine.set(key=k, value=f"{k}=value", ttl=300)
    for k in keys:
        got = mine.get(key=k)
        if got != f"{k}=value":
            mismatches.append((k, got))
    for k, v in mine.multi_get(keys=keys).items():
        name = getattr(k, "key", k)
        if v != f"{name}=value":
            mismatches.append((name, v))


threads = [threading.Thread(target=work, args=(w,)) for w in range(20)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not mismatches, mismatches[:5]
print("ok")
