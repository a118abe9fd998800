#!/usr/bin/python3
"""Regenerates the compatibility placement data in this directory.

Runs the real programs -- twemproxy (nutcracker), libmemcached (through
pylibmc) and nginx -- on loopback only, routes every key of keys.txt through
each of them, and records which server each key landed on:

  * twemproxy and libmemcached variants: 4 memcached instances are started on
    127.0.0.1:11211..11214; every key is `set` through the program under test
    (value = the key itself), then every memcached is asked directly with
    batched `get`s which keys it holds. A key found on zero servers, or on
    more than one, is a hard error. `flush_all` on all four between variants.
  * nginx variants: `hash $arg_k consistent` upstreams in front of 4 backends
    that each answer with their own address; the response body is the server.

Must run with Debian's /usr/bin/python3 (it imports python3-pylibmc) as root
(memcached is started with `-u root`). Needs the Debian packages nutcracker,
memcached, nginx and python3-pylibmc. Takes well under a minute; the output
is deterministic (keys are generated from a fixed seed).

    /usr/bin/python3 testdata/compat/generate.py
"""
import http.client
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HOST = "127.0.0.1"
MC_PORTS = [11211, 11212, 11213, 11214]
MC_SERVERS = [f"{HOST}:{p}" for p in MC_PORTS]
TW_LISTEN = 22121
TW_STATS = 22222
NGX_BACKENDS = [18081, 18082, 18083, 18084]
NGX_FRONT = 18080
NGX_FRONT_EQUAL = 18090
SEED = 20250101
MAX_KEY = 250  # memcached's key length limit, in bytes

PROCS = []  # every process we started: stopped in the finally of main()


# --------------------------------------------------------------------------
# keys

def gen_keys():
    """The key set, as a list of bytes (UTF-8), deterministic and de-duplicated."""
    rng = random.Random(SEED)
    out = []

    def add(s):
        b = s.encode("utf-8") if isinstance(s, str) else s
        out.append(b)

    printable = [chr(c) for c in range(0x21, 0x7F)]  # no space, no controls, no DEL
    scripts = {
        "cjk": [chr(c) for c in range(0x4E00, 0x9FA6)],
        "cyrillic": [chr(c) for c in range(0x0410, 0x0450)] + ["ё", "Ё"],
        "greek": [chr(c) for c in range(0x0391, 0x03CA) if c != 0x03A2],
        "emoji": [chr(c) for c in range(0x1F600, 0x1F650)]
        + [chr(c) for c in range(0x1F300, 0x1F320)]
        + ["🔑", "🚀", "❤", "☕", "👍🏽", "🇩🇪", "👩\u200d💻"],
        "latin": list("àáâãäåæçèéêëìíîïðñòóôõöøùúûüýþÿÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÐÑÒÓÔÕÖØÙÚÛÜÝÞßœŒšŠžŽłŁőŐűŰ"),
    }
    ascii_word = "abcdefghijklmnopqrstuvwxyz0123456789"

    # plain ASCII keys in the usual shapes
    for i in range(10000):
        add(f"key:{i}")
    for i in range(4000):
        add(f"user:{i}:profile")
    # hash-tagged keys (twemproxy's hash_tag "{}"), and malformed tags
    for i in range(600):
        add(f"{{user:{i % 150}}}:cart:{i}")
        add(f"order:{i}:{{user:{i % 150}}}")
    for k in ["{}", "{", "}", "a{}b", "x{y", "x}y{z}", "{{a}}", "}a{b}", "{a}{b}", "{é}:1", "{太阳}:2"]:
        add(k)
    for _ in range(1000):
        add(str(rng.randrange(0, 10**rng.randrange(1, 12))))

    # keys equal to ketama point labels (twemproxy, libmemcached) and near them
    bases = ["127.0.0.1"] + MC_SERVERS + ["cache-b", "cache-c"] + [f"{HOST}:{p}" for p in NGX_BACKENDS]
    for base in bases:
        add(base)
        for i in range(40):
            add(f"{base}-{i}")

    # very short keys: every 1-byte key, some 2-byte ones
    for c in printable:
        add(c)
    for _ in range(200):
        add(rng.choice(printable) + rng.choice(printable))

    # random printable ASCII (braces, %, &, #, + ... included)
    for _ in range(3000):
        add("".join(rng.choice(printable) for _ in range(rng.randrange(3, 65))))

    # non-ASCII UTF-8: each script alone, mixed with ASCII, and mixed scripts
    names = list(scripts)
    for name in names:
        for j in range(400):
            n = rng.randrange(1, 21)
            word = "".join(rng.choice(scripts[name]) for _ in range(n))
            if j % 3 == 1:
                word = f"user:{word}:{rng.randrange(10000)}"
            elif j % 3 == 2:
                word = word + "".join(rng.choice(ascii_word) for _ in range(rng.randrange(1, 8)))
            add(word)
    for _ in range(500):
        add("".join(rng.choice(scripts[rng.choice(names)]) for _ in range(rng.randrange(2, 12))))
    for w in ["太阳", "月亮", "星星", "1111号客户端", "ключ", "κλειδί", "🔑", "naïve", "café", "Ελλάδα",
              "Москва", "東京", "crème brûlée".replace(" ", "_"), "😀", "é", "ß", "я", "中"]:
        add(w)

    # keys of exactly MAX_KEY bytes: ASCII and multi-byte (never split a char)
    def exact(chars, length, pad=ascii_word):
        s, size = [], 0
        while True:
            c = rng.choice(chars)
            cb = len(c.encode("utf-8"))
            if size + cb > length:
                break
            s.append(c)
            size += cb
        while size < length:  # pad with 1-byte chars up to the exact length
            s.append(rng.choice(pad))
            size += 1
        r = "".join(s)
        assert len(r.encode("utf-8")) == length
        return r

    for _ in range(30):
        add(exact(printable, MAX_KEY))
    for i in range(10):
        p = f"key:{i}:"
        add(p + "x" * (MAX_KEY - len(p)))
    for name in names:
        for _ in range(12):
            add(exact(scripts[name], MAX_KEY))
    for _ in range(10):
        add(exact([c for n in names for c in scripts[n][:64]], MAX_KEY))
    # near the limit
    for _ in range(50):
        length = rng.randrange(240, MAX_KEY)
        add(exact(rng.choice([printable, scripts[rng.choice(names)]]), length))

    seen, keys = set(), []
    for k in out:
        assert 1 <= len(k) <= MAX_KEY, k
        assert all(b > 0x20 and b != 0x7F for b in k), k
        k.decode("utf-8")  # valid UTF-8
        if k not in seen:
            seen.add(k)
            keys.append(k)
    return keys


# --------------------------------------------------------------------------
# processes

def start(argv, log_path):
    log = open(log_path, "wb")
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    log.close()
    PROCS.append(p)
    return p


def stop(p):
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=5)
    if p in PROCS:
        PROCS.remove(p)


def port_open(port):
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_port(port, proc, log_path, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}): {open(log_path, errors='replace').read()}")
        if port_open(port):
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open within {timeout}s")


def wait_closed(port, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not port_open(port):
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} still open after {timeout}s")


def version_of(argv):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=10)
    return r.stdout.decode().strip().splitlines()[0]


# --------------------------------------------------------------------------
# memcached ASCII protocol over a plain socket

class Conn:
    def __init__(self, port, timeout=20.0):
        self.s = socket.create_connection((HOST, port), timeout=timeout)
        self.buf = bytearray()

    def close(self):
        self.s.close()

    def send(self, data):
        self.s.sendall(data)

    def _fill(self):
        chunk = self.s.recv(1 << 16)
        if not chunk:
            raise RuntimeError("connection closed by peer")
        self.buf += chunk

    def readline(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return line
            self._fill()

    def readexact(self, n):
        while len(self.buf) < n:
            self._fill()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data


def set_cmd(k):
    return b"set %s 0 0 %d\r\n%s\r\n" % (k, len(k), k)


def set_all(port, keys, batch=200):
    """Sets every key (value = key) through the server at port, pipelined."""
    c = Conn(port)
    try:
        for i in range(0, len(keys), batch):
            chunk = keys[i:i + batch]
            c.send(b"".join(set_cmd(k) for k in chunk))
            for k in chunk:
                line = c.readline()
                if line != b"STORED":
                    raise RuntimeError(f"set {k!r}: {line!r}")
    finally:
        c.close()


def get_batches(keys, max_line=2000):
    """get lines of at most max_line bytes (memcached treats longer lines specially)."""
    batch, size = [], 4
    for k in keys:
        if batch and size + len(k) + 1 > max_line:
            yield batch
            batch, size = [], 4
        batch.append(k)
        size += len(k) + 1
    if batch:
        yield batch


def held_keys(port, keys, group=16):
    """Asks the memcached at port for every key; returns the set it holds."""
    held = set()
    c = Conn(port)
    try:
        batches = list(get_batches(keys))
        for i in range(0, len(batches), group):
            part = batches[i:i + group]
            c.send(b"".join(b"get " + b" ".join(b) + b"\r\n" for b in part))
            for _ in part:
                while True:
                    line = c.readline()
                    if line == b"END":
                        break
                    f = line.split(b" ")
                    if len(f) != 4 or f[0] != b"VALUE":
                        raise RuntimeError(f"memcached {port}: unexpected {line!r}")
                    n = int(f[3])
                    data = c.readexact(n + 2)
                    if data[-2:] != b"\r\n" or data[:-2] != f[1]:
                        raise RuntimeError(f"memcached {port}: bad value for {f[1]!r}: {data!r}")
                    held.add(f[1])
    finally:
        c.close()
    return held


def flush_all():
    for port in MC_PORTS:
        c = Conn(port)
        try:
            c.send(b"flush_all\r\n")
            line = c.readline()
            if line != b"OK":
                raise RuntimeError(f"flush_all on {port}: {line!r}")
        finally:
            c.close()
    # memcached's flush works at one-second granularity in some versions:
    # wait so that nothing set next can fall into the flushed second.
    time.sleep(1.1)


def locate(keys, servers):
    """servers: the config's server ids, in MC_PORTS order. Returns {key: server}."""
    owners = {k: [] for k in keys}
    for port, server in zip(MC_PORTS, servers):
        for k in held_keys(port, keys):
            if k not in owners:
                raise RuntimeError(f"memcached {port} holds unexpected key {k!r}")
            owners[k].append(server)
    bad = [(k, v) for k, v in owners.items() if len(v) != 1]
    if bad:
        raise RuntimeError(f"{len(bad)} keys not on exactly one server, e.g. {bad[:5]!r}")
    return {k: v[0] for k, v in owners.items()}


# --------------------------------------------------------------------------
# outputs

def write_tsv(name, keys, placement):
    counts = {}
    with open(os.path.join(HERE, name + ".tsv"), "wb") as f:
        for k in keys:
            s = placement[k]
            counts[s] = counts.get(s, 0) + 1
            f.write(k + b"\t" + s.encode() + b"\n")
    summary = " ".join(f"{s}={n}" for s, n in sorted(counts.items()))
    print(f"  {name}.tsv: {len(keys)} keys: {summary}", flush=True)


def write_yml(name, header, distribution, hash_, servers, listen=True, where=HERE, hash_tag=None):
    """servers: list of (id, weight, name-or-None). Twemproxy's schema, pool alpha."""
    lines = [f"# {l}" if l else "#" for l in header] + ["alpha:"]
    if listen:
        lines.append(f"  listen: {HOST}:{TW_LISTEN}")
    if distribution:
        lines.append(f"  distribution: {distribution}")
    if hash_:
        lines.append(f"  hash: {hash_}")
    if hash_tag:
        lines.append(f'  hash_tag: "{hash_tag}"')
    lines.append("  servers:")
    for sid, w, nm in servers:
        lines.append(f"   - {sid}:{w}" + (f" {nm}" if nm else ""))
    path = os.path.join(where, name + ".yml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


# --------------------------------------------------------------------------
# twemproxy

def servers4(weights, names=(None, None, None, None)):
    return [(s, w, n) for s, w, n in zip(MC_SERVERS, weights, names)]


TW_VARIANTS = [
    ("tw-ketama-md5", "ketama", "md5", servers4([1, 1, 1, 1])),
    ("tw-ketama-md5-weighted-named", "ketama", "md5",
     servers4([1, 2, 1, 3], [None, "cache-b", "cache-c", None])),
    ("tw-ketama-fnv1a_32", "ketama", "fnv1a_32", servers4([1, 2, 1, 3])),
    ("tw-ketama-default", None, None, servers4([1, 1, 2, 1])),
] + [
    (f"tw-ketama-{h}", "ketama", h, servers4([1, 1, 1, 1]))
    for h in ["one_at_a_time", "crc16", "crc32", "crc32a", "fnv1_64", "fnv1a_64", "fnv1_32",
              "hsieh", "murmur", "jenkins"]
] + [
    ("tw-ketama-md5-removed", "ketama", "md5",
     servers4([1, 2, 1, 3], [None, "cache-b", "cache-c", None])[:3]),
    ("tw-modula-md5", "modula", "md5", servers4([1, 2, 1, 1])),
    ("tw-modula-fnv1a_64", "modula", "fnv1a_64", servers4([1, 1, 1, 1])),
    ("tw-ketama-md5-hashtag", "ketama", "md5", servers4([1, 2, 1, 3]), "{}"),
    # twemproxy sorts servers by name (shorter first, then bytewise) and
    # keeps that order: listed out of order, modula's slots show it.
    ("tw-modula-md5-unsorted", "modula", "md5",
     [(MC_SERVERS[3], 1, None), (MC_SERVERS[1], 2, "zeta"), (MC_SERVERS[0], 1, None), (MC_SERVERS[2], 3, None)]),
    ("tw-modula-crc32a-hashtag", "modula", "crc32a", servers4([1, 1, 1, 1]), "{}"),
]


def start_nutcracker(cfg, tmp):
    log = os.path.join(tmp, "nutcracker.log")
    p = start(["nutcracker", "-c", cfg, "-s", str(TW_STATS), "-a", HOST, "-o", log,
               "-p", os.path.join(tmp, "nutcracker.pid")], os.path.join(tmp, "nutcracker.out"))
    wait_port(TW_LISTEN, p, log)
    return p


def twemproxy_key_limit(tmp):
    """The longest key nutcracker accepts, probed around MAX_KEY."""
    cfg = write_yml("tw-probe", [], "ketama", "md5", servers4([1, 1, 1, 1]), where=tmp)
    if True:
        p = start_nutcracker(cfg, tmp)
        try:
            ok = {}
            for n in (MAX_KEY - 1, MAX_KEY, MAX_KEY + 1):
                c = Conn(TW_LISTEN, timeout=5)
                try:
                    c.send(set_cmd(b"p" * n))
                    try:
                        line = c.readline()
                    except (RuntimeError, OSError) as e:
                        line = repr(e).encode()
                finally:
                    c.close()
                ok[n] = line == b"STORED"
                print(f"  twemproxy probe: {n}-byte key -> {line!r}", flush=True)
        finally:
            stop(p)
            wait_closed(TW_LISTEN)
    flush_all()
    limit = max([n for n, v in ok.items() if v], default=0)
    if limit < MAX_KEY - 1:
        raise RuntimeError(f"twemproxy rejects keys of {MAX_KEY - 1} bytes: {ok}")
    return min(limit, MAX_KEY)


def run_twemproxy(keys, tmp, limit):
    tw_keys = [k for k in keys if len(k) <= limit]
    for name, dist, h, servers, *tag in TW_VARIANTS:
        header = [f"Generated by generate.py; fed to nutcracker (twemproxy) as is.",
                  f"Placement of every key of keys.txt: {name}.tsv."]
        if not dist:
            header.append("No distribution/hash keys: twemproxy's defaults (ketama, fnv1a_64).")
        cfg = write_yml(name, header, dist, h, servers, hash_tag=tag[0] if tag else None)
        p = start_nutcracker(cfg, tmp)
        try:
            set_all(TW_LISTEN, tw_keys)
            # locate() wants one label per memcached, in MC_PORTS order.
            listed = {s[0] for s in servers}
            placement = locate(tw_keys, [m if m in listed else f"(not in config: {m})" for m in MC_SERVERS])
        finally:
            stop(p)
            wait_closed(TW_LISTEN)
        if any(v.startswith("(not") for v in placement.values()):
            raise RuntimeError(f"{name}: a key reached a server not in the config")
        write_tsv(name, tw_keys, placement)
        flush_all()


# --------------------------------------------------------------------------
# libmemcached through pylibmc

LM_VARIANTS = [
    ("lm-ketama-weighted", [1, 2, 1, 3]),
    ("lm-ketama-weighted-equal", [1, 1, 1, 1]),
]


def run_libmemcached(keys):
    import pylibmc
    for name, weights in LM_VARIANTS:
        specs = [f"{s}:{w}" for s, w in zip(MC_SERVERS, weights)]
        mc = pylibmc.Client(specs, binary=False, behaviors={"ketama_weighted": True})
        b = mc.behaviors
        if b["hash"] != "md5" or b["distribution"] != "consistent weighted" or b["ketama_hash"] != 1:
            raise RuntimeError(f"{name}: unexpected behaviors {b}")
        try:
            for k in keys:
                if not mc.set(k.decode("utf-8"), k):
                    raise RuntimeError(f"{name}: set {k!r} failed")
        finally:
            mc.disconnect_all()
        placement = locate(keys, MC_SERVERS)
        write_tsv(name, keys, placement)
        write_yml(name, ["Generated by generate.py: the chash config equivalent to",
                         f"pylibmc.Client({specs!r}, binary=False,",
                         "                behaviors={'ketama_weighted': True})",
                         "(libmemcached: MD5 key hash, weighted ketama continuum)."],
                  "ketama", "md5", servers4(weights), listen=False)
        flush_all()


# --------------------------------------------------------------------------
# nginx

# Bytes sent as they are in the query string; every other byte is sent
# percent-encoded (upper-case hex). nginx hashes $arg_k as it appears in the
# request line, so the encoded form is the key.
NGX_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$'()*+,;=:@/?")


def ngx_encode(k):
    return "".join(chr(b) if b in NGX_SAFE else "%%%02X" % b for b in k).encode("ascii")


NGX_VARIANTS = [
    ("nginx-chash", "chash", NGX_FRONT, [1, 2, 1, 3]),
    ("nginx-chash-equal", "chash_equal", NGX_FRONT_EQUAL, [1, 1, 1, 1]),
]


def nginx_conf(tmp):
    t = tmp
    c = [
        "master_process off;", "daemon off;", "worker_processes 1;",
        f"error_log {t}/nginx-error.log info;", f"pid {t}/nginx.pid;",
        "events { worker_connections 256; }",
        "http {",
        "  access_log off;", "  default_type text/plain;", "  keepalive_requests 1000000;",
        f"  client_body_temp_path {t}/body; proxy_temp_path {t}/proxy;",
        f"  fastcgi_temp_path {t}/fastcgi; uwsgi_temp_path {t}/uwsgi; scgi_temp_path {t}/scgi;",
    ]
    for _, up, front, weights in NGX_VARIANTS:
        c.append(f"  upstream {up} {{")
        c.append("    hash $arg_k consistent;")
        for port, w in zip(NGX_BACKENDS, weights):
            c.append(f"    server {HOST}:{port} weight={w};")
        c.append("    keepalive 8;")  # reuses connections; does not change peer selection
        c.append("  }")
        c.append(f"  server {{ listen {HOST}:{front}; location / {{ proxy_pass http://{up};"
                 " proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_next_upstream off; } }")
    for port in NGX_BACKENDS:
        c.append(f"  server {{ listen {HOST}:{port}; location / {{ return 200 \"{HOST}:{port}\"; }} }}")
    c.append("}")
    return "\n".join(c) + "\n"


def run_nginx(keys, tmp):
    enc = [ngx_encode(k) for k in keys]
    assert len(set(enc)) == len(enc)
    with open(os.path.join(HERE, "nginx-keys.txt"), "wb") as f:
        f.write(b"".join(e + b"\n" for e in enc))
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(nginx_conf(tmp))
    log = os.path.join(tmp, "nginx-error.log")
    p = start(["nginx", "-p", tmp + "/", "-e", log, "-c", conf], os.path.join(tmp, "nginx.out"))
    try:
        for port in [NGX_FRONT, NGX_FRONT_EQUAL] + NGX_BACKENDS:
            wait_port(port, p, log)
        valid = {f"{HOST}:{port}" for port in NGX_BACKENDS}
        for name, _, front, weights in NGX_VARIANTS:
            conn = http.client.HTTPConnection(HOST, front, timeout=10)
            placement = {}
            try:
                for e in enc:
                    conn.request("GET", "/?k=" + e.decode("ascii"))
                    r = conn.getresponse()
                    body = r.read().decode()
                    if r.status != 200 or body not in valid:
                        raise RuntimeError(f"{name}: {e!r} -> {r.status} {body!r}")
                    placement[e] = body
            finally:
                conn.close()
            write_tsv(name, enc, placement)
            write_yml(name, ["Generated by generate.py: the chash config equivalent to nginx's",
                             "  upstream { hash $arg_k consistent; server HOST:PORT weight=W; ... }",
                             "Keys are the query-string form nginx saw: nginx-keys.txt."],
                      "nginx", None,
                      [(f"{HOST}:{port}", w, None) for port, w in zip(NGX_BACKENDS, weights)], listen=False)
    finally:
        stop(p)


# --------------------------------------------------------------------------

def main():
    if os.geteuid() != 0:
        sys.exit("run as root (memcached is started with -u root)")
    import pylibmc  # fail early if not Debian's python3
    t0 = time.monotonic()
    busy = [p for p in MC_PORTS + [TW_LISTEN, TW_STATS, NGX_FRONT, NGX_FRONT_EQUAL] + NGX_BACKENDS if port_open(p)]
    if busy:
        sys.exit(f"ports already in use on {HOST}: {busy}")

    keys = gen_keys()
    with open(os.path.join(HERE, "keys.txt"), "wb") as f:
        f.write(b"".join(k + b"\n" for k in keys))
    print(f"keys.txt: {len(keys)} keys", flush=True)

    versions = [
        version_of(["nutcracker", "--version"]),
        version_of(["memcached", "-V"]),
        version_of(["nginx", "-v"]),
        f"pylibmc {pylibmc.__version__}, libmemcached {pylibmc.libmemcached_version}",
    ]
    with open(os.path.join(HERE, "versions.txt"), "w") as f:
        f.write("\n".join(versions) + "\n")
    print("\n".join(versions), flush=True)

    with tempfile.TemporaryDirectory(prefix="chash-compat-") as tmp:
        try:
            for port in MC_PORTS:
                log = os.path.join(tmp, f"memcached-{port}.log")
                p = start(["memcached", "-l", HOST, "-p", str(port), "-U", "0", "-m", "64",
                           "-c", "1024", "-u", "root"], log)
                wait_port(port, p, log)
            flush_all()

            limit = twemproxy_key_limit(tmp)
            print(f"twemproxy accepts keys up to {limit} bytes", flush=True)
            run_twemproxy(keys, tmp, limit)
            run_libmemcached(keys)
            run_nginx(keys, tmp)
        finally:
            for p in list(PROCS):
                stop(p)
    print(f"done in {time.monotonic() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    main()
