"""Data through chash proxies while a Redis pool migrates (issue 28).

    redis_migrate.py load PROXY N STATE
        N keys of every type (strings, some with a TTL, hashes, lists, sets,
        sorted sets, streams) through PROXY; STATE records when.
    redis_migrate.py work PROXY_A PROXY_B STATE STOPFILE
        20 clients, each through both proxies in turn, until STOPFILE exists:
        versioned SETs, INCRs and LPUSHes on keys of their own (each value
        names its version), reads of their own keys (never older than the
        last acknowledged write) and of the loaded keys (as loaded). A
        request that fails is retried; one whose outcome is unknown (the
        connection went) widens what the key may hold. STATE gets it all.
    redis_migrate.py verify PROXY STATE
        Every key as STATE says: loaded keys as loaded (TTLs within a second),
        the clients' keys at their last acknowledged value (or one of the
        unknown outcomes after it).
    redis_migrate.py strand OLD NEW SCRIPTS LEASE_MS SAVED KEY...
        A copier (migrate_method: copy) that died mid-copy, straight on the
        servers: the first three KEYs claimed on OLD and never restored, the
        rest claimed and restored on NEW but never released. SCRIPTS: a JSON
        file of the copy's scripts by name; SAVED gets what a late restore
        needs.
    redis_migrate.py late NEW SCRIPTS SAVED
        That copier wakes up and restores again: prints the script's answer.

Each mode prints one JSON object; verify exits 1 when anything is off.
"""

import json
import os
import random
import sys
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

TYPES = ["string", "ttl", "hash", "list", "set", "zset", "stream"]
TTL = 3600


def client(addr):
    host, port = addr.rsplit(":", 1)
    # No retries of its own: a write whose connection went is an unknown
    # outcome here, not one redis-py sends again behind the test's back.
    return redis.Redis(
        host=host, port=int(port), socket_timeout=10, decode_responses=True, retry=Retry(NoBackoff(), 0)
    )


def loaded_key(i):
    return f"{TYPES[i % len(TYPES)]}:{i}"


def load(addr, n, state_path):
    r = client(addr)
    started = time.time()
    p = r.pipeline(transaction=False)
    for i in range(n):
        kind = TYPES[i % len(TYPES)]
        k = loaded_key(i)
        if kind == "string":
            p.set(k, f"v{i}")
        elif kind == "ttl":
            p.set(k, f"v{i}", ex=TTL)
        elif kind == "hash":
            p.hset(k, mapping={f"f{j}": f"{i}.{j}" for j in range(5)})
        elif kind == "list":
            p.rpush(k, *[f"{i}.{j}" for j in range(5)])
        elif kind == "set":
            p.sadd(k, *[f"{i}.{j}" for j in range(5)])
        elif kind == "zset":
            p.zadd(k, {f"{i}.{j}": j for j in range(5)})
        else:
            for j in range(3):
                p.xadd(k, {"n": f"{i}.{j}"}, id=f"{j + 1}-1")
        if i % 500 == 499:
            p.execute()
    p.execute()
    with open(state_path, "w") as f:
        json.dump({"n": n, "loaded_at": started}, f)
    print(json.dumps({"loaded": n, "seconds": round(time.time() - started, 2)}))


def check_loaded(r, i):
    """What is wrong with loaded key i, or None."""
    kind = TYPES[i % len(TYPES)]
    k = loaded_key(i)
    if kind in ("string", "ttl"):
        got, want = r.get(k), f"v{i}"
    elif kind == "hash":
        got, want = r.hgetall(k), {f"f{j}": f"{i}.{j}" for j in range(5)}
    elif kind == "list":
        got, want = r.lrange(k, 0, -1), [f"{i}.{j}" for j in range(5)]
    elif kind == "set":
        got, want = r.smembers(k), {f"{i}.{j}" for j in range(5)}
    elif kind == "zset":
        got, want = r.zrange(k, 0, -1, withscores=True), [(f"{i}.{j}", float(j)) for j in range(5)]
    else:
        got, want = [e[1]["n"] for e in r.xrange(k)], [f"{i}.{j}" for j in range(3)]
    if got == want:
        return None
    # What was read, and when (the proxies' logs say what they did then).
    return f"{k} does not hold what was loaded: read {got!r} at {time.time():.3f}"


class Owned:
    """A client's own keys: what each holds for sure, and at most."""

    def __init__(self, t):
        self.t = t
        self.version = {}  # string key -> [acked, attempted]
        self.count = {}  # counter key -> [acked, attempted]
        self.length = {}  # list key -> [acked, attempted]


def work(addr_a, addr_b, state_path, stop_file):
    state = json.load(open(state_path))
    n = state["n"]
    proxies = [client(addr_a), client(addr_b)]
    owned = [Owned(t) for t in range(20)]
    stats = {"writes": 0, "reads": 0, "retries": 0, "older_reads": 0, "wrong_loaded": 0, "unknown": 0, "errors": {}}
    lock = threading.Lock()

    def note(what):
        with lock:
            stats["errors"][what] = stats["errors"].get(what, 0) + 1

    def attempt(op, key, box, first_client, ack):
        """One write, retried while refused; acknowledged, or its outcome
        unknown (it may have happened): box is [acknowledged, attempted]."""
        box[1] += 1
        for tries in range(200):
            r = proxies[(first_client + tries) % 2]
            try:
                op(r)
                ack(box)
                with lock:
                    stats["writes"] += 1
                return
            except redis.exceptions.ResponseError as e:
                # redis-py raises TRYAGAIN replies as TryAgainError (the
                # word itself taken off the message).
                retry = isinstance(e, getattr(redis.exceptions, "TryAgainError", ())) or str(e).startswith("TRYAGAIN")
                note("TRYAGAIN" if retry else str(e).split(" ")[0])
                if retry:
                    # Refused before it went anywhere: try again.
                    with lock:
                        stats["retries"] += 1
                    time.sleep(0.02)
                    continue
                with lock:
                    stats["unknown"] += 1
                return
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
                # Sent or not: the write may have happened.
                note(type(e).__name__)
                with lock:
                    stats["unknown"] += 1
                return
        raise RuntimeError(f"{key}: not acknowledged after 200 tries")

    def acked_version(v):
        def ack(box):
            box[0] = v
        return ack

    def acked_one(box):
        box[0] += 1

    def run(o):
        rnd = random.Random(o.t)
        i = 0
        while not os.path.exists(stop_file):
            i += 1
            c = i % 2
            slot = rnd.randrange(200)
            which = rnd.randrange(5)
            try:
                if which == 0:
                    k = f"w{o.t}:{slot}"
                    box = o.version.setdefault(k, [0, 0])
                    v = box[1] + 1
                    attempt(lambda r: r.set(k, f"{k}:{v}"), k, box, c, acked_version(v))
                elif which == 1:
                    k = f"c{o.t}:{slot}"
                    box = o.count.setdefault(k, [0, 0])
                    attempt(lambda r: r.incr(k), k, box, c, acked_one)
                elif which == 2:
                    k = f"l{o.t}:{slot}"
                    box = o.length.setdefault(k, [0, 0])
                    attempt(lambda r: r.lpush(k, "x"), k, box, c, acked_one)
                elif which == 3:
                    k = f"w{o.t}:{slot}"
                    if k in o.version:
                        acked = o.version[k][0]
                        got = proxies[c].get(k)
                        seen = int(got.rsplit(":", 1)[1]) if got else 0
                        with lock:
                            stats["reads"] += 1
                            if seen < acked:
                                stats["older_reads"] += 1
                else:
                    j = rnd.randrange(n)
                    problem = check_loaded(proxies[c], j)
                    if problem:
                        problem += f" through proxy {'ab'[c]}"
                    with lock:
                        stats["reads"] += 1
                        if problem:
                            stats["wrong_loaded"] += 1
                            stats.setdefault("wrong_examples", []).append(problem)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.ResponseError) as e:
                # A read that failed (a proxy restarting): not counted.
                note("read " + type(e).__name__)
                time.sleep(0.02)

    threads = [threading.Thread(target=run, args=(o,)) for o in owned]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state["owned"] = [{"version": o.version, "count": o.count, "length": o.length} for o in owned]
    with open(state_path, "w") as f:
        json.dump(state, f)
    if "wrong_examples" in stats:
        stats["wrong_examples"] = stats["wrong_examples"][:5]
    print(json.dumps(stats))


def verify(addr, state_path):
    state = json.load(open(state_path))
    r = client(addr)
    out = {"loaded_wrong": 0, "ttl_off": 0, "lost_writes": 0, "counters_off": 0, "lists_off": 0, "examples": []}
    elapsed = time.time() - state["loaded_at"]
    for i in range(state["n"]):
        problem = check_loaded(r, i)
        if problem:
            out["loaded_wrong"] += 1
            out["examples"].append(problem)
        if TYPES[i % len(TYPES)] == "ttl":
            elapsed = time.time() - state["loaded_at"]
            ttl = r.pttl(loaded_key(i)) / 1000.0
            # Set at most `elapsed` seconds ago (and at least 0).
            if not (TTL - elapsed - 1.0 <= ttl <= TTL + 1.0):
                out["ttl_off"] += 1
                out["examples"].append(f"{loaded_key(i)}: TTL {ttl}, want about {TTL - elapsed:.0f}")
    for o in state.get("owned", []):
        for k, (acked, attempted) in o["version"].items():
            got = r.get(k)
            seen = int(got.rsplit(":", 1)[1]) if got else 0
            if not (acked <= seen <= attempted):
                out["lost_writes"] += 1
                out["examples"].append(f"{k}: holds version {seen}, acknowledged {acked} (attempted {attempted})")
        for k, (acked, attempted) in o["count"].items():
            got = int(r.get(k) or 0)
            if not (acked <= got <= attempted):
                out["counters_off"] += 1
                out["examples"].append(f"{k}: {got}, acknowledged {acked} INCRs (attempted {attempted})")
        for k, (acked, attempted) in o["length"].items():
            got = r.llen(k)
            if not (acked <= got <= attempted):
                out["lists_off"] += 1
                out["examples"].append(f"{k}: length {got}, acknowledged {acked} LPUSHes (attempted {attempted})")
    out["examples"] = out["examples"][:10]
    out["owned_keys"] = sum(len(o["version"]) + len(o["count"]) + len(o["length"]) for o in state.get("owned", []))
    print(json.dumps(out))
    bad = out["loaded_wrong"] + out["ttl_off"] + out["lost_writes"] + out["counters_off"] + out["lists_off"]
    sys.exit(1 if bad else 0)


def raw(addr):
    host, port = addr.rsplit(":", 1)
    return redis.Redis(host=host, port=int(port), socket_timeout=10, retry=Retry(NoBackoff(), 0))


def restore_args(token, deadline, dumps):
    args = [token, str(deadline)]
    for at, payload in dumps:
        args += [str(at), payload]
    return args


def strand(old_addr, new_addr, scripts_path, lease_ms, saved_path, keys):
    with open(scripts_path) as f:
        scripts = json.load(f)
    old, new = raw(old_addr), raw(new_addr)
    unrestored, restored = keys[:3], keys[3:]
    deadline, items = old.eval(scripts["claim"], len(unrestored), *unrestored, "dead-1", lease_ms)
    claimed = sum(1 for i in items if isinstance(i, list) and len(i) == 2)
    deadline, items = old.eval(scripts["claim"], len(restored), *restored, "dead-2", lease_ms)
    dumps = [(i[1], i[0]) for i in items]
    answer = new.eval(scripts["restore"], len(restored), *restored, *restore_args("dead-2", deadline, dumps))
    with open(saved_path, "w") as f:
        json.dump({"keys": restored, "deadline": deadline,
                   "dumps": [[at, payload.hex()] for at, payload in dumps]}, f)
    print(json.dumps({"claimed": claimed + len(dumps), "restored": str(answer)}))


def late(new_addr, scripts_path, saved_path):
    with open(scripts_path) as f:
        scripts = json.load(f)
    with open(saved_path) as f:
        saved = json.load(f)
    dumps = [(at, bytes.fromhex(payload)) for at, payload in saved["dumps"]]
    answer = raw(new_addr).eval(scripts["restore"], len(saved["keys"]), *saved["keys"],
                                *restore_args("dead-2", saved["deadline"], dumps))
    print(json.dumps({"answer": answer.decode() if isinstance(answer, bytes) else str(answer)}))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "load":
        load(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif mode == "work":
        work(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    elif mode == "verify":
        verify(sys.argv[2], sys.argv[3])
    elif mode == "strand":
        strand(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7:])
    elif mode == "late":
        late(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(f"unknown mode {mode}")
